//! The emit side of the C API (feature `emit`), called as a compiler backend would: TVM 0.27's
//! `relax_add_mul` (its host object `lib0.o` and its `relax.VMExecutable` payload, both as TVM
//! wrote them, in `tests/fixtures/tvm-goldens/other_versions/tvm-0.27.0.post1`) exported in
//! TVM's tree shape (the executable at the root, importing the host library) and the ffi
//! layout, by each route. The library holds TVM's blob byte for byte and runs TVM's inputs to
//! TVM's output.
#![cfg(feature = "emit")]

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

use mblob_capi::mblob_status::*;
use mblob_capi::*;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/other_versions/tvm-0.27.0.post1")
}

fn last_error() -> String {
    // SAFETY: never NULL; valid until the next call on this thread.
    unsafe { CStr::from_ptr(mblob_last_error()) }.to_string_lossy().into_owned()
}

fn ok(status: mblob_status, what: &str) {
    assert_eq!(status, MBLOB_OK, "{what}: {}", last_error());
}

fn c(p: &Path) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

/// The float32 data of a `.npy` file written by numpy (little-endian).
fn npy_f32(path: &Path) -> (Vec<i64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let file = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(file.dtype().descr().trim_matches('\''), "<f4");
    let shape: Vec<i64> = file.shape().iter().map(|&d| d as i64).collect();
    let n = shape.iter().product::<i64>() as usize * 4;
    (shape, bytes[bytes.len() - n..].to_vec())
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
        let (mut xs, mut x) = npy_f32(&dir().join("relax_add_mul.in.x.npy"));
        let (mut ys, mut y) = npy_f32(&dir().join("relax_add_mul.in.y.npy"));
        let (want_shape, want) = npy_f32(&dir().join("relax_add_mul.out.0.npy"));
        let tensor = |data: &mut Vec<u8>, shape: &mut Vec<i64>| mblob_dl_tensor {
            data: data.as_mut_ptr().cast(),
            device: mblob_dl_device { device_type: 1, device_id: 0 },
            ndim: shape.len() as i32,
            dtype: mblob_dtype { code: 2, bits: 32, lanes: 1 },
            shape: shape.as_mut_ptr(),
            strides: null_mut(),
            byte_offset: 0,
        };
        let (tx, ty) = (tensor(&mut x, &mut xs), tensor(&mut y, &mut ys));
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
            assert_eq!(std::slice::from_raw_parts(shape, ndim as usize), &want_shape[..]);
            assert!(
                std::slice::from_raw_parts(data.cast::<u8>(), n) == &want[..],
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
