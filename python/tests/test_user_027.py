"""A new user's Relax models for TVM 0.27 (tests/fixtures/user-0.27, outputs and errors made by
TVM's own VM): an nn.Module MLP with a top-p filter (sort, argsort, cumsum, where), R.topk with
largest=False, R.unique with counts on floats, R.nonzero on bools, R.strided_slice with prim
bounds, a (Tensor, Shape) tuple parameter, (Tensor, Prim, Shape) results, shape variables
shared between parameters and across a call, R.call_pure_packed of vm.builtins. Called with
mblob.VirtualMachine as a TVM user calls tvm.relax.VirtualMachine: every result equals TVM's
bit for bit, every bad argument raises with TVM's message."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mblob
from conftest import REPO

DIR = REPO / "tests" / "fixtures" / "user-0.27"
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
            "int": lambda: int(a), "float": lambda: float(a), "bool": lambda: bool(a)}[kind]()


def assert_same(got, want, where=""):
    """Same structure and types, arrays equal bit for bit."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), where
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert got.tobytes() == want.tobytes(), where
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (where, got)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def vm(model: str) -> mblob.VirtualMachine:
    return mblob.VirtualMachine(mblob.load_module(DIR / MODELS[model]["so"]), mblob.cpu())


CASES = [(m, i) for m, meta in MODELS.items() for i, c in enumerate(meta["cases"])]


@pytest.mark.parametrize("model,index", CASES)
def test_cases_give_tvms_results_or_errors(model, index):
    case = MODELS[model]["cases"][index]
    f = vm(model)[case["function"]]
    args = [value(a) for a in case["inputs"]]
    if "error" in case:
        with pytest.raises(mblob.RunError) as e:
            f(*args)
        err = case["error"]
        assert f"{err['kind']}: {err['message']}" in str(e.value)
    else:
        assert_same(f(*args), value(case["outputs"]), f"{model}.{case['function']}")


def test_stateful_calls_with_keywords_give_tvms_results():
    """set_input with keyword arguments (the nn.Module's dotted parameter names too),
    invoke_stateful, get_outputs: TVM's results of the same arguments."""
    case = MODELS["user_mlp"]["cases"][0]
    names = ["x", "top_p"] + MODELS["user_mlp"]["params"]
    args = dict(zip(names, (value(a) for a in case["inputs"])))
    m = vm("user_mlp")
    m.set_input("forward", args.pop("x"), **args)
    m.invoke_stateful("forward")
    assert_same(m.get_outputs("forward"), value(case["outputs"]), "forward")
    timed = m.time_evaluator("invoke_stateful", mblob.cpu(), number=2, repeat=2)("forward")
    assert len(timed.results) == 2 and timed.min > 0


def test_arrays_in_through_dlpack():
    """A host array that only speaks DLPack is read as numpy reads it."""

    class OnlyDlpack:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    case = MODELS["user_sym"]["cases"][0]
    x, y = (value(a) for a in case["inputs"])
    got = vm("user_sym")["pair"](OnlyDlpack(x), OnlyDlpack(y))
    assert_same(got, value(case["outputs"]), "pair")
