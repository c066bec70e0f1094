//! OpenCL device 0 for the tests that run on it, or a skip: without one the test prints
//! `skipped: no OpenCL device (...)` and passes, unless `MBLOB_REQUIRE_OPENCL` is set (as CI
//! sets it where pocl is installed), which turns the skip into a failure.

#![allow(dead_code)]

use std::sync::Arc;

use mblob_runtime::device::{device_api, DeviceApi};
use mblob_runtime::Device;

/// OpenCL device 0's API, or `None` (after saying so) when there is none.
pub fn opencl_api() -> Option<Arc<dyn DeviceApi>> {
    match device_api(Device::opencl(0)) {
        Ok(api) => Some(api),
        Err(e) => {
            if std::env::var_os("MBLOB_REQUIRE_OPENCL").is_some() {
                panic!("MBLOB_REQUIRE_OPENCL is set but no OpenCL device opens: {e}");
            }
            eprintln!("skipped: no OpenCL device ({e})");
            None
        }
    }
}
