//! OpenCL device memory ([`OpenClApi`], the device API of `opencl:N`) through
//! opencl3, which opens the OpenCL ICD loader (`libOpenCL.so.1`) at run time (feature `opencl`):
//! a build with the feature runs on machines without OpenCL, where opening a device is a
//! [`DeviceError::NoDriver`].
//!
//! Devices are numbered as TVM numbers them: every device of every platform, GPUs first, then
//! the others (accelerators, CPUs such as pocl's) in platform order. Each opened device has one
//! context and one in-order command queue; [`OpenClApi::shared`] gives the one instance of a
//! device, the same one `crate::device::device_api` returns.
//!
//! A device pointer ([`DevicePtr`]) is a `cl_mem` handle. Views are sub-buffers (their origin
//! must be a multiple of the device's `CL_DEVICE_MEM_BASE_ADDR_ALIGN`); every buffer and view
//! the API made is remembered with its size, so copies are bounds-checked and a kernel is never
//! handed a handle that is not one of this device's buffers.
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use opencl3::command_queue as clq;
use opencl3::context::context as clctx;
use opencl3::device as cldev;
use opencl3::error_codes as clerr;
use opencl3::event as clev;
use opencl3::memory as clmem;
use opencl3::platform::platform as clplat;
use opencl3::types::{
    cl_buffer_region, cl_command_queue, cl_context, cl_device_id, cl_device_type, cl_event, cl_int, cl_mem, cl_uint,
};

use crate::device::api::{DeviceApi, DevicePtr, TransferCounters, TransferStats, WorkspacePool};
use crate::device::{Device, DeviceError, DeviceType};

/// What to install when there is no OpenCL.
const INSTALL_HINT: &str = "install an OpenCL driver and the ICD loader, e.g. \
     `apt-get install ocl-icd-libopencl1 pocl-opencl-icd` (pocl runs OpenCL on the CPU), or set \
     OPENCL_DYLIB_PATH to the loader's path";

/// The module name in build errors.
pub(super) const MODULE: &str = "opencl";

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An OpenCL error code as text: `CL_OUT_OF_RESOURCES (-5)`.
pub(super) fn cl_text(code: cl_int) -> String {
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
pub(super) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

/// Runs driver calls, turning a panic in the binding into an error.
pub(super) fn guard<T>(
    device: Device,
    what: &str,
    f: impl FnOnce() -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
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
pub(super) fn release_event(event: cl_event) {
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
    pub(super) device: Device,
    pub(super) id: cl_device_id,
    name: String,
    /// `CL_DEVICE_MAX_MEM_ALLOC_SIZE`.
    max_alloc: u64,
    /// `CL_DEVICE_MEM_BASE_ADDR_ALIGN`, in bytes.
    base_align: usize,
    pub(super) context: cl_context,
    pub(super) queue: cl_command_queue,
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
    /// [`crate::device::device_api`].
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
    pub(super) fn create(device: Device) -> Result<OpenClApi, DeviceError> {
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

    pub(super) fn driver(&self, call: &str, code: cl_int) -> DeviceError {
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

/// Opens `device` (the backend table's opener for `opencl`).
pub(crate) fn open(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
    OpenClApi::open(device)
}

#[cfg(test)]
mod tests {
    use super::*;

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
