//! How a library was packed (layout, symbol, `c_symbol_prefix`, system-lib registration) is
//! read from the source and kept through `pack --from`, `extract` and `export`, checked against
//! what TVM 0.27 wrote (tests/fixtures/containers/tvm27-syslib.tar: a system-lib build whose
//! prefix, `TinyLlama_1.1b_q4f16_1_`, is one MLC wrote).

use std::ffi::OsStr;
#[cfg(feature = "llvm")]
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mblob::runtime::container::find_blob;
use mblob::runtime::map_file;
#[cfg(feature = "llvm")]
use mblob::runtime::Layout;

#[cfg(feature = "llvm")]
const PREFIX: &str = "TinyLlama_1.1b_q4f16_1_";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn mblob(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).output().unwrap()
}

fn ok(out: &Output) {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// TVM's own blob object in the archive.
#[cfg(feature = "llvm")]
fn tvm_devc() -> Vec<u8> {
    let data = std::fs::read(fixtures().join("containers/tvm27-syslib.tar")).unwrap();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&data[..]));
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_string_lossy().ends_with(&format!("{PREFIX}devc.o")) {
            let mut out = Vec::new();
            e.read_to_end(&mut out).unwrap();
            return out;
        }
    }
    panic!("no devc.o")
}

/// The blob symbol, prefix and system-lib mode of a library.
#[cfg(feature = "llvm")]
fn packing_of(path: &Path) -> (String, String, bool, Vec<u8>) {
    let data = map_file(path).unwrap();
    let found = find_blob(&data, None).unwrap().unwrap();
    (found.symbol, found.prefix, found.system_lib, found.bytes.to_vec())
}

// The blob object is compared with TVM's byte for byte, which the LLVM route writes; without
// LLVM the C route refuses this prefix (`.` cannot be in a C name), as TVM's C route would.
#[cfg(feature = "llvm")]
#[test]
fn pack_from_a_system_lib_tar_keeps_its_prefix_and_registration() {
    let tar = fixtures().join("containers/tvm27-syslib.tar");
    let dir = tempfile::tempdir().unwrap();
    let (so, devc) = (dir.path().join("out.so"), dir.path().join("devc"));
    // No --prefix, no --system-lib: the archive's are kept, and its host object, which
    // defines the kernels under the prefix, passes the host-code check.
    ok(&mblob(&[
        "pack".as_ref(),
        "--from".as_ref(),
        tar.as_os_str(),
        "--emit-devc".as_ref(),
        devc.as_os_str(),
        "-o".as_ref(),
        so.as_os_str(),
    ]));
    let ours = std::fs::read(devc.join(format!("{PREFIX}devc.o"))).unwrap();
    assert!(ours == tvm_devc(), "the blob object is not TVM's");
    let (symbol, prefix, system_lib, _) = packing_of(&so);
    assert_eq!(
        (symbol.as_str(), prefix.as_str(), system_lib),
        (&*format!("{PREFIX}__tvm_ffi__library_bin"), PREFIX, true)
    );
}

// The blob object is compared with TVM's byte for byte, which the LLVM route writes; without
// LLVM the C route refuses this prefix (`.` cannot be in a C name), as TVM's C route would.
#[cfg(feature = "llvm")]
#[test]
fn extract_then_export_rebuilds_the_same_library_by_default() {
    let dir = tempfile::tempdir().unwrap();
    // A system-lib archive (prefix, registration) and a plain TVM 0.27 library (ffi layout,
    // which `export` did not default to).
    let plain = fixtures().join("tvm-goldens/other_versions/tvm-0.27.0.post1");
    for (i, source) in
        [fixtures().join("containers/tvm27-syslib.tar"), plain.join("relax_add_mul.so")].iter().enumerate()
    {
        let x = dir.path().join(format!("x{i}"));
        ok(&mblob(&["extract".as_ref(), source.as_os_str(), "-o".as_ref(), x.as_os_str()]));
        let tree: serde_json::Value = serde_json::from_slice(&std::fs::read(x.join("tree.json")).unwrap()).unwrap();
        assert_eq!(tree["layout"], "ffi", "{tree}");
        if i == 1 {
            // A shared library's host code is its own: give its TVM object back.
            std::fs::copy(plain.join("relax_add_mul.lib0.o"), x.join("lib0.o")).unwrap();
            let mut t = tree.clone();
            t["imports"][0]["objects"] = serde_json::json!(["lib0.o"]);
            std::fs::write(x.join("tree.json"), serde_json::to_vec(&t).unwrap()).unwrap();
        }
        let (so, devc) = (dir.path().join(format!("y{i}.so")), dir.path().join(format!("devc{i}")));
        let tree_path = x.join("tree.json");
        ok(&mblob(&[
            "export".as_ref(),
            tree_path.as_os_str(),
            "--emit-devc".as_ref(),
            devc.as_os_str(),
            "-o".as_ref(),
            so.as_os_str(),
        ]));
        let (symbol, prefix, system_lib, blob) = packing_of(&so);
        let source_data = map_file(source).unwrap();
        let want = if i == 0 {
            assert!(std::fs::read(devc.join(format!("{PREFIX}devc.o"))).unwrap() == tvm_devc(), "not TVM's devc.o");
            let t = mblob::tvm_tar::TvmTar::from_bytes(&source_data, source).unwrap().unwrap();
            let m = t.blob_member(None).unwrap().unwrap();
            (m.found.symbol.clone(), m.found.prefix.clone(), m.found.system_lib, m.blob.to_vec())
        } else {
            let f = find_blob(&source_data, None).unwrap().unwrap();
            (f.symbol, f.prefix, f.system_lib, f.bytes.to_vec())
        };
        assert_eq!((&symbol, &prefix, system_lib), (&want.0, &want.1, want.2), "{}", source.display());
        assert!(blob == want.3, "{}: the blob differs", source.display());
        assert_eq!(Layout::from_symbol(&symbol).unwrap().0, Layout::Ffi);
    }
}

#[test]
fn tree_json_packing_fields_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree.json");
    for (json, says) in [
        (r#"{"layout": "ffi", "symbol": "__tvm_dev_mblob", "type_key": "llvm", "objects": []}"#, "does not agree"),
        (r#"{"layout": "newest", "type_key": "llvm", "objects": []}"#, "unknown layout `newest`"),
        (r#"{"symbol": "blob", "type_key": "llvm", "objects": []}"#, "no blob symbol"),
        (r#"{"system_lib": "yes", "type_key": "llvm", "objects": []}"#, "expected a boolean"),
    ] {
        std::fs::write(&tree, json).unwrap();
        let out = mblob(&["export".as_ref(), tree.as_os_str(), "-o".as_ref(), dir.path().join("o.so").as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{json}: {err}");
    }
}

/// `--target` / host objects for another machine: the target's compiler (`CC_<triple>`), else
/// `ld.lld` directly, else a refusal before any work that names what to install; never the
/// host `cc`'s raw "incompatible" error.
#[test]
fn a_cross_target_links_with_the_targets_tools_or_is_refused_up_front() {
    let fx = fixtures().join("cross-aarch64");
    let dir = tempfile::tempdir().unwrap();
    let (blob, lib0) = (fx.join("graph_add.blob"), fx.join("graph_add.lib0.o"));
    let run = |out: &Path, extra: &[&str], env: &[(&str, &OsStr)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mblob"));
        cmd.args(["pack", "--from"]).arg(&blob).arg("--host").arg(&lib0).arg("-o").arg(out).args(extra);
        for var in ["CC_aarch64_unknown_linux_gnu", "CC_aarch64-unknown-linux-gnu", "CC_aarch64_linux_gnu", "TARGET_CC"]
        {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // The target's compiler, named by the cc crate's variable, is the one run.
    let log = dir.path().join("args.txt");
    let fake = dir.path().join("fake-cc.sh");
    std::fs::write(&fake, format!("#!/bin/sh\necho \"$@\" > {}\nexit 3\n", log.display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = run(&dir.path().join("a.so"), &[], &[("CC_aarch64_unknown_linux_gnu", fake.as_os_str())]);
    assert!(!out.status.success());
    let args = std::fs::read_to_string(&log).expect("the target's compiler ran");
    assert!(args.contains("-shared") && args.contains("graph_add.lib0.o"), "{args}");
    assert!(!args.contains("--sysroot"), "{args}");
    // An NDK's sysroot goes to it.
    let ndk = dir.path().join("ndk-sysroot");
    let sysroot = ["--sysroot", ndk.to_str().unwrap()];
    let out = run(&dir.path().join("a.so"), &sysroot, &[("CC_aarch64_unknown_linux_gnu", fake.as_os_str())]);
    assert!(!out.status.success());
    let args = std::fs::read_to_string(&log).unwrap();
    assert!(args.contains(&format!("--sysroot={}", ndk.display())), "{args}");
    // Without a target compiler: ld.lld links the AArch64 objects itself, when installed.
    if mblob::link::find_lld().is_some() {
        let so = dir.path().join("b.so");
        let out = run(&so, &[], &[]);
        ok(&out);
        let data = map_file(&so).unwrap();
        let found = find_blob(&data, None).unwrap().unwrap();
        assert_eq!(found.identity.machine, "aarch64");
        assert!(found.bytes[..] == std::fs::read(&blob).unwrap()[..], "not TVM's blob");
    }
    // With neither (the driver's default linker asked for): refused before any work, naming
    // the variable to set and the tools to install.
    let so = dir.path().join("c.so");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let out = run(&so, &["--linker", "default"], &[("PATH", &path)]);
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.contains("aarch64-linux-gnu-gcc") || out.status.success() {
        // An AArch64 gcc is installed here: nothing to refuse.
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("CC_aarch64_unknown_linux_gnu") && err.contains("lld"), "{err}");
    assert!(!err.contains("incompatible"), "{err}");
    assert!(!so.exists());
}

/// `mblob pack --from FROM --host HOST --layout LAYOUT --force-layout -o SO`, which must succeed.
fn pack_forced(from: &Path, host: &Path, layout: &str, so: &Path) {
    let args: [&OsStr; 10] = [
        "pack".as_ref(),
        "--from".as_ref(),
        from.as_os_str(),
        "--host".as_ref(),
        host.as_os_str(),
        "--layout".as_ref(),
        layout.as_ref(),
        "--force-layout".as_ref(),
        "-o".as_ref(),
        so.as_os_str(),
    ];
    ok(&mblob(&args));
}

/// One classifier of host code: TVM 0.19 code packed under the tvm-ffi layout's symbol
/// (`--force-layout`) is reported by `inspect` in its own convention (classic packed), the one
/// the loader calls it in, not the layout's.
#[test]
fn inspect_reports_the_codes_convention_not_the_layouts() {
    let g = fixtures().join("tvm-goldens");
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("forced.so");
    let (from, host) = (g.join("graph_dense_relu.so"), g.join("graph_dense_relu.lib0.o"));
    pack_forced(&from, &host, "ffi", &so);
    let out = mblob(&["inspect".as_ref(), "--json".as_ref(), so.as_os_str()]);
    ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["symbol"], "__tvm_ffi__library_bin");
    assert_eq!(r["host"]["convention"], "classic-packed", "{}", r["host"]);
    let data = std::fs::read(&so).unwrap();
    assert_eq!(mblob::runtime::format::convention::classify_file(&data), Some(mblob::runtime::Layout::Classic));
    // And the pack check, the same classifier, names that convention.
    assert_eq!(mblob::pack::abi::detect(&host).unwrap(), Some(mblob::runtime::Layout::Classic));
}

/// One TVM generation for the host code, wherever it is asked: TVM 0.19's Relax program
/// (`relax_add_mul`, built by TVM 0.19) packed under each newer layout with `--force-layout`
/// keeps the blob in the layout asked for, while `inspect`, `pack`'s check and the loader all
/// tell the code's own generation (classic), the loader calls it in that convention, and
/// `run` gives TVM's output.
#[test]
fn a_forced_relax_build_is_reported_and_called_as_its_code_is() {
    use mblob::runtime::Layout;
    let g = fixtures().join("tvm-goldens");
    let dir = tempfile::tempdir().unwrap();
    let (from, host) = (g.join("relax_add_mul.so"), g.join("relax_add_mul.lib0.o"));
    assert_eq!(mblob::pack::abi::detect(&host).unwrap(), Some(Layout::Classic));
    for layout in [Layout::Classic021, Layout::Ffi] {
        let so = dir.path().join(format!("forced-{layout}.so"));
        pack_forced(&from, &host, layout.name(), &so);
        let out = mblob(&["inspect".as_ref(), "--json".as_ref(), so.as_os_str()]);
        ok(&out);
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["symbol"], layout.symbol(), "{layout}");
        assert_eq!(r["host"]["convention"], "classic-packed", "{layout}: {}", r["host"]);
        assert_eq!(mblob::runtime::format::convention::classify_file(&map_file(&so).unwrap()), Some(Layout::Classic));
        // SAFETY: a library packed from TVM's own build, run by this test.
        let tree =
            unsafe { mblob::runtime::load_library(&so, &Default::default(), &mblob::runtime::LoadOptions::default()) }
                .unwrap();
        let add = tree.packed_function("add").unwrap();
        assert_eq!(add.abi(), Some(Layout::Classic), "{layout}: the loader calls the code as what it is");
        let out_dir = dir.path().join(format!("out-{layout}"));
        let inputs = ["x", "y"].map(|n| format!("{n}={}", g.join(format!("relax_add_mul.in.{n}.npy")).display()));
        ok(&mblob(&[
            "run".as_ref(),
            so.as_os_str(),
            "--input".as_ref(),
            inputs[0].as_ref(),
            "--input".as_ref(),
            inputs[1].as_ref(),
            "--output-dir".as_ref(),
            out_dir.as_os_str(),
        ]));
        assert_eq!(
            crate::goldens::npy_f32(&out_dir.join("out.0.npy")),
            crate::goldens::npy_f32(&g.join("relax_add_mul.out.0.npy")),
            "{layout}: not TVM's output"
        );
    }
}
