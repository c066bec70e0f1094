//! Errors that name their cause (issue 33): inputs over what the model was built for are an
//! input error (`VmError::InputBound`, TVM's check and message), not "invalid program"; a
//! builtin given too few arguments says how many it needs.
#![cfg(feature = "llm")]

use std::path::Path;

use mblob_runtime::exec::relax::{VirtualMachine, VmError};
use mblob_runtime::exec::Value;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};

fn llm_vm() -> VirtualMachine {
    let so = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm/llm_consts.so");
    // SAFETY: a fixture TVM built; loading it runs its initialisers.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library(&so, &Registry::default(), &LoadOptions::keep_unknown()) }.unwrap();
    VirtualMachine::new(&tree, Device::cpu(0)).unwrap()
}

fn ids(n: i64) -> Value {
    let data: Vec<u8> = (0..n as i32).flat_map(|i| (i % 256).to_le_bytes()).collect();
    Value::Tensor(NdArray::from_bytes(&data, &[n], DataType::I32, Device::cpu(0)).unwrap())
}

fn shape(v: i64) -> Value {
    Value::Shape([v].into())
}

/// The model's functions are built for at most 64 tokens (`tir_var_upper_bound`): a prefill of
/// 65 overruns the storage the program planned, TVM's InternalError (errors.json
/// `prefill_past_chunk_size`), an input error.
#[test]
fn inputs_over_the_models_bounds_are_input_errors() {
    let vm = llm_vm();
    let cache =
        vm.invoke("create_tir_paged_kv_cache", &[shape(4), shape(128), shape(64), shape(16), shape(0)]).unwrap();
    vm.invoke("vm.builtin.kv_state_add_sequence", &[cache.clone(), Value::Int(0)]).unwrap();
    vm.invoke("vm.builtin.kv_state_begin_forward", &[cache.clone(), shape(0), shape(65)]).unwrap();
    let Value::Tensor(e) = vm.invoke("embed", &[ids(65)]).unwrap() else { panic!("embed") };
    let e = Value::Tensor(e.view(&[1, 65, 64], e.dtype()).unwrap());
    let err = vm.invoke("prefill", &[e, cache]).unwrap_err();
    let text = err.to_string();
    assert!(!text.contains("invalid program"), "{text}");
    match err.root() {
        VmError::InputBound { kind, message } => {
            assert_eq!(*kind, "InternalError");
            assert!(
                message.contains(
                    "storage allocation failure, attempted to allocate 16640 at offset 0 in region that is 16384bytes"
                ),
                "{message}"
            );
        }
        other => panic!("not an input error: {other:?}"),
    }
}

/// A KV-cache builtin given the cache alone says it needs more, counting as people do.
#[test]
fn too_few_arguments_say_how_many_are_needed() {
    let vm = llm_vm();
    let cache =
        vm.invoke("create_tir_paged_kv_cache", &[shape(4), shape(128), shape(64), shape(16), shape(0)]).unwrap();
    let err = vm.invoke("vm.builtin.kv_state_add_sequence", &[cache]).unwrap_err();
    let text = err.to_string();
    assert!(!text.contains("needs argument 1, but was given 1"), "{text}");
    assert!(text.contains("needs at least 2 arguments") && text.contains("was given 1"), "{text}");
}
