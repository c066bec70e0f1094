#!/usr/bin/env bash
# Fuzzes the readers with cargo-fuzz (nightly): seeds each target's corpus from the goldens and
# runs it for SECONDS (default 600) each, two at a time. Prints libFuzzer's final stats.
#   bash ci/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-600}; shift || true
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(blob graph_payload device_payload elf_lookup)
G=${MBLOB_GOLDENS:-$PWD/../../shared/tvm-goldens}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
seed() { # target
  local c=corpus/$1; mkdir -p "$c"
  case $1 in
    blob)
      for f in "$G"/*.blob "$G"/device/*.blob "$G"/other_versions/tvm-0.19.0/*.blob; do { printf '\x00'; cat "$f"; } > "$c/classic-$(basename "$f")"; done
      for f in "$G"/other_versions/tvm-0.21.0/*.blob "$G"/device/tvm-0.21.0/*.blob; do { printf '\x01'; cat "$f"; } > "$c/v021-$(basename "$f")"; done
      for f in "$G"/other_versions/tvm-0.27.0.post1/*.blob "$G"/device/tvm-0.27.0.post1/*.blob; do { printf '\x02'; cat "$f"; } > "$c/ffi-$(basename "$f")"; done ;;
    graph_payload) tail -c +45 "$G/graph_dense_relu.blob" | head -c 1603 > "$c/graph_dense_relu" ;;
    device_payload)
      for f in "$G"/device/*.payload*.bin; do { printf '\x00'; cat "$f"; } > "$c/019-$(basename "$f")"; done
      for f in "$G"/device/tvm-0.21.0/*.payload*.bin; do { printf '\x01'; cat "$f"; } > "$c/021-$(basename "$f")"; done
      for f in "$G"/device/tvm-0.27.0.post1/*.payload*.bin; do { printf '\x02'; cat "$f"; } > "$c/027-$(basename "$f")"; done ;;
    elf_lookup) for f in "$G"/*.so "$G"/*.devc.o "$G"/device/*.so; do cp "$f" "$c/"; done ;;
  esac
}
for t in "${targets[@]}"; do seed "$t"; done
cargo +nightly fuzz build -O
run() {
  cargo +nightly fuzz run -O "$1" "corpus/$1" -- -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
    -max_len=65536 -print_final_stats=1 > "fuzz-$1.log" 2>&1 || echo "$1: FAILED (see fuzz/fuzz-$1.log)"
  echo "== $1"; grep -E "stat::|Done|SUMMARY|crash-|timeout-" "fuzz-$1.log" || true
}
i=0
for t in "${targets[@]}"; do
  run "$t" &
  i=$((i + 1)); if [ $((i % 2)) -eq 0 ]; then wait; fi
done
wait
