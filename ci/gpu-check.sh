#!/usr/bin/env bash
# Runs every CUDA test in one go on a machine with an NVIDIA GPU (the project's lent machine is an
# H200, sm_90), and prints a summary: the tests `#[ignore]`d without a GPU (`--ignored`), and the
# CUDA tests that run everywhere (here with the driver present). Nothing else is run.
#
#   bash ci/gpu-check.sh              # with Rust on the GPU machine: build, then run
#   bash ci/gpu-check.sh --prepare    # where Rust is (not the GPU machine): build the test
#                                     # programs into target/gpu-check/ (carry that folder)
#   bash ci/gpu-check.sh --from target/gpu-check   # on the GPU machine, without Rust: run them
#
# The test programs find their fixtures and the `mblob` program at the absolute paths they were
# built at (CARGO_MANIFEST_DIR, CARGO_BIN_EXE_mblob); `--from` links those paths to this checkout
# and the carried `mblob` when they are missing. CUDA source payloads (TVM 0.27's format `cuda`)
# need NVRTC and the CUDA headers: the script looks for them under $CUDA_PATH, /usr/local/cuda
# and Python's `nvidia` wheels. Budget: about 5 minutes of runs on the H200 after the build
# (each test prints its worst logit difference); a 10-minute device call holds it.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=build
from=""
case "${1:-}" in
  --prepare) mode=prepare ;;
  --from) mode=from; from=$(cd "${2:?--from needs the folder --prepare wrote}" && pwd) ;;
  "") ;;
  *) echo "usage: $0 [--prepare | --from DIR]" >&2; exit 2 ;;
esac

# The test programs with CUDA tests (package:target, `lib` for the unit tests); each is run with
# the filter `cuda` (in the test's name or module path) and `--include-ignored`. The C library's
# tests (mblob-capi) are built by the plain build only, not by `--prepare`.
targets="mblob-runtime:lib mblob-runtime:llm_device mblob-runtime:mlc_kv mblob-runtime:device_run mblob-runtime:relax mblob:all mblob-capi:run_model mblob-capi:tensors"

# Builds the test programs and `mblob`; prints "NAME PATH" per program. Without options, as
# `cargo test --workspace` builds them (CI's features: the `mblob` crate's defaults, CUDA
# included); `--release` (for `--prepare`): the two crates with CUDA, OpenCL, the LLM runtime
# and the command line, without LLVM (smaller programs to carry).
build() {
  local sel=(--workspace) feats=()
  if [ "${1:-}" = --release ]; then
    sel=(-p mblob -p mblob-runtime)
    feats=(--release --no-default-features --features mblob/cli,mblob/cuda,mblob/opencl,mblob/llm,mblob-runtime/relay-vm)
  fi
  {
    cargo test "${sel[@]}" "${feats[@]}" --no-run --message-format=json || echo '{"reason": "build-failed"}'
  } 2>/dev/null | TARGETS="$targets" python3 -c '
import json, os, sys
want = os.environ["TARGETS"].split()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-failed":
        sys.exit("the build failed: run the cargo commands of ci/gpu-check.sh for its errors")
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    pkg = m["package_id"].split("#")[-1].split("@")[0]
    name, kind = m["target"]["name"], m["target"]["kind"][0]
    key = f"{pkg}:lib" if kind == "lib" and m["profile"]["test"] else f"{pkg}:{name}"
    if m["profile"]["test"] and key in want:
        print(key.replace(":", "-"), m["executable"])
    elif kind == "bin" and name == "mblob" and not m["profile"]["test"]:
        print("mblob", m["executable"])
'
}

if [ "$mode" = prepare ]; then
  out="$root/target/gpu-check"
  rm -rf "$out" && mkdir -p "$out"
  build --release >"$out/list" || exit 1
  while read -r name path; do
    cp "$path" "$out/$name" && strip "$out/$name"
    echo "$name $path" >>"$out/manifest"
  done <"$out/list"
  rm "$out/list"
  echo "root $root" >>"$out/manifest"
  du -sh "$out"
  exit 0
fi

# A device test that cannot open CUDA or NVRTC fails here rather than skipping.
export MBLOB_REQUIRE_CUDA=1 MBLOB_REQUIRE_NVRTC=1
echo "== GPU"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "nvidia-smi: not found"
# NVRTC and the CUDA headers for the CUDA source payloads.
for d in "${CUDA_PATH:-}" "${CUDA_HOME:-}" /usr/local/cuda; do
  if [ -n "$d" ] && [ -e "$d/include/cuda_fp16.h" ]; then export CUDA_PATH="$d" CUDA_HOME="$d"; break; fi
done
nvrtc=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
dirs = [os.environ.get("CUDA_PATH", "") + "/lib64", "/usr/local/cuda/lib64"]
for s in site.getsitepackages():
    dirs += glob.glob(s + "/nvidia/cuda_nvrtc/lib") + glob.glob(s + "/nvidia/cu*/lib")
for d in dirs:
    if glob.glob(d + "/libnvrtc.so*"):
        print(d)
        break
EOF
)
[ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "CUDA_PATH=${CUDA_PATH:-none} NVRTC=${nvrtc:-not found}"

declare -a programs
if [ "$mode" = from ]; then
  built_root=$(awk '$1 == "root" {print $2}' "$from/manifest")
  if [ "$built_root" != "$root" ] && [ ! -e "$built_root" ]; then
    mkdir -p "$(dirname "$built_root")" && ln -s "$root" "$built_root"
  fi
  mblob_at=$(awk '$1 == "mblob" {print $2}' "$from/manifest")
  if [ ! -e "$mblob_at" ]; then mkdir -p "$(dirname "$mblob_at")" && cp "$from/mblob" "$mblob_at"; fi
  while read -r name path; do
    [ "$name" = root ] || [ "$name" = mblob ] || programs+=("$name $from/$name")
  done <"$from/manifest"
else
  list=$(build) || { echo "$list"; exit 1; }
  while read -r name path; do
    [ "$name" = mblob ] || programs+=("$name $path")
  done <<<"$list"
fi
[ ${#programs[@]} -gt 0 ] || { echo "no test programs" >&2; exit 1; }

echo "== tests"
summary=()
failed=0
for p in "${programs[@]}"; do
  read -r name path <<<"$p"
  log=$(mktemp)
  start=$SECONDS
  case "$name" in mblob-runtime-*) dir=runtime ;; mblob-capi-*) dir=capi ;; *) dir=. ;; esac
  (cd "$root/$dir" &&
    "$path" --include-ignored --test-threads 1 --nocapture cuda) >"$log" 2>&1
  rc=$?
  grep -E "^test |worst|GPU:|skipped|panicked|^failures" "$log"
  line=$(grep -E "^test result" "$log" | tail -1)
  summary+=("$name: ${line:-no result (exit $rc)} [$((SECONDS - start)) s]")
  [ "$rc" -ne 0 ] && { failed=1; tail -40 "$log"; }
  rm -f "$log"
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
