//! Packed values in TVM's two conventions, and their coding. Which one a function takes
//! follows the TVM generation of its code ([`Layout::ffi_values`](crate::format::Layout::ffi_values)):
//!
//! - classic ([`Layout::Classic`](crate::format::Layout::Classic), TVM 0.8 to 0.20):
//!   `int f(TVMValue* args, int* type_codes, int n, TVMValue* ret, int* ret_code, void*
//!   resource_handle)`, 8-byte values with a separate array of type codes.
//! - tvm-ffi (TVM 0.21 and later): `int f(void* self, const TVMFFIAny* args, int32_t n,
//!   TVMFFIAny* result)`, 16-byte values that carry their type index.
//!
//! [`Value`] is an argument or a return value of either; TVM's `TVMValue` and `TVMFFIAny`
//! are their C forms (crate-private here). The calls themselves are in [`super::call`].
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr, CString};

use crate::ffi::dlpack::{DLDataType, DLDevice, DLTensor};
use crate::ffi::last_error::CallError;

/// An argument or a return value of a packed call.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value (`kTVMNullptr` / `kTVMFFINone`).
    None,
    /// An integer (also what a `bool` or `uint` comes back as).
    Int(i64),
    /// A float.
    Float(f64),
    /// An opaque pointer (`kTVMOpaqueHandle` / `kTVMFFIOpaquePtr`).
    Handle(*mut c_void),
    /// A data type.
    DataType(DLDataType),
    /// A device.
    Device(DLDevice),
    /// A `DLTensor*` (`kTVMDLTensorHandle` / `kTVMFFIDLTensorPtr`, code 7 in both).
    Tensor(*mut DLTensor),
    /// A string (passed as a NUL-terminated C string).
    Str(String),
    /// A byte string, between Rust functions only (`opencl.GetPreCompiledPrograms`): compiled
    /// code is never passed one.
    Bytes(Vec<u8>),
    /// A tvm-ffi object returned by a function (type index 64 or more). mblob has no object
    /// system: the reference is not released.
    Object {
        /// Its type index.
        type_index: i32,
        /// The object.
        ptr: *mut c_void,
    },
}

// Classic type codes (`TVMArgTypeCode`).
const K_INT: c_int = 0;
const K_UINT: c_int = 1;
const K_FLOAT: c_int = 2;
const K_HANDLE: c_int = 3;
pub(crate) const K_NULL: c_int = 4;
const K_DATATYPE: c_int = 5;
const K_DEVICE: c_int = 6;
const K_DLTENSOR: c_int = 7;
const K_STR: c_int = 11;

// tvm-ffi type indices.
pub(crate) const F_NONE: i32 = 0;
const F_INT: i32 = 1;
const F_BOOL: i32 = 2;
const F_FLOAT: i32 = 3;
const F_PTR: i32 = 4;
const F_DATATYPE: i32 = 5;
const F_DEVICE: i32 = 6;
const F_DLTENSOR: i32 = 7;
const F_RAWSTR: i32 = 8;
const F_SMALLSTR: i32 = 11;
const F_OBJECT_BEGIN: i32 = 64;

/// `TVMValue`: the 8-byte union of the classic convention.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union TVMValue {
    /// Integers.
    pub v_int64: i64,
    /// Floats.
    pub v_float64: f64,
    /// Pointers and strings.
    pub v_handle: *mut c_void,
    /// Data types.
    pub v_type: DLDataType,
    /// Devices.
    pub v_device: DLDevice,
}

/// `TVMFFIAny`: the 16-byte tagged value of tvm-ffi.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct TVMFFIAny {
    /// The type index.
    pub type_index: i32,
    /// Zero, or the length of a small string.
    pub small_len: u32,
    /// The payload.
    pub value: TVMValue,
}

impl TVMFFIAny {
    pub(crate) fn none() -> TVMFFIAny {
        TVMFFIAny { type_index: F_NONE, small_len: 0, value: TVMValue { v_int64: 0 } }
    }
}

/// Classic values, their type codes, and the strings they point to.
pub(crate) type ClassicArgs = (Vec<TVMValue>, Vec<c_int>, Vec<CString>);

/// Encodes `args` as classic values; strings are kept alive in the returned vector.
pub(crate) fn encode_classic(args: &[Value]) -> Result<ClassicArgs, CallError> {
    let mut values = Vec::with_capacity(args.len());
    let mut codes = Vec::with_capacity(args.len());
    let mut strings = Vec::new();
    for a in args {
        let (v, c) = match a {
            Value::None => (TVMValue { v_int64: 0 }, K_NULL),
            Value::Int(i) => (TVMValue { v_int64: *i }, K_INT),
            Value::Float(f) => (TVMValue { v_float64: *f }, K_FLOAT),
            Value::Handle(p) if p.is_null() => (TVMValue { v_int64: 0 }, K_NULL),
            Value::Handle(p) => (TVMValue { v_handle: *p }, K_HANDLE),
            Value::DataType(t) => (TVMValue { v_type: *t }, K_DATATYPE),
            Value::Device(d) => (TVMValue { v_device: *d }, K_DEVICE),
            Value::Tensor(t) => (TVMValue { v_handle: t.cast() }, K_DLTENSOR),
            Value::Str(s) => {
                let c = CString::new(s.as_str())
                    .map_err(|_| CallError { code: -1, message: format!("string argument {s:?} holds a NUL byte") })?;
                let v = TVMValue { v_handle: c.as_ptr().cast_mut().cast() };
                strings.push(c);
                (v, K_STR)
            }
            Value::Object { .. } => {
                return Err(CallError {
                    code: -1,
                    message: "tvm-ffi objects cannot be passed to a classic function".into(),
                })
            }
            Value::Bytes(_) => return Err(bytes_to_compiled_code()),
        };
        values.push(v);
        codes.push(c);
    }
    Ok((values, codes, strings))
}

/// A byte string passed to compiled code, which mblob does not do.
fn bytes_to_compiled_code() -> CallError {
    CallError { code: -1, message: "a byte string cannot be passed to a compiled function".into() }
}

/// Decodes one classic value. Strings are copied.
///
/// # Safety
///
/// A string (code 11) must point to a NUL-terminated string.
pub(crate) unsafe fn decode_classic(v: TVMValue, code: c_int) -> Value {
    // SAFETY: the union field read is the one the type code names; strings per the contract.
    unsafe {
        match code {
            K_INT | K_UINT => Value::Int(v.v_int64),
            K_FLOAT => Value::Float(v.v_float64),
            K_HANDLE => Value::Handle(v.v_handle),
            K_NULL => Value::None,
            K_DATATYPE => Value::DataType(v.v_type),
            K_DEVICE => Value::Device(v.v_device),
            K_DLTENSOR => Value::Tensor(v.v_handle.cast()),
            K_STR if !v.v_handle.is_null() => {
                Value::Str(CStr::from_ptr(v.v_handle.cast()).to_string_lossy().into_owned())
            }
            other => Value::Object { type_index: other, ptr: v.v_handle },
        }
    }
}

/// Encodes `args` as tvm-ffi values; strings are kept alive in the returned vector.
pub(crate) fn encode_ffi(args: &[Value]) -> Result<(Vec<TVMFFIAny>, Vec<CString>), CallError> {
    let mut out = Vec::with_capacity(args.len());
    let mut strings = Vec::new();
    for a in args {
        let value = match a {
            Value::Str(s) => {
                let c = CString::new(s.as_str())
                    .map_err(|_| CallError { code: -1, message: format!("string argument {s:?} holds a NUL byte") })?;
                let v = TVMValue { v_handle: c.as_ptr().cast_mut().cast() };
                strings.push(c);
                v
            }
            Value::Bytes(_) => return Err(bytes_to_compiled_code()),
            _ => TVMValue { v_int64: 0 },
        };
        out.push(encode_ffi_value(a, value));
    }
    Ok((out, strings))
}

/// One tvm-ffi value; `string` is the payload of a string argument (a pointer to its C string).
pub(crate) fn encode_ffi_value(a: &Value, string: TVMValue) -> TVMFFIAny {
    let (index, value) = match a {
        Value::None => (F_NONE, TVMValue { v_int64: 0 }),
        Value::Int(i) => (F_INT, TVMValue { v_int64: *i }),
        Value::Float(f) => (F_FLOAT, TVMValue { v_float64: *f }),
        Value::Handle(p) if p.is_null() => (F_NONE, TVMValue { v_int64: 0 }),
        Value::Handle(p) => (F_PTR, TVMValue { v_handle: *p }),
        Value::DataType(t) => (F_DATATYPE, TVMValue { v_type: *t }),
        Value::Device(d) => (F_DEVICE, TVMValue { v_device: *d }),
        Value::Tensor(t) => (F_DLTENSOR, TVMValue { v_handle: t.cast() }),
        Value::Str(_) => (F_RAWSTR, string),
        // Refused by `encode_ffi`, which every call with one goes through.
        Value::Bytes(_) => (F_NONE, TVMValue { v_int64: 0 }),
        Value::Object { type_index, ptr } => (*type_index, TVMValue { v_handle: *ptr }),
    };
    // Only the 8 payload bytes matter; a DataType or Device fills part of them, the rest
    // stays zero as tvm-ffi requires.
    let mut any = TVMFFIAny::none();
    any.type_index = index;
    match a {
        Value::DataType(t) => any.value.v_type = *t,
        Value::Device(d) => any.value.v_device = *d,
        _ => any.value = value,
    }
    any
}

/// Decodes one tvm-ffi value. Strings are copied.
///
/// # Safety
///
/// A raw string (index 8) must point to a NUL-terminated string.
pub(crate) unsafe fn decode_ffi(a: &TVMFFIAny) -> Value {
    // SAFETY: the union field read is the one the type index names; strings per the contract.
    unsafe {
        match a.type_index {
            F_NONE => Value::None,
            F_INT | F_BOOL => Value::Int(a.value.v_int64),
            F_FLOAT => Value::Float(a.value.v_float64),
            F_PTR => Value::Handle(a.value.v_handle),
            F_DATATYPE => Value::DataType(a.value.v_type),
            F_DEVICE => Value::Device(a.value.v_device),
            F_DLTENSOR => Value::Tensor(a.value.v_handle.cast()),
            F_RAWSTR if !a.value.v_handle.is_null() => {
                Value::Str(CStr::from_ptr(a.value.v_handle.cast()).to_string_lossy().into_owned())
            }
            F_SMALLSTR => {
                let bytes: [u8; 8] = a.value.v_int64.to_ne_bytes();
                let n = (a.small_len as usize).min(8);
                Value::Str(String::from_utf8_lossy(&bytes[..n]).into_owned())
            }
            i if i >= F_OBJECT_BEGIN => Value::Object { type_index: i, ptr: a.value.v_handle },
            other => Value::Object { type_index: other, ptr: a.value.v_handle },
        }
    }
}
