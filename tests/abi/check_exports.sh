#!/usr/bin/env bash
# ABI checks on the built shared library:
#  1. the exported (defined, dynamic) symbols equal tests/abi/exported-symbols.txt;
#  2. every exported symbol is dsi_* and carries the DSINFER_0 version node;
#  3. every DSI_API function declared in include/dsinfer.h is exported (nothing declared
#     is missing) and nothing else is;
#  4. the SONAME is libdsinfer.so.0.
# Usage: check_exports.sh LIBDSINFER.SO SOURCE_DIR
set -u
lib=$1
src=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | grep -v '^DSINFER_0$' | sort >"$tmp/raw"
sed 's/@.*//' "$tmp/raw" | sort -u >"$tmp/exported"
if ! diff -u "$src/tests/abi/exported-symbols.txt" "$tmp/exported"; then
  echo "FAIL: exported symbols differ from tests/abi/exported-symbols.txt (update it deliberately)"
  fail=1
fi
if grep -v '^dsi_' "$tmp/exported"; then
  echo "FAIL: the symbols above are exported but are not dsi_*"
  fail=1
fi
if grep -v '@@DSINFER_0$' "$tmp/raw"; then
  echo "FAIL: the symbols above are not versioned DSINFER_0"
  fail=1
fi
grep -o 'DSI_API[^;]*' "$src/include/dsinfer.h" | tr '\n' ' ' | grep -o 'dsi_[a-z0-9_]*(' | tr -d '(' | sort -u >"$tmp/declared"
if ! diff -u "$tmp/declared" "$tmp/exported"; then
  echo "FAIL: declared DSI_API functions (left) differ from exported symbols (right)"
  fail=1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
if [ "$soname" != "libdsinfer.so.0" ]; then
  echo "FAIL: SONAME is '$soname', expected libdsinfer.so.0"
  fail=1
fi
n=$(wc -l <"$tmp/exported")
if [ $fail -eq 0 ]; then
  echo "ok: $n exported dsi_* symbols, versioned DSINFER_0, SONAME $soname"
fi
exit $fail
