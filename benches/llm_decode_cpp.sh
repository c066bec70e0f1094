#!/usr/bin/env bash
# Per-token greedy decode time of `mblob generate` against TVM 0.27's own Relax VM driven from
# C++ (`benches/tvm_llm_decode.cc`: TVM's runtime from the PyPI wheel, called as MLC-LLM's engine
# calls it, no Python in the loop) on the same MLC-LLM model libraries (`tests/fixtures/mlc/`),
# at 1 and N threads. Run by hand (needs TVM 0.27 from PyPI in $TVM_VENV and g++); not in CI.
#
#   bash benches/llm_decode_cpp.sh [REPEAT] [THREADS...]
#
# REPEAT (default 20) timed generations per process after an untimed one; THREADS default 1 and
# nproc. Environment: MODELS (folders of tests/fixtures/mlc, default qwen2-q0f32 qwen2-q4f32_1
# llama3-q0f32 phi3-q0f32), ROUNDS (default 5: processes per side and row, the sides taking
# turns, the first side swapped each round), NEW_TOKENS (default 32: the prefill's token and
# NEW_TOKENS-1 decode steps), TVM_VENV (default /work/venv/tvm027). Other CPU folders with their
# weights run too (mistral-q0f32 with its sliding window, phi2-q0f32, gemma2-q0f32: the driver
# gives their reference tokens).
#
# Each side runs the fixture's reference prompt (`reference.json`, 37 tokens, prefill in chunks
# of 16). First the C++ driver's tokens must equal `reference.json`'s (TVM's recorded greedy
# tokens); every timed run's first tokens must equal them too, and mblob's tokens must equal the
# driver's. Both sides time the same span per decode step: `embed`, `kv_state_begin_forward`,
# `decode`, `kv_state_end_forward`, the last row of logits to the host and its argmax. A row's
# median is the median of its rounds' medians (each over REPEAT x (NEW_TOKENS-1) steps), its mean
# the mean of all steps; "spread" is the lowest and highest round median.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-20}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 "$(nproc)")
models=(${MODELS:-qwen2-q0f32 qwen2-q4f32_1 llama3-q0f32 phi3-q0f32})
rounds=${ROUNDS:-5}
new=${NEW_TOKENS:-32}
venv=${TVM_VENV:-/work/venv/tvm027}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q apache-tvm==0.27.0.post1
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -f "$site/tvm/lib/libtvm_runtime.so" ] || { echo "no TVM runtime in $site (TVM_VENV)" >&2; exit 1; }

out=$(bash ci/target-dir.sh)
cargo build -q --release --bin mblob
M=$out/release/mblob
D=$out/tvm_llm_decode/tvm_llm_decode
mkdir -p "$(dirname "$D")"
if [ ! -x "$D" ] || [ benches/tvm_llm_decode.cc -nt "$D" ]; then
  # Only tvm-ffi's headers (the wheel's tvm/runtime/ headers need tvm/support/, not shipped);
  # libtvm_runtime.so is linked for its registered functions (the VM, the KV cache, the
  # builtins), hence --no-as-needed.
  g++ -std=c++17 -O2 -Wall -I"$site/tvm_ffi/include" benches/tvm_llm_decode.cc -o "$D" \
    -Wl,--no-as-needed -L"$site/tvm/lib" -L"$site/tvm_ffi/lib" -ltvm_runtime -ltvm_ffi \
    -Wl,-rpath,"$site/tvm/lib" -Wl,-rpath,"$site/tvm_ffi/lib"
fi

json() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "| model | threads | mblob median us/token | mblob mean | mblob spread | TVM C++ median us/token | TVM mean | TVM spread | median ratio (mblob/TVM) | same tokens |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for name in "${models[@]}"; do
  F=tests/fixtures/mlc/$name
  ref=$F/reference.json
  prompt=$(json "$ref" '",".join(map(str, d["generate"]["prompt"]))')
  want=$(json "$ref" '",".join(map(str, d["generate"]["tokens"]))')
  nref=$(json "$ref" 'len(d["generate"]["tokens"])')
  if [ "$new" -lt "$nref" ]; then
    echo "NEW_TOKENS=$new: give at least reference.json's $nref tokens" >&2
    exit 2
  fi
  got=$(TVM_NUM_THREADS=1 "$D" "$F/lib.so" --weights "$F" --prompt-ids "$prompt" --max-new-tokens "$nref" --repeat 1 |
    python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))')
  if [ "$got" != "$want" ]; then
    echo "$name: the C++ driver's tokens $got are not reference.json's $want" >&2
    exit 1
  fi
  for t in "${threads[@]}"; do
    : >"$work/mblob"
    : >"$work/tvm"
    same=yes
    for r in $(seq "$rounds"); do
      sides=(mblob tvm)
      [ $((r % 2)) -eq 0 ] && sides=(tvm mblob)
      for side in "${sides[@]}"; do
        if [ "$side" = mblob ]; then
          out=$("$M" generate "$F/lib.so" --weights "$F" --prompt-ids "$prompt" --max-new-tokens "$new" \
            --threads "$t" --repeat "$repeat")
          echo "$out" | tail -1 >"$work/mblob.tokens"
          # `decode, per token: N runs, T threads: mean X us, median Y us, min Z us`
          echo "$out" | grep '^decode' | sed -E 's/.*: ([0-9]+) runs.*mean ([0-9.]+) us, median ([0-9.]+) us.*/\1 \2 \3/' >>"$work/mblob"
        else
          TVM_NUM_THREADS=$t "$D" "$F/lib.so" --weights "$F" --prompt-ids "$prompt" --max-new-tokens "$new" \
            --repeat "$repeat" >"$work/tvm.json"
          json "$work/tvm.json" '",".join(map(str, d["tokens"]))' >"$work/tvm.tokens"
          json "$work/tvm.json" '"%d %s %s" % (d["steps"], d["decode_us_mean"], d["decode_us_median"])' >>"$work/tvm"
        fi
      done
      cmp -s "$work/mblob.tokens" "$work/tvm.tokens" || same=no
      case $(cat "$work/tvm.tokens"), in "$want",*) ;; *) same=no ;; esac
    done
    python3 - "$work/mblob" "$work/tvm" "$name" "$t" "$same" <<'EOF'
import statistics, sys
def row(path):
    runs = [tuple(map(float, line.split())) for line in open(path) if line.strip()]
    steps = sum(n for n, _, _ in runs)
    mean = sum(n * m for n, m, _ in runs) / steps
    meds = [md for _, _, md in runs]
    return statistics.median(meds), mean, min(meds), max(meds)
m, t = row(sys.argv[1]), row(sys.argv[2])
print("| %s | %s | %.1f | %.1f | %.1f-%.1f | %.1f | %.1f | %.1f-%.1f | %.2f | %s |"
      % (sys.argv[3], sys.argv[4], m[0], m[1], m[2], m[3], t[0], t[1], t[2], t[3], m[0] / t[0], sys.argv[5]))
EOF
  done
done
