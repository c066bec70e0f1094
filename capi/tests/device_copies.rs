//! Host<->device copies of one C-API graph run with device tensors on OpenCL (pocl), counted by
//! the device API: the input, already on the device, is not copied through the host; the
//! output goes to the host once, when the caller asks for it. Alone in its test binary: the
//! counters are the process's, and no other test may use the device meanwhile. Skipped with a
//! message when no OpenCL device opens, unless `MBLOB_REQUIRE_OPENCL` is set.
#![cfg(feature = "opencl")]

use std::ffi::CString;
use std::path::Path;
use std::ptr::{null, null_mut};

use mblob_capi::mblob_status::*;
use mblob_capi::*;
use mblob_runtime::device::device_api;
use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};

#[path = "support/common.rs"]
mod common;
use common::{last_error, npy, ok};

#[test]
fn a_graph_run_with_device_tensors_copies_only_the_output_out() {
    let dev = Device::opencl(0);
    let api = match device_api(dev) {
        Ok(api) => api,
        Err(e) if std::env::var_os("MBLOB_REQUIRE_OPENCL").is_none() => {
            eprintln!("SKIPPED: no OpenCL device ({e})");
            return;
        }
        Err(e) => panic!("no OpenCL device: {e}"),
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/device-run");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let name = "dev_graph_cnn_opencl";
    let spec = &manifest["models"][name];
    let x = npy(&dir.join(spec["inputs"][0]["file"].as_str().unwrap()));
    let want = npy(&dir.join(spec["outputs"][0]["file"].as_str().unwrap()));
    let rtol = spec["rtol"].as_f64().unwrap() as f32;
    // The caller's input, on the device already (as another OpenCL library would hand it).
    let input = NdArray::from_bytes(&x.data, &x.shape, DataType::F32, dev).unwrap();
    let mut dl = input.dl_tensor();
    // SAFETY: `mblob_dl_tensor` has `DLTensor`'s layout (the header says a `DLTensor *`
    // converts to it with a cast); `dl` outlives every use below.
    let t = unsafe { &*(&raw mut dl).cast::<mblob_dl_tensor>() };
    let path = CString::new(dir.join(spec["so"].as_str().unwrap()).to_str().unwrap()).unwrap();
    let (mut lib, mut m) = (null_mut(), null_mut());
    // SAFETY: valid strings, handles and out-pointers throughout; each handle freed once.
    unsafe {
        ok(mblob_library_load(path.as_ptr(), &mut lib), "load");
        ok(mblob_model_new(lib, 4, 0, &mut m), "model");
        for run in 0..2 {
            let before = api.transfers();
            ok(mblob_model_set_input_dltensor(m, c"x".as_ptr(), 0, t), "set_input_dltensor");
            ok(mblob_model_run(m), "run");
            let mut y = null_mut();
            ok(mblob_model_output_device(m, 0, &mut y), "output_device");
            let mut device = mblob_dl_device { device_type: 0, device_id: -1 };
            ok(mblob_tensor_device(y, &mut device), "device");
            assert_eq!(device.device_type, 4, "the output stays on the device");
            let on_device = api.transfers() - before;
            assert_eq!(
                (on_device.host_to_device, on_device.device_to_host),
                (0, 0),
                "run {run}: a device input and output do not pass through the host"
            );
            let mut host = null_mut();
            ok(mblob_tensor_to_host(y, &mut host), "to_host");
            let moved = api.transfers() - before;
            assert_eq!((moved.host_to_device, moved.device_to_host), (0, 1), "run {run}: the output out, once");
            assert_eq!(moved.device_to_host_bytes, want.data.len() as u64, "run {run}");
            let (mut data, mut nbytes) = (null(), 0usize);
            ok(mblob_tensor_data(host, &mut data), "data");
            ok(mblob_tensor_nbytes(host, &mut nbytes), "nbytes");
            let got = std::slice::from_raw_parts(data.cast::<f32>(), nbytes / 4);
            let want: Vec<f32> =
                want.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert_eq!(got.len(), want.len(), "run {run}");
            let scale = want.iter().fold(1f32, |a, w| a.max(w.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(worst <= rtol * scale, "run {run}: off by {worst} from TVM's ({})", last_error());
            ok(mblob_tensor_free(host), "free");
            ok(mblob_tensor_free(y), "free");
        }
        // A wrong input on the device is still refused before anything runs.
        let mut bad = dl;
        bad.ndim = 1;
        let bad = &*(&raw const bad).cast::<mblob_dl_tensor>();
        assert_eq!(mblob_model_set_input_dltensor(m, c"x".as_ptr(), 0, bad), MBLOB_ERR_INPUT);
        ok(mblob_model_free(m), "free");
        ok(mblob_library_free(lib), "free");
    }
}
