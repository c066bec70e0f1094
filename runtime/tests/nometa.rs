//! `LanguageModel` on a library without `_metadata` (tests/fixtures/nnllm, README there): the
//! model functions alone, written with `tvm.relax.frontend.nn` and `nn.llm`'s `PagedKVCache`,
//! its weights the tensor cache's `param_0`, `param_1`, ... The settings `_metadata` would give
//! come from `GenerateOptions::model`. TVM 0.27's VM, driven as MLC-LLM's engine drives it
//! (`extend`/`batch_extend` for a sequence prefilled before: the later chunk of a long prompt
//! and the second turn), recorded the tokens and logits (`reference.json`); the fixture's
//! `extend` functions add a bias to their logits, so a `prefill` in their place shows. Tokens
//! equal TVM's; logits within 1e-4 of max(1, max |ref|).
#![cfg(feature = "llm")]

use std::path::{Path, PathBuf};

use mblob_runtime::device::Device;
use mblob_runtime::exec::llm::generate::{
    GenerateError, GenerateOptions, LanguageModel, ModelSettings, Sampling, SamplingOptionError,
};
use mblob_runtime::{load_library, LoadOptions, LoadedTree, Registry};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/nnllm")
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("reference.json")).unwrap()).unwrap()
}

fn load() -> LoadedTree {
    // SAFETY: the fixture is a library TVM built for these tests.
    unsafe { load_library(&dir().join("lib.so"), &Registry::default(), &LoadOptions::default()) }.unwrap()
}

fn npy(file: &str) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(dir().join(file)).unwrap();
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    (f.shape().to_vec(), f.into_vec::<f32>().unwrap())
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
}

/// The options the fixture was built for (what its `_metadata` would say).
fn options() -> GenerateOptions {
    GenerateOptions {
        prefill_chunk_size: Some(32),
        model: ModelSettings { context_window_size: Some(128), max_batch_size: Some(4), ..ModelSettings::default() },
        ..GenerateOptions::default()
    }
}

fn model(options: &GenerateOptions) -> Result<LanguageModel, GenerateError> {
    LanguageModel::new(&load(), Device::cpu(0), Some(&dir().join("params")), options)
}

/// Each row of `got` within 1e-4 of max(1, max |ref|) of TVM's rows in `file`.
fn logits_close(what: &str, got: &[Vec<f32>], file: &str) {
    let (shape, want) = npy(file);
    let vocab = shape[1] as usize;
    assert_eq!(got.len(), shape[0] as usize, "{what}: steps");
    for (step, (g, w)) in got.iter().zip(want.chunks(vocab)).enumerate() {
        assert_eq!(g.len(), vocab, "{what}: vocabulary");
        let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4 * scale, "{what}, step {step}: logits differ from TVM's by {diff}");
    }
}

#[test]
fn multi_turn_gives_tvms_tokens_and_logits_through_extend() {
    let r = reference();
    let s = &r["scenarios"]["multi_turn"];
    let mut lm = model(&options()).unwrap();
    // No `_metadata`: the vocabulary is the logits' length, the weights the cache's param_N.
    assert_eq!(lm.vocab_size(), Some(1000));
    assert_eq!(lm.params().map(<[_]>::len), Some(r["config"]["num_hidden_layers"].as_u64().unwrap() as usize * 6 + 4));
    let turns = s["turns"].as_array().unwrap();
    let greedy = Sampling::default();
    // Turn 1: 40 tokens, chunks of 32: `prefill`, then `extend` (its logits pick the first token).
    let first = lm.generate_sampled(&ints(&turns[0]["prompt"]), 6, &greedy, |_| {}).unwrap();
    assert_eq!(first.tokens, ints(&turns[0]["tokens"]), "turn 1: TVM's tokens");
    // Turn 2: the last token and the new prompt through `extend`.
    let second = lm.continue_sampled(&ints(&turns[1]["prompt"]), 6, &greedy, |_| {}).unwrap();
    assert_eq!(second.tokens, ints(&turns[1]["tokens"]), "turn 2: TVM's tokens");
    let all: Vec<Vec<f32>> = first.logits.into_iter().chain(second.logits).collect();
    logits_close("multi_turn", &all, s["logits"].as_str().unwrap());
}

#[test]
fn a_batch_continued_gives_tvms_tokens_and_logits_through_batch_extend() {
    let r = reference();
    let s = &r["scenarios"]["batch_turns"];
    let mut lm = model(&options()).unwrap();
    let turns = s["turns"].as_array().unwrap();
    let prompts = |t: &Value| -> Vec<Vec<i32>> { t["prompts"].as_array().unwrap().iter().map(ints).collect() };
    let tokens = |t: &Value| -> Vec<Vec<i32>> { t["tokens"].as_array().unwrap().iter().map(ints).collect() };
    let greedy = Sampling::default();
    let first = lm.generate_batch(&prompts(&turns[0]), 4, &greedy).unwrap();
    assert_eq!(first.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>(), tokens(&turns[0]), "turn 1");
    let second = lm.continue_batch(&prompts(&turns[1]), 4, &greedy).unwrap();
    assert_eq!(second.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>(), tokens(&turns[1]), "turn 2");
    for (i, file) in s["logits"].as_array().unwrap().iter().enumerate() {
        let rows: Vec<Vec<f32>> = first[i].logits.iter().chain(&second[i].logits).cloned().collect();
        logits_close(&format!("batch_turns seq {i}"), &rows, file.as_str().unwrap());
    }
    // A next turn needs one prompt per sequence of the batch.
    let e = lm.continue_batch(&[vec![1]], 2, &greedy).unwrap_err();
    assert!(matches!(e, GenerateError::TurnCount { given: 1, sequences } if sequences > 1), "{e}");
}

#[test]
fn no_context_window_with_a_cache_size_and_a_sliding_window_gives_tvms_tokens_and_logits() {
    let r = reference();
    let s = &r["scenarios"]["sliding"];
    let options = GenerateOptions {
        max_total_seq_len: Some(64),
        prefill_chunk_size: Some(32),
        model: ModelSettings {
            context_window_size: Some(-1),
            sliding_window_size: Some(s["sliding_window_size"].as_i64().unwrap()),
            attention_sink_size: Some(s["attention_sink_size"].as_i64().unwrap()),
            ..ModelSettings::default()
        },
        ..GenerateOptions::default()
    };
    let mut lm = model(&options).unwrap();
    let turn = &s["turns"][0];
    let want = ints(&turn["tokens"]);
    // 40 prompt tokens and 30 new ones: past the 64 tokens of the cache, which the window keeps.
    let out = lm.generate(&ints(&turn["prompt"]), want.len()).unwrap();
    assert_eq!(out.tokens, want, "TVM's tokens");
    logits_close("sliding", &out.logits, s["logits"].as_str().unwrap());
}

#[test]
fn what_metadata_would_give_is_asked_for_by_name() {
    // Nothing given: the context window (or a cache size) is needed.
    let e = model(&GenerateOptions::default()).unwrap_err();
    assert!(matches!(&e, GenerateError::Setting { option, .. } if option.starts_with("context_window_size")), "{e}");
    assert!(e.to_string().contains("--context-window") && e.to_string().contains("_metadata"), "{e}");
    // A context window of -1 needs the cache's size.
    let o = GenerateOptions {
        model: ModelSettings { context_window_size: Some(-1), ..ModelSettings::default() },
        ..GenerateOptions::default()
    };
    let e = model(&o).unwrap_err();
    assert!(matches!(&e, GenerateError::Setting { option, .. } if option.starts_with("max_total_seq_len")), "{e}");
    // The cache's size alone is enough: the chunk defaults to it (MLC-LLM's min(context, 8192)).
    let o = GenerateOptions { max_total_seq_len: Some(32), ..GenerateOptions::default() };
    let mut lm = model(&o).unwrap();
    assert_eq!(lm.generate(&[1, 2, 3], 2).unwrap().tokens.len(), 2);
}

#[test]
fn requests_the_model_cannot_take_are_typed_errors() {
    let mut lm = model(&options()).unwrap();
    let greedy = Sampling::default();
    // Nothing to continue yet.
    assert!(matches!(lm.continue_sampled(&[1], 2, &greedy, |_| {}), Err(GenerateError::NothingToContinue)));
    // A prompt longer than the cache (the context window, 128).
    let long: Vec<i32> = (0..129).collect();
    let e = lm.generate(&long, 1).unwrap_err();
    assert!(
        matches!(&e, GenerateError::PromptTooLong { prompts, max_new_tokens: 1, needed: 129, capacity: 128 } if prompts == &[129]),
        "{e}"
    );
    assert!(e.to_string().contains("more than its 128"), "{e}");
    // A continuation past the cache: 120 + 1 held, 8 more and 4 new.
    lm.generate(&(0..120).collect::<Vec<_>>(), 2).unwrap();
    let e = lm.continue_sampled(&(0..8).collect::<Vec<_>>(), 4, &greedy, |_| {}).unwrap_err();
    assert!(matches!(&e, GenerateError::PromptTooLong { capacity: 128, .. }), "{e}");
    // The vocabulary (from the logits' length) bounds the ids, in a continuation too.
    let e = lm.generate(&[5, 1000], 1).unwrap_err();
    assert!(matches!(e, GenerateError::TokenId { id: 1000, position: 1, vocab: Some(1000) }), "{e}");
    lm.generate(&[5], 1).unwrap();
    let e = lm.continue_sampled(&[-1], 1, &greedy, |_| {}).unwrap_err();
    assert!(matches!(e, GenerateError::TokenId { id: -1, .. }), "{e}");
    // A chunk past the functions' compiled bound (seq_len 32): a typed error, and the failed
    // turn leaves nothing to continue.
    let mut big = model(&GenerateOptions { prefill_chunk_size: Some(64), ..options() }).unwrap();
    let e = big.generate(&(0..40).collect::<Vec<_>>(), 2).unwrap_err();
    assert!(matches!(e, GenerateError::Vm(_)), "{e}");
    assert!(matches!(big.continue_sampled(&[1], 1, &greedy, |_| {}), Err(GenerateError::NothingToContinue)));
    // More prompts than max_batch_size.
    let e = lm.generate_batch(&vec![vec![1]; 5], 1, &greedy).unwrap_err();
    assert!(matches!(e, GenerateError::TooManyPrompts { given: 5, max: 4 }), "{e}");
    assert!(e.to_string().contains("max_batch_size 4"), "{e}");
    // Empty prompts, of one sequence and of a batch.
    assert!(matches!(lm.generate(&[], 1), Err(GenerateError::EmptyPrompt { index: None })));
    let e = lm.generate_batch(&[vec![1], vec![]], 1, &greedy).unwrap_err();
    assert!(matches!(e, GenerateError::EmptyPrompt { index: Some(1) }), "{e}");
    assert!(matches!(lm.generate_batch(&[], 1, &greedy), Err(GenerateError::NoPrompt)));
    // Sampling settings out of their domain.
    let bad = Sampling { top_p: 0.0, ..Sampling::default() };
    let e = lm.generate_sampled(&[1], 1, &bad, |_| {}).unwrap_err();
    assert!(matches!(e, GenerateError::SamplingOption(SamplingOptionError::TopP(_))), "{e}");
}

/// A scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of the fixture's tensor cache with the records `keep` keeps.
fn cache_with(tag: &str, keep: impl Fn(&str) -> bool) -> Scratch {
    let tmp = Scratch(std::env::temp_dir().join(format!("mblob-nometa-{}-{tag}", std::process::id())));
    std::fs::create_dir_all(tmp.path()).unwrap();
    let src = dir().join("params");
    let mut index: Value = serde_json::from_slice(&std::fs::read(src.join("tensor-cache.json")).unwrap()).unwrap();
    for shard in index["records"].as_array_mut().unwrap() {
        std::fs::copy(
            src.join(shard["dataPath"].as_str().unwrap()),
            tmp.path().join(shard["dataPath"].as_str().unwrap()),
        )
        .unwrap();
        let records = shard["records"].as_array_mut().unwrap();
        records.retain(|r| keep(r["name"].as_str().unwrap()));
    }
    std::fs::write(tmp.path().join("tensor-cache.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    tmp
}

#[test]
fn a_tensor_cache_without_the_indexed_weights_is_refused() {
    let tree = load();
    // No `param_0`: the weights are not where a library without `_metadata` reads them.
    let tmp = cache_with("first", |n| n != "param_0");
    let e = LanguageModel::new(&tree, Device::cpu(0), Some(tmp.path()), &options()).unwrap_err();
    assert!(matches!(e, GenerateError::NoIndexedWeights), "{e}");
    assert!(e.to_string().contains("param_0"), "{e}");
    // The last weight missing: the functions' signatures take one more (the VM's tuple check).
    let last = format!("param_{}", 2 * 6 + 3);
    let tmp = cache_with("last", |n| n != last);
    let e = LanguageModel::new(&tree, Device::cpu(0), Some(tmp.path()), &options()).unwrap_err();
    assert!(matches!(e, GenerateError::Vm(_)), "{e}");
    // No weights at all for a library that takes them.
    let e = LanguageModel::new(&tree, Device::cpu(0), None, &options()).unwrap_err();
    assert!(matches!(e, GenerateError::WeightsMissing), "{e}");
}
