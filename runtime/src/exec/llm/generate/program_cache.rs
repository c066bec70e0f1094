//! The OpenCL program cache of a model
//! ([`GenerateOptions::opencl_program_cache`](super::GenerateOptions::opencl_program_cache)):
//! MLC-LLM's engine calls `opencl.GetPreCompiledPrograms` and then
//! `opencl.SetPreCompiledPrograms` on the library before it loads the VM on OpenCL
//! (`cpp/serve/function_table.cc`); with a file, mblob writes what Get returns on the first run
//! and gives it to Set on the later ones, so that they load the kernels' program binaries
//! instead of building every kernel from its OpenCL C source. Both are found by name through
//! the library's imports, as TVM finds them.

use std::io::ErrorKind;
use std::path::Path;

use super::GenerateError;
use crate::device::api::set_current_device;
use crate::device::program_cache::{GET_PROGRAMS, SET_PROGRAMS};
use crate::device::{Device, DeviceType};
use crate::exec::call::call;
use crate::exec::value::Value;
use crate::module::LoadedTree;

/// Loads the program cache at `path` into the OpenCL module of `tree` on `device`, or, when
/// there is no such file, writes the module's programs there (built now).
pub(super) fn use_program_cache(tree: &LoadedTree, device: Device, path: &Path) -> Result<(), GenerateError> {
    let _span = tracing::debug_span!("lm_opencl_program_cache", path = %path.display()).entered();
    let fail = |detail: String| GenerateError::ProgramCache { path: path.to_owned(), detail };
    if device.device_type != DeviceType::OpenCl {
        return Err(fail(format!("a program cache is for OpenCL devices, and the model runs on {device}")));
    }
    // TVM's functions act on the calling thread's OpenCL device.
    set_current_device(device);
    match std::fs::read(path) {
        Ok(bytes) => {
            call(tree, SET_PROGRAMS, &mut [Value::Bytes(bytes)])
                .map_err(|e| fail(format!("{e} (delete the file to build the programs again and rewrite it)")))?;
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let bytes = match call(tree, GET_PROGRAMS, &mut []).map_err(|e| fail(e.to_string()))? {
                Value::Bytes(b) => b,
                v => return Err(fail(format!("{GET_PROGRAMS} returned a {}, not bytes", v.kind()))),
            };
            // Written beside it and renamed into place: a run that stops half way leaves no
            // partial cache for the next one to load.
            let partial = path.with_extension("partial");
            std::fs::write(&partial, &bytes)
                .and_then(|()| std::fs::rename(&partial, path))
                .map_err(|e| fail(format!("cannot write it: {e}")))?;
            tracing::debug!(bytes = bytes.len(), "wrote the OpenCL program cache");
            Ok(())
        }
        Err(e) => Err(fail(format!("cannot read it: {e}"))),
    }
}
