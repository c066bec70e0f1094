//! The VM's storage pool: storages kept by device and size and handed out again once no one
//! holds them, as TVM's pooled allocator does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::DeviceError;
use crate::ffi::device_api::{DeviceApi, Storage};

/// The page TVM's pooled allocator rounds storage sizes up to (`kDefaultPageSize`).
pub(crate) const POOL_PAGE: u64 = 4096;

/// Storages by device and size, for the next allocation of the same size on the same device
/// (a VM's storages have the same sizes on every run, as TVM's pooled allocator exploits). A
/// storage is free again when the pool holds the only reference: no register, tensor or view
/// (nor an output a caller kept) uses it any more.
#[derive(Debug, Default)]
pub(crate) struct StoragePool {
    buckets: Mutex<Vec<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    /// Index into the VM's devices.
    device: usize,
    nbytes: usize,
    storages: Vec<Arc<Storage>>,
}

impl StoragePool {
    /// Frees the storages no one uses (TVM's `MemoryManager::Clear` of its pooled allocators).
    pub(crate) fn clear(&self) {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        for b in buckets.iter_mut() {
            b.storages.retain_mut(|s| Arc::get_mut(s).is_none());
        }
        buckets.retain(|b| !b.storages.is_empty());
    }

    /// `nbytes` bytes on device `device` (`api`): a free storage of that size (holding what its
    /// last user wrote), or a new one.
    pub(crate) fn alloc(
        &self,
        device: usize,
        api: &Arc<dyn DeviceApi>,
        nbytes: usize,
    ) -> Result<Arc<Storage>, DeviceError> {
        self.alloc_at(None, device, api, nbytes)
    }

    /// [`StoragePool::alloc`] from an allocation site that remembers its bucket in `hint` (the
    /// bucket's index, checked before use: [`StoragePool::clear`] may have moved it), so that
    /// the site finds its bucket without a search.
    pub(crate) fn alloc_at(
        &self,
        hint: Option<&AtomicUsize>,
        device: usize,
        api: &Arc<dyn DeviceApi>,
        nbytes: usize,
    ) -> Result<Arc<Storage>, DeviceError> {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let hinted = hint
            .map(|h| h.load(Ordering::Relaxed))
            .filter(|&i| buckets.get(i).is_some_and(|b| b.device == device && b.nbytes == nbytes));
        let i = match hinted.or_else(|| buckets.iter().position(|b| b.device == device && b.nbytes == nbytes)) {
            Some(i) => i,
            None => {
                buckets.push(Bucket { device, nbytes, storages: Vec::new() });
                buckets.len() - 1
            }
        };
        if let Some(h) = hint {
            h.store(i, Ordering::Relaxed);
        }
        let bucket = &mut buckets[i];
        // `get_mut` succeeds only for the sole reference, and synchronises with the drop of the
        // last other one (which may have been on another thread).
        if let Some(free) = bucket.storages.iter_mut().find_map(|s| Arc::get_mut(s).is_some().then(|| s.clone())) {
            return Ok(free);
        }
        let s = Storage::with_api(api.clone(), nbytes)?;
        bucket.storages.push(s.clone());
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::ffi::device_api::device_api;

    /// An allocation site's bucket hint finds its bucket, a storage comes back only when no
    /// one else holds it, and a hint left stale by `clear` (its bucket gone, another in its
    /// place) is not trusted.
    #[test]
    fn pool_sites_find_their_buckets_and_survive_clear() {
        let api = device_api(Device::cpu(0)).unwrap();
        let pool = StoragePool::default();
        let (a, b) = (AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX));
        let s1 = pool.alloc_at(Some(&a), 0, &api, 4096).unwrap();
        let t1 = pool.alloc_at(Some(&b), 0, &api, 8192).unwrap();
        assert_eq!((a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)), (0, 1));
        // Held: a second storage of the bucket; freed: the first one again.
        let s2 = pool.alloc_at(Some(&a), 0, &api, 4096).unwrap();
        assert!(!Arc::ptr_eq(&s1, &s2));
        let p1 = s1.ptr();
        drop(s1);
        assert_eq!(pool.alloc_at(Some(&a), 0, &api, 4096).unwrap().ptr(), p1);
        // `clear` drops the 4096-byte bucket once nothing holds its storages: the 8192-byte
        // one moves to index 0, where site `a`'s hint points.
        drop(s2);
        pool.clear();
        let t2 = pool.alloc_at(Some(&a), 0, &api, 4096).unwrap();
        assert_eq!(t2.nbytes(), 4096);
        assert!(!Arc::ptr_eq(&t1, &t2));
        let t3 = pool.alloc_at(Some(&b), 0, &api, 8192).unwrap();
        assert_eq!(t3.nbytes(), 8192);
        assert_eq!(b.load(Ordering::Relaxed), 0);
        assert_eq!(a.load(Ordering::Relaxed), 1);
    }
}
