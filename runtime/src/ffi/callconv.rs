//! Calling TVM-compiled host functions, in both of TVM's conventions, with tensors and
//! scalars.
//!
//! - [`Abi::Packed`] (TVM 0.8 to 0.20): `int f(TVMValue* args, int* type_codes, int n,
//!   TVMValue* ret, int* ret_code, void* resource_handle)`, 8-byte values with a separate array
//!   of type codes.
//! - [`Abi::Ffi`] (tvm-ffi, TVM 0.21 and later): `int f(void* self, const TVMFFIAny* args,
//!   int32_t n, TVMFFIAny* result)`, 16-byte values that carry their type index.
//!
//! A [`PackedFunction`] is either such a native function (with its convention) or a Rust
//! closure. A module kind offers Rust functions to compiled code (`GetFuncFromEnv`, e.g. a CUDA
//! kernel launcher) through [`Module::get_function`] with [`function_symbol`]. [`LoadedTree::packed_function`] finds one by name as TVM's
//! `GetFunction(name, query_imports = true)` does; on a tvm-ffi library `add` finds
//! `__tvm_ffi_add`.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr, CString};
use std::fmt;
use std::sync::Arc;

use crate::ffi::packed::{CallError, DLDataType, DLDevice, DLTensor};
use crate::module::{LoadedTree, Module, Symbol};

/// The calling convention of a library's compiled functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// TVM 0.8 to 0.20: `TVMBackendPackedCFunc`, type codes in a separate array.
    Packed,
    /// TVM 0.21 and later: tvm-ffi's `TVMFFISafeCallType` over `TVMFFIAny` values.
    Ffi,
}

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
const K_NULL: c_int = 4;
const K_DATATYPE: c_int = 5;
const K_DEVICE: c_int = 6;
const K_DLTENSOR: c_int = 7;
const K_STR: c_int = 11;

// tvm-ffi type indices.
const F_NONE: i32 = 0;
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
pub union TVMValue {
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
pub struct TVMFFIAny {
    /// The type index.
    pub type_index: i32,
    /// Zero, or the length of a small string.
    pub small_len: u32,
    /// The payload.
    pub value: TVMValue,
}

impl TVMFFIAny {
    fn none() -> TVMFFIAny {
        TVMFFIAny { type_index: F_NONE, small_len: 0, value: TVMValue { v_int64: 0 } }
    }
}

pub(crate) type PackedCFn =
    unsafe extern "C" fn(*mut TVMValue, *mut c_int, c_int, *mut TVMValue, *mut c_int, *mut c_void) -> c_int;
pub(crate) type SafeCallFn = unsafe extern "C" fn(*mut c_void, *const TVMFFIAny, i32, *mut TVMFFIAny) -> c_int;

/// A function a Rust module offers to compiled code: arguments in, a value or a message out.
pub type RustFunction = dyn Fn(&[Value]) -> Result<Value, String> + Send + Sync;

/// A function callable with packed arguments: native code of a library, or a Rust closure.
#[derive(Clone)]
pub struct PackedFunction {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Native { symbol: Symbol, abi: Abi },
    Rust(Arc<RustFunction>),
}

impl fmt::Debug for PackedFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Native { symbol, abi } => write!(f, "PackedFunction({symbol:?}, {abi:?})"),
            Inner::Rust(_) => f.write_str("PackedFunction(<rust closure>)"),
        }
    }
}

impl PackedFunction {
    /// A native function at `symbol` with convention `abi`.
    pub fn native(symbol: Symbol, abi: Abi) -> PackedFunction {
        PackedFunction { inner: Inner::Native { symbol, abi } }
    }

    /// A Rust closure.
    pub fn from_fn(f: impl Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static) -> PackedFunction {
        PackedFunction { inner: Inner::Rust(Arc::new(f)) }
    }

    /// The convention of a native function; `None` for a closure.
    pub fn abi(&self) -> Option<Abi> {
        match &self.inner {
            Inner::Native { abi, .. } => Some(*abi),
            Inner::Rust(_) => None,
        }
    }

    /// The native address, when it is native code.
    pub fn symbol(&self) -> Option<&Symbol> {
        match &self.inner {
            Inner::Native { symbol, .. } => Some(symbol),
            Inner::Rust(_) => None,
        }
    }

    /// Calls the function. A non-zero return comes back as a [`CallError`] carrying the
    /// message the function set (`TVMAPISetLastError`, `TVMFFIErrorSetRaisedFromCStr*`).
    ///
    /// # Safety
    ///
    /// For native code: the function must be what its convention says, from a library loaded
    /// by [`crate::load_library`] (which installed the context), and every pointer argument
    /// (tensors, their shapes and data, handles) must be valid for what the function does
    /// with it, which for compiled kernels means the dtype, shape and device they check and
    /// 64-byte aligned data they assume.
    pub unsafe fn call(&self, args: &[Value]) -> Result<Value, CallError> {
        match &self.inner {
            // SAFETY: forwarded from the caller.
            Inner::Native { symbol, abi: Abi::Packed } => unsafe {
                call_classic(symbol.addr(), symbol.resource(), args)
            },
            // SAFETY: forwarded from the caller.
            Inner::Native { symbol, abi: Abi::Ffi } => unsafe { call_ffi(symbol.addr(), symbol.resource(), args) },
            Inner::Rust(f) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(args))) {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(message)) => Err(CallError { code: -1, message }),
                Err(_) => Err(CallError { code: -1, message: "a Rust function panicked".into() }),
            },
        }
    }

    /// Calls with tensor arguments only (what kernels take).
    ///
    /// # Safety
    ///
    /// As [`PackedFunction::call`].
    pub unsafe fn call_tensors(&self, tensors: &mut [DLTensor]) -> Result<(), CallError> {
        let args: Vec<Value> = tensors.iter_mut().map(|t| Value::Tensor(t)).collect();
        // SAFETY: forwarded from the caller.
        unsafe { self.call(&args) }.map(|_| ())
    }
}

fn call_error(code: c_int) -> CallError {
    CallError { code, message: super::context::last_error() }
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
        };
        values.push(v);
        codes.push(c);
    }
    Ok((values, codes, strings))
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
            _ => TVMValue { v_int64: 0 },
        };
        out.push(encode_ffi_value(a, value));
    }
    Ok((out, strings))
}

/// One tvm-ffi value; `string` is the payload of a string argument (a pointer to its C string).
fn encode_ffi_value(a: &Value, string: TVMValue) -> TVMFFIAny {
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

/// Calls a classic packed function.
///
/// # Safety
///
/// `addr` must be a `TVMBackendPackedCFunc`; see [`PackedFunction::call`].
pub(crate) unsafe fn call_classic(
    addr: *mut c_void,
    resource: *mut c_void,
    args: &[Value],
) -> Result<Value, CallError> {
    let (mut values, mut codes, _strings) = encode_classic(args)?;
    // SAFETY: per the contract `addr` has this signature; the argument arrays (and the strings
    // they point to) live until it returns.
    let (ret, ret_code) = unsafe { invoke_classic(addr, resource, &mut values, &mut codes) }?;
    // SAFETY: a compiled function returns strings as NUL-terminated C strings.
    Ok(unsafe { decode_classic(ret, ret_code) })
}

/// Calls the classic packed function at `addr` on encoded arguments, after clearing this
/// thread's last error; its return value and type code, or the error it reported.
///
/// # Safety
///
/// `addr` must be a `TVMBackendPackedCFunc`, and the values (with what they point to) must be
/// valid arguments for it until it returns.
pub(crate) unsafe fn invoke_classic(
    addr: *mut c_void,
    resource: *mut c_void,
    values: &mut [TVMValue],
    codes: &mut [c_int],
) -> Result<(TVMValue, c_int), CallError> {
    let mut ret = TVMValue { v_int64: 0 };
    let mut ret_code: c_int = K_NULL;
    super::context::clear_last_error();
    // SAFETY: forwarded from the caller; `ret` and `ret_code` outlive the call.
    let code = unsafe {
        let f = std::mem::transmute::<*mut c_void, PackedCFn>(addr);
        f(values.as_mut_ptr(), codes.as_mut_ptr(), values.len() as c_int, &mut ret, &mut ret_code, resource)
    };
    if code != 0 {
        return Err(call_error(code));
    }
    Ok((ret, ret_code))
}

/// Calls the tvm-ffi safe-call function at `addr` on encoded arguments, after clearing this
/// thread's last error; its result (None to start with, as the convention requires), or the
/// error it reported.
///
/// # Safety
///
/// `addr` must be a `TVMFFISafeCallType`, and the values (with what they point to) must be
/// valid arguments for it until it returns.
pub(crate) unsafe fn invoke_ffi(
    addr: *mut c_void,
    resource: *mut c_void,
    values: &[TVMFFIAny],
) -> Result<TVMFFIAny, CallError> {
    let mut result = TVMFFIAny::none();
    super::context::clear_last_error();
    // SAFETY: forwarded from the caller; `result` outlives the call.
    let code = unsafe {
        let f = std::mem::transmute::<*mut c_void, SafeCallFn>(addr);
        f(resource, values.as_ptr(), values.len() as i32, &mut result)
    };
    if code != 0 {
        return Err(call_error(code));
    }
    Ok(result)
}

/// Calls a tvm-ffi safe-call function.
///
/// # Safety
///
/// `addr` must be a `TVMFFISafeCallType`; see [`PackedFunction::call`].
pub(crate) unsafe fn call_ffi(addr: *mut c_void, resource: *mut c_void, args: &[Value]) -> Result<Value, CallError> {
    if !args.iter().any(|a| matches!(a, Value::Str(_))) {
        // No strings to keep alive: the arguments are encoded on the stack (a VM's kernel
        // calls, many per inference, take this way).
        let mut stack = [TVMFFIAny::none(); 8];
        let heap: Vec<TVMFFIAny>;
        let values: &[TVMFFIAny] = if args.len() <= stack.len() {
            for (slot, a) in stack.iter_mut().zip(args) {
                *slot = encode_ffi_value(a, TVMValue { v_int64: 0 });
            }
            &stack[..args.len()]
        } else {
            heap = args.iter().map(|a| encode_ffi_value(a, TVMValue { v_int64: 0 })).collect();
            &heap
        };
        // SAFETY: per the contract `addr` has this signature; the arguments live until it returns.
        let result = unsafe { invoke_ffi(addr, resource, values) }?;
        if result.type_index == F_NONE {
            // What a destination-passing kernel returns, without the general decoding.
            return Ok(Value::None);
        }
        // SAFETY: as in `call_classic`.
        return Ok(unsafe { decode_ffi(&result) });
    }
    let (values, _strings) = encode_ffi(args)?;
    // SAFETY: per the contract `addr` has this signature; the arguments live until it returns.
    let result = unsafe { invoke_ffi(addr, resource, &values) }?;
    // SAFETY: as in `call_classic`.
    Ok(unsafe { decode_ffi(&result) })
}

impl LoadedTree {
    /// Finds a function by name from the root (as TVM's `GetFunction(name, query_imports =
    /// true)`): [`LoadedTree::lookup`] from module 0.
    pub fn packed_function(&self, name: &str) -> Option<PackedFunction> {
        self.lookup(0, name)
    }

    /// Finds `name` in module `from` and its imports, depth first
    /// ([`LoadedTree::depth_first`]), each module answering in its own calling convention
    /// ([`module_function`]): native functions of a library with the library's convention (on
    /// a tvm-ffi library `add` finds `__tvm_ffi_add`), and the functions other module kinds
    /// offer (a device module's kernels). This is the one lookup: the executors, the Relax VM
    /// and `GetFuncFromEnv` all go through it.
    pub fn lookup(&self, from: usize, name: &str) -> Option<PackedFunction> {
        self.depth_first(from).find_map(|i| module_function(self.modules()[i].module.as_ref(), name))
    }
}

/// A call whose arguments are encoded once and made many times (an executor's kernel calls).
pub struct PreparedCall {
    function: PackedFunction,
    encoded: Encoded,
}

enum Encoded {
    Classic { values: Vec<TVMValue>, codes: Vec<c_int>, _strings: Vec<CString> },
    Ffi { values: Vec<TVMFFIAny>, _strings: Vec<CString> },
    Rust(Vec<Value>),
}

impl fmt::Debug for PreparedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PreparedCall({:?})", self.function)
    }
}

impl PreparedCall {
    /// Encodes `args` for `function`'s convention.
    pub fn new(function: PackedFunction, args: Vec<Value>) -> Result<PreparedCall, CallError> {
        let encoded = match function.abi() {
            Some(Abi::Packed) => {
                let (values, codes, strings) = encode_classic(&args)?;
                Encoded::Classic { values, codes, _strings: strings }
            }
            Some(Abi::Ffi) => {
                let (values, strings) = encode_ffi(&args)?;
                Encoded::Ffi { values, _strings: strings }
            }
            None => Encoded::Rust(args),
        };
        Ok(PreparedCall { function, encoded })
    }

    /// Makes the call; the return value is dropped.
    ///
    /// # Safety
    ///
    /// As [`PackedFunction::call`], for the arguments given to [`PreparedCall::new`], which
    /// must still be valid.
    pub unsafe fn invoke(&mut self) -> Result<(), CallError> {
        let addr = self.function.symbol().map(|s| s.addr());
        let resource = self.function.symbol().map_or(std::ptr::null_mut(), |s| s.resource());
        match (&mut self.encoded, addr) {
            (Encoded::Classic { values, codes, .. }, Some(addr)) => {
                // SAFETY: per the contract; the arrays live in `self`. The resource handle is
                // the symbol's, as `PackedFunction::call` passes it (null for a library's
                // functions; a Rust function's own for `function_symbol`s).
                unsafe { invoke_classic(addr, resource, values, codes) }.map(|_| ())
            }
            (Encoded::Ffi { values, .. }, Some(addr)) => {
                // SAFETY: per the contract; the values live in `self`.
                unsafe { invoke_ffi(addr, resource, values) }.map(|_| ())
            }
            (Encoded::Rust(args), _) => {
                // SAFETY: forwarded from the caller.
                unsafe { self.function.call(args) }.map(|_| ())
            }
            _ => Err(CallError { code: -1, message: "internal: prepared call without an address".into() }),
        }
    }
}

/// A module's function `name` with its calling convention: the library's own convention
/// (each ABI's naming applied by [`crate::ffi::library::LibraryModule`]), classic packed for
/// every other kind.
pub fn module_function(module: &dyn Module, name: &str) -> Option<PackedFunction> {
    let abi = module.as_any().downcast_ref::<crate::ffi::library::LibraryModule>().map_or(Abi::Packed, |l| l.abi());
    module.get_function(name).map(|s| PackedFunction::native(s, abi))
}

/// Holds a Rust function behind a [`Symbol`] made by [`function_symbol`].
struct RustHolder(Box<RustFunction>);

/// Makes a Rust function callable as a native classic packed function, for a module kind's
/// [`Module::get_function`]: compiled code that looks it up by name (`GetFuncFromEnv`) and
/// calls it (`TVMFuncCall`) reaches `f` with the decoded arguments. Errors and panics come
/// back to the caller as an error return with the message.
pub fn function_symbol(f: impl Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static) -> Symbol {
    let holder = Arc::new(RustHolder(Box::new(f)));
    let resource = Arc::as_ptr(&holder).cast_mut().cast::<c_void>();
    Symbol::with_resource(rust_trampoline as *mut c_void, holder, resource)
}

extern "C" fn rust_trampoline(
    values: *mut TVMValue,
    codes: *mut c_int,
    n: c_int,
    ret: *mut TVMValue,
    ret_code: *mut c_int,
    resource: *mut c_void,
) -> c_int {
    let run = || -> Result<Value, String> {
        if resource.is_null() {
            return Err("a Rust function was called without its resource handle".into());
        }
        // SAFETY: `resource` is the `RustHolder` of the `Symbol` this address was handed out
        // with, which the caller keeps alive while it calls.
        let holder = unsafe { &*(resource as *const RustHolder) };
        let n = n.max(0) as usize;
        let args: Vec<Value> = if n == 0 || values.is_null() || codes.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller passes `n` values and `n` type codes.
            (0..n).map(|i| unsafe { decode_classic(*values.add(i), *codes.add(i)) }).collect()
        };
        (holder.0)(&args)
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(v)) => {
            if !ret.is_null() && !ret_code.is_null() {
                if let Ok((vals, codes, _)) = encode_classic(std::slice::from_ref(&v)) {
                    if !matches!(v, Value::Str(_)) {
                        // SAFETY: the caller's return slots are valid for writes.
                        unsafe {
                            *ret = vals[0];
                            *ret_code = codes[0];
                        }
                    }
                }
            }
            0
        }
        Ok(Err(msg)) => {
            super::context::set_last_error(&msg);
            -1
        }
        Err(_) => {
            super::context::set_last_error("a Rust function panicked");
            -1
        }
    }
}
