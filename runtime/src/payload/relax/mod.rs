//! The Relax VM executable as a payload: TVM's `relax.Executable` (0.19) and
//! `relax.VMExecutable` (0.20 and later), read and written ([`executable`]), with the constant
//! tags of each TVM version ([`v019`], [`v021`]). The interpreter is
//! [`crate::exec::relax`].

mod const_kind;
pub mod executable;
pub mod v019;
pub mod v021;

use std::any::Any;
use std::io::{self, Write};

pub use executable::{
    Arg, Constant, FuncInfo, FuncKind, Instruction, Reg, RelaxExecutable, RELAX_EXECUTABLE, RELAX_VM_EXECUTABLE,
};

use super::Payload;
use crate::format::stream;
use crate::format::Layout;

impl Payload for RelaxExecutable {
    fn type_key(&self) -> &str {
        &self.type_key
    }

    /// Writes the executable with the constant tags of the TVM version that writes `layout`
    /// (wrapped in a string for the classic layouts).
    fn write_payload(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        if layout.frames_payloads() {
            return self.write_executable(layout, out);
        }
        let mut code = Vec::new();
        self.write_executable(layout, &mut code)?;
        stream::write_str(out, &code)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
