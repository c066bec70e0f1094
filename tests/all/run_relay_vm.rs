//! `mblob run` on Relay VM executables (TVM 0.19's `relay.vm.compile` + `export_library`,
//! `tests/fixtures/relay-vm`): every case's output files equal TVM's byte for byte; inputs by
//! position and by name; `--function` selects a VM function; a corrupt executable fails
//! cleanly.

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/relay-vm")
}

fn run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).arg("run").args(args).output().expect("run mblob")
}

/// The array bytes of a `.npy` file (after its header), and the header's dtype and shape text.
fn npy_body(path: &Path) -> (String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let header = format!("{} {:?}", f.dtype().descr(), f.shape());
    let n = f.shape().iter().product::<u64>() as usize;
    let size = match f.dtype().descr().trim_matches('\'') {
        "<f4" | "<i4" => 4,
        "<i8" => 8,
        d => panic!("{d}"),
    };
    (header, bytes[bytes.len() - n * size..].to_vec())
}

#[test]
fn mblob_run_relay_vm_models_give_tvms_outputs() {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir().join("manifest.json")).unwrap()).unwrap();
    for case in manifest["cases"].as_array().unwrap() {
        let name = case["case"].as_str().unwrap();
        let out = tempfile::tempdir().unwrap();
        let lib = dir().join(case["library"].as_str().unwrap());
        let mut args: Vec<std::ffi::OsString> = vec![lib.into(), "--output-dir".into(), out.path().into()];
        for i in 0..case["inputs"].as_u64().unwrap() {
            args.push("--input".into());
            args.push(dir().join(format!("{name}.in.{i}.npy")).into());
        }
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let o = run(&refs);
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        for i in 0..case["outputs"].as_u64().unwrap() {
            let want = npy_body(&dir().join(format!("{name}.out.{i}.npy")));
            let got = npy_body(&out.path().join(format!("out.{i}.npy")));
            assert_eq!(got, want, "{name} output {i}");
        }
        assert!(!out.path().join(format!("out.{}.npy", case["outputs"].as_u64().unwrap())).exists(), "{name}");
    }
}

#[test]
fn inputs_by_name_and_function_selection() {
    let out = tempfile::tempdir().unwrap();
    let d = dir();
    let n = format!("n={}", d.join("loop.0.in.0.npy").display());
    let x = format!("x={}", d.join("loop.0.in.1.npy").display());
    // Given in the other order, by name.
    let o = run(&[
        d.join("loop.so").as_os_str(),
        "--function".as_ref(),
        "main".as_ref(),
        "--input".as_ref(),
        x.as_ref(),
        "--input".as_ref(),
        n.as_ref(),
        "--output-dir".as_ref(),
        out.path().as_os_str(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(npy_body(&out.path().join("out.0.npy")), npy_body(&d.join("loop.0.out.0.npy")));
    // An unknown function names the executable's.
    let o = run(&[d.join("loop.so").as_os_str(), "--function".as_ref(), "nope".as_ref()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nope") && err.contains("main") && err.contains("loop"), "{err}");
    // A missing input is named.
    let o = run(&[d.join("loop.so").as_os_str(), "--input".as_ref(), x.as_ref()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing inputs") && err.contains('n'), "{err}");
}

/// A library whose executable has a corrupted instruction fails with the loader's error
/// (exit 1), not a crash.
#[test]
fn corrupt_executable_fails_cleanly() {
    let bytes = std::fs::read(dir().join("closure.so")).unwrap();
    // The `ret $5` instruction at the end of the executable: change its register.
    let needle: Vec<u8> = [1i64, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let at = bytes.windows(16).rposition(|w| w == needle.as_slice()).expect("ret $5 in the blob");
    let mut b = bytes.clone();
    b[at + 8] = 4;
    let tmp = tempfile::tempdir().unwrap();
    let lib = tmp.path().join("closure.so");
    std::fs::write(&lib, b).unwrap();
    let x = dir().join("closure.0.in.0.npy");
    let o = run(&[lib.as_os_str(), "--input".as_ref(), x.as_os_str()]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("instruction hash"), "{err}");
}

/// `mblob pack` carries the executable over unchanged: the re-packed blob's `VMExecutable`
/// payload is TVM's, byte for byte.
#[test]
fn pack_keeps_the_executable() {
    let tmp = tempfile::tempdir().unwrap();
    let mblob = env!("CARGO_BIN_EXE_mblob");
    let packed = tmp.path().join("mlp.so");
    let o = Command::new(mblob)
        .args(["pack", "-q", "--blob-only", "--from"])
        .arg(dir().join("mlp.so"))
        .arg("-o")
        .arg(&packed)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut payloads = Vec::new();
    for (i, lib) in [dir().join("mlp.so"), packed].iter().enumerate() {
        let out = tmp.path().join(format!("x{i}"));
        let o = Command::new(mblob).arg("extract").arg("-o").arg(&out).arg(lib).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        payloads.push(std::fs::read(out.join("0.VMExecutable.bin")).unwrap());
    }
    assert!(payloads[0].len() > 1000);
    assert_eq!(payloads[0], payloads[1]);
}
