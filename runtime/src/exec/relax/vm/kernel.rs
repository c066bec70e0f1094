//! Calls of the library's kernels with VM values: tensors as `DLTensor`s of their storage, in
//! the kernel's own calling convention (made by `ffi::kernel_call`, where the `unsafe` is).

use super::value::{Value, VmError};
use crate::ffi::call::PackedFunction;
use crate::ffi::kernel_call::{self, KernelArg};
use crate::ffi::value::Value as CallValue;

/// Calls a kernel with the VM values as arguments: tensors as `DLTensor`s of their storage
/// (on whichever device they are), integers, floats and nulls, in the kernel's convention,
/// through the safe [`kernel_call::call_kernel`].
/// Its return value comes back as a VM value (integers and bools as `Int`, floats, null).
pub(crate) fn call_kernel(name: &str, kernel: &PackedFunction, args: &[&Value]) -> Result<Value, VmError> {
    for (index, v) in args.iter().enumerate() {
        if !matches!(v, Value::Tensor(_) | Value::Int(_) | Value::Float(_) | Value::Null) {
            return Err(VmError::Type {
                callee: name.to_owned(),
                index,
                expected: "a tensor, an integer, a float or null",
                got: v.kind(),
            });
        }
    }
    let _span = tracing::trace_span!("relax_kernel", kernel = name).entered();
    let called = kernel_call::call_kernel(kernel, args, |v| match v {
        Value::Tensor(a) => KernelArg::Tensor(a),
        Value::Int(i) => KernelArg::Int(*i),
        Value::Float(f) => KernelArg::Float(*f),
        _ => KernelArg::Null,
    });
    match called.map_err(|e| VmError::Kernel { name: name.to_owned(), code: e.code, message: e.message })? {
        CallValue::None => Ok(Value::Null),
        CallValue::Int(i) => Ok(Value::Int(i)),
        CallValue::Float(f) => Ok(Value::Float(f)),
        other => Err(VmError::KernelResult { name: name.to_owned(), got: call_value_kind(&other) }),
    }
}

/// What kind of value a packed call returned, for errors.
fn call_value_kind(v: &CallValue) -> &'static str {
    match v {
        CallValue::None => "none",
        CallValue::Int(_) => "an integer",
        CallValue::Float(_) => "a float",
        CallValue::Handle(_) => "an opaque pointer",
        CallValue::DataType(_) => "a data type",
        CallValue::Device(_) => "a device",
        CallValue::Tensor(_) => "a DLTensor pointer",
        CallValue::Str(_) => "a string",
        CallValue::Bytes(_) => "bytes",
        CallValue::Object { .. } => "a tvm-ffi object",
    }
}
