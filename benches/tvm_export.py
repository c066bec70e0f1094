"""TVM 0.19's export_library against mblob on the same model, a graph with one large parameter.

Run by hand (minutes, a few GiB of disk), with TVM 0.19 from PyPI (see ci/tvm-compat.sh):
    cargo build --release
    /path/to/venv/bin/python benches/tvm_export.py [MiB] [reps]

It builds a Relay model `y = x * w` with a float32 parameter `w` of MiB MiB (default 512),
then, best of `reps` (default 2):
- TVM: `export_library("tvm.so")` (its default packer: `_PackImportsToLLVM` + the system
  compiler's link), timed;
- mblob: `mblob pack --from tvm.so --host lib0.o -o mblob.so` (the same module tree, re-packed
  through mblob's default route), timed, with the host object TVM wrote (`export_library`
  to a `.tar`);
and checks that TVM loads mblob's library and gets the same output. Prints one JSON line.
"""
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor

MBLOB = os.environ.get("MBLOB", os.path.join(os.path.dirname(__file__), "..", "target", "release", "mblob"))


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    n = mib * (1 << 20) // 4
    x = relay.var("x", shape=(n,), dtype="float32")
    w = relay.var("w", shape=(n,), dtype="float32")
    func = relay.Function([x, w], x * w)
    rng = np.random.default_rng(7)
    weight = rng.random(n, dtype=np.float32)
    t = time.perf_counter()
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(func), target="llvm", params={"w": weight})
    build_s = time.perf_counter() - t
    work = tempfile.mkdtemp(dir=os.environ.get("MBLOB_BENCH_DIR"))
    tvm_so = os.path.join(work, "tvm.so")
    tvm_s = []
    for _ in range(reps):
        if os.path.exists(tvm_so):
            os.remove(tvm_so)
        t = time.perf_counter()
        lib.export_library(tvm_so)
        tvm_s.append(time.perf_counter() - t)
    tar = os.path.join(work, "tvm.tar")
    lib.export_library(tar)
    with tarfile.open(tar) as f:
        f.extract("lib0.o", work)
    lib0 = os.path.join(work, "lib0.o")
    os.remove(tar)
    ours = os.path.join(work, "mblob.so")
    mblob_s = []
    for _ in range(reps):
        if os.path.exists(ours):
            os.remove(ours)
        t = time.perf_counter()
        subprocess.run([MBLOB, "pack", "--from", tvm_so, "--host", lib0, "-o", ours, "-q"], check=True)
        mblob_s.append(time.perf_counter() - t)
    # TVM loads mblob's library and computes the same thing.
    xs = rng.random(n, dtype=np.float32)
    outs = []
    for path in (tvm_so, ours):
        m = graph_executor.GraphModule(tvm.runtime.load_module(path)["default"](tvm.cpu()))
        m.set_input("x", xs)
        m.run()
        outs.append(m.get_output(0).numpy())
    same = bool(np.array_equal(outs[0], outs[1]))
    print(
        json.dumps(
            {
                "param_mib": mib,
                "relay_build_s": round(build_s, 3),
                "tvm_export_library_s": [round(s, 3) for s in tvm_s],
                "mblob_pack_s": [round(s, 3) for s in mblob_s],
                "ratio_best": round(min(tvm_s) / min(mblob_s), 2),
                "tvm_so_bytes": os.path.getsize(tvm_so),
                "mblob_so_bytes": os.path.getsize(ours),
                "same_output": same,
                "loadavg": os.getloadavg(),
            }
        )
    )
    for p in (tvm_so, ours, lib0):
        os.remove(p)
    os.rmdir(work)


if __name__ == "__main__":
    main()
