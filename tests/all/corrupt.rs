//! Bad input: every class of corrupt blob gets a typed error with its byte offset, never a
//! panic. Built from TVM's golden blobs by cutting and forging fields.

use mblob_runtime::format::{self, stream, UnknownKeys};
use mblob_runtime::{load_blob, Bytes, FormatError, FormatErrorKind, Layout, LoadOptions, Registry};

use crate::goldens::{goldens, read};

fn parse(blob: &[u8], layout: Layout) -> Result<(), FormatError> {
    format::parse_blob(blob, layout, &Registry::default(), UnknownKeys::Error).map(|_| ())
}

fn err(blob: &[u8], layout: Layout) -> FormatError {
    parse(blob, layout).expect_err("corrupt blob was accepted")
}

/// graph_dense_relu: GraphExecutorFactory (payload at 44), `_lib` at 1647, `_import_tree` at
/// 1659 with row_ptr at 1679 and child_indices at 1711.
fn graph_blob() -> Vec<u8> {
    read(&goldens().join("graph_dense_relu.blob"))
}

fn ffi_blob() -> Vec<u8> {
    read(&goldens().join("other_versions/tvm-0.27.0.post1/relax_add_mul.blob"))
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn every_truncation_of_every_golden_is_an_error() {
    let cases = [
        (graph_blob(), Layout::Classic),
        (read(&goldens().join("relax_add_mul.blob")), Layout::Classic),
        (read(&goldens().join("other_versions/tvm-0.21.0/relax_add_mul.blob")), Layout::Classic021),
        (ffi_blob(), Layout::Ffi),
    ];
    for (blob, layout) in cases {
        parse(&blob, layout).unwrap();
        for cut in 0..blob.len() {
            // Cut the symbol short, keeping the header.
            assert!(parse(&blob[..cut], layout).is_err(), "{layout} cut at {cut}");
            // Cut the body short and fix the header to match, so the body itself is truncated.
            if cut >= 8 {
                let mut b = blob[..cut].to_vec();
                put_u64(&mut b, 0, cut as u64 - 8);
                assert!(parse(&b, layout).is_err(), "{layout} body cut at {cut}");
            }
        }
    }
}

#[test]
fn header_longer_than_the_symbol() {
    let mut b = graph_blob();
    put_u64(&mut b, 0, 1_000_000);
    assert_eq!(
        err(&b, Layout::Classic),
        FormatError::new(0, FormatErrorKind::HeaderTooLarge { nbytes: 1_000_000, available: 1719 })
    );
}

#[test]
fn trailing_bytes_after_the_body_and_inside_it() {
    let mut b = graph_blob();
    b.extend_from_slice(&[0; 3]);
    assert_eq!(
        err(&b, Layout::Classic).kind,
        FormatErrorKind::TrailingBytes { what: "the body announced by the header", extra: 3 }
    );
    let mut b = graph_blob();
    b.extend_from_slice(&[0; 5]);
    let n = b.len() as u64 - 8;
    put_u64(&mut b, 0, n);
    let e = err(&b, Layout::Classic);
    assert_eq!(e, FormatError::new(1727, FormatErrorKind::TrailingBytes { what: "the last entry", extra: 5 }));
    let mut b = ffi_blob();
    b.push(0);
    let n = b.len() as u64 - 8;
    put_u64(&mut b, 0, n);
    assert!(matches!(err(&b, Layout::Ffi).kind, FormatErrorKind::TrailingBytes { extra: 1, .. }));
}

#[test]
fn string_length_past_the_end() {
    let mut b = graph_blob();
    put_u64(&mut b, 16, 1 << 40); // the first key's length
    let e = err(&b, Layout::Classic);
    assert_eq!(e.offset, 16);
    assert!(matches!(e.kind, FormatErrorKind::LengthTooLarge { what: "type_key", len: 1099511627776, .. }), "{e}");
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    let mut b = graph_blob();
    put_u64(&mut b, 8, u64::MAX); // count
    let e = err(&b, Layout::Classic);
    assert_eq!(e.offset, 8);
    assert!(matches!(e.kind, FormatErrorKind::LengthTooLarge { what: "count", .. }));
    let mut b = graph_blob();
    put_u64(&mut b, 1679, 1 << 60); // row_ptr count
    let e = err(&b, Layout::Classic);
    assert_eq!(e.offset, 1679);
    assert!(matches!(e.kind, FormatErrorKind::LengthTooLarge { what: "row_ptr", .. }));
    let mut b = ffi_blob();
    put_u64(&mut b, 8, 1 << 59); // indptr count
    assert!(matches!(err(&b, Layout::Ffi).kind, FormatErrorKind::LengthTooLarge { what: "indptr", .. }));
}

#[test]
fn row_pointers_not_monotonic_or_out_of_range() {
    // row_ptr = [0, 1, 1] at 1687, 1695, 1703.
    let mut b = graph_blob();
    put_u64(&mut b, 1695, 0);
    put_u64(&mut b, 1703, 1);
    // [0, 0, 1] is fine structurally but makes module 1 import module 1: not after its parent.
    assert!(matches!(err(&b, Layout::Classic).kind, FormatErrorKind::ChildNotAfterParent { parent: 1, child: 1 }));
    let mut b = graph_blob();
    put_u64(&mut b, 1695, 1);
    put_u64(&mut b, 1703, 0);
    let e = err(&b, Layout::Classic);
    assert_eq!(e.offset, 1679);
    assert!(matches!(e.kind, FormatErrorKind::RowPtrInvalid { index: 2, value: 0, .. }), "{e}");
    let mut b = graph_blob();
    put_u64(&mut b, 1695, 9);
    assert!(matches!(err(&b, Layout::Classic).kind, FormatErrorKind::RowPtrInvalid { index: 1, value: 9, .. }));
    let mut b = graph_blob();
    put_u64(&mut b, 1687, 1);
    assert!(matches!(err(&b, Layout::Classic).kind, FormatErrorKind::RowPtrInvalid { index: 0, value: 1, .. }));
}

#[test]
fn child_indices_out_of_range_or_not_after_their_parent() {
    // child_indices = [1] at 1711 (count) and 1719.
    let mut b = graph_blob();
    put_u64(&mut b, 1719, 7);
    let e = err(&b, Layout::Classic);
    assert_eq!(e.kind, FormatErrorKind::ChildOutOfRange { parent: 0, child: 7, modules: 2 });
    put_u64(&mut b, 1719, 0);
    assert_eq!(err(&b, Layout::Classic).kind, FormatErrorKind::ChildNotAfterParent { parent: 0, child: 0 });
    // tvm-ffi: indptr [0,1,1] at 16..40, child_indices [1] count at 40, value at 48.
    let mut b = ffi_blob();
    put_u64(&mut b, 48, 2);
    assert_eq!(err(&b, Layout::Ffi).kind, FormatErrorKind::ChildOutOfRange { parent: 0, child: 2, modules: 2 });
}

#[test]
fn row_ptr_with_the_wrong_number_of_entries() {
    // Build a classic blob whose tree describes 3 modules but whose body holds 2.
    let mut body = Vec::new();
    stream::write_u64(&mut body, 2).unwrap();
    stream::write_str(&mut body, "_lib").unwrap();
    stream::write_str(&mut body, "_import_tree").unwrap();
    stream::write_vec_u64(&mut body, &[0, 0, 0]).unwrap();
    stream::write_vec_u64(&mut body, &[]).unwrap();
    let mut blob = Vec::new();
    stream::write_u64(&mut blob, body.len() as u64).unwrap();
    blob.extend_from_slice(&body);
    assert_eq!(err(&blob, Layout::Classic).kind, FormatErrorKind::RowPtrLength { expected: 2, found: 3 });
}

fn classic_blob(keys: &[&str], row_ptr: &[u64], children: &[u64]) -> Vec<u8> {
    let mut body = Vec::new();
    stream::write_u64(&mut body, keys.len() as u64 + 1).unwrap();
    for k in keys {
        stream::write_str(&mut body, k).unwrap();
    }
    stream::write_str(&mut body, "_import_tree").unwrap();
    stream::write_vec_u64(&mut body, row_ptr).unwrap();
    stream::write_vec_u64(&mut body, children).unwrap();
    let mut blob = Vec::new();
    stream::write_u64(&mut blob, body.len() as u64).unwrap();
    blob.extend_from_slice(&body);
    blob
}

#[test]
fn two_lib_entries_are_refused() {
    // TVM 0.7 wrote one `_lib` per DSO module; a 0.8+ loader refuses it.
    let blob = classic_blob(&["_lib", "_lib"], &[0, 1, 1], &[1]);
    let e = err(&blob, Layout::Classic);
    assert_eq!(e.kind, FormatErrorKind::DuplicateLib { first: 0, second: 1 });
    assert_eq!(e.offset, 28);

    // The tvm-ffi layout: tree [0,1,1] / [1], then `_lib` twice (no payloads).
    let mut body = Vec::new();
    stream::write_vec_u64(&mut body, &[0, 1, 1]).unwrap();
    stream::write_vec_u64(&mut body, &[1]).unwrap();
    stream::write_str(&mut body, "_lib").unwrap();
    let second = 8 + body.len() as u64;
    stream::write_str(&mut body, "_lib").unwrap();
    let mut blob = Vec::new();
    stream::write_u64(&mut blob, body.len() as u64).unwrap();
    blob.extend_from_slice(&body);
    let e = err(&blob, Layout::Ffi);
    assert_eq!(e.kind, FormatErrorKind::DuplicateLib { first: 0, second: 1 });
    assert_eq!(e.offset, second);
}

#[test]
fn import_tree_must_be_last() {
    let mut body = Vec::new();
    stream::write_u64(&mut body, 3).unwrap();
    stream::write_str(&mut body, "_import_tree").unwrap();
    stream::write_vec_u64(&mut body, &[0, 0]).unwrap();
    stream::write_vec_u64(&mut body, &[]).unwrap();
    stream::write_str(&mut body, "_lib").unwrap();
    let mut blob = Vec::new();
    stream::write_u64(&mut blob, body.len() as u64).unwrap();
    blob.extend_from_slice(&body);
    assert!(matches!(err(&blob, Layout::Classic).kind, FormatErrorKind::MisplacedImportTree { .. }));
}

#[test]
fn unknown_type_key_names_the_key_and_the_registered_loaders() {
    let blob = classic_blob(&["_lib", "mystery"], &[0, 1, 1], &[1]);
    let e = err(&blob, Layout::Classic);
    match &e.kind {
        FormatErrorKind::UnknownTypeKey { key, registered } => {
            assert_eq!(key, "mystery");
            assert!(registered.iter().any(|k| k == "GraphExecutorFactory"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.offset, 28);
    let text = e.to_string();
    assert!(text.contains("mystery") && text.contains("GraphExecutorFactory"), "{text}");
}

#[test]
fn legacy_blob_without_import_tree_loads_under_a_library_root() {
    // TVM 0.6: count == number of root imports, no `_lib`, no tree.
    let payload = read(&goldens().join("graph_dense_relu.blob"));
    let parsed = format::parse_blob(&payload, Layout::Classic, &Registry::default(), UnknownKeys::Error).unwrap();
    let gef = parsed.modules().next().unwrap().payload.to_vec();
    let mut body = Vec::new();
    stream::write_u64(&mut body, 1).unwrap();
    stream::write_str(&mut body, "GraphExecutorFactory").unwrap();
    body.extend_from_slice(&gef);
    let mut blob = Vec::new();
    stream::write_u64(&mut blob, body.len() as u64).unwrap();
    blob.extend_from_slice(&body);
    let loaded =
        load_blob(&Bytes::from_vec(blob), Layout::Classic, &Registry::default(), &LoadOptions::default()).unwrap();
    assert!(loaded.origin().legacy);
    assert_eq!(loaded.type_keys(), ["library", "GraphExecutorFactory"]);
    assert_eq!(loaded.modules()[0].imports, [1]);
}

#[test]
fn random_corruption_never_panics() {
    // A fixed xorshift so failures reproduce.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let cases = [(graph_blob(), Layout::Classic), (ffi_blob(), Layout::Ffi)];
    for (blob, layout) in cases {
        for _ in 0..3000 {
            let mut b = blob.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % b.len() as u64) as usize;
                b[at] = next() as u8;
            }
            let _ = parse(&b, layout);
            let _ = load_blob(&Bytes::from_vec(b.clone()), layout, &Registry::default(), &LoadOptions::keep_unknown());
        }
    }
}
