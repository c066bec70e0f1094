//! `relax.run.unique` and `relax.run.nonzero`: the functions TVM registers from Python
//! (`python/tvm/relax/op/set.py`) over numpy, so that TVM's C++ runtime alone cannot run
//! them. Results are numpy's (numpy 2): indices, inverse and counts are `int64`.

use std::cmp::Ordering;

use super::sort::f16_to_f32;
use super::{dtype_name, elem_bytes, OpError, Owned, View};
use crate::format::DataType;

/// The elements of a view as comparable keys: numpy's order (NaN after everything, NaNs equal
/// to each other, `-0.0 == 0.0`).
enum Keys {
    Ints(Vec<i128>),
    Floats(Vec<f64>),
}

impl Keys {
    fn of(function: &'static str, v: &View<'_>) -> Result<Keys, OpError> {
        let size = elem_bytes(v.dtype).ok_or_else(|| OpError::InputDtype { function, dtype: dtype_name(v.dtype) })?;
        let c = v.data.chunks_exact(size);
        let int = |b: &[u8], signed: bool| -> i128 {
            let mut a = [0u8; 16];
            a[..b.len()].copy_from_slice(b);
            if signed && b[b.len() - 1] & 0x80 != 0 {
                a[b.len()..].fill(0xff);
            }
            i128::from_le_bytes(a)
        };
        Ok(match (v.dtype.code, v.dtype.bits) {
            (0, _) => Keys::Ints(c.map(|b| int(b, true)).collect()),
            (1, _) | (6, 8) => Keys::Ints(c.map(|b| int(b, false)).collect()),
            (2, 16) => Keys::Floats(c.map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64).collect()),
            (2, 32) => Keys::Floats(c.map(|b| f32::from_le_bytes(b.try_into().unwrap_or_default()) as f64).collect()),
            (2, 64) => Keys::Floats(c.map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect()),
            _ => return Err(OpError::InputDtype { function, dtype: dtype_name(v.dtype) }),
        })
    }

    fn cmp(&self, i: usize, j: usize) -> Ordering {
        match self {
            Keys::Ints(k) => k[i].cmp(&k[j]),
            Keys::Floats(k) => match (k[i].is_nan(), k[j].is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => k[i].partial_cmp(&k[j]).unwrap_or(Ordering::Equal),
            },
        }
    }

    fn is_nan(&self, i: usize) -> bool {
        matches!(self, Keys::Floats(k) if k[i].is_nan())
    }

    fn is_zero(&self, i: usize) -> bool {
        match self {
            Keys::Ints(k) => k[i] == 0,
            Keys::Floats(k) => k[i] == 0.0,
        }
    }
}

fn i64_tensor(values: impl IntoIterator<Item = i64>, shape: Vec<i64>) -> Owned {
    Owned { dtype: DataType::I64, shape, data: values.into_iter().flat_map(i64::to_le_bytes).collect() }
}

/// What `unique` returns besides the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UniqueFlags {
    /// Values in ascending order (else in order of first occurrence).
    pub sorted: bool,
    /// The index of each value's first occurrence.
    pub return_index: bool,
    /// For each element, the position of its value among the unique values.
    pub return_inverse: bool,
    /// How often each value occurs.
    pub return_counts: bool,
}

/// `relax.run.unique(x, sorted, return_index, return_inverse, return_counts, axis)`: the
/// unique values, then what the flags ask for, in that order, as numpy 2 computes them.
///
/// - `axis` None: over the flattened input; NaNs count as one value (numpy's `equal_nan`);
///   the inverse has the input's shape.
/// - `axis` given (negative counts from the end): the unique slices along it, compared
///   lexicographically (a slice holding NaN equals no other, as numpy's structured compare
///   has it); the values keep the other extents, the inverse is 1-d.
/// - `sorted` false: values (and indices, counts, the inverse's numbering) in order of first
///   occurrence, as TVM's Python function reorders numpy's result.
pub fn unique(x: View<'_>, flags: UniqueFlags, axis: Option<i64>) -> Result<Vec<Owned>, OpError> {
    const F: &str = "relax.run.unique";
    let total = x.check(F, "the input")?;
    let size = elem_bytes(x.dtype).unwrap_or(1);
    let keys = Keys::of(F, &x)?;
    // Items along the axis: `n` of them, each `before * after` elements.
    let (axis, before, n, after) = match axis {
        None => (None, 1, total, 1),
        Some(a) => {
            let ndim = x.shape.len() as i64;
            let ax = if a < 0 { a + ndim } else { a };
            if ax < 0 || ax >= ndim {
                return Err(OpError::Axis { function: F, axis: a, ndim: x.shape.len() });
            }
            let ax = ax as usize;
            let ext = |s: &[i64]| s.iter().map(|&d| d.max(0) as usize).product::<usize>();
            (Some(ax), ext(&x.shape[..ax]), x.shape[ax].max(0) as usize, ext(&x.shape[ax + 1..]))
        }
    };
    let at = |item: usize, i: usize, j: usize| i * n * after + item * after + j;
    let cmp_items = |p: usize, q: usize| -> Ordering {
        for i in 0..before {
            for j in 0..after {
                let o = keys.cmp(at(p, i, j), at(q, i, j));
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
        Ordering::Equal
    };
    let same = |p: usize, q: usize| -> bool {
        if axis.is_none() {
            return keys.cmp(p, q) == Ordering::Equal;
        }
        (0..before).all(|i| {
            (0..after).all(|j| {
                let (e, f) = (at(p, i, j), at(q, i, j));
                keys.cmp(e, f) == Ordering::Equal && !keys.is_nan(e)
            })
        })
    };
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by(|&p, &q| cmp_items(p, q));
    // Groups of equal items in ascending order: (first occurrence, count).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut group_of = vec![0usize; n];
    for (k, &item) in perm.iter().enumerate() {
        if k == 0 || !same(perm[k - 1], item) {
            groups.push((item, 0));
        }
        let g = groups.len() - 1;
        groups[g].1 += 1;
        group_of[item] = g;
    }
    // Unsorted: groups in order of their first occurrence.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    if !flags.sorted {
        order.sort_by_key(|&g| groups[g].0);
    }
    let mut rank = vec![0usize; groups.len()];
    for (r, &g) in order.iter().enumerate() {
        rank[g] = r;
    }
    let m = groups.len();
    let mut data = Vec::with_capacity(before * m * after * size);
    for i in 0..before {
        for &g in &order {
            for j in 0..after {
                let e = at(groups[g].0, i, j);
                data.extend_from_slice(&x.data[e * size..(e + 1) * size]);
            }
        }
    }
    let shape = match axis {
        None => vec![m as i64],
        Some(ax) => {
            let mut s = x.shape.to_vec();
            s[ax] = m as i64;
            s
        }
    };
    let mut out = vec![Owned { dtype: x.dtype, shape, data }];
    if flags.return_index {
        out.push(i64_tensor(order.iter().map(|&g| groups[g].0 as i64), vec![m as i64]));
    }
    if flags.return_inverse {
        let shape = if axis.is_none() { x.shape.to_vec() } else { vec![n as i64] };
        out.push(i64_tensor(group_of.iter().map(|&g| rank[g] as i64), shape));
    }
    if flags.return_counts {
        out.push(i64_tensor(order.iter().map(|&g| groups[g].1 as i64), vec![m as i64]));
    }
    Ok(out)
}

/// `relax.run.nonzero(x)`: `np.stack(np.atleast_1d(x).nonzero())`, an `int64` tensor of shape
/// `(ndim, count)` (a 0-d input counts as 1-d), the coordinates in row-major order.
pub fn nonzero(x: View<'_>) -> Result<Owned, OpError> {
    const F: &str = "relax.run.nonzero";
    let n = x.check(F, "the input")?;
    let keys = Keys::of(F, &x)?;
    let shape: Vec<i64> = if x.shape.is_empty() { vec![1] } else { x.shape.to_vec() };
    let hits: Vec<usize> = (0..n).filter(|&i| !keys.is_zero(i)).collect();
    let ndim = shape.len();
    let mut coords = vec![0i64; ndim * hits.len()];
    for (c, &flat) in hits.iter().enumerate() {
        let mut rest = flat;
        for d in (0..ndim).rev() {
            let ext = shape[d].max(1) as usize;
            coords[d * hits.len() + c] = (rest % ext) as i64;
            rest /= ext;
        }
    }
    Ok(i64_tensor(coords, vec![ndim as i64, hits.len() as i64]))
}
