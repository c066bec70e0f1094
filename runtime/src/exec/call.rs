//! Calling a function of a loaded tree by name, safely: [`call`] takes tensors as
//! [`NdArray`]s (which own live, aligned allocations of exactly their shape and dtype), so the
//! caller hands no raw pointer over. The trust in the library's code was taken once, at
//! `unsafe load_library` (the trust boundary); a compiled function checks the ndim, dtype,
//! shape and device of each tensor before it touches the data. This is the one call of loaded
//! code outside the FFI edge that needs no `unsafe` from its caller.
#![allow(unsafe_code)]

use smallvec::SmallVec;

use crate::array::NdArray;
use crate::device::backends::device_api;
use crate::device::{Device, DeviceError};
use crate::ffi::dlpack::DLTensor;
use crate::ffi::last_error::CallError;
use crate::ffi::value::Value;
use crate::module::LoadedTree;

/// An argument of [`call`], or what a call returns.
#[derive(Debug, Clone)]
pub enum CallArg {
    /// No value.
    None,
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A tensor, passed as a `DLTensor*` (what compiled host functions take); the function
    /// may write into it.
    Tensor(NdArray),
    /// A tensor's data pointer, passed as a handle (what host code passes a device kernel).
    Data(NdArray),
}

/// Why [`call`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallFailed {
    /// The tree has no function of that name.
    #[error("no function `{0}`")]
    NoFunction(String),
    /// The function reported an error.
    #[error("`{name}` failed: {}", source.message)]
    Call {
        /// The function.
        name: String,
        /// Its error.
        #[source]
        source: CallError,
    },
    /// Waiting for a device the call used failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Calls function `name` of `tree` (found from the root as TVM's `GetFunction(name,
/// query_imports = true)` does) with `args`, and waits for the devices its tensors live on.
/// Tensors are lent to the function (its writes land in them); the return value comes back as
/// a scalar or string (handles and objects mean nothing to the caller: `None`).
pub fn call(tree: &LoadedTree, name: &str, args: &mut [CallArg]) -> Result<CallArg, CallFailed> {
    let _span = tracing::debug_span!("call", function = name).entered();
    let f = tree.packed_function(name).ok_or_else(|| CallFailed::NoFunction(name.to_owned()))?;
    let mut tensors: SmallVec<[DLTensor; 8]> = args
        .iter()
        .filter_map(|a| match a {
            CallArg::Tensor(t) => Some(t.dl_tensor()),
            _ => None,
        })
        .collect();
    let mut next = tensors.iter_mut();
    let mut values: SmallVec<[Value; 8]> = SmallVec::with_capacity(args.len());
    let mut devices: SmallVec<[Device; 2]> = SmallVec::new();
    for a in args.iter() {
        let device = match a {
            CallArg::Tensor(t) | CallArg::Data(t) => Some(t.device()),
            _ => None,
        };
        if let Some(d) = device.filter(|d| !d.is_cpu() && !devices.contains(d)) {
            devices.push(d);
        }
        values.push(match a {
            CallArg::None => Value::None,
            CallArg::Int(v) => Value::Int(*v),
            CallArg::Float(v) => Value::Float(*v),
            CallArg::Str(s) => Value::Str(s.clone()),
            CallArg::Tensor(_) => Value::Tensor(next.next().map_or(std::ptr::null_mut(), |t| t as *mut DLTensor)),
            CallArg::Data(t) => Value::Handle(t.dl_tensor().data),
        });
    }
    // SAFETY: the function comes from a tree loaded by `load_library` or `load_blob`, whose
    // caller took the trust in its code (the loading entry points are `unsafe` for this); it is
    // called in the convention it carries. Every tensor argument describes a live `NdArray`
    // allocation of exactly its shape and dtype on its device (64-byte aligned on the CPU),
    // borrowed from `args` for the whole call, and a data handle points to the start of one.
    let ret = unsafe { f.call(&values) }.map_err(|source| CallFailed::Call { name: name.to_owned(), source })?;
    for d in devices {
        device_api(d)?.synchronize()?;
    }
    Ok(match ret {
        Value::Int(v) => CallArg::Int(v),
        Value::Float(v) => CallArg::Float(v),
        Value::Str(s) => CallArg::Str(s),
        _ => CallArg::None,
    })
}
