//! Running what is loaded: both calling conventions on every TVM version's library, the
//! context functions, the thread pool, and the graph and AOT executors against TVM's outputs.
#![allow(unsafe_code)]

use std::path::Path;

use mblob_runtime::ffi::dlpack::{DLDataType, DLDevice, DLTensor};
use mblob_runtime::ffi::Value;
use mblob_runtime::{load_library, Layout, LoadOptions, LoadedTree, NdArray, Registry};

use crate::goldens::{f32_file, goldens};

fn load(path: &Path) -> LoadedTree {
    // SAFETY: TVM's own exports of tiny models (the goldens), trusted to run.
    unsafe { load_library(path, &Registry::default(), &LoadOptions::keep_unknown()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A 64-byte aligned f32 tensor for kernels: an `NdArray` on the CPU.
struct Buf {
    data: NdArray,
}

impl Buf {
    fn f32(values: &[f32], shape: &[i64]) -> Buf {
        Buf { data: NdArray::from_f32(values, shape, Device::cpu(0)).unwrap() }
    }
    /// Its `DLTensor`, with the dtype code `code` (the shape stays the array's own).
    fn dl(&mut self, code: u8) -> DLTensor {
        let mut t = self.data.dl_tensor();
        t.dtype = DLDataType { code, bits: 32, lanes: 1 };
        t
    }
    fn to_f32(&self) -> Vec<f32> {
        self.data.to_f32().unwrap().unwrap()
    }
}

/// `add` of relax_add_mul on every TVM version's library: found by its plain name (0.22+ has
/// only `__tvm_ffi_add`), called in the library's own convention, and `2 * (x + y)` is TVM's
/// output for the whole program (`multiply` by 2 is exact).
#[test]
fn add_is_found_and_called_on_every_version() {
    let root = goldens();
    for (dir, abi) in [
        ("", Layout::Classic),
        ("other_versions/tvm-0.19.0", Layout::Classic),
        ("other_versions/tvm-0.21.0", Layout::Classic021),
        ("other_versions/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        let dir = root.join(dir);
        let tree = load(&dir.join("relax_add_mul.so"));
        assert!(tree.get_function("add").is_some(), "{}: get_function(add)", dir.display());
        let f = tree.packed_function("add").unwrap();
        assert_eq!(f.abi(), Some(abi), "{}", dir.display());
        let mut x = Buf::f32(&f32_file(&dir.join("relax_add_mul.in.x.f32")), &[2, 3]);
        let mut y = Buf::f32(&f32_file(&dir.join("relax_add_mul.in.y.f32")), &[2, 3]);
        let mut out = Buf::f32(&[0.0; 6], &[2, 3]);
        let mut args = [x.dl(2), y.dl(2), out.dl(2)];
        // SAFETY: `add` takes three float32 [2, 3] tensors; the buffers are aligned and live.
        unsafe { f.call_tensors(&mut args) }.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let want: Vec<f32> = f32_file(&dir.join("relax_add_mul.out.0.f32")).iter().map(|v| v / 2.0).collect();
        assert_eq!(out.to_f32(), want, "{}", dir.display());

        // Argument errors come back as errors, in every convention (on 0.27 through
        // TVMFFIErrorSetRaisedFromCStrParts, which the shim provides).
        // SAFETY: the function checks the argument count before touching any argument.
        let err = unsafe { f.call_tensors(&mut args[..1]) }.unwrap_err();
        assert!(err.message.contains("num_args") || err.message.contains("argument"), "{}: {err}", dir.display());
        let mut bad = [x.dl(0), y.dl(2), out.dl(2)];
        // SAFETY: a wrong dtype is checked before the data is read.
        let err = unsafe { f.call_tensors(&mut bad) }.unwrap_err();
        assert!(err.message.contains("dtype") || err.message.contains("float32"), "{}: {err}", dir.display());
        // Scalars where a tensor is expected are refused too, not read as pointers.
        // SAFETY: the type code/index is checked before the value is used.
        let err = unsafe { f.call(&[Value::Int(1), Value::Float(2.0), Value::None]) }.unwrap_err();
        assert!(!err.message.is_empty(), "{}", dir.display());
    }
}

// ---- models against TVM's outputs -------------------------------------------------------

use mblob_runtime::exec::{Device, ExecError, Model as RunModel, Value as RunValue};
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;

/// A host tensor as a model's input value (on the CPU).
fn value(t: &Tensor) -> RunValue {
    RunValue::Tensor(NdArray::from_tensor(t, Device::cpu(0)).unwrap())
}

/// Output `i` of the last run, copied to the host.
fn output(m: &RunModel, i: usize) -> Tensor {
    m.outputs().unwrap()[i].as_tensor().expect("a tensor").to_tensor().unwrap()
}

/// Reads a `.npy` file (little-endian float32 / int8, what the goldens hold) into a tensor.
fn npy(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape: Vec<i64> = f.shape().iter().map(|&d| d as i64).collect();
    let npyz::DType::Plain(ts) = f.dtype() else { panic!("{}: structured", path.display()) };
    let (dtype, data): (DataType, Vec<u8>) = match ts.to_string().as_str() {
        "<f4" => (DataType::F32, f.into_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect()),
        "|i1" => {
            (DataType { code: 0, bits: 8, lanes: 1 }, f.into_vec::<i8>().unwrap().iter().map(|&v| v as u8).collect())
        }
        other => panic!("{}: dtype {other}", path.display()),
    };
    Tensor::new(dtype, shape, data).unwrap()
}

/// (model file, [(input name, .npy)], [output .npy]).
type Model = (std::path::PathBuf, Vec<(String, std::path::PathBuf)>, Vec<std::path::PathBuf>);

/// Every runnable golden.
fn models() -> Vec<Model> {
    let g = goldens();
    let run = g.join("run");
    let mut out = Vec::new();
    for name in ["graph_mlp", "graph_cnn", "graph_two_outputs", "graph_int8", "aot_mlp"] {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join(format!("{name}.json"))).unwrap()).unwrap();
        let inputs = meta["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["name"].as_str().unwrap().to_owned(), run.join(i["file"].as_str().unwrap())))
            .collect();
        let outputs =
            meta["outputs"].as_array().unwrap().iter().map(|o| run.join(o["file"].as_str().unwrap())).collect();
        out.push((run.join(format!("{name}.so")), inputs, outputs));
    }
    for name in ["graph_dense_relu", "graph_two_dso_merged"] {
        out.push((
            g.join(format!("{name}.so")),
            vec![("x".to_owned(), g.join("graph_dense_relu.in.x.npy"))],
            vec![g.join("graph_dense_relu.out.0.npy")],
        ));
    }
    out
}

/// Every graph and AOT golden through the library API, at 1 and at 4 threads: outputs equal
/// TVM's bit for bit (the README says TVM's own results are bit-exact across thread counts),
/// and a second run of the same executor gives them again.
#[test]
fn models_give_tvms_outputs_bit_for_bit_at_1_and_4_threads() {
    for (so, inputs, outputs) in models() {
        let tree = load(&so);
        for threads in [1, 4] {
            mblob_runtime::ffi::threadpool::set_num_threads(threads);
            let mut m = RunModel::new(&tree, Device::cpu(0)).unwrap_or_else(|e| panic!("{}: {e}", so.display()));
            assert_eq!(m.output_info().len(), outputs.len(), "{}", so.display());
            assert_eq!(
                m.params().iter().map(|i| i.name.clone()).collect::<Vec<_>>(),
                inputs.iter().map(|i| i.0.clone()).collect::<Vec<_>>()
            );
            for (name, file) in &inputs {
                m.set_input(Some(name), value(&npy(file))).unwrap();
            }
            for round in 0..2 {
                m.run().unwrap_or_else(|e| panic!("{} at {threads} threads: {e}", so.display()));
                for (i, file) in outputs.iter().enumerate() {
                    let got = output(&m, i);
                    let want = npy(file);
                    assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{} output {i}", so.display());
                    assert!(
                        got.data == want.data,
                        "{} output {i} at {threads} threads, run {round}: differs from TVM's {}",
                        so.display(),
                        file.display()
                    );
                }
            }
        }
        mblob_runtime::ffi::threadpool::set_num_threads(0);
    }
}

/// Wrong input name, shape, dtype or index: typed errors naming what was expected; TVM would
/// ignore the name silently.
#[test]
fn wrong_inputs_are_typed_errors() {
    let run = goldens().join("run");
    for so in ["graph_mlp.so", "aot_mlp.so"] {
        let tree = load(&run.join(so));
        let mut m = RunModel::new(&tree, Device::cpu(0)).unwrap();
        let x = npy(&run.join("graph_mlp.in.x.npy"));
        match m.set_input(Some("y"), value(&x)).unwrap_err() {
            ExecError::UnknownInput { name, known, function: None } => {
                assert_eq!((name.as_str(), known), ("y", vec!["x".to_owned()]))
            }
            e => panic!("{so}: {e}"),
        }
        let int8 = npy(&run.join("graph_int8.in.x.npy"));
        let err = m.set_input(Some("x"), value(&int8)).unwrap_err();
        assert!(matches!(err, ExecError::InputMismatch { .. }), "{so}: {err}");
        assert!(err.to_string().contains("expected float32 [2, 64], got int8 [4, 32]"), "{so}: {err}");
        let reshaped = Tensor::new(DataType::F32, vec![64, 2], x.data.clone()).unwrap();
        let err = m.set_input(Some("x"), value(&reshaped)).unwrap_err();
        assert!(err.to_string().contains("[64, 2]"), "{so}: {err}");
        let err = m.set_input(Some("x"), RunValue::Int(1)).unwrap_err();
        assert!(matches!(err, ExecError::InputKind { expected: "tensor", got: "int", .. }), "{so}: {err}");
        assert!(matches!(m.set_input_at(3, value(&x)), Err(ExecError::Index { what: "input", index: 3, count: 1 })));
        assert!(matches!(m.select_function("main"), Err(ExecError::NoFunctions { .. })), "{so}");
        assert!(RunModel::new(&tree, Device::cuda(0)).is_err(), "{so}: CUDA device refused");
    }
    // A library with no model has no executor.
    let err = RunModel::new(&load(&goldens().join("dso_add_one.so")), Device::cpu(0)).err().unwrap();
    assert!(matches!(err, ExecError::NoModel { .. }), "{err}");
}

/// A kernel's own argument check reaches the caller as an error naming the node, the
/// function and the kernel's assert text: graph_dense_relu's graph, with its input declared
/// [1, 5] instead of [1, 4], exported with TVM's kernel object and run.
#[test]
fn a_failing_kernel_names_its_node_function_and_assert_text() {
    use mblob::export::Export;
    use mblob_runtime::payload::graph::GraphExecutorFactory;
    let g = goldens();
    let golden = load(&g.join("graph_dense_relu.so"));
    let mut forged = golden.find::<GraphExecutorFactory>().unwrap().clone();
    let json = forged.graph_json.replacen("[1, 4]", "[1, 5]", 1);
    assert_ne!(json, forged.graph_json, "the graph JSON changed");
    forged.graph_json = json;
    let mut tree = mblob_runtime::ModuleTree::new();
    let root = tree.add_payload(forged);
    let host = tree.add_dso("llvm");
    tree.import(root, host);
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("forged.so");
    let mut e = Export::from_tree(tree);
    e.object(g.join("graph_dense_relu.lib0.o"));
    e.write(&so).unwrap();
    let tree = load(&so);
    let mut m = RunModel::new(&tree, Device::cpu(0)).unwrap();
    let x = Tensor::new(DataType::F32, vec![1, 5], vec![0u8; 20]).unwrap();
    m.set_input(Some("x"), value(&x)).unwrap();
    let err = m.run().unwrap_err();
    match &err {
        ExecError::Kernel { node, function, message } => {
            assert_eq!(node, "tvmgen_default_fused_nn_contrib_dense_pack_add_nn_relu");
            assert_eq!(function, node);
            assert!(message.contains("Assert") || message.contains("shape"), "{message}");
        }
        e => panic!("{e}"),
    }
}

// ---- calls into imported modules: a user-defined kind ----------------------------------

mod fake_opencl {
    use std::sync::{Arc, Mutex};

    use mblob_runtime::ffi::{PackedFunction, Value};
    use mblob_runtime::format::Layout;
    use mblob_runtime::registry::{Loader, LoaderError, Measure};
    use mblob_runtime::{Bytes, FormatError, Module, Registry};

    /// (kernel, buffers, extents) of one launch.
    pub type Launch = (String, usize, Vec<i64>);

    /// A user-defined kind standing in for OpenCL: its "kernel" runs on the CPU, and every
    /// launch is recorded (the extents the host code passes included).
    #[derive(Debug, Default)]
    pub struct FakeCl {
        pub launches: Arc<Mutex<Vec<Launch>>>,
    }

    impl Module for FakeCl {
        fn type_key(&self) -> &str {
            "opencl"
        }
        fn get_function(&self, name: &str) -> Option<PackedFunction> {
            if name != "vector_add_kernel" {
                return None;
            }
            let launches = self.launches.clone();
            Some(PackedFunction::from_fn(move |args| {
                let ptrs: Vec<*mut f32> = args
                    .iter()
                    .filter_map(|a| match a {
                        Value::Handle(p) => Some(p.cast::<f32>()),
                        _ => None,
                    })
                    .collect();
                let extents: Vec<i64> =
                    args.iter().filter_map(|a| if let Value::Int(i) = a { Some(*i) } else { None }).collect();
                let [a, b, c] = ptrs[..] else { return Err(format!("expected 3 buffers, got {args:?}")) };
                let n = (extents.iter().product::<i64>()) as usize;
                // SAFETY: the host code passes the data pointers of the three tensors the test
                // gave it, each of `grid * block` floats (the kernel's launch covers them).
                #[allow(unsafe_code)]
                unsafe {
                    for i in 0..n {
                        *c.add(i) = *a.add(i) + *b.add(i);
                    }
                }
                launches.lock().unwrap().push(("vector_add_kernel".into(), ptrs.len(), extents));
                Ok(Value::None)
            }))
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    pub struct FakeClLoader;

    impl Loader for FakeClLoader {
        fn type_key(&self) -> &str {
            "opencl"
        }
        fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError> {
            Registry::default().get("opencl").unwrap().measure(bytes, base, layout)
        }
        fn load(&self, _payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
            Ok(Arc::new(FakeCl::default()))
        }
    }
}

/// TVM 0.19, 0.21 and 0.27 host code of an OpenCL vector add looks its kernel up by name in
/// the library's imports (`GetFuncFromEnv`, or `EnvModLookupFromImports` + `HandleInitOnce`
/// on 0.27) and calls it with the buffers and launch extents (`FuncCall` /
/// `TVMFFIFunctionCall`): here the import is a user-defined kind, found through
/// `Module::get_function` (a Rust function made callable by `function_symbol`), and the
/// result is `A + B`.
#[test]
fn host_code_calls_a_user_defined_kind_through_get_func_from_env() {
    let dev = goldens().join("device");
    let mut registry = Registry::default();
    registry.register(fake_opencl::FakeClLoader);
    for dir in [dev.clone(), dev.join("tvm-0.21.0"), dev.join("tvm-0.27.0.post1")] {
        let so = dir.join("opencl_vector_add.so");
        // SAFETY: TVM's export of a tiny model, trusted to run.
        let tree = unsafe { load_library(&so, &registry, &LoadOptions::default()) }.unwrap();
        let f = tree.packed_function("vector_add").unwrap();
        // The entry: `__tvm_main__` is a string naming `vector_add` on 0.19 and 0.21, and
        // `__tvm_ffi_main` a function on 0.27 (found as `main`).
        let entry = tree.get_function("__tvm_main__").or_else(|| tree.get_function("main")).unwrap();
        if !dir.ends_with("tvm-0.27.0.post1") {
            assert_eq!(entry.addr(), tree.get_function("vector_add").unwrap().addr(), "{}", so.display());
        }
        let n = 1024;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
        let (mut ba, mut bb, mut bc) =
            (Buf::f32(&a, &[n as i64]), Buf::f32(&b, &[n as i64]), Buf::f32(&vec![0.0; n], &[n as i64]));
        // The host code checks device_type == OpenCL (4) before launching.
        let mut args = [ba.dl(2), bb.dl(2), bc.dl(2)];
        for t in &mut args {
            t.device = DLDevice { device_type: 4, device_id: 0 };
        }
        // SAFETY: vector_add takes three float32 [n] tensors on an OpenCL device; the fake
        // device's memory is host memory.
        unsafe { f.call_tensors(&mut args) }.unwrap_or_else(|e| panic!("{}: {e}", so.display()));
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(bc.to_f32(), want, "{}", so.display());
        let fake = tree.find::<fake_opencl::FakeCl>().unwrap();
        let launches = fake.launches.lock().unwrap().clone();
        assert_eq!(launches.len(), 1, "{}", so.display());
        assert_eq!(launches[0].1, 3);
        assert_eq!(
            launches[0].2.iter().product::<i64>(),
            n as i64,
            "grid * block covers the vector: {:?}",
            launches[0].2
        );
    }
}

// ---- mblob run ---------------------------------------------------------------------------

fn mblob_run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mblob")).arg("run").args(args).output().expect("run mblob")
}

/// `mblob run` on every graph/AOT golden at 1 and 4 threads writes TVM's outputs, bit for bit;
/// `--repeat` prints the timing line.
#[test]
fn mblob_run_writes_tvms_outputs() {
    let dir = tempfile::tempdir().unwrap();
    for (k, (so, inputs, outputs)) in models().into_iter().enumerate() {
        for threads in ["1", "4"] {
            let out = dir.path().join(format!("{k}-{threads}"));
            let mut args: Vec<std::ffi::OsString> = vec![so.clone().into()];
            for (name, file) in &inputs {
                args.push("--input".into());
                args.push(format!("{name}={}", file.display()).into());
            }
            args.extend([
                "--threads".into(),
                threads.into(),
                "--repeat".into(),
                "3".into(),
                "--output-dir".into(),
                out.clone().into(),
            ]);
            let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
            let o = mblob_run(&args);
            let stdout = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{}: {}", so.display(), String::from_utf8_lossy(&o.stderr));
            assert!(stdout.contains(&format!("3 runs, {threads} threads: mean")), "{stdout}");
            for (i, want) in outputs.iter().enumerate() {
                let got = npy(&out.join(format!("out.{i}.npy")));
                let want = npy(want);
                assert!(got == want, "{} output {i} at {threads} threads differs from TVM's", so.display());
            }
        }
    }
}

/// `--function` calls one host function of a plain library (dso_add_one: B = A + 1).
#[test]
fn mblob_run_function_of_a_plain_library() {
    let g = goldens();
    let dir = tempfile::tempdir().unwrap();
    let a = format!("A={}", g.join("dso_add_one.in.A.npy").display());
    let o = mblob_run(&[
        g.join("dso_add_one.so").as_os_str(),
        "--function".as_ref(),
        "add_one".as_ref(),
        "--input".as_ref(),
        a.as_ref(),
        "--output".as_ref(),
        "B=float32[4]".as_ref(),
        "-o".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(npy(&dir.path().join("out.0.npy")) == npy(&g.join("dso_add_one.out.B.npy")));
    // A wrong output shape is the kernel's own error, reported, not a crash.
    let o = mblob_run(&[
        g.join("dso_add_one.so").as_os_str(),
        "--function".as_ref(),
        "add_one".as_ref(),
        "--input".as_ref(),
        a.as_ref(),
        "--output".as_ref(),
        "B=float32[5]".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("add_one") && err.contains("failed"), "{err}");
}

/// Inputs are checked against the model before anything runs: unknown name, wrong dtype or
/// shape, missing input, a file that is not .npy; nothing is written.
#[test]
fn mblob_run_checks_inputs_first() {
    let run = goldens().join("run");
    let dir = tempfile::tempdir().unwrap();
    let so = run.join("graph_mlp.so");
    let x = run.join("graph_mlp.in.x.npy");
    let int8 = run.join("graph_int8.in.x.npy");
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (vec!["--input".into(), format!("y={}", x.display()).into()], "no input named `y` (inputs: x)"),
        (vec!["--input".into(), format!("x={}", int8.display()).into()], "expected float32 [2, 64], got int8 [4, 32]"),
        (vec![], "missing inputs: x (float32 [2, 64])"),
        (vec!["--input".into(), format!("x={}", so.display()).into()], "not a .npy file"),
        // A file that is not there (a bare FILE is a usage error for a graph model: cli.rs).
        (vec!["--input".into(), "x=x".into()], "x: cannot read"),
    ];
    for (extra, want) in cases {
        let mut args: Vec<std::ffi::OsString> = vec![so.clone().into(), "-o".into(), dir.path().into()];
        args.extend(extra);
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let o = mblob_run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{want}: {err}");
        assert!(err.contains(want), "want {want:?}, got {err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing written");
    }
}

/// TVM's `save_param_dict` file of graph_dense_relu reads as the factory's params.
#[test]
fn params_file_reads_as_the_factorys_params() {
    use mblob_runtime::exec::graph::read_params;
    use mblob_runtime::payload::graph::GraphExecutorFactory;
    let g = goldens();
    let mut file =
        read_params(&mblob_runtime::Bytes::from_vec(std::fs::read(g.join("graph_dense_relu.params")).unwrap()))
            .unwrap();
    let tree = load(&g.join("graph_dense_relu.so"));
    let mut factory = tree.find::<GraphExecutorFactory>().unwrap().params.clone();
    file.sort_by(|a, b| a.0.cmp(&b.0));
    factory.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(file, factory);
}

/// Host code that imports runtime functions by name (TVM's C host target, system-lib builds):
/// the ones mblob provides bind to its shim; a library importing one it does not provide is
/// refused before it is opened, with the names.
#[test]
fn libraries_importing_runtime_functions_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let build = |name: &str, src: &str| {
        let c = dir.path().join(format!("{name}.c"));
        let so = dir.path().join(format!("{name}.so"));
        std::fs::write(&c, src).unwrap();
        let st = std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&c).status().unwrap();
        assert!(st.success());
        so
    };
    let ok = build(
        "imports_ok",
        r#"#include <stdint.h>
void* TVMBackendAllocWorkspace(int, int, uint64_t, int, int);
int TVMBackendFreeWorkspace(int, int, void*);
void TVMAPISetLastError(const char*);
int uses_workspace(void* args, int* codes, int n, void* ret, int* rc, void* h) {
  void* p = TVMBackendAllocWorkspace(1, 0, 100, 2, 32);
  if (p == 0 || ((uintptr_t)p) % 64 != 0) { TVMAPISetLastError("bad workspace"); return -1; }
  if (TVMBackendFreeWorkspace(1, 0, p) != 0) return -1;
  if (n != 0) { TVMAPISetLastError("no arguments wanted"); return -1; }
  return 0;
}"#,
    );
    let tree = load(&ok);
    let f = tree.packed_function("uses_workspace").unwrap();
    // SAFETY: the function above reads no argument.
    unsafe { f.call(&[]) }.unwrap();
    // SAFETY: as above.
    let err = unsafe { f.call(&[Value::Int(1)]) }.unwrap_err();
    assert_eq!(err.message, "no arguments wanted");

    let refused = build(
        "imports_missing",
        "int TVMArrayAlloc(const long*, int, int, int, int, int, int, void**);\nint f(void) { return TVMArrayAlloc(0, 0, 0, 0, 0, 0, 0, 0); }\n",
    );
    // SAFETY: refused before it is opened.
    let err = unsafe { load_library(&refused, &Registry::default(), &LoadOptions::default()) }.unwrap_err();
    assert!(
        matches!(err, mblob_runtime::Error::MissingRuntimeSymbols { ref symbols, .. } if symbols == &["TVMArrayAlloc"]),
        "{err}"
    );
}
