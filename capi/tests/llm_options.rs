//! `mblob_llm_new_with_options` on a library without `_metadata` (tests/fixtures/nnllm: the
//! model functions alone, built with TVM 0.27's `nn.llm`; weights the tensor cache's `param_0`,
//! `param_1`, ...): with the settings the metadata would give, `mblob_llm_generate` and
//! `mblob_llm_generate_batch` give the tokens TVM's own VM gave, driven as MLC-LLM's engine
//! drives it (`reference.json`), with a context window and with a sliding window and sinks in
//! a cache of a given size. Without them, or with a struct of an unknown size, the call is a
//! typed error naming what is missing; the C status follows the cause of each error.

#![cfg(feature = "llm")]

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

use mblob_capi::mblob_status::*;
use mblob_capi::*;
use serde_json::Value;

#[path = "support/common.rs"]
mod common;
use common::{last_error, ok};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/nnllm")
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("reference.json")).unwrap()).unwrap()
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
}

fn load(path: &Path) -> *mut mblob_library {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let mut lib = null_mut();
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    ok(unsafe { mblob_library_load(path.as_ptr(), &mut lib) }, "load");
    lib
}

/// The defaults, as `mblob_llm_options_init` writes them.
fn defaults() -> mblob_llm_options {
    let mut o = std::mem::MaybeUninit::<mblob_llm_options>::uninit();
    // SAFETY: storage for one struct, of its size.
    ok(unsafe { mblob_llm_options_init(o.as_mut_ptr(), std::mem::size_of::<mblob_llm_options>()) }, "init");
    // SAFETY: written whole by the successful call.
    unsafe { o.assume_init() }
}

/// The settings the fixture was built for (what its `_metadata` would say).
fn built_for() -> mblob_llm_options {
    mblob_llm_options { context_window_size: 128, prefill_chunk_size: 32, max_batch_size: 4, ..defaults() }
}

/// A model of the fixture with its weights and `options` (NULL for `None`).
fn llm(lib: *mut mblob_library, options: Option<&mblob_llm_options>) -> Result<*mut mblob_llm, mblob_status> {
    let weights = CString::new(dir().join("params").to_str().unwrap()).unwrap();
    let mut out = null_mut();
    let options = options.map_or(null(), |o| o as *const _);
    // SAFETY: a live library, a NUL-terminated path, NULL or one options struct, a valid
    // out-pointer.
    let s = unsafe { mblob_llm_new_with_options(lib, weights.as_ptr(), 1, 0, options, &mut out) };
    if s == MBLOB_OK {
        Ok(out)
    } else {
        assert!(out.is_null(), "written on an error");
        Err(s)
    }
}

/// Greedy tokens after `prompt`, or the status.
fn generate(l: *mut mblob_llm, prompt: &[i32], n: usize) -> Result<Vec<i32>, mblob_status> {
    let mut out = vec![-7; n];
    let mut n_out = 0;
    // SAFETY: a live handle, `prompt.len()` ids, `n` writable ids and a writable count.
    let s = unsafe { mblob_llm_generate(l, prompt.as_ptr(), prompt.len(), n, null(), out.as_mut_ptr(), n, &mut n_out) };
    if s != MBLOB_OK {
        return Err(s);
    }
    out.truncate(n_out);
    Ok(out)
}

/// Greedy tokens after each of `prompts` in one batch, or the status.
fn generate_batch(l: *mut mblob_llm, prompts: &[Vec<i32>], n: usize) -> Result<Vec<Vec<i32>>, mblob_status> {
    let starts: Vec<*const i32> = prompts.iter().map(|p| p.as_ptr()).collect();
    let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut out = vec![-7; prompts.len() * n];
    let mut n_out = 0;
    // SAFETY: a live handle, `prompts.len()` pointers (each to its length of ids) and lengths,
    // `out.len()` writable ids and a writable count.
    let s = unsafe {
        mblob_llm_generate_batch(
            l,
            starts.as_ptr(),
            lengths.as_ptr(),
            prompts.len(),
            n,
            null(),
            out.as_mut_ptr(),
            out.len(),
            &mut n_out,
        )
    };
    if s != MBLOB_OK {
        return Err(s);
    }
    Ok(out.chunks(n).map(|c| c[..n_out].to_vec()).collect())
}

fn free(l: *mut mblob_llm) {
    // SAFETY: a live handle, freed once.
    ok(unsafe { mblob_llm_free(l) }, "free llm");
}

#[test]
fn the_settings_of_a_library_without_metadata_give_tvms_tokens() {
    let r = reference();
    let lib = load(&dir().join("lib.so"));
    let l = llm(lib, Some(&built_for())).unwrap_or_else(|s| panic!("{s:?}: {}", last_error()));
    let mut vocab = 0;
    // SAFETY: a live handle and a writable out-pointer.
    ok(unsafe { mblob_llm_vocab_size(l, &mut vocab) }, "vocab");
    assert_eq!(vocab, r["config"]["vocab_size"].as_i64().unwrap(), "the logits' length");
    // One sequence: the first turn of `multi_turn` (40 tokens, prefilled in chunks of 32).
    let turn = &r["scenarios"]["multi_turn"]["turns"][0];
    let want = ints(&turn["tokens"]);
    assert_eq!(generate(l, &ints(&turn["prompt"]), want.len()), Ok(want), "multi_turn: TVM's tokens");
    // A batch: the first turn of `batch_turns`.
    let turn = &r["scenarios"]["batch_turns"]["turns"][0];
    let prompts: Vec<Vec<i32>> = turn["prompts"].as_array().unwrap().iter().map(ints).collect();
    let want: Vec<Vec<i32>> = turn["tokens"].as_array().unwrap().iter().map(ints).collect();
    assert_eq!(generate_batch(l, &prompts, want[0].len()), Ok(want), "batch_turns: TVM's tokens");
    free(l);
    // A context window of -1 with a cache of 64 tokens, a sliding window and sinks: 40 prompt
    // tokens and 30 new ones, past the cache, which the window keeps.
    let s = &r["scenarios"]["sliding"];
    let o = mblob_llm_options {
        context_window_size: -1,
        max_total_seq_len: 64,
        prefill_chunk_size: 32,
        sliding_window_size: s["sliding_window_size"].as_i64().unwrap(),
        attention_sink_size: s["attention_sink_size"].as_i64().unwrap(),
        ..defaults()
    };
    let l = llm(lib, Some(&o)).unwrap_or_else(|s| panic!("{s:?}: {}", last_error()));
    let want = ints(&s["turns"][0]["tokens"]);
    assert_eq!(generate(l, &ints(&s["turns"][0]["prompt"]), want.len()), Ok(want), "sliding: TVM's tokens");
    free(l);
    // SAFETY: a live handle, freed once.
    ok(unsafe { mblob_library_free(lib) }, "free lib");
}

#[test]
fn missing_settings_and_bad_options_are_typed_errors() {
    let lib = load(&dir().join("lib.so"));
    // Nothing given: the context window (or a cache size) is needed; NULL options are the
    // defaults, as `mblob_llm_new` passes them.
    assert_eq!(llm(lib, None), Err(MBLOB_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("context_window_size"), "{}", last_error());
    assert_eq!(llm(lib, Some(&defaults())), Err(MBLOB_ERR_INVALID_ARGUMENT));
    // A context window of -1 needs the cache's size.
    assert_eq!(
        llm(lib, Some(&mblob_llm_options { context_window_size: -1, ..defaults() })),
        Err(MBLOB_ERR_INVALID_ARGUMENT)
    );
    assert!(last_error().contains("max_total_seq_len"), "{}", last_error());
    // Out of range: a negative budget, a page of no tokens.
    assert_eq!(
        llm(lib, Some(&mblob_llm_options { kv_cache_bytes: -1, ..built_for() })),
        Err(MBLOB_ERR_INVALID_ARGUMENT)
    );
    assert!(last_error().contains("kv_cache_bytes"), "{}", last_error());
    assert_eq!(llm(lib, Some(&mblob_llm_options { page_size: 0, ..built_for() })), Err(MBLOB_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("page_size"), "{}", last_error());
    // A budget too small for one token.
    assert_eq!(
        llm(lib, Some(&mblob_llm_options { kv_cache_bytes: 1, ..built_for() })),
        Err(MBLOB_ERR_INVALID_ARGUMENT)
    );
    // A struct of a size no version has, in `init` (nothing written) and in the call.
    let size = std::mem::size_of::<mblob_llm_options>();
    let bad = mblob_llm_options { struct_size: size + 8, ..built_for() };
    assert_eq!(llm(lib, Some(&bad)), Err(MBLOB_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains(&format!("struct_size is {}", size + 8)), "{}", last_error());
    let mut o = built_for();
    // SAFETY: storage for one struct; the size is refused before anything is written.
    assert_eq!(unsafe { mblob_llm_options_init(&mut o, 12) }, MBLOB_ERR_INVALID_ARGUMENT);
    assert_eq!(o, built_for(), "nothing written");
    // SAFETY: NULL is refused.
    assert_eq!(unsafe { mblob_llm_options_init(null_mut(), size) }, MBLOB_ERR_NULL_ARGUMENT);
    // SAFETY: a live handle, freed once.
    ok(unsafe { mblob_library_free(lib) }, "free lib");
}

#[test]
fn each_request_error_has_the_status_of_its_cause() {
    let lib = load(&dir().join("lib.so"));
    let l = llm(lib, Some(&built_for())).unwrap();
    // The prompts: empty, longer than the context window (128), more than max_batch_size (4),
    // an id outside the vocabulary (1000): input problems.
    assert_eq!(generate(l, &[], 1), Err(MBLOB_ERR_INPUT));
    assert!(last_error().contains("the prompt is empty"), "{}", last_error());
    let long: Vec<i32> = (0..129).collect();
    assert_eq!(generate(l, &long, 1), Err(MBLOB_ERR_INPUT));
    assert!(last_error().contains("more than its 128"), "{}", last_error());
    assert_eq!(generate_batch(l, &vec![vec![1]; 5], 1), Err(MBLOB_ERR_INPUT));
    assert!(last_error().contains("5 prompts, more than the model's max_batch_size 4"), "{}", last_error());
    assert_eq!(generate_batch(l, &[vec![1], vec![1000]], 1), Err(MBLOB_ERR_INPUT));
    assert!(last_error().contains("the vocabulary has 1000 ids"), "{}", last_error());
    // A prefill chunk past the functions' compiled bound (seq_len 32): the VM's bound check, an
    // input over what the model was built for.
    free(l);
    let l = llm(lib, Some(&mblob_llm_options { prefill_chunk_size: 64, ..built_for() })).unwrap();
    assert_eq!(generate(l, &(0..40).collect::<Vec<_>>(), 1), Err(MBLOB_ERR_INPUT), "{}", last_error());
    free(l);
    // SAFETY: a live handle, freed once.
    ok(unsafe { mblob_library_free(lib) }, "free lib");
}

/// `opencl_program_cache` on MLC-LLM's Qwen2.5 built for OpenCL (tests/fixtures/mlc): the first
/// model builds the kernels and writes their programs in TVM's layout (a u64 count, then per
/// kernel a u64-prefixed name and binary); a model made later loads them. Both give TVM's
/// tokens (the records of the CPU build of the same weights). Skipped without an OpenCL device
/// (pocl in CI) unless `MBLOB_REQUIRE_OPENCL` is set.
#[cfg(feature = "opencl")]
#[test]
fn an_opencl_program_cache_is_written_then_loaded() {
    let mlc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc");
    let r: Value = serde_json::from_slice(&std::fs::read(mlc.join("qwen2-q0f32/reference.json")).unwrap()).unwrap();
    let (prompt, want) = (ints(&r["generate"]["prompt"]), ints(&r["generate"]["tokens"]));
    let lib = load(&mlc.join("qwen2-q0f32-opencl/lib.so"));
    let weights = CString::new(mlc.join("qwen2-q0f32").to_str().unwrap()).unwrap();
    let cache = std::env::temp_dir().join(format!("mblob-capi-programs-{}", std::process::id()));
    let _ = std::fs::remove_file(&cache);
    let cache_c = CString::new(cache.to_str().unwrap()).unwrap();
    let o = mblob_llm_options { opencl_program_cache: cache_c.as_ptr(), ..defaults() };
    for turn in ["written", "loaded"] {
        let mut l = null_mut();
        // SAFETY: a live library, a NUL-terminated path, one options struct whose string lives
        // through the call, a valid out-pointer.
        let s = unsafe { mblob_llm_new_with_options(lib, weights.as_ptr(), 4, 0, &o, &mut l) };
        if s == MBLOB_ERR_DEVICE && std::env::var_os("MBLOB_REQUIRE_OPENCL").is_none() {
            eprintln!("SKIPPED: no OpenCL device ({})", last_error());
            // SAFETY: a live library, freed once.
            ok(unsafe { mblob_library_free(lib) }, "free lib");
            return;
        }
        ok(s, turn);
        assert_eq!(generate(l, &prompt, want.len()), Ok(want.clone()), "{turn}: TVM's tokens");
        let data = std::fs::read(&cache).unwrap();
        let count = u64::from_le_bytes(data[..8].try_into().unwrap());
        let name_len = u64::from_le_bytes(data[8..16].try_into().unwrap()) as usize;
        assert!(count > 1 && name_len > 0 && data.len() > 16 + name_len, "{turn}: {count} programs");
        free(l);
    }
    let _ = std::fs::remove_file(&cache);
    // SAFETY: a live handle, freed once.
    ok(unsafe { mblob_library_free(lib) }, "free lib");
}
