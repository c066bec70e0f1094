//! The VM's values and errors, the leaf the rest of the VM (and the LLM builtins of
//! `exec::llm`) build on: [`VmError`], the caller's values ([`VmValue`], [`VmOutput`]),
//! runtime objects ([`ObjectRef`], [`VmObject`]), the register values (`Value`) and the
//! argument access of builtins (`Args`).

use std::sync::{Arc, Mutex, PoisonError};

use crate::array::{ArrayError, NdArray};
use crate::device::storage::Storage;
use crate::device::{Device, DeviceError};
use crate::format::DataType;
use crate::payload::graph::Tensor;

/// An error of the Relax VM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmError {
    /// A check of TVM's that the inputs failed, not the program: an allocation past the
    /// storage the program planned (a batch or a sequence over the upper bound it was built
    /// for), a size that overflows. `kind` and `message` are TVM's.
    #[error("the inputs exceed what the model was built for: {kind}: {message}")]
    InputBound {
        /// TVM's error kind.
        kind: &'static str,
        /// TVM's message.
        message: String,
    },
    /// The tree holds no Relax executable.
    #[error("the module tree has no relax executable (relax.Executable or relax.VMExecutable); its modules: {0}")]
    NoExecutable(String),
    /// The VM cannot run on this device: mblob has no device API for it (or was built without
    /// its feature), or the library has no code for it.
    #[error("not supported on {device}: the relax VM {reason}")]
    UnsupportedDevice {
        /// The device asked for.
        device: Device,
        /// Why not.
        reason: String,
    },
    /// A device failed: no driver or device, out of memory, a failed copy.
    #[error(transparent)]
    Device(DeviceError),
    /// A tensor that cannot be made (a shape that overflows, data of the wrong size).
    #[error(transparent)]
    Array(ArrayError),
    /// `invoke` of a name that is not a VM function.
    #[error("ValueError: Unknown function: {name} (VM functions: {})", available.join(", "))]
    UnknownFunction {
        /// The name asked for.
        name: String,
        /// The VM functions of the executable.
        available: Vec<String>,
    },
    /// A VM function called with the wrong number of arguments (TVM's message).
    #[error("ValueError: Invoking function {function} expects {expected} arguments{params}, but {got} arguments were provided.")]
    ArgumentCount {
        /// The function.
        function: String,
        /// Its number of parameters.
        expected: usize,
        /// ` (x, y)`: the parameter names, or nothing.
        params: String,
        /// Arguments given.
        got: usize,
    },
    /// A function of the table that is neither a builtin nor a kernel of the library.
    #[error(
        "cannot find function `{name}` in the library's kernels, and it is not a relax VM builtin mblob implements"
    )]
    MissingFunction {
        /// The name.
        name: String,
    },
    /// A `vm.builtin.*` function this VM does not implement, refused when it is called.
    #[error("relax VM builtin `{name}` is not supported by mblob: {reason}")]
    UnknownBuiltin {
        /// The name.
        name: String,
        /// Why (the builtin's group).
        reason: &'static str,
    },
    /// A feature the VM does not implement (VM TIR functions, memory scopes).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// One of TVM's runtime checks failed: `kind` is TVM's error kind (`ValueError`,
    /// `TypeError`, `RuntimeError`) and `message` its text.
    #[error("{kind}: {message}")]
    Check {
        /// TVM's error kind.
        kind: &'static str,
        /// TVM's message.
        message: String,
    },
    /// A kernel returned an error.
    #[error("kernel `{name}` failed (code {code}): {message}")]
    Kernel {
        /// The kernel.
        name: String,
        /// Its return code.
        code: i32,
        /// The message it reported.
        message: String,
    },
    /// A value of the wrong kind where a builtin or kernel needs another.
    #[error("argument {index} of `{callee}`: expected {expected}, got {got}")]
    Type {
        /// The function called.
        callee: String,
        /// The argument's position.
        index: usize,
        /// What was expected.
        expected: &'static str,
        /// What was found.
        got: &'static str,
    },
    /// A decoded executable with an index the VM cannot follow (a register past its function's
    /// register file, a constant or function index past its table, a jump out of its
    /// function): refused when the VM is made (`exec::relax::checks::program`).
    #[error("invalid executable: `{function}` instruction {pc}: {detail}")]
    Bytecode {
        /// The VM function.
        function: String,
        /// The instruction index.
        pc: i64,
        /// What is wrong.
        detail: String,
    },
    /// The program did something TVM would refuse (out-of-range heap index, too few builtin
    /// arguments, running past its last instruction, ...).
    #[error("invalid program: {0}")]
    Program(String),
    /// An input tensor that cannot be passed.
    #[error("input {index}: {detail}")]
    Input {
        /// Position of the input.
        index: usize,
        /// What is wrong.
        detail: String,
    },
    /// A size that does not fit in memory (an overflowing storage size).
    #[error("cannot allocate {0} bytes")]
    Alloc(u64),
    /// A function returned something other than tensors.
    #[error("function `{function}` returned {got}; which cannot be an output here (`invoke` returns tensors, `invoke_outputs` tensors and shapes, `invoke_values` tensors, shapes, numbers and strings, each also inside tuples)")]
    Output {
        /// The function.
        function: String,
        /// What it returned.
        got: &'static str,
    },
    /// An LLM builtin failed (the paged KV cache, the tensor cache, sampling, the legacy KV
    /// cache: `exec::llm`, feature `llm`), with TVM's checks and messages. The LLM's own error
    /// (its `KvCacheError` or `LmError`) is the source, boxed: the VM does not name the types of
    /// the floor above it. [`VmError::lm_error`] gives it back typed.
    #[error(transparent)]
    Lm(Box<dyn std::error::Error + Send + Sync>),
    /// Where an error happened: the VM function, its instruction and the function it called.
    #[error("in `{function}` at instruction {pc} (call of `{callee}`): {source}")]
    At {
        /// The VM function.
        function: String,
        /// The instruction index.
        pc: usize,
        /// The callee.
        callee: String,
        /// The error.
        #[source]
        source: Box<VmError>,
    },
}

impl VmError {
    /// The innermost error (through [`VmError::At`]).
    pub fn root(&self) -> &VmError {
        match self {
            VmError::At { source, .. } => source.root(),
            e => e,
        }
    }

    /// The LLM builtin's error of type `E` that the innermost error holds
    /// ([`VmError::Lm`]), if it is one.
    pub fn lm_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self.root() {
            VmError::Lm(e) => e.downcast_ref::<E>(),
            _ => None,
        }
    }
}

impl From<DeviceError> for VmError {
    fn from(e: DeviceError) -> VmError {
        VmError::Device(e)
    }
}

impl From<ArrayError> for VmError {
    /// A device's error as [`VmError::Device`], whichever way it came.
    fn from(e: ArrayError) -> VmError {
        match e {
            ArrayError::Device(d) => VmError::Device(d),
            e => VmError::Array(e),
        }
    }
}

/// One output of a VM function, as [`VirtualMachine::invoke_outputs`](super::VirtualMachine::invoke_outputs) returns them (a returned
/// tuple flattened in order).
#[derive(Debug, Clone)]
pub enum VmOutput {
    /// A tensor (TVM's `NDArray` / `Tensor`), copied to the host.
    Tensor(Tensor),
    /// A shape (TVM's `ShapeTuple` / `ffi.Shape`), such as `R.shape_of` returns.
    Shape(Vec<i64>),
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

/// A value passed to or returned by a VM function ([`VirtualMachine::invoke_values`](super::VirtualMachine::invoke_values)): what
/// TVM's `relax.VirtualMachine` takes and gives in Python.
#[derive(Debug, Clone)]
pub enum VmValue {
    /// A tensor (`R.Tensor`); returned ones are copied to the host.
    Tensor(Tensor),
    /// A shape (`R.Shape`, TVM's `ShapeTuple` / `ffi.Shape`).
    Shape(Vec<i64>),
    /// An integer or bool `R.Prim` value.
    Int(i64),
    /// A float `R.Prim` value.
    Float(f64),
    /// A string.
    Str(String),
    /// A tuple (`R.Tuple`), also nested and of one element.
    Tuple(Vec<VmValue>),
    /// Nothing (`None`), such as an `R.Object` the function set to null.
    Null,
    /// A runtime object (`R.Object`), such as the paged KV cache that
    /// `create_tir_paged_kv_cache` returns: passed back as it is, shared.
    Object(ObjectRef),
    /// A tensor passed by reference (as TVM passes its `Tensor`s): a tensor on the VM's device
    /// is given to the function itself, not copied, so that what the callee writes into it
    /// (`vm.builtin.attention_kv_cache_debug_get_kv`) is seen by the caller. One on another
    /// device is copied there. Results never come back in this form.
    Array(NdArray),
}

impl PartialEq for VmValue {
    /// Values equal as TVM compares them in Python: tensors, shapes, numbers and strings by
    /// value, objects and arrays by identity (the same object, the same bytes of the same
    /// storage with the same shape and dtype).
    fn eq(&self, other: &VmValue) -> bool {
        match (self, other) {
            (VmValue::Tensor(a), VmValue::Tensor(b)) => a == b,
            (VmValue::Shape(a), VmValue::Shape(b)) => a == b,
            (VmValue::Int(a), VmValue::Int(b)) => a == b,
            (VmValue::Float(a), VmValue::Float(b)) => a == b,
            (VmValue::Str(a), VmValue::Str(b)) => a == b,
            (VmValue::Tuple(a), VmValue::Tuple(b)) => a == b,
            (VmValue::Null, VmValue::Null) => true,
            (VmValue::Object(a), VmValue::Object(b)) => a == b,
            (VmValue::Array(a), VmValue::Array(b)) => {
                Arc::ptr_eq(a.storage(), b.storage()) && a.shape() == b.shape() && a.dtype() == b.dtype()
            }
            _ => false,
        }
    }
}

impl VmValue {
    /// The leaves of the value, depth first (tuples flattened in order).
    pub fn flatten(&self) -> Vec<&VmValue> {
        fn walk<'a>(v: &'a VmValue, out: &mut Vec<&'a VmValue>) {
            match v {
                VmValue::Tuple(items) => items.iter().for_each(|i| walk(i, out)),
                v => out.push(v),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
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

/// A closure: a function of the table with arguments bound after the caller's (TVM's
/// `VMClosure::BindLastArgs`).
#[derive(Debug)]
pub(crate) struct Closure {
    pub(crate) func: u32,
    pub(crate) bound: Vec<Value>,
}

/// A register value.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Float(f64),
    DType(DataType),
    Str(Arc<[u8]>),
    Shape(Arc<[i64]>),
    Tensor(NdArray),
    Storage(Arc<Storage>),
    /// A tuple (TVM's `Array`): shared, its items settable (`tuple_reset_item`).
    Tuple(Arc<[Mutex<Value>]>),
    Vm,
    Func(u32),
    Closure(Arc<Closure>),
    /// A runtime object (the paged KV cache).
    Object(ObjectRef),
}

impl Value {
    /// The name of the value's kind, as TVM's type keys call it (before tvm-ffi).
    pub(crate) fn kind(&self) -> &'static str {
        self.type_key(false)
    }

    /// TVM's type key of the value: tvm-ffi's (TVM 0.22 and later) with `ffi`, else the
    /// runtime's.
    pub(crate) fn type_key(&self, ffi: bool) -> &'static str {
        match (self, ffi) {
            (Value::Null, _) => "None",
            (Value::Int(_), _) => "int",
            (Value::Float(_), _) => "float",
            (Value::DType(_), _) => "DataType",
            (Value::Str(_), false) => "runtime.String",
            // tvm-ffi keeps strings of up to 7 bytes inline, as a POD value, not an object.
            (Value::Str(s), true) if s.len() <= 7 => "ffi.SmallStr",
            (Value::Str(_), true) => "ffi.String",
            (Value::Shape(_), false) => "runtime.ShapeTuple",
            (Value::Shape(_), true) => "ffi.Shape",
            (Value::Tensor(_), false) => "runtime.NDArray",
            (Value::Tensor(_), true) => "ffi.Tensor",
            (Value::Storage(_), _) => "vm.Storage",
            (Value::Tuple(_), false) => "runtime.Array",
            (Value::Tuple(_), true) => "ffi.Array",
            (Value::Vm, _) => "VirtualMachine",
            (Value::Func(_) | Value::Closure(_), _) => "vm.Closure",
            (Value::Object(o), _) => o.type_key(),
        }
    }

    pub(crate) fn tuple(items: impl IntoIterator<Item = Value>) -> Value {
        Value::Tuple(items.into_iter().map(Mutex::new).collect())
    }
}

/// Item `i` of a tuple.
pub(crate) fn tuple_item(t: &[Mutex<Value>], i: usize) -> Option<Value> {
    t.get(i).map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).clone())
}
/// The items of a tuple.
pub(crate) fn tuple_items(t: &[Mutex<Value>]) -> Vec<Value> {
    t.iter().map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).clone()).collect()
}

pub(crate) fn check(kind: &'static str, message: String) -> VmError {
    VmError::Check { kind, message }
}

/// A bool input in the spelling of the executable's TVM: `uint1` (one byte per element) before
/// tvm-ffi (0.19 to 0.21), tvm-ffi's 8-bit `kDLBool` after; either spelling is accepted.
pub(crate) fn bool_for_dialect(d: DataType, ffi_bool: bool) -> DataType {
    match (d, ffi_bool) {
        (DataType::FFI_BOOL, false) => DataType::BOOL,
        (DataType::BOOL, true) => DataType::FFI_BOOL,
        _ => d,
    }
}

/// An output's dtype as numpy spells it: tvm-ffi's 8-bit `kDLBool` becomes `uint1` (numpy's
/// bool, one byte per element, the same bytes); every other dtype stays.
pub fn numpy_dtype(d: DataType) -> DataType {
    if d == DataType::FFI_BOOL {
        DataType::BOOL
    } else {
        d
    }
}

/// An error context string, turned into text only when an error is reported.
pub(crate) struct Ctx<'a>(&'a [u8]);

impl std::fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.0))
    }
}

/// Argument access for builtins, with typed errors.
pub(crate) struct Args<'a> {
    callee: &'a str,
    args: &'a [&'a Value],
}

impl<'a> Args<'a> {
    /// The arguments `args` of the builtin `callee`.
    pub(crate) fn new(callee: &'a str, args: &'a [&'a Value]) -> Args<'a> {
        Args { callee, args }
    }

    /// Argument `i`, else an error naming the callee and the count given.
    pub(crate) fn get(&self, i: usize) -> Result<&'a Value, VmError> {
        self.args.get(i).copied().ok_or_else(|| missing_argument(self.callee, i, self.args.len()))
    }

    /// The error for argument `index` being `got` where `expected` was wanted.
    pub(crate) fn type_err(&self, index: usize, expected: &'static str, got: &Value) -> VmError {
        VmError::Type { callee: self.callee.to_owned(), index, expected, got: got.kind() }
    }

    /// Argument `i` as an integer.
    pub(crate) fn int(&self, i: usize) -> Result<i64, VmError> {
        match self.get(i)? {
            Value::Int(v) => Ok(*v),
            v => Err(self.type_err(i, "an integer", v)),
        }
    }

    pub(crate) fn dtype(&self, i: usize) -> Result<DataType, VmError> {
        match self.get(i)? {
            Value::DType(t) => Ok(*t),
            v => Err(self.type_err(i, "a data type", v)),
        }
    }

    pub(crate) fn shape(&self, i: usize) -> Result<Arc<[i64]>, VmError> {
        match self.get(i)? {
            Value::Shape(s) if s.iter().all(|&d| d >= 0) => Ok(s.clone()),
            Value::Shape(s) => Err(VmError::Program(format!("`{}`: negative extent in shape {s:?}", self.callee))),
            v => Err(self.type_err(i, "a shape", v)),
        }
    }

    pub(crate) fn str(&self, i: usize) -> Result<Arc<[u8]>, VmError> {
        match self.get(i)? {
            Value::Str(s) => Ok(s.clone()),
            v => Err(self.type_err(i, "a string", v)),
        }
    }

    /// Argument `i` as a tensor.
    pub(crate) fn tensor(&self, i: usize) -> Result<&'a NdArray, VmError> {
        match self.get(i)? {
            Value::Tensor(t) => Ok(t),
            v => Err(self.type_err(i, "a tensor", v)),
        }
    }

    /// The error context string (or empty for null).
    pub(crate) fn ctx(&self, i: usize) -> Result<Ctx<'_>, VmError> {
        match self.get(i)? {
            Value::Str(s) => Ok(Ctx(s)),
            Value::Null => Ok(Ctx(&[])),
            v => Err(self.type_err(i, "an error context string", v)),
        }
    }

    /// The shape heap: null or an int64 tensor.
    pub(crate) fn heap(&self, i: usize) -> Result<Option<NdArray>, VmError> {
        match self.get(i)? {
            Value::Null => Ok(None),
            Value::Tensor(t) if t.dtype() == DataType::I64 => Ok(Some(t.clone())),
            v => Err(self.type_err(i, "the shape heap (an int64 tensor) or null", v)),
        }
    }
}

/// The accessors the LLM builtins (`kv_cache`, `lm`) use besides the ones above.
#[cfg(feature = "llm")]
impl<'a> Args<'a> {
    /// Argument `i` as a number: a float, or an integer where TVM takes a `double`.
    pub(crate) fn float(&self, i: usize) -> Result<f64, VmError> {
        match self.get(i)? {
            Value::Float(v) => Ok(*v),
            Value::Int(v) => Ok(*v as f64),
            v => Err(self.type_err(i, "a number", v)),
        }
    }

    /// Argument `i` as a UTF-8 string.
    pub(crate) fn string(&self, i: usize) -> Result<String, VmError> {
        match self.get(i)? {
            Value::Str(s) => {
                std::str::from_utf8(s).map(str::to_owned).map_err(|_| self.type_err(i, "a UTF-8 string", &Value::Null))
            }
            v => Err(self.type_err(i, "a string", v)),
        }
    }

    /// Argument `i` as the extents of a shape value, of any sign (unlike [`Args::shape`]).
    pub(crate) fn extents(&self, i: usize) -> Result<&'a [i64], VmError> {
        match self.get(i)? {
            Value::Shape(s) => Ok(s),
            v => Err(self.type_err(i, "a shape", v)),
        }
    }

    /// Argument `i` as the items of an `Array` (a tuple).
    pub(crate) fn tuple(&self, i: usize) -> Result<Vec<Value>, VmError> {
        match self.get(i)? {
            Value::Tuple(items) => Ok(tuple_items(items)),
            v => Err(self.type_err(i, "an array", v)),
        }
    }
}

/// `callee` was given `given` arguments, too few to have argument `index` (counting from 0).
pub(crate) fn missing_argument(callee: &str, index: usize, given: usize) -> VmError {
    VmError::Program(format!(
        "`{callee}` needs at least {} argument{} (argument {index}, counting from 0, is missing), but was given {given}",
        index + 1,
        if index == 0 { "" } else { "s" }
    ))
}
