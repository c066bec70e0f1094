//! The RNN state of an `rnn_state` model (see `state.rs`): made as MLC-LLM's engine makes it.

use super::logits::vm_kind;
use super::state::{StateKind, RNN_MAX_HISTORY};
use super::{GenerateError, LanguageModel, SEQUENCE_ID};
use crate::exec::relax::vm::value::ObjectRef;
use crate::exec::value::Value as ExecValue;

impl LanguageModel {
    /// What the model keeps between steps.
    pub fn state_kind(&self) -> StateKind {
        StateKind::of(self.metadata.kv_state_kind.as_deref()).unwrap_or(StateKind::KvCache)
    }

    /// A new RNN state (`create_rnn_state([max_batch_size], [RNN_MAX_HISTORY])`) with one empty
    /// sequence.
    pub(super) fn new_rnn_state(&self) -> Result<ObjectRef, GenerateError> {
        let state = self.create_rnn_state(RNN_MAX_HISTORY)?;
        self.vm.invoke(
            "vm.builtin.kv_state_add_sequence",
            &[ExecValue::Object(state.clone()), ExecValue::Int(SEQUENCE_ID)],
        )?;
        Ok(state)
    }

    /// A new RNN state of `history` steps (`create_rnn_state([max_batch_size], [history])`), with
    /// no sequence.
    pub(super) fn create_rnn_state(&self, history: i64) -> Result<ObjectRef, GenerateError> {
        let _span = tracing::debug_span!("lm_create_rnn_state").entered();
        let shape = |v: i64| ExecValue::Shape([v].into());
        let state = self.vm.invoke("create_rnn_state", &[shape(self.metadata.max_batch_size), shape(history)])?;
        match state {
            ExecValue::Object(state) => Ok(state),
            state => Err(GenerateError::Result {
                function: "create_rnn_state",
                detail: format!("{}, not an RNN state object", vm_kind(&state)),
            }),
        }
    }
}
