#!/usr/bin/env bash
# A refactor's cost, measured: two builds of `mblob` (BEFORE and AFTER, e.g. main's and a
# branch's, each `cargo build --release --no-default-features --features cli,llm`) time the
# same models in the same run, interleaved, against TVM's own runtime on the same `.so`:
# graph and AOT models (TVM 0.19's executors), a Relay VM model and the Relax MLPs (`mblob run
# --repeat`), and the LLM fixture's greedy decode (`mblob generate --repeat`, TVM 0.27's VM).
# Prints a markdown table: medians in us and the ratios AFTER/BEFORE and AFTER/TVM.
#   bash benches/before_after.sh BEFORE AFTER [REPEAT] [THREADS]
# TVM from PyPI in $TVM019 and $TVM027 (default /work/venv/tvm019, /work/venv/tvm027).
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1 after=$2 repeat=${3:-2000} threads=${4:-1}
tvm019=${TVM019:-/work/venv/tvm019}/bin/python
tvm027=${TVM027:-/work/venv/tvm027}/bin/python
G=tests/fixtures/tvm-goldens/run
median() { grep ' runs, ' | sed -E 's/.*median ([0-9.]+) us.*/\1/'; }
ratio() { python3 -c "print('%.2f' % ($1 / $2))"; }
echo "| model | threads | before median us | after median us | TVM median us | after/before | after/TVM |"
echo "|---|---|---|---|---|---|---|"
for m in graph_mlp graph_cnn graph_two_outputs graph_int8 aot_mlp; do
  case $m in aot_*) ex=aot ;; *) ex=graph ;; esac
  b=$("$before" run "$G/$m.so" --input "x=$G/$m.in.x.npy" --threads "$threads" --repeat "$repeat" | median)
  a=$("$after" run "$G/$m.so" --input "x=$G/$m.in.x.npy" --threads "$threads" --repeat "$repeat" | median)
  t=$(TVM_NUM_THREADS=$threads "$tvm019" benches/tvm_time.py "$G/$m.so" "$ex" "$repeat" "x=$G/$m.in.x.npy" \
    | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["median_us"])')
  echo "| $m | $threads | $b | $a | $t | $(ratio "$a" "$b") | $(ratio "$a" "$t") |"
done
# Models TVM times through other front ends: before against after only.
R=tests/fixtures/relay-vm
for spec in "relay-vm mlp:$R/mlp.so:--input $R/mlp.0.in.0.npy" \
  "relax 0.19 mlp:$G/relax_mlp_tvm019.so:--input x=$G/relax_mlp_tvm019.in.x.npy" \
  "relax 0.27 mlp:$G/relax_mlp_tvm027.so:--input x=$G/relax_mlp_tvm027.in.x.npy"; do
  IFS=: read -r name so args <<<"$spec"
  # shellcheck disable=SC2086
  b=$("$before" run "$so" $args --threads "$threads" --repeat "$repeat" | median)
  # shellcheck disable=SC2086
  a=$("$after" run "$so" $args --threads "$threads" --repeat "$repeat" | median)
  echo "| $name | $threads | $b | $a | | $(ratio "$a" "$b") | |"
done
F=tests/fixtures/llm
gen=(generate "$F/llm_params.so" --weights "$F/params" --prompt-ids 17,211,5,98,140,33,251 --max-new-tokens 17
  --threads "$threads" --repeat 30)
decode() { grep '^decode' | sed -E 's/.*median ([0-9.]+) us.*/\1/'; }
b=$("$before" "${gen[@]}" | decode)
a=$("$after" "${gen[@]}" | decode)
t=$(TVM_NUM_THREADS=$threads "$tvm027" benches/tvm_llm_decode.py "$F/llm_params.so" --weights "$F/params" \
  --prompt-ids 17,211,5,98,140,33,251 --max-new-tokens 17 --repeat 30 \
  | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["decode_us_median"])')
echo "| llm_params decode (per token) | $threads | $b | $a | $t | $(ratio "$a" "$b") | $(ratio "$a" "$t") |"
