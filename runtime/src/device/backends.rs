//! The built-in backends and [`device_api`], the way to a device's API: it registers the CPU,
//! OpenCL (feature `opencl`) and CUDA (feature `cuda`) in the backend table of
//! [`super::api`] once, then opens the device there. This is the one file of `device/` that
//! knows every backend; the table itself knows none.

use std::sync::{Arc, Once};

use crate::device::api::{self, DeviceApi};
use crate::device::{Device, DeviceError, DeviceType};

/// Registers the built-in backends (once).
fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        api::register_backend(DeviceType::Cpu, crate::device::cpu::open);
        #[cfg(feature = "opencl")]
        api::register_backend(DeviceType::OpenCl, crate::device::opencl::api::open);
        #[cfg(feature = "cuda")]
        api::register_backend(DeviceType::Cuda, crate::device::cuda::api::open);
    });
}

/// The device API of `device`, created on first use (which opens the driver for that kind).
pub fn device_api(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
    install();
    api::opened(device)
}
