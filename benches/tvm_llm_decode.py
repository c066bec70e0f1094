"""Per-token greedy decode time of TVM's own Relax VM on an MLC-style model library (run by hand,
TVM 0.27; `benches/llm_decode.sh` calls it). Mirrors `mblob generate`: prefill the prompt, then
decode greedily, each step `kv_state_begin_forward`, `embed`, `decode`, `kv_state_end_forward` and an
argmax on the host. Prints one JSON line: the tokens and the per-token times.

    TVM_NUM_THREADS=1 python benches/tvm_llm_decode.py MODEL.so [--weights DIR] \
        --prompt-ids 1,2,3 --max-new-tokens 16 --repeat 20
"""
import argparse
import json
import time

import numpy as np
import tvm
from tvm import relax


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--weights")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--page-size", type=int, default=16)
    a = ap.parse_args()
    gf = tvm.get_global_func
    S = tvm.runtime.ShapeTuple
    lib = tvm.runtime.load_module(a.model)
    vm = relax.VirtualMachine(lib, tvm.cpu())
    meta = json.loads(vm["_metadata"]())
    extra = ()
    if a.weights:
        gf("vm.builtin.tensor_cache.load")(a.weights, 1, 0)
        names = [p["name"] for p in meta["params"]]
        extra = (gf("vm.builtin.param_array_from_cache_by_name")(names),)
        gf("vm.builtin.tensor_cache.clear")()
    prompt = [int(t) for t in a.prompt_ids.split(",")]
    per_token = []
    tokens = []
    for _ in range(a.repeat):
        cache = vm["create_tir_paged_kv_cache"](
            S([meta["max_batch_size"]]), S([meta["context_window_size"]]), S([meta["prefill_chunk_size"]]),
            S([a.page_size]), S([0]))
        gf("vm.builtin.kv_state_add_sequence")(cache, 0)

        def step(func, ids):
            gf("vm.builtin.kv_state_begin_forward")(cache, S([0]), S([len(ids)]))
            e = vm["embed"](tvm.runtime.tensor(np.array(ids, dtype="int32")), *extra)
            e = gf("vm.builtin.reshape")(e, S([1, len(ids), e.shape[-1]]))
            logits, _ = vm[func](e, cache, *extra)
            gf("vm.builtin.kv_state_end_forward")(cache)
            return int(np.argmax(logits.numpy().reshape(-1)[-logits.shape[-1]:]))

        run = [step("prefill", prompt)]
        for _ in range(a.max_new_tokens - 1):
            t0 = time.perf_counter()
            run.append(step("decode", [run[-1]]))
            per_token.append(time.perf_counter() - t0)
        tokens = run
    us = np.array(per_token) * 1e6
    print(json.dumps({"tokens": tokens, "decode_us_mean": float(us.mean()), "decode_us_median": float(np.median(us)),
                      "decode_us_min": float(us.min()), "steps": len(us)}))


if __name__ == "__main__":
    main()
