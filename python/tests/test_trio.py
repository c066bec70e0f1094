"""TVM's classic trio in Python (tests/fixtures/trio, made by TVM 0.19): a host library, its
graph JSON and a params file run with ``mblob.graph_executor.create`` + ``load_params``, as
TVM's ``graph_executor`` ran them, giving TVM's output bit for bit; bad input raises."""

from __future__ import annotations

import numpy as np
import pytest

import mblob
from conftest import REPO

TRIO = REPO / "tests" / "fixtures" / "trio"


def trio(name: str):
    p = TRIO / name
    assert p.exists(), f"missing fixture {p}"
    return p


def test_create_and_load_params_give_tvms_output():
    lib = mblob.load_module(trio("m.so"))
    gmod = mblob.graph_executor.create(trio("m.json").read_text(), lib, mblob.cpu(0))
    gmod.load_params(trio("m.params").read_bytes())
    gmod.set_input("x", np.load(trio("m.in.x.npy")))
    gmod.run()
    got = gmod.get_output(0)
    want = np.load(trio("m.out.0.npy"))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # A bytearray works as TVM's load_params takes it, and a device list as create does.
    again = mblob.graph_executor.create(trio("m.json").read_text(), lib, [mblob.cpu(0)])
    again.load_params(bytearray(trio("m.params").read_bytes()))
    again.run(x=np.load(trio("m.in.x.npy")))
    assert np.array_equal(again.get_output(0).view(np.uint32), want.view(np.uint32))


def test_bad_trio_input_raises_input_errors():
    lib = mblob.load_module(trio("m.so"))
    graph = trio("m.json").read_text()
    gmod = mblob.graph_executor.create(graph, lib, mblob.cpu(0))
    with pytest.raises(mblob.InputError, match="not a params file"):
        gmod.load_params(graph.encode())
    with pytest.raises(mblob.InputError, match="param `p0`"):
        other = mblob.graph_executor.create(graph.replace("[1, 8, 4]", "[1, 4, 8]"), lib)
        other.load_params(trio("m.params").read_bytes())
    with pytest.raises(mblob.InputError, match="dense_pack_sub_nn_relu"):
        mblob.graph_executor.create(graph.replace("dense_pack_add_nn_relu", "dense_pack_sub_nn_relu"), lib)
    with pytest.raises(mblob.InputError, match="graph JSON"):
        mblob.graph_executor.create("{}", lib)
    with pytest.raises(mblob.InputError, match="graph JSON text"):
        mblob.graph_executor.create(trio("m.json").read_bytes(), lib)
