//! The FFI edge: everything that talks to native code, and the only place with `unsafe`
//! (besides the read-only file mapping in `load.rs` and `Symbol`'s `Send`/`Sync`).
//!
//! - [`library`]: opening a shared library, reading its blob from the loaded image, and the
//!   library module that looks up its functions.
//! - [`packed`]: TVM's calling convention for compiled host functions, and the context
//!   functions a loader hands to the library.
//! - `cuda` (feature `cuda`): CUDA payloads on a GPU, through the driver API.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod library;
pub mod packed;
