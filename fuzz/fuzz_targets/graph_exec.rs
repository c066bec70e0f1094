//! The graph executor's readers: the graph JSON (`exec::graph::Graph::parse`) and the params
//! file (`exec::graph::read_params`). The first byte picks the reader. A graph that parses has
//! every index in range (what the executor then relies on without checking again); a params
//! file that reads has tensors whose data length matches dtype and shape.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, READ_FACTOR};
use mblob_runtime::exec::graph::{read_params, Graph};
use mblob_runtime::Bytes;

/// serde_json builds a vector element (8 to 24 bytes) from as little as 2 or 3 input bytes
/// (`0,` or `[],`), and the checked graph copies it once more.
const JSON_FACTOR: usize = 4 * READ_FACTOR;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    if pick % 2 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else { return };
        let parsed = bounded(rest.len(), JSON_FACTOR, "Graph::parse", || Graph::parse(text));
        match parsed {
            Ok(g) => {
                let entries = g.dltype.len();
                assert_eq!(g.shape.len(), entries);
                assert_eq!(g.storage_id.len(), entries);
                assert_eq!(g.node_row_ptr.len(), g.nodes.len() + 1);
                for (nid, n) in g.nodes.iter().enumerate() {
                    for &e in &n.inputs {
                        assert!(e.node < nid, "inputs run before their node");
                        assert!(g.entry_id(e) < entries);
                    }
                }
                for &h in &g.heads {
                    assert!(g.entry_id(h) < entries);
                }
                for &a in &g.arg_nodes {
                    assert_eq!(g.nodes[a].op, "null");
                }
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    } else {
        let owned = Bytes::from_vec(rest.to_vec());
        match bounded(rest.len(), READ_FACTOR, "read_params", || read_params(&owned)) {
            Ok(params) => {
                for (_, t) in params {
                    let elems: u64 = t.shape.iter().map(|&d| d as u64).product();
                    assert_eq!(t.data.len() as u64, elems * t.dtype.element_bytes());
                }
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
