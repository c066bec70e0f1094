//! Helpers of the device-run tests: the fixtures of `tests/fixtures/device-run`, their
//! inputs and TVM's outputs, the comparison, and the OpenCL device.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mblob_runtime::device::device_api;
use mblob_runtime::exec::{Device, Model, Value as ExecValue};
use mblob_runtime::format::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::NdArray;
use mblob_runtime::{load_library, LoadOptions, LoadedTree, Registry};
use serde_json::Value;

/// The fixtures' folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/device-run")
}

/// Loads a fixture library.
pub fn load(path: &Path) -> LoadedTree {
    // SAFETY: the fixtures are libraries TVM built for these tests; running their
    // initialisers is what TVM's own loader does.
    unsafe { load_library(path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A float32 `.npy` file.
pub fn npy(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let arr = npyz::NpyFile::new(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let shape: Vec<i64> = arr.shape().iter().map(|&d| d as i64).collect();
    let data: Vec<u8> = arr.into_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new(DataType::F32, shape, data).unwrap()
}

/// A fixture's description (`NAME.json`).
pub fn json(name: &str) -> Value {
    let p = fixtures().join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// The input/output cases of a fixture: `cases` when it has several, else its one.
/// Named input files, and the output files, of one case.
pub type Case = (Vec<(String, PathBuf)>, Vec<PathBuf>);

pub fn cases(meta: &Value) -> Vec<Case> {
    let one = |c: &Value| {
        let ins = c["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["name"].as_str().unwrap().to_owned(), fixtures().join(i["file"].as_str().unwrap())))
            .collect();
        let outs =
            c["outputs"].as_array().unwrap().iter().map(|o| fixtures().join(o["file"].as_str().unwrap())).collect();
        (ins, outs)
    };
    match meta["cases"].as_array() {
        Some(cs) => cs.iter().map(one).collect(),
        None => vec![one(meta)],
    }
}

/// Every output within `rtol * max(1, max|ref|)` of TVM's.
pub fn assert_close(name: &str, got: &[ExecValue], want: &[PathBuf], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: number of outputs");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let ExecValue::Tensor(g) = g else { panic!("{name}: output {k} is a {}", g.kind()) };
        let g = g.to_tensor().unwrap();
        let w = npy(w);
        assert_eq!((g.dtype, &g.shape), (w.dtype, &w.shape), "{name}: output {k}");
        let (g, w) = (g.to_f32().unwrap(), w.to_f32().unwrap());
        let scale = w.iter().fold(1.0f64, |m, v| m.max(f64::from(v.abs())));
        let worst = g.iter().zip(&w).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max);
        assert!(worst <= rtol * scale, "{name}: output {k} differs by {worst} (allowed {})", rtol * scale);
    }
}

/// Runs fixture `name` on `device` through `exec::Model`, every case, twice each (the second
/// run must give the same outputs: nothing is left over between runs).
pub fn run_fixture(name: &str, device: Device) {
    let meta = json(name);
    let tree = load(&fixtures().join(meta["so"].as_str().unwrap()));
    run_tree(name, &tree, device);
}

/// Runs fixture `name`, loaded as `tree`, on `device` as [`run_fixture`] does.
pub fn run_tree(name: &str, tree: &LoadedTree, device: Device) {
    let meta = json(name);
    let mut m = Model::new(tree, device).unwrap_or_else(|e| panic!("{name} on {device}: {e}"));
    let entry = meta["entry"].as_str().unwrap();
    if meta["executor"] == "relax" {
        m.select_function(entry).unwrap();
    }
    for (ins, outs) in cases(&meta) {
        for (input, file) in &ins {
            m.set_input(Some(input), input_value(&npy(file))).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for _ in 0..2 {
            m.run().unwrap_or_else(|e| panic!("{name} on {device}: {e}"));
            assert_close(name, &m.outputs().unwrap(), &outs, meta["rtol"].as_f64().unwrap());
        }
    }
}

/// A host tensor as an input value, on the CPU (the model copies it to its device).
pub fn input_value(t: &Tensor) -> ExecValue {
    ExecValue::Tensor(NdArray::from_tensor(t, Device::cpu(0)).unwrap())
}

/// The OpenCL device of these tests: pocl here and in CI.
pub fn opencl() -> Device {
    let d = Device::opencl(0);
    if let Err(e) = device_api(d) {
        panic!("no OpenCL device ({e}): install an OpenCL driver, e.g. `apt-get install pocl-opencl-icd` (ci/setup.sh does)");
    }
    d
}

/// The fixtures for `device` (`opencl`, `cuda`), by name.
pub fn fixture_names(device: &str) -> Vec<String> {
    let manifest: Value = serde_json::from_slice(&std::fs::read(fixtures().join("manifest.json")).unwrap()).unwrap();
    let mut names: Vec<String> = manifest["models"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, m)| m["device"] == device)
        .map(|(k, _)| k.clone())
        .collect();
    names.sort();
    names
}
