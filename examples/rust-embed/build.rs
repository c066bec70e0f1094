//! Writes each model of `tests/fixtures/system-lib` (TVM's `system-lib` objects) as a static
//! archive with mblob's `Export`, as MLC's `libmodel_*.a`: TVM's host object, and a blob
//! object mblob packs (registering itself at start-up under the model's prefix). Each archive
//! is linked whole (`+whole-archive`): nothing in the program names the model's symbols, its
//! start-up code is what registers them.

use std::path::PathBuf;

use mblob::export::Export;

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let fixtures = here.join("../../tests/fixtures/system-lib");
    for (model, prefix) in [("tinyllm", "tinyllm_"), ("relax27", "relaxmodel27_")] {
        let host = fixtures.join(format!("{model}.lib0.o"));
        let devc = fixtures.join(format!("{model}.devc.o"));
        println!("cargo:rerun-if-changed={}", host.display());
        println!("cargo:rerun-if-changed={}", devc.display());
        // The module tree TVM packed (read from its blob object), exported again under the
        // same prefix with TVM's host object.
        let (blob, layout) =
            mblob::repack::read_blob(&devc, None).unwrap_or_else(|e| panic!("{}: {e}", devc.display()));
        let tree =
            mblob::repack::module_tree_of(&blob, layout, &devc).unwrap_or_else(|e| panic!("{}: {e}", devc.display()));
        let mut export = Export::from_tree(tree);
        export.object(&host).layout(layout).system_lib(true).prefix(prefix);
        let archive = out.join(format!("lib{model}.a"));
        export.write(&archive).unwrap_or_else(|e| panic!("{}: {}", archive.display(), mblob::with_causes(&e)));
        println!("cargo:rustc-link-lib=static:+whole-archive={model}");
    }
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rerun-if-changed=build.rs");
}
