//! CUDA on a GPU (feature `cuda`), through the driver API with cudarc: the device API
//! ([`api`]), images checked before the driver sees them and CUDA source compiled with NVRTC
//! ([`image`], [`nvrtc`]), and `cuda` payloads as modules whose kernels host code launches
//! ([`module`]). These are the only files of the crate that call the CUDA driver.

pub mod api;
pub mod image;
pub mod module;
pub mod nvrtc;

pub use api::CudaApi;
pub use module::CudaModule;
