//! Hand-built blobs for tests of bad and extreme input, shared by `runtime/tests` and the root
//! crate's `tests/all` (through `#[path]`). They are written byte by byte on purpose: the
//! library's writer refuses most of what these tests need to feed the readers.

#![allow(dead_code)]

pub fn u64le(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// TVM's stream string: u64 length, then the bytes.
pub fn push_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&u64le(s.len() as u64));
    out.extend_from_slice(s);
}

/// The blob's 8-byte length header, then the body.
pub fn blob(body: Vec<u8>) -> Vec<u8> {
    let mut out = u64le(body.len() as u64).to_vec();
    out.extend(body);
    out
}

/// A tvm-ffi blob of `m` modules, `_lib` first and then `m - 1` modules of `key` with empty
/// payloads, where module `i` imports `imports(i)` (its CSR row).
pub fn ffi_tree(m: usize, key: &[u8], imports: impl Fn(usize) -> Vec<u64>) -> Vec<u8> {
    let mut row_ptr = vec![0u64];
    let mut children = Vec::new();
    for i in 0..m {
        children.extend(imports(i));
        row_ptr.push(children.len() as u64);
    }
    let mut body = u64le(row_ptr.len() as u64).to_vec();
    row_ptr.iter().for_each(|v| body.extend_from_slice(&u64le(*v)));
    body.extend_from_slice(&u64le(children.len() as u64));
    children.iter().for_each(|v| body.extend_from_slice(&u64le(*v)));
    push_str(&mut body, b"_lib");
    for _ in 1..m {
        push_str(&mut body, key);
        push_str(&mut body, b"");
    }
    blob(body)
}

/// [`ffi_tree`] where every module imports every later one: `m (m - 1) / 2` edges and
/// `2^(m - 1)` paths from the root.
pub fn ffi_dense_dag(m: usize, key: &[u8]) -> Vec<u8> {
    ffi_tree(m, key, |i| (i as u64 + 1..m as u64).collect())
}

/// [`ffi_tree`] where each module imports the next: a chain `m` levels deep.
pub fn ffi_chain(m: usize, key: &[u8]) -> Vec<u8> {
    ffi_tree(m, key, |i| if i + 1 < m { vec![i as u64 + 1] } else { Vec::new() })
}
