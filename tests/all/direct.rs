//! The direct route (the default): the linker lays out a placeholder, mblob writes the blob
//! into the linked library. Checked against a library linked the usual way (TVM's `devc.o`
//! route, or the C route without LLVM), with real linkers, `readelf` and `dlopen`.

use std::path::Path;
use std::process::Command;

use mblob::export::{Backend, Export};
use mblob::link::{find_lld, Linker};
use mblob::pack::direct::SECTION;
use mblob_runtime::{elf, Layout, RawPayload};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use crate::export::load;
use crate::goldens::{goldens, read, run_dense_relu};

/// The route a normal link takes in this build.
fn linked_route() -> Backend {
    if cfg!(feature = "llvm") {
        Backend::Llvm
    } else {
        Backend::C(mblob::pack::CStyle::Fast)
    }
}

fn linkers() -> Vec<Linker> {
    let mut l = vec![Linker::Default];
    if find_lld().is_some() {
        l.push(Linker::Lld);
    } else {
        eprintln!("SKIPPED: ld.lld is not installed, the direct route is checked with GNU ld only");
    }
    l
}

/// A graph golden's export (TVM's kernels and payloads) with an extra payload of `extra` bytes.
fn export(extra: usize) -> Export {
    let m = crate::goldens::json(&goldens().join("manifest.json"));
    let g = m["goldens"].as_array().unwrap().iter().find(|g| g["name"] == "graph_dense_relu").unwrap();
    let mut e = crate::export::golden_export(&goldens(), g, Layout::Classic);
    if extra > 0 {
        let bytes: Vec<u8> = (0..extra as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
        e.import(RawPayload::new("metadata", bytes));
    }
    e
}

/// `readelf` (binutils) and `llvm-readelf-14`, when installed, read every header and table
/// without a warning.
fn readelf_clean(so: &Path) {
    let mut ran = 0;
    for tool in ["readelf", "llvm-readelf-14", "llvm-readelf"] {
        let Ok(out) = Command::new(tool).args(["--all", "-W"]).arg(so).output() else { continue };
        ran += 1;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.trim().is_empty(), "{tool} {}: {stderr}", so.display());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.to_lowercase().contains("warning"), "{tool} {}: {stdout}", so.display());
    }
    assert!(ran > 0, "no readelf installed");
}

/// The layout the route promises: the blob section last in the last loadable segment, whose
/// sizes, like the symbol's in both tables, are the blob's.
fn check_layout(so: &Path, symbol: &str, blob_len: u64) {
    let data = read(so);
    let file = object::File::parse(&*data).unwrap();
    let section = file.section_by_name(SECTION).unwrap();
    assert_eq!(section.size(), blob_len);
    let (off, size) = section.file_range().unwrap();
    assert_eq!(size, blob_len);
    for table in [file.dynamic_symbols(), file.symbols()] {
        let sym = table.into_iter().find(|s| s.name() == Ok(symbol)).unwrap();
        assert_eq!((sym.address(), sym.size()), (section.address(), blob_len), "{symbol}");
    }
    let last = file.segments().max_by_key(|s| s.address()).unwrap();
    assert_eq!(last.address() + last.size(), section.address() + blob_len, "the segment ends with the blob");
    let (seg_off, seg_size) = last.file_range();
    assert_eq!(seg_off + seg_size, off + size, "the segment's file part ends with the blob");
    // Every other allocated section lies below the blob.
    for s in file.sections().filter(|s| s.address() != 0 && s.name() != Ok(SECTION)) {
        assert!(s.address() + s.size() <= section.address(), "{:?}", s.name());
    }
}

#[test]
fn direct_libraries_load_like_linked_ones_with_each_linker_and_layout() {
    let dir = tempfile::tempdir().unwrap();
    for linker in linkers() {
        for layout in Layout::ALL {
            for prefix in ["", "demo_"] {
                let what = format!("{linker:?} {layout} prefix `{prefix}`");
                let direct = dir.path().join("direct.so");
                let linked = dir.path().join("linked.so");
                let mut e = export(100_000);
                e.force_layout(true).layout(layout).prefix(prefix).linker(linker.clone());
                let report = e.backend(Backend::Direct).write(&direct).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(report.stages.iter().map(|s| s.0).collect::<Vec<_>>(), ["serialize", "link", "pack"]);
                e.backend(linked_route()).write(&linked).unwrap();
                let symbol = format!("{prefix}{}", layout.symbol());
                check_layout(&direct, &symbol, report.blob_len);
                readelf_clean(&direct);
                // The same blob as the normally linked library, byte for byte.
                let (a, b) = (read(&direct), read(&linked));
                let blob = |data: &[u8]| {
                    let found = elf::find_blob(data, Some(prefix)).unwrap().unwrap();
                    assert_eq!(found.symbol, symbol);
                    found.bytes(data).unwrap().to_vec()
                };
                assert!(blob(&a) == blob(&b), "{what}: blobs differ");
                // dlopen, the tree, the host code.
                let (x, y) = (load(&direct), load(&linked));
                assert_eq!(x.shape(), y.shape(), "{what}");
                if prefix.is_empty() && layout == Layout::Classic {
                    let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
                    assert_eq!(run_dense_relu(&x), want, "{what}");
                }
                // `strip` leaves a library that still loads.
                let stripped = dir.path().join("stripped.so");
                let out = Command::new("strip").arg("-o").arg(&stripped).arg(&direct).output().unwrap();
                assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
                assert_eq!(load(&stripped).shape(), y.shape(), "{what}");
            }
        }
    }
}

#[test]
fn direct_blob_sizes_from_one_byte_past_a_page_keep_the_tail_intact() {
    // Sizes around the page size: the moved section headers and symbol tables must land where
    // the headers say, whatever the blob's length.
    let dir = tempfile::tempdir().unwrap();
    for extra in [0, 1, 4000, 4096, 4097, 3 << 20] {
        let so = dir.path().join(format!("s{extra}.so"));
        let mut e = export(extra);
        let report = e.backend(Backend::Direct).write(&so).unwrap();
        check_layout(&so, "__tvm_dev_mblob", report.blob_len);
        readelf_clean(&so);
        let loaded = load(&so);
        let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
        assert_eq!(run_dense_relu(&loaded), want, "{extra}");
    }
}

#[test]
fn direct_is_the_default_and_falls_back_where_it_needs_an_object() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("default.so");
    let report = export(10).write(&so).unwrap();
    check_layout(&so, "__tvm_dev_mblob", report.blob_len);
    // System-lib needs the registration constructor, `--emit-devc` and `.tar` a blob object:
    // those go through the LLVM route (C without LLVM), which puts the blob elsewhere.
    let sys = dir.path().join("sys.so");
    let mut e = export(10);
    e.system_lib(true);
    let report = e.write(&sys).unwrap();
    assert_eq!(report.stages.iter().map(|s| s.0).collect::<Vec<_>>(), ["serialize", "pack", "link"]);
    let data = read(&sys);
    let file = object::File::parse(&*data).unwrap();
    assert!(file.section_by_name(SECTION).is_none());
    assert!(file.symbols().any(|s| s.name() == Ok("TVMBackendRegisterSystemLibSymbol")));
    let devc = dir.path().join("devc");
    let mut e = export(10);
    e.emit_devc(&devc).write(dir.path().join("emit.so")).unwrap();
    assert!(devc.join("devc.o").is_file());
    let tar = dir.path().join("x.tar");
    export(10).write(&tar).unwrap();
    assert!(read(&tar).windows(6).any(|w| w == b"devc.o"));
}

#[test]
fn direct_refuses_a_layout_it_did_not_ask_for_and_leaves_nothing() {
    // A host object with its own large data: GNU ld puts its `.lrodata` after the placeholder,
    // so the blob could not grow in place. The export fails and names the way out.
    let dir = tempfile::tempdir().unwrap();
    let asm = dir.path().join("large.s");
    std::fs::write(
        &asm,
        ".section .lrodata,\"al\",@progbits\n.globl big\nbig: .quad 1\n.section .note.GNU-stack,\"\",@progbits\n",
    )
    .unwrap();
    let obj = dir.path().join("large.o");
    let out = Command::new("cc").arg("-c").arg(&asm).arg("-o").arg(&obj).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let so = dir.path().join("out.so");
    let mut e = export(10);
    e.object(&obj).linker(Linker::Default);
    let err = e.write(&so).unwrap_err().to_string();
    assert!(err.contains("not the last of the loaded part") && err.contains("--backend llvm"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
    // The same export through the linked route works.
    e.backend(linked_route()).write(&so).unwrap();
}

/// The build ID covers the blob: the same inputs give the same ID, another blob (same host
/// code, same length) another one, with each linker; the note keeps the linker's size.
#[test]
fn direct_build_id_changes_with_the_blob() {
    let dir = tempfile::tempdir().unwrap();
    let build_id = |so: &Path| -> Vec<u8> {
        let data = read(so);
        let file = object::File::parse(&*data).unwrap();
        file.build_id().unwrap().expect("the linker wrote a build ID").to_vec()
    };
    for linker in linkers() {
        let write = |name: &str, fill: u8| {
            let so = dir.path().join(name);
            let mut e = export(0);
            e.import(RawPayload::new("metadata", vec![fill; 50_000]));
            e.linker(linker.clone()).backend(Backend::Direct).write(&so).unwrap();
            readelf_clean(&so);
            so
        };
        let (a, again, other) = (write("a.so", 1), write("again.so", 1), write("other.so", 2));
        let (ia, iagain, iother) = (build_id(&a), build_id(&again), build_id(&other));
        assert_eq!(ia, iagain, "{linker:?}: the same inputs, another ID");
        assert_ne!(ia, iother, "{linker:?}: another blob, the same ID");
        assert!(ia.len() >= 8, "{linker:?}: {} bytes", ia.len());
        // A library linked the usual way has a note of the same size.
        let plain = dir.path().join("plain.so");
        let mut e = export(0);
        e.import(RawPayload::new("metadata", vec![1; 50_000]));
        e.linker(linker.clone()).backend(linked_route()).write(&plain).unwrap();
        assert_eq!(build_id(&plain).len(), ia.len(), "{linker:?}: the note's size is the linker's");
    }
}
