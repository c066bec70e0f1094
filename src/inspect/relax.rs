//! What a Relax executable holds, for `inspect`: its function table, constants, string
//! constants, the constant arguments of its builtin calls, and MLC's `_metadata`.

use mblob_runtime::payload::relax::{Constant, FuncKind, RelaxExecutable};

use super::{RelaxConstant, RelaxFunction, RelaxReport};

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
}
