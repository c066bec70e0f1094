//! The CPU device: aligned, zeroed memory for tensors ([`CpuApi`]), and the per-thread
//! workspace allocator behind `TVMBackendAllocWorkspace` / `TVMBackendFreeWorkspace`
//! ([`alloc_workspace`], [`free_workspace`]).
//!
//! TVM's kernels assume 64-byte aligned data without checking (`llvm.assume`), so every buffer
//! handed to them is aligned so ([`CPU_ALIGNMENT`]). The workspace allocator keeps, per thread,
//! the blocks that were freed and gives them out again (a best-fit free list): kernels allocate
//! and free in LIFO order on every call, and after the first inference no call reaches the
//! system allocator. A 0-byte request still gets a valid, distinct pointer.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use crate::device::api::{DeviceApi, DevicePtr, TransferCounters, TransferStats};
use crate::device::{Device, DeviceError};

/// The alignment of CPU tensors (TVM's `kAllocAlignment`).
pub const CPU_ALIGNMENT: usize = 64;

/// The CPU: aligned, zeroed heap memory; copies are `memcpy`; workspace memory is
/// this file's per-thread allocator ([`alloc_workspace`]).
#[derive(Debug)]
pub struct CpuApi {
    device: Device,
    counters: TransferCounters,
}

impl CpuApi {
    pub(crate) fn new(device: Device) -> CpuApi {
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
        let p = alloc_workspace(nbytes as u64);
        if p.is_null() {
            return Err(DeviceError::OutOfMemory { device: self.device, bytes: nbytes as u64 });
        }
        Ok(DevicePtr::from_ptr(p))
    }

    fn free_workspace(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        free_workspace(ptr.as_ptr()).map_err(|detail| DeviceError::Driver {
            device: self.device,
            call: "TVMBackendFreeWorkspace".into(),
            detail,
        })
    }

    fn transfers(&self) -> TransferStats {
        self.counters.get()
    }
}

/// Opens the CPU (the backend table's opener for `cpu`).
pub(crate) fn open(device: Device) -> Result<Arc<dyn DeviceApi>, DeviceError> {
    Ok(Arc::new(CpuApi::new(device)))
}

// ---- workspace -------------------------------------------------------------------------

/// How many freed blocks a thread keeps for reuse.
const MAX_CACHED: usize = 64;

#[derive(Default)]
struct Pool {
    /// Blocks handed out and not yet freed: (address, capacity).
    live: Vec<(usize, usize)>,
    /// Freed blocks kept for reuse: (address, capacity).
    free: Vec<(usize, usize)>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Live blocks are leaked on purpose if a kernel never freed them: freeing them here
        // could free memory another thread still uses after a kernel handed it over.
        for &(addr, cap) in &self.free {
            // SAFETY: each cached block was allocated by `alloc_block` with this capacity.
            unsafe { alloc::dealloc(addr as *mut u8, Layout::from_size_align_unchecked(cap, CPU_ALIGNMENT)) }
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

fn alloc_block(cap: usize) -> Option<usize> {
    let layout = Layout::from_size_align(cap, CPU_ALIGNMENT).ok()?;
    // SAFETY: `cap` is at least `CPU_ALIGNMENT`, so the layout is non-zero.
    let p = unsafe { alloc::alloc(layout) };
    (!p.is_null()).then_some(p as usize)
}

/// Allocates `nbytes` of workspace on this thread: 64-byte aligned, valid for 0 bytes, null
/// when the size cannot be allocated.
pub fn alloc_workspace(nbytes: u64) -> *mut c_void {
    let Some(cap) = usize::try_from(nbytes).ok().and_then(|n| n.max(1).checked_next_multiple_of(CPU_ALIGNMENT)) else {
        return std::ptr::null_mut();
    };
    let got = POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        // Best fit among the freed blocks that are large enough.
        let best = pool.free.iter().enumerate().filter(|(_, &(_, c))| c >= cap).min_by_key(|(_, &(_, c))| c);
        let block = match best {
            Some((i, _)) => Some(pool.free.swap_remove(i)),
            None => alloc_block(cap).map(|a| (a, cap)),
        };
        if let Some(b) = block {
            pool.live.push(b);
        }
        block
    });
    match got {
        Ok(Some((addr, _))) => addr as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

/// Frees workspace from [`alloc_workspace`] on this thread. `Err` for a pointer this thread did not
/// allocate (TVM reports the same mistake).
pub fn free_workspace(ptr: *mut c_void) -> Result<(), String> {
    let addr = ptr as usize;
    let r = POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        // Usually the last block handed out (LIFO), so search from the end.
        let i = pool.live.iter().rposition(|&(a, _)| a == addr)?;
        let block = pool.live.remove(i);
        if pool.free.len() < MAX_CACHED {
            pool.free.push(block);
        } else {
            // SAFETY: the block was allocated by `alloc_block` with this capacity.
            unsafe { alloc::dealloc(block.0 as *mut u8, Layout::from_size_align_unchecked(block.1, CPU_ALIGNMENT)) }
        }
        Some(())
    });
    match r {
        Ok(Some(())) => Ok(()),
        _ => Err(format!("TVMBackendFreeWorkspace: {ptr:p} was not allocated as workspace on this thread")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_reused_lifo_and_zero_sized() {
        let a = alloc_workspace(0);
        let b = alloc_workspace(100);
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(a as usize % CPU_ALIGNMENT, 0);
        assert_eq!(b as usize % CPU_ALIGNMENT, 0);
        free_workspace(b).unwrap();
        free_workspace(a).unwrap();
        // The freed 128-byte block is reused for a request that fits.
        let c = alloc_workspace(120);
        assert_eq!(c, b);
        free_workspace(c).unwrap();
        assert!(free_workspace(c).is_err(), "double free is refused");
        assert!(alloc_workspace(u64::MAX).is_null());
    }
}
