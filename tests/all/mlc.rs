//! `mblob generate` on model libraries MLC-LLM's own pipeline built (`convert_weight`,
//! `gen_config`, `compile --device cpu` with TVM 0.27; tests/fixtures/mlc, README there), with the
//! weights MLC-LLM converted (`"format": "f32-to-bf16"` on every record, quantized `uint32`
//! records included) and `_metadata` as MLC-LLM writes it (weight shapes with named symbolic
//! dimensions): the greedy tokens are those of TVM 0.27's own VM driven as MLC-LLM's engine
//! drives it (`reference.json`), and the logits of every step are within 1e-4 of
//! max(1, max |logit|) of TVM's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlc").join(name)
}

fn reference(name: &str) -> Value {
    let path = fixture(name).join("reference.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn f32s(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    (shape, f.into_vec::<f32>().unwrap())
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap().to_string()).collect()
}

/// `mblob generate` on `device` with the library of `lib_of`, the weights of `name` and the
/// prompt TVM ran, writing the logits to `logits`.
fn generate(lib_of: &str, name: &str, device: &str, threads: &str, logits: &Path) -> Output {
    let r = reference(name);
    let g = &r["generate"];
    let dir = fixture(name);
    Command::new(env!("CARGO_BIN_EXE_mblob"))
        .arg("generate")
        .arg(fixture(lib_of).join("lib.so"))
        .args(["--device", device])
        .arg("--weights")
        .arg(&dir)
        .args(["--prompt-ids", &ids(&g["prompt"]).join(",")])
        .args(["--max-new-tokens", &g["tokens"].as_array().unwrap().len().to_string()])
        .args(["--threads", threads])
        .arg("--logits")
        .arg(logits)
        .output()
        .expect("run mblob")
}

/// mblob gives TVM's greedy tokens and its logits of every step, at 1 and 2 threads.
fn runs_as_tvm(name: &str) {
    runs_as_tvm_with(name, name);
}

/// [`runs_as_tvm`] with the library of `lib_of` and the weights and TVM's records of `name`.
fn runs_as_tvm_with(lib_of: &str, name: &str) {
    runs_as_tvm_on(lib_of, name, "cpu");
}

/// [`runs_as_tvm_with`] on `device`.
fn runs_as_tvm_on(lib_of: &str, name: &str, device: &str) {
    let r = reference(name);
    let g = &r["generate"];
    let tokens = ids(&g["tokens"]).join(",");
    let (ref_shape, want) = f32s(&fixture(name).join(g["logits"].as_str().unwrap()));
    let vocab = ref_shape[1] as usize;
    let tmp = tempfile::tempdir().unwrap();
    for threads in ["1", "2"] {
        let logits = tmp.path().join(format!("{threads}.npy"));
        let out = generate(lib_of, name, device, threads, &logits);
        assert!(out.status.success(), "{lib_of} on {device}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().last().unwrap_or_default(), tokens, "{name}: TVM's greedy tokens");
        let (shape, got) = f32s(&logits);
        assert_eq!(shape, ref_shape, "{name}: logits shape");
        for step in 0..ref_shape[0] as usize {
            let want = &want[step * vocab..(step + 1) * vocab];
            let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff =
                got[step * vocab..(step + 1) * vocab].iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff <= 1e-4 * scale, "{name} at {threads} threads, step {step}: logits differ by {diff}");
        }
    }
}

#[test]
fn qwen2_q0f32_gives_tvms_tokens_and_logits() {
    runs_as_tvm("qwen2-q0f32");
}

#[test]
fn qwen2_q4f32_1_gives_tvms_tokens_and_logits() {
    // q4f32_1: uint32 weights and float32 scales, every record `f32-to-bf16` as MLC-LLM writes.
    runs_as_tvm("qwen2-q4f32_1");
}

#[test]
fn llama3_q0f32_gives_tvms_tokens_and_logits() {
    // Llama 3.x rope scaling; `_metadata` names the symbolic dim `vocab_size` in weight shapes.
    runs_as_tvm("llama3-q0f32");
}

#[test]
fn mistral_sliding_window_gives_tvms_tokens_and_logits() {
    // Mistral with a 16-token window and 4 attention sinks (`support_sliding_window = 1`): the
    // 37-token prompt and the decodes run past the window, so TVM's eviction shows in the
    // logits of every step.
    runs_as_tvm("mistral-q0f32");
}

#[test]
fn phi3_longrope_gives_tvms_tokens_and_logits() {
    // Phi-3.5's longrope: RoPE extension factors (argument 11 of the create call), which
    // `f_split_rotary` gets in place of its RoPE flag.
    runs_as_tvm("phi3-q0f32");
}

#[test]
fn phi2_partial_rotary_gives_tvms_tokens_and_logits() {
    // Phi-2: RoPE on 32 of each head's 64 features (`rotary_dim`), attention and MLP in
    // parallel off one LayerNorm, biases everywhere (the lm_head's too).
    runs_as_tvm("phi2-q0f32");
}

#[test]
fn gemma2_final_soft_capping_gives_tvms_tokens_and_logits() {
    // Gemma 2: the logits soft-capped (tanh(x / 3) * 3 here, so that every logit is in tanh's
    // curve), sqrt(hidden)-scaled embeddings, `1 + w` RMS norms around attention and MLP.
    runs_as_tvm("gemma2-q0f32");
}

/// Every step's logits within 1e-4 of max(1, max |ref|) of TVM's, row by row.
fn logits_close(name: &str, what: &str, got: &[f32], want: &[f32], vocab: usize) {
    assert_eq!(got.len(), want.len(), "{name}, {what}: logits shape");
    for (step, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4 * scale, "{name}, {what}, row {step}: logits differ by {diff}");
    }
}

/// `mblob generate` of the fixture's library with its weights and `args`.
fn generate_output(name: &str, args: &[String]) -> Output {
    let dir = fixture(name);
    Command::new(env!("CARGO_BIN_EXE_mblob"))
        .arg("generate")
        .arg(dir.join("lib.so"))
        .arg("--weights")
        .arg(&dir)
        .args(args)
        .output()
        .expect("run mblob")
}

/// `mblob generate` with `args` on the fixture: its stdout lines, the logits it wrote.
fn generate_with(name: &str, args: &[String]) -> (Vec<String>, (Vec<u64>, Vec<f32>)) {
    let dir = fixture(name);
    let tmp = tempfile::tempdir().unwrap();
    let logits = tmp.path().join("l.npy");
    let out = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .arg("generate")
        .arg(dir.join("lib.so"))
        .arg("--weights")
        .arg(&dir)
        .args(args)
        .arg("--logits")
        .arg(&logits)
        .output()
        .expect("run mblob");
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let lines = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    (lines, f32s(&logits))
}

/// Several prompts in one batch (`--prompt-ids` given three times, and the same as a
/// `--prompt-file`) through `batch_prefill` and `batch_decode`: TVM's tokens and logits of
/// every sequence (`reference.py`'s `batch`), greedy and sampled with TVM's
/// `sample_top_p_from_logits` and MLC-LLM's seeded draws.
fn batch_as_tvm(name: &str) {
    let (prompts, n) = batch_greedy_as_tvm(name);
    let r = reference(name);
    let s = &r["batch"]["sampled"];
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("prompts.txt");
    let text: String = prompts.iter().map(|p| format!("{}\n", p.replace(',', " "))).collect();
    std::fs::write(&file, format!("# one prompt per line\n{text}")).unwrap();
    let args: Vec<String> = vec![
        "--prompt-file".into(),
        file.display().to_string(),
        "--max-new-tokens".into(),
        n,
        "--temperature".into(),
        s["temperature"].as_f64().unwrap().to_string(),
        "--top-p".into(),
        s["top_p"].as_f64().unwrap().to_string(),
        "--seed".into(),
        s["seeds"][0].as_u64().unwrap().to_string(),
    ];
    let (lines, _) = generate_with(name, &args);
    let want: Vec<String> = s["tokens"].as_array().unwrap().iter().map(|t| ids(t).join(",")).collect();
    assert_eq!(lines[lines.len() - 3..], want[..], "{name}: TVM's sampled tokens of the batch");
}

/// The greedy half of [`batch_as_tvm`]: the three prompts given as `--prompt-ids` each, TVM's
/// tokens and logits of every sequence. The prompts (comma-separated) and the new tokens.
fn batch_greedy_as_tvm(name: &str) -> (Vec<String>, String) {
    let r = reference(name);
    let b = &r["batch"];
    let prompts: Vec<String> = b["prompts"].as_array().unwrap().iter().map(|p| ids(p).join(",")).collect();
    let n = b["max_new_tokens"].as_u64().unwrap().to_string();
    let want_tokens: Vec<String> = b["tokens"].as_array().unwrap().iter().map(|t| ids(t).join(",")).collect();
    let (ref_shape, want) = f32s(&fixture(name).join(b["logits"].as_str().unwrap()));
    let mut args: Vec<String> = prompts.iter().flat_map(|p| ["--prompt-ids".to_owned(), p.clone()]).collect();
    args.extend(["--max-new-tokens".to_owned(), n.clone()]);
    let (lines, (shape, got)) = generate_with(name, &args);
    assert_eq!(lines[lines.len() - 3..], want_tokens[..], "{name}: TVM's greedy tokens of the batch");
    assert_eq!(shape, ref_shape, "{name}: batch logits shape");
    logits_close(name, "batch", &got, &want, ref_shape[2] as usize);
    (prompts, n)
}

/// One prompt sampled (`--temperature`, `--top-p`, `--seed`): TVM's tokens drawn by its
/// `sample_top_p_from_logits` from MLC-LLM's seeded uniform draws, and TVM's logits of every
/// step (`reference.py`'s `sampled`).
fn sampled_as_tvm(name: &str) {
    let r = reference(name);
    let s = &r["sampled"];
    let (ref_shape, want) = f32s(&fixture(name).join(s["logits"].as_str().unwrap()));
    let args: Vec<String> = vec![
        "--prompt-ids".into(),
        ids(&s["prompt"]).join(","),
        "--max-new-tokens".into(),
        s["tokens"].as_array().unwrap().len().to_string(),
        "--temperature".into(),
        s["temperature"].as_f64().unwrap().to_string(),
        "--top-p".into(),
        s["top_p"].as_f64().unwrap().to_string(),
        "--seed".into(),
        s["seed"].as_u64().unwrap().to_string(),
    ];
    let (lines, (shape, got)) = generate_with(name, &args);
    assert_eq!(lines.last().unwrap(), &ids(&s["tokens"]).join(","), "{name}: TVM's sampled tokens");
    assert_eq!(shape, ref_shape);
    logits_close(name, "sampled", &got, &want, ref_shape[1] as usize);
}

#[test]
fn qwen2_q0f32_batch_gives_tvms_tokens_and_logits() {
    batch_as_tvm("qwen2-q0f32");
}

#[test]
fn mistral_batch_with_sliding_windows_gives_tvms_tokens_and_logits() {
    // Each of the three sequences with its own window and sinks.
    batch_as_tvm("mistral-q0f32");
}

#[test]
fn qwen2_q0f32_sampling_gives_tvms_tokens() {
    sampled_as_tvm("qwen2-q0f32");
}

#[test]
fn mistral_sampling_gives_tvms_tokens() {
    sampled_as_tvm("mistral-q0f32");
}

#[test]
fn rwkv6_rnn_state_gives_tvms_tokens_and_logits() {
    // `kv_state_kind` `rnn_state`: TVM's RNN state from `create_rnn_state`, no KV cache, no
    // context window (-1).
    runs_as_tvm("rwkv6-q0f32");
}

#[test]
fn rwkv6_batch_gives_tvms_tokens_and_logits() {
    // Each prompt prefilled alone (`prefill`), then `batch_decode` of the three, as
    // reference_rnn.py ran TVM: RWKV-6's `batch_prefill` takes one sequence only.
    batch_greedy_as_tvm("rwkv6-q0f32");
}

#[test]
fn qwen35_hybrid_state_gives_tvms_tokens_and_logits() {
    // `kv_state_kind` `hybrid`: TVM's paged KV cache (attention layers) and RNN state (Gated
    // DeltaNet layers) together; one sequence through `batch_prefill`/`batch_decode`, as
    // reference_hybrid.py ran TVM (the library has no `prefill`/`decode`).
    runs_as_tvm("qwen35-q0f32");
}

#[test]
fn qwen35_batch_gives_tvms_tokens_and_logits() {
    // Each prompt prefilled alone through `batch_prefill`, then `batch_decode` of the three.
    batch_greedy_as_tvm("qwen35-q0f32");
}

#[test]
fn qwen35_second_turn_continues_both_states_as_tvm() {
    // `--then-prompt-ids`: the last new token and the next prompt through `batch_prefill` on the
    // same KV cache and RNN state, then `batch_decode` (reference_hybrid.py's `turn`).
    let name = "qwen35-q0f32";
    let r = reference(name);
    let (g, t) = (&r["generate"], &r["turn"]);
    let n = ids(&g["tokens"]).len().to_string();
    let args: Vec<String> = [
        "--prompt-ids",
        &ids(&g["prompt"]).join(","),
        "--then-prompt-ids",
        &ids(&t["prompt"]).join(","),
        "--max-new-tokens",
        &n,
    ]
    .map(str::to_owned)
    .into();
    let (lines, (shape, got)) = generate_with(name, &args);
    assert_eq!(lines[lines.len() - 2..], [ids(&g["tokens"]).join(","), ids(&t["tokens"]).join(",")], "TVM's turns");
    let (want_shape, want) = f32s(&fixture(name).join(t["logits"].as_str().unwrap()));
    assert_eq!(shape, want_shape);
    logits_close(name, "turns", &got, &want, shape[1] as usize);
}

#[test]
fn kv_cache_sized_from_a_memory_budget() {
    // Qwen2.5's cache: 2 layers x 2 (keys, values) x 2 KV heads x 16 tokens x 64 features of
    // float32 = 32768 bytes a page; TVM adds one page to those of max_total_seq_len. The 37-token
    // prompt and 8 new tokens take 44 positions: 4 pages hold 48 tokens, 3 pages 32.
    let name = "qwen2-q0f32";
    let r = reference(name);
    let g = &r["generate"];
    let mut args = vec![
        "--prompt-ids".to_owned(),
        ids(&g["prompt"]).join(","),
        "--max-new-tokens".to_owned(),
        g["tokens"].as_array().unwrap().len().to_string(),
        "--kv-cache-bytes".to_owned(),
        (4 * 32768).to_string(),
    ];
    let (lines, (shape, got)) = generate_with(name, &args);
    assert_eq!(lines.last().unwrap(), &ids(&g["tokens"]).join(","), "TVM's tokens in a cache sized from the budget");
    let (_, want) = f32s(&fixture(name).join(g["logits"].as_str().unwrap()));
    logits_close(name, "budget", &got, &want, shape[1] as usize);
    args[5] = (4 * 32768 - 1).to_string();
    let out = generate_output(name, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("44 positions") && stderr.contains("more than its 32"), "{stderr}");
}

#[test]
fn gemma3_per_layer_sliding_window_gives_tvms_tokens_and_logits() {
    // Gemma 3: five local layers (attention kind 3) and one global; the 1100-token prompt runs
    // past the local layers' window (TVM's default 1024: MLC-LLM passes none), so those layers
    // read only the window's pages, with TVM's RoPE theta 10000 of local layers.
    runs_as_tvm("gemma3-q0f32");
}

#[test]
fn backend_tag_tir_of_tvm_020_to_023_gives_tvms_tokens_and_logits() {
    // qwen2-q0f32's library compiled again with the attention kernels tagged "tir", as TVM 0.20
    // to 0.23 tag them (TVM 0.27 refuses that tag, so TVM's records are those of the "tirx"
    // build: the same kernels).
    runs_as_tvm_with("qwen2-q0f32-tir", "qwen2-q0f32");
}

/// OpenCL device 0 opens, or (after saying so) the test is skipped; `MBLOB_REQUIRE_OPENCL`
/// (set by CI where pocl is installed) turns the skip into a failure.
#[cfg(feature = "opencl")]
fn opencl_or_skip() -> bool {
    match mblob_runtime::device::device_api(mblob_runtime::Device::opencl(0)) {
        Ok(_) => true,
        Err(e) if std::env::var_os("MBLOB_REQUIRE_OPENCL").is_some() => {
            panic!("MBLOB_REQUIRE_OPENCL is set but no OpenCL device opens: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no OpenCL device ({e})");
            false
        }
    }
}

#[cfg(feature = "opencl")]
#[test]
fn qwen2_built_for_opencl_gives_tvms_tokens_and_logits_on_opencl() {
    // `compile --device opencl`: TVM's GPU pipeline, MLC's dlight schedules and the cache's GPU
    // kernels as OpenCL C. TVM 0.27's wheel cannot run OpenCL, so the records are those of the
    // CPU build of the same model and weights (the kernels sum in another order: 1e-4 bound).
    if opencl_or_skip() {
        runs_as_tvm_on("qwen2-q0f32-opencl", "qwen2-q0f32", "opencl");
    }
}

#[cfg(feature = "opencl")]
#[test]
fn phi2_built_for_opencl_gives_tvms_tokens_and_logits_on_opencl() {
    // Phi-2's partial rotary in the GPU kernels of the cache.
    if opencl_or_skip() {
        runs_as_tvm_on("phi2-q0f32-opencl", "phi2-q0f32", "opencl");
    }
}

#[cfg(feature = "opencl")]
#[test]
fn mistral_built_for_opencl_gives_tvms_tokens_and_logits_on_opencl() {
    // The 16-token window with 4 sinks and its eviction in the cache's GPU kernels.
    if opencl_or_skip() {
        runs_as_tvm_on("mistral-q0f32-opencl", "mistral-q0f32", "opencl");
    }
}

#[test]
fn a_prefill_chunk_larger_than_the_embedding_workspace_is_refused() {
    // The library's `alloc_embedding_tensor` (MLC-LLM's `AttachAllocEmbeddingTensorFunc`) gives
    // `[prefill_chunk_size, hidden]` = [16, 256]; MLC-LLM's engine requires at least as many
    // rows as its prefill chunk, and so does mblob, before anything runs.
    let args = ["--prompt-ids", "1,2,3", "--prefill-chunk-size", "32"].map(String::from);
    let out = generate_output("qwen2-q0f32", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("alloc_embedding_tensor") && stderr.contains("16 rows") && stderr.contains("32 tokens"),
        "{stderr}"
    );
}

#[cfg(feature = "opencl")]
#[test]
fn an_opencl_program_cache_written_by_one_run_loads_in_the_next() {
    // `--opencl-program-cache`: the first process builds every kernel from its OpenCL C and
    // writes the programs as TVM's `opencl.GetPreCompiledPrograms` lays them out; the second
    // loads them (`SetPreCompiledPrograms`). Both give TVM's tokens.
    if !opencl_or_skip() {
        return;
    }
    let name = "qwen2-q0f32";
    let r = reference(name);
    let g = &r["generate"];
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("qwen2.programs");
    let run = |prompt: &str, new_tokens: &str| {
        Command::new(env!("CARGO_BIN_EXE_mblob"))
            .arg("generate")
            .arg(fixture("qwen2-q0f32-opencl").join("lib.so"))
            .args(["--device", "opencl", "--weights"])
            .arg(fixture(name))
            .args(["--prompt-ids", prompt, "--max-new-tokens", new_tokens, "--opencl-program-cache"])
            .arg(&cache)
            .output()
            .unwrap()
    };
    let tokens = || {
        let out = run(&ids(&g["prompt"]).join(","), &g["tokens"].as_array().unwrap().len().to_string());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned()
    };
    assert_eq!(tokens(), ids(&g["tokens"]).join(","), "TVM's tokens, the programs built from the source");
    let bytes = std::fs::read(&cache).unwrap();
    // TVM's layout: a u64 count, then per kernel a u64-prefixed name and a u64-prefixed binary.
    let count = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let name_len = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    assert!(count > 1 && std::str::from_utf8(&bytes[16..16 + name_len]).is_ok(), "{count} programs");
    assert_eq!(tokens(), ids(&g["tokens"]).join(","), "TVM's tokens, the programs loaded from the cache");
    assert_eq!(std::fs::read(&cache).unwrap(), bytes, "the second run reads the cache, it does not write it");
    // A damaged cache is refused, naming the file.
    std::fs::write(&cache, &bytes[..bytes.len() / 2]).unwrap();
    let out = run("1,2,3", "1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("qwen2.programs") && stderr.contains("cut short"), "{stderr}");
}

/// The libraries compiled for CUDA (`compile --device '{"kind": "cuda", "arch": "sm_90"}'`),
/// each with the CPU build whose weights and TVM records it shares. TVM 0.27 keeps the kernels
/// as CUDA C++ source (payload format `cuda`): its CUDA runtime compiles them with NVRTC when
/// the library loads, and so does mblob.
#[cfg(feature = "cuda")]
const CUDA_BUILDS: [(&str, &str); 3] =
    [("qwen2-q0f32-cuda", "qwen2-q0f32"), ("phi2-q0f32-cuda", "phi2-q0f32"), ("mistral-q0f32-cuda", "mistral-q0f32")];

/// Without a GPU: each CUDA build loads (the driver untouched), its CUDA modules hold TVM's
/// CUDA source with a `__global__` definition for every kernel of the modules' function
/// tables, the cache's attention kernels among them, and every global function its bytecode
/// calls is served; `mblob generate --device cuda` refuses with the typed error that names the
/// missing driver: exit status 1, no token written (on a machine with a driver the ignored
/// tests below run them).
#[cfg(feature = "cuda")]
#[test]
fn the_cuda_builds_load_without_a_gpu_and_refuse_to_run() {
    use mblob_runtime::device::cuda::CudaModule;
    for (lib, name) in CUDA_BUILDS {
        let path = fixture(lib).join("lib.so");
        // SAFETY: the fixture is a library MLC-LLM's pipeline built for these tests.
        let tree =
            unsafe { mblob_runtime::load_library(&path, &mblob_runtime::Registry::default(), &Default::default()) }
                .unwrap_or_else(|e| panic!("{lib}: {e}"));
        let modules: Vec<&CudaModule> =
            tree.modules().iter().filter_map(|m| m.module.as_any().downcast_ref::<CudaModule>()).collect();
        assert!(!modules.is_empty(), "{lib}: no CUDA module");
        let mut kernels = Vec::new();
        for m in modules {
            assert!(format!("{m:?}").contains("not loaded"), "{lib}: loading the tree used the driver");
            let device = m.device_module();
            assert_eq!(device.format, "cuda", "{lib}: TVM 0.27 keeps CUDA source");
            let source = std::str::from_utf8(&device.data).unwrap_or_else(|e| panic!("{lib}: {e}"));
            for (kernel, info) in &device.functions {
                let defined = source.match_indices(&format!(" {kernel}(")).any(|(at, _)| {
                    let line = &source[source[..at].rfind('\n').map_or(0, |n| n + 1)..at];
                    line.starts_with("extern \"C\" __global__ void")
                });
                assert!(defined, "{lib}: {kernel} has no __global__ definition in the source");
                assert!(!info.launch_param_tags.is_empty(), "{lib}: {kernel} has no launch parameters");
                kernels.push(kernel.clone());
            }
        }
        for kernel in
            ["batch_decode_paged_kv_kernel", "batch_prefill_ragged_kv_kernel", "batch_prefill_paged_kv_kernel"]
        {
            assert!(kernels.iter().any(|k| k == kernel), "{lib}: the cache's kernel {kernel}");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_mblob")).args(["inspect", "--json"]).arg(&path).output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{lib}: inspect: {e}"));
        assert_eq!(report["modules"][0]["relax"]["unsupported_calls"], serde_json::json!([]), "{lib}");
        if CudaModule::driver_present() {
            eprintln!("{lib}: a CUDA driver is present; the ignored tests run the library");
            continue;
        }
        let out = generate(lib, name, "cuda", "1", &std::env::temp_dir().join(format!("{lib}-nogpu.npy")));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{lib}: {stderr}");
        assert!(stderr.contains("no CUDA driver found"), "{lib}: {stderr}");
        assert!(out.stdout.is_empty(), "{lib}: {}", String::from_utf8_lossy(&out.stdout));
    }
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (sm_90) with its driver, and NVRTC: ci/gpu-check.sh"]
fn qwen2_built_for_cuda_gives_tvms_tokens_and_logits_on_cuda() {
    // TVM's GPU pipeline, MLC's dlight schedules and the cache's GPU kernels in CUDA, against
    // TVM's records of the CPU build of the same model and weights (TVM was not run on a GPU:
    // the kernels sum in another order, hence the 1e-4 bound).
    runs_as_tvm_on("qwen2-q0f32-cuda", "qwen2-q0f32", "cuda");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (sm_90) with its driver, and NVRTC: ci/gpu-check.sh"]
fn phi2_built_for_cuda_gives_tvms_tokens_and_logits_on_cuda() {
    runs_as_tvm_on("phi2-q0f32-cuda", "phi2-q0f32", "cuda");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (sm_90) with its driver, and NVRTC: ci/gpu-check.sh"]
fn mistral_built_for_cuda_gives_tvms_tokens_and_logits_on_cuda() {
    // The 16-token window with 4 sinks and its eviction in the cache's CUDA kernels.
    runs_as_tvm_on("mistral-q0f32-cuda", "mistral-q0f32", "cuda");
}
