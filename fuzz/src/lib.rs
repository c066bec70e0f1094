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
use std::sync::OnceLock;

use mblob_runtime::format::{parse_blob, EntryKind, ParsedBlob, UnknownKeys};
use mblob_runtime::{load_blob, Bytes, FormatError, Layout, LoadOptions, Registry};

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

/// The built-in registry, built once for the whole run: building it per input cost an eighth
/// of `blob_classic`'s time (the key comparisons go through libFuzzer's `memcmp` hook).
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

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

/// Checks what a successful parse claims against the input: the entries tile the body in
/// order (each key's length field follows the previous payload, the last payload ends the
/// body), every payload is the input's bytes at its offset, and every key is the string
/// stored at its offset.
pub fn check_parsed(data: &[u8], parsed: &ParsedBlob<'_>) {
    let end = 8 + parsed.nbytes;
    assert_eq!(end, data.len() as u64, "the blob does not end where the header says");
    let mut prev_end: Option<u64> = None;
    for e in &parsed.entries {
        if let Some(prev) = prev_end {
            assert_eq!(e.key_offset, prev, "entry at {} does not follow the previous payload", e.key_offset);
        }
        let key_at = usize::try_from(e.key_offset).expect("offset fits");
        let key_len = data.get(key_at..key_at + 8).expect("key length inside the input");
        assert_eq!(u64::from_le_bytes(key_len.try_into().expect("8 bytes")), e.type_key.len() as u64);
        assert_eq!(data.get(key_at + 8..key_at + 8 + e.type_key.len()), Some(e.type_key.as_bytes()));
        let at = usize::try_from(e.payload_offset).expect("offset fits");
        let stored = data.get(at..at + e.payload.len()).expect("payload inside the input");
        assert!(e.payload.is_empty() || stored.as_ptr() == e.payload.as_ptr(), "payload does not lie at its offset");
        prev_end = Some(e.payload_offset + e.payload.len() as u64);
    }
    if let Some(prev) = prev_end {
        assert_eq!(prev, end, "the last entry does not end the body");
    }
}

/// A typed error must point into the input and format.
pub fn check_error(n: usize, e: &FormatError) {
    assert!(e.offset <= n as u64, "error offset {} past the input's {n} bytes: {e}", e.offset);
    drop(e.to_string());
}

/// The blob target of one layout: strict and opaque parsing and loading, each under the bound,
/// each result checked against the input, and the loaded tree drawn.
pub fn blob(data: &[u8], layout: Layout) {
    let registry = registry();
    let owned = Bytes::from_vec(data.to_vec());
    let n = data.len();
    let mut opaque_ok = false;
    for unknown in [UnknownKeys::Error, UnknownKeys::KeepRaw] {
        // (The two need not agree: in a legacy blob, whose entries carry no length, the opaque
        // search may split the bytes differently once unknown keys are allowed.)
        let what = if unknown == UnknownKeys::Error { "parse_blob(Error)" } else { "parse_blob(KeepRaw)" };
        let parsed = bounded(n, READ_FACTOR, what, || parse_blob(data, layout, registry, unknown));
        match &parsed {
            Ok(p) => check_parsed(data, p),
            Err(e) => check_error(n, e),
        }
        opaque_ok = parsed.is_ok();
    }
    let loaded =
        bounded(n, LOAD_FACTOR, "load_blob", || load_blob(&owned, layout, registry, &LoadOptions::keep_unknown()));
    match &loaded {
        // Drawn as `inspect --load` and `demo` draw it; not under the bound, since the drawing
        // indents each line by its depth, but it must neither hang nor exhaust memory.
        Ok(tree) => drop(tree.render()),
        Err(e) => drop(e.to_string()),
    }
    // Loading parses with the opaque reader first: it cannot succeed where that failed.
    assert!(loaded.is_err() || opaque_ok, "load_blob accepted what parse_blob refused");
}

/// Factor of the bound for the container readers: a linked WebAssembly module's blob is rebuilt
/// from its data segments, with the zeros binaryen left out (at most 32 bytes of blob for each
/// byte of the file).
pub const CONTAINER_FACTOR: usize = 40;

/// A container target: when `data` is one of `formats`, its blob is looked up (a typed error
/// with an offset inside the input, or the blob) under the container bound, then parsed as
/// `inspect` parses it and every module payload decoded by its loader, under the readers'
/// bound for the blob's size.
pub fn container(data: &[u8], formats: &[mblob_runtime::container::ContainerFormat]) {
    use mblob_runtime::container::{find_blob, identify};
    let Some(identity) = identify(data) else { return };
    if !formats.contains(&identity.format) {
        return;
    }
    let registry = registry();
    let owned = Bytes::from_vec(data.to_vec());
    let n = data.len();
    // A bundle's models (`inspect` of an archive): each blob the file's own bytes.
    let all = bounded(n, CONTAINER_FACTOR, "container::find_blobs", || mblob_runtime::container::find_blobs(&owned));
    match all {
        Err(e) => assert!(e.offset <= n as u64, "error offset {} past the input's {n} bytes: {e}", e.offset),
        Ok(blobs) => {
            for b in blobs.iter().filter_map(|b| b.file_offset.map(|at| (at, &b.bytes))) {
                let start = usize::try_from(b.0).expect("an offset in the input");
                assert_eq!(data.get(start..start + b.1.len()), Some(&b.1[..]), "a bundle's blob is not the file's bytes");
            }
        }
    }
    let found = bounded(n, CONTAINER_FACTOR, "container::find_blob", || find_blob(&owned, None));
    let found = match found {
        Err(e) => {
            assert!(e.offset <= n as u64, "error offset {} past the input's {n} bytes: {e}", e.offset);
            drop(e.to_string());
            return;
        }
        Ok(None) => return,
        Ok(Some(found)) => found,
    };
    let blob = found.bytes;
    if let Some(at) = found.file_offset {
        let start = usize::try_from(at).expect("an offset in the input");
        assert_eq!(data.get(start..start + blob.len()), Some(&blob[..]), "the blob is not the file's bytes");
    }
    bounded(blob.len(), READ_FACTOR, "parse_blob + loaders of a container's blob", || {
        let Ok(parsed) = parse_blob(&blob, found.layout, registry, UnknownKeys::KeepRaw) else { return };
        for e in parsed.entries.iter().filter(|e| e.kind == EntryKind::Module) {
            if let Some(loader) = registry.get(e.type_key) {
                let payload = blob.slice_ref(e.payload).expect("the payload lies in the blob");
                if let Err(err) = loader.load(payload, parsed.layout) {
                    drop(err.to_string());
                }
            }
        }
    });
}

/// The repository's test fixtures (`tests/fixtures`), which the VM targets run.
pub fn fixtures() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"))
}

/// A float32 `.npy` file (the fixtures' inputs) as a tensor on the CPU.
pub fn npy_f32(path: &std::path::Path) -> mblob_runtime::NdArray {
    use mblob_runtime::format::stream::DataType;
    let b = std::fs::read(path).unwrap();
    let len = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + len]).unwrap();
    assert!(header.contains("'<f4'"), "{}: not float32", path.display());
    let dims = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<i64> = dims.split(',').filter_map(|d| d.trim().parse().ok()).collect();
    mblob_runtime::NdArray::from_bytes(&b[10 + len..], &shape, DataType::F32, mblob_runtime::Device::cpu(0)).unwrap()
}
