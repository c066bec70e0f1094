//! The ELF symbol lookup of `inspect`, then the blob it finds parsed as `inspect` does.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_runtime::elf::find_blob;
use mblob_runtime::format::{parse_blob, UnknownKeys};
use mblob_runtime::Registry;

#[path = "alloc_bound.rs"]
mod alloc_bound;
#[global_allocator]
static A: alloc_bound::Counting = alloc_bound::Counting;

fuzz_target!(|data: &[u8]| {
    alloc_bound::bounded(data.len(), || {
        if let Ok(Some(found)) = find_blob(data, None) {
            if let Some(blob) = found.bytes(data) {
                let _ = parse_blob(blob, found.layout, &Registry::default(), UnknownKeys::KeepOpaque);
            }
        }
    });
});
