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
pub mod call;
pub mod graph;
#[cfg(feature = "llm")]
pub mod llm;
pub mod relax;
#[cfg(feature = "relay-vm")]
pub mod relay_vm;

pub mod model;
pub(crate) mod pool;

pub use crate::device::{Device, DeviceType};
use crate::format::DataType;
pub use crate::payload::graph::Tensor;
pub use model::{Model, ModelKind, Output};

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
    /// The model cannot run on this device: built for another, or an executor or kernel kind
    /// mblob runs on the CPU only.
    #[error("not supported on {device}: {detail}")]
    UnsupportedDevice {
        /// The device asked for.
        device: Device,
        /// Why.
        detail: String,
    },
    /// The device failed (no driver, out of memory, a copy, a kernel that does not build).
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    /// A tensor could not be made or copied.
    #[error(transparent)]
    Array(#[from] crate::array::ArrayError),
    /// An input name the model does not have.
    #[error("no input named `{name}` (inputs: {})", known.join(", "))]
    UnknownInput {
        /// The name given.
        name: String,
        /// The model's inputs.
        known: Vec<String>,
    },
    /// Inputs a run needs that were not given.
    #[error("missing inputs: {}", names.join(", "))]
    MissingInputs {
        /// Their names.
        names: Vec<String>,
    },
    /// A Relax model has no function of that name.
    #[error("no VM function `{name}` (functions: {})", known.join(", "))]
    NoFunction {
        /// The name given.
        name: String,
        /// The model's functions.
        known: Vec<String>,
    },
    /// The Relax VM failed.
    #[error(transparent)]
    Relax(Box<relax::VmError>),
    /// The Relay VM failed.
    #[cfg(feature = "relay-vm")]
    #[error(transparent)]
    RelayVm(Box<relay_vm::RelayVmError>),
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

/// Checks that executors that run on the CPU alone (AOT) were asked for the CPU.
pub(crate) fn check_devices(devices: &[Device], executor: &str) -> Result<(), ExecError> {
    match devices {
        [] => Err(ExecError::UnsupportedDevice { device: Device::cpu(0), detail: "no device given".into() }),
        ds => match ds.iter().find(|d| !d.is_cpu()) {
            Some(d) => Err(ExecError::UnsupportedDevice {
                device: *d,
                detail: format!("mblob runs {executor} models on the CPU only"),
            }),
            None => Ok(()),
        },
    }
}

/// Refuses to build an executor on `device` for a library whose device code is for another
/// kind of device (a model built for OpenCL asked to run on CUDA, or on the CPU), or that
/// mblob cannot run (Vulkan, Metal, WebGPU, ...).
pub(crate) fn check_device_code(
    tree: &crate::module::LoadedTree,
    index: usize,
    device: Device,
) -> Result<(), ExecError> {
    let kinds = device_kinds(tree, index);
    if !matches!(device.device_type, DeviceType::Cpu | DeviceType::Cuda | DeviceType::OpenCl) {
        return Err(ExecError::UnsupportedDevice {
            device,
            detail: "mblob runs models on cpu, opencl and cuda devices".into(),
        });
    }
    if kinds.is_empty() && !device.is_cpu() {
        return Err(ExecError::UnsupportedDevice {
            device,
            detail: "the model holds no device code: it was built for the CPU".into(),
        });
    }
    if let Some(&kind) = kinds.iter().find(|&&k| k != device.device_type) {
        let built = kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ");
        return Err(ExecError::UnsupportedDevice {
            device,
            detail: if matches!(kind, DeviceType::Cuda | DeviceType::OpenCl) {
                format!("the model was built for {built} (run it on {kind})")
            } else {
                format!("the model holds {kind} kernels, which mblob loads and inspects but cannot run")
            },
        });
    }
    Ok(())
}

/// The kinds of device code module `from` reaches through its imports, each once, in
/// lookup order.
pub fn device_kinds(tree: &crate::module::LoadedTree, from: usize) -> Vec<DeviceType> {
    let mut kinds = Vec::new();
    for i in tree.depth_first(from) {
        if let Some(k) = DeviceType::of_module_key(tree.modules()[i].module.type_key()) {
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
    }
    kinds
}
