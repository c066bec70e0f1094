//! Text generation with a language-model library as MLC-LLM exports them, with the
//! functions MLC-LLM's engine calls (`mlc-ai/mlc-llm`'s `cpp/serve/function_table.cc`):
//! `embed`, `prefill`, `decode`, `create_tir_paged_kv_cache` and `_metadata`, the weights either
//! bound into the library as constants or passed as the last parameter (`packed_params`, a
//! tuple of tensors read from a tensor cache, `tensor-cache.json` and its shards). Feature
//! `llm`.
//!
//! A [`LanguageModel`] makes the VM, reads the model's metadata, loads the weights once and
//! creates the paged KV cache; [`LanguageModel::generate`] then runs one sequence: the prompt
//! in chunks of at most `prefill_chunk_size` tokens through `prefill`, then one token at a time
//! through `decode`, each step framed by `vm.builtin.kv_state_begin_forward` and
//! `vm.builtin.kv_state_end_forward` as MLC-LLM frames it, picking the token of largest logit
//! (greedy decoding: the first of equal largest ones, as numpy's `argmax`). No tokenizer: token
//! ids in, token ids out. [`LanguageModel::generate_sampled`] draws each token with TVM's
//! sampling builtin instead ([`Sampling`]), and [`LanguageModel::generate_batch`] runs several
//! sequences in one batch through `batch_prefill` and `batch_decode`, as MLC-LLM's engine does.
//! A model with a sliding window gets it on each sequence
//! (`attention_kv_cache_enable_sliding_window_for_seq`), and the cache may be sized from a
//! memory budget ([`GenerateOptions::kv_cache_bytes`]).
//!
//! ```no_run
//! use mblob_runtime::device::Device;
//! use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};
//! use mblob_runtime::{load_library, LoadOptions, Registry};
//!
//! // SAFETY: the library is trusted to run (its initialisers run when it is opened).
//! let tree = unsafe { load_library("model.so".as_ref(), &Registry::default(), &LoadOptions::default())? };
//! let mut lm = LanguageModel::new(&tree, Device::cpu(0), Some("params".as_ref()), &GenerateOptions::default())?;
//! let out = lm.generate(&[1, 2, 3], 16)?;
//! println!("{:?}", out.tokens);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batch;

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::lm::sampler::Sampler;
pub use super::lm::sampler::Sampling;
use super::lm::{SamplingError, TensorCache, TensorCacheError};
use crate::array::NdArray;
use crate::device::Device;
use crate::exec::relax::vm::value::{tuple_item, ObjectRef, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;
use crate::exec::value::Value as ExecValue;
use crate::format::DataType;
use crate::module::LoadedTree;

/// The sequence id [`LanguageModel::generate`] uses in the KV cache.
pub const SEQUENCE_ID: i64 = 0;

/// What can go wrong when generating.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// A call of the VM (a function of the library or a builtin) failed.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The weights could not be read.
    #[error("cannot read the weights: {0}")]
    Weights(#[from] TensorCacheError),
    /// TVM's sampling builtin refused the logits.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The library lacks a function MLC-LLM's engine calls.
    #[error("the library has no VM function `{name}`, which {why} (it has: {available})")]
    MissingFunction {
        /// The function.
        name: &'static str,
        /// What it is for.
        why: &'static str,
        /// The VM functions it has.
        available: String,
    },
    /// `_metadata` did not return the JSON MLC-LLM writes.
    #[error("the model's metadata (`_metadata`) is not what MLC-LLM writes: {detail}")]
    Metadata {
        /// What is wrong.
        detail: String,
    },
    /// The weights are parameters but no tensor cache was given, or the other way round.
    #[error("{0}")]
    WeightsMode(String),
    /// A function returned something other than what MLC-LLM's functions return.
    #[error("`{function}` returned {detail}")]
    Result {
        /// The function.
        function: &'static str,
        /// What it returned.
        detail: String,
    },
    /// The prompt is empty, or the prompt and the new tokens do not fit the context window.
    #[error("{0}")]
    Request(String),
    /// A token id of the prompt is not in the vocabulary (negative, or not below its size):
    /// refused before anything runs, as the embedding kernel would read outside its table.
    #[error("token id {id} (prompt position {position}) is out of range: {}", vocab_range(*vocab))]
    TokenId {
        /// The id.
        id: i64,
        /// Its position in the prompt.
        position: usize,
        /// The vocabulary size, when known.
        vocab: Option<i64>,
    },
}

/// Settings of the KV cache and of the run that the model's metadata does not give.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Tokens per page of the paged KV cache (MLC-LLM's default, 16).
    pub page_size: i64,
    /// Tokens the cache holds in all (`max_total_seq_len`); default: the metadata's
    /// `context_window_size`.
    pub max_total_seq_len: Option<i64>,
    /// The longest prefill chunk; default: the metadata's `prefill_chunk_size`.
    pub prefill_chunk_size: Option<i64>,
    /// Size the KV cache from a memory budget (bytes for its pages), as MLC-LLM's engine sizes
    /// it from the memory it may use, when `max_total_seq_len` is not given: as many tokens as
    /// whole pages of the model's layers, heads and dtype fit (see
    /// [`LanguageModel::new`]).
    pub kv_cache_bytes: Option<u64>,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions { page_size: 16, max_total_seq_len: None, prefill_chunk_size: None, kv_cache_bytes: None }
    }
}

/// The fields of MLC-LLM's model metadata (`_metadata`) that generation reads.
#[derive(Debug, Clone, Deserialize)]
pub struct ModelMetadata {
    /// The weights, in the order of the `packed_params` tuple.
    #[serde(default)]
    pub params: Vec<ParamInfo>,
    /// The longest sequence the model was built for.
    pub context_window_size: i64,
    /// The most tokens one prefill takes.
    pub prefill_chunk_size: i64,
    /// The most sequences of one batch.
    #[serde(default = "one")]
    pub max_batch_size: i64,
    /// The sliding window (`-1`: none; `sliding_window` in older libraries).
    #[serde(default = "minus_one", alias = "sliding_window")]
    pub sliding_window_size: i64,
    /// The attention sinks a sequence keeps in front of its sliding window.
    #[serde(default)]
    pub attention_sink_size: i64,
    /// `kv_cache` for a paged KV cache (`rnn_state` models are not supported).
    #[serde(default)]
    pub kv_state_kind: Option<String>,
    /// The model's architecture (`llama`, ...).
    #[serde(default)]
    pub model_type: Option<String>,
    /// Whether the library was built for disaggregated prefill and decode (KV transfer between
    /// engines); mblob refuses such a library.
    #[serde(default)]
    pub disaggregation: bool,
    /// Tensor-parallel shards (Disco workers); mblob runs one.
    #[serde(default = "one")]
    pub tensor_parallel_shards: i64,
    /// Pipeline-parallel stages (Disco groups); mblob runs one.
    #[serde(default = "one")]
    pub pipeline_parallel_stages: i64,
    /// The vocabulary size, when the metadata gives it (MLC-LLM's does not: it is then read
    /// from the embedding weight's shape, see [`LanguageModel::vocab_size`]).
    #[serde(default)]
    pub vocab_size: Option<i64>,
}

impl ModelMetadata {
    /// Refuses what mblob does not run, naming it: an RNN state or a hybrid KV state,
    /// disaggregation, several tensor-parallel shards or pipeline stages (Disco).
    pub fn check_supported(&self) -> Result<(), GenerateError> {
        let refuse = |detail: String| Err(GenerateError::Metadata { detail });
        if let Some(k) = self.kv_state_kind.as_deref().filter(|k| *k != "kv_cache") {
            return refuse(format!("its KV state is `{k}`; mblob generates with a paged KV cache (`kv_cache`) only"));
        }
        if self.disaggregation {
            return refuse("it is built for disaggregation (KV transfer between prefill and decode engines), which mblob does not run".into());
        }
        if self.tensor_parallel_shards > 1 || self.pipeline_parallel_stages > 1 {
            return refuse(format!(
                "it is built for {} tensor-parallel shards and {} pipeline stages (Disco groups); mblob runs one \
                 shard in one stage",
                self.tensor_parallel_shards, self.pipeline_parallel_stages
            ));
        }
        Ok(())
    }
}

fn one() -> i64 {
    1
}

fn minus_one() -> i64 {
    -1
}

/// A weight of the model, as the metadata lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct ParamInfo {
    /// Its name in the tensor cache.
    pub name: String,
    /// Its shape, when given: sizes, and names for the symbolic ones (MLC-LLM writes
    /// `["vocab_size", 256]`, which its engine resolves from the chat config).
    #[serde(default)]
    pub shape: Vec<ParamDim>,
    /// Its dtype, when given.
    #[serde(default)]
    pub dtype: Option<String>,
}

/// One dimension of a weight's shape in the metadata: a size, or the name of a symbolic one
/// (`vocab_size`; `-1` is MLC-LLM's other spelling of a dynamic size).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ParamDim {
    /// A size.
    Size(i64),
    /// The name of a symbolic size.
    Named(String),
}

/// What [`LanguageModel::generate`] produced.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The new tokens: the prefill's, then one per decode step.
    pub tokens: Vec<i32>,
    /// The logits each token was picked from (`vocab_size` floats each), in order.
    pub logits: Vec<Vec<f32>>,
    /// How long the prefill took (all its chunks, embedding and argmax included).
    pub prefill_time: Duration,
    /// How long each decode step took (begin and end of the forward pass, embedding, `decode`
    /// and argmax).
    pub decode_times: Vec<Duration>,
}

/// A language-model library ready to generate: its VM, weights and KV cache.
#[derive(Debug)]
pub struct LanguageModel {
    vm: VirtualMachine,
    metadata: ModelMetadata,
    /// The `packed_params` tuple, when the functions take the weights as a parameter.
    params: Option<ExecValue>,
    /// The same tuple as the VM's value, made once and passed to every call as it is.
    packed: Option<Value>,
    options: GenerateOptions,
    cache: Option<ExecValue>,
    /// The vocabulary size, when known ([`LanguageModel::vocab_size`]).
    vocab: Option<i64>,
}

impl LanguageModel {
    /// Makes the VM of `tree` on `device`, reads `_metadata` and, with `weights`, the tensor
    /// cache in that directory (each weight made once, mapped from its shard where it can be).
    /// A library whose functions take `packed_params` needs `weights`; one with the weights
    /// bound as constants refuses them. On a GPU (a library built for OpenCL or CUDA) the
    /// weights are uploaded to the device once, here, and the KV cache lives there too.
    pub fn new(
        tree: &LoadedTree,
        device: Device,
        weights: Option<&Path>,
        options: &GenerateOptions,
    ) -> Result<LanguageModel, GenerateError> {
        let _span = tracing::debug_span!("lm_new", %device).entered();
        let vm = VirtualMachine::new(tree, device)?;
        let functions = vm.functions();
        let available = || functions.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ");
        let param_count = |name: &'static str, why: &'static str| {
            functions
                .iter()
                .find(|f| f.name == name)
                .map(|f| f.params.len())
                .ok_or_else(|| GenerateError::MissingFunction { name, why, available: available() })
        };
        let embed = param_count("embed", "turns token ids into embeddings")?;
        param_count("prefill", "runs the prompt")?;
        param_count("decode", "runs one new token")?;
        param_count("create_tir_paged_kv_cache", "creates the KV cache (a TIR paged KV cache)")?;
        param_count("_metadata", "describes the model")?;
        let metadata = match vm.invoke("_metadata", &[])? {
            ExecValue::Str(s) => serde_json::from_str::<ModelMetadata>(&s)
                .map_err(|e| GenerateError::Metadata { detail: e.to_string() })?,
            v => return Err(GenerateError::Metadata { detail: format!("it returned {}, not a string", vm_kind(&v)) }),
        };
        metadata.check_supported()?;
        let packed = match embed {
            1 => false,
            2 => true,
            n => {
                return Err(GenerateError::Result {
                    function: "embed",
                    detail: format!("a signature of {n} parameters (expected input_ids[, packed_params])"),
                })
            }
        };
        let arrays = match (packed, weights) {
            (true, Some(dir)) => {
                let _span = tracing::debug_span!("lm_weights", dir = %dir.display()).entered();
                let mut cache = TensorCache::new();
                cache.load(dir, device)?;
                if metadata.params.is_empty() {
                    // As MLC-LLM's engine loads a library whose metadata lists no weights:
                    // `param_0`, `param_1`, ... until one is missing.
                    Some(cache.param_array("param", -1)?)
                } else {
                    let names: Vec<&str> = metadata.params.iter().map(|p| p.name.as_str()).collect();
                    Some(cache.param_array_by_name(&names)?)
                }
            }
            (true, None) => {
                return Err(GenerateError::WeightsMode(format!(
                    "the model takes its {} weights as a parameter (packed_params): give the directory of its \
                     tensor cache (tensor-cache.json and the shards)",
                    metadata.params.len()
                )))
            }
            (false, Some(dir)) => {
                return Err(GenerateError::WeightsMode(format!(
                    "the model's weights are bound into the library (its functions take no packed_params): \
                     it needs no weights, but {} was given",
                    dir.display()
                )))
            }
            (false, None) => None,
        };
        let params = arrays.as_ref().map(|a| ExecValue::Tuple(a.iter().cloned().map(ExecValue::Tensor).collect()));
        let packed = arrays.map(|a| Value::tuple(a.into_iter().map(Value::Tensor)));
        let vocab = vocab_size(&metadata, params.as_ref());
        let mut lm = LanguageModel { vm, metadata, params, packed, options: options.clone(), cache: None, vocab };
        if let (None, Some(budget)) = (options.max_total_seq_len, options.kv_cache_bytes) {
            lm.options.max_total_seq_len = Some(lm.tokens_in_budget(budget)?);
        }
        Ok(lm)
    }

    /// The most tokens a KV cache of `budget` bytes of pages holds: a cache of one page shows
    /// the model's pages (layers x 2 x KV heads x page size x head dim, of the cache's dtype);
    /// TVM adds one page to `ceil(max_total_seq_len / page_size)`, and two per sequence with a
    /// sliding window.
    fn tokens_in_budget(&mut self, budget: u64) -> Result<i64, GenerateError> {
        let page = self.options.page_size;
        self.options.max_total_seq_len = Some(page);
        let probe = self.new_cache()?;
        let Some(c) = probe.downcast_ref::<super::kv_cache::PagedKvCache>().map(|c| c.config().clone()) else {
            return Err(GenerateError::Result {
                function: "create_tir_paged_kv_cache",
                detail: format!("{}, not TVM's paged KV cache", probe.type_key()),
            });
        };
        let page_bytes = crate::array::tensor_bytes(c.dtype, &[c.num_layers, 2, c.num_kv_heads, page, c.qk_head_dim])
            .filter(|&b| b > 0)
            .ok_or_else(|| GenerateError::Request("a KV cache page of no bytes".into()))?;
        let extra = 1 + if self.metadata.sliding_window_size > 0 { 2 * c.reserved_num_seqs } else { 0 };
        let pages = i64::try_from(budget / page_bytes).unwrap_or(i64::MAX);
        if pages <= extra {
            return Err(GenerateError::Request(format!(
                "a KV cache of {budget} bytes holds no token: each page of {page} tokens takes {page_bytes} bytes, \
                 and the cache needs {extra} more than the tokens' pages"
            )));
        }
        Ok((pages - extra).saturating_mul(page).min(i64::from(i32::MAX)))
    }

    /// The vocabulary size: the metadata's `vocab_size`, else the first dimension of the token
    /// embedding weight (`*embed_tokens.weight`, `*wte.weight`, quantized `*embed_tokens.q_weight`),
    /// as loaded when the weights are a parameter, else as the metadata lists it. `None` when
    /// neither says (then only negative token ids are refused).
    pub fn vocab_size(&self) -> Option<i64> {
        self.vocab
    }

    /// Refuses a prompt with a token id outside the vocabulary.
    fn check_ids(&self, prompt: &[i32]) -> Result<(), GenerateError> {
        let limit = self.vocab.unwrap_or(i64::MAX);
        match prompt.iter().map(|&id| i64::from(id)).enumerate().find(|&(_, id)| id < 0 || id >= limit) {
            Some((position, id)) => Err(GenerateError::TokenId { id, position, vocab: self.vocab }),
            None => Ok(()),
        }
    }

    /// The model's metadata.
    pub fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    /// The VM, for calls of other functions and builtins.
    pub fn vm(&self) -> &VirtualMachine {
        &self.vm
    }

    /// The KV cache of the current generation, when one started.
    pub fn kv_cache(&self) -> Option<&ExecValue> {
        self.cache.as_ref()
    }

    fn max_total_seq_len(&self) -> i64 {
        self.options.max_total_seq_len.unwrap_or(self.metadata.context_window_size)
    }

    fn prefill_chunk_size(&self) -> i64 {
        self.options.prefill_chunk_size.unwrap_or(self.metadata.prefill_chunk_size).max(1)
    }

    /// A new KV cache (`create_tir_paged_kv_cache`), with one empty sequence.
    fn new_cache(&mut self) -> Result<ObjectRef, GenerateError> {
        let _span = tracing::debug_span!("lm_create_kv_cache").entered();
        let shape = |v: i64| ExecValue::Shape([v].into());
        let sliding = i64::from(self.metadata.sliding_window_size > 0);
        let cache = self.vm.invoke(
            "create_tir_paged_kv_cache",
            &[
                shape(self.metadata.max_batch_size),
                shape(self.max_total_seq_len()),
                shape(self.prefill_chunk_size()),
                shape(self.options.page_size),
                shape(sliding),
            ],
        )?;
        let ExecValue::Object(cache) = cache else {
            return Err(GenerateError::Result {
                function: "create_tir_paged_kv_cache",
                detail: format!("{}, not a KV cache object", vm_kind(&cache)),
            });
        };
        self.add_sequence(&cache, SEQUENCE_ID)?;
        Ok(cache)
    }

    /// Adds sequence `seq` to the cache, with the model's sliding window when it has one (as
    /// MLC-LLM's engine does).
    fn add_sequence(&self, cache: &ObjectRef, seq: i64) -> Result<(), GenerateError> {
        self.vm.invoke("vm.builtin.kv_state_add_sequence", &[ExecValue::Object(cache.clone()), ExecValue::Int(seq)])?;
        if self.metadata.sliding_window_size > 0 {
            self.vm.invoke(
                "vm.builtin.attention_kv_cache_enable_sliding_window_for_seq",
                &[
                    ExecValue::Object(cache.clone()),
                    ExecValue::Int(seq),
                    ExecValue::Int(self.metadata.sliding_window_size),
                    // MLC-LLM reads a negative sink size (Gemma 3 writes -1) as none.
                    ExecValue::Int(self.metadata.attention_sink_size.max(0)),
                ],
            )?;
        }
        Ok(())
    }

    /// One forward pass of `func` (`prefill` or `decode`) over `ids` of the sequence: the
    /// logits of its last position. Only the token ids go to the device and only that last
    /// row of logits comes back (besides the cache's own per-round arrays): the embeddings stay
    /// on the device between `embed` and `func`, reshaped by a view, and the weights tuple is
    /// the one made with the model.
    fn forward(&self, cache: &ObjectRef, func: &'static str, ids: &[i32]) -> Result<Vec<f32>, GenerateError> {
        let _span = tracing::trace_span!("lm_forward", function = func, tokens = ids.len()).entered();
        let n = ids.len() as i64;
        let cache = Value::Object(cache.clone());
        let shape = |v: i64| Value::Shape([v].into());
        self.vm.call_vm_values("vm.builtin.kv_state_begin_forward", &[&cache, &shape(SEQUENCE_ID), &shape(n)])?;
        let embedded = self.embed(ids)?;
        let hidden = embedded.shape()[1];
        let embedded = Value::Tensor(embedded.view(&[1, n, hidden], embedded.dtype()).map_err(VmError::from)?);
        let mut args = vec![&embedded, &cache];
        args.extend(self.packed.as_ref());
        let result = self.vm.call_vm_values(func, &args)?;
        self.vm.call_vm_values("vm.builtin.kv_state_end_forward", &[&cache])?;
        last_row(func, &logits_of(func, result)?)
    }

    /// Generates up to `max_new_tokens` tokens after `prompt` greedily, in a new KV cache.
    pub fn generate(&mut self, prompt: &[i32], max_new_tokens: usize) -> Result<Generation, GenerateError> {
        self.generate_with(prompt, max_new_tokens, |_| {})
    }

    /// [`LanguageModel::generate`], calling `on_token` with each new token as it comes.
    pub fn generate_with(
        &mut self,
        prompt: &[i32],
        max_new_tokens: usize,
        on_token: impl FnMut(i32),
    ) -> Result<Generation, GenerateError> {
        self.generate_sampled(prompt, max_new_tokens, &Sampling::default(), on_token)
    }

    /// [`LanguageModel::generate_with`], each token picked as `sampling` says (greedy at
    /// temperature 0; else TVM's `sample_top_p_from_logits` with MLC-LLM's draws, see
    /// [`Sampling`]).
    pub fn generate_sampled(
        &mut self,
        prompt: &[i32],
        max_new_tokens: usize,
        sampling: &Sampling,
        mut on_token: impl FnMut(i32),
    ) -> Result<Generation, GenerateError> {
        let _span = tracing::debug_span!("lm_generate", prompt = prompt.len(), max_new_tokens).entered();
        sampling.check().map_err(GenerateError::Request)?;
        if prompt.is_empty() {
            return Err(GenerateError::Request("the prompt is empty: give at least one token id".into()));
        }
        self.check_ids(prompt)?;
        self.check_capacity([prompt.len()], max_new_tokens)?;
        let mut sampler = Sampler::new(sampling, sampling.seed);
        let mut out = Generation {
            tokens: Vec::new(),
            logits: Vec::new(),
            prefill_time: Duration::ZERO,
            decode_times: Vec::new(),
        };
        // Drop the previous cache first, so that its pages are free before the new one is made.
        self.cache = None;
        let cache = self.new_cache()?;
        self.cache = Some(ExecValue::Object(cache.clone()));
        if max_new_tokens == 0 {
            return Ok(out);
        }
        let start = Instant::now();
        let mut logits = Vec::new();
        for chunk in prompt.chunks(self.prefill_chunk_size() as usize) {
            logits = self.forward(&cache, "prefill", chunk)?;
        }
        let mut token = pick(&mut sampler, "prefill", &logits)?;
        out.prefill_time = start.elapsed();
        out.tokens.push(token);
        out.logits.push(logits);
        on_token(token);
        while out.tokens.len() < max_new_tokens {
            let start = Instant::now();
            let logits = self.forward(&cache, "decode", &[token])?;
            token = pick(&mut sampler, "decode", &logits)?;
            out.decode_times.push(start.elapsed());
            out.tokens.push(token);
            out.logits.push(logits);
            on_token(token);
        }
        Ok(out)
    }

    /// Refuses prompts (of these lengths) and new tokens that do not fit the KV cache.
    fn check_capacity(
        &self,
        prompt_lengths: impl IntoIterator<Item = usize>,
        max_new_tokens: usize,
    ) -> Result<(), GenerateError> {
        if self.max_total_seq_len() <= 0 {
            return Err(GenerateError::Request(format!(
                "the model's context window is {} (a sliding-window model): give the KV cache's size \
                 (max_total_seq_len, `--max-total-seq-len`)",
                self.metadata.context_window_size
            )));
        }
        // In u128: prompts and `max_new_tokens` near 2^64 cannot overflow the sum. A sequence
        // with a sliding window holds at most its window and one chunk, however long it runs.
        let lengths: Vec<usize> = prompt_lengths.into_iter().collect();
        let per_seq = (max_new_tokens as u128).saturating_sub(1);
        let total: u128 = lengths.iter().map(|&l| l as u128 + per_seq).sum();
        let sliding = self.metadata.sliding_window_size > 0;
        if !sliding && total > self.max_total_seq_len() as u128 {
            let prompts = lengths.iter().map(usize::to_string).collect::<Vec<_>>().join(" + ");
            return Err(GenerateError::Request(format!(
                "{prompts} prompt tokens and {max_new_tokens} new ones per sequence need {total} positions in the KV \
                 cache, more than its {} (the model's context window)",
                self.max_total_seq_len()
            )));
        }
        Ok(())
    }

    /// The weights passed as `packed_params`, when the functions take them.
    pub fn params(&self) -> Option<&[ExecValue]> {
        match &self.params {
            Some(ExecValue::Tuple(items)) => Some(items),
            _ => None,
        }
    }

    /// The weights as arrays, when the functions take them.
    pub fn weight_arrays(&self) -> Vec<NdArray> {
        self.params()
            .unwrap_or_default()
            .iter()
            .filter_map(|v| match v {
                ExecValue::Tensor(a) => Some(a.clone()),
                _ => None,
            })
            .collect()
    }
}

/// The ids a vocabulary of `vocab` tokens has, for errors.
fn vocab_range(vocab: Option<i64>) -> String {
    match vocab {
        Some(v) => format!("the vocabulary has {v} ids, 0 to {}", v - 1),
        None => "a token id is not negative".into(),
    }
}

/// The vocabulary size the metadata or the loaded embedding weight gives (see
/// [`LanguageModel::vocab_size`]).
fn vocab_size(metadata: &ModelMetadata, params: Option<&ExecValue>) -> Option<i64> {
    if let Some(v) = metadata.vocab_size.filter(|&v| v > 0) {
        return Some(v);
    }
    let is_embedding = |name: &str| {
        ["embed_tokens.weight", "embed_tokens.q_weight", "wte.weight", "embeddings.weight"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
    };
    let index = metadata.params.iter().position(|p| is_embedding(&p.name))?;
    let loaded = match params {
        Some(ExecValue::Tuple(items)) => match items.get(index) {
            Some(ExecValue::Tensor(a)) => a.shape().first().copied(),
            _ => None,
        },
        _ => None,
    };
    let listed = || match metadata.params[index].shape.first() {
        Some(ParamDim::Size(v)) => Some(*v),
        _ => None,
    };
    loaded.or_else(listed).filter(|&v| v > 0)
}

/// The last row of a logits tensor (`[1, 1, vocab]`, or `[1, n, vocab]` from a prefill that
/// returns every position), as floats: only its `vocab * 4` bytes are read, from wherever the
/// tensor is.
fn last_row(function: &'static str, logits: &NdArray) -> Result<Vec<f32>, GenerateError> {
    if logits.dtype() != DataType::F32 {
        return Err(GenerateError::Result {
            function,
            detail: format!("logits of dtype {:?}; mblob generates from float32 logits", logits.dtype()),
        });
    }
    let vocab = match logits.shape().last() {
        Some(&v) if v > 0 => v as usize,
        _ => return Err(GenerateError::Result { function, detail: format!("logits of shape {:?}", logits.shape()) }),
    };
    let at =
        vocab.checked_mul(4).and_then(|row| logits.nbytes().checked_sub(row)).ok_or_else(|| GenerateError::Result {
            function,
            detail: format!("logits of shape {:?} with {} bytes", logits.shape(), logits.nbytes()),
        })?;
    let mut row = vec![0u8; vocab * 4];
    logits.storage().read(at, &mut row).map_err(VmError::from)?;
    Ok(row.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// The logits a model function returned: the tensor, or the first item of its tuple.
fn logits_of(function: &'static str, result: Value) -> Result<NdArray, GenerateError> {
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

/// The next token from `logits`: the sampler's draw, or the argmax when greedy.
fn pick(sampler: &mut Sampler, function: &'static str, logits: &[f32]) -> Result<i32, GenerateError> {
    match sampler.sample(logits)? {
        Some(token) => Ok(token),
        None => argmax(function, logits),
    }
}

/// The index of the largest logit (the first of equal ones, as numpy's `argmax`).
fn argmax(function: &'static str, logits: &[f32]) -> Result<i32, GenerateError> {
    if logits.iter().any(|x| x.is_nan()) {
        return Err(GenerateError::Result { function, detail: "logits with NaN".into() });
    }
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    i32::try_from(best).map_err(|_| GenerateError::Result { function, detail: "a vocabulary past i32".into() })
}

/// A caller's value's kind, for errors.
fn vm_kind(v: &ExecValue) -> &'static str {
    match v {
        ExecValue::Tensor(_) => "a tensor",
        ExecValue::Shape(_) => "a shape",
        ExecValue::Int(_) => "an integer",
        ExecValue::Float(_) => "a float",
        ExecValue::Str(_) => "a string",
        ExecValue::Tuple(_) => "a tuple",
        ExecValue::Null => "None",
        ExecValue::Object(o) => o.type_key(),
    }
}

/// A VM value's kind, for errors (in the words of [`vm_kind`]).
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Tensor(_) => "a tensor",
        Value::Shape(_) => "a shape",
        Value::Int(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Str(_) => "a string",
        Value::Tuple(_) => "a tuple",
        Value::Null => "None",
        Value::Object(o) => o.type_key(),
        v => v.kind(),
    }
}

/// Several sequences in one batch (the schedule is the `batch` module's; see
/// [`LanguageModel::generate_batch`]).
impl LanguageModel {
    /// Embeds `ids` (`embed`): a `[n, hidden]` tensor on the model's device.
    fn embed(&self, ids: &[i32]) -> Result<NdArray, GenerateError> {
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
    #[allow(clippy::too_many_arguments)]
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
        batch::rows_of(&logits_of(function, result)?, seqs.len())
            .map_err(|detail| GenerateError::Result { function, detail })
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
        sampling.check().map_err(GenerateError::Request)?;
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
        self.cache = Some(ExecValue::Object(cache.clone()));
        if max_new_tokens == 0 {
            return Ok(outs);
        }
        let cache = Value::Object(cache);
        let mut samplers: Vec<Sampler> =
            (0..prompts.len()).map(|i| Sampler::new(sampling, sampling.seed.wrapping_add(i as u32))).collect();
        let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let start = Instant::now();
        for round in batch::prefill_rounds(&lengths, self.prefill_chunk_size() as usize) {
            let seqs: Vec<i64> = round.iter().map(|e| e.seq as i64).collect();
            let lens: Vec<i64> = round.iter().map(|e| e.len as i64).collect();
            let ids: Vec<i32> =
                round.iter().flat_map(|e| prompts[e.seq][e.start..e.start + e.len].iter().copied()).collect();
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
            let rows =
                self.batch_round(&cache, "batch_prefill", &seqs, &lens, &ids, Some(&positions), |h| vec![1, n, h])?;
            for (e, row) in round.iter().zip(rows) {
                if e.start + e.len == lengths[e.seq] {
                    let token = pick(&mut samplers[e.seq], "batch_prefill", &row)?;
                    outs[e.seq].tokens.push(token);
                    outs[e.seq].logits.push(row);
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
                out.tokens.push(pick(sampler, "batch_decode", &row)?);
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
    fn metadata_weight_shapes_may_name_symbolic_dims() {
        // As MLC-LLM writes them for llama-type models (`mlc_llm/compiler_pass`'s metadata).
        let m: ModelMetadata = serde_json::from_str(
            r#"{"context_window_size": 256, "prefill_chunk_size": 16, "sliding_window": 16,
                "params": [{"name": "lm_head.weight", "shape": ["vocab_size", 256], "dtype": "float32"},
                           {"name": "model.norm.weight", "shape": [256], "dtype": "float32"}]}"#,
        )
        .unwrap();
        assert_eq!(m.params[0].shape, [ParamDim::Named("vocab_size".into()), ParamDim::Size(256)]);
        assert_eq!(m.params[1].shape, [ParamDim::Size(256)]);
        assert_eq!(m.sliding_window_size, 16);
    }

    #[test]
    fn unsupported_kinds_of_library_are_refused_naming_them() {
        // The fields as MLC-LLM 79d603f writes them (`compile.py`'s "Registering metadata").
        let base = r#""model_type": "gemma3_text", "quantization": "q0f32", "context_window_size": 256,
            "sliding_window_size": 16, "attention_sink_size": -1, "prefill_chunk_size": 16,
            "max_batch_size": 4, "active_vocab_size": 1000, "model_task": "chat""#;
        let meta = |extra: &str| -> ModelMetadata { serde_json::from_str(&format!("{{{base}, {extra}}}")).unwrap() };
        let ok = r#""tensor_parallel_shards": 1, "pipeline_parallel_stages": 1, "disaggregation": false, "kv_state_kind": "kv_cache""#;
        assert!(meta(ok).check_supported().is_ok());
        for (extra, word) in [
            (r#""disaggregation": true"#, "disaggregation"),
            (r#""tensor_parallel_shards": 2"#, "Disco"),
            (r#""pipeline_parallel_stages": 2"#, "Disco"),
            (r#""kv_state_kind": "rnn_state""#, "rnn_state"),
            (r#""kv_state_kind": "none""#, "`none`"),
        ] {
            let e = meta(extra).check_supported().unwrap_err().to_string();
            assert!(e.contains(word), "{extra}: {e}");
        }
    }

    #[test]
    fn argmax_takes_the_first_of_equal_largest() {
        assert_eq!(argmax("t", &[1.0, 3.0, 3.0, -1.0]).unwrap(), 1);
        assert!(argmax("t", &[1.0, f32::NAN]).is_err());
    }

    #[test]
    fn last_row_of_every_position_logits() {
        let t = NdArray::from_f32(&[0., 1., 2., 3., 4., 5.], &[1, 2, 3], Device::cpu(0)).unwrap();
        assert_eq!(last_row("t", &t).unwrap(), vec![3., 4., 5.]);
        // A view of fewer bytes than its storage: the row is the view's last.
        assert_eq!(last_row("t", &t.view(&[1, 1, 3], DataType::F32).unwrap()).unwrap(), vec![0., 1., 2.]);
    }
}
