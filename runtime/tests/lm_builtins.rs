//! TVM's LLM builtins other than the paged KV cache (`exec::llm::lm`), called directly and
//! compared with what TVM 0.27 gave for the same calls (tests/fixtures/llm, see its README):
//! the tensor cache of build A's weights against the shard bytes TVM wrote and the prompt
//! embedding TVM's `embed` computed from them, and TVM's errors for bad caches; every case
//! of `sampling.json` against TVM's results (bitwise) and its errors; every step of
//! `legacy_kv_cache.json` against TVM's views (bitwise) and its errors.
#![cfg(feature = "llm")]

use std::path::{Path, PathBuf};

use std::sync::Mutex;

use mblob_runtime::exec::llm::lm::{legacy_kv, sampling, tensor_cache, AttentionKvCacheLegacy, TensorCache};
use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::format::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};

#[path = "support/npyfile.rs"]
mod npyfile;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::{Host, HostCalls};

/// Held by the tests of the process-wide tensor cache (tests run in parallel).
static GLOBAL_CACHE: Mutex<()> = Mutex::new(());

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm")
}

fn json(name: &str) -> serde_json::Value {
    let path = dir().join(name);
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// A `.npy` file of the fixture as a CPU tensor.
fn npy(file: &str) -> NdArray {
    let t = npyfile::tensor(&dir().join(file));
    NdArray::from_bytes(&t.data, &t.shape, t.dtype, Device::cpu(0)).unwrap()
}

fn f64s_of(a: &NdArray) -> Vec<f64> {
    a.to_bytes().unwrap().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Asserts that two tensors have the same dtype, shape and bytes.
fn assert_same(what: &str, got: &NdArray, want: &NdArray) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert!(got.to_bytes().unwrap() == want.to_bytes().unwrap(), "{what}: bytes differ from TVM's");
}

/// A fresh scratch directory for this test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mblob-lm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A copy of the fixture's tensor cache in a scratch directory.
fn params_copy(name: &str) -> PathBuf {
    let d = scratch(name);
    for f in ["tensor-cache.json", "params_shard_0.bin", "params_shard_1.bin"] {
        std::fs::copy(dir().join("params").join(f), d.join(f)).unwrap();
    }
    d
}

fn error_case(name: &str) -> serde_json::Value {
    json("errors.json")["cases"][name]["error"].clone()
}

fn param_names() -> Vec<String> {
    json("scenarios.json")["param_names"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
}

#[test]
fn tensor_cache_holds_tvms_weights() {
    let params = dir().join("params");
    let mut cache = TensorCache::new();
    cache.load(&params, Device::cpu(0)).unwrap();
    let meta = json("params/tensor-cache.json");
    let mut count = 0;
    for shard in meta["records"].as_array().unwrap() {
        let bytes = std::fs::read(params.join(shard["dataPath"].as_str().unwrap())).unwrap();
        for rec in shard["records"].as_array().unwrap() {
            let name = rec["name"].as_str().unwrap();
            let a = cache.get(name).unwrap_or_else(|| panic!("{name} not loaded"));
            let shape: Vec<i64> = rec["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
            assert_eq!(a.shape(), shape, "{name}");
            assert_eq!(a.dtype().to_string(), rec["dtype"].as_str().unwrap(), "{name}");
            let off = rec["byteOffset"].as_u64().unwrap() as usize;
            let n = rec["nbytes"].as_u64().unwrap() as usize;
            assert!(a.to_bytes().unwrap() == bytes[off..off + n], "{name}: not the shard's bytes");
            count += 1;
        }
    }
    assert_eq!(count, 15);
    assert_eq!(cache.len(), 15);
    // Every record of TVM's shards starts 64-byte aligned: all stay views of the mapping.
    for name in cache.names() {
        assert!(cache.get(name).unwrap().storage().is_file_mapped(), "{name} was copied");
    }

    // The model's order, as MLC-LLM asks for it; the embedding rows of the prompt are what
    // TVM's `embed` computed from these weights.
    let names = param_names();
    let arr = cache.param_array_by_name(&names).unwrap();
    assert_eq!(arr.len(), names.len());
    let embed = &arr[0];
    assert_eq!(embed.shape(), [256, 64]);
    let scen = json("scenarios.json");
    let tokens: Vec<usize> =
        scen["embed"]["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as usize).collect();
    assert_eq!(tokens, [17, 211, 5, 98, 140, 33, 251]);
    let want = npy(scen["embed"]["output"].as_str().unwrap());
    let table = embed.to_bytes().unwrap();
    let rows: Vec<u8> = tokens.iter().flat_map(|&t| table[t * 256..(t + 1) * 256].to_vec()).collect();
    assert_eq!(want.shape(), [7, 64]);
    assert!(rows == want.to_bytes().unwrap(), "embedding rows differ from TVM's embed output");

    // A weight that stays a view of its shard is still writable (copy-on-write), and the
    // file is untouched.
    let norm = cache.get("model.norm.weight").unwrap();
    norm.copy_from_bytes(&vec![0u8; norm.nbytes()]).unwrap();
    assert!(norm.to_bytes().unwrap().iter().all(|&b| b == 0));
    let mut fresh = TensorCache::new();
    fresh.load(&params, Device::cpu(0)).unwrap();
    assert!(fresh.get("model.norm.weight").unwrap().to_bytes().unwrap().iter().any(|&b| b != 0));

    let err = cache.param_array_by_name(&["model.embed_tokens.weight", "no.such.weight"]).unwrap_err();
    let tvm = error_case("param_not_in_cache");
    assert_eq!(err.to_string(), tvm["message"].as_str().unwrap());
    assert_eq!(err.tvm_kind(), tvm["kind"].as_str().unwrap());
}

#[test]
fn global_tensor_cache_builtins() {
    let _global = GLOBAL_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    tensor_cache::tensor_cache_clear();
    tensor_cache::tensor_cache_load(&dir().join("params"), 1, 0).unwrap();
    let names = param_names();
    let arr = tensor_cache::param_array_from_cache_by_name(&names).unwrap();
    assert_eq!(arr.len(), 15);
    assert_eq!(arr[14].shape(), [256, 64]);
    let err =
        tensor_cache::param_array_from_cache_by_name(&["model.embed_tokens.weight", "no.such.weight"]).unwrap_err();
    assert_eq!(err.to_string(), error_case("param_not_in_cache")["message"].as_str().unwrap());

    let x = npy("builtins/logits.npy");
    tensor_cache::tensor_cache_update("w_0", x.clone(), None).unwrap();
    tensor_cache::tensor_cache_update("w_1", x.clone(), Some(false)).unwrap();
    assert!(tensor_cache::tensor_cache_update("w_1", x.clone(), None)
        .unwrap_err()
        .to_string()
        .contains("already exists"));
    tensor_cache::tensor_cache_update("w_1", x.clone(), Some(true)).unwrap();
    assert_eq!(tensor_cache::param_array_from_cache("w", -1).unwrap().len(), 2);
    assert_eq!(tensor_cache::param_array_from_cache("w", 2).unwrap().len(), 2);
    assert_eq!(tensor_cache::param_array_from_cache("w", 3).unwrap_err().to_string(), "Cannot find w_2 in cache");
    tensor_cache::tensor_cache_remove("w_1");
    assert!(tensor_cache::tensor_cache_get("w_1").is_none());
    assert_eq!(tensor_cache::param_array_from_cache_by_name_unpacked(&["w_0"]).unwrap().len(), 1);
    tensor_cache::tensor_cache_clear();
    assert!(tensor_cache::tensor_cache_get("model.norm.weight").is_none());
}

/// The cache with each shard shifted by `pad` bytes (the JSON's offsets and sizes to match).
fn shifted_cache(name: &str, pad: usize) -> PathBuf {
    let d = scratch(name);
    let mut meta = json("params/tensor-cache.json");
    for shard in meta["records"].as_array_mut().unwrap() {
        let file = shard["dataPath"].as_str().unwrap().to_owned();
        let mut bytes = vec![0xA5u8; pad];
        bytes.extend(std::fs::read(dir().join("params").join(&file)).unwrap());
        std::fs::write(d.join(&file), &bytes).unwrap();
        shard["nbytes"] = (bytes.len() as u64).into();
        for rec in shard["records"].as_array_mut().unwrap() {
            rec["byteOffset"] = (rec["byteOffset"].as_u64().unwrap() + pad as u64).into();
        }
    }
    std::fs::write(d.join("tensor-cache.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    d
}

#[test]
fn tensor_cache_copies_unaligned_weights() {
    // Shifted by 4 bytes, no weight starts aligned: each is copied once into its own tensor,
    // with TVM's bytes (the embedding rows are still those of TVM's `embed`).
    let d = shifted_cache("unaligned", 4);
    let mut cache = TensorCache::new();
    cache.load(&d, Device::cpu(0)).unwrap();
    let mut reference = TensorCache::new();
    reference.load(&dir().join("params"), Device::cpu(0)).unwrap();
    for name in param_names() {
        let a = cache.get(&name).unwrap();
        assert!(!a.storage().is_file_mapped(), "{name} is a view of a misaligned record");
        assert_eq!(a.storage().ptr().0 % 64, 0, "{name}");
        assert!(a.to_bytes().unwrap() == reference.get(&name).unwrap().to_bytes().unwrap(), "{name}");
    }
    let table = cache.get("model.embed_tokens.weight").unwrap().to_bytes().unwrap();
    let rows: Vec<u8> =
        [17usize, 211, 5, 98, 140, 33, 251].iter().flat_map(|&t| table[t * 256..(t + 1) * 256].to_vec()).collect();
    assert!(rows == npy("embed.prompt.npy").to_bytes().unwrap());
    // Shifted by 64, all are aligned again and stay views.
    let d64 = shifted_cache("aligned64", 64);
    let mut cache = TensorCache::new();
    cache.load(&d64, Device::cpu(0)).unwrap();
    assert!(cache.get("lm_head.weight").unwrap().storage().is_file_mapped());
    let _ = std::fs::remove_dir_all(d);
    let _ = std::fs::remove_dir_all(d64);
}

#[test]
fn tensor_cache_decodes_bf16_records() {
    // `f32-to-bf16`: each float32 stored as its upper 16 bits, which TVM's loader shifts back
    // (`ParamRecord::Load`). Encoded here by truncating TVM's weights, so the loaded values are
    // TVM's with the low 16 bits cleared.
    let d = scratch("bf16");
    let mut meta = json("params/tensor-cache.json");
    let mut reference = TensorCache::new();
    reference.load(&dir().join("params"), Device::cpu(0)).unwrap();
    for shard in meta["records"].as_array_mut().unwrap() {
        let mut bytes = Vec::new();
        for rec in shard["records"].as_array_mut().unwrap() {
            let w = reference.get(rec["name"].as_str().unwrap()).unwrap().to_bytes().unwrap();
            rec["byteOffset"] = (bytes.len() as u64).into();
            rec["nbytes"] = (w.len() as u64 / 2).into();
            rec["format"] = "f32-to-bf16".into();
            bytes.extend(w.chunks_exact(4).flat_map(|c| [c[2], c[3]]));
        }
        shard["nbytes"] = (bytes.len() as u64).into();
        std::fs::write(d.join(shard["dataPath"].as_str().unwrap()), &bytes).unwrap();
    }
    std::fs::write(d.join("tensor-cache.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    let mut cache = TensorCache::new();
    cache.load(&d, Device::cpu(0)).unwrap();
    for name in param_names() {
        let got = cache.get(&name).unwrap().to_bytes().unwrap();
        let want: Vec<u8> = reference
            .get(&name)
            .unwrap()
            .to_bytes()
            .unwrap()
            .chunks_exact(4)
            .flat_map(|c| [0, 0, c[2], c[3]])
            .collect();
        assert!(got == want, "{name}");
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn tensor_cache_reads_per_name_formats_and_quantized_records() {
    // tests/fixtures/mlc/tensor_cache: written by TVM 0.27's `dump_tensor_cache` with a format
    // per name (`"*": "f32-to-bf16"`, two names `raw`), so float16, uint32 and bfloat16 records
    // carry `f32-to-bf16` as MLC-LLM's quantized weights do. Each tensor equals, dtype, shape
    // and bytes, what TVM's C++ loader (`vm.builtin.tensor_cache.load`) read back.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc/tensor_cache");
    let loaded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("loaded.json")).unwrap()).unwrap();
    let mut cache = TensorCache::new();
    cache.load(&fixture, Device::cpu(0)).unwrap();
    let tensors = loaded["tensors"].as_object().unwrap();
    assert_eq!(cache.len(), tensors.len());
    for (name, info) in tensors {
        let got = cache.get(name).unwrap_or_else(|| panic!("{name} not loaded"));
        let want = npyfile::tensor(&fixture.join(format!("loaded.{name}.npy")));
        assert_eq!(got.dtype(), DataType::parse(info["dtype"].as_str().unwrap()).unwrap(), "{name}: dtype");
        assert_eq!(got.shape(), &want.shape[..], "{name}: shape");
        assert!(got.to_bytes().unwrap()[..] == want.data[..], "{name}: bytes differ from TVM's");
    }
}

#[test]
fn tensor_cache_refuses_bad_caches() {
    // A shard four bytes short: TVM's check, naming the file.
    let d = params_copy("short");
    let shard = d.join("params_shard_1.bin");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len - 4).unwrap();
    let err = TensorCache::new().load(&d, Device::cpu(0)).unwrap_err();
    let tvm = error_case("tensor_cache_short_shard");
    let msg = err.to_string();
    assert!(msg.contains(tvm["message"].as_str().unwrap()), "{msg}");
    assert!(msg.contains(&shard.display().to_string()), "{msg}");
    assert_eq!(err.tvm_kind(), tvm["kind"].as_str().unwrap());
    // Nothing of the first shard was added to the global cache either.
    {
        let _global = GLOBAL_CACHE.lock().unwrap_or_else(|e| e.into_inner());
        tensor_cache::tensor_cache_clear();
        assert!(tensor_cache::tensor_cache_load(&d, 1, 0).is_err());
        assert!(tensor_cache::tensor_cache_get("model.embed_tokens.weight").is_none());
    }

    // A missing shard.
    std::fs::remove_file(&shard).unwrap();
    let err = TensorCache::new().load(&d, Device::cpu(0)).unwrap_err();
    let tvm = error_case("tensor_cache_missing_shard");
    let check = tvm["check"].as_str().unwrap().replace("DIR", &d.display().to_string());
    assert!(err.to_string().contains(&check), "{err}");
    assert_eq!(err.tvm_kind(), tvm["kind"].as_str().unwrap());

    // Not JSON, and JSON of another shape: errors naming the file.
    let json_path = d.join("tensor-cache.json");
    std::fs::write(&json_path, b"{\"records\": [").unwrap();
    let err = TensorCache::new().load(&d, Device::cpu(0)).unwrap_err();
    assert!(err.to_string().contains(&json_path.display().to_string()) && err.to_string().contains("JSON"), "{err}");
    std::fs::write(&json_path, br#"{"records": [{"dataPath": 3}]}"#).unwrap();
    let err = TensorCache::new().load(&d, Device::cpu(0)).unwrap_err();
    assert!(err.to_string().contains("dataPath"), "{err}");

    // A record past its shard's end, an absurd shape, an encoding mblob does not know.
    let d = params_copy("records");
    let original = std::fs::read_to_string(dir().join("params/tensor-cache.json")).unwrap();
    let edits = [
        ("\"byteOffset\": 164608", "\"byteOffset\": 9223372036854775807", "outside the shard"),
        ("\"byteOffset\": 164608", "\"byteOffset\": 164612", "outside the shard"),
        ("\"nbytes\": 65536,\n                    \"byteOffset\": 164608", "\"nbytes\": 1,\n                    \"byteOffset\": 164608", "needs 65536 bytes"),
        ("[\n                        256,\n                        64\n                    ],\n                    \"dtype\": \"float32\",\n                    \"format\": \"raw\",\n                    \"nbytes\": 65536,\n                    \"byteOffset\": 164608",
         "[\n                        9223372036854775807,\n                        64\n                    ],\n                    \"dtype\": \"float32\",\n                    \"format\": \"raw\",\n                    \"nbytes\": 65536,\n                    \"byteOffset\": 164608", "not a valid tensor shape"),
        ("\"format\": \"raw\",\n                    \"nbytes\": 65536,\n                    \"byteOffset\": 164608", "\"format\": \"f16-to-i8\",\n                    \"nbytes\": 65536,\n                    \"byteOffset\": 164608", "unsupported encode format \"f16-to-i8\""),
    ];
    for (from, to, want) in edits {
        assert!(original.contains(from), "{from}");
        std::fs::write(d.join("tensor-cache.json"), original.replace(from, to)).unwrap();
        let err = TensorCache::new().load(&d, Device::cpu(0)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(want) && msg.contains("lm_head.weight"), "{to}: {msg}");
    }
    let _ = std::fs::remove_dir_all(d);
}

/// A sampling case's argument: a tensor of the fixture, or a number.
enum Arg {
    Tensor(NdArray),
    Num(f64),
}

fn args(case: &serde_json::Value) -> Vec<Arg> {
    case["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| match a["tensor"].as_str() {
            Some(f) => Arg::Tensor(npy(f)),
            None => Arg::Num(a.as_f64().unwrap()),
        })
        .collect()
}

fn t(a: &Arg) -> &NdArray {
    match a {
        Arg::Tensor(x) => x,
        Arg::Num(_) => panic!("expected a tensor"),
    }
}

fn n(a: &Arg) -> f64 {
    match a {
        Arg::Num(x) => *x,
        Arg::Tensor(_) => panic!("expected a number"),
    }
}

#[test]
fn sampling_builtins_give_tvms_results() {
    let fixture = json("sampling.json");
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 77);
    for (i, case) in cases.iter().enumerate() {
        let builtin = case["builtin"].as_str().unwrap();
        let a = args(case);
        let what = format!("case {i}: {builtin} {}", case["args"]);
        match builtin {
            "vm.builtin.sample_top_p_from_logits" => {
                let got = sampling::sample_top_p_from_logits(t(&a[0]), n(&a[1]), n(&a[2]), n(&a[3])).unwrap();
                assert_eq!(i64::from(got), case["result"]["int"].as_i64().unwrap(), "{what}");
            }
            "vm.builtin.sample_top_p_from_prob" => {
                let got = sampling::sample_top_p_from_prob(t(&a[0]), n(&a[1]), n(&a[2])).unwrap();
                assert_eq!(got, case["result"]["int"].as_i64().unwrap(), "{what}");
            }
            "vm.builtin.multinomial_from_uniform" => {
                let got = sampling::multinomial_from_uniform(t(&a[0]), t(&a[1])).unwrap();
                assert_same(&what, &got, &npy(case["result"]["tensor"].as_str().unwrap()));
            }
            _ => {
                // In place on argument 0.
                assert_eq!(case["in_place"].as_i64(), Some(0), "{what}");
                match builtin {
                    "vm.builtin.apply_repetition_penalty" => {
                        sampling::apply_repetition_penalty(t(&a[0]), t(&a[1]), n(&a[2])).unwrap()
                    }
                    "vm.builtin.apply_presence_and_frequency_penalty" => {
                        sampling::apply_presence_and_frequency_penalty(t(&a[0]), t(&a[1]), t(&a[2]), n(&a[3]), n(&a[4]))
                            .unwrap()
                    }
                    "vm.builtin.apply_softmax_with_temperature" => {
                        sampling::apply_softmax_with_temperature(t(&a[0]), n(&a[1])).unwrap()
                    }
                    other => panic!("{other}: no such case"),
                }
                assert_same(&what, t(&a[0]), &npy(case["result"]["tensor"].as_str().unwrap()));
            }
        }
    }
}

#[test]
fn sampling_builtins_fail_as_tvm_does() {
    let fixture = json("sampling.json");
    let logits = || npy("builtins/logits.npy");
    let ids64 = {
        let ids = npy("builtins/token_ids.npy");
        let v: Vec<u8> = ids
            .to_bytes()
            .unwrap()
            .chunks_exact(4)
            .flat_map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())).to_le_bytes())
            .collect();
        NdArray::from_bytes(&v, ids.shape(), DataType::I64, Device::cpu(0)).unwrap()
    };
    let nan = NdArray::from_f32(&[f32::NAN; 256], &[1, 256], Device::cpu(0)).unwrap();
    let f64_logits = {
        let v: Vec<u8> = logits().to_f32().unwrap().unwrap().iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect();
        NdArray::from_bytes(&v, &[1, 256], DataType { code: 2, bits: 64, lanes: 1 }, Device::cpu(0)).unwrap()
    };
    let before = logits().to_bytes().unwrap();
    for case in fixture["errors"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let target = logits();
        let err = match name {
            "sample_top_p_from_logits_batch2" => {
                sampling::sample_top_p_from_logits(&npy("builtins/logits2.npy"), 1.0, 0.9, 0.5).map(|_| ())
            }
            "sample_top_p_from_prob_batch2" => {
                sampling::sample_top_p_from_prob(&npy("builtins/prob2.npy"), 0.9, 0.5).map(|_| ())
            }
            "sample_top_p_from_prob_nan" => sampling::sample_top_p_from_prob(&nan, 0.9, 0.5).map(|_| ()),
            "repetition_penalty_int64_ids" => sampling::apply_repetition_penalty(&target, &ids64, 1.3),
            "softmax_float64" => sampling::apply_softmax_with_temperature(&f64_logits, 1.0),
            other => panic!("{other}: no such case"),
        }
        .unwrap_err();
        let msg = err.to_string();
        let tvm = &case["error"];
        assert!(msg.contains(tvm["check"].as_str().unwrap()), "{name}: {msg}");
        if name.ends_with("batch2") || name.ends_with("nan") {
            assert!(msg.contains(tvm["message"].as_str().unwrap()), "{name}: {msg}");
        }
        assert_eq!(err.tvm_kind(), tvm["kind"].as_str().unwrap(), "{name}");
        assert!(target.to_bytes().unwrap() == before, "{name}: the logits changed");
    }

    // What TVM leaves unchecked (it reads or writes out of bounds) is an error here.
    let ids = NdArray::from_bytes(&[0, 1, 0, 0], &[1], DataType::I32, Device::cpu(0)).unwrap();
    let target = logits();
    let err = sampling::apply_repetition_penalty(&target, &ids, 1.3).unwrap_err();
    assert!(err.to_string().contains("token id 256"), "{err}");
    assert!(target.to_bytes().unwrap() == before);
    let short = NdArray::from_f32(&[0.5], &[1, 1], Device::cpu(0)).unwrap();
    assert!(sampling::multinomial_from_uniform(&npy("builtins/prob2.npy"), &short).is_err());
    // An empty vocabulary: no token to return (TVM reads past the end), an "all NaN"
    // distribution to TVM's `sample_top_p_from_prob`, nothing to normalise; a 0-d tensor has
    // no last dimension (TVM reads before its shape).
    let empty = NdArray::from_f32(&[], &[1, 0], Device::cpu(0)).unwrap();
    assert!(sampling::sample_top_p_from_logits(&empty, 1.0, 0.9, 0.5).is_err());
    assert!(matches!(sampling::sample_top_p_from_prob(&empty, 0.9, 0.5), Err(sampling::SamplingError::AllNan)));
    sampling::apply_softmax_with_temperature(&empty, 1.0).unwrap();
    let scalar = NdArray::from_f32(&[1.0], &[], Device::cpu(0)).unwrap();
    assert!(sampling::apply_softmax_with_temperature(&scalar, 1.0).is_err());
    assert!(sampling::sample_top_p_from_prob(&scalar, 0.9, 0.5).is_err());
    let zero_vocab = NdArray::from_f32(&[], &[2, 0], Device::cpu(0)).unwrap();
    let picked = sampling::multinomial_from_uniform(&zero_vocab, &npy("builtins/uniform2.npy")).unwrap();
    assert_eq!(picked.to_bytes().unwrap(), [0u8; 16]);
    let err = sampling::sample_top_p_from_logits(&logits(), 1.0, 0.9, 1.5).unwrap_err();
    assert!(err.to_string().contains("uniform_sample <= data[0].first"), "{err}");
}

fn shape_arg(v: &serde_json::Value) -> Vec<i64> {
    v["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect()
}

#[test]
fn legacy_kv_cache_follows_tvm() {
    let fixture = json("legacy_kv_cache.json");
    let mut cache: Option<AttentionKvCacheLegacy> = None;
    for (i, step) in fixture["steps"].as_array().unwrap().iter().enumerate() {
        let op = step["op"].as_str().unwrap();
        let a = step["args"].as_array().unwrap();
        let what = format!("step {i}: {op}");
        let tensor = |k: usize| npy(a[k]["tensor"].as_str().unwrap());
        match op {
            "vm.builtin.attention_kv_cache_create" => {
                cache = Some(
                    legacy_kv::attention_kv_cache_create(&tensor(0), &shape_arg(&a[1]), a[2].as_i64().unwrap())
                        .unwrap(),
                );
            }
            _ => {
                let c = cache.as_mut().unwrap();
                match op {
                    "vm.builtin.attention_kv_cache_append" => {
                        legacy_kv::attention_kv_cache_append(c, &tensor(0)).unwrap()
                    }
                    "vm.builtin.attention_kv_cache_update" => {
                        legacy_kv::attention_kv_cache_update(c, &tensor(0)).unwrap()
                    }
                    "vm.builtin.attention_kv_cache_view" => {
                        let got = legacy_kv::attention_kv_cache_view(c, Some(&shape_arg(&a[0]))).unwrap();
                        assert_same(&what, &got, &npy(step["result"].as_str().unwrap()));
                    }
                    "vm.builtin.attention_kv_cache_array_popn" => {
                        legacy_kv::attention_kv_cache_array_popn(&mut [c], a[0].as_i64().unwrap()).unwrap()
                    }
                    "vm.builtin.attention_kv_cache_array_clear" => legacy_kv::attention_kv_cache_array_clear(&mut [c]),
                    "vm.builtin.attention_kv_cache_window_override" => {
                        legacy_kv::attention_kv_cache_window_override(c, &tensor(0), a[1].as_i64().unwrap()).unwrap()
                    }
                    "vm.builtin.attention_kv_cache_window_override_with_sinks" => {
                        legacy_kv::attention_kv_cache_window_override_with_sinks(
                            c,
                            &tensor(0),
                            a[1].as_i64().unwrap(),
                            a[2].as_i64().unwrap(),
                        )
                        .unwrap()
                    }
                    other => panic!("{other}: no such step"),
                }
            }
        }
        let c = cache.as_ref().unwrap();
        if let Some(view) = step["view"].as_str() {
            assert_eq!(c.fill_count(), step["fill_count"].as_i64().unwrap(), "{what}");
            let got = legacy_kv::attention_kv_cache_view(c, None).unwrap();
            assert_same(&what, &got, &npy(view));
        }
        if i == 2 {
            // TVM's growth: two appends of 3 rows double the reserve of 4 to 8.
            assert_eq!(c.reserved(), 8, "{what}");
        }
    }
}

#[test]
fn legacy_kv_cache_fails_as_tvm_does() {
    let fixture = json("legacy_kv_cache.json");
    let cpu = Device::cpu(0);
    let ones = |shape: &[i64]| {
        let n: i64 = shape.iter().product();
        NdArray::from_f32(&vec![1.0; n as usize], shape, cpu).unwrap()
    };
    let setup = || {
        let zeros = NdArray::empty(&[1, 2, 4], DataType::F32, cpu).unwrap();
        let mut c = AttentionKvCacheLegacy::create(&zeros, &[4, 2, 4], 0).unwrap();
        c.append(&ones(&[3, 2, 4])).unwrap();
        c
    };
    assert_eq!(fixture["error_setup"], "create(zeros [1, 2, 4], Shape([4, 2, 4]), 0), append(ones [3, 2, 4])");
    for case in fixture["errors"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut c = setup();
        let before = c.view_filled().unwrap().to_bytes().unwrap();
        let err = match name {
            "view_wrong_rows" => c.view(&[2, 2, 4]).map(|_| ()),
            "view_wrong_dim" => c.view(&[3, 2, 5]).map(|_| ()),
            "update_wrong_rows" => c.update(&ones(&[2, 2, 4])),
            "append_wrong_dim" => c.append(&ones(&[1, 3, 4])),
            "append_wrong_dtype" => {
                let v = NdArray::from_bytes(
                    &1f64.to_le_bytes().repeat(8),
                    &[1, 2, 4],
                    DataType { code: 2, bits: 64, lanes: 1 },
                    cpu,
                )
                .unwrap();
                assert_eq!(f64s_of(&v)[0], 1.0);
                c.append(&v)
            }
            "popn_past_fill" => legacy_kv::attention_kv_cache_array_popn(&mut [&mut c], 4),
            other => panic!("{other}: no such case"),
        }
        .unwrap_err();
        let tvm = &case["error"];
        let msg = err.to_string();
        assert!(msg.contains(tvm["message"].as_str().unwrap()), "{name}: {msg}");
        assert_eq!(err.tvm_kind(), tvm["kind"].as_str().unwrap(), "{name}");
        // A refused call changes nothing.
        assert_eq!(c.fill_count(), 3, "{name}");
        assert_eq!(c.reserved(), 4, "{name}");
        assert!(c.view_filled().unwrap().to_bytes().unwrap() == before, "{name}");
    }

    // What TVM does not check: a zero reserve (TVM doubles it forever), a window write past
    // the reserve (TVM writes out of bounds), a pop of a negative count.
    let zeros = NdArray::empty(&[1, 2, 4], DataType::F32, cpu).unwrap();
    assert!(AttentionKvCacheLegacy::create(&zeros, &[0, 2, 4], 0).is_err());
    let mut c = AttentionKvCacheLegacy::create(&zeros, &[4, 2, 4], 3).unwrap();
    let err = c.window_override(&ones(&[6, 2, 4]), 8, 0).unwrap_err();
    assert!(err.to_string().contains("past the 4 reserved rows"), "{err}");
    let err = legacy_kv::attention_kv_cache_array_popn(&mut [&mut c], -1).unwrap_err();
    assert!(err.to_string().contains("(18446744073709551615 vs. 3)"), "{err}");
    let err = c.window_override(&ones(&[7, 2, 4]), 8, 2).unwrap_err();
    assert!(err.to_string().contains("(7 vs. 6) : dim 0 of value too large"), "{err}");
}

fn host(a: &NdArray) -> Tensor {
    a.to_tensor().unwrap()
}

/// The builtins by name through the Relax VM, as MLC-LLM's runtime calls them: build A's
/// weights from the tensor cache run TVM's `embed` and `prefill` to TVM's outputs; a sampler,
/// an in-place softmax and a legacy cache give TVM's results.
#[test]
fn lm_builtins_through_the_vm() {
    let _global = GLOBAL_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let path = dir().join("llm_params.so");
    // SAFETY: the fixture is a library TVM built for these tests.
    let tree = unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }.unwrap();
    let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
    let params_dir = dir().join("params").display().to_string();
    vm.call_host("vm.builtin.tensor_cache.clear", &[]).unwrap();
    vm.call_host("vm.builtin.tensor_cache.load", &[Host::Str(params_dir), Host::Int(1), Host::Int(0)]).unwrap();
    let names = param_names();
    let params = vm
        .call_host(
            "vm.builtin.param_array_from_cache_by_name",
            &[Host::Tuple(names.iter().map(|n| Host::Str(n.clone())).collect())],
        )
        .unwrap();
    let Host::Tuple(items) = &params else { panic!("{params:?}") };
    assert_eq!(items.len(), 15);
    let err = vm
        .call_host(
            "vm.builtin.param_array_from_cache_by_name",
            &[Host::Tuple(vec![Host::Str("model.embed_tokens.weight".into()), Host::Str("no.such.weight".into())])],
        )
        .unwrap_err();
    assert!(err.to_string().contains(error_case("param_not_in_cache")["message"].as_str().unwrap()), "{err}");

    // `embed` of the prompt with these weights: TVM's embedding, bitwise.
    let scen = json("scenarios.json");
    let step = &scen["scenarios"]["single"]["steps"][2];
    assert_eq!(step["func"], "prefill");
    let tokens: Vec<u8> =
        step["tokens"].as_array().unwrap().iter().flat_map(|t| (t.as_i64().unwrap() as i32).to_le_bytes()).collect();
    let ids = Tensor::new(DataType::I32, vec![7], tokens).unwrap();
    let e = match vm.call_host("embed", &[Host::Tensor(ids), params.clone()]).unwrap() {
        Host::Tensor(t) => t,
        v => panic!("embed returned {v:?}"),
    };
    assert_eq!(e, host(&npy("embed.prompt.npy")), "embed differs from TVM's");

    // `prefill` of the prompt: TVM's logits (within 1e-4, as the paged KV cache's tests) and
    // its greedy token.
    let shape = |n| Host::Shape(vec![n]);
    let cache =
        vm.call_host("create_tir_paged_kv_cache", &[shape(4), shape(128), shape(64), shape(16), shape(0)]).unwrap();
    vm.call_host("vm.builtin.kv_state_add_sequence", &[cache.clone(), Host::Int(0)]).unwrap();
    vm.call_host("vm.builtin.kv_state_begin_forward", &[cache.clone(), shape(0), shape(7)]).unwrap();
    let e = Host::Tensor(Tensor::new(e.dtype, vec![1, 7, 64], e.data).unwrap());
    let out = vm.call_host("prefill", &[e, cache.clone(), params]).unwrap();
    vm.call_host("vm.builtin.kv_state_end_forward", &[cache]).unwrap();
    let Host::Tuple(out) = out else { panic!("prefill returned {out:?}") };
    let Host::Tensor(logits) = &out[0] else { panic!("{:?}", out[0]) };
    assert_eq!(logits.shape, [1, 1, 256]);
    let got: Vec<f32> = logits.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let want = npy("single.logits.npy").to_f32().unwrap().unwrap();
    let bound = want[..256].iter().fold(1f32, |m, x| m.max(x.abs()));
    let worst = got.iter().zip(&want[..256]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4 * bound, "prefill logits differ from TVM's by {worst}");
    let argmax = (0..256).max_by(|&a, &b| got[a].total_cmp(&got[b])).unwrap();
    assert_eq!(argmax as i64, step["argmax"][0].as_i64().unwrap());
    tensor_cache::tensor_cache_clear();

    // A sampler and an in-place builtin, with a VM tensor passed by reference.
    let fixture = json("sampling.json");
    let case = &fixture["cases"][11];
    assert_eq!(case["builtin"], "vm.builtin.sample_top_p_from_logits");
    let logits = npy("builtins/logits.npy");
    let a = case["args"].as_array().unwrap();
    let token = vm
        .call_host(
            "vm.builtin.sample_top_p_from_logits",
            &[
                Host::Array(logits.clone()),
                Host::Float(a[1].as_f64().unwrap()),
                Host::Float(a[2].as_f64().unwrap()),
                Host::Float(a[3].as_f64().unwrap()),
            ],
        )
        .unwrap();
    assert_eq!(token, Host::Int(case["result"]["int"].as_i64().unwrap()));
    vm.call_host("vm.builtin.apply_softmax_with_temperature", &[Host::Array(logits.clone()), Host::Int(1)]).unwrap();
    assert_same("softmax through the VM", &logits, &npy("builtins/softmax_t1.out.npy"));

    // The legacy cache as a VM object.
    let legacy = json("legacy_kv_cache.json");
    let steps = legacy["steps"].as_array().unwrap();
    let arg_tensor = |i: usize| Host::Tensor(host(&npy(steps[i]["args"][0]["tensor"].as_str().unwrap())));
    let c = vm
        .call_host("vm.builtin.attention_kv_cache_create", &[arg_tensor(0), Host::Shape(vec![4, 2, 4]), Host::Int(0)])
        .unwrap();
    let Host::Object(o) = &c else { panic!("{c:?}") };
    assert_eq!(o.type_key(), "relax.vm.AttentionKVCacheLegacy");
    for i in [1, 2] {
        let same = vm.call_host("vm.builtin.attention_kv_cache_append", &[c.clone(), arg_tensor(i)]).unwrap();
        assert_eq!(same, c, "append returns the cache it was given");
        let view = vm.call_host("vm.builtin.attention_kv_cache_view", std::slice::from_ref(&c)).unwrap();
        assert_eq!(view, Host::Tensor(host(&npy(steps[i]["view"].as_str().unwrap()))), "step {i}");
    }
    vm.call_host("vm.builtin.attention_kv_cache_array_popn", &[Host::Tuple(vec![c.clone()]), Host::Int(2)]).unwrap();
    let view = vm.call_host("vm.builtin.attention_kv_cache_view", &[c.clone(), Host::Shape(vec![4, 2, 4])]).unwrap();
    let Host::Tensor(view) = view else { panic!("{view:?}") };
    assert_eq!(view.shape, [4, 2, 4]);
    let err =
        vm.call_host("vm.builtin.attention_kv_cache_array_popn", &[Host::Tuple(vec![c]), Host::Int(5)]).unwrap_err();
    assert!(err.to_string().contains("Check failed: n <= fill_count (5 vs. 4) :"), "{err}");
}

#[test]
fn every_lm_builtin_is_served_by_the_vm() {
    use mblob_runtime::exec::llm::lm::BUILTINS;
    for name in BUILTINS {
        assert!(mblob_runtime::exec::relax::is_served(name), "{name} is not dispatched");
    }
    // The names TVM 0.27's registry has (sampling.json's `in_registry`) are served; the others
    // are not TVM's and stay unknown.
    for (name, registered) in json("sampling.json")["in_registry"].as_object().unwrap() {
        assert_eq!(mblob_runtime::exec::relax::is_served(name), registered.as_bool().unwrap(), "{name}");
    }
}
