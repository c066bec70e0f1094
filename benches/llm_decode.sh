#!/usr/bin/env bash
# Per-token greedy decode time of `mblob generate` against TVM 0.27's own Relax VM on the same
# model library (the LLM fixture, or a library given), at 1 and N threads, in the same run.
# Prints a markdown table. Run by hand (needs TVM 0.27 from PyPI, installed into $TVM_VENV).
#   bash benches/llm_decode.sh [REPEAT] [THREADS...]
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-30}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 "$(nproc)")
venv=${TVM_VENV:-/work/venvs/tvm027}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q apache-tvm==0.27.0.post1 numpy
fi
cargo build -q --release --bin mblob
M=$(bash ci/target-dir.sh)/release/mblob
F=tests/fixtures/llm
prompt=17,211,5,98,140,33,251
n=17
echo "| library | threads | mblob median us/token | mblob mean | TVM median us/token | TVM mean | median ratio (mblob/TVM) | same tokens |"
echo "|---|---|---|---|---|---|---|---|"
for lib in llm_params llm_consts; do
  w=(); [ $lib = llm_params ] && w=(--weights $F/params)
  for t in "${threads[@]}"; do
    out=$("$M" generate $F/$lib.so "${w[@]}" --prompt-ids $prompt --max-new-tokens $n --threads "$t" --repeat "$repeat")
    mine=$(echo "$out" | tail -1)
    read -r mm md < <(echo "$out" | grep '^decode' | sed -E 's/.*mean ([0-9.]+) us, median ([0-9.]+) us.*/\1 \2/')
    tv=$(TVM_NUM_THREADS=$t "$venv/bin/python" benches/tvm_llm_decode.py $F/$lib.so "${w[@]}" --prompt-ids $prompt --max-new-tokens $n --repeat "$repeat")
    read -r tm td tt < <(echo "$tv" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f %.1f %s" % (d["decode_us_mean"], d["decode_us_median"], ",".join(map(str, d["tokens"]))))')
    same=no; [ "$mine" = "$tt" ] && same=yes
    echo "| $lib | $t | $md | $mm | $td | $tm | $(python3 -c "print('%.2f' % ($md / $td))") | $same |"
  done
done
