#!/usr/bin/env bash
# Builds mblob's C API in release and installs it under PREFIX (default /usr/local):
#   PREFIX/include/mblob.h
#   PREFIX/lib/libmblob.so.0 (soname libmblob.so.0), PREFIX/lib/libmblob.so -> libmblob.so.0
#   PREFIX/lib/libmblob.a
#   PREFIX/lib/pkgconfig/mblob.pc
# Then `cc prog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs mblob)`
# links the shared library, and `pkg-config --static` the static one.
set -euo pipefail
prefix=${1:-/usr/local}
cd "$(dirname "$0")/.."
cargo build --release --quiet -p mblob-capi
target=$(bash ci/target-dir.sh)/release
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
