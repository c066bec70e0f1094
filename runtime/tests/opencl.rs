//! The OpenCL device API and OpenCL modules on a real OpenCL device (pocl runs OpenCL on the
//! CPU: Debian `pocl-opencl-icd` with `ocl-icd-libopencl1`).
//!
//! Without an OpenCL device each test prints `skipped: no OpenCL device (...)` and passes,
//! unless `MBLOB_REQUIRE_OPENCL` is set (as CI sets it where pocl is installed), which turns the
//! skip into a failure.
#![cfg(feature = "opencl")]

use std::sync::Arc;

use mblob_runtime::device::opencl::{OpenClApi, OpenClModule};
use mblob_runtime::device::{device_api, DeviceApi, Storage};
use mblob_runtime::ffi::Value;
use mblob_runtime::format::DataType;
use mblob_runtime::payload::device::{DeviceModule, FunctionInfo, DYN_SHARED_MEMORY_TAG};
use mblob_runtime::{Device, DeviceError, Module, NdArray};

#[path = "support/opencl_device.rs"]
mod opencl_device;
use opencl_device::opencl_api as opencl;

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn types(names: &[&str]) -> Vec<DataType> {
    names.iter().map(|n| DataType::parse(n).unwrap()).collect()
}

/// A module of `source` with one kernel per `(name, arg types, launch tags)`.
fn module(source: &str, kernels: &[(&str, &[&str], &[&str])]) -> OpenClModule {
    let functions = kernels
        .iter()
        .map(|(name, args, tags)| {
            (name.to_string(), FunctionInfo::new(*name, types(args), tags.iter().map(|t| t.to_string()).collect()))
        })
        .collect();
    OpenClModule::new(DeviceModule::new("opencl", "cl", functions, source.as_bytes().to_vec()))
}

/// Calls kernel `name` of `m` as host code does.
fn launch(m: &OpenClModule, name: &str, args: &[Value]) -> Result<(), String> {
    let f = m.get_function(name).expect("kernel in the function table");
    assert_eq!(f.abi(), None, "a Rust function");
    // SAFETY: a Rust function (the module's launcher); the handles passed are `cl_mem`s of
    // live tensors (or deliberately wrong ones, which the module refuses before the driver).
    unsafe { f.call(args) }.map(|_| ()).map_err(|e| e.message)
}

fn handle(a: &NdArray) -> Value {
    Value::Handle(a.dl_tensor().data)
}

const ADD_ONE: &str = "__kernel void add_one(__global float* restrict A, __global float* restrict B, int n) {
  int i = get_group_id(0) * get_local_size(0) + get_local_id(0);
  if (i < n) B[i] = A[i] + 1.0f;
}
";

#[test]
fn memory_round_trips_views_and_bounds() {
    let Some(api) = opencl() else { return };
    assert!(!api.name().is_empty());
    assert_eq!(api.device(), Device::opencl(0));
    let before = api.transfers();

    let s = Storage::with_api(api.clone(), 16384).unwrap();
    let data: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
    s.write(0, &data).unwrap();
    let mut back = vec![0u8; 16384];
    s.read(0, &mut back).unwrap();
    assert_eq!(back, data);

    // A view at an aligned offset, and a view of that view (made of the root buffer).
    let v = s.view(8192, 4096).unwrap();
    let mut part = vec![0u8; 4096];
    v.read(0, &mut part).unwrap();
    assert_eq!(part, data[8192..12288]);
    let vv = v.view(2048, 1024).unwrap();
    let mut small = vec![0u8; 1024];
    vv.read(0, &mut small).unwrap();
    assert_eq!(small, data[10240..11264]);
    vv.write(0, &[7u8; 1024]).unwrap();
    s.read(10240, &mut small).unwrap();
    assert_eq!(small, [7u8; 1024]);
    // An empty view.
    assert_eq!(s.view(16384, 0).unwrap().nbytes(), 0);

    // A view at an offset the device cannot start a sub-buffer at.
    let err = s.view(4, 16).unwrap_err();
    assert!(matches!(err, DeviceError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("CL_DEVICE_MEM_BASE_ADDR_ALIGN"), "{err}");

    // Out of bounds, through the storage and straight at the API.
    assert!(matches!(s.write(16380, &[0; 8]), Err(DeviceError::OutOfBounds { offset: 16380, end: 16388, .. })));
    assert!(matches!(v.read(4090, &mut [0; 8]), Err(DeviceError::OutOfBounds { size: 4096, .. })));
    // SAFETY: deliberately outside the allocation: the API checks and refuses.
    let err = unsafe { api.copy_from_host(s.ptr(), 16383, &[1, 2]) }.unwrap_err();
    assert!(matches!(err, DeviceError::OutOfBounds { size: 16384, .. }), "{err}");
    // SAFETY: not a buffer of the device: the API refuses it.
    let err = unsafe { api.copy_to_host(mblob_runtime::device::DevicePtr(0x10), 0, &mut [0; 4]) };
    assert!(matches!(err, Err(DeviceError::Driver { .. })), "{err:?}");

    // Copies within the device, overlapping ones included.
    let t = Storage::with_api(api.clone(), 16384).unwrap();
    s.copy_to(0, &t, 0, 16384).unwrap();
    let mut tb = vec![0u8; 16384];
    t.read(0, &mut tb).unwrap();
    s.read(0, &mut back).unwrap();
    assert_eq!(tb, back);
    let head = t.view(0, 8192).unwrap();
    let tail = t.view(4096, 8192).unwrap();
    head.copy_to(0, &tail, 0, 8192).unwrap();
    t.read(0, &mut tb).unwrap();
    assert_eq!(tb[4096..12288], back[0..8192]);
    assert_eq!(tb[0..4096], back[0..4096]);

    let d = api.transfers() - before;
    assert!(d.host_to_device >= 2 && d.device_to_host >= 6, "{d:?}");
    assert!(d.device_to_device >= 2, "{d:?}");
}

#[test]
fn transfers_are_counted_exactly() {
    let Some(api) = opencl() else { return };
    // The counters are per device and other tests run at once: count on a private buffer and
    // check only the differences this test must have made at least.
    let before = api.transfers();
    let a = NdArray::empty(&[256], DataType::F32, Device::opencl(0)).unwrap();
    a.copy_from_bytes(&bytes(&[1.5; 256])).unwrap();
    assert_eq!(a.to_f32().unwrap().unwrap(), vec![1.5; 256]);
    let d = api.transfers() - before;
    assert!(d.host_to_device >= 1 && d.host_to_device_bytes >= 1024, "{d:?}");
    assert!(d.device_to_host >= 1 && d.device_to_host_bytes >= 1024, "{d:?}");
}

#[test]
fn devices_out_of_range_and_big_allocations_are_refused() {
    let Some(api) = opencl() else {
        let err = device_api(Device::opencl(99)).unwrap_err();
        assert!(matches!(err, DeviceError::NoDriver { .. } | DeviceError::NoDevice { .. }), "{err}");
        return;
    };
    let count = OpenClApi::device_count().unwrap();
    assert!(count >= 1);
    match device_api(Device::opencl(99)) {
        Err(DeviceError::NoDevice { available, .. }) => assert_eq!(available, count),
        other => panic!("expected NoDevice, got {other:?}"),
    }
    assert!(matches!(api.alloc(usize::MAX / 2), Err(DeviceError::OutOfMemory { .. })));
    // The same instance through both doors.
    let shared = OpenClApi::shared(Device::opencl(0)).unwrap();
    let as_dyn: Arc<dyn DeviceApi> = shared.clone();
    assert!(std::ptr::addr_eq(Arc::as_ptr(&as_dyn), Arc::as_ptr(&api)));
    assert!(shared.base_alignment() >= 1 && shared.max_alloc_size() > 0);
}

#[test]
fn workspace_blocks_are_reused() {
    let Some(api) = opencl() else { return };
    let a = api.alloc_workspace(1000).unwrap();
    api.free_workspace(a).unwrap();
    let b = api.alloc_workspace(1000).unwrap();
    assert_eq!(a, b);
    api.free_workspace(b).unwrap();
    assert!(api.free_workspace(b).is_err(), "freed twice");
}

#[test]
fn a_kernel_runs_through_its_packed_function() {
    let Some(_api) = opencl() else { return };
    let m = module(ADD_ONE, &[("add_one", &["handle", "handle", "int32"], &["blockIdx.x", "threadIdx.x"])]);
    let n: i64 = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let a = NdArray::from_f32(&x, &[n], Device::opencl(0)).unwrap();
    let b = NdArray::empty(&[n], DataType::F32, Device::opencl(0)).unwrap();
    let threads = 64;
    let blocks = (n + threads - 1) / threads;
    launch(&m, "add_one", &[handle(&a), handle(&b), Value::Int(n), Value::Int(blocks), Value::Int(threads)]).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
    assert_eq!(b.to_f32().unwrap().unwrap(), want);
    // Again, in place on a view at an aligned offset (a sub-buffer).
    let tail = NdArray::in_storage(a.storage(), 512, &[n - 128], DataType::F32).unwrap();
    launch(
        &m,
        "add_one",
        &[handle(&tail), handle(&tail), Value::Int(n - 128), Value::Int(blocks), Value::Int(threads)],
    )
    .unwrap();
    let got = a.to_f32().unwrap().unwrap();
    assert_eq!(got[..128], x[..128]);
    assert_eq!(got[128..], want[128..]);
    assert!(m.get_function("missing").is_none());
}

#[test]
fn scalars_two_dimensions_and_local_memory() {
    let Some(_api) = opencl() else { return };
    let src = "
__kernel void axpb(__global float* restrict y, __global const float* restrict x, float a, long b, uchar c) {
  int i = get_global_id(0);
  y[i] = a * x[i] + (float)b + (float)c;
}
__kernel void fill2d(__global int* restrict out, int w) {
  int x = get_global_id(0);
  int y = get_global_id(1);
  out[y * w + x] = y * 1000 + x + (int)get_work_dim() * 1000000;
}
__kernel void reverse(__global float* restrict out, __global const float* restrict in, __local float* buf) {
  int l = get_local_id(0);
  int n = get_local_size(0);
  int g = get_group_id(0);
  buf[l] = in[g * n + l];
  barrier(CLK_LOCAL_MEM_FENCE);
  out[g * n + l] = buf[n - 1 - l];
}
";
    let m = module(
        src,
        &[
            ("axpb", &["handle", "handle", "float32", "int64", "uint8"], &["threadIdx.x"]),
            ("fill2d", &["handle", "int32"], &["blockIdx.x", "blockIdx.y", "threadIdx.x"]),
            ("reverse", &["handle", "handle"], &["blockIdx.x", "threadIdx.x", DYN_SHARED_MEMORY_TAG]),
        ],
    );
    let dev = Device::opencl(0);

    let x = NdArray::from_f32(&[1.0, 2.0, 3.0, 4.0], &[4], dev).unwrap();
    let y = NdArray::empty(&[4], DataType::F32, dev).unwrap();
    launch(&m, "axpb", &[handle(&y), handle(&x), Value::Float(2.0), Value::Int(10), Value::Int(3), Value::Int(4)])
        .unwrap();
    assert_eq!(y.to_f32().unwrap().unwrap(), [15.0, 17.0, 19.0, 21.0]);

    let (w, h) = (8i64, 3i64);
    let out = NdArray::empty(&[h, w], DataType::I32, dev).unwrap();
    launch(&m, "fill2d", &[handle(&out), Value::Int(w), Value::Int(w / 4), Value::Int(h), Value::Int(4)]).unwrap();
    let got: Vec<i32> =
        out.to_bytes().unwrap().chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let want: Vec<i32> = (0..h).flat_map(|y| (0..w).map(move |x| 2_000_000 + y as i32 * 1000 + x as i32)).collect();
    assert_eq!(got, want);

    let input: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let a = NdArray::from_f32(&input, &[32], dev).unwrap();
    let r = NdArray::empty(&[32], DataType::F32, dev).unwrap();
    launch(&m, "reverse", &[handle(&r), handle(&a), Value::Int(2), Value::Int(16), Value::Int(16 * 4)]).unwrap();
    let want: Vec<f32> = (0..2).flat_map(|g| (0..16).rev().map(move |l| (g * 16 + l) as f32)).collect();
    assert_eq!(r.to_f32().unwrap().unwrap(), want);
}

#[test]
fn tvm_sections_are_built_one_kernel_at_a_time() {
    let Some(_api) = opencl() else { return };
    // As TVM's codegen writes it: each section declares every kernel and defines its own; a
    // helper defined in both would not build as one program.
    let src = "// Function: twice
__kernel void twice(__global float* restrict a);
__kernel void negate(__global float* restrict a);
float helper(float x) { return x; }
__kernel void twice(__global float* restrict a) { a[get_global_id(0)] = helper(a[get_global_id(0)]) * 2.0f; }

// Function: negate
__kernel void twice(__global float* restrict a);
__kernel void negate(__global float* restrict a);
float helper(float x) { return x; }
__kernel void negate(__global float* restrict a) { a[get_global_id(0)] = -helper(a[get_global_id(0)]); }
";
    let m = module(src, &[("twice", &["handle"], &["threadIdx.x"]), ("negate", &["handle"], &["threadIdx.x"])]);
    let a = NdArray::from_f32(&[1.0, 2.0], &[2], Device::opencl(0)).unwrap();
    launch(&m, "twice", &[handle(&a), Value::Int(2)]).unwrap();
    launch(&m, "negate", &[handle(&a), Value::Int(2)]).unwrap();
    assert_eq!(a.to_f32().unwrap().unwrap(), [-2.0, -4.0]);
}

#[test]
fn bad_sources_formats_and_arguments_are_errors() {
    let Some(_api) = opencl() else { return };
    let dev = Device::opencl(0);
    let a = NdArray::from_f32(&[1.0; 4], &[4], dev).unwrap();

    // A source that does not build: the error carries the compiler's log.
    let broken = module(
        "__kernel void k(__global float* a) { a[0] = undefined_thing_xyz; }",
        &[("k", &["handle"], &["threadIdx.x"])],
    );
    let err = launch(&broken, "k", &[handle(&a), Value::Int(1)]).unwrap_err();
    assert!(err.contains("OpenCL kernel `k`"), "{err}");
    assert!(err.contains("does not build"), "{err}");
    assert!(err.contains("undefined_thing_xyz"), "the build log: {err}");
    // Kept: the second launch fails the same way without building again.
    assert_eq!(launch(&broken, "k", &[handle(&a), Value::Int(1)]).unwrap_err(), err);
    assert!(matches!(broken.build(dev, "k"), Err(DeviceError::Build { .. })));

    let m = module(ADD_ONE, &[("add_one", &["handle", "handle", "int32"], &["blockIdx.x", "threadIdx.x"])]);
    let err = launch(&m, "add_one", &[handle(&a), handle(&a), Value::Int(4), Value::Int(1)]).unwrap_err();
    assert!(err.contains("takes 3 arguments (handle, handle, int32) and 2 launch values"), "{err}");
    assert!(err.contains("4 given"), "{err}");
    let err = launch(&m, "add_one", &[handle(&a), Value::Float(1.0), Value::Int(4), Value::Int(1), Value::Int(4)])
        .unwrap_err();
    assert!(err.contains("argument 1"), "{err}");
    let host = [0f32; 4];
    let stranger = Value::Handle(host.as_ptr().cast_mut().cast());
    let err = launch(&m, "add_one", &[stranger, handle(&a), Value::Int(4), Value::Int(1), Value::Int(4)]).unwrap_err();
    assert!(err.contains("not a buffer of this OpenCL device"), "{err}");
    // An extent of 0 (a dynamic size of 0) leaves its axis at 1, as TVM does.
    launch(&m, "add_one", &[handle(&a), handle(&a), Value::Int(4), Value::Int(0), Value::Int(4)]).unwrap();
    let err =
        launch(&m, "add_one", &[handle(&a), handle(&a), Value::Int(4), Value::Int(-1), Value::Int(4)]).unwrap_err();
    assert!(err.contains("launch value 0"), "{err}");

    // A kernel the function table names but the source lacks.
    let missing = module(ADD_ONE, &[("nope", &["handle"], &["threadIdx.x"])]);
    let err = launch(&missing, "nope", &[handle(&a), Value::Int(1)]).unwrap_err();
    assert!(err.contains("clCreateKernel"), "{err}");

    // Other formats.
    let spirv = OpenClModule::new(DeviceModule::new(
        "opencl",
        "spirv",
        vec![("k".into(), FunctionInfo::new("k", types(&["handle"]), vec!["threadIdx.x".into()]))],
        vec![3, 2, 0x23, 7],
    ));
    let err = launch(&spirv, "k", &[handle(&a), Value::Int(1)]).unwrap_err();
    assert!(err.contains("format `spirv`"), "{err}");
    assert_eq!(spirv.type_key(), "opencl");
    assert!(spirv.as_payload().is_some());
}

#[test]
fn launches_from_many_threads() {
    let Some(_api) = opencl() else { return };
    let m = Arc::new(module(ADD_ONE, &[("add_one", &["handle", "handle", "int32"], &["blockIdx.x", "threadIdx.x"])]));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let x: Vec<f32> = (0..256).map(|i| (i + t * 1000) as f32).collect();
                let a = NdArray::from_f32(&x, &[256], Device::opencl(0)).unwrap();
                let b = NdArray::empty(&[256], DataType::F32, Device::opencl(0)).unwrap();
                for _ in 0..20 {
                    launch(&m, "add_one", &[handle(&a), handle(&b), Value::Int(256), Value::Int(4), Value::Int(64)])
                        .unwrap();
                    launch(&m, "add_one", &[handle(&b), handle(&a), Value::Int(256), Value::Int(4), Value::Int(64)])
                        .unwrap();
                }
                let want: Vec<f32> = x.iter().map(|v| v + 40.0).collect();
                assert_eq!(f32s(&a.to_bytes().unwrap()), want);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}
