//! `mblob generate` on the LLM fixture (`tests/fixtures/llm`, a tiny LLaMA-like model TVM 0.27
//! compiled with its TIR paged KV cache): the greedy tokens and their logits are TVM's (the
//! `single` scenario of `scenarios.json`, recorded by TVM's own VM), for the library that takes
//! its weights from a tensor cache and for the one with the weights bound, at 1 and 2 threads;
//! and the errors of bad requests name the file and the problem.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn llm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm")
}

fn generate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).arg("generate").args(args).output().expect("run mblob")
}

fn scenario(name: &str) -> Value {
    let s: Value = serde_json::from_slice(&std::fs::read(llm().join("scenarios.json")).unwrap()).unwrap();
    s["scenarios"][name].clone()
}

/// The forward steps of the `single` scenario: the tokens fed and the argmax TVM got.
fn single_steps() -> Vec<Value> {
    scenario("single")["steps"].as_array().unwrap().iter().filter(|s| s["op"] == "forward").cloned().collect()
}

fn f32s(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    (shape, f.into_vec::<f32>().unwrap())
}

fn last_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned()
}

/// What TVM recorded for the `single` scenario: its prompt, greedy tokens and logits.
struct Single {
    steps: Vec<Value>,
    /// The prompt's token ids, comma-separated (`--prompt-ids`).
    prompt: String,
    /// TVM's greedy tokens, as `mblob generate` prints them.
    tokens: String,
    /// TVM's logits, one row of `vocab` per row its VM produced.
    reference: Vec<f32>,
    vocab: usize,
}

impl Single {
    fn load() -> Single {
        let steps = single_steps();
        let prompt: Vec<String> = steps[0]["tokens"].as_array().unwrap().iter().map(|t| t.to_string()).collect();
        let tokens: Vec<String> = steps.iter().map(|s| s["argmax"][0].to_string()).collect();
        let (ref_shape, reference) = f32s(&llm().join("single.logits.npy"));
        Single { prompt: prompt.join(","), tokens: tokens.join(","), reference, vocab: ref_shape[1] as usize, steps }
    }

    /// `--max-new-tokens`: one token per forward step.
    fn new_tokens(&self) -> String {
        self.steps.len().to_string()
    }

    /// `out` (of a run that wrote its logits to `logits`) gave TVM's greedy tokens, and logits
    /// within 1e-4 of max(1, max |logit|) of TVM's.
    fn check(&self, what: &str, out: &Output, logits: &Path) {
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(last_line(out), self.tokens, "{what}: TVM's greedy tokens");
        let (shape, got) = f32s(logits);
        let vocab = self.vocab;
        assert_eq!(shape, [self.steps.len() as u64, vocab as u64]);
        for (i, step) in self.steps.iter().enumerate() {
            let row = step["logit_rows"][0].as_u64().unwrap() as usize;
            let want = &self.reference[row * vocab..(row + 1) * vocab];
            let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff =
                got[i * vocab..(i + 1) * vocab].iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff <= 1e-4 * scale, "{what}, step {i}: logits differ by {diff}");
        }
    }
}

#[test]
fn generate_gives_tvms_tokens_and_logits() {
    let single = Single::load();
    let dir = tempfile::tempdir().unwrap();
    let weights = llm().join("params");
    let n = single.new_tokens();
    for (lib, extra) in [("llm_params.so", vec!["--weights", weights.to_str().unwrap()]), ("llm_consts.so", vec![])] {
        for threads in ["1", "2"] {
            let logits = dir.path().join(format!("{lib}.{threads}.npy"));
            let model = llm().join(lib);
            let mut args = vec![model.to_str().unwrap(), "--prompt-ids", &single.prompt];
            args.extend(["--max-new-tokens", &n, "--threads", threads, "--logits", logits.to_str().unwrap()]);
            args.extend(&extra);
            single.check(&format!("{lib} at {threads} threads"), &generate(&args), &logits);
        }
    }
}

/// `mblob generate --device opencl` with the fixture's model built for OpenCL
/// (`tests/fixtures/llm/device`), its weights uploaded to the device and the paged KV cache on
/// it: TVM's greedy tokens exactly and its logits (TVM's CPU run of the same model and weights)
/// within 1e-4 of max(1, max |logit|). Runs on the machine's OpenCL device (pocl in CI), as
/// `run_device.rs` does.
#[cfg(feature = "opencl")]
#[test]
fn generate_on_opencl_gives_tvms_tokens_and_logits() {
    let single = Single::load();
    let dir = tempfile::tempdir().unwrap();
    let logits = dir.path().join("opencl.npy");
    let model = llm().join("device/llm_params_opencl.so");
    let weights = llm().join("params");
    let out = generate(&[
        model.to_str().unwrap(),
        "--device",
        "opencl",
        "--weights",
        weights.to_str().unwrap(),
        "--prompt-ids",
        &single.prompt,
        "--max-new-tokens",
        &single.new_tokens(),
        "--logits",
        logits.to_str().unwrap(),
    ]);
    single.check("OpenCL", &out, &logits);
}

#[test]
fn generate_repeat_reports_per_token_time() {
    let model = llm().join("llm_consts.so");
    let out =
        generate(&[model.to_str().unwrap(), "--prompt-ids", "17,211,5", "--max-new-tokens", "4", "--repeat", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("decode, per token: 6 runs"), "{stdout}");
    assert!(stdout.contains("prefill of 3 tokens: 2 runs"), "{stdout}");
    assert_eq!(last_line(&out).split(',').count(), 4);
}

#[test]
fn generate_refuses_bad_requests_with_clear_errors() {
    let params = llm().join("llm_params.so");
    let consts = llm().join("llm_consts.so");
    let weights = llm().join("params");
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    let o = generate(&[params.to_str().unwrap(), "--prompt-ids", "1,2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("llm_params.so") && stderr(&o).contains("tensor cache"), "{}", stderr(&o));

    let o = generate(&[consts.to_str().unwrap(), "--weights", weights.to_str().unwrap(), "--prompt-ids", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bound into the library"), "{}", stderr(&o));

    // The context window is 128 (scenarios.json `config`).
    let long = vec!["1"; 120].join(",");
    let o = generate(&[consts.to_str().unwrap(), "--prompt-ids", &long, "--max-new-tokens", "10"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("129 positions") && stderr(&o).contains("128"), "{}", stderr(&o));

    let o = generate(&[consts.to_str().unwrap(), "--prompt-ids", "1,x"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // A shard 4 bytes shorter than tensor-cache.json says: TVM's check, naming the file.
    let dir = tempfile::tempdir().unwrap();
    for f in ["tensor-cache.json", "params_shard_0.bin", "params_shard_1.bin"] {
        std::fs::copy(weights.join(f), dir.path().join(f)).unwrap();
    }
    let shard = dir.path().join("params_shard_1.bin");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len - 4).unwrap();
    let o = generate(&[params.to_str().unwrap(), "--weights", dir.path().to_str().unwrap(), "--prompt-ids", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("params_shard_1.bin"), "{}", stderr(&o));
    assert!(stderr(&o).contains("corrupted parameter shard"), "{}", stderr(&o));
}

/// Token ids outside the vocabulary (256 ids, from the embedding weight's shape in
/// `_metadata`) are refused before anything runs, naming the id and the vocabulary size: they
/// gave garbage tokens (256, -1) or crashed the embedding kernel (100000, 2^31-1, -2^31).
#[test]
fn generate_refuses_token_ids_outside_the_vocabulary() {
    let params = llm().join("llm_params.so");
    let consts = llm().join("llm_consts.so");
    let weights = llm().join("params");
    for id in ["256", "-1", "100000", "2147483647", "-2147483648"] {
        for lib in [&params, &consts] {
            let prompt = format!("--prompt-ids=17,{id}");
            let mut args = vec![lib.to_str().unwrap(), prompt.as_str(), "--max-new-tokens", "2"];
            if lib == &params {
                args.extend(["--weights", weights.to_str().unwrap()]);
            }
            let o = generate(&args);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{id}: {stderr}");
            assert!(stderr.contains(&format!("token id {id} (prompt position 1)")), "{id}: {stderr}");
            assert!(stderr.contains("256 ids"), "{id}: {stderr}");
            assert!(o.stdout.is_empty(), "{id}: {}", String::from_utf8_lossy(&o.stdout));
        }
    }
    // The largest id is fine.
    let o = generate(&[consts.to_str().unwrap(), "--prompt-ids", "255", "--max-new-tokens", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `--max-new-tokens` near 2^64 is refused by the context check (it overflowed it), before
/// anything runs.
#[test]
fn generate_refuses_max_new_tokens_that_cannot_fit() {
    let consts = llm().join("llm_consts.so");
    for n in ["18446744073709551615", "18446744073709551614", "129"] {
        let o = generate(&[consts.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-new-tokens", n]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{n}: {stderr}");
        assert!(stderr.contains("context window") && stderr.contains("128"), "{n}: {stderr}");
    }
}

/// With `--repeat`, the token ids stay the last line when no decode step ran
/// (`--max-new-tokens 1`), and no prefill time is reported when no prefill ran (`0`).
#[test]
fn generate_repeat_reports_only_what_ran() {
    let model = llm().join("llm_consts.so");
    let single = Single::load();
    let first = single.tokens.split(',').next().unwrap().to_owned();
    let o =
        generate(&[model.to_str().unwrap(), "--prompt-ids", &single.prompt, "--max-new-tokens", "1", "--repeat", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(last_line(&o), first, "{stdout}");
    assert!(stdout.contains(&format!("prefill of {} tokens: 2 runs", single.prompt.split(',').count())), "{stdout}");
    assert!(!stdout.contains("decode"), "{stdout}");

    let o = generate(&[model.to_str().unwrap(), "--prompt-ids", "1,2", "--max-new-tokens", "0", "--repeat", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(!stdout.contains("prefill") && !stdout.contains("decode"), "{stdout}");
}

/// A shard that is a directory is reported as one, naming it, not as a shard of the wrong size.
#[test]
fn generate_reports_a_shard_that_is_a_directory() {
    let params = llm().join("llm_params.so");
    let weights = llm().join("params");
    let dir = tempfile::tempdir().unwrap();
    for f in ["tensor-cache.json", "params_shard_0.bin"] {
        std::fs::copy(weights.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::create_dir(dir.path().join("params_shard_1.bin")).unwrap();
    let o = generate(&[params.to_str().unwrap(), "--weights", dir.path().to_str().unwrap(), "--prompt-ids", "1"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("params_shard_1.bin") && stderr.to_lowercase().contains("is a directory"), "{stderr}");
    assert!(!stderr.contains("corrupted parameter shard"), "{stderr}");
}
