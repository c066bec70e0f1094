//! Models TVM compiled for OpenCL and CUDA (`tests/fixtures/device-run`, see its README), run
//! on their device by `exec::Model` and compared with TVM's outputs of the same model built
//! for the CPU: every output within `rtol * max(1, max|ref|)`.
//!
//! OpenCL runs here without a GPU: pocl (`ci/setup.sh` installs it) is a real OpenCL driver
//! on the CPU. These tests fail, rather than pass, when no OpenCL device can be opened. The
//! CUDA tests need an NVIDIA GPU and are ignored without one (`cargo test -- --ignored` runs
//! them where there is one).
#![cfg(feature = "opencl")]

#[path = "support/device_run.rs"]
mod device_run;

use device_run::{fixture_names, fixtures, load, opencl, run_fixture};
use mblob_runtime::device::device_api;
use mblob_runtime::exec::{Device, ExecError, Model};
use mblob_runtime::DeviceError;

#[test]
fn opencl_graph_models_give_tvms_outputs() {
    let dev = opencl();
    let names: Vec<String> = fixture_names("opencl").into_iter().filter(|n| n.starts_with("dev_graph_")).collect();
    assert!(names.len() >= 2, "{names:?}");
    for name in names {
        run_fixture(&name, dev);
    }
}

#[test]
fn opencl_relax_models_give_tvms_outputs() {
    let dev = opencl();
    let names: Vec<String> = fixture_names("opencl").into_iter().filter(|n| n.starts_with("dev_relax_")).collect();
    assert!(names.len() >= 3, "{names:?}");
    for name in names {
        run_fixture(&name, dev);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (sm_80 or newer) with its driver, and NVRTC"]
fn cuda_models_give_tvms_outputs() {
    for name in fixture_names("cuda") {
        run_fixture(&name, Device::cuda(0));
    }
}

/// A model built for OpenCL asked to run on CUDA or the CPU, a CPU model asked to run on
/// OpenCL, a missing device: typed errors naming the device, no panic.
#[test]
fn wrong_or_missing_devices_are_typed_errors() {
    let tree = load(&fixtures().join("dev_relax_mlp_opencl.so"));
    for dev in [Device::cuda(0), Device::cpu(0)] {
        let err = Model::new(&tree, dev).unwrap_err();
        assert!(matches!(err, ExecError::UnsupportedDevice { device, .. } if device == dev), "{err}");
        assert!(err.to_string().contains(&format!("not supported on {dev}")), "{err}");
        assert!(err.to_string().contains("built for opencl"), "{err}");
    }
    let graph = load(&fixtures().join("dev_graph_cnn_opencl.so"));
    let err = Model::new(&graph, Device::cuda(0)).unwrap_err();
    assert!(err.to_string().contains("built for opencl"), "{err}");
    match device_api(Device::opencl(99)) {
        Err(DeviceError::NoDevice { device, .. }) => assert_eq!(device, Device::opencl(99)),
        Err(DeviceError::NoDriver { .. }) => {}
        other => panic!("opencl:99: {other:?}"),
    }
    if device_api(Device::opencl(0)).is_ok() {
        let err = Model::new(&graph, Device::opencl(99)).unwrap_err();
        assert!(err.to_string().contains("opencl:99"), "{err}");
    }
}
