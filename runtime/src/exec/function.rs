//! The VM models' [`Runner`]s: a selected function of a Relax VM ([`RelaxFunction`]) or of a
//! Relay VM ([`RelayFunction`]), with its inputs and its last result.

use super::relax::VirtualMachine;
use super::runner::{Param, Runner};
use super::value::{ParamKind, Value};
use super::ExecError;

/// A Relax VM and the function [`Runner::run`] calls.
pub struct RelaxFunction {
    vm: VirtualMachine,
    function: String,
    params: Vec<Param>,
    inputs: Vec<Option<Value>>,
    result: Option<Value>,
}

fn relax_error(e: super::relax::VmError) -> ExecError {
    ExecError::Relax(Box::new(e))
}

impl RelaxFunction {
    /// A runner over `vm` that calls `main`, or its only function when it has one and no
    /// `main` (none selected when there is neither).
    pub fn new(vm: VirtualMachine) -> RelaxFunction {
        let mut f = RelaxFunction { vm, function: String::new(), params: Vec::new(), inputs: Vec::new(), result: None };
        let functions = f.vm.functions();
        let default = match functions.as_slice() {
            [only] => only.name.clone(),
            _ => "main".to_owned(),
        };
        if functions.iter().any(|s| s.name == default) {
            f.select(&default).expect("the function exists");
        }
        f
    }
}

impl Runner for RelaxFunction {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn set_input(&mut self, index: usize, value: Value) -> Result<(), ExecError> {
        let count = self.inputs.len();
        *self.inputs.get_mut(index).ok_or(ExecError::Index { what: "input", index, count })? = Some(value);
        Ok(())
    }

    fn run(&mut self) -> Result<(), ExecError> {
        let inputs = given_inputs(&self.function, &self.params, &self.inputs)?;
        self.result = None;
        self.result = Some(self.vm.invoke(&self.function, &inputs).map_err(relax_error)?);
        Ok(())
    }

    fn outputs(&self) -> Result<Vec<Value>, ExecError> {
        Ok(self.result.iter().cloned().collect())
    }

    fn functions(&self) -> Vec<String> {
        self.vm.functions().into_iter().map(|f| f.name).collect()
    }

    fn function(&self) -> Option<&str> {
        (!self.function.is_empty()).then_some(self.function.as_str())
    }

    fn select(&mut self, name: &str) -> Result<(), ExecError> {
        let functions = self.vm.functions();
        let f = functions.iter().find(|f| f.name == name).ok_or_else(|| ExecError::NoFunction {
            name: name.to_owned(),
            known: functions.iter().map(|f| f.name.clone()).collect(),
        })?;
        self.function = f.name.clone();
        self.params = f
            .params
            .iter()
            .zip(f.kinds.iter().copied().chain(std::iter::repeat(ParamKind::Any)))
            .map(|(name, kind)| Param { name: name.clone(), kind, tensor: None })
            .collect();
        self.inputs = vec![None; f.params.len()];
        self.result = None;
        Ok(())
    }

    fn call(&mut self, name: &str, args: Vec<Value>) -> Result<Value, ExecError> {
        self.vm.invoke(name, &args).map_err(relax_error)
    }
}

/// A Relay VM and the function [`Runner::run`] calls.
#[cfg(feature = "relay-vm")]
pub struct RelayFunction {
    vm: super::relay_vm::RelayVm,
    function: String,
    params: Vec<Param>,
    inputs: Vec<Option<Value>>,
    result: Option<Value>,
}

#[cfg(feature = "relay-vm")]
fn relay_error(e: super::relay_vm::RelayVmError) -> ExecError {
    ExecError::RelayVm(Box::new(e))
}

#[cfg(feature = "relay-vm")]
impl RelayFunction {
    /// A runner over `vm` that calls `main` (none selected when it has no `main`).
    pub fn new(vm: super::relay_vm::RelayVm) -> RelayFunction {
        let mut f = RelayFunction { vm, function: String::new(), params: Vec::new(), inputs: Vec::new(), result: None };
        if f.vm.functions().iter().any(|s| s.name == "main") {
            f.select("main").expect("the function exists");
        }
        f
    }
}

#[cfg(feature = "relay-vm")]
impl Runner for RelayFunction {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn set_input(&mut self, index: usize, value: Value) -> Result<(), ExecError> {
        let count = self.inputs.len();
        let slot = self.inputs.get_mut(index).ok_or(ExecError::Index { what: "input", index, count })?;
        if !matches!(value, Value::Tensor(_)) {
            return Err(ExecError::InputKind {
                name: self.params[index].name.clone(),
                expected: "tensor",
                got: value.kind(),
            });
        }
        *slot = Some(value);
        Ok(())
    }

    fn run(&mut self) -> Result<(), ExecError> {
        let inputs = given_inputs(&self.function, &self.params, &self.inputs)?;
        self.result = None;
        self.result = Some(self.vm.invoke(&self.function, &inputs).map_err(relay_error)?);
        Ok(())
    }

    fn outputs(&self) -> Result<Vec<Value>, ExecError> {
        Ok(self.result.iter().cloned().collect())
    }

    fn functions(&self) -> Vec<String> {
        self.vm.functions().into_iter().map(|f| f.name).collect()
    }

    fn function(&self) -> Option<&str> {
        (!self.function.is_empty()).then_some(self.function.as_str())
    }

    fn select(&mut self, name: &str) -> Result<(), ExecError> {
        let functions = self.vm.functions();
        let f = functions.iter().find(|f| f.name == name).ok_or_else(|| ExecError::NoFunction {
            name: name.to_owned(),
            known: functions.iter().map(|f| f.name.clone()).collect(),
        })?;
        self.function = f.name.clone();
        self.params =
            f.params.iter().map(|p| Param { name: p.clone(), kind: ParamKind::Tensor, tensor: None }).collect();
        self.inputs = vec![None; f.params.len()];
        self.result = None;
        Ok(())
    }

    fn call(&mut self, name: &str, args: Vec<Value>) -> Result<Value, ExecError> {
        self.vm.invoke(name, &args).map_err(relay_error)
    }
}

/// The inputs of a VM function's run, in parameter order, or the names of those not given.
fn given_inputs(function: &str, params: &[Param], inputs: &[Option<Value>]) -> Result<Vec<Value>, ExecError> {
    let missing: Vec<String> =
        params.iter().zip(inputs).filter(|(_, i)| i.is_none()).map(|(p, _)| p.name.clone()).collect();
    if !missing.is_empty() {
        return Err(ExecError::MissingInputs { function: Some(function.to_owned()), inputs: missing });
    }
    Ok(inputs.iter().flatten().cloned().collect())
}
