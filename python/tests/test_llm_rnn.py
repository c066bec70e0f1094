"""The RWKV-6 library MLC-LLM's own pipeline built (tests/fixtures/mlc/rwkv6-q0f32, README
there; `kv_state_kind` `rnn_state`) through `mblob.LanguageModel`: TVM's RNN state from the
library's `create_rnn_state`, and the greedy tokens and every step's logits of TVM 0.27's own
VM driven as MLC-LLM's engine drives it (reference_rnn.py), logits within 1e-4 of
max(1, max|ref|). The same for Qwen3.5 (qwen35-q0f32, `kv_state_kind` `hybrid`: a paged KV
cache and an RNN state together, every step through `batch_prefill`/`batch_decode`;
reference_hybrid.py)."""
import json
import os

import numpy as np
import pytest

import mblob

MLC = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "mlc")


@pytest.mark.parametrize("name,kind,context", [("rwkv6-q0f32", "rnn_state", -1), ("qwen35-q0f32", "hybrid", 256)])
def test_rnn_state_models_generate_tvms_tokens_and_logits(name, kind, context):
    fixture = os.path.join(MLC, name)
    ref = json.load(open(os.path.join(fixture, "reference.json")))["generate"]
    lm = mblob.LanguageModel(os.path.join(fixture, "lib.so"), weights=fixture)
    assert lm.metadata["kv_state_kind"] == kind
    assert lm.metadata["context_window_size"] == context
    tokens = lm.generate(ref["prompt"], len(ref["tokens"]))
    assert tokens == ref["tokens"]
    want = np.load(os.path.join(fixture, ref["logits"]))
    got = np.asarray(lm.logits, dtype=np.float32)
    assert got.shape == want.shape
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-4 * max(1.0, np.abs(w).max())
