"""The LLM fixture (tests/fixtures/llm: a tiny LLaMA-like model TVM 0.27 compiled with its TIR
paged KV cache) through the Python API, called the way MLC-LLM's runtime and the fixture's
make.py call TVM's: weights from the tensor cache by name, the KV cache handle's builtins
(add, fork, popn, remove, begin/end forward), embed, prefill, decode, batch_decode. Every step
is checked against what TVM's own VM recorded: the tokens, the logits (1e-4 of max(1, max|ref|)),
the cache's bookkeeping after every step, and the keys and values read back."""
import json
import os

import numpy as np
import pytest

import mblob

LLM = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "llm")
SCEN = json.load(open(os.path.join(LLM, "scenarios.json")))
H = SCEN["config"]["hidden_size"]


class Runner:
    """make.py's Runner, with mblob instead of TVM."""

    def __init__(self, lib):
        self.vm = mblob.VirtualMachine(mblob.load_module(os.path.join(LLM, lib)), mblob.cpu())
        self.params = None
        if lib == "llm_params.so":
            gf = self.vm.get_global_func
            gf("vm.builtin.tensor_cache.clear")()
            gf("vm.builtin.tensor_cache.load")(os.path.join(LLM, "params"), 1, 0)
            self.params = gf("vm.builtin.param_array_from_cache_by_name")(SCEN["param_names"])
            gf("vm.builtin.tensor_cache.clear")()
        self.cache = None

    def call(self, fname, *args):
        if self.params is not None:
            args = args + (self.params,)
        return self.vm[fname](*args)

    def state(self, seq_ids):
        c = self.cache
        return {
            "num_available_pages": c.get_num_available_pages(),
            "total_sequence_length": c.get_total_sequence_length(),
            "seq_lengths": {str(s): c.get_sequence_length(s) for s in seq_ids},
        }

    def forward(self, func, seq_ids, lengths, tokens, logit_positions=None):
        self.cache.begin_forward(seq_ids, lengths)
        e = self.call("embed", np.array(tokens, dtype="int32"))
        if func in ("prefill", "batch_prefill"):
            x = e.reshape(1, len(tokens), H)
        elif func == "decode":
            x = e.reshape(1, 1, H)
        else:
            x = e.reshape(len(tokens), 1, H)
        if func == "batch_prefill":
            res = self.call(func, x, np.array(logit_positions, dtype="int32"), self.cache)
        else:
            res = self.call(func, x, self.cache)
        self.cache.end_forward()
        assert res[1].same_as(self.cache), "the function returns the cache it was given"
        return res[0].reshape(-1, res[0].shape[-1])


def close(got, want):
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got - want).max()) <= 1e-4 * scale


@pytest.mark.parametrize("lib", ["llm_params.so", "llm_consts.so"])
@pytest.mark.parametrize("name", ["single", "shared", "batch_prefill"])
def test_scenarios_match_tvm(lib, name):
    r = Runner(lib)
    ref = np.load(os.path.join(LLM, f"{name}.logits.npy"))
    live = []
    for i, step in enumerate(SCEN["scenarios"][name]["steps"]):
        op = step["op"]
        if op == "create":
            r.cache = r.vm["create_tir_paged_kv_cache"](*[(x,) for x in step["args"]])
            assert isinstance(r.cache, mblob.PagedKVCache)
            assert r.cache.type_key == "relax.vm.PagedAttentionKVCache"
        elif op == "add_sequence":
            r.cache.add_sequence(step["seq"])
            live.append(step["seq"])
        elif op == "remove_sequence":
            r.cache.remove_sequence(step["seq"])
            live.remove(step["seq"])
        elif op == "fork_sequence":
            r.cache.fork_sequence(step["parent"], step["child"], step["fork_pos"])
            live.append(step["child"])
        elif op == "popn":
            r.cache.popn(step["seq"], step["n"])
        elif op == "debug_get_kv":
            want_k = np.load(os.path.join(LLM, step["k"]))
            k = np.zeros_like(want_k)
            v = np.zeros_like(want_k)
            r.cache.debug_get_kv(step["seq"], step["start"], step["end"], k, v)
            assert close(k, want_k), f"step {i}: keys"
            assert close(v, np.load(os.path.join(LLM, step["v"]))), f"step {i}: values"
        elif op == "forward":
            logits = r.forward(step["func"], step["seq_ids"], step["lengths"], step["tokens"], step.get("logit_positions"))
            start, count = step["logit_rows"]
            assert close(logits, ref[start : start + count]), f"step {i}: logits"
            assert [int(t) for t in logits.argmax(axis=-1)] == step["argmax"], f"step {i}: tokens"
        else:
            raise AssertionError(op)
        assert r.state(live) == step["state"], f"step {i} ({op}): cache state"


def test_kv_cache_errors_are_tvms():
    errors = json.load(open(os.path.join(LLM, "errors.json")))["cases"]
    r = Runner("llm_consts.so")
    r.cache = r.vm["create_tir_paged_kv_cache"](*[(x,) for x in SCEN["cache_config"]])
    r.cache.add_sequence(0)
    with pytest.raises(mblob.RunError) as e:
        r.cache.add_sequence(0)
    assert errors["add_sequence_twice"]["error"]["check"] in str(e.value)
    with pytest.raises(mblob.RunError) as e:
        r.cache.remove_sequence(99)
    assert errors["remove_unknown_sequence"]["error"]["check"] in str(e.value)
    with pytest.raises(mblob.RunError):
        r.cache.popn(0, 1)  # the sequence is empty
    with pytest.raises(mblob.InputError):
        r.cache.debug_get_kv(0, 0, 1)


@pytest.mark.parametrize("lib", ["llm_params.so", "llm_consts.so"])
def test_language_model_generates_tvms_tokens(lib):
    steps = [s for s in SCEN["scenarios"]["single"]["steps"] if s["op"] == "forward"]
    weights = os.path.join(LLM, "params") if lib == "llm_params.so" else None
    lm = mblob.LanguageModel(os.path.join(LLM, lib), weights=weights)
    assert lm.metadata["context_window_size"] == SCEN["config"]["context_window_size"]
    tokens = lm.generate(steps[0]["tokens"], len(steps))
    assert tokens == [s["argmax"][0] for s in steps]
    ref = np.load(os.path.join(LLM, "single.logits.npy"))
    assert close(lm.logits, ref[: len(steps)])
    assert len(lm.decode_seconds) == len(steps) - 1


def test_language_model_refuses_missing_weights():
    with pytest.raises(mblob.RunError, match="tensor cache"):
        mblob.LanguageModel(os.path.join(LLM, "llm_params.so"))


@pytest.mark.parametrize("by_name", [True, False])
def test_param_module_gives_the_weights(by_name):
    """vm.builtin.param_module_from_cache(_by_name): a module whose get_params are the weights;
    embed with them gives TVM's embedding of the prompt (embed.prompt.npy)."""
    vm = mblob.VirtualMachine(mblob.load_module(os.path.join(LLM, "llm_params.so")), mblob.cpu())
    gf = vm.get_global_func
    gf("vm.builtin.tensor_cache.clear")()
    gf("vm.builtin.tensor_cache.load")(os.path.join(LLM, "params"), 1, 0)
    if by_name:
        mod = gf("vm.builtin.param_module_from_cache_by_name")(SCEN["param_names"])
    else:
        # TVM's by-prefix names: PREFIX_0 .. PREFIX_{n-1}, here the cache's own names under a prefix.
        for i, name in enumerate(SCEN["param_names"]):
            gf("vm.builtin.tensor_cache.update")(f"param_{i}", gf("vm.builtin.tensor_cache.get")(name), True)
        mod = gf("vm.builtin.param_module_from_cache")("param", len(SCEN["param_names"]))
    gf("vm.builtin.tensor_cache.clear")()
    assert isinstance(mod, mblob.ParamModule) and mod.type_key == "ffi.Module"
    params = mod["get_params"]()
    assert len(params) == len(SCEN["param_names"])
    prompt = SCEN["scenarios"]["single"]["steps"][2]["tokens"]
    e = vm["embed"](np.array(prompt, dtype="int32"), params)
    assert np.array_equal(e, np.load(os.path.join(LLM, "embed.prompt.npy")))
    with pytest.raises(mblob.InputError):
        mod["nothing"]
