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
//! allocated on the device the program names (`alloc_storage`'s device index into that list;
//! TVM's check refuses `-1`, which its code would take for the host); the shape heap lives on the host. Tensors are [`NdArray`]s: storages are pooled by
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
//! ([`ObjectRef`]: TVM's paged KV cache, `exec::llm::kv_cache` with the `llm` feature) that a
//! caller gets back as [`Value::Object`](crate::exec::Value::Object) and passes in again, and
//! function values that builtins resolve to the library's kernels. The one entry point,
//! [`VirtualMachine::invoke`], takes and gives [`exec::Value`](crate::exec::Value)s and calls a
//! VM function, or a builtin or global function by name as `tvm.get_global_func(name)(...)`
//! does; the interpreter's own register values do not leave the VM.

use std::sync::Arc;

use crate::array::NdArray;
use crate::device::api::DeviceApi;
use crate::device::backends::device_api;
use crate::device::{Device, DeviceError};
use crate::format::Layout;
use crate::module::LoadedTree;
use crate::payload::relax::executable::{Arg, Constant, FuncKind, Instruction, Reg, RelaxExecutable};

mod builtins;
mod decode;
mod io;
mod kernel;
mod run;
mod types;
pub(crate) mod value;

pub(crate) use kernel::call_kernel;
#[cfg(feature = "llm")]
pub(crate) use types::BuiltinFn;
pub(crate) use types::Builtins;
pub use types::VirtualMachine;
use types::{Callee, Op, Quick};
pub(crate) use value::{numpy_dtype, tuple_items, Value};
pub use value::{ObjectRef, ParamKind, VmError};

use crate::exec::pool::StoragePool;

/// Calls nested deeper than this fail (a recursive program would otherwise exhaust the stack).
const MAX_CALL_DEPTH: usize = 256;

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

impl VirtualMachine {
    /// A VM for the Relax executable of `tree` (found depth first from the root) on `device`.
    /// Resolves every function of the executable's table, as TVM does when it creates its VM,
    /// and copies the constant tensors to `device`.
    pub fn new(tree: &LoadedTree, device: Device) -> Result<VirtualMachine, VmError> {
        let exec = tree
            .modules()
            .iter()
            .find_map(|m| m.module.as_any().downcast_ref::<RelaxExecutable>())
            .ok_or_else(|| no_executable(tree))?;
        VirtualMachine::build(tree, Arc::new(exec.clone()), device, Builtins::default())
    }

    /// A VM that runs `exec` with the functions of `tree` (its library, the imports), for an
    /// executable that is not part of the tree (built with [`RelaxExecutable::from_parts`], or
    /// read on its own). Each module of the tree is called in its own convention.
    pub fn with_executable(
        tree: &LoadedTree,
        exec: Arc<RelaxExecutable>,
        device: Device,
    ) -> Result<VirtualMachine, VmError> {
        VirtualMachine::build(tree, exec, device, Builtins::default())
    }

    fn build(
        tree: &LoadedTree,
        exec: Arc<RelaxExecutable>,
        device: Device,
        builtins: Builtins,
    ) -> Result<VirtualMachine, VmError> {
        let _span = tracing::debug_span!("relax_vm_new", %device).entered();
        crate::exec::relax::checks::program(&exec)?;
        if let Some((index, scope)) = exec.memory_scopes.iter().find(|(_, s)| s != "global") {
            return Err(VmError::MemoryScope { what: format!("constant {index}"), scope: scope.clone() });
        }
        let mut callees = Vec::with_capacity(exec.functions.len());
        for (i, f) in exec.functions.iter().enumerate() {
            let callee = match f.kind {
                FuncKind::Vm => Callee::Vm(i),
                FuncKind::VmTir => return Err(VmError::VmTir { name: f.name.clone() }),
                FuncKind::Packed => resolve(tree, &builtins, &f.name)?,
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
            builtins,
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
                Callee::Builtin("vm.builtin.check_tensor_info", _) => Some(ParamKind::Tensor),
                Callee::Builtin("vm.builtin.check_shape_info", _) => Some(ParamKind::Shape),
                Callee::Builtin("vm.builtin.check_func_info", _) => Some(ParamKind::Func),
                Callee::Builtin("vm.builtin.check_string_info", _) => Some(ParamKind::Str),
                Callee::Builtin("vm.builtin.check_tuple_info", _) => {
                    Some(ParamKind::Tuple(imm(1).and_then(|v| usize::try_from(v).ok()).unwrap_or(0)))
                }
                Callee::Builtin("vm.builtin.check_prim_value_info", _) => Some(ParamKind::Prim(match args.get(1) {
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

    fn call_vm(&self, index: usize, args: Vec<Value>, depth: usize) -> Result<Value, VmError> {
        let exec = self.executable();
        let f = &exec.functions[index];
        if depth >= MAX_CALL_DEPTH {
            return Err(VmError::CallDepth { function: f.name.clone(), max: MAX_CALL_DEPTH });
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
                return Err(VmError::RanPast { function: f.name.clone() });
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
                            return Err(VmError::Condition {
                                function: f.name.clone(),
                                pc,
                                register: cond.to_string(),
                                got: v.kind(),
                            })
                        }
                    };
                    pc += if c != 0 { 1 } else { *false_offset };
                }
            }
        }
    }

    /// Calls entry `func` of the function table.
    fn call(&self, func: usize, args: &[&Value], depth: usize) -> Result<Value, VmError> {
        self.dispatch(&self.callees[func], &self.executable().functions[func].name, args, depth)
    }

    /// Calls `callee` (named `name`) with `args`: the one dispatch of function-table calls and
    /// of [`VirtualMachine::invoke`].
    fn dispatch(&self, callee: &Callee, name: &str, args: &[&Value], depth: usize) -> Result<Value, VmError> {
        match callee {
            Callee::Vm(i) => self.call_vm(*i, args.iter().map(|v| (*v).clone()).collect(), depth + 1),
            Callee::Builtin(_, f) => f(self, name, args, depth),
            // A kernel's return value is the call's result: a destination-passing kernel
            // returns nothing (null), a host function such as `compute_symbolic_expr` (a
            // symbolic expression Relax computes for `R.prim_value(n * m + 1)`) returns its value.
            Callee::Kernel(f) => call_kernel(name, f, args),
            Callee::Run(f) => f(name, args),
            Callee::Refused(reason) => Err(VmError::UnknownBuiltin { name: name.to_owned(), reason }),
        }
    }

    /// The library function that the function value `func` (an index into the function
    /// table, `Value::Func`) resolves to, when it is one of the library's kernels.
    #[cfg(feature = "llm")]
    pub(crate) fn kernel_of(&self, func: u32) -> Option<(&str, crate::ffi::call::PackedFunction)> {
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

    /// Calls a function by name as [`VirtualMachine::invoke`] does, with register values as
    /// they are: tensors are passed wherever they are (the caller puts them on the VM's
    /// device) and the result comes back as the program left it, tensors uncopied on the
    /// device. For callers inside the crate that keep values on the device between calls (the
    /// LLM floor's generation).
    #[cfg(feature = "llm")]
    pub(crate) fn call_vm_values(&self, name: &str, args: &[&Value]) -> Result<Value, VmError> {
        let _span = tracing::trace_span!("relax_vm_call_values", function = name, args = args.len()).entered();
        self.dispatch(&self.callee_by_name(name)?, name, args, 0)
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

    /// TVM's type key of `v`, in the spelling of the executable's TVM.
    fn key(&self, v: &Value) -> &'static str {
        v.type_key(self.executable().layout == Layout::Ffi)
    }
}

/// Whether mblob itself serves a packed function of this name, as the VM's name resolution
/// finds it when no module of the tree has it: a builtin of the VM (with the `llm` feature,
/// the LLM builtins too), a `relax.run.*` function or a global function
/// ([`crate::ffi::globals`]). Used by [`super::unsupported_calls`].
pub fn is_served(name: &str) -> bool {
    Builtins::default().contains(name) || provided(name).is_some()
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

/// [`VmError::NoExecutable`] naming `tree`'s modules.
fn no_executable(tree: &LoadedTree) -> VmError {
    VmError::NoExecutable { modules: tree.type_keys().into_iter().map(str::to_owned).collect() }
}

/// Resolves a packed function by name: a builtin of `builtins`, else a function of the tree
/// (from the root, through the imports), called in the convention of the module that has it,
/// else one mblob provides; a `vm.builtin.*` of none of these is refused when called.
fn resolve(tree: &LoadedTree, builtins: &Builtins, name: &str) -> Result<Callee, VmError> {
    if let Some((n, f)) = builtins.get(name) {
        return Ok(Callee::Builtin(n, f));
    }
    match tree.packed_function(name) {
        Some(f) => Ok(Callee::Kernel(f)),
        None => match provided(name) {
            Some(c) => Ok(c),
            None if name.starts_with("vm.builtin.") => Ok(Callee::Refused(builtins::refusal(name))),
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
