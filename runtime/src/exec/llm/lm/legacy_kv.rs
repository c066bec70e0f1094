//! The legacy attention KV cache of `nn.KVCache` (TVM's `relax.vm.AttentionKVCacheLegacy`,
//! `src/runtime/vm/lm_support.cc`) and its `vm.builtin.attention_kv_cache_*` builtins.
//!
//! The cache is one tensor of reserved rows (`data`, its first dimension the rows) and a fill
//! count: `append` copies rows after the filled ones, doubling the reserve until they fit;
//! `update` rewrites the filled rows; `view` is the filled rows as a tensor sharing the
//! cache's memory; `window_override` writes rows as a ring of `max_cache_size` rows whose
//! first `num_attention_sinks` rows are never overwritten once the ring is full.
//!
//! Every check runs before anything changes, so a refused call leaves the cache as it was
//! (TVM may have grown the reserve or written part of a window first); writes that TVM would
//! make past the reserve are errors.

use crate::array::{tensor_bytes, ArrayError, NdArray};
use crate::format::DataType;

/// A legacy KV cache builtin refused its arguments. Messages carry TVM's text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LegacyKvError {
    /// A value of another dtype than the cache's.
    #[error("{op}: Check failed: (data.DataType() == value.DataType()) is false: dtype mismatch (cache {cache}, value {value})")]
    Dtype {
        /// The builtin.
        op: &'static str,
        /// The cache's dtype.
        cache: DataType,
        /// The value's.
        value: DataType,
    },
    /// A row count (of a view's shape or an update's value) that is not the fill count.
    #[error("{op}: Check failed: {what}[0] == fill_count ({rows} vs. {fill_count}) : Requested shape do not match the filled count")]
    FillCount {
        /// The builtin.
        op: &'static str,
        /// `shape` (a view) or `value->shape` (an update).
        what: &'static str,
        /// The rows asked for.
        rows: i64,
        /// The fill count.
        fill_count: i64,
    },
    /// A dimension after the first that is not the cache's.
    #[error("{op}: Check failed: {what}[i] == data->shape[i] ({found} vs. {expected}) : Dimension {dim} mismatch")]
    Dimension {
        /// The builtin.
        op: &'static str,
        /// `shape` (a view) or `value->shape`.
        what: &'static str,
        /// The dimension.
        dim: usize,
        /// Its extent there.
        found: i64,
        /// The cache's.
        expected: i64,
    },
    /// A shape or value with another number of dimensions than the cache's (TVM reads past
    /// the end of the shorter shape).
    #[error("{op}: {what} has {found} dimensions, the cache {expected}")]
    Rank {
        /// The builtin.
        op: &'static str,
        /// What was given.
        what: &'static str,
        /// Its dimensions.
        found: usize,
        /// The cache's.
        expected: usize,
    },
    /// `attention_kv_cache_array_popn` of more rows than a cache holds (`n` shown as TVM's
    /// `size_t`).
    #[error("vm.builtin.attention_kv_cache_array_popn: Check failed: n <= fill_count ({n} vs. {fill_count}) :")]
    PopN {
        /// The rows to pop, as an unsigned number.
        n: u64,
        /// The fill count.
        fill_count: i64,
    },
    /// A window override with more rows than the window holds apart from its sinks.
    #[error("{op}: Check failed: value->shape[0] <= max_cache_size - num_attention_sinks ({rows} vs. {room}) : dim 0 of value too large")]
    WindowTooSmall {
        /// The builtin.
        op: &'static str,
        /// Rows of the value.
        rows: i64,
        /// `max_cache_size - num_attention_sinks`.
        room: i64,
    },
    /// A window override that wraps while the cache is not a full window (after a pop), or
    /// whose position is past the window.
    #[error("{op}: Check failed: the window must be full to wrap (fill count {fill_count}, position {position}, max_cache_size {max_cache_size})")]
    WindowState {
        /// The builtin.
        op: &'static str,
        /// The fill count after the call.
        fill_count: i64,
        /// The window position before the call.
        position: i64,
        /// The window size.
        max_cache_size: i64,
    },
    /// Rows `start..end` written past the reserve of `reserved` rows (TVM writes out of
    /// bounds).
    #[error("{op}: rows {start}..{end} lie past the {reserved} reserved rows of the cache")]
    PastReserve {
        /// The builtin.
        op: &'static str,
        /// First row written.
        start: i64,
        /// One past the last.
        end: i64,
        /// Reserved rows.
        reserved: i64,
    },
    /// Growing a cache whose reserve has no rows (TVM doubles 0 forever), or past `i64`.
    #[error("{op}: cannot grow a reserve of {reserved} rows to hold {needed}")]
    Grow {
        /// The builtin.
        op: &'static str,
        /// Reserved rows.
        reserved: i64,
        /// Rows needed.
        needed: i64,
    },
    /// A negative argument.
    #[error("{op}: {what} is {value}, which is negative")]
    Negative {
        /// The builtin.
        op: &'static str,
        /// The argument.
        what: &'static str,
        /// Its value.
        value: i64,
    },
    /// Allocating or copying a tensor failed.
    #[error(transparent)]
    Array(#[from] ArrayError),
}

impl LegacyKvError {
    /// The class of the error TVM raises for it (`InternalError` for all of these).
    pub fn tvm_kind(&self) -> &'static str {
        "InternalError"
    }
}

/// TVM's `relax.vm.AttentionKVCacheLegacy`: reserved rows, the fill count and the window
/// position. TVM's object is shared by reference; the VM holds this behind its object handle.
#[derive(Debug, Clone)]
pub struct AttentionKvCacheLegacy {
    data: NdArray,
    fill_count: i64,
    window_attention_current_pos: i64,
}

/// Bytes of one row of `shape` (the product of the extents after the first).
fn row_bytes(dtype: DataType, shape: &[i64]) -> Result<usize, ArrayError> {
    tensor_bytes(dtype, shape.get(1..).unwrap_or(&[]))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| ArrayError::BadShape { shape: shape.to_vec(), dtype })
}

/// Bytes of `rows` rows of `row` bytes (`rows` is never negative: the callers check).
fn offset(rows: i64, row: usize, dtype: DataType) -> Result<usize, ArrayError> {
    usize::try_from(rows).ok().and_then(|r| r.checked_mul(row)).ok_or(ArrayError::BadShape { shape: vec![rows], dtype })
}

impl AttentionKvCacheLegacy {
    /// The reserved rows.
    pub fn reserved(&self) -> i64 {
        self.data.shape()[0]
    }

    /// The number of filled rows (`fill_count`).
    pub fn fill_count(&self) -> i64 {
        self.fill_count
    }

    /// The next row a window override writes (`window_attention_current_pos`).
    pub fn window_position(&self) -> i64 {
        self.window_attention_current_pos
    }

    /// The tensor of reserved rows.
    pub fn data(&self) -> &NdArray {
        &self.data
    }

    fn check_dtype(&self, op: &'static str, value: &NdArray) -> Result<(), LegacyKvError> {
        if self.data.dtype() == value.dtype() {
            Ok(())
        } else {
            Err(LegacyKvError::Dtype { op, cache: self.data.dtype(), value: value.dtype() })
        }
    }

    /// Checks that `shape` (of a value or a view) has the cache's dimensions after the first.
    fn check_dims(&self, op: &'static str, what: &'static str, shape: &[i64]) -> Result<(), LegacyKvError> {
        let data = self.data.shape();
        if shape.len() != data.len() {
            return Err(LegacyKvError::Rank { op, what, found: shape.len(), expected: data.len() });
        }
        for dim in 1..data.len() {
            if shape[dim] != data[dim] {
                return Err(LegacyKvError::Dimension { op, what, dim, found: shape[dim], expected: data[dim] });
            }
        }
        Ok(())
    }

    /// The reserve doubled until it holds `needed` rows (TVM's growth).
    fn grown_reserve(&self, op: &'static str, needed: i64) -> Result<i64, LegacyKvError> {
        let mut reserved = self.reserved();
        while needed > reserved {
            reserved = match reserved.checked_mul(2) {
                Some(r) if r > 0 => r,
                _ => return Err(LegacyKvError::Grow { op, reserved: self.reserved(), needed }),
            };
        }
        Ok(reserved)
    }

    /// Replaces the data by a reserve of `reserved` rows holding the old rows.
    fn grow_to(&mut self, reserved: i64) -> Result<(), LegacyKvError> {
        if reserved == self.reserved() {
            return Ok(());
        }
        let mut shape = self.data.shape().to_vec();
        shape[0] = reserved;
        let grown = NdArray::empty(&shape, self.data.dtype(), self.data.device())?;
        self.data.storage().copy_to(0, grown.storage(), 0, self.data.nbytes()).map_err(ArrayError::from)?;
        self.data = grown;
        Ok(())
    }

    /// Copies rows `src_row..src_row + rows` of `value` to rows `dst_row..` of the data.
    fn copy_rows(&self, value: &NdArray, src_row: i64, dst_row: i64, rows: i64) -> Result<(), LegacyKvError> {
        let dtype = self.data.dtype();
        let row = row_bytes(dtype, self.data.shape())?;
        let n = offset(rows, row, dtype)?;
        value
            .storage()
            .copy_to(offset(src_row, row, dtype)?, self.data.storage(), offset(dst_row, row, dtype)?, n)
            .map_err(ArrayError::from)?;
        Ok(())
    }

    fn check_within_reserve(
        &self,
        op: &'static str,
        start: i64,
        rows: i64,
        reserved: i64,
    ) -> Result<(), LegacyKvError> {
        let end = start.saturating_add(rows);
        if start < 0 || end > reserved {
            return Err(LegacyKvError::PastReserve { op, start, end, reserved });
        }
        Ok(())
    }

    /// `AttentionKVCacheLegacy::Create`: a reserve of `reserve_shape` on `init_data`'s device,
    /// `init_data` appended, then the fill count (and window position) set to
    /// `init_fill_count` when it is not negative.
    pub fn create(init_data: &NdArray, reserve_shape: &[i64], init_fill_count: i64) -> Result<Self, LegacyKvError> {
        const OP: &str = "vm.builtin.attention_kv_cache_create";
        if reserve_shape.is_empty() {
            return Err(LegacyKvError::Rank {
                op: OP,
                what: "the reserve shape",
                found: 0,
                expected: init_data.shape().len(),
            });
        }
        let data = NdArray::empty(reserve_shape, init_data.dtype(), init_data.device())?;
        let mut cache = AttentionKvCacheLegacy { data, fill_count: 0, window_attention_current_pos: 0 };
        cache.append_rows(OP, init_data)?;
        if init_fill_count >= 0 {
            cache.fill_count = init_fill_count;
            cache.window_attention_current_pos = init_fill_count;
        }
        Ok(cache)
    }

    fn append_rows(&mut self, op: &'static str, value: &NdArray) -> Result<(), LegacyKvError> {
        self.check_dtype(op, value)?;
        self.check_dims(op, "value->shape", value.shape())?;
        let rows = value.shape()[0];
        let needed = self.fill_count.checked_add(rows).ok_or(LegacyKvError::Grow {
            op,
            reserved: self.reserved(),
            needed: i64::MAX,
        })?;
        let reserved = self.grown_reserve(op, needed)?;
        self.check_within_reserve(op, self.fill_count, rows, reserved)?;
        self.grow_to(reserved)?;
        self.copy_rows(value, 0, self.fill_count, rows)?;
        self.fill_count = needed;
        Ok(())
    }

    /// `Append`: `value`'s rows after the filled ones, the reserve doubled until they fit.
    pub fn append(&mut self, value: &NdArray) -> Result<(), LegacyKvError> {
        self.append_rows("vm.builtin.attention_kv_cache_append", value)
    }

    /// `Update`: the filled rows replaced by `value`, which has exactly that many.
    pub fn update(&mut self, value: &NdArray) -> Result<(), LegacyKvError> {
        const OP: &str = "vm.builtin.attention_kv_cache_update";
        self.check_dtype(OP, value)?;
        let rows = value.shape().first().copied().unwrap_or(0);
        if value.shape().is_empty() || rows != self.fill_count {
            return Err(LegacyKvError::FillCount { op: OP, what: "value->shape", rows, fill_count: self.fill_count });
        }
        self.check_dims(OP, "value->shape", value.shape())?;
        self.check_within_reserve(OP, 0, rows, self.reserved())?;
        self.copy_rows(value, 0, 0, rows)?;
        self.fill_count = rows;
        Ok(())
    }

    /// `View`: the filled rows as a tensor of `shape` sharing the cache's memory (`shape[0]`
    /// must be the fill count, the rest the cache's dimensions).
    pub fn view(&self, shape: &[i64]) -> Result<NdArray, LegacyKvError> {
        const OP: &str = "vm.builtin.attention_kv_cache_view";
        let rows = shape.first().copied().unwrap_or(0);
        if shape.is_empty() || rows != self.fill_count {
            return Err(LegacyKvError::FillCount { op: OP, what: "shape", rows, fill_count: self.fill_count });
        }
        self.check_dims(OP, "shape", shape)?;
        Ok(self.data.view(shape, self.data.dtype())?)
    }

    /// The view of the filled rows with the cache's own dimensions (the one-argument
    /// `attention_kv_cache_view`).
    pub fn view_filled(&self) -> Result<NdArray, LegacyKvError> {
        let mut shape = self.data.shape().to_vec();
        shape[0] = self.fill_count;
        self.view(&shape)
    }

    /// `PopN`: the last `n` filled rows dropped (`n` at most the fill count).
    pub fn pop_n(&mut self, n: i64) -> Result<(), LegacyKvError> {
        self.check_pop(n)?;
        self.fill_count -= n;
        Ok(())
    }

    fn check_pop(&self, n: i64) -> Result<(), LegacyKvError> {
        // TVM casts `n` to `size_t` and compares it with the fill count.
        if n < 0 || n > self.fill_count {
            return Err(LegacyKvError::PopN { n: n as u64, fill_count: self.fill_count });
        }
        Ok(())
    }

    /// `Clear`: no filled rows, the window back at row 0 (the reserve is kept).
    pub fn clear(&mut self) {
        self.fill_count = 0;
        self.window_attention_current_pos = 0;
    }

    /// `WindowOverride`: `value`'s rows written at the window position in a ring of
    /// `max_cache_size` rows; rows past the end wrap to row `num_attention_sinks`. The reserve
    /// grows (doubling) while the rows still fit in `max_cache_size`.
    pub fn window_override(
        &mut self,
        value: &NdArray,
        max_cache_size: i64,
        num_attention_sinks: i64,
    ) -> Result<(), LegacyKvError> {
        let op = if num_attention_sinks == 0 {
            "vm.builtin.attention_kv_cache_window_override"
        } else {
            "vm.builtin.attention_kv_cache_window_override_with_sinks"
        };
        self.check_dtype(op, value)?;
        if num_attention_sinks < 0 {
            return Err(LegacyKvError::Negative { op, what: "num_attention_sinks", value: num_attention_sinks });
        }
        if max_cache_size < 0 {
            return Err(LegacyKvError::Negative { op, what: "max_cache_size", value: max_cache_size });
        }
        self.check_dims(op, "value->shape", value.shape())?;
        let rows = value.shape()[0];
        let room = max_cache_size - num_attention_sinks;
        if rows > room {
            return Err(LegacyKvError::WindowTooSmall { op, rows, room });
        }
        let pos = self.window_attention_current_pos;
        let mut reserved = self.reserved();
        let filled = self.fill_count.saturating_add(rows);
        if filled <= max_cache_size {
            reserved = self.grown_reserve(op, filled)?;
        }
        let to_copy = rows.min(max_cache_size.saturating_sub(pos));
        let new_fill = filled.min(max_cache_size);
        let mut new_pos = pos.saturating_add(rows).min(max_cache_size);
        if to_copy > 0 {
            self.check_within_reserve(op, pos, to_copy, reserved)?;
        }
        let wrapped = rows - to_copy.max(0);
        if to_copy < rows {
            if new_fill != max_cache_size || new_pos != max_cache_size || to_copy < 0 {
                return Err(LegacyKvError::WindowState { op, fill_count: new_fill, position: pos, max_cache_size });
            }
            self.check_within_reserve(op, num_attention_sinks, wrapped, reserved)?;
            new_pos = wrapped + num_attention_sinks;
        }
        self.grow_to(reserved)?;
        if to_copy > 0 {
            self.copy_rows(value, 0, pos, to_copy)?;
        }
        if to_copy < rows {
            self.copy_rows(value, to_copy, num_attention_sinks, wrapped)?;
        }
        self.fill_count = new_fill;
        self.window_attention_current_pos = new_pos;
        Ok(())
    }
}

/// `vm.builtin.attention_kv_cache_create(init_data, reserve_shape, init_fill_count)`:
/// [`AttentionKvCacheLegacy::create`].
pub fn attention_kv_cache_create(
    init_data: &NdArray,
    reserve_shape: &[i64],
    init_fill_count: i64,
) -> Result<AttentionKvCacheLegacy, LegacyKvError> {
    AttentionKvCacheLegacy::create(init_data, reserve_shape, init_fill_count)
}

/// `vm.builtin.attention_kv_cache_update(cache, value) -> cache`:
/// [`AttentionKvCacheLegacy::update`] (TVM returns the same cache object).
pub fn attention_kv_cache_update(cache: &mut AttentionKvCacheLegacy, value: &NdArray) -> Result<(), LegacyKvError> {
    cache.update(value)
}

/// `vm.builtin.attention_kv_cache_append(cache, value) -> cache`:
/// [`AttentionKvCacheLegacy::append`] (TVM returns the same cache object).
pub fn attention_kv_cache_append(cache: &mut AttentionKvCacheLegacy, value: &NdArray) -> Result<(), LegacyKvError> {
    cache.append(value)
}

/// `vm.builtin.attention_kv_cache_window_override(cache, value, max_cache_size) -> cache`:
/// [`AttentionKvCacheLegacy::window_override`] without sinks.
pub fn attention_kv_cache_window_override(
    cache: &mut AttentionKvCacheLegacy,
    value: &NdArray,
    max_cache_size: i64,
) -> Result<(), LegacyKvError> {
    cache.window_override(value, max_cache_size, 0)
}

/// `vm.builtin.attention_kv_cache_window_override_with_sinks(cache, value, max_cache_size,
/// num_attention_sinks) -> cache`: [`AttentionKvCacheLegacy::window_override`].
pub fn attention_kv_cache_window_override_with_sinks(
    cache: &mut AttentionKvCacheLegacy,
    value: &NdArray,
    max_cache_size: i64,
    num_attention_sinks: i64,
) -> Result<(), LegacyKvError> {
    cache.window_override(value, max_cache_size, num_attention_sinks)
}

/// `vm.builtin.attention_kv_cache_view(cache[, shape]) -> tensor`: the filled rows, with
/// `shape` when given ([`AttentionKvCacheLegacy::view`]), else with the cache's dimensions
/// ([`AttentionKvCacheLegacy::view_filled`]). The tensor shares the cache's memory, as TVM's
/// `CreateView` does.
pub fn attention_kv_cache_view(
    cache: &AttentionKvCacheLegacy,
    shape: Option<&[i64]>,
) -> Result<NdArray, LegacyKvError> {
    match shape {
        Some(s) => cache.view(s),
        None => cache.view_filled(),
    }
}

/// `vm.builtin.attention_kv_cache_array_popn(caches, n)`: the last `n` rows dropped from each
/// cache. Every cache is checked first: a refused call changes none.
pub fn attention_kv_cache_array_popn(caches: &mut [&mut AttentionKvCacheLegacy], n: i64) -> Result<(), LegacyKvError> {
    for cache in caches.iter() {
        cache.check_pop(n)?;
    }
    for cache in caches.iter_mut() {
        cache.fill_count -= n;
    }
    Ok(())
}

/// `vm.builtin.attention_kv_cache_array_clear(caches)`: [`AttentionKvCacheLegacy::clear`] on
/// each cache.
pub fn attention_kv_cache_array_clear(caches: &mut [&mut AttentionKvCacheLegacy]) {
    for cache in caches.iter_mut() {
        cache.clear();
    }
}
