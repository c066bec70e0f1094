#!/usr/bin/env bash
# Fuzzes the readers with cargo-fuzz (nightly): installs cargo-fuzz if missing, seeds each
# target's corpus from the TVM goldens, and runs the targets one after the other for SECONDS
# each (default 600). Each run's libFuzzer log is fuzz/fuzz-TARGET.log; crash, timeout and oom
# inputs land in fuzz/artifacts/TARGET/. Exits non-zero when a target found something.
#   bash ci/fuzz.sh [SECONDS] [TARGET...]
#   MBLOB_GOLDENS=/path/to/tvm-goldens   (default: tests/fixtures/tvm-goldens in this repository)
#   MBLOB_FUZZ_RUNS=N        stop each target after N executions as well (a campaign: SECONDS 0
#                            means no time limit, so `MBLOB_FUZZ_RUNS=10000000 bash ci/fuzz.sh 0`)
#   MBLOB_FUZZ_SANITIZER=S   cargo-fuzz's --sanitizer (default none: the code the targets run
#                            has no `unsafe`, and AddressSanitizer made them 3 to 4 times slower;
#                            `address` for a target that reaches unsafe code, see fuzz/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(blob_classic blob_classic_021 blob_ffi graph_payload device_payload elf_lookup graph_exec relax_exec container_macho container_pe container_wasm container_archive opencl_program_cache)
G=${MBLOB_GOLDENS:-$PWD/../tests/fixtures/tvm-goldens}
[ -d "$G" ] || { echo "goldens not found at $G (set MBLOB_GOLDENS)" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

# Copies FILES into corpus/TARGET, each prefixed with the byte PREFIX (octal, or "" for none).
add() { # target prefix files...
  local c=corpus/$1 prefix=$2; shift 2
  mkdir -p "$c"
  for f in "$@"; do
    local name
    name=$(echo "${f#"$G"/}" | tr / _)
    { [ -z "$prefix" ] || printf "\\$prefix"; cat "$f"; } > "$c/seed-$name"
  done
}

# Layout of a golden by its directory: 0.19 and unversioned dirs are classic.
blobs() { # grep arguments
  find "$G" -name '*.blob' | sort | grep -E "$@"
}

seed() { # target
  case $1 in
    blob_classic) mapfile -t f < <(blobs -v 'tvm-0\.2[17]'); add "$1" "" "${f[@]}" ;;
    blob_classic_021) mapfile -t f < <(blobs 'tvm-0\.21\.0'); add "$1" "" "${f[@]}" ;;
    blob_ffi) mapfile -t f < <(blobs 'tvm-0\.27\.0'); add "$1" "" "${f[@]}" ;;
    graph_payload)
      # The GraphExecutorFactory payload of graph_dense_relu.blob: bytes 44 to 44 + 1603.
      mkdir -p "corpus/$1"
      tail -c +45 "$G/graph_dense_relu.blob" | head -c 1603 > "corpus/$1/seed-graph_dense_relu" ;;
    device_payload)
      # First byte: layout index (0 classic, 1 classic-0.21, 2 ffi) + 3 * key index
      # (cuda, opencl, metal, webgpu, vulkan), as the target decodes it.
      while IFS= read -r f; do
        case $f in */tvm-0.21.0/*) l=1 ;; */tvm-0.27.0*) l=2 ;; *) l=0 ;; esac
        case $f in *.cuda.bin) k=0 ;; *.opencl.bin) k=1 ;; *.metal.bin) k=2 ;; *.webgpu.bin) k=3 ;; *) k=4 ;; esac
        add "$1" "$(printf '%03o' $((l + 3 * k)))" "$f"
      done < <(find "$G/device" -name '*.payload*.bin' | sort) ;;
    graph_exec)
      # Byte 0 even: a graph JSON; odd: a params file (save_param_dict).
      add "$1" 000 "$G/graph_dense_relu.graph.json"
      add "$1" 001 "$G/graph_dense_relu.params" ;;
    elf_lookup) mapfile -t f < <(find "$G" -name '*.so' -o -name '*.devc.o' | sort); add "$1" "" "${f[@]}" ;;
    relax_exec) mapfile -t f < <(find "$G" -name 'relax_add_mul.relax*.bin' | sort); add "$1" "" "${f[@]}" ;;
    # The TVM-built containers beside the goldens (tests/fixtures/containers).
    container_macho) mapfile -t f < <(find "$G/../containers" -name '*.dylib' | sort); add "$1" "" "${f[@]}" ;;
    container_pe) mapfile -t f < <(find "$G/../containers" -name '*.dll' -o -name '*.obj' | sort); add "$1" "" "${f[@]}" ;;
    container_wasm) mapfile -t f < <(find "$G/../containers" -name '*.wasm' -o -name 'tvm27-wasm.devc.o' | sort); add "$1" "" "${f[@]}" ;;
    container_archive) mapfile -t f < <(find "$G/../containers" -name '*.a' | sort); add "$1" "" "${f[@]}" ;;
    vm_run|vm_decoded)
      # Byte 0 picks the model (even: Relax, odd: Relay VM); the rest picks the changes, so a
      # few short inputs of each start the search.
      mkdir -p "corpus/$1"
      for b in 000 001 002 003; do printf "\\$b\\001\\377\\020\\002\\000\\000\\000\\007" > "corpus/$1/seed-$b"; done ;;
    opencl_program_cache)
      # TVM's layout (u64 count; per kernel a u64-prefixed name and a u64-prefixed binary): one
      # kernel, and two (TVM's wheel has no OpenCL runtime to write a real one).
      mkdir -p "corpus/$1"
      printf '\001\0\0\0\0\0\0\0\004\0\0\0\0\0\0\0add0\004\0\0\0\0\0\0\0\177ELF' > "corpus/$1/seed-one"
      printf '\002\0\0\0\0\0\0\0\001\0\0\0\0\0\0\0a\0\0\0\0\0\0\0\0\001\0\0\0\0\0\0\0b\002\0\0\0\0\0\0\0xy' > "corpus/$1/seed-two" ;;
    *) echo "unknown target $1" >&2; exit 2 ;;
  esac
}

for t in "${targets[@]}"; do seed "$t"; done
# cargo-fuzz's default build: optimised, with debug assertions and overflow checks (`-O` would
# drop them); no sanitizer unless asked for.
san=${MBLOB_FUZZ_SANITIZER:-none}
runs=()
[ -z "${MBLOB_FUZZ_RUNS:-}" ] || runs=(-runs="$MBLOB_FUZZ_RUNS")
cargo +nightly fuzz build -s "$san"

status=0
for t in "${targets[@]}"; do
  mkdir -p "artifacts/$t"
  # -max_len: the .so seeds are up to 40 KB. -timeout: one input taking 10 s is a hang.
  if ! cargo +nightly fuzz run -s "$san" "$t" "corpus/$t" -- -max_total_time="$secs" "${runs[@]}" \
      -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1 > "fuzz-$t.log" 2>&1; then
    status=1
    echo "$t: FOUND SOMETHING (see fuzz/fuzz-$t.log and fuzz/artifacts/$t/)"
  fi
  echo "== $t"
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|slowest_unit_time_sec)|^Done|SUMMARY|Test unit written" "fuzz-$t.log" || true
done
exit $status
