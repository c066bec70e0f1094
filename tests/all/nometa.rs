//! `mblob generate` on a library without `_metadata` (tests/fixtures/nnllm, README there):
//! the options give what the metadata would, `--then-prompt-ids` continues the sequences in the
//! same cache (through `extend`/`batch_extend`, as MLC-LLM's engine), and the tokens and every
//! step's logits are TVM 0.27's (`reference.json`: its VM driven as the engine drives it),
//! within 1e-4 of max(1, max |ref|).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nnllm")
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> String {
    v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap().to_string()).collect::<Vec<_>>().join(",")
}

fn f32s(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    (f.shape().to_vec(), f.into_vec::<f32>().unwrap())
}

fn generate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob"))
        .arg("generate")
        .arg(dir().join("lib.so"))
        .arg("--weights")
        .arg(dir().join("params"))
        .args(args)
        .output()
        .expect("run mblob")
}

fn close(what: &str, got: &[f32], want: &[f32], vocab: usize) {
    assert_eq!(got.len(), want.len(), "{what}: logits shape");
    for (step, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4 * scale, "{what}, step {step}: logits differ from TVM's by {diff}");
    }
}

#[test]
fn two_turns_without_metadata_give_tvms_tokens_and_logits() {
    let r = reference();
    let turns = r["scenarios"]["multi_turn"]["turns"].as_array().unwrap().clone();
    let tmp = std::env::temp_dir().join(format!("mblob-nometa-cli-{}.npy", std::process::id()));
    let (p1, p2) = (ids(&turns[0]["prompt"]), ids(&turns[1]["prompt"]));
    let out = generate(&[
        "--context-window",
        "128",
        "--prefill-chunk",
        "32",
        "--max-batch-size",
        "4",
        "--prompt-ids",
        &p1,
        "--then-prompt-ids",
        &p2,
        "--max-new-tokens",
        "6",
        "--logits",
        tmp.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, [ids(&turns[0]["tokens"]), ids(&turns[1]["tokens"])], "TVM's tokens, one line per turn");
    let (shape, got) = f32s(&tmp);
    let _ = std::fs::remove_file(&tmp);
    let (want_shape, want) = f32s(&dir().join(r["scenarios"]["multi_turn"]["logits"].as_str().unwrap()));
    assert_eq!(shape, want_shape);
    close("multi_turn", &got, &want, shape[1] as usize);
}

#[test]
fn a_batch_continued_from_the_cli_gives_tvms_tokens() {
    let r = reference();
    let turns = r["scenarios"]["batch_turns"]["turns"].as_array().unwrap().clone();
    let p = |t: usize, i: usize| ids(&turns[t]["prompts"][i]);
    let (a, b, c, d) = (p(0, 0), p(0, 1), p(1, 0), p(1, 1));
    let out = generate(&[
        "--context-window",
        "128",
        "--prefill-chunk-size",
        "32",
        "--max-batch-size",
        "4",
        "--max-new-tokens",
        "4",
        "--prompt-ids",
        &a,
        "--prompt-ids",
        &b,
        "--then-prompt-ids",
        &c,
        "--then-prompt-ids",
        &d,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want: Vec<String> =
        (0..2).flat_map(|t| (0..2).map(move |i| (t, i))).map(|(t, i)| ids(&turns[t]["tokens"][i])).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), want);
    // Further turns split into one prompt per sequence.
    let out = generate(&["--context-window", "128", "--prompt-ids", &a, "--prompt-ids", &b, "--then-prompt-ids", &c]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_missing_setting_is_named() {
    let out = generate(&["--prompt-ids", "1,2,3"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--context-window") && err.contains("_metadata"), "{err}");
    let out = generate(&["--context-window", "-1", "--prompt-ids", "1,2,3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-total-seq-len"));
    // A prompt longer than the cache.
    let long: Vec<String> = (0..129).map(|i| i.to_string()).collect();
    let out = generate(&["--context-window", "128", "--prompt-ids", &long.join(",")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("context window"));
}
