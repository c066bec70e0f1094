//! [`Model`]: one handle on whatever a library holds (a graph factory, an AOT factory or a
//! Relax executable), on one device, for the CLI, Python and a C API: set inputs by name or
//! in order, run, read the outputs.
//!
//! ```no_run
//! use mblob_runtime::exec::{Device, Model};
//! use mblob_runtime::{load_library, LoadOptions, Registry};
//! # fn input() -> mblob_runtime::payload::graph::Tensor { unimplemented!() }
//!
//! // SAFETY: a library we trust to run.
//! let tree = unsafe { load_library("deploy.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut m = Model::new(&tree, Device::opencl(0))?;
//! m.set_input(Some("x"), &input())?;
//! m.run()?;
//! let outputs = m.outputs()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::relax::{ParamKind, RelaxExecutable, VirtualMachine, VmValue};
#[cfg(feature = "relay-vm")]
use super::relay_vm::RelayVm;
use super::{aot, graph, Device, ExecError, Executor, Tensor, TensorInfo};
use crate::module::LoadedTree;
use crate::payload::graph::GraphExecutorFactory;
#[cfg(feature = "relay-vm")]
use crate::payload::relay_vm::RelayVmExecutable;

/// What kind of model a library holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A `GraphExecutorFactory` (Relay's `relay.build`).
    Graph,
    /// An `AotExecutorFactory`.
    Aot,
    /// A Relax executable (`relax.build` / `tvm.compile`), run by the VM.
    Relax,
    /// A Relay VM executable (`VMExecutable`, `relay.vm.compile`), run by the Relay VM.
    RelayVm,
}

/// One output of a run.
#[derive(Debug, Clone)]
pub enum Output {
    /// A tensor, copied to the host.
    Tensor(Tensor),
    /// A shape (a Relax function can return one).
    Shape(Vec<i64>),
    /// An integer (or bool) `R.Prim` value a Relax function returned.
    Int(i64),
    /// A float `R.Prim` value a Relax function returned.
    Float(f64),
    /// A string a Relax function returned.
    Str(String),
}

/// A model ready to run on a device.
pub struct Model {
    device: Device,
    inner: Inner,
}

enum Inner {
    Executor {
        exec: Box<dyn Executor + Send>,
        kind: ModelKind,
        given: Vec<bool>,
    },
    Relax(Box<RelaxState>),
    #[cfg(feature = "relay-vm")]
    RelayVm(Box<RelayState>),
}

#[cfg(feature = "relay-vm")]
struct RelayState {
    vm: RelayVm,
    function: String,
    params: Vec<String>,
    inputs: Vec<Option<Tensor>>,
    outputs: Vec<Tensor>,
}

struct RelaxState {
    vm: VirtualMachine,
    function: String,
    params: Vec<String>,
    kinds: Vec<ParamKind>,
    inputs: Vec<Option<VmValue>>,
    result: Option<VmValue>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("kind", &self.kind()).field("device", &self.device).finish()
    }
}

/// Whether `tree` holds a Relay VM executable: read by its loader, or, without the `relay-vm`
/// feature, kept as raw bytes under its type key (`VMExecutable`).
#[cfg(feature = "relay-vm")]
fn holds_relay_vm(tree: &LoadedTree) -> bool {
    tree.find::<RelayVmExecutable>().is_some()
}

#[cfg(not(feature = "relay-vm"))]
fn holds_relay_vm(tree: &LoadedTree) -> bool {
    tree.modules().iter().any(|m| m.module.type_key() == "VMExecutable")
}

impl Model {
    /// The kind of model `tree` holds, if any: a Relax executable first (a Relax library
    /// can also carry other modules), then a graph factory, then an AOT factory.
    pub fn kind_of(tree: &LoadedTree) -> Option<ModelKind> {
        if tree.find::<RelaxExecutable>().is_some() {
            Some(ModelKind::Relax)
        } else if holds_relay_vm(tree) {
            Some(ModelKind::RelayVm)
        } else if tree.find::<GraphExecutorFactory>().is_some() {
            Some(ModelKind::Graph)
        } else if tree.modules().iter().any(|m| m.module.type_key() == aot::AOT_EXECUTOR_FACTORY) {
            Some(ModelKind::Aot)
        } else {
            None
        }
    }

    /// Builds the executor for what `tree` holds on `device` (a Relax model calls `main`, or
    /// its only function when it has one and no `main`, until [`Model::select_function`]
    /// picks another). Parameters and constants are copied
    /// to the device here, once.
    pub fn new(tree: &LoadedTree, device: Device) -> Result<Model, ExecError> {
        let kind = Model::kind_of(tree).ok_or_else(|| {
            ExecError::NoFactory(format!(
                "the library holds no GraphExecutorFactory, AotExecutorFactory, Relax executable or Relay VM executable (modules: {})",
                tree.type_keys().join(", ")
            ))
        })?;
        super::check_device_code(tree, 0, device)?;
        let inner = match kind {
            ModelKind::Relax => {
                let vm = VirtualMachine::new(tree, device).map_err(|e| ExecError::Relax(Box::new(e)))?;
                let mut state = RelaxState {
                    vm,
                    function: String::new(),
                    params: Vec::new(),
                    kinds: Vec::new(),
                    inputs: Vec::new(),
                    result: None,
                };
                let functions = state.vm.functions();
                let default = match functions.as_slice() {
                    [only] => only.name.clone(),
                    _ => "main".to_owned(),
                };
                state.select(&default, false)?;
                Inner::Relax(Box::new(state))
            }
            // Without the feature the executable was kept as raw bytes, and is not run.
            #[cfg(not(feature = "relay-vm"))]
            ModelKind::RelayVm => {
                return Err(ExecError::NoFactory(
                    "a Relay VM executable: mblob-runtime was built without its `relay-vm` feature".into(),
                ))
            }
            #[cfg(feature = "relay-vm")]
            ModelKind::RelayVm => {
                let vm = RelayVm::new(tree, device).map_err(|e| ExecError::RelayVm(Box::new(e)))?;
                let mut state = RelayState {
                    vm,
                    function: String::new(),
                    params: Vec::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                };
                state.select("main", false)?;
                #[cfg(feature = "relay-vm")]
                Inner::RelayVm(Box::new(state))
            }
            ModelKind::Graph => {
                let exec = graph::GraphFactory::from_tree(tree)?.default(&[device])?;
                let given = vec![false; exec.inputs().len()];
                Inner::Executor { exec: Box::new(exec), kind, given }
            }
            ModelKind::Aot => {
                let exec = aot::AotFactory::from_tree(tree)?.default(&[device])?;
                let given = vec![false; exec.inputs().len()];
                Inner::Executor { exec: Box::new(exec), kind, given }
            }
        };
        Ok(Model { device, inner })
    }

    /// The kind of model.
    pub fn kind(&self) -> ModelKind {
        match &self.inner {
            Inner::Executor { kind, .. } => *kind,
            Inner::Relax(_) => ModelKind::Relax,
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(_) => ModelKind::RelayVm,
        }
    }

    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The Relax VM, for a Relax model.
    pub fn vm(&mut self) -> Option<&mut VirtualMachine> {
        match &mut self.inner {
            Inner::Relax(r) => Some(&mut r.vm),
            _ => None,
        }
    }

    /// The Relax function [`Model::run`] calls (`None` for graph and AOT models, and for a
    /// Relax model without `main` and with several functions until one is selected).
    pub fn function(&self) -> Option<&str> {
        match &self.inner {
            Inner::Relax(r) if !r.function.is_empty() => Some(&r.function),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) if !r.function.is_empty() => Some(&r.function),
            _ => None,
        }
    }

    /// The functions a caller can pick: the Relax VM's, or none for graph and AOT models.
    pub fn functions(&self) -> Vec<String> {
        match &self.inner {
            Inner::Relax(r) => r.vm.functions().into_iter().map(|f| f.name).collect(),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.vm.functions().into_iter().map(|f| f.name).collect(),
            Inner::Executor { .. } => Vec::new(),
        }
    }

    /// Makes `name` the function [`Model::run`] calls (Relax models); the inputs given so
    /// far are dropped.
    pub fn select_function(&mut self, name: &str) -> Result<(), ExecError> {
        match &mut self.inner {
            Inner::Relax(r) => r.select(name, true),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.select(name, true),
            Inner::Executor { kind, .. } => Err(ExecError::NoFactory(format!(
                "a {} model has no functions to choose from (only Relax models do)",
                if *kind == ModelKind::Graph { "graph" } else { "AOT" }
            ))),
        }
    }

    /// The inputs a caller sets, in order: names, and for graph and AOT models their shapes and
    /// dtypes (a Relax function's parameters are checked by the function itself).
    pub fn inputs(&self) -> Vec<(String, Option<TensorInfo>)> {
        match &self.inner {
            Inner::Executor { exec, .. } => exec.inputs().into_iter().map(|i| (i.name.clone(), Some(i))).collect(),
            Inner::Relax(r) => r.params.iter().map(|p| (p.clone(), None)).collect(),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.params.iter().map(|p| (p.clone(), None)).collect(),
        }
    }

    /// What each input of the selected Relax function takes (tensor, shape, prim value,
    /// tuple...), as the function checks its parameters; empty for graph and AOT models.
    pub fn input_kinds(&self) -> Vec<ParamKind> {
        match &self.inner {
            Inner::Relax(r) => r.kinds.clone(),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => vec![ParamKind::Tensor; r.params.len()],
            Inner::Executor { .. } => Vec::new(),
        }
    }

    /// Sets an input of a Relax function to any value (a shape, a prim value, a tuple, ...),
    /// by name or with `None` the first one not set yet; the function checks it when it runs.
    /// Graph and AOT models take tensors only.
    pub fn set_input_value(&mut self, name: Option<&str>, value: VmValue) -> Result<(), ExecError> {
        match value {
            VmValue::Tensor(t) => self.set_input(name, &t),
            v => {
                if !matches!(self.inner, Inner::Relax(_)) {
                    return Err(ExecError::NoFactory("a graph or AOT model takes tensors only".into()));
                }
                let index = self.input_index(name)?;
                if let Inner::Relax(r) = &mut self.inner {
                    r.inputs[index] = Some(v);
                }
                Ok(())
            }
        }
    }

    fn input_index(&self, name: Option<&str>) -> Result<usize, ExecError> {
        let known = || self.inputs().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        match name {
            Some(n) => {
                self.input_position(n).ok_or_else(|| ExecError::UnknownInput { name: n.to_owned(), known: known() })
            }
            None => {
                self.next_unset().ok_or(ExecError::Index { what: "input", index: known().len(), count: known().len() })
            }
        }
    }

    /// Sets an input by name, or with `None` the first one not set yet (parameter order).
    /// Names, shapes and dtypes are checked (graph and AOT) before anything runs.
    pub fn set_input(&mut self, name: Option<&str>, tensor: &Tensor) -> Result<(), ExecError> {
        let index = self.input_index(name)?;
        match &mut self.inner {
            Inner::Executor { exec, given, .. } => {
                let name = exec.inputs()[index].name.clone();
                exec.set_input_by_name(name.as_str(), tensor)?;
                given[index] = true;
            }
            // The VM passes a bool in the spelling of the executable's TVM.
            Inner::Relax(r) => r.inputs[index] = Some(VmValue::Tensor(tensor.clone())),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.inputs[index] = Some(tensor.clone()),
        }
        Ok(())
    }

    /// The position in [`Model::inputs`] of the input called `name` (an AOT model also
    /// answers to the names it was built with).
    pub fn input_position(&self, name: &str) -> Option<usize> {
        match &self.inner {
            Inner::Executor { exec, .. } => exec.input_index(name),
            Inner::Relax(r) => r.params.iter().position(|p| p == name),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.params.iter().position(|p| p == name),
        }
    }

    fn next_unset(&self) -> Option<usize> {
        match &self.inner {
            Inner::Executor { given, .. } => given.iter().position(|g| !g),
            Inner::Relax(r) => r.inputs.iter().position(Option::is_none),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.inputs.iter().position(Option::is_none),
        }
    }

    /// Whether input `index` was set.
    pub fn is_set(&self, index: usize) -> bool {
        match &self.inner {
            Inner::Executor { given, .. } => given.get(index).copied().unwrap_or(false),
            Inner::Relax(r) => r.inputs.get(index).is_some_and(Option::is_some),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => r.inputs.get(index).is_some_and(Option::is_some),
        }
    }

    /// The inputs not set yet, by name.
    pub fn missing_inputs(&self) -> Vec<String> {
        self.inputs().into_iter().enumerate().filter(|(i, _)| !self.is_set(*i)).map(|(_, (n, _))| n).collect()
    }

    /// Runs the model (the selected function of a Relax model) once. Every input must be set.
    pub fn run(&mut self) -> Result<(), ExecError> {
        let missing = self.missing_inputs();
        if !missing.is_empty() {
            return Err(ExecError::MissingInputs { names: missing });
        }
        match &mut self.inner {
            Inner::Executor { exec, .. } => exec.run(),
            Inner::Relax(r) => {
                let inputs: Vec<VmValue> = r.inputs.iter().flatten().cloned().collect();
                r.result = None;
                r.result = Some(r.vm.invoke_values(&r.function, &inputs).map_err(|e| ExecError::Relax(Box::new(e)))?);
                Ok(())
            }
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => {
                let inputs: Vec<Tensor> = r.inputs.iter().flatten().cloned().collect();
                r.outputs = r.vm.invoke(&r.function, &inputs).map_err(|e| ExecError::RelayVm(Box::new(e)))?;
                Ok(())
            }
        }
    }

    /// The result of the last run of a Relax function, with its structure (nested tuples,
    /// shapes, prim values); `None` for graph and AOT models or before a run.
    pub fn result(&self) -> Option<&VmValue> {
        match &self.inner {
            Inner::Relax(r) => r.result.as_ref(),
            _ => None,
        }
    }

    /// The outputs of the last run, copied to the host, in order (a Relax function's returned
    /// tuple flattened depth first; a `None` in it is left out).
    pub fn outputs(&self) -> Result<Vec<Output>, ExecError> {
        match &self.inner {
            Inner::Executor { exec, .. } => {
                (0..exec.num_outputs()).map(|i| exec.get_output(i).map(Output::Tensor)).collect()
            }
            Inner::Relax(r) => Ok(r
                .result
                .as_ref()
                .map(|v| v.flatten())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|o| match o {
                    VmValue::Tensor(t) => Some(Output::Tensor(t.clone())),
                    VmValue::Shape(s) => Some(Output::Shape(s.clone())),
                    VmValue::Int(i) => Some(Output::Int(*i)),
                    VmValue::Float(f) => Some(Output::Float(*f)),
                    VmValue::Str(s) => Some(Output::Str(s.clone())),
                    VmValue::Null | VmValue::Tuple(_) | VmValue::Object(_) | VmValue::Array(_) => None,
                })
                .collect()),
            #[cfg(feature = "relay-vm")]
            Inner::RelayVm(r) => Ok(r.outputs.iter().cloned().map(Output::Tensor).collect()),
        }
    }
}

impl RelaxState {
    fn select(&mut self, name: &str, strict: bool) -> Result<(), ExecError> {
        let functions = self.vm.functions();
        match functions.iter().find(|f| f.name == name) {
            Some(f) => {
                self.function = f.name.clone();
                self.params = f.params.clone();
                self.kinds = f.kinds.clone();
                self.inputs = vec![None; f.params.len()];
                self.result = None;
                Ok(())
            }
            None if !strict => Ok(()),
            None => Err(ExecError::NoFunction {
                name: name.to_owned(),
                known: functions.into_iter().map(|f| f.name).collect(),
            }),
        }
    }
}

#[cfg(feature = "relay-vm")]
impl RelayState {
    fn select(&mut self, name: &str, strict: bool) -> Result<(), ExecError> {
        let functions = self.vm.functions();
        match functions.iter().find(|f| f.name == name) {
            Some(f) => {
                self.function = f.name.clone();
                self.params = f.params.clone();
                self.inputs = vec![None; f.params.len()];
                self.outputs.clear();
                Ok(())
            }
            None if !strict => Ok(()),
            None => Err(ExecError::NoFunction {
                name: name.to_owned(),
                known: functions.into_iter().map(|f| f.name).collect(),
            }),
        }
    }
}
