//! [`NdArray`]: the one tensor of the run side. Owned (shared) storage on a device, a shape and
//! a dtype; the executors' inputs, outputs, parameters and storage, the Relax VM's registers,
//! and what the CLI and Python hand in and get back.
//!
//! It lends a `DLTensor` ([`NdArray::dl_tensor`]) for calls into compiled code, copies to and
//! from host bytes, and makes views (a part of its storage with another shape). The host-side
//! form of a tensor, as a blob stores it, is [`crate::payload::graph::Tensor`];
//! [`NdArray::from_tensor`] and [`NdArray::to_tensor`] convert.

use std::sync::Arc;

use crate::bytes::Bytes;
use crate::device::api::DeviceApi;
use crate::device::storage::Storage;
use crate::device::{Device, DeviceError};
use crate::ffi::dlpack::{DLDataType, DLDevice, DLTensor};
use crate::format::DataType;
use crate::payload::graph::Tensor;

/// What is wrong with a tensor made from parts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArrayError {
    /// A negative extent, or a size that overflows.
    #[error("shape {shape:?} of {dtype} is not a valid tensor shape")]
    BadShape {
        /// The shape.
        shape: Vec<i64>,
        /// The dtype.
        dtype: DataType,
    },
    /// Data whose length is not what the shape and dtype need.
    #[error("{dtype} {shape:?} needs {expected} bytes, {found} given")]
    Size {
        /// The dtype.
        dtype: DataType,
        /// The shape.
        shape: Vec<i64>,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        found: u64,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// How many bytes [`NdArray::copy_from_mapped`] copies before it gives their pages back.
const RELEASE_CHUNK: usize = 8 << 20;
/// How far each range given back reaches into the one before it: the page that straddles
/// two chunks is whole in neither (64 KiB covers every page size of Linux's targets).
const RELEASE_OVERLAP: usize = 64 << 10;

/// Bytes of a tensor of `dtype` and `shape` as TVM counts them (`(bits * lanes + 7) / 8` per
/// element), or `None` on overflow or a negative extent.
pub fn tensor_bytes(dtype: DataType, shape: &[i64]) -> Option<u64> {
    let per = (u64::from(dtype.bits) * u64::from(dtype.lanes)).div_ceil(8);
    shape.iter().try_fold(per, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

/// A tensor on a device: shared storage, a shape and a dtype. Cloning shares the storage (as
/// TVM's `NDArray` reference does); [`NdArray::copy`] makes a new one. A tensor starts at the
/// start of its storage, which may hold more bytes than the tensor (a tensor at offset 0 of a
/// larger storage shares it, as the Relax VM's `alloc_tensor` places them).
#[derive(Debug, Clone)]
pub struct NdArray {
    storage: Arc<Storage>,
    shape: Arc<[i64]>,
    dtype: DataType,
    /// The tensor's size in bytes (at most the storage's).
    nbytes: usize,
    /// Where the tensor starts in the storage the VM allocated it in, when a VM's
    /// `alloc_tensor` placed it at a non-zero offset: TVM passes such a tensor to a kernel
    /// as that storage's pointer plus this `byte_offset` (and TVM's kernels refuse a non-zero
    /// one), see [`NdArray::with_vm_offset`]. The storage here is the view itself.
    vm_offset: usize,
}

impl NdArray {
    fn checked_len(dtype: DataType, shape: &[i64]) -> Result<usize, ArrayError> {
        tensor_bytes(dtype, shape)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| ArrayError::BadShape { shape: shape.to_vec(), dtype })
    }

    /// The byte size of a `dtype` tensor of `shape`, checked to be `found` (the bytes given
    /// for it).
    fn checked_data_len(dtype: DataType, shape: &[i64], found: usize) -> Result<usize, ArrayError> {
        let n = NdArray::checked_len(dtype, shape)?;
        if n != found {
            return Err(ArrayError::Size { dtype, shape: shape.to_vec(), expected: n as u64, found: found as u64 });
        }
        Ok(n)
    }

    /// An empty (zeroed on the CPU) tensor on `device`.
    pub fn empty(shape: &[i64], dtype: DataType, device: Device) -> Result<NdArray, ArrayError> {
        let n = NdArray::checked_len(dtype, shape)?;
        Ok(NdArray { storage: Storage::new(device, n)?, shape: shape.into(), dtype, nbytes: n, vm_offset: 0 })
    }

    /// An empty tensor from `api`'s device.
    pub(crate) fn empty_with(shape: &[i64], dtype: DataType, api: &Arc<dyn DeviceApi>) -> Result<NdArray, ArrayError> {
        let n = NdArray::checked_len(dtype, shape)?;
        Ok(NdArray { storage: Storage::with_api(api.clone(), n)?, shape: shape.into(), dtype, nbytes: n, vm_offset: 0 })
    }

    /// A tensor on `device` holding `data` (little-endian elements, row-major).
    pub fn from_bytes(data: &[u8], shape: &[i64], dtype: DataType, device: Device) -> Result<NdArray, ArrayError> {
        NdArray::checked_data_len(dtype, shape, data.len())?;
        let a = NdArray::empty(shape, dtype, device)?;
        a.storage.write(0, data)?;
        Ok(a)
    }

    /// A `float32` tensor on `device`.
    pub fn from_f32(data: &[f32], shape: &[i64], device: Device) -> Result<NdArray, ArrayError> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        NdArray::from_bytes(&bytes, shape, DataType::F32, device)
    }

    /// A tensor on `device` with the contents of a host tensor.
    pub fn from_tensor(t: &Tensor, device: Device) -> Result<NdArray, ArrayError> {
        NdArray::from_bytes(&t.data, &t.shape, t.dtype, device)
    }

    /// A tensor on `api`'s device with the contents of `data` (a constant or parameter as the
    /// library or a params file stores it), held once: on the CPU, when `data` lies at the
    /// alignment kernels assume, the tensor is a read-only view of it (no copy; see
    /// [`Storage::in_bytes`]); otherwise one aligned copy, made with
    /// [`NdArray::copy_from_mapped`] (the pages of a mapped file given back as they are copied).
    pub fn from_mapped(
        data: &Bytes,
        shape: &[i64],
        dtype: DataType,
        api: &Arc<dyn DeviceApi>,
    ) -> Result<NdArray, ArrayError> {
        let n = NdArray::checked_data_len(dtype, shape, data.len())?;
        if let Some(storage) = Storage::in_bytes(api, data) {
            return Ok(NdArray { storage, shape: shape.into(), dtype, nbytes: n, vm_offset: 0 });
        }
        let a = NdArray::empty_with(shape, dtype, api)?;
        a.copy_from_mapped(data)?;
        Ok(a)
    }

    /// [`NdArray::copy_from_bytes`] from bytes that may be a view of a mapped file: their pages
    /// are given back as they are copied ([`Bytes::release`]), so that the copy is the only one
    /// held in memory. On the CPU the copy goes in chunks, each one's pages given back before
    /// the next; to another device it is one upload (counted once), the pages given back after.
    pub fn copy_from_mapped(&self, data: &Bytes) -> Result<(), ArrayError> {
        if !data.is_mapped() || data.len() != self.nbytes() {
            return self.copy_from_bytes(data);
        }
        if !self.device().is_cpu() {
            self.copy_from_bytes(data)?;
            data.release();
            return Ok(());
        }
        let mut at = 0;
        while at < data.len() {
            let end = data.len().min(at + RELEASE_CHUNK);
            self.storage.write(at, &data[at..end])?;
            if let Some(done) = data.slice(at.saturating_sub(RELEASE_OVERLAP)..end) {
                done.release();
            }
            at = end;
        }
        Ok(())
    }

    /// A view of `storage` from `offset` with `shape` and `dtype` (TVM's
    /// `Storage::AllocNDArray`).
    pub fn in_storage(
        storage: &Arc<Storage>,
        offset: usize,
        shape: &[i64],
        dtype: DataType,
    ) -> Result<NdArray, ArrayError> {
        NdArray::in_storage_shared(storage, offset, shape.into(), dtype)
    }

    /// [`NdArray::in_storage`] with a shape the caller already holds shared (a VM's constant
    /// shape), which the tensor then shares instead of copying.
    pub(crate) fn in_storage_shared(
        storage: &Arc<Storage>,
        offset: usize,
        shape: Arc<[i64]>,
        dtype: DataType,
    ) -> Result<NdArray, ArrayError> {
        let n = NdArray::checked_len(dtype, &shape)?;
        if offset == 0 {
            // The start of the storage: shared as it is (no view storage to make and free),
            // the tensor's own size kept here.
            if n > storage.nbytes() {
                return Err(DeviceError::OutOfBounds {
                    device: storage.device(),
                    what: "view",
                    offset: 0,
                    end: n as u64,
                    size: storage.nbytes() as u64,
                }
                .into());
            }
            return Ok(NdArray { storage: storage.clone(), shape, dtype, nbytes: n, vm_offset: 0 });
        }
        Ok(NdArray { storage: storage.view(offset, n)?, shape, dtype, nbytes: n, vm_offset: 0 })
    }

    /// This tensor, marked as placed by a VM's `alloc_tensor` at byte `offset` of its storage
    /// (`self` is the view there): [`NdArray::vm_offset`].
    pub(crate) fn with_vm_offset(self, offset: usize) -> NdArray {
        NdArray { vm_offset: offset, ..self }
    }

    /// The byte offset a VM's `alloc_tensor` placed this tensor at in its storage (0 for every
    /// other tensor): what TVM passes to kernels as the `DLTensor`'s `byte_offset`.
    pub(crate) fn vm_offset(&self) -> usize {
        self.vm_offset
    }

    /// The same bytes with another shape and dtype (as many bytes or fewer).
    pub fn view(&self, shape: &[i64], dtype: DataType) -> Result<NdArray, ArrayError> {
        let n = NdArray::checked_len(dtype, shape)?;
        if n > self.nbytes {
            return Err(DeviceError::OutOfBounds {
                device: self.device(),
                what: "view",
                offset: 0,
                end: n as u64,
                size: self.nbytes as u64,
            }
            .into());
        }
        Ok(NdArray { storage: self.storage.clone(), shape: shape.into(), dtype, nbytes: n, vm_offset: self.vm_offset })
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The dtype.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The storage the tensor starts at (it may hold more bytes than [`NdArray::nbytes`]).
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `data` (exactly [`NdArray::nbytes`] bytes) into the tensor.
    pub fn copy_from_bytes(&self, data: &[u8]) -> Result<(), ArrayError> {
        if data.len() != self.nbytes() {
            return Err(ArrayError::Size {
                dtype: self.dtype,
                shape: self.shape.to_vec(),
                expected: self.nbytes() as u64,
                found: data.len() as u64,
            });
        }
        Ok(self.storage.write(0, data)?)
    }

    /// The elements as host bytes (a copy from the device).
    pub fn to_bytes(&self) -> Result<Vec<u8>, ArrayError> {
        let mut out = vec![0u8; self.nbytes()];
        self.storage.read(0, &mut out)?;
        Ok(out)
    }

    /// The elements as a host tensor.
    pub fn to_tensor(&self) -> Result<Tensor, ArrayError> {
        Ok(Tensor {
            dtype: self.dtype,
            shape: self.shape.to_vec(),
            device: (1, 0),
            data: Bytes::from_vec(self.to_bytes()?),
        })
    }

    /// The elements as `f32`s, when the dtype is `float32`.
    pub fn to_f32(&self) -> Result<Option<Vec<f32>>, ArrayError> {
        if self.dtype != DataType::F32 {
            return Ok(None);
        }
        let b = self.to_bytes()?;
        Ok(Some(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
    }

    /// Copies this tensor's bytes into `dst` (same size; any devices).
    pub fn copy_to(&self, dst: &NdArray) -> Result<(), ArrayError> {
        if dst.nbytes() != self.nbytes() {
            return Err(ArrayError::Size {
                dtype: dst.dtype,
                shape: dst.shape.to_vec(),
                expected: dst.nbytes() as u64,
                found: self.nbytes() as u64,
            });
        }
        Ok(self.storage.copy_to(0, &dst.storage, 0, self.nbytes())?)
    }

    /// A new tensor on `device` with the same contents.
    pub fn copy(&self, device: Device) -> Result<NdArray, ArrayError> {
        let out = NdArray::empty(&self.shape, self.dtype, device)?;
        self.copy_to(&out)?;
        Ok(out)
    }

    /// This tensor on `device`: itself when already there, else a copy.
    pub fn to_device(&self, device: Device) -> Result<NdArray, ArrayError> {
        if self.device() == device {
            Ok(self.clone())
        } else {
            self.copy(device)
        }
    }

    /// A `DLTensor` describing this tensor, for a call into compiled code. It points into the
    /// tensor's storage and shape: use it while `self` (or a clone) is alive.
    pub fn dl_tensor(&self) -> DLTensor {
        let (device_type, device_id) = self.device().to_dlpack();
        DLTensor {
            data: self.storage.ptr().as_ptr(),
            device: DLDevice { device_type, device_id },
            ndim: self.shape.len() as i32,
            dtype: DLDataType::from(self.dtype),
            shape: self.shape.as_ptr().cast_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    /// Like [`NdArray::dl_tensor`], but presented as 1-D (a graph op's `flatten_data`); the
    /// shape lives in `shape`, which must outlive the tensor's use.
    pub fn dl_tensor_flat(&self, shape: &mut [i64; 1]) -> DLTensor {
        shape[0] = self.len() as i64;
        DLTensor { ndim: 1, shape: shape.as_mut_ptr(), ..self.dl_tensor() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_views_and_checks() {
        let a = NdArray::from_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2], Device::cpu(0)).unwrap();
        assert_eq!(a.nbytes(), 16);
        assert_eq!(a.to_f32().unwrap().unwrap(), [1.0, 2.0, 3.0, 4.0]);
        let v = a.view(&[4], DataType::F32).unwrap();
        assert_eq!(v.dl_tensor().data, a.dl_tensor().data);
        let b = a.copy(Device::cpu(0)).unwrap();
        b.copy_from_bytes(&[0u8; 16]).unwrap();
        assert_eq!(a.to_f32().unwrap().unwrap()[3], 4.0);
        assert!(matches!(a.copy_from_bytes(&[0u8; 3]), Err(ArrayError::Size { expected: 16, found: 3, .. })));
        assert!(matches!(NdArray::empty(&[-1], DataType::F32, Device::cpu(0)), Err(ArrayError::BadShape { .. })));
        assert!(NdArray::empty(&[i64::MAX, 4], DataType::F32, Device::cpu(0)).is_err());
        let t = a.to_tensor().unwrap();
        assert_eq!(NdArray::from_tensor(&t, Device::cpu(0)).unwrap().to_bytes().unwrap(), a.to_bytes().unwrap());
        // A tensor at the start of a larger storage shares it, with its own size: its bytes,
        // copies and views stay within that size.
        let head = NdArray::in_storage(a.storage(), 0, &[2], DataType::F32).unwrap();
        assert!(Arc::ptr_eq(head.storage(), a.storage()));
        assert_eq!((head.nbytes(), head.to_f32().unwrap().unwrap()), (8, vec![1.0, 2.0]));
        assert!(head.view(&[3], DataType::F32).is_err());
        assert!(matches!(head.copy_from_bytes(&[0u8; 16]), Err(ArrayError::Size { expected: 8, found: 16, .. })));
        assert!(NdArray::in_storage(a.storage(), 0, &[5], DataType::F32).is_err());
        assert_eq!(head.copy(Device::cpu(0)).unwrap().to_bytes().unwrap(), a.to_bytes().unwrap()[..8]);
    }

    #[test]
    fn aligned_bytes_are_held_in_place_read_only_and_others_copied_once() {
        let api = crate::device::backends::device_api(Device::cpu(0)).unwrap();
        let all = Bytes::from_vec((0..512u32).map(|i| (i * 7) as u8).collect());
        let skip = all.as_ptr().align_offset(crate::device::cpu::CPU_ALIGNMENT);
        let aligned = all.slice(skip..skip + 64).unwrap();
        let a = NdArray::from_mapped(&aligned, &[16], DataType::F32, &api).unwrap();
        assert_eq!(a.dl_tensor().data as usize, aligned.as_ptr() as usize, "held in place");
        assert!(a.storage().is_read_only());
        assert_eq!(a.to_bytes().unwrap(), &aligned[..]);
        // Writes into it, or into a view of it, are refused, not made.
        let err = a.copy_from_bytes(&[0u8; 64]).unwrap_err();
        assert!(matches!(err, ArrayError::Device(DeviceError::ReadOnly { .. })), "{err}");
        let part = NdArray::in_storage(a.storage(), 4, &[2], DataType::F32).unwrap();
        assert!(part.copy_from_bytes(&[0u8; 8]).is_err());
        let other = NdArray::from_f32(&[0.0; 16], &[16], Device::cpu(0)).unwrap();
        assert!(other.copy_to(&a).is_err());
        assert_eq!(a.to_bytes().unwrap(), &aligned[..]);
        // Misaligned bytes: one aligned, writable copy.
        let misaligned = all.slice(skip + 1..skip + 65).unwrap();
        let b = NdArray::from_mapped(&misaligned, &[16], DataType::F32, &api).unwrap();
        assert_ne!(b.dl_tensor().data as usize, misaligned.as_ptr() as usize);
        assert_eq!(b.dl_tensor().data as usize % crate::device::cpu::CPU_ALIGNMENT, 0);
        assert!(!b.storage().is_read_only());
        assert_eq!(b.to_bytes().unwrap(), &misaligned[..]);
        b.copy_from_bytes(&[1u8; 64]).unwrap();
        // The size must match the shape.
        assert!(matches!(
            NdArray::from_mapped(&aligned, &[15], DataType::F32, &api),
            Err(ArrayError::Size { expected: 60, found: 64, .. })
        ));
    }

    /// Resident bytes of the mapping that holds `addr` (its `Rss` line in `/proc/self/smaps`).
    fn resident_bytes_of_mapping(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)));
            if let Some((start, end)) = range {
                inside = (start..end).contains(&addr);
            } else if inside && line.starts_with("Rss:") {
                let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
                return kb * 1024;
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn a_copy_of_a_mapped_file_gives_its_pages_back() {
        let path = std::env::temp_dir().join(format!("mblob-array-release-{}.bin", std::process::id()));
        let n = 24 << 20;
        std::fs::write(&path, (0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
        let file = crate::load::map_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(file.is_mapped());
        // Misaligned on purpose (a mapping starts on a page): the copy path.
        let data = file.slice(1..n - 3).unwrap();
        let before: u64 = data.iter().map(|&b| u64::from(b)).sum();
        assert!(resident_bytes_of_mapping(data.as_ptr() as usize) >= n - 4096, "the sum read every page");
        let api = crate::device::backends::device_api(Device::cpu(0)).unwrap();
        let a = NdArray::from_mapped(&data, &[(n - 4) as i64], DataType { code: 1, bits: 8, lanes: 1 }, &api).unwrap();
        let left = resident_bytes_of_mapping(data.as_ptr() as usize);
        assert!(left <= 64 << 10, "{left} bytes of the file still resident after the copy");
        // The copy holds the bytes, and the file's bytes read the same again.
        let copied = a.to_bytes().unwrap();
        assert_eq!(copied.iter().map(|&b| u64::from(b)).sum::<u64>(), before);
        assert!(copied[..] == data[..]);
        // Bytes that are not a mapping are copied as they are, nothing given back.
        let owned = Bytes::from_vec(copied[..4096].to_vec());
        assert!(!owned.is_mapped());
        owned.release();
        assert_eq!(&owned[..], &copied[..4096]);
    }
}
