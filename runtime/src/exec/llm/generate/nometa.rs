//! A library without `_metadata`: the model functions alone, as `tvm.relax.frontend.nn` and
//! `nn.llm`'s `PagedKVCache` export them. What MLC-LLM's metadata gives comes from the options
//! ([`ModelSettings`], with MLC-LLM's defaults where it has one), the weights are the tensor
//! cache's `param_0`, `param_1`, ... (MLC-LLM's engine: `param_array_from_cache("param", -1)`
//! when the metadata lists no weights), and the vocabulary size, when not given, is the length
//! of the logits of a one-token probe.

use super::error::GenerateError;
use super::metadata::ModelMetadata;
use crate::array::NdArray;
use crate::exec::llm::lm::TensorCache;

/// What MLC-LLM's `_metadata` gives, for a library without it. With `_metadata` these may be
/// left out; one given must agree with the metadata (`max_batch_size` may be smaller, as MLC-LLM's
/// engine's `max_num_sequence`), else [`GenerateError::Setting`] names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelSettings {
    /// The longest sequence (`context_window_size`); `-1` for a sliding-window model, whose KV
    /// cache size must then be given ([`GenerateOptions::max_total_seq_len`](super::GenerateOptions::max_total_seq_len) or
    /// [`GenerateOptions::kv_cache_bytes`](super::GenerateOptions::kv_cache_bytes)). Without `_metadata` and without a cache size it is
    /// needed.
    pub context_window_size: Option<i64>,
    /// The most sequences of one batch (default 1, MLC-LLM's).
    pub max_batch_size: Option<i64>,
    /// The sliding window each sequence gets (default: none).
    pub sliding_window_size: Option<i64>,
    /// The attention sinks kept in front of the sliding window (default 0).
    pub attention_sink_size: Option<i64>,
    /// The vocabulary size (default: the length of the logits, from a one-token probe).
    pub vocab_size: Option<i64>,
}

/// The option names, as [`ModelSettings`] and `mblob generate` spell them, for errors.
const CONTEXT: &str = "context_window_size (--context-window)";
const CACHE: &str = "max_total_seq_len (--max-total-seq-len)";
const BATCH: &str = "max_batch_size (--max-batch-size)";
const WINDOW: &str = "sliding_window_size (--sliding-window)";
const SINKS: &str = "attention_sink_size (--attention-sinks)";
const VOCAB: &str = "vocab_size (--vocab-size)";

/// MLC-LLM's cap on the default prefill chunk (`min(context_window_size, 8192)`, its model
/// configs' default).
pub(super) const MAX_DEFAULT_CHUNK: i64 = 8192;

/// The options of the KV cache that a library without `_metadata` sizes from.
#[derive(Debug, Clone, Copy)]
pub(super) struct CacheOptions {
    /// `max_total_seq_len`.
    pub max_total_seq_len: Option<i64>,
    /// Whether `kv_cache_bytes` is given.
    pub kv_cache_bytes: bool,
    /// `prefill_chunk_size`.
    pub prefill_chunk_size: Option<i64>,
}

fn setting(option: &'static str, detail: impl Into<String>) -> GenerateError {
    GenerateError::Setting { option, detail: detail.into() }
}

/// Refuses a size below `min`.
fn at_least(option: &'static str, value: Option<i64>, min: i64) -> Result<(), GenerateError> {
    match value {
        Some(v) if v < min => Err(setting(option, format!("{v} is out of range (at least {min})"))),
        _ => Ok(()),
    }
}

impl ModelSettings {
    /// Refuses values no model has.
    fn check(&self) -> Result<(), GenerateError> {
        if let Some(c) = self.context_window_size.filter(|&c| c == 0 || c < -1) {
            return Err(setting(CONTEXT, format!("{c} is out of range (a size of at least 1, or -1 for none)")));
        }
        at_least(BATCH, self.max_batch_size, 1)?;
        if let Some(w) = self.sliding_window_size.filter(|&w| w == 0 || w < -1) {
            return Err(setting(WINDOW, format!("{w} is out of range (a size of at least 1, or -1 for none)")));
        }
        at_least(SINKS, self.attention_sink_size, 0)?;
        at_least(VOCAB, self.vocab_size, 1)
    }

    /// The metadata of a library without `_metadata`, from these settings and the options of
    /// the cache ([`GenerateOptions`](super::GenerateOptions)'s fields of these names).
    pub(super) fn metadata(&self, cache: CacheOptions) -> Result<ModelMetadata, GenerateError> {
        self.check()?;
        let sized = cache.max_total_seq_len.is_some() || cache.kv_cache_bytes;
        let context = match self.context_window_size {
            Some(-1) if !sized => {
                return Err(setting(
                    CACHE,
                    "a context window of -1 (a sliding-window model) leaves the KV cache's size open: give \
                     max_total_seq_len (--max-total-seq-len) or kv_cache_bytes (--kv-cache-bytes)",
                ))
            }
            Some(c) => c,
            None if sized => -1,
            None => {
                return Err(setting(
                    CONTEXT,
                    "the library has no `_metadata` (MLC-LLM's model metadata), which gives the context window: \
                     give it, or the KV cache's size (max_total_seq_len, --max-total-seq-len, or kv_cache_bytes, \
                     --kv-cache-bytes)",
                ))
            }
        };
        // The prefill chunk: MLC-LLM's default, the context window (else the cache) up to 8192;
        // 0 while only a memory budget sizes the cache (settled by `settle_without_metadata`).
        let span = if context > 0 { Some(context) } else { cache.max_total_seq_len };
        let chunk = cache.prefill_chunk_size.or(span.map(|s| s.min(MAX_DEFAULT_CHUNK))).unwrap_or(0);
        Ok(ModelMetadata {
            params: Vec::new(),
            context_window_size: context,
            prefill_chunk_size: chunk,
            max_batch_size: self.max_batch_size.unwrap_or(1),
            sliding_window_size: self.sliding_window_size.unwrap_or(-1),
            attention_sink_size: self.attention_sink_size.unwrap_or(0),
            kv_state_kind: None,
            model_type: None,
            disaggregation: false,
            tensor_parallel_shards: 1,
            pipeline_parallel_stages: 1,
            vocab_size: self.vocab_size,
        })
    }

    /// Applies these settings to a library's `_metadata`: each one given must agree with it
    /// (`max_batch_size` may be smaller, and then replaces it).
    pub(super) fn apply(&self, m: &mut ModelMetadata) -> Result<(), GenerateError> {
        self.check()?;
        let agree = |option: &'static str, given: Option<i64>, has: Option<i64>| {
            match (given, has) {
            (Some(g), Some(h)) if g != h => Err(setting(
                option,
                format!("{g} was given, but the library's `_metadata` says {h}; leave it out (it is for a library without `_metadata`)"),
            )),
            _ => Ok(()),
        }
        };
        agree(CONTEXT, self.context_window_size, Some(m.context_window_size))?;
        agree(WINDOW, self.sliding_window_size, Some(m.sliding_window_size))?;
        agree(SINKS, self.attention_sink_size, Some(m.attention_sink_size))?;
        agree(VOCAB, self.vocab_size, m.vocab_size)?;
        if let Some(b) = self.max_batch_size {
            if b > m.max_batch_size {
                return Err(setting(
                    BATCH,
                    format!("{b} is more than the library was built for (its `_metadata` says {})", m.max_batch_size),
                ));
            }
            m.max_batch_size = b;
        }
        if m.vocab_size.is_none() {
            m.vocab_size = self.vocab_size;
        }
        Ok(())
    }
}

/// The weights of a library whose metadata lists none (or that has no `_metadata`): the tensor
/// cache's `param_0`, `param_1`, ... up to the first missing one, as MLC-LLM's engine loads
/// them (`param_array_from_cache("param", -1)`).
pub(super) fn indexed_params(cache: &TensorCache) -> Result<Vec<NdArray>, GenerateError> {
    let params = cache.param_array("param", -1)?;
    if params.is_empty() {
        return Err(GenerateError::NoIndexedWeights);
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: CacheOptions =
        CacheOptions { max_total_seq_len: None, kv_cache_bytes: false, prefill_chunk_size: None };

    #[test]
    fn without_metadata_the_context_window_or_a_cache_size_is_needed() {
        let e = ModelSettings::default().metadata(NONE).unwrap_err();
        assert!(matches!(e, GenerateError::Setting { option, .. } if option == CONTEXT), "{e}");
        let s = ModelSettings { context_window_size: Some(-1), ..ModelSettings::default() };
        let e = s.metadata(NONE).unwrap_err();
        assert!(matches!(e, GenerateError::Setting { option, .. } if option == CACHE), "{e}");
        // MLC-LLM's defaults: one sequence, no window, the chunk min(context, 8192).
        let s = ModelSettings { context_window_size: Some(20000), ..ModelSettings::default() };
        let m = s.metadata(NONE).unwrap();
        assert_eq!((m.prefill_chunk_size, m.max_batch_size, m.sliding_window_size), (8192, 1, -1));
        let o = CacheOptions { max_total_seq_len: Some(64), ..NONE };
        let m = ModelSettings::default().metadata(o).unwrap();
        assert_eq!((m.context_window_size, m.prefill_chunk_size), (-1, 64));
    }

    #[test]
    fn settings_contradicting_the_metadata_are_refused_naming_them() {
        let s = ModelSettings { context_window_size: Some(128), ..ModelSettings::default() };
        let mut m = s.metadata(NONE).unwrap();
        m.max_batch_size = 4;
        let given = ModelSettings { context_window_size: Some(64), ..ModelSettings::default() };
        assert!(given.apply(&mut m.clone()).unwrap_err().to_string().contains("--context-window"));
        let given = ModelSettings { max_batch_size: Some(8), ..ModelSettings::default() };
        assert!(given.apply(&mut m.clone()).unwrap_err().to_string().contains("--max-batch-size"));
        let given = ModelSettings { max_batch_size: Some(2), ..ModelSettings::default() };
        given.apply(&mut m).unwrap();
        assert_eq!(m.max_batch_size, 2);
        let bad = ModelSettings { sliding_window_size: Some(0), ..ModelSettings::default() };
        assert!(bad.metadata(NONE).unwrap_err().to_string().contains("--sliding-window"));
    }
}
