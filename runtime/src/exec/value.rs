//! [`Value`]: the one value of the run side. What a [`Model`](super::Model) takes as input
//! and gives as output, what a Relax or Relay VM function is called with and returns, what
//! [`call`](super::call()) passes to a host function and what the CLI, the C API and Python
//! convert to and from. A tensor is an [`NdArray`] on some device; the host form a blob stores
//! ([`crate::payload::graph::Tensor`]) is converted once, where it is read
//! ([`NdArray::from_mapped`], [`NdArray::from_tensor`]).

//!
//! A leaf of `exec`: it names nothing of the runners or the VMs above it, which all speak it,
//! as the LLM floor (`exec::llm`) does.

use std::sync::Arc;

use crate::array::{ArrayError, NdArray};
use crate::device::Device;
use crate::format::DataType;

/// A value passed to or returned by a model or a function: TVM's `Any` as Python sees it.
#[derive(Debug, Clone)]
pub enum Value {
    /// A tensor, on the device it lies on (shared: cloning shares the storage).
    Tensor(NdArray),
    /// A shape (`R.Shape`, TVM's `ShapeTuple` / `ffi.Shape`).
    Shape(Arc<[i64]>),
    /// An integer or bool (`R.Prim`).
    Int(i64),
    /// A float (`R.Prim`).
    Float(f64),
    /// A string.
    Str(String),
    /// A byte string (TVM's `ffi::Bytes`, or a `String` of any bytes): what
    /// `opencl.GetPreCompiledPrograms` returns and `opencl.SetPreCompiledPrograms` takes.
    Bytes(Vec<u8>),
    /// A tuple (`R.Tuple`, a Relay ADT of tag 0), nested as the function built it.
    Tuple(Vec<Value>),
    /// A runtime object (the paged KV cache, a Relay constructor value): passed back as it
    /// is, shared.
    Object(ObjectRef),
    /// Nothing (`None`).
    Null,
}

impl PartialEq for Value {
    /// Values equal as TVM compares them in Python: shapes, numbers and strings by value,
    /// tensors and objects by identity (the same bytes of the same storage, with the same
    /// shape and dtype; the same object).
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Tensor(a), Value::Tensor(b)) => {
                Arc::ptr_eq(a.storage(), b.storage()) && a.shape() == b.shape() && a.dtype() == b.dtype()
            }
            (Value::Shape(a), Value::Shape(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            (Value::Tuple(a), Value::Tuple(b)) => a == b,
            (Value::Object(a), Value::Object(b)) => a == b,
            (Value::Null, Value::Null) => true,
            _ => false,
        }
    }
}

impl From<NdArray> for Value {
    fn from(a: NdArray) -> Value {
        Value::Tensor(a)
    }
}

/// `float64`.
const F64: DataType = DataType { code: 2, bits: 64, lanes: 1 };

impl Value {
    /// What kind of value it is, for messages (`tensor`, `shape`, `int`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Tensor(_) => "tensor",
            Value::Shape(_) => "shape",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "tuple",
            Value::Object(_) => "object",
            Value::Null => "null",
        }
    }

    /// The tensor, when it is one.
    pub fn as_tensor(&self) -> Option<&NdArray> {
        match self {
            Value::Tensor(a) => Some(a),
            _ => None,
        }
    }

    /// The leaves of the value, depth first (tuples flattened in order; an empty tuple has
    /// none).
    pub fn flatten(&self) -> Vec<&Value> {
        fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
            match v {
                Value::Tuple(items) => items.iter().for_each(|i| walk(i, out)),
                v => out.push(v),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }

    /// The value as numpy would hold it, an array: a tensor as it is, a shape as a 1-d
    /// `int64` array, an integer as a 0-d `int64` one, a float as a 0-d `float64` one (on the
    /// host). `None` for a string, bytes, a tuple, an object or null.
    pub fn to_array(&self) -> Result<Option<NdArray>, ArrayError> {
        let host = |data: &[u8], shape: &[i64], dtype| NdArray::from_bytes(data, shape, dtype, Device::cpu(0));
        Ok(Some(match self {
            Value::Tensor(a) => a.clone(),
            Value::Shape(s) => {
                let data: Vec<u8> = s.iter().flat_map(|d| d.to_le_bytes()).collect();
                host(&data, &[s.len() as i64], DataType::I64)?
            }
            Value::Int(i) => host(&i.to_le_bytes(), &[], DataType::I64)?,
            Value::Float(f) => host(&f.to_le_bytes(), &[], F64)?,
            Value::Str(_) | Value::Bytes(_) | Value::Tuple(_) | Value::Object(_) | Value::Null => return Ok(None),
        }))
    }

    /// An array given for a parameter that takes `kind`, as the value the parameter checks
    /// for: a shape from a 1-d integer array, a prim value from a 0-d number (as
    /// [`Value::to_array`] writes them); else the tensor itself, for the function's own
    /// check to refuse.
    pub fn for_param(array: NdArray, kind: ParamKind) -> Result<Value, ArrayError> {
        let d = array.dtype();
        let wants_host = match kind {
            ParamKind::Shape => array.shape().len() == 1,
            ParamKind::Prim(_) => array.shape().is_empty(),
            _ => false,
        };
        if !wants_host || d.lanes != 1 {
            return Ok(Value::Tensor(array));
        }
        let bytes = array.to_bytes()?;
        let ints = || -> Option<Vec<i64>> {
            match (d.code, d.bits) {
                (0, 64) => {
                    Some(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
                }
                (0, 32) => Some(
                    bytes
                        .chunks_exact(4)
                        .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
                        .collect(),
                ),
                _ => None,
            }
        };
        Ok(match kind {
            ParamKind::Shape => ints().map_or(Value::Tensor(array), |s| Value::Shape(s.into())),
            _ => match (d.code, d.bits) {
                (2, 64) => Value::Float(f64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]))),
                (2, 32) => Value::Float(f64::from(f32::from_le_bytes(bytes[..4].try_into().unwrap_or([0; 4])))),
                (1, 1) | (1, 8) | (6, 8) => Value::Int(i64::from(bytes.first().is_some_and(|&b| b != 0))),
                _ => ints().and_then(|v| v.first().copied()).map_or(Value::Tensor(array), Value::Int),
            },
        })
    }
}

/// A TVM runtime object a VM function or builtin made and the caller may hold and pass back,
/// such as the paged KV cache (`relax.vm.PagedAttentionKVCache`). Objects change through
/// their own methods (interior mutability): builtins get them by shared reference.
pub trait VmObject: std::any::Any + std::fmt::Debug + Send + Sync {
    /// TVM's type key of the object (e.g. `relax.vm.PagedAttentionKVCache`).
    fn type_key(&self) -> &'static str;
    /// The object as [`std::any::Any`], for [`ObjectRef::downcast_ref`].
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A shared reference to a [`VmObject`] (TVM's `ObjectRef`): cloning shares the object, and
/// two references are equal when they name the same object.
#[derive(Debug, Clone)]
pub struct ObjectRef(Arc<dyn VmObject>);

impl ObjectRef {
    /// A reference to a new object.
    pub fn new(object: impl VmObject) -> ObjectRef {
        ObjectRef(Arc::new(object))
    }

    /// TVM's type key of the object.
    pub fn type_key(&self) -> &'static str {
        self.0.type_key()
    }

    /// The object as a `T`, when it is one.
    pub fn downcast_ref<T: VmObject>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// Whether both name the same object.
    pub fn ptr_eq(&self, other: &ObjectRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl PartialEq for ObjectRef {
    fn eq(&self, other: &ObjectRef) -> bool {
        self.ptr_eq(other)
    }
}

/// What a parameter of a VM function takes, as the function's own checks say (TVM's
/// `VMShapeLower` puts a `check_*_info` of each parameter at the start of the function).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A tensor (`check_tensor_info`).
    Tensor,
    /// A shape (`check_shape_info`).
    Shape,
    /// A primitive value of this dtype (`check_prim_value_info`); `None` when any dtype.
    Prim(Option<DataType>),
    /// A tuple of this many elements (`check_tuple_info`).
    Tuple(usize),
    /// A function or closure (`check_func_info`).
    Func,
    /// A string (`check_string_info`).
    Str,
    /// Not checked (`R.Object`, or a module built without the checks).
    Any,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_and_params_round_trip() {
        let shape = Value::Shape(vec![2, 3].into());
        let a = shape.to_array().unwrap().unwrap();
        assert_eq!((a.shape(), a.dtype()), (&[2][..], DataType::I64));
        assert_eq!(Value::for_param(a.clone(), ParamKind::Shape).unwrap(), shape);
        assert!(matches!(Value::for_param(a, ParamKind::Tensor).unwrap(), Value::Tensor(_)));
        let f = Value::Float(1.5).to_array().unwrap().unwrap();
        assert_eq!(Value::for_param(f, ParamKind::Prim(None)).unwrap(), Value::Float(1.5));
        let i = Value::Int(-7).to_array().unwrap().unwrap();
        assert_eq!(Value::for_param(i, ParamKind::Prim(None)).unwrap(), Value::Int(-7));
        assert!(Value::Str("x".into()).to_array().unwrap().is_none());
        let t = Value::Tuple(vec![Value::Int(1), Value::Tuple(vec![Value::Null, Value::Float(2.0)])]);
        assert_eq!(t.flatten(), [&Value::Int(1), &Value::Null, &Value::Float(2.0)]);
    }
}
