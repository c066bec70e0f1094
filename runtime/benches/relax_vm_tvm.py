"""TVM's own per-inference time for a relax golden: `python relax_vm_tvm.py NAME` (run from
this directory, with TVM 0.27 from PyPI for the *_tvm027 models). Uses TVM's time_evaluator
(C++ timing loop, no Python per call) with the same number of runs as relax_vm.rs."""
import os
import sys

import numpy as np
import tvm
from tvm import relax

d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/tvm-goldens/run")
for name in sys.argv[1:] or ["relax_mlp_tvm027"]:
    lib = tvm.runtime.load_module(os.path.join(d, name + ".so"))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    x = tvm.runtime.tensor(np.load(os.path.join(d, name + ".in.x.npy")))
    f = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=5000, min_repeat_ms=0)
    r = f(x)
    res = sorted(r.results)
    print(f"| {name} (TVM {tvm.__version__}) | {len(res)} | {r.mean * 1e6:.2f} | {r.median * 1e6:.2f} | {res[0] * 1e6:.2f} |")
