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
//! # Public API
//!
//! The entry points, by task:
//!
//! | task | what to call |
//! |---|---|
//! | export a library (TVM's `export_library`) | [`export::Export`]: [`new`](export::Export::new) or [`from_tree`](export::Export::from_tree), then [`object`](export::Export::object), [`c_source`](export::Export::c_source), [`import`](export::Export::import), [`layout`](export::Export::layout), [`backend`](export::Export::backend) ([`export::Backend`]), [`target`](export::Export::target), [`system_lib`](export::Export::system_lib), and [`write`](export::Export::write) (`.so`, `.dylib`, `.dll`, `.tar`, `.a`), which gives an [`export::ExportReport`]; [`export::write_bundle`] for several system-lib models in one archive |
//! | pack the blob object alone (`_PackImportsToLLVM`, `_PackImportsToC`) | `pack::llvm::write_object` (feature `llvm`), [`pack::c::write_source`] and [`pack::c::compile`], with [`pack::PackOptions`] and [`pack::CStyle`]; [`pack::c::write_tvm_text`] writes TVM's C text; [`pack::abi::detect`] tells a host object's calling convention, [`pack::host::called_functions`] what a tree calls |
//! | inspect without running | [`inspect::inspect_path`] (a library, blob object, raw blob, tar or archive) or [`inspect::inspect_bytes`], giving an [`inspect::Report`] |
//! | read libraries and TVM's files back | [`repack::read_module_tree`], [`repack::read_blob`], [`tvm_tar::TvmTar`], [`tree_json::read_tree_json`] (TREE.json, the tree as files) |
//! | link and compile | [`link`] and [`tool`] (what [`export::Export`] runs) |
//! | load and run | [`runtime`] (the `mblob-runtime` crate, re-exported) |
//! | errors | [`Error`], one per cause, [`with_causes`] for the whole chain as text |
//!
//! The blob object through generated C, TVM's text byte for byte (TVM 0.19's `devc.c` of the
//! same blob):
//!
//! ```
//! use mblob::pack::{c, PackOptions};
//! use mblob::runtime::Layout;
//!
//! let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens");
//! let blob = std::fs::read(goldens.join("graph_dense_relu.blob"))?;
//! let opts = PackOptions { layout: Layout::Classic, prefix: String::new(), system_lib: false, target: None };
//! let mut text = Vec::new();
//! c::write_tvm_text(&blob[..], &opts, &mut text)?;
//! assert!(text == std::fs::read(goldens.join("graph_dense_relu.devc.c"))?, "TVM's devc.c");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Exporting and inspecting, from TVM 0.19's `relay.build` of a dense + relu layer (its graph,
//! parameters and host object `lib0.o`), gives the blob TVM wrote, byte for byte:
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
