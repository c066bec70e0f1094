"""Times TVM 0.19's own executor on a .so: the per-run time of `run`, as `mblob run --repeat`
reports it (mean, median, min over N single runs, after one warm-up run). Used by
benches/run_vs_tvm.sh; needs TVM 0.19 from PyPI (see ci/tvm-compat.sh)."""
import json
import statistics
import sys

import numpy as np
import tvm
from tvm.contrib import graph_executor
from tvm.runtime.executor import AotModule

so, executor, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
inputs = dict(a.split("=", 1) for a in sys.argv[4:])
lib = tvm.runtime.load_module(so)
dev = tvm.cpu(0)
if executor == "aot":
    m = AotModule(lib["default"](dev))
else:
    m = graph_executor.GraphModule(lib["default"](dev))
for name, path in inputs.items():
    m.set_input(name, np.load(path))
m.run()
f = m.module.time_evaluator("run", dev, number=1, repeat=repeat)
res = f().results
print(json.dumps({"mean_us": statistics.mean(res) * 1e6, "median_us": statistics.median(res) * 1e6, "min_us": min(res) * 1e6}))
