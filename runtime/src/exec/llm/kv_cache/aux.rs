//! One round of forwarding (`kv_state_begin_forward`): the positions the new tokens take in
//! the pages, and the auxiliary arrays the attention kernels read, built as TVM's
//! `BeginForward` and `SyncAuxArrayToDevice` build them (without token trees, which the cache
//! refuses).
//!
//! Attention runs per depth of the sequences' block chains: depth 0 holds each sequence's
//! first block (shared prefixes coalesced into one entry when the batch allows, so that a
//! prefix is read once), depth 1 the next one and everything after it. The kernels of a depth
//! get `qo_indptr`, `page_indptr`, `page_indices`, `last_page_len` (the length info) and
//! `k_rope_pos_offset`; all get `q_rope_position_map`, `append_position_map`, the append
//! lengths' indptr and `k_ragged_rope_pos_offset`. Every array is `int32`, as TVM's.
//!
//! With sliding windows the length info of a depth is `[3, n]`: the last page's length, where
//! the window starts in the pages and the sinks' length, per entry. A cache with per-layer
//! sliding layers also gives those layers the pages of the last `layer_sliding_window_size`
//! positions of each entry (`page_indptr`/`page_indices` of the window), their length info and
//! `k_rope_pos_offset`.

use crate::array::NdArray;
use crate::device::Device;
use crate::exec::relax::vm::value::VmError;
use crate::format::DataType;

use super::blocks::{Table, MAX_BLOCK_DEPTH};
use super::error::{check_cmp, check_false, unknown_sequence, KvCacheError};

/// The host side of one round: what `BeginForward` computes.
#[derive(Debug, Clone, Default)]
pub(super) struct Batch {
    /// How many tokens each appends.
    pub append_lengths: Vec<i64>,
    /// Depths the attention runs over (1 or 2).
    pub num_depths: usize,
    /// Whether the new keys and values go into the pages before attention (a decode batch:
    /// the paged kernels then see them), or after (a prefill: the ragged kernel handles the
    /// new tokens among themselves).
    pub append_before_attn: bool,
    /// Per depth: the decode kernel, else the prefill kernel.
    pub use_decode_kernel: Vec<bool>,
    /// Per depth: `qo_indptr`.
    pub qo_indptr: Vec<Vec<i32>>,
    /// Per depth: `page_indptr`.
    pub page_indptr: Vec<Vec<i32>>,
    /// Per depth: `page_indices`.
    pub page_indices: Vec<Vec<i32>>,
    /// Per depth: `last_page_len`.
    pub last_page_len: Vec<Vec<i32>>,
    /// Per depth: where the sliding window starts in each entry's pages.
    pub sliding_window_offset: Vec<Vec<i32>>,
    /// Per depth: each entry's attention sinks.
    pub sink_size: Vec<Vec<i32>>,
    /// Per depth, for per-layer sliding layers: `page_indptr` of the window's pages.
    pub page_indptr_sliding: Vec<Vec<i32>>,
    /// Per depth, for per-layer sliding layers: the window's pages.
    pub page_indices_sliding: Vec<Vec<i32>>,
    /// Per depth, for per-layer sliding layers: the window's start position in each entry.
    pub k_rope_pos_offset_sliding: Vec<Vec<i32>>,
    /// Per depth: `k_rope_pos_offset` (the start position of each block).
    pub k_rope_pos_offset: Vec<Vec<i32>>,
    /// Per sequence: its length before this round.
    pub k_ragged_rope_pos_offset: Vec<i32>,
    /// Per new token: its position in its sequence (for RoPE of the queries).
    pub q_rope_position_map: Vec<i32>,
    /// Per new token: where it goes in the pages (`page * page_size + offset`).
    pub append_position_map: Vec<i32>,
}

impl Batch {
    /// The total number of new tokens.
    pub(crate) fn total_append_length(&self) -> i64 {
        self.append_lengths.iter().sum()
    }
}

/// Per depth, the blocks of each sequence of the batch (`None` past a chain's end), and per
/// sequence the blocks past the last depth (TVM's `GetBlockIdsOnDepth`).
fn block_ids_on_depths(table: &Table, seq_ids: &[i64]) -> (Vec<Vec<Option<usize>>>, Vec<Vec<usize>>) {
    let traces: Vec<Vec<usize>> = seq_ids.iter().map(|id| table.trace(&table.seqs[id])).collect();
    let num_depths = traces.iter().map(|t| t.len().min(MAX_BLOCK_DEPTH)).max().unwrap_or(0);
    let on_depths = (0..num_depths).map(|d| traces.iter().map(|t| t.get(d).copied()).collect()).collect();
    let trailing = traces.iter().map(|t| t.iter().skip(MAX_BLOCK_DEPTH).copied().collect()).collect();
    (on_depths, trailing)
}

/// The (block, append length) entries of one depth, coalescing neighbours on the same block
/// unless the decode kernel is used or `enable_coalesce` is off, and whether the decode
/// kernel is used (TVM's `GetChunkedBlockIds`).
fn chunked_block_ids(
    table: &Table,
    block_ids: &[Option<usize>],
    enable_coalesce: bool,
    append_lengths: &[i64],
    is_decode_request: bool,
) -> (Vec<(Option<usize>, i64)>, bool) {
    let pages = |b: Option<usize>| b.map_or(0, |b| table.blocks[b].page_ids.len() as i64);
    let mut uncoalesced = Vec::with_capacity(block_ids.len());
    let mut coalesced = Vec::new();
    let mut cur = block_ids[0];
    let mut chunk = append_lengths[0];
    let mut pages_coalesced = 0i64;
    let mut pages_uncoalesced = pages(block_ids[0]);
    for i in 1..block_ids.len() {
        pages_uncoalesced += pages(block_ids[i]);
        uncoalesced.push((block_ids[i - 1], append_lengths[i - 1]));
        if block_ids[i] == cur {
            chunk += append_lengths[i];
        } else {
            coalesced.push((cur, chunk));
            pages_coalesced += pages(cur);
            cur = block_ids[i];
            chunk = append_lengths[i];
        }
    }
    uncoalesced.push((block_ids[block_ids.len() - 1], append_lengths[append_lengths.len() - 1]));
    coalesced.push((cur, chunk));
    pages_coalesced += pages(cur);
    let ratio = if pages_coalesced > 0 { pages_uncoalesced as f64 / pages_coalesced as f64 } else { 0.0 };
    let use_decode = is_decode_request && ratio < 32.0;
    (if use_decode || !enable_coalesce { uncoalesced } else { coalesced }, use_decode)
}

impl Table {
    /// TVM's `GetLayerSlidingWindowOffset`: where the per-layer window of a `length`-long
    /// entry starts in its first window page.
    fn layer_window_offset(&self, length: i64) -> i32 {
        match self.layer_sliding_window_size {
            Some(w) if length > w => ((length - w) % self.page_size) as i32,
            _ => 0,
        }
    }

    /// TVM's `GetLayerSlidingWindowNumPages`: the pages the per-layer window of a
    /// `length`-long entry spans (TVM's default window, 1024, without per-layer layers).
    fn layer_window_num_pages(&self, length: i64) -> i32 {
        if length == 0 {
            return 0;
        }
        let w = self.layer_sliding_window_size.unwrap_or(1024);
        let offset = if length > w { (length - w) % self.page_size } else { 0 };
        ((offset + length.min(w) + self.page_size - 1) / self.page_size) as i32
    }

    /// TVM's `BeginForward` for a batch that is a chain per sequence (no token tree). On an
    /// error the table is left as TVM leaves it (lengths already counted, pages taken so far
    /// kept).
    pub(crate) fn begin_forward(&mut self, seq_ids: &[i64], append_lengths: &[i64]) -> Result<Batch, KvCacheError> {
        if seq_ids.len() != append_lengths.len() {
            return Err(check_cmp(
                "seq_ids.size() == append_lengths.size()",
                seq_ids.len(),
                append_lengths.len(),
                format!(
                    "The seq_ids size ({}) and append_lengths size ({}) mismatch.",
                    seq_ids.len(),
                    append_lengths.len()
                ),
            ));
        }
        if seq_ids.is_empty() {
            return Err(check_false("!seq_ids.empty()", "BeginForward needs at least one sequence."));
        }
        // TVM finds out in `ReserveAppendLengthInSeq`, after it counted the lengths; a length
        // that is not positive is refused before anything changes here.
        if let Some(&len) = append_lengths.iter().find(|&&l| l <= 0 || l > i64::from(i32::MAX)) {
            return Err(check_cmp("append_length > 0", len, 0, "Append with length 0 is not allowed."));
        }
        let mut batch = Batch { append_lengths: append_lengths.to_vec(), ..Batch::default() };
        let mut is_decode_request = true;
        let mut last_block_length_before = Vec::with_capacity(seq_ids.len());
        for (&id, &len) in seq_ids.iter().zip(append_lengths) {
            let seq = self.seqs.get_mut(&id).ok_or_else(|| unknown_sequence(id))?;
            last_block_length_before.push(self.blocks[seq.last_block].seq_length);
            batch.k_ragged_rope_pos_offset.push(seq.seq_length as i32);
            seq.seq_length += len;
            if len != 1 {
                is_decode_request = false;
            }
        }
        let (on_depths, trailing) = block_ids_on_depths(self, seq_ids);
        batch.num_depths = on_depths.len().min(MAX_BLOCK_DEPTH);
        let mut chunked = Vec::with_capacity(batch.num_depths);
        for (d, ids) in on_depths.iter().take(batch.num_depths).enumerate() {
            let (c, use_decode) =
                chunked_block_ids(self, ids, d != MAX_BLOCK_DEPTH - 1, append_lengths, is_decode_request);
            chunked.push(c);
            batch.use_decode_kernel.push(use_decode);
        }
        batch.append_before_attn =
            !self.support_sliding_window && batch.use_decode_kernel.last().copied().unwrap_or(false);

        if batch.append_before_attn {
            for (&id, &len) in seq_ids.iter().zip(append_lengths) {
                self.reserve_append(id, len)?;
            }
        }
        let ps = self.page_size;
        for (d, entries) in chunked.iter().enumerate() {
            let mut qo_indptr = vec![0i32];
            let mut page_indptr = vec![0i32];
            let mut page_indices = Vec::new();
            let mut last_page_len = Vec::new();
            let mut window_offset = Vec::new();
            let mut sink_size = Vec::new();
            let mut k_rope_pos_offset = Vec::new();
            let mut page_indptr_sliding = vec![0i32];
            let mut page_indices_sliding = Vec::new();
            let mut k_rope_pos_offset_sliding = Vec::new();
            for (i, &(block, chunk)) in entries.iter().enumerate() {
                qo_indptr.push(qo_indptr[qo_indptr.len() - 1] + chunk as i32);
                let Some(b) = block else {
                    page_indptr.push(page_indptr[page_indptr.len() - 1]);
                    page_indptr_sliding.push(page_indptr_sliding[page_indptr_sliding.len() - 1]);
                    last_page_len.push(0);
                    window_offset.push(0);
                    sink_size.push(0);
                    k_rope_pos_offset.push(0);
                    k_rope_pos_offset_sliding.push(0);
                    continue;
                };
                let block = &self.blocks[b];
                let mut num_pages = block.page_ids.len() as i32;
                let mut length = block.seq_length;
                let mut last = b;
                page_indices.extend_from_slice(&block.page_ids);
                if d == MAX_BLOCK_DEPTH - 1 {
                    // The last depth takes the blocks past it too (entries are per sequence
                    // here: this depth is never coalesced).
                    for &t in &trailing[i] {
                        page_indices.extend_from_slice(&self.blocks[t].page_ids);
                        num_pages += self.blocks[t].page_ids.len() as i32;
                        length += self.blocks[t].seq_length;
                        last = t;
                    }
                }
                page_indptr.push(page_indptr[page_indptr.len() - 1] + num_pages);
                // The pages of the per-layer window: the last ones.
                let window_pages = self.layer_window_num_pages(length).clamp(0, num_pages) as usize;
                page_indptr_sliding.push(page_indptr_sliding[page_indptr_sliding.len() - 1] + window_pages as i32);
                page_indices_sliding.extend_from_slice(&page_indices[page_indices.len() - window_pages..]);
                let last = &self.blocks[last];
                last_page_len.push(if length == 0 {
                    0
                } else {
                    ((length - last.sink_length + last.sliding_window_offset - 1) % ps + 1) as i32
                });
                window_offset.push(if self.layer_sliding_window_size.is_some() {
                    self.layer_window_offset(length)
                } else {
                    last.sliding_window_offset as i32
                });
                sink_size.push(last.sink_length as i32);
                k_rope_pos_offset.push(block.start_pos as i32);
                if let Some(w) = self.layer_sliding_window_size {
                    k_rope_pos_offset_sliding.push((block.start_pos + length - w).max(0) as i32);
                }
            }
            batch.qo_indptr.push(qo_indptr);
            batch.page_indptr.push(page_indptr);
            batch.page_indices.push(page_indices);
            batch.last_page_len.push(last_page_len);
            batch.sliding_window_offset.push(window_offset);
            batch.sink_size.push(sink_size);
            batch.k_rope_pos_offset.push(k_rope_pos_offset);
            batch.page_indptr_sliding.push(page_indptr_sliding);
            batch.page_indices_sliding.push(page_indices_sliding);
            batch.k_rope_pos_offset_sliding.push(k_rope_pos_offset_sliding);
        }
        if !batch.append_before_attn {
            for (&id, &len) in seq_ids.iter().zip(append_lengths) {
                self.reserve_append(id, len)?;
            }
        }
        for (i, (&id, &len)) in seq_ids.iter().zip(append_lengths).enumerate() {
            let block = &self.blocks[self.seqs[&id].last_block];
            let page_of = |offset: i64| -> Result<i32, KvCacheError> {
                let page = block.page_ids.get((offset / ps) as usize).ok_or_else(|| {
                    check_false("offset_in_block / page_size_ < block.page_ids.size()", "a position past the pages")
                })?;
                Ok(page * ps as i32 + (offset % ps) as i32)
            };
            for pos in 0..len {
                batch.q_rope_position_map.push(batch.k_ragged_rope_pos_offset[i].wrapping_add(pos as i32));
                let in_block = block.seq_length - len + pos;
                let slot = if last_block_length_before[i] + pos < block.sink_length {
                    // Part of the attention sinks.
                    page_of(last_block_length_before[i] + pos)?
                } else if in_block < block.sink_length {
                    // Pinned by the sinks before this append: not written.
                    -1
                } else {
                    page_of(in_block - block.sink_length + block.sliding_window_offset)?
                };
                batch.append_position_map.push(slot);
            }
        }
        Ok(batch)
    }
}

/// The arrays of one depth, on the cache's device.
#[derive(Debug, Clone)]
pub(super) struct DepthArrays {
    pub qo_indptr: NdArray,
    pub page_indptr: NdArray,
    /// `None` when the depth has no page (TVM skips the depth then).
    pub page_indices: Option<NdArray>,
    /// `last_page_len`, or `[3, n]` with the windows' offsets and sinks in a sliding cache.
    pub length_info: NdArray,
    pub k_rope_pos_offset: NdArray,
    /// For per-layer sliding layers.
    pub sliding: Option<LayerWindowArrays>,
}

/// The arrays of one depth that per-layer sliding layers read instead.
#[derive(Debug, Clone)]
pub(super) struct LayerWindowArrays {
    pub page_indptr: NdArray,
    pub page_indices: NdArray,
    /// `[3, n]`.
    pub length_info: NdArray,
    pub k_rope_pos_offset: NdArray,
}

/// The auxiliary arrays of a round, as the kernels get them.
#[derive(Debug, Clone)]
pub(super) struct AuxArrays {
    pub q_rope_position_map: NdArray,
    pub append_position_map: NdArray,
    pub cur_append_length_indptr: NdArray,
    pub k_ragged_rope_pos_offset: NdArray,
    pub depths: Vec<DepthArrays>,
}

/// An `int32` vector as a 1-D tensor on `device` (copied there from the host, as TVM's aux
/// data managers copy their host staging buffers in `CopyTo*Async`).
pub(super) fn int32_array(v: &[i32], device: Device) -> Result<NdArray, VmError> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Ok(NdArray::from_bytes(&bytes, &[v.len() as i64], DataType::I32, device)?)
}

impl AuxArrays {
    /// The arrays of `batch` on `device` (TVM's `SyncAuxArrayToDevice`: computed on the host,
    /// then copied to the device once per round).
    /// `sliding` and `layer_sliding`: whether the cache supports sliding windows and has
    /// per-layer sliding layers.
    pub(crate) fn new(batch: &Batch, device: Device, sliding: bool, layer_sliding: bool) -> Result<AuxArrays, VmError> {
        let int32_array = |v: &[i32]| int32_array(v, device);
        let mut indptr = vec![0i32];
        for &l in &batch.append_lengths {
            indptr.push(indptr[indptr.len() - 1] + l as i32);
        }
        let length_info_3 = |d: usize| {
            let mut v = batch.last_page_len[d].clone();
            v.extend_from_slice(&batch.sliding_window_offset[d]);
            v.extend_from_slice(&batch.sink_size[d]);
            let n = batch.last_page_len[d].len() as i64;
            int32_array(&v)?.view(&[3, n], DataType::I32).map_err(VmError::from)
        };
        let depths = (0..batch.num_depths)
            .map(|d| {
                let sliding_arrays = if layer_sliding {
                    Some(LayerWindowArrays {
                        page_indptr: int32_array(&batch.page_indptr_sliding[d])?,
                        page_indices: int32_array(&batch.page_indices_sliding[d])?,
                        length_info: length_info_3(d)?,
                        k_rope_pos_offset: int32_array(&batch.k_rope_pos_offset_sliding[d])?,
                    })
                } else {
                    None
                };
                Ok(DepthArrays {
                    qo_indptr: int32_array(&batch.qo_indptr[d])?,
                    page_indptr: int32_array(&batch.page_indptr[d])?,
                    page_indices: if batch.page_indices[d].is_empty() {
                        None
                    } else {
                        Some(int32_array(&batch.page_indices[d])?)
                    },
                    length_info: if sliding { length_info_3(d)? } else { int32_array(&batch.last_page_len[d])? },
                    k_rope_pos_offset: int32_array(&batch.k_rope_pos_offset[d])?,
                    sliding: sliding_arrays,
                })
            })
            .collect::<Result<Vec<_>, VmError>>()?;
        Ok(AuxArrays {
            q_rope_position_map: int32_array(&batch.q_rope_position_map)?,
            append_position_map: int32_array(&batch.append_position_map)?,
            cur_append_length_indptr: int32_array(&indptr)?,
            k_ragged_rope_pos_offset: int32_array(&batch.k_ragged_rope_pos_offset)?,
            depths,
        })
    }
}
