//! `inspect` on blobs the fuzzing of the readers turned up (see `fuzz/RESULTS.md`).

use std::path::Path;

use mblob::cli::inspect::inspect_bytes;
use mblob_runtime::{Bytes, Layout, LoadedTree};
use serde_json::Value;

fn u64le(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

fn push_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&u64le(s.len() as u64));
    out.extend_from_slice(s);
}

/// A tvm-ffi blob of `m` modules, `_lib` and then `x` kinds with empty payloads, where each
/// module imports every later one: `m (m - 1) / 2` edges and `2^(m - 1)` paths from the root.
fn dense_dag(m: usize) -> Vec<u8> {
    let mut row_ptr = vec![0u64];
    let mut children = Vec::new();
    for i in 0..m {
        children.extend((i + 1..m).map(|c| c as u64));
        row_ptr.push(children.len() as u64);
    }
    let mut body = u64le(row_ptr.len() as u64).to_vec();
    row_ptr.iter().for_each(|v| body.extend_from_slice(&u64le(*v)));
    body.extend_from_slice(&u64le(children.len() as u64));
    children.iter().for_each(|v| body.extend_from_slice(&u64le(*v)));
    push_str(&mut body, b"_lib");
    for _ in 1..m {
        push_str(&mut body, b"x");
        push_str(&mut body, b"");
    }
    let mut blob = u64le(body.len() as u64).to_vec();
    blob.extend(body);
    blob
}

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
    let data = dense_dag(30);
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
    let mut row_ptr = vec![0u64];
    let mut children = Vec::new();
    for i in 0..m {
        if i + 1 < m {
            children.push(i as u64 + 1);
        }
        row_ptr.push(children.len() as u64);
    }
    let mut body = u64le(row_ptr.len() as u64).to_vec();
    row_ptr.iter().for_each(|v| body.extend_from_slice(&u64le(*v)));
    body.extend_from_slice(&u64le(children.len() as u64));
    children.iter().for_each(|v| body.extend_from_slice(&u64le(*v)));
    push_str(&mut body, b"_lib");
    for _ in 1..m {
        push_str(&mut body, b"x");
        push_str(&mut body, b"");
    }
    let mut data = u64le(body.len() as u64).to_vec();
    data.extend(body);
    let report =
        inspect_bytes(&Bytes::from_vec(data), Path::new("chain.blob"), Some(Layout::Ffi), None).expect("inspect");
    let tree = report.tree.as_ref().expect("a tree");
    assert_eq!(depth(tree), LoadedTree::MAX_SHAPE_DEPTH);
    assert_eq!(report.modules.len(), m);
}
