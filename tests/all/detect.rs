//! Raw `.blob` files: the layout is told from the bytes alone, and every golden is read as the
//! layout its TVM wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use mblob_runtime::format::detect::DetectError;
use mblob_runtime::{Layout, Registry};

use crate::goldens::{goldens, read};

/// Every golden `.blob` with the layout of the TVM that wrote it (the folder says which).
fn golden_blobs() -> Vec<(PathBuf, Layout)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "blob") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&goldens(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let s = p.to_string_lossy();
            let layout = if s.contains("tvm-0.27") {
                Layout::Ffi
            } else if s.contains("tvm-0.21") {
                Layout::Classic021
            } else {
                // The top level, device/ and other_versions/tvm-0.19.0 are TVM 0.19's.
                Layout::Classic
            };
            (p, layout)
        })
        .collect()
}

#[test]
fn every_golden_blob_is_detected_as_the_layout_its_tvm_wrote() {
    let blobs = golden_blobs();
    assert_eq!(blobs.len(), 24, "the goldens hold 24 .blob files");
    let registry = Registry::default();
    for (path, want) in &blobs {
        let got = Layout::detect(&read(path), &registry).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(got, *want, "{}", path.display());
    }
}

#[test]
fn bytes_that_fit_no_layout_say_why_each_failed() {
    let registry = Registry::default();
    let mut forged = read(&goldens().join("device/tvm-0.27.0.post1/nvptx_vector_add.blob"));
    let last = forged.len() - 1;
    forged[last] ^= 0xff;
    forged.push(0);
    let err = Layout::detect(&forged, &registry).unwrap_err();
    let DetectError::NoneFits { failures } = &err else { panic!("{err}") };
    assert_eq!(failures.iter().map(|(l, _)| *l).collect::<Vec<_>>(), Layout::ALL);
    let msg = err.to_string();
    for layout in Layout::ALL {
        assert!(msg.contains(&format!("as {layout}:")), "{msg}");
    }
}

#[test]
fn inspect_reports_each_golden_blob_in_its_layout() {
    for (path, want) in golden_blobs() {
        let out = Command::new(env!("CARGO_BIN_EXE_mblob")).arg("inspect").arg(&path).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find(|l| l.trim_start().starts_with("layout")).unwrap_or_default();
        assert_eq!(line.split_whitespace().nth(1), Some(want.name()), "{}:\n{text}", path.display());
        assert!(!line.contains("legacy"), "{}:\n{text}", path.display());
    }
}

#[test]
fn pack_from_a_raw_blob_uses_the_same_detection() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host.c");
    std::fs::write(&host, "int mblob_host_marker(void) { return 7; }\n").unwrap();
    let obj = dir.path().join("host.o");
    let cc = Command::new("cc").arg("-c").arg("-fPIC").arg(&host).arg("-o").arg(&obj).status().unwrap();
    assert!(cc.success());
    let blob = goldens().join("device/tvm-0.27.0.post1/opencl_two_kernels.blob");
    let so = dir.path().join("out.so");
    let out = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .args(["pack", "-q", "--layout", "ffi", "--backend", "c", "--from"])
        .arg(&blob)
        .arg("--host")
        .arg(&obj)
        .arg("-o")
        .arg(&so)
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Read as ffi, the blob is written back byte for byte; misread, a kernel went missing.
    let data = read(&so);
    let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
    assert_eq!(found.bytes(&data).unwrap(), &read(&blob)[..]);
}
