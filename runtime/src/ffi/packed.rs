//! DLPack's structs as compiled functions take them, and the simplest call: tensors into a
//! classic packed function.
//!
//! A function TVM compiles for the host has the "packed" signature
//! `int f(TVMValue* args, int* type_codes, int num_args, TVMValue* ret, int* ret_code, void*)`
//! (TVM 0.8 to 0.20) or tvm-ffi's safe-call signature (0.21 and later), tensors passed as
//! `DLTensor*` with type code 7. It reports errors and reaches the runtime through the function
//! pointers stored in the library's `__TVM*` data symbols, which the loader fills
//! ([`crate::ffi::context`]). [`crate::ffi::PackedFunction`] calls either convention.
//!
//! This file is part of the FFI edge ([`crate::ffi`]).
#![allow(unsafe_code)]

use std::ffi::c_void;

use crate::format::DataType;
use crate::module::Symbol;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// 1 for CPU, 2 for CUDA.
    pub device_type: i32,
    /// Device ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// Type code.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes.
    pub lanes: u16,
}

impl From<DataType> for DLDataType {
    fn from(t: DataType) -> DLDataType {
        DLDataType { code: t.code, bits: t.bits, lanes: t.lanes }
    }
}

/// `DLTensor`: a borrowed view of an array, as compiled functions take it.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The first element.
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// Strides in elements, or null for a compact row-major array.
    pub strides: *mut i64,
    /// Byte offset of the first element from `data`.
    pub byte_offset: u64,
}

impl DLTensor {
    /// A CPU `float32` tensor over `data` with `shape`. The tensor borrows both: keep them alive
    /// and unmoved while it is used.
    pub fn f32(data: &mut [f32], shape: &mut [i64]) -> DLTensor {
        DLTensor {
            data: data.as_mut_ptr().cast(),
            device: DLDevice { device_type: 1, device_id: 0 },
            ndim: shape.len() as i32,
            dtype: DataType::F32.into(),
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
}

/// Error of a packed call: the return code and the message the function set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("packed function returned {code}: {message}")]
pub struct CallError {
    /// The non-zero return code.
    pub code: i32,
    /// What the function reported through `TVMAPISetLastError` (empty if nothing).
    pub message: String,
}

/// Calls a compiled host function with tensor arguments, as TVM's packed call does, in the
/// classic convention (TVM 0.8 to 0.20). [`crate::ffi::PackedFunction`] calls either
/// convention with any arguments.
///
/// # Safety
///
/// `f` must be a function TVM compiled for the host of this process (packed signature, TVM
/// 0.8 to 0.20), from a library loaded by [`crate::load_library`] (which installed the context
/// functions), and each tensor must describe live memory of the size its shape and dtype say,
/// matching what the function expects.
pub unsafe fn call_packed(f: &Symbol, tensors: &mut [DLTensor]) -> Result<(), CallError> {
    let func = crate::ffi::PackedFunction::native(f.clone(), crate::ffi::Abi::Packed);
    // SAFETY: forwarded from the caller.
    unsafe { func.call_tensors(tensors) }
}

/// The last message a compiled function reported on this thread.
pub fn last_error() -> String {
    crate::ffi::context::last_error()
}
