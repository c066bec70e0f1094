//! The VM's edge to its callers: calling a function by name with the caller's values
//! ([`exec::Value`](crate::exec::Value): tensors on any device, shapes, numbers, strings,
//! tuples, objects) and giving its result back as one. The register values of the interpreter
//! ([`Value`]) are converted here, once each way, and nowhere else.

use super::builtins::refusal;
use super::value::{bool_for_dialect, numpy_dtype, tuple_items, Value, VmError};
use super::{provided, Callee, VirtualMachine};
use crate::array::NdArray;
use crate::exec::value::Value as ExecValue;
use crate::format::Layout;
use crate::payload::relax::executable::FuncKind;

/// Copies back into the caller's tensors what a call wrote into their copies: a tensor off
/// the VM's device is passed to a builtin or kernel as a copy on the device, so that one that
/// writes into its arguments (`vm.builtin.attention_kv_cache_debug_get_kv` of a cache on a
/// GPU) writes into the caller's tensor as it does on the VM's device.
fn write_back(args: &[ExecValue], values: &[Value]) -> Result<(), VmError> {
    for (arg, value) in args.iter().zip(values) {
        match (arg, value) {
            (ExecValue::Tensor(a), Value::Tensor(t)) if a.device() != t.device() => t.copy_to(a)?,
            (ExecValue::Tuple(items), Value::Tuple(vals)) => write_back(items, &tuple_items(vals))?,
            _ => {}
        }
    }
    Ok(())
}

impl VirtualMachine {
    /// Calls the function `name` with `args`, as TVM's `relax.VirtualMachine` does from
    /// Python (`vm["main"](x)`), and returns its result with its structure (nested tuples stay
    /// nested). `name` is a VM function of the executable, else a global function as
    /// `tvm.get_global_func(name)(*args)` finds it: a VM builtin (the KV cache's
    /// `vm.builtin.kv_state_add_sequence`, ...) or one of the functions mblob provides by name
    /// (`relax.run.*`, `tvm.contrib.sort.*`). A kernel of the library is not a function a
    /// caller names (TVM's `vm["softmax"]` of a kernel is "Unknown function" too).
    ///
    /// Tensors are passed by reference, as TVM passes its `Tensor`s: one on the VM's device as
    /// it is, one elsewhere as a copy there (as TVM's VM copies an argument on another
    /// device). A builtin or kernel called by name that writes into its arguments writes into
    /// the caller's tensors (a copy is copied back after the call). A bool tensor may be
    /// spelled either way (`uint1` as TVM 0.19-0.21 do, or tvm-ffi's 8-bit `kDLBool`); it is
    /// passed as the executable's TVM spells bool. The result's tensors stay where the
    /// program left them (on the VM's device), uncopied, a bool as numpy spells it; an output
    /// shares its storage with nothing the VM uses again while the caller holds it.
    pub fn invoke(&self, name: &str, args: &[ExecValue]) -> Result<ExecValue, VmError> {
        let _span = tracing::debug_span!("relax_vm_invoke", function = name, args = args.len()).entered();
        let callee = self.callee_by_name(name)?;
        let ffi_bool = self.executable().layout == Layout::Ffi;
        let values = args.iter().map(|v| self.register_value(v, ffi_bool)).collect::<Result<Vec<_>, _>>()?;
        let result = match callee {
            // A VM function's frame takes its arguments as its first registers.
            Callee::Vm(index) => self.call_vm(index, values, 0)?,
            callee => {
                let refs: Vec<&Value> = values.iter().collect();
                let result = self.dispatch(&callee, name, &refs, 0)?;
                write_back(args, &values)?;
                result
            }
        };
        caller_value(&result, name)
    }

    /// What [`VirtualMachine::invoke`] calls for `name`.
    pub(super) fn callee_by_name(&self, name: &str) -> Result<Callee, VmError> {
        let exec = self.executable();
        if let Some(index) = exec.functions.iter().position(|f| f.name == name && f.kind == FuncKind::Vm) {
            return Ok(Callee::Vm(index));
        }
        if let Some((n, f)) = self.builtins.get(name) {
            return Ok(Callee::Builtin(n, f));
        }
        match provided(name) {
            Some(c) => Ok(c),
            None if name.starts_with("vm.builtin.") => Ok(Callee::Refused(refusal(name))),
            None => Err(VmError::UnknownFunction {
                name: name.to_owned(),
                available: exec.vm_functions().map(|f| f.name.clone()).collect(),
            }),
        }
    }

    /// A caller's value as a register value.
    fn register_value(&self, v: &ExecValue, ffi_bool: bool) -> Result<Value, VmError> {
        Ok(match v {
            ExecValue::Tensor(a) => self.upload_array(a, ffi_bool)?,
            ExecValue::Shape(s) => Value::Shape(s.clone()),
            ExecValue::Int(i) => Value::Int(*i),
            ExecValue::Float(f) => Value::Float(*f),
            ExecValue::Str(s) => Value::Str(s.as_bytes().into()),
            ExecValue::Bytes(b) => Value::Str(b.as_slice().into()),
            ExecValue::Null => Value::Null,
            ExecValue::Object(o) => Value::Object(o.clone()),
            ExecValue::Tuple(items) => {
                Value::tuple(items.iter().map(|i| self.register_value(i, ffi_bool)).collect::<Result<Vec<_>, _>>()?)
            }
        })
    }

    /// An input tensor on the VM's device: itself when it is there, else a copy.
    fn upload_array(&self, a: &NdArray, ffi_bool: bool) -> Result<Value, VmError> {
        let dtype = bool_for_dialect(a.dtype(), ffi_bool);
        if a.device() == self.devices[0] {
            return Ok(Value::Tensor(if dtype == a.dtype() { a.clone() } else { a.view(a.shape(), dtype)? }));
        }
        let storage = self.pool.alloc(0, &self.apis[0], a.nbytes())?;
        let copy = NdArray::in_storage(&storage, 0, a.shape(), dtype)?;
        a.copy_to(&copy)?;
        Ok(Value::Tensor(copy))
    }
}

/// A register value as the caller's value: tensors where they lie, bools as numpy spells
/// them; a value a caller cannot hold (a storage, a closure, a data type) is
/// [`VmError::Output`].
pub(crate) fn caller_value(v: &Value, function: &str) -> Result<ExecValue, VmError> {
    Ok(match v {
        Value::Tensor(t) => {
            let dtype = numpy_dtype(t.dtype());
            ExecValue::Tensor(if dtype == t.dtype() { t.clone() } else { t.view(t.shape(), dtype)? })
        }
        Value::Shape(s) => ExecValue::Shape(s.clone()),
        Value::Int(i) => ExecValue::Int(*i),
        Value::Float(f) => ExecValue::Float(*f),
        Value::Str(s) => ExecValue::Str(String::from_utf8_lossy(s).into_owned()),
        Value::Null => ExecValue::Null,
        Value::Object(o) => ExecValue::Object(o.clone()),
        Value::Tuple(items) => {
            ExecValue::Tuple(tuple_items(items).iter().map(|i| caller_value(i, function)).collect::<Result<_, _>>()?)
        }
        v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
    })
}
