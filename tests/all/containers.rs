//! Blobs read out of every container TVM writes: Mach-O (thin, fat), PE/COFF, WebAssembly,
//! `ar` archives and tars of them, from libraries real TVM built (tests/fixtures/containers,
//! made by its make.py with TVM 0.19 and 0.27) and from MLC-LLM's published model libraries
//! (tests/fixtures/mlc-libs), each checked against an independent reading.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use mblob::inspect::{inspect_bytes, inspect_path, Options, Report};
use mblob::runtime::{Bytes, Layout};
use object::{Object, ObjectSection, ObjectSymbol};
use serde_json::Value;

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out).unwrap();
    out
}

/// The facts of a report that come from the blob alone.
fn blob_facts(r: &Report) -> Value {
    let mut v = serde_json::to_value(r).unwrap();
    let keep = ["layout", "legacy", "blob_len", "type_keys", "payload_lens", "row_ptr", "child_indices", "tree"];
    let mut out = serde_json::Map::new();
    for k in keep {
        out.insert(k.into(), v[k].take());
    }
    let mut modules = v["modules"].take();
    for m in modules.as_array_mut().unwrap() {
        if let Some(relax) = m.get_mut("relax").and_then(Value::as_object_mut) {
            relax.remove("unsupported_calls");
        }
    }
    out.insert("modules".into(), modules);
    Value::Object(out)
}

/// The same blob read as a raw `.blob` file (its bytes, in the layout its symbol names).
fn raw_reading(blob: &[u8], layout: Layout) -> Report {
    inspect_bytes(&Bytes::from_vec(blob.to_vec()), Path::new("raw.blob"), Some(layout), None).unwrap()
}

/// An independent cut of the blob out of an object or library: the symbol found with `object`'s
/// generic symbol table (or a PE file's exports), its bytes from its section's file range, as
/// long as their 8-byte header says.
fn cut_with_object(data: &[u8]) -> Option<(String, Vec<u8>)> {
    let file = object::File::parse(data).ok()?;
    // Mach-O puts `_` in front of C names.
    let macho = file.format() == object::BinaryFormat::MachO;
    let c_name = |n: &str| -> Option<String> {
        if macho {
            n.strip_prefix('_').map(str::to_owned)
        } else {
            Some(n.to_owned())
        }
    };
    let mut hits: Vec<(String, u64, Option<object::SectionIndex>)> = file
        .symbols()
        .filter(|s| !s.is_undefined())
        .filter_map(|s| Some((c_name(s.name().ok()?)?, s.address(), s.section_index())))
        .collect();
    for e in file.exports().ok()?.flatten() {
        if let (object::NameOrOrdinal::Name(name), object::ExportTarget::Address { address }) = (e.name(), e.target()) {
            hits.push((String::from_utf8_lossy(name).into_owned(), address, None));
        }
    }
    let (name, address, index) = hits.into_iter().find(|(n, _, _)| Layout::from_symbol(n).is_some())?;
    let section = match index {
        Some(i) => file.section_by_index(i).ok()?,
        None => file.sections().find(|s| s.address() <= address && address < s.address() + s.size())?,
    };
    let (offset, _) = section.file_range()?;
    let start = usize::try_from(offset + (address - section.address())).ok()?;
    let len = u64::from_le_bytes(data[start..start + 8].try_into().unwrap()) as usize + 8;
    Some((name, data[start..start + len].to_vec()))
}

/// TVM's own containers: every one holds exactly the bytes TVM's serializer gives
/// (`ModulePackImportsToNDArray`/`...ToTensor`, kept as `<tvm>-<kind>.blob`).
#[test]
fn tvm_built_containers_hold_tvms_own_blob() {
    let fx = dir("containers");
    // (kind, file suffix, the report's `kind`), per TVM with its blob symbol.
    type Files = &'static [(&'static str, &'static str, &'static str)];
    let cases: &[(&str, &str, Files)] = &[
        (
            "tvm19",
            "__tvm_dev_mblob",
            &[
                ("macho", "macho.dylib", "macho"),
                ("macho", "macho.fat.dylib", "macho"),
                ("macho", "macho.a", "archive"),
                ("macho", "macho.tar", "tar"),
                ("coff", "coff.dll", "pe"),
                ("coff", "coff.devc.obj", "coff"),
                ("coff", "coff.tar", "tar"),
            ],
        ),
        (
            "tvm27",
            "__tvm_ffi__library_bin",
            &[
                ("macho", "macho.dylib", "macho"),
                ("macho", "macho.fat.dylib", "macho"),
                ("macho", "macho.a", "archive"),
                ("macho", "macho.tar", "tar"),
                ("coff", "coff.dll", "pe"),
                ("coff", "coff.devc.obj", "coff"),
                ("coff", "coff.tar", "tar"),
                ("wasm", "wasm.wasm", "wasm"),
                ("wasm", "wasm.devc.o", "wasm"),
                ("wasm", "wasm.tar", "tar"),
            ],
        ),
    ];
    for (tvm, symbol, files) in cases {
        let facts: Value = serde_json::from_slice(&std::fs::read(fx.join(format!("{tvm}.json"))).unwrap()).unwrap();
        for (kind, file, report_kind) in *files {
            let path = fx.join(format!("{tvm}-{file}"));
            let golden = std::fs::read(fx.join(format!("{tvm}-{kind}.blob"))).unwrap();
            let r = inspect_path(&path, &Options::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let what = path.display().to_string();
            assert_eq!(serde_json::to_value(r.kind).unwrap(), *report_kind, "{what}");
            assert_eq!(r.symbol.as_deref(), Some(*symbol), "{what}");
            assert_eq!(r.prefix.as_deref(), Some(""), "{what}");
            assert!(r.blob.as_ref().unwrap()[..] == golden[..], "{what}: not TVM's bytes");
            let keys: Vec<&str> = facts["containers"][kind]["type_keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap())
                .collect();
            for k in keys {
                assert!(r.type_keys.iter().any(|t| t == k), "{what}: {k} missing from {:?}", r.type_keys);
            }
            let c = r.container.as_ref().unwrap();
            assert!(!c.runs_here, "{what}");
            let machine = if *kind == "macho" {
                "aarch64"
            } else if *kind == "coff" {
                "x86_64"
            } else {
                "wasm32"
            };
            assert_eq!(c.machine, machine, "{what}");
            // An independent cut agrees where `object` alone can make one.
            let data = std::fs::read(&path).unwrap();
            if ["macho.dylib", "coff.dll", "coff.devc.obj"].contains(file) {
                let (name, bytes) = cut_with_object(&data).unwrap_or_else(|| panic!("{what}: no cut"));
                assert_eq!(name, *symbol, "{what}");
                assert!(bytes == golden, "{what}: the independent cut differs");
            }
        }
    }
}

/// `--load` (and so `run`) refuses a library built for another machine or system, saying so,
/// and `inspect` exits non-zero when it prints an error.
#[test]
fn foreign_containers_are_refused_by_load_with_what_they_are_built_for() {
    let fx = dir("containers");
    for (file, says) in [
        ("tvm27-macho.dylib", "built for aarch64/macOS/iOS"),
        ("tvm19-coff.dll", "built for x86_64/Windows"),
        ("tvm27-wasm.wasm", "built for wasm32/WebAssembly"),
    ] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_mblob")).arg("inspect").arg("--load").arg(fx.join(file)).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file}");
        assert!(err.contains(says) && err.contains("cannot be loaded or run here"), "{file}: {err}");
    }
}

/// MLC-LLM's published libraries (github.com/mlc-ai/binary-mlc-llm-libs at commit
/// 9ee759c847e114b7e8934819da4c8e5b00ac5d97; the `.gz` files are gzip of the file at that path):
/// each one's blob, read by `inspect`, gives the same facts as the blob cut out independently
/// and parsed as a raw blob.
#[test]
fn mlc_published_libraries_read_as_their_raw_blobs_do() {
    let fx = dir("mlc-libs");
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        // (fixture, path in the repository, container, symbol, machine)
        (
            "RedPajama-INCITE-Chat-3B-v1-q4f32_1-android.tar",
            "RedPajama-INCITE-Chat-3B-v1/RedPajama-INCITE-Chat-3B-v1-q4f32_1-android.tar",
            "elf",
            "gpt_neox_q4f32_1___tvm_dev_mblob",
            "aarch64",
        ),
        (
            "Mistral-7B-Instruct-v0.2-q3f16_1-iphone.tar",
            "Mistral-7B-Instruct-v0.2/Mistral-7B-Instruct-v0.2-q3f16_1-iphone.tar",
            "macho",
            "mistral_q3f16_1___tvm_dev_mblob",
            "aarch64",
        ),
        ("gpt2-q0f16-metal.so.gz", "gpt2/gpt2-q0f16-metal.so", "macho", "__tvm_dev_mblob", "aarch64"),
        ("gpt2-q0f16-ctx1k-webgpu.wasm.gz", "gpt2/gpt2-q0f16-ctx1k-webgpu.wasm", "wasm", "__tvm_dev_mblob", "wasm32"),
    ];
    for (fixture, origin, format, symbol, machine) in cases {
        let what = format!("{fixture} ({origin})");
        let raw = std::fs::read(fx.join(fixture)).unwrap();
        let data = if fixture.ends_with(".gz") { gunzip(&raw) } else { raw };
        let r = inspect_bytes(&Bytes::from_vec(data.clone()), Path::new(fixture), None, None)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.symbol.as_deref(), Some(*symbol), "{what}");
        let c = r.container.as_ref().unwrap();
        assert_eq!((c.format, c.machine.as_str()), (*format, *machine), "{what}");
        let layout = Layout::from_name(r.layout.unwrap()).unwrap();
        let blob = r.blob.as_ref().unwrap();
        // The independent cut: the member (tars) or file, its symbol found by `object`.
        let holder = if fixture.ends_with(".tar") {
            let member = r.tar.as_ref().unwrap().blob_member.clone().unwrap();
            let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&data[..]));
            let mut bytes = Vec::new();
            for e in archive.entries().unwrap() {
                let mut e = e.unwrap();
                if e.path().unwrap().to_string_lossy() == member {
                    e.read_to_end(&mut bytes).unwrap();
                }
            }
            bytes
        } else {
            data.clone()
        };
        if *format == "wasm" {
            // Linear memory rebuilt from data segments: every run of the blob between runs of
            // zeros lies in the file, in order.
            let mut at = 0usize;
            for chunk in blob.split(|b| *b == 0).filter(|c| c.len() >= 32) {
                let found = holder[at..].windows(chunk.len()).position(|w| w == chunk);
                let found = found.unwrap_or_else(|| panic!("{what}: a run of the blob is not in the file"));
                at += found + chunk.len();
            }
        } else {
            let (name, bytes) = cut_with_object(&holder).unwrap_or_else(|| panic!("{what}: no independent cut"));
            assert_eq!(name, *symbol, "{what}");
            assert!(bytes == blob[..], "{what}: the independent cut differs");
        }
        let independent = raw_reading(blob, layout);
        assert_eq!(blob_facts(&r), blob_facts(&independent), "{what}");
        // The facts are those of an MLC model library: a Relax executable with its kernels.
        assert!(r.type_keys.iter().any(|k| k == "relax.Executable"), "{what}: {:?}", r.type_keys);
        let relax = r.modules.iter().find_map(|m| m.relax.as_ref()).unwrap();
        for f in ["prefill", "decode", "_metadata"] {
            assert!(relax.functions.iter().any(|x| x.name == f), "{what}: no {f}");
        }
        assert!(r.modules.iter().any(|m| m.device.as_ref().is_some_and(|d| !d.functions.0.is_empty())), "{what}");
    }
}

/// Mutated containers (bytes overwritten, files cut short) give the blob or a typed error whose
/// offset lies in the file, never a panic.
#[test]
fn mutated_containers_give_typed_errors_inside_the_file() {
    use mblob::runtime::container::find_blob;
    let fx = dir("containers");
    for file in ["tvm27-macho.dylib", "tvm19-macho.fat.dylib", "tvm27-macho.a", "tvm19-coff.dll", "tvm27-coff.devc.obj"]
        .into_iter()
        .chain(["tvm27-wasm.wasm", "tvm27-wasm.devc.o"])
    {
        let data = std::fs::read(fx.join(file)).unwrap();
        let step = (data.len() / 400).max(1);
        let mut cases: Vec<Vec<u8>> = (0..data.len()).step_by(step).map(|n| data[..n].to_vec()).collect();
        for at in (0..data.len()).step_by(step) {
            for value in [0x00, 0xff, 0x7f] {
                let mut d = data.clone();
                d[at] = value;
                cases.push(d);
            }
        }
        for d in cases {
            let n = d.len() as u64;
            match find_blob(&Bytes::from_vec(d), None) {
                Ok(Some(found)) => assert!(found.bytes.len() as u64 <= n.saturating_mul(40) + 4096, "{file}"),
                Ok(None) => {}
                Err(e) => assert!(e.offset <= n, "{file}: {e}"),
            }
        }
    }
}

/// `inspect` exits non-zero when it prints a payload's error (here a VM version no TVM wrote),
/// and still prints the report.
#[test]
fn inspect_exits_non_zero_when_a_payload_does_not_decode() {
    let mut blob = std::fs::read(dir("containers").join("tvm27-coff.blob")).unwrap();
    let at = blob.windows(4).position(|w| w == b"0.14").unwrap();
    blob[at..at + 4].copy_from_slice(b"0.15");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.blob");
    std::fs::write(&path, &blob).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mblob")).arg("inspect").arg(&path).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("relax.VMExecutable") && stderr.contains("\"0.15\""), "{stdout}{stderr}");
}

/// TVM 0.22+'s `bool` constant (DLPack code 6, 8 bits) is named `bool`, as TVM names it.
#[test]
fn tvm_bool_constants_are_named_bool() {
    let path = dir("containers").join("tvm27-bool.blob");
    let r = inspect_path(&path, &Options::default()).unwrap();
    let relax = r.modules.iter().find_map(|m| m.relax.as_ref()).unwrap();
    let c: Vec<(&str, &[i64])> = relax.constants.iter().map(|c| (c.dtype.as_str(), &c.shape[..])).collect();
    assert_eq!(c, [("bool", &[4i64][..])]);
    // The type checks TVM compiled name the same type, as a string constant.
    assert!(relax.calls.iter().any(|c| c.callee == "vm.builtin.check_tensor_info" && c.args.contains(&"bool".into())));
}

/// MLC's libraries: the string constants, the builtin calls' constant arguments (the KV-cache
/// create call) and `inspect --metadata` (the `_metadata` JSON, read without running code),
/// checked against what the file names say (model and quantization) and the constant pool.
#[test]
fn mlc_metadata_strings_and_builtin_calls_are_shown() {
    let fx = dir("mlc-libs");
    let tmp = tempfile::tempdir().unwrap();
    for (fixture, model_type, quantization) in [
        ("RedPajama-INCITE-Chat-3B-v1-q4f32_1-android.tar", "gpt_neox", "q4f32_1"),
        ("Mistral-7B-Instruct-v0.2-q3f16_1-iphone.tar", "mistral", "q3f16_1"),
        ("gpt2-q0f16-metal.so.gz", "gpt2", "q0f16"),
        ("gpt2-q0f16-ctx1k-webgpu.wasm.gz", "gpt2", "q0f16"),
    ] {
        let raw = std::fs::read(fx.join(fixture)).unwrap();
        let path = if let Some(name) = fixture.strip_suffix(".gz") {
            let p = tmp.path().join(name);
            std::fs::write(&p, gunzip(&raw)).unwrap();
            p
        } else {
            fx.join(fixture)
        };
        let out =
            Command::new(env!("CARGO_BIN_EXE_mblob")).arg("inspect").arg("--metadata").arg(&path).output().unwrap();
        assert!(out.status.success(), "{fixture}: {}", String::from_utf8_lossy(&out.stderr));
        let meta: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{fixture}: {e}"));
        assert_eq!(meta["model_type"], model_type, "{fixture}");
        assert_eq!(meta["quantization"], quantization, "{fixture}");
        // The same text is a string constant of the pool, and `--json` gives it whole.
        let r = inspect_path(&path, &Options::default()).unwrap();
        let relax = r.modules.iter().find_map(|m| m.relax.as_ref()).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(relax.strings.iter().any(|s| s.text == text.trim_end()), "{fixture}");
        assert_eq!(relax.metadata.as_deref(), Some(text.trim_end()));
        // A builtin call with constant arguments: every one names a builtin, and its constant
        // arguments are values of the pool.
        assert!(!relax.calls.is_empty(), "{fixture}");
        for c in &relax.calls {
            assert!(relax.externs.contains(&c.callee) && c.callee.contains('.'), "{fixture}: {}", c.callee);
        }
        // The text form abbreviates long strings.
        let out = Command::new(env!("CARGO_BIN_EXE_mblob")).arg("inspect").arg(&path).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--json gives it whole") && text.contains("call vm.builtin."), "{fixture}");
    }
    // gpt2's KV caches: `attention_kv_cache_create(c[k], shape, 0)`, the shape that of c[k].
    let gpt2 = tmp.path().join("gpt2-q0f16-metal.so");
    let r = inspect_path(&gpt2, &Options::default()).unwrap();
    let relax = r.modules.iter().find_map(|m| m.relax.as_ref()).unwrap();
    let creates: Vec<_> = relax.calls.iter().filter(|c| c.callee == "vm.builtin.attention_kv_cache_create").collect();
    assert_eq!(creates.len(), 24, "12 layers, a key and a value cache each");
    let c = &relax.constants[0];
    for call in creates {
        let want = serde_json::json!([format!("tensor {}{:?}", c.dtype, c.shape), c.shape, 0]);
        assert_eq!(Value::Array(call.args.clone()), want);
    }
}
