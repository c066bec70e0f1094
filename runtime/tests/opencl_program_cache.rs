//! TVM's OpenCL program cache on MLC-LLM's Qwen2.5 built for OpenCL (`tests/fixtures/mlc`):
//! `opencl.GetPreCompiledPrograms` and `opencl.SetPreCompiledPrograms`, found by name through
//! the library's imports and called as MLC-LLM's engine calls them before it loads the VM.
//!
//! OpenCL runs for real on the machine's OpenCL device (pocl on a CPU in CI). Without one the
//! tests print `skipped: no OpenCL device (...)` and pass, unless `MBLOB_REQUIRE_OPENCL` is
//! set, which turns the skip into a failure.
#![cfg(all(feature = "llm", feature = "opencl"))]

use std::path::{Path, PathBuf};

use mblob_runtime::device::opencl::OpenClModule;
use mblob_runtime::device::Device;
use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};
use mblob_runtime::exec::{call, ExecError, Value};
use mblob_runtime::payload::device::DeviceModule;
use mblob_runtime::{load_library, LoadOptions, LoadedTree, Registry};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc").join(name)
}

/// The library, loaded anew (its OpenCL module with no program built).
fn library() -> LoadedTree {
    let path = fixture("qwen2-q0f32-opencl/lib.so");
    // SAFETY: the fixture is a library MLC-LLM's pipeline built for these tests.
    unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }.unwrap()
}

#[path = "support/opencl_device.rs"]
mod opencl_device;

/// OpenCL device 0, or `None` (after saying so) when there is none.
fn opencl() -> Option<Device> {
    opencl_device::opencl_api().map(|_| Device::opencl(0))
}

/// The bytes of a program cache read as TVM's `SetPreCompiledPrograms` reads them
/// (`support::BytesInStream`: a `uint64_t` count, then per kernel a `std::string` name and a
/// `std::vector<unsigned char>` binary, each after its `uint64_t` length, little-endian).
fn tvm_layout(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut at = 0;
    let u64_at = |at: &mut usize| {
        let v = u64::from_le_bytes(bytes[*at..*at + 8].try_into().unwrap());
        *at += 8;
        v as usize
    };
    let count = u64_at(&mut at);
    let mut out = Vec::new();
    for _ in 0..count {
        let n = u64_at(&mut at);
        let name = String::from_utf8(bytes[at..at + n].to_vec()).unwrap();
        at += n;
        let n = u64_at(&mut at);
        out.push((name, bytes[at..at + n].to_vec()));
        at += n;
    }
    assert_eq!(at, bytes.len(), "nothing after the last program");
    out
}

/// The kernels of the OpenCL source, in its order: TVM's `// Function: NAME` lines.
fn kernels(tree: &LoadedTree) -> Vec<String> {
    let source = String::from_utf8_lossy(&tree.find::<DeviceModule>().unwrap().data).into_owned();
    source.lines().filter_map(|l| l.strip_prefix("// Function: ")).map(|n| n.trim().to_owned()).collect()
}

fn set(tree: &LoadedTree, bytes: Vec<u8>) -> Result<Value, ExecError> {
    call(tree, "opencl.SetPreCompiledPrograms", &mut [Value::Bytes(bytes)])
}

/// TVM's greedy tokens of the record of the CPU build of the same weights.
fn generates_as_tvm(tree: &LoadedTree, d: Device) {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("qwen2-q0f32/reference.json")).unwrap()).unwrap();
    let ints = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
    };
    let (prompt, want) = (ints(&r["generate"]["prompt"]), ints(&r["generate"]["tokens"]));
    let weights = fixture("qwen2-q0f32");
    let mut lm = LanguageModel::new(tree, d, Some(&weights), &GenerateOptions::default()).unwrap();
    assert_eq!(lm.generate(&prompt, want.len()).unwrap().tokens, want, "TVM's tokens");
}

#[test]
fn programs_got_in_tvms_layout_load_into_a_new_module_and_generate_tvms_tokens() {
    let Some(d) = opencl() else { return };
    mblob_runtime::device::api::set_current_device(d);
    let first = library();
    let Value::Bytes(bytes) = call(&first, "opencl.GetPreCompiledPrograms", &mut []).unwrap() else {
        panic!("GetPreCompiledPrograms returned no bytes")
    };
    let programs = tvm_layout(&bytes);
    let names: Vec<String> = programs.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, kernels(&first), "one program per kernel section, in the source's order");
    assert!(programs.iter().all(|(_, b)| !b.is_empty()), "every program has a binary");

    // A new load has built nothing; Set gives every kernel its program from the binaries.
    let second = library();
    let module = || format!("{:?}", second.find::<OpenClModule>().unwrap());
    assert!(module().contains("programs: 0"), "{}", module());
    assert_eq!(set(&second, bytes.clone()).unwrap(), Value::Null);
    assert!(module().contains(&format!("programs: {}", names.len())), "{}", module());
    generates_as_tvm(&second, d);
    // Set again: every program is there already, as TVM skips them.
    assert_eq!(set(&second, bytes).unwrap(), Value::Null);
}

#[test]
fn bad_program_caches_are_typed_errors_and_change_nothing() {
    let Some(d) = opencl() else { return };
    mblob_runtime::device::api::set_current_device(d);
    let tree = library();
    let first = kernels(&tree)[0].clone();
    let entry = |name: &str, binary: &[u8]| {
        let mut b = 1u64.to_le_bytes().to_vec();
        b.extend((name.len() as u64).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend((binary.len() as u64).to_le_bytes());
        b.extend(binary);
        b
    };
    let mut huge = entry(&first, b"x");
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    for (bytes, says) in [
        (b"garbage".to_vec(), "cut short"),
        (u64::MAX.to_le_bytes().to_vec(), "hold at most"),
        (huge, "cut short"),
        (entry("no_such_kernel", b"x"), "not a kernel of this module"),
        (entry(&first, b"not a program binary"), "clCreateProgramWithBinary"),
    ] {
        match set(&tree, bytes) {
            Err(ExecError::Call { function, message }) => {
                assert_eq!(function, "opencl.SetPreCompiledPrograms");
                assert!(message.contains(says), "{says}: {message}");
            }
            other => panic!("{says}: {other:?}"),
        }
    }
    match call(&tree, "opencl.GetPreCompiledPrograms", &mut [Value::Int(1)]) {
        Err(ExecError::Call { message, .. }) => assert!(message.contains("takes no arguments"), "{message}"),
        other => panic!("{other:?}"),
    }
    // Nothing was loaded: the kernels build from the source and give TVM's tokens.
    assert!(format!("{:?}", tree.find::<OpenClModule>().unwrap()).contains("programs: 0"));
    generates_as_tvm(&tree, d);
}
