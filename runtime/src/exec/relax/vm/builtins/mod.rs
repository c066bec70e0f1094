//! The builtins of the VM (TVM's `vm.builtin.*` runtime functions), in groups: argument checks
//! ([`check`]), shapes and the shape heap ([`shape`]), storage and tensors ([`memory`]), tuples
//! ([`tuple`]), closures and calls ([`closure`]). Each group lists its builtins once, in its
//! `TABLE` of names and functions; a [`Builtins`] set is the tables a VM resolves names with:
//! [`Builtins::core`], plus the LLM tables of `exec::llm` in [`Builtins::default`] when the
//! `llm` feature is on (`exec::llm` adds them: the VM does not name the floor above it).

use super::types::{BuiltinFn, Builtins, Table};

mod check;
mod closure;
mod memory;
mod shape;
mod tuple;

/// The core groups, in lookup order.
const CORE: &[Table] = &[check::TABLE, shape::TABLE, memory::TABLE, tuple::TABLE, closure::TABLE];

impl std::fmt::Debug for Builtins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builtins").field("names", &self.names().count()).finish()
    }
}

impl Builtins {
    /// The builtins of the VM itself (checks, shapes, memory, tuples, closures).
    pub(crate) fn core() -> Builtins {
        Builtins { tables: CORE.to_vec() }
    }

    /// The set with `table` added (looked up after the tables already in it).
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
    pub(crate) fn with(mut self, table: Table) -> Builtins {
        self.tables.push(table);
        self
    }

    /// The builtin of this name.
    pub(crate) fn get(&self, name: &str) -> Option<(&'static str, BuiltinFn)> {
        self.tables.iter().flat_map(|t| t.iter()).find(|(n, _)| *n == name).copied()
    }

    /// Whether the set has a builtin of this name.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The names of the builtins, in lookup order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.tables.iter().flat_map(|t| t.iter()).map(|(n, _)| *n)
    }
}

/// Without the `llm` feature the default set is the core one. With it, `exec::llm` gives the
/// default set (the core one, then its tables): the VM does not name the floor above it.
#[cfg(not(feature = "llm"))]
impl Default for Builtins {
    fn default() -> Builtins {
        Builtins::core()
    }
}

/// The `vm.builtin.*` groups of TVM 0.27's registry that mblob refuses, by name prefix, with
/// the reason given when a function calls one.
const REFUSED_BUILTINS: &[(&str, &str)] = &[
    ("vm.builtin.attention_kv_cache_", "an LLM KV-cache builtin (not supported yet)"),
    ("vm.builtin.paged_attention_kv_cache_", "an LLM KV-cache builtin (not supported yet)"),
    ("vm.builtin.kv_cache_disagg_", "an LLM KV-cache builtin (not supported yet)"),
    ("vm.builtin.kv_state_", "an LLM KV-state builtin (not supported yet)"),
    ("vm.builtin.rnn_state_", "an LLM RNN-state builtin (not supported yet)"),
    ("vm.builtin.sample_", "an LLM sampling builtin (not supported yet)"),
    ("vm.builtin.multinomial_from_uniform", "an LLM sampling builtin (not supported yet)"),
    ("vm.builtin.apply_", "an LLM sampling builtin (not supported yet)"),
    ("vm.builtin.tensor_cache.", "it reads TVM's process-wide tensor cache of LLM weights (not supported yet)"),
    ("vm.builtin.param_", "it reads TVM's process-wide tensor cache of LLM weights (not supported yet)"),
    ("vm.builtin.call_py_func", PY_REASON),
    ("vm.builtin.register_py_func", PY_REASON),
    ("vm.builtin.get_py_func", PY_REASON),
    ("vm.builtin.clear_py_func_registry", PY_REASON),
];

const PY_REASON: &str = "it calls Python functions registered in TVM's process, which mblob does not have";

/// Why mblob refuses the builtin `name` (a `vm.builtin.*` it does not implement).
pub(super) fn refusal(name: &str) -> &'static str {
    REFUSED_BUILTINS
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or("it is not in TVM 0.27's registry of relax VM builtins", |(_, why)| *why)
}
