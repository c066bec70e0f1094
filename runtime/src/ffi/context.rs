//! The context functions a TVM-compiled library calls back into, and the per-library context
//! behind `__tvm_module_ctx` / `__tvm_ffi_library_ctx` / `__tvm_ffi__library_ctx`.
//!
//! After `dlopen`, the loader writes the address of each function below into the library's
//! pointer-sized data symbol of that name, where the symbol exists (TVM's loader does the same
//! writes). Every slot any TVM version defines gets a function; none is left null:
//!
//! | slot | versions | here |
//! |---|---|---|
//! | `__TVMAPISetLastError` | 0.8-0.20 | the calling thread's last error |
//! | `__TVMFFIErrorSetRaisedFromCStr` | 0.21+ | the same, as `kind: message` |
//! | `__TVMBackendAllocWorkspace`, `...FreeWorkspace` | all | [`crate::device::cpu`], a device's API |
//! | `__TVMBackendParallelLaunch`, `...Barrier` | all | [`crate::ffi::threadpool`] |
//! | `__TVMBackendGetFuncFromEnv` | 0.8-0.20 | the library's imports, then global functions |
//! | `__TVMFFIEnvModLookupFromImports` | 0.22+ | the same |
//! | `__TVMFuncCall`, `__TVMFFIFunctionCall` | all | calls a handle the two above gave out |
//! | `__TVMFFIHandleInitOnce` | 0.22+ | one-time initialisation of a cached handle |
//!
//! Every function here catches panics: no Rust panic crosses the `extern "C"` edge.
//!
//! Handles given to compiled code (the context and function handles) are small records that
//! are never freed (one context handle per image, one function handle per name it asks for,
//! both reachable from a table of images) and refer to the library's context weakly: compiled
//! code caches them in its own static data, which can outlive a load of the library, so a
//! stale handle gives an error, never a dangling pointer. A function handle keeps the function
//! it resolved to (weakly: the load that found it owns it), so a call (a kernel launch from
//! host code, many per inference) neither looks the name up again nor takes the context's
//! locks; a Rust function (a device module's kernel launcher) is called directly on the
//! decoded arguments.
//!
//! One file loaded several times is one image (`dlopen` hands back the image already loaded),
//! with one context slot and one set of cached handles in its static data, so there is one
//! context per image, shared by its loads. A function handle names the function, not the
//! module that serves it: the context keeps each live load's imports apart, and a call finds
//! the function among the imports of the oldest load still alive. Each load drops out of the
//! context when it is dropped (with the functions found among its imports), so the loads of
//! one file are independent: any of them may be dropped, on any thread, while the others run.
//! An image that stays mapped after its last load is dropped keeps its context handle, and its
//! next load's context goes behind it (see [`ContextHandle`]).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use smallvec::SmallVec;

use crate::device::{api as device_api, cpu, Device, DeviceError};
use crate::ffi::call::PackedFunction;
use crate::ffi::last_error::set_last_error;
use crate::ffi::threadpool::{self, ParallelGroupEnv, ParallelLambda};
use crate::ffi::value::{self, TVMFFIAny, TVMValue, Value};
use crate::module::Module;

thread_local! {
    /// Keeps a string returned to compiled code alive until the next one.
    static RETURNED_STRING: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into `on_panic` and an error message.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_last_error("mblob-runtime: a context function panicked");
            on_panic
        }
    }
}

/// Reads a C string argument.
///
/// # Safety
///
/// `p` is null or points to a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char) -> Option<std::borrow::Cow<'a, str>> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy())
}

/// What mblob knows about one loaded library, for the calls its code makes back.
#[derive(Debug)]
pub(crate) struct LibraryContext {
    path: PathBuf,
    /// The loads of the library alive now, oldest first (each added once its tree is built,
    /// removed when it is dropped).
    loads: Mutex<Vec<Load>>,
    /// Functions found among the global functions for compiled code (none of the library's
    /// imports has them), by name.
    globals: Mutex<HashMap<String, Arc<PackedFunction>>>,
    /// The handle written into the library's context slot.
    handle: &'static ContextHandle,
}

/// One load of a library, as its context knows it.
#[derive(Debug)]
struct Load {
    /// The load's number (see [`crate::ffi::library`]'s images).
    id: u64,
    /// The library's imports and their imports, depth first.
    imports: Vec<Weak<dyn Module>>,
    /// Functions already found among them for compiled code, by name (the handles given out
    /// for them refer to these weakly).
    found: HashMap<String, Arc<PackedFunction>>,
}

/// What `__tvm_module_ctx` points to: one per loaded image, never freed, leading to the
/// image's context while one is alive. A library that stays mapped after its last load was
/// dropped (marked `NODELETE`, or held by another `dlopen`) keeps the handles its compiled code
/// cached; its next load gets a new context behind the same handle, so those handles lead to
/// the new load's functions.
///
/// The function handles given to the image's code are kept here too, one per name, reused by
/// every load (they name the function; each call finds it in the context of the time), so
/// they are made once per image and stay reachable.
#[derive(Debug)]
pub(crate) struct ContextHandle {
    ctx: RwLock<Weak<LibraryContext>>,
    /// Handles given out, by name.
    handles: Mutex<HashMap<String, &'static FunctionHandle>>,
}

impl ContextHandle {
    /// A new handle, leading to no context yet.
    pub(crate) fn leak() -> &'static ContextHandle {
        Box::leak(Box::new(ContextHandle { ctx: RwLock::new(Weak::new()), handles: Mutex::new(HashMap::new()) }))
    }

    /// The handle of function `name` (made on first use).
    fn function_handle(&'static self, name: &str) -> &'static FunctionHandle {
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = handles.get(name) {
            return h;
        }
        let h: &'static FunctionHandle = Box::leak(Box::new(FunctionHandle {
            ctx: self,
            name: name.to_owned(),
            resolved: RwLock::new(Weak::new()),
        }));
        handles.insert(name.to_owned(), h);
        h
    }

    /// The context it leads to now, if one is alive.
    pub(crate) fn context(&self) -> Option<Arc<LibraryContext>> {
        self.ctx.read().unwrap_or_else(|e| e.into_inner()).upgrade()
    }
}

/// What a function handle given to compiled code points to.
#[derive(Debug)]
pub(crate) struct FunctionHandle {
    ctx: &'static ContextHandle,
    name: String,
    /// The function it resolved to last, owned by the context (by the load whose imports had
    /// it, or the context's globals): it lets go when that load is dropped or its imports
    /// change, and the next call resolves the name again.
    resolved: RwLock<Weak<PackedFunction>>,
}

impl LibraryContext {
    /// A new context behind `handle` (which then leads to it), for the library at `path`.
    pub(crate) fn new(path: PathBuf, handle: &'static ContextHandle) -> Arc<LibraryContext> {
        let ctx = Arc::new(LibraryContext {
            path,
            loads: Mutex::new(Vec::new()),
            globals: Mutex::new(HashMap::new()),
            handle,
        });
        *handle.ctx.write().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&ctx);
        ctx
    }

    fn context_handle(&self) -> &'static ContextHandle {
        self.handle
    }

    /// Records (or replaces) the imports of load `id`, in lookup order.
    pub(crate) fn set_imports(&self, id: u64, imports: Vec<Weak<dyn Module>>) {
        let mut loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
        match loads.iter_mut().find(|l| l.id == id) {
            Some(load) => {
                load.imports = imports;
                load.found.clear();
            }
            None => loads.push(Load { id, imports, found: HashMap::new() }),
        }
    }

    /// Forgets load `id` (dropped): its imports are no longer searched, and the functions found
    /// among them are let go.
    pub(crate) fn forget(&self, id: u64) {
        let gone: Vec<Load> = {
            let mut loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
            let (gone, kept) = std::mem::take(&mut *loads).into_iter().partition(|l| l.id == id);
            *loads = kept;
            gone
        };
        // The functions (and the modules they hold) are dropped here, outside the lock.
        drop(gone);
    }

    /// Finds `name` among the imports (depth first) of the oldest live load that has it, as
    /// compiled code asks for it.
    fn find_in_imports(&self, name: &str) -> Option<Arc<PackedFunction>> {
        let searched: Vec<(u64, Vec<Weak<dyn Module>>)> = {
            let loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = loads.iter().find_map(|l| l.found.get(name)) {
                return Some(f.clone());
            }
            loads.iter().map(|l| (l.id, l.imports.clone())).collect()
        };
        // Searched without the lock: a module's lookup may take its time (and its own locks).
        let (id, f) = searched.iter().find_map(|(id, imports)| {
            let f = imports.iter().filter_map(Weak::upgrade).find_map(|m| m.get_function(name))?;
            Some((*id, Arc::new(f)))
        })?;
        let mut loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
        // Kept only while its load is alive (it may have been dropped during the search).
        if let Some(load) = loads.iter_mut().find(|l| l.id == id) {
            load.found.insert(name.to_owned(), f.clone());
        }
        Some(f)
    }

    /// Function `name` as compiled code asks for it: an import's function (of the oldest live
    /// load that has it), else a global one.
    fn resolve(&self, name: &str) -> Result<Arc<PackedFunction>, String> {
        if let Some(g) = self.globals.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(g.clone());
        }
        if let Some(f) = self.find_in_imports(name) {
            return Ok(f);
        }
        let g = Arc::new(global_function(name).ok_or_else(|| {
            format!(
                "Cannot find function {name} in the imported modules or global registry (library {})",
                self.path.display()
            )
        })?);
        self.globals.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), g.clone());
        Ok(g)
    }

    /// The handle for `name`, once it resolves (see [`LibraryContext::resolve`]).
    fn lookup(&self, name: &str) -> Result<&'static FunctionHandle, String> {
        let f = self.resolve(name)?;
        let handle = self.handle.function_handle(name);
        *handle.resolved.write().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&f);
        Ok(handle)
    }
}

impl FunctionHandle {
    /// The function: the one resolved before while its owner keeps it, else resolved now.
    fn function(&self) -> Result<Arc<PackedFunction>, String> {
        if let Some(f) = self.resolved.read().unwrap_or_else(|e| e.into_inner()).upgrade() {
            return Ok(f);
        }
        let ctx = self.ctx.context().ok_or_else(|| format!("function {}: its module was unloaded", self.name))?;
        let f = ctx.resolve(&self.name)?;
        *self.resolved.write().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&f);
        Ok(f)
    }
}

fn global_function(name: &str) -> Option<PackedFunction> {
    crate::ffi::globals::global_function(name)
}

// ---- the context functions -------------------------------------------------------------

pub(crate) extern "C" fn api_set_last_error(msg: *const c_char) {
    guard((), || {
        // SAFETY: compiled code passes a NUL-terminated message.
        if let Some(m) = unsafe { c_str(msg) } {
            set_last_error(&m);
        }
    })
}

pub(crate) extern "C" fn ffi_error_set_raised(kind: *const c_char, msg: *const c_char) {
    guard((), || {
        // SAFETY: compiled code passes NUL-terminated strings (or null).
        let (kind, msg) = unsafe { (c_str(kind), c_str(msg)) };
        set_last_error(&format!("{}: {}", kind.as_deref().unwrap_or("Error"), msg.as_deref().unwrap_or("")));
    })
}

pub(crate) extern "C" fn ffi_error_set_raised_parts(kind: *const c_char, parts: *const *const c_char, n: i32) {
    guard((), || {
        // SAFETY: compiled code passes `n` string pointers, each null (skipped) or
        // NUL-terminated.
        let text: String = unsafe {
            let mut text = String::new();
            if !parts.is_null() {
                for i in 0..n.max(0) as usize {
                    if let Some(p) = c_str(*parts.add(i)) {
                        text.push_str(&p);
                    }
                }
            }
            format!("{}: {text}", c_str(kind).as_deref().unwrap_or("Error"))
        };
        set_last_error(&text);
    })
}

pub(crate) extern "C" fn backend_alloc_workspace(
    dev_type: c_int,
    dev_id: c_int,
    nbytes: u64,
    _code: c_int,
    _bits: c_int,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if dev_type == 1 {
            let p = cpu::alloc_workspace(nbytes);
            if p.is_null() {
                set_last_error(&format!("TVMBackendAllocWorkspace: cannot allocate {nbytes} bytes"));
            }
            return p;
        }
        // Workspace on a device: its device API's pool.
        // (Opened already: the kernel's tensors live there.)
        let device = Device::from_dlpack(dev_type, dev_id);
        let got = usize::try_from(nbytes)
            .map_err(|_| DeviceError::OutOfMemory { device, bytes: nbytes })
            .and_then(|n| device_api::opened(device)?.alloc_workspace(n));
        match got {
            Ok(p) => p.as_ptr(),
            Err(e) => {
                set_last_error(&format!("TVMBackendAllocWorkspace: {e}"));
                std::ptr::null_mut()
            }
        }
    })
}

pub(crate) extern "C" fn backend_free_workspace(dev_type: c_int, dev_id: c_int, ptr: *mut c_void) -> c_int {
    guard(-1, || {
        let freed = if dev_type == 1 {
            cpu::free_workspace(ptr)
        } else {
            let device = Device::from_dlpack(dev_type, dev_id);
            device_api::opened(device)
                .and_then(|api| api.free_workspace(device_api::DevicePtr::from_ptr(ptr)))
                .map_err(|e| e.to_string())
        };
        match freed {
            Ok(()) => 0,
            Err(e) => {
                set_last_error(&format!("TVMBackendFreeWorkspace: {e}"));
                -1
            }
        }
    })
}

pub(crate) extern "C" fn backend_parallel_launch(
    f: Option<ParallelLambda>,
    cdata: *mut c_void,
    num_task: c_int,
) -> c_int {
    guard(-1, || threadpool::launch(f, cdata, num_task))
}

pub(crate) extern "C" fn backend_parallel_barrier(task_id: c_int, env: *mut ParallelGroupEnv) -> c_int {
    guard(-1, || threadpool::barrier(task_id, env))
}

/// Resolves a context handle to its library context.
///
/// # Safety
///
/// `ctx` is null or a handle [`install`] wrote.
unsafe fn context_of(ctx: *mut c_void) -> Result<Arc<LibraryContext>, String> {
    if ctx.is_null() {
        return Err("the library context is null".into());
    }
    // SAFETY: per the contract, a leaked `ContextHandle`.
    let h = unsafe { &*(ctx as *const ContextHandle) };
    h.context().ok_or_else(|| "the library was unloaded".into())
}

fn lookup_into(ctx: *mut c_void, name: *const c_char, out: *mut *mut c_void) -> c_int {
    if out.is_null() {
        set_last_error("function lookup: the output pointer is null");
        return -1;
    }
    // SAFETY: compiled code passes its context slot's value and a NUL-terminated name.
    let r = unsafe { context_of(ctx) }.and_then(|c| {
        // SAFETY: as above.
        let name = unsafe { c_str(name) }.ok_or("function lookup: the name is null")?;
        c.lookup(&name)
    });
    match r {
        Ok(h) => {
            // SAFETY: `out` is a valid pointer to the caller's handle slot.
            unsafe { *out = (h as *const FunctionHandle).cast_mut().cast() };
            0
        }
        Err(e) => {
            set_last_error(&e);
            -1
        }
    }
}

pub(crate) extern "C" fn backend_get_func_from_env(
    ctx: *mut c_void,
    name: *const c_char,
    out: *mut *mut c_void,
) -> c_int {
    guard(-1, || lookup_into(ctx, name, out))
}

pub(crate) extern "C" fn env_mod_lookup_from_imports(
    ctx: *mut c_void,
    name: *const c_char,
    out: *mut *mut c_void,
) -> c_int {
    guard(-1, || lookup_into(ctx, name, out))
}

/// Resolves a function handle.
///
/// # Safety
///
/// `h` is null or a handle `lookup_into` gave out.
unsafe fn function_of(h: *mut c_void) -> Result<Arc<PackedFunction>, String> {
    if h.is_null() {
        return Err("the function handle is null".into());
    }
    // SAFETY: per the contract, a leaked `FunctionHandle`.
    unsafe { &*(h as *const FunctionHandle) }.function()
}

fn keep_string(s: String) -> *mut c_void {
    let c = CString::new(s.replace('\0', " ")).unwrap_or_default();
    let p = c.as_ptr().cast_mut().cast();
    let _ = RETURNED_STRING.try_with(|r| *r.borrow_mut() = Some(c));
    p
}

pub(crate) extern "C" fn func_call(
    handle: *mut c_void,
    values: *mut TVMValue,
    codes: *mut c_int,
    n: c_int,
    ret: *mut TVMValue,
    ret_code: *mut c_int,
) -> c_int {
    guard(-1, || {
        let run = || -> Result<Value, String> {
            // SAFETY: the handle came from `lookup_into` (compiled code only calls what it
            // looked up).
            let f = unsafe { function_of(handle) }?;
            let n = n.max(0) as usize;
            let args: SmallVec<[Value; 8]> = if n == 0 || values.is_null() || codes.is_null() {
                SmallVec::new()
            } else {
                // SAFETY: compiled code passes `n` values and `n` codes.
                (0..n).map(|i| unsafe { value::decode_classic(*values.add(i), *codes.add(i)) }).collect()
            };
            // SAFETY: the function is an import of the library that calls it, called with
            // the arguments its own compiled caller built for it.
            unsafe { f.call(&args) }.map_err(|e| e.message)
        };
        match run() {
            Ok(v) => {
                if !ret.is_null() && !ret_code.is_null() {
                    let v = match v {
                        Value::Str(s) => Value::Handle(keep_string(s)),
                        v => v,
                    };
                    if let Ok((vals, codes, _)) = value::encode_classic(std::slice::from_ref(&v)) {
                        // SAFETY: the caller's return slots are valid for writes.
                        unsafe {
                            *ret = vals[0];
                            *ret_code = codes[0];
                        }
                    }
                }
                0
            }
            Err(e) => {
                set_last_error(&e);
                -1
            }
        }
    })
}

pub(crate) extern "C" fn ffi_function_call(
    handle: *mut c_void,
    args: *const TVMFFIAny,
    n: i32,
    result: *mut TVMFFIAny,
) -> c_int {
    guard(-1, || {
        let run = || -> Result<Value, String> {
            // SAFETY: as in `func_call`.
            let f = unsafe { function_of(handle) }?;
            let n = n.max(0) as usize;
            let args: SmallVec<[Value; 8]> = if n == 0 || args.is_null() {
                SmallVec::new()
            } else {
                // SAFETY: compiled code passes `n` values.
                (0..n).map(|i| unsafe { value::decode_ffi(&*args.add(i)) }).collect()
            };
            // SAFETY: as in `func_call`.
            unsafe { f.call(&args) }.map_err(|e| e.message)
        };
        match run() {
            Ok(v) => {
                if !result.is_null() {
                    let v = match v {
                        Value::Str(s) => Value::Handle(keep_string(s)),
                        v => v,
                    };
                    if let Ok((vals, _)) = value::encode_ffi(std::slice::from_ref(&v)) {
                        // SAFETY: the caller's result slot is valid for writes.
                        unsafe { *result = vals[0] };
                    }
                }
                0
            }
            Err(e) => {
                set_last_error(&e);
                -1
            }
        }
    })
}

/// `TVMBackendRegisterSystemLibSymbol`: a system-lib build's static initialisers call it at
/// `dlopen`, once per function (and for `__tvm_module_ctx` and the packed-imports blob). Every
/// registered symbol of a system-lib `.so` is also a dynamic symbol of that file, where mblob
/// finds it, so the registration has nothing to record; it only has to succeed.
extern "C" fn backend_register_system_lib_symbol(_name: *const c_char, _ptr: *mut c_void) -> c_int {
    0
}

pub(crate) type InitFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;

pub(crate) extern "C" fn handle_init_once(handle: *mut *mut c_void, init: Option<InitFn>) -> c_int {
    static LOCK: Mutex<()> = Mutex::new(());
    guard(-1, || {
        if handle.is_null() {
            set_last_error("TVMFFIHandleInitOnce: the handle address is null");
            return -1;
        }
        // SAFETY: `handle` points to a pointer-sized, pointer-aligned static slot of the
        // calling library; all accesses to it go through atomics here.
        let slot = unsafe { AtomicPtr::from_ptr(handle) };
        if !slot.load(Ordering::Acquire).is_null() {
            return 0;
        }
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if !slot.load(Ordering::Acquire).is_null() {
            return 0;
        }
        let Some(init) = init else {
            set_last_error("TVMFFIHandleInitOnce: the init function is null");
            return -1;
        };
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: compiled code passes an init function of this signature.
        let rc = unsafe { init(&mut out) };
        if rc != 0 {
            return rc;
        }
        if out.is_null() {
            set_last_error("TVMFFIHandleInitOnce: the init function returned null");
            return -1;
        }
        slot.store(out, Ordering::Release);
        0
    })
}

/// The context functions, by slot name (the data symbol is `__` + the name).
pub(crate) fn context_functions() -> [(&'static str, *const c_void); 14] {
    [
        ("TVMAPISetLastError", api_set_last_error as *const c_void),
        ("TVMFFIErrorSetRaisedFromCStr", ffi_error_set_raised as *const c_void),
        ("TVMFFIErrorSetRaisedFromCStrParts", ffi_error_set_raised_parts as *const c_void),
        ("TVMBackendAllocWorkspace", backend_alloc_workspace as *const c_void),
        ("TVMBackendFreeWorkspace", backend_free_workspace as *const c_void),
        ("TVMBackendParallelLaunch", backend_parallel_launch as *const c_void),
        ("TVMBackendParallelBarrier", backend_parallel_barrier as *const c_void),
        ("TVMBackendGetFuncFromEnv", backend_get_func_from_env as *const c_void),
        ("TVMFuncCall", func_call as *const c_void),
        ("TVMFFIFunctionCall", ffi_function_call as *const c_void),
        ("TVMFFIEnvModLookupFromImports", env_mod_lookup_from_imports as *const c_void),
        ("TVMFFIHandleInitOnce", handle_init_once as *const c_void),
        // The 0.21 name of the lookup, before tvm-ffi renamed it.
        ("TVMFFIEnvLookupFromImports", env_mod_lookup_from_imports as *const c_void),
        ("TVMBackendRegisterSystemLibSymbol", backend_register_system_lib_symbol as *const c_void),
    ]
}

/// Writes the context functions into the library's `__<name>` data symbols where they exist,
/// and the context handle into its context symbols, as TVM's `InitContextFunctions` does.
/// `address` finds a symbol of the library.
pub(crate) fn install(ctx: &Arc<LibraryContext>, address: impl Fn(&str) -> Option<*mut c_void>) {
    let handle = ctx.context_handle() as *const ContextHandle as *const c_void;
    let contexts = ["__tvm_module_ctx", "__tvm_ffi_library_ctx", "__tvm_ffi__library_ctx"];
    let functions = context_functions();
    let named = functions.iter().map(|(n, f)| (format!("__{n}"), *f));
    for (name, value) in named.chain(contexts.iter().map(|c| (c.to_string(), handle))) {
        let Some(slot) = address(&name) else { continue };
        // SAFETY: each of these names is, in a TVM-compiled library, a pointer-sized writable
        // data symbol that exists to receive exactly this pointer (TVM's loader does the same
        // writes). The symbol is looked up as a plain address and written before any of the
        // library's functions are called through mblob.
        unsafe { slot.cast::<*const c_void>().write(value) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::last_error::last_error;

    #[test]
    fn error_parts_are_joined_and_null_parts_skipped() {
        let kind = CString::new("ValueError").unwrap();
        let a = CString::new("Expected ").unwrap();
        let b = CString::new("2").unwrap();
        let parts = [a.as_ptr(), std::ptr::null(), b.as_ptr()];
        ffi_error_set_raised_parts(kind.as_ptr(), parts.as_ptr(), 3);
        assert_eq!(last_error(), "ValueError: Expected 2");
    }

    #[test]
    fn init_once_runs_once() {
        unsafe extern "C" fn init(out: *mut *mut c_void) -> c_int {
            static X: u8 = 7;
            // SAFETY: `out` is valid (the caller's local).
            unsafe { *out = (&X as *const u8).cast_mut().cast() };
            0
        }
        unsafe extern "C" fn fail(_: *mut *mut c_void) -> c_int {
            -3
        }
        let mut slot: *mut c_void = std::ptr::null_mut();
        assert_eq!(handle_init_once(&mut slot, Some(fail)), -3);
        assert!(slot.is_null());
        assert_eq!(handle_init_once(&mut slot, Some(init)), 0);
        let first = slot;
        assert!(!first.is_null());
        assert_eq!(handle_init_once(&mut slot, Some(fail)), 0, "already initialised: init not called");
        assert_eq!(slot, first);
    }

    #[test]
    fn stale_and_null_handles_are_errors() {
        let mut out = std::ptr::null_mut();
        let name = CString::new("f").unwrap();
        assert_eq!(backend_get_func_from_env(std::ptr::null_mut(), name.as_ptr(), &mut out), -1);
        assert!(last_error().contains("null"));
        let ctx = LibraryContext::new("x.so".into(), ContextHandle::leak());
        let h = ctx.context_handle() as *const ContextHandle as *mut c_void;
        assert_eq!(backend_get_func_from_env(h, name.as_ptr(), &mut out), -1);
        assert!(last_error().contains("Cannot find function f"), "{}", last_error());
        let set_device = CString::new("__tvm_set_device").unwrap();
        assert_eq!(backend_get_func_from_env(h, set_device.as_ptr(), &mut out), 0);
        let mut vals = [TVMValue { v_int64: 1 }, TVMValue { v_int64: 0 }];
        let mut codes = [0, 0];
        let mut ret = TVMValue { v_int64: 0 };
        let mut rc = 0;
        assert_eq!(func_call(out, vals.as_mut_ptr(), codes.as_mut_ptr(), 2, &mut ret, &mut rc), 0);
        assert_eq!(rc, 4, "returns None");
        drop(ctx);
        assert_eq!(backend_get_func_from_env(h, set_device.as_ptr(), &mut out), -1);
        assert!(last_error().contains("unloaded"));
    }

    #[test]
    fn a_handle_keeps_its_function_while_its_owner_does() {
        use std::sync::atomic::AtomicUsize;
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        crate::ffi::globals::register_global(
            "__mblob_test_handle_cache",
            PackedFunction::from_fn(|args| {
                CALLS.fetch_add(1, Ordering::Relaxed);
                // Called directly on the decoded arguments.
                assert_eq!(args, [Value::Int(7)]);
                Ok(Value::Int(8))
            }),
        );
        let ctx = LibraryContext::new("y.so".into(), ContextHandle::leak());
        let h = ctx.context_handle() as *const ContextHandle as *mut c_void;
        let name = CString::new("__mblob_test_handle_cache").unwrap();
        let mut out = std::ptr::null_mut();
        assert_eq!(backend_get_func_from_env(h, name.as_ptr(), &mut out), 0);
        // SAFETY: `out` is the handle just given out.
        let handle = unsafe { &*(out as *const FunctionHandle) };
        let resolved = || handle.resolved.read().unwrap().upgrade();
        assert!(resolved().is_some(), "kept from the lookup");
        let mut vals = [TVMValue { v_int64: 7 }];
        let mut codes = [0];
        let (mut ret, mut rc) = (TVMValue { v_int64: 0 }, 0);
        for _ in 0..3 {
            assert_eq!(func_call(out, vals.as_mut_ptr(), codes.as_mut_ptr(), 1, &mut ret, &mut rc), 0);
            // SAFETY: an int return.
            assert_eq!((unsafe { ret.v_int64 }, rc), (8, 0));
        }
        assert_eq!(CALLS.load(Ordering::Relaxed), 3);
        let kept = resolved().unwrap();
        assert!(Arc::ptr_eq(&kept, &resolved().unwrap()), "the same function every call");
        drop(kept);
        // The context owned it: gone with the context, and the handle says so.
        drop(ctx);
        assert!(resolved().is_none());
        assert_eq!(func_call(out, vals.as_mut_ptr(), codes.as_mut_ptr(), 1, &mut ret, &mut rc), -1);
        assert!(last_error().contains("unloaded"), "{}", last_error());
    }
}
