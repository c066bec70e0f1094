//! TVM's Relax virtual machine: the executable ([`executable`]), its loader, and the
//! interpreter ([`vm`]).
//!
//! Since TVM 0.21 every model TVM builds is a Relax model: `tvm.compile` / `relax.build`
//! gives a VM executable (`relax.Executable` in 0.19, `relax.VMExecutable` from 0.20) that
//! imports the host library. The [`Registry`](crate::Registry::default)'s default loaders turn those
//! payloads into a [`RelaxExecutable`], and a [`VirtualMachine`] runs its functions with the
//! library's kernels:
//!
//! ```no_run
//! use mblob_runtime::exec::relax::VirtualMachine;
//! use mblob_runtime::payload::graph::Tensor;
//! use mblob_runtime::format::stream::DataType;
//! use mblob_runtime::{load_library, LoadOptions, Registry};
//!
//! // SAFETY: the library is trusted to run (its initialisers run when it is opened).
//! let tree = unsafe { load_library("model.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut vm = VirtualMachine::new(&tree, mblob_runtime::packed::DLDevice { device_type: 1, device_id: 0 })?;
//! let x = Tensor::new(DataType::F32, vec![2, 64], vec![0u8; 2 * 64 * 4]).unwrap();
//! let outputs = vm.invoke("main", &[x])?;
//! println!("{:?}", outputs[0].shape);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod executable;
mod ffi;
pub mod v019;
pub mod v021;
pub mod vm;

use std::any::Any;
use std::io::{self, Write};
use std::sync::Arc;

pub use executable::{
    Arg, Constant, Dialect, FuncInfo, FuncKind, Instruction, Reg, RelaxExecutable, RELAX_EXECUTABLE,
    RELAX_VM_EXECUTABLE,
};
pub use vm::{VirtualMachine, VmError};

use crate::error::FormatError;
use crate::format::stream;
use crate::format::Layout;
use crate::module::Module;
use crate::payload::Payload;
use crate::registry::{Loader, LoaderError, Measure, Registry};
use crate::Bytes;

impl Payload for RelaxExecutable {
    fn type_key(&self) -> &str {
        &self.type_key
    }

    /// Writes the executable with the constant tags of the TVM version that writes `layout`
    /// (wrapped in a string for the classic layouts).
    fn write_payload(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        let dialect = Dialect::of_layout(layout);
        if layout.frames_payloads() {
            return self.write_executable(dialect, out);
        }
        let mut code = Vec::new();
        self.write_executable(dialect, &mut code)?;
        stream::write_str(out, &code)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

crate::payload_module!(RelaxExecutable);

/// The loader of one of the executable's type keys.
#[derive(Debug, Clone, Copy)]
pub struct RelaxLoader(pub &'static str);

impl Loader for RelaxLoader {
    fn type_key(&self) -> &str {
        self.0
    }

    fn measure(&self, bytes: &[u8], base: u64, _layout: Layout) -> Result<Measure, FormatError> {
        RelaxExecutable::measure_classic(bytes, base).map(Measure::Len)
    }

    fn load(&self, payload: Bytes, layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(RelaxExecutable::read_payload(&payload, layout, self.0)?))
    }
}

/// Registers the loaders of `relax.Executable` and `relax.VMExecutable` (part of
/// [`Registry::default`]).
pub fn register_loaders(r: &mut Registry) {
    r.register(RelaxLoader(RELAX_EXECUTABLE));
    r.register(RelaxLoader(RELAX_VM_EXECUTABLE));
}
