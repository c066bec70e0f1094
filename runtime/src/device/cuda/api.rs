//! The CUDA device API ([`CudaApi`], the [`DeviceApi`] of `cuda:N`) through the driver API
//! with cudarc (feature `cuda`), and what the CUDA files share: the guards that turn a panic
//! of cudarc into an error, the driver's errors, and each device's primary context.
//!
//! Every device is used through its primary context, retained once per process and shared
//! by the device API and every module on that device, with its default stream: memory from
//! [`CudaApi`] is what the modules' kernels read, and copies, kernels and synchronisation are
//! ordered on that one stream. Errors of the device API are [`DeviceError`]s (a missing driver
//! is [`DeviceError::NoDriver`]).
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::DriverError;
use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::device::api::{DeviceApi, DevicePtr, TransferCounters, TransferStats, WorkspacePool};
use crate::device::{Device, DeviceError, DeviceType};
use crate::error::{Error, Result};

/// Whether the CUDA driver library can be opened (checked once per process).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` opens and closes the driver library by its usual names;
    // opening `libcuda` runs its initialisers, which is what using CUDA at all requires.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
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
pub(super) fn catch<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(format!("{what}: the CUDA driver library failed: {}", panic_message(&*payload))),
    }
}

/// [`catch`], with the error as [`Error::Cuda`].
pub(super) fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T> {
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
pub(super) fn describe(e: DriverError) -> String {
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
pub(super) const NO_DRIVER: &str =
    "no CUDA driver found: libcuda could not be loaded (is the NVIDIA driver installed and on the library path?)";

// ---- contexts -------------------------------------------------------------------------------

/// The primary context of device `ordinal`, retained once per process and shared by the
/// device API and every module on that device. Call only with the driver present, inside a
/// guard.
pub(super) fn primary_context(ordinal: usize) -> Result<Arc<CudaContext>, DriverError> {
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
pub(super) fn open_device(device: Device) -> Result<Arc<CudaContext>, DeviceError> {
    if device.device_type != DeviceType::Cuda {
        return Err(DeviceError::Unsupported { device, what: "the CUDA device API".into() });
    }
    if !driver_present() {
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
/// context, which the device's [`super::CudaModule`] kernels share.
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

/// Opens `device` (the backend table's opener for `cuda`).
pub(crate) fn open(device: Device) -> std::result::Result<Arc<dyn DeviceApi>, DeviceError> {
    CudaApi::open(device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::backends::device_api;
    use crate::device::storage::Storage;

    #[test]
    fn the_device_api_without_a_driver_is_a_typed_error() {
        // Not a CUDA device: refused before the driver is asked.
        assert!(matches!(CudaApi::open(Device::cpu(0)), Err(DeviceError::Unsupported { .. })));
        let opened = CudaApi::open(Device::cuda(0));
        if driver_present() {
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
        let err = device_api(Device::cuda(2)).unwrap_err();
        assert!(matches!(&err, DeviceError::NoDriver { device, .. } if *device == Device::cuda(2)), "{err:?}");
        assert!(matches!(Storage::new(Device::cuda(0), 16), Err(DeviceError::NoDriver { .. })));
        assert!(matches!(CudaApi::new(Device::cuda(-1)), Err(DeviceError::NoDriver { .. })));
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
}
