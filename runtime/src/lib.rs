//! # mblob-runtime
//!
//! The load side of [mblob](https://crates.io/crates/mblob): TVM's packed-module blob format
//! (reader and writer, in every layout from TVM 0.6 to tvm-ffi), the module tree, TVM's
//! serializer, the registry of payload loaders and the library module. A deployed program
//! depends on this crate alone; it has no LLVM.
//!
//! ```
//! use mblob_runtime::{
//!     load_blob, serialize, Bytes, Layout, LoadOptions, ModuleTree, Registry,
//!     payload::graph::{GraphExecutorFactory, Tensor},
//!     format::stream::DataType,
//! };
//!
//! // A graph factory that imports the host library, as `relay.build(...)` makes it.
//! let weights: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|f| f.to_le_bytes()).collect();
//! let p0 = Tensor::new(DataType::F32, vec![3], weights).unwrap();
//! let mut tree = ModuleTree::new();
//! let root = tree.add_payload(GraphExecutorFactory::new("{}", vec![("p0".into(), p0)], "default"));
//! let host = tree.add_dso("llvm");
//! tree.import(root, host);
//!
//! // Serialize as TVM 0.19 would, then load the bytes back.
//! let blob = serialize(&tree)?.to_blob(&tree, Layout::Classic)?;
//! let loaded = load_blob(&Bytes::from_vec(blob), Layout::Classic, &Registry::default(), &LoadOptions::default())?;
//! assert_eq!(loaded.type_keys(), ["GraphExecutorFactory", "library"]);
//! let factory = loaded.find::<GraphExecutorFactory>().unwrap();
//! assert_eq!(factory.param("p0").unwrap().to_f32().unwrap(), [1.0, 2.0, 3.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Parts:
//! - [`format`](mod@format): the byte layouts ([`format::stream`], [`format::classic`], [`format::ffi`]).
//! - [`tree`] and [`serialize`](mod@serialize): the module tree before export, and TVM's numbering of it.
//! - [`payload`]: payload kinds ([`payload::graph`], [`payload::device`], [`payload::Opaque`]).
//! - [`registry`]: loaders keyed by type key.
//! - [`load_library`] and [`load_blob`]: loading into a [`LoadedTree`].
//! - [`elf`]: finding a blob in an ELF file without running it.
//! - [`ffi`]: calling compiled code (both of TVM's conventions), the context functions, the
//!   thread pool and workspace memory; [`exec`]: the graph and AOT executors and
//!   ([`exec::relax`]) TVM's Relax VM.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod bytes;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod elf;
mod error;
pub mod exec;
pub mod ffi;
pub mod format;
mod library;
mod load;
mod module;
pub mod packed;
pub mod payload;
pub mod registry;
pub mod serialize;
pub mod tree;

pub use bytes::Bytes;
pub use error::{Error, FormatError, FormatErrorKind, Result};
pub use format::{ImportTree, Layout, ParsedBlob, UnknownKeys};
pub use library::{LibraryModule, LIBRARY_TYPE_KEY};
pub use load::{load_blob, load_library, map_file, LoadOptions};
pub use module::{LoadedModule, LoadedTree, Module, Origin, Symbol, TreeShape};
pub use payload::{Opaque, Payload};
pub use registry::{Loader, LoaderError, Measure, Registry};
pub use serialize::{serialize, Group, SerializeError, Serialized};
pub use tree::{ModuleId, ModuleKind, ModuleTree};
