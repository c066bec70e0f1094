//! Calls of the library's kernels with VM values: tensors as `DLTensor`s of their storage, in
//! the kernel's own calling convention.

use super::value::{Value, VmError};
use crate::ffi::callconv::{PackedFunction, Value as CallValue};
use crate::ffi::packed::DLTensor;

/// Calls a kernel with the VM values as arguments: tensors as `DLTensor`s of their storage
/// (on whichever device they are), integers, floats and nulls, in the kernel's convention.
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
    // The DLTensors and the call's values in arrays on the stack, sized to the call (most
    // kernels take two to four arguments: nothing more to fill and drop), else in vectors.
    match args.len() {
        0..=2 => call_kernel_in::<2>(name, kernel, args),
        3..=4 => call_kernel_in::<4>(name, kernel, args),
        5..=8 => call_kernel_in::<8>(name, kernel, args),
        _ => {
            let mut tensors: Vec<DLTensor> = args.iter().map(|_| UNUSED_DL_TENSOR).collect();
            let mut values: Vec<CallValue> = args.iter().map(|_| CallValue::None).collect();
            call_kernel_with(name, kernel, args, &mut tensors, &mut values)
        }
    }
}

/// [`call_kernel`] with arrays of `N` places (at least as many as the arguments).
#[inline]
fn call_kernel_in<const N: usize>(name: &str, kernel: &PackedFunction, args: &[&Value]) -> Result<Value, VmError> {
    let mut tensors: [DLTensor; N] = [UNUSED_DL_TENSOR; N];
    let mut values: [CallValue; N] = std::array::from_fn(|_| CallValue::None);
    let n = args.len();
    call_kernel_with(name, kernel, args, &mut tensors[..n], &mut values[..n])
}

/// [`call_kernel`] of checked arguments, with `tensors` and `values` (one place per argument)
/// to encode them in: the arrays are not touched again until the call returns, so that the
/// pointers to the DLTensors stay valid.
#[inline]
fn call_kernel_with(
    name: &str,
    kernel: &PackedFunction,
    args: &[&Value],
    tensors: &mut [DLTensor],
    values: &mut [CallValue],
) -> Result<Value, VmError> {
    for ((t, slot), v) in tensors.iter_mut().zip(values.iter_mut()).zip(args) {
        *slot = match v {
            Value::Tensor(a) => {
                *t = a.dl_tensor();
                CallValue::Tensor(t as *mut DLTensor)
            }
            Value::Int(i) => CallValue::Int(*i),
            Value::Float(f) => CallValue::Float(*f),
            _ => CallValue::None,
        };
    }
    let _span = tracing::trace_span!("relax_kernel", kernel = name).entered();
    // SAFETY: the function is one the library (or a module of its tree) exports under this
    // name, called in the convention its module reports; that it is a kernel of that
    // signature is what the library's TVM promises (the trust taken when it was opened with
    // the `unsafe` `load_library`). Every tensor argument describes a live storage the
    // arguments hold (an `NdArray` is never larger than its storage), on its own device, with
    // a shape that lives in the `NdArray`; the `DLTensor`s live in `tensors` until the call
    // returns. Kernels do not write shapes.
    #[allow(unsafe_code)]
    let called = unsafe { kernel.call(values) };
    match called.map_err(|e| VmError::Kernel { name: name.to_owned(), code: e.code, message: e.message })? {
        CallValue::None => Ok(Value::Null),
        CallValue::Int(i) => Ok(Value::Int(i)),
        CallValue::Float(f) => Ok(Value::Float(f)),
        other => Err(VmError::Program(format!(
            "function `{name}` returned a value the VM cannot hold ({})",
            call_value_kind(&other)
        ))),
    }
}

/// The place of an argument that is not a tensor in `call_kernel`'s array of DLTensors (never
/// passed to the kernel).
const UNUSED_DL_TENSOR: DLTensor = DLTensor {
    data: std::ptr::null_mut(),
    device: crate::ffi::packed::DLDevice { device_type: 0, device_id: 0 },
    ndim: 0,
    dtype: crate::ffi::packed::DLDataType { code: 0, bits: 0, lanes: 0 },
    shape: std::ptr::null_mut(),
    strides: std::ptr::null_mut(),
    byte_offset: 0,
};

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
        CallValue::Object { .. } => "a tvm-ffi object",
    }
}
