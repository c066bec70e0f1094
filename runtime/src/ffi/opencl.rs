//! OpenCL device memory ([`OpenClApi`]) and OpenCL device modules ([`OpenClModule`]) through
//! opencl3, which opens the OpenCL ICD loader (`libOpenCL.so.1`) at run time (feature `opencl`):
//! a build with the feature runs on machines without OpenCL, where opening a device is a
//! [`DeviceError::NoDriver`].
//!
//! Devices are numbered as TVM numbers them: every device of every platform, GPUs first, then
//! the others (accelerators, CPUs such as pocl's) in platform order. Each opened device has one
//! context and one in-order command queue; [`OpenClApi::shared`] gives the one instance of a
//! device, the same one [`super::device_api::device_api`] returns.
//!
//! A device pointer ([`DevicePtr`]) is a `cl_mem` handle. Views are sub-buffers (their origin
//! must be a multiple of the device's `CL_DEVICE_MEM_BASE_ADDR_ALIGN`); every buffer and view
//! the API made is remembered with its size, so copies are bounds-checked and a kernel is never
//! handed a handle that is not one of this device's buffers.
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
use std::ffi::{c_void, CString};
use std::fmt;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use opencl3::command_queue as clq;
use opencl3::context::context as clctx;
use opencl3::device as cldev;
use opencl3::error_codes as clerr;
use opencl3::event as clev;
use opencl3::kernel as clk;
use opencl3::memory as clmem;
use opencl3::platform::platform as clplat;
use opencl3::program as clprog;
use opencl3::types::{
    cl_buffer_region, cl_command_queue, cl_context, cl_device_id, cl_device_type, cl_event, cl_int, cl_kernel, cl_mem,
    cl_program, cl_uint,
};

use super::device_api::{current_device, DeviceApi, DevicePtr, TransferCounters, TransferStats, WorkspacePool};
use crate::device::{Device, DeviceError, DeviceType};
use crate::ffi::Value;
use crate::format::DataType;
use crate::module::{Module, Symbol};
use crate::payload::device::{DeviceModule, FunctionInfo, LaunchDims, LaunchParams};
use crate::payload::Payload;

/// What to install when there is no OpenCL.
const INSTALL_HINT: &str = "install an OpenCL driver and the ICD loader, e.g. \
     `apt-get install ocl-icd-libopencl1 pocl-opencl-icd` (pocl runs OpenCL on the CPU), or set \
     OPENCL_DYLIB_PATH to the loader's path";

/// The module name in build errors.
const MODULE: &str = "opencl";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An OpenCL error code as text: `CL_OUT_OF_RESOURCES (-5)`.
fn cl_text(code: cl_int) -> String {
    match code {
        clerr::DLOPEN_RUNTIME_LOAD_FAILED => format!("libOpenCL.so.1 cannot be opened ({code})"),
        clerr::DLOPEN_FUNCTION_NOT_AVAILABLE => {
            format!("the OpenCL library lacks this function (DLOPEN_FUNCTION_NOT_AVAILABLE, {code})")
        }
        _ => format!("{} ({code})", clerr::error_text(code)),
    }
}

fn driver_error(device: Device, call: &str, code: cl_int) -> DeviceError {
    DeviceError::Driver { device, call: call.into(), detail: cl_text(code) }
}

/// The message of a panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

/// Runs driver calls, turning a panic in the binding into an error.
fn guard<T>(device: Device, what: &str, f: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(DeviceError::Driver {
            device,
            call: what.into(),
            detail: format!("the OpenCL binding panicked: {}", panic_message(&*payload)),
        }),
    }
}

/// Releases an event returned by an enqueue (the command goes on without it).
fn release_event(event: cl_event) {
    if !event.is_null() {
        // SAFETY: `event` was just returned by an enqueue call and is released once, here.
        let _ = unsafe { clev::release_event(event) };
    }
}

/// A device's information as bytes, then as a number or a string.
fn info_u64(id: cl_device_id, param: cl_uint) -> Option<u64> {
    let b = cldev::get_device_data(id, param).ok()?;
    Some(u64::from_ne_bytes(b.get(..8)?.try_into().ok()?))
}

fn info_u32(id: cl_device_id, param: cl_uint) -> Option<u32> {
    let b = cldev::get_device_data(id, param).ok()?;
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

fn info_string(id: cl_device_id, param: cl_uint) -> Option<String> {
    let b = cldev::get_device_data(id, param).ok()?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    Some(String::from_utf8_lossy(&b[..end]).trim().to_owned())
}

/// Every OpenCL device, numbered as TVM numbers them: GPUs first, then the others, each in
/// platform order. `device` is only for errors.
fn all_devices(device: Device) -> Result<Vec<cl_device_id>, DeviceError> {
    let platforms = match clplat::get_platform_ids() {
        Ok(p) => p,
        Err(clerr::DLOPEN_RUNTIME_LOAD_FAILED) => {
            return Err(DeviceError::NoDriver {
                device,
                detail: format!("the OpenCL ICD loader libOpenCL.so.1 cannot be opened; {INSTALL_HINT}"),
            })
        }
        Err(code) => {
            return Err(DeviceError::NoDriver {
                device,
                detail: format!("libOpenCL.so.1 lists no OpenCL platform: {}; {INSTALL_HINT}", cl_text(code)),
            })
        }
    };
    if platforms.is_empty() {
        return Err(DeviceError::NoDriver {
            device,
            detail: format!("libOpenCL.so.1 lists no OpenCL platform; {INSTALL_HINT}"),
        });
    }
    let mut found: Vec<(bool, cl_device_id)> = Vec::new();
    for platform in platforms {
        match cldev::get_device_ids(platform, cldev::CL_DEVICE_TYPE_ALL) {
            Ok(ids) => {
                for id in ids {
                    let kind: cl_device_type = info_u64(id, cldev::CL_DEVICE_TYPE).unwrap_or(0);
                    found.push((kind & cldev::CL_DEVICE_TYPE_GPU != 0, id));
                }
            }
            Err(code) => tracing::debug!(error = %cl_text(code), "an OpenCL platform lists no devices"),
        }
    }
    // Stable: GPUs first, each group in platform order.
    found.sort_by_key(|(gpu, _)| !*gpu);
    Ok(found.into_iter().map(|(_, id)| id).collect())
}

/// A buffer or sub-buffer the API made: its size, and where it lies in its root buffer (itself,
/// at 0, for a buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mem {
    size: usize,
    root: usize,
    origin: usize,
}

/// The OpenCL device API: one device, its context and in-order command queue, and the buffers
/// made on it.
pub struct OpenClApi {
    device: Device,
    id: cl_device_id,
    name: String,
    /// `CL_DEVICE_MAX_MEM_ALLOC_SIZE`.
    max_alloc: u64,
    /// `CL_DEVICE_MEM_BASE_ADDR_ALIGN`, in bytes.
    base_align: usize,
    context: cl_context,
    queue: cl_command_queue,
    /// Every live buffer and sub-buffer, by handle.
    mems: Mutex<HashMap<usize, Mem>>,
    counters: TransferCounters,
    workspace: WorkspacePool,
}

// SAFETY: the handles are OpenCL objects, which the OpenCL API (1.1 and later) lets any thread
// use: every call is thread-safe except `clSetKernelArg` on one kernel, and kernels are not kept
// here (see `Kernel`). The rest of the state is behind mutexes or atomics.
unsafe impl Send for OpenClApi {}
// SAFETY: as above.
unsafe impl Sync for OpenClApi {}

impl fmt::Debug for OpenClApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenClApi")
            .field("device", &self.device)
            .field("name", &self.name)
            .field("buffers", &lock(&self.mems).len())
            .finish()
    }
}

impl OpenClApi {
    /// Opens `device` (an OpenCL device): the same instance on every call, shared with
    /// [`super::device_api::device_api`].
    pub fn open(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
        Ok(OpenClApi::shared(device)?)
    }

    /// The one instance of `device`, opened on first use.
    pub fn shared(device: Device) -> Result<Arc<OpenClApi>, DeviceError> {
        static APIS: OnceLock<Mutex<HashMap<Device, Arc<OpenClApi>>>> = OnceLock::new();
        if device.device_type != DeviceType::OpenCl {
            return Err(DeviceError::Unsupported { device, what: "the OpenCL device API".into() });
        }
        // Held while opening, so that a device is opened once.
        let mut apis = lock(APIS.get_or_init(Default::default));
        if let Some(api) = apis.get(&device) {
            return Ok(api.clone());
        }
        let api = Arc::new(guard(device, "opening the device", || OpenClApi::create(device))?);
        apis.insert(device, api.clone());
        Ok(api)
    }

    /// How many OpenCL devices there are (an error when there is no OpenCL at all).
    pub fn device_count() -> Result<usize, DeviceError> {
        let device = Device::opencl(0);
        guard(device, "listing devices", || all_devices(device).map(|d| d.len()))
    }

    /// Opens `device` for a new instance (not shared).
    fn create(device: Device) -> Result<OpenClApi, DeviceError> {
        let _span = tracing::debug_span!("opencl_open", %device).entered();
        let ids = all_devices(device)?;
        let available = ids.len();
        let id = usize::try_from(device.device_id)
            .ok()
            .and_then(|i| ids.get(i).copied())
            .ok_or(DeviceError::NoDevice { device, available })?;
        let name = info_string(id, cldev::CL_DEVICE_NAME).unwrap_or_default();
        let max_alloc = info_u64(id, cldev::CL_DEVICE_MAX_MEM_ALLOC_SIZE).unwrap_or(u64::MAX);
        // In bits; at least 1024 on a full-profile device (the size of a `long16`).
        let base_align = info_u32(id, cldev::CL_DEVICE_MEM_BASE_ADDR_ALIGN).map_or(128, |bits| (bits / 8).max(1));
        let context = clctx::create_context(&[id], ptr::null(), None, ptr::null_mut())
            .map_err(|c| driver_error(device, "clCreateContext", c))?;
        // SAFETY: `id` is a device of `context` (it was made from it); no properties: in order.
        let queue = match unsafe { clq::create_command_queue(context, id, 0) } {
            // An OpenCL 3.0 loader may drop the 1.x entry point: use its successor.
            // SAFETY: as above; a null property list is allowed.
            Err(clerr::DLOPEN_FUNCTION_NOT_AVAILABLE) => unsafe {
                clq::create_command_queue_with_properties(context, id, ptr::null())
            },
            other => other,
        };
        let queue = match queue {
            Ok(q) => q,
            Err(code) => {
                // SAFETY: the context was made above and nothing else holds it.
                let _ = unsafe { clctx::release_context(context) };
                return Err(driver_error(device, "clCreateCommandQueue", code));
            }
        };
        tracing::debug!(name, max_alloc, base_align, available, "opened");
        Ok(OpenClApi {
            device,
            id,
            name,
            max_alloc,
            base_align: base_align as usize,
            context,
            queue,
            mems: Mutex::new(HashMap::new()),
            counters: TransferCounters::default(),
            workspace: WorkspacePool::default(),
        })
    }

    /// The alignment a view's offset needs (`CL_DEVICE_MEM_BASE_ADDR_ALIGN`, in bytes).
    pub fn base_alignment(&self) -> usize {
        self.base_align
    }

    /// The largest single allocation (`CL_DEVICE_MAX_MEM_ALLOC_SIZE`).
    pub fn max_alloc_size(&self) -> u64 {
        self.max_alloc
    }

    /// Whether `ptr` is a live buffer or view of this device.
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        lock(&self.mems).contains_key(&ptr.0)
    }

    fn driver(&self, call: &str, code: cl_int) -> DeviceError {
        driver_error(self.device, call, code)
    }

    /// The buffer or view at `ptr`, with `offset..offset + n` checked to lie within it.
    fn mem(&self, ptr: DevicePtr, what: &'static str, offset: usize, n: usize) -> Result<Mem, DeviceError> {
        let m = lock(&self.mems).get(&ptr.0).copied().ok_or_else(|| DeviceError::Driver {
            device: self.device,
            call: what.into(),
            detail: format!("{:#x} is not a live buffer of this device", ptr.0),
        })?;
        match offset.checked_add(n) {
            Some(end) if end <= m.size => Ok(m),
            end => Err(DeviceError::OutOfBounds {
                device: self.device,
                what,
                offset: offset as u64,
                end: end.map_or(u64::MAX, |e| e as u64),
                size: m.size as u64,
            }),
        }
    }

    /// Releases a buffer or view the API made.
    fn release(&self, handle: usize) {
        if lock(&self.mems).remove(&handle).is_some() {
            // SAFETY: the handle was a live memory object of this API (it was in the table,
            // from which it is now removed, so it is released once).
            if let Err(code) = unsafe { clmem::release_mem_object(handle as cl_mem) } {
                tracing::debug!(error = %cl_text(code), "clReleaseMemObject failed");
            }
        }
    }

    fn enqueue_copy(
        &self,
        src: cl_mem,
        src_offset: usize,
        dst: cl_mem,
        dst_offset: usize,
        n: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: both are live memory objects of this context, and the ranges were checked
        // to lie within them.
        let event =
            unsafe { clq::enqueue_copy_buffer(self.queue, src, dst, src_offset, dst_offset, n, 0, ptr::null()) }
                .map_err(|c| self.driver("clEnqueueCopyBuffer", c))?;
        release_event(event);
        Ok(())
    }
}

impl DeviceApi for OpenClApi {
    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        let oom = || DeviceError::OutOfMemory { device: self.device, bytes: nbytes as u64 };
        let n = nbytes.max(1);
        if n as u64 > self.max_alloc {
            return Err(oom());
        }
        // SAFETY: read-write, no host pointer: the driver allocates `n` bytes itself.
        let mem = unsafe { clmem::create_buffer(self.context, clmem::CL_MEM_READ_WRITE, n, ptr::null_mut()) }.map_err(
            |code| match code {
                clerr::CL_MEM_OBJECT_ALLOCATION_FAILURE
                | clerr::CL_OUT_OF_RESOURCES
                | clerr::CL_OUT_OF_HOST_MEMORY
                | clerr::CL_INVALID_BUFFER_SIZE => oom(),
                other => self.driver("clCreateBuffer", other),
            },
        )?;
        lock(&self.mems).insert(mem as usize, Mem { size: n, root: mem as usize, origin: 0 });
        Ok(DevicePtr(mem as usize))
    }

    unsafe fn free(&self, ptr: DevicePtr, _nbytes: usize) {
        self.release(ptr.0);
    }

    unsafe fn view(&self, base: DevicePtr, offset: usize, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        let m = self.mem(base, "view", offset, nbytes)?;
        // Sub-buffers of sub-buffers are not allowed: views are made of the root buffer.
        let (origin, size) = if nbytes == 0 {
            // Nothing can be read through an empty view: any byte of the root will do.
            (0, 1)
        } else {
            (m.origin + offset, nbytes)
        };
        if origin % self.base_align != 0 {
            return Err(DeviceError::Unsupported {
                device: self.device,
                what: format!(
                    "a view at byte {origin} of a buffer (OpenCL sub-buffers must start at a multiple of \
                     {} bytes, the device's CL_DEVICE_MEM_BASE_ADDR_ALIGN)",
                    self.base_align
                ),
            });
        }
        let region = cl_buffer_region { origin, size };
        // SAFETY: the root is a live buffer of this API and `origin + size` lies within it
        // (checked above against the view's extent within the root); `region` outlives the call.
        let sub = unsafe {
            clmem::create_sub_buffer(
                m.root as cl_mem,
                clmem::CL_MEM_READ_WRITE,
                clmem::CL_BUFFER_CREATE_TYPE_REGION,
                (&region as *const cl_buffer_region).cast::<c_void>(),
            )
        }
        .map_err(|code| match code {
            clerr::CL_MISALIGNED_SUB_BUFFER_OFFSET => DeviceError::Unsupported {
                device: self.device,
                what: format!("a view at byte {origin} of a buffer (the driver refuses the sub-buffer's alignment)"),
            },
            clerr::CL_MEM_OBJECT_ALLOCATION_FAILURE | clerr::CL_OUT_OF_RESOURCES | clerr::CL_OUT_OF_HOST_MEMORY => {
                DeviceError::OutOfMemory { device: self.device, bytes: size as u64 }
            }
            other => self.driver("clCreateSubBuffer", other),
        })?;
        lock(&self.mems).insert(sub as usize, Mem { size, root: m.root, origin });
        Ok(DevicePtr(sub as usize))
    }

    unsafe fn free_view(&self, view: DevicePtr) {
        self.release(view.0);
    }

    unsafe fn copy_from_host(&self, dst: DevicePtr, offset: usize, src: &[u8]) -> Result<(), DeviceError> {
        self.mem(dst, "copy from host", offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let _span = tracing::debug_span!("opencl_write", bytes = src.len()).entered();
        // SAFETY: `dst` is a live buffer of this API holding `offset + src.len()` bytes
        // (checked); the write is blocking, so `src` is read before the call returns.
        let event = unsafe {
            clq::enqueue_write_buffer(
                self.queue,
                dst.0 as cl_mem,
                cldev::CL_TRUE,
                offset,
                src.len(),
                src.as_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|c| self.driver("clEnqueueWriteBuffer", c))?;
        release_event(event);
        self.counters.host_to_device(src.len());
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.mem(src, "copy to host", offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _span = tracing::debug_span!("opencl_read", bytes = dst.len()).entered();
        // SAFETY: `src` is a live buffer of this API holding `offset + dst.len()` bytes
        // (checked); the read is blocking, so `dst` is written before the call returns.
        let event = unsafe {
            clq::enqueue_read_buffer(
                self.queue,
                src.0 as cl_mem,
                cldev::CL_TRUE,
                offset,
                dst.len(),
                dst.as_mut_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|c| self.driver("clEnqueueReadBuffer", c))?;
        release_event(event);
        self.counters.device_to_host(dst.len());
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        src: DevicePtr,
        src_offset: usize,
        dst: DevicePtr,
        dst_offset: usize,
        n: usize,
    ) -> Result<(), DeviceError> {
        let s = self.mem(src, "copy", src_offset, n)?;
        let d = self.mem(dst, "copy", dst_offset, n)?;
        if n == 0 {
            return Ok(());
        }
        self.counters.device_to_device();
        let (from, to) = (s.origin + src_offset, d.origin + dst_offset);
        let overlap = s.root == d.root && from < to + n && to < from + n;
        if !overlap {
            return self.enqueue_copy(src.0 as cl_mem, src_offset, dst.0 as cl_mem, dst_offset, n);
        }
        if from == to {
            return Ok(());
        }
        // OpenCL refuses overlapping copies (CL_MEM_COPY_OVERLAP): go through a temporary
        // buffer, released once both copies are queued (the driver keeps it until they ran).
        let tmp = self.alloc(n)?;
        let r = self
            .enqueue_copy(src.0 as cl_mem, src_offset, tmp.0 as cl_mem, 0, n)
            .and_then(|()| self.enqueue_copy(tmp.0 as cl_mem, 0, dst.0 as cl_mem, dst_offset, n));
        self.release(tmp.0);
        r
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        clq::finish(self.queue).map_err(|c| self.driver("clFinish", c))
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

impl Drop for OpenClApi {
    fn drop(&mut self) {
        let _ = clq::finish(self.queue);
        // Pooled workspace blocks are in the buffer table too: released with the rest.
        let _ = self.workspace.drain();
        let mut mems: Vec<(usize, Mem)> = lock(&self.mems).drain().collect();
        // Views before the buffers they are part of.
        mems.sort_by_key(|(h, m)| m.root == *h);
        for (handle, _) in mems {
            // SAFETY: every entry is a live memory object of this API, released once, here
            // (the table was drained); nothing uses the API any more.
            let _ = unsafe { clmem::release_mem_object(handle as cl_mem) };
        }
        // SAFETY: the queue and the context were made by `create` and are released once, here,
        // after every object made from them (programs and kernels hold an `Arc` of this API).
        unsafe {
            let _ = clq::release_command_queue(self.queue);
            let _ = clctx::release_context(self.context);
        }
    }
}

/// A built program; released when dropped (after its kernels, which hold it).
struct Program {
    handle: cl_program,
    /// Keeps the context alive while the program is.
    _api: Arc<OpenClApi>,
}

// SAFETY: a `cl_program` may be used from any thread (OpenCL API calls are thread-safe, and a
// program is only read after it is built).
unsafe impl Send for Program {}
// SAFETY: as above.
unsafe impl Sync for Program {}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: made by `Program::build`, released once, here; its kernels held it, so none
        // is left.
        let _ = unsafe { clprog::release_program(self.handle) };
    }
}

/// Whether a `&str` is laid out as (data pointer, length), as cl3's
/// `create_program_with_source` assumes when it passes a slice of `&str` as a `const char**`.
fn str_is_pointer_first(s: &str) -> bool {
    // SAFETY: a `&str` is two words (transmute checks the sizes at compile time), both
    // initialised integers; reading them as `usize`s reads no memory they point to.
    let words = unsafe { std::mem::transmute::<&str, [usize; 2]>(s) };
    words[0] == s.as_ptr() as usize
}

impl Program {
    /// Builds `source` for the API's device; a build failure is a [`DeviceError::Build`] with
    /// the driver's log.
    fn build(api: &Arc<OpenClApi>, source: &[u8]) -> Result<Program, DeviceError> {
        let device = api.device;
        let _span = tracing::debug_span!("opencl_build", %device, bytes = source.len()).entered();
        let build_error = |log: String| DeviceError::Build { device, module: MODULE.into(), log };
        let text =
            std::str::from_utf8(source).map_err(|e| build_error(format!("the OpenCL C source is not UTF-8 ({e})")))?;
        if text.trim().is_empty() {
            return Err(build_error("the OpenCL C source is empty".into()));
        }
        if !str_is_pointer_first(text) {
            return Err(DeviceError::Unsupported {
                device,
                what: "building OpenCL C with this Rust compiler (unexpected `&str` layout)".into(),
            });
        }
        let handle = clprog::create_program_with_source(api.context, &[text])
            .map_err(|c| api.driver("clCreateProgramWithSource", c))?;
        let program = Program { handle, _api: api.clone() };
        let options = CString::default();
        match clprog::build_program(handle, &[api.id], &options, None, ptr::null_mut()) {
            Ok(()) => Ok(program),
            Err(code) => {
                let log = clprog::get_program_build_data(handle, api.id, clprog::CL_PROGRAM_BUILD_LOG)
                    .map(|b| {
                        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                        String::from_utf8_lossy(&b[..end]).trim_end().to_owned()
                    })
                    .unwrap_or_else(|c| format!("(no build log: {})", cl_text(c)));
                Err(build_error(format!("clBuildProgram: {}\n{log}", cl_text(code))))
            }
        }
    }
}

/// A kernel of a built program. `clSetKernelArg` changes the kernel object, so setting the
/// arguments and enqueueing happen under `launch`.
struct Kernel {
    handle: cl_kernel,
    launch: Mutex<()>,
    /// Keeps the program alive while the kernel is.
    _program: Arc<Program>,
}

// SAFETY: the kernel is only changed (`clSetKernelArg`) and enqueued while `launch` is held;
// every other OpenCL call on it is thread-safe.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: made by `clCreateKernel` in `ModuleInner::kernel`, released once, here; launches
        // already queued keep their own reference.
        let _ = unsafe { clk::release_kernel(self.handle) };
    }
}

/// A kernel argument, as `clSetKernelArg` takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum KernelArg {
    /// A buffer (or null).
    Mem(cl_mem),
    /// A scalar: its first `len` bytes, little-endian.
    Scalar([u8; 8], usize),
}

impl KernelArg {
    fn scalar(bytes: &[u8]) -> KernelArg {
        let mut b = [0u8; 8];
        let n = bytes.len().min(8);
        b[..n].copy_from_slice(&bytes[..n]);
        KernelArg::Scalar(b, n)
    }
}

/// `f32` to IEEE half, rounding to nearest even.
fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rounded = (m + half - 1 + ((m >> shift) & 1)) >> shift;
        return sign | rounded as u16;
    }
    let rounded = man + 0xfff + ((man >> 13) & 1);
    let out = ((e as u32) << 10) + (rounded >> 13);
    sign | out.min(0x7c00) as u16
}

/// `f32` to bfloat16, rounding to nearest even.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Argument `i`, of type `t`, as `clSetKernelArg` takes it; `live` says whether a handle is a
/// buffer of the device.
fn encode_arg(i: usize, t: DataType, v: &Value, live: &dyn Fn(usize) -> bool) -> Result<KernelArg, String> {
    let bad = || format!("argument {i}: a {t} parameter cannot take {v:?}");
    if t.lanes != 1 {
        return Err(format!("argument {i} has vector type {t}, which cannot be passed to a kernel"));
    }
    let range = |x: i64| format!("argument {i}: {x} is not a {t}");
    Ok(match (t.code, t.bits, v) {
        (3, _, Value::None) => KernelArg::Mem(ptr::null_mut()),
        (3, _, Value::Handle(p)) if p.is_null() => KernelArg::Mem(ptr::null_mut()),
        (3, _, Value::Handle(p)) => {
            if !live(*p as usize) {
                return Err(format!("argument {i}: {p:?} is not a buffer of this OpenCL device"));
            }
            KernelArg::Mem(*p as cl_mem)
        }
        (0, 8, Value::Int(x)) => KernelArg::scalar(&i8::try_from(*x).map_err(|_| range(*x))?.to_le_bytes()),
        (0, 16, Value::Int(x)) => KernelArg::scalar(&i16::try_from(*x).map_err(|_| range(*x))?.to_le_bytes()),
        (0, 32, Value::Int(x)) => KernelArg::scalar(&i32::try_from(*x).map_err(|_| range(*x))?.to_le_bytes()),
        (0, 64, Value::Int(x)) => KernelArg::scalar(&x.to_le_bytes()),
        (1, 1, Value::Int(x)) => KernelArg::scalar(&[u8::from(*x != 0)]),
        (1, 8, Value::Int(x)) => KernelArg::scalar(&u8::try_from(*x).map_err(|_| range(*x))?.to_le_bytes()),
        (1, 16, Value::Int(x)) => KernelArg::scalar(&u16::try_from(*x).map_err(|_| range(*x))?.to_le_bytes()),
        (1, 32, Value::Int(x)) => KernelArg::scalar(&u32::try_from(*x).map_err(|_| range(*x))?.to_le_bytes()),
        // A uint64 arrives as the int64 of the same bits.
        (1, 64, Value::Int(x)) => KernelArg::scalar(&x.to_le_bytes()),
        (2, 16, Value::Float(x)) => KernelArg::scalar(&f16_bits(*x as f32).to_le_bytes()),
        (2, 32, Value::Float(x)) => KernelArg::scalar(&(*x as f32).to_le_bytes()),
        (2, 64, Value::Float(x)) => KernelArg::scalar(&x.to_le_bytes()),
        (4, 16, Value::Float(x)) => KernelArg::scalar(&bf16_bits(*x as f32).to_le_bytes()),
        (0..=2 | 4, 1 | 8 | 16 | 32 | 64, _) | (3, _, _) => return Err(bad()),
        _ => return Err(format!("argument {i} has type {t}, which cannot be passed to a kernel")),
    })
}

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

/// TVM's `SplitKernels`: the sections of a source that starts each kernel with a
/// `// Function: NAME` line, as (name, byte range of the section after that line). Empty when
/// the source has no such line. A name given twice keeps its first section.
fn split_kernels(src: &[u8]) -> Vec<(String, Range<usize>)> {
    const DELIMITER: &[u8] = b"// Function: ";
    let find = |from: usize| {
        src.get(from..).and_then(|rest| rest.windows(DELIMITER.len()).position(|w| w == DELIMITER)).map(|p| p + from)
    };
    let mut out: Vec<(String, Range<usize>)> = Vec::new();
    let mut next = find(0);
    while let Some(at) = next {
        let name_start = at + DELIMITER.len();
        let name_end = src[name_start..].iter().position(|&c| c == b'\n').map_or(src.len(), |p| p + name_start);
        let name = String::from_utf8_lossy(&src[name_start..name_end]).trim_end_matches('\r').to_owned();
        let body_start = (name_end + 1).min(src.len());
        next = find(body_start);
        let body = body_start..next.unwrap_or(src.len());
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, body));
        }
    }
    out
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

    /// Launches kernel `name` on the current OpenCL device with packed `args`: the kernel
    /// arguments, then the launch extents.
    fn launch(&self, name: &str, info: &FunctionInfo, params: &LaunchParams, args: &[Value]) -> Result<(), String> {
        if self.device.format != "cl" {
            return Err(format!(
                "the module's device code has format `{}`; mblob builds OpenCL C source (format `cl`) only",
                self.device.format
            ));
        }
        if params.cooperative || params.programmatic_dependent_launch {
            return Err("cooperative and programmatic dependent launches are not supported on OpenCL".into());
        }
        let nargs = info.arg_types.len();
        if args.len() != nargs + params.extent_count() {
            let types: Vec<String> = info.arg_types.iter().map(|t| t.to_string()).collect();
            return Err(format!(
                "takes {nargs} arguments ({}) and {} launch values ({}), {} given",
                types.join(", "),
                params.extent_count(),
                info.launch_param_tags.join(", "),
                args.len()
            ));
        }
        let (kargs, rest) = args.split_at(nargs);
        let extents = rest
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Value::Int(v) if *v >= 0 => Ok(*v as u64),
                other => Err(format!("launch value {i}: {other:?} is not a non-negative int")),
            })
            .collect::<Result<Vec<u64>, String>>()?;
        let dims = params.dims(&extents).map_err(|e| e.to_string())?;
        let device = current_device(DeviceType::OpenCl);
        let api = OpenClApi::shared(device).map_err(|e| e.to_string())?;
        let encoded = {
            let mems = lock(&api.mems);
            let live = |p: usize| mems.contains_key(&p);
            kargs
                .iter()
                .zip(&info.arg_types)
                .enumerate()
                .map(|(i, (v, t))| encode_arg(i, *t, v, &live))
                .collect::<Result<Vec<KernelArg>, String>>()?
        };
        let kernel = self.kernel(&api, name)?;
        let (work_dim, global, local) = nd_range(&dims);
        tracing::debug!(%device, work_dim, ?global, ?local, shared = dims.dyn_shared_memory, "launch");
        let _held = lock(&kernel.launch);
        for (i, arg) in encoded.iter().enumerate() {
            let r = match arg {
                // SAFETY: the kernel is held (`launch`); the value is a `cl_mem` (a live buffer
                // of this device, checked above, or null), read during the call.
                KernelArg::Mem(m) => unsafe {
                    clk::set_kernel_arg(
                        kernel.handle,
                        i as cl_uint,
                        std::mem::size_of::<cl_mem>(),
                        (m as *const cl_mem).cast(),
                    )
                },
                // SAFETY: as above; `len` bytes of `bytes` are read during the call.
                KernelArg::Scalar(bytes, len) => unsafe {
                    clk::set_kernel_arg(kernel.handle, i as cl_uint, *len, bytes.as_ptr().cast())
                },
            };
            r.map_err(|c| format!("clSetKernelArg (argument {i}, {}): {}", info.arg_types[i], cl_text(c)))?;
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

impl Module for OpenClModule {
    fn type_key(&self) -> &str {
        &self.inner.device.type_key
    }

    /// A kernel, for host code that launches it (`GetFuncFromEnv` + `TVMFuncCall`): its
    /// arguments as the function table types them (buffers as `cl_mem` handles), then the
    /// launch extents in the order of its `launch_param_tags` (and the dynamic shared memory
    /// in bytes when tagged). It runs on the current OpenCL device of the calling thread.
    fn get_function(&self, name: &str) -> Option<Symbol> {
        let info = self.inner.device.function(name)?.clone();
        let params = info.launch_params().map_err(|e| e.to_string());
        let inner = self.inner.clone();
        let name = name.to_owned();
        Some(crate::ffi::callconv::function_symbol(move |args| {
            let _span = tracing::debug_span!("opencl_launch", kernel = %name).entered();
            let run = || {
                let params = params.as_ref().map_err(Clone::clone)?;
                inner.launch(&name, &info, params, args)
            };
            let r = match panic::catch_unwind(AssertUnwindSafe(run)) {
                Ok(r) => r,
                Err(payload) => Err(format!("the OpenCL binding panicked: {}", panic_message(&*payload))),
            };
            r.map(|()| Value::None).map_err(|e| format!("OpenCL kernel `{name}`: {e}"))
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
    fn sections_split_as_tvm_splits_them() {
        let src = b"// Function: a\nkernel A\n// Function: b\r\nkernel B\n// Function: a\nagain";
        let s = split_kernels(src);
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(&src[s[0].1.clone()], b"kernel A\n");
        assert_eq!(&src[s[1].1.clone()], b"kernel B\n");
        assert!(split_kernels(b"__kernel void f() {}").is_empty());
        assert_eq!(split_kernels(b"// Function: tail"), [("tail".to_owned(), 17..17)]);
    }

    #[test]
    fn halves_round_to_nearest_even() {
        for (x, h) in [
            (0.0f32, 0x0000u16),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00),
            (1e9, 0x7c00),
            (f32::INFINITY, 0x7c00),
            (6.0e-8, 0x0001),
            (2.0f32.powi(-24), 0x0001),
            (2.0f32.powi(-25), 0x0000),
            (2.0f32.powi(-14), 0x0400),
            (1.0 + 2.0f32.powi(-11), 0x3c00),
            (1.0 + 3.0 * 2.0f32.powi(-11), 0x3c02),
            (0.1, 0x2e66),
        ] {
            assert_eq!(f16_bits(x), h, "{x}");
        }
        assert_eq!(f16_bits(f32::NAN) & 0x7e00, 0x7e00);
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(-3.5), 0xc060);
        assert_eq!(bf16_bits(f32::NAN) & 0x7fc0, 0x7fc0);
    }

    #[test]
    fn arguments_are_encoded_by_type() {
        let none = |_: usize| false;
        let t = |s: &str| DataType::parse(s).unwrap();
        assert_eq!(encode_arg(0, t("int32"), &Value::Int(-2), &none), Ok(KernelArg::scalar(&(-2i32).to_le_bytes())));
        assert_eq!(encode_arg(0, t("int8"), &Value::Int(-2), &none), Ok(KernelArg::scalar(&[0xfe])));
        assert_eq!(encode_arg(0, t("uint16"), &Value::Int(513), &none), Ok(KernelArg::scalar(&[1, 2])));
        assert_eq!(encode_arg(0, t("bool"), &Value::Int(1), &none), Ok(KernelArg::scalar(&[1])));
        assert_eq!(
            encode_arg(0, t("float64"), &Value::Float(0.5), &none),
            Ok(KernelArg::scalar(&0.5f64.to_le_bytes()))
        );
        assert_eq!(encode_arg(0, t("float16"), &Value::Float(1.0), &none), Ok(KernelArg::scalar(&[0, 0x3c])));
        assert_eq!(encode_arg(1, t("handle"), &Value::None, &none), Ok(KernelArg::Mem(ptr::null_mut())));
        assert!(encode_arg(0, t("int8"), &Value::Int(300), &none).unwrap_err().contains("300 is not a int8"));
        assert!(encode_arg(0, t("int32"), &Value::Float(1.0), &none).unwrap_err().contains("cannot take"));
        assert!(encode_arg(0, t("float32x4"), &Value::Float(1.0), &none).unwrap_err().contains("vector type"));
        let stranger = Value::Handle(0x1000 as *mut c_void);
        assert!(encode_arg(2, t("handle"), &stranger, &none).unwrap_err().contains("not a buffer"));
        assert_eq!(encode_arg(2, t("handle"), &stranger, &|p| p == 0x1000), Ok(KernelArg::Mem(0x1000 as cl_mem)));
    }

    #[test]
    fn nd_ranges_use_the_highest_axis_in_use() {
        let dims = |grid, block| LaunchDims { grid, block, dyn_shared_memory: 0 };
        assert_eq!(nd_range(&dims([4, 1, 1], [64, 1, 1])), (1, [256, 1, 1], [64, 1, 1]));
        assert_eq!(nd_range(&dims([1, 1, 1], [1, 1, 1])), (1, [1, 1, 1], [1, 1, 1]));
        assert_eq!(nd_range(&dims([2, 3, 1], [8, 1, 1])), (2, [16, 3, 1], [8, 1, 1]));
        assert_eq!(nd_range(&dims([1, 1, 5], [1, 2, 1])), (3, [1, 2, 5], [1, 2, 1]));
    }

    #[test]
    fn a_private_instance_releases_what_it_holds() {
        let device = Device::opencl(0);
        let api = match OpenClApi::create(device) {
            Ok(api) => api,
            Err(e) => {
                eprintln!("skipped: no OpenCL device ({e})");
                return;
            }
        };
        let a = api.alloc(4096).unwrap();
        // SAFETY: `a` is a live allocation of 4096 bytes.
        let v = unsafe { api.view(a, 0, 16) }.unwrap();
        let w = api.alloc_workspace(64).unwrap();
        api.free_workspace(w).unwrap();
        let _ = api.alloc_workspace(128).unwrap();
        assert!(api.owns(a) && api.owns(v));
        assert_eq!(lock(&api.mems).len(), 4);
        drop(api);
    }
}
