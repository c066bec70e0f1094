"""The native `Tensor` (what crosses between `mblob._native` and `mblob.runtime`) speaks DLPack
and numpy's array protocol: `numpy.from_dlpack(t)` and `numpy.asarray(t)` of a model's outputs
give TVM's outputs (the run goldens), a `Tensor` goes in as an input as it is, and any object
that offers only `__dlpack__` (no torch needed) is taken as an input."""

from __future__ import annotations

import numpy as np
import pytest

import mblob
from mblob import _native
from conftest import golden, manifest

RUN = manifest("run", "manifest.json")["models"]


class HostDLPack:
    """A foreign host array that offers DLPack only (as a torch CPU tensor would)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def _io(name: str):
    model = RUN[name]
    ins = [np.load(golden("run", i["file"])) for i in model["inputs"]]
    outs = [np.load(golden("run", o["file"])) for o in model["outputs"]]
    return model, ins, outs


@pytest.mark.parametrize("name", ["relax_mlp_tvm019", "relax_mlp_tvm027"])
def test_relax_outputs_are_tensors_that_dlpack_reads_as_tvms(name):
    model, ins, outs = _io(name)
    vm = _native.RelaxVm(mblob.load_module(golden("run", model["so"]))._library, (1, 0))
    (t,) = vm.invoke(model["entry"], ins)
    assert isinstance(t, _native.Tensor)
    assert (t.shape, t.dtype, t.device) == (outs[0].shape, str(outs[0].dtype), (1, 0))
    assert t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(t), outs[0])
    np.testing.assert_array_equal(np.asarray(t), outs[0])
    np.testing.assert_array_equal(t.numpy(), outs[0])


def test_tensor_and_dlpack_inputs_give_tvms_outputs():
    model, ins, outs = _io("relax_mlp_tvm027")
    vm = _native.RelaxVm(mblob.load_module(golden("run", model["so"]))._library, (1, 0))
    x = _native.Tensor.from_numpy(ins[0])
    (out,) = vm.invoke(model["entry"], [x])
    np.testing.assert_array_equal(np.from_dlpack(out), outs[0])
    # The input Tensor is read, not changed; a round trip through DLPack keeps its bytes.
    np.testing.assert_array_equal(np.from_dlpack(x), ins[0])
    # A DLPack-only object through the Python API, numpy out.
    py_vm = mblob.VirtualMachine(mblob.load_module(golden("run", model["so"])), mblob.cpu())
    np.testing.assert_array_equal(py_vm[model["entry"]](HostDLPack(ins[0])), outs[0])
    np.testing.assert_array_equal(py_vm[model["entry"]](x), outs[0])


@pytest.mark.parametrize("name", ["graph_mlp", "graph_two_outputs", "aot_mlp"])
def test_graph_outputs_are_tensors_that_dlpack_reads_as_tvms(name):
    model, ins, outs = _io(name)
    gmod = mblob.load_module(golden("run", model["so"]))[model["entry"]](mblob.cpu(0))
    for i, a in zip(model["inputs"], ins):
        gmod.set_input(i["name"], HostDLPack(a))
    gmod.run()
    for k, want in enumerate(outs):
        t = gmod._e.get_output(k)
        assert isinstance(t, _native.Tensor)
        np.testing.assert_array_equal(np.from_dlpack(t), want)
        np.testing.assert_array_equal(gmod.get_output(k), want)


class LegacyConsumer:
    """Hands numpy the unversioned capsule (`"dltensor"`), as a consumer of DLPack before 1.0
    gets it: `__dlpack__` without `max_version`."""

    def __init__(self, t) -> None:
        self._t = t

    def __dlpack__(self, stream=None, **_ignored):
        return self._t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@pytest.mark.parametrize("name", ["relax_mlp_tvm019", "relax_mlp_tvm027"])
def test_dlpack_hands_out_the_tensors_memory(name):
    model, ins, outs = _io(name)
    vm = _native.RelaxVm(mblob.load_module(golden("run", model["so"]))._library, (1, 0))
    (t,) = vm.invoke(model["entry"], ins)
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=(1, 0)))
    assert "dltensor_versioned" not in repr(t.__dlpack__())
    a, b = np.from_dlpack(t), np.from_dlpack(LegacyConsumer(t))
    np.testing.assert_array_equal(a, outs[0])
    np.testing.assert_array_equal(b, outs[0])
    # Both views are the tensor's memory: a write through one shows in the other and in the
    # tensor's own copy.
    assert np.shares_memory(a, b) and a.flags.writeable
    changed = outs[0].flat[0] + 1
    a.flat[0] = changed
    assert b.flat[0] == changed and t.numpy().flat[0] == changed
    # A copy asked for is one.
    c = np.from_dlpack(t, copy=True)
    assert not np.shares_memory(a, c)
    np.testing.assert_array_equal(c, a)
    # The views keep the memory alive after the tensor and its VM are gone.
    a.flat[0] = outs[0].flat[0]
    del t, vm
    import gc

    gc.collect()
    np.testing.assert_array_equal(a, outs[0])
    np.testing.assert_array_equal(b, outs[0])


def test_dlpack_keywords_follow_the_array_api():
    model, ins, _ = _io("relax_mlp_tvm027")
    t = _native.Tensor.from_numpy(ins[0])
    assert t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(t, device="cpu", copy=False), ins[0])
    with pytest.raises(BufferError, match="not on"):
        t.__dlpack__(dl_device=(2, 0), copy=False)
    with pytest.raises(TypeError):
        t.__dlpack__(None, (1, 0))  # max_version is keyword-only
