//! TVM's C calling convention for compiled host functions (TVM 0.8 to 0.20), and the context
//! functions a loader hands to the library.
//!
//! A function TVM compiles for the host has the "packed" signature
//! `int f(TVMValue* args, int* type_codes, int num_args, TVMValue* ret, int* ret_code, void*)`,
//! tensors passed as `DLTensor*` with type code 7. It reports errors through the function
//! pointer stored in the library's data symbol `__TVMAPISetLastError`, and may call the other
//! `__TVMBackend*` pointers; TVM's loader fills them when it opens the library, and so does
//! `install_context`. mblob is not a TVM runtime: the functions it installs cover errors,
//! workspace memory and parallel loops (run on the calling thread); calls back into TVM
//! (`TVMFuncCall`, `TVMBackendGetFuncFromEnv`) fail with an error message.
//!
//! This file is part of the FFI edge ([`crate::ffi`]).
#![allow(unsafe_code)]

use std::alloc::{self, Layout as AllocLayout};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};

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

#[repr(C)]
#[derive(Clone, Copy)]
union TVMValue {
    v_int64: i64,
    v_float64: f64,
    v_handle: *mut c_void,
}

/// Type code of a `DLTensor*` argument (`kTVMDLTensorHandle`).
const TYPE_CODE_DLTENSOR: c_int = 7;

type PackedFn = unsafe extern "C" fn(*mut TVMValue, *mut c_int, c_int, *mut TVMValue, *mut c_int, *mut c_void) -> c_int;

/// Error of a packed call: the return code and the message the function set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("packed function returned {code}: {message}")]
pub struct CallError {
    /// The non-zero return code.
    pub code: i32,
    /// What the function reported through `TVMAPISetLastError` (empty if nothing).
    pub message: String,
}

/// Calls a compiled host function with tensor arguments, as TVM's packed call does.
///
/// # Safety
///
/// `f` must be a function TVM compiled for the host of this process (packed signature, TVM
/// 0.8 to 0.20), from a library loaded by [`crate::load_library`] (which installed the context
/// functions), and each tensor must describe live memory of the size its shape and dtype say,
/// matching what the function expects.
pub unsafe fn call_packed(f: &Symbol, tensors: &mut [DLTensor]) -> Result<(), CallError> {
    let mut args: Vec<TVMValue> =
        tensors.iter_mut().map(|t| TVMValue { v_handle: (t as *mut DLTensor).cast() }).collect();
    let mut codes: Vec<c_int> = vec![TYPE_CODE_DLTENSOR; tensors.len()];
    let mut ret = TVMValue { v_int64: 0 };
    let mut ret_code: c_int = 0;
    LAST_ERROR.with(|e| e.borrow_mut().clear());
    // SAFETY: the caller guarantees `f` has the packed signature and that the tensors are
    // valid; the argument arrays live until the call returns.
    let code = unsafe {
        let func: PackedFn = std::mem::transmute::<*mut c_void, PackedFn>(f.addr());
        func(args.as_mut_ptr(), codes.as_mut_ptr(), args.len() as c_int, &mut ret, &mut ret_code, std::ptr::null_mut())
    };
    if code == 0 {
        Ok(())
    } else {
        Err(CallError { code, message: LAST_ERROR.with(|e| e.borrow().clone()) })
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The last message a compiled function reported on this thread.
pub fn last_error() -> String {
    LAST_ERROR.with(|e| e.borrow().clone())
}

fn set_last_error(msg: &str) {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg.to_owned());
}

extern "C" fn api_set_last_error(msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: compiled code passes a NUL-terminated message that lives for the call.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

extern "C" fn ffi_error_set_raised(kind: *const c_char, msg: *const c_char) {
    api_set_last_error(if msg.is_null() { kind } else { msg });
}

/// Alignment TVM gives workspace memory.
const WORKSPACE_ALIGN: usize = 64;

extern "C" fn backend_alloc_workspace(_dt: c_int, _id: c_int, nbytes: u64, _code: c_int, _bits: c_int) -> *mut c_void {
    // The size is kept in a header of one alignment unit in front of the block.
    let Some(total) = usize::try_from(nbytes).ok().and_then(|n| n.checked_add(WORKSPACE_ALIGN)) else {
        return std::ptr::null_mut();
    };
    let Ok(layout) = AllocLayout::from_size_align(total, WORKSPACE_ALIGN) else { return std::ptr::null_mut() };
    // SAFETY: `layout` has a non-zero size; the block is freed with the same layout below.
    unsafe {
        let base = alloc::alloc(layout);
        if base.is_null() {
            return std::ptr::null_mut();
        }
        base.cast::<usize>().write(total);
        base.add(WORKSPACE_ALIGN).cast()
    }
}

extern "C" fn backend_free_workspace(_dt: c_int, _id: c_int, ptr: *mut c_void) -> c_int {
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: `ptr` came from `backend_alloc_workspace`, whose header holds the total size.
    unsafe {
        let base = ptr.cast::<u8>().sub(WORKSPACE_ALIGN);
        let total = base.cast::<usize>().read();
        alloc::dealloc(base, AllocLayout::from_size_align_unchecked(total, WORKSPACE_ALIGN));
    }
    0
}

#[repr(C)]
struct ParallelGroupEnv {
    sync_handle: *mut c_void,
    num_task: i32,
}

type ParallelLambda = unsafe extern "C" fn(c_int, *mut ParallelGroupEnv, *mut c_void) -> c_int;

extern "C" fn backend_parallel_launch(flambda: Option<ParallelLambda>, cdata: *mut c_void, _num_task: c_int) -> c_int {
    let Some(f) = flambda else { return -1 };
    let mut env = ParallelGroupEnv { sync_handle: std::ptr::null_mut(), num_task: 1 };
    // SAFETY: one task covering the whole range, run on this thread, as TVM does when it has
    // one worker.
    unsafe { f(0, &mut env, cdata) }
}

extern "C" fn backend_parallel_barrier(_task: c_int, _env: *mut ParallelGroupEnv) -> c_int {
    0
}

const NO_CALLBACKS: &str =
    "mblob runtime: calls back into TVM (TVMFuncCall, TVMFFIFunctionCall, TVMBackendGetFuncFromEnv) are not supported";

/// `__TVMFuncCall`: `int(TVMFunctionHandle, TVMValue*, int*, int, TVMValue*, int*)`.
extern "C" fn func_call_unsupported(
    _func: *mut c_void,
    _args: *mut TVMValue,
    _type_codes: *mut c_int,
    _num_args: c_int,
    _ret: *mut TVMValue,
    _ret_type_code: *mut c_int,
) -> c_int {
    set_last_error(NO_CALLBACKS);
    -1
}

/// `__TVMFFIFunctionCall`: `int(TVMFFIObjectHandle, const TVMFFIAny*, int32_t, TVMFFIAny*)`.
extern "C" fn ffi_function_call_unsupported(
    _func: *mut c_void,
    _args: *const c_void,
    _num_args: i32,
    _result: *mut c_void,
) -> c_int {
    set_last_error(NO_CALLBACKS);
    -1
}

/// `__TVMBackendGetFuncFromEnv`: `int(void* mod_node, const char* name, TVMFunctionHandle* out)`.
extern "C" fn get_func_from_env_unsupported(
    _mod_node: *mut c_void,
    _name: *const c_char,
    _out: *mut *mut c_void,
) -> c_int {
    set_last_error(NO_CALLBACKS);
    -1
}

/// Writes the context functions into the library's `__<name>` data symbols where they exist,
/// and the library handle into its context symbol, as TVM's `InitContextFunctions` does.
pub(crate) fn install_context(lib: &libloading::os::unix::Library, ctx: *mut c_void) {
    let functions: [(&str, *const c_void); 9] = [
        ("__TVMAPISetLastError", api_set_last_error as *const c_void),
        ("__TVMFFIErrorSetRaisedFromCStr", ffi_error_set_raised as *const c_void),
        ("__TVMBackendAllocWorkspace", backend_alloc_workspace as *const c_void),
        ("__TVMBackendFreeWorkspace", backend_free_workspace as *const c_void),
        ("__TVMBackendParallelLaunch", backend_parallel_launch as *const c_void),
        ("__TVMBackendParallelBarrier", backend_parallel_barrier as *const c_void),
        ("__TVMFuncCall", func_call_unsupported as *const c_void),
        ("__TVMFFIFunctionCall", ffi_function_call_unsupported as *const c_void),
        ("__TVMBackendGetFuncFromEnv", get_func_from_env_unsupported as *const c_void),
    ];
    let contexts = ["__tvm_module_ctx", "__tvm_ffi_library_ctx", "__tvm_ffi__library_ctx"];
    let slots = functions.iter().copied().chain(contexts.iter().map(|c| (*c, ctx as *const c_void)));
    for (name, value) in slots {
        // SAFETY: each of these names is, in a TVM-compiled library, a pointer-sized writable
        // data symbol that exists to receive exactly this pointer (TVM's loader does the same
        // writes). The symbol is looked up as a plain address and written once, before any of
        // the library's functions are called through mblob.
        unsafe {
            if let Ok(slot) = lib.get::<*mut *const c_void>(name.as_bytes()) {
                let slot = *slot;
                if !slot.is_null() {
                    slot.write(value);
                }
            }
        }
    }
}
