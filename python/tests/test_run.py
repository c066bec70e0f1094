"""Load and run through the Python API: the run goldens give TVM's outputs, host functions
compute what TVM's did, libraries that mblob exported or re-packed load back and run, and
errors are exceptions."""

from __future__ import annotations

import os

import numpy as np
import pytest

import mblob
from conftest import golden, manifest

RUN = manifest("run", "manifest.json")["models"]


def inputs_of(model: dict) -> list:
    return [(i["name"], np.load(golden("run", i["file"]))) for i in model["inputs"]]


def outputs_of(model: dict) -> list:
    return [np.load(golden("run", o["file"])) for o in model["outputs"]]


@pytest.mark.parametrize("name", sorted(RUN))
def test_run_goldens_give_tvms_outputs(name):
    model = RUN[name]
    m = mblob.load_module(golden("run", model["so"]))
    if model["executor"] == "relax":
        vm = mblob.VirtualMachine(m, mblob.cpu())
        got = vm[model["entry"]](*[a for _, a in inputs_of(model)])
        got = list(got) if isinstance(got, tuple) else [got]
    else:
        gmod = m[model["entry"]](mblob.cpu(0))
        for n, a in inputs_of(model):
            gmod.set_input(n, a)
        gmod.run()
        got = [gmod.get_output(i) for i in range(gmod.get_num_outputs())]
    want = outputs_of(model)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_module_tree_and_device():
    m = mblob.load_module(golden("run", "graph_mlp.so"))
    assert m.type_key == "GraphExecutorFactory"
    assert [i.type_key for i in m.imported_modules] == ["library"]
    assert mblob.cpu(0) == mblob.Device(1, 0) and mblob.cpu(1) != mblob.cpu(0)


def test_host_function_writes_its_output():
    m = mblob.load_module(golden("dso_add_one.so"))
    a = np.load(golden("dso_add_one.in.A.npy"))
    b = np.zeros_like(a)
    m["add_one"](a, b)
    np.testing.assert_array_equal(b, np.load(golden("dso_add_one.out.B.npy")))


def test_host_function_writes_into_a_native_tensor():
    from mblob import _native

    m = mblob.load_module(golden("dso_add_one.so"))
    a = np.load(golden("dso_add_one.in.A.npy"))
    b = _native.Tensor.from_numpy(np.zeros_like(a))
    view = np.from_dlpack(b)
    m["add_one"](_native.Tensor.from_numpy(a), b)
    want = np.load(golden("dso_add_one.out.B.npy"))
    # Passed by reference: the function's output is in the tensor and in a view of it.
    np.testing.assert_array_equal(b.numpy(), want)
    np.testing.assert_array_equal(view, want)


def test_exported_library_loads_back_and_runs(tmp_path):
    out = tmp_path / "classic.so"
    mblob.pack(golden("graph_dense_relu.so"), out, host=[golden("graph_dense_relu.lib0.o")])
    gmod = mblob.load_module(out)["default"](mblob.cpu())
    gmod.set_input("x", np.load(golden("graph_dense_relu.in.x.npy")))
    gmod.run()
    np.testing.assert_array_equal(gmod.get_output(0), np.load(golden("graph_dense_relu.out.0.npy")))


@pytest.mark.parametrize(
    "version,layout", [("tvm-0.19.0", "classic"), ("tvm-0.21.0", "classic-0.21"), ("tvm-0.27.0.post1", "ffi")]
)
def test_repacked_relax_runs(tmp_path, version, layout):
    d = ("other_versions", version)
    out = tmp_path / "relax.so"
    mblob.pack(golden(*d, "relax_add_mul.so"), out, host=[golden(*d, "relax_add_mul.lib0.o")], layout=layout)
    vm = mblob.VirtualMachine(mblob.load_module(out), mblob.cpu())
    x, y = np.load(golden(*d, "relax_add_mul.in.x.npy")), np.load(golden(*d, "relax_add_mul.in.y.npy"))
    np.testing.assert_array_equal(vm["main"](x, y), np.load(golden(*d, "relax_add_mul.out.0.npy")))


def test_run_errors_are_exceptions(tmp_path):
    m = mblob.load_module(golden("run", "graph_mlp.so"))
    gmod = m["default"](mblob.cpu())
    with pytest.raises(mblob.RunError, match="no input named `y`"):
        gmod.set_input("y", np.zeros((2, 64), "float32"))
    with pytest.raises(mblob.RunError, match=r"input `x`: expected float32 \[2, 64\], got float32 \[3, 64\]"):
        gmod.set_input("x", np.zeros((3, 64), "float32"))
    with pytest.raises(mblob.RunError, match="output index 5 is out of range"):
        gmod.get_output(5)
    with pytest.raises(mblob.InputError, match="no function `nope`"):
        m["nope"]
    with pytest.raises(mblob.RunError, match="not supported on cuda:0"):
        m["default"](mblob.Device(2, 0))
    with pytest.raises(mblob.RunError, match="Relax executable|relax"):
        mblob.VirtualMachine(m, mblob.cpu())
    text = tmp_path / "x.so"
    text.write_text("not a library")
    with pytest.raises(mblob.Error, match="x.so"):
        mblob.load_module(text)


RELAX_027 = sorted(p.stem for p in golden("relax", "tvm-0.27").glob("*.json"))


@pytest.mark.parametrize("name", RELAX_027)
def test_relax_goldens_of_tvm_027(name):
    """Control flow, dynamic shapes, fused kernels, tuples and calls between VM functions:
    each recorded run gives TVM's outputs."""
    d = ("relax", "tvm-0.27")
    spec = manifest(*d, f"{name}.json")
    vm = mblob.VirtualMachine(mblob.load_module(golden(*d, f"{name}.so")), mblob.cpu())
    assert spec["runs"]
    for run in spec["runs"]:
        got = vm["main"](*[np.load(golden(*d, i["file"])) for i in run["inputs"]])
        got = list(got) if isinstance(got, tuple) else [got]
        want = [np.load(golden(*d, o["file"])) for o in run["outputs"]]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


DEVICE_RUN = golden("..", "device-run")
DEVICE_MODELS = manifest("..", "device-run", "manifest.json")["models"]


def device_of(model: dict):
    return {"opencl": mblob.opencl, "cuda": mblob.cuda}[model["device"]](0)


@pytest.mark.parametrize("name", sorted(DEVICE_MODELS))
def test_device_models_run_on_their_device_with_tvms_outputs(name):
    """Models TVM built for OpenCL or CUDA run on such a device and give TVM's CPU outputs of
    the same model within rtol * max(1, max|ref|). OpenCL runs on pocl here and in CI; a CUDA
    model is skipped (shown as skipped) where no NVIDIA driver and GPU are found."""
    model = DEVICE_MODELS[name]
    m = mblob.load_module(DEVICE_RUN / model["so"])
    dev = device_of(model)
    cases = model.get("cases") or [model]
    for case in cases:
        ins = [(i["name"], np.load(DEVICE_RUN / i["file"])) for i in case["inputs"]]
        want = [np.load(DEVICE_RUN / o["file"]) for o in case["outputs"]]
        try:
            if model["executor"] == "relax":
                vm = mblob.VirtualMachine(m, dev)
                got = vm[model["entry"]](*[a for _, a in ins])
                got = list(got) if isinstance(got, tuple) else [got]
            else:
                gmod = m[model["entry"]](dev)
                for n, a in ins:
                    gmod.set_input(n, a)
                gmod.run()
                got = [gmod.get_output(i) for i in range(gmod.get_num_outputs())]
        except mblob.Error as e:
            no_gpu = "no CUDA driver found" in str(e) or "no CUDA device" in str(e)
            if model["device"] == "cuda" and no_gpu and not os.environ.get("MBLOB_REQUIRE_CUDA"):
                pytest.skip(f"no NVIDIA GPU here: {e}")
            raise
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            scale = max(1.0, float(np.abs(w).max()))
            assert float(np.abs(g - w).max()) <= model["rtol"] * scale


def test_device_names_and_wrong_device():
    assert mblob.opencl(1) == mblob.Device(4, 1)
    assert mblob.cuda() == mblob.Device(2, 0)
    assert repr(mblob.opencl(0)) == "mblob.Device(opencl, 0)"
    m = mblob.load_module(DEVICE_RUN / "dev_relax_mlp_opencl.so")
    with pytest.raises(mblob.RunError, match="not supported on cuda:0"):
        mblob.VirtualMachine(m, mblob.cuda(0))
