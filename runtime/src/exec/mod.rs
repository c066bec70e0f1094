//! Running a loaded model. [`Model`] is the one handle: it holds a [`Runner`] (the graph
//! executor [`graph`], the AOT executor [`aot`], a Relax function run by [`relax`]'s VM, or a
//! Relay VM function [`relay_vm`]) on one device, and takes and gives [`Value`]s, whose
//! tensors are [`NdArray`](crate::NdArray)s. [`call()`] calls one host function of a plain
//! library.
//!
//! ```no_run
//! use mblob_runtime::exec::{Device, Model, Value};
//! use mblob_runtime::{load_library, LoadOptions, NdArray, Registry};
//!
//! // SAFETY: a library we trust to run.
//! let tree = unsafe { load_library("deploy.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut m = Model::new(&tree, Device::cpu(0))?;
//! let x = NdArray::from_f32(&[0.0; 4], &[1, 4], Device::cpu(0))?;
//! m.set_input(Some("x"), Value::Tensor(x))?;
//! m.run()?;
//! let y = m.outputs()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Parallel loops in the kernels use [`crate::ffi::threadpool`]: its thread count is set per
//! calling thread ([`crate::ffi::threadpool::set_num_threads`]).

pub mod aot;
pub mod call;
pub mod graph;
#[cfg(feature = "llm")]
pub mod llm;
pub mod relax;
#[cfg(feature = "relay-vm")]
pub(crate) mod relay_checks;
#[cfg(feature = "relay-vm")]
pub mod relay_vm;

mod error;
pub mod function;
mod graph_error;
mod kind;
pub mod model;
pub(crate) mod pool;
pub mod runner;
pub mod value;

pub use crate::device::{Device, DeviceType};
pub use call::call;
pub(crate) use error::{check_device_code, check_devices};
pub use error::{device_kinds, ExecError};
pub use graph_error::GraphError;
pub use kind::{ModelKind, TensorInfo};
pub use model::Model;
pub use runner::{Param, Runner};
pub use value::{ObjectRef, ParamKind, Value};
