//! Shapes and the shape heap: `make_shape`, `make_prim_value`, `alloc_shape_heap`, `shape_of`,
//! `tensor_to_shape`.

use super::BuiltinFn;
use crate::array::NdArray;
use crate::exec::relax::checks;
use crate::exec::relax::vm::value::{Args, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;
use crate::format::DataType;

pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.make_shape", make_shape),
    ("vm.builtin.make_prim_value", make_prim_value),
    ("vm.builtin.alloc_shape_heap", alloc_shape_heap),
    ("vm.builtin.shape_of", shape_of),
    ("vm.builtin.tensor_to_shape", tensor_to_shape),
];

/// `vm.builtin.make_shape`.
fn make_shape(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let heap = a.heap(0)?;
    let size = a.int(1)?;
    checks::shape_pairs(2, size, args.len())?;
    let n = size as usize;
    let mut shape = Vec::with_capacity(n);
    for i in 0..n {
        let (code, reg) = (a.int(2 + 2 * i)?, a.int(3 + 2 * i)?);
        shape.push(match code {
            0 => reg,
            1 => heap_get(&heap, reg, name)?,
            _ => return Err(checks::shape_code(true)),
        });
    }
    Ok(Value::Shape(shape.into()))
}

/// `vm.builtin.make_prim_value`.
fn make_prim_value(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let heap = a.heap(0)?;
    match (a.int(1)?, a.int(2)?) {
        (0, reg) => Ok(Value::Int(reg)),
        (1, reg) => heap_get(&heap, reg, name).map(Value::Int),
        (c, _) => Err(crate::exec::relax::vm::value::check("InternalError", format!("Invalid shape code: {c}"))),
    }
}

/// `vm.builtin.alloc_shape_heap`.
fn alloc_shape_heap(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // On the host, the last device (TVM's `AllocShapeHeap`), zeroed.
    let size = a.int(1)?;
    let n = usize::try_from(size).map_err(|_| VmError::OutOfRange {
        callee: name.to_owned(),
        what: "size",
        value: size.to_string(),
    })?;
    let bytes = n.checked_mul(8).ok_or(VmError::Alloc(u64::MAX))?;
    let host = vm.devices.len() - 1;
    let storage = vm.pool.alloc(host, &vm.apis[host], bytes)?;
    storage.write(0, &vec![0; bytes])?;
    Ok(Value::Tensor(NdArray::in_storage(&storage, 0, &[size], DataType::I64)?))
}

/// `vm.builtin.shape_of`.
fn shape_of(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    Ok(Value::Shape(a.tensor(0)?.shape().into()))
}

/// `vm.builtin.tensor_to_shape`.
fn tensor_to_shape(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // A 1-D integer tensor's elements as a shape, read from wherever it is.
    let t = a.tensor(0)?;
    let bits = t.dtype().bits;
    checks::tensor_to_shape(t)?;
    let raw = t.to_bytes()?;
    let shape: Vec<i64> = match bits {
        16 => raw.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
        32 => raw.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        _ => raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
    };
    Ok(Value::Shape(shape.into()))
}

/// The shape heap (a host tensor) and the byte offset of its slot `reg`.
fn heap_slot<'a>(heap: &'a Option<NdArray>, reg: i64, name: &str) -> Result<(&'a NdArray, usize), VmError> {
    let missing = || VmError::HeapSlot { callee: name.to_owned(), slot: reg };
    let h = heap.as_ref().ok_or_else(missing)?;
    let r = usize::try_from(reg).ok().filter(|&r| r < h.len()).ok_or_else(missing)?;
    Ok((h, r * 8))
}

/// Slot `reg` of the shape heap.
pub(super) fn heap_get(heap: &Option<NdArray>, reg: i64, name: &str) -> Result<i64, VmError> {
    let (h, at) = heap_slot(heap, reg, name)?;
    let mut b = [0u8; 8];
    h.storage().read(at, &mut b)?;
    Ok(i64::from_le_bytes(b))
}

/// Sets slot `reg` of the shape heap.
pub(super) fn heap_set(heap: &Option<NdArray>, reg: i64, v: i64, name: &str) -> Result<(), VmError> {
    let (h, at) = heap_slot(heap, reg, name)?;
    h.storage().write(at, &v.to_le_bytes())?;
    Ok(())
}
