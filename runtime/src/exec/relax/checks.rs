//! What the VMs check of a program's pointers, sizes and offsets, as TVM does, so that a bad
//! executable gets TVM's error instead of a kernel reading or writing where it should not.
//!
//! - `vm.builtin.alloc_tensor` (Relax) and `AllocTensor` (Relay VM) at a non-zero byte offset
//!   of a storage: TVM makes the tensor as the storage's pointer plus a `DLTensor.byte_offset`
//!   (`StorageObj::AllocTensor`), and the kernels TVM compiles check that offset against their
//!   buffers' (0 unless a buffer says otherwise), failing with their own message (TVM 0.27:
//!   `ValueError: Invalid a.byte_offset on argument #0 when calling: ... expected 0`). mblob
//!   passes such tensors to kernels the same way ([`kernel_dl_tensor`](crate::ffi::kernel_call::kernel_dl_tensor)), so the kernel refuses
//!   them as under TVM; before, it got a pointer into the middle of the storage (not 64-byte
//!   aligned for most offsets, which TVM's kernels assume: a crash).

use super::vm::value::check;
use super::vm::VmError;
use crate::array::NdArray;
use crate::format::DataType;
use crate::payload::relax::executable::{dtype_name, Arg, FuncKind, Instruction, Reg, RelaxExecutable, MAX_VM_ARGS};

/// A tensor of `needed` bytes (`None`: a size that overflows) at `offset` does not fit the
/// storage of `size` bytes the program planned: TVM's check (`StorageObj::AllocTensor`), which
/// inputs over the upper bounds the program was built for fail (a batch over its maximum, a
/// longer sequence), an input error.
pub(crate) fn alloc_tensor_overrun(needed: Option<u64>, offset: i64, size: usize) -> VmError {
    let needed = needed.map_or_else(|| "too many".to_owned(), |n| n.to_string());
    VmError::InputBound {
        kind: "InternalError",
        message: format!(
            "Check failed: (offset + needed_size <= this->buffer.size) is false: storage allocation failure, attempted \
             to allocate {needed} at offset {offset} in region that is {size}bytes"
        ),
    }
}

/// `vm.builtin.tuple_getitem` / `tuple_reset_item` of `index` in a tuple of `len` items: TVM's
/// `ffi::Array` check (TVM 0.27: `IndexError: Index 5 out of bounds 2`; TVM 0.19's
/// `ArrayNode::at` fails the same way).
pub(crate) fn tuple_index(index: i64, len: usize) -> VmError {
    check("IndexError", format!("Index {index} out of bounds {len}"))
}

/// A view (`vm.builtin.reshape`, `runtime.TVMTensorCreateView`) of `shape` and `dtype` at
/// `offset` bytes into `t` that would read past `t`: TVM's `Tensor::CreateView` check, its text.
/// `view` is the view's size (`None`: it overflows).
pub(crate) fn view_overrun(shape: &[i64], dtype: DataType, offset: i64, view: Option<u64>, t: &NdArray) -> VmError {
    let dims = |s: &[i64]| s.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let end = view.map_or_else(|| "too many".to_owned(), |v| (i128::from(v) + i128::from(offset)).to_string());
    let size = view.map_or_else(|| "too many".to_owned(), |v| v.to_string());
    check(
        "ValueError",
        format!(
            "View with shape [{}] and datatype {} would have a size of {size} bytes.  This would occupy bytes {offset} \
             <= i_byte < {end} within the backing array.  However, the Tensor being viewed only contains {} bytes \
             (shape = [{}], dtype= {}).",
            dims(shape),
            dtype_name(dtype),
            t.nbytes(),
            dims(t.shape()),
            dtype_name(t.dtype())
        ),
    )
}

/// Whether a view of `view` bytes (`None`: overflows) at `offset` fits a tensor of `size` bytes.
pub(crate) fn view_fits(offset: i64, view: Option<u64>, size: usize) -> bool {
    u64::try_from(offset).ok().zip(view).and_then(|(o, v)| o.checked_add(v)).is_some_and(|e| e <= size as u64)
}

/// `vm.builtin.alloc_storage` on device `index` of a VM with `devices` devices: TVM's check
/// `device_index < vm->devices.size()` and its message. TVM compares as unsigned, so that it
/// refuses every negative index, `-1` too (its code after the check would take `-1` for the
/// host, but no index gets there: TVM 0.27 and 0.19 refuse it, `tests/fixtures/vm-checks`).
pub(crate) fn device_index(index: i64, devices: usize) -> Result<usize, VmError> {
    usize::try_from(index)
        .ok()
        .filter(|&i| i < devices)
        .ok_or_else(|| check("InternalError", "The device index is out of VM physical devices list".to_owned()))
}

/// The argument position `first + 2 * count` (`match_shape`'s and `make_shape`'s code/value
/// pairs after `first` fixed arguments, then for `match_shape` the error context) when it lies
/// within `len` arguments; TVM checks `kBeginCode + size * 2 <= args.size()` (its message is
/// empty: the condition is given). A count that overflows is refused the same way.
pub(crate) fn shape_pairs(first: usize, count: i64, len: usize) -> Result<usize, VmError> {
    usize::try_from(count)
        .ok()
        .and_then(|n| n.checked_mul(2))
        .and_then(|n| n.checked_add(first))
        .filter(|&end| end <= len)
        .ok_or_else(|| {
            let want = i128::from(first as u64) + 2 * i128::from(count);
            check("InternalError", format!("Check failed: kBeginCode + size * 2 <= args.size() ({want} vs. {len}) :"))
        })
}

/// An unknown `match_shape` / `make_shape` code: TVM's check (`code == kAssertEqualToLoad`,
/// `code == kLoadShape`: its condition, the message being empty).
pub(crate) fn shape_code(make: bool) -> VmError {
    let want = if make { "MakeShapeCode::kLoadShape" } else { "MatchShapeCode::kAssertEqualToLoad" };
    check("InternalError", format!("Check failed: (code == {want}) is false:"))
}

/// `vm.builtin.tensor_to_shape` of a tensor that is not 1-d int16/int32/int64: TVM's checks in
/// their order (`arr->ndim == 1`, `arr->dtype.code == kDLInt`, then the bits), their text.
pub(crate) fn tensor_to_shape(t: &NdArray) -> Result<(), VmError> {
    let ndim = t.shape().len();
    let d = t.dtype();
    if ndim != 1 {
        return Err(check("InternalError", format!("Check failed: arr->ndim == 1 ({ndim} vs. 1) :")));
    }
    if d.code != 0 {
        // TVM prints the code as a character (a `uint8_t`).
        let code = char::from(d.code);
        return Err(check("InternalError", format!("Check failed: arr->dtype.code == kDLInt ({code} vs. 0) :")));
    }
    if d.lanes != 1 || !matches!(d.bits, 16 | 32 | 64) {
        return Err(check("InternalError", format!("Unknown scalar int type: {}", dtype_name(d))));
    }
    Ok(())
}

/// Checks a decoded executable before a VM runs it: every index an instruction holds is one
/// the VM can follow. The reader checks the same of the bytes it reads
/// ([`RelaxExecutable::read`]); an executable made or changed after reading (its fields are
/// public) is checked here, so that no instruction indexes past a register file, the constant
/// pool or the function table, or jumps out of its function. TVM checks only some of these
/// when it runs (`ReadRegister`, the constant pool: not at all; a function index:
/// `func_idx < func_pool_.size()`; a jump: `run into invalid section`), a crash for the rest:
/// each is [`VmError::Bytecode`] here, before anything runs.
pub(crate) fn program(exec: &RelaxExecutable) -> Result<(), VmError> {
    let count = exec.instructions.len();
    let (functions, constants) = (exec.functions.len(), exec.constants.len());
    for f in exec.functions.iter().filter(|f| f.kind == FuncKind::Vm) {
        let bad = |pc: i64, detail: String| VmError::Bytecode { function: f.name.clone(), pc, detail };
        let range =
            usize::try_from(f.start).ok().zip(usize::try_from(f.end).ok()).filter(|&(s, e)| s < e && e <= count);
        let Some((start, end)) = range else {
            return Err(bad(f.start, format!("spans instructions {}..{} of {count}", f.start, f.end)));
        };
        // A register file larger than the function could write is a forged count (the reader's
        // bound: arguments plus one register per instruction word).
        let words: i64 = exec
            .instructions
            .iter()
            .map(|i| match i {
                Instruction::Call { args, .. } => 4 + args.len() as i64,
                Instruction::If { .. } => 3,
                _ => 2,
            })
            .sum();
        let names = f.param_names.len() as i64;
        if !(0..=MAX_VM_ARGS).contains(&f.num_args)
            || (names != 0 && names != f.num_args)
            || f.register_file_size < f.num_args
            || f.register_file_size > f.num_args + words + 1
        {
            return Err(bad(f.start, format!("{} arguments and {} registers", f.num_args, f.register_file_size)));
        }
        let file = f.register_file_size;
        for pc in start..end {
            let at = pc as i64;
            let reg = |r: &Reg| match r {
                Reg::Index(i) if i64::from(*i) >= file => {
                    Err(bad(at, format!("register {r} is outside its {file} registers")))
                }
                _ => Ok(()),
            };
            let jump = |off: i64| match at.checked_add(off) {
                Some(t) if f.start <= t && t < f.end && off != 0 => Ok(()),
                _ => Err(bad(at, format!("jump by {off} leaves the function (TVM: run into invalid section)"))),
            };
            match &exec.instructions[pc] {
                Instruction::Call { dst, func, args } => {
                    reg(dst)?;
                    if *func as usize >= functions {
                        return Err(bad(
                            at,
                            format!("calls function {func} of {functions} (TVM: func_idx < func_pool_.size())"),
                        ));
                    }
                    for a in args {
                        match a {
                            Arg::Reg(r) => reg(r)?,
                            Arg::Const(c) if *c as usize >= constants => {
                                return Err(bad(at, format!("constant {c} of {constants}")))
                            }
                            Arg::Func(g) if *g as usize >= functions => {
                                return Err(bad(at, format!("function {g} of {functions} as an argument")))
                            }
                            _ => {}
                        }
                    }
                }
                Instruction::Ret { result } => reg(result)?,
                Instruction::Goto { offset } => jump(*offset)?,
                Instruction::If { cond, false_offset } => {
                    reg(cond)?;
                    if *false_offset <= 1 {
                        return Err(bad(at, format!("false offset {false_offset} (TVM: instr.false_offset > 1)")));
                    }
                    jump(*false_offset)?;
                    jump(1)?;
                }
            }
        }
    }
    Ok(())
}
