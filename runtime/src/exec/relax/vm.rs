//! The Relax VM interpreter: registers, calls of VM functions, of the library's kernels
//! (destination-passing style) and of TVM's `vm.builtin.*` runtime functions.
//!
//! Semantics follow TVM's `VirtualMachineImpl` (`src/runtime/relax_vm/vm.cc`, later
//! `src/runtime/vm/vm.cc`): each call of a VM function gets a frame of
//! `register_file_size` registers with the arguments in the first ones; `Call` evaluates its
//! arguments (registers, immediates, constants, functions), calls and writes the result to
//! `dst` unless it is `%void`; `Ret` returns a register; `Goto` and `If` jump relative to the
//! current instruction. Constant tensors are copied to aligned memory once, when the VM is
//! created, as TVM copies them to the device.
//!
//! Function names are resolved when the VM is created, as TVM's `InitFuncPool` does: a name
//! that is neither a builtin this VM implements nor a kernel of the library is an error then,
//! naming it. Argument checks (`check_tensor_info`, `match_shape`, ...) fail with the error
//! kind and message TVM gives.

use std::sync::Arc;

use smallvec::SmallVec;

use super::ffi::{self, Buffer, CallArg, CallFailure, Pool};
use crate::bytes::Bytes;
use crate::exec::tensor_bytes;
use crate::ffi::callconv::Abi;
use crate::ffi::packed::DLDevice;
use crate::format::stream::DataType;
use crate::format::Layout;
use crate::module::{LoadedTree, Symbol};
use crate::payload::graph::Tensor;
use crate::payload::relax::executable::{
    dtype_name, Arg, Constant, Dialect, FuncKind, Instruction, Reg, RelaxExecutable,
};

/// Calls nested deeper than this fail (a recursive program would otherwise exhaust the stack).
pub const MAX_CALL_DEPTH: usize = 256;

/// An error of the Relax VM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmError {
    /// The tree holds no Relax executable.
    #[error("the module tree has no relax executable (relax.Executable or relax.VMExecutable); its modules: {0}")]
    NoExecutable(String),
    /// Only the CPU is supported.
    #[error("device type {} (id {}) is not supported: the relax VM runs on the CPU (device type 1)", .0.device_type, .0.device_id)]
    UnsupportedDevice(DLDevice),
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
    /// A `vm.builtin.*` function this VM does not implement.
    #[error("relax VM builtin `{name}` is not supported by mblob")]
    UnknownBuiltin {
        /// The name.
        name: String,
    },
    /// A feature the VM does not implement (VM TIR functions, memory scopes, other devices).
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
    /// An input tensor that cannot be passed.
    #[error("input {index}: {detail}")]
    Input {
        /// Position of the input.
        index: usize,
        /// What is wrong.
        detail: String,
    },
    /// Memory for a tensor or storage could not be allocated.
    #[error("cannot allocate {0} bytes")]
    Alloc(u64),
    /// A function returned something other than tensors.
    #[error("function `{function}` returned {got}; which cannot be an output here (`invoke` returns tensors, `invoke_outputs` tensors and shapes, each also inside tuples)")]
    Output {
        /// The function.
        function: String,
        /// What it returned.
        got: &'static str,
    },
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

/// One output of a VM function, as [`VirtualMachine::invoke_outputs`] returns them (a returned
/// tuple flattened in order).
#[derive(Debug, Clone)]
pub enum VmOutput {
    /// A tensor (TVM's `NDArray` / `Tensor`).
    Tensor(Tensor),
    /// A shape (TVM's `ShapeTuple` / `ffi.Shape`), such as `R.shape_of` returns.
    Shape(Vec<i64>),
}

/// A tensor the VM holds: a view of an aligned buffer.
#[derive(Debug, Clone)]
struct NdArray {
    buf: Arc<Buffer>,
    offset: usize,
    shape: Arc<[i64]>,
    dtype: DataType,
}

impl NdArray {
    fn nbytes(&self) -> usize {
        tensor_bytes(self.dtype, &self.shape).unwrap_or(0) as usize
    }

    fn call_arg(&self) -> CallArg<'_> {
        CallArg::Tensor { buf: &self.buf, offset: self.offset, shape: &self.shape, dtype: self.dtype }
    }

    fn to_tensor(&self) -> Result<Tensor, VmError> {
        let n = self.nbytes();
        let bytes =
            self.buf.read(self.offset, n).ok_or_else(|| VmError::Program("tensor view past its storage".into()))?;
        Ok(Tensor { dtype: self.dtype, shape: self.shape.to_vec(), device: (1, 0), data: Bytes::from_vec(bytes) })
    }

    fn from_bytes(bytes: &[u8], shape: &[i64], dtype: DataType) -> Result<NdArray, VmError> {
        let buf = Buffer::from_bytes(bytes).ok_or(VmError::Alloc(bytes.len() as u64))?;
        Ok(NdArray { buf: Arc::new(buf), offset: 0, shape: shape.into(), dtype })
    }

    fn i64_at(&self, i: usize) -> Option<i64> {
        let b = self.buf.read(self.offset.checked_add(i.checked_mul(8)?)?, 8)?;
        Some(i64::from_le_bytes(b.try_into().ok()?))
    }

    fn set_i64(&self, i: usize, v: i64) -> bool {
        let Some(at) = i.checked_mul(8).and_then(|o| o.checked_add(self.offset)) else { return false };
        self.buf.write(at, &v.to_le_bytes())
    }

    fn len(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }
}

/// A register value.
#[derive(Debug, Clone)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
    DType(DataType),
    Str(Arc<[u8]>),
    Shape(Arc<[i64]>),
    Tensor(NdArray),
    Storage(Arc<Buffer>),
    Tuple(Arc<[Value]>),
    Vm,
    Func(u32),
}

impl Value {
    /// The name of the value's kind, as TVM's type keys call it.
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "None",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::DType(_) => "DataType",
            Value::Str(_) => "runtime.String",
            Value::Shape(_) => "runtime.ShapeTuple",
            Value::Tensor(_) => "runtime.NDArray",
            Value::Storage(_) => "vm.Storage",
            Value::Tuple(_) => "runtime.Array",
            Value::Vm => "VirtualMachine",
            Value::Func(_) => "vm.Closure",
        }
    }
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
    CallTirDyn,
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
    ("vm.builtin.call_tir_dyn", Builtin::CallTirDyn),
];

/// The names of the `vm.builtin.*` functions this VM implements.
pub fn supported_builtins() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|(n, _)| *n)
}

/// What an entry of the function table resolves to.
#[derive(Debug, Clone)]
enum Callee {
    Vm(usize),
    Builtin(Builtin),
    Kernel(Symbol, Abi),
}

/// A function of the executable that a caller can invoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSignature {
    /// The name.
    pub name: String,
    /// The parameter names, in order.
    pub params: Vec<String>,
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
    pool: Arc<Pool>,
}

impl VirtualMachine {
    /// A VM for the Relax executable of `tree` (found depth first from the root) on `device`
    /// (the CPU: device type 1). Resolves every function of the executable's table, as TVM
    /// does when it creates its VM, and copies the constant tensors to aligned memory.
    pub fn new(tree: &LoadedTree, device: DLDevice) -> Result<VirtualMachine, VmError> {
        let exec = tree
            .modules()
            .iter()
            .find_map(|m| m.module.as_any().downcast_ref::<RelaxExecutable>())
            .ok_or_else(|| VmError::NoExecutable(tree.type_keys().join(", ")))?;
        VirtualMachine::with_executable(tree, Arc::new(exec.clone()), device)
    }

    /// A VM that runs `exec` with the kernels of `tree` (its library and the imports), for an
    /// executable that is not part of the tree (built with [`RelaxExecutable::from_parts`], or
    /// read on its own). Kernels are looked up as for `tree`'s own TVM version.
    pub fn with_executable(
        tree: &LoadedTree,
        exec: Arc<RelaxExecutable>,
        device: DLDevice,
    ) -> Result<VirtualMachine, VmError> {
        let _span = tracing::debug_span!("relax_vm_new").entered();
        if device.device_type != 1 {
            return Err(VmError::UnsupportedDevice(device));
        }
        if let Some((index, scope)) = exec.memory_scopes.iter().find(|(_, s)| s != "global") {
            return Err(VmError::Unsupported(format!("memory scope `{scope}` of constant {index}")));
        }
        let layout = tree.origin().layout;
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
                FuncKind::Packed => resolve(tree, layout, &f.name)?,
            };
            callees.push(callee);
        }
        let constants = exec.constants.iter().map(constant_value).collect::<Result<_, _>>()?;
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
        Ok(VirtualMachine { _tree: tree.clone(), exec, callees, constants, immediates, pool: Arc::default() })
    }

    /// The executable the VM runs.
    pub fn executable(&self) -> &RelaxExecutable {
        &self.exec
    }

    /// The VM functions a caller can invoke, with their parameter names.
    pub fn functions(&self) -> Vec<FunctionSignature> {
        self.executable()
            .functions
            .iter()
            .filter(|f| f.kind == FuncKind::Vm)
            .map(|f| FunctionSignature { name: f.name.clone(), params: f.param_names.clone() })
            .collect()
    }

    /// Calls the VM function `name` with `inputs` (positionally, in parameter order) and
    /// returns its outputs: one tensor, or the tensors of a returned tuple, flattened in order.
    /// A bool input may be spelled either way (`uint1` as TVM 0.19-0.21 do, or tvm-ffi's 8-bit
    /// `kDLBool`); it is passed as the executable's TVM spells bool.
    ///
    /// A function that returns a shape (`R.shape_of`, a `ShapeTuple`) anywhere in its result is
    /// refused here with [`VmError::Output`]; [`VirtualMachine::invoke_outputs`] returns those.
    pub fn invoke(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, VmError> {
        let result = self.invoke_value(name, inputs)?;
        let mut out = Vec::new();
        flatten(&result, name, &mut out)?;
        Ok(out)
    }

    /// Like [`VirtualMachine::invoke`], but a shape in the result (TVM's `ShapeTuple`, as
    /// `R.shape_of` returns) comes back as [`VmOutput::Shape`] instead of being refused.
    pub fn invoke_outputs(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<VmOutput>, VmError> {
        let result = self.invoke_value(name, inputs)?;
        let mut out = Vec::new();
        flatten_outputs(&result, name, &mut out)?;
        Ok(out)
    }

    fn invoke_value(&mut self, name: &str, inputs: &[Tensor]) -> Result<Value, VmError> {
        let _span = tracing::debug_span!("relax_vm_invoke", function = name, inputs = inputs.len()).entered();
        let exec = self.executable();
        let index = exec.functions.iter().position(|f| f.name == name && f.kind == FuncKind::Vm).ok_or_else(|| {
            VmError::UnknownFunction {
                name: name.to_owned(),
                available: exec.vm_functions().map(|f| f.name.clone()).collect(),
            }
        })?;
        let ffi_bool = exec.dialect == Dialect::Tvm022;
        let args = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let expected = tensor_bytes(t.dtype, &t.shape);
                if expected != Some(t.data.len() as u64) {
                    return Err(VmError::Input {
                        index: i,
                        detail: format!(
                            "{} bytes of data for shape {:?} and dtype {} (expected {:?})",
                            t.data.len(),
                            t.shape,
                            t.dtype,
                            expected
                        ),
                    });
                }
                let buf = Buffer::pooled(t.data.len(), &self.pool).ok_or(VmError::Alloc(t.data.len() as u64))?;
                buf.write(0, &t.data);
                Ok(Value::Tensor(NdArray {
                    buf: Arc::new(buf),
                    offset: 0,
                    shape: t.shape.as_slice().into(),
                    dtype: bool_for_dialect(t.dtype, ffi_bool),
                }))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.call_vm(index, args, 0)
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
        let mut regs = vec![Value::Null; f.register_file_size as usize];
        for (slot, a) in regs.iter_mut().zip(args) {
            *slot = a;
        }
        let (start, end) = (f.start, f.end);
        let mut pc = start;
        loop {
            if pc < start || pc >= end {
                return Err(VmError::Program(format!("`{}` ran past its last instruction", f.name)));
            }
            match &exec.instructions[pc as usize] {
                Instruction::Call { dst, func, args } => {
                    // Every argument by reference: registers, constants, and the values of
                    // immediates made when the VM was created (nothing is cloned).
                    let mut owned = self.immediates[pc as usize].iter();
                    let values: SmallVec<[&Value; 8]> = args
                        .iter()
                        .map(|a| match *a {
                            Arg::Reg(Reg::Index(i)) => &regs[i as usize],
                            Arg::Const(c) => &self.constants[c as usize],
                            _ => owned.next().unwrap_or(&Value::Null),
                        })
                        .collect();
                    let ret = self.call(*func as usize, &values, depth).map_err(|e| VmError::At {
                        function: f.name.clone(),
                        pc: pc as usize,
                        callee: exec.functions[*func as usize].name.clone(),
                        source: Box::new(e),
                    })?;
                    drop(values);
                    if let Reg::Index(r) = dst {
                        regs[*r as usize] = ret;
                    }
                    pc += 1;
                }
                Instruction::Ret { result } => return Ok(read(&regs, *result)),
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

    fn call(&self, func: usize, args: &[&Value], depth: usize) -> Result<Value, VmError> {
        let name = &self.executable().functions[func].name;
        match &self.callees[func] {
            Callee::Vm(i) => self.call_vm(*i, args.iter().map(|v| (*v).clone()).collect(), depth + 1),
            Callee::Builtin(b) => self.builtin(*b, name, args, depth),
            Callee::Kernel(sym, conv) => {
                call_kernel(name, sym, *conv, args, 0)?;
                Ok(Value::Null)
            }
        }
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
                    return Err(check("TypeError", format!("{ctx} expect a Tensor but get {}", a.get(0)?.kind())));
                };
                if ndim != -1 && t.shape.len() as i64 != ndim {
                    return Err(check(
                        "ValueError",
                        format!("{ctx} expect Tensor with ndim {ndim} but get {}", t.shape.len()),
                    ));
                }
                if let Some(d) = dtype {
                    if t.dtype != d {
                        return Err(check(
                            "ValueError",
                            format!("{ctx} expect Tensor with dtype {} but get {}", dtype_name(d), dtype_name(t.dtype)),
                        ));
                    }
                }
                Ok(Value::Null)
            }
            Builtin::CheckShapeInfo => {
                let ndim = a.int(1)?;
                let ctx = a.ctx(2)?;
                let Value::Shape(s) = a.get(0)? else {
                    return Err(check("TypeError", format!("{ctx} expect a Shape but get {}", a.get(0)?.kind())));
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
                    return Err(check("TypeError", format!("{ctx} expect a Tuple but get {}", a.get(0)?.kind())));
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
                let shape: Arc<[i64]> = match a.get(0)? {
                    Value::Tensor(t) => t.shape.clone(),
                    Value::Shape(s) => s.clone(),
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
                let size = a.int(1)?;
                let n = usize::try_from(size).map_err(|_| VmError::Program(format!("{name}: size {size}")))?;
                let bytes = n.checked_mul(8).ok_or(VmError::Alloc(u64::MAX))?;
                let buf = Buffer::pooled(bytes, &self.pool).ok_or(VmError::Alloc(bytes as u64))?;
                buf.write(0, &vec![0; bytes]);
                Ok(Value::Tensor(NdArray {
                    buf: Arc::new(buf),
                    offset: 0,
                    shape: vec![size].into(),
                    dtype: DataType { code: 0, bits: 64, lanes: 1 },
                }))
            }
            Builtin::AllocStorage => {
                let shape = a.shape(1)?;
                let device_index = a.int(2)?;
                let dtype = a.dtype(3)?;
                if device_index != 0 && device_index != -1 {
                    return Err(VmError::Program(format!(
                        "{name}: device index {device_index}, but the VM has one device"
                    )));
                }
                if args.len() > 4 {
                    let scope = a.str(4)?;
                    if &*scope != b"global" {
                        return Err(VmError::Unsupported(format!(
                            "storage in memory scope `{}`",
                            String::from_utf8_lossy(&scope)
                        )));
                    }
                }
                let size = tensor_bytes(dtype, &shape).ok_or(VmError::Alloc(u64::MAX))?;
                let len = usize::try_from(size).map_err(|_| VmError::Alloc(size))?;
                Ok(Value::Storage(Arc::new(Buffer::pooled(len, &self.pool).ok_or(VmError::Alloc(size))?)))
            }
            Builtin::AllocTensor => {
                let Value::Storage(buf) = a.get(0)? else { return Err(a.type_err(0, "a storage", a.get(0)?)) };
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
                    .is_some_and(|end| end <= buf.len() as u64);
                if !fits {
                    return Err(VmError::Program(format!(
                        "storage allocation failure, attempted to allocate {} at offset {offset} in region that is {} bytes",
                        needed.map_or_else(|| "too many".to_owned(), |n| n.to_string()),
                        buf.len()
                    )));
                }
                Ok(Value::Tensor(NdArray { buf: buf.clone(), offset: offset as usize, shape, dtype }))
            }
            Builtin::NullValue => {
                if !args.is_empty() {
                    return Err(VmError::Program(format!("{name} takes no arguments, got {}", args.len())));
                }
                Ok(Value::Null)
            }
            Builtin::MakeTuple => Ok(Value::Tuple(args.iter().map(|v| (*v).clone()).collect())),
            Builtin::TupleGetItem => {
                let Value::Tuple(t) = a.get(0)? else { return Err(a.type_err(0, "a tuple", a.get(0)?)) };
                let i = a.int(1)?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| t.get(i))
                    .cloned()
                    .ok_or_else(|| VmError::Program(format!("{name}: index {i} of a tuple of {}", t.len())))
            }
            Builtin::Reshape => {
                let t = a.tensor(0)?;
                let shape = a.shape(1)?;
                let new_size = tensor_bytes(t.dtype, &shape);
                if new_size.is_none_or(|n| n > t.nbytes() as u64) {
                    return Err(VmError::Program(format!(
                        "{name}: shape {:?} does not fit in a tensor of shape {:?}",
                        shape, t.shape
                    )));
                }
                Ok(Value::Tensor(NdArray { shape, ..t.clone() }))
            }
            Builtin::Copy => a.get(0).cloned(),
            Builtin::ShapeOf => Ok(Value::Shape(a.tensor(0)?.shape.clone())),
            Builtin::EnsureZeroOffset => Ok(Value::Tensor(a.tensor(0)?.clone())),
            Builtin::ToDevice => {
                let t = a.tensor(0)?;
                let (dev_type, dev_id) = (a.int(1)?, a.int(2)?);
                if dev_type != 1 {
                    return Err(VmError::Unsupported(format!("copy to device type {dev_type} (id {dev_id})")));
                }
                let bytes = t.to_tensor()?;
                NdArray::from_bytes(&bytes.data, &t.shape, t.dtype).map(Value::Tensor)
            }
            Builtin::ReadIfCond => match a.get(0)? {
                Value::Int(v) => Ok(Value::Int(i64::from(*v != 0))),
                Value::Tensor(t) if matches!(t.dtype.code, 0 | 1 | 6) && t.len() >= 1 => {
                    let bytes = usize::from(t.dtype.bits).div_ceil(8);
                    let raw = t.buf.read(t.offset, bytes).unwrap_or_default();
                    Ok(Value::Int(i64::from(raw.iter().any(|&b| b != 0))))
                }
                v => Err(a.type_err(0, "an integer or an integer tensor", v)),
            },
            Builtin::CallTirDyn => {
                let Value::Func(f) = a.get(0)? else { return Err(a.type_err(0, "a function", a.get(0)?)) };
                let shape = a.shape(args.len().saturating_sub(1))?;
                let extents: Vec<Value> = shape.iter().map(|&d| Value::Int(d)).collect();
                let call_args: Vec<&Value> = args[1..args.len() - 1].iter().copied().chain(extents.iter()).collect();
                let f = *f as usize;
                match &self.callees[f] {
                    Callee::Kernel(sym, conv) => {
                        call_kernel(&self.executable().functions[f].name, sym, *conv, &call_args, 0)?;
                        Ok(Value::Null)
                    }
                    _ => self.call(f, &call_args, depth),
                }
            }
        }
    }
}

/// Resolves a packed function by name: a builtin, else a kernel of the library.
fn resolve(tree: &LoadedTree, layout: Option<Layout>, name: &str) -> Result<Callee, VmError> {
    if let Some((_, b)) = BUILTINS.iter().find(|(n, _)| *n == name) {
        return Ok(Callee::Builtin(*b));
    }
    // TVM 0.22+ exports kernels as `__tvm_ffi_<name>`; 0.21 keeps the name with the tvm-ffi
    // signature; 0.8-0.20 use the classic packed signature.
    let ffi_name = format!("__tvm_ffi_{name}");
    let found = match layout {
        Some(Layout::Ffi) => tree.get_function(&ffi_name).map(|s| (s, Abi::Ffi)),
        Some(Layout::Classic021) => tree.get_function(name).map(|s| (s, Abi::Ffi)),
        Some(Layout::Classic) => tree.get_function(name).map(|s| (s, Abi::Packed)),
        None => tree
            .get_function(&ffi_name)
            .map(|s| (s, Abi::Ffi))
            .or_else(|| tree.get_function(name).map(|s| (s, Abi::Packed))),
    };
    match found {
        Some((sym, conv)) => Ok(Callee::Kernel(sym, conv)),
        None if name.starts_with("vm.builtin.") => Err(VmError::UnknownBuiltin { name: name.to_owned() }),
        None => Err(VmError::MissingFunction { name: name.to_owned() }),
    }
}

fn constant_value(c: &Constant) -> Result<Value, VmError> {
    Ok(match c {
        Constant::Tensor(t) => Value::Tensor(NdArray::from_bytes(&t.data, &t.shape, t.dtype)?),
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

fn flatten(v: &Value, function: &str, out: &mut Vec<Tensor>) -> Result<(), VmError> {
    match v {
        Value::Tensor(t) => out.push(t.to_tensor()?),
        Value::Tuple(items) => {
            for i in items.iter() {
                flatten(i, function, out)?;
            }
        }
        v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
    }
    Ok(())
}

/// A bool input in the spelling of the executable's TVM: `uint1` (one byte per element) before
/// tvm-ffi (0.19 to 0.21), tvm-ffi's 8-bit `kDLBool` after; either spelling is accepted.
fn bool_for_dialect(d: DataType, ffi_bool: bool) -> DataType {
    const UINT1: DataType = DataType { code: 1, bits: 1, lanes: 1 };
    const FFI: DataType = DataType { code: 6, bits: 8, lanes: 1 };
    match (d, ffi_bool) {
        (FFI, false) => UINT1,
        (UINT1, true) => FFI,
        _ => d,
    }
}

fn flatten_outputs(v: &Value, function: &str, out: &mut Vec<VmOutput>) -> Result<(), VmError> {
    match v {
        Value::Tensor(t) => out.push(VmOutput::Tensor(t.to_tensor()?)),
        Value::Shape(s) => out.push(VmOutput::Shape(s.to_vec())),
        Value::Tuple(items) => {
            for i in items.iter() {
                flatten_outputs(i, function, out)?;
            }
        }
        v => return Err(VmError::Output { function: function.to_owned(), got: v.kind() }),
    }
    Ok(())
}

fn heap_get(heap: &Option<NdArray>, reg: i64, name: &str) -> Result<i64, VmError> {
    heap.as_ref()
        .and_then(|h| usize::try_from(reg).ok().filter(|&r| r < h.len()).and_then(|r| h.i64_at(r)))
        .ok_or_else(|| VmError::Program(format!("{name}: shape heap slot {reg} does not exist")))
}

fn heap_set(heap: &Option<NdArray>, reg: i64, v: i64, name: &str) -> Result<(), VmError> {
    let ok = heap.as_ref().is_some_and(|h| usize::try_from(reg).ok().is_some_and(|r| r < h.len() && h.set_i64(r, v)));
    if ok {
        Ok(())
    } else {
        Err(VmError::Program(format!("{name}: shape heap slot {reg} does not exist")))
    }
}

/// Calls a kernel with the VM values as arguments.
fn call_kernel(name: &str, sym: &Symbol, conv: Abi, args: &[&Value], _depth: usize) -> Result<(), VmError> {
    let call_args = args
        .iter()
        .enumerate()
        .map(|(index, v)| match v {
            Value::Tensor(t) => Ok(t.call_arg()),
            Value::Int(v) => Ok(CallArg::Int(*v)),
            Value::Float(v) => Ok(CallArg::Float(*v)),
            Value::Null => Ok(CallArg::Null),
            v => Err(VmError::Type {
                callee: name.to_owned(),
                index,
                expected: "a tensor, an integer, a float or null",
                got: v.kind(),
            }),
        })
        .collect::<Result<SmallVec<[_; 4]>, _>>()?;
    let _span = tracing::trace_span!("relax_kernel", kernel = name).entered();
    ffi::call(sym, conv, &call_args).map_err(|e| match e {
        CallFailure::View(index) => {
            VmError::Program(format!("argument {index} of `{name}` is a view past its storage"))
        }
        CallFailure::Kernel(code, message) => VmError::Kernel { name: name.to_owned(), code, message },
    })
}

/// An error context string, turned into text only when an error is reported.
struct Ctx<'a>(&'a [u8]);

impl std::fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.0))
    }
}

/// Argument access for builtins, with typed errors.
struct Args<'a> {
    callee: &'a str,
    args: &'a [&'a Value],
}

impl Args<'_> {
    fn get(&self, i: usize) -> Result<&Value, VmError> {
        self.args.get(i).copied().ok_or_else(|| {
            VmError::Program(format!("`{}` needs argument {i}, but was given {}", self.callee, self.args.len()))
        })
    }

    fn type_err(&self, index: usize, expected: &'static str, got: &Value) -> VmError {
        VmError::Type { callee: self.callee.to_owned(), index, expected, got: got.kind() }
    }

    fn int(&self, i: usize) -> Result<i64, VmError> {
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

    fn tensor(&self, i: usize) -> Result<&NdArray, VmError> {
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
            Value::Tensor(t) if t.dtype == (DataType { code: 0, bits: 64, lanes: 1 }) => Ok(Some(t.clone())),
            v => Err(self.type_err(i, "the shape heap (an int64 tensor) or null", v)),
        }
    }
}
