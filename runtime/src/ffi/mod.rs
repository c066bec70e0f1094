//! The FFI edge: what talks to compiled code, and where most `unsafe` lives (besides the
//! device backends in [`crate::device`] and the library-loading entry points).
//!
//! - [`dlpack`]: DLPack's structs as compiled functions take them (`packed` is its old name,
//!   kept for users, with [`call::call_packed`] and [`last_error::last_error`]).
//! - [`last_error`]: the calling thread's last error, and [`CallError`].
//! - [`value`]: [`Value`] and its coding in TVM's two conventions.
//! - [`call`]: [`PackedFunction`] (native code with its convention, or a Rust closure) and
//!   [`call::PreparedCall`].
//! - [`library`]: opening a shared library, reading its blob from the loaded image, and the
//!   library module that looks up its functions (each ABI's naming).
//! - [`context`]: the context functions compiled code calls back (errors, workspace, parallel
//!   loops, function lookup in the imports, calls).
//! - [`metadata`]: an AOT model's `TVMMetadata`, copied out of the library.
//! - [`globals`]: the global functions mblob provides (TVM's `tvm.contrib.sort.*`, ...),
//!   found by name when no module has it.
//! - [`threadpool`]: parallel loops.
//! - `system_lib` (feature `system-lib`): the registry of models linked into the program
//!   (TVM's `system-lib` builds) and TVM's runtime names that their code calls.
//! - `shim`: the runtime functions a library imports by name (a small C library, opened
//!   globally before such a library).

pub mod call;
pub mod context;
pub mod dlpack;
pub mod globals;
pub mod kernel_call;
pub mod last_error;
pub mod library;
pub mod metadata;
pub(crate) mod shim;
#[cfg(feature = "system-lib")]
pub mod system_lib;
pub mod threadpool;
pub mod value;

pub use call::PackedFunction;
pub use last_error::CallError;
pub use value::Value;

/// DLPack's structs and the simplest call, by their old path (`mblob_runtime::packed`).
pub mod packed {
    pub use super::call::call_packed;
    pub use super::dlpack::*;
    pub use super::last_error::{last_error, CallError};
}
