//! The storage pool of the virtual machines (the Relax VM's and the Relay VM's): storages kept
//! by device and size and handed out again once no one holds them, as TVM's pooled allocator
//! (`PooledAllocator`, which both of TVM's VMs allocate through) does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::api::DeviceApi;
use crate::device::storage::Storage;
use crate::device::DeviceError;

/// The page TVM's pooled allocator rounds storage sizes up to (`kDefaultPageSize`).
pub(crate) const POOL_PAGE: u64 = 4096;

/// The most storages a bucket keeps. A free one is found by a scan of the bucket, so a program
/// that holds ever more storages of one size at once (a deep recursion of the Relay VM, each
/// frame with its own) would make each allocation slower; past this many, an allocation that
/// finds none free gets a storage the pool does not keep (freed when its last user drops it).
pub(crate) const MAX_BUCKET: usize = 64;

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
    /// last user wrote), or a new one (kept by the pool unless its bucket holds
    /// [`MAX_BUCKET`] already).
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
        // last other one (which may have been on another thread); the count, a plain load, rules
        // out the held ones first.
        let free = bucket
            .storages
            .iter_mut()
            .find_map(|s| (Arc::strong_count(s) == 1 && Arc::get_mut(s).is_some()).then(|| s.clone()));
        if let Some(free) = free {
            return Ok(free);
        }
        let s = Storage::with_api(api.clone(), nbytes)?;
        if bucket.storages.len() < MAX_BUCKET {
            bucket.storages.push(s.clone());
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::backends::device_api;
    use crate::device::Device;

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

    /// A bucket keeps at most `MAX_BUCKET` storages: one more held at once is not kept, and
    /// once all are free the kept ones come back.
    #[test]
    fn buckets_keep_at_most_max_bucket_storages() {
        let api = device_api(Device::cpu(0)).unwrap();
        let pool = StoragePool::default();
        let held: Vec<_> = (0..MAX_BUCKET + 3).map(|_| pool.alloc(0, &api, 64).unwrap()).collect();
        assert_eq!(pool.buckets.lock().unwrap()[0].storages.len(), MAX_BUCKET);
        let kept: Vec<usize> = held[..MAX_BUCKET].iter().map(|s| s.ptr().0).collect();
        drop(held);
        let again: Vec<_> = (0..MAX_BUCKET).map(|_| pool.alloc(0, &api, 64).unwrap()).collect();
        let mut got: Vec<usize> = again.iter().map(|s| s.ptr().0).collect();
        let mut want = kept;
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
