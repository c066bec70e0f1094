//! What a Relax executable holds, for `inspect`: its function table, constants, string
//! constants, the constant arguments of its builtin calls, and MLC's `_metadata`.

use mblob_runtime::payload::relax::executable::{Arg, Instruction, Reg};
use mblob_runtime::payload::relax::{Constant, FuncKind, RelaxExecutable};
use serde_json::Value;

use super::report::{RelaxCall, RelaxConstant, RelaxFunction, RelaxReport, RelaxString};

/// The function table of a Relax executable, as the runtime's reader decoded it (the loader
/// that `describe` already ran; it accepts only the VM version string TVM has written).
pub(super) fn describe_relax(x: &RelaxExecutable) -> RelaxReport {
    let mut report = RelaxReport {
        version: x.version.clone(),
        functions: Vec::new(),
        externs: Vec::new(),
        constant_pool_len: 0,
        constants: Vec::new(),
        constants_bytes: 0,
        unsupported_calls: None,
        strings: Vec::new(),
        calls: Vec::new(),
        metadata: None,
    };
    for f in &x.functions {
        let (name, params) = (f.name.clone(), f.param_names.clone());
        match f.kind {
            FuncKind::Packed => report.externs.push(name),
            FuncKind::Vm => report.functions.push(RelaxFunction { name, kind: "vm", params }),
            FuncKind::VmTir => report.functions.push(RelaxFunction { name, kind: "vm-tir", params }),
        }
    }
    report
}

/// A Relax executable's constants, and the calls mblob cannot serve (when the library's
/// functions are known).
pub(super) fn describe_relax_more(r: &mut RelaxReport, x: &RelaxExecutable, exports: Option<&[String]>) {
    r.constant_pool_len = x.constants.len();
    for (index, c) in x.constants.iter().enumerate() {
        if let Constant::Tensor(t) = c {
            r.constants.push(RelaxConstant {
                index,
                dtype: t.dtype.to_string(),
                shape: t.shape.clone(),
                bytes: t.data.len(),
            });
            r.constants_bytes = r.constants_bytes.saturating_add(t.data.len());
        }
    }
    r.unsupported_calls =
        exports.map(|names| mblob_runtime::exec::relax::unsupported_calls(x, &|n| names.iter().any(|e| e == n)));
    for (index, c) in x.constants.iter().enumerate() {
        if let Constant::Str(bytes) = c {
            r.strings.push(RelaxString { index, text: String::from_utf8_lossy(bytes).into_owned() });
        }
    }
    r.calls = builtin_calls(x);
    r.metadata = metadata(x);
}

/// Whether a packed function is a builtin (a dotted name: `vm.builtin.*`, `mlc.*`), not a
/// kernel of the library (kernels have C names).
fn is_builtin(name: &str) -> bool {
    name.contains('.')
}

/// The value of an argument, for the report.
fn arg_value(x: &RelaxExecutable, arg: &Arg) -> Value {
    match arg {
        Arg::Reg(Reg::Index(i)) => Value::String(format!("%{i}")),
        Arg::Reg(r) => Value::String(r.to_string()),
        Arg::Imm(v) => Value::from(*v),
        Arg::Func(f) => Value::String(format!("@{}", x.functions.get(*f as usize).map_or("?", |f| f.name.as_str()))),
        Arg::Const(c) => match x.constants.get(*c as usize) {
            Some(Constant::Str(b)) => Value::String(String::from_utf8_lossy(b).into_owned()),
            Some(Constant::Int(v)) => Value::from(*v),
            Some(Constant::Float(v)) => Value::from(*v),
            Some(Constant::Shape(v)) => Value::from(v.clone()),
            Some(Constant::DataType(d)) => Value::String(d.to_string()),
            Some(Constant::Tensor(t)) => Value::String(format!("tensor {}{:?}", t.dtype, t.shape)),
            None => Value::Null,
        },
    }
}

/// Every call of a builtin that passes a constant or an immediate, in code order.
fn builtin_calls(x: &RelaxExecutable) -> Vec<RelaxCall> {
    let mut out = Vec::new();
    for f in x.functions.iter().filter(|f| f.kind == FuncKind::Vm) {
        let (Ok(start), Ok(end)) = (usize::try_from(f.start), usize::try_from(f.end)) else { continue };
        for ins in x.instructions.get(start..end).unwrap_or_default() {
            let Instruction::Call { func, args, .. } = ins else { continue };
            let Some(callee) = x.functions.get(*func as usize).filter(|c| c.kind == FuncKind::Packed) else { continue };
            if !is_builtin(&callee.name) || !args.iter().any(|a| matches!(a, Arg::Const(_) | Arg::Imm(_))) {
                continue;
            }
            out.push(RelaxCall {
                function: f.name.clone(),
                callee: callee.name.clone(),
                args: args.iter().map(|a| arg_value(x, a)).collect(),
            });
        }
    }
    out
}

/// What MLC's `_metadata` function returns, when that is a string constant: its code returns
/// the register a call filled from the constant (`%0 = vm.builtin.copy(c[k]); ret %0`) or the
/// constant's value some other single-argument call passes through.
fn metadata(x: &RelaxExecutable) -> Option<String> {
    let f = x.functions.iter().find(|f| f.kind == FuncKind::Vm && f.name == "_metadata")?;
    let code = x.instructions.get(usize::try_from(f.start).ok()?..usize::try_from(f.end).ok()?)?;
    let Some(Instruction::Ret { result }) = code.iter().rev().find(|i| matches!(i, Instruction::Ret { .. })) else {
        return None;
    };
    let filled = code.iter().rev().find_map(|i| match i {
        Instruction::Call { dst, args, .. } if dst == result => Some(args),
        _ => None,
    })?;
    match filled.as_slice() {
        [Arg::Const(c)] => match x.constants.get(*c as usize)? {
            Constant::Str(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}
