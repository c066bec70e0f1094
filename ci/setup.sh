#!/usr/bin/env bash
# Installs what building mblob needs on Debian 12: LLVM 14 for the `llvm` feature (static
# inkwell needs Polly and zlib too), lld (the fast linker, optional but preferred), and a C
# compiler, Python 3 with venv for the Python package, patchelf (which `maturin build` needs to
# put the libraries the extension links, libffi and libtinfo from LLVM, into a wheel), and pocl
# for OpenCL tests (a CPU OpenCL driver, with the ICD loader and clinfo), and g++, cmake and
# pkg-config for the C++ example of the C API (examples/cpp/). Safe to run again:
# packages already present are skipped.
set -euo pipefail
need=(llvm-14-dev libpolly-14-dev zlib1g-dev lld-14 gcc libc6-dev binutils python3 python3-venv patchelf pocl-opencl-icd ocl-icd-libopencl1 clinfo g++ cmake pkg-config)
missing=()
for p in "${need[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
# The Windows test (tests/all/windows.rs) builds a test program with the mingw-w64 compiler
# and runs it under wine64: without recommends, 31 packages, about 200 MB to fetch, 1.2 GB
# installed, 35 s here.
windows=()
for p in wine64 gcc-mingw-w64-x86-64; do
  dpkg -s "$p" >/dev/null 2>&1 || windows+=("$p")
done
if [ ${#windows[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${windows[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "ci/setup.sh: cargo not found: install Rust 1.85 or newer (https://rustup.rs)" >&2
  exit 1
fi
