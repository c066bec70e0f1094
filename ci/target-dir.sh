#!/usr/bin/env bash
# Prints cargo's target directory for this workspace, absolute: `target/` unless
# CARGO_TARGET_DIR (or a cargo config's build.target-dir) puts it elsewhere. The scripts in
# ci/ and benches/ find the binaries they build through it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
