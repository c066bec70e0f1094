//! Devices: where a tensor lives and where kernels run, named as TVM names them
//! (`tvm.cpu(0)`, `tvm.cuda(1)`, `tvm.opencl(0)`), the errors of using one, and each kind's
//! memory and kernels.
//!
//! [`Device`] is the one device type of the crate: the executors, [`crate::array::NdArray`],
//! the device APIs and the callers (CLI, Python) all take it. It converts to and from DLPack's
//! `(device_type, device_id)` pair.
//!
//! - [`api`]: the [`DeviceApi`] trait (TVM's `DeviceAPI`) and the backend table keyed by device
//!   type; [`backends`]: the built-in backends and [`device_api`], the way to a device's API.
//! - [`storage`]: [`Storage`], an owned allocation on a device.
//! - [`cpu`]: the CPU's memory and the per-thread workspace allocator kernels use.
//! - `kernel` (features `opencl`, `cuda`): one plan of a kernel's arguments from its
//!   `FunctionInfo`, shared by the GPU backends.
//! - `opencl` (feature `opencl`): OpenCL memory and modules (programs built per device,
//!   kernels launched with TVM's launch parameters), through opencl3.
//! - [`program_cache`]: the bytes of TVM's OpenCL program cache
//!   (`opencl.GetPreCompiledPrograms` / `opencl.SetPreCompiledPrograms`), read and written
//!   without OpenCL.
//! - `cuda` (feature `cuda`): CUDA memory and modules through the driver API, and NVRTC for
//!   TVM's CUDA source.

pub mod api;
pub mod backends;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", feature = "opencl"))]
pub mod kernel;
#[cfg(feature = "opencl")]
pub mod opencl;
pub mod program_cache;
pub mod storage;

pub use api::{DeviceApi, DevicePtr, TransferStats};
pub use backends::device_api;
pub use cpu::CPU_ALIGNMENT;
pub use storage::{HostFileMapping, Storage};

use std::fmt;
use std::str::FromStr;

/// A DLPack device type (`DLDeviceType`), with TVM's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// `kDLCPU` (1).
    Cpu,
    /// `kDLCUDA` (2).
    Cuda,
    /// `kDLCUDAHost` (3): pinned host memory.
    CudaHost,
    /// `kDLOpenCL` (4).
    OpenCl,
    /// `kDLVulkan` (7).
    Vulkan,
    /// `kDLMetal` (8).
    Metal,
    /// `kDLROCM` (10).
    Rocm,
    /// `kDLExtDev` (12).
    ExtDev,
    /// `kDLHexagon` (16).
    Hexagon,
    /// `kDLWebGPU` (15).
    WebGpu,
    /// Any other code.
    Other(i32),
}

impl DeviceType {
    /// The DLPack code.
    pub fn code(self) -> i32 {
        match self {
            DeviceType::Cpu => 1,
            DeviceType::Cuda => 2,
            DeviceType::CudaHost => 3,
            DeviceType::OpenCl => 4,
            DeviceType::Vulkan => 7,
            DeviceType::Metal => 8,
            DeviceType::Rocm => 10,
            DeviceType::ExtDev => 12,
            DeviceType::WebGpu => 15,
            DeviceType::Hexagon => 16,
            DeviceType::Other(c) => c,
        }
    }

    /// The type of DLPack code `code`.
    pub(crate) fn from_code(code: i32) -> DeviceType {
        match code {
            1 => DeviceType::Cpu,
            2 => DeviceType::Cuda,
            3 => DeviceType::CudaHost,
            4 => DeviceType::OpenCl,
            7 => DeviceType::Vulkan,
            8 => DeviceType::Metal,
            10 => DeviceType::Rocm,
            12 => DeviceType::ExtDev,
            15 => DeviceType::WebGpu,
            16 => DeviceType::Hexagon,
            c => DeviceType::Other(c),
        }
    }

    /// TVM's name (`tvm.runtime.Device.DEVICE_TYPE_TO_NAME`): `cpu`, `cuda`, `opencl`, ...
    pub fn name(self) -> String {
        match self {
            DeviceType::Cpu => "cpu".into(),
            DeviceType::Cuda => "cuda".into(),
            DeviceType::CudaHost => "cuda_host".into(),
            DeviceType::OpenCl => "opencl".into(),
            DeviceType::Vulkan => "vulkan".into(),
            DeviceType::Metal => "metal".into(),
            DeviceType::Rocm => "rocm".into(),
            DeviceType::ExtDev => "ext_dev".into(),
            DeviceType::WebGpu => "webgpu".into(),
            DeviceType::Hexagon => "hexagon".into(),
            DeviceType::Other(c) => format!("device type {c}"),
        }
    }

    /// The device type of a device module's type key (`cuda`, `opencl`, `vulkan`, `metal`,
    /// `webgpu`, `rocm`/`hip`, `hexagon`), or `None` for host kinds.
    pub(crate) fn of_module_key(type_key: &str) -> Option<DeviceType> {
        Some(match type_key {
            "cuda" => DeviceType::Cuda,
            "opencl" | "opencl_xml" | "sdaccel" | "aocl" => DeviceType::OpenCl,
            "vulkan" => DeviceType::Vulkan,
            "metal" => DeviceType::Metal,
            "webgpu" => DeviceType::WebGpu,
            "rocm" | "hip" => DeviceType::Rocm,
            "hexagon" => DeviceType::Hexagon,
            _ => return None,
        })
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A device: a type and an ordinal, as `tvm.cuda(1)` names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// The kind of device.
    pub device_type: DeviceType,
    /// The ordinal among devices of that kind.
    pub device_id: i32,
}

impl Device {
    /// `tvm.cpu(id)`.
    pub fn cpu(id: i32) -> Device {
        Device { device_type: DeviceType::Cpu, device_id: id }
    }

    /// `tvm.cuda(id)`.
    pub fn cuda(id: i32) -> Device {
        Device { device_type: DeviceType::Cuda, device_id: id }
    }

    /// `tvm.opencl(id)`.
    pub fn opencl(id: i32) -> Device {
        Device { device_type: DeviceType::OpenCl, device_id: id }
    }

    /// The device of a DLPack `(device_type, device_id)` pair.
    pub fn from_dlpack(device_type: i32, device_id: i32) -> Device {
        Device { device_type: DeviceType::from_code(device_type), device_id }
    }

    /// The DLPack `(device_type, device_id)` pair.
    pub fn to_dlpack(self) -> (i32, i32) {
        (self.device_type.code(), self.device_id)
    }

    /// Whether this is host memory the CPU reads directly.
    pub fn is_cpu(self) -> bool {
        self.device_type == DeviceType::Cpu
    }
}

impl Default for Device {
    fn default() -> Device {
        Device::cpu(0)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device_type, self.device_id)
    }
}

/// A device name that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a device: expected cpu, cuda or opencl, optionally with `:N` (e.g. `cuda:1`)")]
pub struct ParseDeviceError(pub String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    /// `cpu`, `cuda`, `gpu` (CUDA, as TVM's alias), `opencl`, `cl`, `vulkan`, `metal`,
    /// `rocm`, `webgpu`, each with an optional `:N` (default 0).
    fn from_str(s: &str) -> Result<Device, ParseDeviceError> {
        let bad = || ParseDeviceError(s.to_owned());
        let (kind, id) = match s.split_once(':') {
            Some((k, n)) => (k, n.trim().parse::<i32>().ok().filter(|n| *n >= 0).ok_or_else(bad)?),
            None => (s, 0),
        };
        let device_type = match kind.trim().to_ascii_lowercase().as_str() {
            "cpu" | "llvm" => DeviceType::Cpu,
            "cuda" | "gpu" | "nvptx" => DeviceType::Cuda,
            "opencl" | "cl" => DeviceType::OpenCl,
            "vulkan" => DeviceType::Vulkan,
            "metal" => DeviceType::Metal,
            "rocm" => DeviceType::Rocm,
            "webgpu" => DeviceType::WebGpu,
            _ => return Err(bad()),
        };
        Ok(Device { device_type, device_id: id })
    }
}

/// What went wrong on a device. Every variant names the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The driver library of the device kind cannot be opened, or has no platform.
    #[error("{device}: no driver: {detail}")]
    NoDriver {
        /// The device asked for.
        device: Device,
        /// What was tried.
        detail: String,
    },
    /// The driver is there but has no device of that ordinal.
    #[error("{device}: no such device ({available} {} device(s) found)", device.device_type)]
    NoDevice {
        /// The device asked for.
        device: Device,
        /// How many devices of that kind there are.
        available: usize,
    },
    /// mblob cannot run on this kind of device (or was built without its feature).
    #[error("{what} is not supported on {device}")]
    Unsupported {
        /// The device.
        device: Device,
        /// What was asked for.
        what: String,
    },
    /// An allocation the device refused.
    #[error("{device}: out of memory: cannot allocate {bytes} bytes")]
    OutOfMemory {
        /// The device.
        device: Device,
        /// The size asked for.
        bytes: u64,
    },
    /// A driver call failed.
    #[error("{device}: {call} failed: {detail}")]
    Driver {
        /// The device.
        device: Device,
        /// The operation.
        call: String,
        /// The driver's error.
        detail: String,
    },
    /// A device program that does not compile, with the compiler's log.
    #[error("{device}: the device code of module `{module}` does not build:\n{log}")]
    Build {
        /// The device.
        device: Device,
        /// The module's type key.
        module: String,
        /// The build log.
        log: String,
    },
    /// An OpenCL program cache that cannot be used (`opencl.SetPreCompiledPrograms`).
    #[error("{device}: {error}")]
    ProgramCache {
        /// The device.
        device: Device,
        /// What is wrong with it.
        error: program_cache::ProgramCacheError,
    },
    /// A copy or view outside an allocation.
    #[error("{device}: {what}: bytes {offset}..{end} are outside an allocation of {size} bytes")]
    OutOfBounds {
        /// The device.
        device: Device,
        /// What was attempted.
        what: &'static str,
        /// First byte.
        offset: u64,
        /// One past the last byte.
        end: u64,
        /// The allocation's size.
        size: u64,
    },
    /// A write into a tensor that is a view of the library's read-only bytes (a constant held
    /// in place instead of copied).
    #[error("{device}: {what}: the tensor is a constant held in the library's read-only memory")]
    ReadOnly {
        /// The device.
        device: Device,
        /// What was attempted.
        what: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tvm_names_and_refuses_others() {
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::cuda(1));
        assert_eq!("opencl".parse::<Device>().unwrap(), Device::opencl(0));
        assert_eq!("CPU:3".parse::<Device>().unwrap(), Device::cpu(3));
        assert_eq!("gpu".parse::<Device>().unwrap(), Device::cuda(0));
        for bad in ["", "tpu", "cuda:", "cuda:-1", "cuda:x"] {
            assert!(bad.parse::<Device>().is_err(), "{bad}");
        }
        assert_eq!(Device::opencl(2).to_string(), "opencl:2");
        assert_eq!(Device::from_dlpack(4, 1), Device::opencl(1));
        assert_eq!(DeviceType::from_code(99).code(), 99);
        for code in [1, 2, 3, 4, 7, 8, 10, 12, 15, 16] {
            assert_eq!(DeviceType::from_code(code).code(), code);
        }
    }
}
