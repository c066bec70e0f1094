//! What kind of model a library holds ([`ModelKind`]) and the description of an input or
//! output ([`TensorInfo`]): a leaf of `exec`, named by the errors and the runners alike.

use crate::format::DataType;

/// What kind of model a library holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A `GraphExecutorFactory` (Relay's `relay.build`).
    Graph,
    /// An `AotExecutorFactory`.
    Aot,
    /// A Relax executable (`relax.build` / `tvm.compile`), run by the VM.
    Relax,
    /// A Relay VM executable (`VMExecutable`, `relay.vm.compile`), run by the Relay VM.
    RelayVm,
}

/// Name, shape and dtype of an input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name (outputs of a graph are named by position: `output_0`, ...).
    pub name: String,
    /// The shape.
    pub shape: Vec<i64>,
    /// The element type.
    pub dtype: DataType,
}
