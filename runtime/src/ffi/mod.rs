//! The FFI edge with TVM-compiled code: calling conventions ([`callconv`]), the context
//! functions compiled code calls back ([`context`]), the thread pool ([`threadpool`]), memory
//! kernels see ([`workspace`]) and the shim that provides runtime functions a library imports
//! by name (`shim`).

pub mod callconv;
pub mod context;
#[cfg(feature = "cuda")]
pub mod cuda_packed;
pub(crate) mod shim;
pub mod threadpool;
pub mod workspace;

pub use callconv::{Abi, PackedFunction, Value};
