"""Models a new user wrote against issue 21's TVM 0.19 features (``tests/fixtures/user-0.19``,
made and run by TVM 0.19), through the Python API: graph models through
``load_module(...)["default"]``, the classic trio through ``graph_executor.create`` +
``load_params``, Relay VM executables through ``mblob.relay_vm``, whose results keep TVM's
nesting of tuples. Every output equals TVM's bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mblob
from mblob import graph_executor

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "user-0.19"
CASES = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
RUNNABLE = [c for c in CASES if c["kind"] in ("graph", "relay-vm", "trio")]


def leaves(v):
    if isinstance(v, tuple):
        return [x for f in v for x in leaves(f)]
    return [v]


def same(got, want_file, what):
    want = np.load(FIXTURES / want_file)
    assert isinstance(got, np.ndarray), what
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert got.tobytes() == want.tobytes(), what


@pytest.mark.parametrize("case", RUNNABLE, ids=[c["case"] for c in RUNNABLE])
def test_outputs_equal_tvms(case):
    name = case["case"]
    lib = mblob.load_module(FIXTURES / case["library"])
    for r, run in enumerate(case["runs"]):
        inputs = [(n, np.load(FIXTURES / f)) for n, f in run["inputs"]]
        if case["kind"] == "relay-vm":
            outs = leaves(mblob.relay_vm(lib).invoke("main", *[a for _, a in inputs]))
        else:
            if case["kind"] == "trio":
                g = graph_executor.create((FIXTURES / case["graph"]).read_text(), lib, mblob.cpu(0))
                g.load_params((FIXTURES / case["params"]).read_bytes())
            else:
                g = lib["default"](mblob.cpu(0))
            g.run(**dict(inputs))
            outs = [g.get_output(i) for i in range(g.get_num_outputs())]
        assert len(outs) == len(run["outputs"]), name
        for k, (got, want) in enumerate(zip(outs, run["outputs"])):
            same(got, want, (name, r, k))


def test_relay_vm_results_keep_tvms_tuple_nesting():
    case = next(c for c in CASES if c["case"] == "vm_nested")
    run = case["runs"][0]
    vm = mblob.relay_vm(mblob.load_module(FIXTURES / case["library"]))
    out = vm["main"](*[np.load(FIXTURES / f) for _, f in run["inputs"]])

    def check(got, structure):
        # `structure` is TVM's nesting: a list per ADT, a leaf's output file index.
        if isinstance(structure, list):
            assert isinstance(got, tuple) and len(got) == len(structure), (got, structure)
            for g, s in zip(got, structure):
                check(g, s)
        else:
            same(got, run["outputs"][structure], structure)

    assert case["structure"] == [[0, [1]], 2]
    check(out, case["structure"])
    # What a TVM user writes: the one-field tuple is indexed, not the array.
    same(out[0][1][0], run["outputs"][1], "out[0][1][0]")
