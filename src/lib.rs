//! # mblob
//!
//! The emit side of mblob: TVM's `export_library`, `_PackImportsToLLVM` and
//! `_PackImportsToC` in Rust. A module tree (see [`mblob_runtime::ModuleTree`]) is serialized
//! byte for byte as TVM does, packed into an object (with LLVM, or through generated C), and
//! linked with the host objects into one shared library that TVM and
//! [`mblob_runtime::load_library`] both load.
//!
//! The `mblob` command-line program is built from this package's binary (the `cli` feature,
//! on by default); it is not part of the library, so a crate that depends on `mblob` with
//! `default-features = false` compiles neither clap nor tracing-subscriber.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod error;
pub mod export;
pub mod inspect;
pub mod link;
pub mod pack;
pub mod repack;
pub mod tool;
pub mod tree_json;
pub mod tvm_tar;

pub use error::{with_causes, Detail, Error, Result};
pub use mblob_runtime as runtime;
