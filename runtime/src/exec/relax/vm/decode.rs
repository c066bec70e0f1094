//! Instruction decoding: the commonest calls decoded once, when the VM is made, into
//! specialised operations ([`Op`]) that [`VirtualMachine::quick`] runs without the general
//! call's dispatch.

use std::sync::atomic::AtomicUsize;

use super::kernel::call_kernel;
use super::types::{Callee, Op, Quick, VirtualMachine};
use super::value::{Value, VmError};
use crate::array::{tensor_bytes, NdArray};
use crate::exec::pool::POOL_PAGE;
use crate::payload::relax::executable::{Arg, Instruction, Reg};

impl Op {
    /// The operation instruction `ins` of `exec` becomes, with `callees` its resolved function
    /// table and `constants` its constants as values; [`Op::General`] for all that is not one
    /// of the quick cases.
    pub(super) fn decode(ins: &Instruction, callees: &[Callee], constants: &[Value], devices: usize) -> Op {
        let Instruction::Call { func, args, .. } = ins else { return Op::General };
        let value = |a: &Arg| match *a {
            Arg::Const(c) => constants.get(c as usize).cloned(),
            Arg::Imm(v) => Some(Value::Int(v)),
            Arg::Reg(Reg::Void) => Some(Value::Null),
            _ => None,
        };
        let int = |a: &Arg| match *a {
            Arg::Imm(v) => Some(v),
            _ => None,
        };
        let reg = |a: &Arg| match *a {
            Arg::Reg(Reg::Index(r)) => Some(r),
            _ => None,
        };
        let global = |a: Option<&Arg>| match a {
            None => true,
            Some(a) => matches!(value(a), Some(Value::Str(s)) if &*s == b"global"),
        };
        let decoded = match callees.get(*func as usize) {
            Some(Callee::Builtin("vm.builtin.null_value", _)) if args.is_empty() => Some(Op::Null),
            Some(Callee::Kernel(kernel)) => args
                .iter()
                .map(reg)
                .collect::<Option<Box<[u32]>>>()
                .map(|regs| Op::Kernel { kernel: kernel.clone(), regs }),
            Some(Callee::Builtin("vm.builtin.alloc_storage", _)) if (4..=5).contains(&args.len()) => (|| {
                let Some(Value::Shape(shape)) = value(&args[1]) else { return None };
                // An index TVM refuses (`checks::device_index`) runs the general call, which refuses it.
                let device = usize::try_from(int(&args[2])?).ok().filter(|&i| i < devices)?;
                let Some(Value::DType(dtype)) = value(&args[3]) else { return None };
                if !global(args.get(4)) || shape.iter().any(|&d| d < 0) {
                    return None;
                }
                let size = tensor_bytes(dtype, &shape)?.checked_next_multiple_of(POOL_PAGE)?;
                Some(Op::AllocStorage { device, len: usize::try_from(size).ok()?, hint: AtomicUsize::new(usize::MAX) })
            })(),
            Some(Callee::Builtin("vm.builtin.alloc_tensor", _)) if (4..=5).contains(&args.len()) => (|| {
                let storage = reg(&args[0])?;
                let offset = int(&args[1])?;
                let Some(Value::Shape(shape)) = value(&args[2]) else { return None };
                let Some(Value::DType(dtype)) = value(&args[3]) else { return None };
                if !global(args.get(4)) || shape.iter().any(|&d| d < 0) {
                    return None;
                }
                let offset_bytes = u64::try_from(offset).ok()?;
                let end = offset_bytes.checked_add(tensor_bytes(dtype, &shape)?)?;
                Some(Op::AllocTensor { storage, offset: usize::try_from(offset_bytes).ok()?, end, shape, dtype })
            })(),
            Some(Callee::Builtin("vm.builtin.check_tensor_info", _)) if (3..=4).contains(&args.len()) => (|| {
                let r = reg(&args[0])?;
                let ndim = int(&args[1])?;
                let dtype = match args.len() {
                    3 => None,
                    _ => match value(&args[2])? {
                        Value::DType(t) => Some(t),
                        Value::Null => None,
                        _ => return None,
                    },
                };
                if !matches!(value(&args[args.len() - 1])?, Value::Str(_) | Value::Null) {
                    return None;
                }
                Some(Op::CheckTensor { reg: r, ndim, dtype })
            })(
            ),
            Some(Callee::Builtin("vm.builtin.match_shape", _)) if args.len() >= 4 => (|| {
                let r = reg(&args[0])?;
                if !matches!(args[1], Arg::Reg(Reg::Void)) {
                    return None;
                }
                let n = usize::try_from(int(&args[2])?).ok()?;
                if n.checked_mul(2).and_then(|m| m.checked_add(4)) != Some(args.len())
                    || !matches!(value(&args[3 + 2 * n])?, Value::Str(_) | Value::Null)
                {
                    return None;
                }
                let dims = (0..n)
                    .map(|i| match (int(&args[3 + 2 * i])?, int(&args[4 + 2 * i])?) {
                        (0, v) => Some(Some(v)),
                        (2, _) => Some(None),
                        _ => None,
                    })
                    .collect::<Option<_>>()?;
                Some(Op::MatchShape { reg: r, dims })
            })(),
            _ => None,
        };
        decoded.unwrap_or(Op::General)
    }
}
impl VirtualMachine {
    /// Runs the decoded operation `op` of a call of `func` on `regs` when its quick conditions
    /// hold, else says to run the general call.
    #[inline]
    pub(super) fn quick(&self, op: &Op, regs: &[Value], func: u32) -> Result<Quick, VmError> {
        Ok(match op {
            Op::General => Quick::General,
            Op::Null => Quick::Value(Value::Null),
            Op::Kernel { kernel, regs: args } => {
                let mut stack: [&Value; 8] = [&Value::Null; 8];
                if args.len() > stack.len() {
                    return Ok(Quick::General);
                }
                for (slot, &r) in stack.iter_mut().zip(args.iter()) {
                    *slot = &regs[r as usize];
                }
                let name = &self.executable().functions[func as usize].name;
                Quick::Value(call_kernel(name, kernel, &stack[..args.len()])?)
            }
            Op::AllocStorage { device, len, hint } => {
                let storage = self.pool.alloc_at(Some(hint), *device, &self.apis[*device], *len)?;
                Quick::Value(Value::Storage(storage))
            }
            Op::AllocTensor { storage, offset, end, shape, dtype } => match &regs[*storage as usize] {
                Value::Storage(s) if *end <= s.nbytes() as u64 => Quick::Value(Value::Tensor(
                    NdArray::in_storage_shared(s, *offset, shape.clone(), *dtype)?.with_vm_offset(*offset),
                )),
                _ => Quick::General,
            },
            Op::CheckTensor { reg, ndim, dtype } => match &regs[*reg as usize] {
                Value::Tensor(t)
                    if (*ndim == -1 || t.shape().len() as i64 == *ndim) && dtype.is_none_or(|d| d == t.dtype()) =>
                {
                    Quick::Value(Value::Null)
                }
                _ => Quick::General,
            },
            Op::MatchShape { reg, dims } => {
                let shape: &[i64] = match &regs[*reg as usize] {
                    Value::Tensor(t) => t.shape(),
                    Value::Shape(s) => s,
                    _ => return Ok(Quick::General),
                };
                let matches = shape.len() == dims.len()
                    && shape.iter().zip(dims.iter()).all(|(&d, want)| want.is_none_or(|w| w == d));
                if matches {
                    Quick::Value(Value::Null)
                } else {
                    Quick::General
                }
            }
        })
    }
}
