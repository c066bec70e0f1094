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

/// TVM's `kPagedKVCacheMaxBlockDepth`: attention runs per depth of the block chains, at most
/// this many (deeper blocks are folded into the last depth).
pub(super) const MAX_BLOCK_DEPTH: usize = 2;

/// A block of a sequence's chain (TVM's `Block`, without sliding-window fields).
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
}

/// A sequence: its last block and its length (TVM's `Sequence`).
#[derive(Debug, Clone)]
pub(super) struct Sequence {
    /// The last block of its chain.
    pub last_block: usize,
    /// Its length (the sum over its chain).
    pub seq_length: i64,
}

/// The page table: blocks, free pages and the sequences.
#[derive(Debug)]
pub(super) struct Table {
    pub page_size: i64,
    pub num_total_pages: i64,
    pub blocks: Vec<Block>,
    pub free_blocks: Vec<usize>,
    pub free_pages: Vec<i32>,
    pub seqs: HashMap<i64, Sequence>,
}

impl Table {
    /// An empty table of `num_total_pages` pages of `page_size`.
    pub fn new(page_size: i64, num_total_pages: i64) -> Table {
        let mut t = Table {
            page_size,
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
    pub fn clear(&mut self) {
        self.seqs.clear();
        // TVM pushes the ids from the last down, so that page 0 is handed out first.
        self.free_pages = (0..self.num_total_pages as i32).rev().collect();
        self.blocks.clear();
        self.free_blocks.clear();
    }

    /// A page off the free list (TVM's `GetFreePage`).
    pub fn free_page(&mut self) -> Result<i32, KvCacheError> {
        self.free_pages.pop().ok_or_else(out_of_pages)
    }

    /// A reset block from the pool (TVM's `GetFreeBlock`).
    pub fn free_block(&mut self) -> usize {
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
        Sequence { last_block, seq_length }
    }

    /// The blocks of a sequence's chain, from the root to its last block.
    pub fn trace(&self, seq: &Sequence) -> Vec<usize> {
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
    pub fn seq(&self, seq_id: i64) -> Result<&Sequence, KvCacheError> {
        self.seqs.get(&seq_id).ok_or_else(|| unknown_sequence(seq_id))
    }

    /// TVM's `AddSequence`.
    pub fn add_sequence(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
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
    pub fn remove_sequence(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
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
    pub fn fork_sequence(
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
    pub fn popn(
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

    /// `RemoveSequence` of a sequence whose last block `PopN` already freed (TVM walks from
    /// the block it left, which may be the freed ones' parent).
    fn remove_sequence_after_pop(&mut self, seq_id: i64) -> Result<(), KvCacheError> {
        self.remove_sequence(seq_id)
    }
}
