//! `inspect` on blobs the fuzzing of the readers turned up (see `fuzz/RESULTS.md`).

use std::process::Command;

use mblob_runtime::LoadedTree;
use serde_json::Value;

#[path = "../../runtime/tests/support/blobs.rs"]
pub mod blobs;
use blobs::{ffi_chain, ffi_dense_dag};

/// `mblob inspect --json --layout ffi` on `data` written to a file: the report's text.
fn inspect_ffi_text(data: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fuzzed.blob");
    std::fs::write(&path, data).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .args(["inspect", "--json", "--layout", "ffi"])
        .arg(&path)
        .output()
        .expect("run mblob");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn inspect_ffi(data: &[u8]) -> Value {
    serde_json::from_str(&inspect_ffi_text(data)).expect("one JSON report")
}

/// The deepest nesting of JSON objects in `text` (deeper than `serde_json` parses by default);
/// the type keys of these blobs hold no braces.
fn object_depth(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for c in text.chars() {
        match c {
            '{' => {
                depth += 1;
                max = max.max(depth);
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    max
}

fn nodes(v: &Value) -> usize {
    1 + v["imports"].as_array().map_or(0, |a| a.iter().map(nodes).sum())
}

/// A 4 KB blob of 30 modules sharing their imports: the report's import tree expanded all
/// 2^29 paths and `inspect` hung. Now it stops at modules + edges + 4096 nodes, and every
/// node it expands lists all of its imports.
#[test]
fn inspect_bounds_the_tree_of_shared_imports() {
    let data = ffi_dense_dag(30, b"x");
    assert!(data.len() < 5000);
    let report = inspect_ffi(&data);
    let tree = &report["tree"];
    assert_eq!(tree["imports"].as_array().map(Vec::len), Some(29));
    assert_eq!(tree["imports"][0]["imports"].as_array().map(Vec::len), Some(28));
    let n = nodes(tree);
    assert!(n > 30 && n <= 30 + 435 + 4096 + 1, "{n} nodes");
}

/// A chain of 3000 modules, each importing the next: the tree stops at
/// `LoadedTree::MAX_SHAPE_DEPTH` levels (the JSON's drop and drawing recurse per level).
#[test]
fn inspect_bounds_the_depth_of_a_chain() {
    let m = 3000;
    let data = ffi_chain(m, b"x");
    let text = inspect_ffi_text(&data);
    // The report is one object, the tree's root a second, each level below one more.
    assert_eq!(object_depth(&text), 2 + LoadedTree::MAX_SHAPE_DEPTH, "{}", &text[..200]);
    let modules = text.split("\"modules\":[").nth(1).and_then(|t| t.split("],\"tree\"").next()).unwrap();
    assert_eq!(modules.matches("\"payload_len\":").count(), m);
}
