//! `mblob inspect` and `extract` on AOT and Relax models: AOT inputs and outputs as TVM's
//! metadata gives them, Relax constants equal to the arrays TVM put in the constant pool, and
//! the calls mblob cannot serve (fixtures `tvm-goldens/run` and `inspect`, see their READMEs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mblob_runtime::exec::graph::read_params;
use mblob_runtime::Bytes;
use serde_json::Value;

use crate::goldens::{goldens, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inspect")
}

fn mblob(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).output().expect("run mblob")
}

fn inspect(path: &Path, extra: &[&str]) -> (Value, String) {
    let p = path.to_str().unwrap();
    let json_out = mblob(&[&["inspect", "--json"], extra, &[p]].concat());
    assert!(json_out.status.success(), "{p}: {}", String::from_utf8_lossy(&json_out.stderr));
    let text_out = mblob(&[&["inspect"], extra, &[p]].concat());
    assert!(text_out.status.success(), "{p}: {}", String::from_utf8_lossy(&text_out.stderr));
    (serde_json::from_slice(&json_out.stdout).unwrap(), String::from_utf8(text_out.stdout).unwrap())
}

fn module<'a>(report: &'a Value, key: &str) -> &'a Value {
    report["modules"].as_array().unwrap().iter().find(|m| m["type_key"] == key).unwrap_or_else(|| panic!("no {key}"))
}

/// Shape and raw little-endian bytes of a `.npy` file of float32 or int32.
fn npy(path: &Path) -> (Vec<i64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().iter().map(|&d| d as i64).collect();
    let data = match f.dtype().descr().trim_matches('\'') {
        "<f4" => f.into_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i4" => f.into_vec::<i32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        d => panic!("{}: dtype {d}", path.display()),
    };
    (shape, data)
}

#[test]
fn aot_inputs_and_outputs_are_tvms() {
    let so = goldens().join("run/aot_mlp.so");
    let tvm = json(&goldens().join("run/aot_mlp.json"));

    // Without loading: the payload (name, no params) and a note; the metadata is in the code.
    let (report, text) = inspect(&so, &[]);
    let aot = &module(&report, "AotExecutorFactory")["aot"];
    assert_eq!(aot["module_name"], "default");
    assert_eq!(aot["params"], serde_json::json!([]));
    assert_eq!(aot["inputs"], Value::Null);
    assert!(text.contains("pass --load to read them"), "{text}");

    // Loaded: TVM's metadata, as the AOT executor reads it.
    let (report, text) = inspect(&so, &["--load"]);
    let aot = &module(&report, "AotExecutorFactory")["aot"];
    let inputs = aot["inputs"].as_array().unwrap();
    let want = tvm["inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), want.len());
    for (got, want) in inputs.iter().zip(want) {
        for key in ["name", "shape", "dtype"] {
            assert_eq!(got[key], want[key], "input {key}");
        }
        let line =
            format!("input {} {}{}", want["name"].as_str().unwrap(), want["dtype"].as_str().unwrap(), want["shape"]);
        assert!(text.replace(", ", ",").contains(&line), "{line} in {text}");
    }
    let outputs = aot["outputs"].as_array().unwrap();
    let want = tvm["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), want.len());
    for (got, want) in outputs.iter().zip(want) {
        assert_eq!(got["shape"], want["shape"]);
        assert_eq!(got["dtype"], want["dtype"]);
    }
    assert!(!text.contains("pass --load"), "{text}");
}

#[test]
fn relax_constants_are_the_arrays_tvm_was_given() {
    let so = fixtures().join("relax_consts_calls.so");
    let tvm = json(&fixtures().join("relax_consts_calls.json"));
    let (report, text) = inspect(&so, &[]);
    let relax = &module(&report, "relax.VMExecutable")["relax"];
    assert_eq!(relax["constant_pool_len"], tvm["constant_pool_len"]);
    let want = tvm["tensor_constants"].as_array().unwrap();
    let got = relax["constants"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    let mut total = 0;
    for (g, w) in got.iter().zip(want) {
        let (shape, data) = npy(&fixtures().join(w["file"].as_str().unwrap()));
        assert_eq!(g["index"], w["index"]);
        assert_eq!(g["shape"], w["shape"]);
        assert_eq!(g["dtype"], w["dtype"]);
        assert_eq!(g["shape"], serde_json::json!(shape));
        assert_eq!(g["bytes"], data.len());
        total += data.len();
    }
    assert_eq!(relax["constants_bytes"], total);
    assert!(text.contains(&format!("{} tensors ({total} bytes", want.len())), "{text}");

    // extract writes them in TVM's params format, named by pool index.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let run = mblob(&["extract", "-q", so.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let params = read_params(&Bytes::from_vec(std::fs::read(out.join("0.constants.params")).unwrap())).unwrap();
    assert_eq!(params.len(), want.len());
    for w in want {
        let name = format!("c[{}]", w["index"]);
        let (_, t) = params.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no {name}"));
        let (shape, data) = npy(&fixtures().join(w["file"].as_str().unwrap()));
        assert_eq!(t.shape, shape, "{name}");
        assert_eq!(t.dtype.to_string(), w["dtype"].as_str().unwrap(), "{name}");
        assert_eq!(&t.data[..], &data[..], "{name}");
    }
}

#[test]
fn calls_mblob_cannot_serve_are_flagged() {
    let so = fixtures().join("relax_consts_calls.so");
    let tvm = json(&fixtures().join("relax_consts_calls.json"));
    let (report, text) = inspect(&so, &[]);
    let calls: Vec<&str> = module(&report, "relax.VMExecutable")["relax"]["unsupported_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // `vm.builtin.attention_kv_cache_append` (TVM's legacy `nn.KVCache`) is served with the
    // `llm` feature.
    #[cfg(not(feature = "llm"))]
    assert_eq!(calls, ["vm.builtin.attention_kv_cache_append", "my_ext.not_registered"]);
    #[cfg(feature = "llm")]
    assert_eq!(calls, ["my_ext.not_registered"]);
    // Each is a global of TVM's function table that the library does not implement; the
    // first is in TVM's own registry, the second in no one's.
    let has = |key: &str, name: &str| tvm[key].as_array().unwrap().iter().any(|g| g == name);
    for c in &calls {
        assert!(has("globals", c) && !has("library_functions", c), "{c}");
    }
    assert!(has("globals_tvm_registry_has", "vm.builtin.attention_kv_cache_append"));
    assert!(!has("globals_tvm_registry_has", "my_ext.not_registered"));
    assert!(text.contains(&format!("warning: mblob cannot serve {}", calls.join(", "))), "{text}");

    // A model mblob runs (tests/all/run_relax.rs) has none.
    for (name, key) in [("relax_mlp_tvm027.so", "relax.VMExecutable"), ("relax_mlp_tvm019.so", "relax.Executable")] {
        let (report, text) = inspect(&goldens().join("run").join(name), &[]);
        assert_eq!(module(&report, key)["relax"]["unsupported_calls"], serde_json::json!([]), "{name}");
        assert!(!text.contains("warning"), "{text}");
    }
}

/// Host code that imports a TVM runtime function mblob does not provide (`TVMArrayAlloc`, of
/// TVM's C runtime API) is flagged, with the names the loader refuses it for; the imports of
/// TVM-built libraries (`TVMFFIErrorSetRaisedFromCStrParts`, ...) are provided.
#[test]
fn runtime_imports_mblob_lacks_are_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("imports.c");
    let so = dir.path().join("imports.so");
    std::fs::write(
        &c,
        "int TVMArrayAlloc(const long*, int, int, int, int, int, int, void**);\nvoid TVMAPISetLastError(const char*);\n\
         int f(void) { TVMAPISetLastError(\"x\"); return TVMArrayAlloc(0, 0, 0, 0, 0, 0, 0, 0); }\n",
    )
    .unwrap();
    let st = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&c).status().unwrap();
    assert!(st.success());
    let (report, text) = inspect(&so, &[]);
    assert_eq!(report["host"]["unsupported_imports"], serde_json::json!(["TVMArrayAlloc"]));
    assert!(text.contains("warning: imports TVM runtime functions mblob does not provide: TVMArrayAlloc"), "{text}");
    // The loader refuses it for the same name.
    let load = mblob(&["inspect", "--load", so.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&load.stderr);
    assert!(!load.status.success() && err.contains("TVMArrayAlloc") && err.contains("does not provide"), "{err}");

    for name in ["relax_mlp_tvm027", "graph_cnn", "aot_mlp"] {
        let tvm = json(&goldens().join("run").join(format!("{name}.json")));
        let (report, _) = inspect(&goldens().join("run").join(format!("{name}.so")), &[]);
        // TVM's build left these TVM runtime functions undefined (`nm -D`); mblob provides
        // them all.
        let undefined = tvm["dynamic_symbols"]["nm_D_undefined_only"].as_array().unwrap();
        let names: Vec<&str> = undefined.iter().map(|s| s["symbol"].as_str().unwrap()).collect();
        assert!(names.iter().any(|n| n.starts_with("TVM")) || name != "relax_mlp_tvm027", "{name}");
        assert_eq!(report["host"]["unsupported_imports"], serde_json::json!([]), "{name}");
    }
}
