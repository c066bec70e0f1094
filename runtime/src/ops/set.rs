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

/// `relax.run.unique(x, sorted, return_index, return_inverse, return_counts, axis)` over the
/// flattened input (`axis` None): the unique values, then what the flags ask for, in that
/// order. The inverse has the input's shape (numpy 2).
pub fn unique(x: View<'_>, flags: UniqueFlags, axis: Option<i64>) -> Result<Vec<Owned>, OpError> {
    const F: &str = "relax.run.unique";
    let n = x.check(F, "the input")?;
    if let Some(axis) = axis {
        return Err(OpError::Arguments {
            function: F,
            detail: format!("unique along an axis ({axis}) is not supported by mblob, only over the flattened input"),
        });
    }
    let size = elem_bytes(x.dtype).unwrap_or(1);
    let keys = Keys::of(F, &x)?;
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by(|&a, &b| keys.cmp(a, b));
    // Groups of equal values in ascending order: (first occurrence, count).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut group_of = vec![0usize; n];
    for (p, &e) in perm.iter().enumerate() {
        if p == 0 || keys.cmp(perm[p - 1], e) != Ordering::Equal {
            groups.push((e, 0));
        }
        let g = groups.len() - 1;
        groups[g].1 += 1;
        group_of[e] = g;
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
    let m = groups.len() as i64;
    let mut out = vec![Owned {
        dtype: x.dtype,
        shape: vec![m],
        data: order
            .iter()
            .flat_map(|&g| x.data[groups[g].0 * size..(groups[g].0 + 1) * size].iter().copied())
            .collect(),
    }];
    if flags.return_index {
        out.push(i64_tensor(order.iter().map(|&g| groups[g].0 as i64), vec![m]));
    }
    if flags.return_inverse {
        out.push(i64_tensor(group_of.iter().map(|&g| rank[g] as i64), x.shape.to_vec()));
    }
    if flags.return_counts {
        out.push(i64_tensor(order.iter().map(|&g| groups[g].1 as i64), vec![m]));
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
