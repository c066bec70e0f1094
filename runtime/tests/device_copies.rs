//! Host<->device copies of one graph run and one Relax run on OpenCL (pocl), counted by the
//! device API. Alone in its test binary: the counters are the process's, and no other test
//! may use the device meanwhile.
#![cfg(feature = "opencl")]

#[path = "support/device_run.rs"]
mod device_run;

use device_run::{assert_close, cases, fixtures, input_value, json, load, npy, opencl};
use mblob_runtime::device::{device_api, TransferStats};
use mblob_runtime::exec::Model;
use mblob_runtime::exec::Value;
use mblob_runtime::Device;

/// One graph run and one Relax run move, between host and device, the inputs in and the
/// outputs out and nothing else; the parameters and constants go up once, when the model is
/// made.
#[test]
fn device_runs_copy_inputs_in_outputs_out_and_params_once() {
    let dev = opencl();
    let api = device_api(dev).unwrap();
    for name in ["dev_graph_resblock_opencl", "dev_relax_mlp_opencl"] {
        let meta = json(name);
        let tree = load(&fixtures().join(meta["so"].as_str().unwrap()));
        let before = api.transfers();
        let mut m = Model::new(&tree, dev).unwrap();
        let made = api.transfers() - before;
        assert_eq!(made.device_to_host, 0, "{name}: made");
        assert!(made.host_to_device > 0, "{name}: params or constants uploaded");
        if meta["executor"] == "relax" {
            m.select_function(meta["entry"].as_str().unwrap()).unwrap();
        }
        let (ins, outs) = cases(&meta).remove(0);
        let in_bytes: u64 = ins.iter().map(|(_, f)| npy(f).data.len() as u64).sum();
        let out_bytes: u64 = outs.iter().map(|f| npy(f).data.len() as u64).sum();
        for run in 0..2 {
            let inputs: Vec<_> = ins.iter().map(|(input, file)| (input, input_value(&npy(file)))).collect();
            let start = api.transfers();
            for (input, value) in inputs {
                m.set_input(Some(input), value).unwrap();
            }
            m.run().unwrap();
            // The outputs stay on the device until the caller copies them out.
            let got: Vec<Value> = m
                .outputs()
                .unwrap()
                .iter()
                .map(|v| Value::Tensor(v.as_tensor().unwrap().copy(Device::cpu(0)).unwrap()))
                .collect();
            let moved = api.transfers() - start;
            assert_eq!(
                moved,
                TransferStats {
                    host_to_device: ins.len() as u64,
                    host_to_device_bytes: in_bytes,
                    device_to_host: outs.len() as u64,
                    device_to_host_bytes: out_bytes,
                    device_to_device: moved.device_to_device,
                },
                "{name}: run {run}"
            );
            assert_close(name, &got, &outs, 1e-4);
        }
    }
}
