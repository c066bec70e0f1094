//! Memory that compiled kernels see: 64-byte aligned buffers ([`AlignedBuffer`]) and the
//! per-thread workspace allocator behind `TVMBackendAllocWorkspace` /
//! `TVMBackendFreeWorkspace`.
//!
//! TVM's kernels assume 64-byte aligned data without checking (`llvm.assume`), so every buffer
//! handed to them comes from here. The workspace allocator keeps, per thread, the blocks that
//! were freed and gives them out again (a best-fit free list): kernels allocate and free in
//! LIFO order on every call, and after the first inference no call reaches the system
//! allocator. A 0-byte request still gets a valid, distinct pointer.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::ffi::c_void;
use std::ptr::NonNull;

/// The alignment TVM gives tensors and workspace memory (`kAllocAlignment`).
pub const ALIGNMENT: usize = 64;

/// A zero-initialised, 64-byte aligned heap buffer.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its allocation exclusively (like a `Vec<u8>`); sharing `&AlignedBuffer`
// only gives shared reads.
unsafe impl Send for AlignedBuffer {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// A buffer of `len` zero bytes, or `None` when the size cannot be allocated.
    pub fn zeroed(len: usize) -> Option<AlignedBuffer> {
        // At least one alignment unit, so a 0-byte buffer still has a unique valid pointer.
        let cap = len.max(1).checked_next_multiple_of(ALIGNMENT)?;
        let layout = Layout::from_size_align(cap, ALIGNMENT).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(AlignedBuffer { ptr, len, cap })
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, 64-byte aligned.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `cap >= len` initialised (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.cap, ALIGNMENT)) }
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuffer({} bytes at {:p})", self.len, self.ptr)
    }
}

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
            unsafe { alloc::dealloc(addr as *mut u8, Layout::from_size_align_unchecked(cap, ALIGNMENT)) }
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

fn alloc_block(cap: usize) -> Option<usize> {
    let layout = Layout::from_size_align(cap, ALIGNMENT).ok()?;
    // SAFETY: `cap` is at least `ALIGNMENT`, so the layout is non-zero.
    let p = unsafe { alloc::alloc(layout) };
    (!p.is_null()).then_some(p as usize)
}

/// Allocates `nbytes` of workspace on this thread: 64-byte aligned, valid for 0 bytes, null
/// when the size cannot be allocated.
pub fn alloc(nbytes: u64) -> *mut c_void {
    let Some(cap) = usize::try_from(nbytes).ok().and_then(|n| n.max(1).checked_next_multiple_of(ALIGNMENT)) else {
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

/// Frees workspace from [`alloc()`] on this thread. `Err` for a pointer this thread did not
/// allocate (TVM reports the same mistake).
pub fn free(ptr: *mut c_void) -> Result<(), String> {
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
            unsafe { alloc::dealloc(block.0 as *mut u8, Layout::from_size_align_unchecked(block.1, ALIGNMENT)) }
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
        let a = alloc(0);
        let b = alloc(100);
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(a as usize % ALIGNMENT, 0);
        assert_eq!(b as usize % ALIGNMENT, 0);
        free(b).unwrap();
        free(a).unwrap();
        // The freed 128-byte block is reused for a request that fits.
        let c = alloc(120);
        assert_eq!(c, b);
        free(c).unwrap();
        assert!(free(c).is_err(), "double free is refused");
        assert!(alloc(u64::MAX).is_null());
        let buf = AlignedBuffer::zeroed(0).unwrap();
        assert_eq!(buf.as_ptr() as usize % ALIGNMENT, 0);
        assert!(buf.is_empty());
    }
}
