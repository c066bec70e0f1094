//! OpenCL device modules ([`OpenClModule`]).
//!
//! [`OpenClModule`] follows TVM's `opencl_module.cc` (0.19): the payload's `data` is the OpenCL
//! C source of every kernel (format `cl`). TVM's code generator writes it in sections, one per
//! kernel, each starting with a `// Function: NAME` line; like TVM, a kernel's program is built
//! from its own section (once per device, on first launch). A source without such lines (a
//! hand-written module) is built whole, once per device. Kernels are found by
//! [`Module::get_function`] as functions host code calls with the kernel arguments and then the
//! launch extents (see [`crate::payload::device::LaunchParams`]); a launch is enqueued on the
//! current OpenCL device's queue without waiting (copies back to the host wait for it).
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::HashMap;
use std::ffi::CString;
use std::fmt;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use opencl3::command_queue as clq;
use opencl3::kernel as clk;
use opencl3::types::{cl_mem, cl_uint};

use crate::device::api::{current_device, DevicePtr};
use crate::device::kernel::{Arg, ArgKind, KernelPlan};
use crate::device::opencl::api::{cl_text, guard, lock, panic_message, release_event, OpenClApi, MODULE};
use crate::device::opencl::program::{split_kernels, Kernel, Program};
use crate::device::program_cache::{self, ProgramCacheError, GET_PROGRAMS, SET_PROGRAMS};
use crate::device::{Device, DeviceError, DeviceType};
use crate::ffi::call::PackedFunction;
use crate::ffi::value::Value;
use crate::module::Module;
use crate::payload::device::{DeviceModule, LaunchDims};
use crate::payload::Payload;

/// The NDRange of a launch, as TVM makes it: the work dimension is one more than the highest
/// axis with a grid or block extent other than 1; the global size is grid times block, the
/// local size the block.
fn nd_range(dims: &LaunchDims) -> (cl_uint, [usize; 3], [usize; 3]) {
    let work_dim = (1..3).rev().find(|&i| dims.grid[i] != 1 || dims.block[i] != 1).map_or(1, |i| i + 1);
    let mut global = [1usize; 3];
    let mut local = [1usize; 3];
    for i in 0..3 {
        global[i] = dims.grid[i] as usize * dims.block[i] as usize;
        local[i] = dims.block[i] as usize;
    }
    (work_dim as cl_uint, global, local)
}

/// A program's device and section (`None`: the whole source).
type ProgramKey = (Device, Option<String>);

/// The shared state of a module: the payload, its sections, and what was built per device.
struct ModuleInner {
    device: DeviceModule,
    /// `split_kernels` of the source, once.
    sections: OnceLock<Vec<(String, Range<usize>)>>,
    /// Programs by device and section (`None`: the whole source); failures are kept too.
    programs: Mutex<HashMap<ProgramKey, Result<Arc<Program>, DeviceError>>>,
    /// Kernels by device and name.
    /// By device, then by name (looked up by `&str` on every launch: no allocation).
    kernels: Mutex<HashMap<Device, HashMap<String, Arc<Kernel>>>>,
}

impl ModuleInner {
    fn sections(&self) -> &[(String, Range<usize>)] {
        self.sections.get_or_init(|| split_kernels(&self.device.data))
    }

    /// The program holding kernel `name` on `api`'s device, built on first use.
    fn program(&self, api: &Arc<OpenClApi>, name: &str) -> Result<Arc<Program>, DeviceError> {
        let data: &[u8] = &self.device.data;
        let sections = self.sections();
        let (key, range) = if sections.is_empty() {
            (None, 0..data.len())
        } else {
            let (_, range) = sections.iter().find(|(n, _)| n == name).ok_or_else(|| DeviceError::Build {
                device: api.device,
                module: MODULE.into(),
                log: format!("the OpenCL source has no `// Function: {name}` section"),
            })?;
            (Some(name.to_owned()), range.clone())
        };
        // Held while building, so that a program is built once (TVM's `build_lock_`).
        let mut programs = lock(&self.programs);
        let key = (api.device, key);
        if let Some(built) = programs.get(&key) {
            return built.clone();
        }
        let source = data.get(range).unwrap_or_default();
        let built = guard(api.device, "clBuildProgram", || Program::build(api, source)).map(Arc::new);
        programs.insert(key, built.clone());
        built
    }

    /// Kernel `name` on `api`'s device, made on first use.
    fn kernel(&self, api: &Arc<OpenClApi>, name: &str) -> Result<Arc<Kernel>, String> {
        if let Some(k) = lock(&self.kernels).get(&api.device).and_then(|m| m.get(name)) {
            return Ok(k.clone());
        }
        let program = self.program(api, name).map_err(|e| e.to_string())?;
        let cname = CString::new(name).map_err(|_| "the kernel name holds a NUL byte".to_owned())?;
        let handle = clk::create_kernel(program.handle, &cname)
            .map_err(|c| format!("clCreateKernel: {} (is `{name}` a __kernel of the source?)", cl_text(c)))?;
        let made = Arc::new(Kernel { handle, launch: Mutex::new(()), _program: program });
        // A thread that raced here made one too: the first one in stays, the other is released.
        Ok(lock(&self.kernels).entry(api.device).or_default().entry(name.to_owned()).or_insert(made).clone())
    }

    /// TVM's `GetPreCompiledPrograms` on `api`'s device: every kernel's program (built now
    /// where it was not yet), as the bytes of a program cache ([`program_cache`]), in the
    /// order of the source's sections.
    fn precompiled_programs(&self, api: &Arc<OpenClApi>) -> Result<Vec<u8>, DeviceError> {
        let device = api.device;
        let sections = self.sections();
        if sections.is_empty() {
            return Err(DeviceError::ProgramCache { device, error: ProgramCacheError::NoSections });
        }
        let mut binaries = Vec::with_capacity(sections.len());
        for (name, _) in sections {
            let binary = self.program(api, name)?.binary()?;
            binaries.push((name.as_str(), binary));
        }
        Ok(program_cache::write(binaries.iter().map(|(n, b)| (*n, b.as_slice()))))
    }

    /// TVM's `SetPreCompiledPrograms` on `api`'s device: each kernel of the cache whose
    /// program is not built yet gets it from the cached binary (`clCreateProgramWithBinary`).
    /// The bytes are checked whole first: bad bytes, or a kernel the module does not have,
    /// change nothing. A binary the driver refuses is an error, and that kernel's program is
    /// then built from the source on first use as before.
    fn set_precompiled_programs(&self, api: &Arc<OpenClApi>, bytes: &[u8]) -> Result<(), DeviceError> {
        let device = api.device;
        let refuse = |error| DeviceError::ProgramCache { device, error };
        let cache = program_cache::parse(bytes).map_err(refuse)?;
        let sections = self.sections();
        if sections.is_empty() {
            return Err(refuse(ProgramCacheError::NoSections));
        }
        if let Some(p) = cache.iter().find(|p| !sections.iter().any(|(n, _)| n == p.name)) {
            return Err(refuse(ProgramCacheError::UnknownKernel { name: p.name.to_owned() }));
        }
        for p in cache {
            let mut programs = lock(&self.programs);
            let key = (device, Some(p.name.to_owned()));
            if matches!(programs.get(&key), Some(Ok(_))) {
                continue;
            }
            let program = guard(device, "clCreateProgramWithBinary", || Program::from_binary(api, p.binary))?;
            programs.insert(key, Ok(Arc::new(program)));
        }
        Ok(())
    }

    /// Launches kernel `name` on the current OpenCL device with packed `args`: the kernel
    /// arguments, then the launch extents.
    fn launch(&self, plan: &KernelPlan, args: &[Value]) -> Result<(), String> {
        if self.device.format != "cl" {
            return Err(format!(
                "the module's device code has format `{}`; mblob builds OpenCL C source (format `cl`) only",
                self.device.format
            ));
        }
        let name = plan.name.as_str();
        let (encoded, extents) = plan.encode(args)?;
        let params = plan.launch.as_ref().map_err(Clone::clone)?;
        let nargs = encoded.len();
        let dims = params.dims(&extents).map_err(|e| e.to_string())?;
        let device = current_device(DeviceType::OpenCl);
        let api = OpenClApi::shared(device).map_err(|e| e.to_string())?;
        // A kernel is never handed a handle that is not one of this device's buffers.
        for (i, arg) in encoded.iter().enumerate() {
            if let Arg::Handle(p) = arg {
                if *p != 0 && !api.owns(DevicePtr(*p)) {
                    return Err(format!("argument {i}: {:?} is not a buffer of this OpenCL device", *p as *const ()));
                }
            }
        }
        let kernel = self.kernel(&api, name)?;
        let (work_dim, global, local) = nd_range(&dims);
        tracing::debug!(%device, work_dim, ?global, ?local, shared = dims.dyn_shared_memory, "launch");
        let _held = lock(&kernel.launch);
        for (i, arg) in encoded.iter().enumerate() {
            let r = match arg {
                Arg::Handle(p) => {
                    let m = *p as cl_mem;
                    // SAFETY: the kernel is held (`launch`); the value is a `cl_mem` (a live
                    // buffer of this device, checked above, or null), read during the call.
                    unsafe {
                        clk::set_kernel_arg(
                            kernel.handle,
                            i as cl_uint,
                            std::mem::size_of::<cl_mem>(),
                            (&m as *const cl_mem).cast(),
                        )
                    }
                }
                // SAFETY: as above; `len` bytes of `bytes` are read during the call.
                Arg::Scalar { bytes, len } => unsafe {
                    clk::set_kernel_arg(kernel.handle, i as cl_uint, *len, bytes.as_ptr().cast())
                },
            };
            r.map_err(|c| format!("clSetKernelArg (argument {i}, {}): {}", plan.types[i], cl_text(c)))?;
        }
        if params.dyn_shared_memory {
            let bytes = (dims.dyn_shared_memory as usize).max(1);
            // SAFETY: the kernel is held; a null value with a size declares `__local` memory.
            unsafe { clk::set_kernel_arg(kernel.handle, nargs as cl_uint, bytes, ptr::null()) }
                .map_err(|c| format!("clSetKernelArg (the __local argument, {bytes} bytes): {}", cl_text(c)))?;
        }
        // SAFETY: every argument is set, the kernel is held, and the size arrays hold
        // `work_dim` (at most 3) entries and outlive the call.
        let event = unsafe {
            clq::enqueue_nd_range_kernel(
                api.queue,
                kernel.handle,
                work_dim,
                ptr::null(),
                global.as_ptr(),
                local.as_ptr(),
                0,
                ptr::null(),
            )
        }
        .map_err(|c| format!("clEnqueueNDRangeKernel (global {global:?}, local {local:?}): {}", cl_text(c)))?;
        release_event(event);
        Ok(())
    }
}

/// An OpenCL module: the payload, and per device the programs and kernels built from it on
/// first use.
pub struct OpenClModule {
    inner: Arc<ModuleInner>,
}

impl fmt::Debug for OpenClModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenClModule")
            .field("device", &self.inner.device)
            .field("programs", &lock(&self.inner.programs).len())
            .field("kernels", &lock(&self.inner.kernels).values().map(HashMap::len).sum::<usize>())
            .finish()
    }
}

impl OpenClModule {
    /// A module for an `opencl` payload; nothing is built until first use.
    pub fn new(device: DeviceModule) -> OpenClModule {
        OpenClModule {
            inner: Arc::new(ModuleInner {
                device,
                sections: OnceLock::new(),
                programs: Mutex::new(HashMap::new()),
                kernels: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The payload.
    pub fn device_module(&self) -> &DeviceModule {
        &self.inner.device
    }

    /// Builds kernel `name`'s program for `device` now (otherwise its first launch does).
    pub fn build(&self, device: Device, name: &str) -> Result<(), DeviceError> {
        let api = OpenClApi::shared(device)?;
        self.inner.program(&api, name).map(|_| ())
    }
}

impl OpenClModule {
    /// The program cache of the module on `device` ([`GET_PROGRAMS`]).
    pub fn precompiled_programs(&self, device: Device) -> Result<Vec<u8>, DeviceError> {
        let api = OpenClApi::shared(device)?;
        guard(device, GET_PROGRAMS, || self.inner.precompiled_programs(&api))
    }

    /// Loads a program cache into the module on `device` ([`SET_PROGRAMS`]).
    pub fn set_precompiled_programs(&self, device: Device, bytes: &[u8]) -> Result<(), DeviceError> {
        let api = OpenClApi::shared(device)?;
        guard(device, SET_PROGRAMS, || self.inner.set_precompiled_programs(&api, bytes))
    }

    /// [`GET_PROGRAMS`] (`get`) or [`SET_PROGRAMS`] as a function, on the calling thread's
    /// current OpenCL device.
    fn program_cache_function(&self, get: bool) -> PackedFunction {
        let module = OpenClModule { inner: self.inner.clone() };
        PackedFunction::from_fn(move |args| {
            let device = current_device(DeviceType::OpenCl);
            let name = if get { GET_PROGRAMS } else { SET_PROGRAMS };
            let _span = tracing::debug_span!("opencl_program_cache", function = name, %device).entered();
            let r = match (get, args) {
                (true, []) => module.precompiled_programs(device).map(Value::Bytes),
                (false, [Value::Bytes(b)]) => module.set_precompiled_programs(device, b).map(|()| Value::None),
                (false, [Value::Str(s)]) => module.set_precompiled_programs(device, s.as_bytes()).map(|()| Value::None),
                _ => {
                    let want = if get { "no arguments" } else { "one argument, the bytes of a program cache" };
                    return Err(format!("{name} takes {want} ({} given)", args.len()));
                }
            };
            r.map_err(|e| format!("{name}: {e}"))
        })
    }
}

impl Module for OpenClModule {
    fn type_key(&self) -> &str {
        &self.inner.device.type_key
    }

    /// A kernel, for host code that launches it (`GetFuncFromEnv` + `TVMFuncCall`): its
    /// arguments as the function table types them (buffers as `cl_mem` handles), then the
    /// launch extents in the order of its `launch_param_tags` (and the dynamic shared memory
    /// in bytes when tagged). It runs on the current OpenCL device of the calling thread.
    ///
    /// Besides its kernels it answers TVM's two functions of an OpenCL module, on the calling
    /// thread's current OpenCL device: `opencl.GetPreCompiledPrograms()`, the program of every
    /// kernel (built now where it was not yet) as the bytes of a program cache in TVM's layout
    /// ([`program_cache`]), and `opencl.SetPreCompiledPrograms(bytes)`, which gives the kernels
    /// their programs from such bytes (written by an earlier process for the same device) instead
    /// of building them from the source.
    fn get_function(&self, name: &str) -> Option<PackedFunction> {
        match name {
            GET_PROGRAMS => return Some(self.program_cache_function(true)),
            SET_PROGRAMS => return Some(self.program_cache_function(false)),
            _ => {}
        }
        let plan = KernelPlan::new(name, self.inner.device.function(name)?, ArgKind::any);
        let inner = self.inner.clone();
        Some(PackedFunction::from_fn(move |args| {
            let _span = tracing::debug_span!("opencl_launch", kernel = %plan.name).entered();
            let r = match panic::catch_unwind(AssertUnwindSafe(|| inner.launch(&plan, args))) {
                Ok(r) => r,
                Err(payload) => Err(format!("the OpenCL binding panicked: {}", panic_message(&*payload))),
            };
            r.map(|()| Value::None).map_err(|e| format!("OpenCL kernel `{}`: {e}", plan.name))
        }))
    }

    fn as_payload(&self) -> Option<&dyn Payload> {
        Some(&self.inner.device)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nd_ranges_use_the_highest_axis_in_use() {
        let dims = |grid, block| LaunchDims { grid, block, dyn_shared_memory: 0 };
        assert_eq!(nd_range(&dims([4, 1, 1], [64, 1, 1])), (1, [256, 1, 1], [64, 1, 1]));
        assert_eq!(nd_range(&dims([1, 1, 1], [1, 1, 1])), (1, [1, 1, 1], [1, 1, 1]));
        assert_eq!(nd_range(&dims([2, 3, 1], [8, 1, 1])), (2, [16, 3, 1], [8, 1, 1]));
        assert_eq!(nd_range(&dims([1, 1, 5], [1, 2, 1])), (3, [1, 2, 5], [1, 2, 1]));
    }
}
