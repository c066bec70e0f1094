//! `examples/c/run_model.c`, compiled with `cc` against the libmblob this build made, runs
//! every model of `tests/fixtures/tvm-goldens/run` (made by TVM 0.19 and 0.27, see its README)
//! on TVM's inputs, and its outputs equal TVM's bit for bit (dtype, shape and bytes).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// The profile directory of this build (`target/debug`): the test binary is in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// A directory laid out as an install's `lib/`: `libmblob.so` and `libmblob.so.0` (the soname)
/// pointing at the build's `libmblob_capi.so` (`cargo test` leaves it in `deps/`, `cargo build`
/// in the profile directory).
fn lib_dir(work: &Path) -> PathBuf {
    let dir = profile_dir();
    let so = [dir.join("deps/libmblob_capi.so"), dir.join("libmblob_capi.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libmblob_capi.so not built in {} or its deps/", dir.display()));
    let lib = work.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    for name in ["libmblob.so", "libmblob.so.0"] {
        let link = lib.join(name);
        std::fs::remove_file(&link).ok();
        std::os::unix::fs::symlink(&so, &link).unwrap();
    }
    lib
}

/// (descr, shape, data bytes) of a .npy file.
fn npy(path: &Path) -> (String, Vec<u64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = npyz::NpyFile::new(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dtype = file.dtype();
    let shape = file.shape().to_vec();
    let n = shape.iter().product::<u64>() as usize * dtype.num_bytes().unwrap();
    (dtype.descr(), shape, bytes[bytes.len() - n..].to_vec())
}

/// Builds `examples/c/run_model.c` in `work` against the build's libmblob, or `None` (with a
/// message) when there is no C compiler.
fn build_example(work: &Path) -> Option<PathBuf> {
    if !Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: no `cc` on PATH: examples/c/run_model.c not built");
        return None;
    }
    std::fs::create_dir_all(work).unwrap();
    let lib = lib_dir(work);
    let exe = work.join("run_model");
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-I"])
        .arg(repo().join("capi/include"))
        .arg(repo().join("examples/c/run_model.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lmblob")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "cc run_model.c:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(exe)
}

#[test]
fn run_model_example_matches_tvm_goldens() {
    let work = std::env::temp_dir().join(format!("mblob-capi-run-{}", std::process::id()));
    let Some(exe) = build_example(&work) else { return };
    let goldens = repo().join("tests/fixtures/tvm-goldens/run");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(goldens.join("manifest.json")).unwrap()).unwrap();
    let models = manifest["models"].as_object().unwrap();
    let mut ran = Vec::new();
    for (name, m) in models {
        let out_dir = work.join(name);
        std::fs::create_dir_all(&out_dir).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.arg(goldens.join(m["so"].as_str().unwrap()));
        if m["executor"] == "relax" {
            cmd.args(["--function", m["entry"].as_str().unwrap()]);
        }
        for input in m["inputs"].as_array().unwrap() {
            let file = goldens.join(input["file"].as_str().unwrap());
            cmd.arg(format!("{}={}", input["name"].as_str().unwrap(), file.display()));
        }
        cmd.arg("-o").arg(&out_dir);
        let run = cmd.output().unwrap();
        assert!(run.status.success(), "run_model {name}:\n{}", String::from_utf8_lossy(&run.stderr));
        let outputs = m["outputs"].as_array().unwrap();
        for (k, o) in outputs.iter().enumerate() {
            let want = npy(&goldens.join(o["file"].as_str().unwrap()));
            let got = npy(&out_dir.join(format!("out.{k}.npy")));
            assert_eq!(got.0, want.0, "{name} output {k}: dtype");
            assert_eq!(got.1, want.1, "{name} output {k}: shape");
            assert!(got.2 == want.2, "{name} output {k}: bytes differ from TVM's");
        }
        assert!(!out_dir.join(format!("out.{}.npy", outputs.len())).exists(), "{name}: more outputs than TVM's");
        ran.push((name.clone(), m["executor"].as_str().unwrap().to_owned()));
    }
    for kind in ["graph", "aot", "relax"] {
        assert!(ran.iter().any(|(_, e)| e == kind), "no {kind} model among the goldens: {ran:?}");
    }
    assert!(ran.iter().any(|(n, _)| n == "graph_mlp"), "graph_mlp missing from the goldens");
    std::fs::remove_dir_all(&work).ok();
}

/// `run_model --device opencl` on the OpenCL models of `tests/fixtures/device-run` (built by
/// TVM 0.19 and 0.27 for OpenCL; the reference is TVM's run of the same model built for the
/// CPU): within the fixtures' tolerance, `rtol * max(1, max|want|)`. Skipped with a message
/// when no OpenCL device opens, unless `MBLOB_REQUIRE_OPENCL` is set.
#[cfg(feature = "opencl")]
#[test]
fn run_model_example_on_opencl() {
    run_on_device("opencl", &["dev_relax_mlp_opencl", "dev_graph_cnn_opencl"], "MBLOB_REQUIRE_OPENCL");
}

/// The same on CUDA, with TVM 0.27's CUDA models (`sm_80` and `sm_90`; their CUDA source is
/// compiled with NVRTC at load): needs an NVIDIA GPU, its driver and NVRTC (run with
/// `-- --ignored`, NVRTC's folder on `LD_LIBRARY_PATH`).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (sm_80 or newer) with its driver, and NVRTC"]
fn run_model_example_on_cuda() {
    let models = [
        "dev_relax_mlp_cuda_sm80",
        "dev_relax_mlp_cuda_sm90",
        "dev_relax_cnn_cuda_sm90",
        "dev_relax_transformer_cuda_sm90",
    ];
    run_on_device("cuda", &models, "MBLOB_REQUIRE_CUDA");
}

/// Runs the device-run models `names` through the example on `device` and compares them with
/// TVM's CPU outputs within their tolerance; skips (with a message) when the device cannot be
/// opened, unless the environment variable `require` is set.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn run_on_device(device: &str, names: &[&str], require: &str) {
    let work = std::env::temp_dir().join(format!("mblob-capi-{device}-{}", std::process::id()));
    let Some(exe) = build_example(&work) else { return };
    let dir = repo().join("tests/fixtures/device-run");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    for name in names {
        let m = &manifest["models"][name];
        let out_dir = work.join(name);
        std::fs::create_dir_all(&out_dir).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.arg(dir.join(m["so"].as_str().unwrap())).args(["--device", device]);
        if m["executor"] == "relax" {
            cmd.args(["--function", m["entry"].as_str().unwrap()]);
        }
        for input in m["inputs"].as_array().unwrap() {
            let file = dir.join(input["file"].as_str().unwrap());
            cmd.arg(format!("{}={}", input["name"].as_str().unwrap(), file.display()));
        }
        let run = cmd.arg("-o").arg(&out_dir).output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        if !run.status.success() && stderr.contains("(status 7)") && std::env::var_os(require).is_none() {
            eprintln!("SKIPPED: no {device} device ({stderr})");
            return;
        }
        assert!(run.status.success(), "run_model {name} --device {device}:\n{stderr}");
        let rtol = m["rtol"].as_f64().unwrap() as f32;
        for (k, o) in m["outputs"].as_array().unwrap().iter().enumerate() {
            let (want_dtype, want_shape, want) = npy(&dir.join(o["file"].as_str().unwrap()));
            let (dtype, shape, got) = npy(&out_dir.join(format!("out.{k}.npy")));
            assert_eq!((dtype, shape), (want_dtype, want_shape), "{name} output {k}");
            let f =
                |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
            let (got, want) = (f(&got), f(&want));
            let scale = want.iter().fold(1f32, |a, w| a.max(w.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(worst <= rtol * scale, "{name} output {k}: off by {worst} (allowed {})", rtol * scale);
        }
    }
    std::fs::remove_dir_all(&work).ok();
}
