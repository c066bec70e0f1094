//! The device API: memory and copies on one device, behind one trait ([`DeviceApi`]) with one
//! implementation per kind: the CPU's ([`super::cpu`]), OpenCL's (`device::opencl`, feature
//! `opencl`) and CUDA's (`device::cuda`, feature `cuda`). It is TVM's `DeviceAPI`
//! (`AllocDataSpace`, `CopyDataFromTo`, `StreamSync`, `AllocWorkspace`, `SetDevice`).
//!
//! The backend table: each backend registers the function that opens one of its devices
//! ([`register_backend`], keyed by device type, as TVM's `device_api.<name>` globals are), and
//! [`opened`] gives the one instance of a device (created on first use, kept for the process).
//! This file knows no backend; `super::backends::device_api` registers the built-in ones.
//!
//! A device pointer ([`DevicePtr`]) is what a `DLTensor`'s `data` holds for that device: an
//! address for the CPU and CUDA, a `cl_mem` handle for OpenCL. Host code compiled by TVM only
//! passes it on to the device module's kernels, which read it back the same way.
//!
//! Every copy between the host and a device is counted ([`TransferStats`]), so a test can
//! check that a model uploads its parameters once and moves nothing between kernels.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::device::{Device, DeviceError, DeviceType};

/// A device pointer: an address (CPU, CUDA) or a handle (OpenCL `cl_mem`), as a `DLTensor`'s
/// `data` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub usize);

impl DevicePtr {
    /// As a `DLTensor`'s `data`.
    pub fn as_ptr(self) -> *mut c_void {
        self.0 as *mut c_void
    }

    /// From a `DLTensor`'s `data`.
    pub fn from_ptr(p: *mut c_void) -> DevicePtr {
        DevicePtr(p as usize)
    }
}

/// Copies between the host and a device, counted since the device was first used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Host-to-device copies.
    pub host_to_device: u64,
    /// Bytes copied host to device.
    pub host_to_device_bytes: u64,
    /// Device-to-host copies.
    pub device_to_host: u64,
    /// Bytes copied device to host.
    pub device_to_host_bytes: u64,
    /// Copies within the device.
    pub device_to_device: u64,
}

impl std::ops::Sub for TransferStats {
    type Output = TransferStats;
    fn sub(self, o: TransferStats) -> TransferStats {
        TransferStats {
            host_to_device: self.host_to_device - o.host_to_device,
            host_to_device_bytes: self.host_to_device_bytes - o.host_to_device_bytes,
            device_to_host: self.device_to_host - o.device_to_host,
            device_to_host_bytes: self.device_to_host_bytes - o.device_to_host_bytes,
            device_to_device: self.device_to_device - o.device_to_device,
        }
    }
}

/// The counters behind [`TransferStats`], kept by each device API.
#[derive(Debug, Default)]
pub struct TransferCounters {
    h2d: AtomicU64,
    h2d_bytes: AtomicU64,
    d2h: AtomicU64,
    d2h_bytes: AtomicU64,
    d2d: AtomicU64,
}

impl TransferCounters {
    /// Counts a host-to-device copy of `n` bytes.
    pub fn host_to_device(&self, n: usize) {
        self.h2d.fetch_add(1, Ordering::Relaxed);
        self.h2d_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    /// Counts a device-to-host copy of `n` bytes.
    pub fn device_to_host(&self, n: usize) {
        self.d2h.fetch_add(1, Ordering::Relaxed);
        self.d2h_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    /// Counts a copy within the device.
    pub fn device_to_device(&self) {
        self.d2d.fetch_add(1, Ordering::Relaxed);
    }
    /// The counts now.
    pub fn get(&self) -> TransferStats {
        TransferStats {
            host_to_device: self.h2d.load(Ordering::Relaxed),
            host_to_device_bytes: self.h2d_bytes.load(Ordering::Relaxed),
            device_to_host: self.d2h.load(Ordering::Relaxed),
            device_to_host_bytes: self.d2h_bytes.load(Ordering::Relaxed),
            device_to_device: self.d2d.load(Ordering::Relaxed),
        }
    }
}

/// Memory and copies on one device (TVM's `DeviceAPI`). Implementations are thread-safe;
/// operations are ordered on the device's one queue (stream), so a copy after a kernel sees
/// what the kernel wrote, and [`DeviceApi::copy_to_host`] returns once the bytes are there.
pub trait DeviceApi: Send + Sync + fmt::Debug {
    /// The device.
    fn device(&self) -> Device;

    /// The device's name as its driver reports it.
    fn name(&self) -> String;

    /// A new allocation of `nbytes` (at least 1) bytes, aligned for any tensor (64 bytes on
    /// the CPU), zeroed on the CPU.
    fn alloc(&self, nbytes: usize) -> Result<DevicePtr, DeviceError>;

    /// Frees an allocation.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`DeviceApi::alloc`] of this API with `nbytes`, is freed once, and
    /// nothing uses it afterwards (no kernel still queued on it).
    unsafe fn free(&self, ptr: DevicePtr, nbytes: usize);

    /// A pointer to byte `offset` of an allocation, valid for `nbytes` bytes, to hand to kernels
    /// as a tensor's data: an address for the CPU and CUDA; a sub-buffer for OpenCL, which
    /// [`DeviceApi::free_view`] releases.
    ///
    /// # Safety
    ///
    /// `base` is a live allocation of this API and `offset + nbytes` lies within it.
    unsafe fn view(&self, base: DevicePtr, offset: usize, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        let _ = nbytes;
        Ok(DevicePtr(base.0 + offset))
    }

    /// Releases what [`DeviceApi::view`] made (nothing for devices with addresses).
    ///
    /// # Safety
    ///
    /// `view` came from [`DeviceApi::view`] of this API and is released once.
    unsafe fn free_view(&self, view: DevicePtr) {
        let _ = view;
    }

    /// Copies `src` to `dst + offset`.
    ///
    /// # Safety
    ///
    /// `dst` is a live allocation (or view) of this API with `offset + src.len()` bytes.
    unsafe fn copy_from_host(&self, dst: DevicePtr, offset: usize, src: &[u8]) -> Result<(), DeviceError>;

    /// Copies `dst.len()` bytes from `src + offset` to `dst`, after everything queued before.
    ///
    /// # Safety
    ///
    /// `src` is a live allocation (or view) of this API with `offset + dst.len()` bytes.
    unsafe fn copy_to_host(&self, src: DevicePtr, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError>;

    /// Copies `n` bytes within the device.
    ///
    /// # Safety
    ///
    /// Both are live allocations (or views) of this API, `src + src_offset` and
    /// `dst + dst_offset` hold `n` bytes each.
    unsafe fn copy_on_device(
        &self,
        src: DevicePtr,
        src_offset: usize,
        dst: DevicePtr,
        dst_offset: usize,
        n: usize,
    ) -> Result<(), DeviceError>;

    /// Waits until everything queued on the device has finished (`StreamSync`).
    fn synchronize(&self) -> Result<(), DeviceError>;

    /// Makes the device current on this thread (`SetDevice`).
    fn set_device(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Workspace memory for a kernel's temporaries (`TVMBackendAllocWorkspace` on this device):
    /// blocks freed with [`DeviceApi::free_workspace`] are reused by size.
    fn alloc_workspace(&self, nbytes: usize) -> Result<DevicePtr, DeviceError>;

    /// Returns workspace memory; an address not handed out is an error.
    fn free_workspace(&self, ptr: DevicePtr) -> Result<(), DeviceError>;

    /// The copies counted so far.
    fn transfers(&self) -> TransferStats;
}

/// What opens one device of a backend's kind.
pub type Opener = fn(Device) -> Result<Arc<dyn DeviceApi>, DeviceError>;

fn backends() -> &'static RwLock<HashMap<DeviceType, Opener>> {
    static BACKENDS: OnceLock<RwLock<HashMap<DeviceType, Opener>>> = OnceLock::new();
    BACKENDS.get_or_init(Default::default)
}

/// Registers the backend of `device_type` (replacing one registered before).
pub fn register_backend(device_type: DeviceType, open: Opener) {
    backends().write().unwrap_or_else(|e| e.into_inner()).insert(device_type, open);
}

/// The device API of `device` from the backend table, created on first use (which opens the
/// driver for that kind). A kind no backend registered is [`DeviceError::Unsupported`].
pub fn opened(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
    static APIS: OnceLock<Mutex<HashMap<Device, Arc<dyn DeviceApi>>>> = OnceLock::new();
    let apis = APIS.get_or_init(Default::default);
    if let Some(a) = apis.lock().unwrap_or_else(|e| e.into_inner()).get(&device) {
        return Ok(a.clone());
    }
    let open = backends().read().unwrap_or_else(|e| e.into_inner()).get(&device.device_type).copied();
    let Some(open) = open else {
        return Err(DeviceError::Unsupported {
            device,
            what: match device.device_type {
                DeviceType::OpenCl | DeviceType::Cuda => {
                    format!("running (mblob-runtime was built without its `{}` feature)", device.device_type)
                }
                _ => "running".to_owned(),
            },
        });
    };
    // Created outside the lock: opening a driver can take a while, and a second thread that
    // races here only makes an instance that is dropped.
    let made = open(device)?;
    let mut apis = apis.lock().unwrap_or_else(|e| e.into_inner());
    Ok(apis.entry(device).or_insert(made).clone())
}

thread_local! {
    /// The device of each kind that `__tvm_set_device` made current on this thread.
    static CURRENT: std::cell::RefCell<Vec<Device>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes `device` the current one of its kind on this thread (what host code's
/// `__tvm_set_device(type, id)` asks for before it launches kernels).
pub fn set_current_device(device: Device) {
    let _ = CURRENT.try_with(|c| {
        let mut c = c.borrow_mut();
        c.retain(|d| d.device_type != device.device_type);
        c.push(device);
    });
}

/// The current device of kind `device_type` on this thread (ordinal 0 until one is set).
pub fn current_device(device_type: DeviceType) -> Device {
    CURRENT
        .try_with(|c| c.borrow().iter().copied().find(|d| d.device_type == device_type))
        .ok()
        .flatten()
        .unwrap_or(Device { device_type, device_id: 0 })
}

/// Blocks of freed workspace memory by size, and the sizes of the blocks handed out: the
/// workspace allocator of devices whose allocations are slow (OpenCL, CUDA).
#[derive(Debug, Default)]
pub struct WorkspacePool {
    live: Mutex<HashMap<DevicePtr, usize>>,
    free: Mutex<Vec<(usize, DevicePtr)>>,
}

impl WorkspacePool {
    /// A block of `nbytes` (a freed one of the same size, else one from `alloc`).
    pub fn alloc(
        &self,
        nbytes: usize,
        alloc: impl FnOnce(usize) -> Result<DevicePtr, DeviceError>,
    ) -> Result<DevicePtr, DeviceError> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter().position(|(n, _)| *n == nbytes).map(|i| free.swap_remove(i).1)
        };
        let ptr = match reused {
            Some(p) => p,
            None => alloc(nbytes)?,
        };
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(ptr, nbytes);
        Ok(ptr)
    }

    /// Takes a block back for reuse; `None` if it was not handed out.
    pub fn free(&self, ptr: DevicePtr) -> Option<()> {
        let n = self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr)?;
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push((n, ptr));
        Some(())
    }

    /// [`WorkspacePool::free`] for `TVMBackendFreeWorkspace` on `device`: a pointer not
    /// handed out is an error naming the device.
    pub fn release(&self, device: Device, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.free(ptr).ok_or_else(|| DeviceError::Driver {
            device,
            call: "TVMBackendFreeWorkspace".into(),
            detail: format!("{:#x} is not workspace memory handed out by this device", ptr.0),
        })
    }

    /// Every free block (for the device to release when it goes away).
    pub fn drain(&self) -> Vec<(usize, DevicePtr)> {
        std::mem::take(&mut *self.free.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_pool_reuses_by_size_and_refuses_strangers() {
        let pool = WorkspacePool::default();
        let mut next = 0x1000;
        let mut make = |n: usize| {
            next += n;
            Ok(DevicePtr(next))
        };
        let a = pool.alloc(64, &mut make).unwrap();
        assert!(pool.free(a).is_some());
        assert_eq!(pool.alloc(64, &mut make).unwrap(), a);
        assert_ne!(pool.alloc(64, &mut make).unwrap(), a);
        assert!(pool.free(DevicePtr(7)).is_none());
    }
}
