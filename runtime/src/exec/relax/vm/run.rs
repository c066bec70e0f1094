//! The `relax.run.*` functions the VM calls by name (`call_pure_packed`) that TVM registers
//! from Python over numpy (`python/tvm/relax/op/set.py`), so that TVM's C++ runtime alone
//! cannot run them: `relax.run.unique` and `relax.run.nonzero`, computed by
//! [`crate::ops::set`]. Their results are new tensors on the host, as `tvm.runtime.tensor(...)`
//! makes them in TVM's Python function.

use super::{Value, VmError};
use crate::array::NdArray;
use crate::device::Device;
use crate::ops::{self, set::UniqueFlags, Owned, View};

/// A VM-level function: its name (for errors) and its arguments.
pub(super) type RunFn = fn(&str, &[&Value]) -> Result<Value, VmError>;

/// The `relax.run.*` function `name`, if mblob provides it.
pub(super) fn lookup(name: &str) -> Option<RunFn> {
    match name {
        "relax.run.unique" => Some(unique),
        "relax.run.nonzero" => Some(nonzero),
        _ => None,
    }
}

fn op_error(name: &str, e: ops::OpError) -> VmError {
    VmError::Kernel { name: name.to_owned(), code: -1, message: e.to_string() }
}

fn host_tensor(name: &str, args: &[&Value], i: usize) -> Result<crate::payload::graph::Tensor, VmError> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(t.to_tensor()?),
        Some(v) => Err(VmError::Type { callee: name.to_owned(), index: i, expected: "a tensor", got: v.kind() }),
        None => Err(VmError::Program(format!("`{name}` needs argument {i}, but was given {}", args.len()))),
    }
}

fn flag(name: &str, args: &[&Value], i: usize) -> Result<bool, VmError> {
    match args.get(i) {
        Some(Value::Int(v)) => Ok(*v != 0),
        Some(v) => {
            Err(VmError::Type { callee: name.to_owned(), index: i, expected: "an integer (a flag)", got: v.kind() })
        }
        None => Err(VmError::Program(format!("`{name}` needs argument {i}, but was given {}", args.len()))),
    }
}

fn to_value(t: Owned) -> Result<Value, VmError> {
    Ok(Value::Tensor(NdArray::from_bytes(&t.data, &t.shape, t.dtype, Device::cpu(0))?))
}

/// `relax.run.unique(x, sorted, return_index, return_inverse, return_counts[, axis])`: the
/// unique values alone, or a tuple with what the flags ask for.
fn unique(name: &str, args: &[&Value]) -> Result<Value, VmError> {
    let x = host_tensor(name, args, 0)?;
    let flags = UniqueFlags {
        sorted: flag(name, args, 1)?,
        return_index: flag(name, args, 2)?,
        return_inverse: flag(name, args, 3)?,
        return_counts: flag(name, args, 4)?,
    };
    let axis = match args.get(5) {
        None | Some(Value::Null) => None,
        Some(Value::Int(a)) => Some(*a),
        Some(v) => {
            return Err(VmError::Type { callee: name.to_owned(), index: 5, expected: "an axis or None", got: v.kind() })
        }
    };
    let view = View { dtype: x.dtype, shape: &x.shape, data: &x.data };
    let outs = ops::set::unique(view, flags, axis).map_err(|e| op_error(name, e))?;
    if !(flags.return_index || flags.return_inverse || flags.return_counts) {
        return outs.into_iter().next().map_or_else(|| Err(VmError::Program(format!("`{name}`: no result"))), to_value);
    }
    let items = outs.into_iter().map(to_value).collect::<Result<Vec<_>, _>>()?;
    Ok(Value::Tuple(items.into()))
}

/// `relax.run.nonzero(x)`.
fn nonzero(name: &str, args: &[&Value]) -> Result<Value, VmError> {
    let x = host_tensor(name, args, 0)?;
    let view = View { dtype: x.dtype, shape: &x.shape, data: &x.data };
    to_value(ops::set::nonzero(view).map_err(|e| op_error(name, e))?)
}
