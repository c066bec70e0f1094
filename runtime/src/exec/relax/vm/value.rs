//! The VM's values and errors, the leaf the rest of the VM (and the LLM builtins of
//! `exec::llm`) build on: [`VmError`], runtime objects ([`ObjectRef`], [`VmObject`]), what a
//! parameter takes ([`ParamKind`]), the register values (`Value`, private to the VM and its
//! builtins: callers give and get [`exec::Value`](crate::exec::Value)) and the argument access
//! of builtins (`Args`).

use std::sync::{Arc, Mutex, PoisonError};

use crate::array::{ArrayError, NdArray};
use crate::device::storage::Storage;
use crate::device::{Device, DeviceError};
use crate::format::DataType;

pub use crate::exec::value::{ObjectRef, ParamKind, VmObject};

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
    #[error("the module tree has no relax executable (relax.Executable or relax.VMExecutable); its modules: {}", modules.join(", "))]
    NoExecutable {
        /// The type keys of the tree's modules.
        modules: Vec<String>,
    },
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
    /// `invoke` of a name that is neither a VM function nor a function the name resolves to.
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
    /// A memory scope other than `global` (the texture scopes of GPU builds), which this VM
    /// does not implement.
    #[error("not supported: {what} in memory scope `{scope}`")]
    MemoryScope {
        /// What was to live there (`constant 3`, `storage`, `a tensor`).
        what: String,
        /// The scope.
        scope: String,
    },
    /// A VM TIR function (a Relax function compiled with `exec_mode="compiled"`), which this
    /// VM does not run.
    #[error("not supported: VM TIR function `{name}` (a relax function compiled with exec_mode=\"compiled\")")]
    VmTir {
        /// The function.
        name: String,
    },
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
    /// A builtin or kernel called with too few arguments to have argument `index`.
    #[error("invalid program: `{callee}` needs at least {} argument{} (argument {index}, counting from 0, is missing), but was given {given}", index + 1, if *index == 0 { "" } else { "s" })]
    MissingArgument {
        /// The function called.
        callee: String,
        /// The missing argument's position (from 0).
        index: usize,
        /// The arguments given.
        given: usize,
    },
    /// A builtin called with more arguments than it takes.
    #[error("invalid program: `{callee}` takes {takes} arguments, got {given}")]
    ExtraArguments {
        /// The builtin.
        callee: String,
        /// How many it takes.
        takes: usize,
        /// How many it was given.
        given: usize,
    },
    /// A shape argument with a negative extent.
    #[error("invalid program: `{callee}`: negative extent in shape {shape:?}")]
    NegativeExtent {
        /// The function called.
        callee: String,
        /// The shape.
        shape: Vec<i64>,
    },
    /// A builtin argument outside the values it takes (a device, a size, a length).
    #[error("invalid program: `{callee}`: {what} {value} is out of range")]
    OutOfRange {
        /// The builtin.
        callee: String,
        /// What the argument is (`device`, `size`, `shape length`).
        what: &'static str,
        /// Its value.
        value: String,
    },
    /// A shape heap slot that does not exist (or no shape heap at all).
    #[error("invalid program: `{callee}`: shape heap slot {slot} does not exist")]
    HeapSlot {
        /// The builtin.
        callee: String,
        /// The slot.
        slot: i64,
    },
    /// Calls nested deeper than the VM allows (a program that recurses without end).
    #[error("invalid program: calls nested deeper than {max} (in `{function}`)")]
    CallDepth {
        /// The VM function called last.
        function: String,
        /// The limit.
        max: usize,
    },
    /// A VM function ran past its last instruction (no `Ret`).
    #[error("invalid program: `{function}` ran past its last instruction")]
    RanPast {
        /// The VM function.
        function: String,
    },
    /// An `If` whose condition register holds neither an int nor null.
    #[error("invalid program: `{function}` instruction {pc}: the condition {register} holds a {got}")]
    Condition {
        /// The VM function.
        function: String,
        /// The instruction index.
        pc: i64,
        /// The condition register.
        register: String,
        /// What it holds.
        got: &'static str,
    },
    /// A packed function returned a value a register cannot hold (a handle, a module).
    #[error("invalid program: function `{name}` returned a value the VM cannot hold ({got})")]
    KernelResult {
        /// The function.
        name: String,
        /// What it returned.
        got: &'static str,
    },
    /// An operator gave no result.
    #[error("invalid program: `{callee}`: no result")]
    NoResult {
        /// The operator.
        callee: String,
    },
    /// `R.print` could not write its line.
    #[error("`{callee}`: cannot write to standard output")]
    Stdout {
        /// The builtin.
        callee: String,
        /// The error of the write.
        #[source]
        source: std::io::Error,
    },
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
    /// A function returned a value a caller cannot hold (a storage, a closure, a data type).
    #[error("function `{function}` returned {got}, which cannot be given to the caller (tensors, shapes, numbers, strings, objects, null and tuples of them can)")]
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
pub(crate) fn numpy_dtype(d: DataType) -> DataType {
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
            Value::Shape(s) => Err(VmError::NegativeExtent { callee: self.callee.to_owned(), shape: s.to_vec() }),
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
    VmError::MissingArgument { callee: callee.to_owned(), index, given }
}
