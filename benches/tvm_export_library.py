#!/usr/bin/env python3
"""TVM's `export_library` with TVM's packers and with mblob's, on models with large params.

Run by hand in a TVM 0.19 environment with the mblob package importable:

    PYTHONPATH=<mblob site> /work/venvs/tvm019/bin/python benches/tvm_export_library.py \
        --sizes 64 512 --routes tvm-llvm mblob-llvm mblob-c --timeout 600
    ... --sizes 64 --routes tvm-c            # TVM's C fallback: minutes at 64 MiB

Each (size, route) runs in a fresh process: the model (`relu(x + w)`, `w` a float32 param of
SIZE MiB, a Relay graph-executor model) is built, then `export_library` is timed. Memory is
sampled from /proc (VmRSS every 5 ms) during the export: `peak_rss` is the process's highest
resident size during it, `delta_rss` that minus the size just before, and `child_rss` the
largest resident size of a child process (the compiler and linker TVM runs; a child forked
from the Python process counts the parent's resident pages until it execs, so this is at
least about half the parent's size whatever the tool). `blob_sha1` identifies the blob in
the written library (read after the timing): every route must give the one of `tvm-llvm`.
Results are printed as one JSON object per line.

Routes:
  tvm-llvm    TVM's default packer (ModulePackImportsToLLVM: the blob as an LLVM constant)
  tvm-c       TVM's fallback without LLVM (ModulePackImportsToC: the blob as C hex text, gcc)
  mblob-llvm  fpack_imports=mblob.tvm.fpack_imports (mblob's LLVM packer)
  mblob-c     fpack_imports=mblob.tvm.make_fpack_imports(backend="c") (no LLVM anywhere)
  mblob-link  mblob.tvm.export_library(lib, path): for this graph model TVM serializes the
              factory with empty parameters only, mblob writes the parameter arrays, and the
              host code is linked with a placeholder, the blob written into the library once
              (no LLVM needed either)
  mblob-link-generic  fpack_imports=mblob.tvm.fpack_blob (TVM serializes the imports, written
              as a raw blob) and fcompile=mblob.tvm.fcompile (the same link)
  tvm-llvm+fcompile  TVM's default packer, then fcompile=mblob.tvm.fcompile (the blob taken out
              of TVM's devc.o and written into the library)

--repeat N runs every (size, route) N times, the routes taking turns, and prints each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROUTES = ("tvm-llvm", "tvm-c", "mblob-llvm", "mblob-c", "mblob-link", "mblob-link-generic", "tvm-llvm+fcompile")


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def build(size_mib: int):
    import numpy as np
    import tvm
    from tvm import relay

    n = size_mib * (1 << 20) // 4
    x = relay.var("x", shape=(n,), dtype="float32")
    w = relay.var("w", shape=(n,), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.relu(x + w)))
    params = {"w": np.random.default_rng(0).standard_normal(n, dtype=np.float32)}
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target="llvm", params=params)


def fpack_for(route: str):
    if route in ("tvm-llvm", "tvm-llvm+fcompile"):
        return None
    if route == "tvm-c":
        import tvm

        pack_c = tvm.get_global_func("runtime.ModulePackImportsToC")

        def tvm_c(mod, is_system_lib, prefix, workspace):
            # What export_library does when TVM has no LLVM.
            path = os.path.join(workspace, f"{prefix}devc.c")
            with open(path, "w") as f:
                f.write(pack_c(mod, is_system_lib, prefix))
            return path

        return tvm_c
    import mblob.tvm

    if route == "mblob-llvm":
        return mblob.tvm.fpack_imports
    if route in ("mblob-link", "mblob-link-generic"):
        return mblob.tvm.fpack_blob
    return mblob.tvm.make_fpack_imports(backend="c")


def fcompile_for(route: str):
    if route in ("mblob-link", "mblob-link-generic", "tvm-llvm+fcompile"):
        import mblob.tvm

        return mblob.tvm.fcompile
    return None


def one(size_mib: int, route: str, options: list) -> dict:
    lib = build(size_mib)
    fpack = fpack_for(route)
    fcompile = fcompile_for(route)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "model.so")
        before = rss_bytes()
        peak = [before]
        done = threading.Event()

        def sample():
            while not done.wait(0.005):
                peak[0] = max(peak[0], rss_bytes())

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        start = time.perf_counter()
        kwargs = {"options": options} if options else {}
        if fpack is not None:
            kwargs["fpack_imports"] = fpack
        if fcompile is not None:
            kwargs["fcompile"] = fcompile
        if route == "mblob-link":
            import mblob.tvm

            mblob.tvm.export_library(lib, out, **{k: v for k, v in kwargs.items() if k == "options"})
        else:
            lib.export_library(out, **kwargs)
        wall = time.perf_counter() - start
        done.set()
        t.join()
        peak[0] = max(peak[0], rss_bytes())
        child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        so_bytes = os.path.getsize(out)
        # The blob's hash (outside the timed part): every route must embed TVM's bytes.
        import hashlib

        import mblob

        blob_sha1 = hashlib.sha1(mblob.read_blob(out)[0]).hexdigest()[:16]
    import tvm

    return {
        "tvm": tvm.__version__,
        "size_mib": size_mib,
        "route": route,
        "options": options,
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(peak[0] / 2**20),
        "delta_rss_mib": round((peak[0] - before) / 2**20),
        "child_rss_mib": round(child / 2**20),
        "so_mib": round(so_bytes / 2**20, 1),
        "blob_sha1": blob_sha1,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 512], help="param sizes in MiB")
    ap.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per (size, route) before it is stopped")
    ap.add_argument(
        "--link-option",
        action="append",
        default=[],
        help="an option for TVM's compile-and-link step (e.g. -fuse-ld=lld, with ld.lld on PATH)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (size, route), routes taking turns")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "ROUTE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.link_option)), flush=True)
        return 0
    for size in args.sizes:
        for route in [r for _ in range(args.repeat) for r in args.routes]:
            cmd = [sys.executable, __file__, "--one", str(size), route]
            cmd += [f"--link-option={o}" for o in args.link_option]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(json.dumps({"size_mib": size, "route": route, "timeout_s": args.timeout}), flush=True)
                continue
            lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
            if r.returncode != 0 or not lines:
                print(json.dumps({"size_mib": size, "route": route, "error": r.stderr[-2000:]}), flush=True)
            else:
                print(lines[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
