//! The types the parts of the VM share, in one leaf file that names none of them: the machine
//! itself ([`VirtualMachine`]: what [`VirtualMachine::new`](super::VirtualMachine::new) builds and
//! the interpreter reads), what a function-table entry resolves to ([`Callee`]), the signature
//! of a builtin ([`BuiltinFn`]) and the sets of them ([`Builtins`]), and the decoded
//! instructions ([`Op`], [`Quick`]). The code over them lives beside: building and
//! interpreting in `mod.rs`, the builtins' tables in `builtins/`, decoding in `decode.rs`.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::run::RunFn;
use super::value::{Value, VmError};
use crate::device::api::DeviceApi;
use crate::device::Device;
use crate::exec::pool::StoragePool;
use crate::ffi::call::PackedFunction;
use crate::format::DataType;
use crate::module::LoadedTree;
use crate::payload::relax::executable::RelaxExecutable;

/// The Relax virtual machine over a loaded tree.
#[derive(Debug)]
pub struct VirtualMachine {
    /// Keeps the library (and every module the kernels may reach) loaded.
    pub(super) _tree: LoadedTree,
    pub(super) exec: Arc<RelaxExecutable>,
    pub(super) callees: Vec<Callee>,
    pub(super) constants: Vec<Value>,
    /// Per instruction, the values of its immediate, special-register and function arguments.
    pub(super) immediates: Vec<Box<[Value]>>,
    /// Per instruction, what it was decoded to.
    pub(super) ops: Vec<Op>,
    /// TVM's device list: the device the VM runs on, then the host CPU when that is another
    /// device. The last one is the host.
    pub(super) devices: Vec<Device>,
    /// The device API of each device.
    pub(super) apis: Vec<Arc<dyn DeviceApi>>,
    pub(super) pool: StoragePool,
    /// The builtins names resolve to.
    pub(super) builtins: Builtins,
}

/// What an entry of the function table resolves to.
#[derive(Debug, Clone)]
pub(super) enum Callee {
    Vm(usize),
    /// A builtin of the VM's set: its name and function.
    Builtin(&'static str, BuiltinFn),
    Kernel(PackedFunction),
    /// A `relax.run.*` function mblob provides ([`super::run`]).
    Run(RunFn),
    /// A `vm.builtin.*` mblob does not implement: an error when called.
    Refused(&'static str),
}

/// A builtin: the VM, the name it was called by, its arguments and the call depth (for the
/// builtins that call functions back).
pub(crate) type BuiltinFn = fn(&VirtualMachine, &str, &[&Value], usize) -> Result<Value, VmError>;

/// A group's builtins: TVM's names and their functions.
pub(crate) type Table = &'static [(&'static str, BuiltinFn)];

/// The builtins a VM resolves the names of its function table with (before the library's
/// functions): tables of names and functions, looked up in order.
#[derive(Clone)]
pub(crate) struct Builtins {
    pub(super) tables: Vec<Table>,
}

/// A call instruction decoded once, when the VM is made: the commonest calls as specialised
/// operations, their constant arguments read beforehand. Each one that finds its quick
/// conditions unmet at run time (a register of another kind, a tensor that fails a check, a
/// tensor that does not fit) runs the general call instead, which gives the same result or
/// the same error, so decoding changes no behaviour.
#[derive(Debug)]
pub(super) enum Op {
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

/// What [`VirtualMachine::quick`] did.
pub(super) enum Quick {
    /// The call's result, for its destination register.
    Value(Value),
    /// The quick conditions do not hold: run the general call.
    General,
}
