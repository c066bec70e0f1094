//! Host implementations of the runtime functions TVM-compiled code calls by name rather than
//! compiling: TVM's `tvm.contrib.sort.*` (`src/runtime/contrib/sort/sort.cc`, the same from
//! 0.19 to 0.27) and the `relax.run.*` functions TVM registers from Python
//! (`python/tvm/relax/op/set.py`: `unique`, `nonzero`, both numpy underneath).
//!
//! Everything here works on host memory as byte slices with a dtype and a shape ([`View`],
//! [`ViewMut`]) and is safe code; [`crate::ffi`] turns the `DLTensor`s compiled code passes
//! into views and registers the functions by their TVM names.
//!
//! - [`sort`]: `sort`, `argsort`, `argsort_nms`, `topk`, with TVM's dtypes, its stable order
//!   (ties keep their input order; `topk` breaks ties by the smaller index), `k < 1` meaning
//!   the whole axis and negative axes.
//! - [`set`]: numpy's `unique` (sorted or in first-occurrence order, with indices, inverse and
//!   counts, flattened or along an axis) and `nonzero`, as TVM's Python functions compute
//!   them.
//!
//! Both are the runtime's feature `ops` (on in the `mblob` crate, the C API's defaults and the
//! Python package); without it a library that calls them does not find them.

#[cfg(feature = "ops")]
pub mod set;
#[cfg(feature = "ops")]
pub mod sort;

use crate::format::DataType;

/// An error of a runtime function, worded as TVM words it where TVM has a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// An input dtype the function does not handle (`Unsupported input dtype: bfloat16`).
    #[error("{function}: Unsupported input dtype: {dtype}")]
    InputDtype {
        /// The function.
        function: &'static str,
        /// The dtype, as TVM spells it.
        dtype: String,
    },
    /// An output dtype the function does not handle for its input.
    #[error("{function}: Unsupported output dtype: {dtype}")]
    OutputDtype {
        /// The function.
        function: &'static str,
        /// The dtype, as TVM spells it.
        dtype: String,
    },
    /// An axis outside the input's dimensions.
    #[error("{function}: Axis out of boundary for input ndim {ndim} (axis {axis})")]
    Axis {
        /// The function.
        function: &'static str,
        /// The axis given.
        axis: i64,
        /// The input's number of dimensions.
        ndim: usize,
    },
    /// `topk`'s `ret_type` is none of `both`, `values`, `indices`.
    #[error("tvm.contrib.sort.topk: Unsupported ret type: {ret_type}")]
    RetType {
        /// The `ret_type` given.
        ret_type: String,
    },
    /// Arguments of the wrong number, kind, shape or size.
    #[error("{function}: {detail}")]
    Arguments {
        /// The function.
        function: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// A host tensor read by a runtime function: compact row-major bytes.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// Element type.
    pub dtype: DataType,
    /// Extents.
    pub shape: &'a [i64],
    /// The elements, `len() == product(shape) * bytes(dtype)`.
    pub data: &'a [u8],
}

/// A host tensor written by a runtime function.
#[derive(Debug)]
pub struct ViewMut<'a> {
    /// Element type.
    pub dtype: DataType,
    /// Extents.
    pub shape: &'a [i64],
    /// The elements.
    pub data: &'a mut [u8],
}

/// A tensor a runtime function made (`relax.run.*` return new tensors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// Element type.
    pub dtype: DataType,
    /// Extents.
    pub shape: Vec<i64>,
    /// The elements, compact row-major.
    pub data: Vec<u8>,
}

/// The number of elements of `shape` (`None` on a negative extent or an overflow).
#[cfg(feature = "ops")]
pub(crate) fn numel(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

/// Bytes per element of a scalar dtype whose size is a whole number of bytes (bool: one byte).
#[cfg(feature = "ops")]
pub(crate) fn elem_bytes(dtype: DataType) -> Option<usize> {
    if dtype.lanes != 1 {
        return None;
    }
    match dtype.bits {
        1 if dtype.code == 1 => Some(1),
        8 | 16 | 32 | 64 => Some(dtype.bits as usize / 8),
        _ => None,
    }
}

/// TVM's name of a dtype (`float32`, `int64`, `uint8`, `bool`, ...).
pub fn dtype_name(dtype: DataType) -> String {
    let base = match (dtype.code, dtype.bits) {
        (1, 1) | (6, 8) => return "bool".into(),
        (0, b) => format!("int{b}"),
        (1, b) => format!("uint{b}"),
        (2, b) => format!("float{b}"),
        (4, b) => format!("bfloat{b}"),
        (c, b) => format!("type{c}:{b}"),
    };
    if dtype.lanes == 1 {
        base
    } else {
        format!("{base}x{}", dtype.lanes)
    }
}

impl View<'_> {
    /// Checks that the data holds exactly the elements of the shape.
    #[cfg(feature = "ops")]
    pub(crate) fn check(&self, function: &'static str, what: &str) -> Result<usize, OpError> {
        let n = numel(self.shape).ok_or_else(|| OpError::Arguments {
            function,
            detail: format!("{what}: invalid shape {:?}", self.shape),
        })?;
        let size =
            elem_bytes(self.dtype).ok_or_else(|| OpError::InputDtype { function, dtype: dtype_name(self.dtype) })?;
        if n.checked_mul(size) != Some(self.data.len()) {
            return Err(OpError::Arguments {
                function,
                detail: format!(
                    "{what}: {} bytes for shape {:?} of {}",
                    self.data.len(),
                    self.shape,
                    dtype_name(self.dtype)
                ),
            });
        }
        Ok(n)
    }
}
