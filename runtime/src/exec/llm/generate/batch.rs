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
//! `kv_state_end_forward`. A round of several sequences passes the embeddings in the library's
//! `alloc_embedding_tensor` workspace, as the engine does (`embedding`). A sequence whose
//! prompt ends in a round picks its first token from that round's row. Then every decode step runs the whole batch:
//! `batch_decode(embeddings [b, 1, hidden], kv_cache, params)`.
//!
//! An RNN model (`rnn_state`) prefills each prompt alone instead, through `prefill` (see
//! `state.rs`); a `hybrid` one each prompt alone through `batch_prefill`, its calls taking the
//! RNN state after the KV cache (see `hybrid.rs`).
//!
//! **Sampling** ([`Sampling`](crate::exec::llm::lm::sampler::Sampling)): sequence `i` of a
//! batch is seeded `seed + i`.
//!
//! This module holds the batch's schedule of prefill rounds, the rows of its logits and
//! [`LanguageModel::generate_batch`], which runs them.

use std::time::Instant;

use super::logits::{logits_of, pick};
use super::state::StateKind;
use super::{GenerateError, Generation, LanguageModel, Sampling};
use crate::array::NdArray;
use crate::exec::llm::lm::sampler::Sampler;
use crate::exec::relax::vm::value::{ObjectRef, Value, VmError};
use crate::exec::value::Value as ExecValue;
use crate::format::DataType;

/// One entry of a prefill round: the sequence, where its tokens start in its prompt, how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
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
pub(crate) fn prefill_rounds(lengths: &[usize], chunk: usize) -> Vec<Vec<Entry>> {
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

/// The prefill rounds of an RNN model's batch: each prompt alone, in chunks of at most
/// `chunk` tokens.
pub fn rounds_one_by_one(lengths: &[usize], chunk: usize) -> Vec<Vec<Entry>> {
    let chunk = chunk.max(1);
    let mut rounds = Vec::new();
    for (seq, &l) in lengths.iter().enumerate() {
        let mut start = 0;
        while start < l {
            let len = chunk.min(l - start);
            rounds.push(vec![Entry { seq, start, len }]);
            start += len;
        }
    }
    rounds
}

/// The `rows` rows of float32 logits of `function`'s result (`[1, rows, vocab]` or
/// `[rows, 1, vocab]`).
pub(crate) fn rows_of(logits: &NdArray, rows: usize) -> Result<Vec<Vec<f32>>, String> {
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

/// Several sequences in one batch (see [`LanguageModel::generate_batch`]).
impl LanguageModel {
    /// One round of the batch: `kv_state_begin_forward` of `seqs` appending `lengths`, `embed`
    /// of `ids` viewed as `shape(hidden)`, `function(embeddings, extra..., kv_cache, params)`,
    /// `kv_state_end_forward`: one row of logits per sequence. A hybrid model's RNN state is
    /// framed after the cache and passed after it (`function(..., kv_cache, rnn_state, params)`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn batch_round(
        &self,
        cache: &Value,
        function: &'static str,
        seqs: &[i64],
        lengths: &[i64],
        ids: &[i32],
        extra: Option<&Value>,
        shape: impl Fn(i64) -> Vec<i64>,
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        let _span = tracing::trace_span!("lm_batch_round", function, sequences = seqs.len()).entered();
        let shape_of = |v: &[i64]| Value::Shape(v.into());
        let (seqs_v, lengths_v) = (shape_of(seqs), shape_of(lengths));
        self.vm.call_vm_values("vm.builtin.kv_state_begin_forward", &[cache, &seqs_v, &lengths_v])?;
        self.on_companion("vm.builtin.kv_state_begin_forward", &[&seqs_v, &lengths_v])?;
        let mut embedded = self.embed(ids)?;
        // A prefill of several sequences reads the embeddings from `alloc_embedding_tensor`'s
        // workspace, as MLC-LLM's engine does (see `embedding`).
        if let Some(workspace) = self.embedding.as_ref().filter(|_| function == "batch_prefill" && seqs.len() > 1) {
            embedded = workspace.write(&embedded, 0)?.clone();
        }
        let hidden = embedded.shape()[1];
        let embedded = Value::Tensor(embedded.view(&shape(hidden), embedded.dtype()).map_err(VmError::from)?);
        let mut args = vec![&embedded];
        args.extend(extra);
        args.push(cache);
        let rnn = self.companion();
        args.extend(rnn.as_ref());
        args.extend(self.packed.as_ref());
        let result = self.vm.call_vm_values(function, &args)?;
        self.vm.call_vm_values("vm.builtin.kv_state_end_forward", &[cache])?;
        self.on_companion("vm.builtin.kv_state_end_forward", &[])?;
        rows_of(&logits_of(function, result)?, seqs.len()).map_err(|detail| GenerateError::Result { function, detail })
    }

    /// Generates `max_new_tokens` tokens after each of `prompts` in one batch, in a new KV
    /// cache, as MLC-LLM's engine runs a batch (`cpp/serve/model.cc`: `BatchPrefill`,
    /// `BatchDecode`); sequence `i` has id `i` and is seeded `sampling.seed + i`. The prompts are
    /// prefilled in rounds of at most `prefill_chunk_size` tokens, each taking in the
    /// sequences' order as many of each unfinished prompt's next tokens as still fit: one
    /// `kv_state_begin_forward(ids, lengths)`, one `embed`, one `batch_prefill(embeddings
    /// [1, n, hidden], logit_positions, kv_cache, params)` (`logit_positions`: each entry's last
    /// token) and `kv_state_end_forward` a round; a sequence whose prompt ends in a round picks
    /// its first token from that round's row. Then each decode step runs the whole batch
    /// through `batch_decode(embeddings [b, 1, hidden], kv_cache, params)`.
    pub fn generate_batch(
        &mut self,
        prompts: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Generation>, GenerateError> {
        let _span = tracing::debug_span!("lm_generate_batch", sequences = prompts.len(), max_new_tokens).entered();
        sampling.check()?;
        if prompts.is_empty() {
            return Err(GenerateError::NoPrompt);
        }
        if prompts.len() as i64 > self.metadata.max_batch_size {
            return Err(GenerateError::TooManyPrompts { given: prompts.len(), max: self.metadata.max_batch_size });
        }
        for (i, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(GenerateError::EmptyPrompt { index: Some(i) });
            }
            self.check_ids(p)?;
        }
        for name in ["batch_prefill", "batch_decode"] {
            if !self.vm.functions().iter().any(|f| f.name == name) {
                let available = self.vm.functions().iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ");
                let (name, why) = if name == "batch_prefill" {
                    ("batch_prefill", "prefills several sequences in one batch")
                } else {
                    ("batch_decode", "decodes several sequences in one batch")
                };
                return Err(GenerateError::MissingFunction { name, why, available });
            }
        }
        self.check_capacity(prompts.iter().map(Vec::len), max_new_tokens)?;
        self.cache = None;
        let cache = self.new_cache()?;
        for seq in 1..prompts.len() as i64 {
            self.add_sequence(&cache, seq)?;
        }
        self.turns.reset(prompts.len());
        self.cache = Some(ExecValue::Object(cache.clone()));
        if max_new_tokens == 0 {
            return Ok(prompts.iter().map(|_| Generation::default()).collect());
        }
        self.batch_turn(&cache, prompts, max_new_tokens, sampling)
    }

    /// One turn of the batch (sequence `i` has id `i`): `inputs` prefilled in rounds, then
    /// decode steps until each sequence has `max_new_tokens` (at least 1) new tokens. A turn
    /// that fails leaves no generation to continue.
    pub(super) fn batch_turn(
        &mut self,
        cache: &ObjectRef,
        inputs: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Generation>, GenerateError> {
        let out = self.batch_steps(cache, inputs, max_new_tokens, sampling);
        self.ended(out)
    }

    fn batch_steps(
        &mut self,
        cache: &ObjectRef,
        inputs: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Generation>, GenerateError> {
        let mut outs: Vec<Generation> = inputs.iter().map(|_| Generation::default()).collect();
        let cache = Value::Object(cache.clone());
        let mut samplers: Vec<Sampler> =
            (0..inputs.len()).map(|i| Sampler::new(sampling, sampling.seed.wrapping_add(i as u32))).collect();
        let lengths: Vec<usize> = inputs.iter().map(Vec::len).collect();
        let start = Instant::now();
        // An RNN state (alone or beside the cache) is read for one sequence per prefill; an
        // `rnn_state` model prefills through `prefill`, a hybrid one through `batch_prefill`.
        let kind = self.state_kind();
        let rnn = kind == StateKind::Rnn;
        let chunk = self.prefill_chunk_size() as usize;
        let rounds = if kind == StateKind::KvCache {
            prefill_rounds(&lengths, chunk)
        } else {
            rounds_one_by_one(&lengths, chunk)
        };
        for round in rounds {
            let seqs: Vec<i64> = round.iter().map(|e| e.seq as i64).collect();
            let lens: Vec<i64> = round.iter().map(|e| e.len as i64).collect();
            let ids: Vec<i32> =
                round.iter().flat_map(|e| inputs[e.seq][e.start..e.start + e.len].iter().copied()).collect();
            let mut positions = Vec::with_capacity(round.len());
            let mut end = 0i32;
            for e in &round {
                end += e.len as i32;
                positions.push(end - 1);
            }
            let bytes: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
            let positions = NdArray::from_bytes(&bytes, &[positions.len() as i64], DataType::I32, self.vm.devices()[0])
                .map_err(VmError::from)?;
            let n = ids.len() as i64;
            let positions = Value::Tensor(positions);
            let function = self.turns.prefill_function(&seqs, !rnn)?;
            let rows = if rnn {
                self.batch_round(&cache, function, &seqs, &lens, &ids, None, |h| vec![1, n, h])?
            } else {
                self.batch_round(&cache, function, &seqs, &lens, &ids, Some(&positions), |h| vec![1, n, h])?
            };
            for (e, row) in round.iter().zip(rows) {
                if e.start + e.len == lengths[e.seq] {
                    let token = pick(&mut samplers[e.seq], function, &row)?;
                    outs[e.seq].tokens.push(token);
                    outs[e.seq].logits.push(row);
                }
            }
        }
        let prefill_time = start.elapsed();
        let seqs: Vec<i64> = (0..inputs.len() as i64).collect();
        let ones = vec![1i64; inputs.len()];
        let b = inputs.len() as i64;
        for _ in 1..max_new_tokens {
            let start = Instant::now();
            let ids: Vec<i32> = outs.iter().map(|o| o.tokens[o.tokens.len() - 1]).collect();
            let rows = self.batch_round(&cache, "batch_decode", &seqs, &ones, &ids, None, |h| vec![b, 1, h])?;
            for ((out, sampler), row) in outs.iter_mut().zip(&mut samplers).zip(rows) {
                out.tokens.push(pick(sampler, "batch_decode", &row)?);
                out.logits.push(row);
            }
            let took = start.elapsed();
            outs.iter_mut().for_each(|o| o.decode_times.push(took));
        }
        for (i, (o, input)) in outs.iter_mut().zip(inputs).enumerate() {
            o.prefill_time = prefill_time;
            self.turns.record(i, input.len() + o.tokens.len() - 1, o.tokens.last().copied());
        }
        Ok(outs)
    }
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

    #[test]
    fn an_rnn_batch_prefills_each_prompt_alone() {
        let e = |seq, start, len| Entry { seq, start, len };
        assert_eq!(
            rounds_one_by_one(&[21, 9, 14], 16),
            vec![vec![e(0, 0, 16)], vec![e(0, 16, 5)], vec![e(1, 0, 9)], vec![e(2, 0, 14)]]
        );
    }
}
