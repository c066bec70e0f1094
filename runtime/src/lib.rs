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
//!     format::DataType,
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
//! Running what TVM built: [`load_library`] opens the library (its code runs, so it is
//! `unsafe`: load only what you trust) and [`exec::Model`] runs whichever model it holds (graph,
//! AOT, Relax, Relay VM) on a device, with [`exec::Value`]s in and out. Here TVM 0.19's
//! `relay.build` of a dense + relu layer, against TVM's own output:
//!
//! ```
//! use mblob_runtime::exec::{Model, Value};
//! use mblob_runtime::{format::DataType, load_library, Device, LoadOptions, NdArray, Registry};
//!
//! let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens");
//! let f32s = |name: &str| -> Vec<u8> { std::fs::read(goldens.join(name)).unwrap() };
//! // SAFETY: a library TVM built for this test suite.
//! let tree = unsafe { load_library(&goldens.join("graph_dense_relu.so"), &Registry::default(), &LoadOptions::default()) }?;
//! let mut model = Model::new(&tree, Device::cpu(0))?;
//! let x = model.params()[0].tensor.clone().unwrap();
//! let input = NdArray::from_bytes(&f32s("graph_dense_relu.in.x.f32"), &x.shape, DataType::F32, Device::cpu(0))?;
//! model.set_input(Some("x"), Value::Tensor(input))?;
//! model.run()?;
//! let out = model.outputs()?[0].to_array()?.unwrap().to_bytes()?;
//! assert!(out == f32s("graph_dense_relu.out.0.f32"), "TVM's output, bit for bit");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Public API
//!
//! The entry points, by task (the modules hold more, each item documented; these are what a
//! program calls):
//!
//! | task | what to call |
//! |---|---|
//! | load what TVM exported | [`load_library`] (`unsafe`: the library's code runs), [`load_library_bytes`], [`load_blob`] (a blob in memory), `load_system_lib` (feature `system-lib`: a model linked into the program), with [`LoadOptions`] and a [`Registry`] of payload loaders |
//! | look at what loaded | [`LoadedTree`]: [`LoadedTree::type_keys`], [`LoadedTree::find`] (a payload by type), [`LoadedTree::get_function`], [`LoadedTree::depth_first`] |
//! | run a model (graph, AOT, Relax, Relay VM) | [`exec::Model`]: [`exec::Model::new`], [`exec::Model::params`], [`exec::Model::set_input`], [`exec::Model::run`], [`exec::Model::outputs`]; values are [`exec::Value`]s, tensors [`NdArray`]s on a [`Device`] |
//! | call one host function | [`exec::call()`] (safe, with `Value`s); [`ffi::PackedFunction::call`] (`unsafe`, TVM's own values) |
//! | run a Relax VM | [`exec::relax::VirtualMachine`]: [`new`](exec::relax::VirtualMachine::new), [`invoke`](exec::relax::VirtualMachine::invoke), [`functions`](exec::relax::VirtualMachine::functions) |
//! | run a Relay VM (feature `relay-vm`) | `exec::relay_vm::RelayVm` (or [`exec::Model`]) |
//! | generate with a language model (feature `llm`) | `exec::llm::LanguageModel`: `new`, `generate`, `generate_sampled`, `generate_batch` |
//! | build a module tree, serialize it as TVM does | [`ModuleTree`], [`serialize()`], [`Serialized::to_blob`]; a kind of your own: [`Payload`] and [`Loader`] |
//! | inspect without running | [`elf::find_blob`], [`container`] (Mach-O, PE/COFF, wasm, archives), [`format::detect`], [`format::convention::classify`] |
//! | errors | [`Error`] (loading), [`exec::ExecError`] (running), [`exec::relax::VmError`] (the Relax VM) |
//!
//! A host function of a plain library, called safely: TVM 0.19's `add_one` writes `B = A + 1`:
//!
//! ```
//! use mblob_runtime::exec::{self, Value};
//! use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};
//!
//! let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens");
//! let f32s = |name: &str| -> Vec<f32> {
//!     std::fs::read(goldens.join(name)).unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
//! };
//! // SAFETY: a library TVM built for this test suite.
//! let tree = unsafe { load_library(&goldens.join("dso_add_one.so"), &Registry::default(), &LoadOptions::default()) }?;
//! let a = NdArray::from_f32(&f32s("dso_add_one.in.A.f32"), &[4], Device::cpu(0))?;
//! let b = NdArray::from_f32(&[0.0; 4], &[4], Device::cpu(0))?;
//! let mut args = [Value::Tensor(a), Value::Tensor(b)];
//! exec::call(&tree, "add_one", &mut args)?;
//! assert_eq!(args[1].as_tensor().unwrap().to_f32()?.unwrap(), f32s("dso_add_one.out.B.f32"), "TVM's output");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A Relax VM: TVM 0.19's `main(x, y) = (x + y) * 2`, against TVM's output:
//!
//! ```
//! use mblob_runtime::exec::relax::VirtualMachine;
//! use mblob_runtime::exec::Value;
//! use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};
//!
//! let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens");
//! let f32s = |name: &str| -> Vec<f32> {
//!     std::fs::read(goldens.join(name)).unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
//! };
//! // SAFETY: a library TVM built for this test suite.
//! let tree = unsafe { load_library(&goldens.join("relax_add_mul.so"), &Registry::default(), &LoadOptions::default()) }?;
//! let vm = VirtualMachine::new(&tree, Device::cpu(0))?;
//! assert_eq!(vm.functions()[0].params, ["x", "y"]);
//! let x = NdArray::from_f32(&f32s("relax_add_mul.in.x.f32"), &[2, 3], Device::cpu(0))?;
//! let y = NdArray::from_f32(&f32s("relax_add_mul.in.y.f32"), &[2, 3], Device::cpu(0))?;
//! let out = vm.invoke("main", &[Value::Tensor(x), Value::Tensor(y)])?;
//! assert_eq!(out.as_tensor().unwrap().to_f32()?.unwrap(), f32s("relax_add_mul.out.0.f32"), "TVM's output");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Generating with a language model is in `exec::llm` (feature `llm`), with an example there.
//!
//! The TVM version is one axis, [`Layout`]: the blob's layout and symbol, the calling
//! convention of the host code ([`format::convention::classify`] tells it from the symbols),
//! the numbering of a Relax executable's constants and its type key all follow from it.
//!
//! Parts, each depending only on those before it (`runtime/tests/layering.rs` checks):
//! - `Bytes` (shared views of a mapping) and [`format`](mod@format), the floor: the byte
//!   layouts ([`format::stream`], [`format::dtype`], [`format::classic`], [`format::ffi`],
//!   [`format::detect`]) and nothing above them.
//! - [`device`]: [`Device`] (`tvm.cpu(0)`, `tvm.opencl(1)`, ...) and [`DeviceError`], the
//!   [`device::DeviceApi`] trait with its backend table, [`device::Storage`] and the CPU's
//!   memory; above the FFI edge, the GPU backends (`device::opencl`, `device::cuda`) and the
//!   kernel-argument plan they share.
//! - [`payload`]: payload kinds and their codecs ([`payload::graph`], [`payload::device`],
//!   [`payload::RawPayload`]); [`module`]: loaded modules and the [`LoadedTree`], with the one
//!   lookup through the imports ([`LoadedTree::depth_first`], `LoadedTree::lookup`).
//! - [`ffi`]: the FFI edge: DLPack's structs, values in TVM's two calling conventions,
//!   [`ffi::PackedFunction`] (which knows its convention: [`Module::get_function`] returns
//!   one), opening libraries, the context functions compiled code calls back, the thread pool.
//! - [`array`](mod@array): [`NdArray`], the one tensor of the run side (storage on a device, shape,
//!   dtype).
//! - [`tree`] and [`serialize`](mod@serialize): the module tree before export, and TVM's
//!   numbering of it.
//! - [`registry`]: loaders keyed by type key, and the registration of every built-in kind.
//! - [`load_library`] and [`load_blob`]: loading into a [`LoadedTree`], each payload decoded
//!   once; [`elf`]: finding a blob in an ELF file without running it.
//! - [`exec`]: the graph and AOT executors, TVM's Relax VM ([`exec::relax`]), and
//!   [`exec::Model`], one handle on whichever a library holds, on a device.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod array;
mod bytes;
pub mod container;
pub mod device;
pub mod elf;
mod error;
pub mod exec;
pub mod ffi;
pub mod format;
mod load;
pub mod module;
pub mod ops;
pub mod payload;
pub mod registry;
pub mod serialize;
pub mod tree;

pub use array::NdArray;
pub use bytes::Bytes;
pub use device::{Device, DeviceError, DeviceType};
#[cfg(feature = "system-lib")]
pub use error::SystemLibError;
pub use error::{Error, FormatError, FormatErrorKind, Result};
pub use ffi::library::{LibraryModule, LIBRARY_TYPE_KEY};
pub use format::{ImportTree, Layout, ParsedBlob, UnknownKeys};
#[cfg(feature = "system-lib")]
pub use load::load_system_lib;
pub use load::{load_blob, load_library, load_library_bytes, map_file, LoadOptions};
pub use module::{LoadedModule, LoadedTree, Module, Origin, Symbol, TreeShape};
pub use payload::{Payload, RawPayload};
pub use registry::{Loader, LoaderError, Measure, Registry};
pub use serialize::{serialize, Group, SerializeError, Serialized};
pub use tree::{ModuleId, ModuleKind, ModuleTree};
