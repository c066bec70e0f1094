//! `mblob._native.Tensor`: a tensor of the run side ([`NdArray`], on the device it lies on) as
//! Python holds it, the one form in which tensors cross between the native module and
//! `mblob.runtime`. It speaks DLPack (`__dlpack__`, `__dlpack_device__`) and numpy's
//! `__array__`, so `numpy.from_dlpack(t)` and `numpy.asarray(t)` read it, and [`tensor_in`]
//! takes one back by reference (no copy) or reads any numpy array.
//!
//! What a consumer reads is a host copy: the capsule `__dlpack__` gives is numpy's, of the
//! tensor's bytes copied to the host once (abi3 and the crate's no-`unsafe` rule outside the
//! FFI edges leave handing out the device memory itself for later).

use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

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

    /// DLPack's export: the capsule of the tensor's host copy (see the module's note); the
    /// keywords (`stream`, `max_version`, `dl_device`, `copy`) are numpy's.
    #[pyo3(signature = (**kwargs))]
    fn __dlpack__<'py>(&self, py: Python<'py>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyAny>> {
        self.numpy(py)?.call_method("__dlpack__", (), kwargs)
    }

    /// DLPack's device of what `__dlpack__` gives: the host, `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        Device::cpu(0).to_dlpack()
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
