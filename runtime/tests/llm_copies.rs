//! Host<->device copies of `LanguageModel::generate` on OpenCL (pocl), counted by the device
//! API. Alone in its test binary: the counters are the process's, and no other test may use
//! the device meanwhile.
//!
//! OpenCL runs for real on the machine's OpenCL device (pocl on a CPU in CI). Without one the
//! test prints `skipped: no OpenCL device (...)` and passes, unless `MBLOB_REQUIRE_OPENCL` is
//! set, which turns the skip into a failure.
#![cfg(all(feature = "llm", feature = "opencl"))]

use mblob_runtime::device::Device;
use mblob_runtime::device::{device_api, TransferStats};
use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};

#[path = "support/llm_fixture.rs"]
mod llm_fixture;
use llm_fixture::{dir, ints, json, load};

/// Tokens per page of the cache (`GenerateOptions::default`).
const PAGE: u64 = 16;

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
    let api = match device_api(d) {
        Ok(api) => api,
        Err(e) => {
            if std::env::var_os("MBLOB_REQUIRE_OPENCL").is_some() {
                panic!("MBLOB_REQUIRE_OPENCL is set but no OpenCL device opens: {e}");
            }
            eprintln!("skipped: no OpenCL device ({e})");
            return;
        }
    };
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
