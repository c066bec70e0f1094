//! TVM's other artifacts (tests/fixtures/trio, made by TVM 0.19 and 0.27): the classic trio
//! (host library, graph JSON, params file) run with `mblob run --graph --params`, and TVM's
//! own gzip-compressed `.tar` exports read by `inspect`, `extract` and `pack --from`, each
//! checked against TVM's outputs bit for bit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn trio() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trio")
}

fn f(name: &str) -> String {
    trio().join(name).to_str().unwrap().to_owned()
}

fn mblob(args: &[&str], tmpdir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).env("TMPDIR", tmpdir).output().expect("run mblob")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A failure with exit status 1; its stderr.
fn fails(out: Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stderr).unwrap()
}

/// A float32 `.npy` file's shape and the bits of its values.
fn npy(path: &Path) -> (Vec<u64>, Vec<u32>) {
    let bytes = std::fs::read(path).unwrap();
    let file = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(file.dtype(), npyz::DType::Plain("<f4".parse().unwrap()), "{}", path.display());
    let shape = file.shape().to_vec();
    let v: Vec<f32> = file.into_vec().unwrap();
    (shape, v.iter().map(|x| x.to_bits()).collect())
}

/// `out.0.npy` of `dir` is TVM's `want`, bit for bit.
fn same_as_tvm(dir: &Path, want: &str) {
    let got = npy(&dir.join("out.0.npy"));
    assert_eq!(got, npy(&trio().join(want)), "mblob's output differs from TVM's {want}");
}

#[test]
fn the_classic_trio_runs_as_tvm_graph_executor_create_and_load_params() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    ok(mblob(
        &[
            "run",
            &f("m.so"),
            "--graph",
            &f("m.json"),
            "--params",
            &f("m.params"),
            "-i",
            &format!("x={}", f("m.in.x.npy")),
            "-o",
            o,
        ],
        tmp.path(),
    ));
    same_as_tvm(&out, "m.out.0.npy");
}

#[test]
fn trio_bad_input_is_a_typed_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let x = format!("x={}", f("m.in.x.npy"));
    // A params file that is not one (the graph JSON given as params).
    let err =
        fails(mblob(&["run", &f("m.so"), "--graph", &f("m.json"), "--params", &f("m.json"), "-i", &x], tmp.path()));
    assert!(err.contains(&format!("{}: not a params file", f("m.json"))), "{err}");
    // A truncated params file.
    let cut = tmp.path().join("cut.params");
    let p = std::fs::read(trio().join("m.params")).unwrap();
    std::fs::write(&cut, &p[..p.len() - 5]).unwrap();
    let err = fails(mblob(
        &["run", &f("m.so"), "--graph", &f("m.json"), "--params", cut.to_str().unwrap(), "-i", &x],
        tmp.path(),
    ));
    assert!(err.contains("cut.params: not a params file"), "{err}");
    // A graph JSON that calls a kernel the library does not have.
    let json = std::fs::read_to_string(trio().join("m.json")).unwrap();
    let other = tmp.path().join("other.json");
    std::fs::write(&other, json.replace("dense_pack_add_nn_relu", "dense_pack_sub_nn_relu")).unwrap();
    let err = fails(mblob(
        &["run", &f("m.so"), "--graph", other.to_str().unwrap(), "--params", &f("m.params"), "-i", &x],
        tmp.path(),
    ));
    assert!(err.contains("other.json does not match") && err.contains("dense_pack_sub_nn_relu"), "{err}");
    // Params of another shape than the graph's inputs.
    let reshaped = tmp.path().join("reshaped.json");
    std::fs::write(&reshaped, json.replace("[1, 8, 4]", "[1, 4, 8]")).unwrap();
    let err = fails(mblob(
        &["run", &f("m.so"), "--graph", reshaped.to_str().unwrap(), "--params", &f("m.params"), "-i", &x],
        tmp.path(),
    ));
    assert!(err.contains("m.params does not match") && err.contains("param `p0`"), "{err}");
    // Not a graph JSON at all.
    let err = fails(mblob(&["run", &f("m.so"), "--graph", &f("m.params"), "-i", &x], tmp.path()));
    assert!(err.contains(&format!("{}: not a graph JSON", f("m.params"))), "{err}");
    // --params without --graph is a usage error.
    let out = mblob(&["run", &f("m.so"), "--params", &f("m.params")], tmp.path());
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn tvm_tars_are_gzip_and_inspect_reads_their_blob_member() {
    let tmp = tempfile::tempdir().unwrap();
    for (tar, layout, key) in [("m.tar", "classic", "GraphExecutorFactory"), ("r.tar", "ffi", "relax.VMExecutable")] {
        assert!(std::fs::read(trio().join(tar)).unwrap().starts_with(&[0x1f, 0x8b]), "TVM's {tar} is gzip");
        let report: serde_json::Value =
            serde_json::from_str(&ok(mblob(&["inspect", "--json", &f(tar)], tmp.path()))).unwrap();
        assert_eq!(report["kind"], "tar");
        assert_eq!(report["layout"], layout);
        assert_eq!(report["type_keys"][0], key);
        assert_eq!(report["tar"]["blob_member"], "devc.o");
        let names: Vec<&str> =
            report["tar"]["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["devc.o", "lib0.o"]);
    }
}

#[test]
fn extract_of_tvm_tar_gives_tvm_graph_json_and_params_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x");
    ok(mblob(&["extract", &f("m.tar"), "-o", out.to_str().unwrap()], tmp.path()));
    // The factory in TVM's devc.o holds what get_graph_json and save_param_dict wrote.
    assert_eq!(std::fs::read(out.join("0.graph.json")).unwrap(), std::fs::read(trio().join("m.json")).unwrap());
    assert_eq!(std::fs::read(out.join("0.params")).unwrap(), std::fs::read(trio().join("m.params")).unwrap());
}

/// `extract` of TVM's `.tar` writes the archive's host objects and lists them in `tree.json`,
/// so `export` of that tree links a library that runs as TVM's (it used to list no objects,
/// and the export was refused for the kernels the graph calls).
#[test]
fn extract_of_tvm_tar_then_export_runs_as_tvm() {
    let tmp = tempfile::tempdir().unwrap();
    for (tar, layout, inputs, want) in [
        ("m.tar", "classic", vec![format!("x={}", f("m.in.x.npy"))], "m.out.0.npy"),
        ("r.tar", "ffi", vec![format!("x={}", f("r.in.x.npy")), format!("y={}", f("r.in.y.npy"))], "r.out.0.npy"),
    ] {
        let dir = tmp.path().join(format!("{tar}.x"));
        ok(mblob(&["extract", &f(tar), "-o", dir.to_str().unwrap(), "-q"], tmp.path()));
        let tree: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("tree.json")).unwrap()).unwrap();
        let text = tree.to_string();
        assert!(text.contains(r#""objects":["lib0.o"]"#), "{tar}: {text}");
        let members = mblob::tvm_tar::TvmTar::open(&trio().join(tar)).unwrap().unwrap();
        let lib0 = members.host_objects().into_iter().find(|m| m.name.ends_with("lib0.o")).unwrap().data.to_vec();
        assert_eq!(std::fs::read(dir.join("lib0.o")).unwrap(), lib0, "{tar}: lib0.o is not the archive's");
        let so = tmp.path().join(format!("{tar}.so"));
        let tree_path = dir.join("tree.json");
        ok(mblob(
            &["export", tree_path.to_str().unwrap(), "--layout", layout, "-o", so.to_str().unwrap(), "-q"],
            tmp.path(),
        ));
        let out = tmp.path().join(format!("{tar}.out"));
        let mut args =
            vec!["run".to_owned(), so.to_str().unwrap().to_owned(), "-o".into(), out.to_str().unwrap().into()];
        for i in &inputs {
            args.extend(["-i".to_owned(), i.clone()]);
        }
        ok(mblob(&args.iter().map(String::as_str).collect::<Vec<_>>(), tmp.path()));
        same_as_tvm(&out, want);
    }
}

#[test]
fn pack_from_tvm_tar_links_its_own_host_objects_and_runs_as_tvm() {
    let tmp = tempfile::tempdir().unwrap();
    for (tar, layout, inputs, want) in [
        ("m.tar", "classic", vec![format!("x={}", f("m.in.x.npy"))], "m.out.0.npy"),
        ("r.tar", "ffi", vec![format!("x={}", f("r.in.x.npy")), format!("y={}", f("r.in.y.npy"))], "r.out.0.npy"),
    ] {
        let so = tmp.path().join(format!("{tar}.so"));
        ok(mblob(&["pack", "--from", &f(tar), "--layout", layout, "-o", so.to_str().unwrap(), "-q"], tmp.path()));
        let out = tmp.path().join(format!("{tar}.out"));
        let mut args =
            vec!["run".to_owned(), so.to_str().unwrap().to_owned(), "-o".into(), out.to_str().unwrap().into()];
        for i in &inputs {
            args.extend(["-i".to_owned(), i.clone()]);
        }
        ok(mblob(&args.iter().map(String::as_str).collect::<Vec<_>>(), tmp.path()));
        same_as_tvm(&out, want);
    }
}

#[test]
fn a_corrupt_tar_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(trio().join("m.tar")).unwrap();
    let cut = tmp.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let so = tmp.path().join("o.so");
    for args in [
        vec!["inspect", cut.to_str().unwrap()],
        vec!["pack", "--from", cut.to_str().unwrap(), "-o", so.to_str().unwrap()],
    ] {
        let err = fails(mblob(&args, tmp.path()));
        assert!(err.contains("cut.tar: not a readable gzip stream"), "{args:?}: {err}");
    }
    assert!(!so.exists());
}

/// The blob of a linked library or of a blob object.
fn blob_of(data: &[u8]) -> Vec<u8> {
    mblob::runtime::elf::find_blob(data, None).unwrap().unwrap().bytes(data).unwrap().to_vec()
}

#[test]
fn export_of_a_tree_json_with_graph_and_params_is_tvms_blob_and_runs_as_tvm() {
    let tmp = tempfile::tempdir().unwrap();
    // TVM's host object and blob object, from TVM's own .tar of the same relay.build result.
    let tar = mblob::tvm_tar::TvmTar::open(&trio().join("m.tar")).unwrap().unwrap();
    let objects = tar.write_host_objects(tmp.path()).unwrap();
    assert_eq!(objects, [tmp.path().join("lib0.o")]);
    let tvm_blob = tar.blob_member(None).unwrap().unwrap().blob.to_vec();
    std::fs::copy(trio().join("m.json"), tmp.path().join("m.json")).unwrap();
    std::fs::copy(trio().join("m.params"), tmp.path().join("m.params")).unwrap();
    let tree = tmp.path().join("tree.json");
    std::fs::write(
        &tree,
        r#"{"type_key": "GraphExecutorFactory", "graph": "m.json", "params": "m.params",
            "imports": [{"type_key": "llvm", "objects": ["lib0.o"]}]}"#,
    )
    .unwrap();
    let so = tmp.path().join("m.so");
    ok(mblob(&["export", tree.to_str().unwrap(), "-o", so.to_str().unwrap(), "-q"], tmp.path()));
    // The factory made of get_graph_json + save_param_dict is the one TVM packed itself.
    assert_eq!(blob_of(&std::fs::read(&so).unwrap()), tvm_blob);
    let out = tmp.path().join("out");
    ok(mblob(
        &["run", so.to_str().unwrap(), "-i", &format!("x={}", f("m.in.x.npy")), "-o", out.to_str().unwrap()],
        tmp.path(),
    ));
    same_as_tvm(&out, "m.out.0.npy");

    // A params file that is not one, and params of another graph: errors at the field.
    std::fs::write(tmp.path().join("bad.params"), b"not params").unwrap();
    std::fs::write(
        &tree,
        r#"{"type_key": "GraphExecutorFactory", "graph": "m.json", "params": "bad.params",
            "imports": [{"type_key": "llvm", "objects": ["lib0.o"]}]}"#,
    )
    .unwrap();
    let err = fails(mblob(&["export", tree.to_str().unwrap(), "-o", so.to_str().unwrap()], tmp.path()));
    assert!(err.contains("tree.json at $.params: `bad.params` is not a params file"), "{err}");
    let json = std::fs::read_to_string(trio().join("m.json")).unwrap();
    std::fs::write(tmp.path().join("other.json"), json.replace("[1, 4]", "[1, 5]")).unwrap();
    std::fs::write(
        &tree,
        r#"{"type_key": "GraphExecutorFactory", "graph": "other.json", "params": "m.params",
            "imports": [{"type_key": "llvm", "objects": ["lib0.o"]}]}"#,
    )
    .unwrap();
    let err = fails(mblob(&["export", tree.to_str().unwrap(), "-o", so.to_str().unwrap()], tmp.path()));
    assert!(err.contains("`m.params` does not match `other.json`") && err.contains("param `p1`"), "{err}");
    std::fs::write(&tree, r#"{"type_key": "cuda", "graph": "m.json"}"#).unwrap();
    let err = fails(mblob(&["export", tree.to_str().unwrap(), "-o", so.to_str().unwrap()], tmp.path()));
    assert!(err.contains("make a `GraphExecutorFactory`, not a `cuda`"), "{err}");
}

/// `pack --from devc.o --host lib0.o`: TVM's blob object and host object, as TVM's `.tar`
/// holds them, give a library that runs as TVM's.
#[test]
fn pack_from_tvm_devc_o_with_its_host_object_runs_as_tvm() {
    let tmp = tempfile::tempdir().unwrap();
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(trio().join("m.tar")).unwrap());
    let mut archive = tar::Archive::new(gz);
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().file_name().unwrap().to_owned();
        e.unpack(tmp.path().join(name)).unwrap();
    }
    let (devc, lib0) = (tmp.path().join("devc.o"), tmp.path().join("lib0.o"));
    assert!(devc.is_file() && lib0.is_file(), "TVM's tar holds devc.o and lib0.o");
    let so = tmp.path().join("m.so");
    let args = ["pack", "--from", devc.to_str().unwrap(), "--host", lib0.to_str().unwrap(), "-o", so.to_str().unwrap()];
    ok(mblob(&args, tmp.path()));
    let out = tmp.path().join("out");
    let input = format!("x={}", f("m.in.x.npy"));
    ok(mblob(&["run", so.to_str().unwrap(), "-i", &input, "-o", out.to_str().unwrap()], tmp.path()));
    same_as_tvm(&out, "m.out.0.npy");
}
