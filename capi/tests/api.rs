//! The C API's answers to bad input, called as a C program would (through the exported
//! functions): a status and a message, never a crash. The model is TVM 0.19's `graph_mlp`
//! (input `x`, float32 [2, 64]) and TVM 0.27's `relax_mlp_tvm027` from
//! `tests/fixtures/tvm-goldens/run`.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::ptr::{null, null_mut};
use std::sync::{Mutex, MutexGuard, PoisonError};

use mblob_capi::mblob_status::*;
use mblob_capi::*;

/// The tests run one at a time: a test that uses a handle after freeing it must not see its
/// address reused by a handle another test thread made meanwhile.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn golden(name: &str) -> CString {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/run").join(name);
    CString::new(p.to_str().unwrap()).unwrap()
}

fn last_error() -> String {
    // SAFETY: mblob_last_error never returns NULL; the string lives until the next call.
    unsafe { CStr::from_ptr(mblob_last_error()) }.to_str().unwrap().to_owned()
}

/// Asserts `status` is `want` and the message contains `needle`.
fn expect(status: mblob_status, want: mblob_status, needle: &str) {
    let message = last_error();
    assert_eq!(status, want, "message: {message}");
    assert!(message.contains(needle), "message {message:?} does not contain {needle:?}");
}

fn load(name: &str) -> *mut mblob_library {
    let mut lib = null_mut();
    // SAFETY: a valid path string and out-pointer.
    let s = unsafe { mblob_library_load(golden(name).as_ptr(), &mut lib) };
    assert_eq!(s, MBLOB_OK, "{}", last_error());
    lib
}

fn model(lib: *mut mblob_library) -> *mut mblob_model {
    let mut m = null_mut();
    // SAFETY: a live library and a valid out-pointer.
    let s = unsafe { mblob_model_new(lib, 1, 0, &mut m) };
    assert_eq!(s, MBLOB_OK, "{}", last_error());
    m
}

fn x() -> Vec<u8> {
    (0..128).flat_map(|i| (i as f32 * 0.01).to_le_bytes()).collect()
}

/// Sets `x` of `m` from `data` as float32 of `shape`.
fn set(m: *mut mblob_model, name: Option<&CStr>, data: &[u8], bits: u8, shape: &[i64]) -> mblob_status {
    // SAFETY: the pointers come from live Rust values of the sizes given.
    unsafe {
        mblob_model_set_input(
            m,
            name.map_or(null(), CStr::as_ptr),
            0,
            data.as_ptr().cast(),
            data.len(),
            2,
            bits,
            1,
            shape.as_ptr(),
            shape.len() as i32,
        )
    }
}

#[test]
fn null_handles_and_out_pointers() {
    let _serial = serial();
    let mut lib = null_mut();
    let mut m = null_mut();
    let mut n = 0usize;
    // SAFETY: each call passes NULL where the API allows it to be checked.
    unsafe {
        expect(mblob_library_load(null(), &mut lib), MBLOB_ERR_NULL_ARGUMENT, "path is NULL");
        expect(mblob_library_load(golden("graph_mlp.so").as_ptr(), null_mut()), MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        expect(mblob_model_new(null(), 1, 0, &mut m), MBLOB_ERR_NULL_ARGUMENT, "lib is NULL");
        expect(mblob_model_run(null_mut()), MBLOB_ERR_NULL_ARGUMENT, "model is NULL");
        expect(mblob_model_num_inputs(null(), &mut n), MBLOB_ERR_NULL_ARGUMENT, "model is NULL");
        expect(mblob_tensor_nbytes(null(), &mut n), MBLOB_ERR_NULL_ARGUMENT, "tensor is NULL");
        // Freeing NULL does nothing, as free() does.
        assert_eq!(mblob_model_free(null_mut()), MBLOB_OK);
        assert_eq!(mblob_library_free(null_mut()), MBLOB_OK);
        assert_eq!(mblob_tensor_free(null_mut()), MBLOB_OK);
    }
    assert!(lib.is_null() && m.is_null(), "out-pointers written on failure");
    let lib = load("graph_mlp.so");
    let m = model(lib);
    // SAFETY: live handles, NULL out-pointers.
    unsafe {
        expect(mblob_model_num_inputs(m, null_mut()), MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        expect(mblob_model_new(lib, 1, 0, null_mut()), MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        expect(mblob_model_select_function(m, null()), MBLOB_ERR_NULL_ARGUMENT, "name is NULL");
        assert_eq!(mblob_model_free(m), MBLOB_OK);
        assert_eq!(mblob_library_free(lib), MBLOB_OK);
    }
    assert_eq!(last_error(), "", "a successful call clears the last error");
}

#[test]
fn freed_and_foreign_handles() {
    let _serial = serial();
    let lib = load("graph_mlp.so");
    let m = model(lib);
    let mut n = 0usize;
    // SAFETY: handles used after free and of the wrong kind are what is tested; the API
    // checks them against its live set before use.
    unsafe {
        assert_eq!(mblob_library_free(lib), MBLOB_OK);
        expect(mblob_library_free(lib), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_library");
        // The model keeps what it needs of its library.
        let data = x();
        assert_eq!(set(m, None, &data, 32, &[2, 64]), MBLOB_OK, "{}", last_error());
        assert_eq!(mblob_model_run(m), MBLOB_OK, "{}", last_error());
        expect(
            mblob_model_new(m.cast(), 1, 0, &mut null_mut()),
            MBLOB_ERR_INVALID_HANDLE,
            "is a mblob_model, not a mblob_library",
        );
        expect(mblob_tensor_nbytes(m.cast(), &mut n), MBLOB_ERR_INVALID_HANDLE, "not a mblob_tensor");
        let mut t = null_mut();
        assert_eq!(mblob_model_output(m, 0, &mut t), MBLOB_OK, "{}", last_error());
        assert_eq!(mblob_tensor_nbytes(t, &mut n), MBLOB_OK);
        assert_eq!(n, 2 * 10 * 4);
        assert_eq!(mblob_tensor_free(t), MBLOB_OK);
        expect(mblob_tensor_free(t), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_tensor");
        expect(mblob_tensor_nbytes(t, &mut n), MBLOB_ERR_INVALID_HANDLE, "freed already");
        assert_eq!(mblob_model_free(m), MBLOB_OK);
        expect(mblob_model_run(m), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_model");
        expect(mblob_model_free(m), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_model");
    }
}

#[test]
fn wrong_sizes_dtypes_names_and_missing_inputs() {
    let _serial = serial();
    let lib = load("graph_mlp.so");
    let m = model(lib);
    let data = x();
    let name = CString::new("x").unwrap();
    let bad_name = CString::new("y").unwrap();
    // SAFETY: live handles and buffers of the sizes passed, except where a size is the point.
    unsafe {
        expect(mblob_model_run(m), MBLOB_ERR_INPUT, "missing inputs: x");
        let mut n = 0usize;
        expect(mblob_model_num_outputs(m, &mut n), MBLOB_ERR_STATE, "mblob_model_run first");
        expect(set(m, Some(&name), &data[..100], 32, &[2, 64]), MBLOB_ERR_INVALID_ARGUMENT, "nbytes is 100");
        expect(set(m, Some(&name), &data, 32, &[2, -64]), MBLOB_ERR_INVALID_ARGUMENT, "negative extent");
        expect(
            set(m, Some(&name), &data, 64, &[2, 32]),
            MBLOB_ERR_INPUT,
            "expected float32 [2, 64], got float64 [2, 32]",
        );
        expect(set(m, Some(&name), &data, 32, &[4, 32]), MBLOB_ERR_INPUT, "expected float32 [2, 64]");
        expect(set(m, Some(&bad_name), &data, 32, &[2, 64]), MBLOB_ERR_INPUT, "no input named `y` (inputs: x)");
        expect(set(m, Some(&name), &data, 0, &[2, 64]), MBLOB_ERR_INVALID_ARGUMENT, "no bits");
        let s = mblob_model_set_input(m, null(), 1, data.as_ptr().cast(), data.len(), 2, 32, 1, [2i64, 64].as_ptr(), 2);
        expect(s, MBLOB_ERR_INVALID_ARGUMENT, "input index 1 is out of range (there are 1)");
        let s = mblob_model_set_input(m, null(), 0, null(), data.len(), 2, 32, 1, [2i64, 64].as_ptr(), 2);
        expect(s, MBLOB_ERR_NULL_ARGUMENT, "data is NULL");
        let s = mblob_model_set_input(m, null(), 0, data.as_ptr().cast(), data.len(), 2, 32, 1, null(), 2);
        expect(s, MBLOB_ERR_NULL_ARGUMENT, "shape is NULL");
        let s =
            mblob_model_set_input(m, null(), 0, data.as_ptr().cast(), data.len(), 2, 32, 1, [2i64, 64].as_ptr(), -1);
        expect(s, MBLOB_ERR_INVALID_ARGUMENT, "ndim is -1");
        let invalid_utf8 = [0xffu8, 0];
        let s = mblob_model_set_input(
            m,
            invalid_utf8.as_ptr().cast::<c_char>(),
            0,
            data.as_ptr().cast(),
            data.len(),
            2,
            32,
            1,
            [2i64, 64].as_ptr(),
            2,
        );
        expect(s, MBLOB_ERR_INVALID_ARGUMENT, "name is not UTF-8");
        // Nothing above set the input.
        expect(mblob_model_run(m), MBLOB_ERR_INPUT, "missing inputs: x");
        let fname = CString::new("main").unwrap();
        expect(mblob_model_select_function(m, fname.as_ptr()), MBLOB_ERR_NO_MODEL, "no functions");
        // By position, then a run and an output index out of range.
        assert_eq!(set(m, None, &data, 32, &[2, 64]), MBLOB_OK, "{}", last_error());
        assert_eq!(mblob_model_run(m), MBLOB_OK, "{}", last_error());
        assert_eq!(mblob_model_num_outputs(m, &mut n), MBLOB_OK);
        assert_eq!(n, 1);
        let mut t = null_mut();
        expect(
            mblob_model_output(m, 1, &mut t),
            MBLOB_ERR_INVALID_ARGUMENT,
            "output index 1 is out of range (there are 1)",
        );
        assert!(t.is_null());
        mblob_model_free(m);
        mblob_library_free(lib);
    }
}

#[test]
fn relax_functions_and_input_names() {
    let _serial = serial();
    let lib = load("relax_mlp_tvm027.so");
    let m = model(lib);
    let mut n = 0usize;
    let mut name: *const c_char = null();
    // SAFETY: live handles and valid out-pointers.
    unsafe {
        assert_eq!(mblob_model_num_inputs(m, &mut n), MBLOB_OK);
        assert_eq!(n, 1);
        assert_eq!(mblob_model_input_name(m, 0, &mut name), MBLOB_OK);
        assert_eq!(CStr::from_ptr(name).to_str().unwrap(), "x");
        expect(mblob_model_input_name(m, 1, &mut name), MBLOB_ERR_INVALID_ARGUMENT, "input index 1");
        let f = CString::new("nope").unwrap();
        expect(
            mblob_model_select_function(m, f.as_ptr()),
            MBLOB_ERR_NO_MODEL,
            "no VM function `nope` (functions: main",
        );
        let f = CString::new("main").unwrap();
        assert_eq!(mblob_model_select_function(m, f.as_ptr()), MBLOB_OK);
        // A Relax function checks its parameters when it runs.
        let wrong: Vec<u8> = vec![0; 4 * 4 * 4];
        assert_eq!(set(m, None, &wrong, 32, &[4, 4]), MBLOB_OK);
        let s = mblob_model_run(m);
        assert_eq!(s, MBLOB_ERR_RUN, "{}", last_error());
        assert!(!last_error().is_empty());
        mblob_model_free(m);
        mblob_library_free(lib);
    }
}

#[test]
fn load_errors_name_the_file() {
    let _serial = serial();
    let mut lib = null_mut();
    // SAFETY: valid strings and out-pointers.
    unsafe {
        let missing = CString::new("/nonexistent/model.so").unwrap();
        expect(mblob_library_load(missing.as_ptr(), &mut lib), MBLOB_ERR_LOAD, "/nonexistent/model.so");
        let not_elf = golden("manifest.json");
        expect(mblob_library_load(not_elf.as_ptr(), &mut lib), MBLOB_ERR_LOAD, "manifest.json");
    }
    assert!(lib.is_null());
}

#[test]
fn last_error_is_per_thread() {
    let _serial = serial();
    let mut lib = null_mut();
    // SAFETY: NULL path, valid out-pointer.
    unsafe { mblob_library_load(null(), &mut lib) };
    assert!(last_error().contains("path is NULL"));
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "");
    assert!(last_error().contains("path is NULL"));
}

/// One library shared by threads, a model on each: every thread's output is TVM's.
#[test]
fn one_library_shared_by_threads() {
    let _serial = serial();
    let npy_data = |name: &str| {
        let bytes =
            std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/run").join(name))
                .unwrap();
        let file = npyz::NpyFile::new(&bytes[..]).unwrap();
        let n = file.shape().iter().product::<u64>() as usize * file.dtype().num_bytes().unwrap();
        bytes[bytes.len() - n..].to_vec()
    };
    let x = npy_data("graph_mlp.in.x.npy");
    let want = npy_data("graph_mlp.out.0.npy");
    struct Shared(*mut mblob_library);
    // SAFETY: the API documents a library as shareable across threads.
    unsafe impl Send for Shared {}
    unsafe impl Sync for Shared {}
    let lib = Shared(load("graph_mlp.so"));
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let lib = &lib;
                let m = model(lib.0);
                let mut t = null_mut();
                let (mut data, mut n) = (null(), 0usize);
                // SAFETY: a model of this thread's own, buffers of the sizes passed.
                unsafe {
                    for _ in 0..5 {
                        assert_eq!(set(m, None, &x, 32, &[2, 64]), MBLOB_OK, "{}", last_error());
                        assert_eq!(mblob_model_run(m), MBLOB_OK, "{}", last_error());
                        assert_eq!(mblob_model_output(m, 0, &mut t), MBLOB_OK, "{}", last_error());
                        assert_eq!(mblob_tensor_data(t, &mut data), MBLOB_OK);
                        assert_eq!(mblob_tensor_nbytes(t, &mut n), MBLOB_OK);
                        assert!(
                            std::slice::from_raw_parts(data.cast::<u8>(), n) == &want[..],
                            "output differs from TVM's"
                        );
                        assert_eq!(mblob_tensor_free(t), MBLOB_OK);
                    }
                    assert_eq!(mblob_model_free(m), MBLOB_OK);
                }
            });
        }
    });
    // SAFETY: every thread is done with it.
    assert_eq!(unsafe { mblob_library_free(lib.0) }, MBLOB_OK);
}

/// A CPU-built model asked for another device, or an unknown device type: a device error.
#[test]
fn devices_the_model_cannot_run_on() {
    let _serial = serial();
    let lib = load("graph_mlp.so");
    let mut m = null_mut();
    // SAFETY: a live library and a valid out-pointer.
    unsafe {
        for (device_type, device_id) in [(4, 0), (2, 0), (99, 0)] {
            let s = mblob_model_new(lib, device_type, device_id, &mut m);
            let message = last_error();
            assert_eq!(s, MBLOB_ERR_DEVICE, "({device_type}, {device_id}): {message}");
            assert!(!message.is_empty());
            assert!(m.is_null());
        }
        assert_eq!(mblob_library_free(lib), MBLOB_OK);
    }
}
