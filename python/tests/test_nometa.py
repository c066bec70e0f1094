"""A library without `_metadata` (tests/fixtures/nnllm: the model functions alone, built with
TVM 0.27's `nn.llm`; weights the tensor cache's param_0, param_1, ...) through
`mblob.LanguageModel`, with the settings the metadata would give as keyword arguments: two turns
of one sequence (the second, and the prompt's later chunk, through the library's `extend`, as
MLC-LLM's engine runs them) give the tokens of TVM's own VM and its logits within 1e-4 of
max(1, max|ref|) (`reference.json`)."""
import json
import os

import numpy as np
import pytest

import mblob

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "nnllm")
REF = json.load(open(os.path.join(HERE, "reference.json")))


def model(**settings):
    return mblob.LanguageModel(os.path.join(HERE, "lib.so"), weights=os.path.join(HERE, "params"), **settings)


def test_two_turns_give_tvms_tokens_and_logits():
    s = REF["scenarios"]["multi_turn"]
    lm = model(context_window_size=128, prefill_chunk_size=32, max_batch_size=4)
    first = lm.generate(s["turns"][0]["prompt"], 6)
    rows = [lm.logits]
    second = lm.continue_generation(s["turns"][1]["prompt"], 6)
    rows.append(lm.logits)
    assert [first, second] == [t["tokens"] for t in s["turns"]]
    want = np.load(os.path.join(HERE, s["logits"]))
    got = np.concatenate(rows)
    assert got.shape == want.shape
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-4 * max(1.0, np.abs(w).max())


def test_a_continued_batch_gives_tvms_tokens_and_logits():
    """``batch_turns``: two sequences through ``batch_prefill``, then a second turn of both through
    ``continue_batch`` (``batch_extend``), as MLC-LLM's engine runs them."""
    s = REF["scenarios"]["batch_turns"]
    lm = model(context_window_size=128, prefill_chunk_size=32, max_batch_size=4)
    turns = s["turns"]
    first = lm.generate_batch(turns[0]["prompts"], 4)
    rows = [lm.logits]
    second = lm.continue_batch(turns[1]["prompts"], 4)
    rows.append(lm.logits)
    assert [first, second] == [t["tokens"] for t in turns]
    for i, file in enumerate(s["logits"]):
        want = np.load(os.path.join(HERE, file))
        got = np.concatenate([r[i] for r in rows])
        assert got.shape == want.shape
        for g, w in zip(got, want):
            assert np.abs(g - w).max() <= 1e-4 * max(1.0, np.abs(w).max())
    # One prompt per sequence of the last batch.
    with pytest.raises(mblob.RunError, match="2 sequences of the last generation"):
        lm.continue_batch([turns[1]["prompts"][0]], 2)


def test_nothing_to_continue_before_a_batch():
    with pytest.raises(mblob.RunError, match="no generation to continue"):
        model(context_window_size=128, prefill_chunk_size=32, max_batch_size=4).continue_batch([[1], [2]], 2)


def test_a_missing_setting_is_named():
    with pytest.raises(mblob.RunError, match="context_window_size"):
        model()
    with pytest.raises(mblob.RunError, match="max_total_seq_len"):
        model(context_window_size=-1)
