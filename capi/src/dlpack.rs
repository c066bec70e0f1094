//! DLPack tensors both ways: model inputs from a caller's `DLTensor` or `DLManagedTensor`
//! (without a copy where the runtime can use the caller's memory), outputs handed out as
//! `DLManagedTensor`s with a deleter, and Relax functions invoked by name on tensors of any
//! device with their outputs left on the model's device.
//!
//! The structs are declared under mblob's names, so that `mblob.h` can be included next to
//! `dlpack.h`; each has the layout of DLPack's struct of the same role (unversioned DLPack,
//! 0.6 to 1.x's `DLManagedTensor`): a `DLTensor *` converts to a `const mblob_dl_tensor *`
//! with a cast.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use mblob_runtime::array::tensor_bytes;
use mblob_runtime::device::{device_api, DevicePtr, Storage};
use mblob_runtime::exec::relax::VmError;
use mblob_runtime::exec::{ExecError, ModelKind, Value};
use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};

use crate::{
    c_str, call, check, checked, device_failure, input_name, mblob_dtype, mblob_library, mblob_model, mblob_status,
    mblob_tensor, model_mut, not_null, tensor_get, Failure, Kind, Result, RunOutputs,
};

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

fn invalid(message: String) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, message)
}

/// A caller's DLPack tensor, checked.
struct Described {
    device: Device,
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
unsafe fn describe(t: *const mblob_dl_tensor, what: &str) -> Result<Described> {
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
fn is_aligned(d: &Described) -> bool {
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
unsafe fn borrow(d: &Described, owner: Option<Box<dyn Send + Sync>>) -> Result<NdArray> {
    let api = device_api(d.device).map_err(device_failure)?;
    // SAFETY: the caller's contract, passed on.
    let storage = unsafe { Storage::borrowed(api, DevicePtr::from_ptr(d.data), d.byte_offset + d.nbytes, owner) };
    NdArray::in_storage(&storage, d.byte_offset, &d.shape, d.dtype).map_err(device_failure)
}

/// Sets an input from a DLPack tensor, copied in: by `name` when it is not NULL, else by
/// position `index`, as `mblob_model_set_input` does. The tensor may be on any device mblob
/// opens: a graph or AOT model copies it into its input at once (within the device when it is
/// the model's, with no stop on the host); a VM model keeps a copy on the tensor's device
/// until it runs. It is only read during the call.
///
/// # Safety
/// `model` is NULL or a handle; `name` is NULL or a NUL-terminated string; `tensor` is NULL or
/// a readable `DLTensor` whose shape (and strides) hold `ndim` values and whose `data` holds
/// the bytes its shape and dtype take, on its device, during the call.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_set_input_dltensor(
    model: *mut mblob_model,
    name: *const c_char,
    index: usize,
    tensor: *const mblob_dl_tensor,
) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        // SAFETY: the caller passes NULL or a valid DLTensor.
        let d = unsafe { describe(tensor, "tensor") }?;
        // SAFETY: the memory stays valid during the call; the array is dropped in it (a graph
        // or AOT model copies it into its input, a VM model gets a copy of its own).
        let borrowed = unsafe { borrow(&d, None) }?;
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        // SAFETY: `name` is NULL or a NUL-terminated string, per the API.
        let name = unsafe { input_name(m, name, index) }?;
        let array = match m.model.kind() {
            ModelKind::Graph | ModelKind::Aot => borrowed,
            ModelKind::Relax | ModelKind::RelayVm => borrowed.copy(d.device).map_err(device_failure)?,
        };
        m.model.set_input(Some(&name), Value::Tensor(array))?;
        Ok(())
    })
}

/// A `DLManagedTensor` mblob took over: its deleter runs when this is dropped.
struct Managed(*mut mblob_dl_managed_tensor);

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

/// Sets an input from a DLPack managed tensor, whose ownership passes to mblob in every case
/// (also on an error, and with a NULL or invalid model): mblob calls `tensor->deleter` once,
/// when it no longer needs the memory (from the thread that then drops it: the next
/// `mblob_model_set_input*` of that input, `mblob_model_select_function`, `mblob_model_free`,
/// or before returning). By `name` when it is not NULL, else by position `index`. A graph or
/// AOT model copies it into its input at once (within the device when it is the model's); a VM
/// model uses it where it lies, with no copy, until then (one misaligned for TVM's kernels is
/// copied on its device).
///
/// # Safety
/// `model` is NULL or a handle; `name` is NULL or a NUL-terminated string; `tensor` is NULL or
/// a `DLManagedTensor` as DLPack defines it, valid until its deleter runs, its data not
/// written by anyone meanwhile.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_set_input_dlpack(
    model: *mut mblob_model,
    name: *const c_char,
    index: usize,
    tensor: *mut mblob_dl_managed_tensor,
) -> mblob_status {
    call(|| {
        not_null(tensor, "tensor")?;
        // Taken over first, so that every way out runs the deleter.
        let managed = Managed(tensor);
        check(Kind::Model, model, "model")?;
        // SAFETY: the caller passes a valid managed tensor; its `dl_tensor` is its first field.
        let d = unsafe { describe(&raw const (*tensor).dl_tensor, "tensor") }?;
        // SAFETY: the producer keeps the memory valid until the deleter, which `managed` runs
        // when the last array over it is dropped.
        let borrowed = unsafe { borrow(&d, Some(Box::new(managed))) }?;
        let array = if is_aligned(&d) { borrowed } else { borrowed.copy(d.device).map_err(device_failure)? };
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        // SAFETY: `name` is NULL or a NUL-terminated string, per the API.
        let name = unsafe { input_name(m, name, index) }?;
        m.model.set_input(Some(&name), Value::Tensor(array))?;
        Ok(())
    })
}

/// Calls the Relax function `function` (NULL: the selected one, `main` by default) of a
/// Relax model on `num_inputs` DLPack tensors `inputs[0..num_inputs]`, its parameters in
/// order, and keeps its outputs on the model's device, uncopied: `mblob_model_num_outputs`
/// counts them, `mblob_model_output_device` hands them out where they lie and
/// `mblob_model_output` copies them to the host. The inputs set with `mblob_model_set_input*`
/// are not used and stay set. An input on the model's device whose data is aligned to 64 bytes
/// (as TVM allocates) is used where it lies, with no copy (read during the call only: an
/// output that would share its memory is copied); one on another device, or misaligned, is
/// copied. A graph, AOT or Relay VM model: `MBLOB_ERR_UNSUPPORTED` (use
/// `mblob_model_run`).
///
/// # Safety
/// `model` is NULL or a handle; `function` is NULL or a NUL-terminated string; `inputs` is
/// NULL (with `num_inputs` 0) or points to `num_inputs` pointers to readable `DLTensor`s whose
/// memory stays valid, and is not written by anyone else, during the call.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_invoke(
    model: *mut mblob_model,
    function: *const c_char,
    inputs: *const *const mblob_dl_tensor,
    num_inputs: usize,
) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        let function = if function.is_null() {
            None
        } else {
            // SAFETY: not NULL, and the caller passes a NUL-terminated string.
            Some(unsafe { c_str(function, "function") }?)
        };
        let pointers: &[*const mblob_dl_tensor] = if num_inputs == 0 {
            &[]
        } else {
            not_null(inputs, "inputs")?;
            // SAFETY: not NULL, and the caller passes `num_inputs` readable pointers.
            unsafe { std::slice::from_raw_parts(inputs, num_inputs) }
        };
        let described = pointers
            .iter()
            .enumerate()
            // SAFETY: each is NULL or a readable DLTensor, per the API.
            .map(|(i, &t)| unsafe { describe(t, &format!("inputs[{i}]")) })
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        let kind = m.model.kind();
        if kind != ModelKind::Relax {
            return Err(Failure::new(
                mblob_status::MBLOB_ERR_UNSUPPORTED,
                format!("mblob_model_invoke calls Relax functions; this is a {kind:?} model: use mblob_model_run"),
            ));
        }
        let name = match function {
            Some(f) => f.to_owned(),
            None => m.model.function().map(str::to_owned).ok_or_else(|| {
                Failure::new(mblob_status::MBLOB_ERR_NO_MODEL, "no function selected: name one, or select one first")
            })?,
        };
        // Each borrowed array holds a clone of `token`: after the call, more than one left
        // means an output still points into a caller's memory.
        let token = Arc::new(());
        let arrays = described
            .iter()
            .map(|d| {
                let owner: Box<dyn Send + Sync> = Box::new(token.clone());
                // SAFETY: the caller keeps the memory valid during the call; outputs that
                // still hold it after the call are copied below, and the VM drops its
                // registers' references to inputs when the call returns.
                let array = unsafe { borrow(d, Some(owner)) }?;
                // TVM's kernels assume their tensors' data aligned to 64 bytes (TVM refuses a
                // DLPack tensor that is not): a misaligned one is copied into memory of its own.
                if is_aligned(d) {
                    Ok(Value::Tensor(array))
                } else {
                    Ok(Value::Tensor(array.copy(d.device).map_err(device_failure)?))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        m.outputs = None;
        let run = m.model.call_function(&name, arrays);
        let result = run.map_err(|e| {
            let status = match &e {
                ExecError::Relax(v) if matches!(v.root(), VmError::UnknownFunction { .. }) => {
                    mblob_status::MBLOB_ERR_NO_MODEL
                }
                _ => mblob_status::MBLOB_ERR_RUN,
            };
            Failure::new(status, e.to_string())
        })?;
        let mut outputs: Vec<NdArray> = Vec::new();
        for (i, leaf) in result.flatten().into_iter().enumerate() {
            match leaf {
                Value::Tensor(a) => outputs.push(a.clone()),
                v => {
                    return Err(Failure::new(
                        mblob_status::MBLOB_ERR_RUN,
                        format!("`{name}` returned a {} (output {i}), not a tensor", v.kind()),
                    ))
                }
            }
        }
        if Arc::strong_count(&token) > 1 {
            // An output shares a caller's memory (a function returning its input, or a view of
            // it): give every output memory of its own.
            outputs = outputs.iter().map(|a| a.copy(a.device())).collect::<Result<_, _>>().map_err(device_failure)?;
        }
        m.outputs = Some(RunOutputs { values: outputs.into_iter().map(Value::Tensor).collect(), shared: false });
        Ok(())
    })
}

/// Calls host function `name` of a library (found from its root, through its imports; what
/// TVM's `tvm.build` makes, such as `add_one`) with `num_args` DLPack tensors
/// `args[0..num_args]`, the function's arguments in order, and writes what it returns to `*ret`
/// when `ret` is not NULL (an integer; 0 when it returns none). A compiled function writes its
/// outputs into its argument tensors: they are passed where they lie, on their devices, with
/// no copy (one whose data is not aligned to 64 bytes, as TVM's kernels assume, goes through
/// an aligned copy, written back after the call), and the devices are waited for before the
/// call returns. No function of that name: `MBLOB_ERR_NO_MODEL`; the function's own error:
/// `MBLOB_ERR_RUN`, with its message.
///
/// # Safety
/// `lib` is NULL or a handle; `name` is NULL or a NUL-terminated string; `args` is NULL (with
/// `num_args` 0) or points to `num_args` pointers to `DLTensor`s whose memory is valid for
/// reading and writing, and used by no one else, during the call; `ret` is NULL or points to
/// writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_library_call(
    lib: *const mblob_library,
    name: *const c_char,
    args: *const *const mblob_dl_tensor,
    num_args: usize,
    ret: *mut i64,
) -> mblob_status {
    call(|| {
        check(Kind::Library, lib, "lib")?;
        // SAFETY: checked above; a library is never changed, and the API forbids freeing it
        // during a call on it.
        let lib = unsafe { &*lib };
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let name = unsafe { c_str(name, "name") }?;
        let pointers: &[*const mblob_dl_tensor] = if num_args == 0 {
            &[]
        } else {
            not_null(args, "args")?;
            // SAFETY: not NULL, and the caller passes `num_args` readable pointers.
            unsafe { std::slice::from_raw_parts(args, num_args) }
        };
        let described = pointers
            .iter()
            .enumerate()
            // SAFETY: each is NULL or a readable DLTensor, per the API.
            .map(|(i, &t)| unsafe { describe(t, &format!("args[{i}]")) })
            .collect::<Result<Vec<_>>>()?;
        let mut borrowed = Vec::with_capacity(described.len());
        let mut values = Vec::with_capacity(described.len());
        for d in &described {
            // SAFETY: the caller keeps the memory valid during the call; the arrays are
            // dropped in it.
            let array = unsafe { borrow(d, None) }?;
            let aligned = is_aligned(d);
            values.push(Value::Tensor(if aligned {
                array.clone()
            } else {
                array.copy(d.device).map_err(device_failure)?
            }));
            borrowed.push((array, aligned));
        }
        let result = mblob_runtime::exec::call(&lib.tree, name, &mut values)?;
        for ((array, aligned), v) in borrowed.iter().zip(&values) {
            if let (false, Value::Tensor(copy)) = (aligned, v) {
                copy.copy_to(array).map_err(device_failure)?;
            }
        }
        if !ret.is_null() {
            let n = match result {
                Value::Int(i) => i,
                _ => 0,
            };
            // SAFETY: not NULL, and the caller passes writable storage.
            unsafe { ret.write(n) };
        }
        Ok(())
    })
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
        // SAFETY: `tensor` was made by `mblob_tensor_to_dlpack` as the first field of a boxed
        // `Exported` (so the addresses agree), and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(tensor.cast::<Exported>()) });
    });
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
        let array = t.array.clone();
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
        // SAFETY: not NULL, writable per the API.
        unsafe { out.write(raw.cast()) };
        Ok(())
    })
}

/// A DLPack view of `array`: its data, device, dtype and shape.
fn view(array: &NdArray) -> mblob_dl_tensor {
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
