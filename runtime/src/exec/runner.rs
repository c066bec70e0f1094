//! [`Runner`]: what each kind of model offers [`Model`](super::Model): its parameters, one
//! input set at a time, a run, the outputs. Implemented by the graph executor, the AOT
//! executor, a selected Relax function and a selected Relay VM function.

use super::value::{ParamKind, Value};
use super::{ExecError, TensorInfo};

/// A parameter a caller sets: its name, what it takes, and for graph and AOT models the
/// tensor's shape and dtype (checked when it is set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The name.
    pub name: String,
    /// What it takes (a Relax function's parameters say it; graph, AOT and Relay VM ones take
    /// tensors).
    pub kind: ParamKind,
    /// The tensor's shape and dtype, when the model fixes them (graph and AOT).
    pub tensor: Option<TensorInfo>,
}

impl Param {
    /// A tensor parameter of fixed shape and dtype.
    pub fn tensor(info: TensorInfo) -> Param {
        Param { name: info.name.clone(), kind: ParamKind::Tensor, tensor: Some(info) }
    }
}

/// One way to run a model: set the inputs, run, read the outputs.
pub trait Runner {
    /// The parameters a caller sets, in order.
    fn params(&self) -> &[Param];

    /// The position in [`Runner::params`] of the parameter called `name` (an AOT model also
    /// answers to the names it was built with, before TVM sanitized them).
    fn param_index(&self, name: &str) -> Option<usize> {
        self.params().iter().position(|p| p.name == name)
    }

    /// Sets parameter `index` to `value`. Graph and AOT models copy a tensor into their input
    /// at once (from any device), after checking its shape and dtype; a VM function keeps the
    /// value and checks it when it runs.
    fn set_input(&mut self, index: usize, value: Value) -> Result<(), ExecError>;

    /// Runs once with the inputs set.
    fn run(&mut self) -> Result<(), ExecError>;

    /// The outputs of the last run, in order: a graph's or AOT model's outputs, or the one
    /// value a VM function returned, with its structure (nested tuples stay nested). The
    /// tensors are the model's own, on its device (a graph's outputs are overwritten by the
    /// next run, as TVM's `get_output`; copy to keep them). A VM function has none before a
    /// run.
    fn outputs(&self) -> Result<Vec<Value>, ExecError>;

    /// The outputs' names, shapes and dtypes, when the model fixes them (graph and AOT).
    fn output_info(&self) -> Vec<TensorInfo> {
        Vec::new()
    }

    /// The functions a caller can choose from (VM models), in the executable's order.
    fn functions(&self) -> Vec<String> {
        Vec::new()
    }

    /// The function [`Runner::run`] calls (VM models), if one is selected.
    fn function(&self) -> Option<&str> {
        None
    }

    /// Makes `name` the function [`Runner::run`] calls; the inputs given so far are dropped.
    fn select(&mut self, name: &str) -> Result<(), ExecError> {
        Err(ExecError::NoFunction { name: name.to_owned(), known: Vec::new() })
    }

    /// Calls function `name` (VM models) with `args`, apart from the selected function and
    /// its inputs; the result stays where the program left it.
    fn call(&mut self, name: &str, _args: Vec<Value>) -> Result<Value, ExecError> {
        Err(ExecError::NoFunction { name: name.to_owned(), known: Vec::new() })
    }
}
