//! The emit side of the C API (feature `emit`), called as a compiler backend would: TVM 0.27's
//! `relax_add_mul` (its host object `lib0.o` and its `relax.VMExecutable` payload, both as TVM
//! wrote them, in `tests/fixtures/tvm-goldens/other_versions/tvm-0.27.0.post1`) exported in
//! TVM's tree shape (the executable at the root, importing the host library) and the ffi
//! layout, by each route. The library holds TVM's blob byte for byte and runs TVM's inputs to
//! TVM's output.
#![cfg(feature = "emit")]

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

use mblob_capi::*;

#[path = "support/common.rs"]
mod common;
use common::{dl, npy, ok};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/other_versions/tvm-0.27.0.post1")
}

fn c(p: &Path) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

#[test]
fn export_writes_tvm_blob_and_runs_like_tvm() {
    let work = tempfile_dir();
    for (backend, payload_from_file) in [("direct", true), ("c", false)] {
        let out = work.join(format!("relax_add_mul.{backend}.so"));
        let mut e = null_mut();
        // SAFETY: valid strings, bytes and out-pointers; the export is freed once.
        unsafe {
            ok(mblob_export_new(&mut e), "new");
            let mut host = usize::MAX;
            ok(mblob_export_host(e, &mut host), "host");
            ok(mblob_export_add_object(e, c(&dir().join("relax_add_mul.lib0.o")).as_ptr()), "object");
            let bin = dir().join("relax_add_mul.relax.VMExecutable.bin");
            let mut exe = usize::MAX;
            if payload_from_file {
                ok(
                    mblob_export_add_payload_file(e, c"relax.VMExecutable".as_ptr(), c(&bin).as_ptr(), &mut exe),
                    "file",
                );
            } else {
                let bytes = std::fs::read(&bin).unwrap();
                let s = mblob_export_add_payload(
                    e,
                    c"relax.VMExecutable".as_ptr(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    &mut exe,
                );
                ok(s, "payload");
            }
            assert_ne!(exe, host);
            ok(mblob_export_import(e, exe, host), "import");
            ok(mblob_export_set_root(e, exe), "root");
            ok(mblob_export_set_layout(e, c"ffi".as_ptr()), "layout");
            ok(mblob_export_set_backend(e, CString::new(backend).unwrap().as_ptr()), "backend");
            ok(mblob_export_write(e, c(&out).as_ptr()), "write");
            ok(mblob_export_free(e), "free");
        }
        // TVM's blob, byte for byte, under tvm-ffi's symbol.
        let so = std::fs::read(&out).unwrap();
        let found = mblob_runtime::elf::find_blob(&so, None).unwrap().expect("a blob symbol");
        assert_eq!(found.symbol, "__tvm_ffi__library_bin", "{backend}");
        let blob = &so[found.file_offset as usize..][..found.size as usize];
        assert!(blob == std::fs::read(dir().join("relax_add_mul.blob")).unwrap(), "{backend}: blob differs from TVM's");

        // It runs TVM's inputs to TVM's output.
        let (mut x, mut y) = (npy(&dir().join("relax_add_mul.in.x.npy")), npy(&dir().join("relax_add_mul.in.y.npy")));
        let want = npy(&dir().join("relax_add_mul.out.0.npy"));
        assert!([x.bits, y.bits, want.bits] == [32; 3], "float32 inputs and output");
        let (tx, ty) = (dl(&mut x), dl(&mut y));
        let inputs = [&tx as *const mblob_dl_tensor, &ty];
        // SAFETY: live handles, valid pointers, each handle freed once.
        unsafe {
            let (mut lib, mut m, mut t) = (null_mut(), null_mut(), null_mut());
            ok(mblob_library_load(c(&out).as_ptr(), &mut lib), "load");
            ok(mblob_model_new(lib, 1, 0, &mut m), "model");
            ok(mblob_model_invoke(m, null(), inputs.as_ptr(), 2), "invoke");
            ok(mblob_model_output(m, 0, &mut t), "output");
            let (mut data, mut n, mut shape, mut ndim) = (null(), 0usize, null(), 0i32);
            ok(mblob_tensor_data(t, &mut data), "data");
            ok(mblob_tensor_nbytes(t, &mut n), "nbytes");
            ok(mblob_tensor_shape(t, &mut shape), "shape");
            ok(mblob_tensor_ndim(t, &mut ndim), "ndim");
            assert_eq!(std::slice::from_raw_parts(shape, ndim as usize), &want.shape[..]);
            assert!(
                std::slice::from_raw_parts(data.cast::<u8>(), n) == &want.data[..],
                "{backend}: output differs from TVM's"
            );
            ok(mblob_tensor_free(t), "free");
            ok(mblob_model_free(m), "free");
            ok(mblob_library_free(lib), "free");
        }
    }
    std::fs::remove_dir_all(&work).ok();
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mblob-capi-emit-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
