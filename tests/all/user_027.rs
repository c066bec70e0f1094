//! A new user's Relax models for TVM 0.27 (`tests/fixtures/user-0.27`, outputs and errors made
//! by TVM's own VM) run with `mblob run`: nn.Module exports (an MLP with a top-p filter over
//! sort/argsort/cumsum, a causal attention block over a symbolic length and a topk sampler),
//! R.topk with largest=False, R.unique with counts or indices on floats, R.nonzero on bools,
//! R.where, R.strided_slice with prim bounds, (Tensor, Prim, Shape) results, shape variables
//! shared across parameters and calls, R.call_pure_packed of vm.builtins, R.If on an R.Prim
//! bool and on a 0-d bool tensor. Every output file equals TVM's byte for byte; every bad
//! argument fails with TVM's message and exit 1.

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/user-0.27")
}

fn manifest() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir().join("manifest.json")).unwrap()).unwrap()
}

/// The dtype, shape and data bytes of a `.npy` file.
fn npy(path: &Path) -> (String, Vec<u64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let (descr, shape) = (f.dtype().descr(), f.shape().to_vec());
    let data: Vec<u8> = match descr.trim_matches('\'') {
        "<f4" => f.into_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<f8" => f.into_vec::<f64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i4" => f.into_vec::<i32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i8" => f.into_vec::<i64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "|b1" => f.into_vec::<bool>().unwrap().iter().map(|&v| u8::from(v)).collect(),
        d => panic!("{}: dtype {d}", path.display()),
    };
    (descr, shape, data)
}

/// The files of a value tree, depth first; `None` where the CLI cannot pass the value (a tuple).
fn leaves(tree: &serde_json::Value, out: &mut Vec<PathBuf>) -> Option<()> {
    if let Some(items) = tree["tuple"].as_array() {
        return items.iter().try_for_each(|i| leaves(i, out));
    }
    let f = ["tensor", "shape", "int", "float", "bool"].iter().find_map(|k| tree[*k].as_str())?;
    out.push(dir().join(f));
    Some(())
}

fn mblob_run(so: &str, function: Option<&str>, inputs: &[String], out: &Path) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mblob"));
    c.arg("run").arg(dir().join(so)).arg("--output-dir").arg(out);
    if let Some(f) = function {
        c.args(["--function", f]);
    }
    for i in inputs {
        c.arg("--input").arg(i);
    }
    c.output().expect("run mblob")
}

/// Every case whose arguments the CLI can pass: TVM's outputs, or TVM's error and exit 1.
#[test]
fn every_case_gives_tvms_outputs_or_error() {
    let m = manifest();
    let (mut ran, mut refused) = (0, 0);
    for (model, meta) in m["models"].as_object().unwrap() {
        for case in meta["cases"].as_array().unwrap() {
            let f = case["function"].as_str().unwrap();
            let mut inputs = Vec::new();
            if case["inputs"].as_array().unwrap().iter().any(|i| i.get("tuple").is_some()) {
                continue;
            }
            case["inputs"].as_array().unwrap().iter().for_each(|i| leaves(i, &mut inputs).unwrap());
            let inputs: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
            let out = tempfile::tempdir().unwrap();
            let o = mblob_run(meta["so"].as_str().unwrap(), Some(f), &inputs, out.path());
            let stderr = String::from_utf8_lossy(&o.stderr);
            if let Some(err) = case.get("error") {
                let want = format!("{}: {}", err["kind"].as_str().unwrap(), err["message"].as_str().unwrap());
                assert_eq!(o.status.code(), Some(1), "{model}.{f}: {stderr}");
                assert!(stderr.contains(&want), "{model}.{f}: want {want:?} in {stderr}");
                refused += 1;
                continue;
            }
            assert!(o.status.success(), "{model}.{f}: {stderr}");
            let mut want = Vec::new();
            leaves(&case["outputs"], &mut want).unwrap();
            for (k, w) in want.iter().enumerate() {
                let got = npy(&out.path().join(format!("out.{k}.npy")));
                assert_eq!(got, npy(w), "{model}.{f} output {k}");
            }
            assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), want.len(), "{model}.{f}");
            ran += 1;
        }
    }
    assert!(ran >= 20 && refused >= 10, "ran {ran}, refused {refused}");
}

/// `R.prim_value(n * m + 1)` is computed by a host function that returns its value
/// (`compute_symbolic_expr`); the VM must keep what it returns (it was dropped as null).
#[test]
fn prim_value_of_a_symbolic_expression() {
    let m = manifest();
    let case = &m["models"]["user_args"]["cases"][2];
    assert_eq!(case["function"], "mixed_ret");
    let out = tempfile::tempdir().unwrap();
    let ins: Vec<String> =
        (0..2).map(|i| dir().join(format!("user_args.mixed_ret.2.in{i}.npy")).display().to_string()).collect();
    let o = mblob_run("user_args.so", Some("mixed_ret"), &ins, out.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = dir().join(case["flat_outputs"][1]["int"].as_str().unwrap());
    assert_eq!(npy(&out.path().join("out.1.npy")), npy(&want));
}

/// The nn.Module export has one function (`forward`): it runs without `--function`, its
/// inputs given by parameter name (the dotted names of the weights too) or in order.
#[test]
fn one_function_library_by_parameter_names() {
    let m = manifest();
    let meta = &m["models"]["user_mlp"];
    let case = &meta["cases"][0];
    let mut names = vec!["x".to_owned(), "top_p".to_owned()];
    names.extend(meta["params"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()));
    let mut files = Vec::new();
    case["inputs"].as_array().unwrap().iter().for_each(|i| leaves(i, &mut files).unwrap());
    // In reverse order, by name.
    let inputs: Vec<String> = names.iter().zip(&files).rev().map(|(n, f)| format!("{n}={}", f.display())).collect();
    let out = tempfile::tempdir().unwrap();
    let o = mblob_run("user_mlp.so", None, &inputs, out.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut want = Vec::new();
    leaves(&case["outputs"], &mut want).unwrap();
    for (k, w) in want.iter().enumerate() {
        assert_eq!(npy(&out.path().join(format!("out.{k}.npy"))), npy(w), "output {k}");
    }
}
