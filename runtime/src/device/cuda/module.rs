//! CUDA device modules ([`CudaModule`], `cuda` payloads) through the driver API with cudarc
//! (feature `cuda`).
//!
//! With the feature on, `cuda` payloads load as [`CudaModule`]s (the loader is registered in
//! [`crate::registry`]). Loading a tree never touches the driver: the module keeps its
//! [`DeviceModule`] (which [`Module::as_payload`] returns, so the tree can be packed again, and
//! through which `LoadedTree::find::<DeviceModule>()` finds it as it does without the feature)
//! and loads the image into a device on first use there, once per device, after the checks of
//! [`super::image`] (a `cuda` source payload compiled with NVRTC once per module and compute
//! capability).
//!
//! Host code compiled by TVM looks a kernel up ([`Module::get_function`]) and calls it with
//! its arguments (device pointers, scalars) and launch extents (see [`crate::device::kernel`]).
//! The kernel runs on the current CUDA device of the calling thread (`__tvm_set_device`,
//! [`crate::device::api::current_device`]). How the arguments are passed and the launch tags
//! are worked out once per kernel, the kernel is looked up once per device, and a launch is
//! queued without waiting for it: the stream keeps the order, and a copy to the host (or
//! [`crate::device::DeviceApi::synchronize`]) waits, so the error of a kernel that faults comes
//! back from that call. A kernel that reads or writes outside its buffers faults on the device
//! and the driver reports it; the host's memory is not at risk.
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use smallvec::SmallVec;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::device::api::current_device;
use crate::device::cuda::api::{catch, describe, driver_present, guard, open_device, NO_DRIVER};
use crate::device::cuda::image::{compile_source, ptx_hint, Image};
use crate::device::cuda::nvrtc;
use crate::device::kernel::{ArgKind, KernelPlan};
use crate::device::{Device, DeviceType};
use crate::error::{Error, Result};
use crate::ffi::call::PackedFunction;
use crate::ffi::value::Value;
use crate::module::Module;
use crate::payload::device::{DeviceModule, LaunchDims};
use crate::payload::Payload;

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
pub(super) struct Run {
    pub(super) device: DeviceModule,
    /// The image loaded per device ordinal (or why it did not load).
    images: PerDevice<Result<Arc<Loaded>, String>>,
    /// One plan per entry of `device.functions`.
    plans: Vec<Arc<Plan>>,
    /// A `cuda` (source) payload compiled with NVRTC, per compute capability (or why it did
    /// not compile).
    compiled: Mutex<HashMap<(u32, u32), Compiled>>,
}

/// A `cuda` payload compiled for one compute capability, or why it did not compile.
type Compiled = Result<Arc<Image>, String>;

/// A kernel's argument plan ([`KernelPlan`], CUDA taking the kinds TVM's CUDA module passes)
/// and the kernel in each device it has run on.
struct Plan {
    args: KernelPlan,
    /// The kernel per device ordinal (or why it cannot run there).
    ready: PerDevice<Result<Ready, String>>,
}

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
    pub(super) fn run(&self) -> &Arc<Run> {
        self.run.get_or_init(|| {
            let device = self.device.clone();
            let plans = device
                .functions
                .iter()
                .map(|(name, info)| {
                    Arc::new(Plan { args: KernelPlan::new(name, info, ArgKind::tvm_cuda), ready: PerDevice::default() })
                })
                .collect();
            Arc::new(Run { device, images: PerDevice::default(), plans, compiled: Mutex::default() })
        })
    }

    /// The payload.
    pub fn device_module(&self) -> &DeviceModule {
        &self.device
    }

    /// Whether the CUDA driver library can be opened (checked once per process).
    pub fn driver_present() -> bool {
        driver_present()
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
}

impl Run {
    /// The image in device `ordinal`, loaded on first use.
    fn loaded(&self, ordinal: usize) -> Result<Arc<Loaded>, String> {
        self.images.with(ordinal, || Loaded::new(self, ordinal), Clone::clone)
    }

    /// The image of a `cuda` (source) payload for compute capability `cc`, compiled with
    /// NVRTC on first use (once per module and capability: devices alike share it; the lock
    /// makes a second device wait for the first's compile rather than compile again).
    pub(super) fn source_image(&self, cc: (u32, u32)) -> Result<Arc<Image>, String> {
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        compiled.entry(cc).or_insert_with(|| compile_source(&self.device, cc).map(Arc::new)).clone()
    }

    /// The plan of kernel `name`, if the function table has it.
    #[cfg(test)]
    fn plan(&self, name: &str) -> Option<Arc<Plan>> {
        let index = self.device.functions.iter().position(|(n, _)| n == name)?;
        self.plans.get(index).cloned()
    }

    /// Runs `f` on the kernel of `plan` in device `ordinal` (loading the image and looking the
    /// kernel up on first use there).
    #[inline]
    fn with_ready<R>(
        &self,
        plan: &Plan,
        ordinal: usize,
        f: impl FnOnce(&Ready) -> Result<R, String>,
    ) -> Result<R, String> {
        let init = || Ready::new(self.loaded(ordinal)?, &plan.args, &self.device);
        plan.ready.with(ordinal, init, |ready| match ready {
            Ok(ready) => f(ready),
            Err(e) => Err(e.clone()),
        })
    }

    /// A launch by host code: `args` are the kernel's arguments then its launch extents. The
    /// kernel runs on the thread's current CUDA device and is not waited for.
    fn launch_packed(&self, plan: &Plan, args: &[Value]) -> Result<(), String> {
        let name = &plan.args.name;
        let fail = |what: &str| format!("cuda: kernel `{name}`: {what}");
        let params = plan.args.launch.as_ref().map_err(|e| fail(e))?;
        let (encoded, extents) = plan.args.encode(args).map_err(|e| fail(&e))?;
        let mut slots: SmallVec<[u64; 16]> = encoded.iter().map(|a| a.slot()).collect();
        let dims = params.dims(&extents).map_err(|e| fail(&e.to_string()))?;
        let device = current_device(DeviceType::Cuda);
        let ordinal = usize::try_from(device.device_id).map_err(|_| fail(&format!("{device} is not a device")))?;
        tracing::trace!(kernel = %name, %device, grid = ?dims.grid, block = ?dims.block, "launch");
        // SAFETY: the slots hold one value per parameter, of the kinds the function info
        // gives (checked against the kernel's parameter sizes where the driver tells them);
        // device pointers are host code's, which keeps them alive while its kernels run (it
        // frees through the device API, whose `cuMemFree` waits for the device).
        let launched =
            self.with_ready(plan, ordinal, |ready| catch("launch", || unsafe { ready.launch(&mut slots, dims) }));
        launched.map_err(|e| format!("cuda: kernel `{name}` on {device}: {e}"))
    }
}

impl Module for CudaModule {
    fn type_key(&self) -> &str {
        &self.device.type_key
    }
    /// A kernel, for host code that launches it (`GetFuncFromEnv` + `TVMFuncCall`): its
    /// arguments as the function table types them (device pointers as handles), then the
    /// launch extents (see [`crate::device::kernel`]). It runs on the calling thread's
    /// current CUDA device, queued on its stream.
    fn get_function(&self, name: &str) -> Option<PackedFunction> {
        // Other modules' names are answered without making the driver side.
        let index = self.device.functions.iter().position(|(n, _)| n == name)?;
        let run = self.run().clone();
        let plan = run.plans.get(index)?.clone();
        Some(PackedFunction::from_fn(move |args| {
            run.launch_packed(&plan, args)?;
            Ok(Value::None)
        }))
    }
    fn as_payload(&self) -> Option<&dyn Payload> {
        Some(&self.device)
    }
    fn as_any(&self) -> &dyn Any {
        self
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::api::set_current_device;
    use crate::device::storage::Storage;
    use crate::format::DataType;
    use crate::payload::device::{FunctionInfo, CUDA};

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
            m.ensure_loaded_on(Device::cuda(1)).unwrap_err(),
            m.device_name().unwrap_err(),
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
        assert!(e.starts_with("cuda: kernel `k`: takes 2 arguments (handle, int32) and 2 launch values"), "{e}");
        let e = inner.launch_packed(&plan, &[Value::None, Value::Int(1), Value::Int(1)]).unwrap_err();
        assert!(e.contains("3 given"), "{e}");
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
            set_current_device(Device::cuda(id));
            let e = inner.launch_packed(&plan, &args).unwrap_err();
            assert!(e.starts_with(&format!("cuda: kernel `k` on cuda:{id}: no CUDA driver found")), "{e}");
            let e = m.ensure_loaded_on(Device::cuda(id)).unwrap_err();
            assert!(e.to_string().starts_with("cuda: no CUDA driver found"), "{e}");
        }
        set_current_device(Device::cuda(0));
        assert!(m.ensure_loaded_on(Device::cpu(0)).is_err());
        let state = format!("{m:?}");
        assert!(state.contains("failed to load on cuda:0") && state.contains("failed to load on cuda:12"), "{state}");
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
        set_current_device(cuda0);
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
        // The same launch through the module's function, as host code makes it.
        let add = m.get_function("vector_add").unwrap();
        let args2 = [
            Value::Handle(sb.ptr().as_ptr()),
            Value::Handle(sb.ptr().as_ptr()),
            Value::Handle(sc.ptr().as_ptr()),
            Value::Int(n as i64),
            Value::Int(4),
            Value::Int(256),
        ];
        // SAFETY: a Rust function; the handles are live allocations of cuda:0 of 4n bytes.
        unsafe { add.call(&args2) }.unwrap();
        sc.read(0, &mut out).unwrap();
        assert_eq!(f32::from_le_bytes([out[4], out[5], out[6], out[7]]), 2.0 * b[1]);
        // A device that is not there.
        set_current_device(Device::cuda(4096));
        let e = m.run().launch_packed(&plan, &args).unwrap_err();
        assert!(e.contains("no such device"), "{e}");
        set_current_device(cuda0);
    }
}
