//! Models: made from a library on a device, their functions and inputs (from host buffers
//! or DLPack tensors), runs, `mblob_model_invoke`, and their outputs handed out as tensors.

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use mblob_runtime::exec::relax::VmError;
use mblob_runtime::exec::{ExecError, Model, ModelKind, Value};
use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};

use crate::args::c_str;
use crate::call::{call, handle_get};
use crate::dlpack::{borrow, describe, is_aligned, mblob_dl_managed_tensor, mblob_dl_tensor, Managed};
use crate::handle::{check, checked, publish, release, Kind};
use crate::library::mblob_library;
use crate::status::{device_failure, mblob_status, not_null, out_of_range, Failure, Result};
use crate::tensor::mblob_tensor;

/// What kind of model a library holds (`mblob_model_kind` tells).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum mblob_kind {
    /// A graph executor factory (`relay.build`): inputs by name, `mblob_model_run`.
    MBLOB_MODEL_GRAPH = 0,
    /// An AOT executor factory.
    MBLOB_MODEL_AOT = 1,
    /// A Relax executable (`relax.build`, `tvm.compile`): functions by name,
    /// `mblob_model_invoke` or `mblob_model_run`.
    MBLOB_MODEL_RELAX = 2,
    /// A Relay VM executable (`relay.vm.compile`): functions by name, `mblob_model_run`.
    MBLOB_MODEL_RELAY_VM = 3,
}

/// A model on a device (`mblob_model_new`): a graph executor, an AOT executor or a Relax VM
/// function. Used by one call at a time (a call while another thread's uses it gets
/// `MBLOB_ERR_STATE`); freed with `mblob_model_free`.
pub struct mblob_model {
    model: Model,
    /// The input names, as C strings (`mblob_model_input_name`).
    names: Vec<CString>,
    /// The functions a caller can pick, as C strings (`mblob_model_function_name`).
    functions: Vec<CString>,
    /// The outputs of the last successful run, `None` before one.
    outputs: Option<RunOutputs>,
}

/// The outputs of the last run, where they lie (on the model's device).
pub(crate) struct RunOutputs {
    values: Vec<Value>,
    /// Whether the tensors are the model's own (`mblob_model_run` of a graph or AOT model:
    /// the next run overwrites them), so that a tensor handed out must be a copy.
    shared: bool,
}

/// Makes a model of what `lib` holds (a graph factory, an AOT factory, a Relax executable or
/// a Relay VM executable) on the device `(device_type, device_id)`, with DLPack's codes
/// (`kDLCPU` = 1, `kDLCUDA` = 2, `kDLOpenCL` = 4), and writes its handle to `*out`.
/// Parameters are copied to the device here, once. A Relax model calls `main` (or its only
/// function) until `mblob_model_select_function` picks another.
///
/// # Safety
/// `lib` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_new(
    lib: *const mblob_library,
    device_type: i32,
    device_id: i32,
    out: *mut *mut mblob_model,
) -> mblob_status {
    call(|| {
        // SAFETY: the API forbids freeing `lib` while a call on it is in progress, as `checked`
        // needs (a library is never changed).
        let lib = unsafe { checked(Kind::Library, lib, "lib", out) }?;
        let model = Model::new(&lib.tree, Device::from_dlpack(device_type, device_id))?;
        let functions = model.functions().iter().map(|f| c_string(f)).collect();
        let mut handle = mblob_model { model, names: Vec::new(), functions, outputs: None };
        handle.refresh_names();
        publish(Kind::Model, handle, out);
        Ok(())
    })
}

impl mblob_model {
    fn refresh_names(&mut self) {
        self.names = self.model.params().iter().map(|p| c_string(&p.name)).collect();
    }
}

/// A C string of `s` (a NUL inside is spelled `\0`).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// Writes the kind of model (graph, AOT, Relax, Relay VM) to `*out`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_kind(model: *const mblob_model, out: *mut mblob_kind) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe {
        model_get(model, out, |m| {
            Ok(match m.model.kind() {
                ModelKind::Graph => mblob_kind::MBLOB_MODEL_GRAPH,
                ModelKind::Aot => mblob_kind::MBLOB_MODEL_AOT,
                ModelKind::Relax => mblob_kind::MBLOB_MODEL_RELAX,
                ModelKind::RelayVm => mblob_kind::MBLOB_MODEL_RELAY_VM,
            })
        })
    }
}

/// Writes the number of functions a Relax or Relay VM model can call (by
/// `mblob_model_select_function` or `mblob_model_invoke`) to `*out`: 0 for graph and AOT
/// models.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_num_functions(model: *const mblob_model, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe { model_get(model, out, |m| Ok(m.functions.len())) }
}

/// Writes a pointer to the name of function `index` to `*out`: a NUL-terminated string owned
/// by the model, valid until the model is freed.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_function_name(
    model: *const mblob_model,
    index: usize,
    out: *mut *const c_char,
) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe {
        model_get(model, out, |m| {
            let name = m.functions.get(index).ok_or_else(|| out_of_range("function", index, m.functions.len()))?;
            Ok(name.as_ptr())
        })
    }
}

/// Runs `f` on a checked model handle and writes what it gives to `*out`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one `R`.
pub(crate) unsafe fn model_get<R>(
    model: *const mblob_model,
    out: *mut R,
    f: impl FnOnce(&mblob_model) -> Result<R>,
) -> mblob_status {
    // SAFETY: the caller's contract is `handle_get`'s.
    unsafe { handle_get(Kind::Model, model, "model", out, f) }
}

/// Borrows the model behind a checked handle.
///
/// # Safety
/// `model` passed `check(Kind::Model, ..)` in this call, which took it for this call alone
/// ([`in_use`]) until the call ends.
pub(crate) unsafe fn model_mut<'a>(model: *mut mblob_model) -> &'a mut mblob_model {
    // SAFETY: see the function's contract.
    unsafe { &mut *model }
}

/// Frees a model; NULL does nothing.
///
/// # Safety
/// No other call on `model` is in progress, and `model` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_free(model: *mut mblob_model) -> mblob_status {
    call(|| release(Kind::Model, model, "model"))
}

/// Picks the function a Relax (or Relay VM) model runs; the inputs set so far are dropped.
/// A graph or AOT model has no functions: `MBLOB_ERR_NO_MODEL`.
///
/// # Safety
/// `model` is NULL or a handle; `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_select_function(model: *mut mblob_model, name: *const c_char) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        // SAFETY: the caller passes NULL or a NUL-terminated string that outlives the call.
        let name = unsafe { c_str(name, "name") }?;
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        m.model.select_function(name)?;
        m.outputs = None;
        m.refresh_names();
        Ok(())
    })
}

/// Writes the number of inputs of the model (of the selected function) to `*out`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_num_inputs(model: *const mblob_model, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe { model_get(model, out, |m| Ok(m.names.len())) }
}

/// Writes a pointer to the name of input `index` to `*out`: a NUL-terminated string owned by
/// the model, valid until the model is freed or `mblob_model_select_function` is called.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_input_name(
    model: *const mblob_model,
    index: usize,
    out: *mut *const c_char,
) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe {
        model_get(model, out, |m| {
            let name = m.names.get(index).ok_or_else(|| out_of_range("input", index, m.names.len()))?;
            Ok(name.as_ptr())
        })
    }
}

/// The input a `(name, index)` pair names: `name` when it is not NULL, else input `index`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub(crate) unsafe fn input_name(m: &mblob_model, name: *const c_char, index: usize) -> Result<String> {
    if name.is_null() {
        let n = m.names.get(index).ok_or_else(|| out_of_range("input", index, m.names.len()))?;
        Ok(n.to_string_lossy().into_owned())
    } else {
        // SAFETY: not NULL, and the caller passes a NUL-terminated string.
        Ok(unsafe { c_str(name, "name") }?.to_owned())
    }
}

/// Sets an input from a host buffer, copied in: by `name` when it is not NULL, else by
/// position `index`. `data` holds `nbytes` bytes of a dense, C-order, little-endian tensor of
/// the dtype `(dtype_code, dtype_bits, dtype_lanes)` and the shape `shape[0..ndim]`;
/// `nbytes` must be `ceil(dtype_bits / 8) * product(shape)`. A graph or AOT model checks the
/// dtype and shape against its input's here (`MBLOB_ERR_INPUT`); a Relax function checks them
/// when it runs.
///
/// # Safety
/// `model` is NULL or a handle; `name` is NULL or a NUL-terminated string; `data` is NULL or
/// points to `nbytes` readable bytes; `shape` is NULL or points to `ndim` readable `int64_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mblob_model_set_input(
    model: *mut mblob_model,
    name: *const c_char,
    index: usize,
    data: *const c_void,
    nbytes: usize,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    ndim: i32,
) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        let invalid = |m: String| Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, m);
        let ndim = usize::try_from(ndim).map_err(|_| invalid(format!("ndim is {ndim}, negative")))?;
        let shape: Vec<i64> = if ndim == 0 {
            Vec::new()
        } else {
            not_null(shape, "shape")?;
            // SAFETY: not NULL, and the caller passes `ndim` readable extents.
            unsafe { std::slice::from_raw_parts(shape, ndim) }.to_vec()
        };
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(invalid(format!("shape {shape:?} has a negative extent {d}")));
        }
        if dtype_bits == 0 || dtype_lanes == 0 {
            return Err(invalid(format!(
                "dtype (code {dtype_code}, bits {dtype_bits}, lanes {dtype_lanes}) has no bits or no lanes"
            )));
        }
        let dtype = DataType { code: dtype_code, bits: dtype_bits, lanes: dtype_lanes };
        let expected = mblob_runtime::array::tensor_bytes(dtype, &shape)
            .ok_or_else(|| invalid(format!("shape {shape:?} of {dtype} overflows")))?;
        if expected != nbytes as u64 {
            return Err(invalid(format!(
                "nbytes is {nbytes}, but a {dtype} tensor of shape {shape:?} takes {expected} bytes"
            )));
        }
        let bytes: &[u8] = if nbytes == 0 {
            &[]
        } else {
            not_null(data, "data")?;
            // SAFETY: not NULL, and the caller passes `nbytes` readable bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), nbytes) }
        };
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        // SAFETY: `name` is NULL or a NUL-terminated string, per the API.
        let name = unsafe { input_name(m, name, index) }?;
        let array = NdArray::from_bytes(bytes, &shape, dtype, Device::cpu(0)).map_err(|e| invalid(e.to_string()))?;
        m.model.set_input(Some(&name), Value::Tensor(array))?;
        Ok(())
    })
}

/// Runs the model (the selected function of a Relax model) once; every input must be set
/// (`MBLOB_ERR_INPUT` names those that are not). Outputs of an earlier run are dropped. The
/// outputs stay on the model's device: `mblob_model_output` copies one to the host,
/// `mblob_model_output_device` hands it out there.
///
/// # Safety
/// `model` is NULL or a handle.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_run(model: *mut mblob_model) -> mblob_status {
    call(|| {
        check(Kind::Model, model, "model")?;
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let m = unsafe { model_mut(model) };
        m.outputs = None;
        m.model.run()?;
        let shared = matches!(m.model.kind(), ModelKind::Graph | ModelKind::Aot);
        m.outputs = Some(RunOutputs { values: m.model.outputs()?, shared });
        Ok(())
    })
}

pub(crate) fn outputs(m: &mblob_model) -> Result<&RunOutputs> {
    m.outputs.as_ref().ok_or_else(|| {
        Failure::new(
            mblob_status::MBLOB_ERR_STATE,
            "the model has no outputs yet: call mblob_model_run first (or mblob_model_invoke)",
        )
    })
}

/// Writes the number of outputs of the last run to `*out` (a Relax function's returned tuple
/// counts flattened, depth first). Before a successful run: `MBLOB_ERR_STATE`.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_num_outputs(model: *const mblob_model, out: *mut usize) -> mblob_status {
    // SAFETY: the caller's contract is `model_get`'s.
    unsafe { model_get(model, out, |m| Ok(outputs(m)?.values.len())) }
}

/// Output `index` of the last run, as a tensor of its own: on the host (`to_host`), or where
/// it lies (a copy there when the model would overwrite it).
pub(crate) fn output_array(m: &mblob_model, index: usize, to_host: bool) -> Result<NdArray> {
    let all = outputs(m)?;
    let value = all.values.get(index).ok_or_else(|| out_of_range("output", index, all.values.len()))?;
    if let Value::Str(s) = value {
        return Err(Failure::new(
            mblob_status::MBLOB_ERR_UNSUPPORTED,
            format!("output {index} is a string ({s:?}), not a tensor"),
        ));
    }
    let array = value.to_array().map_err(device_failure)?.ok_or_else(|| {
        Failure::new(mblob_status::MBLOB_ERR_UNSUPPORTED, format!("output {index} is a {}", value.kind()))
    })?;
    match value {
        Value::Tensor(a) if to_host => a.copy(Device::cpu(0)).map_err(device_failure),
        Value::Tensor(a) if all.shared => a.copy(a.device()).map_err(device_failure),
        _ => Ok(array),
    }
}

/// Writes to `*out` a new tensor handle on output `index` of the last run, on the host
/// (`to_host`) or where it lies.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
pub(crate) unsafe fn publish_output(
    model: *const mblob_model,
    index: usize,
    to_host: bool,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the model at a time per the API, as `checked` needs.
        let m = unsafe { checked(Kind::Model, model, "model", out) }?;
        let array = output_array(m, index, to_host)?;
        publish(Kind::Tensor, mblob_tensor { array }, out);
        Ok(())
    })
}

/// Copies output `index` of the last run into a new host tensor that the caller owns and
/// frees with `mblob_tensor_free`, and writes its handle to `*out`. A shape a Relax function
/// returns comes as a 1-D `int64` tensor, an integer as a 0-D `int64` one, a float as a 0-D
/// `float64` one; a string is `MBLOB_ERR_UNSUPPORTED`. An output `mblob_model_invoke` left
/// on the device is copied to the host here.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_output(
    model: *const mblob_model,
    index: usize,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    // SAFETY: the caller's contract is `publish_output`'s.
    unsafe { publish_output(model, index, true, out) }
}

/// Writes to `*out` a new tensor handle on output `index` of the last run where it lies, on
/// the model's device: an output of `mblob_model_invoke` or of a Relax or Relay VM function
/// run with `mblob_model_run`, uncopied (the tensor shares its memory and keeps it alive after
/// the model runs again or is freed); an output of a graph or AOT model, which the next run
/// overwrites, copied within the device. A shape or number comes as `mblob_model_output` gives
/// it. `mblob_tensor_to_host` copies it to the host, `mblob_tensor_to_dlpack` hands it on.
///
/// # Safety
/// `model` is NULL or a handle; `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_model_output_device(
    model: *const mblob_model,
    index: usize,
    out: *mut *mut mblob_tensor,
) -> mblob_status {
    // SAFETY: the caller's contract is `publish_output`'s.
    unsafe { publish_output(model, index, false, out) }
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
