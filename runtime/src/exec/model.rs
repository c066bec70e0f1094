//! [`Model`]: one handle on whatever a library holds (a graph factory, an AOT factory, a
//! Relax or Relay VM executable), on one device, for the CLI, Python and the C API: set inputs
//! by name or in order, run, read the outputs, all as [`Value`]s.
//!
//! ```no_run
//! use mblob_runtime::exec::{Device, Model, Value};
//! use mblob_runtime::{load_library, LoadOptions, NdArray, Registry};
//!
//! // SAFETY: a library we trust to run.
//! let tree = unsafe { load_library("deploy.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut m = Model::new(&tree, Device::opencl(0))?;
//! let x = NdArray::from_f32(&[0.0; 4], &[1, 4], Device::cpu(0))?;
//! m.set_input(Some("x"), Value::Tensor(x))?;
//! m.run()?;
//! let outputs = m.outputs()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::error::check_device_code;
use super::function::RelaxFunction;
#[cfg(feature = "relay-vm")]
use super::function::RelayFunction;
use super::kind::{ModelKind, TensorInfo};
use super::relax::{RelaxExecutable, VirtualMachine};
#[cfg(feature = "relay-vm")]
use super::relay_vm::RelayVm;
use super::runner::{Param, Runner};
use super::value::Value;
use super::{aot, graph, Device, ExecError};
use crate::module::LoadedTree;
use crate::payload::graph::GraphExecutorFactory;
#[cfg(feature = "relay-vm")]
use crate::payload::relay_vm::RelayVmExecutable;

/// A model ready to run on a device: a [`Runner`] and which inputs were given.
pub struct Model {
    device: Device,
    kind: ModelKind,
    runner: Box<dyn Runner + Send>,
    given: Vec<bool>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("kind", &self.kind).field("device", &self.device).finish()
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

    /// Builds the runner for what `tree` holds on `device` (a VM model calls `main`, or a
    /// Relax library's only function when it has one and no `main`, until
    /// [`Model::select_function`] picks another). Parameters and constants are copied to the
    /// device here, once.
    pub fn new(tree: &LoadedTree, device: Device) -> Result<Model, ExecError> {
        let kind = Model::kind_of(tree)
            .ok_or_else(|| ExecError::NoModel { modules: tree.type_keys().into_iter().map(str::to_owned).collect() })?;
        check_device_code(tree, 0, device)?;
        let runner: Box<dyn Runner + Send> = match kind {
            ModelKind::Relax => Box::new(RelaxFunction::new(
                VirtualMachine::new(tree, device).map_err(|e| ExecError::Relax(Box::new(e)))?,
            )),
            // Without the feature the executable was kept as raw bytes, and is not run.
            #[cfg(not(feature = "relay-vm"))]
            ModelKind::RelayVm => {
                return Err(ExecError::FeatureOff { what: "Relay VM executable", feature: "relay-vm" })
            }
            #[cfg(feature = "relay-vm")]
            ModelKind::RelayVm => {
                Box::new(RelayFunction::new(RelayVm::new(tree, device).map_err(|e| ExecError::RelayVm(Box::new(e)))?))
            }
            ModelKind::Graph => Box::new(graph::GraphFactory::from_tree(tree)?.default(&[device])?),
            ModelKind::Aot => Box::new(aot::AotFactory::from_tree(tree)?.default(&[device])?),
        };
        Ok(Model::with_runner(runner, kind, device))
    }

    /// A model over a runner made by hand (an executor built with other devices, a graph
    /// factory made of parts).
    pub fn with_runner(runner: Box<dyn Runner + Send>, kind: ModelKind, device: Device) -> Model {
        let given = vec![false; runner.params().len()];
        Model { device, kind, runner, given }
    }

    /// The kind of model.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The VM function [`Model::run`] calls (`None` for graph and AOT models, and for a VM
    /// model without `main` and with several functions until one is selected).
    pub fn function(&self) -> Option<&str> {
        self.runner.function()
    }

    /// The functions a caller can pick: the VM's, or none for graph and AOT models.
    pub fn functions(&self) -> Vec<String> {
        self.runner.functions()
    }

    /// Makes `name` the function [`Model::run`] calls (VM models); the inputs given so far
    /// are dropped.
    pub fn select_function(&mut self, name: &str) -> Result<(), ExecError> {
        if matches!(self.kind, ModelKind::Graph | ModelKind::Aot) {
            return Err(ExecError::NoFunctions { kind: self.kind });
        }
        self.runner.select(name)?;
        self.given = vec![false; self.runner.params().len()];
        Ok(())
    }

    /// Calls VM function `name` with `args`, apart from the selected function and its inputs;
    /// graph and AOT models have no functions ([`ExecError::NoFunctions`]).
    pub fn call_function(&mut self, name: &str, args: Vec<Value>) -> Result<Value, ExecError> {
        if matches!(self.kind, ModelKind::Graph | ModelKind::Aot) {
            return Err(ExecError::NoFunctions { kind: self.kind });
        }
        self.runner.call(name, args)
    }

    /// The inputs a caller sets, in order: names, what each takes, and for graph and AOT
    /// models their shapes and dtypes (a VM function checks its parameters itself).
    pub fn params(&self) -> &[Param] {
        self.runner.params()
    }

    /// The outputs' names, shapes and dtypes, for graph and AOT models (empty for VM models,
    /// whose results say themselves).
    pub fn output_info(&self) -> Vec<TensorInfo> {
        self.runner.output_info()
    }

    fn input_index(&self, name: Option<&str>) -> Result<usize, ExecError> {
        let known = || self.params().iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        match name {
            Some(n) => self.input_position(n).ok_or_else(|| ExecError::UnknownInput {
                name: n.to_owned(),
                function: self.function().map(str::to_owned),
                known: known(),
            }),
            None => self.given.iter().position(|g| !g).ok_or(ExecError::Index {
                what: "input",
                index: self.given.len(),
                count: self.given.len(),
            }),
        }
    }

    /// Sets an input by name, or with `None` the first one not set yet (parameter order).
    /// A graph or AOT model copies a tensor (from any device) into its input at once, its
    /// shape and dtype checked; a VM function keeps the value and checks it when it runs.
    pub fn set_input(&mut self, name: Option<&str>, value: Value) -> Result<(), ExecError> {
        let index = self.input_index(name)?;
        self.set_input_at(index, value)
    }

    /// Sets input `index` (a position in [`Model::params`]).
    pub fn set_input_at(&mut self, index: usize, value: Value) -> Result<(), ExecError> {
        self.runner.set_input(index, value)?;
        if let Some(g) = self.given.get_mut(index) {
            *g = true;
        }
        Ok(())
    }

    /// The position in [`Model::params`] of the input called `name` (an AOT model also
    /// answers to the names it was built with).
    pub fn input_position(&self, name: &str) -> Option<usize> {
        self.runner.param_index(name)
    }

    /// Whether input `index` was set.
    pub fn is_set(&self, index: usize) -> bool {
        self.given.get(index).copied().unwrap_or(false)
    }

    /// The inputs not set yet, by name.
    pub fn missing_inputs(&self) -> Vec<String> {
        self.params().iter().zip(&self.given).filter(|(_, g)| !**g).map(|(p, _)| p.name.clone()).collect()
    }

    /// Runs the model (the selected function of a VM model) once. Every input must be set.
    pub fn run(&mut self) -> Result<(), ExecError> {
        if self.given.iter().any(|g| !g) {
            let inputs = self
                .params()
                .iter()
                .zip(&self.given)
                .filter(|(_, g)| !**g)
                .map(|(p, _)| match &p.tensor {
                    Some(t) => format!("{} ({} {:?})", p.name, t.dtype, t.shape),
                    None => p.name.clone(),
                })
                .collect();
            return Err(ExecError::MissingInputs { function: self.function().map(str::to_owned), inputs });
        }
        self.runner.run()
    }

    /// The result of the last run with its structure: a VM function's returned value, a
    /// graph or AOT model's outputs as a tuple; `None` before a VM model's first run.
    pub fn result(&self) -> Result<Option<Value>, ExecError> {
        let mut outputs = self.runner.outputs()?;
        Ok(match self.kind {
            ModelKind::Relax | ModelKind::RelayVm => outputs.pop(),
            ModelKind::Graph | ModelKind::Aot => Some(Value::Tuple(outputs)),
        })
    }

    /// The outputs of the last run, in order: a graph's or AOT model's outputs, a VM
    /// function's result flattened depth first (a `None` or an object in it left out). The
    /// tensors are the model's own, on its device: a graph's are overwritten by the next run
    /// (copy them to keep them).
    pub fn outputs(&self) -> Result<Vec<Value>, ExecError> {
        let outputs = self.runner.outputs()?;
        Ok(outputs
            .iter()
            .flat_map(Value::flatten)
            .filter(|v| !matches!(v, Value::Null | Value::Object(_)))
            .cloned()
            .collect())
    }
}
