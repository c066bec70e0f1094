//! `inspect` on blobs the fuzzing of the readers turned up (see `fuzz/RESULTS.md`).

use std::path::Path;

use mblob::cli::inspect::inspect_bytes;
use mblob_runtime::{Bytes, Layout, LoadedTree};
use serde_json::Value;

#[path = "../../runtime/tests/support/blobs.rs"]
mod blobs;
use blobs::{ffi_chain, ffi_dense_dag};

fn nodes(v: &Value) -> usize {
    1 + v["imports"].as_array().map_or(0, |a| a.iter().map(nodes).sum())
}

fn depth(v: &Value) -> usize {
    v["imports"].as_array().and_then(|a| a.first()).map_or(0, |c| 1 + depth(c))
}

/// A 4 KB blob of 30 modules sharing their imports: the report's import tree expanded all
/// 2^29 paths and `inspect` hung. Now it stops at modules + edges + 4096 nodes, and every
/// node it expands lists all of its imports.
#[test]
fn inspect_bounds_the_tree_of_shared_imports() {
    let data = ffi_dense_dag(30, b"x");
    assert!(data.len() < 5000);
    let report =
        inspect_bytes(&Bytes::from_vec(data), Path::new("dag.blob"), Some(Layout::Ffi), None).expect("inspect");
    let tree = report.tree.expect("a tree");
    assert_eq!(tree["imports"].as_array().map(Vec::len), Some(29));
    assert_eq!(tree["imports"][0]["imports"].as_array().map(Vec::len), Some(28));
    let n = nodes(&tree);
    assert!(n > 30 && n <= 30 + 435 + 4096 + 1, "{n} nodes");
}

/// A chain of 3000 modules, each importing the next: the tree stops at
/// `LoadedTree::MAX_SHAPE_DEPTH` levels (the JSON's drop and drawing recurse per level).
#[test]
fn inspect_bounds_the_depth_of_a_chain() {
    let m = 3000;
    let data = ffi_chain(m, b"x");
    let report =
        inspect_bytes(&Bytes::from_vec(data), Path::new("chain.blob"), Some(Layout::Ffi), None).expect("inspect");
    let tree = report.tree.as_ref().expect("a tree");
    assert_eq!(depth(tree), LoadedTree::MAX_SHAPE_DEPTH);
    assert_eq!(report.modules.len(), m);
}
