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
if ! command -v cargo >/dev/null 2>&1; then
  echo "ci/setup.sh: cargo not found: install Rust 1.85 or newer (https://rustup.rs)" >&2
  exit 1
fi
