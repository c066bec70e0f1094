//! Several threads loading, using and dropping packed libraries at once: different libraries,
//! and the same one many times. `ci/leaks.sh` runs this under LeakSanitizer.

use std::sync::Arc;
use std::thread;

use mblob_runtime::ffi::call::call_packed;
use mblob_runtime::ffi::dlpack::DLTensor;
use mblob_runtime::{load_library, LoadOptions, Registry};

use crate::goldens::{f32_file, goldens, run_dense_relu};

const THREADS: usize = 8;
const ROUNDS: usize = 25;

#[test]
fn threads_load_use_and_drop_libraries() {
    let registry = Arc::new(Registry::default());
    let expected_dense = f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
    let expected_add = f32_file(&goldens().join("dso_add_one.out.B.f32"));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let registry = registry.clone();
            let (expected_dense, expected_add) = (expected_dense.clone(), expected_add.clone());
            thread::spawn(move || {
                for round in 0..ROUNDS {
                    // Even threads share one library; odd ones alternate between others.
                    let name = match (t % 2, round % 3) {
                        (0, _) => "graph_dense_relu.so",
                        (_, 0) => "graph_two_dso_merged.so",
                        (_, 1) => "dso_add_one.so",
                        _ => "relax_add_mul.so",
                    };
                    // SAFETY: TVM's golden exports of tiny models; loading runs no harmful code.
                    #[allow(unsafe_code)]
                    let loaded = unsafe { load_library(&goldens().join(name), &registry, &LoadOptions::default()) }
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    match name {
                        "graph_dense_relu.so" | "graph_two_dso_merged.so" => {
                            assert_eq!(run_dense_relu(&loaded), expected_dense);
                        }
                        "dso_add_one.so" => {
                            let mut a = vec![1.0f32, 2.0, 3.0, 4.0];
                            let mut b = vec![0f32; 4];
                            let (mut sa, mut sb) = ([4i64], [4i64]);
                            let f = loaded.get_function("add_one").unwrap();
                            let mut args = [DLTensor::f32(&mut a, &mut sa), DLTensor::f32(&mut b, &mut sb)];
                            // SAFETY: add_one takes two float32 tensors of shape [4].
                            #[allow(unsafe_code)]
                            unsafe { call_packed(&f, &mut args) }.unwrap();
                            assert_eq!(b, expected_add);
                        }
                        _ => assert!(loaded.get_function("add").is_some()),
                    }
                    // A symbol may outlive the tree: it keeps the library loaded.
                    let kept = loaded.get_function("__tvm_dev_mblob");
                    drop(loaded);
                    drop(kept);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread panicked");
    }
}

#[test]
fn threads_load_and_drop_what_mblob_exported() {
    use mblob::export::Export;
    use mblob_runtime::payload::device::{DeviceModule, FunctionInfo};
    use mblob_runtime::Layout;

    // The graph golden re-exported in each layout, with a CUDA module below the host library.
    let dir = tempfile::tempdir().unwrap();
    let ptx = std::fs::read(goldens().join("device/tvm-0.27.0.post1/nvptx_vector_add.dev0.source.txt")).unwrap();
    let libs: Vec<_> = [Layout::Classic, Layout::Classic021, Layout::Ffi]
        .into_iter()
        .map(|layout| {
            let mut e: Export = crate::export::dense_relu_export();
            let info = FunctionInfo::new("", vec![mblob_runtime::format::stream::DataType::HANDLE; 3], vec![]);
            let cuda = DeviceModule::cuda_from_ptx(ptx.clone(), vec![("vector_add_kernel".into(), info)]);
            let host = e.host();
            let id = e.tree_mut().add_payload(cuda);
            e.tree_mut().import(host, id);
            let so = dir.path().join(format!("{layout:?}.so"));
            e.layout(layout).write(&so).unwrap();
            so
        })
        .collect();
    let libs = Arc::new(libs);
    let registry = Arc::new(Registry::default());
    let expected = f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (libs, registry, expected) = (libs.clone(), registry.clone(), expected.clone());
            thread::spawn(move || {
                for round in 0..ROUNDS {
                    let so = &libs[(t + round) % libs.len()];
                    // SAFETY: libraries this test exported from TVM's golden kernel objects.
                    #[allow(unsafe_code)]
                    let loaded = unsafe { load_library(so, &registry, &LoadOptions::default()) }
                        .unwrap_or_else(|e| panic!("{}: {e}", so.display()));
                    assert_eq!(loaded.type_keys(), ["GraphExecutorFactory", "library", "cuda"]);
                    assert_eq!(run_dense_relu(&loaded), expected);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread panicked");
    }
}
