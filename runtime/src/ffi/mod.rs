//! The FFI edge: everything that talks to native code, and the only place with `unsafe`
//! (besides the read-only file mapping in `load.rs` and `Symbol`'s `Send`/`Sync`).
//!
//! - [`library`]: opening a shared library, reading its blob from the loaded image, and the
//!   library module that looks up its functions (each ABI's naming).
//! - [`packed`]: DLPack's structs, and the simplest call (tensors into a classic function).
//! - [`callconv`]: calling compiled functions in both of TVM's conventions (classic packed and
//!   tvm-ffi) with tensors and scalars.
//! - [`context`]: the context functions compiled code calls back (errors, workspace, parallel
//!   loops, function lookup in the imports, calls).
//! - [`threadpool`] and [`workspace`]: parallel loops and the memory kernels see.
//! - `shim`: the runtime functions a library imports by name (a small C library, opened
//!   globally before such a library).
//! - `cuda` (feature `cuda`): CUDA payloads on a GPU, through the driver API; `cuda_packed`
//!   its kernels as packed functions for host code.

pub mod callconv;
pub mod context;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_packed;
pub mod device_api;
pub mod library;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "opencl")]
pub mod opencl;
pub mod packed;
pub(crate) mod shim;
pub mod threadpool;
pub mod workspace;

pub use callconv::{Abi, PackedFunction, Value};
