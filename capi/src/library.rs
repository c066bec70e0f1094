//! Libraries: loading one from a file or from memory, freeing it, and calling a host
//! function of it on DLPack tensors (`mblob_library_call`).

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use mblob_runtime::exec::Value;
use mblob_runtime::{load_library, load_library_bytes, LoadOptions, LoadedTree, Registry};

use crate::args::{c_path, c_str, memory_file};
use crate::call::call;
use crate::dlpack::{borrow, describe, is_aligned, mblob_dl_tensor};
use crate::handle::{check, publish, release, Kind};
use crate::status::{device_failure, mblob_status, not_null, Failure, Result};

/// A loaded library (`mblob_library_load`). Shareable across threads; freed with
/// `mblob_library_free`. Models made from it keep what they need of it alive, so it may be
/// freed before them.
pub struct mblob_library {
    pub(crate) tree: Arc<LoadedTree>,
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

/// Calls host function `name` of a library (found from its root, through its imports; what
/// TVM's `tvm.build` makes, such as `add_one`) with `num_args` DLPack tensors
/// `args[0..num_args]`, the function's arguments in order, and writes what it returns to `*ret`
/// when `ret` is not NULL (an integer; 0 when it returns none). A compiled function writes its
/// outputs into its argument tensors: they are passed where they lie, on their devices, with
/// no copy (one whose data is not aligned to 64 bytes, as TVM's kernels assume, goes through
/// an aligned copy, written back after the call), and the devices are waited for before the
/// call returns. No function of that name: `MBLOB_ERR_NO_MODEL`; the function's own error:
/// `MBLOB_ERR_RUN`, with its message.
///
/// # Safety
/// `lib` is NULL or a handle; `name` is NULL or a NUL-terminated string; `args` is NULL (with
/// `num_args` 0) or points to `num_args` pointers to `DLTensor`s whose memory is valid for
/// reading and writing, and used by no one else, during the call; `ret` is NULL or points to
/// writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_library_call(
    lib: *const mblob_library,
    name: *const c_char,
    args: *const *const mblob_dl_tensor,
    num_args: usize,
    ret: *mut i64,
) -> mblob_status {
    call(|| {
        check(Kind::Library, lib, "lib")?;
        // SAFETY: checked above; a library is never changed, and the API forbids freeing it
        // during a call on it.
        let lib = unsafe { &*lib };
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let name = unsafe { c_str(name, "name") }?;
        let pointers: &[*const mblob_dl_tensor] = if num_args == 0 {
            &[]
        } else {
            not_null(args, "args")?;
            // SAFETY: not NULL, and the caller passes `num_args` readable pointers.
            unsafe { std::slice::from_raw_parts(args, num_args) }
        };
        let described = pointers
            .iter()
            .enumerate()
            // SAFETY: each is NULL or a readable DLTensor, per the API.
            .map(|(i, &t)| unsafe { describe(t, &format!("args[{i}]")) })
            .collect::<Result<Vec<_>>>()?;
        let mut borrowed = Vec::with_capacity(described.len());
        let mut values = Vec::with_capacity(described.len());
        for d in &described {
            // SAFETY: the caller keeps the memory valid during the call; the arrays are
            // dropped in it.
            let array = unsafe { borrow(d, None) }?;
            let aligned = is_aligned(d);
            values.push(Value::Tensor(if aligned {
                array.clone()
            } else {
                array.copy(d.device).map_err(device_failure)?
            }));
            borrowed.push((array, aligned));
        }
        let result = mblob_runtime::exec::call(&lib.tree, name, &mut values)?;
        for ((array, aligned), v) in borrowed.iter().zip(&values) {
            if let (false, Value::Tensor(copy)) = (aligned, v) {
                copy.copy_to(array).map_err(device_failure)?;
            }
        }
        if !ret.is_null() {
            let n = match result {
                Value::Int(i) => i,
                _ => 0,
            };
            // SAFETY: not NULL, and the caller passes writable storage.
            unsafe { ret.write(n) };
        }
        Ok(())
    })
}
