//! Device modules (CUDA, OpenCL, Vulkan-source, Metal, WebGPU): placeholder until the device
//! payload kinds land.

use crate::registry::Registry;

/// Registers the device kinds' loaders.
pub fn register_loaders(_registry: &mut Registry) {}
