//! Time per token of the fixture LLM (tests/fixtures/llm, `llm_consts.so`) as
//! [`LanguageModel`] generates: `cargo bench -p mblob-runtime --features llm --bench
//! llm_decode`. Each round is one `generate` of 64 tokens after a 7-token prompt, in a new
//! paged KV cache: the prefill, then per token what MLC-LLM's runtime does per step
//! (`kv_state_begin_forward`, `embed`, `decode`, `kv_state_end_forward`, greedy), timed by
//! `generate` itself ([`Generation::decode_times`], [`Generation::prefill_time`]). The first two
//! rounds warm the storage pool and the caches. Prints mean, median and min per decode step and
//! per prefill. No comparison with TVM: see the README for claims.

use std::path::Path;
use std::time::Duration;

use mblob_runtime::exec::llm::generate::{GenerateOptions, Generation, LanguageModel};
use mblob_runtime::{load_library, Device, LoadOptions, Registry};

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm/llm_consts.so");
    // SAFETY: TVM's fixture library, built for these tests.
    let tree = unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }.unwrap();
    let mut lm = LanguageModel::new(&tree, Device::cpu(0), None, &GenerateOptions::default()).unwrap();
    let prompt = [17, 211, 5, 98, 140, 33, 251];
    let (rounds, per_round) = (40, 64);
    let mut token_us = Vec::new();
    let mut prefill_us = Vec::new();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut first: Option<Vec<i32>> = None;
    for round in 0..rounds + 2 {
        let out: Generation = lm.generate(&prompt, per_round).unwrap();
        // Greedy decoding of the same prompt gives the same tokens every round.
        assert_eq!(first.get_or_insert_with(|| out.tokens.clone()), &out.tokens, "round {round}");
        if round >= 2 {
            token_us.extend(out.decode_times.iter().copied().map(us));
            prefill_us.push(us(out.prefill_time));
        }
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v.iter().sum::<f64>() / v.len() as f64, v[v.len() / 2], v[0])
    };
    let (tm, tmed, tmin) = stats(&mut token_us);
    let (pm, pmed, pmin) = stats(&mut prefill_us);
    println!(
        "| LanguageModel::generate ({} decode steps, {} prefills) | mean us | median us | min us |",
        token_us.len(),
        prefill_us.len()
    );
    println!("|---|---|---|---|");
    println!(
        "| decode step (begin_forward + embed + decode + end_forward + argmax) | {tm:.1} | {tmed:.1} | {tmin:.1} |"
    );
    println!("| prefill of {} tokens | {pm:.1} | {pmed:.1} | {pmin:.1} |", prompt.len());
}
