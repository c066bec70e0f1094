//! Calling functions with packed arguments: a [`PackedFunction`] is native code of a library
//! (with its library's convention, the TVM generation of its code) or a Rust closure (what a module kind such as a
//! device module offers, e.g. a kernel launcher); inside the crate, a prepared call has its
//! arguments encoded once and is made many times.
//!
//! [`crate::module::Module::get_function`] hands out `PackedFunction`s, each knowing how it is
//! called; [`crate::LoadedTree::lookup`] finds one by name as TVM's `GetFunction(name,
//! query_imports = true)` does (on a tvm-ffi library `add` finds `__tvm_ffi_add`).
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::{c_int, c_void, CString};
use std::fmt;
use std::sync::Arc;

use crate::ffi::dlpack::DLTensor;
use crate::ffi::last_error::{self, CallError};
use crate::ffi::value::{
    decode_classic, decode_ffi, encode_classic, encode_ffi, encode_ffi_value, TVMFFIAny, TVMValue, Value, F_NONE,
    K_NULL,
};
use crate::format::Layout;

/// The address of a symbol, with a handle that keeps its library loaded.
#[derive(Clone)]
pub struct Symbol {
    addr: *mut c_void,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: a `Symbol` is an address plus a reference count on the library that maps it; the
// address is never dereferenced by this type, and the owner is itself `Send + Sync`.
unsafe impl Send for Symbol {}
// SAFETY: as above; sharing the address between threads does not touch what it points to.
unsafe impl Sync for Symbol {}

impl Symbol {
    pub(crate) fn new(addr: *mut c_void, owner: Arc<dyn Any + Send + Sync>) -> Symbol {
        Symbol { addr, _owner: owner }
    }

    /// The address. It stays valid while this `Symbol` (or its library) is alive. Calling it
    /// needs `unsafe` and the right function type, as with `dlsym`.
    pub fn addr(&self) -> *mut c_void {
        self.addr
    }
}

impl fmt::Debug for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Symbol({:p})", self.addr)
    }
}

pub(crate) type PackedCFn =
    unsafe extern "C" fn(*mut TVMValue, *mut c_int, c_int, *mut TVMValue, *mut c_int, *mut c_void) -> c_int;
pub(crate) type SafeCallFn = unsafe extern "C" fn(*mut c_void, *const TVMFFIAny, i32, *mut TVMFFIAny) -> c_int;

/// A function a Rust module offers to compiled code: arguments in, a value or a message out.
pub(crate) type RustFunction = dyn Fn(&[Value]) -> Result<Value, String> + Send + Sync;

/// A function callable with packed arguments: native code of a library, or a Rust closure.
#[derive(Clone)]
pub struct PackedFunction {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Native { symbol: Symbol, abi: Layout },
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
    /// A native function at `symbol` compiled by the TVM generation `abi` (and so called in
    /// its convention).
    pub(crate) fn native(symbol: Symbol, abi: Layout) -> PackedFunction {
        PackedFunction { inner: Inner::Native { symbol, abi } }
    }

    /// A Rust closure.
    pub fn from_fn(f: impl Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static) -> PackedFunction {
        PackedFunction { inner: Inner::Rust(Arc::new(f)) }
    }

    /// The TVM generation a native function was compiled by, whose convention it is called
    /// in; `None` for a closure.
    pub fn abi(&self) -> Option<Layout> {
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

    /// The native address (null for a Rust closure). It stays valid while the function is
    /// alive.
    pub fn addr(&self) -> *mut c_void {
        self.symbol().map_or(std::ptr::null_mut(), Symbol::addr)
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
            Inner::Native { symbol, abi } if !abi.ffi_values() => unsafe {
                call_classic(symbol.addr(), std::ptr::null_mut(), args)
            },
            // SAFETY: forwarded from the caller.
            Inner::Native { symbol, .. } => unsafe { call_ffi(symbol.addr(), std::ptr::null_mut(), args) },
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
    CallError { code, message: last_error::last_error() }
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
    last_error::clear_last_error();
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
    last_error::clear_last_error();
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
    if !args.iter().any(|a| matches!(a, Value::Str(_) | Value::Bytes(_))) {
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

/// A call whose arguments are encoded once and made many times (an executor's kernel calls).
pub(crate) struct PreparedCall {
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
    pub(crate) fn new(function: PackedFunction, args: Vec<Value>) -> Result<PreparedCall, CallError> {
        let encoded = match function.abi() {
            Some(abi) if !abi.ffi_values() => {
                let (values, codes, strings) = encode_classic(&args)?;
                Encoded::Classic { values, codes, _strings: strings }
            }
            Some(_) => {
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
    pub(crate) unsafe fn invoke(&mut self) -> Result<(), CallError> {
        let addr = self.function.symbol().map(|s| s.addr());
        let resource = std::ptr::null_mut();
        match (&mut self.encoded, addr) {
            (Encoded::Classic { values, codes, .. }, Some(addr)) => {
                // SAFETY: per the contract; the arrays live in `self`. The resource handle is
                // null, as `PackedFunction::call` passes it to a library's functions.
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

/// Calls a compiled host function with tensor arguments, as TVM's packed call does, in the
/// function's own convention. [`PackedFunction::call`] takes any arguments.
///
/// # Safety
///
/// `f` must be a function TVM compiled for the host of this process, from a library loaded by
/// [`crate::load_library`] (which installed the context functions), and each tensor must
/// describe live memory of the size its shape and dtype say, matching what the function
/// expects.
pub unsafe fn call_packed(f: &PackedFunction, tensors: &mut [DLTensor]) -> Result<(), CallError> {
    // SAFETY: forwarded from the caller.
    unsafe { f.call_tensors(tensors) }
}
