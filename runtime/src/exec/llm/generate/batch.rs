//! Several sequences in one batch, as MLC-LLM's engine runs them (`cpp/serve/model.cc`:
//! `BatchPrefill`, `BatchDecode`), and TVM's sampling besides greedy decoding.
//!
//! **Batch.** Sequence `i` of the batch has id `i` in the KV cache. The prompts are prefilled
//! in rounds of at most `prefill_chunk_size` tokens: each round takes, in the sequences'
//! order, as many of each unfinished prompt's next tokens as still fit (a long prompt spans
//! rounds, as the engine's chunked prefill does). A round is one
//! `kv_state_begin_forward(ids, lengths)`, one `embed` of all its tokens, one
//! `batch_prefill(embeddings [1, n, hidden], logit_positions, kv_cache, params)` whose
//! `logit_positions` are each entry's last token (its cumulative length - 1), and
//! `kv_state_end_forward`. A sequence whose prompt ends in a round picks its first token from
//! that round's row. Then every decode step runs the whole batch:
//! `batch_decode(embeddings [b, 1, hidden], kv_cache, params)`.
//!
//! **Sampling** ([`Sampling`](crate::exec::llm::lm::sampler::Sampling)): sequence `i` of a
//! batch is seeded `seed + i`.
//!
//! This module holds the batch's pure parts: the schedule of the prefill rounds and the rows of
//! the logits; `LanguageModel::generate_batch` runs them.

use crate::array::NdArray;
use crate::format::DataType;

/// One entry of a prefill round: the sequence, where its tokens start in its prompt, how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The sequence (its index in the batch).
    pub seq: usize,
    /// The first prompt token of the round.
    pub start: usize,
    /// How many of its tokens the round takes.
    pub len: usize,
}

/// The prefill rounds of prompts of `lengths` tokens with rounds of at most `chunk` tokens:
/// each round takes, in the sequences' order, as many of each unfinished prompt's next tokens
/// as still fit.
pub fn prefill_rounds(lengths: &[usize], chunk: usize) -> Vec<Vec<Entry>> {
    let chunk = chunk.max(1);
    let mut done = vec![0usize; lengths.len()];
    let mut rounds = Vec::new();
    while done.iter().zip(lengths).any(|(d, l)| d < l) {
        let mut round = Vec::new();
        let mut used = 0;
        for (seq, &l) in lengths.iter().enumerate() {
            let len = (l - done[seq]).min(chunk - used);
            if len > 0 {
                round.push(Entry { seq, start: done[seq], len });
                done[seq] += len;
                used += len;
            }
        }
        rounds.push(round);
    }
    rounds
}

/// The `rows` rows of float32 logits of `function`'s result (`[1, rows, vocab]` or
/// `[rows, 1, vocab]`).
pub fn rows_of(logits: &NdArray, rows: usize) -> Result<Vec<Vec<f32>>, String> {
    let bad = || format!("logits of shape {:?} and dtype {:?} for {rows} sequences", logits.shape(), logits.dtype());
    let vocab = match logits.shape() {
        [1, r, v] | [r, 1, v] if *r as usize == rows && *v > 0 => *v as usize,
        _ => return Err(bad()),
    };
    if logits.dtype() != DataType::F32 {
        return Err(bad());
    }
    let bytes = logits.to_bytes().map_err(|e| e.to_string())?;
    let floats: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(floats.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_rounds_fill_each_round_in_order() {
        // reference.py's batch: prompts of 21, 9 and 14 tokens in rounds of 16 (its
        // `prefill_rounds`: [0, 16], then [0, 1, 2] with 5, 9 and 2, then [2] with 12).
        let e = |seq, start, len| Entry { seq, start, len };
        assert_eq!(
            prefill_rounds(&[21, 9, 14], 16),
            vec![vec![e(0, 0, 16)], vec![e(0, 16, 5), e(1, 0, 9), e(2, 0, 2)], vec![e(2, 2, 12)]]
        );
    }
}
