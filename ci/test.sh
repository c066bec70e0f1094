#!/usr/bin/env bash
# The test command of README.md: sets up the machine, then checks formatting, lints and API
# docs and runs every test, with the default features (LLVM, CUDA through cudarc) and without
# any.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export CARGO_TERM_COLOR=never
# pocl is installed above: the OpenCL tests run for real, and fail (rather than skip) when no
# OpenCL device can be opened.
export MBLOB_REQUIRE_OPENCL=1
# g++, cmake and pkg-config are installed above: the C++ example of the C API is built and run.
export MBLOB_REQUIRE_CMAKE=1
cargo fmt --all -- --check
bash ci/checks.sh
# The library without its default features must not pull in the command line's crates.
if cargo tree -p mblob --no-default-features -e normal | grep -E " (clap|tracing-subscriber) v"; then exit 1; fi
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --no-default-features -- -D warnings
# In the workspace the `mblob` crate turns the runtime's `relay-vm` feature on; the runtime
# alone, without it (what the CPU-only C library builds), must be clean too.
cargo clippy -p mblob-runtime --all-targets --no-default-features -- -D warnings
# The fuzz targets live outside the workspace (cargo-fuzz builds them with nightly); checking
# them here on stable keeps them compiling as the readers' API changes.
cargo check --manifest-path fuzz/Cargo.toml --all-targets
# The API docs: no broken or private links, with and without the optional features.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet --no-default-features
cargo test --workspace
# Without LLVM and CUDA, but with the command line that most of the integration tests run.
cargo test --workspace --no-default-features --features cli
# Models linked into a program (TVM system-lib builds): the C library's static form with the
# `system-lib` feature, linked into a C program with three TVM-built models and no dlopen; the
# Rust example (its own workspace: the feature defines TVM's names, which must stay out of the
# workspace's libmblob.so) embeds two with `Export` and runs them against TVM's outputs.
cargo test -p mblob-runtime --features system-lib --lib system_lib
cargo test -p mblob-capi --features system-lib --test system_lib
cargo clippy -p mblob-capi --features system-lib --all-targets -- -D warnings
(cd examples/rust-embed && cargo fmt -- --check && cargo clippy -- -D warnings)
cargo run --manifest-path examples/rust-embed/Cargo.toml
# The runtime alone without `relay-vm` (the workspace always has it on): a Relay VM model is
# refused, naming the feature.
cargo test -p mblob-runtime --no-default-features --test relay_vm_off
# The C library without its optional features (graph, AOT and Relax models on the CPU) must
# stay under 1 MiB stripped: one `release-small` build of it (about 2 minutes cold on 2 cores).
bash benches/size.sh --check
# The Python package (python/, its own crate outside the workspace): lints, then built with
# maturin into a fresh virtualenv and tested with pytest against the goldens and the `mblob`
# binary that `cargo test` built. Tests that need TVM are reported as skipped without it.
(cd python && cargo fmt -- --check && cargo clippy --all-targets -- -D warnings)
# Everything built goes to cargo's target directory, wherever CARGO_TARGET_DIR puts it.
target_dir=$(bash ci/target-dir.sh)
venv=$target_dir/python-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q maturin numpy pytest
PATH="$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation ./python
# The binary `cargo test` built.
MBLOB_BIN="$target_dir/debug/mblob" "$venv/bin/python" -m pytest -q -rs python/tests
