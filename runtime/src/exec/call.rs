//! [`call()`]: one host function of a loaded library, called with [`Value`]s (what `mblob run
//! --function`, Python's `Library.call` and the C API's `mblob_library_call` do).

use super::value::Value;
use super::ExecError;
use crate::ffi::dlpack::DLTensor;
use crate::ffi::value::Value as FfiValue;
use crate::module::LoadedTree;

/// Calls host function `name` of `tree` (found from the root, through the imports) with
/// `args`, and returns what it returns (an int, a float, a string, bytes, or `Null`; handles
/// and objects come back as `Null`). Tensors are passed as `DLTensor`s over their own memory,
/// on their own devices: a compiled function writes its outputs into them, so the caller's
/// tensors hold the results after the call (devices are waited for before it returns).
/// Ints, floats, strings, bytes (to a function mblob provides, such as an OpenCL module's
/// `opencl.SetPreCompiledPrograms`) and `Null` pass as themselves; shapes, tuples and objects
/// cannot be passed ([`ExecError::Argument`]).
///
/// The call is safe to make: the trust in the library's code was given when it was loaded
/// ([`crate::load_library`] is `unsafe`), and every tensor describes live memory of exactly
/// its shape and dtype (64-byte aligned where mblob allocated it), which a compiled function
/// checks (ndim, dtype, shape, device) before it touches the data.
pub fn call(tree: &LoadedTree, name: &str, args: &mut [Value]) -> Result<Value, ExecError> {
    call_as(tree, name, args, TensorsAs::DlTensors)
}

/// Calls a device kernel `name` of `tree` as host code calls it: each tensor is passed as the
/// handle of its data (the device pointer), then the kernel's scalar arguments and launch
/// extents as ints, on the device the tensors live on. Otherwise as [`call()`].
pub fn call_device_kernel(tree: &LoadedTree, name: &str, args: &mut [Value]) -> Result<Value, ExecError> {
    call_as(tree, name, args, TensorsAs::DataHandles)
}

/// How [`call_as`] passes tensors.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TensorsAs {
    /// `DLTensor*`s (host functions).
    DlTensors,
    /// Their data pointers (device kernels).
    DataHandles,
}

fn call_as(tree: &LoadedTree, name: &str, args: &mut [Value], tensors_as: TensorsAs) -> Result<Value, ExecError> {
    let _span = tracing::debug_span!("host_call", function = name, args = args.len()).entered();
    let f = tree.packed_function(name).ok_or_else(|| ExecError::NoHostFunction { name: name.to_owned() })?;
    let mut tensors: Vec<DLTensor> = args.iter().filter_map(Value::as_tensor).map(|a| a.dl_tensor()).collect();
    let mut next = tensors.iter_mut();
    let mut values = Vec::with_capacity(args.len());
    for (index, a) in args.iter().enumerate() {
        values.push(match a {
            Value::Tensor(_) => match (tensors_as, next.next()) {
                (TensorsAs::DlTensors, t) => FfiValue::Tensor(t.map_or(std::ptr::null_mut(), |t| t as *mut DLTensor)),
                (TensorsAs::DataHandles, t) => FfiValue::Handle(t.map_or(std::ptr::null_mut(), |t| t.data)),
            },
            Value::Int(i) => FfiValue::Int(*i),
            Value::Float(x) => FfiValue::Float(*x),
            Value::Str(s) => FfiValue::Str(s.clone()),
            Value::Bytes(b) => FfiValue::Bytes(b.clone()),
            Value::Null => FfiValue::None,
            v @ (Value::Shape(_) | Value::Tuple(_) | Value::Object(_)) => {
                return Err(ExecError::Argument {
                    index,
                    detail: format!("a {} cannot be passed to a host function", v.kind()),
                })
            }
        });
    }
    // SAFETY: `f` comes from a library loaded by `load_library` (which installed its context;
    // the caller took the trust in its code there). Every tensor argument points at a live
    // `NdArray` of `args` (its storage, shape and dtype), which outlives the call: `args` is
    // borrowed for all of it. A compiled function checks the ndim, dtype, shape and device of
    // each before it touches the data.
    #[allow(unsafe_code)]
    let ret =
        unsafe { f.call(&values) }.map_err(|e| ExecError::Call { function: name.to_owned(), message: e.message })?;
    drop(values);
    // Kernels launched on a device are queued: the results are there once it is done.
    let mut waited = Vec::new();
    for a in args.iter().filter_map(Value::as_tensor) {
        let d = a.device();
        if !d.is_cpu() && !waited.contains(&d) {
            a.storage().api().synchronize()?;
            waited.push(d);
        }
    }
    Ok(match ret {
        FfiValue::Int(i) => Value::Int(i),
        FfiValue::Float(x) => Value::Float(x),
        FfiValue::Str(s) => Value::Str(s),
        FfiValue::Bytes(b) => Value::Bytes(b),
        _ => Value::Null,
    })
}
