"""The RWKV-6 library MLC-LLM's own pipeline built (tests/fixtures/mlc/rwkv6-q0f32, README
there; `kv_state_kind` `rnn_state`) through `mblob.LanguageModel`: TVM's RNN state from the
library's `create_rnn_state`, and the greedy tokens and every step's logits of TVM 0.27's own
VM driven as MLC-LLM's engine drives it (reference_rnn.py), logits within 1e-4 of
max(1, max|ref|)."""
import json
import os

import numpy as np

import mblob

RWKV = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "mlc", "rwkv6-q0f32")


def test_rwkv6_generates_tvms_tokens_and_logits():
    ref = json.load(open(os.path.join(RWKV, "reference.json")))["generate"]
    lm = mblob.LanguageModel(os.path.join(RWKV, "lib.so"), weights=RWKV)
    assert lm.metadata["kv_state_kind"] == "rnn_state"
    assert lm.metadata["context_window_size"] == -1
    tokens = lm.generate(ref["prompt"], len(ref["tokens"]))
    assert tokens == ref["tokens"]
    want = np.load(os.path.join(RWKV, ref["logits"]))
    got = np.asarray(lm.logits, dtype=np.float32)
    assert got.shape == want.shape
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-4 * max(1.0, np.abs(w).max())
