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

#[path = "support/common.rs"]
mod common;
use common::last_error;

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

/// A host DLTensor of float32 over `data` with `shape`.
fn dl(data: &mut [u8], shape: &mut [i64]) -> mblob_dl_tensor {
    common::host_dl(data, shape, common::F32)
}

#[test]
fn libraries_from_memory_that_are_not_libraries() {
    let _serial = serial();
    let mut lib = null_mut();
    // SAFETY: the pointers are valid or NULL as each case says.
    unsafe {
        expect(mblob_library_load_memory(null(), 4, null(), &mut lib), MBLOB_ERR_NULL_ARGUMENT, "data is NULL");
        let text = b"not a shared library";
        let s = mblob_library_load_memory(text.as_ptr().cast(), text.len(), c"notes.txt".as_ptr(), &mut lib);
        expect(s, MBLOB_ERR_LOAD, "library from memory `notes.txt`");
        assert!(lib.is_null(), "out written on an error");
        let s = mblob_library_load_memory(text.as_ptr().cast(), 0, null(), &mut lib);
        expect(s, MBLOB_ERR_LOAD, "library from memory `memory`");
        // An ELF header and nothing after it.
        let so =
            std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/run/graph_mlp.so"))
                .unwrap();
        let s = mblob_library_load_memory(so.as_ptr().cast(), 64, null(), &mut lib);
        expect(s, MBLOB_ERR_LOAD, "memory");
        let s = mblob_library_load_memory(so.as_ptr().cast(), so.len(), null(), null_mut());
        expect(s, MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        assert!(lib.is_null());
    }
}

#[test]
fn bad_dltensors_are_refused() {
    let _serial = serial();
    let lib = load("graph_mlp.so");
    let m = model(lib);
    let mut data = x();
    let mut shape = [2i64, 64];
    // SAFETY: each tensor below is readable; the ones that lie about their memory are refused
    // before it is read.
    unsafe {
        let set = |t: &mblob_dl_tensor| mblob_model_set_input_dltensor(m, c"x".as_ptr(), 0, t);
        expect(mblob_model_set_input_dltensor(m, c"x".as_ptr(), 0, null()), MBLOB_ERR_NULL_ARGUMENT, "tensor is NULL");
        let good = dl(&mut data, &mut shape);
        expect(set(&mblob_dl_tensor { ndim: -1, ..good }), MBLOB_ERR_INVALID_ARGUMENT, "ndim is -1");
        expect(set(&mblob_dl_tensor { ndim: 65, ..good }), MBLOB_ERR_INVALID_ARGUMENT, "ndim is 65");
        expect(set(&mblob_dl_tensor { shape: null_mut(), ..good }), MBLOB_ERR_NULL_ARGUMENT, "shape is NULL");
        expect(set(&mblob_dl_tensor { data: null_mut(), ..good }), MBLOB_ERR_INVALID_ARGUMENT, "data is NULL");
        let zero_bits = mblob_dtype { code: 2, bits: 0, lanes: 1 };
        expect(set(&mblob_dl_tensor { dtype: zero_bits, ..good }), MBLOB_ERR_INVALID_ARGUMENT, "no bits");
        let mut negative = [2i64, -64];
        expect(set(&dl(&mut data, &mut negative)), MBLOB_ERR_INVALID_ARGUMENT, "negative extent");
        let mut huge = [i64::MAX, 4];
        expect(set(&dl(&mut data, &mut huge)), MBLOB_ERR_INVALID_ARGUMENT, "overflows");
        let mut transposed = [1i64, 2];
        let t = mblob_dl_tensor { strides: transposed.as_mut_ptr(), ..good };
        expect(set(&t), MBLOB_ERR_INVALID_ARGUMENT, "compact");
        let t = mblob_dl_tensor { byte_offset: u64::MAX, ..good };
        expect(set(&t), MBLOB_ERR_INVALID_ARGUMENT, "byte_offset");
        // ROCm memory: no device API for it.
        let t = mblob_dl_tensor { device: mblob_dl_device { device_type: 10, device_id: 0 }, ..good };
        expect(set(&t), MBLOB_ERR_DEVICE, "");
        // A valid tensor of the wrong shape for the graph's input.
        let mut wrong = [4i64, 32];
        expect(set(&dl(&mut data, &mut wrong)), MBLOB_ERR_INPUT, "");
        // Compact strides are fine, and so is an offset into a larger buffer.
        let mut strides = [64i64, 1];
        ok(set(&mblob_dl_tensor { strides: strides.as_mut_ptr(), ..good }));
        let mut padded = vec![0u8; 8];
        padded.extend_from_slice(&data);
        ok(set(&mblob_dl_tensor { byte_offset: 8, ..dl(&mut padded, &mut shape) }));
        // The freed model.
        mblob_model_free(m);
        expect(set(&good), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_model");
        mblob_library_free(lib);
    }
}

fn ok(s: mblob_status) {
    assert_eq!(s, MBLOB_OK, "{}", last_error());
}

static DELETES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn count_delete(t: *mut mblob_dl_managed_tensor) {
    DELETES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: made by `Box::into_raw` in the test, deleted once.
    drop(unsafe { Box::from_raw(t) });
}

#[test]
fn managed_tensors_are_deleted_once_on_every_error() {
    let _serial = serial();
    let lib = load("graph_mlp.so");
    let m = model(lib);
    let mut data = x();
    let mut shape = [2i64, 64];
    let make = |t: mblob_dl_tensor| {
        Box::into_raw(Box::new(mblob_dl_managed_tensor {
            dl_tensor: t,
            manager_ctx: null_mut(),
            deleter: Some(count_delete),
        }))
    };
    let good = dl(&mut data, &mut shape);
    let deletes = || DELETES.load(std::sync::atomic::Ordering::SeqCst);
    let before = deletes();
    // SAFETY: each managed tensor is handed over once; mblob deletes it.
    unsafe {
        let s = mblob_model_set_input_dlpack(null_mut(), c"x".as_ptr(), 0, make(good));
        expect(s, MBLOB_ERR_NULL_ARGUMENT, "model is NULL");
        let s = mblob_model_set_input_dlpack(m, c"x".as_ptr(), 0, make(mblob_dl_tensor { ndim: -3, ..good }));
        expect(s, MBLOB_ERR_INVALID_ARGUMENT, "ndim");
        let s = mblob_model_set_input_dlpack(m, c"nope".as_ptr(), 0, make(good));
        expect(s, MBLOB_ERR_INPUT, "nope");
        let lib_as_model = lib.cast::<mblob_model>();
        let s = mblob_model_set_input_dlpack(lib_as_model, c"x".as_ptr(), 0, make(good));
        expect(s, MBLOB_ERR_INVALID_HANDLE, "mblob_library, not a mblob_model");
        expect(mblob_model_set_input_dlpack(m, c"x".as_ptr(), 0, null_mut()), MBLOB_ERR_NULL_ARGUMENT, "tensor");
        assert_eq!(deletes() - before, 4);
        // No deleter at all is fine too.
        let bare = Box::into_raw(Box::new(mblob_dl_managed_tensor {
            dl_tensor: good,
            manager_ctx: null_mut(),
            deleter: None,
        }));
        ok(mblob_model_set_input_dlpack(m, c"x".as_ptr(), 0, bare));
        drop(Box::from_raw(bare));
        mblob_model_free(m);
        mblob_library_free(lib);
    }
}

#[test]
fn invoke_and_device_tensors_misused() {
    let _serial = serial();
    let graph = load("graph_mlp.so");
    let gm = model(graph);
    let relax = load("relax_mlp_tvm027.so");
    let rm = model(relax);
    let mut data = x();
    let mut shape = [2i64, 64];
    let t = dl(&mut data, &mut shape);
    let inputs = [&t as *const mblob_dl_tensor];
    // SAFETY: valid or NULL pointers as each case says.
    unsafe {
        expect(mblob_model_invoke(gm, null(), inputs.as_ptr(), 1), MBLOB_ERR_UNSUPPORTED, "mblob_model_run");
        let mut kind = mblob_kind::MBLOB_MODEL_RELAX;
        ok(mblob_model_kind(gm, &mut kind));
        assert_eq!(kind, mblob_kind::MBLOB_MODEL_GRAPH);
        expect(mblob_model_kind(gm, null_mut()), MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        let mut count = 7;
        ok(mblob_model_num_functions(gm, &mut count));
        assert_eq!(count, 0, "a graph model has no functions");
        let mut fname = null();
        expect(
            mblob_model_function_name(gm, 0, &mut fname),
            MBLOB_ERR_INVALID_ARGUMENT,
            "function index 0 is out of range",
        );
        ok(mblob_model_num_functions(rm, &mut count));
        expect(mblob_model_function_name(rm, count, &mut fname), MBLOB_ERR_INVALID_ARGUMENT, "out of range");
        assert!(fname.is_null());
        expect(mblob_model_invoke(rm, c"nope".as_ptr(), inputs.as_ptr(), 1), MBLOB_ERR_NO_MODEL, "nope");
        expect(mblob_model_invoke(rm, null(), null(), 1), MBLOB_ERR_NULL_ARGUMENT, "inputs is NULL");
        let nulls = [null::<mblob_dl_tensor>()];
        expect(mblob_model_invoke(rm, null(), nulls.as_ptr(), 1), MBLOB_ERR_NULL_ARGUMENT, "inputs[0] is NULL");
        // Too few arguments: the VM says so; no outputs.
        expect(mblob_model_invoke(rm, null(), null(), 0), MBLOB_ERR_RUN, "");
        let mut n = 0;
        expect(mblob_model_num_outputs(rm, &mut n), MBLOB_ERR_STATE, "mblob_model_run first");
        let mut wrong_shape = [4i64, 32];
        let w = dl(&mut data, &mut wrong_shape);
        expect(mblob_model_invoke(rm, null(), [&w as *const _].as_ptr(), 1), MBLOB_ERR_RUN, "");
        ok(mblob_model_invoke(rm, null(), inputs.as_ptr(), 1));
        let mut y = null_mut();
        expect(mblob_model_output_device(rm, 1, &mut y), MBLOB_ERR_INVALID_ARGUMENT, "out of range");
        ok(mblob_model_output_device(rm, 0, &mut y));
        let mut managed = null_mut();
        expect(mblob_tensor_to_dlpack(y, null_mut()), MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        expect(mblob_tensor_to_dlpack(rm.cast(), &mut managed), MBLOB_ERR_INVALID_HANDLE, "mblob_model");
        let mut view = std::mem::zeroed::<mblob_dl_tensor>();
        expect(mblob_tensor_dltensor(null(), &mut view), MBLOB_ERR_NULL_ARGUMENT, "tensor is NULL");
        let mut dev = mblob_dl_device { device_type: 0, device_id: 0 };
        ok(mblob_tensor_free(y));
        expect(mblob_tensor_device(y, &mut dev), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_tensor");
        let mut host = null_mut();
        expect(mblob_tensor_to_host(y, &mut host), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_tensor");
        expect(mblob_tensor_to_dlpack(y, &mut managed), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_tensor");
        assert!(managed.is_null() && host.is_null());
        for m in [gm, rm] {
            mblob_model_free(m);
        }
        mblob_library_free(graph);
        mblob_library_free(relax);
    }
}

#[cfg(feature = "inspect")]
#[test]
fn inspect_misused() {
    let _serial = serial();
    let mut s = null_mut();
    // SAFETY: valid or NULL pointers as each case says.
    unsafe {
        expect(mblob_inspect(null(), 0, &mut s), MBLOB_ERR_NULL_ARGUMENT, "path is NULL");
        expect(mblob_inspect(c"/nonexistent/x.so".as_ptr(), 0, &mut s), MBLOB_ERR_LOAD, "/nonexistent/x.so");
        expect(
            mblob_inspect(golden("graph_mlp.so").as_ptr(), 8, &mut s),
            MBLOB_ERR_INVALID_ARGUMENT,
            "unknown bits 0x8",
        );
        let junk = [0u8; 16];
        expect(mblob_inspect_memory(junk.as_ptr().cast(), 16, c"junk".as_ptr(), &mut s), MBLOB_ERR_LOAD, "junk");
        assert!(s.is_null());
        expect(mblob_string_free(c"not mine".as_ptr().cast_mut()), MBLOB_ERR_INVALID_HANDLE, "");
        ok(mblob_inspect(golden("graph_mlp.so").as_ptr(), MBLOB_INSPECT_LOAD, &mut s));
        let report: serde_json::Value = serde_json::from_str(CStr::from_ptr(s).to_str().unwrap()).unwrap();
        assert!(report["loaded"].is_object() || report["loaded"].is_array(), "{report}");
        ok(mblob_string_free(s));
        expect(mblob_string_free(s), MBLOB_ERR_INVALID_HANDLE, "freed already");
        ok(mblob_string_free(null_mut()));
    }
}

#[cfg(feature = "emit")]
#[test]
fn export_misused() {
    let _serial = serial();
    let mut e = null_mut();
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/other_versions/tvm-0.27.0.post1");
    let work = std::env::temp_dir().join(format!("mblob-capi-export-bad-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let out = CString::new(work.join("x.so").to_str().unwrap()).unwrap();
    // SAFETY: valid or NULL pointers as each case says.
    unsafe {
        expect(mblob_export_new(null_mut()), MBLOB_ERR_NULL_ARGUMENT, "out is NULL");
        expect(mblob_export_write(null_mut(), out.as_ptr()), MBLOB_ERR_NULL_ARGUMENT, "export is NULL");
        ok(mblob_export_new(&mut e));
        let mut id = usize::MAX;
        expect(
            mblob_export_set_layout(e, c"classic-0.30".as_ptr()),
            MBLOB_ERR_INVALID_ARGUMENT,
            "classic, classic-0.21, ffi",
        );
        expect(mblob_export_set_backend(e, c"gcc".as_ptr()), MBLOB_ERR_INVALID_ARGUMENT, "unknown backend `gcc`");
        expect(
            mblob_export_add_payload(e, c"".as_ptr(), null(), 0, &mut id),
            MBLOB_ERR_INVALID_ARGUMENT,
            "type_key is empty",
        );
        expect(mblob_export_add_payload(e, c"k".as_ptr(), null(), 3, &mut id), MBLOB_ERR_NULL_ARGUMENT, "data is NULL");
        let missing = c"/nonexistent/payload.bin";
        expect(
            mblob_export_add_payload_file(e, c"k".as_ptr(), missing.as_ptr(), &mut id),
            MBLOB_ERR_LOAD,
            "/nonexistent/payload.bin",
        );
        expect(
            mblob_export_import(e, 0, 7),
            MBLOB_ERR_INVALID_ARGUMENT,
            "child is module 7, but the export has 1 modules",
        );
        expect(mblob_export_set_root(e, 1), MBLOB_ERR_INVALID_ARGUMENT, "id is module 1");
        assert_eq!(id, usize::MAX, "out written on an error");
        // A host object that is not there: refused, and nothing is left at the path.
        let mut e2 = null_mut();
        ok(mblob_export_new(&mut e2));
        ok(mblob_export_add_object(e2, c"/nonexistent/lib0.o".as_ptr()));
        expect(mblob_export_write(e2, out.as_ptr()), MBLOB_ERR_EMIT, "/nonexistent/lib0.o");
        assert!(!work.join("x.so").exists());
        ok(mblob_export_free(e2));
        // A host object TVM 0.27 built (tvm-ffi's convention) in the classic layout: refused.
        let object = CString::new(dir.join("relax_add_mul.lib0.o").to_str().unwrap()).unwrap();
        ok(mblob_export_add_object(e, object.as_ptr()));
        let bytes = std::fs::read(dir.join("relax_add_mul.relax.VMExecutable.bin")).unwrap();
        ok(mblob_export_add_payload(e, c"relax.VMExecutable".as_ptr(), bytes.as_ptr().cast(), bytes.len(), &mut id));
        ok(mblob_export_import(e, id, 0));
        ok(mblob_export_set_root(e, id));
        expect(mblob_export_write(e, out.as_ptr()), MBLOB_ERR_EMIT, "x.so");
        assert!(!work.join("x.so").exists());
        // A cycle in the import tree: refused.
        ok(mblob_export_set_layout(e, c"ffi".as_ptr()));
        ok(mblob_export_import(e, 0, id));
        expect(mblob_export_write(e, out.as_ptr()), MBLOB_ERR_EMIT, "x.so");
        assert!(!work.join("x.so").exists());
        ok(mblob_export_free(e));
        expect(mblob_export_free(e), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_export");
        expect(mblob_export_add_object(e, object.as_ptr()), MBLOB_ERR_INVALID_HANDLE, "not a live mblob_export");
    }
    std::fs::remove_dir_all(&work).ok();
}

/// One model handle hammered by 8 threads at once (set input, run, output): each call either
/// does its work (the output is TVM's) or fails at once with `MBLOB_ERR_STATE` because another
/// thread's call is using the model; never a crash or a wrong output. (Before, the model was
/// used by two calls at once: heap corruption.)
#[test]
fn one_model_hammered_by_threads_is_refused_not_corrupted() {
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
    let lib = load("graph_mlp.so");
    struct Shared(*mut mblob_model);
    // SAFETY: the point of the test: the API must refuse, not corrupt, concurrent use.
    unsafe impl Send for Shared {}
    unsafe impl Sync for Shared {}
    let m = Shared(model(lib));
    let (ok, busy) = (std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0));
    let count = |s: mblob_status| {
        use std::sync::atomic::Ordering::Relaxed;
        match s {
            MBLOB_OK => ok.fetch_add(1, Relaxed),
            MBLOB_ERR_STATE => busy.fetch_add(1, Relaxed),
            other => panic!("{other:?}: {}", last_error()),
        };
        s
    };
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let m = &m;
                let (mut data, mut n) = (null(), 0usize);
                // SAFETY: the handle is live for the whole scope; buffers of the sizes passed.
                unsafe {
                    for _ in 0..200 {
                        count(set(m.0, None, &x, 32, &[2, 64]));
                        count(mblob_model_run(m.0));
                        let mut t = null_mut();
                        if count(mblob_model_output(m.0, 0, &mut t)) == MBLOB_OK {
                            assert_eq!(mblob_tensor_data(t, &mut data), MBLOB_OK);
                            assert_eq!(mblob_tensor_nbytes(t, &mut n), MBLOB_OK);
                            assert!(std::slice::from_raw_parts(data.cast::<u8>(), n) == &want[..], "not TVM's output");
                            assert_eq!(mblob_tensor_free(t), MBLOB_OK);
                        }
                    }
                }
            });
        }
    });
    let (ok, busy) = (ok.into_inner(), busy.into_inner());
    // How many calls get through depends on the scheduler (on a loaded 2-core machine most are
    // refused): what matters is that each call either did its work, with TVM's output, or was
    // refused, and that both happened.
    assert!(ok > 0, "no call did its work");
    assert!(busy > 0, "no call was refused: the threads never met");
    // SAFETY: every thread is done with them.
    unsafe {
        assert_eq!(mblob_model_free(m.0), MBLOB_OK);
        assert_eq!(mblob_library_free(lib), MBLOB_OK);
    }
}
