//! Reading a C caller's arguments: strings, paths and buffers.

use std::ffi::{c_char, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::status::{mblob_status, not_null, Failure, Result};

/// Reads a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str> {
    not_null(ptr, what)?;
    // SAFETY: not NULL, and the caller guarantees a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map_err(|_| Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

/// Reads a path argument: any bytes but NUL.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn c_path<'a>(ptr: *const c_char, what: &str) -> Result<&'a Path> {
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
pub(crate) unsafe fn memory_file<'a>(
    data: *const c_void,
    nbytes: usize,
    name: *const c_char,
) -> Result<(&'a [u8], &'a str)> {
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
