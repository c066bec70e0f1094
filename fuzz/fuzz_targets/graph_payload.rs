//! The GraphExecutorFactory payload reader and its tensors: `measure` and `read` agree, and a
//! payload read and written back reads the same and has the length it was read with.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, READ_FACTOR};
use mblob_runtime::payload::graph::{GraphExecutorFactory, GRAPH_EXECUTOR_FACTORY};
use mblob_runtime::{Bytes, Layout, Payload};

fuzz_target!(|data: &[u8]| {
    let owned = Bytes::from_vec(data.to_vec());
    let n = data.len();
    let measured = bounded(n, READ_FACTOR, "GraphExecutorFactory::measure", || {
        GraphExecutorFactory::measure(data, 0).map_err(|e| e.to_string())
    });
    let read = bounded(n, READ_FACTOR, "GraphExecutorFactory::read", || {
        GraphExecutorFactory::read(&owned, 0, GRAPH_EXECUTOR_FACTORY)
    });
    assert_eq!(measured.clone().ok(), read.as_ref().ok().map(|(_, used)| *used), "measure and read disagree");
    if let Ok((g, used)) = read {
        let mut out = Vec::new();
        g.write_payload(Layout::Classic, &mut out).expect("writing to a Vec");
        assert_eq!(out.len() as u64, used, "written length differs from the length read");
        assert_eq!(g.payload_len(Layout::Classic).unwrap(), used, "payload_len differs from the length read");
        let (again, _) = GraphExecutorFactory::read(&Bytes::from_vec(out), 0, GRAPH_EXECUTOR_FACTORY)
            .expect("what was written reads back");
        assert_eq!(again, g, "read, write, read changed the payload");
    }
});
