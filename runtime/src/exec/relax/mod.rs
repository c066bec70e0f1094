//! TVM's Relax virtual machine: the interpreter ([`vm`]) of the executables that
//! [`crate::payload::relax`] reads.
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

pub mod calls;
pub(crate) mod checks;
pub mod vm;

pub use crate::payload::relax::{
    executable, v019, v021, Arg, Constant, FuncInfo, FuncKind, Instruction, Reg, RelaxExecutable, RELAX_EXECUTABLE,
    RELAX_VM_EXECUTABLE,
};
pub use calls::{unprovided_runtime_imports, unsupported_calls};
pub use vm::{numpy_dtype, Builtins, ObjectRef, ParamKind, VirtualMachine, VmError, VmObject, REFUSED_BUILTINS};
