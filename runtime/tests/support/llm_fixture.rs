//! The LLM fixture (`tests/fixtures/llm`): its files, its libraries, and the readers of TVM's
//! records that the KV cache tests on the CPU (`llm_kv.rs`) and on devices (`llm_device.rs`)
//! share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mblob_runtime::{load_library, LoadOptions, LoadedTree, Registry};
use serde_json::Value as Json;

/// The fixture's folder.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm")
}

/// A JSON file of the fixture.
pub fn json(file: &str) -> Json {
    let path = dir().join(file);
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// Loads the library `name` of the fixture (each caller its own load).
pub fn load(name: &str) -> LoadedTree {
    let path = dir().join(name);
    // SAFETY: the fixtures are libraries TVM built for these tests.
    unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A float32 `.npy` file: its shape and values.
pub fn npy_f32(file: &str) -> (Vec<usize>, Vec<f32>) {
    let path = dir().join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let arr = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = arr.shape().iter().map(|&d| d as usize).collect();
    (shape, arr.into_vec::<f32>().unwrap())
}

/// Little-endian float32 bytes as floats.
pub fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A JSON array of integers.
pub fn ints(v: &Json) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}
