//! What can go wrong when generating.

use std::path::PathBuf;

use super::super::lm::sampler::SamplingOptionError;
use super::super::lm::{SamplingError, TensorCacheError};
use crate::exec::relax::vm::value::VmError;

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
    /// A setting that `_metadata` gives is missing (the library has none and the options do
    /// not give it), or an option contradicts the library's `_metadata`.
    #[error("{option}: {detail}")]
    Setting {
        /// The option, as [`ModelSettings`](super::ModelSettings) and `mblob generate` name it.
        option: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The model takes its weights as a parameter (`packed_params`), but no tensor cache was
    /// given.
    #[error(
        "the model takes its weights as a parameter (packed_params): give the directory of its tensor cache \
         (tensor-cache.json and the shards)"
    )]
    WeightsMissing,
    /// The model's weights are bound into the library, but a tensor cache was given.
    #[error(
        "the model's weights are bound into the library (its functions take no packed_params): it needs no \
         weights, but {} was given",
        dir.display()
    )]
    WeightsBound {
        /// The directory given.
        dir: PathBuf,
    },
    /// The library's `_metadata` lists no weights (or it has none), and the tensor cache has
    /// no `param_0`, which MLC-LLM's engine then reads.
    #[error(
        "the tensor cache has no record `param_0`: a library whose `_metadata` lists no weights (or that has no \
         `_metadata`) reads them as `param_0`, `param_1`, ... (MLC-LLM's `param_array_from_cache(\"param\", -1)`)"
    )]
    NoIndexedWeights,
    /// A function returned something other than what MLC-LLM's functions return.
    #[error("`{function}` returned {detail}")]
    Result {
        /// The function.
        function: &'static str,
        /// What it returned.
        detail: String,
    },
    /// The sampling settings are out of their domain.
    #[error(transparent)]
    SamplingOption(#[from] SamplingOptionError),
    /// A batch of no prompts.
    #[error("no prompt: give at least one")]
    NoPrompt,
    /// A prompt of no tokens (of a batch: its index).
    #[error("{}", match index {
        Some(i) => format!("prompt {i} is empty: give at least one token id"),
        None => "the prompt is empty: give at least one token id".to_owned(),
    })]
    EmptyPrompt {
        /// The prompt's index in the batch; `None` for a single sequence.
        index: Option<usize>,
    },
    /// More prompts in one batch than the model's `max_batch_size`.
    #[error("{given} prompts, more than the model's max_batch_size {max}")]
    TooManyPrompts {
        /// The prompts given.
        given: usize,
        /// The model's `max_batch_size`.
        max: i64,
    },
    /// The prompts and the new tokens need more positions than the KV cache holds.
    #[error(
        "{} prompt tokens and {max_new_tokens} new ones per sequence need {needed} positions in the KV cache, \
         more than its {capacity} (the model's context window)",
        prompts.iter().map(usize::to_string).collect::<Vec<_>>().join(" + ")
    )]
    PromptTooLong {
        /// The length of each prompt.
        prompts: Vec<usize>,
        /// The new tokens asked for, per sequence.
        max_new_tokens: usize,
        /// The positions they need (each prompt and all but the last new token; `u64::MAX`
        /// when more).
        needed: u64,
        /// The positions the KV cache holds (`max_total_seq_len`).
        capacity: i64,
    },
    /// A sliding-window model (context window -1) whose KV cache size was not given.
    #[error(
        "the model's context window is {context_window_size} (a sliding-window model): give the KV cache's size \
         (max_total_seq_len, `--max-total-seq-len`)"
    )]
    NoCacheSize {
        /// The model's `context_window_size`.
        context_window_size: i64,
    },
    /// A KV cache budget ([`GenerateOptions::kv_cache_bytes`](super::GenerateOptions::kv_cache_bytes))
    /// for a model that keeps an RNN state.
    #[error("a KV cache budget ({budget} bytes) was given, but the model keeps an RNN state, not a KV cache")]
    BudgetWithoutCache {
        /// The budget, in bytes.
        budget: u64,
    },
    /// A KV cache budget that holds no token.
    #[error(
        "a KV cache of {budget} bytes holds no token: each page of {page_size} tokens takes {page_bytes} bytes, \
         and the cache needs {extra_pages} more than the tokens' pages"
    )]
    BudgetTooSmall {
        /// The budget, in bytes.
        budget: u64,
        /// Tokens per page.
        page_size: i64,
        /// Bytes per page.
        page_bytes: u64,
        /// The pages the cache takes beyond those of the tokens.
        extra_pages: i64,
    },
    /// More embeddings than the rows of the embedding workspace left from an offset
    /// (MLC-LLM's `copy_embedding_to_offset` check).
    #[error("{count} embeddings from row {offset} do not fit `{function}`'s workspace of {rows} rows")]
    EmbeddingOverflow {
        /// The function that made the workspace.
        function: &'static str,
        /// The embeddings to copy.
        count: i64,
        /// The first row.
        offset: i64,
        /// The workspace's rows.
        rows: i64,
    },
    /// A continuation (`continue_sampled`, `continue_batch`) without a generation before it.
    #[error("no generation to continue: generate first")]
    NothingToContinue,
    /// A continuation with another number of prompts than the sequences of the last
    /// generation.
    #[error("{given} prompts for the {sequences} sequences of the last generation: give one per sequence")]
    TurnCount {
        /// The prompts given.
        given: usize,
        /// The sequences of the last generation.
        sequences: usize,
    },
    /// The OpenCL program cache
    /// ([`GenerateOptions::opencl_program_cache`](super::GenerateOptions::opencl_program_cache))
    /// cannot be read, written or loaded.
    #[error("OpenCL program cache {}: {detail}", path.display())]
    ProgramCache {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
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

/// The ids a vocabulary of `vocab` tokens has, for errors.
fn vocab_range(vocab: Option<i64>) -> String {
    match vocab {
        Some(v) => format!("the vocabulary has {v} ids, 0 to {}", v - 1),
        None => "a token id is not negative".into(),
    }
}
