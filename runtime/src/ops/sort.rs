//! TVM's `tvm.contrib.sort.*` (`src/runtime/contrib/sort/sort.cc`), on host views.
//!
//! Semantics, as TVM's C++ has them on x86 and other non-ARM hosts:
//! - The sort is along one axis (negative counts from the end), each line on its own, and
//!   stable: equal values keep their input order, ascending or descending
//!   (`std::stable_sort` with `<` or `>`).
//! - `sort`: input dtypes `float16`, `float32`, `float64`, `int32`, `int64`; the output has
//!   the input's dtype. `float16` compares as the float it widens to.
//! - `argsort`: the same inputs; indices as `int32`, `int64`, `float32` or `float64`.
//! - `argsort_nms`: `float32` input, the first `sort_num[line]` elements of each line sorted,
//!   `int32` indices, positions past them given their own index.
//! - `topk`: inputs `float16`, `float32`, `float64`, `uint8`, `int8`, `int32`, `int64`;
//!   indices `int32`, `int64`, `float32`, `float64` (and the input's own dtype for
//!   `uint8`/`int8`). `ret_type` is `both` (values then indices), `values` or `indices`;
//!   `k < 1` takes the whole axis; ties go to the smaller index, in both directions.
//!
//! NaN has no order under `<`, so TVM's order of a line holding NaN is whatever its
//! `std::stable_sort` makes of it; mblob's is that of Rust's stable sort over the same
//! comparison, which can differ.

use super::{dtype_name, elem_bytes, OpError, View, ViewMut};
use crate::format::DataType;

/// An element type the sort functions read or write.
trait Elem: Copy {
    fn get(b: &[u8], i: usize) -> Self;
    fn put(self, b: &mut [u8], i: usize);
    fn lt(self, other: Self) -> bool;
    /// An index as this type (`static_cast<IndicesType>(int64_t)`).
    fn from_index(i: i64) -> Self;
}

macro_rules! elem {
    ($t:ty, $n:expr) => {
        impl Elem for $t {
            fn get(b: &[u8], i: usize) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[i * $n..(i + 1) * $n]);
                <$t>::from_le_bytes(a)
            }
            fn put(self, b: &mut [u8], i: usize) {
                b[i * $n..(i + 1) * $n].copy_from_slice(&self.to_le_bytes());
            }
            fn lt(self, other: Self) -> bool {
                self < other
            }
            fn from_index(i: i64) -> Self {
                i as $t
            }
        }
    };
}
elem!(f32, 4);
elem!(f64, 8);
elem!(i8, 1);
elem!(u8, 1);
elem!(i32, 4);
elem!(i64, 8);

/// IEEE half precision, compared as the `float` it widens to (TVM's `float16` struct).
#[derive(Debug, Clone, Copy)]
struct F16(u16);

/// Widens a half-precision bit pattern to `f32` (exact).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise.
            let shift = f.leading_zeros() - 21;
            let f = (f << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (f << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13) | 0x0040_0000,
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

impl Elem for F16 {
    fn get(b: &[u8], i: usize) -> Self {
        F16(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
    }
    fn put(self, b: &mut [u8], i: usize) {
        b[2 * i..2 * i + 2].copy_from_slice(&self.0.to_le_bytes());
    }
    fn lt(self, other: Self) -> bool {
        f16_to_f32(self.0) < f16_to_f32(other.0)
    }
    fn from_index(_: i64) -> Self {
        // Never an index type on these hosts (TVM allows float16 indices on ARM only).
        F16(0)
    }
}

/// The lines of a sort along `axis`: (before, extent, after).
fn lines(function: &'static str, shape: &[i64], axis: i64) -> Result<(usize, usize, usize, usize), OpError> {
    let ndim = shape.len();
    let a = if axis < 0 { axis + ndim as i64 } else { axis };
    if a < 0 || a >= ndim as i64 {
        return Err(OpError::Axis { function, axis, ndim });
    }
    let a = a as usize;
    let ext = |s: &[i64]| s.iter().map(|&d| d.max(0) as usize).product::<usize>();
    Ok((a, ext(&shape[..a]), shape[a].max(0) as usize, ext(&shape[a + 1..])))
}

/// Stable order of one line: (index, value) pairs. The pairs are ordered through a
/// permutation sorted by [`sort_positions`], so that the sort itself is compiled once, not once
/// per element type and direction (it was a tenth of the C library's code); the order is the
/// same, since a stable sort's result is the one order that keeps equal values in input order.
fn sort_line<D: Elem>(sorter: &mut [(i64, D)], ascend: bool) {
    let pairs: &[(i64, D)] = sorter;
    let compare = |l: &usize, r: &usize| {
        let (a, b) = (pairs[*l].1, pairs[*r].1);
        if ascend {
            order(a.lt(b), b.lt(a))
        } else {
            order(b.lt(a), a.lt(b))
        }
    };
    let sorted: Vec<(i64, D)> = sort_positions(pairs.len(), &compare).into_iter().map(|k| pairs[k]).collect();
    sorter.copy_from_slice(&sorted);
}

/// The positions `0..n` in the stable order of `compare`.
fn sort_positions(n: usize, compare: &dyn Fn(&usize, &usize) -> std::cmp::Ordering) -> Vec<usize> {
    let mut positions: Vec<usize> = (0..n).collect();
    positions.sort_by(compare);
    positions
}

fn order(less: bool, greater: bool) -> std::cmp::Ordering {
    if less {
        std::cmp::Ordering::Less
    } else if greater {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

fn check_out(function: &'static str, out: &ViewMut<'_>, elems: usize) -> Result<(), OpError> {
    let size = elem_bytes(out.dtype).ok_or_else(|| OpError::OutputDtype { function, dtype: dtype_name(out.dtype) })?;
    if elems.checked_mul(size) != Some(out.data.len()) {
        return Err(OpError::Arguments {
            function,
            detail: format!(
                "the output holds {} bytes, {elems} elements of {} expected",
                out.data.len(),
                dtype_name(out.dtype)
            ),
        });
    }
    Ok(())
}

/// Sorts every line and hands each (position, pair) to `write`.
fn each_sorted<D: Elem>(
    input: &View<'_>,
    dims: (usize, usize, usize),
    ascend: bool,
    mut write: impl FnMut(usize, (i64, D)),
) {
    let (before, n, after) = dims;
    let mut sorter: Vec<(i64, D)> = Vec::with_capacity(n);
    for i in 0..before {
        for j in 0..after {
            let base = i * n * after + j;
            sorter.clear();
            sorter.extend((0..n).map(|k| (k as i64, D::get(input.data, base + k * after))));
            sort_line(&mut sorter, ascend);
            for (k, p) in sorter.iter().enumerate() {
                write(base + k * after, *p);
            }
        }
    }
}

const F16T: DataType = DataType { code: 2, bits: 16, lanes: 1 };
const F64T: DataType = DataType { code: 2, bits: 64, lanes: 1 };
const I8T: DataType = DataType { code: 0, bits: 8, lanes: 1 };
const U8T: DataType = DataType { code: 1, bits: 8, lanes: 1 };

/// `tvm.contrib.sort.sort(input, output, axis, is_ascend)`.
pub fn sort(input: View<'_>, output: ViewMut<'_>, axis: i64, is_ascend: bool) -> Result<(), OpError> {
    const F: &str = "tvm.contrib.sort.sort";
    let n = input.check(F, "the input")?;
    let (_, before, ext, after) = lines(F, input.shape, axis)?;
    if input.dtype != output.dtype {
        return Err(OpError::Arguments {
            function: F,
            detail: format!(
                "Check failed: data_dtype == out_dtype ({} vs. {})",
                dtype_name(input.dtype),
                dtype_name(output.dtype)
            ),
        });
    }
    check_out(F, &output, n)?;
    let out = output.data;
    fn run<D: Elem>(input: &View<'_>, out: &mut [u8], dims: (usize, usize, usize), asc: bool) {
        each_sorted::<D>(input, dims, asc, |at, (_, v)| v.put(out, at));
    }
    let dims = (before, ext, after);
    match input.dtype {
        DataType::F32 => run::<f32>(&input, out, dims, is_ascend),
        F64T => run::<f64>(&input, out, dims, is_ascend),
        DataType::I32 => run::<i32>(&input, out, dims, is_ascend),
        DataType::I64 => run::<i64>(&input, out, dims, is_ascend),
        F16T => run::<F16>(&input, out, dims, is_ascend),
        t => return Err(OpError::InputDtype { function: F, dtype: dtype_name(t) }),
    }
    Ok(())
}

/// `tvm.contrib.sort.argsort(input, output, axis, is_ascend)`.
pub fn argsort(input: View<'_>, output: ViewMut<'_>, axis: i64, is_ascend: bool) -> Result<(), OpError> {
    const F: &str = "tvm.contrib.sort.argsort";
    let n = input.check(F, "the input")?;
    let (_, before, ext, after) = lines(F, input.shape, axis)?;
    let dims = (before, ext, after);
    fn run<D: Elem, O: Elem>(input: &View<'_>, out: &mut [u8], dims: (usize, usize, usize), asc: bool) {
        each_sorted::<D>(input, dims, asc, |at, (k, _)| O::from_index(k).put(out, at));
    }
    check_out(F, &output, n)?;
    let out = output.data;
    macro_rules! by_out {
        ($D:ty) => {
            match output.dtype {
                DataType::I32 => run::<$D, i32>(&input, out, dims, is_ascend),
                DataType::I64 => run::<$D, i64>(&input, out, dims, is_ascend),
                DataType::F32 => run::<$D, f32>(&input, out, dims, is_ascend),
                F64T => run::<$D, f64>(&input, out, dims, is_ascend),
                t => return Err(OpError::OutputDtype { function: F, dtype: dtype_name(t) }),
            }
        };
    }
    match input.dtype {
        DataType::F32 => by_out!(f32),
        F64T => by_out!(f64),
        DataType::I32 => by_out!(i32),
        DataType::I64 => by_out!(i64),
        F16T => by_out!(F16),
        t => return Err(OpError::InputDtype { function: F, dtype: dtype_name(t) }),
    }
    Ok(())
}

/// `tvm.contrib.sort.argsort_nms(input, sort_num, output, axis, is_ascend)`: `float32` input,
/// `int32` counts (one per line) and `int32` indices.
pub fn argsort_nms(
    input: View<'_>,
    sort_num: View<'_>,
    output: ViewMut<'_>,
    axis: i64,
    is_ascend: bool,
) -> Result<(), OpError> {
    const F: &str = "tvm.contrib.sort.argsort_nms";
    let n = input.check(F, "the input")?;
    if input.dtype.code != 2 {
        return Err(OpError::Arguments {
            function: F,
            detail: "Currently only supports input dtype to be float.".into(),
        });
    }
    if input.dtype != DataType::F32 {
        return Err(OpError::Arguments {
            function: F,
            detail: "Currently only supports input dtype to be float32.".into(),
        });
    }
    let (_, before, ext, after) = lines(F, input.shape, axis)?;
    let counts = sort_num.check(F, "sort_num")?;
    if sort_num.dtype != DataType::I32 || counts < before * after {
        return Err(OpError::Arguments {
            function: F,
            detail: format!(
                "sort_num must be int32 with {} elements, got {} {:?}",
                before * after,
                dtype_name(sort_num.dtype),
                sort_num.shape
            ),
        });
    }
    if output.dtype != DataType::I32 {
        return Err(OpError::OutputDtype { function: F, dtype: dtype_name(output.dtype) });
    }
    check_out(F, &output, n)?;
    let out = output.data;
    let mut sorter: Vec<(i64, f32)> = Vec::with_capacity(ext);
    for i in 0..before {
        for j in 0..after {
            // TVM reads past the line when a count exceeds it; here it is the whole line.
            let count = (i32::get(sort_num.data, i * after + j).max(0) as usize).min(ext);
            let base = i * ext * after + j;
            sorter.clear();
            sorter.extend((0..count).map(|k| (k as i64, f32::get(input.data, base + k * after))));
            sort_line(&mut sorter, is_ascend);
            for k in 0..ext {
                let v = sorter.get(k).map_or(k as i32, |p| p.0 as i32);
                v.put(out, base + k * after);
            }
        }
    }
    Ok(())
}

/// What `topk` writes.
#[derive(Debug)]
pub enum TopkOut<'a> {
    /// `ret_type = "both"`: values, then indices.
    Both(ViewMut<'a>, ViewMut<'a>),
    /// `ret_type = "values"`.
    Values(ViewMut<'a>),
    /// `ret_type = "indices"`.
    Indices(ViewMut<'a>),
}

/// `tvm.contrib.sort.topk(input, outputs..., k, axis, ret_type, is_ascend)`.
pub fn topk(input: View<'_>, out: TopkOut<'_>, k: i64, axis: i64, is_ascend: bool) -> Result<(), OpError> {
    const F: &str = "tvm.contrib.sort.topk";
    input.check(F, "the input")?;
    let (_, before, ext, after) = lines(F, input.shape, axis)?;
    let k = if k < 1 { ext } else { usize::try_from(k).unwrap_or(usize::MAX) };
    let take = k.min(ext);
    let elems = before
        .checked_mul(k)
        .and_then(|x| x.checked_mul(after))
        .ok_or_else(|| OpError::Arguments { function: F, detail: format!("k = {k} is too large") })?;
    let (mut values, mut indices) = match out {
        TopkOut::Both(v, i) => (Some(v), Some(i)),
        TopkOut::Values(v) => (Some(v), None),
        TopkOut::Indices(i) => (None, Some(i)),
    };
    if let Some(v) = &values {
        if v.dtype != input.dtype {
            return Err(OpError::Arguments {
                function: F,
                detail: format!("the values are {}, the input {}", dtype_name(v.dtype), dtype_name(input.dtype)),
            });
        }
        check_out(F, v, elems)?;
    }
    if let Some(i) = &indices {
        check_out(F, i, elems)?;
    }
    // TVM picks the index type "int64" when there is no index output.
    let index_dtype = indices.as_ref().map_or(DataType::I64, |i| i.dtype);
    fn run<D: Elem, O: Elem>(
        input: &View<'_>,
        values: Option<&mut [u8]>,
        indices: Option<&mut [u8]>,
        dims: (usize, usize, usize, usize, usize),
        asc: bool,
    ) {
        let (before, ext, after, k, take) = dims;
        let (mut values, mut indices) = (values, indices);
        let mut sorter: Vec<(i64, D)> = Vec::with_capacity(ext);
        for i in 0..before {
            for j in 0..after {
                let src = i * ext * after + j;
                let dst = i * k * after + j;
                sorter.clear();
                sorter.extend((0..ext).map(|c| (c as i64, D::get(input.data, src + c * after))));
                // Ties by the smaller index in both directions: the stable sort's order.
                sort_line(&mut sorter, asc);
                for (kk, (idx, v)) in sorter.iter().take(take).enumerate() {
                    if let Some(out) = indices.as_deref_mut() {
                        O::from_index(*idx).put(out, dst + kk * after);
                    }
                    if let Some(out) = values.as_deref_mut() {
                        v.put(out, dst + kk * after);
                    }
                }
            }
        }
    }
    let dims = (before, ext, after, k, take);
    let v = values.as_mut().map(|v| &mut *v.data);
    let ix = indices.as_mut().map(|i| &mut *i.data);
    macro_rules! by_out {
        ($D:ty $(, $own:pat => $O:ty)?) => {
            match index_dtype {
                $($own => run::<$D, $O>(&input, v, ix, dims, is_ascend),)?
                DataType::I32 => run::<$D, i32>(&input, v, ix, dims, is_ascend),
                DataType::I64 => run::<$D, i64>(&input, v, ix, dims, is_ascend),
                DataType::F32 => run::<$D, f32>(&input, v, ix, dims, is_ascend),
                F64T => run::<$D, f64>(&input, v, ix, dims, is_ascend),
                t => return Err(OpError::OutputDtype { function: F, dtype: dtype_name(t) }),
            }
        };
    }
    match input.dtype {
        DataType::F32 => by_out!(f32),
        F64T => by_out!(f64),
        U8T => by_out!(u8, U8T => u8),
        I8T => by_out!(i8, I8T => i8),
        DataType::I32 => by_out!(i32),
        DataType::I64 => by_out!(i64),
        F16T => by_out!(F16),
        t => return Err(OpError::InputDtype { function: F, dtype: dtype_name(t) }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_widens_exactly() {
        for (h, f) in [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x0001, 5.960_464_5e-8), (0x7bff, 65504.0), (0x8000, -0.0)]
        {
            assert_eq!(f16_to_f32(h).to_bits(), f.to_bits(), "{h:#x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    }

    #[test]
    fn bad_axis_and_dtypes_are_errors() {
        let data = [0u8; 8];
        let input = View { dtype: DataType::I32, shape: &[2], data: &data };
        let mut out = [0u8; 8];
        let e = sort(input, ViewMut { dtype: DataType::I32, shape: &[2], data: &mut out }, 1, true).unwrap_err();
        assert!(matches!(e, OpError::Axis { .. }), "{e}");
        let e = argsort(input, ViewMut { dtype: U8T, shape: &[2], data: &mut out[..2] }, 0, true).unwrap_err();
        assert_eq!(e.to_string(), "tvm.contrib.sort.argsort: Unsupported output dtype: uint8");
        let u = View { dtype: U8T, shape: &[8], data: &data };
        let e = sort(u, ViewMut { dtype: U8T, shape: &[8], data: &mut out }, 0, true).unwrap_err();
        assert_eq!(e.to_string(), "tvm.contrib.sort.sort: Unsupported input dtype: uint8");
    }
}
