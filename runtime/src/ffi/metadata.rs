//! An AOT model's `TVMMetadata` (TVM's `runtime/metadata_types.h`, version 1), read out of the
//! loaded library into plain Rust data: `get_c_metadata` is called (a function of a library
//! whose code the caller trusted at `load_library`) and the struct it returns is copied, every
//! count and pointer checked before it is followed. `exec::aot` makes its model signature of
//! it.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};

use crate::ffi::call::PackedFunction;
use crate::ffi::dlpack::DLDataType;
use crate::ffi::value::Value;

/// The `TVMMetadata` version this reader knows.
pub(crate) const METADATA_VERSION: i64 = 1;

/// Limits on what the metadata may claim (beyond them it is not a real model's).
const MAX_TENSORS: i64 = 1 << 16;
const MAX_NDIM: i64 = 64;
/// The largest constant (TVM bounds the merged pool the same way).
const MAX_CONSTANT: i64 = i32::MAX as i64;

/// One `TVMTensorInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawTensorInfo {
    /// Its name (empty when null).
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its element type.
    pub dtype: DLDataType,
}

/// One `TVMConstantInfo`: a tensor in TVM's `NDArray::Save` format at a byte offset of the
/// constant pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawConstant {
    /// Where its data goes in the merged pool.
    pub byte_offset: i64,
    /// The saved tensor's bytes.
    pub data: Vec<u8>,
}

/// A `TVMMetadata`, copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawMetadata {
    /// Inputs, in argument order.
    pub inputs: Vec<RawTensorInfo>,
    /// Outputs, in argument order.
    pub outputs: Vec<RawTensorInfo>,
    /// The workspace pools (USMP).
    pub workspace_pools: Vec<RawTensorInfo>,
    /// The pooled constants (USMP), empty ones left out.
    pub constants: Vec<RawConstant>,
    /// The model's name.
    pub mod_name: Option<String>,
}

/// Why an AOT model's metadata cannot be read or is inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// `get_c_metadata` failed.
    #[error("get_c_metadata failed: {message}")]
    Call {
        /// What it reported.
        message: String,
    },
    /// `get_c_metadata` returned something other than a handle.
    #[error("get_c_metadata returned {returned}, expected a handle")]
    NotAHandle {
        /// What it returned.
        returned: String,
    },
    /// `get_c_metadata` returned a null handle.
    #[error("get_c_metadata returned null")]
    Null,
    /// A `TVMMetadata` of another version.
    #[error("version {found} (this reader knows {expected})")]
    Version {
        /// The version read.
        found: i64,
        /// The version this reader knows.
        expected: i64,
    },
    /// A list whose count is out of range (or whose entries are null).
    #[error("{list}: count {count}")]
    Count {
        /// `inputs`, `outputs`, `workspace_pools` or `constant_pools`.
        list: &'static str,
        /// The count read.
        count: i64,
    },
    /// A tensor whose number of dimensions is out of range (or whose shape is null).
    #[error("{list}[{index}]: ndim {ndim}")]
    Ndim {
        /// The list.
        list: &'static str,
        /// The entry.
        index: usize,
        /// The number read.
        ndim: i64,
    },
    /// A tensor whose shape has no size (a negative extent, or bytes past 2^64).
    #[error("{list}[{index}]: shape {shape:?}")]
    Shape {
        /// The list.
        list: &'static str,
        /// The entry.
        index: usize,
        /// The shape read.
        shape: Vec<i64>,
    },
    /// A constant whose size or offset is out of range (or whose data is null).
    #[error("constant_pools[{index}]: {bytes} bytes at offset {offset}")]
    Constant {
        /// The entry.
        index: usize,
        /// Its size.
        bytes: i64,
        /// Its offset in the merged pool.
        offset: i64,
    },
    /// A constant that is not a tensor in TVM's `NDArray::Save` format.
    #[error("constant_pools[{index}]: {source}")]
    ConstantTensor {
        /// The entry.
        index: usize,
        /// Why it does not read.
        source: crate::format::FormatError,
    },
    /// Constants that merge into a pool past TVM's bound (2^31 - 1 bytes).
    #[error("constant pool of {bytes} bytes")]
    ConstantPool {
        /// The merged pool's size.
        bytes: usize,
    },
    /// No `mod_name`.
    #[error("no mod_name")]
    NoModName,
}

#[repr(C)]
struct CTensorInfo {
    name: *const c_char,
    shape: *const i64,
    num_shape: i64,
    dtype: DLDataType,
}

#[repr(C)]
struct CMetadata {
    version: i64,
    inputs: *const CTensorInfo,
    num_inputs: i64,
    outputs: *const CTensorInfo,
    num_outputs: i64,
    workspace_pools: *const CTensorInfo,
    num_workspace_pools: i64,
    constant_pools: *const CConstantInfo,
    num_constant_pools: i64,
    mod_name: *const c_char,
}

#[repr(C)]
struct CConstantInfo {
    _name_hint: *const c_char,
    byte_offset: i64,
    data_len: i64,
    data_bytes: *const c_void,
}

/// Calls `get_c_metadata` (the packed function TVM's AOT codegen emits: no arguments, returns a
/// handle to the metadata in the library's read-only data) and copies the metadata out.
pub(crate) fn read_c_metadata(get_c_metadata: &PackedFunction) -> Result<RawMetadata, MetadataError> {
    // SAFETY: a function of a tree whose caller took the trust in its code at `load_library`;
    // it takes no arguments.
    let ret = unsafe { get_c_metadata.call(&[]) }.map_err(|e| MetadataError::Call { message: e.message })?;
    let Value::Handle(p) = ret else {
        return Err(MetadataError::NotAHandle { returned: format!("{ret:?}") });
    };
    // SAFETY: `p` is what `get_c_metadata` returned: a `TVMMetadata` of the loaded library,
    // valid while it is loaded (the function's `Symbol` holds it).
    unsafe { read(p) }
}

/// Copies the `TVMMetadata` at `p`.
///
/// # Safety
///
/// `p` is null or points to a `TVMMetadata` whose pointers are valid for the counts it gives.
unsafe fn read(p: *const c_void) -> Result<RawMetadata, MetadataError> {
    if p.is_null() {
        return Err(MetadataError::Null);
    }
    // SAFETY: per the contract, `p` points to a `TVMMetadata`.
    let m = unsafe { &*(p as *const CMetadata) };
    if m.version != METADATA_VERSION {
        return Err(MetadataError::Version { found: m.version, expected: METADATA_VERSION });
    }
    // SAFETY: strings of the metadata are NUL-terminated constants of the library.
    let string = |s: *const c_char| unsafe { (!s.is_null()).then(|| CStr::from_ptr(s).to_string_lossy().into_owned()) };
    let infos = |arr: *const CTensorInfo, n: i64, list: &'static str| -> Result<Vec<RawTensorInfo>, MetadataError> {
        if !(0..=MAX_TENSORS).contains(&n) || (n > 0 && arr.is_null()) {
            return Err(MetadataError::Count { list, count: n });
        }
        (0..n as usize)
            .map(|i| {
                // SAFETY: the metadata holds `n` entries at `arr`.
                let t = unsafe { &*arr.add(i) };
                if !(0..=MAX_NDIM).contains(&t.num_shape) || (t.num_shape > 0 && t.shape.is_null()) {
                    return Err(MetadataError::Ndim { list, index: i, ndim: t.num_shape });
                }
                let shape = match t.num_shape {
                    0 => Vec::new(),
                    // SAFETY: the entry's shape has `num_shape` extents (checked non-null).
                    n => unsafe { std::slice::from_raw_parts(t.shape, n as usize) }.to_vec(),
                };
                Ok(RawTensorInfo { name: string(t.name).unwrap_or_default(), shape, dtype: t.dtype })
            })
            .collect()
    };
    let n = m.num_constant_pools;
    if !(0..=MAX_TENSORS).contains(&n) || (n > 0 && m.constant_pools.is_null()) {
        return Err(MetadataError::Count { list: "constant_pools", count: n });
    }
    let mut constants = Vec::new();
    for i in 0..n as usize {
        // SAFETY: the metadata holds `n` entries at `constant_pools`.
        let c = unsafe { &*m.constant_pools.add(i) };
        if c.data_len == 0 {
            continue;
        }
        if !(0..=MAX_CONSTANT).contains(&c.data_len)
            || !(0..=MAX_CONSTANT).contains(&c.byte_offset)
            || c.data_bytes.is_null()
        {
            return Err(MetadataError::Constant { index: i, bytes: c.data_len, offset: c.byte_offset });
        }
        // SAFETY: `data_bytes` holds `data_len` bytes (the contract).
        let data = unsafe { std::slice::from_raw_parts(c.data_bytes.cast::<u8>(), c.data_len as usize) }.to_vec();
        constants.push(RawConstant { byte_offset: c.byte_offset, data });
    }
    Ok(RawMetadata {
        inputs: infos(m.inputs, m.num_inputs, "inputs")?,
        outputs: infos(m.outputs, m.num_outputs, "outputs")?,
        workspace_pools: infos(m.workspace_pools, m.num_workspace_pools, "workspace_pools")?,
        constants,
        mod_name: string(m.mod_name),
    })
}
