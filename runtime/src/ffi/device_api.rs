//! The device API: memory and copies on one device, behind one trait ([`DeviceApi`]) with one
//! implementation per kind: the CPU here, OpenCL in `ffi::opencl` (feature `opencl`) and
//! CUDA in `ffi::cuda` (feature `cuda`). It is TVM's `DeviceAPI` (`AllocDataSpace`, `CopyDataFromTo`,
//! `StreamSync`, `AllocWorkspace`, `SetDevice`).
//!
//! [`device_api`] gives the one instance of a device (created on first use, kept for the
//! process); [`Storage`] is an owned allocation on it, the safe way to hold device memory:
//! freed when dropped, with bounds-checked copies. [`crate::array::NdArray`] is built on it.
//!
//! A device pointer ([`DevicePtr`]) is what a `DLTensor`'s `data` holds for that device: an
//! address for the CPU and CUDA, a `cl_mem` handle for OpenCL. Host code compiled by TVM only
//! passes it on to the device module's kernels, which read it back the same way.
//!
//! Every copy between the host and a device is counted ([`TransferStats`]), so a test can
//! check that a model uploads its parameters once and moves nothing between kernels.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::bytes::Bytes;
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

/// The device API of `device`, created on first use (which opens the driver for that kind).
pub fn device_api(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
    static APIS: OnceLock<Mutex<HashMap<Device, Arc<dyn DeviceApi>>>> = OnceLock::new();
    let apis = APIS.get_or_init(Default::default);
    if let Some(a) = apis.lock().unwrap_or_else(|e| e.into_inner()).get(&device) {
        return Ok(a.clone());
    }
    // Created outside the lock: opening a driver can take a while, and a second thread that
    // races here only makes an instance that is dropped.
    let made: Arc<dyn DeviceApi> = match device.device_type {
        DeviceType::Cpu => Arc::new(CpuApi::new(device)),
        #[cfg(feature = "opencl")]
        DeviceType::OpenCl => super::opencl::OpenClApi::open(device)?,
        #[cfg(feature = "cuda")]
        DeviceType::Cuda => super::cuda::CudaApi::open(device)?,
        _ => {
            return Err(DeviceError::Unsupported {
                device,
                what: match device.device_type {
                    DeviceType::OpenCl | DeviceType::Cuda => {
                        format!("running (mblob-runtime was built without its `{}` feature)", device.device_type)
                    }
                    _ => "running".to_owned(),
                },
            })
        }
    };
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

/// An owned allocation on a device (or a view of one), freed when the last holder drops it.
pub struct Storage {
    /// The API's device (asked once: tensors ask it on every kernel call).
    device: Device,
    api: Arc<dyn DeviceApi>,
    ptr: DevicePtr,
    nbytes: usize,
    kind: StorageKind,
    /// A view of read-only host bytes (or a view of one): copies into it are refused.
    read_only: bool,
}

enum StorageKind {
    /// Allocated by the API: freed on drop.
    Owned,
    /// A view of part of `parent` (kept alive): released with `free_view`.
    View { _parent: Arc<Storage> },
    /// The start of `parent` (kept alive), with fewer bytes: nothing to release.
    Alias { _parent: Arc<Storage> },
    /// Host memory of a file mapping (kept alive): nothing to release.
    Mapped { _map: Arc<HostFileMapping> },
    /// Memory someone else allocated ([`Storage::borrowed`]): never freed here; `_owner`
    /// (dropped with the storage) gives it back.
    Borrowed { _owner: Option<Box<dyn Send + Sync>> },
    /// Host bytes of the loaded library held in place ([`Storage::in_bytes`], kept alive):
    /// nothing to release.
    InBytes { _owner: Bytes },
}

/// A file mapped copy-on-write into host memory, whose byte ranges can be the storage of CPU
/// tensors ([`Storage::in_file_mapping`]): a tensor that stays a view of the file costs no
/// copy, and a kernel that writes to it changes a private copy of the page, never the file.
pub struct HostFileMapping {
    map: memmap2::MmapMut,
    base: usize,
}

impl fmt::Debug for HostFileMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostFileMapping({} bytes)", self.map.len())
    }
}

impl HostFileMapping {
    /// Maps all of `file` (private, copy-on-write). An empty file gives an empty mapping.
    pub fn map(file: &std::fs::File) -> std::io::Result<Arc<HostFileMapping>> {
        // SAFETY: a private copy-on-write mapping: writes through it never reach the file. If
        // another process truncates the file while it is mapped, reads may fault (SIGBUS), as
        // for every mapped file mblob reads (see `load::map_file`); mblob maps only files it
        // was asked to read.
        let mut map = unsafe { memmap2::MmapOptions::new().map_copy(file) }?;
        // The address comes from a unique borrow, so tensors may write through it; the mapping
        // never moves while `self` lives.
        let base = map.as_mut_ptr() as usize;
        Ok(Arc::new(HostFileMapping { map, base }))
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The address of byte `offset` (for alignment checks).
    pub fn address(&self, offset: usize) -> usize {
        self.base.wrapping_add(offset)
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Storage({}, {} bytes)", self.api.device(), self.nbytes)
    }
}

impl Storage {
    /// `nbytes` bytes on `device` (zeroed on the CPU).
    pub fn new(device: Device, nbytes: usize) -> Result<Arc<Storage>, DeviceError> {
        let api = device_api(device)?;
        Storage::with_api(api, nbytes)
    }

    /// `nbytes` bytes from `api`.
    pub fn with_api(api: Arc<dyn DeviceApi>, nbytes: usize) -> Result<Arc<Storage>, DeviceError> {
        let ptr = api.alloc(nbytes)?;
        Ok(Arc::new(Storage { device: api.device(), api, ptr, nbytes, kind: StorageKind::Owned, read_only: false }))
    }

    /// A CPU storage over `bytes` where they lie, without a copy: a constant of the loaded
    /// library held in place. `None` unless `api` is the CPU's and `bytes` is non-empty and
    /// starts at the alignment of CPU tensors ([`CPU_ALIGNMENT`], which TVM's kernels assume).
    /// The storage is read-only: copies into it are refused with [`DeviceError::ReadOnly`]
    /// (compiled code never writes a constant).
    pub fn in_bytes(api: &Arc<dyn DeviceApi>, bytes: &Bytes) -> Option<Arc<Storage>> {
        let at = bytes.as_ptr() as usize;
        (api.device().is_cpu() && !bytes.is_empty() && at % CPU_ALIGNMENT == 0).then(|| {
            Arc::new(Storage {
                device: api.device(),
                api: api.clone(),
                ptr: DevicePtr(at),
                nbytes: bytes.len(),
                kind: StorageKind::InBytes { _owner: bytes.clone() },
                read_only: true,
            })
        })
    }

    /// True for a storage over read-only bytes ([`Storage::in_bytes`], or a view of one).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn check_writable(&self, what: &'static str) -> Result<(), DeviceError> {
        match self.read_only {
            true => Err(DeviceError::ReadOnly { device: self.device(), what }),
            false => Ok(()),
        }
    }

    /// Bytes `offset..offset + nbytes` of a host file mapping as CPU storage (`cpu(0)`), kept
    /// alive by the storage: no copy.
    pub fn in_file_mapping(
        map: &Arc<HostFileMapping>,
        offset: usize,
        nbytes: usize,
    ) -> Result<Arc<Storage>, DeviceError> {
        let device = Device::cpu(0);
        match offset.checked_add(nbytes) {
            Some(end) if end <= map.len() => {}
            end => {
                return Err(DeviceError::OutOfBounds {
                    device,
                    what: "file mapping",
                    offset: offset as u64,
                    end: end.map_or(u64::MAX, |e| e as u64),
                    size: map.len() as u64,
                })
            }
        }
        Ok(Arc::new(Storage {
            device,
            api: device_api(device)?,
            ptr: DevicePtr(map.address(offset)),
            nbytes,
            kind: StorageKind::Mapped { _map: map.clone() },
            read_only: false,
        }))
    }

    /// Whether the storage is part of a file mapping ([`Storage::in_file_mapping`]), directly
    /// or as a view of one.
    pub fn is_file_mapped(&self) -> bool {
        match &self.kind {
            StorageKind::Mapped { .. } => true,
            StorageKind::View { _parent } | StorageKind::Alias { _parent } => _parent.is_file_mapped(),
            StorageKind::Owned | StorageKind::Borrowed { .. } | StorageKind::InBytes { .. } => false,
        }
    }

    /// Memory allocated by someone else (a caller's DLPack tensor, say) as a storage of `api`'s
    /// device, without copying: `ptr` is used as the API's own pointers are, and never freed by
    /// mblob. `owner`, if any, is dropped when the last holder of the storage (or of a view of
    /// it) drops it: the place to give the memory back.
    ///
    /// # Safety
    ///
    /// `ptr` is memory of `api`'s device (a host address for the CPU, a device address for
    /// CUDA in the context mblob uses, a buffer of mblob's own OpenCL context) with at least
    /// `nbytes` bytes, valid for reads and writes until `owner` is dropped (or, without an
    /// owner, as long as the storage or anything made from it is alive).
    pub unsafe fn borrowed(
        api: Arc<dyn DeviceApi>,
        ptr: DevicePtr,
        nbytes: usize,
        owner: Option<Box<dyn Send + Sync>>,
    ) -> Arc<Storage> {
        Arc::new(Storage {
            device: api.device(),
            api,
            ptr,
            nbytes,
            kind: StorageKind::Borrowed { _owner: owner },
            read_only: false,
        })
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device API.
    pub fn api(&self) -> &Arc<dyn DeviceApi> {
        &self.api
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The device pointer (a tensor's `data`).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    fn check(&self, what: &'static str, offset: usize, n: usize) -> Result<(), DeviceError> {
        match offset.checked_add(n) {
            Some(end) if end <= self.nbytes => Ok(()),
            end => Err(DeviceError::OutOfBounds {
                device: self.device(),
                what,
                offset: offset as u64,
                end: end.map_or(u64::MAX, |e| e as u64),
                size: self.nbytes as u64,
            }),
        }
    }

    /// Bytes `offset..offset + nbytes` as a storage of their own (sharing this one's memory).
    pub fn view(self: &Arc<Self>, offset: usize, nbytes: usize) -> Result<Arc<Storage>, DeviceError> {
        self.check("view", offset, nbytes)?;
        if offset == 0 && nbytes == self.nbytes {
            return Ok(self.clone());
        }
        if offset == 0 {
            // The same pointer, fewer bytes: no device object needed.
            return Ok(Arc::new(Storage {
                device: self.device,
                api: self.api.clone(),
                ptr: self.ptr,
                nbytes,
                kind: StorageKind::Alias { _parent: self.clone() },
                read_only: self.read_only,
            }));
        }
        // SAFETY: `self.ptr` is live while `self` is (the view keeps it), and the range was
        // checked to lie within it.
        let ptr = unsafe { self.api.view(self.ptr, offset, nbytes) }?;
        Ok(Arc::new(Storage {
            device: self.device,
            api: self.api.clone(),
            ptr,
            nbytes,
            kind: StorageKind::View { _parent: self.clone() },
            read_only: self.read_only,
        }))
    }

    /// Copies `src` into the storage at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), DeviceError> {
        self.check("copy from host", offset, src.len())?;
        self.check_writable("copy from host")?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the storage is live and the range was checked.
        unsafe { self.api.copy_from_host(self.ptr, offset, src) }
    }

    /// Copies bytes from `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.check("copy to host", offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the storage is live and the range was checked.
        unsafe { self.api.copy_to_host(self.ptr, offset, dst) }
    }

    /// Copies `n` bytes from `self + src_offset` to `dst + dst_offset`: within a device, or
    /// through the host between two.
    pub fn copy_to(&self, src_offset: usize, dst: &Storage, dst_offset: usize, n: usize) -> Result<(), DeviceError> {
        self.check("copy", src_offset, n)?;
        dst.check("copy", dst_offset, n)?;
        dst.check_writable("copy")?;
        if n == 0 {
            return Ok(());
        }
        if Arc::ptr_eq(&self.api, &dst.api) || self.device() == dst.device() {
            // SAFETY: both storages are live and both ranges were checked.
            return unsafe { self.api.copy_on_device(self.ptr, src_offset, dst.ptr, dst_offset, n) };
        }
        let mut host = vec![0u8; n];
        self.read(src_offset, &mut host)?;
        dst.write(dst_offset, &host)
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        match &self.kind {
            // SAFETY: allocated by this API with `nbytes`, freed once, here; every tensor that
            // pointed into it held this storage, so none is left.
            StorageKind::Owned => unsafe { self.api.free(self.ptr, self.nbytes) },
            // SAFETY: made by `view` of this API, released once, here.
            StorageKind::View { .. } => unsafe { self.api.free_view(self.ptr) },
            StorageKind::Alias { .. }
            | StorageKind::Mapped { .. }
            | StorageKind::Borrowed { .. }
            | StorageKind::InBytes { .. } => {}
        }
    }
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

/// The alignment of CPU tensors (TVM's `kAllocAlignment`).
pub const CPU_ALIGNMENT: usize = 64;

/// The CPU: aligned, zeroed heap memory; copies are `memcpy`; workspace memory is
/// [`super::workspace`]'s per-thread allocator.
#[derive(Debug)]
pub struct CpuApi {
    device: Device,
    counters: TransferCounters,
}

impl CpuApi {
    fn new(device: Device) -> CpuApi {
        CpuApi { device, counters: TransferCounters::default() }
    }

    fn layout(nbytes: usize) -> Option<Layout> {
        Layout::from_size_align(nbytes.max(1).checked_next_multiple_of(CPU_ALIGNMENT)?, CPU_ALIGNMENT).ok()
    }

    /// The length of the anonymous mapping that holds an allocation of `nbytes`, for those of
    /// [`CPU_MAP_MIN`] bytes or more (whole pages), else `None` (the heap's).
    fn mapped_len(nbytes: usize) -> Option<usize> {
        (nbytes >= CPU_MAP_MIN).then(|| nbytes.checked_next_multiple_of(CPU_MAP_PAGE)).flatten()
    }
}

/// From this size on, CPU tensors are anonymous mappings of their own: zero pages the kernel
/// fills on first touch, where the heap's aligned `alloc_zeroed` writes every byte first
/// (`posix_memalign` + `memset`), which doubles the cost of filling a large constant.
const CPU_MAP_MIN: usize = 1 << 20;
/// The page size mappings are rounded to (any multiple of the system's page works for mmap).
const CPU_MAP_PAGE: usize = 64 << 10;

impl DeviceApi for CpuApi {
    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> String {
        "cpu".into()
    }

    fn alloc(&self, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        let oom = || DeviceError::OutOfMemory { device: self.device, bytes: nbytes as u64 };
        if let Some(len) = CpuApi::mapped_len(nbytes) {
            // SAFETY: an anonymous private mapping at an address the kernel picks: it aliases
            // nothing; unmapped in `free` with the same length.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(oom());
            }
            // Huge pages where the system allows them (`madvise` mode): fewer faults to fill it.
            // SAFETY: advice on the mapping just made; it changes no contents.
            unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
            return Ok(DevicePtr(p as usize));
        }
        let layout = CpuApi::layout(nbytes).ok_or_else(oom)?;
        // SAFETY: `layout` has a non-zero size; freed in `free` with the same layout.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom());
        }
        Ok(DevicePtr(p as usize))
    }

    unsafe fn free(&self, ptr: DevicePtr, nbytes: usize) {
        if let Some(len) = CpuApi::mapped_len(nbytes) {
            // SAFETY: per the contract, `ptr` came from `alloc(nbytes)`, which mapped `len`
            // bytes there for this size.
            unsafe { libc::munmap(ptr.as_ptr(), len) };
        } else if let Some(layout) = CpuApi::layout(nbytes) {
            // SAFETY: per the contract, `ptr` came from `alloc(nbytes)`, which used this layout.
            unsafe { alloc::dealloc(ptr.0 as *mut u8, layout) }
        }
    }

    unsafe fn copy_from_host(&self, dst: DevicePtr, offset: usize, src: &[u8]) -> Result<(), DeviceError> {
        self.counters.host_to_device(src.len());
        // SAFETY: per the contract the destination holds `offset + src.len()` bytes; host
        // slices never overlap an allocation nobody borrowed.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (dst.0 as *mut u8).add(offset), src.len()) };
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.counters.device_to_host(dst.len());
        // SAFETY: per the contract the source holds `offset + dst.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping((src.0 as *const u8).add(offset), dst.as_mut_ptr(), dst.len()) };
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
        self.counters.device_to_device();
        // SAFETY: per the contract both ranges are valid; `copy` allows them to overlap.
        unsafe { std::ptr::copy((src.0 as *const u8).add(src_offset), (dst.0 as *mut u8).add(dst_offset), n) };
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn alloc_workspace(&self, nbytes: usize) -> Result<DevicePtr, DeviceError> {
        let p = super::workspace::alloc(nbytes as u64);
        if p.is_null() {
            return Err(DeviceError::OutOfMemory { device: self.device, bytes: nbytes as u64 });
        }
        Ok(DevicePtr::from_ptr(p))
    }

    fn free_workspace(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        super::workspace::free(ptr.as_ptr()).map_err(|detail| DeviceError::Driver {
            device: self.device,
            call: "TVMBackendFreeWorkspace".into(),
            detail,
        })
    }

    fn transfers(&self) -> TransferStats {
        self.counters.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_storage_copies_views_and_bounds() {
        let s = Storage::new(Device::cpu(0), 16).unwrap();
        assert_eq!(s.ptr().0 % CPU_ALIGNMENT, 0);
        s.write(4, &[1, 2, 3, 4]).unwrap();
        let v = s.view(4, 8).unwrap();
        let mut out = [0u8; 8];
        v.read(0, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 0, 0, 0, 0]);
        let t = Storage::new(Device::cpu(0), 4).unwrap();
        v.copy_to(0, &t, 0, 4).unwrap();
        let mut four = [0u8; 4];
        t.read(0, &mut four).unwrap();
        assert_eq!(four, [1, 2, 3, 4]);
        assert!(matches!(s.write(14, &[0; 4]), Err(DeviceError::OutOfBounds { offset: 14, end: 18, size: 16, .. })));
        assert!(s.view(8, 9).is_err());
        assert!(s.read(usize::MAX, &mut [0; 2]).is_err());
    }

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
