#!/usr/bin/env bash
# Structure checks of the sources (see ci/checks.py): no file over 1,000 lines, `unsafe` only
# in runtime/src/ffi, runtime/src/device and capi/src or at the library-loading entry points,
# and no import circle among the files.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 ci/checks.py "$@"
