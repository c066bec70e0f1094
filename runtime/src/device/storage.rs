//! [`Storage`]: an owned allocation on a device (or a view of one), the safe way to hold
//! device memory: freed when dropped, with bounds-checked copies. [`crate::array::NdArray`] is
//! built on it. [`HostFileMapping`]: a file mapped copy-on-write whose ranges are CPU storage.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use crate::bytes::Bytes;
use crate::device::api::{DeviceApi, DevicePtr};
use crate::device::backends::device_api;
use crate::device::cpu::CPU_ALIGNMENT;
use crate::device::{Device, DeviceError};

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
}
