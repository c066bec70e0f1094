//! The FFI edge: everything that talks to native code, and where `unsafe` lives (besides the
//! read-only file mapping in `load.rs`, `Symbol`'s `Send`/`Sync`, and the executors' calls of
//! compiled kernels and AOT metadata reads in `exec/`, each with its SAFETY comment).
//!
//! - [`library`]: opening a shared library, reading its blob from the loaded image, and the
//!   library module that looks up its functions (each ABI's naming).
//! - [`packed`]: DLPack's structs, and the simplest call (tensors into a classic function).
//! - [`callconv`]: calling compiled functions in both of TVM's conventions (classic packed and
//!   tvm-ffi) with tensors and scalars.
//! - [`context`]: the context functions compiled code calls back (errors, workspace, parallel
//!   loops, function lookup in the imports, calls).
//! - [`globals`]: the global functions mblob provides (TVM's `tvm.contrib.sort.*`, ...),
//!   found by name when no module has it.
//! - [`threadpool`] and [`workspace`]: parallel loops and the memory kernels see.
//! - `shim`: the runtime functions a library imports by name (a small C library, opened
//!   globally before such a library).
//! - [`device_api`]: the device API (memory, copies, workspace, synchronization) of each
//!   device, the CPU's here, and `Storage`, an owned allocation on a device.
//! - `opencl` (feature `opencl`): OpenCL memory and OpenCL modules (programs built per
//!   device, kernels launched with TVM's launch parameters), through opencl3.
//! - `cuda` (feature `cuda`): CUDA memory and CUDA modules through the driver API;
//!   `cuda_packed` its kernels as packed functions for host code; `nvrtc` the compilation of
//!   TVM's CUDA source.

pub mod callconv;
pub mod context;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_packed;
pub mod device_api;
pub mod globals;
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
