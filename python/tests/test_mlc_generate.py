"""mblob.LanguageModel on libraries MLC-LLM's own pipeline built (tests/fixtures/mlc, README
there): sampling (temperature, top_p, seed) and batches, as ``mblob generate`` runs them,
against the records TVM 0.27's own VM made, driven as MLC-LLM's engine drives it
(``reference.json``: ``sampled`` and ``batch``). Tokens equal TVM's; logits within 1e-4 of
max(1, max|ref|)."""
import json
import os

import numpy as np
import pytest

import mblob

MLC = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "mlc")
MODELS = ["qwen2-q0f32", "mistral-q0f32"]


def model(name):
    d = os.path.join(MLC, name)
    return mblob.LanguageModel(os.path.join(d, "lib.so"), weights=d), json.load(open(os.path.join(d, "reference.json")))


def close(got, want):
    assert got.shape == want.shape
    for g, w in zip(got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])):
        scale = max(1.0, float(np.abs(w).max()))
        assert float(np.abs(g - w).max()) <= 1e-4 * scale


@pytest.mark.parametrize("name", MODELS)
def test_sampling_gives_tvms_tokens_and_logits(name):
    lm, ref = model(name)
    s = ref["sampled"]
    tokens = lm.generate(s["prompt"], len(s["tokens"]), temperature=s["temperature"], top_p=s["top_p"], seed=s["seed"])
    assert tokens == s["tokens"]
    close(lm.logits, np.load(os.path.join(MLC, name, s["logits"])))


@pytest.mark.parametrize("name", MODELS)
def test_a_batch_gives_tvms_tokens_and_logits_greedy_and_sampled(name):
    lm, ref = model(name)
    b = ref["batch"]
    tokens = lm.generate_batch(b["prompts"], b["max_new_tokens"])
    assert tokens == b["tokens"]
    close(lm.logits, np.load(os.path.join(MLC, name, b["logits"])))
    assert len(lm.decode_seconds) == b["max_new_tokens"] - 1
    s = b["sampled"]
    sampled = lm.generate_batch(
        b["prompts"], b["max_new_tokens"], temperature=s["temperature"], top_p=s["top_p"], seed=s["seeds"][0]
    )
    assert sampled == s["tokens"]


def test_bad_sampling_and_batches_are_refused():
    lm, ref = model("qwen2-q0f32")
    prompt = ref["sampled"]["prompt"]
    with pytest.raises(mblob.RunError, match="temperature"):
        lm.generate(prompt, 2, temperature=-1.0)
    with pytest.raises(mblob.RunError, match="top_p"):
        lm.generate(prompt, 2, temperature=0.7, top_p=0.0)
    with pytest.raises(mblob.RunError, match="prompt 1 is empty"):
        lm.generate_batch([prompt, []], 2)
    with pytest.raises(mblob.RunError, match="max_batch_size"):
        lm.generate_batch([prompt] * 5, 2)


def test_an_opencl_program_cache_written_once_loads_later(tmp_path):
    """``opencl_program_cache``: the first model builds the kernels and writes their programs in
    TVM's layout (``opencl.GetPreCompiledPrograms``: a u64 count, then per kernel a u64-prefixed
    name and binary); a model made later loads them. Both give TVM's tokens (the records of the
    CPU build of the same weights). Skipped without an OpenCL device (pocl in CI)."""
    try:
        mblob.VirtualMachine(mblob.load_module(os.path.join(MLC, "qwen2-q0f32-opencl", "lib.so")), mblob.opencl())
    except mblob.Error as e:
        if os.environ.get("MBLOB_REQUIRE_OPENCL"):
            raise
        pytest.skip(f"no OpenCL device: {e}")
    ref = json.load(open(os.path.join(MLC, "qwen2-q0f32", "reference.json")))["generate"]
    cache = tmp_path / "qwen2.programs"
    lib = os.path.join(MLC, "qwen2-q0f32-opencl", "lib.so")
    weights = os.path.join(MLC, "qwen2-q0f32")
    for _ in range(2):
        lm = mblob.LanguageModel(lib, weights=weights, device=mblob.opencl(), opencl_program_cache=cache)
        assert lm.generate(ref["prompt"], len(ref["tokens"])) == ref["tokens"]
        data = cache.read_bytes()
        count = int.from_bytes(data[:8], "little")
        name = data[16 : 16 + int.from_bytes(data[8:16], "little")].decode()
        assert count > 1 and name
    # The functions themselves, by name through the library's imports, take and give bytes.
    m = mblob.load_module(lib)
    got = m["opencl.GetPreCompiledPrograms"]()
    assert isinstance(got, bytes) and int.from_bytes(got[:8], "little") == count
    m["opencl.SetPreCompiledPrograms"](got)
    with pytest.raises(mblob.RunError, match="program cache says it holds"):
        m["opencl.SetPreCompiledPrograms"](got[:10])
