//! Helpers shared by the C API's tests: the last error, `.npy` files (TVM's inputs and
//! outputs) and host DLTensors over them.

#![allow(dead_code)]

use std::ffi::CStr;
use std::path::Path;
use std::ptr::null_mut;

use mblob_capi::mblob_status::*;
use mblob_capi::*;

/// The message of the last call on this thread (lossy UTF-8).
pub fn last_error() -> String {
    // SAFETY: never NULL; valid until the next call on this thread.
    unsafe { CStr::from_ptr(mblob_last_error()) }.to_string_lossy().into_owned()
}

/// Asserts `status` is `MBLOB_OK`, naming the call `what` and the message otherwise.
pub fn ok(status: mblob_status, what: &str) {
    assert_eq!(status, MBLOB_OK, "{what}: {}", last_error());
}

/// A `.npy` file: dtype as DLPack's (code, bits), shape, little-endian bytes.
pub struct Npy {
    pub code: u8,
    pub bits: u8,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

/// A little-endian (or byte-order-free) `.npy` file numpy wrote.
pub fn npy(path: &Path) -> Npy {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = npyz::NpyFile::new(&bytes[..]).unwrap();
    let descr = file.dtype().descr();
    let (code, bits) = match descr.trim_matches('\'') {
        "<f4" => (2, 32),
        "<f8" => (2, 64),
        "<i4" => (0, 32),
        "<i8" => (0, 64),
        "|i1" => (0, 8),
        "|u1" => (1, 8),
        d => panic!("{}: dtype {d}", path.display()),
    };
    let shape: Vec<i64> = file.shape().iter().map(|&d| d as i64).collect();
    let n = shape.iter().product::<i64>() as usize * (bits as usize / 8);
    Npy { code, bits, shape, data: bytes[bytes.len() - n..].to_vec() }
}

/// DLPack's float32.
pub const F32: mblob_dtype = mblob_dtype { code: 2, bits: 32, lanes: 1 };

/// A borrowed DLTensor on the host over `data`, of `dtype` and `shape`.
pub fn host_dl(data: &mut [u8], shape: &mut [i64], dtype: mblob_dtype) -> mblob_dl_tensor {
    mblob_dl_tensor {
        data: data.as_mut_ptr().cast(),
        device: mblob_dl_device { device_type: 1, device_id: 0 },
        ndim: shape.len() as i32,
        dtype,
        shape: shape.as_mut_ptr(),
        strides: null_mut(),
        byte_offset: 0,
    }
}

/// A borrowed DLTensor on the host over `n`'s bytes (the shape is `n`'s).
pub fn dl(n: &mut Npy) -> mblob_dl_tensor {
    let dtype = mblob_dtype { code: n.code, bits: n.bits, lanes: 1 };
    host_dl(&mut n.data, &mut n.shape, dtype)
}
