//! `libmblob.so` exports none of TVM's or tvm-ffi's names: a process may hold TVM's runtime
//! (or tvm-ffi inside another package) beside it, and each name must keep reaching its own
//! definition. Only the static library built with the `system-lib` feature defines them (see
//! `tests/system_lib.rs`); a build with that feature on skips this check, saying so.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol};

/// The profile directory of this build (`target/debug`): the test binary is in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

#[test]
fn shared_library_exports_no_tvm_names() {
    if cfg!(feature = "system-lib") {
        eprintln!("SKIPPED: built with `system-lib`, whose library defines TVM's names on purpose");
        return;
    }
    let dir = profile_dir();
    let so = [dir.join("deps/libmblob_capi.so"), dir.join("libmblob_capi.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libmblob_capi.so not built in {} or its deps/", dir.display()));
    let bytes = std::fs::read(&so).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let exported: Vec<String> =
        file.dynamic_symbols().filter(|s| s.is_definition()).filter_map(|s| s.name().ok().map(str::to_owned)).collect();
    assert!(exported.iter().any(|n| n == "mblob_library_load_system"), "the C API is exported: {exported:?}");
    let tvm: Vec<&String> =
        exported.iter().filter(|n| n.starts_with("TVM") || n.starts_with("tvm_") || n.starts_with("__tvm")).collect();
    assert!(tvm.is_empty(), "{} exports TVM's names: {tvm:?}", so.display());
}

/// Without the feature, `mblob_library_load_system` is there (so a program compiles against
/// either library) and says what it lacks, with no handle written.
#[cfg(not(feature = "system-lib"))]
#[test]
fn load_system_without_the_feature_is_unsupported() {
    use mblob_capi::{mblob_last_error, mblob_library_load_system, mblob_status};
    let mut lib = std::ptr::null_mut();
    // SAFETY: a NUL-terminated prefix and a writable out-pointer.
    let status = unsafe { mblob_library_load_system(c"tinyllm_".as_ptr(), &mut lib) };
    assert_eq!(status, mblob_status::MBLOB_ERR_UNSUPPORTED);
    assert!(lib.is_null());
    // SAFETY: never NULL; valid until the next call on this thread.
    let message = unsafe { std::ffi::CStr::from_ptr(mblob_last_error()) }.to_string_lossy().into_owned();
    assert!(message.contains("system://tinyllm_") && message.contains("libmblob.a"), "{message}");
}
