//! The C API's load-side additions, called as a C program would, against TVM's outputs:
//! libraries loaded from memory, DLPack tensors in and out, Relax functions invoked by name with
//! their outputs left on the device (the CPU here, OpenCL on pocl), and the JSON report.
//! Goldens: `tests/fixtures/tvm-goldens/run` (TVM 0.19 and 0.27 models with TVM's inputs and
//! outputs), `tests/fixtures/device-run` (OpenCL models, TVM's CPU outputs), and
//! `tests/fixtures/inspect` (what TVM 0.27 reports about the executable it wrote).

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

#[cfg(any(feature = "opencl", feature = "cuda"))]
use mblob_capi::mblob_status::*;
use mblob_capi::*;

#[path = "support/common.rs"]
mod common;
#[cfg(any(feature = "opencl", feature = "cuda"))]
use common::last_error;
use common::{dl, npy, ok, Npy};

/// One test at a time: the deleter counters below are shared.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn run_dir() -> PathBuf {
    repo().join("tests/fixtures/tvm-goldens/run")
}

#[cfg(any(feature = "opencl", feature = "cuda"))]
fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Dtype, shape and host bytes of a tensor handle.
fn read(t: *const mblob_tensor) -> (mblob_dtype, Vec<i64>, Vec<u8>) {
    let (mut dtype, mut ndim, mut shape, mut data, mut nbytes) =
        (mblob_dtype { code: 0, bits: 0, lanes: 0 }, 0i32, null(), null(), 0usize);
    // SAFETY: a live tensor and valid out-pointers; the shape and data live as long as it.
    unsafe {
        ok(mblob_tensor_dtype(t, &mut dtype), "dtype");
        ok(mblob_tensor_ndim(t, &mut ndim), "ndim");
        ok(mblob_tensor_shape(t, &mut shape), "shape");
        ok(mblob_tensor_data(t, &mut data), "data");
        ok(mblob_tensor_nbytes(t, &mut nbytes), "nbytes");
        (
            dtype,
            std::slice::from_raw_parts(shape, ndim as usize).to_vec(),
            std::slice::from_raw_parts(data.cast::<u8>(), nbytes).to_vec(),
        )
    }
}

/// Asserts tensor `t` is TVM's output `want`, bit for bit.
fn assert_tvm(t: *const mblob_tensor, want: &Npy, what: &str) {
    let (dtype, shape, data) = read(t);
    assert_eq!((dtype.code, dtype.bits, dtype.lanes), (want.code, want.bits, 1), "{what}: dtype");
    assert_eq!(shape, want.shape, "{what}: shape");
    assert!(data == want.data, "{what}: bytes differ from TVM's");
}

fn model_of(lib: *const mblob_library, device_type: i32) -> *mut mblob_model {
    let mut m = null_mut();
    // SAFETY: a live library and a valid out-pointer.
    ok(unsafe { mblob_model_new(lib, device_type, 0, &mut m) }, "mblob_model_new");
    m
}

fn load_memory(bytes: &[u8], name: &str) -> *mut mblob_library {
    let mut lib = null_mut();
    let name = CString::new(name).unwrap();
    // SAFETY: `bytes` is readable for its length; valid strings and out-pointer.
    ok(unsafe { mblob_library_load_memory(bytes.as_ptr().cast(), bytes.len(), name.as_ptr(), &mut lib) }, "load");
    lib
}

/// Runs `model` (with input `x`) and checks output 0 against TVM's.
fn run_x(m: *mut mblob_model, x: &mut Npy, want: &Npy, what: &str) {
    let t = dl(x);
    // SAFETY: a live model, a valid DLTensor over `x`.
    unsafe {
        ok(mblob_model_set_input_dltensor(m, c"x".as_ptr(), 0, &t), what);
        ok(mblob_model_run(m), what);
        let mut y = null_mut();
        ok(mblob_model_output(m, 0, &mut y), what);
        assert_tvm(y, want, what);
        ok(mblob_tensor_free(y), what);
    }
}

/// Libraries loaded from memory (no file) run as TVM ran them: TVM 0.19's graph and Relax
/// models (opened with `dlopen`) and TVM 0.27's Relax model (it imports a TVM runtime function
/// by name, so it opens in mblob's private `dlmopen` namespace), two copies of one library at
/// once, and again after both are freed (each memory file gets its own path, so the loader
/// never hands back an old image).
#[test]
fn libraries_from_memory_run_like_tvm() {
    let _s = serial();
    for name in ["graph_mlp", "relax_mlp_tvm027", "relax_mlp_tvm019"] {
        let bytes = std::fs::read(run_dir().join(format!("{name}.so"))).unwrap();
        let mut x = npy(&run_dir().join(format!("{name}.in.x.npy")));
        let want = npy(&run_dir().join(format!("{name}.out.0.npy")));
        for round in 0..2 {
            let (a, b) = (load_memory(&bytes, name), load_memory(&bytes, name));
            let (ma, mb) = (model_of(a, 1), model_of(b, 1));
            // SAFETY: live libraries, freed once; the models keep what they need.
            unsafe {
                ok(mblob_library_free(a), "free");
                ok(mblob_library_free(b), "free");
            }
            run_x(ma, &mut x, &want, &format!("{name} (copy 1, round {round})"));
            run_x(mb, &mut x, &want, &format!("{name} (copy 2, round {round})"));
            // SAFETY: live models, freed once.
            unsafe {
                ok(mblob_model_free(ma), "free");
                ok(mblob_model_free(mb), "free");
            }
        }
    }
    // The memory file lives as long as the library: open while a model holds it, closed after.
    let memfds = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().contains("memfd:graph_mlp"))
            .count()
    };
    let before = memfds();
    let bytes = std::fs::read(run_dir().join("graph_mlp.so")).unwrap();
    let lib = load_memory(&bytes, "graph_mlp");
    let m = model_of(lib, 1);
    // SAFETY: a live library, freed once.
    ok(unsafe { mblob_library_free(lib) }, "free");
    assert_eq!(memfds(), before + 1, "the memory file is open while the model holds the library");
    // SAFETY: a live model, freed once.
    ok(unsafe { mblob_model_free(m) }, "free");
    assert_eq!(memfds(), before, "the memory file is closed with the library");

    // A library from memory and then a different one: each runs its own code.
    let two = std::fs::read(run_dir().join("graph_two_outputs.so")).unwrap();
    let lib = load_memory(&two, "graph_two_outputs");
    let m = model_of(lib, 1);
    let mut x = npy(&run_dir().join("graph_two_outputs.in.x.npy"));
    let t = dl(&mut x);
    // SAFETY: live handles, valid pointers.
    unsafe {
        ok(mblob_model_set_input_dltensor(m, null(), 0, &t), "set");
        ok(mblob_model_run(m), "run");
        let mut n = 0;
        ok(mblob_model_num_outputs(m, &mut n), "num_outputs");
        assert_eq!(n, 2);
        for k in 0..2 {
            let mut y = null_mut();
            ok(mblob_model_output(m, k, &mut y), "output");
            assert_tvm(y, &npy(&run_dir().join(format!("graph_two_outputs.out.{k}.npy"))), "graph_two_outputs");
            ok(mblob_tensor_free(y), "free");
        }
        ok(mblob_model_free(m), "free");
        ok(mblob_library_free(lib), "free");
    }
}

static DELETED: AtomicUsize = AtomicUsize::new(0);

/// A managed tensor over a leaked copy of an `.npy`'s data, whose deleter counts its calls.
#[repr(C)]
struct Owned {
    managed: mblob_dl_managed_tensor,
    _data: Vec<u8>,
    _shape: Vec<i64>,
}

unsafe extern "C" fn count_deleter(t: *mut mblob_dl_managed_tensor) {
    DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: made by `managed` below as the first field of a boxed `Owned`, deleted once.
    drop(unsafe { Box::from_raw(t.cast::<Owned>()) });
}

fn managed(n: &Npy) -> *mut mblob_dl_managed_tensor {
    let mut o = Box::new(Owned {
        managed: mblob_dl_managed_tensor {
            dl_tensor: mblob_dl_tensor {
                data: null_mut(),
                device: mblob_dl_device { device_type: 1, device_id: 0 },
                ndim: n.shape.len() as i32,
                dtype: mblob_dtype { code: n.code, bits: n.bits, lanes: 1 },
                shape: null_mut(),
                strides: null_mut(),
                byte_offset: 0,
            },
            manager_ctx: null_mut(),
            deleter: Some(count_deleter),
        },
        _data: n.data.clone(),
        _shape: n.shape.clone(),
    });
    o.managed.dl_tensor.data = o._data.as_mut_ptr().cast();
    o.managed.dl_tensor.shape = o._shape.as_mut_ptr();
    Box::into_raw(o).cast()
}

/// DLPack both ways on TVM 0.19's graph model and TVM 0.27's Relax model: a managed input is
/// used in place and its deleter runs once, when the model lets it go; an output handed out as
/// a managed tensor holds TVM's output, outlives its tensor handle and model, and frees with
/// its deleter.
#[test]
fn dlpack_in_and_out_match_tvm() {
    let _s = serial();
    for name in ["graph_mlp", "relax_mlp_tvm027"] {
        let mut lib = null_mut();
        let path = CString::new(run_dir().join(format!("{name}.so")).to_str().unwrap()).unwrap();
        // SAFETY: a valid path and out-pointer.
        ok(unsafe { mblob_library_load(path.as_ptr(), &mut lib) }, "load");
        let m = model_of(lib, 1);
        let x = npy(&run_dir().join(format!("{name}.in.x.npy")));
        let want = npy(&run_dir().join(format!("{name}.out.0.npy")));
        let before = DELETED.load(Ordering::SeqCst);
        // SAFETY: live handles; the managed tensor is handed over.
        let out = unsafe {
            ok(mblob_model_set_input_dlpack(m, c"x".as_ptr(), 0, managed(&x)), name);
            ok(mblob_model_run(m), name);
            let mut y = null_mut();
            ok(mblob_model_output_device(m, 0, &mut y), name);
            assert_tvm(y, &want, name);
            let mut out = null_mut();
            ok(mblob_tensor_to_dlpack(y, &mut out), name);
            ok(mblob_tensor_free(y), name);
            // A new input replaces the managed one: its deleter runs (a graph model copied it
            // into its input at once and let it go already).
            ok(mblob_model_set_input_dlpack(m, c"x".as_ptr(), 0, managed(&x)), name);
            ok(mblob_model_free(m), name);
            ok(mblob_library_free(lib), name);
            out
        };
        assert_eq!(DELETED.load(Ordering::SeqCst) - before, 2, "{name}: each managed input deleted once");
        // SAFETY: `out` is a managed tensor mblob handed out, read then deleted once.
        unsafe {
            let t = &(*out).dl_tensor;
            assert_eq!((t.device.device_type, t.dtype.code, t.dtype.bits), (1, want.code, want.bits));
            assert!(t.strides.is_null() && t.byte_offset == 0);
            assert_eq!(std::slice::from_raw_parts(t.shape, t.ndim as usize), &want.shape[..], "{name}");
            let data = std::slice::from_raw_parts(t.data.cast::<u8>(), want.data.len());
            assert!(data == &want.data[..], "{name}: DLPack output differs from TVM's");
            ((*out).deleter.unwrap())(out);
        }
    }
}

/// `mblob_model_invoke` calls a Relax function by name on DLTensors (TVM 0.19 and 0.27):
/// outputs stay where the function left them (the CPU here), `mblob_model_output` and
/// `mblob_tensor_to_host` copy them, and an output passed back in as a DLTensor view runs the
/// function again.
#[test]
fn invoke_relax_by_name_matches_tvm() {
    let _s = serial();
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let mut lib = null_mut();
        let path = CString::new(run_dir().join(format!("{name}.so")).to_str().unwrap()).unwrap();
        // SAFETY: a valid path and out-pointer.
        ok(unsafe { mblob_library_load(path.as_ptr(), &mut lib) }, "load");
        let m = model_of(lib, 1);
        let mut x = npy(&run_dir().join(format!("{name}.in.x.npy")));
        let want = npy(&run_dir().join(format!("{name}.out.0.npy")));
        let t = dl(&mut x);
        let inputs = [&t as *const mblob_dl_tensor];
        // SAFETY: live handles and valid pointers.
        unsafe {
            let mut kind = mblob_kind::MBLOB_MODEL_GRAPH;
            ok(mblob_model_kind(m, &mut kind), name);
            assert_eq!(kind, mblob_kind::MBLOB_MODEL_RELAX);
            let mut n = 0;
            ok(mblob_model_num_functions(m, &mut n), name);
            let names: Vec<String> = (0..n)
                .map(|i| {
                    let mut f = null();
                    ok(mblob_model_function_name(m, i, &mut f), name);
                    CStr::from_ptr(f).to_str().unwrap().to_owned()
                })
                .collect();
            assert!(names.iter().any(|f| f == "main"), "{name}: functions {names:?}");
            // The input at a 64-byte boundary (used in place, not copied), then as it lies.
            let mut aligned = vec![0u8; x.data.len() + 64];
            let pad = (64 - aligned.as_ptr() as usize % 64) % 64;
            aligned[pad..pad + x.data.len()].copy_from_slice(&x.data);
            let mut ashape = x.shape.clone();
            let at = mblob_dl_tensor {
                data: aligned.as_mut_ptr().cast(),
                shape: ashape.as_mut_ptr(),
                byte_offset: pad as u64,
                ..t
            };
            ok(mblob_model_invoke(m, c"main".as_ptr(), [&at as *const mblob_dl_tensor].as_ptr(), 1), name);
            let mut first = null_mut();
            ok(mblob_model_output(m, 0, &mut first), name);
            assert_tvm(first, &want, name);
            ok(mblob_tensor_free(first), name);
            ok(mblob_model_invoke(m, c"main".as_ptr(), inputs.as_ptr(), 1), name);
            let mut n = 0;
            ok(mblob_model_num_outputs(m, &mut n), name);
            assert_eq!(n, 1, "{name}");
            let mut y = null_mut();
            ok(mblob_model_output_device(m, 0, &mut y), name);
            let mut dev = mblob_dl_device { device_type: 0, device_id: -1 };
            ok(mblob_tensor_device(y, &mut dev), name);
            assert_eq!((dev.device_type, dev.device_id), (1, 0));
            assert_tvm(y, &want, name);
            let mut host = null_mut();
            ok(mblob_tensor_to_host(y, &mut host), name);
            assert_tvm(host, &want, name);
            let mut copy = null_mut();
            ok(mblob_model_output(m, 0, &mut copy), name);
            assert_tvm(copy, &want, name);
            // The selected function (NULL) is `main`; the inputs of set_input are not used.
            // The input 4 bytes into a buffer (misaligned for TVM's kernels) gives the same.
            let mut shifted = vec![0u8; 4];
            shifted.extend_from_slice(&x.data);
            let mut shape = x.shape.clone();
            let off =
                mblob_dl_tensor { data: shifted.as_mut_ptr().cast(), shape: shape.as_mut_ptr(), byte_offset: 4, ..t };
            ok(mblob_model_invoke(m, null(), [&off as *const mblob_dl_tensor].as_ptr(), 1), name);
            let mut again = null_mut();
            ok(mblob_model_output(m, 0, &mut again), name);
            assert_tvm(again, &want, name);
            for h in [y, host, copy, again] {
                ok(mblob_tensor_free(h), name);
            }
            ok(mblob_model_free(m), name);
            ok(mblob_library_free(lib), name);
        }
    }
}

/// On OpenCL (pocl here): `dev_relax_mlp_opencl` (built by TVM for OpenCL) invoked with a host
/// input keeps its output on the OpenCL device; its host bytes are refused until copied, and
/// the copy is within the fixture's tolerance of TVM's CPU output; its DLPack view and managed
/// tensor point at the same OpenCL memory. Skipped with a message when no OpenCL device opens,
/// unless `MBLOB_REQUIRE_OPENCL` is set.
#[cfg(feature = "opencl")]
#[test]
fn invoke_on_opencl_keeps_outputs_on_the_device() {
    let _s = serial();
    invoke_on_device(4, "dev_relax_mlp_opencl", "MBLOB_REQUIRE_OPENCL");
}

/// The same on CUDA with TVM 0.27's four CUDA models of `tests/fixtures/device-run` (`sm_80`
/// and `sm_90`; their CUDA source is compiled with NVRTC at load): needs an NVIDIA GPU, its
/// driver and NVRTC (run with `-- --ignored`, NVRTC's folder on `LD_LIBRARY_PATH`).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (sm_80 or newer) with its driver, and NVRTC"]
fn invoke_on_cuda_keeps_outputs_on_the_device() {
    let _s = serial();
    for name in [
        "dev_relax_mlp_cuda_sm80",
        "dev_relax_mlp_cuda_sm90",
        "dev_relax_cnn_cuda_sm90",
        "dev_relax_transformer_cuda_sm90",
    ] {
        invoke_on_device(2, name, "MBLOB_REQUIRE_CUDA");
    }
}

/// Invokes the device-run model `name` on the device of DLPack type `device_type` with TVM's
/// input on the host, and checks its output stays on the device and, copied, is within the
/// fixture's tolerance of TVM's CPU output. Skips (with a message) when the device does not
/// open, unless the environment variable `require` is set.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn invoke_on_device(device_type: i32, name: &str, require: &str) {
    let dir = repo().join("tests/fixtures/device-run");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let spec = &manifest["models"][name];
    let mut lib = null_mut();
    let path = CString::new(dir.join(spec["so"].as_str().unwrap()).to_str().unwrap()).unwrap();
    // SAFETY: a valid path and out-pointer.
    ok(unsafe { mblob_library_load(path.as_ptr(), &mut lib) }, "load");
    let mut m = null_mut();
    // SAFETY: a live library and a valid out-pointer.
    let s = unsafe { mblob_model_new(lib, device_type, 0, &mut m) };
    if s == MBLOB_ERR_DEVICE && std::env::var_os(require).is_none() {
        eprintln!("SKIPPED: no device of type {device_type} ({})", last_error());
        // SAFETY: a live library, freed once.
        unsafe { mblob_library_free(lib) };
        return;
    }
    ok(s, name);
    let input = &spec["inputs"][0];
    let mut x = npy(&dir.join(input["file"].as_str().unwrap()));
    let want = npy(&dir.join(spec["outputs"][0]["file"].as_str().unwrap()));
    let rtol = spec["rtol"].as_f64().unwrap() as f32;
    let function = CString::new(spec["entry"].as_str().unwrap()).unwrap();
    let t = dl(&mut x);
    let check = |got: &[u8], what: &str| {
        let (got, want) = (f32s(got), f32s(&want.data));
        assert_eq!(got.len(), want.len(), "{name} {what}");
        let scale = want.iter().fold(1f32, |a, w| a.max(w.abs()));
        let worst = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(worst <= rtol * scale, "{name} {what}: off by {worst} (allowed {})", rtol * scale);
    };
    // SAFETY: live handles and valid pointers.
    unsafe {
        ok(mblob_model_invoke(m, function.as_ptr(), [&t as *const mblob_dl_tensor].as_ptr(), 1), name);
        let mut y = null_mut();
        ok(mblob_model_output_device(m, 0, &mut y), name);
        let mut dev = mblob_dl_device { device_type: 0, device_id: -1 };
        ok(mblob_tensor_device(y, &mut dev), name);
        assert_eq!((dev.device_type, dev.device_id), (device_type, 0), "{name}: the output stays on the device");
        let mut data = null();
        assert_eq!(mblob_tensor_data(y, &mut data), MBLOB_ERR_STATE);
        assert!(last_error().contains("mblob_tensor_to_host"), "{}", last_error());
        let mut host = null_mut();
        ok(mblob_tensor_to_host(y, &mut host), name);
        let (dtype, shape, bytes) = read(host);
        assert_eq!((dtype.code, dtype.bits, shape), (2, 32, want.shape.clone()), "{name}");
        check(&bytes, "to_host");
        let mut copy = null_mut();
        ok(mblob_model_output(m, 0, &mut copy), name);
        check(&read(copy).2, "mblob_model_output");
        // The device output, viewed as a DLTensor and handed out as DLPack, on the device.
        let mut view = std::mem::zeroed::<mblob_dl_tensor>();
        ok(mblob_tensor_dltensor(y, &mut view), name);
        assert_eq!(view.device.device_type, device_type);
        let mut managed = null_mut();
        ok(mblob_tensor_to_dlpack(y, &mut managed), name);
        assert_eq!((*managed).dl_tensor.device.device_type, device_type);
        assert_eq!((*managed).dl_tensor.data, view.data);
        ((*managed).deleter.unwrap())(managed);
        for h in [y, host, copy] {
            ok(mblob_tensor_free(h), name);
        }
        ok(mblob_model_free(m), name);
        ok(mblob_library_free(lib), name);
    }
}

/// The JSON report of `mblob_inspect` (and of `mblob_inspect_memory` on the file's bytes)
/// says what TVM 0.27 reported about the executable it wrote: the constant pool's length and
/// each tensor constant's pool index, shape and dtype.
#[cfg(feature = "inspect")]
#[test]
fn inspect_reports_what_tvm_wrote() {
    let _s = serial();
    let dir = repo().join("tests/fixtures/inspect");
    let so = dir.join("relax_consts_calls.so");
    let tvm: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("relax_consts_calls.json")).unwrap()).unwrap();
    let path = CString::new(so.to_str().unwrap()).unwrap();
    let bytes = std::fs::read(&so).unwrap();
    let mut reports = Vec::new();
    // SAFETY: valid strings, bytes and out-pointers; each string freed once.
    unsafe {
        let mut s = null_mut();
        ok(mblob_inspect(path.as_ptr(), 0, &mut s), "inspect");
        reports.push(CStr::from_ptr(s).to_str().unwrap().to_owned());
        ok(mblob_string_free(s), "free");
        ok(
            mblob_inspect_memory(bytes.as_ptr().cast::<std::ffi::c_void>(), bytes.len(), c"consts.so".as_ptr(), &mut s),
            "memory",
        );
        reports.push(CStr::from_ptr(s).to_str().unwrap().to_owned());
        ok(mblob_string_free(s), "free");
    }
    for text in &reports {
        let report: serde_json::Value = serde_json::from_str(text).unwrap();
        let relax = &report["modules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["type_key"] == "relax.VMExecutable")
            .unwrap_or_else(|| panic!("no relax.VMExecutable in {text}"))["relax"];
        assert_eq!(relax["constant_pool_len"], tvm["constant_pool_len"]);
        let want = tvm["tensor_constants"].as_array().unwrap();
        let got = relax["constants"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            for key in ["index", "shape", "dtype"] {
                assert_eq!(g[key], w[key], "constant {key}");
            }
        }
    }
}

/// `mblob_library_call` calls a host function of a plain library (TVM's `dso_add_one`:
/// `B = A + 1`) on the caller's DLTensors: the output lands in the caller's memory, equal to
/// TVM's; a function the library lacks and a wrong dtype are typed errors.
#[test]
fn library_call_writes_the_callers_tensors() {
    let _s = serial();
    let g = repo().join("tests/fixtures/tvm-goldens");
    let path = CString::new(g.join("dso_add_one.so").to_str().unwrap()).unwrap();
    let mut a = npy(&g.join("dso_add_one.in.A.npy"));
    let want = npy(&g.join("dso_add_one.out.B.npy"));
    let mut b = Npy { code: want.code, bits: want.bits, shape: want.shape.clone(), data: vec![0u8; want.data.len()] };
    let (ta, tb) = (dl(&mut a), dl(&mut b));
    let args = [&ta as *const mblob_dl_tensor, &tb as *const mblob_dl_tensor];
    let mut lib = null_mut();
    // SAFETY: valid strings, tensors and out-pointers; the library freed once.
    unsafe {
        ok(mblob_library_load(path.as_ptr(), &mut lib), "load");
        let mut ret = -1i64;
        ok(mblob_library_call(lib, c"add_one".as_ptr(), args.as_ptr(), 2, &mut ret), "add_one");
        assert_eq!(ret, 0);
        assert!(b.data == want.data, "B differs from TVM's");
        let s = mblob_library_call(lib, c"nope".as_ptr(), args.as_ptr(), 2, null_mut());
        assert_eq!(s, mblob_status::MBLOB_ERR_NO_MODEL, "{}", common::last_error());
        assert!(common::last_error().contains("nope"), "{}", common::last_error());
        let mut wrong = tb;
        wrong.dtype = mblob_dtype { code: 0, bits: 32, lanes: 1 };
        let bad = [&ta as *const mblob_dl_tensor, &wrong as *const mblob_dl_tensor];
        let s = mblob_library_call(lib, c"add_one".as_ptr(), bad.as_ptr(), 2, null_mut());
        assert_eq!(s, mblob_status::MBLOB_ERR_RUN, "{}", common::last_error());
        ok(mblob_library_free(lib), "free");
    }
}
