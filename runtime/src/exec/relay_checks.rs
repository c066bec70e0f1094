//! What the Relay VM checks of a program's indices, sizes and offsets, with TVM's messages where
//! TVM checks (TVM 0.19, `src/runtime/vm/vm.cc`, `memory/memory_manager.cc`, `ndarray.cc`), and
//! a typed error where TVM reads or writes out of range without a check (a register, a
//! constant index: a crash there).
//!
//! - The decoded executable ([`program`]): every register below its function's register file,
//!   every function, primitive and constant index within its table, every device index a
//!   virtual device, every jump inside its function; checked when the VM is made, so that an
//!   executable changed after reading (its fields are public) cannot make the interpreter index
//!   out of range. The reader checks the same of the bytes it reads.
//! - `AllocTensor` / `AllocTensorReg` ([`alloc_tensor`]): the tensor lies within its storage
//!   (`StorageObj::AllocNDArray`: `storage allocation failure, attempted to allocate ...`).
//! - `AllocStorage` ([`storage`]): a size that is not negative and an alignment that is a power
//!   of two (TVM's CPU allocator, `posix_memalign`, fails otherwise: `std::bad_alloc`).
//! - `GetField` ([`field_index`]): TVM's `Index 5 out of bounds 2`.
//! - `ReshapeTensor` ([`view`]): the view fits the tensor (`NDArray::CreateView`'s message).
//!
//! The check functions return [`Bad`] or [`TvmCheck`], which `exec::relay_vm` turns into its
//! error (this file does not name it, so that the two files do not import each other).

use crate::format::DataType;
use crate::payload::relax::executable::dtype_name;
use crate::payload::relay_vm::{Instruction, RelayVmExecutable, MAX_REGISTERS};

/// An instruction the VM cannot follow: the function, the instruction and what is wrong.
#[derive(Debug)]
pub(crate) struct Bad {
    pub(crate) function: String,
    pub(crate) pc: usize,
    pub(crate) detail: String,
}

/// One of TVM's runtime checks failed: its error kind and message (the check's own text, after
/// TVM's `Check failed: ... : ` prefix).
#[derive(Debug)]
pub(crate) struct TvmCheck {
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

/// Checks every index of the decoded executable `exec` against its tables.
pub(crate) fn program(exec: &RelayVmExecutable) -> Result<(), Bad> {
    let (functions, primitives, constants) = (exec.functions.len(), exec.primitives.len(), exec.constants.len());
    let devices = exec.virtual_devices.len();
    for f in &exec.functions {
        let file = f.register_file_size;
        let count = f.instructions.len();
        let bad = |pc: usize, detail: String| Bad { function: f.name.clone(), pc, detail };
        if u64::from(file) > MAX_REGISTERS || f.params.len() > file as usize || count == 0 {
            return Err(bad(0, format!("{} params, {file} registers and {count} instructions", f.params.len())));
        }
        for (pc, ins) in f.instructions.iter().enumerate() {
            let bad = |detail: String| bad(pc, detail);
            let regs = registers(ins);
            if let Some(r) = regs.iter().find(|&&r| r >= file) {
                return Err(bad(format!("register {r} is outside its {file} registers")));
            }
            let index = |what: &str, i: u64, n: usize| {
                if i < n as u64 {
                    Ok(())
                } else {
                    Err(bad(format!("{what} {i} is out of range (there are {n})")))
                }
            };
            // Device indexes are virtual devices from TVM 0.9 on (0.8 wrote device types).
            let device = |i: i64| {
                if devices == 0 || (0..devices as i64).contains(&i) {
                    Ok(())
                } else {
                    Err(bad(format!("device index {i} is not one of the {devices} virtual devices")))
                }
            };
            let jump = |off: i64| match (pc as i64).checked_add(off) {
                Some(t) if off != 0 && (0..count as i64).contains(&t) => Ok(()),
                _ => Err(bad(format!("jump by {off} leaves the function or spins"))),
            };
            match ins {
                Instruction::Invoke { func, .. } | Instruction::AllocClosure { func, .. } => {
                    index("function", u64::from(*func), functions)?
                }
                Instruction::InvokePacked { packed_index, output_size, args } => {
                    index("primitive", u64::from(*packed_index), primitives)?;
                    if *output_size as usize > args.len() {
                        return Err(bad(format!("output size {output_size} of {} arguments", args.len())));
                    }
                }
                Instruction::LoadConst { const_index, device_index, .. } => {
                    index("constant", u64::from(*const_index), constants)?;
                    if let Some(d) = device_index {
                        device(i64::from(*d))?;
                    }
                }
                Instruction::AllocStorage { device_index, .. } => device(*device_index)?,
                Instruction::DeviceCopy { src_device_index, dst_device_index, .. } => {
                    device(*src_device_index)?;
                    device(*dst_device_index)?;
                }
                Instruction::Goto { offset } => jump(*offset)?,
                Instruction::If { true_offset, false_offset, .. } => {
                    jump(*true_offset)?;
                    jump(*false_offset)?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Every register instruction `ins` reads or writes.
fn registers(ins: &Instruction) -> Vec<u32> {
    match ins {
        Instruction::Move { from, dst } => vec![*from, *dst],
        Instruction::Ret { result } => vec![*result],
        Instruction::Invoke { args, dst, .. } => args.iter().copied().chain([*dst]).collect(),
        Instruction::InvokeClosure { closure, args, dst } => args.iter().copied().chain([*closure, *dst]).collect(),
        Instruction::InvokePacked { args, .. } => args.clone(),
        Instruction::AllocTensor { storage, offset, dst, .. } => vec![*storage, *offset, *dst],
        Instruction::AllocTensorReg { storage, offset, shape_register, dst, .. } => {
            vec![*storage, *offset, *shape_register, *dst]
        }
        Instruction::AllocAdt { fields, dst, .. } => fields.iter().copied().chain([*dst]).collect(),
        Instruction::AllocClosure { free_vars, dst, .. } => free_vars.iter().copied().chain([*dst]).collect(),
        Instruction::GetField { object, dst, .. } | Instruction::GetTag { object, dst } => vec![*object, *dst],
        Instruction::If { test, target, .. } => vec![*test, *target],
        Instruction::LoadConst { dst, .. }
        | Instruction::LoadConsti { dst, .. }
        | Instruction::KillRegister { dst } => {
            vec![*dst]
        }
        Instruction::AllocStorage { allocation_size, dst, .. } => {
            allocation_size.iter().copied().chain([*dst]).collect()
        }
        Instruction::ShapeOf { tensor, dst } => vec![*tensor, *dst],
        Instruction::ReshapeTensor { tensor, newshape, dst } => vec![*tensor, *newshape, *dst],
        Instruction::DeviceCopy { src, dst, .. } => vec![*src, *dst],
        Instruction::Goto { .. } | Instruction::Fatal => Vec::new(),
    }
}

/// A tensor of `needed` bytes (`None`: overflows) at byte `offset` of a storage of `size`
/// bytes: the offset as an index when it fits, else TVM's check and message
/// (`StorageObj::AllocNDArray`; a negative offset fails it too, as an unsigned sum).
pub(crate) fn alloc_tensor(offset: i64, needed: Option<u64>, size: usize) -> Result<usize, TvmCheck> {
    let fits =
        u64::try_from(offset).ok().zip(needed).and_then(|(o, n)| o.checked_add(n)).is_some_and(|e| e <= size as u64);
    if fits {
        return Ok(offset as usize);
    }
    let needed = needed.map_or_else(|| "too many".to_owned(), |n| n.to_string());
    Err(TvmCheck {
        kind: "InternalError",
        message: format!(
            "storage allocation failure, attempted to allocate {needed} at offset {offset} in region that is {size}bytes"
        ),
    })
}

/// `AllocStorage` of `size` bytes aligned to `alignment`: the size as a length, or why TVM's
/// allocator fails (a negative size is a huge `size_t` there, an alignment that is not a power
/// of two `posix_memalign`'s `EINVAL`: both `std::bad_alloc`).
pub(crate) fn storage(size: i64, alignment: i64) -> Result<usize, TvmCheck> {
    let bad = |what: String| TvmCheck { kind: "InternalError", message: format!("std::bad_alloc ({what})") };
    if !u64::try_from(alignment).is_ok_and(u64::is_power_of_two) {
        return Err(bad(format!("alignment {alignment} is not a power of two")));
    }
    usize::try_from(size).map_err(|_| bad(format!("a storage of {size} bytes")))
}

/// `GetField` of field `index` of an ADT of `len` fields: TVM's check (`idx < size`).
pub(crate) fn field_index(index: u32, len: usize) -> TvmCheck {
    TvmCheck { kind: "InternalError", message: format!("Index {index} out of bounds {len}") }
}

/// `ReshapeTensor` to `shape` of a tensor of `from` (shape, dtype, bytes): fine when the view
/// is no larger than the tensor, else `NDArray::CreateView`'s check and message (TVM 0.19).
pub(crate) fn view(shape: &[i64], from: (&[i64], DataType, usize)) -> Result<(), TvmCheck> {
    let (from_shape, dtype, size) = from;
    let view = crate::array::tensor_bytes(dtype, shape);
    if view.is_some_and(|v| v <= size as u64) {
        return Ok(());
    }
    let dims = |s: &[i64]| s.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let view = view.map_or_else(|| "too many".to_owned(), |v| v.to_string());
    Err(TvmCheck {
        kind: "ValueError",
        message: format!(
            "View with shape [{}] and datatype {d} would have a size of {view} bytes.  This would occupy bytes 0 <= \
             i_byte < {view} within the backing array.  However, the NDArray being viewed only contains {size} bytes \
             (shape = [{}], dtype= {d}).",
            dims(shape),
            dims(from_shape),
            d = dtype_name(dtype),
        ),
    })
}

/// A shape tensor of `shape` and `dtype` (`AllocTensorReg`'s, `ReshapeTensor`'s new shape): TVM
/// 0.19's checks in their order. `ToShape` (`AllocTensorReg`): a 1-d int32 or int64 tensor;
/// `ReshapeTensor`: an int64 tensor (code 0, 64 bits; its rank is not checked there).
pub(crate) fn shape_tensor(shape: &[i64], dtype: DataType, reshape: bool) -> Result<(), TvmCheck> {
    let internal = |message: String| Err(TvmCheck { kind: "InternalError", message });
    if reshape {
        // TVM prints the fields as characters (they are `uint8_t`).
        if dtype.code != 0 {
            return internal(format!("Check failed: dl_tensor->dtype.code == 0u ({} vs. 0) :", char::from(dtype.code)));
        }
        if dtype.bits != 64 {
            return internal(format!(
                "Check failed: dl_tensor->dtype.bits == 64u ({} vs. 64) :",
                char::from(dtype.bits)
            ));
        }
        return Ok(());
    }
    if shape.len() != 1 {
        return internal(format!("shape tensor should be a k-length vector, found {}", shape.len()));
    }
    if dtype.code != 0 || dtype.lanes != 1 || !matches!(dtype.bits, 32 | 64) {
        return internal(format!("invalid shape tensor datatype: {}", dtype_name(dtype)));
    }
    Ok(())
}
