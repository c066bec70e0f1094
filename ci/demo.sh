#!/usr/bin/env bash
# The main job of README.md: set up the machine, build mblob, and run `mblob demo`, which
# exports a real multi-module deploy.so (host code generated with LLVM, a CUDA kernel, a graph
# factory root), inspects it, loads it back and runs it (the kernel too, when a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cargo build --release --quiet
exec "$(bash ci/target-dir.sh)/release/mblob" demo "$@"
