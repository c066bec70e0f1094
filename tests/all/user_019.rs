//! Models a new user wrote against the TVM 0.19 features of issue 21 (`tests/fixtures/user-0.19`,
//! made by TVM 0.19 and run by its own runtime): topk along a middle axis, int64 argsort,
//! float16 sort, NMS with `return_indices`, a Relay VM `while_loop`, a trio whose params file
//! holds params the graph does not take, and TVM's `.tar` of an AOT model and of a BYOC model
//! (whose `ccompiler` code the archive holds as C source). Every output equals TVM's, bit for bit.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/user-0.19")
}

fn mblob(args: &[OsString], tmpdir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).env("TMPDIR", tmpdir).output().expect("run mblob")
}

fn ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `.npy` file's dtype and shape, and its array bytes.
fn npy(path: &Path) -> (String, Vec<u64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let descr = f.dtype().descr().trim_matches('\'').to_owned();
    let shape = f.shape().to_vec();
    let size = match descr.as_str() {
        "<f2" => 2,
        "<f4" | "<i4" => 4,
        "<i8" => 8,
        d => panic!("{}: dtype {d}", path.display()),
    };
    let n = shape.iter().product::<u64>() as usize * size;
    (descr, shape, bytes[bytes.len() - n..].to_vec())
}

fn manifest() -> Vec<serde_json::Value> {
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(dir().join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["tvm"], "0.19.0");
    m["cases"].as_array().unwrap().clone()
}

/// Runs every run of `case` with `mblob run LIB [extra]` and compares each output with TVM's.
fn runs_as_tvm(case: &serde_json::Value, lib: &Path, extra: &[OsString], tmp: &Path) {
    let name = case["case"].as_str().unwrap();
    for (r, run) in case["runs"].as_array().unwrap().iter().enumerate() {
        let out = tmp.join(format!("{name}.{r}"));
        let mut args: Vec<OsString> = vec!["run".into(), lib.into()];
        args.extend(extra.iter().cloned());
        for input in run["inputs"].as_array().unwrap() {
            let mut a = OsString::from(format!("{}=", input[0].as_str().unwrap()));
            a.push(dir().join(input[1].as_str().unwrap()));
            args.extend(["--input".into(), a]);
        }
        args.extend(["--output-dir".into(), out.clone().into()]);
        ok(&format!("{name} run {r}"), &mblob(&args, tmp));
        let want = run["outputs"].as_array().unwrap();
        for (k, w) in want.iter().enumerate() {
            let got = npy(&out.join(format!("out.{k}.npy")));
            assert_eq!(got, npy(&dir().join(w.as_str().unwrap())), "{name} run {r} output {k} differs from TVM's");
        }
        assert!(!out.join(format!("out.{}.npy", want.len())).exists(), "{name} run {r}: more outputs than TVM's");
    }
}

#[test]
fn graph_and_relay_vm_models_give_tvms_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for case in manifest() {
        if matches!(case["kind"].as_str(), Some("graph" | "relay-vm")) {
            runs_as_tvm(&case, &dir().join(case["library"].as_str().unwrap()), &[], tmp.path());
            seen += 1;
        }
    }
    assert_eq!(seen, 6);
}

#[test]
fn a_trio_whose_params_file_has_params_the_graph_does_not_take_runs_as_tvm() {
    let tmp = tempfile::tempdir().unwrap();
    let case = manifest().into_iter().find(|c| c["kind"] == "trio").unwrap();
    let extra: Vec<OsString> = vec![
        "--graph".into(),
        dir().join(case["graph"].as_str().unwrap()).into(),
        "--params".into(),
        dir().join(case["params"].as_str().unwrap()).into(),
    ];
    runs_as_tvm(&case, &dir().join(case["library"].as_str().unwrap()), &extra, tmp.path());
}

/// `pack --from X.tar` (with `extra` options), then the packed library runs as TVM ran it.
fn tar_case(name: &str, extra: &[OsString]) {
    let tmp = tempfile::tempdir().unwrap();
    let case = manifest().into_iter().find(|c| c["case"] == name).unwrap();
    let so = tmp.path().join(format!("{name}.so"));
    let mut args: Vec<OsString> =
        vec!["pack".into(), "--from".into(), dir().join(case["library"].as_str().unwrap()).into()];
    args.extend(extra.iter().cloned());
    args.extend(["-o".into(), so.clone().into(), "-q".into()]);
    ok(&format!("pack --from {name}.tar"), &mblob(&args, tmp.path()));
    runs_as_tvm(&case, &so, &[], tmp.path());
}

#[test]
fn pack_from_an_aot_tar_runs_as_tvm() {
    tar_case("aot_tar", &[]);
}

#[test]
fn pack_from_a_byoc_tar_compiles_its_c_source_member() {
    // TVM writes the ccompiler module as lib0.c, which includes TVM's headers: here the test's
    // stand-ins for them (a user gives TVM's own with -I).
    let case = manifest().into_iter().find(|c| c["case"] == "byoc_tar").unwrap();
    assert_eq!(case["members"], serde_json::json!(["devc.o", "lib0.c", "lib1.o"]));
    tar_case("byoc_tar", &["-I".into(), dir().join("include").into()]);

    // Without the headers, the C source is compiled (and fails, naming it), not left out.
    let tmp = tempfile::tempdir().unwrap();
    let so = tmp.path().join("b.so");
    let out = mblob(
        &[
            "pack".into(),
            "--from".into(),
            dir().join("byoc_tar.tar").into(),
            "-o".into(),
            so.clone().into(),
            "-q".into(),
        ],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lib0.c") && err.contains("c_runtime_api.h"), "{err}");
    assert!(!so.exists());
}
