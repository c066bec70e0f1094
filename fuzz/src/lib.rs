//! Shared by the fuzz targets: a counting global allocator that turns an allocation peak out of
//! proportion to the input into a failure, and the blob reader run in one layout.
//!
//! The bound: a reader may hold at most `factor * n + SLACK` bytes at once for an input of `n`
//! bytes. Reading (`parse_blob`, the payload readers, the ELF lookup) gets factor 8. Loading
//! (`load_blob`) builds a module object per entry (about 300 bytes: the entry, the loaded module,
//! a decoded device module) from as little as 24 input bytes, and keeps the parsed entries
//! alive meanwhile, so it gets factor 16; `runtime/tests/fuzz_regressions.rs` measures the
//! worst cases (about 10x) with hand-made blobs of tens of thousands of tiny modules. `SLACK`
//! covers fixed costs (error messages listing the registered keys, the ELF reader's tables).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use mblob_runtime::format::{parse_blob, UnknownKeys};
use mblob_runtime::{load_blob, Bytes, Layout, LoadOptions, Registry};

/// Fixed allowance on top of the proportional bound.
pub const SLACK: usize = 64 << 10;

/// Factor of the bound for the readers.
pub const READ_FACTOR: usize = 8;

/// Factor of the bound for `load_blob`, which also builds the modules.
pub const LOAD_FACTOR: usize = 16;

/// Counts live bytes and their peak; forwards everything to `System`.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the counters are atomics that never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: `ptr` came from `alloc` above, that is from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and fails when the bytes it held allocated at once exceed `factor * n + SLACK`.
pub fn bounded<R>(n: usize, factor: usize, what: &str, f: impl FnOnce() -> R) -> R {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let used = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let limit = factor.saturating_mul(n).saturating_add(SLACK);
    assert!(used <= limit, "{what}: an input of {n} bytes held {used} bytes at once (limit {limit})");
    out
}

/// The blob target of one layout: strict and opaque parsing and loading, each under the bound,
/// and the errors formatted (as `inspect` prints them).
pub fn blob(data: &[u8], layout: Layout) {
    let registry = Registry::default();
    let owned = Bytes::from_vec(data.to_vec());
    let n = data.len();
    let strict = bounded(n, READ_FACTOR, "parse_blob(Error)", || {
        parse_blob(data, layout, &registry, UnknownKeys::Error).map_err(|e| e.to_string())
    });
    let opaque = bounded(n, READ_FACTOR, "parse_blob(KeepOpaque)", || {
        parse_blob(data, layout, &registry, UnknownKeys::KeepOpaque).map_err(|e| e.to_string())
    });
    // (No check that `strict` and `opaque` agree: in a legacy blob whose entries have no
    // length, the opaque search may split the bytes differently once unknown keys are allowed.)
    let _ = strict;
    let loaded = bounded(n, LOAD_FACTOR, "load_blob", || {
        load_blob(&owned, layout, &registry, &LoadOptions::keep_unknown()).map(|t| t.type_keys().len())
    });
    if let Err(e) = &loaded {
        let _ = e.to_string();
    }
    // Loading parses with the opaque reader first: it cannot succeed where that failed.
    assert!(loaded.is_err() || opaque.is_ok(), "load_blob accepted what parse_blob refused: {opaque:?}");
}
