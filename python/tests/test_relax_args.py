"""Relax functions called from Python with arguments beyond arrays, against TVM 0.27 (the
fixtures of tests/fixtures/relax-vm, made by TVM's own VM): shapes as tuples of ints, prim
values as Python scalars, strings, nested tuples in and out (1-tuples kept), closures, views;
bad arguments raise with TVM's check messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mblob
from conftest import REPO

DIR = REPO / "tests" / "fixtures" / "relax-vm"
MODELS = json.loads((DIR / "manifest.json").read_text())["models"]


def value(tree: dict):
    """A manifest value tree as the Python value TVM's VM takes or gives."""
    if "tuple" in tree:
        return tuple(value(t) for t in tree["tuple"])
    if "str" in tree:
        return tree["str"]
    if "null" in tree:
        return None
    kind, file = next(iter(tree.items()))
    a = np.load(DIR / file)
    return {"tensor": lambda: a, "shape": lambda: tuple(int(x) for x in a),
            "int": lambda: int(a), "float": lambda: float(a)}[kind]()


def assert_same(got, want, where=""):
    """Same structure and types, arrays equal bit for bit."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), where
        assert got.dtype == want.dtype and got.shape == want.shape, where
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (where, got)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


CASES = [(m, i) for m, meta in MODELS.items() for i, c in enumerate(meta["cases"])]


@pytest.mark.parametrize("model,index", CASES)
def test_cases_give_tvms_results_or_errors(model, index):
    meta = MODELS[model]
    case = meta["cases"][index]
    vm = mblob.VirtualMachine(mblob.load_module(DIR / meta["so"]), mblob.cpu())
    args = [value(a) for a in case["inputs"]]
    f = vm[case["function"]]
    if "error" in case:
        with pytest.raises(mblob.RunError) as e:
            f(*args)
        err = case["error"]
        assert f"{err['kind']}: {err['message']}" in str(e.value)
    else:
        assert_same(f(*args), value(case["outputs"]), f"{model}.{case['function']}")


def test_structure_of_results():
    """A 1-tuple stays a tuple, shapes are tuples of ints, prims Python scalars."""
    vm = mblob.VirtualMachine(mblob.load_module(DIR / "relax_vm_args.so"), mblob.cpu())
    x = np.arange(6, dtype="float32").reshape(2, 3)
    (y,) = vm["one_tuple"](x)
    np.testing.assert_array_equal(y, x * x)
    a, b, c = np.ones(2, "float32"), np.ones(2, "float32"), np.arange(3, dtype="float32")
    (s,), (c2, (a2,)), shape = vm["tuples"]((a, (b, c)))
    assert shape == (3,) and all(type(d) is int for d in shape)
    _, k, f = vm["prim_args"](np.zeros(3, "float32"), np.int64(9), 0.5)
    assert (k, f) == (9, 0.5) and type(k) is int and type(f) is float
    y, s = vm["shape_arg"](np.arange(6, dtype="float32"), (3, 2))
    assert y.shape == (3, 2) and s == (2, 3, 6)


def test_llm_builtin_refused_when_called_only():
    vm = mblob.VirtualMachine(mblob.load_module(DIR / "relax_vm_llm.so"), mblob.cpu())
    x = np.arange(3, dtype="float32")
    np.testing.assert_array_equal(vm["fine"](x), x + x)
    with pytest.raises(mblob.RunError, match="vm.builtin.kv_state_clear"):
        vm["cache"](x)
