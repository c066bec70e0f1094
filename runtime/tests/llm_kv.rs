//! TVM 0.27's TIR paged KV cache against TVM itself: the LLM of tests/fixtures/llm (both
//! libraries: weights as constants, and weights passed as `packed_params` from the tensor
//! cache) runs each scenario of `scenarios.json` (and of `deep/`) step by step, as the
//! fixture's README gives the call sequences, at 1 and 2 threads. After every step the cache's
//! state (`num_available_pages`, `total_sequence_length`, each sequence's length) equals TVM's;
//! every forward gives TVM's greedy tokens and its logits within 1e-4 (relative to the largest
//! logit, at least 1; they come out bitwise equal here); `debug_get_kv` reads back TVM's keys
//! and values bitwise. The KV cache cases of `errors.json` fail with TVM's messages and leave
//! the state TVM leaves.
#![cfg(feature = "llm")]

use std::collections::BTreeMap;

use mblob_runtime::exec::relax::{VirtualMachine, VmError};
use mblob_runtime::ffi::threadpool;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{Device, NdArray};
use serde_json::Value as Json;

#[path = "support/llm_fixture.rs"]
mod llm_fixture;
use llm_fixture::{dir, f32s, ints, json, load, npy_f32};

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::{Host, HostCalls};

/// The 15 weights of `llm_params.so` in `param_names` order, sliced from the tensor cache's
/// raw shards as its `tensor-cache.json` places them.
fn packed_params(names: &[String]) -> Host {
    let cache = json("params/tensor-cache.json");
    let mut found: BTreeMap<String, Tensor> = BTreeMap::new();
    for shard in cache["records"].as_array().unwrap() {
        let file = shard["dataPath"].as_str().unwrap();
        assert_eq!(shard["format"], "raw-shard");
        let data = std::fs::read(dir().join("params").join(file)).unwrap();
        assert_eq!(data.len() as u64, shard["nbytes"].as_u64().unwrap(), "{file}");
        for r in shard["records"].as_array().unwrap() {
            assert_eq!(r["dtype"], "float32");
            let at = r["byteOffset"].as_u64().unwrap() as usize;
            let n = r["nbytes"].as_u64().unwrap() as usize;
            let t = Tensor::new(DataType::F32, ints(&r["shape"]), data[at..at + n].to_vec()).unwrap();
            found.insert(r["name"].as_str().unwrap().to_owned(), t);
        }
    }
    Host::Tuple(names.iter().map(|n| Host::Tensor(found.remove(n).unwrap_or_else(|| panic!("{n}")))).collect())
}

/// A model library with its VM, its weights (for `llm_params.so`) and the current cache.
struct Llm {
    vm: VirtualMachine,
    params: Option<Host>,
    cache: Host,
}

impl Llm {
    fn new(lib: &str, scenarios: &Json) -> Llm {
        let vm = VirtualMachine::new(&load(lib), Device::cpu(0)).unwrap();
        let params = (lib == "llm_params.so").then(|| {
            let names: Vec<String> =
                scenarios["param_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_owned()).collect();
            packed_params(&names)
        });
        Llm { vm, params, cache: Host::Null }
    }

    fn call(&self, name: &str, args: &[Host]) -> Result<Host, VmError> {
        let mut all = vec![self.cache.clone()];
        all.extend_from_slice(args);
        self.vm.call_host(&format!("vm.builtin.{name}"), &all)
    }

    fn int(&self, name: &str, args: &[Host]) -> i64 {
        match self.call(name, args).unwrap() {
            Host::Int(i) => i,
            v => panic!("{name}: {v:?}"),
        }
    }

    /// A model function with the weights last, as `llm_params.so` takes them.
    fn invoke(&mut self, func: &str, mut args: Vec<Host>) -> Result<Host, VmError> {
        if let Some(p) = &self.params {
            args.push(p.clone());
        }
        self.vm.call_host(func, &args)
    }

    fn create(&mut self, args: &[i64]) {
        let shapes: Vec<Host> = args.iter().map(|&a| Host::Shape(vec![a])).collect();
        // `create_tir_paged_kv_cache` takes no weights.
        self.cache = self.vm.call_host("create_tir_paged_kv_cache", &shapes).unwrap();
        match &self.cache {
            Host::Object(o) => assert_eq!(o.type_key(), "relax.vm.PagedAttentionKVCache"),
            v => panic!("create_tir_paged_kv_cache returned {v:?}"),
        }
    }

    /// TVM's `state` record: pages free, total length, each live sequence's length.
    fn state(&self, seqs: impl IntoIterator<Item = i64>) -> Json {
        let lengths: serde_json::Map<String, Json> = seqs
            .into_iter()
            .map(|s| (s.to_string(), Json::from(self.int("attention_kv_cache_get_sequence_length", &[Host::Int(s)]))))
            .collect();
        serde_json::json!({
            "num_available_pages": self.int("attention_kv_cache_get_num_available_pages", &[]),
            "total_sequence_length": self.int("attention_kv_cache_get_total_sequence_length", &[]),
            "seq_lengths": lengths,
        })
    }

    /// `begin_forward`, `embed`, the model function, `end_forward`: the logits.
    fn forward(&mut self, step: &Json) -> Result<Tensor, (&'static str, VmError)> {
        let seq_ids = ints(&step["seq_ids"]);
        let lengths = ints(&step["lengths"]);
        let tokens = ints(&step["tokens"]);
        let func = step["func"].as_str().unwrap();
        self.call("kv_state_begin_forward", &[Host::Shape(seq_ids), Host::Shape(lengths)])
            .map_err(|e| ("begin_forward", e))?;
        let ids: Vec<u8> = tokens.iter().flat_map(|&t| (t as i32).to_le_bytes()).collect();
        let ids = Tensor::new(DataType::I32, vec![tokens.len() as i64], ids).unwrap();
        let e = match self.invoke("embed", vec![Host::Tensor(ids)]).map_err(|e| ("embed", e))? {
            Host::Tensor(t) => t,
            v => panic!("embed returned {v:?}"),
        };
        let n = tokens.len() as i64;
        let shape = if func == "batch_decode" { vec![n, 1, 64] } else { vec![1, n, 64] };
        let e = Host::Tensor(Tensor::new(e.dtype, shape, e.data).unwrap());
        let args = match step.get("logit_positions") {
            Some(p) => {
                let p: Vec<u8> = ints(p).iter().flat_map(|&t| (t as i32).to_le_bytes()).collect();
                let p = Tensor::new(DataType::I32, vec![p.len() as i64 / 4], p).unwrap();
                vec![e, Host::Tensor(p), self.cache.clone()]
            }
            None => vec![e, self.cache.clone()],
        };
        let out = self.invoke(func, args).map_err(|e| (func_name(func), e))?;
        self.call("kv_state_end_forward", &[]).map_err(|e| ("end_forward", e))?;
        match out {
            Host::Tuple(items) if items.len() == 2 => {
                assert_eq!(items[1], self.cache, "{func} returns the cache it was given");
                match &items[0] {
                    Host::Tensor(t) => Ok(t.clone()),
                    v => panic!("{func} returned logits {v:?}"),
                }
            }
            v => panic!("{func} returned {v:?}"),
        }
    }
}

fn func_name(f: &str) -> &'static str {
    match f {
        "prefill" => "prefill",
        "decode" => "decode",
        "batch_prefill" => "batch_prefill",
        _ => "batch_decode",
    }
}

/// The sequences the state record names, as integers.
fn seqs_of(state: &Json) -> Vec<i64> {
    state["seq_lengths"].as_object().unwrap().keys().map(|k| k.parse().unwrap()).collect()
}

/// Runs scenario `name` on `lib` at `threads` threads, comparing every step with TVM's record.
fn scenario(lib: &str, name: &str, threads: usize) {
    threadpool::set_num_threads(threads);
    let scenarios = json("scenarios.json");
    // `deep` and `aligned` (deep/make_deep.py) are recorded apart from make.py's three.
    let (steps, logits) = if name == "deep" || name == "aligned" {
        (json(&format!("deep/{name}.json"))["steps"].clone(), format!("deep/{name}.logits.npy"))
    } else {
        (scenarios["scenarios"][name]["steps"].clone(), format!("{name}.logits.npy"))
    };
    let steps = steps.as_array().unwrap().clone();
    let (ref_shape, reference) = npy_f32(&logits);
    let vocab = ref_shape[1];
    let mut llm = Llm::new(lib, &scenarios);
    let mut forwards = 0;
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{lib} {name} step {i} ({}) at {threads} threads", step["op"]);
        let int = |k: &str| Host::Int(step[k].as_i64().unwrap());
        match step["op"].as_str().unwrap() {
            "create" => llm.create(&ints(&step["args"])),
            "add_sequence" => drop(llm.call("kv_state_add_sequence", &[int("seq")]).unwrap()),
            "remove_sequence" => drop(llm.call("kv_state_remove_sequence", &[int("seq")]).unwrap()),
            "fork_sequence" => {
                drop(llm.call("kv_state_fork_sequence", &[int("parent"), int("child"), int("fork_pos")]).unwrap())
            }
            "popn" => drop(llm.call("kv_state_popn", &[int("seq"), int("n")]).unwrap()),
            "debug_get_kv" => {
                let (start, end) = (step["start"].as_i64().unwrap(), step["end"].as_i64().unwrap());
                let shape = [2, end - start, 4, 16];
                let k = NdArray::empty(&shape, DataType::F32, Device::cpu(0)).unwrap();
                let v = NdArray::empty(&shape, DataType::F32, Device::cpu(0)).unwrap();
                let args = [int("seq"), int("start"), int("end"), Host::Array(k.clone()), Host::Array(v.clone())];
                llm.call("attention_kv_cache_debug_get_kv", &args).unwrap();
                for (got, file) in [(k, &step["k"]), (v, &step["v"])] {
                    let (want_shape, want) = npy_f32(file.as_str().unwrap());
                    assert_eq!(want_shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), shape, "{at}");
                    let got = got.to_f32().unwrap().unwrap();
                    // Bitwise: the same kernels on the same inputs.
                    let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(differ, 0, "{at}: {file}: {differ} values differ");
                }
            }
            "forward" => {
                let logits = llm.forward(step).unwrap_or_else(|(call, e)| panic!("{at}: {call}: {e}"));
                assert_eq!(logits.shape, ints(&step["logits_shape"]), "{at}");
                let rows = ints(&step["logit_rows"]);
                let (start, count) = (rows[0] as usize, rows[1] as usize);
                let want = &reference[start * vocab..(start + count) * vocab];
                let got = f32s(&logits.data);
                assert_eq!(got.len(), want.len(), "{at}");
                let bound = want.iter().fold(1f32, |m, x| m.max(x.abs()));
                let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst <= 1e-4 * bound, "{at}: logits differ by {worst}");
                let argmax: Vec<i64> = got
                    .chunks_exact(vocab)
                    .map(|row| (0..vocab).fold(0, |best, j| if row[j] > row[best] { j } else { best }) as i64)
                    .collect();
                assert_eq!(argmax, ints(&step["argmax"]), "{at}: greedy tokens");
                forwards += 1;
            }
            op => panic!("{at}: unknown op {op}"),
        }
        let want = &step["state"];
        assert_eq!(llm.state(seqs_of(want)), *want, "{at}: cache state");
    }
    assert!(forwards > 0);
    threadpool::set_num_threads(0);
}

#[test]
fn single_consts() {
    for threads in [1, 2] {
        scenario("llm_consts.so", "single", threads);
    }
}

#[test]
fn single_params() {
    for threads in [1, 2] {
        scenario("llm_params.so", "single", threads);
    }
}

#[test]
fn shared_consts() {
    for threads in [1, 2] {
        scenario("llm_consts.so", "shared", threads);
    }
}

#[test]
fn shared_params() {
    for threads in [1, 2] {
        scenario("llm_params.so", "shared", threads);
    }
}

#[test]
fn batch_prefill_consts() {
    for threads in [1, 2] {
        scenario("llm_consts.so", "batch_prefill", threads);
    }
}

#[test]
fn batch_prefill_params() {
    for threads in [1, 2] {
        scenario("llm_params.so", "batch_prefill", threads);
    }
}

#[test]
fn deep_consts() {
    for threads in [1, 2] {
        scenario("llm_consts.so", "deep", threads);
    }
}

#[test]
fn deep_params() {
    for threads in [1, 2] {
        scenario("llm_params.so", "deep", threads);
    }
}

#[test]
fn aligned_consts() {
    for threads in [1, 2] {
        scenario("llm_consts.so", "aligned", threads);
    }
}

#[test]
fn aligned_params() {
    for threads in [1, 2] {
        scenario("llm_params.so", "aligned", threads);
    }
}

/// The integers of a list such as `[0, 1]` or a range `a..b` (inclusive, as the fixture
/// writes them), or one integer.
fn parse_ints(s: &str) -> Vec<i64> {
    let s = s.trim();
    if let Some((a, b)) = s.split_once("..") {
        return (a.trim().parse().unwrap()..=b.trim().parse().unwrap()).collect();
    }
    s.trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse().unwrap())
        .collect()
}

/// The bracketed lists and the rest of a `forward FUNC [ids] [lengths] TOKENS` call.
fn forward_step(call: &str, prompt: &[i64]) -> Json {
    let rest = call.strip_prefix("forward ").unwrap();
    let (func, rest) = rest.split_once(' ').unwrap();
    let (ids, rest) = rest.split_once("] ").unwrap();
    let (lengths, tokens) = rest.split_once("] ").unwrap();
    let tokens = match tokens.strip_prefix("tokens ") {
        Some(t) => parse_ints(t),
        None => {
            assert_eq!(tokens, "PROMPT");
            prompt.to_vec()
        }
    };
    serde_json::json!({"func": func, "seq_ids": parse_ints(ids), "lengths": parse_ints(lengths), "tokens": tokens})
}

/// Runs one call of an `errors.json` case; the error names the call that failed.
fn error_call(llm: &mut Llm, call: &str, prompt: &[i64]) -> Result<(), (String, VmError)> {
    let (op, args) = call.split_once('(').unwrap_or((call, ""));
    let args = args.trim_end_matches(')');
    let plain = |r: Result<Host, VmError>| r.map(drop).map_err(|e| (op.to_owned(), e));
    match op {
        "create" => {
            llm.create(&parse_ints(args));
            Ok(())
        }
        "add_sequence" => {
            for s in parse_ints(args) {
                plain(llm.call("kv_state_add_sequence", &[Host::Int(s)]))?;
            }
            Ok(())
        }
        "remove_sequence" | "fork_sequence" | "popn" => {
            let args: Vec<Host> = parse_ints(args).into_iter().map(Host::Int).collect();
            plain(llm.call(&format!("kv_state_{op}"), &args))
        }
        "begin_forward" => {
            let (ids, lengths) = args.split_once("], ").unwrap();
            let args = [Host::Shape(parse_ints(ids)), Host::Shape(parse_ints(lengths))];
            plain(llm.call("kv_state_begin_forward", &args))
        }
        "embed" => Ok(()),
        "decode" => {
            // decode(embedding [2, 1, 64], ...): the embedding of the `embed` call before.
            let ids = Tensor::new(
                DataType::I32,
                vec![2],
                [1i32, 2].iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>(),
            );
            let e = match llm.invoke("embed", vec![Host::Tensor(ids.unwrap())]).unwrap() {
                Host::Tensor(t) => t,
                v => panic!("embed returned {v:?}"),
            };
            let e = Tensor::new(e.dtype, vec![2, 1, 64], e.data).unwrap();
            let cache = llm.cache.clone();
            plain(llm.invoke("decode", vec![Host::Tensor(e), cache]))
        }
        _ => {
            let step = forward_step(call, prompt);
            llm.forward(&step).map(drop).map_err(|(c, e)| (c.to_owned(), e))
        }
    }
}

/// The KV cache cases of `errors.json`: each fails in the call TVM failed in, with TVM's
/// message (the whole `Check failed: ...` text for the cache's own checks, the check's text for
/// the VM's), and leaves the cache in the state TVM left it.
#[test]
fn kv_cache_errors_are_tvms() {
    let errors = json("errors.json");
    let scenarios = json("scenarios.json");
    let prompt = ints(&scenarios["scenarios"]["single"]["steps"][2]["tokens"]);
    let mut checked = 0;
    for lib in ["llm_consts.so", "llm_params.so"] {
        let mut llm = Llm::new(lib, &scenarios);
        for (name, case) in errors["cases"].as_object().unwrap() {
            let calls: Vec<&str> = case["calls"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
            if !calls[0].starts_with("create(") {
                continue;
            }
            let (last, before) = calls.split_last().unwrap();
            for call in before {
                error_call(&mut llm, call, &prompt).unwrap_or_else(|(c, e)| panic!("{lib} {name}: {call}: {c}: {e}"));
            }
            let (failed_in, err) = match error_call(&mut llm, last, &prompt) {
                Err(e) => e,
                Ok(()) => panic!("{lib} {name}: {last} succeeded"),
            };
            let want = &case["error"];
            if let Some(f) = case.get("failing_call") {
                assert_eq!(failed_in, f.as_str().unwrap(), "{lib} {name}: {err}");
            }
            match (err.lm_error::<mblob_runtime::exec::llm::kv_cache::KvCacheError>(), err.root()) {
                (Some(mblob_runtime::exec::llm::kv_cache::KvCacheError::Check(m)), _) => {
                    assert_eq!(want["kind"], "InternalError", "{lib} {name}");
                    assert_eq!(m, want["message"].as_str().unwrap(), "{lib} {name}");
                }
                (_, e) => {
                    let text = e.to_string();
                    assert!(text.contains(want["check"].as_str().unwrap()), "{lib} {name}: {text}");
                    if let VmError::Check { kind, .. } = e {
                        assert_eq!(*kind, want["kind"].as_str().unwrap(), "{lib} {name}");
                    }
                }
            }
            let state = &case["state_after"];
            assert_eq!(llm.state(seqs_of(state)), *state, "{lib} {name}: state after the error");
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * 15);
}

/// What the cache does not implement is refused when it is created, naming it; calls on a
/// cache left inconsistent by a round that ran out of pages (TVM leaves the sequence longer
/// than its pages) and calls out of range get errors, not panics or reads past the pages.
#[test]
fn refusals_and_bad_calls_are_errors() {
    let scenarios = json("scenarios.json");
    let mut llm = Llm::new("llm_consts.so", &scenarios);
    llm.create(&[4, 16, 64, 16, 0]);
    llm.call("kv_state_add_sequence", &[Host::Int(0)]).unwrap();
    // A cache made without sliding-window support refuses a window, with TVM's text.
    let e = llm
        .call("attention_kv_cache_enable_sliding_window_for_seq", &[Host::Int(0), Host::Int(16), Host::Int(4)])
        .unwrap_err();
    assert!(e.to_string().contains("The KV cache does not support sliding window."), "{e}");
    let e = llm.call("kv_state_begin_forward", &[Host::Shape(vec![0]), Host::Shape(vec![40])]).unwrap_err();
    assert!(e.to_string().contains("The KV cache is full"), "{e}");
    let shape = [2, 40, 4, 16];
    let k = NdArray::empty(&shape, DataType::F32, Device::cpu(0)).unwrap();
    let args = [0, 0, 40].map(Host::Int);
    let mut kv = args.to_vec();
    kv.extend([Host::Array(k.clone()), Host::Array(k.clone())]);
    assert!(llm.call("attention_kv_cache_debug_get_kv", &kv).is_err());
    // A wrong shape of the arrays, a range past the sequence, a negative start.
    assert!(llm.call("attention_kv_cache_debug_get_kv", &[&[0, 0, 10].map(Host::Int)[..], &kv[3..]].concat()).is_err());
    assert!(llm.call("attention_kv_cache_debug_get_kv", &[&[0, 0, 41].map(Host::Int)[..], &kv[3..]].concat()).is_err());
    assert!(llm
        .call("attention_kv_cache_debug_get_kv", &[&[0, -1, 39].map(Host::Int)[..], &kv[3..]].concat())
        .is_err());
    for (name, args) in [
        ("kv_state_fork_sequence", vec![0, 1, 36]),
        ("kv_state_fork_sequence", vec![0, 2, -5]),
        ("kv_state_popn", vec![0, 30]),
        ("kv_state_popn", vec![i64::MIN, 1]),
        ("kv_state_fork_sequence", vec![i64::MIN, 3, -1]),
    ] {
        let args: Vec<Host> = args.into_iter().map(Host::Int).collect();
        let _ = llm.call(name, &args);
    }
    for lengths in [vec![0], vec![-3], vec![i64::MAX], vec![1, 1]] {
        let ids = vec![0; lengths.len()];
        assert!(llm.call("kv_state_begin_forward", &[Host::Shape(ids), Host::Shape(lengths)]).is_err());
    }
    // Attention with a tensor that is not the fused QKV, and on a layer the cache lacks.
    let qkv = Host::Array(NdArray::empty(&[1, 12, 16], DataType::F32, Device::cpu(0)).unwrap());
    let o = Host::Array(NdArray::empty(&[1, 4, 16], DataType::F32, Device::cpu(0)).unwrap());
    let bad = Host::Array(NdArray::empty(&[1, 5, 16], DataType::F32, Device::cpu(0)).unwrap());
    let attn = "attention_kv_cache_attention_with_fused_qkv";
    assert!(llm.call(attn, &[Host::Int(0), Host::Float(0.25), bad, o.clone()]).is_err());
    assert!(llm.call(attn, &[Host::Int(2), Host::Float(0.25), qkv.clone(), o.clone()]).is_err());
    llm.call("kv_state_clear", &[]).unwrap();
    assert_eq!(llm.int("attention_kv_cache_get_num_available_pages", &[]), 2);
    assert_eq!(llm.int("attention_kv_cache_empty", &[]), 1);
    // After a clear, a round is needed again before attention.
    assert!(llm.call(attn, &[Host::Int(0), Host::Float(0.25), qkv, o]).is_err());
}

/// Every global function the fixture libraries call (`functions.json`) is served: what
/// `mblob inspect` reports as `unsupported_calls` is empty for both.
#[test]
fn every_global_function_of_the_libraries_is_served() {
    let functions = json("functions.json");
    for lib in ["llm_consts.so", "llm_params.so"] {
        let vm = VirtualMachine::new(&load(lib), Device::cpu(0)).unwrap();
        let kernels: Vec<&str> =
            functions[lib]["library_kernels"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        let unsupported = mblob_runtime::exec::relax::unsupported_calls(vm.executable(), &|n| kernels.contains(&n));
        assert!(unsupported.is_empty(), "{lib}: {unsupported:?}");
        assert!(!functions[lib]["global_funcs"].as_array().unwrap().is_empty());
    }
}
