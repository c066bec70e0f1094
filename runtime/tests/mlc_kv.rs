//! The paged KV cache of model libraries MLC-LLM's own pipeline built (tests/fixtures/mlc,
//! README there), driven through the VM as MLC-LLM's engine drives it, with the weights loaded
//! by the tensor-cache builtins (`vm.builtin.tensor_cache.load`,
//! `param_array_from_cache_by_name_unpacked` with the names of `_metadata`): after a prompt,
//! `kv_state_fork_sequence(0 -> 1)` and three decodes of the child, then `kv_state_popn(0, 2)`
//! and two decodes of the parent give TVM's greedy tokens and logits within 1e-4 of
//! max(1, max |logit|) of what TVM 0.27's VM gave for the same calls (`reference.json`,
//! `fork.logits.npy`).
#![cfg(feature = "llm")]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::format::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{load_library, Device, LoadOptions, Registry};
use serde_json::Value;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::{Host, HostCalls};

/// The tensor cache builtins share one process-wide cache: one test at a time loads into it.
static GLOBAL_CACHE: Mutex<()> = Mutex::new(());

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc").join(name)
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn npy_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    (shape, f.into_vec::<f32>().unwrap())
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
}

struct Model {
    vm: VirtualMachine,
    params: Host,
    settings: Value,
}

impl Model {
    fn new(name: &str) -> Model {
        Model::on(name, name, Device::cpu(0))
    }

    /// The library of `lib_of` on `device`, with the weights (put on the device) and TVM's
    /// settings of `name`.
    fn on(lib_of: &str, name: &str, device: Device) -> Model {
        let dir = fixture(name);
        let lib = fixture(lib_of).join("lib.so");
        // SAFETY: the fixture is a library MLC-LLM's pipeline built for these tests.
        let tree = unsafe { load_library(&lib, &Registry::default(), &LoadOptions::default()) }
            .unwrap_or_else(|e| panic!("{lib_of}: {e}"));
        let vm = VirtualMachine::new(&tree, device).unwrap_or_else(|e| panic!("{lib_of} on {device}: {e}"));
        let meta: Value = match vm.call_host("_metadata", &[]).unwrap() {
            Host::Str(s) => serde_json::from_str(&s).unwrap(),
            v => panic!("_metadata: {v:?}"),
        };
        let names: Vec<Host> =
            meta["params"].as_array().unwrap().iter().map(|p| Host::Str(p["name"].as_str().unwrap().into())).collect();
        let params = {
            let _global = GLOBAL_CACHE.lock().unwrap_or_else(|e| e.into_inner());
            let dir_arg = Host::Str(dir.to_str().unwrap().into());
            let (kind, id) = (Host::Int(i64::from(device.device_type.code())), Host::Int(i64::from(device.device_id)));
            vm.call_host("vm.builtin.tensor_cache.load", &[dir_arg, kind, id]).unwrap();
            let params = vm.call_host("vm.builtin.param_array_from_cache_by_name_unpacked", &names).unwrap();
            vm.call_host("vm.builtin.tensor_cache.clear", &[]).unwrap();
            params
        };
        match &params {
            Host::Tuple(items) => assert_eq!(items.len(), names.len()),
            v => panic!("param_array_from_cache_by_name_unpacked: {v:?}"),
        }
        let settings = json(&dir.join("reference.json"))["settings"].clone();
        Model { vm, params, settings }
    }

    fn builtin(&self, name: &str, args: &[Host]) -> Host {
        self.vm.call_host(&format!("vm.builtin.{name}"), args).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// `create_tir_paged_kv_cache` with TVM's settings, and sequence 0.
    fn new_cache(&self) -> Host {
        let s = |k: &str| Host::Shape(vec![self.settings[k].as_i64().unwrap()]);
        let sliding = Host::Shape(vec![i64::from(self.settings["sliding_window_size"].as_i64().unwrap() != -1)]);
        let kv = self
            .vm
            .call_host(
                "create_tir_paged_kv_cache",
                &[s("max_batch_size"), s("max_total_seq_len"), s("prefill_chunk_size"), s("page_size"), sliding],
            )
            .unwrap();
        self.builtin("kv_state_add_sequence", &[kv.clone(), Host::Int(0)]);
        kv
    }

    /// One forward step of `seq` over `ids` through `func`: the logits of the last position.
    fn forward(&self, kv: &Host, seq: i64, ids: &[i32], func: &str) -> Vec<f32> {
        let n = ids.len() as i64;
        self.builtin("kv_state_begin_forward", &[kv.clone(), Host::Shape(vec![seq]), Host::Shape(vec![n])]);
        let input =
            Tensor::new(DataType::I32, vec![n], ids.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let emb = match self.vm.call_host("embed", &[Host::Tensor(input), self.params.clone()]).unwrap() {
            Host::Tensor(t) => t,
            v => panic!("embed: {v:?}"),
        };
        let hidden = *emb.shape.last().unwrap();
        let emb = Tensor { shape: vec![1, n, hidden], ..emb };
        let out = self.vm.call_host(func, &[Host::Tensor(emb), kv.clone(), self.params.clone()]).unwrap();
        self.builtin("kv_state_end_forward", std::slice::from_ref(kv));
        let logits = match out {
            Host::Tuple(items) => match items.into_iter().next() {
                Some(Host::Tensor(t)) => t,
                v => panic!("{func}: {v:?}"),
            },
            Host::Tensor(t) => t,
            v => panic!("{func}: {v:?}"),
        };
        let vocab = *logits.shape.last().unwrap() as usize;
        let all: Vec<f32> = logits.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        all[all.len() - vocab..].to_vec()
    }
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

/// Fork and popn as `reference.py` records them.
fn fork_and_popn_as_tvm(name: &str) {
    fork_and_popn_as_tvm_on(&Model::new(name), name);
}

/// [`fork_and_popn_as_tvm`] with the model `m` and TVM's records of `name`.
fn fork_and_popn_as_tvm_on(m: &Model, name: &str) {
    let r = json(&fixture(name).join("reference.json"));
    let f = &r["fork"];
    let (shape, want) = npy_f32(&fixture(name).join(f["logits"].as_str().unwrap()));
    let vocab = shape[1] as usize;
    let mut rows = Vec::new();
    let kv = m.new_cache();
    let prompt = ints(&f["prompt"]);
    let chunk = m.settings["prefill_chunk_size"].as_u64().unwrap() as usize;
    let mut last = Vec::new();
    for c in prompt.chunks(chunk) {
        last = m.forward(&kv, 0, c, "prefill");
    }
    assert_eq!(argmax(&last), f["prefill_token"].as_i64().unwrap() as i32, "{name}: prefill token");
    rows.push(last);
    m.builtin("kv_state_fork_sequence", &[kv.clone(), Host::Int(0), Host::Int(1), Host::Int(-1)]);
    for (fed, tok) in ints(&f["fork"]["decode_fed"]).into_iter().zip(ints(&f["fork"]["tokens"])) {
        let row = m.forward(&kv, 1, &[fed], "decode");
        assert_eq!(argmax(&row), tok, "{name}: decode of the forked sequence");
        rows.push(row);
    }
    m.builtin("kv_state_popn", &[kv.clone(), Host::Int(0), Host::Int(2)]);
    for (fed, tok) in ints(&f["popn"]["decode_fed"]).into_iter().zip(ints(&f["popn"]["tokens"])) {
        let row = m.forward(&kv, 0, &[fed], "decode");
        assert_eq!(argmax(&row), tok, "{name}: decode after popn");
        rows.push(row);
    }
    assert_eq!(rows.len() as u64, shape[0]);
    for (i, row) in rows.iter().enumerate() {
        let want = &want[i * vocab..(i + 1) * vocab];
        let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4 * scale, "{name}, row {i}: logits differ by {diff}");
    }
}

#[test]
fn qwen2_q0f32_fork_and_popn_as_tvm() {
    fork_and_popn_as_tvm("qwen2-q0f32");
}

#[test]
fn qwen2_q4f32_1_fork_and_popn_as_tvm() {
    fork_and_popn_as_tvm("qwen2-q4f32_1");
}

#[test]
fn llama3_q0f32_fork_and_popn_as_tvm() {
    fork_and_popn_as_tvm("llama3-q0f32");
}

/// A sliding-window model (Mistral, `support_sliding_window = 1`): the cache made with the
/// window on and the sequence given its window and sinks
/// (`attention_kv_cache_enable_sliding_window_for_seq`) as `reference.py` does. `reference.json`'s
/// prompt runs in chunks past the window, so TVM's eviction of what slid out shows in the logits
/// of every step, and the fork past the sinks fails with TVM's text.
fn sliding_window_as_tvm(name: &str) {
    sliding_window_as_tvm_on(&Model::new(name), name);
}

/// [`sliding_window_as_tvm`] with the model `m` and TVM's records of `name`.
fn sliding_window_as_tvm_on(m: &Model, name: &str) {
    let r = json(&fixture(name).join("reference.json"));
    let (window, sink) =
        (m.settings["sliding_window_size"].as_i64().unwrap(), m.settings["attention_sink_size"].as_i64().unwrap());
    let new_cache = || {
        let kv = m.new_cache();
        m.builtin(
            "attention_kv_cache_enable_sliding_window_for_seq",
            &[kv.clone(), Host::Int(0), Host::Int(window), Host::Int(sink)],
        );
        kv
    };
    let g = &r["generate"];
    let (shape, want) = npy_f32(&fixture(name).join(g["logits"].as_str().unwrap()));
    let vocab = shape[1] as usize;
    let chunk = m.settings["prefill_chunk_size"].as_u64().unwrap() as usize;
    let kv = new_cache();
    let mut rows = Vec::new();
    let mut last = Vec::new();
    for c in ints(&g["prompt"]).chunks(chunk) {
        last = m.forward(&kv, 0, c, "prefill");
    }
    let tokens = ints(&g["tokens"]);
    rows.push(last);
    for i in 1..tokens.len() {
        assert_eq!(argmax(&rows[i - 1]), tokens[i - 1], "{name}: token {}", i - 1);
        rows.push(m.forward(&kv, 0, &[tokens[i - 1]], "decode"));
    }
    assert_eq!(argmax(rows.last().unwrap()), *tokens.last().unwrap(), "{name}: last token");
    // The window holds the sequence at its size: TVM's `seq_length` after sliding.
    let len = m.builtin("attention_kv_cache_get_sequence_length", &[kv.clone(), Host::Int(0)]);
    assert!(matches!(len, Host::Int(l) if l == window), "{name}: sequence length after sliding {len:?}");
    for (i, row) in rows.iter().enumerate() {
        let want = &want[i * vocab..(i + 1) * vocab];
        let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4 * scale, "{name}, step {i}: logits differ by {diff}");
    }
    // The fork past the sinks: TVM's error, word for word.
    let f = &r["fork"];
    let kv = new_cache();
    for c in ints(&f["prompt"]).chunks(chunk) {
        m.forward(&kv, 0, c, "prefill");
    }
    let err =
        m.vm.call_host("vm.builtin.kv_state_fork_sequence", &[kv.clone(), Host::Int(0), Host::Int(1), Host::Int(-1)])
            .expect_err("a sliding sequence forks only within its sinks");
    let want = f["fork_error"].as_str().unwrap();
    assert!(err.to_string().ends_with(want), "{name}: fork error {err}, TVM's: {want}");
}

#[test]
fn mistral_q0f32_sliding_window_as_tvm() {
    sliding_window_as_tvm("mistral-q0f32");
}

#[test]
fn phi3_q0f32_longrope_fork_and_popn_as_tvm() {
    // RoPE extension factors (Phi-3.5's longrope) passed to `f_split_rotary`.
    fork_and_popn_as_tvm("phi3-q0f32");
}

#[test]
fn phi2_q0f32_partial_rotary_fork_and_popn_as_tvm() {
    // Phi-2's partial rotary (`rotary_dim` 32 of 64) in the cache's RoPE.
    fork_and_popn_as_tvm("phi2-q0f32");
}

#[test]
fn gemma2_q0f32_soft_capping_fork_and_popn_as_tvm() {
    fork_and_popn_as_tvm("gemma2-q0f32");
}

/// OpenCL device 0, or `None` (after saying so) when there is none; `MBLOB_REQUIRE_OPENCL`
/// (set by CI where pocl is installed) turns the skip into a failure.
#[cfg(feature = "opencl")]
fn opencl() -> Option<Device> {
    match mblob_runtime::device::device_api(Device::opencl(0)) {
        Ok(_) => Some(Device::opencl(0)),
        Err(e) if std::env::var_os("MBLOB_REQUIRE_OPENCL").is_some() => {
            panic!("MBLOB_REQUIRE_OPENCL is set but no OpenCL device opens: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no OpenCL device ({e})");
            None
        }
    }
}

#[cfg(feature = "opencl")]
#[test]
fn qwen2_built_for_opencl_fork_and_popn_as_tvm_on_opencl() {
    // `compile --device opencl` of qwen2-q0f32 (weights and the cache on the device) against
    // TVM's records of the CPU build: TVM 0.27's wheel has no OpenCL runtime.
    if let Some(d) = opencl() {
        fork_and_popn_as_tvm_on(&Model::on("qwen2-q0f32-opencl", "qwen2-q0f32", d), "qwen2-q0f32");
    }
}

#[cfg(feature = "opencl")]
#[test]
fn phi2_built_for_opencl_fork_and_popn_as_tvm_on_opencl() {
    if let Some(d) = opencl() {
        fork_and_popn_as_tvm_on(&Model::on("phi2-q0f32-opencl", "phi2-q0f32", d), "phi2-q0f32");
    }
}

#[cfg(feature = "opencl")]
#[test]
fn mistral_built_for_opencl_sliding_window_as_tvm_on_opencl() {
    // The window, its sinks and the eviction in the cache's GPU kernels.
    if let Some(d) = opencl() {
        sliding_window_as_tvm_on(&Model::on("mistral-q0f32-opencl", "mistral-q0f32", d), "mistral-q0f32");
    }
}

/// The same libraries compiled for CUDA (`compile --device '{"kind": "cuda", "arch": "sm_90"}'`:
/// TVM 0.27 keeps the kernels as CUDA source, compiled by NVRTC when the library loads) on
/// `cuda:0`, against TVM's records of the CPU build of the same weights. Run by
/// `ci/gpu-check.sh` where a GPU is lent; they need the driver and NVRTC.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    #[test]
    #[ignore = "needs an NVIDIA GPU (sm_90) with its driver, and NVRTC: ci/gpu-check.sh"]
    fn qwen2_built_for_cuda_fork_and_popn_as_tvm_on_cuda() {
        fork_and_popn_as_tvm_on(&Model::on("qwen2-q0f32-cuda", "qwen2-q0f32", Device::cuda(0)), "qwen2-q0f32");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (sm_90) with its driver, and NVRTC: ci/gpu-check.sh"]
    fn phi2_built_for_cuda_fork_and_popn_as_tvm_on_cuda() {
        fork_and_popn_as_tvm_on(&Model::on("phi2-q0f32-cuda", "phi2-q0f32", Device::cuda(0)), "phi2-q0f32");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (sm_90) with its driver, and NVRTC: ci/gpu-check.sh"]
    fn mistral_built_for_cuda_sliding_window_as_tvm_on_cuda() {
        sliding_window_as_tvm_on(&Model::on("mistral-q0f32-cuda", "mistral-q0f32", Device::cuda(0)), "mistral-q0f32");
    }
}
