#!/usr/bin/env bash
# Installs the real llama.cpp that the interop tests compare against: npm's node-llama-cpp
# and its prebuilt CPU binaries (@node-llama-cpp/linux-x64), with --ignore-scripts (nothing
# is built or downloaded afterwards; no GPU variants). Tests never download anything: they
# read the libraries from the directory this script prints.
#
#   scripts/setup-llama-cpp.sh DIR      → prints the directory holding libggml-base.so,
#                                         libllama.*.so (DIR/node_modules/.../bins/linux-x64)
# Idempotent (skips npm when the pinned version is already in DIR). Exit status 1 when npm
# is missing or the install fails.
set -euo pipefail
ver=3.22.1
dir=${1:?usage: setup-llama-cpp.sh DIR}
bins="$dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
have=$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$dir/node_modules/node-llama-cpp/package.json" 2>/dev/null | head -n1 || true)
if [ "$have" != "$ver" ] || [ ! -f "$bins/libggml-base.so" ]; then
  command -v npm >/dev/null || { echo "setup-llama-cpp: npm not found" >&2; exit 1; }
  mkdir -p "$dir"
  (cd "$dir" && npm install --ignore-scripts --no-audit --no-fund --omit=optional \
     --no-save --loglevel=error "node-llama-cpp@$ver" "@node-llama-cpp/linux-x64@$ver" >&2)
fi
[ -f "$bins/libggml-base.so" ] || { echo "setup-llama-cpp: $bins/libggml-base.so missing" >&2; exit 1; }
echo "$bins"
