//! The settings of `LanguageModel` given by name from Python (what `_metadata` gives, for a
//! library without it, and the KV cache's sizes), and a generation as Python gets it.

use std::collections::BTreeMap;

use mblob_runtime::exec::llm::generate::{GenerateOptions, Generation, ModelSettings};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::InputError;

/// The names `settings` may hold.
const NAMES: [&str; 8] = [
    "context_window_size",
    "prefill_chunk_size",
    "max_batch_size",
    "max_total_seq_len",
    "kv_cache_bytes",
    "sliding_window_size",
    "attention_sink_size",
    "vocab_size",
];

/// The options of pages of `page_size` tokens and `settings`; an unknown name is an
/// `InputError` naming it.
pub fn options(page_size: i64, settings: &BTreeMap<String, i64>) -> PyResult<GenerateOptions> {
    if let Some(name) = settings.keys().find(|k| !NAMES.contains(&k.as_str())) {
        return Err(InputError::new_err(format!("LanguageModel: no setting `{name}` (known: {})", NAMES.join(", "))));
    }
    let get = |name: &str| settings.get(name).copied();
    let bytes = match get("kv_cache_bytes").map(u64::try_from) {
        Some(Err(_)) => return Err(InputError::new_err("LanguageModel: kv_cache_bytes is negative")),
        b => b.map(|b| b.unwrap_or_default()),
    };
    Ok(GenerateOptions {
        page_size,
        max_total_seq_len: get("max_total_seq_len"),
        prefill_chunk_size: get("prefill_chunk_size"),
        kv_cache_bytes: bytes,
        model: ModelSettings {
            context_window_size: get("context_window_size"),
            max_batch_size: get("max_batch_size"),
            sliding_window_size: get("sliding_window_size"),
            attention_sink_size: get("attention_sink_size"),
            vocab_size: get("vocab_size"),
        },
        opencl_program_cache: None,
    })
}

/// A generation as Python gets it: `(tokens, logits as float32 bytes, vocab, decode seconds
/// per step)`.
pub fn generation_out(py: Python<'_>, out: Generation) -> (Vec<i32>, Bound<'_, PyBytes>, usize, Vec<f64>) {
    let vocab = out.logits.first().map_or(0, Vec::len);
    let bytes: Vec<u8> = out.logits.iter().flatten().flat_map(|x| x.to_le_bytes()).collect();
    let times = out.decode_times.iter().map(|d| d.as_secs_f64()).collect();
    (out.tokens, PyBytes::new(py, &bytes), vocab, times)
}
