//! The `relax.run.*` functions the VM calls by name (`call_pure_packed`) that TVM registers
//! from Python over numpy (`python/tvm/relax/op/set.py`), so that TVM's C++ runtime alone
//! cannot run them: `relax.run.unique` and `relax.run.nonzero`, computed by
//! [`crate::ops::set`], `relax.run.assert_op` (`R.assert_op`), `relax.run.print` (`R.print`,
//! to standard output) and `relax.run.shape_to_tensor`. Their results are new tensors on the host, as `tvm.runtime.tensor(...)`
//! makes them in TVM's Python function.

use super::{Value, VmError};
use crate::array::NdArray;
use crate::device::Device;
use crate::ops::{self, Owned};
#[cfg(feature = "ops")]
use crate::ops::{set::UniqueFlags, View};

/// A VM-level function: its name (for errors) and its arguments.
pub(super) type RunFn = fn(&str, &[&Value]) -> Result<Value, VmError>;

/// The `relax.run.*` function `name`, if mblob provides it.
pub(super) fn lookup(name: &str) -> Option<RunFn> {
    match name {
        #[cfg(feature = "ops")]
        "relax.run.unique" => Some(unique),
        #[cfg(feature = "ops")]
        "relax.run.nonzero" => Some(nonzero),
        "relax.run.assert_op" => Some(assert_op),
        "relax.run.print" => Some(print),
        "relax.run.shape_to_tensor" => Some(shape_to_tensor),
        _ => None,
    }
}

#[cfg(feature = "ops")]
fn op_error(name: &str, e: ops::OpError) -> VmError {
    VmError::Kernel { name: name.to_owned(), code: -1, message: e.to_string() }
}

#[cfg(feature = "ops")]
fn host_tensor(name: &str, args: &[&Value], i: usize) -> Result<crate::payload::graph::Tensor, VmError> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(t.to_tensor()?),
        Some(v) => Err(VmError::Type { callee: name.to_owned(), index: i, expected: "a tensor", got: v.kind() }),
        None => Err(super::value::missing_argument(name, i, args.len())),
    }
}

#[cfg(feature = "ops")]
fn flag(name: &str, args: &[&Value], i: usize) -> Result<bool, VmError> {
    match args.get(i) {
        Some(Value::Int(v)) => Ok(*v != 0),
        Some(v) => {
            Err(VmError::Type { callee: name.to_owned(), index: i, expected: "an integer (a flag)", got: v.kind() })
        }
        None => Err(super::value::missing_argument(name, i, args.len())),
    }
}

fn to_value(t: Owned) -> Result<Value, VmError> {
    Ok(Value::Tensor(NdArray::from_bytes(&t.data, &t.shape, t.dtype, Device::cpu(0))?))
}

#[cfg(feature = "ops")]
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
        return outs.into_iter().next().map_or_else(|| Err(VmError::NoResult { callee: name.to_owned() }), to_value);
    }
    let items = outs.into_iter().map(to_value).collect::<Result<Vec<_>, _>>()?;
    Ok(Value::tuple(items))
}

#[cfg(feature = "ops")]
/// `relax.run.nonzero(x)`.
fn nonzero(name: &str, args: &[&Value]) -> Result<Value, VmError> {
    let x = host_tensor(name, args, 0)?;
    let view = View { dtype: x.dtype, shape: &x.shape, data: &x.data };
    to_value(ops::set::nonzero(view).map_err(|e| op_error(name, e))?)
}

/// `relax.run.assert_op(condition, format_str, *args)`: nothing when the condition (an
/// integer, or a 0-d bool tensor) holds, else TVM's `AssertionError` with the message its
/// Python function formats: `format_str.format(*args)` (positional `{}` and `{N}` fields,
/// `{{`/`}}` escapes), `", ".join(args)` for an empty format, `Assertion Failed` with no
/// arguments. Integers, floats, strings and shapes render as Python's `str` renders them;
/// a tensor argument renders as `<tensor dtype shape>` (TVM prints its elements).
fn assert_op(name: &str, args: &[&Value]) -> Result<Value, VmError> {
    let check = |message: String| VmError::Check { kind: "ValueError", message };
    let holds = match args.first() {
        Some(Value::Int(v)) => *v != 0,
        Some(Value::Tensor(t)) => {
            let d = crate::exec::relax::vm::numpy_dtype(t.dtype());
            if d != crate::format::DataType::BOOL {
                return Err(check(format!(
                    "The condition must be a bool scalar, but given a {} tensor",
                    ops::dtype_name(t.dtype())
                )));
            }
            if !t.shape().is_empty() {
                return Err(check(format!("The condition must be a scalar, but it has a shape of {:?}", t.shape())));
            }
            t.to_tensor()?.data.first().is_some_and(|b| *b != 0)
        }
        Some(v) => {
            return Err(check(format!(
                "The condition for relax assert must be a bool, int, or Tensor, but received a {}.",
                v.kind()
            )))
        }
        None => return Err(super::value::missing_argument(name, 0, 0)),
    };
    let format = match args.get(1) {
        Some(Value::Str(s)) => String::from_utf8_lossy(s).into_owned(),
        Some(v) => {
            return Err(check(format!("The format string argument to assert must be a string, given {})", v.kind())))
        }
        None => String::new(),
    };
    if holds {
        return Ok(Value::Null);
    }
    let rendered: Vec<String> = args.iter().skip(2).map(|v| render(v)).collect();
    let message = if rendered.is_empty() && format.is_empty() {
        "Assertion Failed".to_owned()
    } else if format.is_empty() {
        rendered.join(", ")
    } else {
        python_format(&format, &rendered)
    };
    Err(VmError::Check { kind: "AssertionError", message })
}

/// `relax.run.print(format, *values)` (`R.print`): the values as TVM's `render_object` shows
/// them, formatted with `format` (Python's `str.format`) or, when it is empty, separated by
/// spaces as Python's `print` separates them; one line on standard output, as TVM prints it.
fn print(name: &str, args: &[&Value]) -> Result<Value, VmError> {
    use std::io::Write;
    let format = match args.first() {
        Some(Value::Str(s)) => String::from_utf8_lossy(s).into_owned(),
        Some(v) => {
            return Err(VmError::Type { callee: name.to_owned(), index: 0, expected: "a format string", got: v.kind() })
        }
        None => return Err(super::value::missing_argument(name, 0, 0)),
    };
    let rendered: Vec<String> = args.iter().skip(1).map(|v| render(v)).collect();
    let line = if format.is_empty() { rendered.join(" ") } else { python_format(&format, &rendered) };
    tracing::debug!(target: "mblob::relax::print", "{line}");
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|source| VmError::Stdout { callee: name.to_owned(), source })?;
    Ok(Value::Null)
}

/// `relax.run.shape_to_tensor(shape)`: the shape as a 1-d int64 tensor on the host, as
/// `tvm.runtime.tensor([int(v) for v in shape])` makes it.
fn shape_to_tensor(name: &str, args: &[&Value]) -> Result<Value, VmError> {
    match args.first() {
        Some(Value::Shape(s)) => {
            let data = s.iter().flat_map(|d| d.to_le_bytes()).collect();
            let len = i64::try_from(s.len()).map_err(|_| VmError::OutOfRange {
                callee: name.to_owned(),
                what: "shape length",
                value: s.len().to_string(),
            })?;
            to_value(Owned { dtype: crate::format::DataType::I64, shape: vec![len], data })
        }
        Some(v) => Err(VmError::Type { callee: name.to_owned(), index: 0, expected: "a shape", got: v.kind() }),
        None => Err(super::value::missing_argument(name, 0, 0)),
    }
}

/// A value as TVM's `render_object` (Python's `str`) shows it.
fn render(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        Value::Float(f) => f.to_string(),
        Value::Str(s) => String::from_utf8_lossy(s).into_owned(),
        Value::Shape(s) => {
            let items: Vec<String> = s.iter().map(|d| d.to_string()).collect();
            format!("({})", items.join(", "))
        }
        Value::Tuple(items) => {
            format!("({})", super::tuple_items(items).iter().map(render).collect::<Vec<_>>().join(", "))
        }
        Value::Tensor(t) => format!("<tensor {} {:?}>", ops::dtype_name(t.dtype()), t.shape()),
        Value::Null => "None".to_owned(),
        v => v.kind().to_owned(),
    }
}

/// Python's `str.format` for positional fields (`{}`, `{N}`) and `{{`/`}}`; a field it cannot
/// fill is kept as written.
fn python_format(format: &str, args: &[String]) -> String {
    let mut out = String::new();
    let mut next = 0;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut field = String::new();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    field.push(c);
                }
                let index = if field.is_empty() {
                    next += 1;
                    Some(next - 1)
                } else {
                    field.parse::<usize>().ok()
                };
                match index.and_then(|i| args.get(i)) {
                    Some(a) => out.push_str(a),
                    None => {
                        out.push('{');
                        out.push_str(&field);
                        out.push('}');
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}
