//! The device payload reader: the first byte picks the layout and the type key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_runtime::payload::device::{measure, DeviceModule};
use mblob_runtime::{Bytes, Layout};

#[path = "alloc_bound.rs"]
mod alloc_bound;
#[global_allocator]
static A: alloc_bound::Counting = alloc_bound::Counting;

const KEYS: [&str; 5] = ["cuda", "opencl", "metal", "webgpu", "vulkan"];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let layout = Layout::ALL[usize::from(pick) % 3];
    let key = KEYS[usize::from(pick / 3) % KEYS.len()];
    let owned = Bytes::from_vec(rest.to_vec());
    alloc_bound::bounded(rest.len(), || {
        let _ = measure(rest, 0, key, layout);
        let _ = DeviceModule::read(&owned, 0, key, layout);
        let _ = DeviceModule::read_exact(&owned, key, layout);
    });
});
