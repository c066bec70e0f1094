"""TVM's Python API as TVM users write it, checked against what TVM 0.19 answered for the same
models (tests/fixtures/python-api/graph_api.json, made by its make.py with TVM 0.19): input
numbering with params, get_input_info's pair of dicts, get_output_info, get_input, load_params,
share_params, benchmark; the Relax VM's set_input / invoke_stateful / get_outputs /
time_evaluator against TVM's run outputs; DLPack arrays and TVM-like devices in; errors of the
mblob.Error family that are also ValueError / OSError / RuntimeError."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import mblob
from conftest import REPO, golden, manifest

API = json.loads((REPO / "tests" / "fixtures" / "python-api" / "graph_api.json").read_text())
RUN = manifest("run", "manifest.json")["models"]
TRIO = REPO / "tests" / "fixtures" / "trio"


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def info_as_json(info):
    shapes, dtypes = info
    return [{k: list(v) for k, v in shapes.items()}, dict(dtypes)]


@pytest.mark.parametrize("name", sorted(API["models"]))
def test_graph_module_answers_as_tvm(name):
    want = API["models"][name]
    model = RUN[name]
    gmod = mblob.load_module(golden("run", model["so"]))["default"](mblob.cpu(0))
    assert gmod.get_num_inputs() == want["get_num_inputs"]
    assert gmod.get_num_outputs() == want["get_num_outputs"]
    for probe, index in want["get_input_index"].items():
        assert gmod.get_input_index(probe) == index
    assert info_as_json(gmod.get_input_info()) == want["get_input_info"]
    assert info_as_json(gmod.get_output_info()) == want["get_output_info"]
    for i, spec in enumerate(want["get_input"]):
        a = gmod.get_input(i)
        assert list(a.shape) == spec["shape"] and str(a.dtype) == spec["dtype"]
    # The library's own params, as TVM's get_input read them.
    for p, digest in want["param_sha256"].items():
        assert sha(gmod.get_input(p)) == digest
        assert sha(gmod.get_input(gmod.get_input_index(p))) == digest
    assert gmod.get_input("no_such_input") is None
    x = np.load(golden("run", model["inputs"][0]["file"]))
    gmod.set_input(gmod.get_input_index(model["inputs"][0]["name"]), x)  # TVM's index
    assert sha(gmod.get_input(model["inputs"][0]["name"])) == want["get_input_after_set"]
    out = np.empty_like(x)
    assert gmod.get_input(0, out) is out and sha(out) == want["get_input_after_set"]
    gmod.run()
    np.testing.assert_array_equal(gmod.get_output(0), np.load(golden("run", model["outputs"][0]["file"])))


def trio_module():
    lib = mblob.load_module(TRIO / "m.so")
    return mblob.graph_executor.create((TRIO / "m.json").read_text(), lib, mblob.cpu(0))


def test_load_params_and_share_params_as_tvm():
    t = API["trio"]
    gmod = trio_module()
    before = t["before_load_params"]
    assert gmod.get_num_inputs() == before["get_num_inputs"]
    assert info_as_json(gmod.get_input_info()) == before["get_input_info"]
    assert info_as_json(gmod.get_output_info()) == before["get_output_info"]
    params = (TRIO / "m.params").read_bytes()
    gmod.load_params(params)
    after = t["after_load_params"]
    assert gmod.get_num_inputs() == after["get_num_inputs"]
    assert info_as_json(gmod.get_input_info()) == after["get_input_info"]
    for p, digest in after["param_sha256"].items():
        assert sha(gmod.get_input(p)) == digest
    other = trio_module()
    other.share_params(gmod, params)
    shared = t["after_share_params"]
    assert info_as_json(other.get_input_info()) == shared["get_input_info"]
    other.set_input("x", np.load(TRIO / "m.in.x.npy"))
    other.run()
    assert sha(other.get_output(0)) == shared["out0_sha256"]


class HostTensor:
    """The least a DLPack producer offers: __dlpack__ and __dlpack_device__ (numpy behind)."""

    def __init__(self, a, device=(1, 0)):
        self._a, self._device = a, device

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


class TvmLikeDevice:
    """tvm.cpu() of TVM 0.19: device_type and device_id."""

    device_type, device_id = 1, 0


class FfiLikeDevice:
    """tvm.cpu() of TVM 0.22+ (a tvm_ffi Device): dlpack_device_type() and index."""

    index = 0

    def dlpack_device_type(self):
        return 1


@pytest.mark.parametrize("dev", [TvmLikeDevice(), FfiLikeDevice(), (1, 0)], ids=["tvm019", "tvm_ffi", "pair"])
def test_dlpack_arrays_and_tvm_devices(dev):
    model = RUN["graph_mlp"]
    x = np.load(golden("run", model["inputs"][0]["file"]))
    view = mblob.runtime.as_numpy(HostTensor(x))
    assert np.shares_memory(view, x)  # zero-copy
    gmod = mblob.load_module(golden("run", model["so"]))["default"](dev)
    gmod.set_input("x", HostTensor(x))
    gmod.run()
    np.testing.assert_array_equal(gmod.get_output(0), np.load(golden("run", model["outputs"][0]["file"])))
    res = gmod.benchmark(dev, repeat=3, number=2, x=HostTensor(x))
    assert len(res.results) == 3 and all(r > 0 for r in res.results)
    assert res.min <= res.median <= res.max and res.mean == pytest.approx(np.mean(res.results))
    e2e = gmod.benchmark(dev, repeat=2, number=1, end_to_end=True, x=x)
    assert len(e2e.results) == 2 and "Execution time summary" in str(e2e)
    with pytest.raises(mblob.InputError, match=r"a tensor on cuda:0 is not supported"):
        gmod.set_input("x", HostTensor(x, (2, 0)))


def test_relax_vm_stateful_api_gives_tvms_outputs():
    model = RUN["relax_mlp_tvm027"]
    vm = mblob.VirtualMachine(mblob.load_module(golden("run", model["so"])), FfiLikeDevice())
    x = np.load(golden("run", model["inputs"][0]["file"]))
    want = np.load(golden("run", model["outputs"][0]["file"]))
    vm.set_input("main", HostTensor(x))
    vm.invoke_stateful("main")
    np.testing.assert_array_equal(vm.get_outputs("main"), want)
    param = vm._vm.function_params("main")[0]
    vm.set_input("main", **{param: x})
    vm.invoke_stateful("main")
    np.testing.assert_array_equal(vm.get_outputs("main"), want)
    res = vm.time_evaluator("main", TvmLikeDevice(), number=2, repeat=2)(x)
    assert len(res.results) == 2 and res.mean > 0
    res = vm.time_evaluator("invoke_stateful", mblob.cpu(), number=1, repeat=2)("main")
    assert len(res.results) == 2
    vm.save_function("main", "main_saved", x)
    np.testing.assert_array_equal(vm["main_saved"](), want)


def test_bad_input_raises_the_family_with_python_names(tmp_path):
    for cls, builtin in [
        (mblob.InputError, ValueError),
        (mblob.FormatError, ValueError),
        (mblob.FileError, OSError),
        (mblob.LoadError, OSError),
        (mblob.RunError, RuntimeError),
    ]:
        assert issubclass(cls, mblob.Error) and issubclass(cls, builtin)
    gmod = trio_module()
    with pytest.raises(ValueError, match=r"GraphModule.get_input: input index 9 is out of range"):
        gmod.get_input(9)
    with pytest.raises(mblob.InputError, match=r"GraphModule.load_params: params_bytes must be bytes"):
        gmod.load_params("m.params")
    with pytest.raises(mblob.InputError, match=r"GraphModule.share_params: other must be a GraphModule"):
        gmod.share_params(object(), b"")
    with pytest.raises(mblob.InputError, match=r"GraphModule.benchmark: func_name must be 'run'"):
        gmod.benchmark(mblob.cpu(), func_name="nope")
    with pytest.raises(mblob.InputError, match=r"graph_executor.create: str is not a device"):
        mblob.graph_executor.create((TRIO / "m.json").read_text(), mblob.load_module(TRIO / "m.so"), "cpu")
    with pytest.raises(mblob.InputError, match=r"GraphModule.set_input: input `x`: a dict is not an array"):
        gmod.set_input("x", {})
    with pytest.raises(mblob.RunError):
        gmod.set_input("x", np.zeros((3, 3), "float32"))
    vm = mblob.VirtualMachine(mblob.load_module(golden("run", RUN["relax_mlp_tvm027"]["so"])))
    with pytest.raises(mblob.InputError, match=r"VirtualMachine.invoke_stateful: call VirtualMachine.set_input"):
        vm.invoke_stateful("main")
    with pytest.raises(mblob.InputError, match=r"VirtualMachine.get_outputs: call VirtualMachine.invoke_stateful"):
        vm.get_outputs("main")
    with pytest.raises(mblob.InputError, match=r"VirtualMachine.set_input: no VM function 'nope'"):
        vm.set_input("nope")
    with pytest.raises(mblob.InputError, match=r"has no parameter 'zz'"):
        vm.set_input("main", zz=np.zeros(1))
    bad = tmp_path / "x.so"
    bad.write_bytes(b"\x7fELF" + b"\0" * 60)
    with pytest.raises(OSError):
        mblob.load_module(tmp_path / "missing.so")
