//! System libraries: models linked into the program (TVM `system-lib` builds), opened by
//! prefix with no `dlopen` (`mblob_library_load_system`).
//!
//! With the crate feature `system-lib` (what `ci/install-capi.sh` builds into `libmblob.a`),
//! the library also defines TVM's runtime names that such models call at start-up and when
//! they run (`TVMBackendRegisterSystemLibSymbol`, `TVMFFIEnvModRegisterSystemLibSymbol`,
//! `TVMBackendAllocWorkspace`, `TVMFFIFunctionCall`, ...; see `runtime/src/ffi/system_lib.rs`):
//! a program links `libmblob.a` instead of TVM's runtime. `libmblob.so` is built without it
//! and exports none of TVM's names.

use std::ffi::c_char;
use std::sync::Arc;

use crate::args::c_str;
use crate::call::call;
use crate::handle::{publish, Kind};
use crate::library::mblob_library;
use crate::status::{mblob_status, not_null, Failure, Result};

/// Opens the model linked into this program under `prefix` (a TVM `system-lib` build, with
/// `system_lib_prefix` `prefix`; `""` for none: MLC's `system://PREFIX` model path) and writes
/// its handle to `*out`: the same handle `mblob_library_load` gives for a file, for
/// `mblob_model_new`, `mblob_library_call`, .... Nothing is opened and no code runs: the
/// model registered itself when the program started.
///
/// No model registered under `prefix`: `MBLOB_ERR_LOAD`, naming the prefixes that are; one of
/// its symbols registered twice at two addresses (two models linked under one prefix):
/// `MBLOB_ERR_LOAD`. A library built without the `system-lib` feature (`libmblob.so`):
/// `MBLOB_ERR_UNSUPPORTED` (link `libmblob.a` from `ci/install-capi.sh`).
///
/// # Safety
/// `prefix` is NULL or a NUL-terminated string; `out` is NULL or points to writable storage
/// for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_library_load_system(
    prefix: *const c_char,
    out: *mut *mut mblob_library,
) -> mblob_status {
    call(|| {
        not_null(prefix, "prefix")?;
        not_null(out, "out")?;
        // SAFETY: the caller passes a NUL-terminated string.
        let prefix = unsafe { c_str(prefix, "prefix") }?;
        let tree = load(prefix)?;
        publish(Kind::Library, mblob_library { tree: Arc::new(tree) }, out);
        Ok(())
    })
}

#[cfg(feature = "system-lib")]
fn load(prefix: &str) -> Result<mblob_runtime::LoadedTree> {
    use mblob_runtime::{load_system_lib, LoadOptions, Registry};
    load_system_lib(prefix, &Registry::default(), &LoadOptions::keep_unknown())
        .map_err(|e| Failure::new(mblob_status::MBLOB_ERR_LOAD, e.to_string()))
}

#[cfg(not(feature = "system-lib"))]
fn load(prefix: &str) -> Result<mblob_runtime::LoadedTree> {
    Err(Failure::new(
        mblob_status::MBLOB_ERR_UNSUPPORTED,
        format!(
            "system://{prefix}: this libmblob was built without the `system-lib` feature (libmblob.so never has it): link libmblob.a as ci/install-capi.sh installs it"
        ),
    ))
}
