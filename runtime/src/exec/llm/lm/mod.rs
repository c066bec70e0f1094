//! TVM's language-model support for the Relax VM, other than the paged KV cache: the tensor
//! cache of weights ([`tensor_cache`]), the sampling and logit-processing builtins
//! ([`sampling`]), the legacy `nn.KVCache` object ([`legacy_kv`]), and how generation picks
//! tokens with them ([`sampler`]: MLC-LLM's seeded draws). Feature `llm`.
//!
//! Each TVM builtin is one function here, named after it without the `vm.builtin.` prefix
//! (`vm.builtin.sample_top_p_from_logits` is [`sampling::sample_top_p_from_logits`]), taking
//! TVM's arguments in TVM's order as [`NdArray`](crate::array::NdArray)s and plain Rust values.
//! They compute what TVM 0.27 (`src/runtime/vm/lm_support.cc`,
//! `src/runtime/vm/tensor_cache_support.cc`) computes, bit for bit, and fail with typed errors
//! whose messages carry TVM's text. Where TVM reads or writes out of bounds on bad input (a
//! token id past the vocabulary, a window larger than the reserve), these return an error.
//!
//! [`BUILTINS`] lists the global function names; [`builtins`] serves them to the Relax VM
//! (its dispatch, and [`VirtualMachine::invoke`](crate::exec::relax::VirtualMachine::invoke)
//! for the host's calls such as `vm.builtin.tensor_cache.load`).

pub mod builtins;
pub mod legacy_kv;
pub mod sampler;
pub mod sampling;
pub mod tensor_cache;

use crate::exec::relax::vm::value::VmError;

pub use legacy_kv::{AttentionKvCacheLegacy, LegacyKvError};
pub use sampling::SamplingError;
pub use tensor_cache::{TensorCache, TensorCacheError, TensorCacheMetadata};

/// An LM builtin failed: the error of its part.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LmError {
    /// The tensor cache.
    #[error(transparent)]
    TensorCache(#[from] TensorCacheError),
    /// A sampling builtin.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The legacy KV cache.
    #[error(transparent)]
    LegacyKv(#[from] LegacyKvError),
}

impl LmError {
    /// The class of the error TVM raises for it (`InternalError`, `ValueError`).
    pub fn tvm_kind(&self) -> &'static str {
        match self {
            LmError::TensorCache(e) => e.tvm_kind(),
            LmError::Sampling(e) => e.tvm_kind(),
            LmError::LegacyKv(e) => e.tvm_kind(),
        }
    }
}

impl From<LmError> for VmError {
    fn from(e: LmError) -> Self {
        VmError::Lm(Box::new(e))
    }
}

/// The global functions this module implements, by TVM's name.
pub const BUILTINS: &[&str] = &[
    "vm.builtin.tensor_cache.load",
    "vm.builtin.tensor_cache.get",
    "vm.builtin.tensor_cache.update",
    "vm.builtin.tensor_cache.remove",
    "vm.builtin.tensor_cache.clear",
    "vm.builtin.param_array_from_cache",
    "vm.builtin.param_array_from_cache_by_name",
    "vm.builtin.param_array_from_cache_by_name_unpacked",
    "vm.builtin.param_module_from_cache",
    "vm.builtin.param_module_from_cache_by_name",
    "vm.builtin.sample_top_p_from_logits",
    "vm.builtin.sample_top_p_from_prob",
    "vm.builtin.multinomial_from_uniform",
    "vm.builtin.apply_repetition_penalty",
    "vm.builtin.apply_presence_and_frequency_penalty",
    "vm.builtin.apply_softmax_with_temperature",
    "vm.builtin.attention_kv_cache_create",
    "vm.builtin.attention_kv_cache_update",
    "vm.builtin.attention_kv_cache_append",
    "vm.builtin.attention_kv_cache_view",
    "vm.builtin.attention_kv_cache_window_override",
    "vm.builtin.attention_kv_cache_window_override_with_sinks",
    "vm.builtin.attention_kv_cache_array_popn",
    "vm.builtin.attention_kv_cache_array_clear",
];
