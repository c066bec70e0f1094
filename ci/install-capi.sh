#!/usr/bin/env bash
# Builds mblob's C API and installs it under PREFIX (default /usr/local):
#   PREFIX/include/mblob.h
#   PREFIX/lib/libmblob.so.0 (soname libmblob.so.0), PREFIX/lib/libmblob.so -> libmblob.so.0
#   PREFIX/lib/libmblob.a
#   PREFIX/lib/pkgconfig/mblob.pc
# Then `cc prog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs mblob)`
# links the shared library, and `pkg-config --static` the static one.
#
# The profile is `release-small` (smallest code, fat LTO, stripped: the CPU-only library is
# under 1 MiB, `benches/size.sh`), or the one MBLOB_CAPI_PROFILE names (`release`: faster
# Rust code, larger). The features are the crate's defaults, or MBLOB_CAPI_FEATURES (e.g.
# `--no-default-features`, `--no-default-features --features opencl`). The shared and the
# static library are built apart (`cargo rustc --crate-type`): built together the shared one
# comes out about 30% larger.
set -euo pipefail
prefix=${1:-/usr/local}
cd "$(dirname "$0")/.."
profile=${MBLOB_CAPI_PROFILE:-release-small}
# shellcheck disable=SC2086 # the features are words
for crate_type in cdylib staticlib; do
  cargo rustc --quiet -p mblob-capi --profile "$profile" --lib --crate-type "$crate_type" ${MBLOB_CAPI_FEATURES:-}
done
target=$(bash ci/target-dir.sh)/$profile
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
prefix=$(cd "$prefix" && pwd)
install -m 644 capi/include/mblob.h "$prefix/include/mblob.h"
install -m 755 "$target/libmblob_capi.so" "$prefix/lib/libmblob.so.0"
ln -sf libmblob.so.0 "$prefix/lib/libmblob.so"
install -m 644 "$target/libmblob_capi.a" "$prefix/lib/libmblob.a"
cat >"$prefix/lib/pkgconfig/mblob.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: mblob
Description: Load and run TVM runtime module libraries without TVM (C API)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lmblob
Libs.private: -ldl -lpthread -lm -lrt
PC
echo "installed mblob $version C API under $prefix"
