"""`mblob.inspect` on AOT and Relax models: an AOT model's inputs and outputs as TVM's metadata
gives them (with ``load=True``), a Relax executable's constants as TVM's ``stats`` lists them,
and the calls mblob cannot serve (fixtures ``tvm-goldens/run`` and ``inspect``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import mblob
from conftest import GOLDENS

INSPECT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "inspect"


def module(report, key):
    return next(m for m in report["modules"] if m["type_key"] == key)


def test_aot_inputs_and_outputs_are_tvms():
    tvm = json.loads((GOLDENS / "run" / "aot_mlp.json").read_text())
    so = GOLDENS / "run" / "aot_mlp.so"
    assert module(mblob.inspect(so), "AotExecutorFactory")["aot"]["inputs"] is None
    aot = module(mblob.inspect(so, load=True), "AotExecutorFactory")["aot"]
    assert [(i["name"], i["shape"], i["dtype"]) for i in aot["inputs"]] == [
        (i["name"], i["shape"], i["dtype"]) for i in tvm["inputs"]
    ]
    assert [(o["shape"], o["dtype"]) for o in aot["outputs"]] == [(o["shape"], o["dtype"]) for o in tvm["outputs"]]


def test_relax_constants_and_unsupported_calls():
    tvm = json.loads((INSPECT / "relax_consts_calls.json").read_text())
    relax = module(mblob.inspect(INSPECT / "relax_consts_calls.so"), "relax.VMExecutable")["relax"]
    assert relax["constant_pool_len"] == tvm["constant_pool_len"]
    want = tvm["tensor_constants"]
    assert [(c["index"], c["shape"], c["dtype"]) for c in relax["constants"]] == [
        (c["index"], c["shape"], c["dtype"]) for c in want
    ]
    assert relax["constants_bytes"] == sum(np.load(INSPECT / c["file"]).nbytes for c in want)
    # The package is built with mblob's `llm` feature: TVM's legacy KV cache builtin
    # (`vm.builtin.attention_kv_cache_append`) is served; the other call is in no registry.
    assert relax["unsupported_calls"] == ["my_ext.not_registered"]
    assert all(c in tvm["globals"] and c not in tvm["library_functions"] for c in relax["unsupported_calls"])
