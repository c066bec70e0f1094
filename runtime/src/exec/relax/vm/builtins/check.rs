//! Argument checks: `check_*_info` of a function's parameters and `match_shape` /
//! `match_prim_value` against constants and the shape heap, with TVM's error kinds and messages.

use super::shape::{heap_get, heap_set};
use super::BuiltinFn;
use crate::exec::relax::checks;
use crate::exec::relax::vm::value::{check, Args, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;
use crate::payload::relax::executable::dtype_name;

pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.check_tensor_info", check_tensor_info),
    ("vm.builtin.check_shape_info", check_shape_info),
    ("vm.builtin.check_tuple_info", check_tuple_info),
    ("vm.builtin.check_func_info", check_func_info),
    ("vm.builtin.check_prim_value_info", check_prim_value_info),
    ("vm.builtin.check_string_info", check_string_info),
    ("vm.builtin.match_shape", match_shape),
    ("vm.builtin.match_prim_value", match_prim_value),
];

/// `vm.builtin.check_tensor_info`.
fn check_tensor_info(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let ndim = a.int(1)?;
    let (dtype, ctx) = if args.len() == 3 {
        (None, a.ctx(2)?)
    } else {
        let dtype = match a.get(2)? {
            Value::DType(t) => Some(*t),
            Value::Null => None,
            v => return Err(a.type_err(2, "a data type", v)),
        };
        (dtype, a.ctx(3)?)
    };
    let Value::Tensor(t) = a.get(0)? else {
        return Err(check("TypeError", format!("{ctx} expect a Tensor but get {}", vm.key(a.get(0)?))));
    };
    if ndim != -1 && t.shape().len() as i64 != ndim {
        return Err(check("ValueError", format!("{ctx} expect Tensor with ndim {ndim} but get {}", t.shape().len())));
    }
    if let Some(d) = dtype {
        if t.dtype() != d {
            return Err(check(
                "ValueError",
                format!("{ctx} expect Tensor with dtype {} but get {}", dtype_name(d), dtype_name(t.dtype())),
            ));
        }
    }
    Ok(Value::Null)
}

/// `vm.builtin.check_shape_info`.
fn check_shape_info(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let ndim = a.int(1)?;
    let ctx = a.ctx(2)?;
    let Value::Shape(s) = a.get(0)? else {
        return Err(check("TypeError", format!("{ctx} expect a Shape but get {}", vm.key(a.get(0)?))));
    };
    if ndim != -1 && s.len() as i64 != ndim {
        return Err(check("ValueError", format!("{ctx} expect Shape with ndim {ndim} but get {}", s.len())));
    }
    Ok(Value::Null)
}

/// `vm.builtin.check_tuple_info`.
fn check_tuple_info(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let size = a.int(1)?;
    let ctx = a.ctx(2)?;
    let Value::Tuple(t) = a.get(0)? else {
        return Err(check("TypeError", format!("{ctx} expect a Tuple but get {}", vm.key(a.get(0)?))));
    };
    if t.len() as i64 != size {
        return Err(check(
            "ValueError",
            format!("{ctx} expect a Tuple with {size} elements,  but get a Tuple with {} elements.", t.len()),
        ));
    }
    Ok(Value::Null)
}

/// `vm.builtin.check_func_info`.
fn check_func_info(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let ctx = a.ctx(1)?;
    match a.get(0)? {
        Value::Func(_) | Value::Closure(_) => Ok(Value::Null),
        v => Err(check("TypeError", format!("{ctx} expect a Function but get {}", vm.key(v)))),
    }
}

/// `vm.builtin.check_prim_value_info`.
fn check_prim_value_info(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let dtype = a.dtype(1)?;
    let ctx = a.ctx(2)?;
    let v = a.get(0)?;
    let dname = dtype_name(dtype);
    let convert = |to: &str| check("TypeError", format!("Cannot convert from type `{}` to `{to}`", vm.key(v)));
    // Objects are refused first; numbers, None and (in tvm-ffi) short strings are
    // POD values that then fail to convert.
    match (v, dtype.code) {
        (Value::Null | Value::Int(_) | Value::Float(_), _) => {}
        (v @ Value::Str(_), _) if vm.key(v) == "ffi.SmallStr" => {}
        (v, _) => {
            return Err(check(
                "TypeError",
                format!("{ctx}, expected dtype {dname}, but received ObjectRef of type {}", vm.key(v)),
            ))
        }
    }
    match (v, dtype.code, dtype.bits, dtype.lanes) {
        (Value::Int(_), 0 | 1 | 6, _, _) | (Value::Int(_) | Value::Float(_), 2, _, _) => Ok(Value::Null),
        (Value::Null, 3, b, l) if b != 0 || l != 0 => Ok(Value::Null),
        (_, 0 | 1, _, _) => Err(convert("int")),
        (_, 6, _, _) => Err(convert("bool")),
        (_, 2, _, _) => Err(convert("float")),
        (_, 3, b, l) if b != 0 || l != 0 => Err(convert("void*")),
        _ => Err(check("TypeError", format!("{ctx}, unsupported dtype {dname}"))),
    }
}

/// `vm.builtin.check_string_info`.
fn check_string_info(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let ctx = a.ctx(1)?;
    match a.get(0)? {
        Value::Str(_) => Ok(Value::Null),
        _ => Err(check("TypeError", format!("{ctx} expect a string"))),
    }
}

/// `vm.builtin.match_shape`.
fn match_shape(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let shape: &[i64] = match a.get(0)? {
        Value::Tensor(t) => t.shape(),
        Value::Shape(s) => s,
        v => return Err(a.type_err(0, "a tensor or a shape", v)),
    };
    let heap = a.heap(1)?;
    let size = a.int(2)?;
    // TVM checks the pairs and then reads the error context after them.
    checks::shape_pairs(3, size, args.len())?;
    let n = size as usize;
    let ctx = a.ctx(3 + 2 * n)?;
    if shape.len() != n {
        return Err(check("RuntimeError", format!("{ctx} match_cast shape size mismatch.")));
    }
    for (i, &dim) in shape.iter().enumerate() {
        let code = a.int(3 + 2 * i)?;
        let reg = a.int(4 + 2 * i)?;
        match code {
            0 if dim != reg => {
                return Err(check(
                    "RuntimeError",
                    format!("{ctx} match_cast error,  shape[{i}] mismatch to specified constant."),
                ))
            }
            0 | 2 => {}
            1 => heap_set(&heap, reg, dim, name)?,
            3 => {
                if dim != heap_get(&heap, reg, name)? {
                    return Err(check(
                        "RuntimeError",
                        format!("{ctx} match_cast error,  shape[{i}] mismatch to a previous populated value."),
                    ));
                }
            }
            _ => return Err(checks::shape_code(false)),
        }
    }
    Ok(Value::Null)
}

/// `vm.builtin.match_prim_value`.
fn match_prim_value(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let value = a.int(0)?;
    let heap = a.heap(1)?;
    let code = a.int(2)?;
    let reg = a.int(3)?;
    let ctx = a.ctx(4)?;
    match code {
        0 if value != reg => {
            Err(check("RuntimeError", format!("{ctx} match_cast error,  PrimValue mismatch to specified constant.")))
        }
        0 | 2 => Ok(Value::Null),
        1 => heap_set(&heap, reg, value, name).map(|_| Value::Null),
        3 if value != heap_get(&heap, reg, name)? => Err(check(
            "RuntimeError",
            format!("{ctx} match_cast error,  PrimValue mismatch to a previous populated value."),
        )),
        3 => Ok(Value::Null),
        c => Err(check("InternalError", format!("Unknown match shape code: {c}"))),
    }
}
