//! DLPack's structs as compiled functions take them (`DLDevice`, `DLDataType`, `DLTensor`).
//!
//! A function TVM compiles for the host has the "packed" signature
//! `int f(TVMValue* args, int* type_codes, int num_args, TVMValue* ret, int* ret_code, void*)`
//! (TVM 0.8 to 0.20) or tvm-ffi's safe-call signature (0.21 and later), tensors passed as
//! `DLTensor*` with type code 7. It reports errors and reaches the runtime through the function
//! pointers stored in the library's `__TVM*` data symbols, which the loader fills. [`crate::ffi::call::PackedFunction`] calls either convention.
//!
//! This file is part of the FFI edge ([`crate::ffi`]).
use std::ffi::c_void;

use crate::format::DataType;

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
