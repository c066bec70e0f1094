//! # mblob
//!
//! The emit side of mblob: TVM's `export_library`, `_PackImportsToLLVM` and
//! `_PackImportsToC` in Rust. A module tree (see [`mblob_runtime::ModuleTree`]) is serialized
//! byte for byte as TVM does, packed into an object (with LLVM, or through generated C), and
//! linked with the host objects into one shared library that TVM and
//! [`mblob_runtime::load_library`] both load.
//!
//! The parts: [`export::Export`] (TVM's `export_library`: a module tree, host objects, C
//! sources or LLVM IR in, one shared library out, by the `direct`, `llvm` or `c` route),
//! [`pack`] (the blob object alone, TVM's `_PackImportsToLLVM`/`_PackImportsToC`, and the
//! checks of what a layout's TVM can call: [`pack::abi`]), [`inspect`] (what a library, a raw
//! blob or a tar holds, read without running it), [`tree_json`] (TREE.json, the tree as files),
//! [`repack`] and [`tvm_tar`] (libraries, blob objects and TVM's tars read back), and [`link`]
//! and [`tool`] (the compilers and linkers). Errors are one [`Error`], by cause.
//!
//! TVM 0.19's `relay.build` of a dense + relu layer, exported again from its graph, its
//! parameters and its host object (`lib0.o`), holds the blob TVM wrote, byte for byte:
//!
//! ```
//! use mblob::export::Export;
//! use mblob::runtime::{exec::graph::read_params, payload::graph::GraphExecutorFactory, Bytes, Layout, ModuleTree};
//!
//! let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens");
//! let graph = std::fs::read_to_string(goldens.join("graph_dense_relu.graph.json"))?;
//! let params = read_params(&Bytes::from_vec(std::fs::read(goldens.join("graph_dense_relu.params"))?))?;
//! let dir = tempfile::tempdir()?;
//! let so = dir.path().join("model.so");
//! // As `relay.build` makes it: the factory at the root, importing the host library.
//! let mut tree = ModuleTree::new();
//! let factory = tree.add_payload(GraphExecutorFactory::new(graph, params, "default"));
//! let host = tree.add_dso("llvm");
//! tree.import(factory, host);
//! let mut export = Export::from_tree(tree);
//! export.layout(Layout::Classic).object(goldens.join("graph_dense_relu.lib0.o"));
//! export.write(&so)?;
//!
//! let report = mblob::inspect::inspect_path(&so, &Default::default())?;
//! assert_eq!(report.layout, Some("classic"));
//! assert_eq!(report.type_keys, ["GraphExecutorFactory", "_lib", "_import_tree"]);
//! let data = std::fs::read(&so)?;
//! let found = mblob::runtime::elf::find_blob(&data, None)?.unwrap();
//! assert!(found.bytes(&data).unwrap() == std::fs::read(goldens.join("graph_dense_relu.blob"))?, "TVM's blob");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
