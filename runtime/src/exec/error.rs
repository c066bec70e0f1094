//! [`ExecError`], the error of the run floor, and the device checks every runner makes: a leaf
//! of `exec` (it names the VMs' errors, never the runners).

use super::kind::ModelKind;
use crate::device::{Device, DeviceType};
use crate::format::DataType;

/// Errors of the executors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The graph JSON is malformed or inconsistent: the cause, naming where (also the
    /// source).
    #[error("graph JSON: {0}")]
    Graph(#[source] super::graph_error::GraphError),
    /// A params file (`save_param_dict`) does not read: its bytes end early or hold a length
    /// past the end (the offset is in the source).
    #[error("params: {0}")]
    Params(#[source] crate::format::FormatError),
    /// A params file does not start with TVM's params magic.
    #[error("params: magic is {found:#018x}, expected {expected:#018x}")]
    ParamsMagic {
        /// The magic read.
        found: u64,
        /// TVM's (`kTVMNDArrayListMagic`).
        expected: u64,
    },
    /// A params file has another number of names than of tensors.
    #[error("params: {names} names but {tensors} tensors")]
    ParamsCount {
        /// The names.
        names: usize,
        /// The tensors.
        tensors: usize,
    },
    /// A param of a graph's params differs from the graph's input of that name.
    #[error("params: param `{name}` is {dtype} {shape:?}, the graph's input `{name}` is {expected_dtype} {expected_shape:?}")]
    ParamMismatch {
        /// The param.
        name: String,
        /// What the graph takes.
        expected_dtype: DataType,
        /// What the graph takes.
        expected_shape: Vec<i64>,
        /// What the params hold.
        dtype: DataType,
        /// What the params hold.
        shape: Vec<i64>,
    },
    /// A param of the factory could not be set.
    #[error("params: param `{name}`: {source}")]
    Param {
        /// The param.
        name: String,
        /// Why.
        source: Box<ExecError>,
    },
    /// The library holds no model (no graph or AOT factory, Relax or Relay VM executable).
    #[error("the library holds no GraphExecutorFactory, AotExecutorFactory, Relax executable or Relay VM executable (modules: {})", modules.join(", "))]
    NoModel {
        /// The type keys of the library's modules.
        modules: Vec<String>,
    },
    /// The loaded tree has no factory of the kind asked for.
    #[error("no {kind} in the tree ({})", modules.join(", "))]
    NoFactory {
        /// The factory's type key.
        kind: &'static str,
        /// The type keys of the tree's modules.
        modules: Vec<String>,
    },
    /// A factory's payload is malformed.
    #[error("malformed {kind} payload: {source}")]
    Payload {
        /// The factory's type key.
        kind: &'static str,
        /// What is wrong.
        source: crate::format::FormatError,
    },
    /// A factory's payload is not the kind its loader makes (a registry that reads it
    /// another way).
    #[error("the {kind} module is not the payload kind mblob runs")]
    PayloadKind {
        /// The factory's type key.
        kind: &'static str,
    },
    /// A kind of model this build of mblob-runtime does not run.
    #[error("a {what}: mblob-runtime was built without its `{feature}` feature")]
    FeatureOff {
        /// The model.
        what: &'static str,
        /// The feature it needs.
        feature: &'static str,
    },
    /// A model that has no functions to choose from (graph and AOT models).
    #[error("a {kind:?} model has no functions to choose from (only Relax and Relay VM models do)")]
    NoFunctions {
        /// The model's kind.
        kind: ModelKind,
    },
    /// A value of a kind the input does not take (a graph or AOT model takes tensors only).
    #[error("input `{name}` takes a {expected}, not a {got}")]
    InputKind {
        /// The input.
        name: String,
        /// What it takes.
        expected: &'static str,
        /// What was given.
        got: &'static str,
    },
    /// [`call()`](super::call()): the library has no host function of that name.
    #[error("no function `{name}` in the library")]
    NoHostFunction {
        /// The name.
        name: String,
    },
    /// [`call()`](super::call()): an argument that cannot be passed to a host function.
    #[error("argument {index}: {detail}")]
    Argument {
        /// Its position.
        index: usize,
        /// Why.
        detail: String,
    },
    /// [`call()`](super::call()): the host function returned an error.
    #[error("`{function}` failed: {message}")]
    Call {
        /// The function.
        function: String,
        /// What it reported.
        message: String,
    },
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
    #[error("{}", match function {
        Some(f) => format!("no input named `{name}`: `{f}` has parameters {}", known.join(", ")),
        None => format!("no input named `{name}` (inputs: {})", known.join(", ")),
    })]
    UnknownInput {
        /// The name given.
        name: String,
        /// The VM function whose parameters these are, for a VM model.
        function: Option<String>,
        /// The model's inputs.
        known: Vec<String>,
    },
    /// Inputs a run needs that were not given.
    #[error("missing inputs{}: {}", function.as_ref().map(|f| format!(" of `{f}`")).unwrap_or_default(), inputs.join(", "))]
    MissingInputs {
        /// The VM function whose parameters these are, for a VM model.
        function: Option<String>,
        /// Each input: its name, and for graph and AOT models its dtype and shape
        /// (`x (float32 [2, 64])`).
        inputs: Vec<String>,
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
    Relax(Box<super::relax::vm::value::VmError>),
    /// The Relay VM failed.
    #[cfg(feature = "relay-vm")]
    #[error(transparent)]
    RelayVm(Box<super::relay_vm::RelayVmError>),
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
    /// The AOT metadata the library returns is no metadata struct this reader takes, or is
    /// inconsistent (a shape, a constant pool): which, in the source.
    #[error("AOT metadata: {0}")]
    Metadata(#[source] crate::ffi::metadata::MetadataError),
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
