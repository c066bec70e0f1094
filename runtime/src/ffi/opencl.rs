//! OpenCL device memory ([`OpenClApi`]) and OpenCL device modules ([`OpenClModule`]) through
//! opencl3, which opens the OpenCL ICD loader at run time (feature `opencl`).
#![allow(unsafe_code)]

use std::any::Any;
use std::sync::Arc;

use super::device_api::DeviceApi;
use crate::device::{Device, DeviceError};
use crate::module::Module;
use crate::payload::device::DeviceModule;
use crate::payload::Payload;

/// The OpenCL device API (TODO: being written).
#[derive(Debug)]
pub struct OpenClApi;

impl OpenClApi {
    /// Opens `device`.
    pub fn open(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
        Err(DeviceError::Unsupported { device, what: "running".into() })
    }
}

/// An OpenCL module.
#[derive(Debug)]
pub struct OpenClModule {
    device: DeviceModule,
}

impl OpenClModule {
    /// A module for an `opencl` payload; nothing is built until first use.
    pub fn new(device: DeviceModule) -> OpenClModule {
        OpenClModule { device }
    }
}

impl Module for OpenClModule {
    fn type_key(&self) -> &str {
        &self.device.type_key
    }
    fn as_payload(&self) -> Option<&dyn Payload> {
        Some(&self.device)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
