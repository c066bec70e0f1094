//! Host<->device copies of `LanguageModel::generate` and `generate_batch` on OpenCL (pocl),
//! counted by the device API. Alone in their test binary: the counters are the process's, and
//! no other test may use the device meanwhile (the tests here take turns, `TURN`).
//!
//! OpenCL runs for real on the machine's OpenCL device (pocl on a CPU in CI). Without one the
//! test prints `skipped: no OpenCL device (...)` and passes, unless `MBLOB_REQUIRE_OPENCL` is
//! set, which turns the skip into a failure.
#![cfg(all(feature = "llm", feature = "opencl"))]

use mblob_runtime::device::Device;
use mblob_runtime::device::TransferStats;
use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};

#[path = "support/llm_fixture.rs"]
mod llm_fixture;
use llm_fixture::{dir, ints, json, load};

/// Tokens per page of the cache (`GenerateOptions::default`).
const PAGE: u64 = 16;

/// One test at a time counts the device's copies.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[path = "support/opencl_device.rs"]
mod opencl_device;
use opencl_device::opencl_api;

/// The bytes of the int32 arrays the paged KV cache copies to the device at the start of a
/// round (`kv_state_begin_forward`, as TVM's aux data manager copies them) for one sequence
/// appending `m` tokens in one block depth whose pages are `pages`, and how many arrays: per
/// round `q_rope_position_map` (m), `append_position_map` (m), `cur_append_length_indptr` (2),
/// `k_ragged_rope_pos_offset` (1); per depth `qo_indptr` (2), `page_indptr` (2),
/// `page_indices` (one per page, left out when there is none), `length_info` (1),
/// `k_rope_pos_offset` (1).
fn aux(m: u64, pages: u64) -> (u64, u64) {
    let arrays = 4 + 4 + u64::from(pages > 0);
    (arrays, 4 * (m + m + 2 + 1) + 4 * (2 + 2 + pages + 1 + 1))
}

/// One generate step moves the token ids to the device and the last row of logits back, and
/// otherwise only the cache's per-round arrays: the embeddings stay on the device between
/// `embed` and `prefill`/`decode`, the weights are not copied again, and of the logits only
/// the `vocab * 4` bytes of the last row are read. The tokens are TVM's.
#[test]
fn a_generate_step_copies_the_ids_in_and_the_last_logits_row_out() {
    let d = Device::opencl(0);
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(api) = opencl_api() else { return };
    let scenarios = json("scenarios.json");
    let forwards: Vec<serde_json::Value> = scenarios["scenarios"]["single"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["op"] == "forward")
        .cloned()
        .collect();
    let prompt: Vec<i32> = ints(&forwards[0]["tokens"]).iter().map(|&t| t as i32).collect();
    let p = prompt.len() as u64;
    assert!(p < PAGE, "the prompt fits in one prefill and one page");
    let made = api.transfers();
    let mut lm = LanguageModel::new(
        &load("device/llm_params_opencl.so"),
        d,
        Some(&dir().join("params")),
        &GenerateOptions::default(),
    )
    .unwrap();
    let weights: u64 = lm.weight_arrays().iter().map(|w| w.nbytes() as u64).sum();
    let vm = lm.vm();
    let constants: u64 =
        (0..vm.executable().constants.len()).filter_map(|i| vm.constant_tensor(i)).map(|c| c.nbytes() as u64).sum();
    let made = api.transfers() - made;
    assert_eq!(
        (made.host_to_device_bytes, made.device_to_host),
        (weights + constants, 0),
        "the weights and the constants go up once"
    );
    for round in 0..2 {
        let start = api.transfers();
        let mut marks: Vec<TransferStats> = Vec::new();
        let out = lm.generate_with(&prompt, forwards.len(), |_| marks.push(api.transfers())).unwrap();
        let want: Vec<i32> = forwards.iter().map(|s| s["argmax"][0].as_i64().unwrap() as i32).collect();
        assert_eq!(out.tokens, want, "TVM's greedy tokens");
        let vocab = out.logits[0].len() as u64;
        assert_eq!(vocab, 256);
        let mut before = start;
        for (step, mark) in marks.iter().enumerate() {
            let moved = *mark - before;
            before = *mark;
            // Step 0 is the prefill of the new cache (no pages before it: no `page_indices`);
            // step i appends one token, the sequence then `p + i` long.
            let (ids, (arrays, bytes)) =
                if step == 0 { (p, aux(p, 0)) } else { (1, aux(1, (p + step as u64).div_ceil(PAGE))) };
            assert_eq!(
                moved,
                TransferStats {
                    host_to_device: 1 + arrays,
                    host_to_device_bytes: 4 * ids + bytes,
                    device_to_host: 1,
                    device_to_host_bytes: vocab * 4,
                    device_to_device: 0,
                },
                "round {round}, step {step}"
            );
        }
        assert_eq!(marks.len(), forwards.len());
    }
}

/// The model of MLC-LLM's Qwen2.5 built for OpenCL (its library has `alloc_embedding_tensor`)
/// with the weights of the CPU build, and TVM's record of the CPU build.
fn qwen2_opencl() -> (LanguageModel, serde_json::Value) {
    let mlc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlc");
    let reference = serde_json::from_slice(&std::fs::read(mlc.join("qwen2-q0f32/reference.json")).unwrap()).unwrap();
    let lib = mlc.join("qwen2-q0f32-opencl/lib.so");
    // SAFETY: the fixture is a library MLC-LLM's pipeline built for these tests.
    let tree = unsafe { mblob_runtime::load_library(&lib, &Default::default(), &Default::default()) }.unwrap();
    let weights = mlc.join("qwen2-q0f32");
    (LanguageModel::new(&tree, Device::opencl(0), Some(&weights), &GenerateOptions::default()).unwrap(), reference)
}

/// One prefill round of `prompts` as MLC-LLM's engine runs it without the embedding workspace
/// (`embed`'s own result viewed as `[1, n, hidden]`), through the VM's public calls, in a new
/// KV cache: the round's rows of logits.
fn prefill_round_without_workspace(lm: &LanguageModel, prompts: &[Vec<i32>]) -> Vec<f32> {
    use mblob_runtime::array::NdArray;
    use mblob_runtime::exec::Value;
    use mblob_runtime::format::DataType;
    let vm = lm.vm();
    let meta = lm.metadata();
    let shape = |v: &[i64]| Value::Shape(v.into());
    let cache = vm
        .invoke(
            "create_tir_paged_kv_cache",
            &[
                shape(&[meta.max_batch_size]),
                shape(&[meta.context_window_size]),
                shape(&[meta.prefill_chunk_size]),
                shape(&[PAGE as i64]),
                shape(&[0]),
            ],
        )
        .unwrap();
    for seq in 0..prompts.len() as i64 {
        vm.invoke("vm.builtin.kv_state_add_sequence", &[cache.clone(), Value::Int(seq)]).unwrap();
    }
    let seqs: Vec<i64> = (0..prompts.len() as i64).collect();
    let lengths: Vec<i64> = prompts.iter().map(|p| p.len() as i64).collect();
    vm.invoke("vm.builtin.kv_state_begin_forward", &[cache.clone(), shape(&seqs), shape(&lengths)]).unwrap();
    let ids: Vec<u8> = prompts.iter().flatten().flat_map(|t| t.to_le_bytes()).collect();
    let n = (ids.len() / 4) as i64;
    let ids = NdArray::from_bytes(&ids, &[n], DataType::I32, Device::opencl(0)).unwrap();
    let Value::Tensor(embedded) =
        vm.invoke("embed", &[Value::Tensor(ids), Value::Tuple(lm.params().unwrap().to_vec())]).unwrap()
    else {
        panic!("embed returned no tensor")
    };
    let embedded = embedded.view(&[1, n, embedded.shape()[1]], embedded.dtype()).unwrap();
    let mut end = 0;
    let positions: Vec<u8> = lengths
        .iter()
        .flat_map(|l| {
            end += *l as i32;
            (end - 1).to_le_bytes()
        })
        .collect();
    let positions = NdArray::from_bytes(&positions, &[seqs.len() as i64], DataType::I32, Device::opencl(0)).unwrap();
    let out = vm
        .invoke(
            "batch_prefill",
            &[
                Value::Tensor(embedded),
                Value::Tensor(positions),
                cache.clone(),
                Value::Tuple(lm.params().unwrap().to_vec()),
            ],
        )
        .unwrap();
    vm.invoke("vm.builtin.kv_state_end_forward", &[cache]).unwrap();
    let logits = match out {
        Value::Tuple(items) => items.into_iter().next().unwrap(),
        v => v,
    };
    let Value::Tensor(logits) = logits else { panic!("batch_prefill returned no logits") };
    logits.to_f32().unwrap().unwrap()
}

/// A batch of MLC-LLM's Qwen2.5 built for OpenCL, whose library has `alloc_embedding_tensor`:
/// a prefill round of several sequences copies its embeddings into that workspace within the
/// device (MLC-LLM's `mlc.copy_embedding_to_offset`) and otherwise copies between host and
/// device exactly what the same round copies without the workspace, with the same logits. The
/// whole batch gives TVM's tokens (`reference.py`'s `batch`, TVM's records of the CPU build of
/// the same weights).
#[test]
fn a_batch_prefill_writes_the_embedding_workspace_on_the_device() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(api) = opencl_api() else { return };
    let (mut lm, reference) = qwen2_opencl();
    let batch = &reference["batch"];
    let prompts: Vec<Vec<i32>> =
        batch["prompts"].as_array().unwrap().iter().map(|p| ints(p).iter().map(|&t| t as i32).collect()).collect();
    let want: Vec<Vec<i32>> =
        batch["tokens"].as_array().unwrap().iter().map(|p| ints(p).iter().map(|&t| t as i32).collect()).collect();
    let new_tokens = batch["max_new_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lm.hidden_size(), Some(256), "the hidden size, from alloc_embedding_tensor's [16, 256]");
    let outs = lm.generate_batch(&prompts, new_tokens, &Default::default()).unwrap();
    let got: Vec<Vec<i32>> = outs.iter().map(|o| o.tokens.clone()).collect();
    assert_eq!(got, want, "TVM's greedy tokens of the batch");

    // One round of two sequences (9 + 7 tokens: one prefill chunk), with and without it.
    let round = vec![prompts[1].clone(), prompts[2][..7].to_vec()];
    let start = api.transfers();
    let with = lm.generate_batch(&round, 1, &Default::default()).unwrap();
    let with_copies = api.transfers() - start;
    let start = api.transfers();
    let without = prefill_round_without_workspace(&lm, &round);
    let without_copies = api.transfers() - start;
    let rows: Vec<f32> = with.iter().flat_map(|g| g.logits[0].iter().copied()).collect();
    assert_eq!(rows, without, "the same logits with the workspace");
    assert_eq!(
        with_copies,
        TransferStats { device_to_device: without_copies.device_to_device + 1, ..without_copies },
        "one copy within the device more, none between host and device"
    );
}
