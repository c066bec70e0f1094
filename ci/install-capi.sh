#!/usr/bin/env bash
# Builds mblob's C API and installs it under PREFIX (default /usr/local):
#   PREFIX/include/mblob.h
#   PREFIX/lib/libmblob.so.0 (soname libmblob.so.0), PREFIX/lib/libmblob.so -> libmblob.so.0
#   PREFIX/lib/libmblob.a (with the `system-lib` feature: the registry of models linked into the
#                          program, and TVM's runtime names their code calls, defined on purpose;
#                          libmblob.so has neither and exports none of TVM's names)
#   PREFIX/lib/pkgconfig/mblob.pc
# Then `cc prog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs mblob)`
# links the shared library, and `pkg-config --static` the static one; CMake finds it with
# `pkg_check_modules(MBLOB REQUIRED IMPORTED_TARGET mblob)` (see examples/cpp/).
#
# Environment:
#   MBLOB_CAPI_FEATURES  the crate's features, comma-separated, instead of its defaults
#                        (`cuda,opencl,llm,relay-vm,ops` is the runtime alone, without `inspect` and
#                        `emit`: mblob.pc's Cflags then hide their declarations in mblob.h;
#                        `none` is the CPU-only library, under 1 MiB: benches/size.sh)
#   MBLOB_CAPI_PROFILE   the cargo profile: `release-small` (default: smallest code, fat LTO,
#                        stripped) or `release` (faster Rust code, larger)
#   MBLOB_CAPI_LIB_DIR   install the libmblob_capi.so (and libmblob_capi.a, when there) of
#                        this directory instead of building (a build of the same features;
#                        the .a holds the system-lib registry only if it was built with it)
# The shared and the static library are built apart (`cargo rustc --crate-type`): built
# together the shared one comes out about 30% larger.
set -euo pipefail
prefix=${1:-/usr/local}
cd "$(dirname "$0")/.."
features=${MBLOB_CAPI_FEATURES-}
profile=${MBLOB_CAPI_PROFILE:-release-small}
if [ -n "${MBLOB_CAPI_LIB_DIR-}" ]; then
  built=$MBLOB_CAPI_LIB_DIR
else
  args=()
  case "$features" in
    "") ;;
    none) args=(--no-default-features) ;;
    *) args=(--no-default-features --features "$features") ;;
  esac
  # The static library adds `system-lib` (mblob_library_load_system, and TVM's names for the
  # models a program links); the shared one never has it.
  cargo rustc --quiet -p mblob-capi --profile "$profile" --lib --crate-type cdylib "${args[@]}"
  cargo rustc --quiet -p mblob-capi --profile "$profile" --lib --crate-type staticlib "${args[@]}" --features system-lib
  built=$(bash ci/target-dir.sh)/$profile
fi
cflags='-I${includedir}'
if [ -n "$features" ]; then
  case ",$features," in *,inspect,*) ;; *) cflags+=" -DMBLOB_NO_INSPECT" ;; esac
  case ",$features," in *,emit,* | *,llvm,*) ;; *) cflags+=" -DMBLOB_NO_EMIT" ;; esac
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
prefix=$(cd "$prefix" && pwd)
install -m 644 capi/include/mblob.h "$prefix/include/mblob.h"
install -m 755 "$built/libmblob_capi.so" "$prefix/lib/libmblob.so.0"
ln -sf libmblob.so.0 "$prefix/lib/libmblob.so"
if [ -f "$built/libmblob_capi.a" ]; then
  install -m 644 "$built/libmblob_capi.a" "$prefix/lib/libmblob.a"
fi
cat >"$prefix/lib/pkgconfig/mblob.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: mblob
Description: Load, run and write TVM runtime module libraries without TVM (C API)
Version: $version
Cflags: $cflags
Libs: -L\${libdir} -lmblob
Libs.private: -ldl -lpthread -lm -lrt
PC
echo "installed mblob $version C API under $prefix"
