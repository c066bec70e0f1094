//! `mblob run` on Relax functions whose parameters are shapes and prim values (given as `.npy`
//! files: a 1-d int64 array, a 0-d number) and whose results hold shapes, prim values and
//! nested tuples (written flattened, depth first): every output equals TVM 0.27's; bad
//! arguments fail with TVM's check messages and exit 1; a library with one function runs it
//! without `--function`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/relax-vm")
}

fn manifest() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir().join("manifest.json")).unwrap()).unwrap()
}

/// The dtype string, shape and bytes of a `.npy` file (npyz's reading of the header).
fn npy(path: &Path) -> (String, Vec<u64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    let descr = f.dtype().descr();
    let data: Vec<u8> = match descr.trim_matches('\'') {
        "<f4" => f.into_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<f8" => f.into_vec::<f64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i4" => f.into_vec::<i32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i8" => f.into_vec::<i64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        d => panic!("{}: dtype {d}", path.display()),
    };
    (descr, shape, data)
}

/// The `.npy` files of a manifest value tree, depth first (`None` for a string).
fn files(tree: &serde_json::Value, out: &mut Vec<Option<PathBuf>>) {
    if let Some(items) = tree["tuple"].as_array() {
        items.iter().for_each(|i| files(i, out));
    } else if tree.get("str").is_some() {
        out.push(None);
    } else if tree.get("null").is_some() {
        // `run` writes no file for a None.
    } else {
        let f = ["tensor", "shape", "int", "float"]
            .iter()
            .find_map(|k| tree[*k].as_str())
            .unwrap_or_else(|| panic!("{tree}"));
        out.push(Some(dir().join(f)));
    }
}

fn run(so: &str, function: Option<&str>, inputs: &[PathBuf], out: &Path) -> std::process::Output {
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

/// Every case of the fixtures whose arguments are tensors, shapes and prim values (the CLI
/// has no tuple arguments): outputs equal TVM's, file for file; errors are TVM's.
#[test]
fn shapes_and_prims_from_npy_files() {
    let m = manifest();
    let (mut ran, mut refused) = (0, 0);
    for (model, meta) in m["models"].as_object().unwrap() {
        for case in meta["cases"].as_array().unwrap() {
            let mut inputs = Vec::new();
            case["inputs"].as_array().unwrap().iter().for_each(|i| files(i, &mut inputs));
            if case["inputs"].as_array().unwrap().iter().any(|i| i.get("tuple").is_some()) || inputs.contains(&None) {
                continue;
            }
            let inputs: Vec<PathBuf> = inputs.into_iter().flatten().collect();
            let f = case["function"].as_str().unwrap();
            let out = tempfile::tempdir().unwrap();
            let o = run(meta["so"].as_str().unwrap(), Some(f), &inputs, out.path());
            let stderr = String::from_utf8_lossy(&o.stderr);
            if let Some(e) = case.get("error") {
                assert_eq!(o.status.code(), Some(1), "{model}.{f}: {stderr}");
                let text = format!("{}: {}", e["kind"].as_str().unwrap(), e["message"].as_str().unwrap());
                assert!(stderr.contains(&text), "{model}.{f}: {stderr}\nTVM: {text}");
                refused += 1;
                continue;
            }
            assert!(o.status.success(), "{model}.{f}: {stderr}");
            let mut expected = Vec::new();
            files(&case["outputs"], &mut expected);
            for (k, e) in expected.iter().enumerate() {
                let got = npy(&out.path().join(format!("out.{k}.npy")));
                assert_eq!(got, npy(e.as_ref().unwrap()), "{model}.{f}: out.{k}");
            }
            assert!(!out.path().join(format!("out.{}.npy", expected.len())).exists(), "{model}.{f}: extra output");
            ran += 1;
        }
    }
    // closure, 2 shape_arg, prim_args, view, dataflow, shape_of, one_tuple, fine, reset_item,
    // debug; 5 errors of relax_vm_args and a missing debug function
    assert_eq!((ran, refused), (11, 6));
}

/// A library with one function, run without `--function`, runs that function (TVM's CPU
/// build of the OpenCL MLP: its only function is `forward`); a function calling an LLM builtin
/// fails naming it, exit 1.
#[test]
fn the_only_function_is_the_default_and_llm_builtins_are_named() {
    let dev = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/device-run");
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .arg("run")
        .arg(dev.join("dev_relax_mlp_opencl.cpu.so"))
        .arg("--input")
        .arg(format!("x={}", dev.join("dev_relax_mlp_opencl.in.x.npy").display()))
        .arg("--output-dir")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (d, s, got) = npy(&out.path().join("out.0.npy"));
    let (ed, es, expected) = npy(&dev.join("dev_relax_mlp_opencl.out.0.npy"));
    assert_eq!((d, s), (ed, es));
    let f = |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    assert!(f(&got).iter().zip(f(&expected)).all(|(a, b)| (a - b).abs() <= 1e-4 * (1.0 + b.abs())));

    let x = dir().join("relax_vm_llm.fine.0.in0.npy");
    let o = run("relax_vm_llm.so", Some("cache"), std::slice::from_ref(&x), out.path());
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Without the `llm` feature the builtin is refused, naming it; with it, the builtin refuses
    // its argument (a tensor, not a KV cache), naming itself too.
    #[cfg(not(feature = "llm"))]
    assert!(stderr.contains("`vm.builtin.kv_state_clear` is not supported by mblob"), "{stderr}");
    #[cfg(feature = "llm")]
    assert!(
        stderr.contains("argument 0 of `vm.builtin.kv_state_clear`: expected a relax.vm.PagedAttentionKVCache"),
        "{stderr}"
    );
    // Several functions and no `main`: the error lists them.
    let o = run("relax_vm_llm.so", None, &[x], out.path());
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("no VM function `main`") && stderr.contains("fine"), "{stderr}");
}

/// `R.print` (TVM's Python-registered `relax.run.print`): `mblob run` prints what TVM 0.27's
/// VM printed for the same call, line for line (prim values, a shape, a string, an empty
/// format, a format without values), before its own report, and the result is TVM's.
#[test]
fn relax_print_prints_what_tvm_printed() {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/relax-print");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .arg("run")
        .arg(d.join("relax_print.so"))
        .arg("-i")
        .arg(format!("x={}", d.join("x.npy").display()))
        .arg("-i")
        .arg(format!("k={}", d.join("k.npy").display()))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tvm = std::fs::read_to_string(d.join("tvm_stdout.txt")).unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with(&tvm), "mblob printed:\n{stdout}\nTVM printed:\n{tvm}");
    assert_eq!(npy(&out.join("out.0.npy")), npy(&d.join("out.0.npy")));
}
