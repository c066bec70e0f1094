//! Runtime functions that compiled code imports by name, and the checks made before a library
//! is opened.
//!
//! TVM 0.22+ argument checks call `TVMFFIErrorSetRaisedFromCStrParts` through the PLT, with no
//! `DT_NEEDED` entry saying where it lives; TVM's C host target and system-lib builds import
//! `TVMBackendAllocWorkspace`, `TVMFuncCall`, ... the same way. Such a symbol must be global in
//! the process before the library is opened: with immediate binding the open fails, with lazy
//! binding the first failing check kills the process.
//!
//! A Rust library cannot export symbols to libraries opened later (only an executable linked
//! with `-rdynamic` can, and only the executables one builds oneself). So `build.rs` compiles
//! a tiny C shared library (`shim/mblob_shim.c`) whose functions forward to a table of
//! function pointers; its bytes are embedded here. The first time a library needs it, the shim
//! is written to a private temporary file, opened with `RTLD_GLOBAL` (after which the file is
//! removed), and its table filled with the context functions of [`super::context`]. This works
//! in any program that uses mblob-runtime. Libraries are then opened with `RTLD_NOW`, so any
//! other unresolved symbol is an error at load, never a crash later.
//!
//! A library that imports a TVM function the shim does not provide (e.g. `TVMArrayAlloc`) is
//! refused before it is opened, with an error that lists them.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::path::Path;
use std::sync::OnceLock;

use object::{Object, ObjectSection, ObjectSymbol};

use super::callconv::Abi;
use crate::error::{Error, Result};

/// The TVM runtime functions the shim provides, in the order of its table.
pub const PROVIDED: [&str; 13] = [
    "TVMFFIErrorSetRaisedFromCStrParts",
    "TVMFFIErrorSetRaisedFromCStr",
    "TVMAPISetLastError",
    "TVMBackendAllocWorkspace",
    "TVMBackendFreeWorkspace",
    "TVMBackendParallelLaunch",
    "TVMBackendParallelBarrier",
    "TVMBackendGetFuncFromEnv",
    "TVMFuncCall",
    "TVMFFIFunctionCall",
    "TVMFFIEnvModLookupFromImports",
    "TVMFFIHandleInitOnce",
    "TVMBackendRegisterSystemLibSymbol",
];

#[cfg(not(mblob_no_shim))]
static SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mblob_shim.so"));

/// What the file's dynamic symbols say, read before it is opened.
#[derive(Debug, Clone)]
pub(crate) struct Preflight {
    /// The calling convention of its functions.
    pub abi: Abi,
    /// The entry function `__tvm_main__` names (classic libraries).
    pub main_entry: Option<String>,
}

/// Whether a symbol name is one of TVM's runtime functions.
fn is_tvm_runtime(name: &str) -> bool {
    name.starts_with("TVM") || name.starts_with("tvm_")
}

/// Reads the dynamic symbols of `file` (an ELF shared library), loads the shim when the
/// library imports runtime functions, and refuses one that imports runtime functions nobody
/// provides.
pub(crate) fn preflight(file: &[u8], path: &Path) -> Result<Preflight> {
    let Ok(obj) = object::File::parse(file) else {
        // Not an ELF file we can read: let dlopen say what is wrong with it.
        return Ok(Preflight { abi: Abi::Packed, main_entry: None });
    };
    let mut imports = Vec::new();
    let mut ffi = false;
    let mut main_entry = None;
    for sym in obj.dynamic_symbols() {
        let Ok(name) = sym.name() else { continue };
        let name = name.split('@').next().unwrap_or(name);
        if sym.is_undefined() {
            if is_tvm_runtime(name) {
                imports.push(name.to_owned());
            }
            ffi |= name.starts_with("TVMFFI");
            continue;
        }
        ffi |= super::callconv::marks_ffi_code(name);
        if name == "__tvm_main__" {
            main_entry = c_string_at(&obj, &sym);
        }
    }
    imports.sort();
    imports.dedup();
    let missing: Vec<String> = imports.iter().filter(|n| !PROVIDED.contains(&n.as_str())).cloned().collect();
    if !missing.is_empty() {
        return Err(Error::MissingRuntimeSymbols {
            path: path.to_owned(),
            symbols: missing,
            reason: "mblob-runtime does not provide them".into(),
        });
    }
    if !imports.is_empty() {
        ensure_loaded().map_err(|reason| Error::MissingRuntimeSymbols {
            path: path.to_owned(),
            symbols: imports.clone(),
            reason,
        })?;
    }
    Ok(Preflight { abi: if ffi { Abi::Ffi } else { Abi::Packed }, main_entry })
}

/// The NUL-terminated string a defined data symbol holds, read from the file.
fn c_string_at(obj: &object::File<'_>, sym: &object::Symbol<'_, '_>) -> Option<String> {
    let section = obj.section_by_index(sym.section_index()?).ok()?;
    let data = section.data().ok()?;
    let start = usize::try_from(sym.address().checked_sub(section.address())?).ok()?;
    let bytes = data.get(start..)?;
    let len = usize::try_from(sym.size()).ok().filter(|&n| n > 0).unwrap_or(bytes.len()).min(bytes.len());
    let bytes = &bytes[..len];
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8(bytes[..end].to_vec()).ok().filter(|s| !s.is_empty())
}

/// Loads the shim once per process.
pub(crate) fn ensure_loaded() -> std::result::Result<(), String> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(load_shim).clone()
}

#[cfg(mblob_no_shim)]
fn load_shim() -> std::result::Result<(), String> {
    Err("mblob-runtime was built without a C compiler, so it has no shim to provide them".into())
}

#[cfg(not(mblob_no_shim))]
fn load_shim() -> std::result::Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);

    let _span = tracing::debug_span!("load_runtime_shim").entered();
    let dir = std::env::temp_dir();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let path =
        dir.join(format!("mblob-shim-{}-{nanos}-{}.so", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&path)
        .and_then(|mut f| f.write_all(SHIM).and_then(|()| f.sync_all()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&path);
        return Err(format!("cannot write the runtime shim to {}: {e}", path.display()));
    }
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: the shim is mblob's own library (built by build.rs from shim/mblob_shim.c); it has
    // no initialisers.
    let opened = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) };
    let _ = std::fs::remove_file(&path);
    let lib = opened.map_err(|e| format!("cannot open the runtime shim: {e}"))?;
    // SAFETY: `mblob_shim_table` is the shim's array of `PROVIDED.len()` pointers, read as a
    // plain address.
    let table = unsafe { lib.get::<*mut *const c_void>(b"mblob_shim_table") }
        .map(|s| *s)
        .map_err(|e| format!("the runtime shim has no table: {e}"))?;
    let functions = super::context::context_functions();
    for (i, name) in PROVIDED.iter().enumerate() {
        let f = functions.iter().find(|(n, _)| n == name).map(|(_, f)| *f).unwrap_or(std::ptr::null());
        // SAFETY: the table has `PROVIDED.len()` slots; no library calls through it yet (the
        // shim is loaded before any library that imports its functions).
        unsafe { table.add(i).write(f) };
    }
    // The shim stays loaded for the life of the process: libraries bound to it may be open.
    std::mem::forget(lib);
    Ok(())
}
