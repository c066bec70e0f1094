"""Makes the models of benches/constants_rss.sh (run by hand; large, written outside the repo).

    /path/to/tvm-0.27-venv/bin/python benches/constants_model.py relax DIR [MIB]
    /path/to/tvm-0.19-venv/bin/python benches/constants_model.py graph DIR [MIB]

relax (TVM 0.27, `tvm.compile(mod, target="llvm")` + `export_library`): `main(x)` of four
matmuls `x @ W_k` (and a ReLU between them) whose weights are bound constants, MIB MiB in all
(default 256: four float32 4096 x 4096 matrices), written as DIR/relax_consts.so with its input
DIR/relax_consts.in.x.npy and TVM's output DIR/relax_consts.out.npy.

graph (TVM 0.19 Relay, `relay.build` + `export_library`): the same chain as a graph executor
factory whose weights are params (`relay.build(..., params=...)`): DIR/graph_params.so (params
in the library's blob), DIR/graph_params.lib.so (`get_lib()` alone), DIR/graph_params.json and
DIR/graph_params.params (`save_param_dict`) for `mblob run LIB --graph --params`, and the input
and TVM's output (DIR/graph_params.in.x.npy, DIR/graph_params.out.npy).
"""
import os
import sys

import numpy as np
import tvm

LAYERS = 4


def weights(mib):
    n = int(round((mib * (1 << 20) / 4 / LAYERS) ** 0.5))
    rng = np.random.default_rng(23)
    ws = [(rng.standard_normal((n, n), dtype=np.float32) / np.float32(n**0.5)) for _ in range(LAYERS)]
    x = rng.standard_normal((1, n), dtype=np.float32)
    return n, ws, x


def relax_model(out, mib):
    from tvm import relax
    from tvm.script import relax as R

    n, ws, x = weights(mib)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", R.Tensor((1, n), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            h = xv
            for k, w in enumerate(ws):
                h = bb.emit(relax.op.matmul(h, relax.const(w)))
                if k + 1 < len(ws):
                    h = bb.emit(relax.op.nn.relu(h))
            y = bb.emit_output(h)
        bb.emit_func_output(y)
    ex = tvm.compile(bb.get(), target="llvm")
    path = os.path.join(out, "relax_consts.so")
    ex.export_library(path)
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    y = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.save(os.path.join(out, "relax_consts.in.x.npy"), x)
    np.save(os.path.join(out, "relax_consts.out.npy"), y)
    print(f"{path}: {n}x{n} x {LAYERS} float32 constants, {sum(w.nbytes for w in ws) / (1 << 20):.1f} MiB")


def graph_model(out, mib):
    from tvm import relay
    from tvm.contrib import graph_executor

    n, ws, x = weights(mib)
    xv = relay.var("x", shape=(1, n), dtype="float32")
    params = {}
    h = xv
    wvars = []
    for k, w in enumerate(ws):
        # dense takes the weight as (units, in): W_k transposed, so y = x @ W_k.
        wv = relay.var(f"w{k}", shape=(n, n), dtype="float32")
        wvars.append(wv)
        params[f"w{k}"] = np.ascontiguousarray(w.T)
        h = relay.nn.dense(h, wv)
        if k + 1 < len(ws):
            h = relay.nn.relu(h)
    func = relay.Function([xv] + wvars, h)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(func), target="llvm", params=params)
    path = os.path.join(out, "graph_params.so")
    lib.export_library(path)
    lib.get_lib().export_library(os.path.join(out, "graph_params.lib.so"))
    with open(os.path.join(out, "graph_params.json"), "w") as f:
        f.write(lib.get_graph_json())
    with open(os.path.join(out, "graph_params.params"), "wb") as f:
        f.write(relay.save_param_dict(lib.get_params()))
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("x", x)
    m.run()
    np.save(os.path.join(out, "graph_params.in.x.npy"), x)
    np.save(os.path.join(out, "graph_params.out.npy"), m.get_output(0).numpy())
    total = sum(v.numpy().nbytes for v in lib.get_params().values())
    print(f"{path}: {len(lib.get_params())} params, {total / (1 << 20):.1f} MiB")


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    mib = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    os.makedirs(out, exist_ok=True)
    {"relax": relax_model, "graph": graph_model}[kind](out, mib)
