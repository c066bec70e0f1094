//! Pages, blocks and sequences: TVM's bookkeeping of the paged KV cache
//! (`paged_kv_cache.cc`, `attn_utils.h`), without the KV data.
//!
//! A sequence is a chain of blocks from its last block up through parent links; a block holds
//! pages (of `page_size` positions each) and the length it covers. Sequences forked from one
//! another share their common prefix blocks (a block's `ref_cnt` counts the sequences and
//! child blocks that use it); only a block referenced once may grow. Pages come from a free
//! list (a stack, the last freed first), blocks from a pool with its own free list, as in TVM,
//! so that page ids, and with them the aux arrays the kernels get, are TVM's.

use std::collections::HashMap;

use super::error::{check_cmp, check_false, out_of_pages, unknown_sequence, KvCacheError};
#[cfg(test)]
use crate::exec::relax::vm::value::VmError;

/// TVM's `kPagedKVCacheMaxBlockDepth`: attention runs per depth of the block chains, at most
/// this many (deeper blocks are folded into the last depth).
pub(super) const MAX_BLOCK_DEPTH: usize = 2;

/// TVM's `kPagedKVCacheTempPageId`: a page a sliding sequence borrows while no page is free,
/// replaced by a real one once the window slid.
const TEMP_PAGE: i32 = -1;

/// A block of a sequence's chain (TVM's `Block`).
#[derive(Debug, Clone, Default)]
pub(super) struct Block {
    /// The pages, in order.
    pub page_ids: Vec<i32>,
    /// Positions the block covers.
    pub seq_length: i64,
    /// The position of its first entry in the sequence.
    pub start_pos: i64,
    /// The parent block, `None` at the root.
    pub parent: Option<usize>,
    /// Sequences and child blocks that use it.
    pub ref_cnt: i64,
    /// Its first positions pinned as attention sinks once its sequence slides.
    pub sink_length: i64,
    /// Where the sliding window starts in its pages (0 without a sliding window).
    pub sliding_window_offset: i64,
}

impl Block {
    /// Where position `i` of the block lies in its pages, counted from the first page's start:
    /// sinks in place, the rest shifted by the window's offset (TVM's mapping in `DebugGetKV`).
    pub(crate) fn offset_of(&self, i: i64) -> i64 {
        if i < self.sink_length {
            i
        } else {
            i - self.sink_length + self.sliding_window_offset
        }
    }
}

/// A sequence: its last block and its length (TVM's `Sequence`).
#[derive(Debug, Clone)]
pub(super) struct Sequence {
    /// The last block of its chain.
    pub last_block: usize,
    /// Its length (the sum over its chain).
    pub seq_length: i64,
    /// Its sliding window, -1 for none.
    pub sliding_window_size: i64,
    /// The attention sinks of its last block.
    pub last_block_attn_sink_size: i64,
}

/// The page table: blocks, free pages and the sequences.
#[derive(Debug)]
pub(super) struct Table {
    pub page_size: i64,
    /// Whether sequences may slide (TVM's `support_sliding_window_`).
    pub support_sliding_window: bool,
    /// The window of per-layer sliding layers, when the cache has such layers.
    pub layer_sliding_window_size: Option<i64>,
    pub num_total_pages: i64,
    pub blocks: Vec<Block>,
    pub free_blocks: Vec<usize>,
    pub free_pages: Vec<i32>,
    pub seqs: HashMap<i64, Sequence>,
}

impl Table {
    /// An empty table of `num_total_pages` pages of `page_size`.
    pub(crate) fn new(
        page_size: i64,
        num_total_pages: i64,
        support_sliding_window: bool,
        layer_sliding_window_size: Option<i64>,
    ) -> Table {
        let mut t = Table {
            page_size,
            support_sliding_window,
            layer_sliding_window_size,
            num_total_pages,
            blocks: Vec::new(),
            free_blocks: Vec::new(),
            free_pages: Vec::new(),
            seqs: HashMap::new(),
        };
        t.clear();
        t
    }

    /// Drops every sequence and frees every page (TVM's `Clear`).
    pub(crate) fn clear(&mut self) {
        self.seqs.clear();
        // TVM pushes the ids from the last down, so that page 0 is handed out first.
        self.free_pages = (0..self.num_total_pages as i32).rev().collect();
        self.blocks.clear();
        self.free_blocks.clear();
    }

    /// A page off the free list (TVM's `GetFreePage`).
    pub(crate) fn free_page(&mut self) -> Result<i32, KvCacheError> {
        self.free_pages.pop().ok_or_else(out_of_pages)
    }

    /// A reset block from the pool (TVM's `GetFreeBlock`).
    pub(crate) fn free_block(&mut self) -> usize {
        match self.free_blocks.pop() {
            Some(i) => {
                self.blocks[i] = Block::default();
                i
            }
            None => {
                self.blocks.push(Block::default());
                self.blocks.len() - 1
            }
        }
    }

    /// A sequence ending at `last_block`: takes a reference to the block and sums its chain.
    fn new_sequence(&mut self, last_block: usize) -> Sequence {
        self.blocks[last_block].ref_cnt += 1;
        let mut seq_length = 0;
        let mut b = Some(last_block);
        while let Some(i) = b {
            seq_length += self.blocks[i].seq_length;
            b = self.blocks[i].parent;
        }
        Sequence { last_block, seq_length, sliding_window_size: -1, last_block_attn_sink_size: 0 }
    }

    /// The blocks of a sequence's chain, from the root to its last block.
    pub(crate) fn trace(&self, seq: &Sequence) -> Vec<usize> {
        let mut trace = Vec::new();
        let mut b = Some(seq.last_block);
        while let Some(i) = b {
            trace.push(i);
            b = self.blocks[i].parent;
        }
        trace.reverse();
        trace
    }

    /// The sequence `seq_id`, or TVM's error.
    pub(crate) fn seq(&self, seq_id: i64) -> Result<&Sequence, KvCacheError> {
        self.seqs.get(&seq_id).ok_or_else(|| unknown_sequence(seq_id))
    }

    /// TVM's `AddSequence`.
    pub(crate) fn add_sequence(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
        if self.seqs.contains_key(&seq_id) {
            return Err(check_false(
                "seq_map_.find(seq_id) == seq_map_.end()",
                format!("The sequence \"{seq_id}\" is already in the KV cache."),
            ));
        }
        let block = self.free_block();
        let seq = self.new_sequence(block);
        self.seqs.insert(seq_id, seq);
        Ok(())
    }

    /// TVM's `RemoveSequence`: frees the blocks (and their pages) only this sequence used.
    pub(crate) fn remove_sequence(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
        let seq = self.seq(seq_id)?.clone();
        let mut b = Some(seq.last_block);
        while let Some(i) = b.filter(|&i| self.blocks[i].ref_cnt == 1) {
            let pages = std::mem::take(&mut self.blocks[i].page_ids);
            self.free_pages.extend(pages);
            self.free_blocks.push(i);
            b = self.blocks[i].parent;
        }
        if let Some(i) = b {
            self.blocks[i].ref_cnt -= 1;
        }
        self.seqs.remove(&seq_id);
        Ok(())
    }

    /// TVM's `ForkSequence`: `child_id` shares `parent_id`'s first `fork_pos` positions (its
    /// whole length for -1). A fork inside a page gives the child a copy of that page's first
    /// positions, made by `copy_page(src, dst, length)` (the library's `copy_single_page`).
    pub(crate) fn fork_sequence(
        &mut self,
        parent_id: i64,
        child_id: i64,
        fork_pos: i64,
        copy_page: &mut dyn FnMut(i32, i32, i64) -> Result<(), crate::exec::relax::vm::value::VmError>,
    ) -> Result<(), crate::exec::relax::vm::value::VmError> {
        let Some(parent) = self.seqs.get(&parent_id).cloned() else {
            return Err(check_false(
                "parent_it != seq_map_.end()",
                format!("The parent sequence \"{parent_id}\" cannot be found in KV cache."),
            )
            .into());
        };
        if self.seqs.contains_key(&child_id) {
            return Err(check_false(
                "seq_map_.find(child_seq_id) == seq_map_.end()",
                format!("The child sequence \"{child_id}\" is already in the KV cache."),
            )
            .into());
        }
        if fork_pos < -1 {
            return Err(check_cmp(
                "fork_pos >= -1",
                fork_pos,
                -1,
                "The forked position should be non-negative, or -1 for last position as default.",
            )
            .into());
        }
        if fork_pos > parent.seq_length {
            return Err(check_cmp(
                "fork_pos <= parent_it->second.seq_length",
                fork_pos,
                parent.seq_length,
                "The forked position should not exceed the total length of parent sequence.",
            )
            .into());
        }
        let fork_pos = if fork_pos == -1 { parent.seq_length } else { fork_pos };
        if parent.sliding_window_size != -1 {
            let sink_size =
                parent.seq_length - self.blocks[parent.last_block].seq_length + parent.last_block_attn_sink_size;
            if fork_pos > sink_size {
                return Err(check_cmp(
                    "fork_pos <= sink_size",
                    fork_pos,
                    sink_size,
                    format!(
                        "The parent sequence \"{parent_id}\" is enabled with sliding window and thus only can be forked within sink size = {sink_size}. But the forked position = {fork_pos}."
                    ),
                )
                .into());
            }
        }
        let ps = self.page_size;

        if fork_pos == parent.seq_length && fork_pos % ps == 0 && self.blocks[parent.last_block].seq_length > 0 {
            // The parent goes on in a new empty block, so that what it decodes next does not
            // land in the block the child shares.
            let nb = self.free_block();
            self.blocks[nb].start_pos = parent.seq_length;
            self.blocks[nb].parent = Some(parent.last_block);
            self.blocks[nb].ref_cnt = 1;
            if let Some(p) = self.seqs.get_mut(&parent_id) {
                p.last_block = nb;
            }
        }
        let parent = self.seqs[&parent_id].clone();

        let child_block = self.free_block();
        let trace = self.trace(&parent);
        let mut in_block_offset = fork_pos;
        let last = trace.last().copied();
        for forked in trace {
            if Some(forked) != last {
                let len = self.blocks[forked].seq_length;
                if len <= 0 || len % ps != 0 {
                    return Err(KvCacheError::Check(format!(
                        "block {forked} of the chain of sequence {parent_id} has length {len}, which is not a positive multiple of the page size {ps}"
                    ))
                    .into());
                }
                if len <= in_block_offset {
                    in_block_offset -= len;
                    continue;
                }
            }
            let in_page_offset = in_block_offset % ps;
            let moved_offset = in_block_offset - in_page_offset;
            let moved_pages = (moved_offset / ps) as usize;
            if moved_pages == 0 {
                // Forked in the block's first page: the child hangs off the block's parent.
                let pb = self.blocks[forked].parent;
                if let Some(pb) = pb {
                    self.blocks[pb].ref_cnt += 1;
                }
                self.blocks[child_block].parent = pb;
            } else {
                // Forked further in: the leading pages move to a new block that both share.
                let pb = self.free_block();
                self.blocks[pb].parent = self.blocks[forked].parent;
                self.blocks[forked].parent = Some(pb);
                self.blocks[child_block].parent = Some(pb);
                self.blocks[pb].ref_cnt = 2;
                if moved_pages > self.blocks[forked].page_ids.len() {
                    return Err(KvCacheError::Check(format!(
                        "fork of sequence {parent_id} at {fork_pos}: block {forked} has {} pages, fewer than the {moved_pages} to share (its length was never filled)",
                        self.blocks[forked].page_ids.len()
                    ))
                    .into());
                }
                let moved: Vec<i32> = self.blocks[forked].page_ids.drain(..moved_pages).collect();
                self.blocks[pb].page_ids = moved;
                self.blocks[pb].start_pos = self.blocks[forked].start_pos;
                self.blocks[forked].start_pos += moved_offset;
                self.blocks[pb].seq_length = moved_offset;
                self.blocks[forked].seq_length -= moved_offset;
                let p = &self.seqs[&parent_id];
                if p.sliding_window_size != -1 && forked == p.last_block {
                    if moved_offset > p.last_block_attn_sink_size {
                        return Err(check_cmp(
                            "moved_offset <= parent_it->second.last_block_attn_sink_size",
                            moved_offset,
                            p.last_block_attn_sink_size,
                            "",
                        )
                        .into());
                    }
                    if let Some(p) = self.seqs.get_mut(&parent_id) {
                        p.last_block_attn_sink_size -= moved_offset;
                    }
                }
            }
            self.blocks[child_block].start_pos = fork_pos - in_page_offset;
            self.blocks[child_block].seq_length = in_page_offset;
            if in_page_offset > 0 {
                // The shared part of the page is copied into a page of the child's own.
                let src = self.blocks[forked].page_ids.first().copied().ok_or_else(|| {
                    KvCacheError::Check(format!("block {forked} of sequence {parent_id} has no page to fork from"))
                })?;
                let dst = self.free_page()?;
                self.blocks[child_block].page_ids.push(dst);
                copy_page(src, dst, in_page_offset)?;
            }
            break;
        }
        let seq = self.new_sequence(child_block);
        self.seqs.insert(child_id, seq);
        Ok(())
    }

    /// TVM's `PopN`: drops the last `n` positions of `seq_id`; past the blocks it owns alone,
    /// into a shared prefix, by forking the kept part off and removing the old sequence.
    pub(crate) fn popn(
        &mut self,
        seq_id: i64,
        n: i64,
        copy_page: &mut dyn FnMut(i32, i32, i64) -> Result<(), crate::exec::relax::vm::value::VmError>,
    ) -> Result<(), crate::exec::relax::vm::value::VmError> {
        let seq_length = self.seq(seq_id)?.seq_length;
        if n < 0 {
            return Err(check_cmp("n >= 0", n, 0, format!("The length of popping {n} cannot be negative.")).into());
        }
        if n > seq_length {
            return Err(check_cmp(
                "n <= it->second.seq_length",
                n,
                seq_length,
                format!(
                    "The sequence only has length {seq_length}, while the length of pop is {n} which exceeds the whole sequence length."
                ),
            )
            .into());
        }
        if n == 0 {
            return Ok(());
        }
        // After a round that failed for want of pages the sequence is longer than its blocks
        // (TVM counts the lengths first); TVM's pop would then walk off the chain.
        let held: i64 = self.trace(&self.seqs[&seq_id]).iter().map(|&i| self.blocks[i].seq_length).sum();
        if held != seq_length {
            return Err(KvCacheError::Check(format!(
                "popn of sequence {seq_id}: its length is {seq_length} but its blocks hold {held} (a round that failed for want of pages)"
            ))
            .into());
        }
        let mut n = n;
        let mut b = Some(self.seqs[&seq_id].last_block);
        while let Some(i) = b.filter(|&i| self.blocks[i].ref_cnt == 1) {
            let len = self.blocks[i].seq_length;
            if n > len {
                n -= len;
                let pages = std::mem::take(&mut self.blocks[i].page_ids);
                self.free_pages.extend(pages);
                self.free_blocks.push(i);
                b = self.blocks[i].parent;
                if let Some(s) = self.seqs.get_mut(&seq_id) {
                    s.seq_length -= len;
                    // TVM keeps the index -1 only transiently: the fork below replaces it.
                    s.last_block = b.unwrap_or(usize::MAX);
                }
                continue;
            }
            let target = (len - n + self.page_size - 1) / self.page_size;
            while self.blocks[i].page_ids.len() as i64 > target {
                if let Some(p) = self.blocks[i].page_ids.pop() {
                    self.free_pages.push(p);
                }
            }
            self.blocks[i].seq_length -= n;
            if let Some(s) = self.seqs.get_mut(&seq_id) {
                s.seq_length -= n;
            }
            n = 0;
            break;
        }
        if n > 0 {
            // The rest lies in blocks shared with other sequences: fork the kept prefix into
            // a temporary sequence, drop this one, and give the fork this one's id.
            let temp = (-1i64).wrapping_sub(seq_id);
            if self.seqs.contains_key(&temp) {
                return Err(KvCacheError::Check(format!(
                    "popn of sequence {seq_id}: the temporary sequence id {temp} is in use"
                ))
                .into());
            }
            let keep = self.seqs[&seq_id].seq_length - n;
            self.fork_sequence(seq_id, temp, keep, copy_page)?;
            self.remove_sequence_after_pop(seq_id)?;
            if let Some(s) = self.seqs.remove(&temp) {
                self.seqs.insert(seq_id, s);
            }
        }
        Ok(())
    }

    /// TVM's `EnableSlidingWindowForSeq`: from now on the sequence keeps its first
    /// `attn_sink_size` positions and its last `sliding_window_size` ones; the blocks it shares
    /// with others count as sinks already.
    pub(crate) fn enable_sliding_window(
        &mut self,
        seq_id: i64,
        sliding_window_size: i64,
        attn_sink_size: i64,
        supported: bool,
    ) -> Result<(), KvCacheError> {
        if !supported {
            return Err(check_false(
                "support_sliding_window_ || support_layer_sliding_window_",
                "The KV cache does not support sliding window.",
            ));
        }
        let seq = self.seqs.get(&seq_id).ok_or_else(|| unknown_sequence(seq_id))?;
        if attn_sink_size < 0 {
            return Err(check_cmp(
                "attn_sink_size >= 0",
                attn_sink_size,
                0,
                "The specified attention sink size is expected to be non negative",
            ));
        }
        if sliding_window_size <= 0 {
            return Err(check_cmp(
                "sliding_window_size > 0",
                sliding_window_size,
                0,
                "The specified sliding window size should be positive.",
            ));
        }
        if attn_sink_size >= sliding_window_size {
            return Err(check_cmp(
                "attn_sink_size < sliding_window_size",
                attn_sink_size,
                sliding_window_size,
                "The attn sink size should be less than the sliding window size.",
            ));
        }
        if seq.sliding_window_size != -1 {
            return Err(check_cmp(
                "it->second.sliding_window_size == -1",
                seq.sliding_window_size,
                -1,
                "A sequence cannot be enabled twice for sliding window.",
            ));
        }
        let prefix_length = seq.seq_length - self.blocks[seq.last_block].seq_length;
        if let Some(seq) = self.seqs.get_mut(&seq_id) {
            seq.last_block_attn_sink_size = (attn_sink_size - prefix_length).max(0);
            seq.sliding_window_size = sliding_window_size;
        }
        Ok(())
    }

    /// TVM's `SlideWindowForSequence`: past its window, a sliding sequence drops the positions
    /// after its sinks that fell out, freeing the pages they filled.
    fn slide_window(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
        let seq = self.seqs[&seq_id].clone();
        if seq.sliding_window_size == -1 || !self.support_sliding_window || seq.seq_length <= seq.sliding_window_size {
            return Ok(());
        }
        let ps = self.page_size;
        let length_to_slide = seq.seq_length - seq.sliding_window_size;
        let block = &mut self.blocks[seq.last_block];
        if seq.last_block_attn_sink_size > 0 && block.sink_length == 0 {
            // The first slide: the sinks are pinned where they are.
            block.sink_length = seq.last_block_attn_sink_size;
            block.sliding_window_offset = seq.last_block_attn_sink_size;
        }
        let num_sink_pages = ((block.sink_length + ps - 1) / ps) as usize;
        let mut page_after = ((block.sliding_window_offset + length_to_slide) / ps) as usize;
        let start_after = (block.sliding_window_offset + length_to_slide) % ps;
        if page_after > num_sink_pages && page_after > block.page_ids.len() {
            return Err(check_false(
                "page_idx_after_sliding <= block.page_ids.size()",
                "the window would slide past the sequence's pages",
            ));
        }
        while page_after > num_sink_pages {
            let p = block.page_ids.remove(num_sink_pages);
            if p != TEMP_PAGE {
                self.free_pages.push(p);
            }
            page_after -= 1;
        }
        if page_after + 1 != num_sink_pages && page_after != num_sink_pages {
            return Err(check_false(
                "page_idx_after_sliding == num_sink_pages - 1 || page_idx_after_sliding == num_sink_pages",
                "",
            ));
        }
        block.seq_length -= length_to_slide;
        block.sliding_window_offset = page_after as i64 * ps + start_after;
        let pages_needed = (block.sliding_window_offset + (block.seq_length - block.sink_length) + ps - 1) / ps;
        if block.seq_length < block.sink_length
            || block.sliding_window_offset < block.sink_length
            || pages_needed != block.page_ids.len() as i64
        {
            return Err(check_false("block.seq_length >= block.sink_length", "the window slid out of its pages"));
        }
        if let Some(s) = self.seqs.get_mut(&seq_id) {
            s.seq_length = s.sliding_window_size;
        }
        Ok(())
    }

    /// TVM's `ReserveAppendLengthInSeq`: pages for `append_length` more positions in the
    /// sequence's last block, then the slide of its window (a sliding sequence may borrow
    /// [`TEMP_PAGE`]s while no page is free, replaced after the slide).
    pub(crate) fn reserve_append(&mut self, seq_id: i64, append_length: i64) -> Result<(), KvCacheError> {
        let seq = &self.seqs[&seq_id];
        let (b, sliding) = (seq.last_block, seq.sliding_window_size != -1 && self.support_sliding_window);
        if append_length <= 0 {
            return Err(check_cmp("append_length > 0", append_length, 0, "Append with length 0 is not allowed."));
        }
        let refs = self.blocks[b].ref_cnt;
        if refs != 1 {
            return Err(check_cmp(
                "block.external_ref_cnt == 1",
                refs,
                1,
                format!("The block is {}-time referenced by other blocks, thus cannot accept new KV values.", refs - 1),
            ));
        }
        let block = &self.blocks[b];
        let target =
            (block.seq_length - block.sink_length + block.sliding_window_offset + append_length + self.page_size - 1)
                / self.page_size;
        while (self.blocks[b].page_ids.len() as i64) < target {
            let p = if self.free_pages.is_empty() && sliding { TEMP_PAGE } else { self.free_page()? };
            self.blocks[b].page_ids.push(p);
        }
        self.blocks[b].seq_length += append_length;
        let replaced = self.slide_window(seq_id).and_then(|()| {
            for i in 0..self.blocks[b].page_ids.len() {
                if self.blocks[b].page_ids[i] == TEMP_PAGE {
                    self.blocks[b].page_ids[i] = self.free_page()?;
                }
            }
            Ok(())
        });
        if replaced.is_err() {
            // TVM fails here with the borrowed pages in the block; mblob drops them, so that no
            // kernel ever gets page -1 (the block is then shorter in pages than in length, as
            // after any round that ran out of pages).
            self.blocks[b].page_ids.retain(|&p| p != TEMP_PAGE);
        }
        replaced
    }

    /// `RemoveSequence` of a sequence whose last block `PopN` already freed (TVM walks from
    /// the block it left, which may be the freed ones' parent).
    fn remove_sequence_after_pop(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
        self.remove_sequence(seq_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sliding windows, forks, pops and rounds in any order on a small table: TVM's errors
    /// (or success), never a panic, and the page count kept (no page lost or doubled).
    #[test]
    fn sliding_sequences_under_random_calls_keep_the_pages() {
        for (page_size, mut seed) in [(4, 0x2545_f491_4f6c_dd1du64), (16, 7), (4, 0x9e37_79b9_7f4a_7c15)] {
            let mut next = |n: i64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % n as u64) as i64
            };
            let mut t = Table::new(page_size, 12, true, None);
            for _ in 0..3000 {
                let id = next(4);
                let _ = match next(7) {
                    0 => t.add_sequence(id).map_err(VmError::from),
                    1 => t.enable_sliding_window(id, 1 + next(40), next(8), true).map_err(VmError::from),
                    2 => t.begin_forward(&[id], &[1 + next(20)]).map(|_| ()).map_err(VmError::from),
                    3 => t.fork_sequence(id, next(4), next(30) - 1, &mut |_, _, _| Ok(())),
                    4 => t.popn(id, next(10), &mut |_, _, _| Ok(())),
                    5 => t.remove_sequence(id).map_err(VmError::from),
                    _ => t.begin_forward(&[0, 1], &[1, 1]).map(|_| ()).map_err(VmError::from),
                };
                let held: usize = t
                    .blocks
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !t.free_blocks.contains(i))
                    .map(|(_, b)| b.page_ids.len())
                    .sum();
                assert!(t.blocks.iter().all(|b| b.page_ids.iter().all(|&p| p != TEMP_PAGE)));
                assert_eq!(held + t.free_pages.len(), 12, "pages lost or doubled");
            }
        }
    }
}
