//! `mblob demo`: the main job end to end. Builds a real multi-module library (host code in
//! TVM's packed-function convention of the chosen layout, a CUDA kernel, a graph-factory root
//! whose node names the host code), exports `deploy.so`, inspects it, loads it back, calls the
//! host code with the safe `mblob_runtime::exec::call`, and launches the kernel when a GPU is
//! present.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use mblob_runtime::exec::{call, Value};
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::device::{DeviceModule, FunctionInfo};
use mblob_runtime::payload::graph::{GraphExecutorFactory, Tensor};
use mblob_runtime::{load_library, Device, Layout, LoadOptions, NdArray, Registry};

mod parts;

use super::inspect::parse_layout;
use crate::export::{Backend, Export};
use crate::inspect::{inspect_path, render_text};
use crate::{Error, Result};
use parts::{Convention, HOST_ADD, HOST_DOT, KERNEL_NAME, VECTOR_ADD_PTX};

/// Arguments of `mblob demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Keep the outputs in this directory (default: a temporary directory, removed after).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Blob layout of `deploy.so`.
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout, default_value = "classic")]
    pub layout: Layout,
    /// How the blob gets into the library (`direct`, the default, `llvm`, `c`, `c-tvm`).
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<Backend>,
}

const N: usize = 1000;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const BLOCK: u64 = 256;

/// The graph of the demo model: `out = a + b` over two parameters.
const GRAPH_JSON: &str = r#"{"nodes": [{"op": "null", "name": "a", "inputs": []}, {"op": "null", "name": "b", "inputs": []}, {"op": "tvm_op", "name": "add", "attrs": {"func_name": "mblob_demo_add", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}, "inputs": [[0, 0, 0], [1, 0, 0]]}], "arg_nodes": [0, 1], "heads": [[2, 0, 0]], "node_row_ptr": [0, 1, 2, 3], "attrs": {"dltype": ["list_str", ["float32", "float32", "float32"]], "shape": ["list_shape", [[1000], [1000], [1000]]], "storage_id": ["list_int", [0, 1, 2]]}}"#;

fn step(n: u32, what: &str) {
    println!("\n[{n}] {what}");
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs the demo; fails when any check fails.
pub fn run(args: &DemoArgs) -> Result<ExitCode> {
    let start = Instant::now();
    let temp = tempfile::Builder::new().prefix("mblob-demo-").tempdir().map_err(Error::io("<tmp>", "cannot create"))?;
    let dir = args.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir, "cannot create"))?;
    let so = dir.join("deploy.so");

    step(1, "build the module tree");
    let a: Vec<f32> = (0..N).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..N).map(|i| 1000.0 - i as f32).collect();
    let tensor = |v: &[f32]| Tensor::new(DataType::F32, vec![N as i64], f32_bytes(v)).expect("sizes agree");
    let factory =
        GraphExecutorFactory::new(GRAPH_JSON, vec![("a".into(), tensor(&a)), ("b".into(), tensor(&b))], "default");
    let kernel = FunctionInfo::new(
        "",
        vec![DataType::HANDLE, DataType::HANDLE, DataType::HANDLE, DataType { code: 1, bits: 32, lanes: 1 }],
        vec!["blockIdx.x".into(), "threadIdx.x".into()],
    );
    let cuda = DeviceModule::cuda_from_ptx(VECTOR_ADD_PTX.as_bytes().to_vec(), vec![(KERNEL_NAME.into(), kernel)]);
    let mut export = Export::new();
    let host = export.host();
    let root = export.tree_mut().add_payload(factory);
    export.tree_mut().set_root(root).import(root, host);
    export.import(cuda);
    add_host_code(&mut export, &dir, Convention::of(args.layout))?;
    println!("    GraphExecutorFactory (params a, b: float32[{N}])");
    println!("    └── host library: {HOST_ADD}, {HOST_DOT} ({})", host_origin());
    println!("        └── cuda: {KERNEL_NAME} (PTX, {} bytes)", VECTOR_ADD_PTX.len());

    step(2, "export deploy.so (serialize, pack, link)");
    export.layout(args.layout);
    if let Some(backend) = args.backend {
        export.backend(backend);
    }
    let report = export.write(&so)?;
    for (stage, secs) in &report.stages {
        println!("    {stage:<9} {:>8.1} ms", secs * 1000.0);
    }
    println!(
        "    wrote {} ({} bytes, blob {} bytes under {})",
        so.display(),
        file_len(&so),
        report.blob_len,
        report.symbol.as_deref().unwrap_or("-")
    );

    step(3, "inspect it (reads the ELF file, runs nothing)");
    for line in render_text(&inspect_path(&so, &Default::default())?).lines() {
        println!("    {line}");
    }

    step(4, "load it back (dlopen, rebuild the tree, run the loaders)");
    // SAFETY: the library was just linked from the demo's own host code and blob.
    #[allow(unsafe_code)]
    let loaded = unsafe { load_library(&so, &Registry::default(), &LoadOptions::default()) }?;
    for line in loaded.render().lines() {
        println!("    {line}");
    }
    let factory = loaded.find::<GraphExecutorFactory>().ok_or_else(|| check_failed("no graph factory at the root"))?;
    let pa = factory.param("a").and_then(Tensor::to_f32).ok_or_else(|| check_failed("param a"))?;
    let pb = factory.param("b").and_then(Tensor::to_f32).ok_or_else(|| check_failed("param b"))?;
    if pa != a || pb != b {
        return Err(check_failed("params differ from what was packed"));
    }
    println!("    params a, b read back from the blob: {} floats each, equal to what was packed", pa.len());

    step(5, "call the host code (TVM's packed-function convention, through exec::call)");
    let fail = |e: mblob_runtime::exec::ExecError| check_failed(&e.to_string());
    let array = |v: &[f32]| NdArray::from_f32(v, &[N as i64], Device::cpu(0)).map_err(|e| check_failed(&e.to_string()));
    let out = NdArray::empty(&[N as i64], DataType::F32, Device::cpu(0)).map_err(|e| check_failed(&e.to_string()))?;
    let mut call_args = [Value::Tensor(array(&pa)?), Value::Tensor(array(&pb)?), Value::Tensor(out.clone())];
    call(&loaded, HOST_ADD, &mut call_args).map_err(fail)?;
    let sum = out.to_f32().map_err(|e| check_failed(&e.to_string()))?.unwrap_or_default();
    let d = match call(&loaded, HOST_DOT, &mut call_args[..2]).map_err(fail)? {
        Value::Float(d) => d as f32,
        other => return Err(check_failed(&format!("{HOST_DOT} returned a {}, not a float", other.kind()))),
    };
    let expected: Vec<f32> = pa.iter().zip(&pb).map(|(x, y)| x + y).collect();
    let expected_dot: f32 = pa.iter().zip(&pb).fold(0.0, |acc, (x, y)| acc + x * y);
    if sum != expected || d != expected_dot {
        return Err(check_failed("host results differ from the expected values"));
    }
    println!("    {HOST_ADD}(a, b, out): out = [{}, {}, ..., {}]: correct", sum[0], sum[1], sum[N - 1]);
    println!("    {HOST_DOT}(a, b) = {d}: correct");
    // A wrong call is refused by the function itself, with its own message.
    match call(&loaded, HOST_DOT, &mut call_args[..1]) {
        Err(e) if e.to_string().contains("takes two float32 vectors") => println!("    {HOST_DOT}(a) is refused: {e}"),
        other => return Err(check_failed(&format!("{HOST_DOT}(a) was not refused as it should be: {other:?}"))),
    }

    step(6, "launch the CUDA kernel");
    launch_kernel(&loaded, &pa, &pb, &expected)?;

    println!("\ndemo finished in {:.2} s: all checks passed", start.elapsed().as_secs_f64());
    if args.dir.is_some() {
        println!("outputs kept in {}", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn check_failed(what: &str) -> Error {
    Error::Run { what: "demo check".into(), detail: what.into() }
}

fn file_len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

#[cfg(feature = "llvm")]
fn host_origin() -> &'static str {
    "generated with inkwell"
}

#[cfg(not(feature = "llvm"))]
fn host_origin() -> &'static str {
    "compiled from C"
}

#[cfg(feature = "llvm")]
fn add_host_code(export: &mut Export, _dir: &std::path::Path, conv: Convention) -> Result<()> {
    let ctx = inkwell::context::Context::create();
    let module = parts::host_llvm_module(&ctx, conv)?;
    export.inkwell_module(&module)?;
    Ok(())
}

#[cfg(not(feature = "llvm"))]
fn add_host_code(export: &mut Export, dir: &std::path::Path, conv: Convention) -> Result<()> {
    let src = dir.join("demo_host.c");
    std::fs::write(&src, parts::host_c_source(conv)).map_err(Error::io(&src, "cannot write"))?;
    export.c_source(src);
    Ok(())
}

#[cfg(feature = "cuda")]
fn launch_kernel(loaded: &mblob_runtime::LoadedTree, a: &[f32], b: &[f32], expected: &[f32]) -> Result<()> {
    use mblob_runtime::device::cuda::CudaModule;
    use mblob_runtime::exec::call::call_device_kernel;
    let cuda = loaded.find::<CudaModule>().ok_or_else(|| check_failed("no cuda module in the loaded tree"))?;
    if !CudaModule::driver_present() {
        // The tree loaded without a driver; using the kernel says why it cannot run.
        let err = cuda.ensure_loaded().err().map(|e| e.to_string()).unwrap_or_default();
        println!("    no GPU here: {err}");
        println!("    (the cuda module loaded and is inspectable; the launch is skipped)");
        return Ok(());
    }
    // The normal path: tensors on the device, and the kernel called by name as host code calls
    // it (its buffers, `n`, then the launch extents), on the current CUDA device.
    let gpu = Device::cuda(0);
    let fail = |e: mblob_runtime::array::ArrayError| check_failed(&e.to_string());
    let shape = [N as i64];
    let da = NdArray::from_f32(a, &shape, gpu).map_err(fail)?;
    let db = NdArray::from_f32(b, &shape, gpu).map_err(fail)?;
    let dout = NdArray::empty(&shape, DataType::F32, gpu).map_err(fail)?;
    mblob_runtime::device::api::set_current_device(gpu);
    let grid = (N as u64).div_ceil(BLOCK);
    let mut args = [
        Value::Tensor(da),
        Value::Tensor(db),
        Value::Tensor(dout.clone()),
        Value::Int(N as i64),
        Value::Int(grid as i64),
        Value::Int(BLOCK as i64),
    ];
    call_device_kernel(loaded, KERNEL_NAME, &mut args).map_err(|e| check_failed(&e.to_string()))?;
    let got = dout.to_f32().map_err(fail)?.unwrap_or_default();
    if got != expected {
        return Err(check_failed("GPU results differ from the host's"));
    }
    println!("    {KERNEL_NAME}<<<{grid}, {BLOCK}>>> on {}: {N} sums equal the host's", cuda.device_name()?);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn launch_kernel(_: &mblob_runtime::LoadedTree, _: &[f32], _: &[f32], _: &[f32]) -> Result<()> {
    println!("    this build has no `cuda` feature: the kernel stays an inspectable payload");
    Ok(())
}
