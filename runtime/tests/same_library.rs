//! One library file loaded several times in one process: each load is a model of its own that
//! keeps giving TVM's outputs whatever happens to the others (dropped before it runs, run on
//! another thread at the same time), and a load after the last one was dropped works.
//!
//! `dlopen` of one file hands every load the same image, whose compiled host code keeps the
//! device and runtime functions it looks up (`TVMBackendGetFuncFromEnv`,
//! `TVMFFIEnvModLookupFromImports`) and its module context (`__tvm_module_ctx`) in its own
//! static data: these tests run OpenCL models of `tests/fixtures/device-run` (host code that
//! looks up its kernels among the library's imports; pocl runs them here) and CPU models of
//! `tests/fixtures/sort` (host code that looks up `tvm.contrib.sort.*` among the global
//! functions), against the outputs TVM gave for them.

#[path = "support/device_run.rs"]
mod device_run;
#[cfg(feature = "ops")]
#[path = "support/npyfile.rs"]
mod npyfile;

// ---- CPU libraries that look functions up by name (tvm.contrib.sort.*, feature `ops`) ------
#[cfg(feature = "ops")]
mod cpu {
    use std::path::{Path, PathBuf};

    use super::device_run::load;
    use mblob_runtime::exec::{Device, Model, Value};
    use mblob_runtime::LoadedTree;
    use mblob_runtime::NdArray;

    use super::npyfile::tensor as npy;

    fn sort_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sort")
    }

    /// Runs sort fixture `name` (the manifest's entry) loaded as `tree`: every output equal, bit
    /// for bit, to TVM's.
    fn run_sort(name: &str, tree: &LoadedTree) {
        let dir = sort_dir();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        let m = manifest["models"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap();
        let mut model = Model::new(tree, Device::cpu(0)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for i in m["inputs"].as_array().unwrap() {
            let input = npy(&dir.join(i["file"].as_str().unwrap()));
            let input = Value::Tensor(NdArray::from_tensor(&input, Device::cpu(0)).unwrap());
            model.set_input(Some(i["name"].as_str().unwrap()), input).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        model.run().unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = model.outputs().unwrap();
        let want = m["outputs"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: number of outputs");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let Value::Tensor(g) = g else { panic!("{name}: output {k} is not a tensor") };
            let g = g.to_tensor().unwrap();
            let w = npy(&dir.join(w["file"].as_str().unwrap()));
            assert_eq!((g.dtype, &g.shape), (w.dtype, &w.shape), "{name}: output {k}");
            assert!(g.data[..] == w.data[..], "{name}: output {k} differs from TVM's");
        }
    }

    /// The sort fixtures (TVM 0.27 Relax and TVM 0.19 Relay) loaded twice, one load dropped before
    /// the other runs, each way round, on two threads, and again after both were dropped.
    #[test]
    fn cpu_libraries_calling_global_functions_load_twice() {
        for name in ["relax_float32", "relay_float32"] {
            let so = sort_dir().join(format!("{name}.so"));
            let first = load(&so);
            let second = load(&so);
            drop(second);
            run_sort(name, &first);
            let second = load(&so);
            drop(first);
            run_sort(name, &second);
            drop(second);
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let so = so.clone();
                    std::thread::spawn(move || {
                        let tree = load(&so);
                        for _ in 0..3 {
                            run_sort(name, &tree);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap_or_else(|_| panic!("{name}: a thread failed"));
            }
            run_sort(name, &load(&so));
        }
    }
}

/// Models built for OpenCL, run on the machine's OpenCL device (pocl here and in CI).
#[cfg(feature = "opencl")]
mod opencl {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Barrier};

    use super::device_run::{fixtures, json, load, opencl, run_tree};

    /// The OpenCL fixtures these tests load: a Relax model (TVM 0.27, tvm-ffi lookups) and a graph
    /// model.
    const OPENCL: [&str; 2] = ["dev_relax_mlp_opencl", "dev_graph_cnn_opencl"];

    fn library(name: &str) -> PathBuf {
        fixtures().join(json(name)["so"].as_str().unwrap())
    }

    /// A second load dropped before the first one ever ran: the first still finds its kernels.
    #[test]
    fn first_load_runs_after_the_second_is_dropped() {
        let dev = opencl();
        for name in OPENCL {
            let first = load(&library(name));
            let second = load(&library(name));
            drop(second);
            run_tree(name, &first, dev);
        }
    }

    /// The first load dropped before the second one ran, and after it ran.
    #[test]
    fn second_load_runs_after_the_first_is_dropped() {
        let dev = opencl();
        for name in OPENCL {
            let first = load(&library(name));
            let second = load(&library(name));
            drop(first);
            run_tree(name, &second, dev);

            let first = load(&library(name));
            run_tree(name, &first, dev);
            let second = load(&library(name));
            drop(first);
            run_tree(name, &second, dev);
        }
    }

    /// Both loads run, one after the other, in both orders, while both are alive.
    #[test]
    fn two_live_loads_both_run() {
        let dev = opencl();
        for name in OPENCL {
            let first = load(&library(name));
            let second = load(&library(name));
            run_tree(name, &second, dev);
            run_tree(name, &first, dev);
            run_tree(name, &second, dev);
        }
    }

    /// A load after every earlier load of the file was dropped.
    #[test]
    fn load_after_drop_runs() {
        let dev = opencl();
        for name in OPENCL {
            for _ in 0..3 {
                let tree = load(&library(name));
                run_tree(name, &tree, dev);
            }
        }
    }

    /// Two threads, each with its own load of the same file: the second thread loads after the
    /// first and drops its load before the first runs; once the first ran, it keeps running while
    /// the second loads again and runs too.
    #[test]
    fn loads_on_two_threads() {
        let dev = opencl();
        for name in OPENCL {
            let step = Arc::new(Barrier::new(2));
            let first = {
                let step = step.clone();
                std::thread::spawn(move || {
                    let tree = load(&library(name));
                    step.wait();
                    step.wait();
                    run_tree(name, &tree, dev);
                    step.wait();
                    for _ in 0..4 {
                        run_tree(name, &tree, dev);
                    }
                })
            };
            let second = std::thread::spawn(move || {
                step.wait();
                drop(load(&library(name)));
                step.wait();
                step.wait();
                let tree = load(&library(name));
                for _ in 0..4 {
                    run_tree(name, &tree, dev);
                }
            });
            for t in [first, second] {
                t.join().unwrap_or_else(|_| panic!("{name}: a thread failed"));
            }
        }
    }

    /// A load after the last one was dropped while the image stayed mapped (the program holds its
    /// own `dlopen` handle on the file, as a library marked `NODELETE` also stays): the compiled
    /// code's cached function handles, left from the dropped load, lead to the new load's kernels.
    #[test]
    fn load_after_drop_while_the_image_stays_mapped() {
        let dev = opencl();
        // (a graph model: its host code imports no runtime function by name, so it opens in the
        // main namespace, where the test's own `dlopen` finds the image mblob loaded)
        for name in ["dev_graph_cnn_opencl"] {
            let path = library(name);
            // SAFETY: a fixture TVM built for these tests; opened with local scope, as mblob opens it.
            let held = unsafe {
                use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
                Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL)
            }
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for _ in 0..2 {
                let tree = load(&path);
                run_tree(name, &tree, dev);
            }
            drop(held);
        }
    }

    /// Whether the image of `path` is loaded in the main namespace now.
    fn loaded(path: &Path) -> bool {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: `RTLD_NOLOAD` opens nothing: it hands back the loaded image's handle (one more
        // reference, given back just below) or null.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            // SAFETY: the handle `dlopen` just returned, closed once.
            unsafe { libc::dlclose(handle) };
        }
        !handle.is_null()
    }

    /// Dropping every load of a library that ran unloads it: nothing is left holding the image
    /// (the kernels found for its compiled code hold their device module, whose code is a view of
    /// the image).
    #[test]
    fn dropped_loads_unload_the_library() {
        let dev = opencl();
        // (a graph model, opened in the main namespace, where `dlopen` can tell; no other test
        // here loads it)
        let name = "dev_graph_resblock_opencl";
        let path = library(name);
        let first = load(&path);
        let second = load(&path);
        run_tree(name, &first, dev);
        run_tree(name, &second, dev);
        assert!(loaded(&path));
        drop(first);
        run_tree(name, &second, dev);
        drop(second);
        assert!(!loaded(&path), "{name}: still loaded after its loads were dropped");
    }
}
