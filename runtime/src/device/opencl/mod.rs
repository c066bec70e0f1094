//! OpenCL (feature `opencl`): the device API ([`api`]), programs built per device
//! ([`program`]) and device modules whose kernels host code launches ([`module`]).

pub mod api;
pub mod module;
pub mod program;

pub use api::OpenClApi;
pub use module::OpenClModule;
