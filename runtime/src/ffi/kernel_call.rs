//! Safe calls of compiled kernels with [`NdArray`] arguments: what the executors and the VMs
//! call kernels through, so that `exec/` holds no `unsafe`.
//!
//! The trust is the one [`crate::load_library`] takes: its caller promised that the library's
//! functions are what its TVM compiled, so a function the tree exports under a kernel's name
//! takes the tensors TVM's graph, metadata or bytecode pass it. What this module adds is that
//! every pointer it hands over is valid: a `DLTensor` is made here from an [`NdArray`] (never
//! larger than its storage) that the call holds for as long as the pointer lives, with a shape
//! the call owns.
//!
//! - [`KernelCall`]: a call prepared once (arguments encoded, `DLTensor`s built) and made
//!   many times, holding its arrays: the graph executor's ops, the AOT entry.
//! - [`call_kernel`]: one call with borrowed arrays and scalars: the Relax and Relay VMs.
#![allow(unsafe_code)]

use crate::array::NdArray;
use crate::ffi::call::{PackedFunction, PreparedCall};
use crate::ffi::dlpack::{DLDataType, DLDevice, DLTensor};
use crate::ffi::last_error::CallError;
use crate::ffi::value::Value;

/// The `DLTensor` a kernel gets for `a`, as TVM passes it: a tensor a VM placed at a non-zero
/// offset of its storage (`NdArray::vm_offset`) comes as the storage's start and that
/// `byte_offset`. On the CPU only, where pointers are addresses; a device tensor comes as its
/// view (an OpenCL sub-buffer is no address to step back from).
pub(crate) fn kernel_dl_tensor(a: &NdArray) -> DLTensor {
    let mut t = a.dl_tensor();
    let offset = a.vm_offset();
    if offset != 0 && a.device().is_cpu() {
        // The view starts `offset` bytes into the storage it was made from (checked to lie
        // within it when the VM made it): stepping back gives that storage's start.
        t.data = t.data.cast::<u8>().wrapping_sub(offset).cast();
        t.byte_offset = offset as u64;
    }
    t
}

/// A call of a kernel with array arguments, prepared once: the `DLTensor`s built and the
/// arguments encoded in the function's convention. It holds the arrays (their storages live
/// as long as it does) and the shapes the `DLTensor`s point to.
pub(crate) struct KernelCall {
    call: PreparedCall,
    _tensors: Box<[DLTensor]>,
    _shapes: Box<[Box<[i64]>]>,
    _arrays: Vec<NdArray>,
}

// SAFETY: the raw pointers inside (the `DLTensor`s' data and shapes, the encoded arguments'
// pointers to the `DLTensor`s) point into what the call owns: the arrays' storages (shared
// `Arc`s, `Send + Sync`), its boxed shapes and tensors, never moved after `new`. The function
// is a `PackedFunction` (`Send + Sync`). Moving the call to another thread moves none of it.
unsafe impl Send for KernelCall {}

impl std::fmt::Debug for KernelCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KernelCall({:?}, {} arrays)", self.call, self._arrays.len())
    }
}

impl KernelCall {
    /// Prepares a call of `function` with `arrays`, each passed with its shape, or, with
    /// `flat`, as one dimension of all its elements (a graph op's `flatten_data`).
    pub(crate) fn new(function: PackedFunction, arrays: Vec<NdArray>, flat: bool) -> Result<KernelCall, CallError> {
        let shapes: Box<[Box<[i64]>]> = arrays
            .iter()
            .map(|a| if flat { vec![a.shape().iter().product::<i64>()].into() } else { a.shape().into() })
            .collect();
        let mut tensors: Box<[DLTensor]> = arrays
            .iter()
            .zip(shapes.iter())
            // The shape is only read by kernels (TVM's kernels never write a DLTensor's shape).
            .map(|(a, s)| DLTensor { ndim: s.len() as i32, shape: s.as_ptr().cast_mut(), ..a.dl_tensor() })
            .collect();
        let args = tensors.iter_mut().map(|t| Value::Tensor(t)).collect();
        let call = PreparedCall::new(function, args)?;
        Ok(KernelCall { call, _tensors: tensors, _shapes: shapes, _arrays: arrays })
    }

    /// Makes the call; the return value is dropped.
    pub(crate) fn invoke(&mut self) -> Result<(), CallError> {
        // SAFETY: the function is one of a library opened with `load_library`, whose caller
        // vouched for its code (the trust this module rests on). The encoded arguments point
        // to the `DLTensor`s in `self`, which describe the arrays `self` holds (each no larger
        // than its storage, on its own device) with shapes `self` owns, all alive and unmoved
        // until the call returns.
        unsafe { self.call.invoke() }
    }
}

/// An argument of [`call_kernel`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum KernelArg<'a> {
    /// A tensor, passed as a `DLTensor` ([`kernel_dl_tensor`]).
    Tensor(&'a NdArray),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Nothing (`None`).
    Null,
}

/// Calls `kernel` once with `args`, each passed as `arg` makes it (tensors as `DLTensor`s of
/// their arrays, borrowed for the call), in the kernel's own convention; gives what it
/// returned. The `DLTensor`s lie in an array on the stack sized to the call (most kernels take
/// two to eight arguments), in a vector past that; nothing else is collected.
#[inline]
pub(crate) fn call_kernel<T>(
    kernel: &PackedFunction,
    args: &[T],
    arg: impl for<'b> Fn(&'b T) -> KernelArg<'b>,
) -> Result<Value, CallError> {
    match args.len() {
        0..=2 => call_in::<2, T>(kernel, args, arg),
        3..=4 => call_in::<4, T>(kernel, args, arg),
        5..=8 => call_in::<8, T>(kernel, args, arg),
        _ => {
            let mut tensors: Vec<DLTensor> = args.iter().map(|_| UNUSED_DL_TENSOR).collect();
            let mut values: Vec<Value> = args.iter().map(|_| Value::None).collect();
            call_with(kernel, args, arg, &mut tensors, &mut values)
        }
    }
}

/// Calls a kernel with array arguments only (the Relay VM's primitives).
#[cfg(feature = "relay-vm")]
pub(crate) fn call_kernel_arrays(kernel: &PackedFunction, arrays: &[&NdArray]) -> Result<(), CallError> {
    let mut tensors: smallvec::SmallVec<[DLTensor; 8]> = arrays.iter().map(|a| kernel_dl_tensor(a)).collect();
    // SAFETY: as in `KernelCall::invoke`: the function is one of a library the caller of
    // `load_library` vouched for; every `DLTensor` describes an array borrowed for the whole
    // call (no larger than its storage), with the shape that array holds.
    unsafe { kernel.call_tensors(&mut tensors) }
}

/// [`call_kernel`] with arrays of `N` places (at least as many as the arguments).
#[inline]
fn call_in<const N: usize, T>(
    kernel: &PackedFunction,
    args: &[T],
    arg: impl for<'b> Fn(&'b T) -> KernelArg<'b>,
) -> Result<Value, CallError> {
    let mut tensors: [DLTensor; N] = [UNUSED_DL_TENSOR; N];
    let mut values: [Value; N] = std::array::from_fn(|_| Value::None);
    let n = args.len();
    call_with(kernel, args, arg, &mut tensors[..n], &mut values[..n])
}

/// [`call_kernel`] with `tensors` and `values` (one place per argument) to encode the
/// arguments in: the places are not touched again until the call returns, so that the
/// pointers to the `DLTensor`s stay valid.
#[inline]
fn call_with<T>(
    kernel: &PackedFunction,
    args: &[T],
    arg: impl for<'b> Fn(&'b T) -> KernelArg<'b>,
    tensors: &mut [DLTensor],
    values: &mut [Value],
) -> Result<Value, CallError> {
    for ((t, slot), a) in tensors.iter_mut().zip(values.iter_mut()).zip(args) {
        *slot = match arg(a) {
            KernelArg::Tensor(array) => {
                *t = kernel_dl_tensor(array);
                Value::Tensor(t as *mut DLTensor)
            }
            KernelArg::Int(i) => Value::Int(i),
            KernelArg::Float(f) => Value::Float(f),
            KernelArg::Null => Value::None,
        };
    }
    // SAFETY: as in `KernelCall::invoke`: the function is one of a library the caller of
    // `load_library` vouched for. Every tensor argument describes an array `args` borrows for
    // the whole call (no larger than its storage, on its own device), with the shape that
    // array holds; the `DLTensor`s live in `tensors` until the call returns.
    unsafe { kernel.call(values) }
}

/// The place of an argument that is not a tensor in the array of `DLTensor`s (never passed).
const UNUSED_DL_TENSOR: DLTensor = DLTensor {
    data: std::ptr::null_mut(),
    device: DLDevice { device_type: 0, device_id: 0 },
    ndim: 0,
    dtype: DLDataType { code: 0, bits: 0, lanes: 0 },
    shape: std::ptr::null_mut(),
    strides: std::ptr::null_mut(),
    byte_offset: 0,
};
