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
//! memory budget ([`GenerateOptions::kv_cache_bytes`]). A library without `_metadata` (the model
//! functions alone, as TVM's `nn.llm` exports them) takes what it would give from
//! [`GenerateOptions::model`] ([`ModelSettings`]) and its weights as `param_0`, `param_1`, ...
//! [`LanguageModel::continue_sampled`] and [`LanguageModel::continue_batch`] continue the
//! sequences in the same cache; as in MLC-LLM's engine, a prefill round of a sequence prefilled
//! before runs through `extend` / `batch_extend` when the library has them.
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
mod embedding;
mod error;
mod extend;
mod hybrid;
mod logits;
mod metadata;
mod nometa;
mod probe;
mod program_cache;
mod rnn;
mod state;
mod turns;

use std::path::Path;
use std::time::Duration;

use super::lm::sampler::Sampler;
pub use super::lm::sampler::{Sampling, SamplingOptionError};
use super::lm::TensorCache;
use crate::array::NdArray;
use crate::device::Device;
use crate::exec::relax::vm::value::{ObjectRef, Value, VmError};
use crate::exec::relax::vm::VirtualMachine;
use crate::exec::value::Value as ExecValue;
use crate::format::DataType;
use crate::module::LoadedTree;
pub use error::GenerateError;
use logits::{kind, last_row, logits_of, vm_kind};
use metadata::vocab_size;
pub use metadata::{ModelMetadata, ParamDim, ParamInfo};
pub use nometa::ModelSettings;
pub use state::{StateKind, RNN_MAX_HISTORY};

/// The sequence id [`LanguageModel::generate`] uses in the KV cache.
pub const SEQUENCE_ID: i64 = 0;

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
    /// What `_metadata` gives, for a library without it (see [`ModelSettings`]).
    pub model: ModelSettings,
    /// On OpenCL, a file of the kernels' program binaries in TVM's layout
    /// (`opencl.GetPreCompiledPrograms`): loaded when it exists (`SetPreCompiledPrograms`),
    /// else written after the programs are built, as MLC-LLM's engine gets and sets them
    /// before it loads the VM.
    pub opencl_program_cache: Option<std::path::PathBuf>,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            page_size: 16,
            max_total_seq_len: None,
            prefill_chunk_size: None,
            kv_cache_bytes: None,
            model: ModelSettings::default(),
            opencl_program_cache: None,
        }
    }
}

/// What [`LanguageModel::generate`] produced.
#[derive(Debug, Clone, Default)]
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
    /// A `hybrid` model's RNN state beside the KV cache (`hybrid`).
    rnn: Option<ObjectRef>,
    /// The vocabulary size, when known ([`LanguageModel::vocab_size`]).
    vocab: Option<i64>,
    /// What the next turn of the cache's sequences needs (`extend`).
    turns: turns::Turns,
    /// `alloc_embedding_tensor`'s workspace, when the library has the function.
    embedding: Option<embedding::Workspace>,
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
        if let Some(path) = &options.opencl_program_cache {
            program_cache::use_program_cache(tree, device, path)?;
        }
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
        // A library without `_metadata` (the model functions alone): the options give what it
        // would (`nometa`).
        let has_metadata = functions.iter().any(|f| f.name == "_metadata");
        let metadata = if has_metadata {
            let mut metadata = match vm.invoke("_metadata", &[])? {
                ExecValue::Str(s) => serde_json::from_str::<ModelMetadata>(&s)
                    .map_err(|e| GenerateError::Metadata { detail: e.to_string() })?,
                v => {
                    return Err(GenerateError::Metadata {
                        detail: format!("it returned {}, not a string", vm_kind(&v)),
                    })
                }
            };
            options.model.apply(&mut metadata)?;
            metadata
        } else {
            options.model.metadata(nometa::CacheOptions {
                max_total_seq_len: options.max_total_seq_len,
                kv_cache_bytes: options.kv_cache_bytes.is_some(),
                prefill_chunk_size: options.prefill_chunk_size,
            })?
        };
        metadata.check_supported()?;
        let kind = StateKind::of(metadata.kv_state_kind.as_deref()).unwrap_or(StateKind::KvCache);
        for &(name, why) in kind.steps().iter().chain(kind.creators()) {
            param_count(name, why)?;
        }
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
                    Some(nometa::indexed_params(&cache)?)
                } else {
                    let names: Vec<&str> = metadata.params.iter().map(|p| p.name.as_str()).collect();
                    Some(cache.param_array_by_name(&names)?)
                }
            }
            (true, None) => return Err(GenerateError::WeightsMissing),
            (false, Some(dir)) => return Err(GenerateError::WeightsBound { dir: dir.to_path_buf() }),
            (false, None) => None,
        };
        let params = arrays.as_ref().map(|a| ExecValue::Tuple(a.iter().cloned().map(ExecValue::Tensor).collect()));
        let packed = arrays.map(|a| Value::tuple(a.into_iter().map(Value::Tensor)));
        let vocab = vocab_size(&metadata, params.as_ref());
        let turns = turns::Turns::new(&functions);
        let mut lm = LanguageModel {
            vm,
            metadata,
            params,
            packed,
            options: options.clone(),
            cache: None,
            rnn: None,
            vocab,
            turns,
            embedding: None,
        };
        lm.embedding = embedding::Workspace::alloc(&lm.vm, lm.prefill_chunk_size())?;
        if let (None, Some(budget)) = (options.max_total_seq_len, options.kv_cache_bytes) {
            lm.options.max_total_seq_len = Some(lm.tokens_in_budget(budget)?);
        }
        if !has_metadata {
            lm.settle_without_metadata()?;
        }
        Ok(lm)
    }

    /// The most tokens a KV cache of `budget` bytes of pages holds: a cache of one page shows
    /// the model's pages (layers x 2 x KV heads x page size x head dim, of the cache's dtype);
    /// TVM adds one page to `ceil(max_total_seq_len / page_size)`, and two per sequence with a
    /// sliding window.
    fn tokens_in_budget(&mut self, budget: u64) -> Result<i64, GenerateError> {
        if self.state_kind() == StateKind::Rnn {
            return Err(GenerateError::BudgetWithoutCache { budget });
        }
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
            .ok_or_else(|| GenerateError::Result {
                function: "create_tir_paged_kv_cache",
                detail: "a KV cache of pages of no bytes".into(),
            })?;
        let extra = 1 + if self.metadata.sliding_window_size > 0 { 2 * c.reserved_num_seqs } else { 0 };
        let pages = i64::try_from(budget / page_bytes).unwrap_or(i64::MAX);
        if pages <= extra {
            return Err(GenerateError::BudgetTooSmall { budget, page_size: page, page_bytes, extra_pages: extra });
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

    /// The hidden size, as MLC-LLM's engine learns it: from the tensor of the library's
    /// `alloc_embedding_tensor` (allocated once, with the model); `None` when the library has
    /// no such function.
    pub fn hidden_size(&self) -> Option<i64> {
        self.embedding.as_ref().map(embedding::Workspace::hidden)
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

    /// A new KV cache (`create_tir_paged_kv_cache`), or RNN state for an `rnn_state` model, with
    /// one empty sequence; a `hybrid` model's RNN state is made beside the cache (`hybrid`).
    fn new_cache(&mut self) -> Result<ObjectRef, GenerateError> {
        if self.state_kind() == StateKind::Rnn {
            return self.new_rnn_state();
        }
        if self.is_hybrid() {
            self.new_companion_state()?;
        }
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
        self.add_to_companion(seq)?;
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
        if self.is_hybrid() {
            return self.hybrid_forward(cache, func, ids);
        }
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
        sampling.check()?;
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt { index: None });
        }
        self.check_ids(prompt)?;
        self.check_capacity([prompt.len()], max_new_tokens)?;
        let mut sampler = Sampler::new(sampling, sampling.seed);
        // Drop the previous cache first, so that its pages are free before the new one is made.
        self.cache = None;
        let cache = self.new_cache()?;
        self.turns.reset(1);
        self.cache = Some(ExecValue::Object(cache.clone()));
        if max_new_tokens == 0 {
            return Ok(Generation::default());
        }
        self.run_turn(&cache, prompt, max_new_tokens, &mut sampler, &mut on_token)
    }

    /// Refuses prompts (of these lengths) and new tokens that do not fit the KV cache.
    fn check_capacity(
        &self,
        prompt_lengths: impl IntoIterator<Item = usize>,
        max_new_tokens: usize,
    ) -> Result<(), GenerateError> {
        if self.state_kind() == StateKind::Rnn {
            // An RNN state holds a fixed state per sequence, however long it runs.
            return Ok(());
        }
        if self.max_total_seq_len() <= 0 {
            return Err(GenerateError::NoCacheSize { context_window_size: self.metadata.context_window_size });
        }
        // In u128: prompts and `max_new_tokens` near 2^64 cannot overflow the sum. A sequence
        // with a sliding window holds at most its window and one chunk, however long it runs.
        let lengths: Vec<usize> = prompt_lengths.into_iter().collect();
        let per_seq = (max_new_tokens as u128).saturating_sub(1);
        let total: u128 = lengths.iter().map(|&l| l as u128 + per_seq).sum();
        let sliding = self.metadata.sliding_window_size > 0;
        if !sliding && total > self.max_total_seq_len() as u128 {
            return Err(GenerateError::PromptTooLong {
                prompts: lengths,
                max_new_tokens,
                needed: u64::try_from(total).unwrap_or(u64::MAX),
                capacity: self.max_total_seq_len(),
            });
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
}
