"""The Relay VM through the Python API: executables TVM 0.19's ``relay.vm.compile`` made and
``export_library`` packed (``tests/fixtures/relay-vm``) give TVM's outputs bit for bit, through
``mblob.relay_vm`` (``invoke``, ``run``, ``vm[name]``); errors are exceptions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mblob

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "relay-vm"
CASES = json.loads((FIXTURES / "manifest.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_relay_vm_gives_tvms_outputs(case):
    name = case["case"]
    vm = mblob.relay_vm(mblob.load_module(FIXTURES / case["library"]), mblob.cpu())
    inputs = [np.load(FIXTURES / f"{name}.in.{i}.npy") for i in range(case["inputs"])]
    out = vm.invoke(case["function"], *inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    assert len(outs) == case["outputs"]
    for i, got in enumerate(outs):
        want = np.load(FIXTURES / f"{name}.out.{i}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape, (name, i)
        assert got.tobytes() == want.tobytes(), (name, i)


def test_run_getitem_and_functions():
    mod = mblob.load_module(FIXTURES / "loop.so")
    assert mod.type_key == "VMExecutable"
    vm = mblob.relay_vm(mod)
    names = dict(vm.functions())
    assert names["main"] == ["n", "x"]
    assert "loop" in names
    n, x = (np.load(FIXTURES / f"loop.0.in.{i}.npy") for i in range(2))
    want = np.load(FIXTURES / "loop.0.out.0.npy")
    assert vm.run(n, x).tobytes() == want.tobytes()
    assert vm["main"](n, x).tobytes() == want.tobytes()
    # `loop(i, n, x)` called directly from 0 is `main`.
    assert vm["loop"](np.array(0, "int32"), n, x).tobytes() == want.tobytes()


def test_errors_are_exceptions():
    vm = mblob.relay_vm(mblob.load_module(FIXTURES / "loop.so"))
    with pytest.raises(mblob.InputError, match="nope"):
        vm["nope"]
    with pytest.raises(mblob.RunError, match="takes 2 arguments"):
        vm.invoke("main", np.zeros((2, 3), "float32"))
    with pytest.raises(mblob.RunError, match="cannot find function nope"):
        vm.invoke("nope")
    with pytest.raises(mblob.RunError, match="CPU"):
        mblob.relay_vm(mblob.load_module(FIXTURES / "loop.so"), mblob.cuda(0))
    # A graph library holds no Relay VM executable.
    graph = Path(__file__).resolve().parents[2] / "tests/fixtures/tvm-goldens/graph_dense_relu.so"
    with pytest.raises(mblob.RunError, match="no Relay VM executable"):
        mblob.relay_vm(mblob.load_module(graph))
