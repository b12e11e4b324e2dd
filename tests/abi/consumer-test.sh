#!/usr/bin/env bash
# Builds tests/abi/consumer.c against an install tree using only pkg-config, then runs it.
# Usage: consumer-test.sh PREFIX [MODEL.gguf]
set -eu
prefix=$(cd "$1" && pwd)
model=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
pc=$(find "$prefix" -name dsinfer.pc -path '*pkgconfig*' | head -n1)
if [ -z "$pc" ]; then
  echo "FAIL: no dsinfer.pc under $prefix"
  exit 1
fi
export PKG_CONFIG_PATH=$(dirname "$pc")
# The .pc must point into this tree.
libdir=$(pkg-config --variable=libdir dsinfer)
case "$libdir" in "$prefix"/*) ;; *) echo "FAIL: libdir $libdir is outside $prefix"; exit 1 ;; esac
backenddir=$(pkg-config --variable=backenddir dsinfer)
[ "$backenddir" = "$libdir/dsinfer" ] || { echo "FAIL: backenddir=$backenddir"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -std=c99 -Wall -Wextra -Werror -pedantic "$here/consumer.c" -o "$tmp/consumer" \
   $(pkg-config --cflags --libs dsinfer)
# Static linking through Libs.private works too.
cc -std=c99 "$here/consumer.c" -o "$tmp/consumer-static" \
   $(pkg-config --cflags dsinfer) "$libdir/libdsinfer.a" $(pkg-config --libs-only-l --static dsinfer | sed 's/-ldsinfer//')
LD_LIBRARY_PATH=$libdir "$tmp/consumer" $model
"$tmp/consumer-static" $model
# The dynamic consumer resolved the library of this tree.
LD_LIBRARY_PATH=$libdir ldd "$tmp/consumer" | grep -q "$libdir/libdsinfer.so.0" || {
  echo "FAIL: consumer did not bind $libdir/libdsinfer.so.0"; exit 1; }
echo "ok: pkg-config consumer built and ran against $prefix"
