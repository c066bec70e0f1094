//! Executors: run a loaded model. [`graph`] is TVM's graph executor, [`aot`] its AOT executor
//! (packed interface); both take and give [`Tensor`]s, and implement [`Executor`]. [`relax`] is
//! TVM's Relax VM (functions called with tensors, tensors returned).
//!
//! ```no_run
//! use mblob_runtime::exec::{graph::GraphFactory, Device, Executor};
//! use mblob_runtime::{load_library, LoadOptions, Registry};
//! # fn input() -> mblob_runtime::payload::graph::Tensor { unimplemented!() }
//!
//! // SAFETY: a library we trust to run.
//! let tree = unsafe { load_library("deploy.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut m = GraphFactory::from_tree(&tree)?.default(&[Device::cpu(0)])?;
//! m.set_input_by_name("x", &input())?;
//! m.run()?;
//! let y = m.get_output(0)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Parallel loops in the kernels use [`crate::ffi::threadpool`]: its thread count is set per
//! calling thread ([`crate::ffi::threadpool::set_num_threads`]).

pub mod aot;
pub mod graph;
pub mod relax;

use crate::format::DataType;
pub use crate::payload::graph::Tensor;

/// A device, as `tvm.cpu(0)` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// DLPack device type: 1 for CPU.
    pub device_type: i32,
    /// Ordinal.
    pub device_id: i32,
}

impl Device {
    /// The CPU.
    pub fn cpu(id: i32) -> Device {
        Device { device_type: 1, device_id: id }
    }
}

/// Name, shape and dtype of an input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name (outputs of a graph are named by position: `output_0`, ...).
    pub name: String,
    /// The shape.
    pub shape: Vec<i64>,
    /// The element type.
    pub dtype: DataType,
}

/// Errors of the executors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The graph JSON is malformed or inconsistent.
    #[error("graph JSON: {0}")]
    Graph(String),
    /// A params file or factory param is malformed.
    #[error("params: {0}")]
    Params(String),
    /// The loaded tree has no module of the kind asked for.
    #[error("{0}")]
    NoFactory(String),
    /// Only the CPU is supported here.
    #[error("unsupported device {device_type}:{device_id} ({detail})")]
    UnsupportedDevice {
        /// DLPack device type.
        device_type: i32,
        /// Ordinal.
        device_id: i32,
        /// Where it was asked for.
        detail: String,
    },
    /// An input name the model does not have.
    #[error("no input named `{name}` (inputs: {})", known.join(", "))]
    UnknownInput {
        /// The name given.
        name: String,
        /// The model's inputs.
        known: Vec<String>,
    },
    /// An input or output index out of range.
    #[error("{what} index {index} is out of range (there are {count})")]
    Index {
        /// `input` or `output`.
        what: &'static str,
        /// The index given.
        index: usize,
        /// How many there are.
        count: usize,
    },
    /// A tensor whose shape or dtype differs from what the model takes.
    #[error("input `{name}`: expected {expected_dtype} {expected_shape:?}, got {dtype} {shape:?}")]
    InputMismatch {
        /// The input.
        name: String,
        /// What the model takes.
        expected_dtype: DataType,
        /// What the model takes.
        expected_shape: Vec<i64>,
        /// What was given.
        dtype: DataType,
        /// What was given.
        shape: Vec<i64>,
    },
    /// A function the model calls is in none of the loaded modules.
    #[error("node `{node}`: no function `{function}` in the loaded modules")]
    MissingFunction {
        /// The graph node.
        node: String,
        /// The function.
        function: String,
    },
    /// A kernel returned an error (its own assert text when it reported one).
    #[error("node `{node}`: `{function}` failed: {message}")]
    Kernel {
        /// The graph node (or `__tvm_main__` for AOT).
        node: String,
        /// The function.
        function: String,
        /// What the kernel reported.
        message: String,
    },
    /// Memory for the model's tensors could not be allocated.
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc {
        /// Size asked for.
        bytes: u64,
        /// What for.
        what: String,
    },
    /// The AOT metadata the library returns is unusable.
    #[error("AOT metadata: {0}")]
    Metadata(String),
}

/// What both executors offer (TVM's module-based model interface).
pub trait Executor {
    /// The inputs a caller sets (parameters excluded), in order.
    fn inputs(&self) -> Vec<TensorInfo>;
    /// The outputs, in order.
    fn outputs(&self) -> Vec<TensorInfo>;
    /// Copies `tensor` into the input called `name`; an unknown name, or a shape or dtype that
    /// differs from the model's, is an error.
    fn set_input_by_name(&mut self, name: &str, tensor: &Tensor) -> Result<(), ExecError>;
    /// Runs the model once.
    fn run(&mut self) -> Result<(), ExecError>;
    /// A copy of output `index`.
    fn get_output(&self, index: usize) -> Result<Tensor, ExecError>;
    /// The number of outputs.
    fn num_outputs(&self) -> usize {
        self.outputs().len()
    }
    /// The number of inputs a caller sets.
    fn num_inputs(&self) -> usize {
        self.inputs().len()
    }
    /// The position in [`Executor::inputs`] of the input that [`Executor::set_input_by_name`]
    /// sets for `name` (an AOT model also answers to the names it was built with, before TVM
    /// sanitized them), or `None`.
    fn input_index(&self, name: &str) -> Option<usize> {
        self.inputs().iter().position(|i| i.name == name)
    }
}

/// Builds the executor for what `tree` holds: a graph factory or an AOT factory.
pub fn executor(tree: &crate::module::LoadedTree, devices: &[Device]) -> Result<Box<dyn Executor + Send>, ExecError> {
    if tree.find::<crate::payload::graph::GraphExecutorFactory>().is_some() {
        return Ok(Box::new(graph::GraphFactory::from_tree(tree)?.default(devices)?));
    }
    if tree.modules().iter().any(|m| m.module.type_key() == aot::AOT_EXECUTOR_FACTORY) {
        return Ok(Box::new(aot::AotFactory::from_tree(tree)?.default(devices)?));
    }
    Err(ExecError::NoFactory(format!(
        "the library holds no GraphExecutorFactory or AotExecutorFactory (modules: {})",
        tree.type_keys().join(", ")
    )))
}

/// Bytes of a tensor of `dtype` and `shape` as TVM counts them (`(bits * lanes + 7) / 8` per
/// element), or `None` on overflow or a negative extent.
pub(crate) fn tensor_bytes(dtype: DataType, shape: &[i64]) -> Option<u64> {
    let per = (u64::from(dtype.bits) * u64::from(dtype.lanes)).div_ceil(8);
    shape.iter().try_fold(per, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

pub(crate) fn check_devices(devices: &[Device]) -> Result<(), ExecError> {
    match devices {
        [] => Err(ExecError::UnsupportedDevice { device_type: 0, device_id: 0, detail: "no device given".into() }),
        ds => match ds.iter().find(|d| d.device_type != 1) {
            Some(d) => Err(ExecError::UnsupportedDevice {
                device_type: d.device_type,
                device_id: d.device_id,
                detail: "mblob runs graph and AOT models on the CPU (kDLCPU = 1)".into(),
            }),
            None => Ok(()),
        },
    }
}
