//! The FFI edge: what talks to compiled code, and where most `unsafe` lives (besides the
//! device backends in [`crate::device`] and the library-loading entry points).
//!
//! What a user calls here (most programs need none of it: [`crate::exec::Model`] and
//! [`crate::exec::call()`] call compiled code safely):
//! - [`dlpack`]: DLPack's structs as compiled functions take them ([`dlpack::DLTensor`]).
//! - [`call`]: [`PackedFunction`], a function of a loaded library with its calling convention
//!   (or a Rust closure, [`PackedFunction::from_fn`]), called with [`Value`]s
//!   ([`PackedFunction::call`]) or with `DLTensor`s ([`call::call_packed`]).
//! - [`value`]: [`Value`], an argument or result as compiled code sees it.
//! - [`last_error`]: the calling thread's last error ([`last_error::last_error`]) and
//!   [`CallError`].
//! - [`globals`]: the global functions mblob provides by name (TVM's `tvm.contrib.sort.*`,
//!   ...) when no module of a tree has them, and [`globals::register_global`] for your own.
//! - [`threadpool`]: the thread count of parallel loops, per calling thread
//!   ([`threadpool::set_num_threads`]).
//!
//! Inside the crate, besides: opening libraries (or a system library's registered symbols)
//! and reading the blob from the loaded image; the context functions compiled code calls
//! back (errors, workspace, parallel loops, function lookup in the imports, calls); an AOT
//! model's `TVMMetadata`; the kernel calls every executor makes with `NdArray`s; with the
//! `system-lib` feature the registry of models linked into the program and TVM's runtime
//! names their code calls; and the shim of the runtime names a library imports.

pub mod call;
pub(crate) mod context;
pub mod dlpack;
pub mod globals;
pub(crate) mod kernel_call;
pub mod last_error;
pub(crate) mod library;
pub(crate) mod metadata;
pub(crate) mod shim;
#[cfg(feature = "system-lib")]
pub(crate) mod system_lib;
pub mod threadpool;
pub mod value;

pub use call::PackedFunction;
pub use last_error::CallError;
pub use metadata::MetadataError;
pub use value::Value;
