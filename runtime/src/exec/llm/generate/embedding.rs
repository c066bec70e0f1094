//! The embedding workspace of MLC-LLM's engine: `alloc_embedding_tensor`, which every
//! MLC-built library has (MLC-LLM's `AttachAllocEmbeddingTensorFunc` pass: a
//! `[prefill_chunk_size, hidden]` tensor of the embeddings' dtype on the model's device).
//!
//! MLC-LLM's engine (`cpp/serve/model.cc`: `AllocEmbeddingTensor`, `TokenEmbed`;
//! `engine_actions/new_request_prefill.cc`) allocates it once, when the model is made, checks
//! that it is 2-D with at least `prefill_chunk_size` rows, and learns the hidden size from it.
//! A prefill of several sequences then embeds the round's tokens (the engine merges the
//! requests' token ids into one `embed` call) and copies the embeddings into the workspace
//! at their offset (`mlc.copy_embedding_to_offset`, a copy within the device), and
//! `batch_prefill` reads a `[1, n, hidden]` view of it. A round of one sequence, and every
//! decode step, passes `embed`'s own result, as the engine does. [`Workspace`] does the same.

use super::GenerateError;
use crate::array::NdArray;
use crate::exec::relax::vm::value::VmError;
use crate::exec::relax::vm::VirtualMachine;
use crate::exec::value::Value as ExecValue;

/// The function MLC-LLM's engine calls for the workspace.
pub(super) const ALLOC: &str = "alloc_embedding_tensor";

/// The embedding workspace of a model (see the module's docs).
#[derive(Debug)]
pub(super) struct Workspace {
    /// The `[rows, hidden]` tensor `alloc_embedding_tensor` returned.
    tensor: NdArray,
}

impl Workspace {
    /// `alloc_embedding_tensor()` of `vm`, when the library has it, checked as MLC-LLM's
    /// engine checks it: a 2-D tensor of at least `prefill_chunk_size` rows. `None` when the
    /// library has no such function (a library not built by MLC-LLM's pipeline).
    pub(super) fn alloc(vm: &VirtualMachine, prefill_chunk_size: i64) -> Result<Option<Workspace>, GenerateError> {
        if !vm.functions().iter().any(|f| f.name == ALLOC && f.params.is_empty()) {
            return Ok(None);
        }
        let _span = tracing::debug_span!("lm_alloc_embedding_tensor").entered();
        let bad = |detail: String| GenerateError::Result { function: ALLOC, detail };
        let tensor = match vm.invoke(ALLOC, &[])? {
            ExecValue::Tensor(t) => t,
            v => return Err(bad(format!("a {}, not a tensor", v.kind()))),
        };
        match tensor.shape() {
            [rows, hidden] if *rows >= prefill_chunk_size && *hidden > 0 => Ok(Some(Workspace { tensor })),
            [rows, _] if *rows < prefill_chunk_size => Err(bad(format!(
                "a tensor of {rows} rows, fewer than the prefill chunk of {prefill_chunk_size} tokens (the library \
                 was built for prefill chunks of at most {rows} tokens: give a smaller prefill chunk size)"
            ))),
            s => Err(bad(format!("a tensor of shape {s:?} (expected [prefill_chunk_size, hidden])"))),
        }
    }

    /// The hidden size (the workspace's second dimension).
    pub(super) fn hidden(&self) -> i64 {
        self.tensor.shape()[1]
    }

    /// Copies `embedding` (`[m, hidden]`, `embed`'s result) into the workspace from row
    /// `offset` (MLC-LLM's `mlc.copy_embedding_to_offset`, a copy within the device) and
    /// returns the workspace.
    pub(super) fn write(&self, embedding: &NdArray, offset: i64) -> Result<&NdArray, GenerateError> {
        copy_embedding_to_offset(embedding, &self.tensor, offset)?;
        Ok(&self.tensor)
    }
}

/// MLC-LLM's `mlc.copy_embedding_to_offset`: `embedding` (`[m, hidden]`) into `dst`
/// (`[rows, hidden]`, of the same dtype) from row `offset`, with its checks (both 2-D, the
/// same hidden size, `offset + m <= rows`).
pub(super) fn copy_embedding_to_offset(embedding: &NdArray, dst: &NdArray, offset: i64) -> Result<(), GenerateError> {
    let bad = |detail: String| GenerateError::Result { function: "embed", detail };
    let ([m, hidden], [rows, dst_hidden]) = (embedding.shape(), dst.shape()) else {
        return Err(bad(format!(
            "embeddings of shape {:?} for a workspace of shape {:?} (both must be 2-D)",
            embedding.shape(),
            dst.shape()
        )));
    };
    if hidden != dst_hidden || embedding.dtype() != dst.dtype() {
        return Err(bad(format!(
            "embeddings of shape {:?} and dtype {} for `{ALLOC}`'s workspace of shape {:?} and dtype {}",
            embedding.shape(),
            embedding.dtype(),
            dst.shape(),
            dst.dtype()
        )));
    }
    if offset < 0 || offset.checked_add(*m).is_none_or(|end| end > *rows) {
        return Err(GenerateError::EmbeddingOverflow { function: ALLOC, count: *m, offset, rows: *rows });
    }
    let row_bytes = embedding.nbytes() / (*m).max(1) as usize;
    let at = offset as usize * row_bytes;
    embedding.storage().copy_to(0, dst.storage(), at, embedding.nbytes()).map_err(VmError::from)?;
    Ok(())
}
