//! The model's state across steps, by the metadata's `kv_state_kind`, as MLC-LLM's engine
//! makes it (`cpp/serve/model.cc` `CreateKVCache`, `function_table.cc`): a paged KV cache
//! (`kv_cache`, from `create_tir_paged_kv_cache`), TVM's RNN state (`rnn_state`, RWKV: from
//! `create_rnn_state([max_batch_size], [max_history])`), or both (`hybrid`, Qwen3.5: the paged
//! cache for the attention layers, the RNN state for the Gated DeltaNet layers). The RNN state of
//! an `rnn_state` model goes where the cache goes in every call (`prefill(embeddings, state,
//! params)`, `kv_state_begin_forward(state, ...)`, ...); a `hybrid` model's calls take both
//! (see `hybrid.rs`).
//!
//! An RNN state is made with one step of history ([`RNN_MAX_HISTORY`], the engine's least:
//! `max(max_history_size, 1)`), which generation needs no more of; it has no context window
//! and nothing to size from a memory budget. MLC-LLM's RWKV `batch_prefill` takes one sequence
//! only (it keeps the last token of the whole ragged batch; TVM's VM fails on several), so a
//! batch of an RNN model prefills each prompt alone through `prefill`, in chunks, as the engine
//! prefills a single sequence, and then decodes them all together through `batch_decode`.

/// The history steps of the RNN state generation makes (of an `rnn_state` or a `hybrid` model).
pub const RNN_MAX_HISTORY: i64 = 1;

/// What the model keeps between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// TVM's paged KV cache (`kv_state_kind` `kv_cache`, or none given).
    KvCache,
    /// TVM's RNN state (`rnn_state`).
    Rnn,
    /// A paged KV cache and an RNN state together (`hybrid`).
    Hybrid,
}

impl StateKind {
    /// The kind of a metadata's `kv_state_kind` (`None` when mblob does not run it).
    pub fn of(kv_state_kind: Option<&str>) -> Option<StateKind> {
        match kv_state_kind {
            None | Some("kv_cache") => Some(StateKind::KvCache),
            Some("rnn_state") => Some(StateKind::Rnn),
            Some("hybrid") => Some(StateKind::Hybrid),
            Some(_) => None,
        }
    }

    /// The library functions that create the state, and what each is for (for errors).
    pub fn creators(self) -> &'static [(&'static str, &'static str)] {
        const KV: (&str, &str) = ("create_tir_paged_kv_cache", "creates the KV cache (a TIR paged KV cache)");
        const RNN: (&str, &str) = ("create_rnn_state", "creates the RNN state (TVM's vm.builtin.rnn_state_create)");
        match self {
            StateKind::KvCache => &[KV],
            StateKind::Rnn => &[RNN],
            StateKind::Hybrid => &[KV, RNN],
        }
    }

    /// The library functions that run the prompt and one new token, and what each is for: a
    /// `hybrid` library has no `prefill`/`decode`, MLC-LLM's engine runs even one sequence
    /// through `batch_prefill`/`batch_decode`.
    pub fn steps(self) -> [(&'static str, &'static str); 2] {
        match self {
            StateKind::Hybrid => [
                ("batch_prefill", "runs the prompt (a hybrid model's only prefill)"),
                ("batch_decode", "runs one new token (a hybrid model's only decode)"),
            ],
            _ => [("prefill", "runs the prompt"), ("decode", "runs one new token")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_of_state() {
        assert_eq!(StateKind::of(None), Some(StateKind::KvCache));
        assert_eq!(StateKind::of(Some("kv_cache")), Some(StateKind::KvCache));
        assert_eq!(StateKind::of(Some("rnn_state")), Some(StateKind::Rnn));
        assert_eq!(StateKind::of(Some("hybrid")), Some(StateKind::Hybrid));
        assert_eq!(StateKind::Hybrid.creators().len(), 2);
        assert_eq!(StateKind::of(Some("none")), None);
    }
}
