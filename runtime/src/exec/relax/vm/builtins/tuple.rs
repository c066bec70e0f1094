//! Tuples (TVM's `Array`): `make_tuple`, `tuple_getitem`, `tuple_reset_item`.

use std::sync::PoisonError;

use super::BuiltinFn;
use crate::exec::relax::checks;
use crate::exec::relax::vm::value::tuple_item;
use crate::exec::relax::vm::value::{Args, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;

pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.make_tuple", make_tuple),
    ("vm.builtin.tuple_getitem", tuple_get_item),
    ("vm.builtin.tuple_reset_item", tuple_reset_item),
];

/// `vm.builtin.make_tuple`.
fn make_tuple(_vm: &VirtualMachine, _name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    Ok(Value::tuple(args.iter().map(|v| (*v).clone())))
}

/// `vm.builtin.tuple_getitem`.
fn tuple_get_item(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    let Value::Tuple(t) = a.get(0)? else { return Err(a.type_err(0, "a tuple", a.get(0)?)) };
    let i = a.int(1)?;
    usize::try_from(i).ok().and_then(|i| tuple_item(t, i)).ok_or_else(|| checks::tuple_index(i, t.len()))
}

/// `vm.builtin.tuple_reset_item`.
fn tuple_reset_item(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let a = Args::new(name, args);
    // The item becomes null in the tuple itself (every holder sees it), so that what
    // it held can be freed (TVM's `ArrayObj::SetItem(index, nullptr)`).
    let Value::Tuple(t) = a.get(0)? else { return Err(a.type_err(0, "a tuple", a.get(0)?)) };
    let i = a.int(1)?;
    let item = usize::try_from(i).ok().and_then(|i| t.get(i)).ok_or_else(|| checks::tuple_index(i, t.len()))?;
    *item.lock().unwrap_or_else(PoisonError::into_inner) = Value::Null;
    Ok(Value::Null)
}
