//! Storage and tensors: `alloc_storage` (from the VM's pool), `alloc_tensor`, views
//! (`reshape`, `TVMTensorCreateView`), copies between devices and `memory_manager.clear`.

use super::BuiltinFn;
use crate::array::{tensor_bytes, NdArray};
use crate::device::Device;
use crate::exec::pool::POOL_PAGE;
use crate::exec::relax::checks;
use crate::exec::relax::vm::value::{Args, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;

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
    let device = checks::device_index(a.int(2)?, vm.devices.len())?;
    let dtype = a.dtype(3)?;
    if args.len() > 4 {
        let scope = a.str(4)?;
        if &*scope != b"global" {
            let scope = String::from_utf8_lossy(&scope).into_owned();
            return Err(VmError::MemoryScope { what: "storage".into(), scope });
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
    if args.len() > 4 {
        global_scope(&a.str(4)?)?;
    }
    let needed = tensor_bytes(dtype, &shape);
    let fits = u64::try_from(offset)
        .ok()
        .zip(needed)
        .and_then(|(o, n)| o.checked_add(n))
        .is_some_and(|end| end <= storage.nbytes() as u64);
    if !fits {
        return Err(crate::exec::relax::checks::alloc_tensor_overrun(needed, offset, storage.nbytes()));
    }
    Ok(Value::Tensor(
        NdArray::in_storage_shared(storage, offset as usize, shape, dtype)?.with_vm_offset(offset as usize),
    ))
}

/// Refuses a tensor in a memory scope other than `global` (the texture scopes of GPU builds).
fn global_scope(scope: &[u8]) -> Result<(), VmError> {
    if scope == b"global" {
        return Ok(());
    }
    Err(VmError::MemoryScope { what: "a tensor".into(), scope: String::from_utf8_lossy(scope).into_owned() })
}

/// `vm.builtin.null_value`.
fn null_value(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    if !args.is_empty() {
        return Err(VmError::ExtraArguments { callee: name.to_owned(), takes: 0, given: args.len() });
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
    if !checks::view_fits(offset, view, t.nbytes()) {
        return Err(checks::view_overrun(&shape, dtype, offset, view, t));
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
    if !checks::view_fits(0, new_size, t.nbytes()) {
        return Err(checks::view_overrun(&shape, t.dtype(), 0, new_size, t));
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

/// `vm.builtin.ensure_zero_offset`: a tensor `alloc_tensor` placed at a byte offset of its
/// storage (which kernels get as their `DLTensor.byte_offset`) as one at offset 0, as TVM makes
/// it: on the CPU, for an offset that is a multiple of TVM's 64-byte alignment, the same bytes
/// with the pointer moved; else a copy.
fn ensure_zero_offset(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let t = a.tensor(0)?;
    Ok(Value::Tensor(match t.vm_offset() {
        0 => t.clone(),
        o if t.device().is_cpu() && o % 64 == 0 => t.clone().with_vm_offset(0),
        _ => t.copy(t.device())?,
    }))
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
        .ok_or_else(|| VmError::OutOfRange {
        callee: name.to_owned(),
        what: "device",
        value: format!("({dev_type}, {dev_id})"),
    })?;
    if args.len() > 3 {
        global_scope(&a.str(3)?)?;
    }
    Ok(Value::Tensor(t.copy(device)?))
}
