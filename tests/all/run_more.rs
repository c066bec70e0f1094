//! Models no one here had seen while writing the executors: 21 small TVM 0.19 graph and AOT
//! models built by `tests/fixtures/tvm-goldens/run-more/make.py` (convolutions with batch norm
//! and pools, concatenate/split with several outputs, view-only graphs with `__nop` nodes and
//! outputs that are inputs or params, an identity, int32/uint8/int64/bool/float16/float64, a
//! dense chain with many params at opt_level 3 and 0, layout transforms with parallel kernels,
//! a graph with no inputs, AOT with several inputs and outputs, `link-params` graph and AOT
//! builds, a system-lib build, AOT with the unified static memory planner (workspace and
//! constant pools), 0-d tensors and input names such as `input.1`). Each runs through the library
//! API and through `mblob run` at 1 and 4 threads, and its outputs are compared with the ones
//! TVM computed from the same `.so` (only TVM's files are the reference).

use std::path::{Path, PathBuf};

use mblob_runtime::exec::{Device, Model as RunModel, Value};
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::NdArray;
use mblob_runtime::{load_library, LoadOptions, Registry};

use crate::goldens::goldens;

fn dir() -> PathBuf {
    goldens().join("run-more")
}

/// One model's metadata, from its JSON (written by make.py).
struct Model {
    name: String,
    so: PathBuf,
    /// (name, dtype, shape, file)
    inputs: Vec<(String, String, Vec<i64>, PathBuf)>,
    /// (file, TVM's 1- and 4-thread outputs are bit-equal)
    outputs: Vec<(PathBuf, bool)>,
}

fn models() -> Vec<Model> {
    let d = dir();
    let mut names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 21, "run-more holds {} models", names.len());
    names
        .into_iter()
        .map(|name| {
            let meta: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.join(format!("{name}.json"))).unwrap())
                    .unwrap_or_else(|e| panic!("{name}.json: {e}"));
            let inputs = meta["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    (
                        i["name"].as_str().unwrap().to_owned(),
                        i["dtype"].as_str().unwrap().to_owned(),
                        i["shape"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect(),
                        d.join(i["file"].as_str().unwrap()),
                    )
                })
                .collect();
            let outputs = meta["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| (d.join(o["file"].as_str().unwrap()), o["bit_exact_threads_1_vs_4"].as_bool().unwrap()))
                .collect();
            Model { so: d.join(format!("{name}.so")), name, inputs, outputs }
        })
        .collect()
}

/// Reads any plain little-endian (or byte-order-free) `.npy` file into a tensor: the header
/// through npyz, the data as the raw bytes that follow it.
fn npy(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(f.order(), npyz::Order::C, "{}", path.display());
    let shape: Vec<i64> = f.shape().iter().map(|&d| d as i64).collect();
    let npyz::DType::Plain(ts) = f.dtype() else { panic!("{}: structured", path.display()) };
    let ts = ts.to_string();
    let (code, bits) = match &ts[1..] {
        "b1" => (1, 1),
        "f2" => (2, 16),
        "f4" => (2, 32),
        "f8" => (2, 64),
        t => {
            let code = match &t[..1] {
                "i" => 0,
                "u" => 1,
                _ => panic!("{}: dtype {ts}", path.display()),
            };
            (code, t[1..].parse::<u8>().unwrap() * 8)
        }
    };
    assert!(ts.starts_with('<') || ts.starts_with('|'), "{}: byte order of {ts}", path.display());
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut f.into_inner(), &mut data).unwrap();
    Tensor::new(DataType { code, bits, lanes: 1 }, shape, data).unwrap_or_else(|| panic!("{}", path.display()))
}

/// `got` equals TVM's `want`: bit for bit when TVM's own 1- and 4-thread results were, else
/// within 1e-5 relative (floats only).
fn check(what: &str, got: &Tensor, want: &Tensor, bit_exact: bool) {
    assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{what}: dtype and shape");
    if bit_exact || want.dtype.code != 2 {
        assert!(got.data[..] == want.data[..], "{what}: differs from TVM's output");
        return;
    }
    let vals = |t: &Tensor| -> Vec<f64> {
        match t.dtype.bits {
            32 => t.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            64 => t.data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            b => panic!("{what}: no tolerance for float{b}"),
        }
    };
    for (i, (g, w)) in vals(got).iter().zip(vals(want)).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-30), "{what}: element {i}: {g} vs TVM's {w}");
    }
}

/// Every model through the library API at 1 and 4 threads: the input infos are the ones TVM
/// was given, the outputs equal TVM's, on the first run and on a second run of the same
/// executor.
#[test]
fn unseen_models_through_the_library_give_tvms_outputs_at_1_and_4_threads() {
    for m in models() {
        // SAFETY: TVM's own exports of small models built by make.py, trusted to run.
        let tree = unsafe { load_library(&m.so, &Registry::default(), &LoadOptions::keep_unknown()) }
            .unwrap_or_else(|e| panic!("{}: {e}", m.name));
        for threads in [1, 4] {
            mblob_runtime::ffi::threadpool::set_num_threads(threads);
            let mut e = RunModel::new(&tree, Device::cpu(0)).unwrap_or_else(|e| panic!("{}: {e}", m.name));
            // TVM's AOT metadata holds the names sanitized (every character other than an
            // ASCII letter or digit made `_`); its executor takes the original names too.
            let aot = m.name.starts_with("aot");
            let tvm_name = |n: &str| {
                if aot {
                    n.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
                } else {
                    n.to_owned()
                }
            };
            let infos: Vec<_> = e.params().iter().map(|p| p.tensor.clone().expect("a tensor input")).collect();
            assert_eq!(
                infos.iter().map(|i| (i.name.clone(), i.dtype.to_string(), i.shape.clone())).collect::<Vec<_>>(),
                m.inputs.iter().map(|(n, d, s, _)| (tvm_name(n), d.clone(), s.clone())).collect::<Vec<_>>(),
                "{}: input infos",
                m.name
            );
            for (k, (n, ..)) in m.inputs.iter().enumerate() {
                assert_eq!(e.input_position(n), Some(k), "{}: input_position({n})", m.name);
            }
            assert_eq!(e.output_info().len(), m.outputs.len(), "{}", m.name);
            for (name, _, _, file) in &m.inputs {
                let a = NdArray::from_tensor(&npy(file), Device::cpu(0)).unwrap();
                e.set_input(Some(name), Value::Tensor(a)).unwrap_or_else(|err| panic!("{} {name}: {err}", m.name));
            }
            for round in 0..2 {
                e.run().unwrap_or_else(|err| panic!("{} at {threads} threads: {err}", m.name));
                for (i, (file, bit)) in m.outputs.iter().enumerate() {
                    let outputs = e.outputs().unwrap_or_else(|err| panic!("{} outputs: {err}", m.name));
                    let got = outputs[i].as_tensor().expect("a tensor").to_tensor().unwrap();
                    check(&format!("{} output {i} at {threads} threads, run {round}", m.name), &got, &npy(file), *bit);
                }
            }
        }
        mblob_runtime::ffi::threadpool::set_num_threads(0);
    }
}

/// Every model through `mblob run --threads 1` and `--threads 4`: `out.K.npy` equal TVM's
/// outputs (float16 and bool `.npy` files included, in and out).
#[test]
fn unseen_models_through_mblob_run_give_tvms_outputs_at_1_and_4_threads() {
    let tmp = tempfile::tempdir().unwrap();
    for m in models() {
        for threads in ["1", "4"] {
            let out = tmp.path().join(format!("{}-{threads}", m.name));
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mblob"));
            cmd.arg("run").arg(&m.so).args(["--threads", threads, "--output-dir"]).arg(&out);
            for (name, _, _, file) in &m.inputs {
                cmd.arg("--input").arg(format!("{name}={}", file.display()));
            }
            let o = cmd.output().unwrap();
            assert!(o.status.success(), "{} at {threads} threads: {}", m.name, String::from_utf8_lossy(&o.stderr));
            for (i, (file, bit)) in m.outputs.iter().enumerate() {
                let got = npy(&out.join(format!("out.{i}.npy")));
                check(&format!("mblob run {} out.{i} at {threads} threads", m.name), &got, &npy(file), *bit);
            }
            assert!(!out.join(format!("out.{}.npy", m.outputs.len())).exists(), "{}: extra outputs", m.name);
        }
    }
}

/// The system-lib registrar mblob provides (so that TVM system-lib builds such as
/// graph_ints_system_lib load) is global once loaded, yet a library that defines its own
/// `TVMBackendRegisterSystemLibSymbol` still gets its own calls: here one is opened after a
/// system-lib model, and its constructor's registration reaches its own definition.
#[test]
fn a_librarys_own_system_lib_registrar_is_not_taken_over() {
    let opts = LoadOptions::keep_unknown();
    // SAFETY: TVM's own export (make.py); loading it puts mblob's registrar in global scope.
    let syslib = unsafe { load_library(&dir().join("graph_ints_system_lib.so"), &Registry::default(), &opts) }.unwrap();
    assert!(RunModel::new(&syslib, Device::cpu(0)).is_ok());
    let tmp = tempfile::tempdir().unwrap();
    let (c, so) = (tmp.path().join("own.c"), tmp.path().join("own.so"));
    std::fs::write(
        &c,
        "static int calls; static const char* last;\n\
         int TVMBackendRegisterSystemLibSymbol(const char* n, void* p) { (void)p; calls++; last = n; return 0; }\n\
         __attribute__((constructor)) static void reg(void) { TVMBackendRegisterSystemLibSymbol(\"mine\", 0); }\n\
         int own_calls(void) { return calls; }\n\
         const char* own_last(void) { return last; }\n",
    )
    .unwrap();
    let st = std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&c).status().unwrap();
    assert!(st.success());
    // SAFETY: the small library above; its constructor only calls its own function.
    let own = unsafe { load_library(&so, &Registry::default(), &opts) }.unwrap();
    let calls = own.get_function("own_calls").unwrap();
    let last = own.get_function("own_last").unwrap();
    // SAFETY: both are defined above with these signatures.
    #[allow(unsafe_code)]
    let (calls, last) = unsafe {
        let f: extern "C" fn() -> i32 = std::mem::transmute(calls.addr());
        let g: extern "C" fn() -> *const std::ffi::c_char = std::mem::transmute(last.addr());
        let p = g();
        (f(), (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()))
    };
    assert_eq!((calls, last.as_deref()), (1, Some("mine")));
}
