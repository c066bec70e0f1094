//! # mblob
//!
//! The emit side of mblob: TVM's `export_library`, `_PackImportsToLLVM` and
//! `_PackImportsToC` in Rust. A module tree (see [`mblob_runtime::ModuleTree`]) is serialized
//! byte for byte as TVM does, packed into an object (with LLVM, or through generated C), and
//! linked with the host objects into one shared library that TVM and
//! [`mblob_runtime::load_library`] both load.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod demo;
mod error;
pub mod export;
pub mod link;
pub mod pack;
pub mod tool;
pub mod tree_json;

pub use error::{Error, Result};
pub use mblob_runtime as runtime;
