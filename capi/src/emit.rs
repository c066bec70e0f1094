//! The emit side (feature `emit`): what a compiler backend needs to write a deploy library
//! that TVM and mblob load, through the `mblob` crate's [`mblob::export::Export`]: host objects,
//! payload modules by type key (raw bytes or files), the import tree, the blob layout and the
//! route the blob takes into the library, and an atomic write.

use std::ffi::{c_char, c_void};
use std::path::PathBuf;

use mblob::export::{Backend, Export};
use mblob_runtime::{map_file, Bytes, Layout, ModuleId, RawPayload};

use crate::args::{c_path, c_str};
use crate::call::call;
use crate::handle::{check, publish, release, Kind};
use crate::status::{mblob_status, not_null, Failure, Result};

/// An export being built (`mblob_export_new`): a module tree whose root is the host library
/// (type key `llvm`, module id 0) until `mblob_export_set_root` picks another. Used by one
/// thread at a time; freed with `mblob_export_free`.
pub struct mblob_export {
    export: Export,
}

fn invalid(message: String) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, message)
}

/// Reads a path argument that must not be empty (any bytes but NUL).
///
/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
unsafe fn non_empty_path(ptr: *const c_char, what: &str) -> Result<PathBuf> {
    // SAFETY: the caller passes NULL or a NUL-terminated string.
    let path = unsafe { c_path(ptr, what) }?;
    if path.as_os_str().is_empty() {
        return Err(invalid(format!("{what} is empty")));
    }
    Ok(path.to_path_buf())
}

/// Runs `f` on the export behind a checked handle, as one API call. Every entry point's
/// contract says `e` is NULL or a handle used by one thread at a time.
fn with_export(e: *mut mblob_export, f: impl FnOnce(&mut Export) -> Result<()>) -> mblob_status {
    call(|| {
        check(Kind::Export, e, "export")?;
        // SAFETY: checked above: a live export handle; the API gives the calling thread sole
        // use of it for the duration of the call.
        f(&mut unsafe { &mut *e }.export)
    })
}

fn module(export: &mut Export, id: usize, what: &str) -> Result<ModuleId> {
    let count = export.tree_mut().len();
    if id < count {
        Ok(ModuleId(id))
    } else {
        Err(invalid(format!("{what} is module {id}, but the export has {count} modules (0 to {})", count - 1)))
    }
}

/// Starts an export: a tree holding the host library alone (module 0, type key `llvm`, the
/// root), the classic layout (TVM 0.8 to 0.20) and the direct route. Writes its handle to
/// `*out`.
///
/// # Safety
/// `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_new(out: *mut *mut mblob_export) -> mblob_status {
    call(|| {
        not_null(out, "out")?;
        publish(Kind::Export, mblob_export { export: Export::new() }, out);
        Ok(())
    })
}

/// Frees an export; NULL does nothing. What it wrote stays.
///
/// # Safety
/// No other call on `export` is in progress, and `export` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_free(export: *mut mblob_export) -> mblob_status {
    call(|| release(Kind::Export, export, "export"))
}

/// Writes the module id of the host library (the node host objects stand for) to `*out`.
///
/// # Safety
/// `export` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_host(export: *mut mblob_export, out: *mut usize) -> mblob_status {
    with_export(export, |e| {
        not_null(out, "out")?;
        // SAFETY: not NULL, writable per the API.
        unsafe { out.write(e.host().0) };
        Ok(())
    })
}

/// Adds a host object (`.o`: the compiled operators, as TVM's `lib0.o`) to link into the
/// library. It is read when the export is written.
///
/// # Safety
/// `export` is NULL or a handle; `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_add_object(export: *mut mblob_export, path: *const c_char) -> mblob_status {
    with_export(export, |e| {
        // SAFETY: NULL or a NUL-terminated string, per the API.
        let path = unsafe { non_empty_path(path, "path") }?;
        e.object(path);
        Ok(())
    })
}

fn add_payload(e: &mut Export, type_key: &str, bytes: Bytes, out: *mut usize) -> Result<()> {
    if type_key.is_empty() {
        return Err(invalid("type_key is empty".into()));
    }
    let id = e.tree_mut().add_payload(RawPayload::new(type_key, bytes));
    // SAFETY: the callers checked `out` is not NULL; writable per the API.
    unsafe { out.write(id.0) };
    Ok(())
}

/// Adds a payload module of type key `type_key` (`GraphExecutorFactory`,
/// `relax.VMExecutable`, `cuda`, ...) whose saved bytes (what the kind's `SaveToBinary`
/// writes) are `data[0..nbytes]`, copied in; writes its module id to `*out`. It is imported
/// by nothing until `mblob_export_import` says so.
///
/// # Safety
/// `export` is NULL or a handle; `type_key` is NULL or a NUL-terminated string; `data` is NULL
/// (with `nbytes` 0) or points to `nbytes` readable bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_add_payload(
    export: *mut mblob_export,
    type_key: *const c_char,
    data: *const c_void,
    nbytes: usize,
    out: *mut usize,
) -> mblob_status {
    with_export(export, |e| {
        // SAFETY: NULL or a NUL-terminated string, per the API.
        let type_key = unsafe { c_str(type_key, "type_key") }?;
        not_null(out, "out")?;
        let bytes = if nbytes == 0 {
            Vec::new()
        } else {
            not_null(data, "data")?;
            // SAFETY: not NULL, and the caller passes `nbytes` readable bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), nbytes) }.to_vec()
        };
        add_payload(e, type_key, Bytes::from_vec(bytes), out)
    })
}

/// Adds a payload module of type key `type_key` whose saved bytes are the file at `path`
/// (mapped, not copied; the file must not change until the export is written); writes its
/// module id to `*out`.
///
/// # Safety
/// `export` is NULL or a handle; `type_key` and `path` are NULL or NUL-terminated strings;
/// `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_add_payload_file(
    export: *mut mblob_export,
    type_key: *const c_char,
    path: *const c_char,
    out: *mut usize,
) -> mblob_status {
    with_export(export, |e| {
        // SAFETY: NULL or NUL-terminated strings, per the API.
        let type_key = unsafe { c_str(type_key, "type_key") }?;
        // SAFETY: as above.
        let path = unsafe { non_empty_path(path, "path") }?;
        not_null(out, "out")?;
        let bytes = map_file(&path).map_err(|err| Failure::new(mblob_status::MBLOB_ERR_LOAD, err.to_string()))?;
        add_payload(e, type_key, bytes, out)
    })
}

/// Makes module `parent` import module `child` (after its earlier imports), as TVM's
/// `Module.import_module`. A payload imported by the host library, or the host imported by
/// a root payload (a Relax executable's tree), are the usual shapes; a cycle is refused when
/// the export is written.
///
/// # Safety
/// `export` is NULL or a handle.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_import(export: *mut mblob_export, parent: usize, child: usize) -> mblob_status {
    with_export(export, |e| {
        let (p, c) = (module(e, parent, "parent")?, module(e, child, "child")?);
        e.tree_mut().import(p, c);
        Ok(())
    })
}

/// Makes module `id` the root of the tree (the module TVM's loader returns).
///
/// # Safety
/// `export` is NULL or a handle.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_set_root(export: *mut mblob_export, id: usize) -> mblob_status {
    with_export(export, |e| {
        let id = module(e, id, "id")?;
        e.tree_mut().set_root(id);
        Ok(())
    })
}

/// Chooses the blob layout by name: `"classic"` (TVM 0.8 to 0.20), `"classic-0.21"` or
/// `"ffi"` (TVM 0.22+, tvm-ffi). The host objects' calling convention must fit it (checked
/// when written).
///
/// # Safety
/// `export` is NULL or a handle; `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_set_layout(export: *mut mblob_export, name: *const c_char) -> mblob_status {
    with_export(export, |e| {
        // SAFETY: NULL or a NUL-terminated string, per the API.
        let name = unsafe { c_str(name, "name") }?;
        let layout = Layout::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = Layout::ALL.iter().map(|l| l.name()).collect();
            invalid(format!("unknown layout `{name}` (expected one of {})", known.join(", ")))
        })?;
        e.layout(layout);
        Ok(())
    })
}

/// Chooses how the blob gets into the library: `"direct"` (the default: written into the
/// linked library), `"c"` (generated C with `.incbin`, compiled by the system compiler),
/// `"c-tvm"` (TVM's own C text, byte for byte) or `"llvm"` (LLVM 14; needs the crate's `llvm`
/// feature, else the write fails).
///
/// # Safety
/// `export` is NULL or a handle; `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_set_backend(export: *mut mblob_export, name: *const c_char) -> mblob_status {
    with_export(export, |e| {
        // SAFETY: NULL or a NUL-terminated string, per the API.
        let name = unsafe { c_str(name, "name") }?;
        let backend: Backend = name.parse().map_err(invalid)?;
        e.backend(backend);
        Ok(())
    })
}

/// Writes the library to `path`: a shared library (`.so`), or with a `.tar` name the
/// unlinked objects as TVM's `export_library("x.tar")`. Atomic: the library appears at `path`
/// complete, or not at all (an existing file is replaced only on success). Needs the system
/// C compiler and linker (`cc`). The export may be changed and written again.
///
/// # Safety
/// `export` is NULL or a handle; `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mblob_export_write(export: *mut mblob_export, path: *const c_char) -> mblob_status {
    with_export(export, |e| {
        // SAFETY: NULL or a NUL-terminated string, per the API.
        let path = unsafe { non_empty_path(path, "path") }?;
        e.write(&path).map_err(|err| {
            Failure::new(mblob_status::MBLOB_ERR_EMIT, format!("{}: {}", path.display(), mblob::with_causes(&err)))
        })?;
        Ok(())
    })
}
