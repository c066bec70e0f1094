//! TVM's Relax virtual machine: the interpreter of the executables that
//! [`crate::payload::relax`] reads.
//!
//! What a user calls here:
//! - [`VirtualMachine`]: [`VirtualMachine::new`] over a loaded tree (or
//!   [`VirtualMachine::with_executable`] for an executable read or built on its own), then
//!   [`VirtualMachine::invoke`] with [`exec::Value`](crate::exec::Value)s;
//!   [`VirtualMachine::functions`] lists what can be invoked ([`FunctionSignature`], with a
//!   [`ParamKind`] per parameter), [`VirtualMachine::devices`] is TVM's device list and
//!   [`VirtualMachine::constant_tensor`] a constant as the VM holds it.
//! - [`VmError`], the one error of the VM ([`VmError::root`] through the call frames).
//! - [`ObjectRef`]: a runtime object (a KV cache, a Relay ADT) that a function returns and
//!   takes back.
//! - What mblob cannot serve, read without running: [`unsupported_calls`] (the packed calls of
//!   an executable that neither the VM nor the library has), [`unprovided_runtime_imports`]
//!   and [`is_served`].
//! - The executable's types, from [`crate::payload::relax`]: [`RelaxExecutable`],
//!   [`Instruction`], [`Arg`], [`Reg`], [`Constant`], [`FuncInfo`], [`FuncKind`] and the type
//!   keys [`RELAX_EXECUTABLE`] and [`RELAX_VM_EXECUTABLE`].
//!
//! The interpreter follows TVM's `VirtualMachineImpl`: each call of a VM function gets a frame
//! of `register_file_size` registers with the arguments in the first ones; function names are
//! resolved when the VM is made, as TVM's `InitFuncPool` does (a name that is neither a builtin
//! nor a function of the tree is an error then); a `vm.builtin.*` mblob does not implement is
//! refused only when a function calls it ([`VmError::UnknownBuiltin`], with the reason), and
//! argument checks fail with TVM's error kind and message.
//!
//! Since TVM 0.21 every model TVM builds is a Relax model: `tvm.compile` / `relax.build`
//! gives a VM executable (`relax.Executable` in 0.19, `relax.VMExecutable` from 0.20) that
//! imports the host library. The [`Registry`](crate::registry::Registry::default)'s default
//! loaders turn those payloads into a [`RelaxExecutable`], and a [`VirtualMachine`] runs its
//! functions with the library's kernels:
//!
//! ```no_run
//! use mblob_runtime::array::NdArray;
//! use mblob_runtime::device::Device;
//! use mblob_runtime::exec::relax::VirtualMachine;
//! use mblob_runtime::exec::Value;
//! use mblob_runtime::{load_library, LoadOptions, Registry};
//!
//! // SAFETY: the library is trusted to run (its initialisers run when it is opened).
//! let tree = unsafe { load_library("model.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let vm = VirtualMachine::new(&tree, Device::cpu(0))?;
//! let x = NdArray::from_f32(&[0.0; 2 * 64], &[2, 64], Device::cpu(0))?;
//! let out = vm.invoke("main", &[Value::Tensor(x)])?;
//! println!("{:?}", out.as_tensor().map(|t| t.shape()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! On a device (`VirtualMachine::new(&tree, Device::opencl(0))`, for a library TVM compiled
//! for OpenCL) the VM works as TVM's does with `VirtualMachine(mod, tvm.opencl(0))`: its device
//! list is the device and the host CPU, constant tensors are uploaded once when it is created,
//! storage is allocated where the program says, and `invoke` copies to the device only the
//! input tensors that are elsewhere; outputs stay on the device until the caller copies them
//! ([`NdArray::to_tensor`](crate::array::NdArray::to_tensor), [`NdArray::copy`](crate::array::NdArray::copy)).

mod calls;
pub(crate) mod checks;
pub(crate) mod vm;

pub use crate::payload::relax::{
    Arg, Constant, FuncInfo, FuncKind, Instruction, Reg, RelaxExecutable, RELAX_EXECUTABLE, RELAX_VM_EXECUTABLE,
};
pub use calls::{unprovided_runtime_imports, unsupported_calls};
pub use vm::{is_served, FunctionSignature, ObjectRef, ParamKind, VirtualMachine, VmError};
