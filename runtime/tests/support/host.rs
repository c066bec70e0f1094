//! Values on the host, compared by content: what a test compares a VM's result with TVM's in
//! (`.npy` files of the fixtures). The VM gives [`Value`]s whose tensors lie where the program
//! left them and compare by identity; [`host`] copies one to the host, and [`value`] makes the
//! input value of a host one (tensors on the CPU). [`HostCalls`] calls a VM that way.

#![allow(dead_code)]

use mblob_runtime::exec::relax::{VirtualMachine, VmError};
use mblob_runtime::exec::{ObjectRef, Value};
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{Device, NdArray};

/// A value with its tensors on the host: equal when their structure and bytes are.
#[derive(Debug, Clone)]
pub enum Host {
    /// An array passed as it is, by reference (a callee that writes into it writes into
    /// it); [`host`] never gives one. Equal to the same bytes of the same storage only.
    Array(NdArray),
    Tensor(Tensor),
    Shape(Vec<i64>),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Host>),
    Object(ObjectRef),
    Null,
}

impl PartialEq for Host {
    fn eq(&self, other: &Host) -> bool {
        match (self, other) {
            (Host::Array(a), Host::Array(b)) => {
                std::sync::Arc::ptr_eq(a.storage(), b.storage()) && a.shape() == b.shape() && a.dtype() == b.dtype()
            }
            (Host::Tensor(a), Host::Tensor(b)) => a == b,
            (Host::Shape(a), Host::Shape(b)) => a == b,
            (Host::Int(a), Host::Int(b)) => a == b,
            (Host::Float(a), Host::Float(b)) => a == b,
            (Host::Str(a), Host::Str(b)) => a == b,
            (Host::Bytes(a), Host::Bytes(b)) => a == b,
            (Host::Tuple(a), Host::Tuple(b)) => a == b,
            (Host::Object(a), Host::Object(b)) => a == b,
            (Host::Null, Host::Null) => true,
            _ => false,
        }
    }
}

/// `v` with its tensors copied to the host.
pub fn host(v: &Value) -> Host {
    match v {
        Value::Tensor(a) => Host::Tensor(a.to_tensor().unwrap()),
        Value::Shape(s) => Host::Shape(s.to_vec()),
        Value::Int(i) => Host::Int(*i),
        Value::Float(f) => Host::Float(*f),
        Value::Str(s) => Host::Str(s.clone()),
        Value::Bytes(b) => Host::Bytes(b.clone()),
        Value::Tuple(items) => Host::Tuple(items.iter().map(host).collect()),
        Value::Object(o) => Host::Object(o.clone()),
        Value::Null => Host::Null,
    }
}

/// `h` as an input value, its tensors on the CPU.
pub fn value(h: &Host) -> Value {
    match h {
        Host::Array(a) => Value::Tensor(a.clone()),
        Host::Tensor(t) => tensor(t),
        Host::Shape(s) => Value::Shape(s.as_slice().into()),
        Host::Int(i) => Value::Int(*i),
        Host::Float(f) => Value::Float(*f),
        Host::Str(s) => Value::Str(s.clone()),
        Host::Bytes(b) => Value::Bytes(b.clone()),
        Host::Tuple(items) => Value::Tuple(items.iter().map(value).collect()),
        Host::Object(o) => Value::Object(o.clone()),
        Host::Null => Value::Null,
    }
}

/// A host tensor as an input value, on the CPU.
pub fn tensor(t: &Tensor) -> Value {
    Value::Tensor(NdArray::from_tensor(t, Device::cpu(0)).unwrap())
}

/// The tensors of a result (a tensor, or the leaves of a tuple in order) on the host; any
/// other leaf fails the test.
pub fn tensors(v: &Value) -> Vec<Tensor> {
    v.flatten()
        .into_iter()
        .map(|leaf| match leaf {
            Value::Tensor(a) => a.to_tensor().unwrap(),
            v => panic!("a result leaf is a {}, not a tensor", v.kind()),
        })
        .collect()
}

/// Calls of a VM with host values: the inputs made as [`value`] makes them, the result copied
/// back as [`host`] copies it.
pub trait HostCalls {
    /// `invoke` with host values.
    fn call_host(&self, name: &str, args: &[Host]) -> Result<Host, VmError>;
    /// `invoke` with host tensors, giving the result's tensors ([`tensors`]).
    fn call_tensors(&self, name: &str, args: &[Tensor]) -> Result<Vec<Tensor>, VmError>;
}

impl HostCalls for VirtualMachine {
    fn call_host(&self, name: &str, args: &[Host]) -> Result<Host, VmError> {
        let args: Vec<Value> = args.iter().map(value).collect();
        Ok(host(&self.invoke(name, &args)?))
    }

    fn call_tensors(&self, name: &str, args: &[Tensor]) -> Result<Vec<Tensor>, VmError> {
        let args: Vec<Value> = args.iter().map(tensor).collect();
        Ok(tensors(&self.invoke(name, &args)?))
    }
}
