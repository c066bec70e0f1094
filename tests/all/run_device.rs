//! `mblob run` on devices: TVM's OpenCL models (`tests/fixtures/device-run`) on pocl with
//! TVM's outputs, the device chosen from the library when `--device` is left out, and typed
//! errors (exit 1) for a device the model was not built for or that mblob cannot run.

use std::path::{Path, PathBuf};
use std::process::Output;

fn device_run() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/device-run")
}

fn mblob(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).output().unwrap()
}

fn read_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    (npy.shape().to_vec(), npy.into_vec::<f32>().unwrap())
}

fn write_f32(path: &Path, data: &[f32]) {
    use npyz::WriterBuilder;
    let mut f = std::fs::File::create(path).unwrap();
    let mut w =
        npyz::WriteOptions::<f32>::new().default_dtype().shape(&[data.len() as u64]).writer(&mut f).begin_nd().unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

/// `got` within `rtol * max(1, max|want|)` of `want` (the fixtures' rule: device kernels sum
/// in another order than TVM's CPU build).
fn assert_close(got: &Path, want: &Path, rtol: f32) {
    let ((gs, g), (ws, w)) = (read_f32(got), read_f32(want));
    assert_eq!(gs, ws, "{}", got.display());
    let scale = w.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(worst <= rtol * scale, "{}: off by {worst}", got.display());
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn opencl_models_run_on_the_device_the_library_names() {
    let d = device_run();
    let out = tempfile::tempdir().unwrap();
    // Graph model, no --device: the library holds OpenCL code, so OpenCL it is (said on stderr).
    let o = mblob(&[
        "run",
        d.join("dev_graph_cnn_opencl.so").to_str().unwrap(),
        "--input",
        &format!("x={}", d.join("dev_graph_cnn_opencl.in.x.npy").display()),
        "-o",
        out.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("running on opencl:0"), "{}", text(&o));
    assert_close(&out.path().join("out.0.npy"), &d.join("dev_graph_cnn_opencl.out.0.npy"), 1e-4);

    // Relax model with a symbolic length, its second case, on an explicit device, timed.
    let out2 = out.path().join("relax");
    let o = mblob(&[
        "run",
        d.join("dev_relax_transformer_opencl.so").to_str().unwrap(),
        "--device",
        "opencl:0",
        "--function",
        "forward",
        "--input",
        d.join("dev_relax_transformer_opencl.case2.in.x.npy").to_str().unwrap(),
        "--repeat",
        "2",
        "-o",
        out2.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("2 runs"), "{}", text(&o));
    assert_close(&out2.join("out.0.npy"), &d.join("dev_relax_transformer_opencl.case2.out.0.npy"), 1e-4);
}

/// A plain library TVM built for OpenCL (`tvm.build`, 1024-element vector add): its host
/// function called on the device with device arrays.
#[test]
fn opencl_host_function_of_a_plain_library() {
    let so = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens/device/opencl_vector_add.so");
    let dir = tempfile::tempdir().unwrap();
    let a: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..1024).map(|i| 3.0 - i as f32).collect();
    let (pa, pb) = (dir.path().join("a.npy"), dir.path().join("b.npy"));
    write_f32(&pa, &a);
    write_f32(&pb, &b);
    let out = dir.path().join("out");
    let o = mblob(&[
        "run",
        so.to_str().unwrap(),
        "--function",
        "vector_add",
        "--input",
        &format!("A={}", pa.display()),
        "--input",
        &format!("B={}", pb.display()),
        "--output",
        "C=float32[1024]",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (_, c) = read_f32(&out.join("out.0.npy"));
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(c, want);
}

#[test]
fn wrong_and_unsupported_devices_exit_1_naming_the_device() {
    let d = device_run();
    let x = d.join("dev_relax_mlp_opencl.in.x.npy");
    let so = d.join("dev_relax_mlp_opencl.so");
    for dev in ["cuda", "cpu"] {
        let o = mblob(&[
            "run",
            so.to_str().unwrap(),
            "--device",
            dev,
            "--function",
            "forward",
            "--input",
            x.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let want = format!("not supported on {dev}:0");
        assert!(text(&o).contains(&want) && text(&o).contains("built for opencl"), "{}", text(&o));
    }
    // Metal and WebGPU code loads and inspects but does not run: a typed error, exit 1.
    let g = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens/device");
    for (lib, dev) in [("metal_vector_add.so", "metal:0"), ("webgpu_vector_add.so", "webgpu:0")] {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.npy");
        write_f32(&a, &[0.0; 1024]);
        let spec = format!("A={}", a.display());
        let o = mblob(&[
            "run",
            g.join(lib).to_str().unwrap(),
            "--function",
            "vector_add",
            "--input",
            &spec,
            "--input",
            &spec,
            "--output",
            "C=float32[1024]",
        ]);
        assert_eq!(o.status.code(), Some(1), "{lib}: {}", text(&o));
        assert!(text(&o).contains(&format!("not supported on {dev}")), "{lib}: {}", text(&o));
    }
    // A device name that is none: a usage error.
    let o = mblob(&["run", so.to_str().unwrap(), "--device", "tpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("`tpu` is not a device"), "{}", text(&o));
}
