//! The Relay virtual machine: runs a [`RelayVmExecutable`] (TVM 0.8 to 0.19's `VMExecutable`,
//! what `relay.vm.compile` makes for dynamic shapes and control flow) with the kernels of its
//! library.
//!
//! Semantics follow TVM's `VirtualMachine::RunLoop` (`src/runtime/vm/vm.cc`): each call of a
//! VM function gets a frame of `register_file_size` registers with the arguments in the first
//! ones; values are tensors, storages, ADTs (tuples, tagged constructors) and closures.
//! `LoadConsti`, `GetTag` and `ShapeOf` make small host tensors (`int64[1]`, `int32[1]`,
//! `int64[ndim]`); `If` compares the scalars of two registers (as `int32`, as TVM does) and jumps
//! by its true or false offset; `InvokePacked` calls a primitive of the library with its
//! arguments flattened (an ADT argument passes its fields), outputs last, and skips the call
//! when its one output is empty; `AllocStorage` allocates its size register's value (or, with
//! a shape, the shape's bytes) from the VM's storage pool, as TVM's VM allocates from its pooled
//! allocator (a storage handed out again once nothing holds it: the runs after the first
//! allocate nothing new), `AllocTensor`/`AllocTensorReg` view a storage at the offset
//! held in a register, `ReshapeTensor` views a tensor with the shape held in an `int64`
//! tensor. Calls (`Invoke`, `InvokeClosure`) push frames on a heap stack, so deep recursion
//! (a Relay loop) does not use the native stack.
//!
//! mblob runs the Relay VM on the CPU: every virtual device of the executable must be the CPU.
//! Late-bound constants (`exe.move_late_bound_consts`) are given to [`RelayVm::with_late_bound`];
//! [`RelayVm::new`] refuses an executable that has them, as TVM refuses a VM made before they
//! are loaded.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use smallvec::SmallVec;

use super::relay_checks;
use super::value::{ObjectRef, Value as ExecValue};
use crate::array::{tensor_bytes, ArrayError, NdArray};
use crate::device::api::DeviceApi;
use crate::device::backends::device_api;
use crate::device::storage::Storage;
use crate::device::{Device, DeviceError};
use crate::exec::pool::StoragePool;
use crate::ffi::call::PackedFunction;
use crate::ffi::kernel_call;
use crate::format::DataType;
use crate::module::LoadedTree;
use crate::payload::graph::Tensor;
use crate::payload::relay_vm::{FormatVersion, Instruction, RegName, RelayVmExecutable, VmConstant, VM_EXECUTABLE};

/// Frames deeper than this fail (each holds its registers; a runaway recursion would otherwise
/// take all memory).
pub const MAX_FRAMES: usize = 100_000;
/// Registers of all live frames together, at most (a deep recursion of a function with many
/// registers fails here first).
pub(crate) const MAX_STACK_REGISTERS: usize = 1 << 22;

/// An error of the Relay VM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayVmError {
    /// The tree holds no Relay VM executable.
    #[error("the module tree has no Relay VM executable ({VM_EXECUTABLE}); its modules: {}", modules.join(", "))]
    NoExecutable {
        /// The type keys of the tree's modules.
        modules: Vec<String>,
    },
    /// The VM cannot run on this device (mblob runs the Relay VM on the CPU).
    #[error("not supported on {device}: {reason}")]
    UnsupportedDevice {
        /// The device asked for or named by the executable.
        device: String,
        /// Why.
        reason: String,
    },
    /// A device failed.
    #[error(transparent)]
    Device(DeviceError),
    /// A tensor that cannot be made.
    #[error(transparent)]
    Array(ArrayError),
    /// A primitive of the executable that no module of the tree has.
    #[error("cannot find function in module: {name} (primitive {index} of the executable)")]
    MissingPrimitive {
        /// The primitive's name.
        name: String,
        /// Its index.
        index: usize,
    },
    /// A late-bound constant with no value given (TVM: "No binding for late-bound constant").
    #[error("no binding for late-bound constant at index {index} with name '{name}' (give the file of `exe.move_late_bound_consts` to RelayVm::with_late_bound)")]
    LateBound {
        /// The constant's index.
        index: usize,
        /// Its name.
        name: String,
    },
    /// Late-bound constants given that the executable does not name.
    #[error("have {} unused late-bound constants: {}", names.len(), names.join(", "))]
    UnusedLateBound {
        /// Their names.
        names: Vec<String>,
    },
    /// `invoke` of a name that is not a VM function.
    #[error("cannot find function {name} in the executable (functions: {})", available.join(", "))]
    UnknownFunction {
        /// The name asked for.
        name: String,
        /// The executable's functions.
        available: Vec<String>,
    },
    /// A function called with the wrong number of arguments.
    #[error("function {function} takes {expected} arguments ({}), {got} given", params.join(", "))]
    ArgumentCount {
        /// The function.
        function: String,
        /// Its number of parameters.
        expected: usize,
        /// Their names.
        params: Vec<String>,
        /// Arguments given.
        got: usize,
    },
    /// An input tensor whose data does not fit its shape and dtype.
    #[error("input {index}: {detail}")]
    Input {
        /// Position of the input.
        index: usize,
        /// What is wrong.
        detail: String,
    },
    /// A primitive returned an error.
    #[error("primitive `{name}` failed (code {code}): {message}")]
    Kernel {
        /// The primitive.
        name: String,
        /// Its return code.
        code: i32,
        /// Its message.
        message: String,
    },
    /// The program executed `Fatal` (TVM: "VM encountered fatal error").
    #[error("VM encountered fatal error")]
    Fatal,
    /// A decoded executable with an index the VM cannot follow (a register past its function's
    /// register file, a function, primitive or constant index past its table, a jump out of
    /// its function): refused when the VM is made (`exec::relay_checks::program`).
    #[error("invalid executable: `{function}` instruction {pc}: {detail}")]
    Bytecode {
        /// The VM function.
        function: String,
        /// The instruction index.
        pc: usize,
        /// What is wrong.
        detail: String,
    },
    /// One of TVM's runtime checks failed (a field past an ADT's, a tensor past its storage, a
    /// view larger than its tensor): TVM's error kind and message.
    #[error("{kind}: {message}")]
    Check {
        /// TVM's error kind.
        kind: &'static str,
        /// TVM's message.
        message: String,
    },
    /// An instruction given a register of a kind it cannot take (`get_field` of a tensor).
    #[error("invalid program: {instruction} of a {got}")]
    Operand {
        /// The instruction (`invoke_closure`, `get_field`, `get_tag`, `shape_of`,
        /// `reshape_tensor`, `device_copy`, `alloc_tensor`).
        instruction: &'static str,
        /// What the register holds.
        got: &'static str,
    },
    /// A kernel argument that is neither a tensor nor an ADT of tensors.
    #[error("invalid program: argument {index} of `{function}`{}is a {got}, not a tensor", if *in_adt { ": an ADT field " } else { " " })]
    KernelArgument {
        /// The kernel.
        function: String,
        /// The argument's position.
        index: usize,
        /// Whether it is a field of an ADT argument.
        in_adt: bool,
        /// What it is.
        got: &'static str,
    },
    /// A register that must hold a scalar or shape tensor (`If`, `AllocStorage`,
    /// `ReshapeTensor`) holds something else, or a tensor that cannot be one.
    #[error("invalid program: expected {expected}, got {got}")]
    NotScalar {
        /// `a scalar tensor`, `a shape tensor`.
        expected: &'static str,
        /// What it holds (`a tuple`, `a tensor of shape [0]`, `int16`).
        got: String,
    },
    /// A storage whose size, from its shape, overflows.
    #[error("invalid program: storage of shape {shape:?} overflows")]
    StorageOverflow {
        /// The shape.
        shape: Vec<i64>,
    },
    /// The VM's own bounds: calls nested deeper than [`MAX_FRAMES`], live frames holding more
    /// than the registers the VM allows (4 Mi).
    #[error("invalid program: {what} {limit}")]
    Limit {
        /// What went past it (`calls nested deeper than`).
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// A function returned ADTs nested deeper than its outputs can be.
    #[error("invalid program: `{function}` returned ADTs nested deeper than {limit}")]
    OutputDepth {
        /// The function.
        function: String,
        /// The deepest nesting taken.
        limit: usize,
    },
    /// A function ran past its last instruction, or returned with no frame left.
    #[error("invalid program: {}", match function {
        Some(f) => format!("`{f}` ran past its last instruction"),
        None => "the call stack is empty".to_owned(),
    })]
    RanPast {
        /// The function (`None`: no frame was left).
        function: Option<String>,
    },
    /// A function returned something other than tensors and tuples of them.
    #[error("function `{function}` returned a {got}, which cannot be an output")]
    Output {
        /// The function.
        function: String,
        /// What it returned.
        got: &'static str,
    },
    /// Where an error happened.
    #[error("in `{function}` at instruction {pc}: {source}")]
    At {
        /// The VM function.
        function: String,
        /// The instruction index.
        pc: usize,
        /// The error.
        #[source]
        source: Box<RelayVmError>,
    },
}

impl RelayVmError {
    /// The innermost error (through [`RelayVmError::At`]).
    pub fn root(&self) -> &RelayVmError {
        match self {
            RelayVmError::At { source, .. } => source.root(),
            e => e,
        }
    }
}

impl From<relay_checks::Bad> for RelayVmError {
    fn from(b: relay_checks::Bad) -> RelayVmError {
        RelayVmError::Bytecode { function: b.function, pc: b.pc, detail: b.detail }
    }
}

impl From<relay_checks::TvmCheck> for RelayVmError {
    fn from(c: relay_checks::TvmCheck) -> RelayVmError {
        RelayVmError::Check { kind: c.kind, message: c.message }
    }
}

impl From<DeviceError> for RelayVmError {
    fn from(e: DeviceError) -> RelayVmError {
        RelayVmError::Device(e)
    }
}

impl From<ArrayError> for RelayVmError {
    fn from(e: ArrayError) -> RelayVmError {
        match e {
            ArrayError::Device(d) => RelayVmError::Device(d),
            e => RelayVmError::Array(e),
        }
    }
}

/// A register value.
#[derive(Debug, Clone)]
enum Value {
    Null,
    Tensor(NdArray),
    Storage(Arc<Storage>),
    Adt { tag: i64, fields: Arc<[Value]> },
    Closure { func: u32, free: Arc<[Value]> },
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Tensor(_) => "runtime.NDArray",
            Value::Storage(_) => "vm.Storage",
            Value::Adt { .. } => "runtime.ADT",
            Value::Closure { .. } => "vm.Closure",
        }
    }
}

fn operand(instruction: &'static str, got: &Value) -> RelayVmError {
    RelayVmError::Operand { instruction, got: got.kind() }
}

fn not_scalar(expected: &'static str, got: impl Into<String>) -> RelayVmError {
    RelayVmError::NotScalar { expected, got: got.into() }
}

/// [`RelayVmError::NoExecutable`] naming `tree`'s modules.
fn no_executable(tree: &LoadedTree) -> RelayVmError {
    RelayVmError::NoExecutable { modules: tree.type_keys().into_iter().map(str::to_owned).collect() }
}

/// A VM function a caller can invoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSignature {
    /// The name.
    pub name: String,
    /// The parameter names, in order.
    pub params: Vec<String>,
}

/// The Relay virtual machine over a loaded tree.
#[derive(Debug)]
pub struct RelayVm {
    /// Keeps the library loaded.
    _tree: LoadedTree,
    exec: Arc<RelayVmExecutable>,
    primitives: Vec<PackedFunction>,
    constants: Vec<NdArray>,
    api: Arc<dyn DeviceApi>,
    device: Device,
    /// The storages of `AllocStorage` and of the inputs, kept across runs.
    pool: StoragePool,
    /// Per function, per instruction: the pool's bucket an `AllocStorage` there allocated from
    /// last.
    hints: Vec<Box<[AtomicUsize]>>,
}

struct Frame {
    func: usize,
    pc: usize,
    regs: Vec<Value>,
    /// The caller's register that receives the result.
    ret_dst: RegName,
}

impl RelayVm {
    /// A VM for the Relay VM executable of `tree` (found depth first from the root) on
    /// `device` (the CPU). Resolves every primitive in the tree, as TVM's `LoadExecutable`
    /// does, and makes the constants.
    pub fn new(tree: &LoadedTree, device: Device) -> Result<RelayVm, RelayVmError> {
        let exec = tree
            .modules()
            .iter()
            .find_map(|m| m.module.as_any().downcast_ref::<RelayVmExecutable>())
            .ok_or_else(|| no_executable(tree))?;
        RelayVm::with_executable(tree, Arc::new(exec.clone()), device, &[])
    }

    /// Like [`RelayVm::new`], for an executable whose large constants were moved out of it
    /// (`exe.move_late_bound_consts(path)`): `late_bound` holds them by name, as TVM's
    /// `exe.load_late_bound_consts(path)` reads them (TVM's params format:
    /// [`crate::exec::graph::read_params`]). Every late-bound constant must be given, and
    /// nothing else (unless the executable has none, when `late_bound` is ignored as TVM does).
    pub fn with_late_bound(
        tree: &LoadedTree,
        device: Device,
        late_bound: &[(String, Tensor)],
    ) -> Result<RelayVm, RelayVmError> {
        let exec = tree
            .modules()
            .iter()
            .find_map(|m| m.module.as_any().downcast_ref::<RelayVmExecutable>())
            .ok_or_else(|| no_executable(tree))?;
        RelayVm::with_executable(tree, Arc::new(exec.clone()), device, late_bound)
    }

    /// A VM that runs `exec` with the primitives of `tree` (and `late_bound` constants, see
    /// [`RelayVm::with_late_bound`]).
    pub fn with_executable(
        tree: &LoadedTree,
        exec: Arc<RelayVmExecutable>,
        device: Device,
        late_bound: &[(String, Tensor)],
    ) -> Result<RelayVm, RelayVmError> {
        let _span = tracing::debug_span!("relay_vm_new", %device).entered();
        relay_checks::program(&exec)?;
        if !device.is_cpu() {
            return Err(RelayVmError::UnsupportedDevice {
                device: device.to_string(),
                reason: "mblob runs the Relay VM on the CPU only".to_owned(),
            });
        }
        for (i, d) in exec.virtual_devices.iter().enumerate() {
            if d.device_type != 1 {
                return Err(RelayVmError::UnsupportedDevice {
                    device: format!("device type {} (id {})", d.device_type, d.device_id),
                    reason: format!(
                        "virtual device {i} of the executable is not the CPU; mblob runs the Relay VM on the CPU only"
                    ),
                });
            }
        }
        if exec.format == FormatVersion::V08 {
            // Device fields are device types there.
            let other = exec.const_device_indexes.iter().copied().chain(exec.functions.iter().flat_map(|f| {
                f.instructions.iter().filter_map(|i| match i {
                    Instruction::AllocStorage { device_index, .. } => Some(*device_index),
                    _ => None,
                })
            }));
            if let Some(t) = other.into_iter().find(|&t| t != 1) {
                return Err(RelayVmError::UnsupportedDevice {
                    device: format!("device type {t}"),
                    reason: "the executable uses a device other than the CPU; mblob runs the Relay VM on the CPU only"
                        .to_owned(),
                });
            }
        }
        // Each constant held once: in place when aligned, else one copy (see `from_mapped`).
        let held = |t: &Tensor| -> Result<NdArray, RelayVmError> {
            Ok(NdArray::from_mapped(&t.data, &t.shape, t.dtype, &device_api(device)?)?)
        };
        let mut constants = Vec::with_capacity(exec.constants.len());
        let mut used = vec![false; late_bound.len()];
        for (index, c) in exec.constants.iter().enumerate() {
            match c {
                VmConstant::Immediate(t) => constants.push(held(t)?),
                VmConstant::LateBound(name) => {
                    let i = late_bound
                        .iter()
                        .position(|(n, _)| n == name)
                        .ok_or_else(|| RelayVmError::LateBound { index, name: name.clone() })?;
                    used[i] = true;
                    constants.push(held(&late_bound[i].1)?);
                }
            }
        }
        let any_late = exec.constants.iter().any(|c| matches!(c, VmConstant::LateBound(_)));
        let unused: Vec<String> =
            late_bound.iter().zip(&used).filter(|(_, u)| !**u).map(|((n, _), _)| n.clone()).collect();
        if any_late && !unused.is_empty() {
            return Err(RelayVmError::UnusedLateBound { names: unused });
        }
        let primitives = exec
            .primitives
            .iter()
            .enumerate()
            .map(|(index, name)| {
                tree.packed_function(name).ok_or_else(|| RelayVmError::MissingPrimitive { name: name.clone(), index })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let api = device_api(device)?;
        let hints = exec
            .functions
            .iter()
            .map(|f| f.instructions.iter().map(|_| AtomicUsize::new(usize::MAX)).collect())
            .collect();
        Ok(RelayVm {
            _tree: tree.clone(),
            exec,
            primitives,
            constants,
            api,
            device,
            pool: StoragePool::default(),
            hints,
        })
    }

    /// The executable.
    pub fn executable(&self) -> &RelayVmExecutable {
        &self.exec
    }

    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The VM functions, with their parameter names.
    pub fn functions(&self) -> Vec<FunctionSignature> {
        self.exec
            .functions
            .iter()
            .map(|f| FunctionSignature { name: f.name.clone(), params: f.params.clone() })
            .collect()
    }

    /// Calls the VM function `name` with `inputs` (tensors, in parameter order; one on
    /// another device is copied to the VM's) and returns its result with TVM's structure: a
    /// tensor, or a tuple (an ADT of tag 0) of its fields, nested as the function built them
    /// (`((a, (b,)), c)` stays so; a one-field tuple is not a tensor); an ADT of another tag (a
    /// constructor's value) is an [`Adt`] object. The tensors are the VM's, on its device.
    pub fn invoke(&self, name: &str, inputs: &[ExecValue]) -> Result<ExecValue, RelayVmError> {
        let _span = tracing::debug_span!("relay_vm_invoke", function = name, inputs = inputs.len()).entered();
        let index = self.exec.function_index(name).ok_or_else(|| RelayVmError::UnknownFunction {
            name: name.to_owned(),
            available: self.exec.functions.iter().map(|f| f.name.clone()).collect(),
        })?;
        let mut args = Vec::with_capacity(inputs.len());
        for (i, v) in inputs.iter().enumerate() {
            let ExecValue::Tensor(t) = v else {
                return Err(RelayVmError::Input {
                    index: i,
                    detail: format!("a {}: a Relay VM function takes tensors", v.kind()),
                });
            };
            args.push(Value::Tensor(t.to_device(self.device)?));
        }
        let result = self.run(index, args)?;
        nested(&result, name, 0)
    }

    fn frame(&self, func: usize, args: Vec<Value>, ret_dst: RegName) -> Result<Frame, RelayVmError> {
        let f = &self.exec.functions[func];
        if args.len() != f.params.len() {
            return Err(RelayVmError::ArgumentCount {
                function: f.name.clone(),
                expected: f.params.len(),
                params: f.params.clone(),
                got: args.len(),
            });
        }
        // The reader checked params <= register_file_size <= MAX_REGISTERS.
        let mut regs = vec![Value::Null; f.register_file_size as usize];
        for (slot, a) in regs.iter_mut().zip(args) {
            *slot = a;
        }
        Ok(Frame { func, pc: 0, regs, ret_dst })
    }

    fn run(&self, func: usize, args: Vec<Value>) -> Result<Value, RelayVmError> {
        let mut stack = vec![self.frame(func, args, 0)?];
        let mut live = stack[0].regs.len();
        loop {
            let Some(frame) = stack.last_mut() else {
                return Err(RelayVmError::RanPast { function: None });
            };
            let f = &self.exec.functions[frame.func];
            let pc = frame.pc;
            let Some(ins) = f.instructions.get(pc) else {
                return Err(RelayVmError::RanPast { function: Some(f.name.clone()) });
            };
            let at = |e: RelayVmError| RelayVmError::At { function: f.name.clone(), pc, source: Box::new(e) };
            match self.step(ins, frame).map_err(at)? {
                Step::Next => frame.pc += 1,
                Step::Jump(off) => {
                    // The reader checked that every jump lands inside the function.
                    frame.pc = (pc as i64 + off) as usize;
                }
                Step::Call { func, args, dst } => {
                    if stack.len() >= MAX_FRAMES {
                        return Err(at(RelayVmError::Limit { what: "calls nested deeper than", limit: MAX_FRAMES }));
                    }
                    let size = self.exec.functions[func].register_file_size as usize;
                    if live + size > MAX_STACK_REGISTERS {
                        let what = "the live frames would hold more registers than";
                        return Err(at(RelayVmError::Limit { what, limit: MAX_STACK_REGISTERS }));
                    }
                    let callee = self.frame(func, args, dst).map_err(at)?;
                    live += callee.regs.len();
                    stack.push(callee);
                }
                Step::Return(v) => {
                    let done = stack.pop();
                    live -= done.as_ref().map_or(0, |d| d.regs.len());
                    match (stack.last_mut(), done) {
                        (Some(caller), Some(done)) => {
                            caller.regs[done.ret_dst as usize] = v;
                            caller.pc += 1;
                        }
                        _ => return Ok(v),
                    }
                }
            }
        }
    }

    fn step(&self, ins: &Instruction, frame: &mut Frame) -> Result<Step, RelayVmError> {
        let hint = self.hints[frame.func].get(frame.pc);
        let regs = &mut frame.regs;
        // Registers were checked against the file size by the reader.
        let get = |regs: &[Value], r: RegName| regs[r as usize].clone();
        match ins {
            Instruction::Move { from, dst } => regs[*dst as usize] = get(regs, *from),
            Instruction::Ret { result } => return Ok(Step::Return(get(regs, *result))),
            Instruction::Fatal => return Err(RelayVmError::Fatal),
            Instruction::LoadConst { const_index, dst, .. } => {
                regs[*dst as usize] = Value::Tensor(self.constants[*const_index as usize].clone());
            }
            Instruction::LoadConsti { value, dst } => {
                regs[*dst as usize] = Value::Tensor(self.host_ints(&[*value], DataType::I64)?);
            }
            Instruction::Invoke { func, args, dst } => {
                let args = args.iter().map(|r| get(regs, *r)).collect();
                return Ok(Step::Call { func: *func as usize, args, dst: *dst });
            }
            Instruction::InvokeClosure { closure, args, dst } => {
                let Value::Closure { func, free } = &regs[*closure as usize] else {
                    return Err(operand("invoke_closure", &regs[*closure as usize]));
                };
                let all = free.iter().cloned().chain(args.iter().map(|r| get(regs, *r))).collect();
                return Ok(Step::Call { func: *func as usize, args: all, dst: *dst });
            }
            Instruction::InvokePacked { packed_index, output_size, args } => {
                self.invoke_packed(*packed_index as usize, *output_size as usize, args, regs)?;
            }
            Instruction::GetField { object, field_index, dst } => {
                let Value::Adt { fields, .. } = &regs[*object as usize] else {
                    return Err(operand("get_field", &regs[*object as usize]));
                };
                let v = fields
                    .get(*field_index as usize)
                    .cloned()
                    .ok_or_else(|| relay_checks::field_index(*field_index, fields.len()))?;
                regs[*dst as usize] = v;
            }
            Instruction::GetTag { object, dst } => {
                let Value::Adt { tag, .. } = &regs[*object as usize] else {
                    return Err(operand("get_tag", &regs[*object as usize]));
                };
                regs[*dst as usize] = Value::Tensor(self.host_ints(&[*tag as i32 as i64], DataType::I32)?);
            }
            Instruction::Goto { offset } => return Ok(Step::Jump(*offset)),
            Instruction::If { test, target, true_offset, false_offset } => {
                let t = scalar_int(&regs[*test as usize])? as i32;
                let g = scalar_int(&regs[*target as usize])? as i32;
                return Ok(Step::Jump(if t == g { *true_offset } else { *false_offset }));
            }
            Instruction::AllocTensor { storage, offset, shape, dtype, dst } => {
                let t = self.alloc_tensor(&regs[*storage as usize], &regs[*offset as usize], shape, *dtype)?;
                regs[*dst as usize] = Value::Tensor(t);
            }
            Instruction::AllocTensorReg { storage, offset, shape_register, dtype, dst } => {
                let shape = tensor_ints(&regs[*shape_register as usize], false)?;
                let t = self.alloc_tensor(&regs[*storage as usize], &regs[*offset as usize], &shape, *dtype)?;
                regs[*dst as usize] = Value::Tensor(t);
            }
            Instruction::AllocAdt { tag, fields, dst } => {
                let fields: Arc<[Value]> = fields.iter().map(|r| get(regs, *r)).collect();
                regs[*dst as usize] = Value::Adt { tag: *tag, fields };
            }
            Instruction::AllocClosure { func, free_vars, dst } => {
                let free: Arc<[Value]> = free_vars.iter().map(|r| get(regs, *r)).collect();
                regs[*dst as usize] = Value::Closure { func: *func, free };
            }
            Instruction::AllocStorage { allocation_size, alignment, dtype_hint, shape, dst, .. } => {
                let size = match allocation_size {
                    Some(r) => scalar_int(&regs[*r as usize])?,
                    None => tensor_bytes(*dtype_hint, shape)
                        .and_then(|n| i64::try_from(n).ok())
                        .ok_or_else(|| RelayVmError::StorageOverflow { shape: shape.to_vec() })?,
                };
                // Of its own size (TVM's pooled allocator rounds it up to a 4096-byte page: a
                // recursion holding a small storage per frame would then hold pages).
                let len = relay_checks::storage(size, *alignment)?;
                regs[*dst as usize] = Value::Storage(self.pool.alloc_at(hint, 0, &self.api, len)?);
            }
            Instruction::ShapeOf { tensor, dst } => {
                let Value::Tensor(t) = &regs[*tensor as usize] else {
                    return Err(operand("shape_of", &regs[*tensor as usize]));
                };
                let shape = t.shape().to_vec();
                regs[*dst as usize] = Value::Tensor(self.host_ints(&shape, DataType::I64)?);
            }
            Instruction::ReshapeTensor { tensor, newshape, dst } => {
                let Value::Tensor(t) = &regs[*tensor as usize] else {
                    return Err(operand("reshape_tensor", &regs[*tensor as usize]));
                };
                let shape = tensor_ints(&regs[*newshape as usize], true)?;
                relay_checks::view(&shape, (t.shape(), t.dtype(), t.nbytes()))?;
                let v = t.view(&shape, t.dtype())?;
                regs[*dst as usize] = Value::Tensor(v);
            }
            Instruction::DeviceCopy { src, dst, .. } => {
                // Every device is the CPU (checked when the VM was made): a copy.
                let Value::Tensor(t) = &regs[*src as usize] else {
                    return Err(operand("device_copy", &regs[*src as usize]));
                };
                let c = t.copy(self.device)?;
                regs[*dst as usize] = Value::Tensor(c);
            }
            Instruction::KillRegister { dst } => regs[*dst as usize] = Value::Null,
        }
        Ok(Step::Next)
    }

    /// A host tensor of `values` (`int64` or `int32` elements), shape `[len]`.
    fn host_ints(&self, values: &[i64], dtype: DataType) -> Result<NdArray, RelayVmError> {
        let bytes: Vec<u8> = if dtype == DataType::I32 {
            values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
        } else {
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        };
        Ok(NdArray::from_bytes(&bytes, &[values.len() as i64], dtype, self.device)?)
    }

    fn alloc_tensor(
        &self,
        storage: &Value,
        offset: &Value,
        shape: &[i64],
        dtype: DataType,
    ) -> Result<NdArray, RelayVmError> {
        let Value::Storage(s) = storage else {
            return Err(operand("alloc_tensor", storage));
        };
        let off = scalar_int(offset)?;
        let off = relay_checks::alloc_tensor(off, tensor_bytes(dtype, shape), s.nbytes())?;
        Ok(NdArray::in_storage(s, off, shape, dtype)?.with_vm_offset(off))
    }

    fn invoke_packed(
        &self,
        index: usize,
        output_size: usize,
        args: &[RegName],
        regs: &[Value],
    ) -> Result<(), RelayVmError> {
        let name = &self.exec.primitives[index];
        let mut tensors: SmallVec<[&NdArray; 8]> = SmallVec::new();
        let mut empty_output = false;
        for (i, r) in args.iter().enumerate() {
            match &regs[*r as usize] {
                Value::Tensor(t) => {
                    if i + 1 == args.len() && output_size == 1 && t.shape().contains(&0) {
                        empty_output = true;
                    }
                    tensors.push(t);
                }
                Value::Adt { fields, .. } => {
                    for f in fields.iter() {
                        let Value::Tensor(t) = f else {
                            let function = name.clone();
                            return Err(RelayVmError::KernelArgument {
                                function,
                                index: i,
                                in_adt: true,
                                got: f.kind(),
                            });
                        };
                        tensors.push(t);
                    }
                }
                v => {
                    let function = name.clone();
                    return Err(RelayVmError::KernelArgument { function, index: i, in_adt: false, got: v.kind() });
                }
            }
        }
        if empty_output {
            return Ok(());
        }
        let _span = tracing::trace_span!("relay_vm_kernel", kernel = name.as_str()).entered();
        let called = kernel_call::call_kernel_arrays(&self.primitives[index], &tensors);
        drop(tensors);
        called.map_err(|e| RelayVmError::Kernel { name: name.clone(), code: e.code, message: e.message })
    }
}

enum Step {
    Next,
    Jump(i64),
    Call { func: usize, args: Vec<Value>, dst: RegName },
    Return(Value),
}

/// The first element of a tensor as an integer (TVM's `LoadScalarInt`: 1, 8, 16, 32 or 64 bits).
fn scalar_int(v: &Value) -> Result<i64, RelayVmError> {
    let Value::Tensor(t) = v else {
        return Err(not_scalar("a scalar tensor", format!("a {}", v.kind())));
    };
    let bytes = t.to_bytes()?;
    let b = |n: usize| {
        bytes.get(..n).ok_or_else(|| not_scalar("a scalar tensor", format!("an empty tensor of shape {:?}", t.shape())))
    };
    Ok(match t.dtype().bits {
        1 | 8 => i64::from(b(1)?[0] as i8),
        16 => i64::from(i16::from_le_bytes([b(2)?[0], b(2)?[1]])),
        32 => {
            let x = b(4)?;
            i64::from(i32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        }
        64 => {
            let x = b(8)?;
            i64::from_le_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]])
        }
        bits => return Err(not_scalar("a scalar tensor", format!("an int of {bits} bits"))),
    })
}

/// The elements of a 1-D integer tensor (a shape): `int64`, or also `int32` unless
/// `int64_only` (TVM's `ReshapeTensor` requires `int64`).
fn tensor_ints(v: &Value, int64_only: bool) -> Result<Vec<i64>, RelayVmError> {
    let Value::Tensor(t) = v else {
        return Err(not_scalar("a shape tensor", format!("a {}", v.kind())));
    };
    relay_checks::shape_tensor(t.shape(), t.dtype(), int64_only)?;
    let bytes = t.to_bytes()?;
    match (t.dtype().code, t.dtype().bits) {
        (0, 64) => Ok(bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()),
        (0, 32) if !int64_only => {
            Ok(bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect())
        }
        _ => Err(not_scalar("a shape tensor", format!("a tensor of dtype {}", t.dtype()))),
    }
}

/// ADTs nested deeper than this in a result are refused (a Relay list is a chain of ADTs).
const MAX_OUTPUT_DEPTH: usize = 1024;

/// A Relay ADT of a constructor other than the tuple (tag 0), as a VM function returns it: a
/// [`Value::Object`](ExecValue::Object) of type `runtime.ADT`.
#[derive(Debug, Clone)]
pub struct Adt {
    /// The constructor tag.
    pub tag: i64,
    /// The fields, in order.
    pub fields: Vec<ExecValue>,
}

impl crate::exec::value::VmObject for Adt {
    fn type_key(&self) -> &'static str {
        "runtime.ADT"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A result as an [`ExecValue`], ADTs nested at most [`MAX_OUTPUT_DEPTH`] deep.
fn nested(v: &Value, function: &str, depth: usize) -> Result<ExecValue, RelayVmError> {
    match v {
        Value::Tensor(t) => Ok(ExecValue::Tensor(t.clone())),
        Value::Adt { .. } if depth >= MAX_OUTPUT_DEPTH => {
            Err(RelayVmError::OutputDepth { function: function.to_owned(), limit: MAX_OUTPUT_DEPTH })
        }
        Value::Adt { tag, fields } => {
            let fields = fields.iter().map(|f| nested(f, function, depth + 1)).collect::<Result<Vec<_>, _>>()?;
            Ok(if *tag == 0 {
                ExecValue::Tuple(fields)
            } else {
                ExecValue::Object(ObjectRef::new(Adt { tag: *tag, fields }))
            })
        }
        v => Err(RelayVmError::Output { function: function.to_owned(), got: v.kind() }),
    }
}
