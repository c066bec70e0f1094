//! # mblob-capi: the C API of mblob
//!
//! Builds `libmblob.so` and `libmblob.a`; `include/mblob.h` declares what they export (made
//! by cbindgen from this crate, see `cbindgen.toml`; `tests/header.rs` checks it is current and
//! compiles as C99 and C++17). The README's "C API" section is the user's guide.
//!
//! This file holds the conventions, loading (from a file or from memory), models and tensors;
//! `dlpack.rs` DLPack tensors in and out and `mblob_model_invoke`; `inspect.rs` (feature
//! `inspect`) the JSON report and `emit.rs` (feature `emit`) writing libraries, the two parts
//! that link the `mblob` crate (without them the library is the runtime alone).
//!
//! This crate is an FFI edge, like `mblob_runtime::ffi`: every `unsafe` block in it reads a
//! pointer that a C caller handed over, and says in a `// SAFETY:` comment which documented
//! rule of the API makes it valid.
//!
//! The conventions, after wasmtime's, tract's and ONNX Runtime's C APIs:
//! - Opaque handles: [`mblob_library`], [`mblob_model`], [`mblob_tensor`] (and
//!   `mblob_export`). Each is made by one function and freed by one (`mblob_*_free`); freeing
//!   NULL does nothing.
//! - Every call returns an [`mblob_status`]; on an error, [`mblob_last_error`] gives the
//!   message (thread-local, valid until the next mblob call on that thread). Results come back
//!   through out-pointers, written only on success.
//! - No Rust panic crosses the boundary: each call runs under `catch_unwind`, and a panic is
//!   reported as [`mblob_status::MBLOB_ERR_PANIC`].
//! - Handles are checked against the set of live handles of their kind before use, so a NULL,
//!   freed or wrong-kind handle is an error ([`mblob_status::MBLOB_ERR_INVALID_HANDLE`]), not a
//!   crash: except when the allocator has reused a freed handle's address for a new handle of
//!   the same kind, which cannot be told apart.
//! - Threads: a library may be shared by any number of threads (models made from it on each);
//!   a model is used by one thread at a time (it may move between threads). This is enforced:
//!   a call on a model (or an export builder) that another call is using fails at once with
//!   [`mblob_status::MBLOB_ERR_STATE`] instead of waiting or corrupting it; a library or tensor
//!   may be read by several calls at once, but freeing one that a call is using fails the same
//!   way.
#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, missing_docs)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use mblob_runtime::exec::{ExecError, Model, ModelKind, Value};
use mblob_runtime::format::DataType;
use mblob_runtime::{load_library, load_library_bytes, Device, LoadOptions, LoadedTree, NdArray, Registry};

mod dlpack;
#[cfg(feature = "emit")]
mod emit;
#[cfg(feature = "inspect")]
mod inspect;
mod system;

pub use dlpack::*;
pub use system::*;
#[cfg(feature = "emit")]
pub use emit::*;
#[cfg(feature = "inspect")]
pub use inspect::*;

/// What a call did. `MBLOB_OK` is 0; every other value is an error whose message
/// `mblob_last_error` gives.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum mblob_status {
    /// Success.
    MBLOB_OK = 0,
    /// A pointer argument that must not be NULL was NULL.
    MBLOB_ERR_NULL_ARGUMENT = 1,
    /// A handle that is not a live handle of the kind the call takes (freed, or of another
    /// kind).
    MBLOB_ERR_INVALID_HANDLE = 2,
    /// An argument out of its domain: a string that is not UTF-8, a buffer whose size does
    /// not match its dtype and shape, a negative rank or extent, an index out of range.
    MBLOB_ERR_INVALID_ARGUMENT = 3,
    /// A library that could not be loaded (not found, not an ELF file, a malformed blob, a
    /// payload no loader takes).
    MBLOB_ERR_LOAD = 4,
    /// The library holds no model, or the model has no function of that name.
    MBLOB_ERR_NO_MODEL = 5,
    /// An input the model does not take: an unknown name, a dtype or shape that differs from
    /// the model's, inputs missing at run time, or inputs over what the model was built for
    /// (a batch over its maximum).
    MBLOB_ERR_INPUT = 6,
    /// The device is not supported or failed (no driver, out of memory, a kernel that does
    /// not build).
    MBLOB_ERR_DEVICE = 7,
    /// Running the model failed (the graph, the VM or a kernel reported an error).
    MBLOB_ERR_RUN = 8,
    /// A call out of order: outputs asked for before a successful run; or a handle in use by a
    /// call on another thread (a model used by two threads at once, a handle freed while used).
    MBLOB_ERR_STATE = 9,
    /// Something this version does not do (an output that is a string, not a tensor).
    MBLOB_ERR_UNSUPPORTED = 10,
    /// A bug in mblob (a caught Rust panic); the handle the call used should be freed.
    MBLOB_ERR_PANIC = 11,
    /// Writing a library failed (`mblob_export_write`: a host object that cannot be read or
    /// does not fit the layout, a module tree TVM cannot load, the compiler or linker failed).
    MBLOB_ERR_EMIT = 12,
}

/// What kind of model a library holds (`mblob_model_kind` tells).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum mblob_kind {
    /// A graph executor factory (`relay.build`): inputs by name, `mblob_model_run`.
    MBLOB_MODEL_GRAPH = 0,
    /// An AOT executor factory.
    MBLOB_MODEL_AOT = 1,
    /// A Relax executable (`relax.build`, `tvm.compile`): functions by name,
    /// `mblob_model_invoke` or `mblob_model_run`.
    MBLOB_MODEL_RELAX = 2,
    /// A Relay VM executable (`relay.vm.compile`): functions by name, `mblob_model_run`.
    MBLOB_MODEL_RELAY_VM = 3,
}

/// A tensor's element type, laid out as DLPack's `DLDataType`: type code (0 int, 1 uint,
/// 2 float, 4 bfloat, 6 bool), bits per lane, lanes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct mblob_dtype {
    /// DLPack type code.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// A loaded library (`mblob_library_load`). Shareable across threads; freed with
/// `mblob_library_free`. Models made from it keep what they need of it alive, so it may be
/// freed before them.
pub struct mblob_library {
    tree: Arc<LoadedTree>,
}

/// A model on a device (`mblob_model_new`): a graph executor, an AOT executor or a Relax VM
/// function. Used by one call at a time (a call while another thread's uses it gets
/// `MBLOB_ERR_STATE`); freed with `mblob_model_free`.
pub struct mblob_model {
    model: Model,
    /// The input names, as C strings (`mblob_model_input_name`).
    names: Vec<CString>,
    /// The functions a caller can pick, as C strings (`mblob_model_function_name`).
    functions: Vec<CString>,
    /// The outputs of the last successful run, `None` before one.
    outputs: Option<RunOutputs>,
}

/// A tensor owned by the caller, on the host (`mblob_model_output`, `mblob_tensor_to_host`)
/// or on a model's device (`mblob_model_output_device`); freed with `mblob_tensor_free`.
/// A tensor keeps its memory alive by itself: it outlives its model.
pub struct mblob_tensor {
    array: NdArray,
}

/// The outputs of the last run, where they lie (on the model's device).
struct RunOutputs {
    values: Vec<Value>,
    /// Whether the tensors are the model's own (`mblob_model_run` of a graph or AOT model:
    /// the next run overwrites them), so that a tensor handed out must be a copy.
    shared: bool,
}

/// An error on its way to the caller: a status and a message.
struct Failure {
    status: mblob_status,
    message: String,
}

impl Failure {
    fn new(status: mblob_status, message: impl Into<String>) -> Failure {
        Failure { status, message: message.into() }
    }
}

impl From<ExecError> for Failure {
    fn from(e: ExecError) -> Failure {
        use mblob_status::*;
        let status = match &e {
            ExecError::NoModel { .. }
            | ExecError::NoFactory { .. }
            | ExecError::NoFunction { .. }
            | ExecError::NoFunctions { .. }
            | ExecError::NoHostFunction { .. } => MBLOB_ERR_NO_MODEL,
            ExecError::UnknownInput { .. }
            | ExecError::MissingInputs { .. }
            | ExecError::InputMismatch { .. }
            | ExecError::InputKind { .. } => MBLOB_ERR_INPUT,
            // Inputs over the bounds the model was built for (a batch over its maximum).
            ExecError::Relax(v) if matches!(v.root(), mblob_runtime::exec::relax::VmError::InputBound { .. }) => {
                MBLOB_ERR_INPUT
            }
            ExecError::Index { .. } | ExecError::Argument { .. } => MBLOB_ERR_INVALID_ARGUMENT,
            ExecError::FeatureOff { .. } => MBLOB_ERR_UNSUPPORTED,
            ExecError::UnsupportedDevice { .. } | ExecError::Device(_) => MBLOB_ERR_DEVICE,
            _ => MBLOB_ERR_RUN,
        };
        Failure::new(status, e.to_string())
    }
}

type Result<T, E = Failure> = std::result::Result<T, E>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The kinds of handle, for the set of live handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Library,
    Model,
    Tensor,
    /// A string mblob made for the caller (`mblob_string_free`).
    #[cfg_attr(not(feature = "inspect"), allow(dead_code))]
    String,
    /// An export builder (`mblob_export_free`).
    #[cfg_attr(not(feature = "emit"), allow(dead_code))]
    Export,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Library => "mblob_library",
            Kind::Model => "mblob_model",
            Kind::Tensor => "mblob_tensor",
            Kind::String => "string made by mblob",
            Kind::Export => "mblob_export",
        }
    }
}

/// The addresses of the live handles, with their kinds.
static LIVE: Mutex<Option<HashMap<usize, Kind>>> = Mutex::new(None);

fn live<R>(f: impl FnOnce(&mut HashMap<usize, Kind>) -> R) -> R {
    let mut guard = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
}

/// Boxes `value` as a new handle of `kind` and writes it to `out`.
fn publish<T>(kind: Kind, value: T, out: *mut *mut T) {
    let ptr = Box::into_raw(Box::new(value));
    live(|m| m.insert(ptr as usize, kind));
    // SAFETY: every caller checked `out` is not NULL, and the API requires a non-NULL `out`
    // to point to writable storage for one pointer.
    unsafe { out.write(ptr) };
}

/// Checks that `ptr` is a live handle of `kind` and takes it for the rest of the current call
/// ([`in_use::take`]): a handle another call is using exclusively is `MBLOB_ERR_STATE`.
fn check<T>(kind: Kind, ptr: *const T, what: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Failure::new(mblob_status::MBLOB_ERR_NULL_ARGUMENT, format!("{what} is NULL")));
    }
    live(|m| {
        is_live(m, kind, ptr as usize, what)?;
        in_use::take(kind, ptr as usize, what)
    })
}

fn is_live(m: &HashMap<usize, Kind>, kind: Kind, address: usize, what: &str) -> Result<()> {
    match m.get(&address).copied() {
        Some(k) if k == kind => Ok(()),
        Some(k) => Err(Failure::new(
            mblob_status::MBLOB_ERR_INVALID_HANDLE,
            format!("{what} is a {}, not a {}", k.name(), kind.name()),
        )),
        None => Err(Failure::new(
            mblob_status::MBLOB_ERR_INVALID_HANDLE,
            format!("{what} is not a live {} (freed already, or never made by mblob)", kind.name()),
        )),
    }
}

/// Which handles calls are using: a model or an export builder by one call at a time (taken
/// exclusively), a library or a tensor by any number (shared); a call that finds its handle
/// taken the other way fails at once with `MBLOB_ERR_STATE` (a try-lock: nothing waits).
/// Each call gives back what it took when it ends ([`call`]).
mod in_use {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};

    use super::{mblob_status, Failure, Kind, Result};

    /// Per handle address: -1 taken exclusively, n > 0 taken by n calls, absent when free.
    static USERS: Mutex<Option<HashMap<usize, isize>>> = Mutex::new(None);

    thread_local! {
        /// The handles the current call on this thread took.
        static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    fn users<R>(f: impl FnOnce(&mut HashMap<usize, isize>) -> R) -> R {
        let mut guard = USERS.lock().unwrap_or_else(PoisonError::into_inner);
        f(guard.get_or_insert_with(HashMap::new))
    }

    fn busy(what: &str, kind: Kind) -> Failure {
        Failure::new(
            mblob_status::MBLOB_ERR_STATE,
            format!(
                "{what} is in use by a call on another thread: a {} belongs to one thread at a time (this call \
                 did nothing; retry when the other call has returned, or give each thread its own)",
                kind.name()
            ),
        )
    }

    /// Takes the handle at `address` of `kind` for the current call (again taking one it
    /// holds already does nothing).
    pub(super) fn take(kind: Kind, address: usize, what: &str) -> Result<()> {
        if HELD.with(|h| h.borrow().contains(&address)) {
            return Ok(());
        }
        let exclusive = matches!(kind, Kind::Model | Kind::Export);
        users(|u| {
            let n = u.entry(address).or_insert(0);
            match (*n, exclusive) {
                (0, true) => *n = -1,
                (n2, false) if n2 >= 0 => *n += 1,
                _ => {
                    if *n == 0 {
                        u.remove(&address);
                    }
                    return Err(busy(what, kind));
                }
            }
            Ok(())
        })?;
        HELD.with(|h| h.borrow_mut().push(address));
        Ok(())
    }

    /// Refuses to free a handle that a call (of another thread) is using.
    pub(super) fn check_free(address: usize, what: &str) -> Result<()> {
        let mine = HELD.with(|h| h.borrow().contains(&address));
        match users(|u| u.get(&address).copied()) {
            Some(n) if !(mine && (n == -1 || n == 1)) => Err(Failure::new(
                mblob_status::MBLOB_ERR_STATE,
                format!("{what} is in use by a call on another thread: it cannot be freed now"),
            )),
            _ => Ok(()),
        }
    }

    /// Gives back every handle the current call took.
    pub(super) fn give_back() {
        let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
        if held.is_empty() {
            return;
        }
        users(|u| {
            for address in held {
                if let Some(n) = u.get_mut(&address) {
                    if *n > 1 {
                        *n -= 1;
                    } else {
                        u.remove(&address);
                    }
                }
            }
        });
    }
}

/// Takes back and drops the handle `ptr` of `kind`; NULL does nothing.
fn release<T>(kind: Kind, ptr: *mut T, what: &str) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    // Checked and taken out of the live set at once: of two frees of one handle, one wins,
    // and a handle that a call is using is not freed.
    live(|m| -> Result<()> {
        is_live(m, kind, ptr as usize, what)?;
        in_use::check_free(ptr as usize, what)?;
        m.remove(&(ptr as usize));
        Ok(())
    })?;
    // SAFETY: `ptr` was a live handle of `kind`, made by `publish` from `Box::into_raw` of a
    // `T` (the kind determines the type), and it is now out of the live set, so no later call
    // takes it; the API requires that no other call on it is in progress.
    drop(unsafe { Box::from_raw(ptr) });
    Ok(())
}

fn null_arg(what: &str) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_NULL_ARGUMENT, format!("{what} is NULL"))
}

fn not_null<T>(ptr: *const T, what: &str) -> Result<()> {
    if ptr.is_null() {
        Err(null_arg(what))
    } else {
        Ok(())
    }
}

/// Reads a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that lives for `'a`.
unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str> {
    not_null(ptr, what)?;
    // SAFETY: not NULL, and the caller guarantees a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map_err(|_| Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

/// Reads a path argument: any bytes but NUL.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that lives for `'a`.
unsafe fn c_path<'a>(ptr: *const c_char, what: &str) -> Result<&'a Path> {
    not_null(ptr, what)?;
    // SAFETY: not NULL, and the caller guarantees a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    Ok(Path::new(std::ffi::OsStr::from_bytes(bytes)))
}

/// Reads the arguments that hand a file over in memory: `nbytes` bytes at `data` (checked not
/// NULL already) and the name standing for its path (`"memory"` for NULL).
///
/// # Safety
/// `data` is not NULL and points to `nbytes` readable bytes, and `name` is NULL or points to
/// a NUL-terminated string, both living for `'a`.
unsafe fn memory_file<'a>(data: *const c_void, nbytes: usize, name: *const c_char) -> Result<(&'a [u8], &'a str)> {
    let name = if name.is_null() {
        "memory"
    } else {
        // SAFETY: not NULL, and the caller passes a NUL-terminated string.
        unsafe { c_str(name, "name") }?
    };
    // SAFETY: not NULL, and the caller passes `nbytes` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), nbytes) };
    Ok((bytes, name))
}

/// Runs `body` as one API call: catches panics, records the message of an error, and gives
/// back the handles the call took ([`in_use`]).
fn call(body: impl FnOnce() -> Result<()>) -> mblob_status {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    in_use::give_back();
    let outcome = outcome.unwrap_or_else(|payload| {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(Failure::new(mblob_status::MBLOB_ERR_PANIC, format!("internal error (a bug in mblob): {detail}")))
    });
    let (status, message) = match outcome {
        Ok(()) => (mblob_status::MBLOB_OK, String::new()),
        Err(f) => (f.status, f.message),
    };
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    status
}

/// The message of the last call on this thread that failed, or `""` when the last call
/// succeeded. Never NULL. The string belongs to mblob and stays valid until the next mblob
/// call on this thread.
#[no_mangle]
pub extern "C" fn mblob_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// mblob's version, as `"0.1.0"`. Never NULL; a static string.
#[no_mangle]
pub extern "C" fn mblob_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Loads the library at `path` (a TVM `export_library` output or an mblob-packed one) and
/// writes its handle to `*out`.
///
/// Loading runs the library's code (its constructors): load only libraries you trust.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out` is NULL or points to writable storage
/// for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_library_load(path: *const c_char, out: *mut *mut mblob_library) -> mblob_status {
    call(|| {
        not_null(path, "path")?;
        not_null(out, "out")?;
        // SAFETY: the caller passes a NUL-terminated string.
        let path = unsafe { c_path(path, "path") }?;
        // SAFETY: loading runs the library's code; the header says to load only libraries
        // the caller trusts to run, and the caller asked for this one.
        let tree = unsafe { load_library(path, &Registry::default(), &LoadOptions::keep_unknown()) }
            .map_err(|e| Failure::new(mblob_status::MBLOB_ERR_LOAD, e.to_string()))?;
        publish(Kind::Library, mblob_library { tree: Arc::new(tree) }, out);
        Ok(())
    })
}

/// Loads a library held in memory: `data` holds the `nbytes` bytes of a shared library file
/// as `mblob_library_load` takes it (read from a file, received over the network, embedded in
/// the program). No file is written: the bytes are copied into an anonymous memory file
/// (`memfd_create`, kept while the library is loaded) that the dynamic loader opens through
/// `/proc/self/fd`. `name` (NULL for `"memory"`) names it in messages and `/proc/self/maps`.
/// `data` may be freed when the call returns. Bytes that are not a shared library give
/// `MBLOB_ERR_LOAD`.
///
/// Loading runs the library's code (its constructors): load only libraries you trust.
///
/// # Safety
/// `data` is NULL or points to `nbytes` readable bytes; `name` is NULL or a NUL-terminated
/// string; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_library_load_memory(
    data: *const c_void,
    nbytes: usize,
    name: *const c_char,
    out: *mut *mut mblob_library,
) -> mblob_status {
    call(|| {
        not_null(data, "data")?;
        not_null(out, "out")?;
        // SAFETY: `data` is not NULL; the caller passes `nbytes` readable bytes there, and
        // NULL or a NUL-terminated string as `name`.
        let (bytes, name) = unsafe { memory_file(data, nbytes, name) }?;
        // SAFETY: loading runs the library's code; the header says to load only libraries
        // the caller trusts to run, and the caller asked for this one.
        let tree = unsafe { load_library_bytes(bytes, name, &Registry::default(), &LoadOptions::keep_unknown()) }
            .map_err(|e| Failure::new(mblob_status::MBLOB_ERR_LOAD, format!("library from memory `{name}`: {e}")))?;
        publish(Kind::Library, mblob_library { tree: Arc::new(tree) }, out);
        Ok(())
    })
}

/// Frees a library; NULL does nothing. Models made from it stay usable.
///
/// # Safety
/// No other call on `lib` is in progress, and `lib` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_library_free(lib: *mut mblob_library) -> mblob_status {
    call(|| release(Kind::Library, lib, "lib"))
}

/// Makes a model of what `lib` holds (a graph factory, an AOT factory, a Relax executable or
/// a Relay VM executable) on the device `(device_type, device_id)`, with DLPack's codes
/// (`kDLCPU` = 1, `kDLCUDA` = 2, `kDLOpenCL` = 4), and writes its handle to `*out`.
/// Parameters are copied to the device here, once. A Relax model calls `main` (or its only
/// function) until `mblob_model_select_function` picks another.
///
/// # Safety
/// `lib` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_new(
    lib: *const mblob_library,
    device_type: i32,
    device_id: i32,
    out: *mut *mut mblob_model,
) -> mblob_status {
    call(|| {
        // SAFETY: the API forbids freeing `lib` while a call on it is in progress, as `checked`
        // needs (a library is never changed).
        let lib = unsafe { checked(Kind::Library, lib, "lib", out) }?;
        let model = Model::new(&lib.tree, Device::from_dlpack(device_type, device_id))?;
        let functions = model.functions().iter().map(|f| c_string(f)).collect();
        let mut handle = mblob_model { model, names: Vec::new(), functions, outputs: None };
        handle.refresh_names();
        publish(Kind::Model, handle, out);
        Ok(())
    })
}

impl mblob_model {
    fn refresh_names(&mut self) {
        self.names = self.model.params().iter().map(|p| c_string(&p.name)).collect();
    }
}

/// A C string of `s` (a NUL inside is spelled `\0`).
fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// Writes the kind of model (graph, AOT, Relax, Relay VM) to `*out`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_kind(model: *const mblob_model, out: *mut mblob_kind) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe {
        model_get(model, out, |m| {
            Ok(match m.model.kind() {
                ModelKind::Graph => mblob_kind::MBLOB_MODEL_GRAPH,
                ModelKind::Aot => mblob_kind::MBLOB_MODEL_AOT,
                ModelKind::Relax => mblob_kind::MBLOB_MODEL_RELAX,
                ModelKind::RelayVm => mblob_kind::MBLOB_MODEL_RELAY_VM,
            })
        })
    }
}

/// Writes the number of functions a Relax or Relay VM model can call (by
/// `mblob_model_select_function` or `mblob_model_invoke`) to `*out`: 0 for graph and AOT
/// models.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_num_functions(model: *const mblob_model, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe { model_get(model, out, |m| Ok(m.functions.len())) }
}

/// Writes a pointer to the name of function `index` to `*out`: a NUL-terminated string owned
/// by the model, valid until the model is freed.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_function_name(
    model: *const mblob_model,
    index: usize,
    out: *mut *const c_char,
) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe {
        model_get(model, out, |m| {
            let name = m.functions.get(index).ok_or_else(|| out_of_range("function", index, m.functions.len()))?;
            Ok(name.as_ptr())
        })
    }
}

/// Checks that `handle` is a live handle of `kind` (named `what` in messages) and then that
/// `out` is not NULL, and borrows the handle.
///
/// # Safety
/// The API gives the calling thread sole use of a model or tensor handle, and forbids freeing
/// any handle, for the duration of the call; the borrow does not outlive the call.
unsafe fn checked<'a, H, O>(kind: Kind, handle: *const H, what: &str, out: *const O) -> Result<&'a H> {
    check(kind, handle, what)?;
    not_null(out, "out")?;
    // SAFETY: a live handle of `kind` (checked above) points to the `H` that `publish` boxed;
    // the caller's contract keeps it alive and unchanged for the borrow.
    Ok(unsafe { &*handle })
}

/// Runs `f` on a checked handle of `kind` and writes what it gives to `*out`.
///
/// # Safety
/// `handle` is NULL or a handle; `out` is NULL or points to writable storage for one `R`.
unsafe fn handle_get<H, R>(
    kind: Kind,
    handle: *const H,
    what: &str,
    out: *mut R,
    f: impl FnOnce(&H) -> Result<R>,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the handle at a time per the API, as `checked` needs.
        let h = unsafe { checked(kind, handle, what, out) }?;
        let value = f(h)?;
        // SAFETY: not NULL (checked), writable per the API.
        unsafe { out.write(value) };
        Ok(())
    })
}

/// Runs `f` on a checked model handle and writes what it gives to `*out`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one `R`.
unsafe fn model_get<R>(
    model: *const mblob_model,
    out: *mut R,
    f: impl FnOnce(&mblob_model) -> Result<R>,
) -> mblob_status {
    // SAFETY: the caller's contract is `handle_get`'s.
    unsafe { handle_get(Kind::Model, model, "model", out, f) }
}

/// Borrows the model behind a checked handle.
///
/// # Safety
/// `model` passed `check(Kind::Model, ..)` in this call, which took it for this call alone
/// ([`in_use`]) until the call ends.
unsafe fn model_mut<'a>(model: *mut mblob_model) -> &'a mut mblob_model {
    // SAFETY: see the function's contract.
    unsafe { &mut *model }
}

/// Frees a model; NULL does nothing.
///
/// # Safety
/// No other call on `model` is in progress, and `model` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_free(model: *mut mblob_model) -> mblob_status {
    call(|| release(Kind::Model, model, "model"))
}

/// Picks the function a Relax (or Relay VM) model runs; the inputs set so far are dropped.
/// A graph or AOT model has no functions: `MBLOB_ERR_NO_MODEL`.
///
/// # Safety
/// `model` is NULL or a handle; `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_select_function(model: *mut mblob_model, name: *const c_char) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        // SAFETY: the caller passes NULL or a NUL-terminated string that outlives the call.
        let name = unsafe { c_str(name, "name") }?;
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        m.model.select_function(name)?;
        m.outputs = None;
        m.refresh_names();
        Ok(())
    })
}

/// Writes the number of inputs of the model (of the selected function) to `*out`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_num_inputs(model: *const mblob_model, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe { model_get(model, out, |m| Ok(m.names.len())) }
}

/// Writes a pointer to the name of input `index` to `*out`: a NUL-terminated string owned by
/// the model, valid until the model is freed or `mblob_model_select_function` is called.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_input_name(
    model: *const mblob_model,
    index: usize,
    out: *mut *const c_char,
) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe {
        model_get(model, out, |m| {
            let name = m.names.get(index).ok_or_else(|| out_of_range("input", index, m.names.len()))?;
            Ok(name.as_ptr())
        })
    }
}

/// The input a `(name, index)` pair names: `name` when it is not NULL, else input `index`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn input_name(m: &mblob_model, name: *const c_char, index: usize) -> Result<String> {
    if name.is_null() {
        let n = m.names.get(index).ok_or_else(|| out_of_range("input", index, m.names.len()))?;
        Ok(n.to_string_lossy().into_owned())
    } else {
        // SAFETY: not NULL, and the caller passes a NUL-terminated string.
        Ok(unsafe { c_str(name, "name") }?.to_owned())
    }
}

fn out_of_range(what: &str, index: usize, count: usize) -> Failure {
    Failure::new(
        mblob_status::MBLOB_ERR_INVALID_ARGUMENT,
        format!("{what} index {index} is out of range (there are {count})"),
    )
}

/// Sets an input from a host buffer, copied in: by `name` when it is not NULL, else by
/// position `index`. `data` holds `nbytes` bytes of a dense, C-order, little-endian tensor of
/// the dtype `(dtype_code, dtype_bits, dtype_lanes)` and the shape `shape[0..ndim]`;
/// `nbytes` must be `ceil(dtype_bits / 8) * product(shape)`. A graph or AOT model checks the
/// dtype and shape against its input's here (`MBLOB_ERR_INPUT`); a Relax function checks them
/// when it runs.
///
/// # Safety
/// `model` is NULL or a handle; `name` is NULL or a NUL-terminated string; `data` is NULL or
/// points to `nbytes` readable bytes; `shape` is NULL or points to `ndim` readable `int64_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mblob_model_set_input(
    model: *mut mblob_model,
    name: *const c_char,
    index: usize,
    data: *const c_void,
    nbytes: usize,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    ndim: i32,
) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        let invalid = |m: String| Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, m);
        let ndim = usize::try_from(ndim).map_err(|_| invalid(format!("ndim is {ndim}, negative")))?;
        let shape: Vec<i64> = if ndim == 0 {
            Vec::new()
        } else {
            not_null(shape, "shape")?;
            // SAFETY: not NULL, and the caller passes `ndim` readable extents.
            unsafe { std::slice::from_raw_parts(shape, ndim) }.to_vec()
        };
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(invalid(format!("shape {shape:?} has a negative extent {d}")));
        }
        if dtype_bits == 0 || dtype_lanes == 0 {
            return Err(invalid(format!(
                "dtype (code {dtype_code}, bits {dtype_bits}, lanes {dtype_lanes}) has no bits or no lanes"
            )));
        }
        let dtype = DataType { code: dtype_code, bits: dtype_bits, lanes: dtype_lanes };
        let expected = mblob_runtime::array::tensor_bytes(dtype, &shape)
            .ok_or_else(|| invalid(format!("shape {shape:?} of {dtype} overflows")))?;
        if expected != nbytes as u64 {
            return Err(invalid(format!(
                "nbytes is {nbytes}, but a {dtype} tensor of shape {shape:?} takes {expected} bytes"
            )));
        }
        let bytes: &[u8] = if nbytes == 0 {
            &[]
        } else {
            not_null(data, "data")?;
            // SAFETY: not NULL, and the caller passes `nbytes` readable bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), nbytes) }
        };
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        // SAFETY: `name` is NULL or a NUL-terminated string, per the API.
        let name = unsafe { input_name(m, name, index) }?;
        let array = NdArray::from_bytes(bytes, &shape, dtype, Device::cpu(0)).map_err(|e| invalid(e.to_string()))?;
        m.model.set_input(Some(&name), Value::Tensor(array))?;
        Ok(())
    })
}

/// Runs the model (the selected function of a Relax model) once; every input must be set
/// (`MBLOB_ERR_INPUT` names those that are not). Outputs of an earlier run are dropped. The
/// outputs stay on the model's device: `mblob_model_output` copies one to the host,
/// `mblob_model_output_device` hands it out there.
///
/// # Safety
/// `model` is NULL or a handle.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_run(model: *mut mblob_model) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        m.outputs = None;
        m.model.run()?;
        let shared = matches!(m.model.kind(), ModelKind::Graph | ModelKind::Aot);
        m.outputs = Some(RunOutputs { values: m.model.outputs()?, shared });
        Ok(())
    })
}

fn outputs(m: &mblob_model) -> Result<&RunOutputs> {
    m.outputs.as_ref().ok_or_else(|| {
        Failure::new(
            mblob_status::MBLOB_ERR_STATE,
            "the model has no outputs yet: call mblob_model_run first (or mblob_model_invoke)",
        )
    })
}

/// Writes the number of outputs of the last run to `*out` (a Relax function's returned tuple
/// counts flattened, depth first). Before a successful run: `MBLOB_ERR_STATE`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_num_outputs(model: *const mblob_model, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe { model_get(model, out, |m| Ok(outputs(m)?.values.len())) }
}

fn device_failure(e: impl std::fmt::Display) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_DEVICE, e.to_string())
}

/// Output `index` of the last run, as a tensor of its own: on the host (`to_host`), or where
/// it lies (a copy there when the model would overwrite it).
fn output_array(m: &mblob_model, index: usize, to_host: bool) -> Result<NdArray> {
    let all = outputs(m)?;
    let value = all.values.get(index).ok_or_else(|| out_of_range("output", index, all.values.len()))?;
    if let Value::Str(s) = value {
        return Err(Failure::new(
            mblob_status::MBLOB_ERR_UNSUPPORTED,
            format!("output {index} is a string ({s:?}), not a tensor"),
        ));
    }
    let array = value.to_array().map_err(device_failure)?.ok_or_else(|| {
        Failure::new(mblob_status::MBLOB_ERR_UNSUPPORTED, format!("output {index} is a {}", value.kind()))
    })?;
    match value {
        Value::Tensor(a) if to_host => a.copy(Device::cpu(0)).map_err(device_failure),
        Value::Tensor(a) if all.shared => a.copy(a.device()).map_err(device_failure),
        _ => Ok(array),
    }
}

/// Writes to `*out` a new tensor handle on output `index` of the last run, on the host
/// (`to_host`) or where it lies.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
unsafe fn publish_output(
    model: *const mblob_model,
    index: usize,
    to_host: bool,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the model at a time per the API, as `checked` needs.
        let m = unsafe { checked(Kind::Model, model, "model", out) }?;
        let array = output_array(m, index, to_host)?;
        publish(Kind::Tensor, mblob_tensor { array }, out);
        Ok(())
    })
}

/// Copies output `index` of the last run into a new host tensor that the caller owns and
/// frees with `mblob_tensor_free`, and writes its handle to `*out`. A shape a Relax function
/// returns comes as a 1-D `int64` tensor, an integer as a 0-D `int64` one, a float as a 0-D
/// `float64` one; a string is `MBLOB_ERR_UNSUPPORTED`. An output `mblob_model_invoke` left
/// on the device is copied to the host here.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_output(
    model: *const mblob_model,
    index: usize,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    // SAFETY: the caller's contract is `publish_output`'s.
    unsafe { publish_output(model, index, true, out) }
}

/// Writes to `*out` a new tensor handle on output `index` of the last run where it lies, on
/// the model's device: an output of `mblob_model_invoke` or of a Relax or Relay VM function
/// run with `mblob_model_run`, uncopied (the tensor shares its memory and keeps it alive after
/// the model runs again or is freed); an output of a graph or AOT model, which the next run
/// overwrites, copied within the device. A shape or number comes as `mblob_model_output` gives
/// it. `mblob_tensor_to_host` copies it to the host, `mblob_tensor_to_dlpack` hands it on.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_output_device(
    model: *const mblob_model,
    index: usize,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    // SAFETY: the caller's contract is `publish_output`'s.
    unsafe { publish_output(model, index, false, out) }
}

/// Frees a tensor; NULL does nothing. Memory it shares with other tensors or with DLPack
/// tensors handed out (`mblob_tensor_to_dlpack`) lives on with them.
///
/// # Safety
/// No other call on `tensor` is in progress, and `tensor` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_free(tensor: *mut mblob_tensor) -> mblob_status {
    call(|| release(Kind::Tensor, tensor, "tensor"))
}

/// Runs `f` on a checked tensor handle and writes what it gives to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one `R`.
unsafe fn tensor_get<R>(
    tensor: *const mblob_tensor,
    out: *mut R,
    f: impl FnOnce(&mblob_tensor) -> Result<R>,
) -> mblob_status {
    // SAFETY: the caller's contract is `handle_get`'s.
    unsafe { handle_get(Kind::Tensor, tensor, "tensor", out, f) }
}

/// Writes the tensor's rank to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_ndim(tensor: *const mblob_tensor, out: *mut i32) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(t.array.shape().len() as i32)) }
}

/// Writes a pointer to the tensor's `ndim` extents to `*out` (owned by the tensor, valid until
/// it is freed; may be any non-NULL pointer for a 0-D tensor).
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_shape(tensor: *const mblob_tensor, out: *mut *const i64) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(t.array.shape().as_ptr())) }
}

/// Writes the tensor's dtype to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_dtype(tensor: *const mblob_tensor, out: *mut mblob_dtype) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe {
        tensor_get(tensor, out, |t| {
            let d = t.array.dtype();
            Ok(mblob_dtype { code: d.code, bits: d.bits, lanes: d.lanes })
        })
    }
}

/// Writes a pointer to the tensor's bytes (dense, C order, little-endian) to `*out`; owned by
/// the tensor, valid until it is freed (may be any non-NULL pointer when it has no bytes).
/// A tensor on a device has no host bytes: `MBLOB_ERR_STATE` (copy it with
/// `mblob_tensor_to_host`, or take its device pointer with `mblob_tensor_to_dlpack`).
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_data(tensor: *const mblob_tensor, out: *mut *const c_void) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe {
        tensor_get(tensor, out, |t| {
            if !t.array.device().is_cpu() {
                return Err(Failure::new(
                    mblob_status::MBLOB_ERR_STATE,
                    format!(
                        "the tensor is on {}, not on the host: copy it with mblob_tensor_to_host",
                        t.array.device()
                    ),
                ));
            }
            Ok(t.array.dl_tensor().data.cast_const())
        })
    }
}

/// Writes the number of bytes of the tensor's data to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_nbytes(tensor: *const mblob_tensor, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(t.array.nbytes())) }
}

/// Writes the device the tensor's memory is on to `*out` (DLPack's codes: `kDLCPU` 1 for
/// the host).
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_device(tensor: *const mblob_tensor, out: *mut mblob_dl_device) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe {
        tensor_get(tensor, out, |t| {
            let (device_type, device_id) = t.array.device().to_dlpack();
            Ok(mblob_dl_device { device_type, device_id })
        })
    }
}

/// Copies a tensor to the host: writes a new host tensor, which the caller owns, to `*out`
/// (a copy also when `tensor` is on the host already). Waits for the device's work on it.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_to_host(
    tensor: *const mblob_tensor,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the tensor at a time per the API, as `checked` needs.
        let t = unsafe { checked(Kind::Tensor, tensor, "tensor", out) }?;
        let array = t.array.copy(Device::cpu(0)).map_err(device_failure)?;
        publish(Kind::Tensor, mblob_tensor { array }, out);
        Ok(())
    })
}

// A library handle is shared across threads; a model or a tensor moves between them.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<mblob_library>();
    send::<mblob_model>();
    send_sync::<mblob_tensor>();
};

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: never NULL; valid until the next call on this thread.
        unsafe { CStr::from_ptr(mblob_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_is_a_status_and_a_message() {
        assert_eq!(call(|| panic!("boom {}", 7)), mblob_status::MBLOB_ERR_PANIC);
        assert_eq!(last_error(), "internal error (a bug in mblob): boom 7");
        assert_eq!(call(|| Ok(())), mblob_status::MBLOB_OK);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn a_message_with_a_nul_survives() {
        let s = call(|| Err(Failure::new(mblob_status::MBLOB_ERR_INPUT, "no input named `a\0b`")));
        assert_eq!(s, mblob_status::MBLOB_ERR_INPUT);
        assert_eq!(last_error(), "no input named `a\\0b`");
    }

    /// While a call on one thread uses a model, a call on another thread that needs it fails
    /// at once with MBLOB_ERR_STATE; a tensor is shared by readers but not freed under them;
    /// after the call everything is given back (also when it panicked).
    #[test]
    fn a_handle_in_use_is_refused_to_other_threads() {
        use std::sync::Barrier;
        let Ok(array) = NdArray::from_bytes(&7i64.to_le_bytes(), &[1], DataType::I64, Device::cpu(0)) else {
            panic!("a host array")
        };
        let mut tensor: *mut mblob_tensor = std::ptr::null_mut();
        publish(Kind::Tensor, mblob_tensor { array }, &mut tensor);
        let tensor_addr = tensor as usize;
        let fake_model = Box::into_raw(Box::new(0u64)) as usize;
        live(|m| m.insert(fake_model, Kind::Model));
        let (held, done) = (Barrier::new(2), Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                let status = call(|| {
                    check(Kind::Model, fake_model as *const u64, "model")?;
                    check(Kind::Tensor, tensor_addr as *const mblob_tensor, "tensor")?;
                    held.wait();
                    done.wait();
                    Ok(())
                });
                assert_eq!(status, mblob_status::MBLOB_OK);
            });
            held.wait();
            let other = call(|| check(Kind::Model, fake_model as *const u64, "model"));
            assert_eq!(other, mblob_status::MBLOB_ERR_STATE);
            assert!(last_error().contains("in use by a call on another thread"), "{}", last_error());
            // A tensor is read by both at once, but not freed while the other call reads it.
            let mut ndim = 0;
            // SAFETY: a live tensor handle and a valid out-pointer.
            let read = unsafe { mblob_tensor_ndim(tensor_addr as *const mblob_tensor, &mut ndim) };
            assert_eq!(read, mblob_status::MBLOB_OK);
            // SAFETY: a live handle; the call must refuse it.
            let freed = unsafe { mblob_tensor_free(tensor_addr as *mut mblob_tensor) };
            assert_eq!(freed, mblob_status::MBLOB_ERR_STATE, "{}", last_error());
            done.wait();
        });
        assert_eq!(call(|| check(Kind::Model, fake_model as *const u64, "model")), mblob_status::MBLOB_OK);
        assert_eq!(
            call(|| -> Result<()> {
                check(Kind::Model, fake_model as *const u64, "model")?;
                panic!("boom")
            }),
            mblob_status::MBLOB_ERR_PANIC
        );
        assert_eq!(call(|| check(Kind::Model, fake_model as *const u64, "model")), mblob_status::MBLOB_OK);
        // SAFETY: no call uses it now.
        assert_eq!(unsafe { mblob_tensor_free(tensor_addr as *mut mblob_tensor) }, mblob_status::MBLOB_OK);
        live(|m| m.remove(&fake_model));
        // SAFETY: made by Box::into_raw above, out of the live set.
        drop(unsafe { Box::from_raw(fake_model as *mut u64) });
    }
}
