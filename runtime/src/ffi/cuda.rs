//! CUDA on a GPU, through the driver API with cudarc (feature `cuda`): device memory
//! ([`CudaApi`], the [`DeviceApi`] of `cuda:N`) and `cuda` payloads ([`CudaModule`]).
//!
//! Every device is used through its primary context, retained once per process and shared
//! by the device API and every module on that device, with its default stream: memory from
//! [`CudaApi`] is what the modules' kernels read, and copies, kernels and synchronisation are
//! ordered on that one stream.
//!
//! With the feature on, `cuda` payloads load as [`CudaModule`]s (the loader is registered in
//! [`crate::registry`]). Loading a tree never touches the driver: the module keeps its
//! [`DeviceModule`] (which [`Module::as_payload`] returns, so the tree can be packed again, and
//! through which `LoadedTree::find::<DeviceModule>()` finds it as it does without the feature)
//! and loads the image into a device on first use there, once per device.
//!
//! First use checks that the driver library (`libcuda`) can be opened before any other
//! cudarc call (cudarc panics when it cannot), checks the device and the image and hands the
//! image to `cuModuleLoadData`:
//! - PTX (`fmt` `ptx`, or text): copied with the NUL the driver needs (TVM stores none);
//! - cubin (an ELF file) and fatbin (magic `0xBA55ED50`), whatever `fmt` says, as TVM does:
//!   their headers' sizes and ranges are checked against the payload's length first, since
//!   the driver reads the image from a pointer alone;
//! - CUDA C++ source (`fmt` `cuda`, what TVM 0.27 exports): compiled with NVRTC (opened at run
//!   time, see [`super::nvrtc`]) for the device's compute capability, as TVM's loader does, once
//!   per module and compute capability: a cubin when NVRTC knows the architecture, else PTX for
//!   the newest one it knows below. Without `libnvrtc` this is an error that says what to
//!   install; a source that does not compile comes back with NVRTC's log.
//!
//! Kernels run two ways:
//! - host code compiled by TVM looks a kernel up ([`Module::get_function`]) and calls it with
//!   its arguments (device pointers, scalars) and launch extents (see
//!   [`crate::ffi::cuda_packed`]). The kernel runs on the current CUDA device of the calling
//!   thread (`__tvm_set_device`, [`super::device_api::current_device`]). How the arguments are
//!   passed and the launch tags are worked out once per kernel, the kernel is looked up once
//!   per device, and a launch is queued without waiting for it: the stream keeps the order,
//!   and a copy to the host (or [`DeviceApi::synchronize`]) waits, so the error of a kernel
//!   that faults comes back from that call.
//! - [`CudaModule::launch`] (on device 0) takes [`KernelArg`]s, checked against the function
//!   info's `arg_types`, then the thread extents in the order of its `launch_param_tags` (and
//!   the dynamic shared memory when tagged), as TVM's packed call does; it waits for the
//!   kernel, so its errors come back from the call that caused them. Buffers are
//!   [`DeviceBuffer`]s made by the module.
//!
//! A kernel that reads or writes outside its buffers faults on the device and the driver
//! reports it; the host's memory is not at risk.
//!
//! Errors of the device API are [`DeviceError`]s (a missing driver is
//! [`DeviceError::NoDriver`]); those of modules are [`Error::Cuda`]. Every cudarc call runs
//! inside a guard that turns a panic into an error. This file is the only one of the crate
//! that calls the CUDA driver.
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::DriverError;
use cudarc::driver::DevicePtr as _;
use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream};
use smallvec::SmallVec;

use object::{Object, ObjectSection, ObjectSegment};

use super::cuda_packed::{self, ArgKind};
use super::device_api::{DeviceApi, DevicePtr, TransferCounters, TransferStats, WorkspacePool};
use super::nvrtc;
use crate::device::{Device, DeviceError, DeviceType};
use crate::error::{Error, Result};
use crate::format::DataType;
use crate::module::Module;
use crate::payload::device::{DeviceModule, FunctionInfo, LaunchDims, LaunchParams};
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
    /// How it is passed.
    fn kind(&self) -> ArgKind {
        match self {
            KernelArg::Buffer(_) | KernelArg::DevicePtr(_) => ArgKind::Handle,
            KernelArg::I32(_) => ArgKind::I32,
            KernelArg::U32(_) => ArgKind::U32,
            KernelArg::I64(_) => ArgKind::I64,
            KernelArg::F32(_) => ArgKind::F32,
            KernelArg::F64(_) => ArgKind::F64,
        }
    }

    /// The argument type it stands for, in TVM's spelling.
    fn type_name(&self) -> &'static str {
        self.kind().name()
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

// ---- per-device slots ------------------------------------------------------------------

/// Device ordinals whose slots are read without a lock.
const FAST_DEVICES: usize = 8;

/// A value per device ordinal, made on first use there: lock-free for the first
/// [`FAST_DEVICES`] ordinals, behind a mutex beyond.
struct PerDevice<T> {
    fast: [OnceLock<T>; FAST_DEVICES],
    rest: Mutex<Vec<(usize, Arc<OnceLock<T>>)>>,
}

impl<T> Default for PerDevice<T> {
    fn default() -> Self {
        PerDevice { fast: std::array::from_fn(|_| OnceLock::new()), rest: Mutex::new(Vec::new()) }
    }
}

impl<T> PerDevice<T> {
    /// Runs `f` on the value of `ordinal`, made with `init` if there is none yet (once, even
    /// when threads race).
    #[inline]
    fn with<R>(&self, ordinal: usize, init: impl FnOnce() -> T, f: impl FnOnce(&T) -> R) -> R {
        if let Some(slot) = self.fast.get(ordinal) {
            return f(slot.get_or_init(init));
        }
        let slot = {
            let mut rest = self.rest.lock().unwrap_or_else(|e| e.into_inner());
            match rest.iter().find(|(o, _)| *o == ordinal) {
                Some((_, slot)) => slot.clone(),
                None => {
                    let slot = Arc::new(OnceLock::new());
                    rest.push((ordinal, slot.clone()));
                    slot
                }
            }
        };
        f(slot.get_or_init(init))
    }

    /// Every value made so far, by ordinal.
    fn for_each(&self, mut f: impl FnMut(usize, &T)) {
        for (ordinal, slot) in self.fast.iter().enumerate() {
            if let Some(v) = slot.get() {
                f(ordinal, v);
            }
        }
        let rest = self.rest.lock().unwrap_or_else(|e| e.into_inner());
        for (ordinal, slot) in rest.iter() {
            if let Some(v) = slot.get() {
                f(*ordinal, v);
            }
        }
    }
}

// ---- the module ---------------------------------------------------------------------------

/// A CUDA module: the payload, and its image loaded into each device it runs on, on first use
/// there.
pub struct CudaModule {
    device: DeviceModule,
    /// The driver side, made on first use (a tree of many modules that never run keeps one
    /// empty cell per module).
    run: OnceLock<Arc<Run>>,
}

/// What a module and the kernels it hands out share: a copy of the payload (its bytes
/// shared), the image per device, and the kernels' plans.
struct Run {
    device: DeviceModule,
    /// The image loaded per device ordinal (or why it did not load).
    images: PerDevice<Result<Arc<Loaded>, String>>,
    /// One plan per entry of `device.functions`.
    plans: Vec<Arc<KernelPlan>>,
    /// A `cuda` (source) payload compiled with NVRTC, per compute capability (or why it did
    /// not compile).
    compiled: Mutex<HashMap<(u32, u32), Compiled>>,
}

/// A `cuda` payload compiled for one compute capability, or why it did not compile.
type Compiled = Result<Arc<Image>, String>;

impl fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut states = Vec::new();
        if let Some(run) = self.run.get() {
            run.images.for_each(|ordinal, loaded| {
                let state = if loaded.is_ok() { "loaded" } else { "failed to load" };
                states.push(format!("{state} on cuda:{ordinal}"));
            });
        }
        let state = if states.is_empty() { "not loaded".to_owned() } else { states.join(", ") };
        f.debug_struct("CudaModule").field("device", &self.device).field("driver", &state).finish()
    }
}

impl CudaModule {
    /// A module for `device` (a `cuda` payload). Nothing is loaded until first use.
    pub fn new(device: DeviceModule) -> CudaModule {
        CudaModule { device, run: OnceLock::new() }
    }

    /// The driver side, made on first use.
    fn run(&self) -> &Arc<Run> {
        self.run.get_or_init(|| {
            let device = self.device.clone();
            let plans = device.functions.iter().map(|(name, info)| Arc::new(KernelPlan::new(name, info))).collect();
            Arc::new(Run { device, images: PerDevice::default(), plans, compiled: Mutex::default() })
        })
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

    /// Loads the image into device 0 now (otherwise the first buffer or launch does).
    pub fn ensure_loaded(&self) -> Result<()> {
        self.loaded().map(|_| ())
    }

    /// Loads the image into `device` (a CUDA device) now, otherwise the first kernel launched
    /// there does.
    pub fn ensure_loaded_on(&self, device: Device) -> Result<()> {
        if device.device_type != DeviceType::Cuda {
            return Err(Error::Cuda(format!("a CUDA module cannot load into {device}")));
        }
        let ordinal =
            usize::try_from(device.device_id).map_err(|_| Error::Cuda(format!("{device} is not a device")))?;
        self.run().loaded(ordinal).map(|_| ()).map_err(Error::Cuda)
    }

    /// The image in device 0.
    fn loaded(&self) -> Result<Arc<Loaded>> {
        self.run().loaded(0).map_err(Error::Cuda)
    }

    /// The name of the GPU the module runs on (device 0).
    pub fn device_name(&self) -> Result<String> {
        let l = self.loaded()?;
        guard("device name", || l.ctx.name().map_err(|e| format!("device name: {e}")))
    }

    /// Copies `host` to a new device buffer on device 0.
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

    /// Copies `host` to a new device buffer of `f32`s on device 0.
    pub fn upload_f32(&self, host: &[f32]) -> Result<DeviceBuffer> {
        let bytes: Vec<u8> = host.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.upload(&bytes)
    }

    /// A new device buffer of `len` zero bytes on device 0.
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

    /// Launches kernel `name` on device 0 and waits for it. `args` are its arguments (checked
    /// against its `arg_types`), `extents` the thread extents in the order of its
    /// `launch_param_tags`, then the dynamic shared memory in bytes when
    /// `tir.use_dyn_shared_memory` is a tag.
    pub fn launch(&self, name: &str, args: &[KernelArg<'_>], extents: &[u64]) -> Result<()> {
        let run = self.run();
        let l = self.loaded()?;
        let _span = tracing::debug_span!("cuda_launch", kernel = name).entered();
        let fail = |what: String| Error::Cuda(format!("kernel `{name}`: {what}"));
        let plan = run.plan(name).ok_or_else(|| {
            let known: Vec<&str> = run.device.functions.iter().map(|(n, _)| n.as_str()).collect();
            fail(format!("not in the module's function table (it has {known:?})"))
        })?;
        let params = plan.launch.as_ref().map_err(|e| fail(e.clone()))?;
        let dims = params.dims(extents).map_err(|e| fail(e.to_string()))?;
        check_args(&plan.types, args).map_err(fail)?;
        for arg in args {
            if let KernelArg::Buffer(b) = arg {
                if b.slice.context().cu_ctx() != l.ctx.cu_ctx() {
                    return Err(fail("a buffer belongs to another CUDA context".into()));
                }
            }
        }
        tracing::debug!(grid = ?dims.grid, block = ?dims.block, shared = dims.dyn_shared_memory, "launch");
        let launched = run.with_ready(&plan, 0, |ready| {
            catch("launch", || {
                ready.loaded.ctx.bind_to_thread().map_err(|e| format!("cannot use the context: {e}"))?;
                let stream = &ready.loaded.stream;
                // Buffers' pointers, with the guards that record their use on the stream
                // (kept until the kernel is done).
                let mut guards = Vec::new();
                let mut slots = cuda_packed::Slots::with_capacity(args.len());
                for arg in args {
                    slots.push(match arg {
                        KernelArg::Buffer(b) => {
                            let (ptr, sync) = b.slice.device_ptr(stream);
                            guards.push(sync);
                            ptr
                        }
                        other => cuda_packed::value_slot(other).unwrap_or_default(),
                    });
                }
                // SAFETY: the slots hold the arguments `check_args` checked against the
                // function info (and `Ready::new` against the kernel's parameter sizes where
                // the driver tells them); buffers are borrowed by `args` for the whole call,
                // and the stream is synchronized below before they can be dropped.
                unsafe { ready.launch(&mut slots, dims) }?;
                stream.synchronize().map_err(|e| format!("the kernel failed: {}", describe(e)))?;
                drop(guards);
                Ok(())
            })
        });
        launched.map_err(fail)
    }
}

impl Run {
    /// The image in device `ordinal`, loaded on first use.
    fn loaded(&self, ordinal: usize) -> Result<Arc<Loaded>, String> {
        self.images.with(ordinal, || Loaded::new(self, ordinal), Clone::clone)
    }

    /// The image of a `cuda` (source) payload for compute capability `cc`, compiled with
    /// NVRTC on first use (once per module and capability: devices alike share it; the lock
    /// makes a second device wait for the first's compile rather than compile again).
    fn source_image(&self, cc: (u32, u32)) -> Result<Arc<Image>, String> {
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        compiled.entry(cc).or_insert_with(|| compile_source(&self.device, cc).map(Arc::new)).clone()
    }

    /// The plan of kernel `name`, if the function table has it.
    fn plan(&self, name: &str) -> Option<Arc<KernelPlan>> {
        let index = self.device.functions.iter().position(|(n, _)| n == name)?;
        self.plans.get(index).cloned()
    }

    /// Runs `f` on the kernel of `plan` in device `ordinal` (loading the image and looking the
    /// kernel up on first use there).
    #[inline]
    fn with_ready<R>(
        &self,
        plan: &KernelPlan,
        ordinal: usize,
        f: impl FnOnce(&Ready) -> Result<R, String>,
    ) -> Result<R, String> {
        let init = || Ready::new(self.loaded(ordinal)?, plan, &self.device);
        plan.ready.with(ordinal, init, |ready| match ready {
            Ok(ready) => f(ready),
            Err(e) => Err(e.clone()),
        })
    }

    /// A launch by host code: `args` are the kernel's arguments then its launch extents. The
    /// kernel runs on the thread's current CUDA device and is not waited for.
    fn launch_packed(&self, plan: &KernelPlan, args: &[crate::ffi::Value]) -> Result<(), String> {
        let fail = |what: &str| format!("cuda: kernel `{}`: {what}", plan.name);
        let params = plan.launch.as_ref().map_err(|e| fail(e))?;
        let kinds = plan.kinds.as_ref().map_err(|e| fail(e))?;
        let (mut slots, extents) = cuda_packed::pack(kinds, args).map_err(|e| fail(&e))?;
        let dims = params.dims(&extents).map_err(|e| fail(&e.to_string()))?;
        let device = super::device_api::current_device(DeviceType::Cuda);
        let ordinal = usize::try_from(device.device_id).map_err(|_| fail(&format!("{device} is not a device")))?;
        tracing::trace!(kernel = %plan.name, %device, grid = ?dims.grid, block = ?dims.block, "launch");
        // SAFETY: the slots hold one value per parameter, of the kinds the function info
        // gives (checked against the kernel's parameter sizes where the driver tells them);
        // device pointers are host code's, which keeps them alive while its kernels run (it
        // frees through the device API, whose `cuMemFree` waits for the device).
        let launched =
            self.with_ready(plan, ordinal, |ready| catch("launch", || unsafe { ready.launch(&mut slots, dims) }));
        launched.map_err(|e| format!("cuda: kernel `{}` on {device}: {e}", plan.name))
    }
}

impl Module for CudaModule {
    fn type_key(&self) -> &str {
        &self.device.type_key
    }
    /// A kernel, for host code that launches it (`GetFuncFromEnv` + `TVMFuncCall`): its
    /// arguments as the function table types them (device pointers as handles), then the
    /// launch extents (see [`crate::ffi::cuda_packed`]). It runs on the calling thread's
    /// current CUDA device, queued on its stream.
    fn get_function(&self, name: &str) -> Option<crate::module::Symbol> {
        // Other modules' names are answered without making the driver side.
        let index = self.device.functions.iter().position(|(n, _)| n == name)?;
        let run = self.run().clone();
        let plan = run.plans.get(index)?.clone();
        Some(crate::ffi::callconv::function_symbol(move |args| {
            run.launch_packed(&plan, args)?;
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

/// What a kernel's function info says, worked out once: how its arguments are passed, its
/// launch configuration, and the kernel in each device it has run on.
struct KernelPlan {
    name: String,
    /// The function info's argument types (for messages).
    types: Vec<DataType>,
    /// How each argument is passed, or why one cannot be.
    kinds: Result<Vec<ArgKind>, String>,
    /// The launch tags read, or why they cannot make a launch.
    launch: Result<LaunchParams, String>,
    /// The kernel per device ordinal (or why it cannot run there).
    ready: PerDevice<Result<Ready, String>>,
}

impl KernelPlan {
    fn new(name: &str, info: &FunctionInfo) -> KernelPlan {
        let launch = info.launch_params().map_err(|e| e.to_string()).and_then(|p| {
            if p.cooperative || p.programmatic_dependent_launch {
                Err("cooperative and programmatic dependent launches are not supported".to_owned())
            } else {
                Ok(p)
            }
        });
        let kinds = info
            .arg_types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                ArgKind::of(*t).ok_or_else(|| format!("argument {i} has type {t}, which cannot be passed to a kernel"))
            })
            .collect();
        KernelPlan { name: name.to_owned(), types: info.arg_types.clone(), kinds, launch, ready: PerDevice::default() }
    }
}

/// Checks `args` against a kernel's argument types.
fn check_args(types: &[DataType], args: &[KernelArg<'_>]) -> Result<(), String> {
    if types.len() != args.len() {
        return Err(format!("takes {} arguments ({}), {} given", types.len(), join(types), args.len()));
    }
    for (i, (t, a)) in types.iter().zip(args).enumerate() {
        let Some(kind) = ArgKind::of(*t) else {
            return Err(format!("argument {i} has type {t}, which cannot be passed to a kernel"));
        };
        if kind != a.kind() {
            return Err(format!("argument {i} must be {}, {} given", kind.name(), a.type_name()));
        }
    }
    Ok(())
}

fn join(types: &[DataType]) -> String {
    types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

// ---- guards and driver errors ---------------------------------------------------------

/// The message of a caught panic.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

/// Runs cudarc calls, turning a panic (cudarc panics when the driver lacks a function it
/// loads) into an error message.
fn catch<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(format!("{what}: the CUDA driver library failed: {}", panic_message(&*payload))),
    }
}

/// [`catch`], with the error as [`Error::Cuda`].
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T> {
    catch(what, f).map_err(Error::Cuda)
}

/// [`catch`] for the device API: a panic is a [`DeviceError::Driver`] of `call`.
fn device_guard<T>(device: Device, call: &str, f: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(DeviceError::Driver {
            device,
            call: call.to_owned(),
            detail: format!("the CUDA driver library failed: {}", panic_message(&*payload)),
        }),
    }
}

/// A driver error, with a note when it is the sticky error of a kernel that faulted earlier
/// (which the next call that waits for the device reports, and after which the context is
/// lost).
fn describe(e: DriverError) -> String {
    use sys::CUresult as R;
    let sticky = matches!(
        e.0,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
    );
    if sticky {
        format!("{e} (a kernel queued earlier failed; the device cannot be used any more in this process)")
    } else {
        e.to_string()
    }
}

fn driver_error(device: Device, call: &str, e: DriverError) -> DeviceError {
    DeviceError::Driver { device, call: call.to_owned(), detail: describe(e) }
}

/// The message for a missing driver.
const NO_DRIVER: &str =
    "no CUDA driver found: libcuda could not be loaded (is the NVIDIA driver installed and on the library path?)";

// ---- contexts -------------------------------------------------------------------------------

/// The primary context of device `ordinal`, retained once per process and shared by the
/// device API and every module on that device. Call only with the driver present, inside a
/// guard.
fn primary_context(ordinal: usize) -> Result<Arc<CudaContext>, DriverError> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut contexts = CONTEXTS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = contexts.get(&ordinal) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(ordinal)?;
    contexts.insert(ordinal, ctx.clone());
    Ok(ctx)
}

/// The context of `device` (a CUDA device): the driver checked first, then the ordinal
/// against the devices there are.
fn open_device(device: Device) -> Result<Arc<CudaContext>, DeviceError> {
    if device.device_type != DeviceType::Cuda {
        return Err(DeviceError::Unsupported { device, what: "the CUDA device API".into() });
    }
    if !CudaModule::driver_present() {
        return Err(DeviceError::NoDriver { device, detail: NO_DRIVER.into() });
    }
    device_guard(device, "cuInit", || {
        if let Err(e) = result::init() {
            return Err(if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
                DeviceError::NoDevice { device, available: 0 }
            } else {
                DeviceError::NoDriver { device, detail: format!("the CUDA driver does not start (cuInit): {e}") }
            });
        }
        let count = result::device::get_count().map_err(|e| driver_error(device, "cuDeviceGetCount", e))?;
        let available = usize::try_from(count).unwrap_or(0);
        let ordinal = usize::try_from(device.device_id)
            .ok()
            .filter(|&o| o < available)
            .ok_or(DeviceError::NoDevice { device, available })?;
        primary_context(ordinal).map_err(|e| driver_error(device, "cuDevicePrimaryCtxRetain", e))
    })
}

// ---- the device API ---------------------------------------------------------------------

/// The device API of a CUDA device (`cuda:N`): `cuMemAlloc`'d memory (device pointers are
/// `CUdeviceptr`s), copies and synchronisation on the device's default stream in its primary
/// context, which the device's [`CudaModule`] kernels share.
pub struct CudaApi {
    device: Device,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    counters: TransferCounters,
    workspace: WorkspacePool,
}

impl fmt::Debug for CudaApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaApi({})", self.device)
    }
}

impl CudaApi {
    /// Opens `device`: [`DeviceError::NoDriver`] without a CUDA driver,
    /// [`DeviceError::NoDevice`] when the ordinal is not one of the driver's devices.
    pub fn open(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
        Ok(Arc::new(CudaApi::new(device)?))
    }

    /// [`CudaApi::open`], as the type itself.
    pub fn new(device: Device) -> Result<CudaApi, DeviceError> {
        let ctx = open_device(device)?;
        let stream = ctx.default_stream();
        Ok(CudaApi { device, ctx, stream, counters: TransferCounters::default(), workspace: WorkspacePool::default() })
    }

    /// Runs driver call `call` (`f`) with the context bound to this thread, inside a guard.
    #[inline]
    fn call<T>(&self, call: &str, f: impl FnOnce() -> Result<T, DriverError>) -> Result<T, DeviceError> {
        device_guard(self.device, call, || {
            self.ctx.bind_to_thread().map_err(|e| driver_error(self.device, "cuCtxSetCurrent", e))?;
            f().map_err(|e| driver_error(self.device, call, e))
        })
    }
}

/// Byte `offset` of device pointer `ptr`.
fn at(ptr: DevicePtr, offset: usize) -> sys::CUdeviceptr {
    ptr.0.wrapping_add(offset) as sys::CUdeviceptr
}

impl DeviceApi for CudaApi {
    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> String {
        let name = device_guard(self.device, "cuDeviceGetName", || {
            self.ctx.name().map_err(|e| driver_error(self.device, "cuDeviceGetName", e))
        });
        name.unwrap_or_else(|_| format!("CUDA device {}", self.device.device_id))
    }

    fn alloc(&self, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        let device = self.device;
        device_guard(device, "cuMemAlloc", || {
            self.ctx.bind_to_thread().map_err(|e| driver_error(device, "cuCtxSetCurrent", e))?;
            // SAFETY: the context is current; the memory is freed with `cuMemFree` in `free`.
            match unsafe { result::malloc_sync(nbytes.max(1)) } {
                Ok(p) => Ok(DevicePtr(p as usize)),
                Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                    Err(DeviceError::OutOfMemory { device, bytes: nbytes as u64 })
                }
                Err(e) => Err(driver_error(device, "cuMemAlloc", e)),
            }
        })
    }

    unsafe fn free(&self, ptr: DevicePtr, _nbytes: usize) {
        // SAFETY: per the contract `ptr` came from `alloc` (`cuMemAlloc`) and is freed once;
        // `cuMemFree` waits for the device, so a kernel still queued on it finishes first.
        let freed = self.call("cuMemFree", || unsafe { result::free_sync(ptr.0 as sys::CUdeviceptr) });
        if let Err(e) = freed {
            tracing::warn!("{e}");
        }
    }

    unsafe fn copy_from_host(&self, dst: DevicePtr, offset: usize, src: &[u8]) -> Result<(), DeviceError> {
        self.counters.host_to_device(src.len());
        // SAFETY: per the contract `dst + offset` holds `src.len()` bytes. The synchronous copy
        // (on the legacy default stream, the stream kernels run on) is ordered after what was
        // queued before, and is done with `src` when it returns.
        self.call("cuMemcpyHtoD", || unsafe { result::memcpy_htod_sync(at(dst, offset), src) })
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.counters.device_to_host(dst.len());
        // SAFETY: per the contract `src + offset` holds `dst.len()` bytes. The synchronous copy
        // waits for what was queued before on the stream and returns once `dst` is written.
        self.call("cuMemcpyDtoH", || unsafe { result::memcpy_dtoh_sync(dst, at(src, offset)) })
    }

    unsafe fn copy_on_device(
        &self,
        src: DevicePtr,
        src_offset: usize,
        dst: DevicePtr,
        dst_offset: usize,
        n: usize,
    ) -> Result<(), DeviceError> {
        self.counters.device_to_device();
        let stream = self.stream.cu_stream();
        // SAFETY: per the contract both ranges hold `n` bytes of live allocations; the copy is
        // queued on the stream, after what was queued before.
        self.call("cuMemcpyDtoDAsync", || unsafe {
            result::memcpy_dtod_async(at(dst, dst_offset), at(src, src_offset), n, stream)
        })
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.call("cuStreamSynchronize", || self.stream.synchronize())
    }

    fn set_device(&self) -> Result<(), DeviceError> {
        self.call("cuCtxSetCurrent", || Ok(()))
    }

    fn alloc_workspace(&self, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        self.workspace.alloc(nbytes, |n| self.alloc(n))
    }

    fn free_workspace(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.workspace.release(self.device, ptr)
    }

    fn transfers(&self) -> TransferStats {
        self.counters.get()
    }
}

impl Drop for CudaApi {
    fn drop(&mut self) {
        for (nbytes, ptr) in self.workspace.drain() {
            // SAFETY: the pool's free blocks came from `alloc` and are freed once, here.
            unsafe { self.free(ptr, nbytes) };
        }
    }
}

// ---- images and kernels in the driver ---------------------------------------------------

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
            // here; the kernels taken from it are dropped before (each `Ready` holds the
            // `Loaded` that holds this handle).
            unsafe { result::module::unload(module) }.map_err(|e| e.to_string())
        });
    }
}

/// A kernel handle from a loaded module.
#[derive(Clone, Copy)]
struct Kernel(sys::CUfunction);

// SAFETY: a `CUfunction` is a driver handle, valid in any thread while its module is loaded;
// it is only used through `Ready`, which keeps the module.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

/// The image loaded into one device: its context and stream, and the module handle.
struct Loaded {
    image: ModuleHandle,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl Loaded {
    fn new(run: &Run, ordinal: usize) -> Result<Arc<Loaded>, String> {
        let module = &run.device;
        let _span =
            tracing::debug_span!("cuda_load", ordinal, format = %module.format, bytes = module.data.len()).entered();
        if !CudaModule::driver_present() {
            return Err(NO_DRIVER.to_owned());
        }
        // A binary image is checked before the device is opened; source needs NVRTC, then
        // the device's compute capability.
        let source = Image::is_source(&module.format, &module.data);
        let binary = if source {
            if !nvrtc::available() {
                return Err(nvrtc::NvrtcError::NotFound.to_string());
            }
            None
        } else {
            Some(Image::prepare(&module.format, &module.data)?)
        };
        let device = Device::cuda(i32::try_from(ordinal).map_err(|_| format!("cuda:{ordinal} is not a device"))?);
        let ctx = open_device(device).map_err(|e| e.to_string())?;
        let image = match binary {
            Some(image) => Arc::new(image),
            None => {
                let (major, minor) = catch("compute capability", || {
                    ctx.compute_capability().map_err(|e| format!("the compute capability of {device}: {e}"))
                })?;
                let cc = (u32::try_from(major).unwrap_or(0), u32::try_from(minor).unwrap_or(0));
                run.source_image(cc).map_err(|e| format!("{device} (compute capability {major}.{minor}): {e}"))?
            }
        };
        catch("load", || {
            ctx.bind_to_thread().map_err(|e| format!("cannot use the context of {device}: {e}"))?;
            // SAFETY: the image is a NUL-terminated PTX text or a cubin/fatbin whose header
            // ranges were checked to lie within the buffer, and the buffer outlives the call
            // (the driver copies what it needs); the context is current on this thread.
            let handle = unsafe { result::module::load_data(image.as_ptr()) }.map_err(|e| {
                let note = if e.0 == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                    " (the PTX is newer than the driver: update the NVIDIA driver, or use the NVRTC of \
                         an older CUDA)"
                } else {
                    ""
                };
                format!("the driver refused the {} image on {device}: {e}{note}", image.kind)
            })?;
            let image = ModuleHandle { module: handle, ctx: ctx.clone() };
            Ok(Arc::new(Loaded { image, stream: ctx.default_stream(), ctx: ctx.clone() }))
        })
    }
}

/// A kernel in the image of one device, ready to launch.
struct Ready {
    loaded: Arc<Loaded>,
    kernel: Kernel,
    /// The dynamic shared memory the kernel was allowed past [`OPT_IN_SHARED_MEMORY`] (0
    /// until a launch needs it).
    shared_allowed: AtomicU32,
    /// Held while the allowance changes.
    shared_lock: Mutex<()>,
}

impl Ready {
    /// Looks kernel `plan` up in `loaded`, checking its parameters' sizes where the driver
    /// can tell them.
    fn new(loaded: Arc<Loaded>, plan: &KernelPlan, module: &DeviceModule) -> Result<Ready, String> {
        let name = &plan.name;
        let c_name = CString::new(name.as_str()).map_err(|_| "the name holds a NUL byte".to_owned())?;
        let handle = loaded.image.module;
        let found = catch("find kernel", || {
            loaded.ctx.bind_to_thread().map_err(|e| e.to_string())?;
            // SAFETY: `handle` is loaded (owned by `loaded.image`) and its context is current.
            let f = unsafe { result::module::get_function(handle, c_name) }.map_err(|e| e.to_string())?;
            Ok((Kernel(f), param_sizes(Kernel(f))))
        });
        let (kernel, sizes) = found.map_err(|e| {
            let mut msg = format!("not found in the loaded image: {e}");
            if module.format == "ptx" {
                msg.push_str(&ptx_hint(&module.data, name));
            }
            msg
        })?;
        if let (Some(sizes), Ok(kinds)) = (sizes, &plan.kinds) {
            let given: Vec<usize> = kinds.iter().map(|k| k.size()).collect();
            if sizes != given {
                return Err(format!(
                    "the kernel's parameters take {sizes:?} bytes, the function info's arguments {given:?}"
                ));
            }
        }
        Ok(Ready { loaded, kernel, shared_allowed: AtomicU32::new(0), shared_lock: Mutex::new(()) })
    }

    /// Queues the kernel on the stream, with one slot per parameter.
    ///
    /// # Safety
    ///
    /// `slots` hold the kernel's parameters (count and sizes as its function info says), and
    /// the device memory they point to stays allocated until the kernel is done.
    unsafe fn launch(&self, slots: &mut [u64], dims: LaunchDims) -> Result<(), String> {
        let l = &self.loaded;
        l.ctx.bind_to_thread().map_err(|e| format!("cannot use the context: {e}"))?;
        let shared = dims.dyn_shared_memory;
        if shared >= OPT_IN_SHARED_MEMORY && shared > self.shared_allowed.load(Ordering::Acquire) {
            let _changing = self.shared_lock.lock().unwrap_or_else(|e| e.into_inner());
            if shared > self.shared_allowed.load(Ordering::Acquire) {
                // Past 48 KiB a kernel must opt in to dynamic shared memory, or the launch
                // fails with an invalid value (TVM's CUDA module sets the same attribute).
                let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                let bytes =
                    i32::try_from(shared).map_err(|_| format!("{shared} bytes of shared memory is too many"))?;
                // SAFETY: `kernel` is a function of the module `l.image` keeps loaded, and its
                // context is current (bound above).
                unsafe { result::function::set_function_attribute(self.kernel.0, attr, bytes) }
                    .map_err(|e| format!("cannot allow {shared} bytes of dynamic shared memory: {e}"))?;
                self.shared_allowed.store(shared, Ordering::Release);
            }
        }
        let mut params: SmallVec<[*mut c_void; 16]> =
            slots.iter_mut().map(|s| (s as *mut u64).cast::<c_void>()).collect();
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        // SAFETY: `kernel` belongs to the module `l.image` keeps loaded, in the context made
        // current above. `params` holds one pointer per kernel parameter (per the caller's
        // contract), each to a live 8-byte slot of `slots`, which the driver reads before the
        // call returns; the memory they point to is the caller's to keep.
        unsafe {
            result::launch_kernel(self.kernel.0, (gx, gy, gz), (bx, by, bz), shared, l.stream.cu_stream(), &mut params)
        }
        .map_err(|e| format!("launch failed: {}", describe(e)))
    }
}

/// Dynamic shared memory from which a kernel must opt in
/// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): 48 KiB.
const OPT_IN_SHARED_MEMORY: u32 = 48 << 10;

/// The byte sizes of a kernel's parameters, when the driver can tell (CUDA 12.4 and later).
/// One driver call per parameter: asked once per kernel and device (by [`Ready::new`]).
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

/// Compiles the source of `module` (a `cuda` payload) with NVRTC for compute capability `cc`
/// and checks the image for the driver.
fn compile_source(module: &DeviceModule, cc: (u32, u32)) -> Result<Image, String> {
    let source = std::str::from_utf8(&module.data)
        .map_err(|e| format!("the CUDA source (fmt `cuda`) is not UTF-8 text: {e}"))?;
    let started = std::time::Instant::now();
    let compiled = nvrtc::compile_for_device(source, cc).map_err(|e| e.to_string())?;
    tracing::info!(
        arch = %compiled.arch,
        bytes = compiled.image.len(),
        ms = started.elapsed().as_millis() as u64,
        "compiled CUDA source with NVRTC"
    );
    if !compiled.log.is_empty() {
        tracing::debug!(log = %compiled.log, "NVRTC log");
    }
    Image::prepare(compiled.output.format(), &compiled.image)
        .map_err(|e| format!("NVRTC's {} for {}: {e}", compiled.output.format(), compiled.arch))
}

/// An image checked for the driver, in an 8-byte-aligned buffer with a NUL after it.
#[derive(Debug)]
struct Image {
    words: Vec<u64>,
    kind: ImageKind,
}

impl Image {
    /// Whether a payload is CUDA source for NVRTC (format `cuda` and not a cubin or fatbin,
    /// which are loaded whatever the format says).
    fn is_source(format: &str, data: &[u8]) -> bool {
        format == "cuda" && !data.starts_with(b"\x7fELF") && !data.starts_with(&FATBIN_MAGIC.to_le_bytes())
    }

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
            return Err("the payload is CUDA C++ source (fmt `cuda`): it is compiled with NVRTC for the \
                 device before it loads"
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
    use crate::device::Device;
    use crate::ffi::device_api::{self, Storage};
    use crate::ffi::Value;
    use crate::payload::device::CUDA;

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

    #[test]
    fn per_device_slots_are_made_once_per_ordinal() {
        let slots = PerDevice::<usize>::default();
        let made = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..3 {
            for ordinal in [0, 1, FAST_DEVICES - 1, FAST_DEVICES, 40] {
                let got = slots.with(
                    ordinal,
                    || {
                        made.fetch_add(1, Ordering::Relaxed);
                        ordinal * 10
                    },
                    |v| *v,
                );
                assert_eq!(got, ordinal * 10);
            }
        }
        assert_eq!(made.load(Ordering::Relaxed), 5);
        let mut seen = Vec::new();
        slots.for_each(|o, v| seen.push((o, *v)));
        seen.sort_unstable();
        assert_eq!(seen, [(0, 0), (1, 10), (7, 70), (8, 80), (40, 400)]);
    }

    #[test]
    fn the_device_api_without_a_driver_is_a_typed_error() {
        // Not a CUDA device: refused before the driver is asked.
        assert!(matches!(CudaApi::open(Device::cpu(0)), Err(DeviceError::Unsupported { .. })));
        let opened = CudaApi::open(Device::cuda(0));
        if CudaModule::driver_present() {
            // A driver without a GPU says so; with one, the far ordinal is not there.
            if let Err(e) = &opened {
                assert!(matches!(e, DeviceError::NoDevice { .. } | DeviceError::NoDriver { .. }), "{e}");
            }
            let far = CudaApi::open(Device::cuda(4096)).unwrap_err();
            assert!(matches!(far, DeviceError::NoDevice { .. } | DeviceError::NoDriver { .. }), "{far}");
            return;
        }
        let err = opened.unwrap_err();
        assert!(matches!(&err, DeviceError::NoDriver { device, .. } if *device == Device::cuda(0)), "{err:?}");
        assert!(err.to_string().starts_with("cuda:0: no driver: no CUDA driver found"), "{err}");
        // Through the process's device APIs and the storage built on them, for any ordinal.
        let err = device_api::device_api(Device::cuda(2)).unwrap_err();
        assert!(matches!(&err, DeviceError::NoDriver { device, .. } if *device == Device::cuda(2)), "{err:?}");
        assert!(matches!(Storage::new(Device::cuda(0), 16), Err(DeviceError::NoDriver { .. })));
        assert!(matches!(CudaApi::new(Device::cuda(-1)), Err(DeviceError::NoDriver { .. })));
    }

    #[test]
    fn kernels_for_host_code_check_their_arguments_then_fail_cleanly_without_a_driver() {
        let h = DataType::HANDLE;
        let tags = vec!["blockIdx.x".to_owned(), "threadIdx.x".to_owned()];
        let k = FunctionInfo::new("k", vec![h, DataType::I32], tags.clone());
        let f16 = FunctionInfo::new("f16", vec![DataType::parse("float16").unwrap()], tags.clone());
        let coop = FunctionInfo::new("coop", vec![h], vec!["blockIdx.x".into(), "tirx.use_cooperative_launch".into()]);
        let functions = vec![("k".into(), k), ("f16".into(), f16), ("coop".into(), coop)];
        let m = CudaModule::new(DeviceModule::cuda_from_ptx(b".version 6.0\n".to_vec(), functions));
        assert!(m.get_function("nope").is_none());
        assert!(m.get_function("k").is_some());
        let inner = m.run();
        let plan = inner.plan("k").unwrap();
        assert!(Arc::ptr_eq(&plan, &inner.plan("k").unwrap()), "plans are made once");

        // Wrong calls are refused before the driver is asked.
        let e = inner.launch_packed(&plan, &[Value::None]).unwrap_err();
        assert!(e.starts_with("cuda: kernel `k`: the kernel takes 2 arguments"), "{e}");
        let e = inner.launch_packed(&plan, &[Value::None, Value::Int(1), Value::Int(1)]).unwrap_err();
        assert!(e.contains("need 2 extents"), "{e}");
        let e = inner.launch_packed(&inner.plan("f16").unwrap(), &[Value::Float(1.0)]).unwrap_err();
        assert!(e.contains("argument 0 has type float16, which cannot be passed"), "{e}");
        let e = inner.launch_packed(&inner.plan("coop").unwrap(), &[Value::None, Value::Int(1)]).unwrap_err();
        assert!(e.contains("cooperative"), "{e}");
        assert!(format!("{m:?}").contains("not loaded"));

        if CudaModule::driver_present() {
            return;
        }
        // The kernel runs on the thread's current device, whichever it is.
        let args = [Value::None, Value::Int(1), Value::Int(1), Value::Int(32)];
        for id in [0, 3, 12] {
            device_api::set_current_device(Device::cuda(id));
            let e = inner.launch_packed(&plan, &args).unwrap_err();
            assert!(e.starts_with(&format!("cuda: kernel `k` on cuda:{id}: no CUDA driver found")), "{e}");
            let e = m.ensure_loaded_on(Device::cuda(id)).unwrap_err();
            assert!(e.to_string().starts_with("cuda: no CUDA driver found"), "{e}");
        }
        device_api::set_current_device(Device::cuda(0));
        assert!(m.ensure_loaded_on(Device::cpu(0)).is_err());
        let state = format!("{m:?}");
        assert!(state.contains("failed to load on cuda:0") && state.contains("failed to load on cuda:12"), "{state}");
    }

    /// The CUDA models TVM 0.27 exported (`tests/fixtures/device-run`), whose device modules
    /// hold CUDA source.
    const CUDA_FIXTURES: [&str; 4] = [
        "dev_relax_mlp_cuda_sm80",
        "dev_relax_mlp_cuda_sm90",
        "dev_relax_transformer_cuda_sm90",
        "dev_relax_cnn_cuda_sm90",
    ];

    /// The device module of fixture `name`, read from its library's blob (nothing is run).
    fn fixture_device_module(name: &str) -> DeviceModule {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/device-run").join(name);
        let so = std::fs::read(path.with_extension("so")).unwrap();
        let found = crate::elf::find_blob(&so, None).unwrap().expect("a blob symbol");
        let blob = crate::bytes::Bytes::from_vec(found.bytes(&so).unwrap().to_vec());
        let registry = crate::registry::Registry::default();
        let tree =
            crate::load::load_blob(&blob, found.layout, &registry, &crate::load::LoadOptions::default()).unwrap();
        tree.find::<DeviceModule>().expect("a device module").clone()
    }

    /// Whether NVRTC can be opened; when not, the test is skipped (and fails when
    /// `MBLOB_REQUIRE_NVRTC` is set).
    fn nvrtc_or_skip() -> bool {
        if nvrtc::available() {
            return true;
        }
        assert!(
            std::env::var_os("MBLOB_REQUIRE_NVRTC").is_none(),
            "MBLOB_REQUIRE_NVRTC is set, but {}",
            nvrtc::NvrtcError::NotFound
        );
        println!("skipped: no NVRTC");
        false
    }

    #[test]
    fn cuda_source_of_tvm_models_compiles_with_nvrtc() {
        if !nvrtc_or_skip() {
            return;
        }
        for name in CUDA_FIXTURES {
            let device = fixture_device_module(name);
            assert_eq!((device.type_key.as_str(), device.format.as_str()), (CUDA, "cuda"), "{name}");
            assert!(Image::is_source(&device.format, &device.data));
            let source = std::str::from_utf8(&device.data).unwrap();
            let kernels: Vec<&str> = device.functions.iter().map(|(n, _)| n.as_str()).collect();
            assert!(!kernels.is_empty(), "{name}");
            for (major, minor) in [(8, 0), (9, 0)] {
                let ptx = nvrtc::compile_ptx(source, (major, minor)).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(ptx.contains(&format!(".target sm_{major}{minor}")), "{name}");
                let entries = ptx_entries(&ptx);
                for kernel in &kernels {
                    assert!(entries.iter().any(|e| e == kernel), "{name} sm_{major}{minor}: no .entry {kernel}");
                }
                assert_eq!(Image::prepare("ptx", ptx.as_bytes()).unwrap().kind, ImageKind::Ptx);
                println!("{name}: {} kernels, PTX for compute_{major}{minor}: {} bytes", kernels.len(), ptx.len());
            }
        }
    }

    #[test]
    fn cuda_source_payloads_compile_once_per_compute_capability() {
        if !nvrtc_or_skip() {
            return;
        }
        // What the first load on a device does before `cuModuleLoadData`: a cubin for the
        // architecture (checked as the driver's image), kept for the next device alike.
        let m = CudaModule::new(fixture_device_module("dev_relax_mlp_cuda_sm90"));
        let run = m.run();
        let image = run.source_image((9, 0)).unwrap();
        assert_eq!(image.kind, ImageKind::Cubin);
        assert!(Arc::ptr_eq(&image, &run.source_image((9, 0)).unwrap()), "compiled once");
        let bytes = object::pod::bytes_of_slice(&image.words);
        let elf = object::File::parse(bytes).unwrap();
        let symbols: Vec<&str> =
            object::Object::symbols(&elf).filter_map(|s| object::ObjectSymbol::name(&s).ok()).collect();
        for (kernel, _) in &run.device.functions {
            assert!(symbols.contains(&kernel.as_str()), "no symbol {kernel} in the cubin");
        }
        // An architecture past what NVRTC knows gets PTX for the newest it knows below.
        let newest = nvrtc::supported_archs().unwrap().into_iter().max().unwrap();
        let past = run.source_image((newest / 10 + 1, 9)).unwrap();
        assert_eq!(past.kind, ImageKind::Ptx);
        // An architecture before the oldest is an error, remembered.
        let e = run.source_image((1, 0)).unwrap_err();
        assert!(e.contains("cannot compile for compute capability 1.0"), "{e}");
        // A source that does not compile comes back with NVRTC's log.
        let info = FunctionInfo::new("k", vec![DataType::HANDLE], vec!["threadIdx.x".into()]);
        let bad = DeviceModule::new(
            CUDA,
            "cuda",
            vec![("k".into(), info)],
            b"extern \"C\" __global__ void k(float* p) { nope(p); }".to_vec(),
        );
        let e = compile_source(&bad, (8, 0)).unwrap_err();
        assert!(e.contains("could not compile") && e.contains("nope"), "{e}");
    }

    /// `out[i] = a[i] + b[i]` for `i < n` (mblob's demo kernel).
    const VECTOR_ADD_PTX: &str = "
.version 6.0
.target sm_50
.address_size 64
.visible .entry vector_add(.param .u64 pa, .param .u64 pb, .param .u64 pout, .param .u32 pn)
{
	.reg .pred %p<2>;
	.reg .f32 %f<4>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<11>;
	ld.param.u64 %rd1, [pa];
	ld.param.u64 %rd2, [pb];
	ld.param.u64 %rd3, [pout];
	ld.param.u32 %r2, [pn];
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.s32 %r1, %r3, %r4, %r5;
	setp.ge.u32 %p1, %r1, %r2;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd4, %rd1;
	cvta.to.global.u64 %rd5, %rd2;
	cvta.to.global.u64 %rd6, %rd3;
	mul.wide.u32 %rd7, %r1, 4;
	add.s64 %rd8, %rd4, %rd7;
	add.s64 %rd9, %rd5, %rd7;
	add.s64 %rd10, %rd6, %rd7;
	ld.global.f32 %f1, [%rd8];
	ld.global.f32 %f2, [%rd9];
	add.f32 %f3, %f1, %f2;
	st.global.f32 [%rd10], %f3;
DONE:
	ret;
}
";

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn storage_round_trips_through_a_gpu() {
        let n = (1 << 20) + 3;
        let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let s = Storage::new(Device::cuda(0), n).unwrap();
        assert_eq!(s.device(), Device::cuda(0));
        s.write(0, &data).unwrap();
        let mut back = vec![0u8; n];
        s.read(0, &mut back).unwrap();
        assert!(back == data);
        // A view, and a copy within the device.
        let t = Storage::new(Device::cuda(0), 24).unwrap();
        s.view(1000, 24).unwrap().copy_to(0, &t, 0, 24).unwrap();
        let mut small = [0u8; 24];
        t.read(0, &mut small).unwrap();
        assert_eq!(small[..], data[1000..1024]);
        assert!(matches!(s.write(n - 1, &[0; 2]), Err(DeviceError::OutOfBounds { .. })));

        // Counted on an instance of its own (the process's is shared by the tests).
        let api: Arc<dyn DeviceApi> = Arc::new(CudaApi::new(Device::cuda(0)).unwrap());
        assert!(!api.name().is_empty());
        let u = Storage::with_api(api.clone(), 64).unwrap();
        let v = Storage::with_api(api.clone(), 64).unwrap();
        u.write(0, &[7; 64]).unwrap();
        u.copy_to(0, &v, 0, 64).unwrap();
        let mut out = [0u8; 32];
        v.read(32, &mut out).unwrap();
        assert_eq!(out, [7; 32]);
        let d = api.transfers();
        assert_eq!(
            (d.host_to_device, d.host_to_device_bytes, d.device_to_host, d.device_to_host_bytes),
            (1, 64, 1, 32)
        );
        assert_eq!(d.device_to_device, 1);

        // Workspace blocks are reused by size; a stranger is refused.
        let w = api.alloc_workspace(4096).unwrap();
        api.free_workspace(w).unwrap();
        assert_eq!(api.alloc_workspace(4096).unwrap(), w);
        api.free_workspace(w).unwrap();
        assert!(api.free_workspace(DevicePtr(8)).is_err());
        api.set_device().unwrap();
        api.synchronize().unwrap();
        // A petabyte is out of memory, not a panic.
        assert!(matches!(api.alloc(1 << 50), Err(DeviceError::OutOfMemory { .. })));
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn host_code_launches_queue_on_the_current_device() {
        let u32t = DataType::parse("uint32").unwrap();
        let h = DataType::HANDLE;
        let info =
            FunctionInfo::new("vector_add", vec![h, h, h, u32t], vec!["blockIdx.x".into(), "threadIdx.x".into()]);
        let m = CudaModule::new(DeviceModule::cuda_from_ptx(
            VECTOR_ADD_PTX.as_bytes().to_vec(),
            vec![("vector_add".into(), info)],
        ));
        let n = 1000usize;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.5 * (n - i) as f32).collect();
        let cuda0 = Device::cuda(0);
        let (sa, sb, sc) = (
            Storage::new(cuda0, 4 * n).unwrap(),
            Storage::new(cuda0, 4 * n).unwrap(),
            Storage::new(cuda0, 4 * n).unwrap(),
        );
        sa.write(0, &f32_bytes(&a)).unwrap();
        sb.write(0, &f32_bytes(&b)).unwrap();
        sc.write(0, &vec![0; 4 * n]).unwrap();
        device_api::set_current_device(cuda0);
        let plan = m.run().plan("vector_add").unwrap();
        let args = [
            Value::Handle(sa.ptr().as_ptr()),
            Value::Handle(sb.ptr().as_ptr()),
            Value::Handle(sc.ptr().as_ptr()),
            Value::Int(n as i64),
            Value::Int(4),
            Value::Int(256),
        ];
        // Queued without waiting; the copy back waits for them.
        for _ in 0..3 {
            m.run().launch_packed(&plan, &args).unwrap();
        }
        let mut out = vec![0u8; 4 * n];
        sc.read(0, &mut out).unwrap();
        for (i, c) in out.chunks_exact(4).enumerate() {
            assert_eq!(f32::from_le_bytes([c[0], c[1], c[2], c[3]]), a[i] + b[i], "element {i}");
        }
        // The module's own API shares the context (and so the memory) with the device API.
        m.ensure_loaded().unwrap();
        m.launch(
            "vector_add",
            &[
                KernelArg::DevicePtr(sb.ptr().0 as u64),
                KernelArg::DevicePtr(sb.ptr().0 as u64),
                KernelArg::DevicePtr(sc.ptr().0 as u64),
                KernelArg::U32(n as u32),
            ],
            &[4, 256],
        )
        .unwrap();
        sc.read(0, &mut out).unwrap();
        assert_eq!(f32::from_le_bytes([out[4], out[5], out[6], out[7]]), 2.0 * b[1]);
        // A device that is not there.
        device_api::set_current_device(Device::cuda(4096));
        let e = m.run().launch_packed(&plan, &args).unwrap_err();
        assert!(e.contains("no such device"), "{e}");
        device_api::set_current_device(cuda0);
    }
}
