#!/usr/bin/env bash
# The C library's size per feature set: builds libmblob (crate mblob-capi, cdylib alone) with
# the `release-small` profile once per set and prints a table of the stripped sizes.
#
#   bash benches/size.sh            every set: CPU only, +relay-vm, +ops, +opencl, +cuda, +llm, all
#   bash benches/size.sh --check    the CPU-only set alone; exits 1 when it is over 1 MiB
#
# "CPU only" is `--no-default-features`: graph, AOT and Relax models on the CPU. "defaults" adds
# `inspect` and `emit`, which link the `mblob` crate (the emit side, with its C packer). The cdylib is built on its own (`cargo rustc --crate-type cdylib`): built
# beside the staticlib and rlib of the same crate it comes out about 30% larger.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=1048576
check=0
if [[ ${1:-} == --check ]]; then
  check=1
fi
out=$(bash ci/target-dir.sh)/release-small/libmblob_capi.so
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

size_of() {
  cargo rustc --quiet -p mblob-capi --profile release-small --lib --crate-type cdylib "$@"
  cp "$out" "$tmp"
  # The profile strips already; `strip` (when installed) makes sure of it.
  if command -v strip >/dev/null; then strip "$tmp"; fi
  stat -c %s "$tmp"
}

if ((check)); then
  bytes=$(size_of --no-default-features)
  echo "libmblob.so, CPU only (--no-default-features), stripped: $bytes bytes (limit $limit)"
  if ((bytes > limit)); then
    echo "error: the CPU-only C library is over 1 MiB" >&2
    exit 1
  fi
  exit 0
fi

echo "| features | cargo flags | stripped bytes | MiB |"
echo "|---|---|---|---|"
while IFS='|' read -r name flags; do
  # shellcheck disable=SC2086 # the flags are words
  bytes=$(size_of $flags)
  printf '| %s | `%s` | %d | %.2f |\n' "$name" "$flags" "$bytes" "$(awk -v b="$bytes" 'BEGIN { print b / 1048576 }')"
done <<'SETS'
CPU only|--no-default-features
+ relay-vm|--no-default-features --features relay-vm
+ ops|--no-default-features --features ops
+ opencl|--no-default-features --features opencl
+ cuda|--no-default-features --features cuda
+ llm|--no-default-features --features llm
runtime, every feature|--no-default-features --features relay-vm,ops,opencl,cuda,llm
defaults (+ inspect, emit)|
SETS
