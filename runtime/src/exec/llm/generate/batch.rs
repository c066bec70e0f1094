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
//! **Sampling.** [`Sampling`] with a temperature above 0 draws each token with TVM's
//! `vm.builtin.sample_top_p_from_logits(logits, temperature, top_p, uniform_sample)`
//! ([`sample_top_p_from_logits`], bitwise TVM's). The uniform samples are those of MLC-LLM's
//! `RandomGenerator` (`cpp/support/random.h`): `std::mt19937` seeded with the sequence's seed
//! and `std::uniform_real_distribution<double>(0, 1)` as libstdc++ computes it (two 32-bit draws,
//! `(x1 + x2 * 2^32) / 2^64`), one per token; sequence `i` of a batch is seeded `seed + i`.
//! Temperature 0 is greedy (the first largest logit, no draw).

use std::time::{Duration, Instant};

use rand_mt::Mt;

use super::{argmax, kind, GenerateError, Generation, LanguageModel};
use crate::array::NdArray;
use crate::device::Device;
use crate::exec::llm::lm::sampling::sample_top_p_from_logits;
use crate::exec::relax::vm::value::{tuple_item, Value, VmError};
use crate::format::DataType;

/// How each new token is picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// The softmax temperature; 0 (the default) is greedy decoding.
    pub temperature: f64,
    /// The probability mass of the most likely tokens drawn from (1: all of them).
    pub top_p: f64,
    /// The seed of the draws (of the first sequence; sequence `i` of a batch gets `seed + i`).
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling { temperature: 0.0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// Whether tokens are picked greedily (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Refuses a temperature that is negative or not finite, and a `top_p` outside (0, 1].
    pub fn check(&self) -> Result<(), GenerateError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(GenerateError::Request(format!(
                "the temperature {} is not a finite number of at least 0 (0: greedy)",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(GenerateError::Request(format!("top_p {} is not in (0, 1]", self.top_p)));
        }
        Ok(())
    }
}

/// The draws of one sequence.
#[derive(Debug)]
pub(super) struct Sampler {
    sampling: Sampling,
    rng: Mt,
}

impl Sampler {
    /// The sampler of the sequence seeded `seed`.
    pub fn new(sampling: &Sampling, seed: u32) -> Sampler {
        Sampler { sampling: *sampling, rng: Mt::new(seed) }
    }

    /// libstdc++'s `std::uniform_real_distribution<double>(0, 1)` over `std::mt19937`
    /// (`std::generate_canonical<double, 53>`: two draws, the sum in `double`, below 1).
    fn uniform(&mut self) -> f64 {
        let (lo, hi) = (f64::from(self.rng.next_u32()), f64::from(self.rng.next_u32()));
        let u = (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if u >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            u
        }
    }

    /// The next token of the sequence from `logits`.
    pub fn pick(&mut self, function: &'static str, logits: &[f32]) -> Result<i32, GenerateError> {
        if self.sampling.is_greedy() {
            return argmax(function, logits);
        }
        let u = self.uniform();
        let row = NdArray::from_f32(logits, &[1, logits.len() as i64], Device::cpu(0)).map_err(VmError::from)?;
        let token = sample_top_p_from_logits(&row, self.sampling.temperature, self.sampling.top_p, u)?;
        i32::try_from(token).map_err(|_| GenerateError::Result { function, detail: format!("token {token}") })
    }
}

/// The logits a model function returned: the tensor, or the first item of its tuple.
pub(super) fn logits_of(function: &'static str, result: Value) -> Result<NdArray, GenerateError> {
    match result {
        Value::Tuple(items) => match tuple_item(&items, 0) {
            Some(Value::Tensor(t)) => Ok(t),
            other => Err(GenerateError::Result {
                function,
                detail: format!(
                    "a tuple whose first item is {}, not the logits",
                    other.as_ref().map_or("missing", kind)
                ),
            }),
        },
        Value::Tensor(t) => Ok(t),
        v => Err(GenerateError::Result { function, detail: format!("{}, not the logits", kind(&v)) }),
    }
}

/// The `rows` rows of float32 logits of `function`'s result (`[1, rows, vocab]` or
/// `[rows, 1, vocab]`).
fn rows_of(function: &'static str, logits: &NdArray, rows: usize) -> Result<Vec<Vec<f32>>, GenerateError> {
    let bad = || GenerateError::Result {
        function,
        detail: format!("logits of shape {:?} and dtype {:?} for {rows} sequences", logits.shape(), logits.dtype()),
    };
    let vocab = match logits.shape() {
        [1, r, v] | [r, 1, v] if *r as usize == rows && *v > 0 => *v as usize,
        _ => return Err(bad()),
    };
    if logits.dtype() != DataType::F32 {
        return Err(bad());
    }
    let bytes = logits.to_bytes().map_err(VmError::from)?;
    let floats: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(floats.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}

impl LanguageModel {
    /// Embeds `ids` (`embed`): a `[n, hidden]` tensor on the model's device.
    pub(super) fn embed(&self, ids: &[i32]) -> Result<NdArray, GenerateError> {
        let n = ids.len() as i64;
        let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
        let input = NdArray::from_bytes(&bytes, &[n], DataType::I32, self.vm.devices()[0]).map_err(VmError::from)?;
        let input = Value::Tensor(input);
        let mut args = vec![&input];
        args.extend(self.packed.as_ref());
        let embedded = match self.vm.call_vm_values("embed", &args)? {
            Value::Tensor(t) => t,
            v => {
                return Err(GenerateError::Result { function: "embed", detail: format!("{}, not a tensor", kind(&v)) })
            }
        };
        match embedded.shape()[..] {
            [rows, _] if rows == n => Ok(embedded),
            ref s => Err(GenerateError::Result {
                function: "embed",
                detail: format!("a tensor of shape {s:?} for {n} tokens (expected [{n}, hidden])"),
            }),
        }
    }

    /// One round of the batch: `kv_state_begin_forward` of `seqs` appending `lengths`, `embed`
    /// of `ids` viewed as `shape(hidden)`, `function(embeddings, extra..., kv_cache, params)`,
    /// `kv_state_end_forward`: one row of logits per sequence.
    fn batch_round(
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
        self.vm.call_vm_values("vm.builtin.kv_state_begin_forward", &[cache, &shape_of(seqs), &shape_of(lengths)])?;
        let embedded = self.embed(ids)?;
        let hidden = embedded.shape()[1];
        let embedded = Value::Tensor(embedded.view(&shape(hidden), embedded.dtype()).map_err(VmError::from)?);
        let mut args = vec![&embedded];
        args.extend(extra);
        args.push(cache);
        args.extend(self.packed.as_ref());
        let result = self.vm.call_vm_values(function, &args)?;
        self.vm.call_vm_values("vm.builtin.kv_state_end_forward", &[cache])?;
        rows_of(function, &logits_of(function, result)?, seqs.len())
    }

    /// Generates `max_new_tokens` tokens after each of `prompts` in one batch (sequence `i`
    /// has id `i`), through `batch_prefill` and `batch_decode` (see the [module](self)), in a
    /// new KV cache, each token picked as `sampling` says.
    pub fn generate_batch(
        &mut self,
        prompts: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Generation>, GenerateError> {
        let _span = tracing::debug_span!("lm_generate_batch", sequences = prompts.len(), max_new_tokens).entered();
        sampling.check()?;
        if prompts.is_empty() {
            return Err(GenerateError::Request("no prompt: give at least one".into()));
        }
        if prompts.len() as i64 > self.metadata.max_batch_size {
            return Err(GenerateError::Request(format!(
                "{} prompts, more than the model's max_batch_size {}",
                prompts.len(),
                self.metadata.max_batch_size
            )));
        }
        for (i, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(GenerateError::Request(format!("prompt {i} is empty: give at least one token id")));
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
        let mut outs: Vec<Generation> = prompts
            .iter()
            .map(|_| Generation {
                tokens: Vec::new(),
                logits: Vec::new(),
                prefill_time: Duration::ZERO,
                decode_times: Vec::new(),
            })
            .collect();
        self.cache = None;
        let cache = self.new_cache()?;
        for seq in 1..prompts.len() as i64 {
            self.add_sequence(&cache, seq)?;
        }
        self.cache = Some(crate::exec::relax::vm::value::VmValue::Object(cache.clone()));
        if max_new_tokens == 0 {
            return Ok(outs);
        }
        let cache = Value::Object(cache);
        let mut samplers: Vec<Sampler> =
            (0..prompts.len()).map(|i| Sampler::new(sampling, sampling.seed.wrapping_add(i as u32))).collect();
        let chunk = self.prefill_chunk_size() as usize;
        let start = Instant::now();
        let mut done = vec![0usize; prompts.len()];
        while done.iter().zip(prompts).any(|(&d, p)| d < p.len()) {
            let (mut seqs, mut lengths, mut ids, mut positions) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (i, p) in prompts.iter().enumerate() {
                let take = (p.len() - done[i]).min(chunk - ids.len());
                if take == 0 {
                    continue;
                }
                seqs.push(i as i64);
                lengths.push(take as i64);
                ids.extend_from_slice(&p[done[i]..done[i] + take]);
                positions.push(ids.len() as i32 - 1);
                done[i] += take;
            }
            let bytes: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
            let positions = NdArray::from_bytes(&bytes, &[positions.len() as i64], DataType::I32, self.vm.devices()[0])
                .map_err(VmError::from)?;
            let n = ids.len() as i64;
            let positions = Value::Tensor(positions);
            let rows =
                self.batch_round(&cache, "batch_prefill", &seqs, &lengths, &ids, Some(&positions), |h| vec![1, n, h])?;
            for (&seq, row) in seqs.iter().zip(rows) {
                let s = seq as usize;
                if done[s] == prompts[s].len() {
                    let token = samplers[s].pick("batch_prefill", &row)?;
                    outs[s].tokens.push(token);
                    outs[s].logits.push(row);
                }
            }
        }
        let prefill_time = start.elapsed();
        let seqs: Vec<i64> = (0..prompts.len() as i64).collect();
        let ones = vec![1i64; prompts.len()];
        let b = prompts.len() as i64;
        for _ in 1..max_new_tokens {
            let start = Instant::now();
            let ids: Vec<i32> = outs.iter().map(|o| o.tokens[o.tokens.len() - 1]).collect();
            let rows = self.batch_round(&cache, "batch_decode", &seqs, &ones, &ids, None, |h| vec![b, 1, h])?;
            for ((out, sampler), row) in outs.iter_mut().zip(&mut samplers).zip(rows) {
                out.tokens.push(sampler.pick("batch_decode", &row)?);
                out.logits.push(row);
            }
            let took = start.elapsed();
            outs.iter_mut().for_each(|o| o.decode_times.push(took));
        }
        outs.iter_mut().for_each(|o| o.prefill_time = prefill_time);
        Ok(outs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_draws_are_libstdcxx_over_mt19937() {
        // std::mt19937's 10000th output for the default seed 5489 is 4123659995 (the C++
        // standard, [rand.predef]).
        let mut mt = Mt::new(5489);
        let x = (0..10_000).map(|_| mt.next_u32()).last();
        assert_eq!(x, Some(4_123_659_995));
        // The first draws of seed 5489 are 3499211612 and 581869302: the uniform sample is
        // their generate_canonical sum over 2^64.
        let mut s = Sampler::new(&Sampling { temperature: 1.0, top_p: 1.0, seed: 5489 }, 5489);
        let want = (3_499_211_612f64 + 581_869_302f64 * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        assert_eq!(s.uniform(), want);
    }

    #[test]
    fn sampling_settings_are_checked() {
        assert!(Sampling::default().check().is_ok());
        assert!(Sampling { temperature: -1.0, ..Sampling::default() }.check().is_err());
        assert!(Sampling { temperature: f64::NAN, ..Sampling::default() }.check().is_err());
        assert!(Sampling { top_p: 0.0, ..Sampling::default() }.check().is_err());
        assert!(Sampling { top_p: 1.5, ..Sampling::default() }.check().is_err());
    }
}
