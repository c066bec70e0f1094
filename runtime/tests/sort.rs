//! The runtime functions compiled code calls by name, against TVM: the models of
//! `tests/fixtures/sort` (built by its `make.py`) call `tvm.contrib.sort.sort`, `argsort`,
//! `argsort_nms` and `topk` from their kernels (Relay graph models from TVM 0.19, Relax models
//! from TVM 0.27) or `relax.run.unique` / `relax.run.nonzero` from the Relax VM. Each runs
//! through mblob with TVM's inputs, and every output is compared bit for bit with the one TVM
//! computed from the same library.

use std::path::{Path, PathBuf};

use mblob_runtime::exec::{Device, Model, Value};
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::NdArray;
use mblob_runtime::{load_library, LoadOptions, Registry};

#[path = "support/npyfile.rs"]
mod npyfile;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sort")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A `.npy` file as a tensor, bool as TVM 0.19's `uint1`.
fn npy(path: &Path) -> Tensor {
    npyfile::tensor_bool_as(path, npyfile::UINT1)
}

struct Fixture {
    name: String,
    kind: String,
    so: PathBuf,
    inputs: Vec<(String, PathBuf)>,
    outputs: Vec<PathBuf>,
}

fn fixtures() -> Vec<Fixture> {
    let d = dir();
    let manifest: serde_json::Value = serde_json::from_slice(&read(&d.join("manifest.json"))).unwrap();
    manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Fixture {
            name: m["name"].as_str().unwrap().to_owned(),
            kind: m["kind"].as_str().unwrap().to_owned(),
            so: d.join(m["so"].as_str().unwrap()),
            inputs: m["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| (i["name"].as_str().unwrap().to_owned(), d.join(i["file"].as_str().unwrap())))
                .collect(),
            outputs: m["outputs"].as_array().unwrap().iter().map(|o| d.join(o["file"].as_str().unwrap())).collect(),
        })
        .collect()
}

/// Runs one fixture through mblob: its outputs.
fn run(f: &Fixture) -> Result<Vec<Tensor>, String> {
    // SAFETY: TVM's own exports of small models built by make.py, trusted to run.
    let tree = unsafe { load_library(&f.so, &Registry::default(), &LoadOptions::default()) }
        .map_err(|e| format!("{}: {e}", f.name))?;
    let mut model = Model::new(&tree, Device::cpu(0)).map_err(|e| format!("{}: {e}", f.name))?;
    for (name, file) in &f.inputs {
        let a = NdArray::from_tensor(&npy(file), Device::cpu(0)).unwrap();
        model.set_input(Some(name), Value::Tensor(a)).map_err(|e| format!("{} input {name}: {e}", f.name))?;
    }
    model.run().map_err(|e| format!("{}: {e}", f.name))?;
    let outs = model.outputs().map_err(|e| format!("{}: {e}", f.name))?;
    Ok(outs
        .into_iter()
        .map(|o| match o {
            Value::Tensor(t) => t.to_tensor().unwrap(),
            other => panic!("{}: a non-tensor output {other:?}", f.name),
        })
        .collect())
}

fn check_all(filter: impl Fn(&Fixture) -> bool, at_least: usize) {
    let all: Vec<Fixture> = fixtures().into_iter().filter(|f| filter(f)).collect();
    assert!(all.len() >= at_least, "only {} fixtures", all.len());
    let mut failures = Vec::new();
    for f in &all {
        match run(f) {
            Err(e) => failures.push(e),
            Ok(got) => {
                if got.len() != f.outputs.len() {
                    failures.push(format!("{}: {} outputs, TVM gave {}", f.name, got.len(), f.outputs.len()));
                    continue;
                }
                for (k, (g, file)) in got.iter().zip(&f.outputs).enumerate() {
                    let want = npy(file);
                    if (g.dtype, &g.shape) != (want.dtype, &want.shape) {
                        failures.push(format!(
                            "{} output {k}: {:?} {:?}, TVM's {:?} {:?}",
                            f.name, g.dtype, g.shape, want.dtype, want.shape
                        ));
                    } else if g.data[..] != want.data[..] {
                        failures.push(format!("{} output {k}: differs from TVM's", f.name));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences from TVM in {} models:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

/// Relay `sort`, `argsort` (int32, int64 and float32 indices) and `topk` (both, values,
/// indices; k 3, 2, 0 = all, 4; negative axes; float64 indices) on float16, float32, float64,
/// int32, int64 inputs full of ties, `topk` on int8 and uint8 with indices of their own type,
/// and `vision.non_max_suppression` after `get_valid_counts` (which sorts with `argsort_nms`
/// and `argsort`): TVM 0.19 graph models.
#[test]
fn relay_sort_models_give_tvms_outputs() {
    check_all(|f| f.kind == "graph", 9);
}

/// `R.sort`, `R.argsort` and `R.topk` on float32, float64, int32, int64 (kernels calling
/// `tvm.contrib.sort.*` through `TVMFFIEnvModLookupFromImports`), and `R.unique` (sorted and
/// unsorted) and `R.nonzero` (the VM calling `relax.run.*`): TVM 0.27 Relax models.
#[test]
fn relax_sort_unique_nonzero_models_give_tvms_outputs() {
    check_all(|f| f.kind == "relax", 13);
}

/// The registry lists what mblob provides, and a function compiled code asks for that neither
/// the imports nor the registry has is refused naming it (see also `context.rs`'s unit test).
#[test]
fn globals_are_listed_and_unknown_ones_named() {
    let names = mblob_runtime::ffi::globals::global_names();
    for n in
        ["tvm.contrib.sort.sort", "tvm.contrib.sort.argsort", "tvm.contrib.sort.argsort_nms", "tvm.contrib.sort.topk"]
    {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    assert!(mblob_runtime::ffi::globals::global_function("tvm.contrib.sort.no_such").is_none());
    // A wrong call is an error naming the function, not a crash.
    let f = mblob_runtime::ffi::globals::global_function("tvm.contrib.sort.sort").unwrap();
    // SAFETY: a Rust function; it checks its arguments.
    let e = unsafe { f.call(&[mblob_runtime::ffi::Value::Int(1)]) }.unwrap_err();
    assert!(e.message.contains("tvm.contrib.sort.sort: takes 4 arguments"), "{}", e.message);
}

/// A kernel that calls a global function neither its imports nor mblob provide
/// (`calls_unknown.so`, TVM 0.19 `tvm.build` of a `te.extern` calling
/// `mblob.test.no_such_function`): the call fails with TVM's message naming the function
/// (`calls_unknown.tvm-error.txt` holds what TVM said), and the process goes on.
#[test]
fn an_unknown_global_function_is_refused_naming_it() {
    let so = dir().join("calls_unknown.so");
    // SAFETY: TVM's own export, built by make.py.
    let tree = unsafe { load_library(&so, &Registry::default(), &LoadOptions::default()) }.unwrap();
    let f = tree.packed_function("calls_unknown").expect("the kernel");
    let tvm = String::from_utf8(read(&dir().join("calls_unknown.tvm-error.txt"))).unwrap();
    assert!(tvm.contains("Cannot find function mblob.test.no_such_function"), "{tvm}");
    let (mut a, mut b) = ([1f32; 4], [0f32; 4]);
    let (mut sa, mut sb) = ([4i64], [4i64]);
    let mut tensors = [
        mblob_runtime::ffi::dlpack::DLTensor::f32(&mut a, &mut sa),
        mblob_runtime::ffi::dlpack::DLTensor::f32(&mut b, &mut sb),
    ];
    // SAFETY: the kernel takes two float32 tensors of 4 elements, as built.
    let e = unsafe { f.call_tensors(&mut tensors) }.unwrap_err();
    assert!(e.message.contains("Cannot find function mblob.test.no_such_function"), "{}", e.message);
    assert_eq!(b, [0.0; 4], "nothing was written");
}

/// `R.assert_op` (`relax.run.assert_op`, which TVM has only in Python): `relax_assert` runs
/// with its passing input (checked with the other Relax models), and each failing input
/// (`relax_assert.fail.K.npy`) gives TVM's `AssertionError` with the message TVM formatted
/// (`relax_assert.fail.K.txt`): positional fields, `{{ }}` escapes, integers and shapes; and
/// the arguments joined when there is no format.
#[test]
fn relax_assert_op_fails_with_tvms_message() {
    let d = dir();
    // SAFETY: TVM's own export, built by make.py.
    let tree =
        unsafe { load_library(&d.join("relax_assert.so"), &Registry::default(), &LoadOptions::default()) }.unwrap();
    for k in 0..2 {
        let want = String::from_utf8(read(&d.join(format!("relax_assert.fail.{k}.txt")))).unwrap();
        let mut model = Model::new(&tree, Device::cpu(0)).unwrap();
        let x = NdArray::from_tensor(&npy(&d.join(format!("relax_assert.fail.{k}.npy"))), Device::cpu(0)).unwrap();
        model.set_input(Some("x"), Value::Tensor(x)).unwrap();
        let e = model.run().unwrap_err().to_string();
        assert!(e.contains(want.trim()), "input {k}: {e} (TVM: {want})");
    }
}
