//! TVM's language-model runtime (feature `llm`), on its own floor above the Relax VM: the paged
//! KV cache ([`kv_cache`]), the other LLM builtins (tensor cache, sampling, legacy KV cache:
//! [`lm`]) and greedy generation with an MLC-LLM library ([`generate`]).
//!
//! This floor depends on the VM's values (`exec::relax::vm::value`, crate-private) and its
//! calls; the VM never names it. Its builtins reach the VM as tables of names and functions
//! (`kv_cache::TABLE`, `lm::builtins::TABLE`) that this module adds to the VM's default builtin
//! set (`Builtins::default`).

pub mod generate;
pub mod kv_cache;
pub mod lm;

use crate::exec::relax::vm::Builtins;

/// The default builtins of a VM when the `llm` feature is on: the VM's core ones, then the
/// paged KV cache's, then the other LLM builtins.
impl Default for Builtins {
    fn default() -> Builtins {
        Builtins::core().with(kv_cache::TABLE).with(lm::builtins::TABLE)
    }
}
