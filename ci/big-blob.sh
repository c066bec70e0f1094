#!/usr/bin/env bash
# Large blobs end to end, run by hand (minutes, GiBs of disk): a 2.5 GiB blob through the
# direct route (the default) and the LLVM path, and a 512 MiB blob through the C path, each
# exported, inspected and loaded back, with wall time and peak RSS of the export. Sizes in MiB
# can be changed:
#   DIRECT_MIB=2560 LLVM_MIB=2560 C_MIB=512 bash ci/big-blob.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
M=$(bash ci/target-dir.sh)/release/mblob
work=$(mktemp -d "${MBLOB_BIG_DIR:-/tmp}/mblob-big.XXXXXX")
trap 'rm -rf "$work"' EXIT
run() { # backend MiB
  local backend=$1 mib=$2
  head -c $((mib << 20)) /dev/urandom > "$work/payload.bin"
  printf '{"type_key": "llvm", "imports": [{"type_key": "big.Payload", "payload": "payload.bin"}]}' > "$work/tree.json"
  echo "== $mib MiB through --backend $backend"
  /usr/bin/time -f "export: %e s wall, peak RSS %M KiB" "$M" export "$work/tree.json" -o "$work/big.so" --backend "$backend"
  ls -l "$work/big.so"
  readelf -SW "$work/big.so" | grep -E "rodata|lrodata" || true
  "$M" inspect --json "$work/big.so" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("inspect:", r["symbol"], r["section"], r["type_keys"], r["payload_lens"])'
  /usr/bin/time -f "load: %e s wall, peak RSS %M KiB" "$M" inspect --load --keep-unknown "$work/big.so" | tail -3
  # The payload inside the library is the input, byte for byte.
  off=$("$M" inspect --json "$work/big.so" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["file_offset"] + r["payload_offsets"][1])')
  cmp <(tail -c +$((off + 1)) "$work/big.so" | head -c $((mib << 20))) "$work/payload.bin" && echo "payload bytes: identical"
  rm -f "$work/big.so" "$work/payload.bin"
}
run direct "${DIRECT_MIB:-2560}"
run llvm "${LLVM_MIB:-2560}"
run c "${C_MIB:-512}"
