//! A C program linked statically with three models TVM built as `system-lib` objects
//! (`tests/fixtures/system-lib`: a TVM 0.19 graph model, a TVM 0.27 Relax model, the tiny LLM,
//! each under its own prefix) and the `libmblob.a` of this build (feature `system-lib`) runs
//! them with no `dlopen`: `examples/c/run_model.c` given `system://PREFIX` gives TVM's outputs
//! bit for bit, and `support/system_lib_checks.c` opens each prefix (the LLM's functions are
//! TVM's, its compiled embedding kernel, called on its tensor cache's table, gives TVM's
//! `embed` output, and `mblob_llm_generate` with its tensor cache gives TVM's greedy tokens and
//! refuses a token id past the vocabulary) and gets typed errors for a prefix nobody registered and for a symbol
//! registered twice. The program is linked with
//! `--wrap=dlopen,--wrap=dlmopen` to `support/no_dlopen.c`, which aborts: a run that succeeds
//! opened no library. It does not depend on `libmblob.so`.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/common.rs"]
mod common;
use common::npy;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/system-lib")
}

/// The profile directory of this build (`target/debug`): the test binary is in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The static library this build made (with the `system-lib` feature, as the test requires).
fn static_lib() -> PathBuf {
    let dir = profile_dir();
    [dir.join("deps/libmblob_capi.a"), dir.join("libmblob_capi.a")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libmblob_capi.a not built in {} or its deps/", dir.display()))
}

const MODELS: [&str; 3] = ["graph19", "relax27", "tinyllm"];

/// Links `sources` with every model's objects and `libmblob.a` into `exe`, with `dlopen` and
/// `dlmopen` wrapped to abort. `None` (with a message) when there is no C compiler.
fn link(work: &Path, sources: &[PathBuf], exe: &str) -> Option<PathBuf> {
    if !Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: no `cc` on PATH: no system-lib program built");
        return None;
    }
    std::fs::create_dir_all(work).unwrap();
    let exe = work.join(exe);
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-I"]).arg(repo().join("capi/include"));
    cmd.args(sources).arg(repo().join("capi/tests/support/no_dlopen.c"));
    for m in MODELS {
        cmd.arg(fixtures().join(format!("{m}.lib0.o"))).arg(fixtures().join(format!("{m}.devc.o")));
    }
    cmd.arg(static_lib());
    cmd.args(["-Wl,--wrap=dlopen", "-Wl,--wrap=dlmopen", "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl"]);
    let out = cmd.arg("-o").arg(&exe).output().unwrap();
    assert!(out.status.success(), "cc {exe:?}:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(exe)
}

/// The libraries the program asks the dynamic loader for (`DT_NEEDED`).
fn needed(exe: &Path) -> Vec<String> {
    let out = Command::new("readelf").arg("-d").arg(exe).output().expect("readelf (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1).and_then(|r| r.split(']').next()).map(str::to_owned))
        .collect()
}

fn facts(model: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join(format!("{model}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn run_model_runs_linked_models_with_tvm_outputs_and_no_dlopen() {
    let work = std::env::temp_dir().join(format!("mblob-capi-syslib-{}", std::process::id()));
    let Some(exe) = link(&work, &[repo().join("examples/c/run_model.c")], "run_model") else { return };
    let libs = needed(&exe);
    assert!(!libs.iter().any(|l| l.starts_with("libmblob")), "the program needs {libs:?}");
    for model in ["graph19", "relax27"] {
        let f = facts(model);
        let out_dir = work.join(model);
        std::fs::create_dir_all(&out_dir).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.arg(format!("system://{}", f["prefix"].as_str().unwrap()));
        if let Some(function) = f["function"].as_str() {
            cmd.args(["--function", function]);
        }
        for input in f["inputs"].as_array().unwrap() {
            let name = input.as_str().unwrap();
            cmd.arg(format!("{name}={}", fixtures().join(format!("{model}.{name}.npy")).display()));
        }
        let run = cmd.arg("-o").arg(&out_dir).output().unwrap();
        assert!(run.status.success(), "run_model {model}:\n{}", String::from_utf8_lossy(&run.stderr));
        let want = npy(&fixtures().join(format!("{model}.out0.npy")));
        let got = npy(&out_dir.join("out.0.npy"));
        assert_eq!((got.code, got.bits, &got.shape), (want.code, want.bits, &want.shape), "{model}: dtype and shape");
        assert!(got.data == want.data, "{model}: output bytes differ from TVM's");
        assert!(!out_dir.join("out.1.npy").exists(), "{model}: more outputs than TVM's");
    }
    // A prefix no model registered: a typed error (status 4, MBLOB_ERR_LOAD), not a crash.
    let run = Command::new(&exe).args(["system://nosuchmodel_", "-o"]).arg(&work).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("(status 4)") && stderr.contains("no system library with prefix `nosuchmodel_`"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&work).ok();
}

#[test]
fn each_prefix_opens_and_bad_prefixes_are_typed_errors() {
    let work = std::env::temp_dir().join(format!("mblob-capi-syslib-checks-{}", std::process::id()));
    let Some(exe) = link(&work, &[repo().join("capi/tests/support/system_lib_checks.c")], "checks") else {
        return;
    };
    let prefixes: Vec<String> = MODELS.iter().map(|m| facts(m)["prefix"].as_str().unwrap().to_owned()).collect();
    // The LLM's embedding kernel on its table from the tensor cache (TVM's `tensor-cache.json`
    // says where), on TVM's prompt.
    let llm = facts("tinyllm");
    let cache = fixtures().join(llm["tensor_cache"].as_str().unwrap());
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("tensor-cache.json")).unwrap()).unwrap();
    let (shard, table) = index["records"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|r| {
            let t = r["records"].as_array()?.iter().find(|t| t["name"] == "model.embed_tokens.weight")?;
            Some((r["dataPath"].as_str()?.to_owned(), t.clone()))
        })
        .expect("the embedding table in the tensor cache");
    assert_eq!((table["dtype"].as_str(), table["format"].as_str()), (Some("float32"), Some("raw")));
    let tokens: Vec<String> = llm["prompt"].as_array().unwrap().iter().map(|t| t.to_string()).collect();
    let embed_out = work.join("embed.bin");
    let run = Command::new(&exe)
        .args(&prefixes)
        .arg("--embed")
        .arg(cache.join(shard))
        .arg(table["byteOffset"].to_string())
        .arg(table["shape"][0].to_string())
        .arg(table["shape"][1].to_string())
        .arg(&embed_out)
        .arg(tokens.join(","))
        .arg("--generate")
        .arg(&cache)
        .arg(llm["tokens"].as_array().unwrap().len().to_string())
        .arg(tokens.join(","))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let line =
        |start: &str| stdout.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {stdout}"));
    // The LLM and the Relax model list the functions TVM's VM has (functions.json of
    // tests/fixtures/llm, made by TVM, for the same model built as a shared library).
    let llm: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("tests/fixtures/llm/functions.json")).unwrap())
            .unwrap();
    let mut want: Vec<&str> =
        llm["llm_params.so"]["vm_functions"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let mut got: Vec<&str> = line("tinyllm_ functions ").trim_start_matches("tinyllm_ functions ").split(',').collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "the linked LLM's functions");
    assert_eq!(line("relaxmodel27_ "), "relaxmodel27_ functions main");
    assert_eq!(line("embed "), format!("embed {}", tokens.len()));
    let want = npy(&fixtures().join("tinyllm.embed.npy"));
    assert_eq!(want.shape, [tokens.len() as i64, table["shape"][1].as_i64().unwrap()], "TVM's embed shape");
    assert!(std::fs::read(&embed_out).unwrap() == want.data, "the LLM's embedding kernel differs from TVM's embed");
    // Generation with the linked LLM gives TVM's greedy tokens (one per step of its run), and
    // a token id past the vocabulary is refused (status 6, MBLOB_ERR_INPUT) naming it.
    let llm = facts("tinyllm");
    let want: Vec<String> = llm["tokens"].as_array().unwrap().iter().map(|t| t[0].to_string()).collect();
    assert_eq!(line("generate "), format!("generate {}", want.join(",")), "TVM's tokens");
    let badid = line("badid ");
    assert!(
        badid.starts_with(&format!("badid 6 token id 256 (prompt position {})", tokens.len() - 1))
            && badid.contains("the vocabulary has 256 ids"),
        "{badid}"
    );
    assert!(line("graph19_ ").starts_with("graph19_ kind "), "{stdout}");
    let missing = line("missing ");
    assert!(missing.starts_with("missing 4 no system library with prefix `nosuchmodel_`"), "{missing}");
    for p in &prefixes {
        assert!(missing.contains(&format!("`{p}`")), "the error names the linked prefixes: {missing}");
    }
    let conflict = line("conflict ");
    assert!(
        conflict.starts_with(
            "conflict -1 4 system library `graph19_`: symbol `graph19___tvm_module_ctx` was registered twice"
        ),
        "{conflict}"
    );
    std::fs::remove_dir_all(&work).ok();
}
