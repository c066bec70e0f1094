//! The TVM-built fixtures the VM tests run (`tests/fixtures`): loading one, reading an input.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mblob_runtime::exec::Value;
use mblob_runtime::{load_library, Device, LoadOptions, LoadedTree, NdArray, Registry};

#[path = "npyfile.rs"]
mod npyfile;

/// The repository's `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// The library `rel` (below `tests/fixtures`), loaded.
pub fn load(rel: &str) -> LoadedTree {
    // SAFETY: a fixture TVM built for these tests; the tests change only its decoded program,
    // which the VMs check as data.
    unsafe { load_library(&fixtures().join(rel), &Registry::default(), &LoadOptions::default()) }.unwrap()
}

/// The `.npy` file `rel` (below `tests/fixtures`) as a CPU tensor value.
pub fn npy(rel: &str) -> Value {
    let t = npyfile::tensor(&fixtures().join(rel));
    Value::Tensor(NdArray::from_bytes(&t.data, &t.shape, t.dtype, Device::cpu(0)).unwrap())
}
