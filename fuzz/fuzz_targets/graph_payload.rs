//! The GraphExecutorFactory payload reader (and its tensors).
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_runtime::payload::graph::{GraphExecutorFactory, GRAPH_EXECUTOR_FACTORY};
use mblob_runtime::Bytes;

#[path = "alloc_bound.rs"]
mod alloc_bound;
#[global_allocator]
static A: alloc_bound::Counting = alloc_bound::Counting;

fuzz_target!(|data: &[u8]| {
    let owned = Bytes::from_vec(data.to_vec());
    alloc_bound::bounded(data.len(), || {
        let _ = GraphExecutorFactory::measure(data, 0);
        let _ = GraphExecutorFactory::read(&owned, 0, GRAPH_EXECUTOR_FACTORY);
    });
});
