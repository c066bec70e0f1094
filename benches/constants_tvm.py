"""TVM's side of benches/constants_rss.sh (run by the script, with TVM 0.27 from PyPI):

    python benches/constants_tvm.py load MODEL.so [REPEAT]     load time, as a JSON line
    python benches/constants_tvm.py run MODEL.so INPUT.npy     load and run once (peak memory)

`load` times `tvm.runtime.load_module(MODEL.so)` + `relax.VirtualMachine(lib, tvm.cpu())` (the
constants are copied to the device when the VM is made), REPEAT rounds (default 5), each one
dropping the last round's VM and module first: wall-clock and CPU time (`time.process_time`); `run` loads the same way and calls `main` once,
for the script to measure the process's peak resident memory.
"""
import gc
import json
import sys
import time

import numpy as np
import tvm
from tvm import relax


def load(path):
    lib = tvm.runtime.load_module(path)
    return lib, relax.VirtualMachine(lib, tvm.cpu())


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "load":
        repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 5
        wall, cpu = [], []
        for _ in range(repeat):
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            lib, vm = load(path)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            del vm, lib
        out = {"file": path, "tvm": tvm.__version__}
        for name, times in (("load", wall), ("cpu", cpu)):
            s = sorted(times)
            out.update({f"{name}_s": [round(t, 4) for t in times], f"{name}_median_s": round(s[len(s) // 2], 4),
                        f"{name}_min_s": round(s[0], 4)})
        print(json.dumps(out))
    else:
        _, vm = load(path)
        x = tvm.runtime.tensor(np.load(sys.argv[3]))
        vm["main"](x).numpy()


if __name__ == "__main__":
    main()
