//! Executors: programs that run a loaded module tree.
//!
//! - [`relax`]: TVM's Relax virtual machine (`relax.Executable` / `relax.VMExecutable`).

pub mod relax;
