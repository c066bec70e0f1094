//! The errors of the paged KV cache.

use crate::exec::relax::vm::value::VmError;

/// An error of the paged KV cache or of one of its builtins.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvCacheError {
    /// One of TVM's runtime checks failed: TVM raises `InternalError` with this message
    /// (`Check failed: (cond) is false: text`, as TVM 0.27 words it).
    #[error("InternalError: {0}")]
    Check(String),
    /// A configuration or call mblob's cache does not implement (sliding window, tree
    /// attention, MLA, KV transfer, FlashInfer kernels).
    #[error("not supported by mblob's paged KV cache: {0}")]
    Unsupported(String),
    /// An argument of a KV cache builtin of the wrong kind or out of range.
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

impl From<KvCacheError> for VmError {
    /// The cache's error as the source of [`VmError::Lm`].
    fn from(e: KvCacheError) -> VmError {
        VmError::Lm(Box::new(e))
    }
}

/// A failed check of TVM's whose condition is a boolean: `Check failed: (cond) is false: text`.
pub(super) fn check_false(cond: &str, text: impl std::fmt::Display) -> KvCacheError {
    KvCacheError::Check(format!("Check failed: ({cond}) is false: {text}"))
}

/// A failed comparison check of TVM's: `Check failed: lhs op rhs (a vs. b) : text`.
pub(super) fn check_cmp(
    expr: &str,
    a: impl std::fmt::Display,
    b: impl std::fmt::Display,
    text: impl std::fmt::Display,
) -> KvCacheError {
    KvCacheError::Check(format!("Check failed: {expr} ({a} vs. {b}) : {text}"))
}

/// TVM's error for a sequence id the cache does not hold.
pub(super) fn unknown_sequence(seq_id: i64) -> KvCacheError {
    check_false("it != seq_map_.end()", format!("The sequence \"{seq_id}\" cannot be found in KV cache."))
}

/// TVM's error when no page is free.
pub(super) fn out_of_pages() -> KvCacheError {
    check_false("!free_page_ids_.empty()", "The KV cache is full. No page can be allocated.")
}
