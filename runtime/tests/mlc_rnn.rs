//! TVM's RNN state under an RWKV-6 library MLC-LLM's own pipeline built
//! (tests/fixtures/mlc/rwkv6-q0f32, README there), driven through the VM as MLC-LLM's engine
//! drives it and as `reference_rnn.py` drove TVM 0.27's VM: `create_rnn_state([4], [4])`, a
//! 20-token prompt, two decodes, `kv_state_fork_sequence(0 -> 1)`, three decodes of the child,
//! `kv_state_popn(0, 2)` and two decodes of the parent give TVM's tokens, its logits within
//! 1e-4 of max(1, max |logit|), and its states (`rnn_state_debug_get` of every state of both
//! layers and sequences) within 1e-4 of max(1, max |state|); bad calls fail with TVM's
//! messages (`reference.json`'s `errors`), and TVM's failing `batch_prefill` of several
//! sequences fails here too, without a panic.
//!
//! The same for Qwen3.5 (tests/fixtures/mlc/qwen35-q0f32, `kv_state_kind` `hybrid`), as
//! `reference_hybrid.py` drove TVM: both states (the paged KV cache, then the RNN state) framed,
//! forked and popped as the engine does, every step through `batch_prefill`/`batch_decode`;
//! `LanguageModel` makes both and gives TVM's tokens.
#![cfg(feature = "llm")]

use std::path::{Path, PathBuf};

use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};
use mblob_runtime::exec::llm::rnn_state::{RnnState, RnnStateError};
use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::exec::Value;
use mblob_runtime::format::DataType;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};
use serde_json::Value as Json;

const NAME: &str = "rwkv6-q0f32";
/// Qwen3.5 (`kv_state_kind` `hybrid`): a paged KV cache and an RNN state together.
const HYBRID: &str = "qwen35-q0f32";

fn fixture_of(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc").join(name)
}

fn record_of(name: &str) -> Json {
    let path = fixture_of(name).join("reference.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn record() -> Json {
    record_of(NAME)
}

fn npy(name: &str) -> (Vec<u64>, Vec<f32>) {
    npy_of(NAME, name)
}

fn npy_of(fixture: &str, name: &str) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(fixture_of(fixture).join(name)).unwrap();
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    (shape, f.into_vec::<f32>().unwrap())
}

fn ints(v: &Json) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
    let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-4 * scale, "{what}: differs by {diff} (scale {scale})");
}

fn argmax(row: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as i32
}

/// The library with its weights (loaded by `LanguageModel`, as `mblob generate` loads them).
struct Rwkv {
    lm: LanguageModel,
    params: Value,
}

impl Rwkv {
    fn new() -> Rwkv {
        Rwkv::of(NAME)
    }

    fn of(name: &str) -> Rwkv {
        let dir = fixture_of(name);
        // SAFETY: the fixture is a library MLC-LLM's pipeline built for these tests.
        let tree = unsafe { load_library(&dir.join("lib.so"), &Registry::default(), &LoadOptions::default()) }.unwrap();
        let lm = LanguageModel::new(&tree, Device::cpu(0), Some(&dir), &GenerateOptions::default()).unwrap();
        let params = Value::Tuple(lm.params().unwrap().to_vec());
        Rwkv { lm, params }
    }

    fn vm(&self) -> &VirtualMachine {
        self.lm.vm()
    }

    fn call(&self, name: &str, args: &[Value]) -> Result<Value, String> {
        self.vm().invoke(name, args).map_err(|e| e.to_string())
    }

    fn state(&self, max_batch: i64, history: i64) -> Result<Value, String> {
        self.call("create_rnn_state", &[Value::Shape([max_batch].into()), Value::Shape([history].into())])
    }

    fn embed(&self, ids: &[i32], shape: &[i64]) -> Value {
        let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
        let input = NdArray::from_bytes(&bytes, &[ids.len() as i64], DataType::I32, Device::cpu(0)).unwrap();
        match self.call("embed", &[Value::Tensor(input), self.params.clone()]).unwrap() {
            Value::Tensor(t) => Value::Tensor(t.view(shape, t.dtype()).unwrap()),
            v => panic!("embed: {v:?}"),
        }
    }

    /// One round of `seqs` appending `lengths` through `func`: every row of logits it returns.
    fn round(
        &self,
        state: &Value,
        func: &str,
        (seqs, lengths): (&[i64], &[i64]),
        ids: &[i32],
        extra: Option<Value>,
    ) -> Result<Vec<f32>, String> {
        self.round_on(std::slice::from_ref(state), func, (seqs, lengths), ids, extra)
    }

    /// [`Rwkv::round`] on several states (a hybrid model's KV cache and RNN state), each framed
    /// and passed in this order, as MLC-LLM's engine frames and passes them.
    fn round_on(
        &self,
        states: &[Value],
        func: &str,
        (seqs, lengths): (&[i64], &[i64]),
        ids: &[i32],
        extra: Option<Value>,
    ) -> Result<Vec<f32>, String> {
        for state in states {
            let shapes = [state.clone(), Value::Shape(seqs.into()), Value::Shape(lengths.into())];
            self.call("vm.builtin.kv_state_begin_forward", &shapes)?;
        }
        let shape =
            if func == "batch_decode" { vec![seqs.len() as i64, 1, 256] } else { vec![1, ids.len() as i64, 256] };
        let mut args = vec![self.embed(ids, &shape)];
        args.extend(extra);
        args.extend(states.iter().cloned());
        args.push(self.params.clone());
        let out = self.call(func, &args)?;
        for state in states {
            self.call("vm.builtin.kv_state_end_forward", std::slice::from_ref(state))?;
        }
        match out {
            Value::Tuple(items) => match &items[0] {
                Value::Tensor(t) => Ok(t.to_f32().unwrap().unwrap()),
                v => panic!("{func}: {v:?}"),
            },
            v => panic!("{func}: {v:?}"),
        }
    }

    fn step(&self, state: &Value, seq: i64, ids: &[i32], func: &str) -> Vec<f32> {
        let all = self.round(state, func, (&[seq], &[ids.len() as i64]), ids, None).unwrap();
        all[all.len() - 1000..].to_vec()
    }

    fn builtin(&self, name: &str, args: &[Value]) -> Result<Value, String> {
        self.call(&format!("vm.builtin.{name}"), args)
    }
}

#[test]
fn fork_and_popn_give_tvms_logits_and_states() {
    let m = Rwkv::new();
    let r = record();
    let f = &r["fork"];
    let (_, want) = npy(f["logits"].as_str().unwrap());
    let state = m.state(4, f["max_history"].as_i64().unwrap()).unwrap();
    m.builtin("kv_state_add_sequence", &[state.clone(), Value::Int(0)]).unwrap();
    let prompt = ints(&f["prompt"]);
    let mut rows = Vec::new();
    let mut last = Vec::new();
    for chunk in prompt.chunks(16) {
        last = m.step(&state, 0, chunk, "prefill");
    }
    assert_eq!(argmax(&last), f["prefill_token"].as_i64().unwrap() as i32, "TVM's prefill token");
    rows.push(last);
    for &t in &ints(&f["decode0_fed"]) {
        rows.push(m.step(&state, 0, &[t], "decode"));
    }
    m.builtin("kv_state_fork_sequence", &[state.clone(), Value::Int(0), Value::Int(1), Value::Int(-1)]).unwrap();
    for (fed, tok) in ints(&f["fork"]["decode_fed"]).into_iter().zip(ints(&f["fork"]["tokens"])) {
        rows.push(m.step(&state, 1, &[fed], "decode"));
        assert_eq!(argmax(rows.last().unwrap()), tok, "TVM's token of the forked sequence");
    }
    m.builtin("kv_state_popn", &[state.clone(), Value::Int(0), Value::Int(2)]).unwrap();
    for (fed, tok) in ints(&f["popn"]["decode_fed"]).into_iter().zip(ints(&f["popn"]["tokens"])) {
        rows.push(m.step(&state, 0, &[fed], "decode"));
        assert_eq!(argmax(rows.last().unwrap()), tok, "TVM's token after popn");
    }
    for (i, (got, want)) in rows.iter().zip(want.chunks(1000)).enumerate() {
        close(&format!("fork row {i}"), got, want);
    }
    // After popn the parent repeats its first two decodes: TVM's rows 1-2 again.
    close("popn row", &rows[6], &want[1000..2000]);

    let Value::Object(obj) = &state else { panic!("create_rnn_state: {state:?}") };
    let s = obj.downcast_ref::<RnnState>().unwrap();
    assert_eq!((s.num_layers(), s.reserved_num_seqs(), s.max_history()), (2, 4, 4));
    let (_, flat) = npy(f["state"].as_str().unwrap());
    let mut at = 0;
    for entry in f["state_order"].as_array().unwrap() {
        let n: u64 = entry["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product();
        let (layer, sid, seq) =
            (entry["layer"].as_i64().unwrap(), entry["state"].as_i64().unwrap(), entry["seq"].as_i64().unwrap());
        let got = match m
            .builtin("rnn_state_debug_get", &[state.clone(), Value::Int(layer), Value::Int(sid), Value::Int(seq)])
        {
            Ok(Value::Tensor(t)) => t.to_f32().unwrap().unwrap(),
            v => panic!("rnn_state_debug_get: {v:?}"),
        };
        close(&format!("state {sid} of layer {layer}, sequence {seq}"), &got, &flat[at..at + n as usize]);
        at += n as usize;
    }
    assert_eq!(at, flat.len());
    // The bookkeeping TVM's rules give: the parent back at the prompt's state, the child 3 decodes on.
    let p = s.sequence(0).unwrap();
    assert_eq!((p.seq_length, p.available_history_num), (22, 2));
    let c = s.sequence(1).unwrap();
    assert_eq!((c.seq_length, c.available_history_num), (25, 3));
}

#[test]
fn bad_calls_fail_with_tvms_messages() {
    let m = Rwkv::new();
    let r = record();
    let want = |k: &str| r["errors"][k].as_str().unwrap().to_owned();
    let expect = |k: &str, got: Result<Value, String>| {
        let e = got.expect_err(k);
        assert!(e.contains(&want(k)), "{k}: {e}\nTVM: {}", want(k));
    };
    let state = m.state(4, 4).unwrap();
    let add = |s: &Value, id: i64| m.builtin("kv_state_add_sequence", &[s.clone(), Value::Int(id)]);
    add(&state, 0).unwrap();
    let prompt = ints(&r["generate"]["prompt"]);
    m.step(&state, 0, &prompt[..3], "prefill");
    m.step(&state, 0, &[5], "decode");
    let popn = |seq: i64, n: i64| m.builtin("kv_state_popn", &[state.clone(), Value::Int(seq), Value::Int(n)]);
    expect("popn_past_history", popn(0, 2));
    expect("popn_negative", popn(0, -1));
    expect("popn_unknown", popn(7, 1));
    let fork = |a: i64, b: i64| {
        m.builtin("kv_state_fork_sequence", &[state.clone(), Value::Int(a), Value::Int(b), Value::Int(-1)])
    };
    expect("fork_unknown_parent", fork(7, 8));
    expect("add_twice", add(&state, 0));
    add(&state, 1).unwrap();
    expect("fork_onto_existing", fork(0, 1));
    expect("remove_unknown", m.builtin("kv_state_remove_sequence", &[state.clone(), Value::Int(9)]));
    expect(
        "begin_forward_unknown",
        m.builtin("kv_state_begin_forward", &[state.clone(), Value::Shape([9].into()), Value::Shape([1].into())]),
    );
    let full = m.state(4, 1).unwrap();
    for id in 0..4 {
        add(&full, id).unwrap();
    }
    expect("add_past_slots", add(&full, 4));
    expect("create_history_0", m.state(4, 0));
    // Typed, below the message.
    let e = m.vm().invoke("vm.builtin.kv_state_popn", &[state.clone(), Value::Int(0), Value::Int(2)]).unwrap_err();
    assert!(matches!(e.lm_error::<RnnStateError>(), Some(RnnStateError::Check(_))), "{e:?}");
    // A popn within the history still works after the refusals.
    popn(0, 1).unwrap();
}

#[test]
fn batch_decode_gives_tvms_tokens_and_batch_prefill_of_several_fails_as_in_tvm() {
    let m = Rwkv::new();
    let r = record();
    let b = &r["batch"];
    let (shape, want) = npy(b["logits"].as_str().unwrap());
    let prompts: Vec<Vec<i32>> = b["prompts"].as_array().unwrap().iter().map(ints).collect();
    let state = m.state(4, 1).unwrap();
    let mut tokens: Vec<Vec<i32>> = Vec::new();
    let mut rows: Vec<Vec<Vec<f32>>> = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        m.builtin("kv_state_add_sequence", &[state.clone(), Value::Int(s as i64)]).unwrap();
        let mut last = Vec::new();
        for chunk in p.chunks(16) {
            last = m.step(&state, s as i64, chunk, "prefill");
        }
        tokens.push(vec![argmax(&last)]);
        rows.push(vec![last]);
    }
    for _ in 1..shape[1] {
        let ids: Vec<i32> = tokens.iter().map(|t| *t.last().unwrap()).collect();
        let all = m.round(&state, "batch_decode", (&[0, 1, 2], &[1, 1, 1]), &ids, None).unwrap();
        for (s, row) in all.chunks(1000).enumerate() {
            tokens[s].push(argmax(row));
            rows[s].push(row.to_vec());
        }
    }
    for (s, want_tokens) in b["tokens"].as_array().unwrap().iter().enumerate() {
        assert_eq!(tokens[s], ints(want_tokens), "TVM's tokens of sequence {s}");
        let got: Vec<f32> = rows[s].concat();
        let n = got.len();
        close(&format!("batch sequence {s}"), &got, &want[s * n..(s + 1) * n]);
    }
    // TVM's VM fails on one batch_prefill of several sequences (MLC-LLM's RWKV-6 reads the state
    // of one sequence; the state's get kernel is given the round's three): so does mblob's, with
    // the kernel's own check, not a panic.
    let t = &b["batch_prefill_together"];
    let tvm = t["error"].as_str().unwrap();
    let together = m.state(4, 1).unwrap();
    for s in 0..3 {
        m.builtin("kv_state_add_sequence", &[together.clone(), Value::Int(s)]).unwrap();
    }
    let lengths: Vec<i64> = t["lengths"].as_array().unwrap().iter().map(|l| l.as_i64().unwrap()).collect();
    let ids: Vec<i32> = prompts.iter().zip(&lengths).flat_map(|(p, &l)| p[..l as usize].to_vec()).collect();
    let ends: Vec<u8> = ints(&t["logit_positions"]).into_iter().flat_map(i32::to_le_bytes).collect();
    let pos = NdArray::from_bytes(&ends, &[3], DataType::I32, Device::cpu(0)).unwrap();
    let e = m.round(&together, "batch_prefill", (&[0, 1, 2], &lengths), &ids, Some(Value::Tensor(pos))).unwrap_err();
    assert!(tvm.contains("expected to match seq_slot_ids.shape[0]"), "{tvm}");
    assert!(e.contains("rnn_state_get_0"), "{e}\nTVM: {tvm}");
}

/// Qwen3.5's two states as MLC-LLM's engine makes them for `kHybrid` (and reference_hybrid.py
/// made them in TVM): `create_tir_paged_kv_cache([4], [256], [16], [16], [0])` and
/// `create_rnn_state([4], [history])`, with sequences `0..seqs` added to the cache, then to the
/// state.
fn hybrid_states(m: &Rwkv, history: i64, seqs: i64) -> [Value; 2] {
    let shape = |v: i64| Value::Shape([v].into());
    let kv = m.call("create_tir_paged_kv_cache", &[shape(4), shape(256), shape(16), shape(16), shape(0)]).unwrap();
    let rnn = m.state(4, history).unwrap();
    for s in 0..seqs {
        for state in [&kv, &rnn] {
            m.builtin("kv_state_add_sequence", &[state.clone(), Value::Int(s)]).unwrap();
        }
    }
    [kv, rnn]
}

/// `kv_state_NAME(state, args)` on the cache, then on the RNN state.
fn on_both(m: &Rwkv, states: &[Value; 2], name: &str, args: &[Value]) {
    for state in states {
        let mut all = vec![state.clone()];
        all.extend_from_slice(args);
        m.builtin(name, &all).unwrap();
    }
}

/// One step of one sequence of the hybrid model, as the engine runs it: `batch_prefill` (the
/// logit position of the last token) for several tokens, `batch_decode` for one.
fn hybrid_step(m: &Rwkv, states: &[Value; 2], seq: i64, ids: &[i32], decode: bool) -> Vec<f32> {
    let n = ids.len() as i64;
    if decode {
        return m.round_on(states, "batch_decode", (&[seq], &[1]), ids, None).unwrap();
    }
    let pos = NdArray::from_bytes(&(n as i32 - 1).to_le_bytes(), &[1], DataType::I32, Device::cpu(0)).unwrap();
    m.round_on(states, "batch_prefill", (&[seq], &[n]), ids, Some(Value::Tensor(pos))).unwrap()
}

#[test]
fn hybrid_generate_gives_tvms_tokens_with_both_states() {
    let mut m = Rwkv::of(HYBRID);
    let r = record_of(HYBRID);
    let g = &r["generate"];
    let (_, want) = npy_of(HYBRID, g["logits"].as_str().unwrap());
    let out = m.lm.generate(&ints(&g["prompt"]), ints(&g["tokens"]).len()).unwrap();
    assert_eq!(out.tokens, ints(&g["tokens"]), "TVM's tokens");
    close("generate", &out.logits.concat(), &want);
    // Both states of the generation: TVM's paged KV cache (the 2 attention layers) and its RNN
    // state (the 2 Gated DeltaNet layers, one step of history).
    let Some(Value::Object(kv)) = m.lm.kv_cache() else { panic!("no KV cache") };
    assert!(kv.downcast_ref::<mblob_runtime::exec::llm::kv_cache::PagedKvCache>().is_some(), "{}", kv.type_key());
    let s = m.lm.rnn_state().and_then(|o| o.downcast_ref::<RnnState>()).expect("an RNN state");
    assert_eq!((s.num_layers(), s.reserved_num_seqs(), s.max_history()), (2, 4, 1));
    let p = ints(&g["prompt"]).len() as i64;
    assert_eq!(s.sequence(0).unwrap().seq_length, p + ints(&g["tokens"]).len() as i64 - 1);
}

#[test]
fn hybrid_fork_and_popn_on_both_states_give_tvms_logits_and_states() {
    let m = Rwkv::of(HYBRID);
    let r = record_of(HYBRID);
    let f = &r["fork"];
    let (_, want) = npy_of(HYBRID, f["logits"].as_str().unwrap());
    let states = hybrid_states(&m, f["max_history"].as_i64().unwrap(), 1);
    let mut last = Vec::new();
    for chunk in ints(&f["prompt"]).chunks(16) {
        last = hybrid_step(&m, &states, 0, chunk, false);
    }
    assert_eq!(argmax(&last), f["prefill_token"].as_i64().unwrap() as i32, "TVM's prefill token");
    let mut rows = vec![last];
    for &t in &ints(&f["decode0_fed"]) {
        rows.push(hybrid_step(&m, &states, 0, &[t], true));
    }
    on_both(&m, &states, "kv_state_fork_sequence", &[Value::Int(0), Value::Int(1), Value::Int(-1)]);
    for (fed, tok) in ints(&f["fork"]["decode_fed"]).into_iter().zip(ints(&f["fork"]["tokens"])) {
        rows.push(hybrid_step(&m, &states, 1, &[fed], true));
        assert_eq!(argmax(rows.last().unwrap()), tok, "TVM's token of the forked sequence");
    }
    on_both(&m, &states, "kv_state_popn", &[Value::Int(0), Value::Int(2)]);
    for (fed, tok) in ints(&f["popn"]["decode_fed"]).into_iter().zip(ints(&f["popn"]["tokens"])) {
        rows.push(hybrid_step(&m, &states, 0, &[fed], true));
        assert_eq!(argmax(rows.last().unwrap()), tok, "TVM's token after popn");
    }
    for (i, (got, want)) in rows.iter().zip(want.chunks(1000)).enumerate() {
        close(&format!("fork row {i}"), got, want);
    }
    // The Gated DeltaNet recurrences and convolution windows of both sequences at the end.
    let (_, flat) = npy_of(HYBRID, f["state"].as_str().unwrap());
    let mut at = 0;
    for entry in f["state_order"].as_array().unwrap() {
        let n: u64 = entry["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product();
        let key = ["layer", "state", "seq"].map(|k| Value::Int(entry[k].as_i64().unwrap()));
        let got = match m.builtin("rnn_state_debug_get", &[&[states[1].clone()][..], &key].concat()) {
            Ok(Value::Tensor(t)) => t.to_f32().unwrap().unwrap(),
            v => panic!("rnn_state_debug_get: {v:?}"),
        };
        close(&format!("RNN state {entry}"), &got, &flat[at..at + n as usize]);
        at += n as usize;
    }
    assert_eq!(at, flat.len());
}

#[test]
fn hybrid_batch_prefill_of_several_sequences_fails_as_in_tvm() {
    // MLC-LLM's Qwen3.5 reads the RNN state of one sequence per prefill: TVM's VM fails in the
    // state's get kernel when one `batch_prefill` has three (reference_hybrid.py), and so does
    // mblob's, with the kernel's own check, not a panic.
    let m = Rwkv::of(HYBRID);
    let r = record_of(HYBRID);
    let b = &r["batch"];
    let t = &b["batch_prefill_together"];
    let tvm = t["error"].as_str().unwrap();
    let states = hybrid_states(&m, 1, 3);
    let lengths: Vec<i64> = t["lengths"].as_array().unwrap().iter().map(|l| l.as_i64().unwrap()).collect();
    let prompts: Vec<Vec<i32>> = b["prompts"].as_array().unwrap().iter().map(ints).collect();
    let ids: Vec<i32> = prompts.iter().zip(&lengths).flat_map(|(p, &l)| p[..l as usize].to_vec()).collect();
    let mut end = 0;
    let ends: Vec<u8> = lengths
        .iter()
        .flat_map(|l| {
            end += *l as i32;
            (end - 1).to_le_bytes()
        })
        .collect();
    let pos = NdArray::from_bytes(&ends, &[3], DataType::I32, Device::cpu(0)).unwrap();
    let e = m.round_on(&states, "batch_prefill", (&[0, 1, 2], &lengths), &ids, Some(Value::Tensor(pos))).unwrap_err();
    assert!(tvm.contains("rnn_state_get_1") && tvm.contains("expected to match seq_slot_ids.shape[0]"), "{tvm}");
    assert!(e.contains("rnn_state_get_1"), "{e}\nTVM: {tvm}");
}

#[test]
fn hybrid_prompt_past_the_cache_is_refused_typed_and_the_model_still_runs() {
    // The KV cache of a hybrid model bounds its sequences (the RNN state does not): a prompt
    // past the context window (256) is refused before any call, and the next generation runs.
    let mut m = Rwkv::of(HYBRID);
    let r = record_of(HYBRID);
    let g = &r["generate"];
    let long: Vec<i32> = ints(&g["prompt"]).into_iter().cycle().take(300).collect();
    let e = m.lm.generate(&long, 4).unwrap_err();
    assert!(matches!(e, mblob_runtime::exec::llm::generate::GenerateError::PromptTooLong { .. }), "{e:?}");
    assert!(e.to_string().contains("300 prompt tokens"), "{e}");
    let out = m.lm.generate(&ints(&g["prompt"]), ints(&g["tokens"]).len()).unwrap();
    assert_eq!(out.tokens, ints(&g["tokens"]), "TVM's tokens after the refusal");
}
