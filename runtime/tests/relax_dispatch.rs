//! The VM's call path on `benches/fixtures/relax-dispatch` (TVM 0.27, eight kernels each adding
//! one to four floats, storages allocated and freed on every call): repeated calls, with host
//! tensors and with device arrays, outputs kept across calls and not, each give TVM's output
//! bit for bit, and a kept output is not overwritten by the calls after it (the storage pool
//! hands out only storages no one holds).

#[path = "support/npyfile.rs"]
mod npyfile;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::HostCalls;

use std::path::{Path, PathBuf};

use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::exec::Value;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/fixtures/relax-dispatch")
}

#[test]
fn repeated_calls_give_tvms_output() {
    // SAFETY: TVM's library, built by make.py beside it.
    let tree = unsafe { load_library(&dir().join("relax_dispatch.so"), &Registry::default(), &LoadOptions::default()) }
        .unwrap();
    let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
    let x = npyfile::tensor(&dir().join("relax_dispatch.in.x.npy"));
    let expected = npyfile::tensor(&dir().join("relax_dispatch.out.0.npy"));
    let xa = NdArray::from_bytes(&x.data, &x.shape, x.dtype, Device::cpu(0)).unwrap();
    let mut kept = Vec::new();
    for i in 0..50 {
        let out = vm.call_tensors("main", std::slice::from_ref(&x)).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].dtype, &out[0].shape, &out[0].data[..]),
            (expected.dtype, &expected.shape, &expected.data[..])
        );
        let Value::Tensor(array) = vm.invoke("main", &[Value::Tensor(xa.clone())]).unwrap() else {
            panic!("main returns a tensor")
        };
        assert_eq!(array.to_tensor().unwrap().data[..], expected.data[..], "call {i}");
        if i % 7 == 0 {
            kept.push(array);
        }
    }
    // The input is read, never written.
    assert_eq!(xa.to_tensor().unwrap().data[..], x.data[..]);
    for k in &kept {
        assert_eq!(k.to_tensor().unwrap().data[..], expected.data[..]);
    }
}
