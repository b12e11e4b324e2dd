#!/usr/bin/env bash
# GGUF interop with the real llama.cpp (issue 21; tests/interop/README.md).
#
#   bash tests/interop/run.sh BUILD_DIR [WORK_DIR]
#
# 1. installs npm's node-llama-cpp and @node-llama-cpp/linux-x64 (pinned, --ignore-scripts,
#    no optional packages: no GPU variants) into WORK_DIR/npm — or uses DSI_LCPP_NPM_DIR, a
#    folder that already holds that node_modules;
# 2. takes llama.h / ggml*.h from the package's own source bundle (same build as the
#    binaries) and compiles lcpp_peer.c against the bundled libllama.so;
# 3. picks a CPU variant of ggml that works on this machine (ggml's own choice unless it
#    crashes, then the baseline x86-64 one — the reason is printed);
# 4. runs run_interop.py (the checks and the figures).
# Exit: 0 pass, 77 skip (node / npm / the package unavailable here — printed), else fail.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR [WORK_DIR]}
build=$(cd "$build" && pwd)
work=${2:-$build/interop}
mkdir -p "$work"
work=$(cd "$work" && pwd)
LCPP_NPM_VERSION=${LCPP_NPM_VERSION:-3.22.1}
py=${DSI_PYTHON:-/usr/bin/python3}

skip() { echo "SKIP: $*"; exit 77; }

for tool in "$build/bin/dsinfer-mkmodel" "$build/tests/dsi_logits" "$build/tests/dsi_layout_cmp"; do
  [ -x "$tool" ] || { echo "FAIL: $tool not built"; exit 1; }
done
"$py" -c 'import numpy' 2>/dev/null || skip "python3-numpy not installed"

# ---- 1. the package -----------------------------------------------------------------------
npm_dir=${DSI_LCPP_NPM_DIR:-$work/npm}
pkg=$npm_dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
bundle=$npm_dir/node_modules/node-llama-cpp/llama/gitRelease.bundle
find_libllama() { ls "$pkg"/libllama.v*.so "$pkg"/libllama.so 2>/dev/null | head -1; }
if [ -z "$(find_libllama)" ]; then
  command -v npm >/dev/null || skip "npm is not installed (scripts/setup-deps.sh installs it)"
  [ "$(uname -m)" = x86_64 ] || skip "the bundled llama.cpp is linux-x64 only (this is $(uname -m))"
  echo "interop: npm install node-llama-cpp@$LCPP_NPM_VERSION @node-llama-cpp/linux-x64@$LCPP_NPM_VERSION"
  mkdir -p "$npm_dir"
  (cd "$npm_dir" && npm install --ignore-scripts --no-audit --no-fund --omit=optional \
     "node-llama-cpp@$LCPP_NPM_VERSION" "@node-llama-cpp/linux-x64@$LCPP_NPM_VERSION") \
     >"$work/npm-install.log" 2>&1 || { tail -5 "$work/npm-install.log"; skip "npm install failed (registry unreachable?)"; }
fi
libllama=$(find_libllama)
[ -n "$libllama" ] || { echo "FAIL: no libllama in $pkg"; exit 1; }
[ -f "$bundle" ] || { echo "FAIL: $bundle missing"; exit 1; }

# ---- 2. headers from the package's source bundle, then the peer ----------------------------
inc=$work/lcpp-include
if [ ! -f "$inc/llama.h" ]; then
  rm -rf "$work/lcpp-git" && git init -q "$work/lcpp-git" &&
  git -C "$work/lcpp-git" fetch -q "$bundle" HEAD &&
  mkdir -p "$inc" &&
  git -C "$work/lcpp-git" archive FETCH_HEAD include/llama.h ggml/include | tar -x -C "$work/lcpp-git" &&
  cp "$work/lcpp-git/include/llama.h" "$work"/lcpp-git/ggml/include/*.h "$inc/" ||
  { echo "FAIL: cannot extract llama.h from $bundle"; exit 1; }
  rm -rf "$work/lcpp-git"
fi
peer=$work/lcpp_peer
cc -O2 -std=c11 -Wall -o "$peer" "$here/lcpp_peer.c" -I"$inc" "$libllama" "$pkg"/libggml.v*.so \
   "$pkg/libggml-base.so" -Wl,-rpath,"$pkg" -lm || { echo "FAIL: cannot build lcpp_peer"; exit 1; }

# ---- 3. a CPU variant that works here --------------------------------------------------------
export LCPP_BACKEND_DIR=$pkg
probe=$work/probe.gguf
"$build/bin/dsinfer-mkmodel" --config tiny-v4-lcpp --layout llama.cpp --no-mtp -o "$probe" >/dev/null 2>&1 ||
  { echo "FAIL: dsinfer-mkmodel"; exit 1; }
"$py" -c "import numpy as np; np.arange(3, 19, dtype='<i4').tofile('$work/probe.bin')"
if ! "$peer" logits "$probe" "$work/probe.bin" "$work/probe.f32" >"$work/probe.log" 2>&1; then
  rc=$?
  echo "interop: ggml's own CPU variant failed on this machine (exit $rc, $(tail -1 "$work/probe.log"));"
  echo "interop: using the baseline variant libggml-cpu-x64.so (plain x86-64, no AVX) instead"
  export LCPP_CPU_VARIANT=libggml-cpu-x64.so
  "$peer" logits "$probe" "$work/probe.bin" "$work/probe.f32" >"$work/probe.log" 2>&1 ||
    { cat "$work/probe.log"; echo "FAIL: no bundled CPU variant works"; exit 1; }
fi
LCPP_VERBOSE=1 "$peer" load "$probe" 2>&1 | grep -m1 "loaded CPU backend" | sed 's/^/interop: llama.cpp /'

# ---- 4. the checks ---------------------------------------------------------------------------
export LCPP_PEER=$peer
exec "$py" "$here/run_interop.py" --build "$build" --work "$work"
