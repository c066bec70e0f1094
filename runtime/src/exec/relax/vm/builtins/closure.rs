//! Closures and calls: `make_closure`, `invoke_closure`, `call_tir_dyn`, `read_if_cond` and
//! the debug functions.

use std::sync::Arc;

use super::BuiltinFn;
use crate::exec::relax::vm::kernel::call_kernel;
use crate::exec::relax::vm::value::Closure;
use crate::exec::relax::vm::value::{check, Args, Value, VmError};
use crate::exec::relax::vm::Callee;
use crate::exec::relax::vm::VirtualMachine;
use crate::payload::relax::executable::dtype_name;

pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.make_closure", make_closure),
    ("vm.builtin.invoke_closure", invoke_closure),
    ("vm.builtin.call_tir_dyn", call_tir_dyn),
    ("vm.builtin.read_if_cond", read_if_cond),
    ("vm.builtin.invoke_debug_func", invoke_debug_func),
    ("vm.builtin.debug_print", debug_print),
];

/// `vm.builtin.make_closure`.
fn make_closure(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let f = a.get(0)?;
    let saved = args[1..].iter().map(|v| (*v).clone());
    Ok(Value::Closure(Arc::new(match f {
        Value::Func(f) => Closure { func: *f, bound: saved.collect() },
        // Binding again puts the new arguments before the ones bound already.
        Value::Closure(c) => Closure { func: c.func, bound: saved.chain(c.bound.iter().cloned()).collect() },
        v => return Err(a.type_err(0, "a function or closure", v)),
    })))
}

/// `vm.builtin.invoke_closure`.
fn invoke_closure(vm: &VirtualMachine, name: &str, args: &[&Value], depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // (vm, closure, args...)
    let f = a.get(1)?;
    vm.call_closure(f, &args[2..], depth)
}

/// `vm.builtin.call_tir_dyn`.
fn call_tir_dyn(vm: &VirtualMachine, name: &str, args: &[&Value], depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let Value::Func(f) = a.get(0)? else { return Err(a.type_err(0, "a function", a.get(0)?)) };
    let shape = a.shape(args.len().saturating_sub(1))?;
    let extents: Vec<Value> = shape.iter().map(|&d| Value::Int(d)).collect();
    let call_args: Vec<&Value> = args[1..args.len() - 1].iter().copied().chain(extents.iter()).collect();
    let f = *f as usize;
    match &vm.callees[f] {
        Callee::Kernel(kernel) => {
            call_kernel(&vm.executable().functions[f].name, kernel, &call_args)?;
            Ok(Value::Null)
        }
        _ => vm.call(f, &call_args, depth),
    }
}

/// `vm.builtin.read_if_cond`.
fn read_if_cond(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    match a.get(0)? {
        Value::Int(v) => Ok(Value::Int(i64::from(*v != 0))),
        Value::Tensor(t) if matches!(t.dtype().code, 0 | 1 | 6) && !t.is_empty() => {
            // The first element, read from wherever the tensor is.
            let mut raw = [0u8; 8];
            let bytes = usize::from(t.dtype().bits).div_ceil(8).min(8);
            t.storage().read(0, &mut raw[..bytes])?;
            Ok(Value::Int(i64::from(raw.iter().any(|&b| b != 0))))
        }
        v => Err(a.type_err(0, "an integer or an integer tensor", v)),
    }
}

/// `vm.builtin.invoke_debug_func`.
fn invoke_debug_func(vm: &VirtualMachine, name: &str, args: &[&Value], depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // (io_effect, debug function name, line info, args...): the debug functions
    // are Python functions registered in TVM's process; mblob has TVM's own
    // `vm.builtin.debug_print` (as a trace event) and no others.
    if !matches!(a.get(0)?, Value::Null) {
        return Err(check("ValueError", "IOEffect is expected to be lowered to None.".into()));
    }
    let func = a.str(1)?;
    let _ = a.str(2)?;
    if &*func != b"vm.builtin.debug_print" {
        let f = String::from_utf8_lossy(&func);
        return Err(check(
            "ValueError",
            format!("{f} is not found. Use the decorator `@tvm.register_global_func(\"{f}\")` to register it."),
        ));
    }
    debug_print(vm, "vm.builtin.debug_print", &args[2..], depth)?;
    Ok(Value::Null)
}

/// `vm.builtin.debug_print`.
fn debug_print(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let line = a.ctx(0)?;
    let t = a.tensor(1)?;
    tracing::info!(target: "mblob::relax::debug_print", "{line}: shape = {:?}, dtype = {}", t.shape(), dtype_name(t.dtype()));
    Ok(Value::Null)
}
