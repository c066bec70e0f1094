//! What can go wrong when generating.

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
    /// The OpenCL program cache
    /// ([`GenerateOptions::opencl_program_cache`](super::GenerateOptions::opencl_program_cache))
    /// cannot be read, written or loaded.
    #[error("OpenCL program cache {}: {detail}", path.display())]
    ProgramCache {
        /// The file.
        path: std::path::PathBuf,
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
