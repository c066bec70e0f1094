//! OpenCL programs and kernels: TVM's `// Function: NAME` sections of the source
//! (`split_kernels`), a program built per device (`Program`), and its kernels.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::ops::Range;
use std::ptr;
use std::sync::{Arc, Mutex};

use opencl3::kernel as clk;
use opencl3::program as clprog;
use opencl3::types::{cl_kernel, cl_program};

use crate::device::opencl::api::{cl_text, OpenClApi, MODULE};
use crate::device::DeviceError;

/// A built program; released when dropped (after its kernels, which hold it).
pub(super) struct Program {
    pub(super) handle: cl_program,
    /// Keeps the context alive while the program is.
    _api: Arc<OpenClApi>,
}

// SAFETY: a `cl_program` may be used from any thread (OpenCL API calls are thread-safe, and a
// program is only read after it is built).
unsafe impl Send for Program {}
// SAFETY: as above.
unsafe impl Sync for Program {}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: made by `Program::build`, released once, here; its kernels held it, so none
        // is left.
        let _ = unsafe { clprog::release_program(self.handle) };
    }
}

/// Whether a `&str` is laid out as (data pointer, length), as cl3's
/// `create_program_with_source` assumes when it passes a slice of `&str` as a `const char**`.
fn str_is_pointer_first(s: &str) -> bool {
    // SAFETY: a `&str` is two words (transmute checks the sizes at compile time), both
    // initialised integers; reading them as `usize`s reads no memory they point to.
    let words = unsafe { std::mem::transmute::<&str, [usize; 2]>(s) };
    words[0] == s.as_ptr() as usize
}

impl Program {
    /// Builds `source` for the API's device; a build failure is a [`DeviceError::Build`] with
    /// the driver's log.
    pub(super) fn build(api: &Arc<OpenClApi>, source: &[u8]) -> Result<Program, DeviceError> {
        let device = api.device;
        let _span = tracing::debug_span!("opencl_build", %device, bytes = source.len()).entered();
        let build_error = |log: String| DeviceError::Build { device, module: MODULE.into(), log };
        let text =
            std::str::from_utf8(source).map_err(|e| build_error(format!("the OpenCL C source is not UTF-8 ({e})")))?;
        if text.trim().is_empty() {
            return Err(build_error("the OpenCL C source is empty".into()));
        }
        if !str_is_pointer_first(text) {
            return Err(DeviceError::Unsupported {
                device,
                what: "building OpenCL C with this Rust compiler (unexpected `&str` layout)".into(),
            });
        }
        let handle = clprog::create_program_with_source(api.context, &[text])
            .map_err(|c| api.driver("clCreateProgramWithSource", c))?;
        let program = Program { handle, _api: api.clone() };
        let options = CString::default();
        match clprog::build_program(handle, &[api.id], &options, None, ptr::null_mut()) {
            Ok(()) => Ok(program),
            Err(code) => {
                let log = clprog::get_program_build_data(handle, api.id, clprog::CL_PROGRAM_BUILD_LOG)
                    .map(|b| {
                        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                        String::from_utf8_lossy(&b[..end]).trim_end().to_owned()
                    })
                    .unwrap_or_else(|c| format!("(no build log: {})", cl_text(c)));
                Err(build_error(format!("clBuildProgram: {}\n{log}", cl_text(code))))
            }
        }
    }
}

impl Program {
    /// Makes and builds a program from a binary the driver gave for this device before
    /// (`clCreateProgramWithBinary`, `clBuildProgram`, as TVM's `SetPreCompiledPrograms`
    /// does); a binary the driver refuses is a [`DeviceError::Driver`] or [`DeviceError::Build`].
    pub(super) fn from_binary(api: &Arc<OpenClApi>, binary: &[u8]) -> Result<Program, DeviceError> {
        let device = api.device;
        let _span = tracing::debug_span!("opencl_load_binary", %device, bytes = binary.len()).entered();
        if binary.is_empty() {
            return Err(api.driver("clCreateProgramWithBinary", opencl3::error_codes::CL_INVALID_BINARY));
        }
        if !slice_is_pointer_first(binary) {
            return Err(DeviceError::Unsupported {
                device,
                what: "loading OpenCL program binaries with this Rust compiler (unexpected `&[u8]` layout)".into(),
            });
        }
        // SAFETY: the device is the context's own (`OpenClApi` made the context for it); cl3
        // passes the one slice's data pointer (its first word, checked above) and its length.
        let handle = unsafe { clprog::create_program_with_binary(api.context, &[api.id], &[binary]) }
            .map_err(|c| api.driver("clCreateProgramWithBinary", c))?;
        let program = Program { handle, _api: api.clone() };
        let options = CString::default();
        clprog::build_program(handle, &[api.id], &options, None, ptr::null_mut()).map_err(|code| {
            DeviceError::Build {
                device,
                module: MODULE.into(),
                log: format!("clBuildProgram of a cached program binary: {}", cl_text(code)),
            }
        })?;
        Ok(program)
    }

    /// The program's binary for its device (`clGetProgramInfo(CL_PROGRAM_BINARIES)`).
    pub(super) fn binary(&self) -> Result<Vec<u8>, DeviceError> {
        let info = clprog::get_program_info(self.handle, clprog::CL_PROGRAM_BINARIES)
            .map_err(|c| self._api.driver("clGetProgramInfo(CL_PROGRAM_BINARIES)", c))?;
        // cl3 answers `CL_PROGRAM_BINARIES` with binaries (one per device of the program).
        let mut binaries: Vec<Vec<u8>> = info.into();
        match binaries.len() {
            1 if !binaries[0].is_empty() => Ok(binaries.remove(0)),
            _ => {
                Err(self._api.driver("clGetProgramInfo(CL_PROGRAM_BINARIES)", opencl3::error_codes::CL_INVALID_PROGRAM))
            }
        }
    }
}

/// Whether a `&[u8]` is laid out as (data pointer, length), as cl3's
/// `create_program_with_binary` assumes when it passes a slice of `&[u8]` as a
/// `const unsigned char**`.
fn slice_is_pointer_first(s: &[u8]) -> bool {
    // SAFETY: a `&[u8]` is two words (transmute checks the sizes at compile time), both
    // initialised integers; reading them as `usize`s reads no memory they point to.
    let words = unsafe { std::mem::transmute::<&[u8], [usize; 2]>(s) };
    words[0] == s.as_ptr() as usize
}

/// A kernel of a built program. `clSetKernelArg` changes the kernel object, so setting the
/// arguments and enqueueing happen under `launch`.
pub(super) struct Kernel {
    pub(super) handle: cl_kernel,
    pub(super) launch: Mutex<()>,
    /// Keeps the program alive while the kernel is.
    pub(super) _program: Arc<Program>,
}

// SAFETY: the kernel is only changed (`clSetKernelArg`) and enqueued while `launch` is held;
// every other OpenCL call on it is thread-safe.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: made by `clCreateKernel` in `ModuleInner::kernel`, released once, here; launches
        // already queued keep their own reference.
        let _ = unsafe { clk::release_kernel(self.handle) };
    }
}

/// TVM's `SplitKernels`: the sections of a source that starts each kernel with a
/// `// Function: NAME` line, as (name, byte range of the section after that line). Empty when
/// the source has no such line. A name given twice keeps its first section.
pub(super) fn split_kernels(src: &[u8]) -> Vec<(String, Range<usize>)> {
    const DELIMITER: &[u8] = b"// Function: ";
    let find = |from: usize| {
        src.get(from..).and_then(|rest| rest.windows(DELIMITER.len()).position(|w| w == DELIMITER)).map(|p| p + from)
    };
    let mut out: Vec<(String, Range<usize>)> = Vec::new();
    let mut next = find(0);
    while let Some(at) = next {
        let name_start = at + DELIMITER.len();
        let name_end = src[name_start..].iter().position(|&c| c == b'\n').map_or(src.len(), |p| p + name_start);
        let name = String::from_utf8_lossy(&src[name_start..name_end]).trim_end_matches('\r').to_owned();
        let body_start = (name_end + 1).min(src.len());
        next = find(body_start);
        let body = body_start..next.unwrap_or(src.len());
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, body));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_split_as_tvm_splits_them() {
        let src = b"// Function: a\nkernel A\n// Function: b\r\nkernel B\n// Function: a\nagain";
        let s = split_kernels(src);
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(&src[s[0].1.clone()], b"kernel A\n");
        assert_eq!(&src[s[1].1.clone()], b"kernel B\n");
        assert!(split_kernels(b"__kernel void f() {}").is_empty());
        assert_eq!(split_kernels(b"// Function: tail"), [("tail".to_owned(), 17..17)]);
    }
}
