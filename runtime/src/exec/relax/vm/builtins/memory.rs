//! Storage and tensors: `alloc_storage` (from the VM's pool), `alloc_tensor`, views
//! (`reshape`, `TVMTensorCreateView`), copies between devices and `memory_manager.clear`.

use super::BuiltinFn;
use crate::array::{tensor_bytes, NdArray};
use crate::device::Device;
use crate::exec::relax::vm::pool::POOL_PAGE;
use crate::exec::relax::vm::value::{check, Args, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;
use crate::payload::relax::executable::dtype_name;

pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.alloc_storage", alloc_storage),
    ("vm.builtin.alloc_tensor", alloc_tensor),
    ("vm.builtin.null_value", null_value),
    ("vm.builtin.memory_manager.clear", memory_manager_clear),
    ("runtime.TVMTensorCreateView", tensor_create_view),
    ("vm.builtin.reshape", reshape),
    ("vm.builtin.copy", copy),
    ("vm.builtin.ensure_zero_offset", ensure_zero_offset),
    ("vm.builtin.to_device", to_device),
];

/// `vm.builtin.alloc_storage`.
fn alloc_storage(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let shape = a.shape(1)?;
    let device = vm.device_index(name, a.int(2)?)?;
    let dtype = a.dtype(3)?;
    if args.len() > 4 {
        let scope = a.str(4)?;
        if &*scope != b"global" {
            return Err(VmError::Unsupported(format!("storage in memory scope `{}`", String::from_utf8_lossy(&scope))));
        }
    }
    // TVM's VM allocates through its pooled allocator, which rounds every size up
    // to its 4096-byte page: a program that overruns its plan (more tokens than an
    // LLM's bounds) fails where TVM's does, with TVM's sizes.
    let size = tensor_bytes(dtype, &shape)
        .and_then(|n| n.checked_next_multiple_of(POOL_PAGE))
        .ok_or(VmError::Alloc(u64::MAX))?;
    let len = usize::try_from(size).map_err(|_| VmError::Alloc(size))?;
    Ok(Value::Storage(vm.pool.alloc(device, &vm.apis[device], len)?))
}

/// `vm.builtin.alloc_tensor`.
fn alloc_tensor(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let Value::Storage(storage) = a.get(0)? else {
        return Err(a.type_err(0, "a storage", a.get(0)?));
    };
    let offset = a.int(1)?;
    let shape = a.shape(2)?;
    let dtype = a.dtype(3)?;
    if args.len() > 4 && &*a.str(4)? != b"global" {
        return Err(VmError::Unsupported("tensors in a memory scope other than `global`".into()));
    }
    let needed = tensor_bytes(dtype, &shape);
    let fits = u64::try_from(offset)
        .ok()
        .zip(needed)
        .and_then(|(o, n)| o.checked_add(n))
        .is_some_and(|end| end <= storage.nbytes() as u64);
    if !fits {
        return Err(VmError::Program(format!(
            "storage allocation failure, attempted to allocate {} at offset {offset} in region that is {}bytes",
            needed.map_or_else(|| "too many".to_owned(), |n| n.to_string()),
            storage.nbytes()
        )));
    }
    Ok(Value::Tensor(NdArray::in_storage_shared(storage, offset as usize, shape, dtype)?))
}

/// `vm.builtin.null_value`.
fn null_value(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    if !args.is_empty() {
        return Err(VmError::Program(format!("{name} takes no arguments, got {}", args.len())));
    }
    Ok(Value::Null)
}

/// `vm.builtin.memory_manager.clear`.
fn memory_manager_clear(vm: &VirtualMachine, _name: &str, _args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    vm.pool.clear();
    Ok(Value::Null)
}

/// `runtime.TVMTensorCreateView`.
fn tensor_create_view(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // (tensor, shape, dtype, relative byte offset): TVM's `Tensor::CreateView`.
    let t = a.tensor(0)?;
    let shape = a.shape(1)?;
    let dtype = a.dtype(2)?;
    let offset = a.int(3)?;
    let view = tensor_bytes(dtype, &shape);
    let cur = t.nbytes() as u64;
    let fits = u64::try_from(offset).ok().zip(view).and_then(|(o, v)| o.checked_add(v)).filter(|&e| e <= cur);
    if fits.is_none() {
        let dims = |s: &[i64]| s.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        let end = view.map_or_else(|| "too many".to_owned(), |v| (v as i128 + offset as i128).to_string());
        let view = view.map_or_else(|| "too many".to_owned(), |v| v.to_string());
        return Err(check(
                "ValueError",
                format!(
                    "View with shape [{}] and datatype {} would have a size of {view} bytes.  This would occupy bytes {offset} <= i_byte < {end} within the backing array.  However, the Tensor being viewed only contains {cur} bytes (shape = [{}], dtype= {}).",
                    dims(&shape),
                    dtype_name(dtype),
                    dims(t.shape()),
                    dtype_name(t.dtype())
                ),
            ));
    }
    Ok(Value::Tensor(NdArray::in_storage(t.storage(), offset as usize, &shape, dtype)?))
}

/// `vm.builtin.reshape`.
fn reshape(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // A view of the same storage (TVM's `CreateView`), on the same device.
    let t = a.tensor(0)?;
    let shape = a.shape(1)?;
    let new_size = tensor_bytes(t.dtype(), &shape);
    if new_size.is_none_or(|n| n > t.nbytes() as u64) {
        return Err(VmError::Program(format!(
            "{name}: shape {:?} does not fit in a tensor of shape {:?}",
            shape,
            t.shape()
        )));
    }
    Ok(Value::Tensor(t.view(&shape, t.dtype())?))
}

/// `vm.builtin.copy`.
///
/// TVM's `vm.builtin.copy` returns its argument.
fn copy(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    a.get(0).cloned()
}

/// `vm.builtin.ensure_zero_offset`.
///
/// Tensors here have no byte offset: a view's storage starts at its first element.
fn ensure_zero_offset(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    Ok(Value::Tensor(a.tensor(0)?.clone()))
}

/// `vm.builtin.to_device`.
fn to_device(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // A new tensor on the device, also when it is there already (TVM's `CopyTo`).
    let t = a.tensor(0)?;
    let (dev_type, dev_id) = (a.int(1)?, a.int(2)?);
    let device = i32::try_from(dev_type)
        .ok()
        .zip(i32::try_from(dev_id).ok())
        .map(|(t, i)| Device::from_dlpack(t, i))
        .ok_or_else(|| VmError::Program(format!("{name}: device ({dev_type}, {dev_id})")))?;
    if args.len() > 3 && &*a.str(3)? != b"global" {
        return Err(VmError::Unsupported("tensors in a memory scope other than `global`".into()));
    }
    Ok(Value::Tensor(t.copy(device)?))
}
