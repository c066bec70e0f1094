//! Runs the models linked into this program (see build.rs) with mblob-runtime alone, and
//! checks them against TVM's outputs (`tests/fixtures/system-lib`, TVM running its own system
//! library): the Relax model's output, and the tiny LLM's greedy tokens and logits. Exits 1,
//! saying what differs, when anything does; a prefix the program does not hold is a typed
//! error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};
use mblob_runtime::exec::{Model, Value};
use mblob_runtime::{load_system_lib, Device, Error, LoadOptions, NdArray, Registry, SystemLibError};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/system-lib")
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The float32 data and shape of a `.npy` file of the fixtures.
fn npy(name: &str) -> Result<(Vec<f32>, Vec<i64>)> {
    let bytes = std::fs::read(fixtures().join(name))?;
    let file = npyz::NpyFile::new(&bytes[..])?;
    let shape = file.shape().iter().map(|&d| d as i64).collect();
    Ok((file.into_vec::<f32>()?, shape))
}

fn facts(model: &str) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(fixtures().join(format!("{model}.json")))?)?)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

fn relax() -> Result<()> {
    let tree = load_system_lib("relaxmodel27_", &Registry::default(), &LoadOptions::default())?;
    let mut model = Model::new(&tree, Device::cpu(0))?;
    let mut args = Vec::new();
    for name in ["x", "y"] {
        let (data, shape) = npy(&format!("relax27.{name}.npy"))?;
        args.push(Value::Tensor(NdArray::from_f32(&data, &shape, Device::cpu(0))?));
    }
    let Value::Tensor(out) = model.call_function("main", args)? else { return Err("main returned no tensor".into()) };
    let got = out.to_f32()?.ok_or("not float32")?;
    let (want, shape) = npy("relax27.out0.npy")?;
    if out.shape() != shape.as_slice() || got != want {
        return Err(format!("relax27: {got:?} (shape {:?}), TVM gave {want:?} (shape {shape:?})", out.shape()).into());
    }
    println!("relax27 (system://relaxmodel27_): output equal to TVM's");
    Ok(())
}

fn llm() -> Result<()> {
    let f = facts("tinyllm")?;
    let tree = load_system_lib("tinyllm_", &Registry::default(), &LoadOptions::default())?;
    let weights = fixtures().join(f["tensor_cache"].as_str().ok_or("no tensor_cache")?);
    let mut lm = LanguageModel::new(&tree, Device::cpu(0), Some(&weights), &GenerateOptions::default())?;
    let prompt: Vec<i32> =
        f["prompt"].as_array().ok_or("no prompt")?.iter().filter_map(|v| v.as_i64()).map(|t| t as i32).collect();
    let want: Vec<i32> =
        f["tokens"].as_array().ok_or("no tokens")?.iter().filter_map(|v| v[0].as_i64()).map(|t| t as i32).collect();
    let out = lm.generate(&prompt, want.len())?;
    if out.tokens != want {
        return Err(format!("tinyllm tokens {:?}, TVM's {want:?}", out.tokens).into());
    }
    let (logits, _) = npy("tinyllm.logits.npy")?;
    let got: Vec<f32> = out.logits.concat();
    let diff = max_diff(&got, &logits);
    if got.len() != logits.len() || diff > 1e-4 {
        return Err(
            format!("tinyllm logits differ from TVM's by {diff} ({} vs {} values)", got.len(), logits.len()).into()
        );
    }
    println!("tinyllm (system://tinyllm_): {} tokens equal to TVM's, logits within {diff:e}", want.len());
    Ok(())
}

fn missing() -> Result<()> {
    match load_system_lib("nosuchmodel_", &Registry::default(), &LoadOptions::default()) {
        Err(Error::SystemLib(SystemLibError::NotLinked { prefix, held })) if prefix == "nosuchmodel_" => {
            let want = ["relaxmodel27_", "tinyllm_"];
            if held != want {
                return Err(format!("prefixes held: {held:?}, want {want:?}").into());
            }
            println!("system://nosuchmodel_: refused (held: {held:?})");
            Ok(())
        }
        Err(e) => Err(format!("system://nosuchmodel_: unexpected error {e}").into()),
        Ok(_) => Err("system://nosuchmodel_ opened".into()),
    }
}

fn main() -> ExitCode {
    let mut ok = true;
    for (name, check) in [("relax", relax as fn() -> Result<()>), ("llm", llm), ("missing", missing)] {
        if let Err(e) = check() {
            eprintln!("{name}: {e}");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
