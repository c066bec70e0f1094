//! # mblob-capi: the C API of mblob
//!
//! Builds `libmblob.so` and `libmblob.a`; `include/mblob.h` declares what they export (made
//! by cbindgen from this crate, see `cbindgen.toml`; `tests/header.rs` checks it is current and
//! compiles as C99 and C++17). The README's "C API" section is the user's guide.
//!
//! The files, by job: `status.rs` (`mblob_status` and the errors on their way to it),
//! `call.rs` (one API call: panics caught, the last error, the handles given back),
//! `handle.rs` (the set of live handles and which calls use them), `args.rs` (reading C
//! strings and buffers), `dlpack.rs` (DLPack's structs and the conversions to and from
//! arrays), `library.rs` (loading, from a file or from memory, and calling a host function),
//! `model.rs` (models: inputs, runs, outputs, `mblob_model_invoke`), `llm.rs` (language
//! models: `mblob_llm_generate` of token ids), `tensor.rs` (tensors and
//! handing them out as DLPack); `inspect.rs` (feature `inspect`) the JSON report and
//! `emit.rs` (feature `emit`) writing libraries, the two parts that link the `mblob` crate
//! (without them the library is the runtime alone).
//!
//! This crate is an FFI edge, like `mblob_runtime::ffi`: every `unsafe` block in it reads a
//! pointer that a C caller handed over, and says in a `// SAFETY:` comment which documented
//! rule of the API makes it valid.
//!
//! The conventions, after wasmtime's, tract's and ONNX Runtime's C APIs:
//! - Opaque handles: [`mblob_library`], [`mblob_model`], [`mblob_llm`], [`mblob_tensor`] (and
//!   `mblob_export`). Each is made by one function and freed by one (`mblob_*_free`); freeing
//!   NULL does nothing.
//! - Every call returns an [`mblob_status`]; on an error, [`mblob_last_error`] gives the
//!   message (thread-local, valid until the next mblob call on that thread). Results come back
//!   through out-pointers, written only on success.
//! - No Rust panic crosses the boundary: each call runs under `catch_unwind`, and a panic is
//!   reported as [`mblob_status::MBLOB_ERR_PANIC`].
//! - Handles are checked against the set of live handles of their kind before use, so a NULL,
//!   freed or wrong-kind handle is an error ([`mblob_status::MBLOB_ERR_INVALID_HANDLE`]), not a
//!   crash: except when the allocator has reused a freed handle's address for a new handle of
//!   the same kind, which cannot be told apart.
//! - Threads: a library may be shared by any number of threads (models made from it on each);
//!   a model (or a language model) is used by one thread at a time (it may move between threads). This is enforced:
//!   a call on a model (or an export builder) that another call is using fails at once with
//!   [`mblob_status::MBLOB_ERR_STATE`] instead of waiting or corrupting it; a library or tensor
//!   may be read by several calls at once, but freeing one that a call is using fails the same
//!   way.
#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, missing_docs)]

mod args;
mod call;
mod dlpack;
#[cfg(feature = "emit")]
mod emit;
mod handle;
#[cfg(feature = "inspect")]
mod inspect;
mod library;
mod llm;
mod llm_options;
mod model;
mod status;
mod system;
mod tensor;

pub use call::{mblob_last_error, mblob_version};
pub use dlpack::{mblob_dl_device, mblob_dl_managed_tensor, mblob_dl_tensor, mblob_dtype};
#[cfg(feature = "emit")]
pub use emit::*;
#[cfg(feature = "inspect")]
pub use inspect::*;
pub use library::*;
pub use llm::*;
pub use llm_options::{mblob_llm_options, mblob_llm_options_init, MBLOB_LLM_UNSET};
pub use model::*;
pub use status::mblob_status;
pub use system::*;
pub use tensor::*;

// A library handle is shared across threads; a model or a tensor moves between them.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<library::mblob_library>();
    send::<model::mblob_model>();
    send::<llm::mblob_llm>();
    send_sync::<tensor::mblob_tensor>();
};
