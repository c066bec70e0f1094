//! The language-model calls (`mblob_llm_*`) on the tiny LLM of `tests/fixtures/llm` (MLC-LLM's
//! llama built by TVM 0.27, both with its weights as a parameter and bound as constants):
//! greedy generation gives the tokens TVM's run gave (the `argmax` of each `forward` step of
//! scenario `single` in `scenarios.json`), and bad requests are typed errors that leave the
//! out-pointers alone.

#![cfg(feature = "llm")]

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

use mblob_capi::mblob_status::*;
use mblob_capi::*;

#[path = "support/common.rs"]
mod common;
use common::{last_error, ok};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm")
}

fn c(p: &Path) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

fn load(name: &str) -> *mut mblob_library {
    let mut lib = null_mut();
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    ok(unsafe { mblob_library_load(c(&dir().join(name)).as_ptr(), &mut lib) }, name);
    lib
}

fn llm(lib: *mut mblob_library, weights: Option<&Path>) -> Result<*mut mblob_llm, mblob_status> {
    let weights = weights.map(c);
    let mut out = null_mut();
    // SAFETY: a live library, NULL or a NUL-terminated path, a valid out-pointer.
    let s = unsafe { mblob_llm_new(lib, weights.as_ref().map_or(null(), |w| w.as_ptr()), 1, 0, &mut out) };
    if s == MBLOB_OK {
        Ok(out)
    } else {
        assert!(out.is_null(), "written on an error");
        Err(s)
    }
}

/// TVM's prompt and greedy tokens: scenario `single`'s forward steps (the first one's tokens,
/// and each one's argmax).
fn tvm_run() -> (Vec<i32>, Vec<i32>) {
    let text = std::fs::read_to_string(dir().join("scenarios.json")).unwrap();
    let scenarios: serde_json::Value = serde_json::from_str(&text).unwrap();
    let forwards: Vec<&serde_json::Value> =
        scenarios["scenarios"]["single"]["steps"].as_array().unwrap().iter().filter(|s| s["op"] == "forward").collect();
    let ints = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
    };
    let prompt = ints(&forwards[0]["tokens"]);
    let tokens = forwards.iter().map(|s| ints(&s["argmax"])[0]).collect();
    (prompt, tokens)
}

fn generate(
    l: *mut mblob_llm,
    prompt: &[i32],
    n: usize,
    sampling: Option<&mblob_llm_sampling>,
    capacity: usize,
) -> (mblob_status, Vec<i32>, usize) {
    let mut out = vec![-7; capacity];
    let mut n_out = 999;
    // SAFETY: a live handle, `prompt.len()` ids, NULL or one sampling struct, `capacity`
    // writable ids and a writable count.
    let s = unsafe {
        mblob_llm_generate(
            l,
            prompt.as_ptr(),
            prompt.len(),
            n,
            sampling.map_or(null(), |s| s as *const _),
            out.as_mut_ptr(),
            capacity,
            &mut n_out,
        )
    };
    (s, out, n_out)
}

#[test]
fn greedy_tokens_are_tvms_for_both_builds() {
    let (prompt, want) = tvm_run();
    assert!(want.len() > 1, "TVM's run has a prefill and decodes");
    for (name, weights) in [("llm_params.so", Some(dir().join("params"))), ("llm_consts.so", None)] {
        let lib = load(name);
        let l = llm(lib, weights.as_deref()).unwrap_or_else(|s| panic!("{name}: {s:?} {}", last_error()));
        // The library may go before the model.
        // SAFETY: a live handle, freed once.
        ok(unsafe { mblob_library_free(lib) }, "free lib");
        let mut vocab = 0;
        // SAFETY: a live handle and a writable out-pointer.
        ok(unsafe { mblob_llm_vocab_size(l, &mut vocab) }, "vocab");
        assert_eq!(vocab, 256, "{name}: the tiny LLM's vocabulary (config vocab_size)");
        // Twice, to see that each call starts a new KV cache; the second with greedy spelled out.
        let greedy = mblob_llm_sampling { temperature: 0.0, top_p: 1.0, seed: 5 };
        for sampling in [None, Some(&greedy)] {
            let (s, out, n_out) = generate(l, &prompt, want.len(), sampling, want.len() + 2);
            ok(s, name);
            assert_eq!(n_out, want.len());
            assert_eq!(&out[..n_out], &want[..], "{name}: TVM's greedy tokens");
            assert_eq!(&out[n_out..], [-7, -7], "nothing written past the tokens");
        }
        // SAFETY: a live handle, freed once.
        ok(unsafe { mblob_llm_free(l) }, "free llm");
    }
}

#[test]
fn bad_requests_are_typed_errors() {
    let (prompt, _) = tvm_run();
    let lib = load("llm_params.so");
    // The weights mode the library does not have, and a directory that is no tensor cache.
    assert_eq!(llm(lib, None), Err(MBLOB_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("tensor cache"), "{}", last_error());
    assert_eq!(llm(lib, Some(&dir().join("builtins"))), Err(MBLOB_ERR_LOAD));
    let consts = load("llm_consts.so");
    assert_eq!(llm(consts, Some(&dir().join("params"))), Err(MBLOB_ERR_INVALID_ARGUMENT));
    let l = llm(lib, Some(&dir().join("params"))).unwrap();
    // Token ids outside the vocabulary (0..256) are refused before anything runs.
    for (bad, position) in [(256, 3), (-1, 0), (i32::MAX, 6)] {
        let mut p = prompt.clone();
        p[position] = bad;
        let (s, out, n_out) = generate(l, &p, 4, None, 4);
        assert_eq!(s, MBLOB_ERR_INPUT, "{bad}: {}", last_error());
        let e = last_error();
        assert!(
            e.contains(&format!("token id {bad} (prompt position {position})"))
                && e.contains("the vocabulary has 256 ids, 0 to 255"),
            "{e}"
        );
        assert_eq!((out, n_out), (vec![-7; 4], 999), "nothing written on an error");
    }
    // An empty prompt, too many new tokens for the context window (128), a buffer too small,
    // a bad sampling.
    assert_eq!(generate(l, &[], 2, None, 2).0, MBLOB_ERR_INPUT);
    assert_eq!(generate(l, &prompt, 200, None, 200).0, MBLOB_ERR_INPUT, "{}", last_error());
    assert_eq!(generate(l, &prompt, 4, None, 3).0, MBLOB_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("fewer than max_new_tokens (4)"), "{}", last_error());
    for bad in [
        mblob_llm_sampling { temperature: -1.0, top_p: 1.0, seed: 0 },
        mblob_llm_sampling { temperature: 1.0, top_p: 0.0, seed: 0 },
        mblob_llm_sampling { temperature: f64::NAN, top_p: 1.0, seed: 0 },
    ] {
        assert_eq!(generate(l, &prompt, 2, Some(&bad), 2).0, MBLOB_ERR_INVALID_ARGUMENT, "{bad:?}");
    }
    // NULL arguments and handles of the wrong kind.
    let mut n_out = 0;
    let mut tok = [0i32; 2];
    // SAFETY: NULL prompt: refused before anything is read.
    let s = unsafe { mblob_llm_generate(l, null(), 1, 1, null(), tok.as_mut_ptr(), 2, &mut n_out) };
    assert_eq!(s, MBLOB_ERR_NULL_ARGUMENT);
    // SAFETY: a library handle where a language model goes: refused by the live-handle check.
    let s = unsafe {
        mblob_llm_generate(lib.cast(), prompt.as_ptr(), prompt.len(), 1, null(), tok.as_mut_ptr(), 2, &mut n_out)
    };
    assert_eq!(s, MBLOB_ERR_INVALID_HANDLE, "{}", last_error());
    assert!(last_error().contains("not a mblob_llm"), "{}", last_error());
    // SAFETY: live handles, each freed once; then `l` again, which is refused.
    unsafe {
        ok(mblob_llm_free(l), "free llm");
        assert_eq!(mblob_llm_free(l), MBLOB_ERR_INVALID_HANDLE);
        ok(mblob_llm_free(null_mut()), "free NULL");
        ok(mblob_library_free(lib), "free lib");
        ok(mblob_library_free(consts), "free consts");
    }
}

/// `mblob_llm_generate_batch` on MLC-LLM's Qwen2.5 (tests/fixtures/mlc/qwen2-q0f32): TVM's
/// tokens of every sequence of the batch (`reference.json`'s `batch`, TVM 0.27's VM driven as
/// MLC-LLM's engine drives it), greedy and sampled; too small an output, a NULL prompt and an
/// empty one are typed errors that write nothing.
#[test]
fn a_batch_gives_tvms_tokens_greedy_and_sampled() {
    let mlc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc/qwen2-q0f32");
    let text = std::fs::read_to_string(mlc.join("reference.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let b = &r["batch"];
    let seqs = |v: &serde_json::Value| -> Vec<Vec<i32>> {
        let ints = |p: &serde_json::Value| p.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect();
        v.as_array().unwrap().iter().map(ints).collect()
    };
    let prompts = seqs(&b["prompts"]);
    let n = b["max_new_tokens"].as_u64().unwrap() as usize;
    let mut lib = null_mut();
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    ok(unsafe { mblob_library_load(c(&mlc.join("lib.so")).as_ptr(), &mut lib) }, "qwen2");
    let l = llm(lib, Some(&mlc)).unwrap_or_else(|s| panic!("{s:?} {}", last_error()));
    let run = |prompts: &[Vec<i32>], sampling: Option<&mblob_llm_sampling>, capacity: usize| {
        let starts: Vec<*const i32> = prompts.iter().map(|p| if p.is_empty() { null() } else { p.as_ptr() }).collect();
        let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let mut out = vec![-7; capacity];
        let mut n_out = 999;
        // SAFETY: a live handle, `prompts.len()` pointers (each to its length of ids, or NULL)
        // and lengths, NULL or one sampling struct, `capacity` writable ids, a writable count.
        let s = unsafe {
            mblob_llm_generate_batch(
                l,
                starts.as_ptr(),
                lengths.as_ptr(),
                prompts.len(),
                n,
                sampling.map_or(null(), |s| s as *const _),
                out.as_mut_ptr(),
                capacity,
                &mut n_out,
            )
        };
        (s, out, n_out)
    };
    let (s, out, n_out) = run(&prompts, None, prompts.len() * n);
    ok(s, "batch");
    assert_eq!(n_out, n);
    assert_eq!(out.chunks(n).map(<[i32]>::to_vec).collect::<Vec<_>>(), seqs(&b["tokens"]), "TVM's greedy tokens");
    let sampled = &b["sampled"];
    let sampling = mblob_llm_sampling {
        temperature: sampled["temperature"].as_f64().unwrap(),
        top_p: sampled["top_p"].as_f64().unwrap(),
        seed: sampled["seeds"][0].as_u64().unwrap() as u32,
    };
    let (s, out, _) = run(&prompts, Some(&sampling), prompts.len() * n);
    ok(s, "sampled batch");
    assert_eq!(
        out.chunks(n).map(<[i32]>::to_vec).collect::<Vec<_>>(),
        seqs(&sampled["tokens"]),
        "TVM's sampled tokens"
    );
    let nothing = |(s, out, n_out): (mblob_status, Vec<i32>, usize), want: mblob_status| {
        assert_eq!(s, want, "{}", last_error());
        assert!(out.iter().all(|&t| t == -7) && n_out == 999, "nothing written on an error");
    };
    nothing(run(&prompts, None, prompts.len() * n - 1), MBLOB_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains(&format!("fewer than 3 prompts x {n}")), "{}", last_error());
    nothing(run(&[prompts[0].clone(), Vec::new()], None, 2 * n), MBLOB_ERR_NULL_ARGUMENT);
    // SAFETY: live handles, freed once.
    unsafe {
        ok(mblob_llm_free(l), "free llm");
        ok(mblob_library_free(lib), "free lib");
    }
}
