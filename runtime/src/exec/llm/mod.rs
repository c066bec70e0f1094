//! TVM's language-model runtime (feature `llm`), on its own floor above the Relax VM: the paged
//! KV cache ([`kv_cache`]), the RNN state of space-state models ([`rnn_state`]), the other LLM builtins (tensor cache, sampling, legacy KV cache:
//! [`lm`]) and greedy generation with an MLC-LLM library ([`generate`]).
//!
//! This floor depends on the VM's values ([`crate::exec::relax::vm::value`]) and its public
//! calls; the VM never names it. Its builtins reach the VM as tables of names and functions
//! (`rnn_state::TABLE`, `kv_cache::TABLE`, `lm::builtins::TABLE`) that this module adds to the VM's default builtin
//! set ([`Builtins::default`]).

pub mod generate;
pub mod kv_cache;
pub mod lm;
pub mod rnn_state;

use crate::exec::relax::vm::Builtins;

/// The default builtins of a VM when the `llm` feature is on: the VM's core ones, then the RNN
/// state's (whose `kv_state_*` builtins hand a paged cache on to the cache's), then the paged KV
/// cache's, then the other LLM builtins.
impl Default for Builtins {
    fn default() -> Builtins {
        Builtins::core().with(rnn_state::TABLE).with(kv_cache::TABLE).with(lm::builtins::TABLE)
    }
}
