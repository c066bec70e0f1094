#!/usr/bin/env bash
# Runs the concurrency test (threads loading, using and dropping packed libraries) under
# LeakSanitizer, with the nightly toolchain. Exits non-zero on a leak or a crash.
#   bash ci/leaks.sh            # LeakSanitizer (needs `rustup toolchain install nightly`)
#   MBLOB_VALGRIND=1 bash ci/leaks.sh   # valgrind --leak-check=full instead (apt: valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
if [ "${MBLOB_VALGRIND:-0}" = 1 ]; then
  command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
  bin=$(cargo test --no-default-features --features cli --test all --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | tail -n1 | cut -d'"' -f4)
  valgrind --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=1 \
    "$bin" concurrency --test-threads=1
else
  RUSTFLAGS="-Zsanitizer=leak" LSAN_OPTIONS="exitcode=23" \
    cargo +nightly test --no-default-features --features cli --target "$target" --test all concurrency -- --test-threads=1
fi
