//! A `hybrid` model (Qwen3.5: Gated DeltaNet layers on TVM's RNN state, attention layers on the
//! paged KV cache), run as MLC-LLM's engine runs `KVStateKind::kHybrid` (`cpp/serve/model.cc`):
//! `CreateKVCache` makes both, the paged cache as for any model and the RNN state from
//! `create_rnn_state([max_batch_size], [max(history, 1)])`; every call on the state
//! (`kv_state_add_sequence`, `kv_state_begin_forward`, `kv_state_end_forward`, fork, popn,
//! remove) goes to the cache first, then to the RNN state; and the model functions take both,
//! the cache first: `batch_prefill(embeddings, logit_positions, kv_cache, rnn_state, params)`,
//! `batch_decode(embeddings, kv_cache, rnn_state, params)`. The library has no `prefill` or
//! `decode`: as in the engine, one sequence also runs through `batch_prefill` (one logit
//! position, its last token) and `batch_decode` (embeddings `[1, 1, hidden]`).
//!
//! The model reads the RNN state of one sequence per prefill (a prefill of several sequences
//! fails in the state's get kernel, in TVM as here), so a batch prefills each prompt alone, as
//! an `rnn_state` model's does, and then decodes all of them together.

use super::state::{StateKind, RNN_MAX_HISTORY};
use super::{GenerateError, LanguageModel, SEQUENCE_ID};
use crate::array::NdArray;
use crate::exec::relax::vm::value::{ObjectRef, Value, VmError};
use crate::exec::value::Value as ExecValue;
use crate::format::DataType;

impl LanguageModel {
    /// The RNN state of a `hybrid` model's current generation (its KV cache is
    /// [`LanguageModel::kv_cache`]); `None` for other models or before a generation.
    pub fn rnn_state(&self) -> Option<&ObjectRef> {
        self.rnn.as_ref()
    }

    /// Whether the model keeps a KV cache and an RNN state together.
    pub(super) fn is_hybrid(&self) -> bool {
        self.state_kind() == StateKind::Hybrid
    }

    /// A hybrid model's new RNN state beside a new KV cache (`create_rnn_state([max_batch_size],
    /// [RNN_MAX_HISTORY])`), without sequences: `add_sequence` adds each to both.
    pub(super) fn new_companion_state(&mut self) -> Result<(), GenerateError> {
        self.rnn = None;
        let state = self.create_rnn_state(RNN_MAX_HISTORY)?;
        self.rnn = Some(state);
        Ok(())
    }

    /// The RNN state as the VM's value, for a hybrid model's calls (`None` otherwise).
    pub(super) fn companion(&self) -> Option<Value> {
        self.rnn.clone().map(Value::Object)
    }

    /// One step of a hybrid model's single sequence (`func`: `prefill` or `decode`, the names
    /// the other kinds call) through `batch_prefill` or `batch_decode`, as the engine runs it:
    /// the logits of the last position.
    pub(super) fn hybrid_forward(
        &self,
        cache: &ObjectRef,
        func: &'static str,
        ids: &[i32],
    ) -> Result<Vec<f32>, GenerateError> {
        let n = ids.len() as i64;
        let cache = Value::Object(cache.clone());
        let rows = if func == "decode" {
            self.batch_round(&cache, "batch_decode", &[SEQUENCE_ID], &[1], ids, None, |h| vec![1, 1, h])?
        } else {
            let bytes = (n as i32 - 1).to_le_bytes();
            let position =
                NdArray::from_bytes(&bytes, &[1], DataType::I32, self.vm.devices()[0]).map_err(VmError::from)?;
            let position = Value::Tensor(position);
            let function = if func == "extend" { "batch_extend" } else { "batch_prefill" };
            self.batch_round(&cache, function, &[SEQUENCE_ID], &[n], ids, Some(&position), |h| vec![1, n, h])?
        };
        rows.into_iter().next().ok_or(GenerateError::Result { function: func, detail: "no row of logits".into() })
    }

    /// `vm.builtin.NAME(state, args...)` on the RNN state of a hybrid model, after the same call
    /// on its KV cache.
    pub(super) fn on_companion(&self, name: &str, args: &[&Value]) -> Result<(), GenerateError> {
        if let Some(rnn) = self.companion() {
            let mut all = vec![&rnn];
            all.extend_from_slice(args);
            self.vm.call_vm_values(name, &all)?;
        }
        Ok(())
    }

    /// Adds sequence `seq` to a hybrid model's RNN state (after the KV cache).
    pub(super) fn add_to_companion(&self, seq: i64) -> Result<(), GenerateError> {
        if let Some(rnn) = &self.rnn {
            self.vm
                .invoke("vm.builtin.kv_state_add_sequence", &[ExecValue::Object(rnn.clone()), ExecValue::Int(seq)])?;
        }
        Ok(())
    }
}
