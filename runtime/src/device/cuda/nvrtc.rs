//! CUDA C++ source to a cubin or PTX with NVRTC (feature `cuda`), for `cuda` payloads whose
//! format is `cuda`: TVM 0.27 keeps its kernels' CUDA source in an exported library and
//! compiles it when the library is loaded (its `tvm_callback_cuda_compile`), for the GPU there.
//! [`compile_for_device`] does the same: a cubin for the device's architecture when NVRTC knows
//! it, else PTX for the newest virtual architecture NVRTC has below it (which the driver
//! compiles on load).
//!
//! NVRTC (`libnvrtc`) is opened at run time through cudarc, on first use: without it,
//! compiling is [`NvrtcError::NotFound`], never a panic (every cudarc call runs inside a guard,
//! as the driver's do in [`super::api`]).
//!
//! The source is prepared and compiled as TVM's `_compile_cuda_nvrtc` does (TVM 0.27,
//! `tvm/support/nvcc.py`): `#include <cuda.h>` lines dropped, its preamble put first (fixed-width
//! integers and limits from libcu++, `__asm__`/`__volatile__`, `INFINITY`), program name
//! `tvm_kernels.cu`, and options `-default-device --device-int128 --use_fast_math`, the half and
//! bfloat16 operators enabled, the deprecation macros of `vector_types.h` defined empty, and the
//! CUDA include folders (see [`include_dirs`]). TVM's ptxas options (`-v`,
//! `--register-usage-level=10`, `--warn-on-local-memory-usage`) are left out: they only tune
//! or report, and older NVRTCs refuse `--register-usage-level`.
//!
//! TVM's sources include libcu++ headers (`cuda/std/cstdint`, `cuda/std/type_traits`), which
//! NVRTC does not carry: they come from a CUDA toolkit (`$CUDA_PATH`, `$CUDA_HOME`,
//! `/usr/local/cuda`) or from the `nvidia-cuda-cccl-cu12` wheel installed beside
//! `nvidia-cuda-nvrtc-cu12` (found from where `libnvrtc` was opened).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::nvrtc::sys;

/// The library NVRTC is looked for as, for messages.
#[cfg(windows)]
pub(crate) const LIBRARY: &str = "nvrtc64_120_0.dll";
/// The library NVRTC is looked for as, for messages.
#[cfg(not(windows))]
pub(crate) const LIBRARY: &str = "libnvrtc.so.12";

/// TVM's program name.
const PROGRAM_NAME: &str = "tvm_kernels.cu";

/// The most of NVRTC's log an error keeps (a failed compile of a large source can log
/// megabytes of warnings).
const MAX_LOG: usize = 16 << 10;

/// What NVRTC makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text, for a virtual architecture (`compute_XY`); the driver compiles it on load.
    Ptx,
    /// A cubin, for a real architecture (`sm_XY`).
    Cubin,
}

impl Output {
    /// The payload format of the image (`ptx` or `cubin`).
    pub fn format(self) -> &'static str {
        match self {
            Output::Ptx => "ptx",
            Output::Cubin => "cubin",
        }
    }

    /// The architecture option's value for compute capability `XY` (`compute_XY`/`sm_XY`).
    pub fn arch(self, arch: u32) -> String {
        match self {
            Output::Ptx => format!("compute_{arch}"),
            Output::Cubin => format!("sm_{arch}"),
        }
    }
}

/// Why NVRTC did not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NvrtcError {
    /// `libnvrtc` cannot be opened.
    #[error(
        "NVRTC ({LIBRARY}) not found, which compiling CUDA source (payload format `cuda`) needs: install \
         the CUDA toolkit or `pip install nvidia-cuda-nvrtc-cu12` and put its lib folder on LD_LIBRARY_PATH"
    )]
    NotFound,
    /// An NVRTC call failed, or the library lacks a function.
    #[error("NVRTC: {call} failed: {detail}")]
    Call {
        /// The call.
        call: String,
        /// What it said.
        detail: String,
    },
    /// NVRTC knows no architecture the device can run.
    #[error("NVRTC {version} cannot compile for compute capability {major}.{minor} (it supports {supported:?})")]
    Unsupported {
        /// The device's compute capability.
        major: u32,
        /// The device's compute capability.
        minor: u32,
        /// NVRTC's version.
        version: String,
        /// The architectures NVRTC supports (`XY` for compute capability X.Y).
        supported: Vec<u32>,
    },
    /// The source cannot be handed to NVRTC.
    #[error("the CUDA source {0}")]
    Source(String),
    /// The source did not compile.
    #[error("{0}")]
    Compile(Box<CompileFailure>),
}

/// A compile NVRTC refused ([`NvrtcError::Compile`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "NVRTC {version} could not compile the CUDA source for {arch} ({result}){hint}\noptions: {options:?}\nlog:\n{log}"
)]
pub struct CompileFailure {
    /// The architecture option's value.
    pub arch: String,
    /// NVRTC's result.
    pub result: String,
    /// NVRTC's version.
    pub version: String,
    /// The options given.
    pub options: Vec<String>,
    /// NVRTC's program log (cut past 16 KiB).
    pub log: String,
    /// What may be missing, or empty.
    pub hint: String,
}

/// A compiled image.
#[derive(Clone, PartialEq, Eq)]
pub struct Compiled {
    /// PTX or cubin.
    pub output: Output,
    /// The architecture compiled for (`sm_90`, `compute_90`).
    pub arch: String,
    /// The image: PTX text (without a NUL) or the cubin.
    pub image: Vec<u8>,
    /// NVRTC's program log (warnings), or empty.
    pub log: String,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled")
            .field("output", &self.output)
            .field("arch", &self.arch)
            .field("image", &format_args!("{} bytes", self.image.len()))
            .field("log", &format_args!("{} bytes", self.log.len()))
            .finish()
    }
}

/// Whether `libnvrtc` can be opened (checked once per process).
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` opens and closes NVRTC by its usual names; opening it runs
        // its initialisers, which using it at all requires. A panic (none is expected) is no.
        panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
    })
}

/// Runs NVRTC calls with the library checked first, turning a panic (cudarc panics when the
/// library lacks a function it loads) into an error.
fn guard<T>(call: &str, f: impl FnOnce() -> Result<T, NvrtcError>) -> Result<T, NvrtcError> {
    if !available() {
        return Err(NvrtcError::NotFound);
    }
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(NvrtcError::Call { call: call.to_owned(), detail: format!("the NVRTC library failed: {detail}") })
        }
    }
}

/// NVRTC's name of a result.
fn result_name(r: sys::nvrtcResult) -> String {
    // SAFETY: `nvrtcGetErrorString` returns a static NUL-terminated string (or NULL).
    let s = unsafe { sys::nvrtcGetErrorString(r) };
    if s.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null, NUL-terminated and static, per NVRTC.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

fn check(call: &str, r: sys::nvrtcResult) -> Result<(), NvrtcError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(NvrtcError::Call { call: call.to_owned(), detail: result_name(r) })
    }
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    static VERSION: OnceLock<Result<(i32, i32), NvrtcError>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            guard("nvrtcVersion", || {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: two valid out-pointers.
                check("nvrtcVersion", unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
                Ok((major, minor))
            })
        })
        .clone()
}

fn version_text() -> String {
    version().map_or_else(|_| "(version unknown)".to_owned(), |(major, minor)| format!("{major}.{minor}"))
}

/// The architectures NVRTC compiles for, as `XY` for compute capability X.Y (ascending).
pub(crate) fn supported_archs() -> Result<Vec<u32>, NvrtcError> {
    static ARCHS: OnceLock<Result<Vec<u32>, NvrtcError>> = OnceLock::new();
    ARCHS
        .get_or_init(|| {
            guard("nvrtcGetSupportedArchs", || {
                let mut n: c_int = 0;
                // SAFETY: a valid out-pointer.
                check("nvrtcGetNumSupportedArchs", unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) })?;
                let mut archs = vec![0 as c_int; usize::try_from(n).unwrap_or(0)];
                if !archs.is_empty() {
                    // SAFETY: `archs` holds the `n` ints NVRTC writes.
                    check("nvrtcGetSupportedArchs", unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) })?;
                }
                let mut archs: Vec<u32> = archs.into_iter().filter_map(|a| u32::try_from(a).ok()).collect();
                archs.sort_unstable();
                archs.dedup();
                Ok(archs)
            })
        })
        .clone()
}

/// The folder `libnvrtc` was opened from, when the loader tells.
fn library_dir() -> Option<PathBuf> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        if !available() {
            return None;
        }
        let found = panic::catch_unwind(|| {
            // SAFETY: NVRTC is present (checked above), so `culib` opens it rather than panic
            // (and a panic is caught). The symbol is only used as an address.
            let addr = unsafe { sys::culib().get::<*mut c_void>(b"nvrtcVersion\0") }.ok().map(|s| *s)?;
            // SAFETY: `Dl_info` is plain data that dladdr fills; zeroed is a valid value.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: dladdr only looks `addr` up in the loader's tables, and writes `info`.
            if unsafe { libc::dladdr(addr.cast_const(), &mut info) } == 0 || info.dli_fname.is_null() {
                return None;
            }
            // SAFETY: dladdr set `dli_fname` to the object's NUL-terminated path, which lives
            // as long as the object stays loaded (cudarc keeps it loaded for the process).
            let path = Path::new(std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes()));
            let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
            path.parent().map(Path::to_owned)
        });
        found.ok().flatten()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The `targets/<triple>` folder names of a CUDA toolkit for this machine.
fn target_triples() -> &'static [&'static str] {
    match std::env::consts::ARCH {
        "x86_64" => &["x86_64-linux"],
        "aarch64" => &["sbsa-linux", "aarch64-linux"],
        "powerpc64" => &["ppc64le-linux"],
        _ => &[],
    }
}

/// The include folders of the CUDA installation at `root`, where they exist.
fn toolkit_includes(root: &Path, out: &mut Vec<PathBuf>) {
    let mut candidates = vec![root.join("include"), root.join("include").join("cccl")];
    for triple in target_triples() {
        let include = root.join("targets").join(triple).join("include");
        candidates.push(include.join("cccl"));
        candidates.push(include);
    }
    for dir in candidates {
        if dir.is_dir() && !out.contains(&dir) {
            out.push(dir);
        }
    }
}

/// The include folders compiles get, searched in this order, where they exist: the CUDA
/// toolkit at `$CUDA_PATH`, then `$CUDA_HOME` (each `include`, `include/cccl`,
/// `targets/<triple>/include` and its `cccl`), then the wheels beside the `libnvrtc` that was
/// opened (`nvidia-cuda-nvrtc-cu12` keeps it in `nvidia/cuda_nvrtc/lib`: `nvidia/cuda_cccl/include`
/// and `nvidia/cuda_runtime/include`; and `../include` of its folder), then `/usr/local/cuda`.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            toolkit_includes(Path::new(&root), &mut dirs);
        }
    }
    if let Some(lib) = library_dir() {
        let mut candidates = Vec::new();
        if let Some(nvidia) = lib.parent().and_then(Path::parent) {
            candidates.push(nvidia.join("cuda_cccl").join("include"));
            candidates.push(nvidia.join("cuda_runtime").join("include"));
        }
        if let Some(root) = lib.parent() {
            candidates.push(root.join("include").join("cccl"));
            candidates.push(root.join("include"));
        }
        for dir in candidates {
            if dir.is_dir() && !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    toolkit_includes(Path::new("/usr/local/cuda"), &mut dirs);
    dirs
}

/// TVM's preamble for NVRTC (`_compile_cuda_nvrtc`).
const PREAMBLE: &str = "#include <cuda/std/cstdint>
using cuda::std::uint8_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::int8_t;
using cuda::std::int16_t;
using cuda::std::int32_t;
using cuda::std::int64_t;

// NVRTC uses asm/volatile instead of __asm__/__volatile__
#ifndef __asm__
#define __asm__ asm
#endif
#ifndef __volatile__
#define __volatile__ volatile
#endif

// NVRTC does not pull in the host <math.h>, so INFINITY is undefined. Provide it
// from libcu++ (same float +inf value nvcc's <math.h> yields).
#include <cuda/std/limits>
#ifndef INFINITY
#define INFINITY (::cuda::std::numeric_limits<float>::infinity())
#endif

";

/// `CUtensorMap`, which `cuda.h` defines and NVRTC lacks (TVM adds it when the source names it).
const TENSOR_MAP: &str = "struct alignas(64) CUtensorMap_st {
  unsigned long long opaque[16];
};
typedef struct CUtensorMap_st CUtensorMap;

";

/// The source as TVM hands it to NVRTC: `#include <cuda.h>` lines dropped, the preamble first.
pub(crate) fn prepare_source(source: &str) -> String {
    let kept: Vec<&str> = source.lines().filter(|l| l.trim() != "#include <cuda.h>").collect();
    let body = kept.join("\n");
    let mut out = String::with_capacity(PREAMBLE.len() + TENSOR_MAP.len() + body.len());
    out.push_str(PREAMBLE);
    if body.contains("CUtensorMap") {
        out.push_str(TENSOR_MAP);
    }
    out.push_str(&body);
    out
}

/// The options of a compile for `arch` (`sm_XY` or `compute_XY`) with include folders
/// `includes`, as TVM passes them.
pub fn options(arch: &str, includes: &[PathBuf]) -> Vec<String> {
    let mut opts = vec![format!("--gpu-architecture={arch}"), "-default-device".into(), "--device-int128".into()];
    opts.extend(includes.iter().map(|d| format!("-I{}", d.display())));
    for macro_name in [
        "__NV_SILENCE_DEPRECATION_BEGIN",
        "__NV_SILENCE_DEPRECATION_END",
        "__NV_SILENCE_HOST_DEPRECATION_BEGIN",
        "__NV_SILENCE_HOST_DEPRECATION_END",
    ] {
        opts.push(format!("-D{macro_name}="));
    }
    for macro_name in [
        "__CUDA_NO_HALF_OPERATORS__",
        "__CUDA_NO_HALF_CONVERSIONS__",
        "__CUDA_NO_BFLOAT16_OPERATORS__",
        "__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "__CUDA_NO_BFLOAT162_OPERATORS__",
        "__CUDA_NO_BFLOAT162_CONVERSIONS__",
    ] {
        opts.push(format!("-U{macro_name}"));
    }
    opts.push("--use_fast_math".into());
    opts
}

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program came from `nvrtcCreateProgram` and is destroyed once, here. A
        // failure leaks it, which is all that can be done.
        let _ = panic::catch_unwind(AssertUnwindSafe(|| unsafe { sys::nvrtcDestroyProgram(&mut self.0) }));
    }
}

impl Program {
    /// The program's log.
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        if unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC writes (the log and its NUL).
        if unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr().cast::<c_char>()) }
            != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_owned()
    }

    /// The compiled image.
    fn image(&self, output: Output) -> Result<Vec<u8>, NvrtcError> {
        let mut size = 0usize;
        let mut buf;
        match output {
            Output::Ptx => {
                // SAFETY: a compiled program and a valid out-pointer.
                check("nvrtcGetPTXSize", unsafe { sys::nvrtcGetPTXSize(self.0, &mut size) })?;
                buf = vec![0u8; size];
                // SAFETY: `buf` holds the `size` bytes NVRTC writes.
                check("nvrtcGetPTX", unsafe { sys::nvrtcGetPTX(self.0, buf.as_mut_ptr().cast::<c_char>()) })?;
                // PTX comes with its NUL, which the driver's loader adds back.
                while buf.last() == Some(&0) {
                    buf.pop();
                }
            }
            Output::Cubin => {
                // SAFETY: a compiled program and a valid out-pointer.
                check("nvrtcGetCUBINSize", unsafe { sys::nvrtcGetCUBINSize(self.0, &mut size) })?;
                buf = vec![0u8; size];
                // SAFETY: `buf` holds the `size` bytes NVRTC writes.
                check("nvrtcGetCUBIN", unsafe { sys::nvrtcGetCUBIN(self.0, buf.as_mut_ptr().cast::<c_char>()) })?;
            }
        }
        if buf.is_empty() {
            return Err(NvrtcError::Call { call: "nvrtcGet".to_owned() + output.format(), detail: "empty".into() });
        }
        Ok(buf)
    }
}

/// What may be missing when a compile failed with `log`.
fn hint(log: &str, includes: &[PathBuf]) -> String {
    if log.contains("open source file") {
        format!(
            "; a header is missing: TVM's CUDA source includes libcu++ (`cuda/std/...`), which NVRTC \
             does not carry: set CUDA_PATH to a CUDA toolkit, or `pip install nvidia-cuda-cccl-cu12` beside \
             nvidia-cuda-nvrtc-cu12 (include folders searched: {includes:?})"
        )
    } else if log.contains("builtins") {
        " (NVRTC's builtins library, libnvrtc-builtins, must sit beside libnvrtc)".to_owned()
    } else {
        String::new()
    }
}

fn cut_log(log: String) -> String {
    if log.len() <= MAX_LOG {
        return log;
    }
    let mut end = MAX_LOG;
    while !log.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n... ({} more bytes of log)", &log[..end], log.len() - end)
}

/// Compiles `source` (CUDA C++ as TVM stores it) for `arch` (`sm_XY` for [`Output::Cubin`],
/// `compute_XY` for [`Output::Ptx`]) with include folders `includes`, as TVM does.
pub fn compile(source: &str, output: Output, arch: &str, includes: &[PathBuf]) -> Result<Compiled, NvrtcError> {
    let prepared = prepare_source(source);
    let src =
        CString::new(prepared).map_err(|e| NvrtcError::Source(format!("holds a NUL byte at {}", e.nul_position())))?;
    let name = CString::new(PROGRAM_NAME).unwrap_or_default();
    let opts = options(arch, includes);
    let c_opts = opts
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| NvrtcError::Source("include folder holds a NUL byte".into()))?;
    let ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let count = c_int::try_from(ptrs.len()).unwrap_or(c_int::MAX);
    guard("nvrtcCompileProgram", || {
        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: `src` and `name` are NUL-terminated and outlive the program (dropped after
        // it, below); no headers are given.
        let r = unsafe {
            sys::nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null())
        };
        check("nvrtcCreateProgram", r)?;
        let prog = Program(prog);
        let started = Instant::now();
        // SAFETY: a live program; `ptrs` holds `count` NUL-terminated options that `c_opts`
        // keeps alive for the call.
        let r = unsafe { sys::nvrtcCompileProgram(prog.0, count, ptrs.as_ptr()) };
        let log = prog.log();
        tracing::debug!(%arch, ms = started.elapsed().as_millis() as u64, ok = r == sys::nvrtcResult::NVRTC_SUCCESS, "nvrtc");
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(NvrtcError::Compile(Box::new(CompileFailure {
                arch: arch.to_owned(),
                result: result_name(r),
                version: version_text(),
                options: opts.clone(),
                hint: hint(&log, includes),
                log: cut_log(log),
            })));
        }
        let image = prog.image(output)?;
        Ok(Compiled { output, arch: arch.to_owned(), image, log: cut_log(log) })
    })
}

/// [`compile`] to PTX for compute capability `(major, minor)` (`compute_XY`), with the
/// include folders of [`include_dirs`].
pub fn compile_ptx(source: &str, (major, minor): (u32, u32)) -> Result<String, NvrtcError> {
    let arch = Output::Ptx.arch(major * 10 + minor);
    let compiled = compile(source, Output::Ptx, &arch, &include_dirs())?;
    String::from_utf8(compiled.image)
        .map_err(|_| NvrtcError::Call { call: "nvrtcGetPTX".into(), detail: "the PTX is not UTF-8 text".into() })
}

/// What to compile for a device of compute capability `XY`, given NVRTC's architectures: a
/// cubin when NVRTC knows the architecture, else PTX for the newest it knows below, which the
/// driver compiles for the device on load. An unknown list (an NVRTC too old to tell) means a
/// cubin.
pub fn choose(arch: u32, supported: Option<&[u32]>) -> Option<(Output, u32)> {
    match supported {
        None => Some((Output::Cubin, arch)),
        Some(list) if list.contains(&arch) => Some((Output::Cubin, arch)),
        Some(list) => list.iter().copied().filter(|&a| a < arch).max().map(|a| (Output::Ptx, a)),
    }
}

/// Compiles `source` for a device of compute capability `(major, minor)` (see [`choose`]),
/// with the include folders of [`include_dirs`].
pub fn compile_for_device(source: &str, (major, minor): (u32, u32)) -> Result<Compiled, NvrtcError> {
    let arch = major * 10 + minor;
    let supported = match supported_archs() {
        Ok(list) => Some(list),
        Err(NvrtcError::NotFound) => return Err(NvrtcError::NotFound),
        Err(_) => None,
    };
    let (output, target) = choose(arch, supported.as_deref()).ok_or_else(|| NvrtcError::Unsupported {
        major,
        minor,
        version: version_text(),
        supported: supported.clone().unwrap_or_default(),
    })?;
    compile(source, output, &output.arch(target), &include_dirs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_architectures_are_chosen_from_what_nvrtc_supports() {
        let list = [50, 60, 70, 75, 80, 86, 89, 90];
        assert_eq!(choose(90, Some(&list)), Some((Output::Cubin, 90)));
        assert_eq!(choose(87, Some(&list)), Some((Output::Ptx, 86)));
        assert_eq!(choose(120, Some(&list)), Some((Output::Ptx, 90)));
        assert_eq!(choose(35, Some(&list)), None);
        assert_eq!(choose(100, None), Some((Output::Cubin, 100)));
        assert_eq!(Output::Ptx.arch(90), "compute_90");
        assert_eq!(Output::Cubin.arch(120), "sm_120");
    }

    #[test]
    fn cuda_source_is_prepared_as_tvm_does() {
        let src = "#include <cuda.h>\n  #include <cuda.h>  \nextern \"C\" __global__ void k() {}\n";
        let out = prepare_source(src);
        assert!(out.starts_with(PREAMBLE));
        assert!(!out.contains("<cuda.h>"));
        assert!(!out.contains("CUtensorMap_st"));
        assert!(out.ends_with("extern \"C\" __global__ void k() {}"));
        assert!(prepare_source("void f(CUtensorMap m);").contains("struct alignas(64) CUtensorMap_st"));
        let opts = options("sm_90", &[PathBuf::from("/x/include")]);
        assert_eq!(opts[..3], ["--gpu-architecture=sm_90", "-default-device", "--device-int128"]);
        assert!(opts.contains(&"-I/x/include".to_owned()));
        assert_eq!(opts.last().map(String::as_str), Some("--use_fast_math"));
    }

    #[test]
    fn cuda_compile_errors_say_what_to_install() {
        let e = NvrtcError::NotFound.to_string();
        assert!(e.contains(LIBRARY) && e.contains("nvidia-cuda-nvrtc-cu12") && e.contains("LD_LIBRARY_PATH"), "{e}");
        let h = hint("tvm_kernels.cu(2): catastrophic error: could not open source file \"cuda/std/cstdint\"", &[]);
        assert!(h.contains("nvidia-cuda-cccl-cu12") && h.contains("CUDA_PATH"), "{h}");
        let long = "é".repeat(MAX_LOG);
        let cut = cut_log(long.clone());
        assert!(cut.len() < long.len() && cut.contains("more bytes of log"));
    }

    #[test]
    fn cuda_compile_without_nvrtc_is_a_typed_error() {
        if available() {
            // With NVRTC a bad source comes back with its log (the missing function's name, or
            // the libcu++ header when no include folder has it).
            let src = "extern \"C\" __global__ void k() { undeclared(); }";
            let e = compile(src, Output::Ptx, "compute_80", &include_dirs()).unwrap_err();
            match &e {
                NvrtcError::Compile(failure) => {
                    assert_eq!(failure.arch, "compute_80");
                    let (log, hint) = (&failure.log, &failure.hint);
                    assert!(log.contains("undeclared") || hint.contains("cccl"), "{log}");
                }
                other => panic!("{other}"),
            }
            assert!(compile("a\0b", Output::Ptx, "compute_80", &[]).is_err());
            return;
        }
        assert_eq!(compile_ptx("", (9, 0)), Err(NvrtcError::NotFound));
        assert_eq!(compile_for_device("", (9, 0)), Err(NvrtcError::NotFound));
        assert_eq!(supported_archs(), Err(NvrtcError::NotFound));
    }
}
