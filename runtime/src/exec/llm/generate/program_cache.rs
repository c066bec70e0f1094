//! The OpenCL program cache of a model
//! ([`GenerateOptions::opencl_program_cache`](super::GenerateOptions::opencl_program_cache)):
//! MLC-LLM's engine calls `opencl.GetPreCompiledPrograms` and then
//! `opencl.SetPreCompiledPrograms` on the library before it loads the VM on OpenCL
//! (`cpp/serve/function_table.cc`); with a file, mblob writes what Get returns on the first run
//! and gives it to Set on the later ones, so that they load the kernels' program binaries
//! instead of building every kernel from its OpenCL C source. Both act on the library's
//! OpenCL module (the first of the tree, as TVM's lookup by name finds it), whose two methods
//! the functions of those names call.

use std::io::ErrorKind;
use std::path::Path;

use super::GenerateError;
use crate::device::{Device, DeviceType};
use crate::module::LoadedTree;

/// Loads the program cache at `path` into the OpenCL module of `tree` on `device`, or, when
/// there is no such file, writes the module's programs there (built now).
pub(super) fn use_program_cache(tree: &LoadedTree, device: Device, path: &Path) -> Result<(), GenerateError> {
    let _span = tracing::debug_span!("lm_opencl_program_cache", path = %path.display()).entered();
    let fail = |detail: String| GenerateError::ProgramCache { path: path.to_owned(), detail };
    if device.device_type != DeviceType::OpenCl {
        return Err(fail(format!("a program cache is for OpenCL devices, and the model runs on {device}")));
    }
    let cache = Cache::of(tree).map_err(&fail)?;
    match std::fs::read(path) {
        Ok(bytes) => cache
            .set(device, &bytes)
            .map_err(|e| fail(format!("{e} (delete the file to build the programs again and rewrite it)"))),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let bytes = cache.get(device).map_err(fail)?;
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

/// The OpenCL module of a tree, whose programs are cached.
#[cfg(feature = "opencl")]
struct Cache<'a>(&'a crate::device::opencl::OpenClModule);

#[cfg(feature = "opencl")]
impl<'a> Cache<'a> {
    fn of(tree: &'a LoadedTree) -> Result<Cache<'a>, String> {
        tree.find::<crate::device::opencl::OpenClModule>()
            .map(Cache)
            .ok_or_else(|| "the library has no OpenCL module".to_owned())
    }

    /// `opencl.GetPreCompiledPrograms` on `device`.
    fn get(&self, device: Device) -> Result<Vec<u8>, String> {
        self.0.precompiled_programs(device).map_err(|e| e.to_string())
    }

    /// `opencl.SetPreCompiledPrograms` on `device`.
    fn set(&self, device: Device, bytes: &[u8]) -> Result<(), String> {
        self.0.set_precompiled_programs(device, bytes).map_err(|e| e.to_string())
    }
}

/// Without the `opencl` feature there is no OpenCL module to cache.
#[cfg(not(feature = "opencl"))]
struct Cache;

#[cfg(not(feature = "opencl"))]
impl Cache {
    fn of(_: &LoadedTree) -> Result<Cache, String> {
        Err("mblob-runtime was built without the `opencl` feature".into())
    }

    fn get(&self, _: Device) -> Result<Vec<u8>, String> {
        Err("no OpenCL".into())
    }

    fn set(&self, _: Device, _: &[u8]) -> Result<(), String> {
        Err("no OpenCL".into())
    }
}
