//! TVM 0.27's TIR paged KV cache on a GPU device: the LLM of tests/fixtures/llm built for
//! OpenCL and CUDA (tests/fixtures/llm/device: TVM's GPU pipeline and the cache's GPU TIR
//! kernels), with its weights from the fixture's tensor cache uploaded once to the device, runs
//! each scenario of `scenarios.json` (and of `deep/`) step by step as `llm_kv.rs` runs them on
//! the CPU, against TVM's records of the same model and weights on the CPU (TVM cannot run
//! OpenCL or CUDA here). After every step the cache's state equals TVM's; every forward gives
//! TVM's greedy tokens exactly (the fixture asserts top-2 gaps > 1e-3) and its logits within
//! 1e-4 of max(1, max |logit|) (the GPU kernels sum in another order); `debug_get_kv` reads
//! back TVM's keys and values within the same bound, into host tensors (copied back from the
//! device) and into device tensors.
//!
//! OpenCL runs for real on the machine's OpenCL device (pocl on a CPU in CI). Without one each
//! OpenCL test prints `skipped: no OpenCL device (...)` and passes, unless
//! `MBLOB_REQUIRE_OPENCL` is set, which turns the skip into a failure. The CUDA tests are
//! `#[ignore]`d: they need an NVIDIA GPU and NVRTC (run them with `--ignored` on such a machine).
#![cfg(feature = "llm")]
#![allow(dead_code)]

use mblob_runtime::exec::llm::lm::TensorCache;
use mblob_runtime::exec::relax::{VirtualMachine, VmError};
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

/// Logits and keys/values within this much of TVM's CPU records, relative to max(1, max |ref|).
const RTOL: f32 = 1e-4;

/// The largest difference from `want`, and the bound it must stay under.
fn worst(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len());
    let bound = RTOL * want.iter().fold(1f32, |m, x| m.max(x.abs()));
    (got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max), bound)
}

/// The device library with its VM on `device`, its weights on the device and the current
/// cache.
struct Llm {
    vm: VirtualMachine,
    device: Device,
    params: Host,
    cache: Host,
}

impl Llm {
    fn new(lib: &str, device: Device, scenarios: &Json) -> Llm {
        let vm = VirtualMachine::new(&load(lib), device).unwrap_or_else(|e| panic!("{lib} on {device}: {e}"));
        let names: Vec<&str> =
            scenarios["param_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
        // Uploaded once, as MLC-LLM's runtime does with vm.builtin.tensor_cache.load(dir, device).
        let mut cache = TensorCache::new();
        cache.load(&dir().join("params"), device).unwrap();
        let arrays = cache.param_array_by_name(&names).unwrap();
        assert!(arrays.iter().all(|a| a.device() == device));
        let params = Host::Tuple(arrays.into_iter().map(Host::Array).collect());
        Llm { vm, device, params, cache: Host::Null }
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

    fn invoke(&mut self, func: &str, mut args: Vec<Host>) -> Result<Host, VmError> {
        args.push(self.params.clone());
        self.vm.call_host(func, &args)
    }

    fn create(&mut self, args: &[i64]) {
        let shapes: Vec<Host> = args.iter().map(|&a| Host::Shape(vec![a])).collect();
        self.cache = self.vm.call_host("create_tir_paged_kv_cache", &shapes).unwrap();
        match &self.cache {
            Host::Object(o) => assert_eq!(o.type_key(), "relax.vm.PagedAttentionKVCache"),
            v => panic!("create_tir_paged_kv_cache returned {v:?}"),
        }
    }

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

    /// `begin_forward`, `embed`, the model function, `end_forward`: the logits, or the error of
    /// `begin_forward` (the others fail the test).
    fn forward(&mut self, step: &Json) -> Result<Tensor, VmError> {
        let seq_ids = ints(&step["seq_ids"]);
        let lengths = ints(&step["lengths"]);
        let tokens = ints(&step["tokens"]);
        let func = step["func"].as_str().unwrap();
        self.call("kv_state_begin_forward", &[Host::Shape(seq_ids), Host::Shape(lengths)])?;
        let ids: Vec<u8> = tokens.iter().flat_map(|&t| (t as i32).to_le_bytes()).collect();
        let ids = Tensor::new(DataType::I32, vec![tokens.len() as i64], ids).unwrap();
        let e = match self.invoke("embed", vec![Host::Tensor(ids)]).unwrap() {
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
        let out = self.invoke(func, args).unwrap_or_else(|e| panic!("{func}: {e}"));
        self.call("kv_state_end_forward", &[]).unwrap();
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

fn seqs_of(state: &Json) -> Vec<i64> {
    state["seq_lengths"].as_object().unwrap().keys().map(|k| k.parse().unwrap()).collect()
}

/// Runs scenario `name` with the device library `lib` on `device`, comparing every step with
/// TVM's CPU record; returns the largest logit and key/value differences seen.
fn scenario(lib: &str, device: Device, name: &str) -> (f32, f32) {
    let scenarios = json("scenarios.json");
    let (steps, logits) = if name == "deep" || name == "aligned" {
        (json(&format!("deep/{name}.json"))["steps"].clone(), format!("deep/{name}.logits.npy"))
    } else {
        (scenarios["scenarios"][name]["steps"].clone(), format!("{name}.logits.npy"))
    };
    let steps = steps.as_array().unwrap().clone();
    let (ref_shape, reference) = npy_f32(&logits);
    let vocab = ref_shape[1];
    let mut llm = Llm::new(lib, device, &scenarios);
    let (mut forwards, mut reads) = (0, 0);
    let (mut worst_logit, mut worst_kv) = (0f32, 0f32);
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{lib} on {device}: {name} step {i} ({})", step["op"]);
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
                // Every other read into tensors on the device (TVM's way), the others into host
                // tensors (copied back).
                let into = if reads % 2 == 0 { Device::cpu(0) } else { device };
                reads += 1;
                let k = NdArray::empty(&shape, DataType::F32, into).unwrap();
                let v = NdArray::empty(&shape, DataType::F32, into).unwrap();
                let args = [int("seq"), int("start"), int("end"), Host::Array(k.clone()), Host::Array(v.clone())];
                llm.call("attention_kv_cache_debug_get_kv", &args).unwrap_or_else(|e| panic!("{at}: {e}"));
                for (got, file) in [(k, &step["k"]), (v, &step["v"])] {
                    let (want_shape, want) = npy_f32(file.as_str().unwrap());
                    assert_eq!(want_shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), shape, "{at}");
                    let (w, bound) = worst(&got.to_f32().unwrap().unwrap(), &want);
                    assert!(w <= bound, "{at}: {file} (read into {into}): differs by {w} (bound {bound})");
                    worst_kv = worst_kv.max(w);
                }
            }
            "forward" => {
                let logits = llm.forward(step).unwrap_or_else(|e| panic!("{at}: begin_forward: {e}"));
                assert_eq!(logits.shape, ints(&step["logits_shape"]), "{at}");
                let rows = ints(&step["logit_rows"]);
                let (start, count) = (rows[0] as usize, rows[1] as usize);
                let want = &reference[start * vocab..(start + count) * vocab];
                let got = f32s(&logits.data);
                let (w, bound) = worst(&got, want);
                assert!(w <= bound, "{at}: logits differ by {w} (bound {bound})");
                worst_logit = worst_logit.max(w);
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
    eprintln!("{lib} on {device}: {name}: worst logit difference {worst_logit:e}, keys/values {worst_kv:e}");
    (worst_logit, worst_kv)
}

/// Every global function the device libraries' bytecode calls is served (the library's own
/// functions, exported as `__tvm_ffi_<name>`, aside): what `mblob inspect` reports as
/// `unsupported_calls` is empty. The VM is made on the CPU: reading the table needs no device.
#[test]
fn every_global_function_of_the_device_libraries_is_served() {
    for name in ["opencl", "cuda_sm90"] {
        let lib = format!("device/llm_params_{name}.so");
        let bytes = std::fs::read(dir().join(&lib)).unwrap();
        let exported = |f: &str| {
            let symbol = format!("__tvm_ffi_{f}\0");
            bytes.windows(symbol.len()).any(|w| w == symbol.as_bytes())
        };
        assert!(exported("batch_decode_paged_kv") && exported("tir_attention_merge_state"));
        let vm = VirtualMachine::new(&load(&lib), Device::cpu(0)).unwrap();
        let unsupported = mblob_runtime::exec::relax::unsupported_calls(vm.executable(), &exported);
        assert!(unsupported.is_empty(), "{name}: {unsupported:?}");
    }
}

#[cfg(feature = "opencl")]
mod opencl {
    use super::*;
    use mblob_runtime::exec::llm::kv_cache::PagedKvCache;

    const LIB: &str = "device/llm_params_opencl.so";

    /// OpenCL device 0, or `None` (after saying so) when there is none.
    fn opencl() -> Option<Device> {
        match mblob_runtime::device::device_api(Device::opencl(0)) {
            Ok(_) => Some(Device::opencl(0)),
            Err(e) => {
                if std::env::var_os("MBLOB_REQUIRE_OPENCL").is_some() {
                    panic!("MBLOB_REQUIRE_OPENCL is set but no OpenCL device opens: {e}");
                }
                eprintln!("skipped: no OpenCL device ({e})");
                None
            }
        }
    }

    #[test]
    fn single_on_opencl() {
        if let Some(d) = opencl() {
            scenario(LIB, d, "single");
        }
    }

    #[test]
    fn shared_on_opencl() {
        if let Some(d) = opencl() {
            scenario(LIB, d, "shared");
        }
    }

    #[test]
    fn batch_prefill_on_opencl() {
        if let Some(d) = opencl() {
            scenario(LIB, d, "batch_prefill");
        }
    }

    #[test]
    fn deep_on_opencl() {
        if let Some(d) = opencl() {
            scenario(LIB, d, "deep");
        }
    }

    #[test]
    fn aligned_on_opencl() {
        if let Some(d) = opencl() {
            scenario(LIB, d, "aligned");
        }
    }

    /// The KV cache cases of `errors.json` that do not depend on the VM's memory plan (which
    /// differs between the CPU and GPU builds): on a cache on the device, after a prefill there,
    /// each fails with TVM's message and leaves TVM's state.
    #[test]
    fn kv_cache_errors_are_tvms() {
        let Some(d) = opencl() else { return };
        let errors = json("errors.json");
        let scenarios = json("scenarios.json");
        let prompt = ints(&scenarios["scenarios"]["single"]["steps"][2]["tokens"]);
        let mut llm = Llm::new(LIB, d, &scenarios);
        let list = |s: &str| -> Vec<i64> {
            let s = s.trim().trim_matches(|c| c == '[' || c == ']');
            if let Some((a, b)) = s.split_once("..") {
                return (a.trim().parse().unwrap()..=b.trim().parse().unwrap()).collect();
            }
            s.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().unwrap()).collect()
        };
        let mut checked = 0;
        for (name, case) in errors["cases"].as_object().unwrap() {
            if ["prefill_past_chunk_size", "batch_past_max_batch_size", "decode_batch_of_two"].contains(&name.as_str())
            {
                continue;
            }
            let calls: Vec<&str> = case["calls"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
            if !calls[0].starts_with("create(") {
                continue;
            }
            let mut result = Ok(());
            for (i, call) in calls.iter().enumerate() {
                assert!(result.is_ok(), "{name}: call {i} after a failure");
                let (op, args) = call.split_once('(').unwrap_or((call, ""));
                let args = args.trim_end_matches(')');
                let ints_of = |a: &str| list(a).into_iter().map(Host::Int).collect::<Vec<_>>();
                result = match op {
                    "create" => {
                        llm.create(&list(args));
                        Ok(())
                    }
                    "add_sequence" => list(args)
                        .into_iter()
                        .try_for_each(|s| llm.call("kv_state_add_sequence", &[Host::Int(s)]).map(drop)),
                    "remove_sequence" | "fork_sequence" | "popn" => {
                        llm.call(&format!("kv_state_{op}"), &ints_of(args)).map(drop)
                    }
                    "begin_forward" => {
                        let (ids, lengths) = args.split_once("], ").unwrap();
                        let shapes = [Host::Shape(list(ids)), Host::Shape(list(lengths))];
                        llm.call("kv_state_begin_forward", &shapes).map(drop)
                    }
                    _ => {
                        // forward prefill [0] [n] PROMPT | tokens a..b
                        let rest = call.strip_prefix("forward prefill ").unwrap();
                        let (ids, rest) = rest.split_once("] ").unwrap();
                        let (lengths, tokens) = rest.split_once("] ").unwrap();
                        let tokens = if tokens == "PROMPT" { prompt.clone() } else { list(&tokens[7..]) };
                        let step = serde_json::json!({"func": "prefill", "seq_ids": list(ids),
                                                      "lengths": list(lengths), "tokens": tokens});
                        llm.forward(&step).map(drop)
                    }
                };
            }
            let err = result.expect_err(name);
            match err.lm_error::<mblob_runtime::exec::llm::kv_cache::KvCacheError>() {
                Some(mblob_runtime::exec::llm::kv_cache::KvCacheError::Check(m)) => {
                    assert_eq!(case["error"]["kind"], "InternalError", "{name}");
                    assert_eq!(m, case["error"]["message"].as_str().unwrap(), "{name}");
                }
                _ => panic!("{name}: {err}"),
            }
            let state = &case["state_after"];
            assert_eq!(llm.state(seqs_of(state)), *state, "{name}: state after the error");
            checked += 1;
        }
        assert_eq!(checked, 12);
    }

    /// `LanguageModel` on OpenCL: the weights uploaded once (every array of `packed_params`
    /// on the device), the `single` scenario's greedy tokens exactly and its logits within the
    /// bound of TVM's CPU record.
    #[test]
    fn language_model_generates_tvms_tokens() {
        use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};
        let Some(d) = opencl() else { return };
        let scenarios = json("scenarios.json");
        let forwards: Vec<Json> = scenarios["scenarios"]["single"]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["op"] == "forward")
            .cloned()
            .collect();
        let prompt: Vec<i32> = ints(&forwards[0]["tokens"]).iter().map(|&t| t as i32).collect();
        let mut lm =
            LanguageModel::new(&load(LIB), d, Some(&dir().join("params")), &GenerateOptions::default()).unwrap();
        let weights = lm.weight_arrays();
        assert_eq!(weights.len(), 15);
        assert!(weights.iter().all(|w| w.device() == d));
        let (_, reference) = npy_f32("single.logits.npy");
        for _ in 0..2 {
            let out = lm.generate(&prompt, forwards.len()).unwrap();
            let want: Vec<i32> = forwards.iter().map(|s| s["argmax"][0].as_i64().unwrap() as i32).collect();
            assert_eq!(out.tokens, want, "TVM's greedy tokens");
            for (i, (got, step)) in out.logits.iter().zip(&forwards).enumerate() {
                let row = step["logit_rows"][0].as_u64().unwrap() as usize;
                let (w, bound) = worst(got, &reference[row * 256..(row + 1) * 256]);
                assert!(w <= bound, "step {i}: logits differ by {w}");
            }
        }
    }

    /// The cache is made on the VM's device; called directly (not through the VM, which copies
    /// arguments to its device), attention refuses tensors off that device with an error
    /// rather than handing them to the device's kernels, and `debug_get_kv` writes into host
    /// tensors as into device ones.
    #[test]
    fn the_cache_lives_on_the_vms_device() {
        let Some(d) = opencl() else { return };
        let scenarios = json("scenarios.json");
        let mut llm = Llm::new(LIB, d, &scenarios);
        llm.create(&[4, 128, 64, 16, 0]);
        llm.call("kv_state_add_sequence", &[Host::Int(0)]).unwrap();
        llm.forward(&scenarios["scenarios"]["single"]["steps"][2]).unwrap();
        let Host::Object(o) = &llm.cache else { unreachable!() };
        let cache = o.downcast_ref::<PagedKvCache>().unwrap();
        assert_eq!(cache.config().device, d);
        cache.begin_forward(&[0], &[1]).unwrap();
        let host = |s: &[i64]| NdArray::empty(s, DataType::F32, Device::cpu(0)).unwrap();
        let dev = |s: &[i64]| NdArray::empty(s, DataType::F32, d).unwrap();
        for (qkv, o) in [(host(&[1, 12, 16]), host(&[1, 4, 16])), (dev(&[1, 12, 16]), host(&[1, 4, 16]))] {
            let e = cache.attention_with_fused_qkv(0, 0.25, &qkv, &o).unwrap_err().to_string();
            assert!(e.contains("but the cache is on opencl:0"), "{e}");
        }
        // Keys of the prompt read directly into host tensors: TVM's (single.kv1).
        let (k, v) = (host(&[2, 7, 4, 16]), host(&[2, 7, 4, 16]));
        cache.debug_get_kv(0, 0, 7, &k, &v).unwrap();
        let (_, want) = npy_f32("kv/single.kv1.k.npy");
        let (w, bound) = worst(&k.to_f32().unwrap().unwrap(), &want);
        assert!(w <= bound, "keys differ by {w}");
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    const LIB: &str = "device/llm_params_cuda_sm90.so";

    #[test]
    #[ignore = "needs an NVIDIA GPU and NVRTC"]
    fn single_on_cuda() {
        scenario(LIB, Device::cuda(0), "single");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and NVRTC"]
    fn shared_on_cuda() {
        scenario(LIB, Device::cuda(0), "shared");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and NVRTC"]
    fn batch_prefill_on_cuda() {
        scenario(LIB, Device::cuda(0), "batch_prefill");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and NVRTC"]
    fn deep_on_cuda() {
        scenario(LIB, Device::cuda(0), "deep");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and NVRTC"]
    fn aligned_on_cuda() {
        scenario(LIB, Device::cuda(0), "aligned");
    }
}
