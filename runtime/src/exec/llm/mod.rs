//! TVM's language-model runtime (feature `llm`), on its own floor above the Relax VM: the paged
//! KV cache ([`kv_cache`]), the RNN state of space-state models ([`rnn_state`]), the other LLM
//! builtins (tensor cache, sampling, legacy KV cache: [`lm`]) and generation with an MLC-LLM
//! library ([`generate`]).
//!
//! What a user calls here:
//! - [`LanguageModel`] ([`generate`]): [`LanguageModel::new`] over a loaded MLC-LLM model
//!   library, a device and the directory of its weights, then [`LanguageModel::generate`] (greedy),
//!   [`LanguageModel::generate_sampled`] (TVM's sampling with MLC-LLM's seeded draws,
//!   [`Sampling`]) or [`LanguageModel::generate_batch`] (several sequences); each gives a
//!   [`Generation`] (the tokens, their logits and the times). [`GenerateOptions`] are the options,
//!   [`GenerateError`] the error.
//! - [`kv_cache::PagedKvCache`]: TVM's paged KV cache, the object a model's `create_*_kv_cache`
//!   function returns (a [`crate::exec::ObjectRef`]), with [`kv_cache::KvCacheError`].
//! - [`lm::TensorCache`]: the weights of an MLC-LLM `tensor-cache.json` (`params_shard_*.bin`),
//!   as TVM's `vm.builtin.tensor_cache.*` reads them; the sampling functions ([`lm::sampling`])
//!   and the legacy KV cache ([`lm::AttentionKvCacheLegacy`]) as TVM's builtins compute them.
//!
//! The tiny LLaMA-like model of the test suite (built by TVM 0.27 with MLC-LLM's paged KV
//! cache), its weights read from `tensor-cache.json`, gives TVM's greedy tokens:
//!
//! ```
//! use mblob_runtime::exec::llm::{GenerateOptions, LanguageModel};
//! use mblob_runtime::{load_library, Device, LoadOptions, Registry};
//!
//! let llm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm");
//! // What TVM's own VM did: the prompt and the argmax of each forward step.
//! let scenarios: serde_json::Value = serde_json::from_slice(&std::fs::read(llm.join("scenarios.json"))?)?;
//! let steps = scenarios["scenarios"]["single"]["steps"].as_array().unwrap();
//! let forwards: Vec<&serde_json::Value> = steps.iter().filter(|s| s["op"] == "forward").collect();
//! let ids = |v: &serde_json::Value| -> Vec<i32> { v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect() };
//! let prompt = ids(&forwards[0]["tokens"]);
//! let tvm: Vec<i32> = forwards.iter().map(|s| ids(&s["argmax"])[0]).collect();
//!
//! // SAFETY: a library TVM built for this test suite.
//! let tree = unsafe { load_library(&llm.join("llm_params.so"), &Registry::default(), &LoadOptions::default()) }?;
//! let mut lm = LanguageModel::new(&tree, Device::cpu(0), Some(&llm.join("params")), &GenerateOptions::default())?;
//! let out = lm.generate(&prompt, tvm.len())?;
//! assert_eq!(out.tokens, tvm, "TVM's greedy tokens");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Most programs never call the builtins themselves: a [`crate::exec::relax::VirtualMachine`]
//! made with this feature serves them by name to the model's functions.
//!
//! This floor depends on the VM's values (`exec::relax::vm::value`, crate-private) and its
//! calls; the VM never names it. Its builtins reach the VM as tables of names and functions
//! (`rnn_state::TABLE`, `kv_cache::TABLE`, `lm::builtins::TABLE`) that this module adds to the
//! VM's default builtin set (`Builtins::default`).

pub mod generate;
pub mod kv_cache;
pub mod lm;
pub mod rnn_state;

pub use generate::{GenerateError, GenerateOptions, Generation, LanguageModel, Sampling};

use crate::exec::relax::vm::Builtins;

/// The default builtins of a VM when the `llm` feature is on: the VM's core ones, then the RNN
/// state's (whose `kv_state_*` builtins hand a paged cache on to the cache's), then the paged KV
/// cache's, then the other LLM builtins.
impl Default for Builtins {
    fn default() -> Builtins {
        Builtins::core().with(rnn_state::TABLE).with(kv_cache::TABLE).with(lm::builtins::TABLE)
    }
}
