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
    /// A configuration or call mblob's cache does not implement (tree attention, MLA, KV
    /// transfer, FlashInfer kernels, ...): which, in the source.
    #[error("not supported by mblob's paged KV cache: {0}")]
    Unsupported(#[source] UnsupportedFeature),
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

/// What [`KvCacheError::Unsupported`] names: a feature of TVM's paged KV cache that mblob's
/// does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnsupportedFeature {
    /// TVM 0.17's `paged_attention_kv_cache_create_reduced` (the layer count in slot 1).
    #[error(
        "TVM 0.17's paged_attention_kv_cache_create_reduced ({args} arguments, the layer count in slot 1): mblob \
         reads the create calls of TVM 0.18 and later"
    )]
    Tvm017Create {
        /// The create call's arguments.
        args: usize,
    },
    /// TVM 0.17-0.19's `paged_attention_kv_cache_create` of plain functions, which only
    /// FlashInfer caches called.
    #[error(
        "TVM 0.17-0.19's paged_attention_kv_cache_create ({args} arguments, plain functions), which only \
         FlashInfer caches called: FlashInfer kernels"
    )]
    FlashInferCreate {
        /// The create call's arguments.
        args: usize,
    },
    /// An attention backend other than TVM's TIR kernels (FlashInfer).
    #[error(
        "the `{backend}` attention backend of the {kernel} (only TVM's TIR kernels, \"tirx\" or TVM 0.20-0.23's \
         \"tir\", run on the CPU)"
    )]
    Backend {
        /// The backend's name.
        backend: String,
        /// The kernel it serves (`paged decode`, ...).
        kernel: String,
    },
    /// A layer partition over several groups (Disco, pipeline parallelism).
    #[error("a layer partition over {groups} groups (Disco); mblob runs the cache in one group")]
    LayerGroups {
        /// The groups.
        groups: usize,
    },
    /// Layers of an attention kind other than MHA (0) and per-layer sliding MHA (3).
    #[error(
        "{} (attention kind {kind}); only MHA (0) and per-layer sliding MHA (3) are implemented",
        match kind {
            1 => "multi-head latent attention (MLA) layers",
            2 => "linear attention layers",
            _ => "unknown attention kinds",
        }
    )]
    AttentionKind {
        /// TVM's `AttnKind` code.
        kind: i64,
    },
    /// KV transfer between engines (disaggregation over NVSHMEM).
    #[error("KV transfer (disaggregation over NVSHMEM)")]
    KvTransfer,
    /// Token-tree attention (speculative decoding's `token_tree_parent_ptr`).
    #[error("token-tree attention (begin_forward with token_tree_parent_ptr)")]
    TokenTree,
    /// On OpenCL, merging partial attentions of a dtype other than float32.
    #[error("merging partial attentions of {dtype} on OpenCL (float32 only)")]
    MergeDtype {
        /// The dtype, as TVM spells it.
        dtype: String,
    },
}

impl From<UnsupportedFeature> for KvCacheError {
    fn from(u: UnsupportedFeature) -> KvCacheError {
        KvCacheError::Unsupported(u)
    }
}

impl From<KvCacheError> for VmError {
    /// The cache's error as the source of [`VmError::Lm`].
    fn from(e: KvCacheError) -> VmError {
        VmError::Lm(Box::new(e))
    }
}

/// The message of a failed check of TVM's whose condition is a boolean
/// (`TVM_FFI_ICHECK(cond) << text`): `Check failed: (cond) is false: text`. The RNN state's
/// errors word their checks with it too.
pub(crate) fn false_text(cond: &str, text: impl std::fmt::Display) -> String {
    format!("Check failed: ({cond}) is false: {text}")
}

/// The message of a failed comparison check of TVM's (`TVM_FFI_ICHECK_<op>(a, b) << text`)
/// whose values were `a` and `b`: `Check failed: lhs op rhs (a vs. b) : text`.
pub(crate) fn cmp_text(
    expr: &str,
    a: impl std::fmt::Display,
    b: impl std::fmt::Display,
    text: impl std::fmt::Display,
) -> String {
    format!("Check failed: {expr} ({a} vs. {b}) : {text}")
}

/// A failed check of TVM's whose condition is a boolean ([`false_text`]).
pub(super) fn check_false(cond: &str, text: impl std::fmt::Display) -> KvCacheError {
    KvCacheError::Check(false_text(cond, text))
}

/// A failed comparison check of TVM's ([`cmp_text`]).
pub(super) fn check_cmp(
    expr: &str,
    a: impl std::fmt::Display,
    b: impl std::fmt::Display,
    text: impl std::fmt::Display,
) -> KvCacheError {
    KvCacheError::Check(cmp_text(expr, a, b, text))
}

/// TVM's error for a sequence id the cache does not hold.
pub(super) fn unknown_sequence(seq_id: i64) -> KvCacheError {
    check_false("it != seq_map_.end()", format!("The sequence \"{seq_id}\" cannot be found in KV cache."))
}

/// TVM's error when no page is free.
pub(super) fn out_of_pages() -> KvCacheError {
    check_false("!free_page_ids_.empty()", "The KV cache is full. No page can be allocated.")
}
