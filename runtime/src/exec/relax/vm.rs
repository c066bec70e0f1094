//! The Relax VM interpreter: registers, calls of VM functions, of the library's kernels
//! (destination-passing style) and of TVM's `vm.builtin.*` runtime functions.
//!
//! Semantics follow TVM's `VirtualMachineImpl` (`src/runtime/relax_vm/vm.cc`, later
//! `src/runtime/vm/vm.cc`): each call of a VM function gets a frame of
//! `register_file_size` registers with the arguments in the first ones; `Call` evaluates its
//! arguments (registers, immediates, constants, functions), calls and writes the result to
//! `dst` unless it is `%void`; `Ret` returns a register; `Goto` and `If` jump relative to the
//! current instruction.
//!
//! Devices are TVM's too: a VM made for a device other than the CPU has the device list
//! `[device, cpu(0)]` (TVM's `VirtualMachine(mod, dev)` adds the host), one for the CPU just
//! `[cpu]`. Constant tensors are copied to the first device once, when the VM is created;
//! inputs are copied there when a function is invoked (unless already there); storage is
//! allocated on the device the program names (`alloc_storage`'s device index, `-1` for the
//! host); the shape heap lives on the host. Tensors are [`NdArray`]s: storages are pooled by
//! size per device, as TVM's pooled allocator does, and handed to kernels as `DLTensor`s in
//! the library's own calling convention.
//!
//! Function names are resolved when the VM is created, as TVM's `InitFuncPool` does: a name
//! that is neither a builtin nor a function of the tree (looked up from the root through the
//! imports, each module in its own convention) is an error then, naming it. A `vm.builtin.*`
//! this VM does not implement (LLM sampling, the tensor cache, the legacy and RNN states, and
//! without the `llm` feature the paged KV cache; the Python function registry) is refused only
//! when a function calls it ([`VmError::UnknownBuiltin`] with the reason), so the other
//! functions of the module run. Argument checks (`check_tensor_info`, `match_shape`, ...) fail
//! with the error kind and message TVM gives. Storages are allocated in 4096-byte pages, as
//! TVM's pooled allocator allocates them.
//!
//! Besides tensors, shapes, numbers, strings and tuples, registers hold runtime objects
//! ([`ObjectRef`]: TVM's paged KV cache, `exec::relax::kv_cache` with the `llm` feature) that a
//! caller gets back as [`VmValue::Object`] and passes in again, and function values that
//! builtins resolve to the library's kernels. [`VirtualMachine::call_function`] calls a builtin
//! or global function by name, as `tvm.get_global_func(name)(...)` does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::array::{tensor_bytes, ArrayError, NdArray};
use crate::device::{Device, DeviceError};
use crate::ffi::callconv::{PackedFunction, Value as CallValue};
use crate::ffi::device_api::{device_api, DeviceApi, Storage};
use crate::ffi::packed::DLTensor;
use crate::format::DataType;
use crate::module::LoadedTree;
use crate::payload::graph::Tensor;
use crate::payload::relax::executable::{
    dtype_name, Arg, Constant, Dialect, FuncKind, Instruction, Reg, RelaxExecutable,
};

mod run;

/// The page TVM's pooled allocator rounds storage sizes up to (`kDefaultPageSize`).
const POOL_PAGE: u64 = 4096;

/// Calls nested deeper than this fail (a recursive program would otherwise exhaust the stack).
pub const MAX_CALL_DEPTH: usize = 256;

/// An error of the Relax VM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmError {
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
    /// The program did something TVM would refuse (out-of-range heap index, too few builtin
    /// arguments, running past its last instruction, ...).
    #[error("invalid program: {0}")]
    Program(String),
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
    /// A paged KV cache call failed (TVM's checks, with TVM's messages).
    #[cfg(feature = "llm")]
    #[error(transparent)]
    KvCache(#[from] super::kv_cache::KvCacheError),
    /// A tensor cache, sampling or legacy KV cache builtin failed (TVM's checks, with TVM's
    /// messages). Boxed: its errors carry paths and shapes, and `VmError` stays small.
    #[cfg(feature = "llm")]
    #[error(transparent)]
    Lm(Box<super::lm::LmError>),
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

/// One output of a VM function, as [`VirtualMachine::invoke_outputs`] returns them (a returned
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

/// A value passed to or returned by a VM function ([`VirtualMachine::invoke_values`]): what
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
    func: u32,
    bound: Vec<Value>,
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
    fn type_key(&self, ffi: bool) -> &'static str {
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

/// Copies back into the caller's arrays what a call wrote into their copies: a
/// [`VmValue::Array`] off the VM's device is passed as a copy on the device, so that a builtin
/// writing into its arguments (`vm.builtin.attention_kv_cache_debug_get_kv` of a cache on a
/// GPU) writes into the caller's array as it does on the VM's device.
fn write_back(args: &[VmValue], values: &[Value]) -> Result<(), VmError> {
    for (arg, value) in args.iter().zip(values) {
        match (arg, value) {
            (VmValue::Array(a), Value::Tensor(t)) if a.device() != t.device() => t.copy_to(a)?,
            (VmValue::Tuple(items), Value::Tuple(vals)) => write_back(items, &tuple_items(vals))?,
            _ => {}
        }
    }
    Ok(())
}

/// The items of a tuple.
pub(crate) fn tuple_items(t: &[Mutex<Value>]) -> Vec<Value> {
    t.iter().map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).clone()).collect()
}

/// The builtins this VM implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Builtin {
    CheckTensorInfo,
    CheckShapeInfo,
    CheckTupleInfo,
    MatchShape,
    MatchPrimValue,
    MakeShape,
    MakePrimValue,
    AllocShapeHeap,
    AllocStorage,
    AllocTensor,
    NullValue,
    MakeTuple,
    TupleGetItem,
    Reshape,
    Copy,
    ShapeOf,
    EnsureZeroOffset,
    ToDevice,
    ReadIfCond,
    TensorToShape,
    CallTirDyn,
    CheckFuncInfo,
    CheckPrimValueInfo,
    CheckStringInfo,
    TupleResetItem,
    MemoryManagerClear,
    InvokeDebugFunc,
    DebugPrint,
    MakeClosure,
    InvokeClosure,
    TensorCreateView,
}

const BUILTINS: &[(&str, Builtin)] = &[
    ("vm.builtin.check_tensor_info", Builtin::CheckTensorInfo),
    ("vm.builtin.check_shape_info", Builtin::CheckShapeInfo),
    ("vm.builtin.check_tuple_info", Builtin::CheckTupleInfo),
    ("vm.builtin.match_shape", Builtin::MatchShape),
    ("vm.builtin.match_prim_value", Builtin::MatchPrimValue),
    ("vm.builtin.make_shape", Builtin::MakeShape),
    ("vm.builtin.make_prim_value", Builtin::MakePrimValue),
    ("vm.builtin.alloc_shape_heap", Builtin::AllocShapeHeap),
    ("vm.builtin.alloc_storage", Builtin::AllocStorage),
    ("vm.builtin.alloc_tensor", Builtin::AllocTensor),
    ("vm.builtin.null_value", Builtin::NullValue),
    ("vm.builtin.make_tuple", Builtin::MakeTuple),
    ("vm.builtin.tuple_getitem", Builtin::TupleGetItem),
    ("vm.builtin.reshape", Builtin::Reshape),
    ("vm.builtin.copy", Builtin::Copy),
    ("vm.builtin.shape_of", Builtin::ShapeOf),
    ("vm.builtin.ensure_zero_offset", Builtin::EnsureZeroOffset),
    ("vm.builtin.to_device", Builtin::ToDevice),
    ("vm.builtin.read_if_cond", Builtin::ReadIfCond),
    ("vm.builtin.tensor_to_shape", Builtin::TensorToShape),
    ("vm.builtin.call_tir_dyn", Builtin::CallTirDyn),
    ("vm.builtin.check_func_info", Builtin::CheckFuncInfo),
    ("vm.builtin.check_prim_value_info", Builtin::CheckPrimValueInfo),
    ("vm.builtin.check_string_info", Builtin::CheckStringInfo),
    ("vm.builtin.tuple_reset_item", Builtin::TupleResetItem),
    ("vm.builtin.memory_manager.clear", Builtin::MemoryManagerClear),
    ("vm.builtin.invoke_debug_func", Builtin::InvokeDebugFunc),
    ("vm.builtin.debug_print", Builtin::DebugPrint),
    ("vm.builtin.make_closure", Builtin::MakeClosure),
    ("vm.builtin.invoke_closure", Builtin::InvokeClosure),
    ("runtime.TVMTensorCreateView", Builtin::TensorCreateView),
];

/// The `vm.builtin.*` groups of TVM 0.27's registry that mblob refuses, by name prefix, with
/// the reason given when a function calls one.
pub const REFUSED_BUILTINS: &[(&str, &str)] = &[
    ("vm.builtin.attention_kv_cache_", "an LLM KV-cache builtin (not supported yet)"),
    ("vm.builtin.paged_attention_kv_cache_", "an LLM KV-cache builtin (not supported yet)"),
    ("vm.builtin.kv_cache_disagg_", "an LLM KV-cache builtin (not supported yet)"),
    ("vm.builtin.kv_state_", "an LLM KV-state builtin (not supported yet)"),
    ("vm.builtin.rnn_state_", "an LLM RNN-state builtin (not supported yet)"),
    ("vm.builtin.sample_", "an LLM sampling builtin (not supported yet)"),
    ("vm.builtin.multinomial_from_uniform", "an LLM sampling builtin (not supported yet)"),
    ("vm.builtin.apply_", "an LLM sampling builtin (not supported yet)"),
    ("vm.builtin.tensor_cache.", "it reads TVM's process-wide tensor cache of LLM weights (not supported yet)"),
    ("vm.builtin.param_", "it reads TVM's process-wide tensor cache of LLM weights (not supported yet)"),
    ("vm.builtin.call_py_func", PY_REASON),
    ("vm.builtin.register_py_func", PY_REASON),
    ("vm.builtin.get_py_func", PY_REASON),
    ("vm.builtin.clear_py_func_registry", PY_REASON),
];

const PY_REASON: &str = "it calls Python functions registered in TVM's process, which mblob does not have";

/// Why mblob refuses the builtin `name` (a `vm.builtin.*` it does not implement).
fn refusal(name: &str) -> &'static str {
    REFUSED_BUILTINS
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or("it is not in TVM 0.27's registry of relax VM builtins", |(_, why)| *why)
}

/// The names of the `vm.builtin.*` functions this VM implements.
pub fn supported_builtins() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|(n, _)| *n)
}

/// What [`VirtualMachine::quick`] did.
enum Quick {
    /// The call's result, for its destination register.
    Value(Value),
    /// The quick conditions do not hold: run the general call.
    General,
}

/// What an entry of the function table resolves to.
#[derive(Debug, Clone)]
enum Callee {
    Vm(usize),
    Builtin(Builtin),
    Kernel(PackedFunction),
    /// A `relax.run.*` function mblob provides ([`run`]).
    Run(run::RunFn),
    /// A `vm.builtin.*` mblob does not implement: an error when called.
    Refused(&'static str),
    /// An LLM builtin on runtime objects (the paged KV cache, [`super::kv_cache`]).
    #[cfg(feature = "llm")]
    Llm(super::kv_cache::BuiltinFn),
}

/// A call instruction decoded once, when the VM is made: the commonest calls as specialised
/// operations, their constant arguments read beforehand. Each one that finds its quick
/// conditions unmet at run time (a register of another kind, a tensor that fails a check, a
/// tensor that does not fit) runs the general call instead, which gives the same result or
/// the same error, so decoding changes no behaviour.
#[derive(Debug)]
enum Op {
    /// Any instruction, run as it is.
    General,
    /// `vm.builtin.null_value()`: the register becomes null.
    Null,
    /// A kernel called with registers only.
    Kernel {
        /// The kernel.
        kernel: PackedFunction,
        /// Its arguments' registers.
        regs: Box<[u32]>,
    },
    /// `vm.builtin.alloc_storage` of a constant size on a constant device, in global memory.
    AllocStorage {
        /// Index into the VM's devices.
        device: usize,
        /// Bytes (rounded up to the pool's page).
        len: usize,
        /// The pool's bucket this site allocated from last.
        hint: AtomicUsize,
    },
    /// `vm.builtin.alloc_tensor` at a constant offset with a constant shape and dtype, in
    /// global memory.
    AllocTensor {
        /// The register of the storage.
        storage: u32,
        /// Byte offset.
        offset: usize,
        /// The offset plus the tensor's size: at most the storage's size.
        end: u64,
        /// The shape (the constant's, shared).
        shape: Arc<[i64]>,
        /// The dtype.
        dtype: DataType,
    },
    /// `vm.builtin.check_tensor_info` of a register with a constant ndim and dtype.
    CheckTensor {
        /// The register checked.
        reg: u32,
        /// The number of dimensions, `-1` for any.
        ndim: i64,
        /// The dtype, `None` for any.
        dtype: Option<DataType>,
    },
    /// `vm.builtin.match_shape` of a register without the shape heap: each dimension is a
    /// constant to compare with (`Some`) or left alone (`None`, code 2).
    MatchShape {
        /// The register of the tensor or shape.
        reg: u32,
        /// Per dimension, the constant it must equal.
        dims: Box<[Option<i64>]>,
    },
}

impl Op {
    /// The operation instruction `ins` of `exec` becomes, with `callees` its resolved function
    /// table and `constants` its constants as values; [`Op::General`] for all that is not one
    /// of the quick cases.
    fn decode(ins: &Instruction, callees: &[Callee], constants: &[Value], devices: usize) -> Op {
        let Instruction::Call { func, args, .. } = ins else { return Op::General };
        let value = |a: &Arg| match *a {
            Arg::Const(c) => constants.get(c as usize).cloned(),
            Arg::Imm(v) => Some(Value::Int(v)),
            Arg::Reg(Reg::Void) => Some(Value::Null),
            _ => None,
        };
        let int = |a: &Arg| match *a {
            Arg::Imm(v) => Some(v),
            _ => None,
        };
        let reg = |a: &Arg| match *a {
            Arg::Reg(Reg::Index(r)) => Some(r),
            _ => None,
        };
        let global = |a: Option<&Arg>| match a {
            None => true,
            Some(a) => matches!(value(a), Some(Value::Str(s)) if &*s == b"global"),
        };
        let decoded = match callees.get(*func as usize) {
            Some(Callee::Builtin(Builtin::NullValue)) if args.is_empty() => Some(Op::Null),
            Some(Callee::Kernel(kernel)) => args
                .iter()
                .map(reg)
                .collect::<Option<Box<[u32]>>>()
                .map(|regs| Op::Kernel { kernel: kernel.clone(), regs }),
            Some(Callee::Builtin(Builtin::AllocStorage)) if (4..=5).contains(&args.len()) => (|| {
                let Some(Value::Shape(shape)) = value(&args[1]) else { return None };
                let device = match int(&args[2])? {
                    -1 => devices - 1,
                    i => usize::try_from(i).ok().filter(|&i| i < devices)?,
                };
                let Some(Value::DType(dtype)) = value(&args[3]) else { return None };
                if !global(args.get(4)) || shape.iter().any(|&d| d < 0) {
                    return None;
                }
                let size = tensor_bytes(dtype, &shape)?.checked_next_multiple_of(POOL_PAGE)?;
                Some(Op::AllocStorage { device, len: usize::try_from(size).ok()?, hint: AtomicUsize::new(usize::MAX) })
            })(),
            Some(Callee::Builtin(Builtin::AllocTensor)) if (4..=5).contains(&args.len()) => (|| {
                let storage = reg(&args[0])?;
                let offset = int(&args[1])?;
                let Some(Value::Shape(shape)) = value(&args[2]) else { return None };
                let Some(Value::DType(dtype)) = value(&args[3]) else { return None };
                if !global(args.get(4)) || shape.iter().any(|&d| d < 0) {
                    return None;
                }
                let offset_bytes = u64::try_from(offset).ok()?;
                let end = offset_bytes.checked_add(tensor_bytes(dtype, &shape)?)?;
                Some(Op::AllocTensor { storage, offset: usize::try_from(offset_bytes).ok()?, end, shape, dtype })
            })(),
            Some(Callee::Builtin(Builtin::CheckTensorInfo)) if (3..=4).contains(&args.len()) => (|| {
                let r = reg(&args[0])?;
                let ndim = int(&args[1])?;
                let dtype = match args.len() {
                    3 => None,
                    _ => match value(&args[2])? {
                        Value::DType(t) => Some(t),
                        Value::Null => None,
                        _ => return None,
                    },
                };
                if !matches!(value(&args[args.len() - 1])?, Value::Str(_) | Value::Null) {
                    return None;
                }
                Some(Op::CheckTensor { reg: r, ndim, dtype })
            })(),
            Some(Callee::Builtin(Builtin::MatchShape)) if args.len() >= 4 => (|| {
                let r = reg(&args[0])?;
                if !matches!(args[1], Arg::Reg(Reg::Void)) {
                    return None;
                }
                let n = usize::try_from(int(&args[2])?).ok()?;
                if args.len() != 4 + 2 * n || !matches!(value(&args[3 + 2 * n])?, Value::Str(_) | Value::Null) {
                    return None;
                }
                let dims = (0..n)
                    .map(|i| match (int(&args[3 + 2 * i])?, int(&args[4 + 2 * i])?) {
                        (0, v) => Some(Some(v)),
                        (2, _) => Some(None),
                        _ => None,
                    })
                    .collect::<Option<_>>()?;
                Some(Op::MatchShape { reg: r, dims })
            })(),
            _ => None,
        };
        decoded.unwrap_or(Op::General)
    }
}

/// A function of the executable that a caller can invoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSignature {
    /// The name.
    pub name: String,
    /// The parameter names, in order.
    pub params: Vec<String>,
    /// What each parameter takes, as the function checks it.
    pub kinds: Vec<ParamKind>,
}

/// Storages by device and size, for the next allocation of the same size on the same device
/// (a VM's storages have the same sizes on every run, as TVM's pooled allocator exploits). A
/// storage is free again when the pool holds the only reference: no register, tensor or view
/// (nor an output a caller kept) uses it any more.
#[derive(Debug, Default)]
struct StoragePool {
    buckets: Mutex<Vec<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    /// Index into the VM's devices.
    device: usize,
    nbytes: usize,
    storages: Vec<Arc<Storage>>,
}

impl StoragePool {
    /// Frees the storages no one uses (TVM's `MemoryManager::Clear` of its pooled allocators).
    fn clear(&self) {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        for b in buckets.iter_mut() {
            b.storages.retain_mut(|s| Arc::get_mut(s).is_none());
        }
        buckets.retain(|b| !b.storages.is_empty());
    }

    /// `nbytes` bytes on device `device` (`api`): a free storage of that size (holding what its
    /// last user wrote), or a new one.
    fn alloc(&self, device: usize, api: &Arc<dyn DeviceApi>, nbytes: usize) -> Result<Arc<Storage>, DeviceError> {
        self.alloc_at(None, device, api, nbytes)
    }

    /// [`StoragePool::alloc`] from an allocation site that remembers its bucket in `hint` (the
    /// bucket's index, checked before use: [`StoragePool::clear`] may have moved it), so that
    /// the site finds its bucket without a search.
    fn alloc_at(
        &self,
        hint: Option<&AtomicUsize>,
        device: usize,
        api: &Arc<dyn DeviceApi>,
        nbytes: usize,
    ) -> Result<Arc<Storage>, DeviceError> {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let hinted = hint
            .map(|h| h.load(Ordering::Relaxed))
            .filter(|&i| buckets.get(i).is_some_and(|b| b.device == device && b.nbytes == nbytes));
        let i = match hinted.or_else(|| buckets.iter().position(|b| b.device == device && b.nbytes == nbytes)) {
            Some(i) => i,
            None => {
                buckets.push(Bucket { device, nbytes, storages: Vec::new() });
                buckets.len() - 1
            }
        };
        if let Some(h) = hint {
            h.store(i, Ordering::Relaxed);
        }
        let bucket = &mut buckets[i];
        // `get_mut` succeeds only for the sole reference, and synchronises with the drop of the
        // last other one (which may have been on another thread).
        if let Some(free) = bucket.storages.iter_mut().find_map(|s| Arc::get_mut(s).is_some().then(|| s.clone())) {
            return Ok(free);
        }
        let s = Storage::with_api(api.clone(), nbytes)?;
        bucket.storages.push(s.clone());
        Ok(s)
    }
}

/// The Relax virtual machine over a loaded tree.
#[derive(Debug)]
pub struct VirtualMachine {
    /// Keeps the library (and every module the kernels may reach) loaded.
    _tree: LoadedTree,
    exec: Arc<RelaxExecutable>,
    callees: Vec<Callee>,
    constants: Vec<Value>,
    /// Per instruction, the values of its immediate, special-register and function arguments.
    immediates: Vec<Box<[Value]>>,
    /// Per instruction, what it was decoded to.
    ops: Vec<Op>,
    /// TVM's device list: the device the VM runs on, then the host CPU when that is another
    /// device. The last one is the host.
    devices: Vec<Device>,
    /// The device API of each device.
    apis: Vec<Arc<dyn DeviceApi>>,
    pool: StoragePool,
}

impl VirtualMachine {
    /// A VM for the Relax executable of `tree` (found depth first from the root) on `device`.
    /// Resolves every function of the executable's table, as TVM does when it creates its VM,
    /// and copies the constant tensors to `device`.
    pub fn new(tree: &LoadedTree, device: Device) -> Result<VirtualMachine, VmError> {
        let exec = tree
            .modules()
            .iter()
            .find_map(|m| m.module.as_any().downcast_ref::<RelaxExecutable>())
            .ok_or_else(|| VmError::NoExecutable(tree.type_keys().join(", ")))?;
        VirtualMachine::with_executable(tree, Arc::new(exec.clone()), device)
    }

    /// A VM that runs `exec` with the functions of `tree` (its library, the imports), for an
    /// executable that is not part of the tree (built with [`RelaxExecutable::from_parts`], or
    /// read on its own). Each module of the tree is called in its own convention.
    pub fn with_executable(
        tree: &LoadedTree,
        exec: Arc<RelaxExecutable>,
        device: Device,
    ) -> Result<VirtualMachine, VmError> {
        let _span = tracing::debug_span!("relax_vm_new", %device).entered();
        if let Some((index, scope)) = exec.memory_scopes.iter().find(|(_, s)| s != "global") {
            return Err(VmError::Unsupported(format!("memory scope `{scope}` of constant {index}")));
        }
        let mut callees = Vec::with_capacity(exec.functions.len());
        for (i, f) in exec.functions.iter().enumerate() {
            let callee = match f.kind {
                FuncKind::Vm => Callee::Vm(i),
                FuncKind::VmTir => {
                    return Err(VmError::Unsupported(format!(
                        "VM TIR function `{}` (a relax function compiled with exec_mode=\"compiled\")",
                        f.name
                    )))
                }
                FuncKind::Packed => resolve(tree, &f.name)?,
            };
            callees.push(callee);
        }
        if !device.is_cpu() && callees.iter().any(|c| matches!(c, Callee::Kernel(_))) {
            // Kernels compiled for the host alone check that their tensors are on the CPU; a
            // library built for a device carries that device's module.
            if !crate::exec::device_kinds(tree, 0).contains(&device.device_type) {
                let keys = tree.type_keys();
                return Err(VmError::UnsupportedDevice {
                    device,
                    reason: format!(
                        "finds no {} code in the library (its modules: {}): it was built for another target",
                        device.device_type,
                        keys.join(", ")
                    ),
                });
            }
        }
        let devices = if device.is_cpu() { vec![device] } else { vec![device, Device::cpu(0)] };
        let apis = devices.iter().map(|&d| device_api(d).map_err(device_error)).collect::<Result<Vec<_>, _>>()?;
        let constants =
            exec.constants.iter().map(|c| constant_value(c, &apis[0])).collect::<Result<Vec<Value>, _>>()?;
        let immediates = exec
            .instructions
            .iter()
            .map(|ins| match ins {
                Instruction::Call { args, .. } => args
                    .iter()
                    .filter_map(|a| match *a {
                        Arg::Reg(Reg::Index(_)) | Arg::Const(_) => None,
                        Arg::Reg(Reg::Void) => Some(Value::Null),
                        Arg::Reg(Reg::Vm) => Some(Value::Vm),
                        Arg::Imm(v) => Some(Value::Int(v)),
                        Arg::Func(f) => Some(Value::Func(f)),
                    })
                    .collect(),
                _ => Box::default(),
            })
            .collect();
        let ops = exec.instructions.iter().map(|ins| Op::decode(ins, &callees, &constants, devices.len())).collect();
        Ok(VirtualMachine {
            _tree: tree.clone(),
            exec,
            callees,
            constants,
            immediates,
            ops,
            devices,
            apis,
            pool: StoragePool::default(),
        })
    }

    /// The executable the VM runs.
    pub fn executable(&self) -> &RelaxExecutable {
        &self.exec
    }

    /// The tensor that tensor constant `index` of the executable's pool became on the VM's
    /// device: a view of the library's bytes when they lie at the alignment kernels need (on
    /// the CPU), else the one copy. `None` for another kind of constant or an index past the
    /// pool.
    pub fn constant_tensor(&self, index: usize) -> Option<&NdArray> {
        match self.constants.get(index)? {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// TVM's device list: the device the VM runs on (where constants, inputs and outputs live),
    /// then the host CPU when that is another device.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The VM functions a caller can invoke, with their parameter names.
    pub fn functions(&self) -> Vec<FunctionSignature> {
        self.executable()
            .functions
            .iter()
            .filter(|f| f.kind == FuncKind::Vm)
            .map(|f| FunctionSignature {
                name: f.name.clone(),
                params: f.param_names.clone(),
                kinds: self.param_kinds(f),
            })
            .collect()
    }

    /// What each parameter of `f` takes: the first `check_*_info` of it in the function.
    fn param_kinds(&self, f: &crate::payload::relax::FuncInfo) -> Vec<ParamKind> {
        let n = usize::try_from(f.num_args).unwrap_or(0);
        let mut kinds = vec![None; n];
        let exec = self.executable();
        let end = usize::try_from(f.end).unwrap_or(0).min(exec.instructions.len());
        let start = usize::try_from(f.start).unwrap_or(0).min(end);
        for ins in &exec.instructions[start..end] {
            let Instruction::Call { func, args, .. } = ins else { continue };
            let Some(Arg::Reg(Reg::Index(r))) = args.first() else { continue };
            let Some(slot) = kinds.get_mut(*r as usize).filter(|k| k.is_none()) else { continue };
            let imm = |i: usize| match args.get(i) {
                Some(Arg::Imm(v)) => Some(*v),
                _ => None,
            };
            *slot = match &self.callees[*func as usize] {
                Callee::Builtin(Builtin::CheckTensorInfo) => Some(ParamKind::Tensor),
                Callee::Builtin(Builtin::CheckShapeInfo) => Some(ParamKind::Shape),
                Callee::Builtin(Builtin::CheckFuncInfo) => Some(ParamKind::Func),
                Callee::Builtin(Builtin::CheckStringInfo) => Some(ParamKind::Str),
                Callee::Builtin(Builtin::CheckTupleInfo) => {
                    Some(ParamKind::Tuple(imm(1).and_then(|v| usize::try_from(v).ok()).unwrap_or(0)))
                }
                Callee::Builtin(Builtin::CheckPrimValueInfo) => Some(ParamKind::Prim(match args.get(1) {
                    Some(Arg::Const(c)) => match &exec.constants[*c as usize] {
                        Constant::DataType(d) if d.code != 3 => Some(*d),
                        _ => None,
                    },
                    _ => None,
                })),
                _ => None,
            };
        }
        kinds.into_iter().map(|k| k.unwrap_or(ParamKind::Any)).collect()
    }

    /// Calls the VM function `name` with `inputs` (positionally, in parameter order), copied
    /// to the VM's device, and returns its outputs copied to the host: one tensor, or the
    /// tensors of a returned tuple, flattened in order. A bool input may be spelled either way
    /// (`uint1` as TVM 0.19-0.21 do, or tvm-ffi's 8-bit `kDLBool`); it is passed as the
    /// executable's TVM spells bool.
    ///
    /// A function that returns a shape (`R.shape_of`, a `ShapeTuple`) anywhere in its result is
    /// refused here with [`VmError::Output`]; [`VirtualMachine::invoke_outputs`] returns those.
    pub fn invoke(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().enumerate().map(|(i, t)| vm.upload_tensor(i, t, ffi_bool)).collect()
        })?;
        tensor_leaves(&result, name)?.into_iter().map(|t| Ok(t.to_tensor()?)).collect()
    }

    /// Like [`VirtualMachine::invoke`], but a shape in the result (TVM's `ShapeTuple`, as
    /// `R.shape_of` returns) comes back as [`VmOutput::Shape`] instead of being refused.
    pub fn invoke_outputs(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<VmOutput>, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().enumerate().map(|(i, t)| vm.upload_tensor(i, t, ffi_bool)).collect()
        })?;
        leaves(&result, name, true)?
            .into_iter()
            .map(|l| match l {
                Leaf::Shape(s) => Ok(VmOutput::Shape(s.to_vec())),
                Leaf::Tensor(t) => Ok(VmOutput::Tensor(t.to_tensor()?)),
            })
            .collect()
    }

    /// Calls the VM function `name` with any values (tensors, shapes, numbers, strings,
    /// tuples of them), as TVM's `relax.VirtualMachine` does from Python, and returns its
    /// result with its structure: nested tuples stay nested, tensors are copied to the host.
    /// Tensors are passed as [`VirtualMachine::invoke`] passes them.
    pub fn invoke_values(&mut self, name: &str, inputs: &[VmValue]) -> Result<VmValue, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            let mut next = 0;
            inputs.iter().map(|v| vm.upload_value(&mut next, v, ffi_bool)).collect()
        })?;
        self.download_value(&result, name)
    }

    /// A value of the caller's as a register value; `next` numbers the tensors (for errors).
    fn upload_value(&self, next: &mut usize, v: &VmValue, ffi_bool: bool) -> Result<Value, VmError> {
        Ok(match v {
            VmValue::Tensor(t) => {
                *next += 1;
                self.upload_tensor(*next - 1, t, ffi_bool)?
            }
            VmValue::Shape(s) => Value::Shape(s.as_slice().into()),
            VmValue::Int(i) => Value::Int(*i),
            VmValue::Float(f) => Value::Float(*f),
            VmValue::Str(s) => Value::Str(s.as_bytes().into()),
            VmValue::Null => Value::Null,
            VmValue::Object(o) => Value::Object(o.clone()),
            VmValue::Array(a) => {
                *next += 1;
                self.upload_array(a, ffi_bool)?
            }
            VmValue::Tuple(items) => {
                Value::tuple(items.iter().map(|i| self.upload_value(next, i, ffi_bool)).collect::<Result<Vec<_>, _>>()?)
            }
        })
    }

    /// A result as the caller's value: tensors copied to the host, bools as numpy spells them.
    fn download_value(&self, v: &Value, function: &str) -> Result<VmValue, VmError> {
        Ok(match v {
            Value::Tensor(t) => {
                let t = t.to_tensor()?;
                VmValue::Tensor(Tensor { dtype: numpy_dtype(t.dtype), ..t })
            }
            Value::Shape(s) => VmValue::Shape(s.to_vec()),
            Value::Int(i) => VmValue::Int(*i),
            Value::Float(f) => VmValue::Float(*f),
            Value::Str(s) => VmValue::Str(String::from_utf8_lossy(s).into_owned()),
            Value::Null => VmValue::Null,
            Value::Object(o) => VmValue::Object(o.clone()),
            Value::Tuple(items) => VmValue::Tuple(
                tuple_items(items).iter().map(|i| self.download_value(i, function)).collect::<Result<_, _>>()?,
            ),
            v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
        })
    }

    /// Like [`VirtualMachine::invoke`] with tensors on any device: those not on the VM's
    /// device are copied there (the others are passed as they are, as TVM does), and the
    /// outputs stay where the program left them (on the VM's device), uncopied. An output
    /// shares its storage with nothing the VM uses again while the caller holds it.
    pub fn invoke_arrays(&mut self, name: &str, inputs: &[NdArray]) -> Result<Vec<NdArray>, VmError> {
        let result = self.invoke_value(name, inputs.len(), |vm, ffi_bool| {
            inputs.iter().map(|a| vm.upload_array(a, ffi_bool)).collect()
        })?;
        if let Value::Tensor(t) = result {
            // The commonest result, handed over without the walk.
            return Ok(vec![t]);
        }
        tensor_leaves(&result, name)
    }

    /// Finds the function, converts the inputs with `convert` and runs it.
    fn invoke_value(
        &mut self,
        name: &str,
        inputs: usize,
        convert: impl FnOnce(&VirtualMachine, bool) -> Result<Vec<Value>, VmError>,
    ) -> Result<Value, VmError> {
        let _span = tracing::debug_span!("relax_vm_invoke", function = name, inputs).entered();
        let exec = self.executable();
        let index = exec.functions.iter().position(|f| f.name == name && f.kind == FuncKind::Vm).ok_or_else(|| {
            VmError::UnknownFunction {
                name: name.to_owned(),
                available: exec.vm_functions().map(|f| f.name.clone()).collect(),
            }
        })?;
        let args = convert(self, exec.dialect == Dialect::Tvm022)?;
        self.call_vm(index, args, 0)
    }

    /// Input `index`, a host tensor, in a storage of the VM's device.
    fn upload_tensor(&self, index: usize, t: &Tensor, ffi_bool: bool) -> Result<Value, VmError> {
        let expected = tensor_bytes(t.dtype, &t.shape);
        let len = t.data.len();
        let Some(n) = expected.filter(|&n| n == len as u64) else {
            return Err(VmError::Input {
                index,
                detail: format!(
                    "{len} bytes of data for shape {:?} and dtype {} (expected {expected:?})",
                    t.shape, t.dtype
                ),
            });
        };
        let storage = self.pool.alloc(0, &self.apis[0], n as usize)?;
        storage.write(0, &t.data)?;
        Ok(Value::Tensor(NdArray::in_storage(&storage, 0, &t.shape, bool_for_dialect(t.dtype, ffi_bool))?))
    }

    /// An input tensor on the VM's device: itself when it is there, else a copy.
    fn upload_array(&self, a: &NdArray, ffi_bool: bool) -> Result<Value, VmError> {
        let dtype = bool_for_dialect(a.dtype(), ffi_bool);
        if a.device() == self.devices[0] {
            return Ok(Value::Tensor(if dtype == a.dtype() { a.clone() } else { a.view(a.shape(), dtype)? }));
        }
        let storage = self.pool.alloc(0, &self.apis[0], a.nbytes())?;
        let copy = NdArray::in_storage(&storage, 0, a.shape(), dtype)?;
        a.copy_to(&copy)?;
        Ok(Value::Tensor(copy))
    }

    fn call_vm(&self, index: usize, args: Vec<Value>, depth: usize) -> Result<Value, VmError> {
        let exec = self.executable();
        let f = &exec.functions[index];
        if depth >= MAX_CALL_DEPTH {
            return Err(VmError::Program(format!("calls nested deeper than {MAX_CALL_DEPTH} (in `{}`)", f.name)));
        }
        let expected = usize::try_from(f.num_args).unwrap_or(0);
        if args.len() != expected {
            let params =
                if f.param_names.is_empty() { String::new() } else { format!(" ({})", f.param_names.join(", ")) };
            return Err(VmError::ArgumentCount { function: f.name.clone(), expected, params, got: args.len() });
        }
        // The reader checked that every register index is below the file size and that the
        // file size is bounded by the executable's length.
        // The arguments' vector becomes the register file (no second one to allocate).
        let mut regs = args;
        regs.resize(f.register_file_size as usize, Value::Null);
        let (start, end) = (f.start, f.end);
        let mut pc = start;
        loop {
            if pc < start || pc >= end {
                return Err(VmError::Program(format!("`{}` ran past its last instruction", f.name)));
            }
            match &exec.instructions[pc as usize] {
                Instruction::Call { dst, func, args } => {
                    let at = move |e: VmError| VmError::At {
                        function: f.name.clone(),
                        pc: pc as usize,
                        callee: exec.functions[*func as usize].name.clone(),
                        source: Box::new(e),
                    };
                    match self.quick(&self.ops[pc as usize], &regs, *func).map_err(at)? {
                        Quick::Value(v) => {
                            if let Reg::Index(r) = dst {
                                regs[*r as usize] = v;
                            }
                            pc += 1;
                            continue;
                        }
                        Quick::General => {}
                    }
                    // Every argument by reference: registers, constants, and the values of
                    // immediates made when the VM was created (nothing is cloned).
                    let mut owned = self.immediates[pc as usize].iter();
                    let mut value = |a: &Arg| match *a {
                        Arg::Reg(Reg::Index(i)) => &regs[i as usize],
                        Arg::Const(c) => &self.constants[c as usize],
                        _ => owned.next().unwrap_or(&Value::Null),
                    };
                    // Up to 8 arguments (nearly every call) on the stack, more in a vector.
                    let mut stack: [&Value; 8] = [&Value::Null; 8];
                    let heap: Vec<&Value>;
                    let values: &[&Value] = if args.len() <= stack.len() {
                        for (slot, a) in stack.iter_mut().zip(args) {
                            *slot = value(a);
                        }
                        &stack[..args.len()]
                    } else {
                        heap = args.iter().map(value).collect();
                        &heap
                    };
                    let ret = self.call(*func as usize, values, depth).map_err(at)?;
                    if let Reg::Index(r) = dst {
                        regs[*r as usize] = ret;
                    }
                    pc += 1;
                }
                Instruction::Ret { result } => {
                    // The frame ends here: its register is taken, not shared.
                    return Ok(match *result {
                        Reg::Index(i) => std::mem::replace(&mut regs[i as usize], Value::Null),
                        r => read(&regs, r),
                    });
                }
                Instruction::Goto { offset } => pc += offset,
                Instruction::If { cond, false_offset } => {
                    let c = match read(&regs, *cond) {
                        Value::Int(v) => v,
                        Value::Null => 0,
                        v => {
                            return Err(VmError::Program(format!(
                                "`{}` instruction {pc}: the condition {cond} holds a {}",
                                f.name,
                                v.kind()
                            )))
                        }
                    };
                    pc += if c != 0 { 1 } else { *false_offset };
                }
            }
        }
    }

    /// Runs the decoded operation `op` of a call of `func` on `regs` when its quick conditions
    /// hold, else says to run the general call.
    #[inline]
    fn quick(&self, op: &Op, regs: &[Value], func: u32) -> Result<Quick, VmError> {
        Ok(match op {
            Op::General => Quick::General,
            Op::Null => Quick::Value(Value::Null),
            Op::Kernel { kernel, regs: args } => {
                let mut stack: [&Value; 8] = [&Value::Null; 8];
                if args.len() > stack.len() {
                    return Ok(Quick::General);
                }
                for (slot, &r) in stack.iter_mut().zip(args.iter()) {
                    *slot = &regs[r as usize];
                }
                let name = &self.executable().functions[func as usize].name;
                Quick::Value(call_kernel(name, kernel, &stack[..args.len()])?)
            }
            Op::AllocStorage { device, len, hint } => {
                let storage = self.pool.alloc_at(Some(hint), *device, &self.apis[*device], *len)?;
                Quick::Value(Value::Storage(storage))
            }
            Op::AllocTensor { storage, offset, end, shape, dtype } => match &regs[*storage as usize] {
                Value::Storage(s) if *end <= s.nbytes() as u64 => Quick::Value(Value::Tensor(
                    NdArray::in_storage_shared(s, *offset, shape.clone(), *dtype)?.with_vm_offset(*offset),
                )),
                _ => Quick::General,
            },
            Op::CheckTensor { reg, ndim, dtype } => match &regs[*reg as usize] {
                Value::Tensor(t)
                    if (*ndim == -1 || t.shape().len() as i64 == *ndim) && dtype.is_none_or(|d| d == t.dtype()) =>
                {
                    Quick::Value(Value::Null)
                }
                _ => Quick::General,
            },
            Op::MatchShape { reg, dims } => {
                let shape: &[i64] = match &regs[*reg as usize] {
                    Value::Tensor(t) => t.shape(),
                    Value::Shape(s) => s,
                    _ => return Ok(Quick::General),
                };
                let matches = shape.len() == dims.len()
                    && shape.iter().zip(dims.iter()).all(|(&d, want)| want.is_none_or(|w| w == d));
                if matches {
                    Quick::Value(Value::Null)
                } else {
                    Quick::General
                }
            }
        })
    }

    fn call(&self, func: usize, args: &[&Value], depth: usize) -> Result<Value, VmError> {
        let name = &self.executable().functions[func].name;
        match &self.callees[func] {
            // The commonest builtin (every register a function frees), without the builtin
            // dispatch.
            Callee::Builtin(Builtin::NullValue) if args.is_empty() => Ok(Value::Null),
            Callee::Vm(i) => self.call_vm(*i, args.iter().map(|v| (*v).clone()).collect(), depth + 1),
            Callee::Builtin(b) => self.builtin(*b, name, args, depth),
            // A kernel's return value is the call's result: a destination-passing kernel
            // returns nothing (null), a host function such as `compute_symbolic_expr` (a
            // symbolic expression Relax computes for `R.prim_value(n * m + 1)`) returns its value.
            Callee::Kernel(f) => call_kernel(name, f, args),
            Callee::Run(f) => f(name, args),
            Callee::Refused(reason) => Err(VmError::UnknownBuiltin { name: name.clone(), reason }),
            #[cfg(feature = "llm")]
            Callee::Llm(f) => f(self, name, args),
        }
    }

    /// The library function that the function value `func` (an index into the function
    /// table, `Value::Func`) resolves to, when it is one of the library's kernels.
    #[cfg(feature = "llm")]
    pub(crate) fn kernel_of(&self, func: u32) -> Option<(&str, PackedFunction)> {
        match self.callees.get(func as usize)? {
            Callee::Kernel(f) => Some((self.executable().functions[func as usize].name.as_str(), f.clone())),
            _ => None,
        }
    }

    /// The loaded tree the VM runs (kept alive by objects that hold its kernels).
    #[cfg(feature = "llm")]
    pub(crate) fn tree(&self) -> &LoadedTree {
        &self._tree
    }

    /// Calls a packed function by name with `args`, as TVM's
    /// `tvm.get_global_func(name)(*args)` does from Python: a VM builtin (the KV cache's
    /// `vm.builtin.kv_state_add_sequence`, ...), a VM function, a function of the library or one
    /// of mblob's global functions. Tensors are passed as [`VirtualMachine::invoke_values`]
    /// passes them, [`VmValue::Array`]s by reference (a builtin that writes into its
    /// arguments, such as `vm.builtin.attention_kv_cache_debug_get_kv`, writes into the
    /// caller's arrays; an array off the VM's device is copied there for the call and copied
    /// back after it); the result comes back as `invoke_values` gives it.
    pub fn call_function(&self, name: &str, args: &[VmValue]) -> Result<VmValue, VmError> {
        let _span = tracing::debug_span!("relax_vm_call_function", function = name, args = args.len()).entered();
        let exec = self.executable();
        let ffi_bool = exec.dialect == Dialect::Tvm022;
        let mut next = 0;
        let values = args.iter().map(|v| self.upload_value(&mut next, v, ffi_bool)).collect::<Result<Vec<_>, _>>()?;
        if let Some(index) = exec.functions.iter().position(|f| f.name == name && f.kind == FuncKind::Vm) {
            let result = self.call_vm(index, values.clone(), 0)?;
            write_back(args, &values)?;
            return self.download_value(&result, name);
        }
        let refs: Vec<&Value> = values.iter().collect();
        let result = match resolve(&self._tree, name)? {
            Callee::Vm(i) => self.call_vm(i, values.clone(), 0)?,
            Callee::Builtin(b) => self.builtin(b, name, &refs, 0)?,
            Callee::Kernel(f) => call_kernel(name, &f, &refs)?,
            Callee::Run(f) => f(name, &refs)?,
            Callee::Refused(reason) => return Err(VmError::UnknownBuiltin { name: name.to_owned(), reason }),
            #[cfg(feature = "llm")]
            Callee::Llm(f) => f(self, name, &refs)?,
        };
        write_back(args, &values)?;
        self.download_value(&result, name)
    }

    /// Calls a function value (a function of the table or a closure) with `args`, then the
    /// closure's bound arguments (TVM's `InvokeClosurePacked`).
    fn call_closure(&self, f: &Value, args: &[&Value], depth: usize) -> Result<Value, VmError> {
        match f {
            Value::Func(i) => self.call(*i as usize, args, depth),
            Value::Closure(c) => {
                let all: Vec<&Value> = args.iter().copied().chain(c.bound.iter()).collect();
                self.call(c.func as usize, &all, depth)
            }
            v => Err(VmError::Type {
                callee: "vm.builtin.invoke_closure".into(),
                index: 1,
                expected: "a function or closure",
                got: v.kind(),
            }),
        }
    }

    /// The index into the device list of `alloc_storage`'s `device_index` (TVM: `-1` is the
    /// host, the last device).
    fn device_index(&self, name: &str, device_index: i64) -> Result<usize, VmError> {
        let n = self.devices.len();
        match device_index {
            -1 => Ok(n - 1),
            i if (0..n as i64).contains(&i) => Ok(i as usize),
            i => Err(VmError::Program(format!(
                "{name}: device index {i} is out of the VM's device list [{}]",
                self.devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// TVM's type key of `v`, in the spelling of the executable's TVM.
    fn key(&self, v: &Value) -> &'static str {
        v.type_key(self.executable().dialect == Dialect::Tvm022)
    }

    fn builtin(&self, b: Builtin, name: &str, args: &[&Value], depth: usize) -> Result<Value, VmError> {
        let a = Args { callee: name, args };
        match b {
            Builtin::CheckTensorInfo => {
                let ndim = a.int(1)?;
                let (dtype, ctx) = if args.len() == 3 {
                    (None, a.ctx(2)?)
                } else {
                    let dtype = match a.get(2)? {
                        Value::DType(t) => Some(*t),
                        Value::Null => None,
                        v => return Err(a.type_err(2, "a data type", v)),
                    };
                    (dtype, a.ctx(3)?)
                };
                let Value::Tensor(t) = a.get(0)? else {
                    return Err(check("TypeError", format!("{ctx} expect a Tensor but get {}", self.key(a.get(0)?))));
                };
                if ndim != -1 && t.shape().len() as i64 != ndim {
                    return Err(check(
                        "ValueError",
                        format!("{ctx} expect Tensor with ndim {ndim} but get {}", t.shape().len()),
                    ));
                }
                if let Some(d) = dtype {
                    if t.dtype() != d {
                        return Err(check(
                            "ValueError",
                            format!(
                                "{ctx} expect Tensor with dtype {} but get {}",
                                dtype_name(d),
                                dtype_name(t.dtype())
                            ),
                        ));
                    }
                }
                Ok(Value::Null)
            }
            Builtin::CheckShapeInfo => {
                let ndim = a.int(1)?;
                let ctx = a.ctx(2)?;
                let Value::Shape(s) = a.get(0)? else {
                    return Err(check("TypeError", format!("{ctx} expect a Shape but get {}", self.key(a.get(0)?))));
                };
                if ndim != -1 && s.len() as i64 != ndim {
                    return Err(check(
                        "ValueError",
                        format!("{ctx} expect Shape with ndim {ndim} but get {}", s.len()),
                    ));
                }
                Ok(Value::Null)
            }
            Builtin::CheckTupleInfo => {
                let size = a.int(1)?;
                let ctx = a.ctx(2)?;
                let Value::Tuple(t) = a.get(0)? else {
                    return Err(check("TypeError", format!("{ctx} expect a Tuple but get {}", self.key(a.get(0)?))));
                };
                if t.len() as i64 != size {
                    return Err(check(
                        "ValueError",
                        format!(
                            "{ctx} expect a Tuple with {size} elements,  but get a Tuple with {} elements.",
                            t.len()
                        ),
                    ));
                }
                Ok(Value::Null)
            }
            Builtin::MatchShape => {
                let shape: &[i64] = match a.get(0)? {
                    Value::Tensor(t) => t.shape(),
                    Value::Shape(s) => s,
                    v => return Err(a.type_err(0, "a tensor or a shape", v)),
                };
                let heap = a.heap(1)?;
                let size = a.int(2)?;
                let n = usize::try_from(size).ok().filter(|n| 3 + 2 * n < args.len()).ok_or_else(|| {
                    VmError::Program(format!("{name}: {size} dimensions but {} arguments", args.len()))
                })?;
                let ctx = a.ctx(3 + 2 * n)?;
                if shape.len() != n {
                    return Err(check("RuntimeError", format!("{ctx} match_cast shape size mismatch.")));
                }
                for (i, &dim) in shape.iter().enumerate() {
                    let code = a.int(3 + 2 * i)?;
                    let reg = a.int(4 + 2 * i)?;
                    match code {
                        0 if dim != reg => {
                            return Err(check(
                                "RuntimeError",
                                format!("{ctx} match_cast error,  shape[{i}] mismatch to specified constant."),
                            ))
                        }
                        0 | 2 => {}
                        1 => heap_set(&heap, reg, dim, name)?,
                        3 => {
                            if dim != heap_get(&heap, reg, name)? {
                                return Err(check(
                                    "RuntimeError",
                                    format!(
                                        "{ctx} match_cast error,  shape[{i}] mismatch to a previous populated value."
                                    ),
                                ));
                            }
                        }
                        c => return Err(VmError::Program(format!("{name}: unknown match shape code {c}"))),
                    }
                }
                Ok(Value::Null)
            }
            Builtin::MatchPrimValue => {
                let value = a.int(0)?;
                let heap = a.heap(1)?;
                let code = a.int(2)?;
                let reg = a.int(3)?;
                let ctx = a.ctx(4)?;
                match code {
                    0 if value != reg => Err(check(
                        "RuntimeError",
                        format!("{ctx} match_cast error,  PrimValue mismatch to specified constant."),
                    )),
                    0 | 2 => Ok(Value::Null),
                    1 => heap_set(&heap, reg, value, name).map(|_| Value::Null),
                    3 if value != heap_get(&heap, reg, name)? => Err(check(
                        "RuntimeError",
                        format!("{ctx} match_cast error,  PrimValue mismatch to a previous populated value."),
                    )),
                    3 => Ok(Value::Null),
                    c => Err(VmError::Program(format!("{name}: unknown match shape code {c}"))),
                }
            }
            Builtin::MakeShape => {
                let heap = a.heap(0)?;
                let size = a.int(1)?;
                let n = usize::try_from(size).ok().filter(|n| 2 + 2 * n <= args.len()).ok_or_else(|| {
                    VmError::Program(format!("{name}: {size} dimensions but {} arguments", args.len()))
                })?;
                let mut shape = Vec::with_capacity(n);
                for i in 0..n {
                    let (code, reg) = (a.int(2 + 2 * i)?, a.int(3 + 2 * i)?);
                    shape.push(match code {
                        0 => reg,
                        1 => heap_get(&heap, reg, name)?,
                        c => return Err(VmError::Program(format!("{name}: unknown make shape code {c}"))),
                    });
                }
                Ok(Value::Shape(shape.into()))
            }
            Builtin::MakePrimValue => {
                let heap = a.heap(0)?;
                match (a.int(1)?, a.int(2)?) {
                    (0, reg) => Ok(Value::Int(reg)),
                    (1, reg) => heap_get(&heap, reg, name).map(Value::Int),
                    (c, _) => Err(VmError::Program(format!("{name}: unknown make shape code {c}"))),
                }
            }
            Builtin::AllocShapeHeap => {
                // On the host, the last device (TVM's `AllocShapeHeap`), zeroed.
                let size = a.int(1)?;
                let n = usize::try_from(size).map_err(|_| VmError::Program(format!("{name}: size {size}")))?;
                let bytes = n.checked_mul(8).ok_or(VmError::Alloc(u64::MAX))?;
                let host = self.devices.len() - 1;
                let storage = self.pool.alloc(host, &self.apis[host], bytes)?;
                storage.write(0, &vec![0; bytes])?;
                Ok(Value::Tensor(NdArray::in_storage(&storage, 0, &[size], DataType::I64)?))
            }
            Builtin::AllocStorage => {
                let shape = a.shape(1)?;
                let device = self.device_index(name, a.int(2)?)?;
                let dtype = a.dtype(3)?;
                if args.len() > 4 {
                    let scope = a.str(4)?;
                    if &*scope != b"global" {
                        return Err(VmError::Unsupported(format!(
                            "storage in memory scope `{}`",
                            String::from_utf8_lossy(&scope)
                        )));
                    }
                }
                // TVM's VM allocates through its pooled allocator, which rounds every size up
                // to its 4096-byte page: a program that overruns its plan (more tokens than an
                // LLM's bounds) fails where TVM's does, with TVM's sizes.
                let size = tensor_bytes(dtype, &shape)
                    .and_then(|n| n.checked_next_multiple_of(POOL_PAGE))
                    .ok_or(VmError::Alloc(u64::MAX))?;
                let len = usize::try_from(size).map_err(|_| VmError::Alloc(size))?;
                Ok(Value::Storage(self.pool.alloc(device, &self.apis[device], len)?))
            }
            Builtin::AllocTensor => {
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
                    return Err(super::checks::alloc_tensor_overrun(needed, offset, storage.nbytes()));
                }
                Ok(Value::Tensor(
                    NdArray::in_storage_shared(storage, offset as usize, shape, dtype)?.with_vm_offset(offset as usize),
                ))
            }
            Builtin::NullValue => {
                if !args.is_empty() {
                    return Err(VmError::Program(format!("{name} takes no arguments, got {}", args.len())));
                }
                Ok(Value::Null)
            }
            Builtin::MakeTuple => Ok(Value::tuple(args.iter().map(|v| (*v).clone()))),
            Builtin::TupleGetItem => {
                let Value::Tuple(t) = a.get(0)? else { return Err(a.type_err(0, "a tuple", a.get(0)?)) };
                let i = a.int(1)?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| tuple_item(t, i))
                    .ok_or_else(|| VmError::Program(format!("{name}: index {i} of a tuple of {}", t.len())))
            }
            Builtin::TupleResetItem => {
                // The item becomes null in the tuple itself (every holder sees it), so that what
                // it held can be freed (TVM's `ArrayObj::SetItem(index, nullptr)`).
                let Value::Tuple(t) = a.get(0)? else { return Err(a.type_err(0, "a tuple", a.get(0)?)) };
                let i = a.int(1)?;
                let item = usize::try_from(i)
                    .ok()
                    .and_then(|i| t.get(i))
                    .ok_or_else(|| VmError::Program(format!("{name}: index {i} of a tuple of {}", t.len())))?;
                *item.lock().unwrap_or_else(PoisonError::into_inner) = Value::Null;
                Ok(Value::Null)
            }
            Builtin::CheckFuncInfo => {
                let ctx = a.ctx(1)?;
                match a.get(0)? {
                    Value::Func(_) | Value::Closure(_) => Ok(Value::Null),
                    v => Err(check("TypeError", format!("{ctx} expect a Function but get {}", self.key(v)))),
                }
            }
            Builtin::CheckPrimValueInfo => {
                let dtype = a.dtype(1)?;
                let ctx = a.ctx(2)?;
                let v = a.get(0)?;
                let dname = dtype_name(dtype);
                let convert =
                    |to: &str| check("TypeError", format!("Cannot convert from type `{}` to `{to}`", self.key(v)));
                // Objects are refused first; numbers, None and (in tvm-ffi) short strings are
                // POD values that then fail to convert.
                match (v, dtype.code) {
                    (Value::Null | Value::Int(_) | Value::Float(_), _) => {}
                    (v @ Value::Str(_), _) if self.key(v) == "ffi.SmallStr" => {}
                    (v, _) => {
                        return Err(check(
                            "TypeError",
                            format!("{ctx}, expected dtype {dname}, but received ObjectRef of type {}", self.key(v)),
                        ))
                    }
                }
                match (v, dtype.code, dtype.bits, dtype.lanes) {
                    (Value::Int(_), 0 | 1 | 6, _, _) | (Value::Int(_) | Value::Float(_), 2, _, _) => Ok(Value::Null),
                    (Value::Null, 3, b, l) if b != 0 || l != 0 => Ok(Value::Null),
                    (_, 0 | 1, _, _) => Err(convert("int")),
                    (_, 6, _, _) => Err(convert("bool")),
                    (_, 2, _, _) => Err(convert("float")),
                    (_, 3, b, l) if b != 0 || l != 0 => Err(convert("void*")),
                    _ => Err(check("TypeError", format!("{ctx}, unsupported dtype {dname}"))),
                }
            }
            Builtin::CheckStringInfo => {
                let ctx = a.ctx(1)?;
                match a.get(0)? {
                    Value::Str(_) => Ok(Value::Null),
                    _ => Err(check("TypeError", format!("{ctx} expect a string"))),
                }
            }
            Builtin::MemoryManagerClear => {
                self.pool.clear();
                Ok(Value::Null)
            }
            Builtin::InvokeDebugFunc => {
                // (io_effect, debug function name, line info, args...): the debug functions
                // are Python functions registered in TVM's process; mblob has TVM's own
                // `vm.builtin.debug_print` (as a trace event) and no others.
                if !matches!(a.get(0)?, Value::Null) {
                    return Err(check("ValueError", "IOEffect is expected to be lowered to None.".into()));
                }
                let func = a.str(1)?;
                let _ = a.str(2)?;
                if &*func != b"vm.builtin.debug_print" {
                    let f = String::from_utf8_lossy(&func);
                    return Err(check(
                        "ValueError",
                        format!(
                            "{f} is not found. Use the decorator `@tvm.register_global_func(\"{f}\")` to register it."
                        ),
                    ));
                }
                self.builtin(Builtin::DebugPrint, "vm.builtin.debug_print", &args[2..], depth)?;
                Ok(Value::Null)
            }
            Builtin::DebugPrint => {
                let line = a.ctx(0)?;
                let t = a.tensor(1)?;
                tracing::info!(target: "mblob::relax::debug_print", "{line}: shape = {:?}, dtype = {}", t.shape(), dtype_name(t.dtype()));
                Ok(Value::Null)
            }
            Builtin::MakeClosure => {
                let f = a.get(0)?;
                let saved = args[1..].iter().map(|v| (*v).clone());
                Ok(Value::Closure(Arc::new(match f {
                    Value::Func(f) => Closure { func: *f, bound: saved.collect() },
                    // Binding again puts the new arguments before the ones bound already.
                    Value::Closure(c) => {
                        Closure { func: c.func, bound: saved.chain(c.bound.iter().cloned()).collect() }
                    }
                    v => return Err(a.type_err(0, "a function or closure", v)),
                })))
            }
            Builtin::InvokeClosure => {
                // (vm, closure, args...)
                let f = a.get(1)?;
                self.call_closure(f, &args[2..], depth)
            }
            Builtin::TensorCreateView => {
                // (tensor, shape, dtype, relative byte offset): TVM's `Tensor::CreateView`.
                let t = a.tensor(0)?;
                let shape = a.shape(1)?;
                let dtype = a.dtype(2)?;
                let offset = a.int(3)?;
                let view = tensor_bytes(dtype, &shape);
                let cur = t.nbytes() as u64;
                let fits =
                    u64::try_from(offset).ok().zip(view).and_then(|(o, v)| o.checked_add(v)).filter(|&e| e <= cur);
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
            Builtin::Reshape => {
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
            // TVM's `vm.builtin.copy` returns its argument.
            Builtin::Copy => a.get(0).cloned(),
            Builtin::ShapeOf => Ok(Value::Shape(a.tensor(0)?.shape().into())),
            // Tensors here have no byte offset: a view's storage starts at its first element.
            Builtin::EnsureZeroOffset => Ok(Value::Tensor(a.tensor(0)?.clone())),
            Builtin::ToDevice => {
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
            Builtin::ReadIfCond => match a.get(0)? {
                Value::Int(v) => Ok(Value::Int(i64::from(*v != 0))),
                Value::Tensor(t) if matches!(t.dtype().code, 0 | 1 | 6) && !t.is_empty() => {
                    // The first element, read from wherever the tensor is.
                    let mut raw = [0u8; 8];
                    let bytes = usize::from(t.dtype().bits).div_ceil(8).min(8);
                    t.storage().read(0, &mut raw[..bytes])?;
                    Ok(Value::Int(i64::from(raw.iter().any(|&b| b != 0))))
                }
                v => Err(a.type_err(0, "an integer or an integer tensor", v)),
            },
            Builtin::TensorToShape => {
                // A 1-D integer tensor's elements as a shape, read from wherever it is.
                let t = a.tensor(0)?;
                let bits = t.dtype().bits;
                if t.shape().len() != 1 || t.dtype().code != 0 || t.dtype().lanes != 1 || !matches!(bits, 16 | 32 | 64)
                {
                    return Err(VmError::Program(format!(
                        "{name}: expects a 1-D int16, int32 or int64 tensor, got {} {:?}",
                        dtype_name(t.dtype()),
                        t.shape()
                    )));
                }
                let raw = t.to_bytes()?;
                let shape: Vec<i64> = match bits {
                    16 => raw.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
                    32 => {
                        raw.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()
                    }
                    _ => raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
                };
                Ok(Value::Shape(shape.into()))
            }
            Builtin::CallTirDyn => {
                let Value::Func(f) = a.get(0)? else { return Err(a.type_err(0, "a function", a.get(0)?)) };
                let shape = a.shape(args.len().saturating_sub(1))?;
                let extents: Vec<Value> = shape.iter().map(|&d| Value::Int(d)).collect();
                let call_args: Vec<&Value> = args[1..args.len() - 1].iter().copied().chain(extents.iter()).collect();
                let f = *f as usize;
                match &self.callees[f] {
                    Callee::Kernel(kernel) => {
                        call_kernel(&self.executable().functions[f].name, kernel, &call_args)?;
                        Ok(Value::Null)
                    }
                    _ => self.call(f, &call_args, depth),
                }
            }
        }
    }
}

/// Whether mblob itself serves a packed function of this name, as the VM's name resolution finds it when
/// no module of the tree has it: a VM builtin, a `relax.run.*` function or a global function
/// (`crate::ffi::globals`). Used by [`super::calls::unsupported_calls`].
pub fn is_served(name: &str) -> bool {
    BUILTINS.iter().any(|(n, _)| *n == name) || provided(name).is_some() || llm_builtin(name).is_some()
}

/// The LLM builtin (paged KV cache, tensor cache, sampling, legacy KV cache) of this name,
/// when the `llm` feature is on.
#[cfg(feature = "llm")]
fn llm_builtin(name: &str) -> Option<Callee> {
    super::kv_cache::lookup(name).or_else(|| super::lm::builtins::lookup(name)).map(Callee::Llm)
}

/// Without the `llm` feature there are none: the names stay refused.
#[cfg(not(feature = "llm"))]
fn llm_builtin(_name: &str) -> Option<Callee> {
    None
}

/// A function mblob provides by name for when no module of the tree has it, as TVM's global
/// registry: a `relax.run.*` function on VM values, else a global function on DLTensors
/// (`tvm.contrib.sort.*` and others, `crate::ffi::globals`).
fn provided(name: &str) -> Option<Callee> {
    match run::lookup(name) {
        Some(f) => Some(Callee::Run(f)),
        None => crate::ffi::globals::global_function(name).map(Callee::Kernel),
    }
}

/// Resolves a packed function by name: a builtin, else a function of the tree (from the root,
/// through the imports), called in the convention of the module that has it.
fn resolve(tree: &LoadedTree, name: &str) -> Result<Callee, VmError> {
    if let Some((_, b)) = BUILTINS.iter().find(|(n, _)| *n == name) {
        return Ok(Callee::Builtin(*b));
    }
    match tree.packed_function(name) {
        Some(f) => Ok(Callee::Kernel(f)),
        None => match provided(name).or_else(|| llm_builtin(name)) {
            Some(c) => Ok(c),
            None if name.starts_with("vm.builtin.") => Ok(Callee::Refused(refusal(name))),
            None => Err(VmError::MissingFunction { name: name.to_owned() }),
        },
    }
}

/// A device API that cannot be had: a kind mblob cannot run on is
/// [`VmError::UnsupportedDevice`], a missing driver or device [`VmError::Device`].
fn device_error(e: DeviceError) -> VmError {
    match e {
        DeviceError::Unsupported { device, what } => {
            VmError::UnsupportedDevice { device, reason: format!("cannot use it ({what} is not supported)") }
        }
        e => VmError::Device(e),
    }
}

/// A constant of the pool as a register value: tensors on the VM's first device (`api`),
/// everything else (shapes, strings, numbers) on the host.
fn constant_value(c: &Constant, api: &Arc<dyn DeviceApi>) -> Result<Value, VmError> {
    Ok(match c {
        // Held once: a view of the library's bytes when aligned, else one copy (the library's
        // pages given back as they are copied).
        Constant::Tensor(t) => Value::Tensor(NdArray::from_mapped(&t.data, &t.shape, t.dtype, api)?),
        Constant::DataType(t) => Value::DType(*t),
        Constant::Shape(s) => Value::Shape(s.as_slice().into()),
        Constant::Str(s) => Value::Str(s.as_slice().into()),
        Constant::Int(v) => Value::Int(*v),
        Constant::Float(v) => Value::Float(*v),
    })
}

fn read(regs: &[Value], r: Reg) -> Value {
    match r {
        Reg::Index(i) => regs[i as usize].clone(),
        Reg::Void => Value::Null,
        Reg::Vm => Value::Vm,
    }
}

fn check(kind: &'static str, message: String) -> VmError {
    VmError::Check { kind, message }
}

/// A tensor or a shape of a function's result.
enum Leaf {
    Tensor(NdArray),
    Shape(Arc<[i64]>),
}

/// The tensors (and, with `shapes`, the shapes) of a result, tuples flattened in order.
fn leaves(v: &Value, function: &str, shapes: bool) -> Result<Vec<Leaf>, VmError> {
    fn walk(v: &Value, function: &str, shapes: bool, out: &mut Vec<Leaf>) -> Result<(), VmError> {
        match v {
            Value::Tensor(t) => out.push(Leaf::Tensor(t.clone())),
            Value::Shape(s) if shapes => out.push(Leaf::Shape(s.clone())),
            Value::Tuple(items) => {
                for i in tuple_items(items).iter() {
                    walk(i, function, shapes, out)?;
                }
            }
            v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(v, function, shapes, &mut out)?;
    Ok(out)
}

/// The tensors of a result, with an error naming anything else.
fn tensor_leaves(v: &Value, function: &str) -> Result<Vec<NdArray>, VmError> {
    Ok(leaves(v, function, false)?
        .into_iter()
        .filter_map(|l| match l {
            Leaf::Tensor(t) => Some(t),
            Leaf::Shape(_) => None,
        })
        .collect())
}

/// A bool input in the spelling of the executable's TVM: `uint1` (one byte per element) before
/// tvm-ffi (0.19 to 0.21), tvm-ffi's 8-bit `kDLBool` after; either spelling is accepted.
fn bool_for_dialect(d: DataType, ffi_bool: bool) -> DataType {
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

/// The shape heap (a host tensor) and the byte offset of its slot `reg`.
fn heap_slot<'a>(heap: &'a Option<NdArray>, reg: i64, name: &str) -> Result<(&'a NdArray, usize), VmError> {
    let missing = || VmError::Program(format!("{name}: shape heap slot {reg} does not exist"));
    let h = heap.as_ref().ok_or_else(missing)?;
    let r = usize::try_from(reg).ok().filter(|&r| r < h.len()).ok_or_else(missing)?;
    Ok((h, r * 8))
}

/// Slot `reg` of the shape heap.
fn heap_get(heap: &Option<NdArray>, reg: i64, name: &str) -> Result<i64, VmError> {
    let (h, at) = heap_slot(heap, reg, name)?;
    let mut b = [0u8; 8];
    h.storage().read(at, &mut b)?;
    Ok(i64::from_le_bytes(b))
}

/// Sets slot `reg` of the shape heap.
fn heap_set(heap: &Option<NdArray>, reg: i64, v: i64, name: &str) -> Result<(), VmError> {
    let (h, at) = heap_slot(heap, reg, name)?;
    h.storage().write(at, &v.to_le_bytes())?;
    Ok(())
}

/// Calls a kernel with the VM values as arguments: tensors as `DLTensor`s of their storage
/// (on whichever device they are), integers, floats and nulls, in the kernel's convention.
/// Its return value comes back as a VM value (integers and bools as `Int`, floats, null).
pub(crate) fn call_kernel(name: &str, kernel: &PackedFunction, args: &[&Value]) -> Result<Value, VmError> {
    for (index, v) in args.iter().enumerate() {
        if !matches!(v, Value::Tensor(_) | Value::Int(_) | Value::Float(_) | Value::Null) {
            return Err(VmError::Type {
                callee: name.to_owned(),
                index,
                expected: "a tensor, an integer, a float or null",
                got: v.kind(),
            });
        }
    }
    // The DLTensors and the call's values in arrays on the stack, sized to the call (most
    // kernels take two to four arguments: nothing more to fill and drop), else in vectors.
    match args.len() {
        0..=2 => call_kernel_in::<2>(name, kernel, args),
        3..=4 => call_kernel_in::<4>(name, kernel, args),
        5..=8 => call_kernel_in::<8>(name, kernel, args),
        _ => {
            let mut tensors: Vec<DLTensor> = args.iter().map(|_| UNUSED_DL_TENSOR).collect();
            let mut values: Vec<CallValue> = args.iter().map(|_| CallValue::None).collect();
            call_kernel_with(name, kernel, args, &mut tensors, &mut values)
        }
    }
}

/// [`call_kernel`] with arrays of `N` places (at least as many as the arguments).
#[inline]
fn call_kernel_in<const N: usize>(name: &str, kernel: &PackedFunction, args: &[&Value]) -> Result<Value, VmError> {
    let mut tensors: [DLTensor; N] = [UNUSED_DL_TENSOR; N];
    let mut values: [CallValue; N] = std::array::from_fn(|_| CallValue::None);
    let n = args.len();
    call_kernel_with(name, kernel, args, &mut tensors[..n], &mut values[..n])
}

/// [`call_kernel`] of checked arguments, with `tensors` and `values` (one place per argument)
/// to encode them in: the arrays are not touched again until the call returns, so that the
/// pointers to the DLTensors stay valid.
#[inline]
fn call_kernel_with(
    name: &str,
    kernel: &PackedFunction,
    args: &[&Value],
    tensors: &mut [DLTensor],
    values: &mut [CallValue],
) -> Result<Value, VmError> {
    for ((t, slot), v) in tensors.iter_mut().zip(values.iter_mut()).zip(args) {
        *slot = match v {
            Value::Tensor(a) => {
                *t = super::checks::kernel_dl_tensor(a);
                CallValue::Tensor(t as *mut DLTensor)
            }
            Value::Int(i) => CallValue::Int(*i),
            Value::Float(f) => CallValue::Float(*f),
            _ => CallValue::None,
        };
    }
    let _span = tracing::trace_span!("relax_kernel", kernel = name).entered();
    // SAFETY: the function is one the library (or a module of its tree) exports under this
    // name, called in the convention its module reports; that it is a kernel of that
    // signature is what the library's TVM promises (the trust taken when it was opened with
    // the `unsafe` `load_library`). Every tensor argument describes a live storage the
    // arguments hold (an `NdArray` is never larger than its storage), on its own device, with
    // a shape that lives in the `NdArray`; the `DLTensor`s live in `tensors` until the call
    // returns. Kernels do not write shapes.
    #[allow(unsafe_code)]
    let called = unsafe { kernel.call(values) };
    match called.map_err(|e| VmError::Kernel { name: name.to_owned(), code: e.code, message: e.message })? {
        CallValue::None => Ok(Value::Null),
        CallValue::Int(i) => Ok(Value::Int(i)),
        CallValue::Float(f) => Ok(Value::Float(f)),
        other => Err(VmError::Program(format!(
            "function `{name}` returned a value the VM cannot hold ({})",
            call_value_kind(&other)
        ))),
    }
}

/// The place of an argument that is not a tensor in `call_kernel`'s array of DLTensors (never
/// passed to the kernel).
const UNUSED_DL_TENSOR: DLTensor = DLTensor {
    data: std::ptr::null_mut(),
    device: crate::ffi::packed::DLDevice { device_type: 0, device_id: 0 },
    ndim: 0,
    dtype: crate::ffi::packed::DLDataType { code: 0, bits: 0, lanes: 0 },
    shape: std::ptr::null_mut(),
    strides: std::ptr::null_mut(),
    byte_offset: 0,
};

/// What kind of value a packed call returned, for errors.
fn call_value_kind(v: &CallValue) -> &'static str {
    match v {
        CallValue::None => "none",
        CallValue::Int(_) => "an integer",
        CallValue::Float(_) => "a float",
        CallValue::Handle(_) => "an opaque pointer",
        CallValue::DataType(_) => "a data type",
        CallValue::Device(_) => "a device",
        CallValue::Tensor(_) => "a DLTensor pointer",
        CallValue::Str(_) => "a string",
        CallValue::Object { .. } => "a tvm-ffi object",
    }
}

/// An error context string, turned into text only when an error is reported.
struct Ctx<'a>(&'a [u8]);

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
    /// Argument `i`, else an error naming the callee and the count given.
    pub(crate) fn get(&self, i: usize) -> Result<&'a Value, VmError> {
        self.args.get(i).copied().ok_or_else(|| super::checks::missing_argument(self.callee, i, self.args.len()))
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

    fn dtype(&self, i: usize) -> Result<DataType, VmError> {
        match self.get(i)? {
            Value::DType(t) => Ok(*t),
            v => Err(self.type_err(i, "a data type", v)),
        }
    }

    fn shape(&self, i: usize) -> Result<Arc<[i64]>, VmError> {
        match self.get(i)? {
            Value::Shape(s) if s.iter().all(|&d| d >= 0) => Ok(s.clone()),
            Value::Shape(s) => Err(VmError::Program(format!("`{}`: negative extent in shape {s:?}", self.callee))),
            v => Err(self.type_err(i, "a shape", v)),
        }
    }

    fn str(&self, i: usize) -> Result<Arc<[u8]>, VmError> {
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
    fn ctx(&self, i: usize) -> Result<Ctx<'_>, VmError> {
        match self.get(i)? {
            Value::Str(s) => Ok(Ctx(s)),
            Value::Null => Ok(Ctx(&[])),
            v => Err(self.type_err(i, "an error context string", v)),
        }
    }

    /// The shape heap: null or an int64 tensor.
    fn heap(&self, i: usize) -> Result<Option<NdArray>, VmError> {
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
    /// The arguments `args` of the builtin `callee`.
    pub(crate) fn new(callee: &'a str, args: &'a [&'a Value]) -> Args<'a> {
        Args { callee, args }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocation site's bucket hint finds its bucket, a storage comes back only when no
    /// one else holds it, and a hint left stale by `clear` (its bucket gone, another in its
    /// place) is not trusted.
    #[test]
    fn pool_sites_find_their_buckets_and_survive_clear() {
        let api = device_api(Device::cpu(0)).unwrap();
        let pool = StoragePool::default();
        let (a, b) = (AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX));
        let s1 = pool.alloc_at(Some(&a), 0, &api, 4096).unwrap();
        let t1 = pool.alloc_at(Some(&b), 0, &api, 8192).unwrap();
        assert_eq!((a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)), (0, 1));
        // Held: a second storage of the bucket; freed: the first one again.
        let s2 = pool.alloc_at(Some(&a), 0, &api, 4096).unwrap();
        assert!(!Arc::ptr_eq(&s1, &s2));
        let p1 = s1.ptr();
        drop(s1);
        assert_eq!(pool.alloc_at(Some(&a), 0, &api, 4096).unwrap().ptr(), p1);
        // `clear` drops the 4096-byte bucket once nothing holds its storages: the 8192-byte
        // one moves to index 0, where site `a`'s hint points.
        drop(s2);
        pool.clear();
        let t2 = pool.alloc_at(Some(&a), 0, &api, 4096).unwrap();
        assert_eq!(t2.nbytes(), 4096);
        assert!(!Arc::ptr_eq(&t1, &t2));
        let t3 = pool.alloc_at(Some(&b), 0, &api, 8192).unwrap();
        assert_eq!(t3.nbytes(), 8192);
        assert_eq!(b.load(Ordering::Relaxed), 0);
        assert_eq!(a.load(Ordering::Relaxed), 1);
    }
}
