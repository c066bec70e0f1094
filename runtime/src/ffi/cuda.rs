//! CUDA payloads on a GPU, through the driver API with cudarc (feature `cuda`).
//!
//! With the feature on, `cuda` payloads load as [`CudaModule`]s (the loader is registered in
//! [`crate::registry`]). Loading a tree never touches the driver: the module keeps its
//! [`DeviceModule`] (which [`Module::as_payload`] returns, so the tree can be packed again, and
//! through which `LoadedTree::find::<DeviceModule>()` finds it as it does without the feature)
//! and loads the image into the driver on first use.
//!
//! First use checks that the driver library (`libcuda`) can be opened before any other
//! cudarc call (cudarc panics when it cannot), creates a context on device 0, checks the image
//! and hands it to `cuModuleLoadData`:
//! - PTX (`fmt` `ptx`, or text): copied with the NUL the driver needs (TVM stores none);
//! - cubin (an ELF file) and fatbin (magic `0xBA55ED50`), whatever `fmt` says, as TVM does:
//!   their headers' sizes and ranges are checked against the payload's length first, since
//!   the driver reads the image from a pointer alone;
//! - CUDA C source (`fmt` `cuda`) needs NVRTC, which mblob does not use: an error.
//!
//! [`CudaModule::launch`] takes the kernel arguments, checked against the function info's
//! `arg_types`, then the thread extents in the order of its `launch_param_tags` (and the
//! dynamic shared memory when tagged), as TVM's packed call does; it waits for the kernel, so
//! its errors come back from the call that caused them. Buffers are [`DeviceBuffer`]s made by
//! the module. A kernel that reads or writes outside its buffers faults on the device and the
//! launch returns the driver's error; the host's memory is not at risk.
//!
//! Every driver error, a missing driver included, is [`Error::Cuda`]. This file is the only
//! one of the crate that calls the CUDA driver.
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::{c_void, CString};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr};

use object::{Object, ObjectSection, ObjectSegment};

use crate::error::{Error, Result};
use crate::format::DataType;
use crate::module::Module;
use crate::payload::device::DeviceModule;
use crate::payload::Payload;

/// A kernel argument for [`CudaModule::launch`]; each must match the kernel's `arg_types`.
#[derive(Debug, Clone, Copy)]
pub enum KernelArg<'a> {
    /// A buffer, for a `handle` argument.
    Buffer(&'a DeviceBuffer),
    /// `int32`.
    I32(i32),
    /// `uint32`.
    U32(u32),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// A raw device pointer, for a `handle` argument (what TVM's host code passes a kernel it
    /// launches through `TVMFuncCall`).
    DevicePtr(u64),
}

impl KernelArg<'_> {
    /// The argument type it stands for, in TVM's spelling.
    fn type_name(&self) -> &'static str {
        match self {
            KernelArg::Buffer(_) | KernelArg::DevicePtr(_) => "handle",
            KernelArg::I32(_) => "int32",
            KernelArg::U32(_) => "uint32",
            KernelArg::I64(_) => "int64",
            KernelArg::F32(_) => "float32",
            KernelArg::F64(_) => "float64",
        }
    }

    /// Bytes the kernel parameter takes.
    fn size(&self) -> usize {
        match self {
            KernelArg::I32(_) | KernelArg::U32(_) | KernelArg::F32(_) => 4,
            KernelArg::Buffer(_) | KernelArg::DevicePtr(_) | KernelArg::I64(_) | KernelArg::F64(_) => 8,
        }
    }
}

/// Device memory made by a [`CudaModule`]. Freed when dropped.
pub struct DeviceBuffer {
    slice: CudaSlice<u8>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.slice.len())
    }
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True when empty (never: buffers have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// Copies the buffer to the host.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        guard("copy to host", || {
            let stream = self.slice.stream();
            let out = stream.clone_dtoh(&self.slice).map_err(|e| format!("copy to host: {e}"))?;
            stream.synchronize().map_err(|e| format!("copy to host: {e}"))?;
            Ok(out)
        })
    }

    /// Copies the buffer to the host as `f32`s (its length must be a multiple of 4).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let bytes = self.to_bytes()?;
        if bytes.len() % 4 != 0 {
            return Err(Error::Cuda(format!("a buffer of {} bytes is not a list of f32", bytes.len())));
        }
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// A CUDA module: the payload, and its image loaded into the driver on first use.
pub struct CudaModule {
    device: DeviceModule,
    loaded: OnceLock<Result<Arc<Loaded>, String>>,
}

impl fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.loaded.get() {
            None => "not loaded",
            Some(Ok(_)) => "loaded",
            Some(Err(_)) => "failed to load",
        };
        f.debug_struct("CudaModule").field("device", &self.device).field("driver", &state).finish()
    }
}

impl CudaModule {
    /// A module for `device` (a `cuda` payload). Nothing is loaded until first use.
    pub fn new(device: DeviceModule) -> CudaModule {
        CudaModule { device, loaded: OnceLock::new() }
    }

    /// The payload.
    pub fn device_module(&self) -> &DeviceModule {
        &self.device
    }

    /// Whether the CUDA driver library can be opened (checked once per process).
    pub fn driver_present() -> bool {
        static PRESENT: OnceLock<bool> = OnceLock::new();
        // SAFETY: `is_culib_present` opens and closes the driver library by its usual names;
        // opening `libcuda` runs its initialisers, which is what using CUDA at all requires.
        *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
    }

    /// Loads the image into the driver now (otherwise the first buffer or launch does).
    pub fn ensure_loaded(&self) -> Result<()> {
        self.loaded().map(|_| ())
    }

    fn loaded(&self) -> Result<&Arc<Loaded>> {
        match self.loaded.get_or_init(|| Loaded::new(&self.device)) {
            Ok(l) => Ok(l),
            Err(e) => Err(Error::Cuda(e.clone())),
        }
    }

    /// The name of the GPU the module runs on.
    pub fn device_name(&self) -> Result<String> {
        let l = self.loaded()?;
        guard("device name", || l.ctx.name().map_err(|e| format!("device name: {e}")))
    }

    /// Copies `host` to a new device buffer.
    pub fn upload(&self, host: &[u8]) -> Result<DeviceBuffer> {
        let l = self.loaded()?;
        if host.is_empty() {
            return Err(Error::Cuda("cannot make an empty device buffer".into()));
        }
        guard("copy to device", || {
            l.ctx.bind_to_thread().map_err(|e| format!("copy to device: {e}"))?;
            let slice = l.stream.clone_htod(host).map_err(|e| format!("copy to device: {e}"))?;
            Ok(DeviceBuffer { slice })
        })
    }

    /// Copies `host` to a new device buffer of `f32`s.
    pub fn upload_f32(&self, host: &[f32]) -> Result<DeviceBuffer> {
        let bytes: Vec<u8> = host.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.upload(&bytes)
    }

    /// A new device buffer of `len` zero bytes.
    pub fn zeros(&self, len: usize) -> Result<DeviceBuffer> {
        let l = self.loaded()?;
        if len == 0 {
            return Err(Error::Cuda("cannot make an empty device buffer".into()));
        }
        guard("allocate", || {
            l.ctx.bind_to_thread().map_err(|e| format!("allocate: {e}"))?;
            let slice = l.stream.alloc_zeros::<u8>(len).map_err(|e| format!("allocate {len} bytes: {e}"))?;
            Ok(DeviceBuffer { slice })
        })
    }

    /// Launches kernel `name` and waits for it. `args` are its arguments (checked against its
    /// `arg_types`), `extents` the thread extents in the order of its `launch_param_tags`, then
    /// the dynamic shared memory in bytes when `tir.use_dyn_shared_memory` is a tag.
    pub fn launch(&self, name: &str, args: &[KernelArg<'_>], extents: &[u64]) -> Result<()> {
        launch_on(&self.device, self.loaded()?, name, args, extents)
    }
}

/// [`CudaModule::launch`] on a loaded image (shared with the packed functions the module
/// offers to host code).
fn launch_on(device: &DeviceModule, l: &Loaded, name: &str, args: &[KernelArg<'_>], extents: &[u64]) -> Result<()> {
    {
        let _span = tracing::debug_span!("cuda_launch", kernel = name).entered();
        let fail = |what: String| Error::Cuda(format!("kernel `{name}`: {what}"));
        let info = device.function(name).ok_or_else(|| {
            let known: Vec<&str> = device.functions.iter().map(|(n, _)| n.as_str()).collect();
            fail(format!("not in the module's function table (it has {known:?})"))
        })?;
        let params = info.launch_params().map_err(|e| fail(e.to_string()))?;
        if params.cooperative || params.programmatic_dependent_launch {
            return Err(fail("cooperative and programmatic dependent launches are not supported".into()));
        }
        let dims = params.dims(extents).map_err(|e| fail(e.to_string()))?;
        check_args(&info.arg_types, args).map_err(fail)?;
        for arg in args {
            if let KernelArg::Buffer(b) = arg {
                if b.slice.context().cu_ctx() != l.ctx.cu_ctx() {
                    return Err(fail("a buffer belongs to another CUDA context".into()));
                }
            }
        }
        let kernel = l.kernel(name, device).map_err(fail)?;
        tracing::debug!(grid = ?dims.grid, block = ?dims.block, shared = dims.dyn_shared_memory, "launch");
        guard("launch", || l.launch(&kernel, args, dims.grid, dims.block, dims.dyn_shared_memory)).map_err(
            |e| match e {
                Error::Cuda(m) => fail(m),
                other => other,
            },
        )
    }
}

impl Module for CudaModule {
    fn type_key(&self) -> &str {
        &self.device.type_key
    }
    /// A kernel, for host code that launches it (`GetFuncFromEnv` + `TVMFuncCall`): its
    /// arguments as the function table types them (device pointers as handles), then the
    /// launch extents (see [`crate::ffi::cuda_packed`]).
    fn get_function(&self, name: &str) -> Option<crate::module::Symbol> {
        let info = self.device.function(name)?.clone();
        let device = self.device.clone();
        let loaded = self.loaded().cloned().map_err(|e| e.to_string());
        let name = name.to_owned();
        Some(crate::ffi::callconv::function_symbol(move |args| {
            let l = loaded.as_ref().map_err(Clone::clone)?;
            let (kargs, extents) = crate::ffi::cuda_packed::kernel_args(&info.arg_types, args)?;
            launch_on(&device, l, &name, &kargs, &extents).map_err(|e| e.to_string())?;
            Ok(crate::ffi::Value::None)
        }))
    }
    fn as_payload(&self) -> Option<&dyn Payload> {
        Some(&self.device)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Checks `args` against a kernel's argument types.
fn check_args(types: &[DataType], args: &[KernelArg<'_>]) -> Result<(), String> {
    if types.len() != args.len() {
        return Err(format!("takes {} arguments ({}), {} given", types.len(), join(types), args.len()));
    }
    for (i, (t, a)) in types.iter().zip(args).enumerate() {
        let want = t.to_string();
        let supported = ["handle", "int32", "uint32", "int64", "float32", "float64"];
        if !supported.contains(&want.as_str()) {
            return Err(format!("argument {i} has type {want}, which cannot be passed to a kernel"));
        }
        if want != a.type_name() {
            return Err(format!("argument {i} must be {want}, {} given", a.type_name()));
        }
    }
    Ok(())
}

fn join(types: &[DataType]) -> String {
    types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// Runs cudarc calls, turning a panic (cudarc panics when the driver lacks a function it
/// loads) into an error.
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(Error::Cuda),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(Error::Cuda(format!("{what}: the CUDA driver library failed: {msg}")))
        }
    }
}

/// The message for a missing driver.
const NO_DRIVER: &str =
    "no CUDA driver found: libcuda could not be loaded (is the NVIDIA driver installed and on the library path?)";

/// A module handle; unloaded when dropped.
struct ModuleHandle {
    module: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a `CUmodule` is a driver handle that may be used from any thread once its context
// is current there; every use binds the context first.
unsafe impl Send for ModuleHandle {}
// SAFETY: as above; the driver's module functions are thread-safe.
unsafe impl Sync for ModuleHandle {}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        let ctx = &self.ctx;
        let module = self.module;
        let _ = guard("unload", || {
            ctx.bind_to_thread().map_err(|e| e.to_string())?;
            // SAFETY: `module` came from `cuModuleLoadData` in this context and is unloaded once,
            // here; the functions taken from it are dropped with it (they live in `Loaded`).
            unsafe { result::module::unload(module) }.map_err(|e| e.to_string())
        });
    }
}

/// A kernel handle from a loaded module.
#[derive(Clone, Copy)]
struct Kernel(sys::CUfunction);

// SAFETY: a `CUfunction` is a driver handle, valid in any thread while its module is loaded;
// it is only used through `Loaded`, which keeps the module.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

/// A kernel found in the loaded image, with its parameters' byte sizes when the driver can
/// tell them (asked once, when the kernel is first looked up).
#[derive(Clone)]
struct FoundKernel {
    kernel: Kernel,
    param_sizes: Option<Vec<usize>>,
}

/// The driver side of a module: context, stream, the loaded image and its kernels.
struct Loaded {
    /// Kernels found in `image` (valid while it is loaded; dropped before it).
    kernels: Mutex<Vec<(String, FoundKernel)>>,
    image: ModuleHandle,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl Loaded {
    fn new(device: &DeviceModule) -> Result<Arc<Loaded>, String> {
        let _span = tracing::debug_span!("cuda_load", format = %device.format, bytes = device.data.len()).entered();
        if !CudaModule::driver_present() {
            return Err(NO_DRIVER.to_owned());
        }
        let image = Image::prepare(&device.format, &device.data)?;
        let loaded = guard("load", || {
            let ctx = CudaContext::new(0).map_err(|e| format!("cannot create a context on device 0: {e}"))?;
            let stream = ctx.default_stream();
            ctx.bind_to_thread().map_err(|e| format!("cannot use the context: {e}"))?;
            // SAFETY: the image is a NUL-terminated PTX text or a cubin/fatbin whose header
            // ranges were checked to lie within the buffer, and the buffer outlives the call
            // (the driver copies what it needs); the context is current on this thread.
            let module = unsafe { result::module::load_data(image.as_ptr()) }
                .map_err(|e| format!("the driver refused the {} image: {e}", image.kind))?;
            let image = ModuleHandle { module, ctx: ctx.clone() };
            Ok(Arc::new(Loaded { kernels: Mutex::new(Vec::new()), image, stream, ctx }))
        });
        loaded.map_err(|e| match e {
            Error::Cuda(m) => m,
            other => other.to_string(),
        })
    }

    /// The kernel called `name` and its parameter sizes, looked up once.
    fn kernel(&self, name: &str, device: &DeviceModule) -> Result<FoundKernel, String> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, k)) = kernels.iter().find(|(n, _)| n == name) {
            return Ok(k.clone());
        }
        let c_name = CString::new(name).map_err(|_| "the name holds a NUL byte".to_owned())?;
        let module = self.image.module;
        let found = guard("find kernel", || {
            self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
            // SAFETY: `module` is loaded (owned by `self.image`) and its context is current.
            unsafe { result::module::get_function(module, c_name) }.map_err(|e| e.to_string())
        });
        let f = found.map_err(|e| {
            let mut msg = format!("not found in the loaded image: {e}");
            if device.format == "ptx" {
                msg.push_str(&ptx_hint(&device.data, name));
            }
            msg
        })?;
        let found = FoundKernel { kernel: Kernel(f), param_sizes: param_sizes(Kernel(f)) };
        kernels.push((name.to_owned(), found.clone()));
        Ok(found)
    }

    /// Launches `kernel` with `args` and waits for it.
    fn launch(
        &self,
        found: &FoundKernel,
        args: &[KernelArg<'_>],
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
    ) -> Result<(), String> {
        self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
        let kernel = found.kernel;
        if let Some(sizes) = &found.param_sizes {
            let given: Vec<usize> = args.iter().map(KernelArg::size).collect();
            if *sizes != given {
                return Err(format!(
                    "the kernel's parameters take {sizes:?} bytes, the function info's arguments {given:?}"
                ));
            }
        }
        // One 8-byte slot per argument, holding its value in its first bytes; the driver reads
        // each parameter (4 or 8 bytes) from the start of its slot.
        let mut guards = Vec::new();
        let mut slots: Vec<u64> = Vec::with_capacity(args.len());
        for arg in args {
            slots.push(match arg {
                KernelArg::Buffer(b) => {
                    let (ptr, sync) = b.slice.device_ptr(&self.stream);
                    guards.push(sync);
                    ptr
                }
                KernelArg::I32(v) => slot4(v.to_ne_bytes()),
                KernelArg::U32(v) => slot4(v.to_ne_bytes()),
                KernelArg::F32(v) => slot4(v.to_ne_bytes()),
                KernelArg::I64(v) => u64::from_ne_bytes(v.to_ne_bytes()),
                KernelArg::F64(v) => u64::from_ne_bytes(v.to_ne_bytes()),
                KernelArg::DevicePtr(p) => *p,
            });
        }
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast::<c_void>()).collect();
        if shared >= OPT_IN_SHARED_MEMORY {
            // Past 48 KiB a kernel must opt in to dynamic shared memory, or the launch fails
            // with an invalid value (TVM's CUDA module sets the same attribute).
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            let bytes = i32::try_from(shared).map_err(|_| format!("{shared} bytes of shared memory is too many"))?;
            // SAFETY: `kernel` is a function of the module `self.image` keeps loaded, and its
            // context is current (bound above).
            unsafe { result::function::set_function_attribute(kernel.0, attr, bytes) }
                .map_err(|e| format!("cannot allow {shared} bytes of dynamic shared memory: {e}"))?;
        }
        let grid = (grid[0], grid[1], grid[2]);
        let block = (block[0], block[1], block[2]);
        // SAFETY: `kernel` belongs to the module `self.image` keeps loaded, in the context made
        // current above. `params` holds one pointer per kernel parameter (the count and sizes
        // were checked against the kernel where the driver can tell them, and against the
        // function info always), each to a live 8-byte slot of `slots`, which outlives the
        // call. Device pointers come from buffers borrowed by `args` for the whole call, and
        // the stream is synchronized below before they can be dropped.
        let launched =
            unsafe { result::launch_kernel(kernel.0, grid, block, shared, self.stream.cu_stream(), &mut params) };
        launched.map_err(|e| format!("launch failed: {e}"))?;
        self.stream.synchronize().map_err(|e| format!("the kernel failed: {e}"))?;
        drop(guards);
        Ok(())
    }
}

/// Dynamic shared memory from which a kernel must opt in
/// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): 48 KiB.
const OPT_IN_SHARED_MEMORY: u32 = 48 << 10;

/// An 8-byte slot whose first 4 bytes are `bytes`.
fn slot4(bytes: [u8; 4]) -> u64 {
    let [a, b, c, d] = bytes;
    u64::from_ne_bytes([a, b, c, d, 0, 0, 0, 0])
}

/// The byte sizes of a kernel's parameters, when the driver can tell (CUDA 12.4 and later).
/// One driver call per parameter: asked once per kernel ([`Loaded::kernel`] keeps the answer).
fn param_sizes(kernel: Kernel) -> Option<Vec<usize>> {
    let mut version = 0;
    // SAFETY: `cuDriverGetVersion` writes one int through a valid pointer.
    let ok = unsafe { sys::cuDriverGetVersion(&mut version) };
    if ok != sys::CUresult::CUDA_SUCCESS || version < 12040 {
        return None;
    }
    let mut sizes = Vec::new();
    // A kernel's parameters take at most 32 KiB, so at most 32768 one-byte parameters.
    for index in 0..32768 {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `kernel` is a live function handle (its module is loaded), and the two
        // out-pointers are valid; an index past the last parameter returns an error.
        let r = unsafe { sys::cuFuncGetParamInfo(kernel.0, index, &mut offset, &mut size) };
        if r != sys::CUresult::CUDA_SUCCESS {
            break;
        }
        sizes.push(size);
    }
    Some(sizes)
}

/// Why a PTX image lacks kernel `name`, when its text tells.
fn ptx_hint(ptx: &[u8], name: &str) -> String {
    let text = String::from_utf8_lossy(ptx);
    let declared = |directive: &str| {
        text.lines().filter_map(|l| l.split_once(directive).map(|(_, rest)| rest)).any(|rest| {
            rest.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',').any(|tok| tok == name)
        })
    };
    let entries = ptx_entries(&text);
    if declared(".func") && !declared(".entry") {
        format!(
            " (the PTX declares `{name}` as a `.func`, a device function, not an `.entry` kernel; \
             kernels in the PTX: {entries:?})"
        )
    } else {
        format!(" (kernels in the PTX: {entries:?})")
    }
}

/// The `.entry` names of a PTX text.
fn ptx_entries(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(".entry").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split(|c: char| c.is_whitespace() || c == '(').find(|t| !t.is_empty()))
        .map(str::to_owned)
        .collect()
}

/// What kind of image a payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageKind {
    Ptx,
    Cubin,
    Fatbin,
}

impl fmt::Display for ImageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageKind::Ptx => "PTX",
            ImageKind::Cubin => "cubin",
            ImageKind::Fatbin => "fatbin",
        })
    }
}

/// Magic of a fatbin's header (`50 ed 55 ba`).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `EM_CUDA`.
const EM_CUDA: u16 = 190;

/// An image checked for the driver, in an 8-byte-aligned buffer with a NUL after it.
#[derive(Debug)]
struct Image {
    words: Vec<u64>,
    kind: ImageKind,
}

impl Image {
    fn prepare(format: &str, data: &[u8]) -> Result<Image, String> {
        // Zero-filled, with room for at least one NUL after the data, and 8-byte aligned (the
        // ELF reader needs its headers aligned).
        let mut words = vec![0u64; data.len() / 8 + 1];
        for (word, chunk) in words.iter_mut().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        let aligned = object::pod::bytes_of_slice(&words).get(..data.len()).unwrap_or_default();
        let kind = if data.starts_with(b"\x7fELF") {
            check_cubin(aligned)?;
            ImageKind::Cubin
        } else if data.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
            check_fatbin(data)?;
            ImageKind::Fatbin
        } else if format == "ptx" || format == "cubin" || format == "fatbin" || format.is_empty() {
            check_ptx(data)?;
            ImageKind::Ptx
        } else if format == "cuda" {
            return Err("the payload is CUDA C source (fmt `cuda`), which needs NVRTC to compile; \
                 mblob loads PTX, cubin and fatbin images"
                .into());
        } else {
            return Err(format!("unknown CUDA image format `{format}`"));
        };
        Ok(Image { words, kind })
    }

    fn as_ptr(&self) -> *const c_void {
        self.words.as_ptr().cast()
    }
}

fn check_ptx(data: &[u8]) -> Result<(), String> {
    let text_end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if let Some(at) = data.get(..text_end).and_then(|t| t.iter().position(|&b| b == 0)) {
        return Err(format!("the PTX text holds a NUL byte at {at}, which would cut it short"));
    }
    if text_end == 0 {
        return Err("the PTX text is empty".into());
    }
    Ok(())
}

fn le_u16(data: &[u8], at: u64) -> Option<u16> {
    let at = usize::try_from(at).ok()?;
    data.get(at..)?.get(..2)?.try_into().ok().map(u16::from_le_bytes)
}

fn le_u64(data: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    data.get(at..)?.get(..8)?.try_into().ok().map(u64::from_le_bytes)
}

/// Checks, with the `object` crate, that an ELF64 little-endian CUDA object's header, section
/// and segment tables, and every section's and segment's bytes lie within `data` (which must be
/// 8-byte aligned, as [`Image`]'s buffer is).
fn check_cubin(data: &[u8]) -> Result<(), String> {
    let len = data.len() as u64;
    let bad = |what: &str| format!("the cubin is malformed: {what} (image is {len} bytes)");
    let within = |range: Option<(u64, u64)>| {
        range.is_none_or(|(offset, size)| offset.checked_add(size).is_some_and(|end| end <= len))
    };
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let file = object::read::elf::ElfFile64::<object::LittleEndian>::parse(data).map_err(|e| bad(&e.to_string()))?;
    let machine = file.elf_header().e_machine.get(object::LittleEndian).0;
    if machine != EM_CUDA {
        return Err(format!("the ELF image is not a CUDA cubin (e_machine {machine}, expected {EM_CUDA})"));
    }
    for section in file.sections() {
        let i = section.index().0;
        // `file_range` is `None` for sections that take no bytes in the file (`SHT_NOBITS`).
        let range = section.file_range();
        if !within(range) {
            let (offset, size) = range.unwrap_or_default();
            return Err(bad(&format!("section {i} ({offset}+{size}) lies outside the image")));
        }
    }
    for (i, segment) in file.segments().enumerate() {
        let (offset, size) = segment.file_range();
        if !within(Some((offset, size))) {
            return Err(bad(&format!("segment {i} ({offset}+{size}) lies outside the image")));
        }
    }
    Ok(())
}

/// Checks a fatbin's header: `magic:u32, version:u16, header_size:u16, fat_size:u64`, with
/// `header_size + fat_size` within `data`.
fn check_fatbin(data: &[u8]) -> Result<(), String> {
    let len = data.len() as u64;
    let header = le_u16(data, 6).zip(le_u64(data, 8));
    let (header_size, fat_size) = header.ok_or_else(|| format!("the fatbin header is truncated ({len} bytes)"))?;
    if header_size < 16 {
        return Err(format!("the fatbin header size {header_size} is smaller than the header"));
    }
    match u64::from(header_size).checked_add(fat_size) {
        Some(end) if end <= len => Ok(()),
        _ => Err(format!("the fatbin says it takes {header_size}+{fat_size} bytes, the payload holds {len}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::device::{FunctionInfo, CUDA};

    fn cubin_header() -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[6] = 1;
        h[0x12..0x14].copy_from_slice(&EM_CUDA.to_le_bytes());
        h[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        h[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        h
    }

    #[test]
    fn images_are_checked_before_the_driver_sees_them() {
        // PTX: copied with a NUL after it, aligned.
        let img = Image::prepare("ptx", b".version 6.0\n").unwrap();
        assert_eq!(img.kind, ImageKind::Ptx);
        assert!(img.words.len() * 8 > 13, "room for the NUL");
        assert_eq!(img.words.last().map(|w| w.to_ne_bytes()[5..].to_vec()), Some(vec![0, 0, 0]));
        assert!(Image::prepare("ptx", b".version\0 6.0").unwrap_err().contains("NUL byte at 8"));
        assert!(Image::prepare("ptx", b".version 6.0\0\0").is_ok());
        assert!(Image::prepare("cuda", b"__global__ void f() {}").unwrap_err().contains("NVRTC"));
        assert!(Image::prepare("spirv", b"x").unwrap_err().contains("unknown CUDA image format"));

        // A cubin with a null section, its section name table and one section that lies
        // inside (the whole file), then one made to run past the end.
        let mut cubin = cubin_header();
        cubin[0x28..0x30].copy_from_slice(&64u64.to_le_bytes()); // shoff
        cubin[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes()); // shnum
        cubin[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes()); // shstrndx
        let section = |kind: u8, offset: u64, size: u64| {
            let mut sh = vec![0u8; 64];
            sh[4] = kind;
            sh[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
            sh[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            sh
        };
        let total = 64 + 3 * 64 + 1;
        cubin.extend_from_slice(&[0u8; 64]); // SHT_NULL
        cubin.extend_from_slice(&section(3, total - 1, 1)); // SHT_STRTAB: one NUL
        cubin.extend_from_slice(&section(1, 0, total)); // SHT_PROGBITS
        cubin.push(0);
        assert_eq!(cubin.len() as u64, total);
        assert_eq!(Image::prepare("cubin", &cubin).unwrap().kind, ImageKind::Cubin);
        let mut past = cubin.clone();
        past[64 + 2 * 64 + 0x20..64 + 2 * 64 + 0x28].copy_from_slice(&(total + 1).to_le_bytes());
        let err = Image::prepare("cubin", &past).unwrap_err();
        assert!(err.contains("section 2"), "{err}");
        let mut table_past = cubin.clone();
        table_past[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        assert!(Image::prepare("cubin", &table_past).unwrap_err().contains("the cubin is malformed"));
        let mut x86 = cubin.clone();
        x86[0x12] = 62;
        assert!(Image::prepare("cubin", &x86).unwrap_err().contains("not a CUDA cubin"));
        for cut in 4..cubin.len() {
            assert!(Image::prepare("cubin", &cubin[..cut]).is_err(), "cut {cut}");
        }

        // A fatbin whose size fits, and one that does not.
        let mut fat = FATBIN_MAGIC.to_le_bytes().to_vec();
        fat.extend_from_slice(&1u16.to_le_bytes());
        fat.extend_from_slice(&16u16.to_le_bytes());
        fat.extend_from_slice(&8u64.to_le_bytes());
        fat.extend_from_slice(&[0; 8]);
        assert_eq!(Image::prepare("cubin", &fat).unwrap().kind, ImageKind::Fatbin);
        assert!(Image::prepare("cubin", &fat[..fat.len() - 1]).unwrap_err().contains("16+8"));
        assert!(Image::prepare("fatbin", &fat[..10]).unwrap_err().contains("truncated"));
    }

    #[test]
    fn ptx_hints_name_func_declarations() {
        let ptx = b".visible .func k(\n .param .b64 p\n)\n.visible .entry other(\n)\n";
        let hint = ptx_hint(ptx, "k");
        assert!(hint.contains("`.func`"), "{hint}");
        assert!(hint.contains("[\"other\"]"), "{hint}");
        assert!(!ptx_hint(ptx, "missing").contains(".func"));
    }

    #[test]
    fn args_are_checked_against_the_function_info() {
        let types = [DataType::HANDLE, DataType::I32];
        assert!(check_args(&types, &[KernelArg::I32(1)]).unwrap_err().contains("takes 2 arguments (handle, int32)"));
        assert!(check_args(&types, &[KernelArg::I32(1), KernelArg::I32(1)]).unwrap_err().contains("must be handle"));
        let f16 = DataType::parse("float16").unwrap();
        assert!(check_args(&[f16], &[KernelArg::F32(1.0)]).unwrap_err().contains("cannot be passed"));
    }

    #[test]
    fn without_a_driver_loading_works_and_use_fails_cleanly() {
        if CudaModule::driver_present() {
            // With a driver, use succeeds; the GPU tests (tests/all/device.rs) cover it.
            return;
        }
        let info = FunctionInfo::new("k", vec![DataType::HANDLE], vec!["threadIdx.x".into()]);
        let m = CudaModule::new(DeviceModule::cuda_from_ptx(b".version 6.0\n".to_vec(), vec![("k".into(), info)]));
        for err in [
            m.ensure_loaded().unwrap_err(),
            m.upload_f32(&[1.0]).unwrap_err(),
            m.zeros(4).unwrap_err(),
            m.launch("k", &[], &[1]).unwrap_err(),
        ] {
            assert!(err.to_string().starts_with("cuda: no CUDA driver found"), "{err}");
        }
        assert!(matches!(m.as_payload(), Some(p) if p.type_key() == CUDA));
    }
}

/// The CUDA device API (TODO: being written).
#[derive(Debug)]
pub struct CudaApi;

impl CudaApi {
    /// Opens `device`.
    pub fn open(device: crate::device::Device) -> Result<Arc<dyn super::device_api::DeviceApi>, crate::device::DeviceError> {
        Err(crate::device::DeviceError::Unsupported { device, what: "running".into() })
    }
}
