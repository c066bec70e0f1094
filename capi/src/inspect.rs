//! Inspecting (feature `inspect`): the JSON report of `mblob inspect --json` for a file or
//! for bytes in memory, read without running anything (unless asked to load).
//!
//! The report is built by the `mblob` crate's [`mblob::inspect`] (the one shared by the CLI
//! and Python), so this feature links it: the runtime-only library leaves it out.

use std::ffi::{c_char, c_void, CString};
use std::path::Path;

use mblob::inspect::{inspect_bytes, inspect_path, Options};
use mblob_runtime::Bytes;

use crate::args::{c_path, memory_file};
use crate::call::call;
use crate::handle::{is_live, live, Kind};
use crate::status::{mblob_status, not_null, Failure, Result};

/// `mblob_inspect` flag: also load the file (this runs its code: only for files you trust)
/// and report the module tree after loading (the JSON's `loaded`), as `mblob inspect --load`.
pub const MBLOB_INSPECT_LOAD: u32 = 1;
/// `mblob_inspect` flag: with `MBLOB_INSPECT_LOAD`, keep payloads of type keys without a
/// loader as opaque bytes instead of failing (`--keep-unknown`).
pub const MBLOB_INSPECT_KEEP_UNKNOWN: u32 = 2;

/// Hands `text` to the caller as a new string tracked as a live handle.
fn publish_string(text: String, out: *mut *mut c_char) -> Result<()> {
    let c = CString::new(text)
        .map_err(|_| Failure::new(mblob_status::MBLOB_ERR_PANIC, "internal error: a JSON report with a NUL"))?;
    let ptr = c.into_raw();
    live(|m| m.insert(ptr as usize, Kind::String));
    // SAFETY: every caller checked `out` is not NULL; the API requires it writable.
    unsafe { out.write(ptr) };
    Ok(())
}

fn report_json(report: &mblob::inspect::Report) -> Result<String> {
    serde_json::to_string(report)
        .map_err(|e| Failure::new(mblob_status::MBLOB_ERR_PANIC, format!("internal error: the report as JSON: {e}")))
}

fn inspect_failure(e: mblob::Error) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_LOAD, mblob::with_causes(&e))
}

/// Inspects the file at `path` (a shared library, a raw `.blob`, a `.tar`) and writes its
/// report to `*out`: one JSON object, the line `mblob inspect --json` prints for it (keys
/// listed in the README's "Command line" section). The string is the caller's, freed with
/// `mblob_string_free`. `flags`: 0, or `MBLOB_INSPECT_LOAD` and `MBLOB_INSPECT_KEEP_UNKNOWN`
/// or'ed. A file that cannot be read or holds no blob mblob reads: `MBLOB_ERR_LOAD`.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out` is NULL or points to writable storage
/// for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_inspect(path: *const c_char, flags: u32, out: *mut *mut c_char) -> mblob_status {
    call(|| {
        not_null(path, "path")?;
        not_null(out, "out")?;
        let unknown = flags & !(MBLOB_INSPECT_LOAD | MBLOB_INSPECT_KEEP_UNKNOWN);
        if unknown != 0 {
            return Err(Failure::new(
                mblob_status::MBLOB_ERR_INVALID_ARGUMENT,
                format!("flags {flags:#x}: unknown bits {unknown:#x}"),
            ));
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let path = unsafe { c_path(path, "path") }?;
        let options = Options {
            load: flags & MBLOB_INSPECT_LOAD != 0,
            keep_unknown: flags & MBLOB_INSPECT_KEEP_UNKNOWN != 0,
            ..Options::default()
        };
        let report = inspect_path(path, &options).map_err(inspect_failure)?;
        publish_string(report_json(&report)?, out)
    })
}

/// Inspects `nbytes` bytes in memory (what `mblob_inspect` reads from a file; nothing is
/// loaded or run) and writes the JSON report to `*out` (freed with `mblob_string_free`).
/// `name` (NULL for `"memory"`) stands for the file's path in the report and messages.
///
/// # Safety
/// `data` is NULL or points to `nbytes` readable bytes; `name` is NULL or a NUL-terminated
/// string; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_inspect_memory(
    data: *const c_void,
    nbytes: usize,
    name: *const c_char,
    out: *mut *mut c_char,
) -> mblob_status {
    call(|| {
        not_null(data, "data")?;
        not_null(out, "out")?;
        // SAFETY: `data` is not NULL; the caller passes `nbytes` readable bytes there, and
        // NULL or a NUL-terminated string as `name`.
        let (bytes, name) = unsafe { memory_file(data, nbytes, name) }?;
        let bytes = Bytes::from_vec(bytes.to_vec());
        let report = inspect_bytes(&bytes, Path::new(name), None, None).map_err(inspect_failure)?;
        publish_string(report_json(&report)?, out)
    })
}

/// Frees a string mblob made for the caller (`mblob_inspect`, `mblob_inspect_memory`); NULL
/// does nothing. Any other pointer, or one freed already, is `MBLOB_ERR_INVALID_HANDLE`.
///
/// # Safety
/// No other call on `s` is in progress, and `s` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_string_free(s: *mut c_char) -> mblob_status {
    call(|| {
        if s.is_null() {
            return Ok(());
        }
        live(|m| -> Result<()> {
            is_live(m, Kind::String, s as usize, "s")?;
            m.remove(&(s as usize));
            Ok(())
        })?;
        // SAFETY: `s` was a live string, made by `CString::into_raw` in `publish_string`, and
        // is now out of the live set, so this is its one release.
        drop(unsafe { CString::from_raw(s) });
        Ok(())
    })
}
