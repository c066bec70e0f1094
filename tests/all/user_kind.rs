//! The user-defined kind of `examples/custom_kind.rs`, run in every layout.

#[test]
fn a_kind_defined_outside_the_crate_exports_and_loads() {
    let dir = tempfile::tempdir().unwrap();
    for layout in mblob_runtime::Layout::ALL {
        let tokens = crate::custom_kind::run(dir.path(), layout).unwrap();
        assert_eq!(tokens, ["<s>", "hello", "world"]);
    }
}
