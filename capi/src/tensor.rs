//! Tensors the caller owns: their shape, dtype, bytes and device, copying one to the host,
//! and handing one out as DLPack (`mblob_tensor_to_dlpack`, `mblob_tensor_dltensor`).

use std::ffi::c_void;

use mblob_runtime::{Device, NdArray};

use crate::call::{call, handle_get};
use crate::dlpack::{export, mblob_dl_device, mblob_dl_managed_tensor, mblob_dl_tensor, mblob_dtype, view};
use crate::handle::{checked, publish, release, Kind};
use crate::status::{device_failure, mblob_status, Failure, Result};

/// A tensor owned by the caller, on the host (`mblob_model_output`, `mblob_tensor_to_host`)
/// or on a model's device (`mblob_model_output_device`); freed with `mblob_tensor_free`.
/// A tensor keeps its memory alive by itself: it outlives its model.
pub struct mblob_tensor {
    pub(crate) array: NdArray,
}

/// Frees a tensor; NULL does nothing. Memory it shares with other tensors or with DLPack
/// tensors handed out (`mblob_tensor_to_dlpack`) lives on with them.
///
/// # Safety
/// No other call on `tensor` is in progress, and `tensor` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_free(tensor: *mut mblob_tensor) -> mblob_status {
    call(|| release(Kind::Tensor, tensor, "tensor"))
}

/// Runs `f` on a checked tensor handle and writes what it gives to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one `R`.
pub(crate) unsafe fn tensor_get<R>(
    tensor: *const mblob_tensor,
    out: *mut R,
    f: impl FnOnce(&mblob_tensor) -> Result<R>,
) -> mblob_status {
    // SAFETY: the caller's contract is `handle_get`'s.
    unsafe { handle_get(Kind::Tensor, tensor, "tensor", out, f) }
}

/// Writes the tensor's rank to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_ndim(tensor: *const mblob_tensor, out: *mut i32) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(t.array.shape().len() as i32)) }
}

/// Writes a pointer to the tensor's `ndim` extents to `*out` (owned by the tensor, valid until
/// it is freed; may be any non-NULL pointer for a 0-D tensor).
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_shape(tensor: *const mblob_tensor, out: *mut *const i64) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(t.array.shape().as_ptr())) }
}

/// Writes the tensor's dtype to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_dtype(tensor: *const mblob_tensor, out: *mut mblob_dtype) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe {
        tensor_get(tensor, out, |t| {
            let d = t.array.dtype();
            Ok(mblob_dtype { code: d.code, bits: d.bits, lanes: d.lanes })
        })
    }
}

/// Writes a pointer to the tensor's bytes (dense, C order, little-endian) to `*out`; owned by
/// the tensor, valid until it is freed (may be any non-NULL pointer when it has no bytes).
/// A tensor on a device has no host bytes: `MBLOB_ERR_STATE` (copy it with
/// `mblob_tensor_to_host`, or take its device pointer with `mblob_tensor_to_dlpack`).
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_data(tensor: *const mblob_tensor, out: *mut *const c_void) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe {
        tensor_get(tensor, out, |t| {
            if !t.array.device().is_cpu() {
                return Err(Failure::new(
                    mblob_status::MBLOB_ERR_STATE,
                    format!(
                        "the tensor is on {}, not on the host: copy it with mblob_tensor_to_host",
                        t.array.device()
                    ),
                ));
            }
            Ok(t.array.dl_tensor().data.cast_const())
        })
    }
}

/// Writes the number of bytes of the tensor's data to `*out`.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_nbytes(tensor: *const mblob_tensor, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(t.array.nbytes())) }
}

/// Writes the device the tensor's memory is on to `*out` (DLPack's codes: `kDLCPU` 1 for
/// the host).
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_device(tensor: *const mblob_tensor, out: *mut mblob_dl_device) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe {
        tensor_get(tensor, out, |t| {
            let (device_type, device_id) = t.array.device().to_dlpack();
            Ok(mblob_dl_device { device_type, device_id })
        })
    }
}

/// Copies a tensor to the host: writes a new host tensor, which the caller owns, to `*out`
/// (a copy also when `tensor` is on the host already). Waits for the device's work on it.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_to_host(
    tensor: *const mblob_tensor,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the tensor at a time per the API, as `checked` needs.
        let t = unsafe { checked(Kind::Tensor, tensor, "tensor", out) }?;
        let array = t.array.copy(Device::cpu(0)).map_err(device_failure)?;
        publish(Kind::Tensor, mblob_tensor { array }, out);
        Ok(())
    })
}

/// Hands a tensor out as a new DLPack `DLManagedTensor`, written to `*out`: it shares the
/// tensor's memory (no copy, on the tensor's device) and keeps it alive by itself, so the
/// tensor may be freed first. The caller owns it and calls `(*out)->deleter(*out)` once when
/// done (from any thread). The data is compact, row-major, `strides` NULL, `byte_offset` 0.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_to_dlpack(
    tensor: *const mblob_tensor,
    out: *mut *mut mblob_dl_managed_tensor,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the tensor at a time per the API, as `checked` needs.
        let t = unsafe { checked(Kind::Tensor, tensor, "tensor", out) }?;
        let raw = export(t.array.clone());
        // SAFETY: not NULL (checked), writable per the API.
        unsafe { out.write(raw) };
        Ok(())
    })
}

/// Writes a DLPack `DLTensor` that views the tensor to `*out`, with no copy and no ownership:
/// its data and shape belong to the tensor and are valid until it is freed. To pass an
/// output back in to `mblob_model_invoke` (on the device, uncopied), or to read a device
/// output's address.
///
/// # Safety
/// `tensor` is NULL or a handle; `out` is NULL or points to a writable `mblob_dl_tensor`.
#[no_mangle]
pub unsafe extern "C" fn mblob_tensor_dltensor(tensor: *const mblob_tensor, out: *mut mblob_dl_tensor) -> mblob_status {
    // SAFETY: the caller's contract is `tensor_get`'s.
    unsafe { tensor_get(tensor, out, |t| Ok(view(&t.array))) }
}
