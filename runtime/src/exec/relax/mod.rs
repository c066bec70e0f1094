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
//! use mblob_runtime::device::Device;
//! use mblob_runtime::exec::relax::VirtualMachine;
//! use mblob_runtime::payload::graph::Tensor;
//! use mblob_runtime::format::stream::DataType;
//! use mblob_runtime::{load_library, LoadOptions, Registry};
//!
//! // SAFETY: the library is trusted to run (its initialisers run when it is opened).
//! let tree = unsafe { load_library("model.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut vm = VirtualMachine::new(&tree, Device::cpu(0))?;
//! let x = Tensor::new(DataType::F32, vec![2, 64], vec![0u8; 2 * 64 * 4]).unwrap();
//! let outputs = vm.invoke("main", &[x])?;
//! println!("{:?}", outputs[0].shape);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! On a device (`VirtualMachine::new(&tree, Device::opencl(0))`, for a library TVM compiled
//! for OpenCL) the VM works as TVM's does with `VirtualMachine(mod, tvm.opencl(0))`: its device
//! list is the device and the host CPU, constant tensors are uploaded once when it is created,
//! storage is allocated where the program says, and `invoke` copies the inputs to the device
//! and the outputs back. [`VirtualMachine::invoke_arrays`] takes and gives
//! [`NdArray`](crate::array::NdArray)s instead, copying only inputs that are elsewhere.

pub mod calls;
pub(crate) mod checks;
pub mod vm;

pub use crate::payload::relax::{
    executable, v019, v021, Arg, Constant, FuncInfo, FuncKind, Instruction, Reg, RelaxExecutable, RELAX_EXECUTABLE,
    RELAX_VM_EXECUTABLE,
};
pub use calls::{unprovided_runtime_imports, unsupported_calls};
pub use vm::{
    numpy_dtype, Builtins, ObjectRef, ParamKind, VirtualMachine, VmError, VmObject, VmOutput, VmValue, REFUSED_BUILTINS,
};
