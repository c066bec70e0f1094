//! The blob reader in all three layouts (the first byte picks one), strict and opaque, and
//! the loaders run by `load_blob`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_runtime::format::{parse_blob, UnknownKeys};
use mblob_runtime::{load_blob, Bytes, Layout, LoadOptions, Registry};

#[path = "alloc_bound.rs"]
mod alloc_bound;
#[global_allocator]
static A: alloc_bound::Counting = alloc_bound::Counting;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let layout = Layout::ALL[usize::from(pick) % 3];
    let registry = Registry::default();
    let owned = Bytes::from_vec(rest.to_vec());
    alloc_bound::bounded(rest.len(), || {
        let _ = parse_blob(rest, layout, &registry, UnknownKeys::Error);
        let _ = parse_blob(rest, layout, &registry, UnknownKeys::KeepOpaque);
        let _ = load_blob(&owned, layout, &registry, &LoadOptions::keep_unknown());
    });
});
