//! MLC-LLM's model metadata (`_metadata`): the fields generation reads, what mblob refuses,
//! and the vocabulary size it gives.

use serde::Deserialize;

use super::state::StateKind;
use super::GenerateError;
use crate::exec::value::Value as ExecValue;

/// The fields of MLC-LLM's model metadata (`_metadata`) that generation reads.
#[derive(Debug, Clone, Deserialize)]
pub struct ModelMetadata {
    /// The weights, in the order of the `packed_params` tuple.
    #[serde(default)]
    pub params: Vec<ParamInfo>,
    /// The longest sequence the model was built for.
    pub context_window_size: i64,
    /// The most tokens one prefill takes.
    pub prefill_chunk_size: i64,
    /// The most sequences of one batch.
    #[serde(default = "one")]
    pub max_batch_size: i64,
    /// The sliding window (`-1`: none; `sliding_window` in older libraries).
    #[serde(default = "minus_one", alias = "sliding_window")]
    pub sliding_window_size: i64,
    /// The attention sinks a sequence keeps in front of its sliding window.
    #[serde(default)]
    pub attention_sink_size: i64,
    /// `kv_cache` for a paged KV cache, `rnn_state` for TVM's RNN state (RWKV), `hybrid` for both
    /// (Qwen3.5).
    #[serde(default)]
    pub kv_state_kind: Option<String>,
    /// The model's architecture (`llama`, ...).
    #[serde(default)]
    pub model_type: Option<String>,
    /// Whether the library was built for disaggregated prefill and decode (KV transfer between
    /// engines); mblob refuses such a library.
    #[serde(default)]
    pub disaggregation: bool,
    /// Tensor-parallel shards (Disco workers); mblob runs one.
    #[serde(default = "one")]
    pub tensor_parallel_shards: i64,
    /// Pipeline-parallel stages (Disco groups); mblob runs one.
    #[serde(default = "one")]
    pub pipeline_parallel_stages: i64,
    /// The vocabulary size, when the metadata gives it (MLC-LLM's does not: it is then read
    /// from the embedding weight's shape, see [`LanguageModel::vocab_size`](super::LanguageModel::vocab_size)).
    #[serde(default)]
    pub vocab_size: Option<i64>,
}

impl ModelMetadata {
    /// Refuses what mblob does not run, naming it: an unknown KV state kind,
    /// disaggregation, several tensor-parallel shards or pipeline stages (Disco).
    pub fn check_supported(&self) -> Result<(), GenerateError> {
        let refuse = |detail: String| Err(GenerateError::Metadata { detail });
        if let Some(k) = self.kv_state_kind.as_deref().filter(|k| StateKind::of(Some(k)).is_none()) {
            return refuse(format!(
                "its KV state is `{k}`; mblob generates with a paged KV cache (`kv_cache`), an RNN state \
                 (`rnn_state`) or both (`hybrid`)"
            ));
        }
        if self.disaggregation {
            return refuse("it is built for disaggregation (KV transfer between prefill and decode engines), which mblob does not run".into());
        }
        if self.tensor_parallel_shards > 1 || self.pipeline_parallel_stages > 1 {
            return refuse(format!(
                "it is built for {} tensor-parallel shards and {} pipeline stages (Disco groups); mblob runs one \
                 shard in one stage",
                self.tensor_parallel_shards, self.pipeline_parallel_stages
            ));
        }
        Ok(())
    }
}

fn one() -> i64 {
    1
}

fn minus_one() -> i64 {
    -1
}

/// A weight of the model, as the metadata lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct ParamInfo {
    /// Its name in the tensor cache.
    pub name: String,
    /// Its shape, when given: sizes, and names for the symbolic ones (MLC-LLM writes
    /// `["vocab_size", 256]`, which its engine resolves from the chat config).
    #[serde(default)]
    pub shape: Vec<ParamDim>,
    /// Its dtype, when given.
    #[serde(default)]
    pub dtype: Option<String>,
}

/// One dimension of a weight's shape in the metadata: a size, or the name of a symbolic one
/// (`vocab_size`; `-1` is MLC-LLM's other spelling of a dynamic size).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ParamDim {
    /// A size.
    Size(i64),
    /// The name of a symbolic size.
    Named(String),
}

/// The vocabulary size the metadata or the loaded embedding weight gives (see
/// [`LanguageModel::vocab_size`](super::LanguageModel::vocab_size)).
pub(super) fn vocab_size(metadata: &ModelMetadata, params: Option<&ExecValue>) -> Option<i64> {
    if let Some(v) = metadata.vocab_size.filter(|&v| v > 0) {
        return Some(v);
    }
    let is_embedding = |name: &str| {
        ["embed_tokens.weight", "embed_tokens.q_weight", "wte.weight", "embeddings.weight"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
    };
    let index = metadata.params.iter().position(|p| is_embedding(&p.name))?;
    let loaded = match params {
        Some(ExecValue::Tuple(items)) => match items.get(index) {
            Some(ExecValue::Tensor(a)) => a.shape().first().copied(),
            _ => None,
        },
        _ => None,
    };
    let listed = || match metadata.params[index].shape.first() {
        Some(ParamDim::Size(v)) => Some(*v),
        _ => None,
    };
    loaded.or_else(listed).filter(|&v| v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_weight_shapes_may_name_symbolic_dims() {
        // As MLC-LLM writes them for llama-type models (`mlc_llm/compiler_pass`'s metadata).
        let m: ModelMetadata = serde_json::from_str(
            r#"{"context_window_size": 256, "prefill_chunk_size": 16, "sliding_window": 16,
                "params": [{"name": "lm_head.weight", "shape": ["vocab_size", 256], "dtype": "float32"},
                           {"name": "model.norm.weight", "shape": [256], "dtype": "float32"}]}"#,
        )
        .unwrap();
        assert_eq!(m.params[0].shape, [ParamDim::Named("vocab_size".into()), ParamDim::Size(256)]);
        assert_eq!(m.params[1].shape, [ParamDim::Size(256)]);
        assert_eq!(m.sliding_window_size, 16);
    }

    #[test]
    fn unsupported_kinds_of_library_are_refused_naming_them() {
        // The fields as MLC-LLM 79d603f writes them (`compile.py`'s "Registering metadata").
        let base = r#""model_type": "gemma3_text", "quantization": "q0f32", "context_window_size": 256,
            "sliding_window_size": 16, "attention_sink_size": -1, "prefill_chunk_size": 16,
            "max_batch_size": 4, "active_vocab_size": 1000, "model_task": "chat""#;
        let meta = |extra: &str| -> ModelMetadata { serde_json::from_str(&format!("{{{base}, {extra}}}")).unwrap() };
        let ok = r#""tensor_parallel_shards": 1, "pipeline_parallel_stages": 1, "disaggregation": false, "kv_state_kind": "kv_cache""#;
        assert!(meta(ok).check_supported().is_ok());
        assert!(meta(r#""kv_state_kind": "rnn_state""#).check_supported().is_ok());
        assert!(meta(r#""kv_state_kind": "hybrid""#).check_supported().is_ok());
        for (extra, word) in [
            (r#""disaggregation": true"#, "disaggregation"),
            (r#""tensor_parallel_shards": 2"#, "Disco"),
            (r#""pipeline_parallel_stages": 2"#, "Disco"),
            (r#""kv_state_kind": "none""#, "`none`"),
        ] {
            let e = meta(extra).check_supported().unwrap_err().to_string();
            assert!(e.contains(word), "{extra}: {e}");
        }
    }
}
