//! DLPack tensors both ways: model inputs from a caller's `DLTensor` or `DLManagedTensor`
//! (without a copy where the runtime can use the caller's memory), outputs handed out as
//! `DLManagedTensor`s with a deleter, and Relax functions invoked by name on tensors of any
//! device with their outputs left on the model's device.
//!
//! The structs are declared under mblob's names, so that `mblob.h` can be included next to
//! `dlpack.h`; each has the layout of DLPack's struct of the same role (unversioned DLPack,
//! 0.6 to 1.x's `DLManagedTensor`): a `DLTensor *` converts to a `const mblob_dl_tensor *`
//! with a cast.

use std::ffi::c_void;

use mblob_runtime::array::tensor_bytes;
use mblob_runtime::device::{device_api, DevicePtr, Storage};
use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};

use crate::status::{device_failure, mblob_status, not_null, Failure, Result};

/// A tensor's element type, laid out as DLPack's `DLDataType`: type code (0 int, 1 uint,
/// 2 float, 4 bfloat, 6 bool), bits per lane, lanes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct mblob_dtype {
    /// DLPack type code.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// DLPack's `DLDevice`: a device type (`kDLCPU` 1, `kDLCUDA` 2, `kDLCUDAHost` 3,
/// `kDLOpenCL` 4) and an ordinal.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct mblob_dl_device {
    /// DLPack's device type code.
    pub device_type: i32,
    /// The device's ordinal.
    pub device_id: i32,
}

/// DLPack's `DLTensor`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mblob_dl_tensor {
    /// The memory: a host address for the CPU, a device address for CUDA, a buffer of
    /// mblob's own OpenCL context for OpenCL (one a tensor mblob handed out holds).
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: mblob_dl_device,
    /// Number of dimensions (0 to 64).
    pub ndim: i32,
    /// Element type (DLPack's `DLDataType`).
    pub dtype: mblob_dtype,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// NULL for a compact row-major tensor, or `ndim` strides in elements, which must then be
    /// those of a compact row-major tensor (mblob takes no other strides).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// DLPack's `DLManagedTensor`: a tensor and who frees it. Whoever holds one calls
/// `deleter(self)` once, when done with it (from any thread).
#[repr(C)]
#[derive(Debug)]
pub struct mblob_dl_managed_tensor {
    /// The tensor.
    pub dl_tensor: mblob_dl_tensor,
    /// The producer's context (for mblob's tensors, what keeps the memory alive).
    pub manager_ctx: *mut c_void,
    /// Frees the tensor (NULL: nothing to free).
    pub deleter: Option<unsafe extern "C" fn(*mut mblob_dl_managed_tensor)>,
}

/// The most dimensions a DLPack tensor given to mblob may have.
const MAX_NDIM: i32 = 64;

pub(crate) fn invalid(message: String) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, message)
}

/// A caller's DLPack tensor, checked.
pub(crate) struct Described {
    pub(crate) device: Device,
    dtype: DataType,
    shape: Vec<i64>,
    data: *mut c_void,
    byte_offset: usize,
    nbytes: usize,
}

/// Reads and checks `t`: the rank, shape, dtype and strides (compact only), and a `data` that
/// is not NULL when there are bytes.
///
/// # Safety
/// `t` is NULL or points to a readable `mblob_dl_tensor` whose `shape` and `strides` (when
/// not NULL) point to `ndim` readable `int64_t` each.
pub(crate) unsafe fn describe(t: *const mblob_dl_tensor, what: &str) -> Result<Described> {
    not_null(t, what)?;
    // SAFETY: not NULL, and the caller passes a readable tensor.
    let t = unsafe { &*t };
    if !(0..=MAX_NDIM).contains(&t.ndim) {
        return Err(invalid(format!("{what}: ndim is {}, not 0 to {MAX_NDIM}", t.ndim)));
    }
    let ndim = t.ndim as usize;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        not_null(t.shape, &format!("{what}'s shape"))?;
        // SAFETY: not NULL, and the caller passes `ndim` readable extents.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(invalid(format!("{what}: shape {shape:?} has a negative extent {d}")));
    }
    let d = t.dtype;
    if d.bits == 0 || d.lanes == 0 {
        return Err(invalid(format!(
            "{what}: dtype (code {}, bits {}, lanes {}) has no bits or no lanes",
            d.code, d.bits, d.lanes
        )));
    }
    let dtype = DataType { code: d.code, bits: d.bits, lanes: d.lanes };
    let nbytes = tensor_bytes(dtype, &shape)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid(format!("{what}: a {dtype} tensor of shape {shape:?} overflows")))?;
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: not NULL, and the caller passes `ndim` readable strides.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expected = 1i64;
        for k in (0..ndim).rev() {
            // A stride of an extent-1 dimension never moves: any value is compact.
            if shape[k] != 1 && strides[k] != expected {
                return Err(invalid(format!(
                    "{what}: strides {strides:?} are not those of a compact row-major tensor of shape {shape:?}: \
                     mblob takes compact tensors only"
                )));
            }
            expected = expected.saturating_mul(shape[k]);
        }
    }
    if t.data.is_null() && nbytes > 0 {
        return Err(invalid(format!("{what}: data is NULL for {nbytes} bytes")));
    }
    let byte_offset = usize::try_from(t.byte_offset)
        .ok()
        .filter(|o| o.checked_add(nbytes).is_some())
        .ok_or_else(|| invalid(format!("{what}: byte_offset {} is out of range", t.byte_offset)))?;
    // `kDLCUDAHost` memory is host memory.
    let device = match t.device.device_type {
        1 | 3 => Device::cpu(0),
        code => Device::from_dlpack(code, t.device.device_id),
    };
    Ok(Described { device, dtype, shape, data: t.data, byte_offset, nbytes })
}

/// TVM's alignment of tensor data (`kAllocAlignment`), which compiled kernels assume.
const ALIGNMENT: usize = 64;

/// Whether the first element of `d` is aligned as TVM's kernels assume: its address on the
/// CPU and CUDA, its offset into the buffer object on devices whose pointers are handles.
pub(crate) fn is_aligned(d: &Described) -> bool {
    use mblob_runtime::DeviceType;
    match d.device.device_type {
        DeviceType::Cpu | DeviceType::Cuda => (d.data as usize).wrapping_add(d.byte_offset) % ALIGNMENT == 0,
        _ => d.byte_offset % ALIGNMENT == 0,
    }
}

/// An `NdArray` over the caller's memory `d` describes, no byte copied; `owner` is dropped
/// when the last array made from it is.
///
/// # Safety
/// `d.data` is memory of `d.device` with `d.byte_offset + d.nbytes` bytes, valid until `owner`
/// is dropped (without an owner: as long as the array and anything made from it live).
pub(crate) unsafe fn borrow(d: &Described, owner: Option<Box<dyn Send + Sync>>) -> Result<NdArray> {
    let api = device_api(d.device).map_err(device_failure)?;
    // SAFETY: the caller's contract, passed on.
    let storage = unsafe { Storage::borrowed(api, DevicePtr::from_ptr(d.data), d.byte_offset + d.nbytes, owner) };
    NdArray::in_storage(&storage, d.byte_offset, &d.shape, d.dtype).map_err(device_failure)
}

/// A `DLManagedTensor` mblob took over: its deleter runs when this is dropped.
pub(crate) struct Managed(pub(crate) *mut mblob_dl_managed_tensor);

// SAFETY: the API tells callers that mblob may run the deleter from any thread (the thread that
// drops the last reference), and the tensor's memory is only read through this pointer.
unsafe impl Send for Managed {}

// SAFETY: as above; shared references only read the struct.
unsafe impl Sync for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: the pointer is a managed tensor whose ownership the caller handed over
        // (`mblob_model_set_input_dlpack`), and this is its one release.
        if let Some(deleter) = unsafe { (*self.0).deleter } {
            // SAFETY: DLPack's contract: the holder calls the deleter once, with the tensor.
            unsafe { deleter(self.0) }
        }
    }
}

/// What a `DLManagedTensor` mblob handed out owns; the managed tensor is its first field, so
/// the tensor's address is this box's.
#[repr(C)]
struct Exported {
    managed: mblob_dl_managed_tensor,
    array: NdArray,
    shape: Vec<i64>,
}

/// The deleter of the managed tensors mblob hands out.
unsafe extern "C" fn exported_deleter(tensor: *mut mblob_dl_managed_tensor) {
    // No panic may cross: dropping an array only releases memory, but be sure.
    let _ = std::panic::catch_unwind(|| {
        if tensor.is_null() {
            return;
        }
        // SAFETY: `tensor` was made by `export` as the first field of a boxed
        // `Exported` (so the addresses agree), and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(tensor.cast::<Exported>()) });
    });
}

/// A new `DLManagedTensor` that shares `array`'s memory and keeps it alive until its deleter
/// ([`exported_deleter`]) runs.
pub(crate) fn export(array: NdArray) -> *mut mblob_dl_managed_tensor {
    let mut exported = Box::new(Exported {
        managed: mblob_dl_managed_tensor {
            dl_tensor: view(&array),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(exported_deleter),
        },
        shape: array.shape().to_vec(),
        array,
    });
    // The shape the tensor points to is the box's own copy, which lives as long as it.
    exported.managed.dl_tensor.shape = exported.shape.as_mut_ptr();
    let raw = Box::into_raw(exported);
    // SAFETY: `raw` is the live box just made; only its own field is written.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    raw.cast()
}

/// A DLPack view of `array`: its data, device, dtype and shape.
pub(crate) fn view(array: &NdArray) -> mblob_dl_tensor {
    let t = array.dl_tensor();
    mblob_dl_tensor {
        data: t.data,
        device: mblob_dl_device { device_type: t.device.device_type, device_id: t.device.device_id },
        ndim: t.ndim,
        dtype: mblob_dtype { code: t.dtype.code, bits: t.dtype.bits, lanes: t.dtype.lanes },
        shape: t.shape,
        strides: std::ptr::null_mut(),
        byte_offset: t.byte_offset,
    }
}
