//! The errors of the RNN state.

use crate::exec::llm::kv_cache::{cmp_text, false_text};
use crate::exec::relax::vm::value::VmError;

/// An error of the RNN state or of one of its builtins.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RnnStateError {
    /// One of TVM's runtime checks failed: TVM raises `InternalError` with this message, as
    /// TVM 0.27's `rnn_state.cc` words it (`Check failed: (cond) is false: text`, or
    /// `Check failed: a <= b (x vs. y) : text` for a comparison).
    #[error("InternalError: {0}")]
    Check(String),
    /// An argument of an RNN state builtin of the wrong kind or out of range.
    #[error("argument {index} of `{builtin}`: {detail}")]
    Arg {
        /// The builtin.
        builtin: String,
        /// The argument's position.
        index: usize,
        /// What is wrong.
        detail: String,
    },
}

impl From<RnnStateError> for VmError {
    /// The state's error as the source of [`VmError::Lm`].
    fn from(e: RnnStateError) -> VmError {
        VmError::Lm(Box::new(e))
    }
}

impl RnnStateError {
    /// TVM's `TVM_FFI_ICHECK(cond) << text`.
    pub(super) fn unless(cond: &str, text: impl std::fmt::Display) -> RnnStateError {
        RnnStateError::Check(false_text(cond, text))
    }

    /// TVM's `TVM_FFI_ICHECK_<op>(a, b) << text`, which failed with values `x` and `y`.
    pub(super) fn compare(
        expr: &str,
        x: impl std::fmt::Display,
        y: impl std::fmt::Display,
        text: impl std::fmt::Display,
    ) -> RnnStateError {
        RnnStateError::Check(cmp_text(expr, x, y, text))
    }

    /// TVM's error for a sequence id the state does not hold (`where`: "in the space state
    /// storage", or "in space state" as `PopN` words it).
    pub(super) fn unknown(seq_id: i64, place: &str) -> RnnStateError {
        RnnStateError::unless("it != seq_map_.end()", format!("The sequence \"{seq_id}\" cannot be found {place}."))
    }
}
