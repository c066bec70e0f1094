//! Decode time per token of the fixture LLM (tests/fixtures/llm, `llm_consts.so`) with the
//! paged KV cache: `cargo bench -p mblob-runtime --features llm --bench llm_decode`. One token
//! is what MLC-LLM's runtime does per step: `kv_state_begin_forward`, `embed`, `decode`,
//! `kv_state_end_forward`, greedy; the cache is cleared and the prompt prefilled again every
//! 64 tokens (the model's cache holds 128). Prints mean, median and min per token, and the
//! share of `decode` alone. No comparison with TVM: see the README for claims.

use std::path::Path;
use std::time::Instant;

use mblob_runtime::exec::relax::{VirtualMachine, VmValue};
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{load_library, Device, LoadOptions, Registry};

fn tensor(v: VmValue) -> Tensor {
    match v {
        VmValue::Tensor(t) => t,
        VmValue::Tuple(mut items) => tensor(items.remove(0)),
        v => panic!("{v:?}"),
    }
}

fn ids(tokens: &[i32]) -> VmValue {
    VmValue::Tensor(
        Tensor::new(
            DataType::I32,
            vec![tokens.len() as i64],
            tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>(),
        )
        .unwrap(),
    )
}

fn argmax(logits: &Tensor) -> i32 {
    let v: Vec<f32> = logits.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (0..v.len()).fold(0, |b, j| if v[j] > v[b] { j } else { b }) as i32
}

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llm/llm_consts.so");
    // SAFETY: TVM's fixture library, built for these tests.
    let tree = unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }.unwrap();
    let mut vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
    let shape = |n: i64| VmValue::Shape(vec![n]);
    let cache =
        vm.invoke_values("create_tir_paged_kv_cache", &[shape(4), shape(128), shape(64), shape(16), shape(0)]).unwrap();
    let call = |vm: &VirtualMachine, name: &str, args: &[VmValue]| {
        let mut all = vec![cache.clone()];
        all.extend_from_slice(args);
        vm.call_function(name, &all).unwrap();
    };
    let prompt = [17, 211, 5, 98, 140, 33, 251];
    let (rounds, per_round) = (40, 64);
    let mut token_us = Vec::new();
    let mut decode_us = Vec::new();
    for round in 0..rounds + 2 {
        call(&vm, "vm.builtin.kv_state_clear", &[]);
        call(&vm, "vm.builtin.kv_state_add_sequence", &[VmValue::Int(0)]);
        call(&vm, "vm.builtin.kv_state_begin_forward", &[shape(0), shape(prompt.len() as i64)]);
        let e = tensor(vm.invoke_values("embed", &[ids(&prompt)]).unwrap());
        let e = VmValue::Tensor(Tensor::new(e.dtype, vec![1, prompt.len() as i64, 64], e.data).unwrap());
        let mut next = argmax(&tensor(vm.invoke_values("prefill", &[e, cache.clone()]).unwrap()));
        call(&vm, "vm.builtin.kv_state_end_forward", &[]);
        for _ in 0..per_round {
            let t = Instant::now();
            call(&vm, "vm.builtin.kv_state_begin_forward", &[shape(0), shape(1)]);
            let e = tensor(vm.invoke_values("embed", &[ids(&[next])]).unwrap());
            let e = VmValue::Tensor(Tensor::new(e.dtype, vec![1, 1, 64], e.data).unwrap());
            let d = Instant::now();
            let logits = tensor(vm.invoke_values("decode", &[e, cache.clone()]).unwrap());
            let d = d.elapsed();
            call(&vm, "vm.builtin.kv_state_end_forward", &[]);
            next = argmax(&logits);
            // The first two rounds warm the storage pool and the caches.
            if round >= 2 {
                token_us.push(t.elapsed().as_secs_f64() * 1e6);
                decode_us.push(d.as_secs_f64() * 1e6);
            }
        }
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v.iter().sum::<f64>() / v.len() as f64, v[v.len() / 2], v[0])
    };
    let (tm, tmed, tmin) = stats(&mut token_us);
    let (dm, dmed, dmin) = stats(&mut decode_us);
    println!("| per token ({} tokens) | mean us | median us | min us |", token_us.len());
    println!("|---|---|---|---|");
    println!("| begin_forward + embed + decode + end_forward | {tm:.1} | {tmed:.1} | {tmin:.1} |");
    println!("| decode alone | {dm:.1} | {dmed:.1} | {dmin:.1} |");
}
