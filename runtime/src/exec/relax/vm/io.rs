//! The VM's edge to its callers: invoking a VM function with the caller's values (host
//! tensors, arrays on any device, shapes, numbers, tuples) and giving its result back.

use std::sync::Arc;

use super::value::{bool_for_dialect, numpy_dtype, tuple_items, Value, VmError, VmOutput, VmValue};
use super::VirtualMachine;
use crate::array::{tensor_bytes, NdArray};
use crate::exec::value::Value as ExecValue;
use crate::format::Layout;
use crate::payload::graph::Tensor;
use crate::payload::relax::executable::FuncKind;

/// Copies back into the caller's arrays what a call wrote into their copies: a
/// [`VmValue::Array`] off the VM's device is passed as a copy on the device, so that a builtin
/// writing into its arguments (`vm.builtin.attention_kv_cache_debug_get_kv` of a cache on a
/// GPU) writes into the caller's array as it does on the VM's device.
pub(super) fn write_back(args: &[VmValue], values: &[Value]) -> Result<(), VmError> {
    for (arg, value) in args.iter().zip(values) {
        match (arg, value) {
            (VmValue::Array(a), Value::Tensor(t)) if a.device() != t.device() => t.copy_to(a)?,
            (VmValue::Tuple(items), Value::Tuple(vals)) => write_back(items, &tuple_items(vals))?,
            _ => {}
        }
    }
    Ok(())
}

/// A tensor or a shape of a function's result.
enum Leaf {
    Tensor(NdArray),
    Shape(Arc<[i64]>),
}

/// The tensors (and, with `shapes`, the shapes) of a result, tuples flattened in order.
fn leaves(v: &Value, function: &str, shapes: bool) -> Result<Vec<Leaf>, VmError> {
    fn walk(v: &Value, function: &str, shapes: bool, out: &mut Vec<Leaf>) -> Result<(), VmError> {
        match v {
            Value::Tensor(t) => out.push(Leaf::Tensor(t.clone())),
            Value::Shape(s) if shapes => out.push(Leaf::Shape(s.clone())),
            Value::Tuple(items) => {
                for i in tuple_items(items).iter() {
                    walk(i, function, shapes, out)?;
                }
            }
            v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(v, function, shapes, &mut out)?;
    Ok(out)
}

/// The tensors of a result, with an error naming anything else.
fn tensor_leaves(v: &Value, function: &str) -> Result<Vec<NdArray>, VmError> {
    Ok(leaves(v, function, false)?
        .into_iter()
        .filter_map(|l| match l {
            Leaf::Tensor(t) => Some(t),
            Leaf::Shape(_) => None,
        })
        .collect())
}

impl VirtualMachine {
    /// Calls the VM function `name` with `inputs` (positionally, in parameter order), copied
    /// to the VM's device, and returns its outputs copied to the host: one tensor, or the
    /// tensors of a returned tuple, flattened in order. A bool input may be spelled either way
    /// (`uint1` as TVM 0.19-0.21 do, or tvm-ffi's 8-bit `kDLBool`); it is passed as the
    /// executable's TVM spells bool.
    ///
    /// A function that returns a shape (`R.shape_of`, a `ShapeTuple`) anywhere in its result is
    /// refused here with [`VmError::Output`]; [`VirtualMachine::invoke_outputs`] returns those.
    pub fn invoke(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().enumerate().map(|(i, t)| vm.upload_tensor(i, t, ffi_bool)).collect()
        })?;
        tensor_leaves(&result, name)?.into_iter().map(|t| Ok(t.to_tensor()?)).collect()
    }

    /// Like [`VirtualMachine::invoke`], but a shape in the result (TVM's `ShapeTuple`, as
    /// `R.shape_of` returns) comes back as [`VmOutput::Shape`] instead of being refused.
    pub fn invoke_outputs(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<VmOutput>, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().enumerate().map(|(i, t)| vm.upload_tensor(i, t, ffi_bool)).collect()
        })?;
        leaves(&result, name, true)?
            .into_iter()
            .map(|l| match l {
                Leaf::Shape(s) => Ok(VmOutput::Shape(s.to_vec())),
                Leaf::Tensor(t) => Ok(VmOutput::Tensor(t.to_tensor()?)),
            })
            .collect()
    }

    /// Calls the VM function `name` with any values (tensors, shapes, numbers, strings,
    /// tuples of them), as TVM's `relax.VirtualMachine` does from Python, and returns its
    /// result with its structure: nested tuples stay nested, tensors are copied to the host.
    /// Tensors are passed as [`VirtualMachine::invoke`] passes them.
    pub fn invoke_values(&mut self, name: &str, inputs: &[VmValue]) -> Result<VmValue, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            let mut next = 0;
            inputs.iter().map(|v| vm.upload_value(&mut next, v, ffi_bool)).collect()
        })?;
        self.download_value(&result, name)
    }

    /// Calls the VM function `name` with the caller's values (tensors on any device, shapes,
    /// numbers, strings, tuples, objects), as TVM's `relax.VirtualMachine` does from Python, and
    /// returns its result with its structure (nested tuples stay nested). Tensors are passed by
    /// reference: one on the VM's device as it is, one elsewhere as a copy there (as TVM's
    /// VM copies an argument on another device). The result's tensors stay where the
    /// program left them (on the VM's device), uncopied, a bool as numpy spells it; an output
    /// shares its storage with nothing the VM uses again while the caller holds it.
    pub fn call_values(&mut self, name: &str, inputs: &[ExecValue]) -> Result<ExecValue, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().map(|v| vm.upload_exec(v, ffi_bool)).collect()
        })?;
        self.exec_value(&result, name)
    }

    /// A caller's value as a register value.
    fn upload_exec(&self, v: &ExecValue, ffi_bool: bool) -> Result<Value, VmError> {
        Ok(match v {
            ExecValue::Tensor(a) => self.upload_array(a, ffi_bool)?,
            ExecValue::Shape(s) => Value::Shape(s.clone()),
            ExecValue::Int(i) => Value::Int(*i),
            ExecValue::Float(f) => Value::Float(*f),
            ExecValue::Str(s) => Value::Str(s.as_bytes().into()),
            ExecValue::Null => Value::Null,
            ExecValue::Object(o) => Value::Object(o.clone()),
            ExecValue::Tuple(items) => {
                Value::tuple(items.iter().map(|i| self.upload_exec(i, ffi_bool)).collect::<Result<Vec<_>, _>>()?)
            }
        })
    }

    /// A result as the caller's value: tensors where they lie, bools as numpy spells them.
    fn exec_value(&self, v: &Value, function: &str) -> Result<ExecValue, VmError> {
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
            Value::Tuple(items) => ExecValue::Tuple(
                tuple_items(items).iter().map(|i| self.exec_value(i, function)).collect::<Result<_, _>>()?,
            ),
            v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
        })
    }

    /// A value of the caller's as a register value; `next` numbers the tensors (for errors).
    pub(super) fn upload_value(&self, next: &mut usize, v: &VmValue, ffi_bool: bool) -> Result<Value, VmError> {
        Ok(match v {
            VmValue::Tensor(t) => {
                *next += 1;
                self.upload_tensor(*next - 1, t, ffi_bool)?
            }
            VmValue::Shape(s) => Value::Shape(s.as_slice().into()),
            VmValue::Int(i) => Value::Int(*i),
            VmValue::Float(f) => Value::Float(*f),
            VmValue::Str(s) => Value::Str(s.as_bytes().into()),
            VmValue::Null => Value::Null,
            VmValue::Object(o) => Value::Object(o.clone()),
            VmValue::Array(a) => {
                *next += 1;
                self.upload_array(a, ffi_bool)?
            }
            VmValue::Tuple(items) => {
                Value::tuple(items.iter().map(|i| self.upload_value(next, i, ffi_bool)).collect::<Result<Vec<_>, _>>()?)
            }
        })
    }

    /// A result as the caller's value: tensors copied to the host, bools as numpy spells them.
    pub(super) fn download_value(&self, v: &Value, function: &str) -> Result<VmValue, VmError> {
        Ok(match v {
            Value::Tensor(t) => {
                let t = t.to_tensor()?;
                VmValue::Tensor(Tensor { dtype: numpy_dtype(t.dtype), ..t })
            }
            Value::Shape(s) => VmValue::Shape(s.to_vec()),
            Value::Int(i) => VmValue::Int(*i),
            Value::Float(f) => VmValue::Float(*f),
            Value::Str(s) => VmValue::Str(String::from_utf8_lossy(s).into_owned()),
            Value::Null => VmValue::Null,
            Value::Object(o) => VmValue::Object(o.clone()),
            Value::Tuple(items) => VmValue::Tuple(
                tuple_items(items).iter().map(|i| self.download_value(i, function)).collect::<Result<_, _>>()?,
            ),
            v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
        })
    }

    /// Like [`VirtualMachine::invoke`] with tensors on any device: those not on the VM's
    /// device are copied there (the others are passed as they are, as TVM does), and the
    /// outputs stay where the program left them (on the VM's device), uncopied. An output
    /// shares its storage with nothing the VM uses again while the caller holds it.
    pub fn invoke_arrays(&mut self, name: &str, inputs: &[NdArray]) -> Result<Vec<NdArray>, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().map(|a| vm.upload_array(a, ffi_bool)).collect()
        })?;
        if let Value::Tensor(t) = result {
            // The commonest result, handed over without the walk.
            return Ok(vec![t]);
        }
        tensor_leaves(&result, name)
    }

    /// Finds the function, converts the inputs with `convert` and runs it.
    fn invoke_value(
        &mut self,
        name: &str,
        inputs: usize,
        convert: impl FnOnce(&VirtualMachine, bool) -> Result<Vec<Value>, VmError>,
    ) -> Result<Value, VmError> {
        let _span = tracing::debug_span!("relax_vm_invoke", function = name, inputs).entered();
        let exec = self.executable();
        let index = exec.functions.iter().position(|f| f.name == name && f.kind == FuncKind::Vm).ok_or_else(|| {
            VmError::UnknownFunction {
                name: name.to_owned(),
                available: exec.vm_functions().map(|f| f.name.clone()).collect(),
            }
        })?;
        let args = convert(self, exec.layout == Layout::Ffi)?;
        self.call_vm(index, args, 0)
    }

    /// Input `index`, a host tensor, in a storage of the VM's device.
    fn upload_tensor(&self, index: usize, t: &Tensor, ffi_bool: bool) -> Result<Value, VmError> {
        let expected = tensor_bytes(t.dtype, &t.shape);
        let len = t.data.len();
        let Some(n) = expected.filter(|&n| n == len as u64) else {
            return Err(VmError::Input {
                index,
                detail: format!(
                    "{len} bytes of data for shape {:?} and dtype {} (expected {expected:?})",
                    t.shape, t.dtype
                ),
            });
        };
        let storage = self.pool.alloc(0, &self.apis[0], n as usize)?;
        storage.write(0, &t.data)?;
        Ok(Value::Tensor(NdArray::in_storage(&storage, 0, &t.shape, bool_for_dialect(t.dtype, ffi_bool))?))
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
