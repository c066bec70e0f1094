//! `mblob._native.Tensor`: a tensor of the run side ([`NdArray`], on the device it lies on) as
//! Python holds it, the one form in which tensors cross between the native module and
//! `mblob.runtime`. It speaks DLPack (`__dlpack__`, `__dlpack_device__`) and numpy's
//! `__array__`, so `numpy.from_dlpack(t)` and `numpy.asarray(t)` read it, and [`tensor_in`]
//! takes one back by reference (no copy) or reads any numpy array.
//!
//! `__dlpack__` hands out the tensor's own memory (no copy): `numpy.from_dlpack(t)` of a CPU
//! tensor is a view of it, and writing through the view changes the tensor (the capsule
//! keeps the tensor's storage alive, [`crate::dlpack`]). A copy is made only where the
//! consumer asks for one (`copy=True`, or `dl_device` another device) or where a tensor over
//! read-only memory (a constant of the library's mapped bytes) goes to a consumer of the
//! unversioned protocol, which has no read-only flag.

use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::dlpack;

/// A tensor (TVM's `tvm.runtime.Tensor` as Python sees it): shape, dtype, device and its
/// bytes there.
#[pyclass(frozen, module = "mblob._native", name = "Tensor")]
pub struct Tensor {
    pub(crate) inner: NdArray,
}

impl Tensor {
    /// `a` as a Python object.
    pub(crate) fn py(py: Python<'_>, a: NdArray) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, Tensor { inner: a })?.into_any())
    }
}

#[pymethods]
impl Tensor {
    /// A new tensor on the CPU with the contents of a numpy array (C-contiguous).
    #[staticmethod]
    fn from_numpy(array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        Ok(Tensor { inner: tensor_in(array, "Tensor.from_numpy")? })
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// The dtype, as numpy spells it (`float32`, `bool`, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype().to_string()
    }

    /// The device, as DLPack numbers it: `(device_type, device_id)`.
    #[getter]
    fn device(&self) -> (i32, i32) {
        self.inner.device().to_dlpack()
    }

    /// The tensor as a new numpy array on the host (its bytes copied there).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let bytes =
            py.detach(|| self.inner.to_bytes()).map_err(|e| crate::PyErrLater::Run(e.to_string()).into_py_err())?;
        let np = py.import("numpy")?;
        let dtype = np.getattr("dtype")?.call1((self.dtype(),))?;
        let flat = np.getattr("frombuffer")?.call1((PyBytes::new(py, &bytes), dtype))?;
        flat.call_method1("reshape", (self.shape(py)?,))?.call_method0("copy")
    }

    /// numpy's array protocol: `numpy.asarray(t)` (a host copy; `dtype` converts it).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = copy;
        let a = self.numpy(py)?;
        match dtype {
            Some(d) => a.call_method1("astype", (d,)),
            None => Ok(a),
        }
    }

    /// DLPack's export, as the Python array API defines `__dlpack__`: a capsule over the
    /// tensor's memory, `"dltensor_versioned"` (DLPack 1.0, with the read-only and copied
    /// flags) when `max_version` is `(1, 0)` or later, else `"dltensor"`. `dl_device` (a
    /// `(device_type, device_id)` pair) asks for the tensor on that device, `copy=True` for a
    /// copy, `copy=False` for none (a `BufferError` where one would be needed). Work on a
    /// device is finished (the device synchronised) before the capsule is made, so the
    /// consumer may read it on any `stream`.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(i64, i64)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let here = self.inner.device();
        let target = dl_device.map_or(here, |(t, id)| Device::from_dlpack(t, id));
        // A consumer of the unversioned capsule cannot be told that memory is read-only.
        let read_only = self.inner.storage().is_read_only();
        let needs_copy = target != here || (read_only && !versioned);
        let copied = copy == Some(true) || needs_copy;
        if needs_copy && copy == Some(false) {
            let why = if target != here {
                format!("the tensor is on {here}, not on {target}")
            } else {
                "its memory is read-only, which a DLPack capsule before 1.0 cannot say (ask with max_version=(1, 0))"
                    .to_owned()
            };
            return Err(PyBufferError::new_err(format!("__dlpack__(copy=False): {why}")));
        }
        let array = if copied {
            py.detach(|| self.inner.copy(target)).map_err(|e| PyBufferError::new_err(format!("__dlpack__: {e}")))?
        } else {
            self.inner.clone()
        };
        if !array.device().is_cpu() {
            py.detach(|| array.storage().api().synchronize())
                .map_err(|e| PyBufferError::new_err(format!("__dlpack__: {e}")))?;
        }
        let mut flags = 0;
        if array.storage().is_read_only() {
            flags |= dlpack::FLAG_READ_ONLY;
        }
        if copied {
            flags |= dlpack::FLAG_IS_COPIED;
        }
        dlpack::capsule(py, array, versioned, flags)
    }

    /// DLPack's device of the tensor, `(device_type, device_id)`: where `__dlpack__` hands
    /// it out unless asked for another.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.inner.device().to_dlpack()
    }

    fn __repr__(&self) -> String {
        format!("mblob.Tensor(shape={:?}, dtype={}, device={})", self.inner.shape(), self.dtype(), self.inner.device())
    }
}

/// A tensor argument from Python: a [`Tensor`] as it is (by reference: shared, uncopied), else
/// a numpy array (made C-contiguous by `mblob.runtime`), its bytes copied to a new CPU array.
pub(crate) fn tensor_in(a: &Bound<'_, PyAny>, what: &str) -> PyResult<NdArray> {
    if let Ok(t) = a.cast::<Tensor>() {
        return Ok(t.get().inner.clone());
    }
    let bad = |detail: String| crate::InputError::new_err(format!("{what}: {detail}"));
    let dtype_name: String = a.getattr("dtype").and_then(|d| d.str()?.extract()).map_err(|_| {
        bad(format!(
            "a {} is not an array (a numpy array or an mblob Tensor)",
            a.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    let dtype = DataType::parse(&dtype_name).ok_or_else(|| bad(format!("unknown dtype `{dtype_name}`")))?;
    let shape: Vec<i64> = a.getattr("shape")?.extract()?;
    let bytes = a.call_method0("tobytes")?;
    let data = bytes.cast::<PyBytes>()?.as_bytes();
    NdArray::from_bytes(data, &shape, dtype, Device::cpu(0)).map_err(|e| bad(e.to_string()))
}
