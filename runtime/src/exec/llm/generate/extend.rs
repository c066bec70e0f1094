//! Continuing sequences (multi-turn) and MLC-LLM's engine's rule for `extend`: when the library
//! has `extend`, a prefill round in which a sequence was prefilled before (a later chunk of a
//! long prompt, or a new turn of a sequence) runs through `extend` (one sequence) or
//! `batch_extend` (several), not `prefill`/`batch_prefill` (`cpp/serve/model.cc`,
//! `BatchPrefill`: `prefilled_seq_ids_`). A library without `extend` prefills every round.
//!
//! [`LanguageModel::continue_sampled`] and [`LanguageModel::continue_batch`] continue the
//! sequences of the last generation in the same KV cache: each sequence's input is its last new
//! token (which the cache does not hold yet: a token is fed by the step after the one that
//! picked it) followed by the new prompt.

use std::time::Instant;

use super::logits::pick;
use super::{GenerateError, Generation, LanguageModel, Sampling, SEQUENCE_ID};
use crate::exec::llm::lm::sampler::Sampler;
use crate::exec::relax::vm::value::ObjectRef;
use crate::exec::value::Value as ExecValue;

impl LanguageModel {
    /// One turn of the sequence: `input` in chunks of at most `prefill_chunk_size` tokens
    /// (`prefill` or `extend` by the engine's rule), then decode steps until `max_new_tokens`
    /// tokens are picked (at least one). A turn that fails leaves no generation to continue.
    pub(super) fn run_turn(
        &mut self,
        cache: &ObjectRef,
        input: &[i32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        on_token: &mut impl FnMut(i32),
    ) -> Result<Generation, GenerateError> {
        let out = self.turn_steps(cache, input, max_new_tokens, sampler, on_token);
        self.ended(out)
    }

    /// A turn's result; after a failure the cache (its sequences part-way through a step) is
    /// dropped, so that no later turn continues them.
    pub(super) fn ended<T>(&mut self, out: Result<T, GenerateError>) -> Result<T, GenerateError> {
        if out.is_err() {
            self.cache = None;
            self.rnn = None;
        }
        out
    }

    fn turn_steps(
        &mut self,
        cache: &ObjectRef,
        input: &[i32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        on_token: &mut impl FnMut(i32),
    ) -> Result<Generation, GenerateError> {
        let mut out = Generation::default();
        let start = Instant::now();
        let mut logits = Vec::new();
        for chunk in input.chunks(self.prefill_chunk_size() as usize) {
            let function = self.turns.prefill_function(&[SEQUENCE_ID], false)?;
            logits = self.forward(cache, function, chunk)?;
        }
        let mut token = pick(sampler, "prefill", &logits)?;
        out.prefill_time = start.elapsed();
        out.tokens.push(token);
        out.logits.push(logits);
        on_token(token);
        while out.tokens.len() < max_new_tokens {
            let start = Instant::now();
            let logits = self.forward(cache, "decode", &[token])?;
            token = pick(sampler, "decode", &logits)?;
            out.decode_times.push(start.elapsed());
            out.tokens.push(token);
            out.logits.push(logits);
            on_token(token);
        }
        self.turns.record(0, input.len() + out.tokens.len() - 1, Some(token));
        Ok(out)
    }

    /// The cache and the sequences' inputs for a new turn after `prompts` (one per sequence of
    /// the last generation): each sequence's last new token, then its prompt.
    fn next_turn(&self, prompts: &[Vec<i32>]) -> Result<(ObjectRef, Vec<Vec<i32>>), GenerateError> {
        let Some(ExecValue::Object(cache)) = self.cache.clone() else {
            return Err(GenerateError::NothingToContinue);
        };
        if prompts.len() != self.turns.seqs.len() {
            return Err(GenerateError::TurnCount { given: prompts.len(), sequences: self.turns.seqs.len() });
        }
        let mut inputs = Vec::with_capacity(prompts.len());
        for (i, (p, (_, last))) in prompts.iter().zip(&self.turns.seqs).enumerate() {
            self.check_ids(p)?;
            let input: Vec<i32> = last.iter().copied().chain(p.iter().copied()).collect();
            if input.is_empty() {
                return Err(GenerateError::EmptyPrompt { index: Some(i) });
            }
            inputs.push(input);
        }
        Ok((cache, inputs))
    }

    /// Continues the sequence of the last [`LanguageModel::generate_sampled`] (or
    /// [`LanguageModel::continue_sampled`]) in the same KV cache: its last new token and
    /// `prompt` are prefilled (through `extend` when the library has it, as MLC-LLM's engine
    /// prefills a sequence it prefilled before), then up to `max_new_tokens` tokens are
    /// generated as [`LanguageModel::generate_sampled`] does, with a sampler seeded anew.
    pub fn continue_sampled(
        &mut self,
        prompt: &[i32],
        max_new_tokens: usize,
        sampling: &Sampling,
        mut on_token: impl FnMut(i32),
    ) -> Result<Generation, GenerateError> {
        let _span = tracing::debug_span!("lm_continue", prompt = prompt.len(), max_new_tokens).entered();
        sampling.check()?;
        let (cache, inputs) = self.next_turn(std::slice::from_ref(&prompt.to_vec()))?;
        self.check_capacity([self.turns.seqs[0].0 + inputs[0].len()], max_new_tokens)?;
        if max_new_tokens == 0 {
            return Ok(Generation::default());
        }
        let mut sampler = Sampler::new(sampling, sampling.seed);
        self.run_turn(&cache, &inputs[0], max_new_tokens, &mut sampler, &mut on_token)
    }

    /// Continues the sequences of the last [`LanguageModel::generate_batch`] (or
    /// [`LanguageModel::continue_batch`]) in the same KV cache, one prompt each: each sequence's
    /// last new token and its prompt are prefilled in rounds as `generate_batch` prefills
    /// (through `batch_extend` when the library has `extend`, as MLC-LLM's engine does), then the
    /// batch decodes; sequence `i` is seeded `sampling.seed + i` anew.
    pub fn continue_batch(
        &mut self,
        prompts: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Generation>, GenerateError> {
        let _span = tracing::debug_span!("lm_continue_batch", sequences = prompts.len(), max_new_tokens).entered();
        sampling.check()?;
        let (cache, inputs) = self.next_turn(prompts)?;
        let held: Vec<usize> = self.turns.seqs.iter().zip(&inputs).map(|((fed, _), i)| fed + i.len()).collect();
        self.check_capacity(held, max_new_tokens)?;
        if max_new_tokens == 0 {
            return Ok(prompts.iter().map(|_| Generation::default()).collect());
        }
        self.batch_turn(&cache, &inputs, max_new_tokens, sampling)
    }
}
