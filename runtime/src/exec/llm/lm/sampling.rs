//! TVM's sampling and logit-processing builtins (`src/runtime/vm/lm_support.cc`):
//! top-p sampling from logits or probabilities, multinomial sampling from uniform draws, the
//! repetition and presence/frequency penalties, and the softmax with temperature.
//!
//! The arithmetic is TVM's, operation for operation and in the same precision (`float` sums,
//! `double` where TVM mixes in a `double` argument, `expf`), so results are bitwise TVM's.
//! TVM's quirks are kept: [`apply_softmax_with_temperature`] normalises only the first
//! `vocab_size` elements (the first row of a batch) and starts its running maximum at the
//! smallest positive `float`, not at minus infinity; the penalties index the logits as one
//! flat array. Unlike TVM, a token id outside the logits, token frequencies or uniform
//! samples fewer than needed, and an empty vocabulary are errors (TVM reads or writes out of
//! bounds), and every check runs before anything is written.
//!
//! TVM sorts with `std::sort` (not stable); these sort stably. Equal logits or probabilities
//! can therefore come out in another order than TVM's (TVM's order among equal keys is
//! `libstdc++`'s introsort's); distinct values sort the same.

use std::cmp::Ordering;

use crate::array::{ArrayError, NdArray};
use crate::device::Device;
use crate::format::DataType;

/// A sampling builtin refused its arguments. Messages carry TVM's text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SamplingError {
    /// A tensor that must be `float32` is not.
    #[error("{builtin}: {what} data type is not float32! (it is {found})")]
    NotF32 {
        /// The builtin.
        builtin: &'static str,
        /// TVM's name for the argument (`Logits`, `prob`, `uniform_sample`).
        what: &'static str,
        /// Its dtype.
        found: DataType,
    },
    /// Token ids or frequencies that are not `int32`.
    #[error("{builtin}: {what} must be int32! (they are {found})")]
    NotI32 {
        /// The builtin.
        builtin: &'static str,
        /// `token ids` or `token freqs`.
        what: &'static str,
        /// Their dtype.
        found: DataType,
    },
    /// A top-p sampler given a batch: a leading dimension is not 1.
    #[error(
        "{builtin}: Check failed: {what}->shape[i] == 1 ({extent} vs. 1) : The leading dimensions of logits must be 1"
    )]
    LeadingDimension {
        /// The builtin.
        builtin: &'static str,
        /// `logits` or `prob`.
        what: &'static str,
        /// The extent found.
        extent: i64,
    },
    /// A tensor without the dimensions the builtin reads (no dimension, or an empty last one).
    #[error("{builtin}: {what} of shape {shape:?} has no elements to read")]
    Empty {
        /// The builtin.
        builtin: &'static str,
        /// The argument.
        what: &'static str,
        /// Its shape.
        shape: Vec<i64>,
    },
    /// Fewer elements than the builtin reads (TVM would read past the end).
    #[error("{builtin}: {what} of shape {shape:?} has {found} elements, {needed} needed")]
    TooFew {
        /// The builtin.
        builtin: &'static str,
        /// The argument.
        what: &'static str,
        /// Its shape.
        shape: Vec<i64>,
        /// Elements it has.
        found: usize,
        /// Elements read.
        needed: usize,
    },
    /// A token id outside the logits (TVM would write out of bounds).
    #[error("{builtin}: token id {token_id} (position {index}) is outside the {len} logits")]
    TokenOutOfRange {
        /// The builtin.
        builtin: &'static str,
        /// Position in the token ids.
        index: usize,
        /// The id.
        token_id: i32,
        /// Number of logits.
        len: usize,
    },
    /// An in-place builtin given a tensor that is not on the CPU.
    #[error("{builtin}: {what} device must be CPU! (it is on {device})")]
    NotOnCpu {
        /// The builtin.
        builtin: &'static str,
        /// `logits`, `token_ids`.
        what: &'static str,
        /// The device.
        device: Device,
    },
    /// `sample_top_p_from_prob` on probabilities that are all NaN.
    #[error("The output probabilities are all NaNs, can not sample from it")]
    AllNan,
    /// `sample_top_p_from_prob` found no token for another reason.
    #[error("Cannot sample from the given probability distribution due to unknown reason")]
    CannotSample,
    /// `sample_top_p_from_logits` found no token: the uniform sample is past the first
    /// cumulative probability (a sample of 1 or more, or NaN logits).
    #[error("vm.builtin.sample_top_p_from_logits: Check failed: uniform_sample <= data[0].first ({uniform_sample} vs. {first}) : ")]
    UniformSample {
        /// The uniform sample.
        uniform_sample: f64,
        /// The first cumulative probability.
        first: f32,
    },
    /// Reading or writing a tensor failed.
    #[error(transparent)]
    Array(#[from] ArrayError),
}

impl SamplingError {
    /// The class of the error TVM raises for it (`InternalError` for all of these).
    pub fn tvm_kind(&self) -> &'static str {
        "InternalError"
    }
}

/// The elements of a `float32` tensor.
fn f32s(a: &NdArray, builtin: &'static str, what: &'static str) -> Result<Vec<f32>, SamplingError> {
    if a.dtype() != DataType::F32 {
        return Err(SamplingError::NotF32 { builtin, what, found: a.dtype() });
    }
    let bytes = a.to_bytes()?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The elements of an `int32` tensor.
fn i32s(a: &NdArray, builtin: &'static str, what: &'static str) -> Result<Vec<i32>, SamplingError> {
    if a.dtype() != DataType::I32 {
        return Err(SamplingError::NotI32 { builtin, what, found: a.dtype() });
    }
    let bytes = a.to_bytes()?;
    Ok(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Writes `values` back into a `float32` tensor.
fn store_f32s(a: &NdArray, values: &[f32]) -> Result<(), SamplingError> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(a.copy_from_bytes(&bytes)?)
}

/// The last extent of `a` (TVM's `shape[ndim - 1]`), which must exist (TVM reads before the
/// shape of a 0-d tensor).
fn last_dim(a: &NdArray, builtin: &'static str, what: &'static str) -> Result<usize, SamplingError> {
    a.shape().last().and_then(|&d| usize::try_from(d).ok()).ok_or_else(|| SamplingError::Empty {
        builtin,
        what,
        shape: a.shape().to_vec(),
    })
}

/// [`last_dim`], which must also be positive (the builtin reads its first element).
fn last_extent(a: &NdArray, builtin: &'static str, what: &'static str) -> Result<usize, SamplingError> {
    Some(last_dim(a, builtin, what)?).filter(|&d| d > 0).ok_or_else(|| SamplingError::Empty {
        builtin,
        what,
        shape: a.shape().to_vec(),
    })
}

/// Checks that every dimension but the last is 1 (a single row).
fn single_row(a: &NdArray, builtin: &'static str, what: &'static str) -> Result<(), SamplingError> {
    let dims = a.shape();
    match dims[..dims.len().saturating_sub(1)].iter().find(|&&d| d != 1) {
        Some(&extent) => Err(SamplingError::LeadingDimension { builtin, what, extent }),
        None => Ok(()),
    }
}

fn require_cpu(a: &NdArray, builtin: &'static str, what: &'static str) -> Result<(), SamplingError> {
    if a.device().is_cpu() {
        Ok(())
    } else {
        Err(SamplingError::NotOnCpu { builtin, what, device: a.device() })
    }
}

/// Largest first, as TVM's comparator `lhs.first > rhs.first` orders them (NaN last, so
/// the order is total).
fn descending(a: &(f32, i32), b: &(f32, i32)) -> Ordering {
    match (a.0.is_nan(), b.0.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.0.partial_cmp(&a.0).unwrap_or(Ordering::Equal),
    }
}

/// `vm.builtin.sample_top_p_from_logits(logits, temperature, top_p, uniform_sample) -> int`:
/// a token drawn from the softmax of `logits / temperature` restricted to the smallest set of
/// most likely tokens whose probability reaches `top_p`, by the uniform sample in `[0, 1)`;
/// the argmax when `temperature < 1e-6`. `logits`: `float32`, every dimension but the last 1.
pub fn sample_top_p_from_logits(
    logits: &NdArray,
    temperature: f64,
    top_p: f64,
    uniform_sample: f64,
) -> Result<i32, SamplingError> {
    const B: &str = "vm.builtin.sample_top_p_from_logits";
    let values = f32s(logits, B, "Logits")?;
    single_row(logits, B, "logits")?;
    let n = last_extent(logits, B, "logits")?;
    let mut data: Vec<(f32, i32)> = values.iter().take(n).enumerate().map(|(i, &x)| (x, i as i32)).collect();
    data.sort_by(descending);
    // TVM compares the double temperature with the float literal 1e-6f.
    if temperature < f64::from(1e-6f32) {
        return Ok(data[0].1);
    }
    // `float logit_scale = 1.0f / temperature`: a double quotient rounded to float.
    let logit_scale = (1.0 / temperature) as f32;
    let max_value = data[0].0;
    let mut sum = 0.0f32;
    for it in data.iter_mut() {
        it.0 = ((it.0 - max_value) * logit_scale).exp();
        sum += it.0;
    }
    let mut cum_sum_prob = 0.0f32;
    let mut top_p_sum = 0.0f32;
    for it in data.iter_mut() {
        let prob = it.0 / sum;
        if f64::from(cum_sum_prob) < top_p {
            top_p_sum += prob;
        }
        cum_sum_prob += prob;
        it.0 = cum_sum_prob;
    }
    for it in &data {
        if uniform_sample < f64::from(it.0 / top_p_sum) {
            return Ok(it.1);
        }
    }
    if uniform_sample <= f64::from(data[0].0) {
        Ok(data[0].1)
    } else {
        Err(SamplingError::UniformSample { uniform_sample, first: data[0].0 })
    }
}

/// `vm.builtin.sample_top_p_from_prob(prob, top_p, uniform_sample) -> int`: as
/// [`sample_top_p_from_logits`] on probabilities already computed. TVM first tries the
/// tokens of probability at least `top_p / 1024`, then all of them; probabilities that are
/// all NaN are an error. `prob`: `float32`, every dimension but the last 1.
pub fn sample_top_p_from_prob(prob: &NdArray, top_p: f64, uniform_sample: f64) -> Result<i64, SamplingError> {
    const B: &str = "vm.builtin.sample_top_p_from_prob";
    let values = f32s(prob, B, "prob")?;
    single_row(prob, B, "prob")?;
    // An empty distribution is "all NaN" to TVM (`std::all_of` of nothing).
    let n = last_dim(prob, B, "prob")?;
    let p = values.get(..n).ok_or_else(|| SamplingError::TooFew {
        builtin: B,
        what: "prob",
        shape: prob.shape().to_vec(),
        found: values.len(),
        needed: n,
    })?;
    let mut data: Vec<(f32, i32)> = Vec::new();
    let mut sample_with_cutoff = |cutoff: f32| -> i64 {
        data.clear();
        data.extend(p.iter().enumerate().filter(|(_, &x)| x >= cutoff).map(|(i, &x)| (x, i as i32)));
        if data.is_empty() {
            return -1;
        }
        data.sort_by(descending);
        // The most likely token, when the sample is below p[0] / top_p (a float over a double).
        if uniform_sample < f64::from(data[0].0) / top_p {
            return i64::from(data[0].1);
        }
        let mut cum_sum_prob = 0.0f32;
        let mut top_p_sum = 0.0f32;
        for it in data.iter_mut() {
            let prob = it.0;
            if f64::from(cum_sum_prob) < top_p {
                top_p_sum += prob;
            } else {
                break;
            }
            cum_sum_prob += prob;
            it.0 = cum_sum_prob;
        }
        if f64::from(cum_sum_prob) < top_p && cutoff != 0.0 {
            return -1;
        }
        // Past the cut, TVM compares the raw probabilities left in place: kept as TVM does.
        for it in data.iter() {
            if uniform_sample < f64::from(it.0 / top_p_sum) {
                return i64::from(it.1);
            }
        }
        data.last().map_or(-1, |it| i64::from(it.1))
    };
    if top_p < 1.0 {
        // `top_p / 1024` is a double passed as the float cutoff.
        let sampled = sample_with_cutoff((top_p / 1024.0) as f32);
        if sampled >= 0 {
            return Ok(sampled);
        }
    }
    let sampled = sample_with_cutoff(0.0);
    if sampled >= 0 {
        Ok(sampled)
    } else if p.iter().all(|x| x.is_nan()) {
        Err(SamplingError::AllNan)
    } else {
        Err(SamplingError::CannotSample)
    }
}

/// `vm.builtin.multinomial_from_uniform(prob, uniform_sample) -> int64 [batch, 1]`: for each
/// row `i` of `prob` (`float32 [batch, ..., vocab]`), the first token whose cumulative
/// probability exceeds `uniform_sample[i]` (`float32`, at least `batch` elements), or the last
/// token. The result is on the CPU, as TVM's.
pub fn multinomial_from_uniform(prob: &NdArray, uniform_sample: &NdArray) -> Result<NdArray, SamplingError> {
    const B: &str = "vm.builtin.multinomial_from_uniform";
    let p = f32s(prob, B, "prob")?;
    let u = f32s(uniform_sample, B, "uniform_sample")?;
    let vocab = last_dim(prob, B, "prob")?;
    let batch = usize::try_from(prob.shape()[0]).unwrap_or(0);
    let needed = batch.saturating_mul(vocab);
    if p.len() < needed {
        return Err(SamplingError::TooFew {
            builtin: B,
            what: "prob",
            shape: prob.shape().to_vec(),
            found: p.len(),
            needed,
        });
    }
    if u.len() < batch {
        return Err(SamplingError::TooFew {
            builtin: B,
            what: "uniform_sample",
            shape: uniform_sample.shape().to_vec(),
            found: u.len(),
            needed: batch,
        });
    }
    let mut out = Vec::with_capacity(batch * 8);
    for (i, &sample) in u.iter().take(batch).enumerate() {
        let row = &p[i * vocab..(i + 1) * vocab];
        let mut cum_sum_prob = 0.0f32;
        let mut index = 0i64;
        for (j, &x) in row.iter().enumerate() {
            index = j as i64;
            cum_sum_prob += x;
            if cum_sum_prob > sample {
                break;
            }
        }
        out.extend_from_slice(&index.to_le_bytes());
    }
    Ok(NdArray::from_bytes(&out, &[batch as i64, 1], DataType::I64, Device::cpu(0))?)
}

/// The logits and token ids of a penalty, checked as TVM checks them (CPU, `float32`,
/// `int32`), with every id inside the logits.
fn penalty_inputs(
    builtin: &'static str,
    logits: &NdArray,
    token_ids: &NdArray,
    token_freqs: Option<&NdArray>,
) -> Result<(Vec<f32>, Vec<i32>), SamplingError> {
    // TVM's order: the dtypes, then the devices.
    if logits.dtype() != DataType::F32 {
        return Err(SamplingError::NotF32 { builtin, what: "Logits", found: logits.dtype() });
    }
    if token_ids.dtype() != DataType::I32 {
        return Err(SamplingError::NotI32 { builtin, what: "token ids", found: token_ids.dtype() });
    }
    if let Some(f) = token_freqs.filter(|f| f.dtype() != DataType::I32) {
        return Err(SamplingError::NotI32 { builtin, what: "token freqs", found: f.dtype() });
    }
    require_cpu(logits, builtin, "logits")?;
    require_cpu(token_ids, builtin, "token_ids")?;
    if let Some(f) = token_freqs {
        require_cpu(f, builtin, "token_freqs")?;
    }
    let values = f32s(logits, builtin, "Logits")?;
    let ids = i32s(token_ids, builtin, "token ids")?;
    // TVM reads `shape[ndim - 1]` ids.
    let count = match token_ids.shape().last() {
        Some(&d) => usize::try_from(d).unwrap_or(0),
        None => return Err(SamplingError::Empty { builtin, what: "token_ids", shape: Vec::new() }),
    };
    let ids = ids.get(..count).map(<[i32]>::to_vec).ok_or(SamplingError::TooFew {
        builtin,
        what: "token_ids",
        shape: token_ids.shape().to_vec(),
        found: ids.len(),
        needed: count,
    })?;
    for (index, &token_id) in ids.iter().enumerate() {
        if usize::try_from(token_id).map_or(true, |t| t >= values.len()) {
            return Err(SamplingError::TokenOutOfRange { builtin, index, token_id, len: values.len() });
        }
    }
    Ok((values, ids))
}

/// `vm.builtin.apply_repetition_penalty(logits, token_ids, penalty)`, in place on `logits`
/// (`float32`, CPU): each listed token's logit is multiplied by `penalty` when it is at most 0
/// and divided by it otherwise (once per occurrence of the id). `token_ids`: `int32`, the
/// last dimension's extent of them are read.
pub fn apply_repetition_penalty(logits: &NdArray, token_ids: &NdArray, penalty: f64) -> Result<(), SamplingError> {
    const B: &str = "vm.builtin.apply_repetition_penalty";
    let (mut values, ids) = penalty_inputs(B, logits, token_ids, None)?;
    for &id in &ids {
        let x = &mut values[id as usize];
        // `float *= double`: computed in double, rounded to float.
        *x = if *x <= 0.0 { (f64::from(*x) * penalty) as f32 } else { (f64::from(*x) / penalty) as f32 };
    }
    store_f32s(logits, &values)
}

/// `vm.builtin.apply_presence_and_frequency_penalty(logits, token_ids, token_freqs,
/// presence_penalty, frequency_penalty)`, in place on `logits` (`float32`, CPU): the logit of
/// `token_ids[i]` loses `token_freqs[i] * frequency_penalty + presence_penalty`. Both id
/// tensors `int32`.
pub fn apply_presence_and_frequency_penalty(
    logits: &NdArray,
    token_ids: &NdArray,
    token_freqs: &NdArray,
    presence_penalty: f64,
    frequency_penalty: f64,
) -> Result<(), SamplingError> {
    const B: &str = "vm.builtin.apply_presence_and_frequency_penalty";
    let (mut values, ids) = penalty_inputs(B, logits, token_ids, Some(token_freqs))?;
    let freqs = i32s(token_freqs, B, "token freqs")?;
    if freqs.len() < ids.len() {
        return Err(SamplingError::TooFew {
            builtin: B,
            what: "token_freqs",
            shape: token_freqs.shape().to_vec(),
            found: freqs.len(),
            needed: ids.len(),
        });
    }
    for (&id, &freq) in ids.iter().zip(&freqs) {
        let x = &mut values[id as usize];
        *x = (f64::from(*x) - (f64::from(freq) * frequency_penalty + presence_penalty)) as f32;
    }
    store_f32s(logits, &values)
}

/// `vm.builtin.apply_softmax_with_temperature(logits, temperature)`, in place on `logits`
/// (`float32`, CPU): the softmax of `logits / temperature` over the last dimension's extent of
/// elements from the start, that is the first row only of a batch (TVM's behaviour: the other
/// rows are left as they were).
pub fn apply_softmax_with_temperature(logits: &NdArray, temperature: f64) -> Result<(), SamplingError> {
    const B: &str = "vm.builtin.apply_softmax_with_temperature";
    let mut values = f32s(logits, B, "Logits")?;
    require_cpu(logits, B, "logits")?;
    // TVM reads `vocab_size` elements from the start (nothing for an empty last dimension).
    let vocab = last_dim(logits, B, "logits")?;
    let len = values.len();
    let row = values.get_mut(..vocab).ok_or_else(|| SamplingError::TooFew {
        builtin: B,
        what: "logits",
        shape: logits.shape().to_vec(),
        found: len,
        needed: vocab,
    })?;
    let inv_temp = (1.0 / temperature) as f32;
    // TVM starts from `std::numeric_limits<float>::min()`, the smallest positive float.
    let mut m = f32::MIN_POSITIVE;
    let mut d = 0.0f64;
    for &l in row.iter() {
        let x = l * inv_temp;
        let m_prev = m;
        // `std::max(m, x)`: `m < x ? x : m`.
        if m < x {
            m = x;
        }
        d = d * f64::from((m_prev - m).exp()) + f64::from((x - m).exp());
    }
    for l in row.iter_mut() {
        let x = *l * inv_temp;
        *l = (f64::from((x - m).exp()) / d) as f32;
    }
    store_f32s(logits, &values)
}
