#!/usr/bin/env bash
# GGUF interop with the real llama.cpp (issue 21; tests/interop/README.md).
#
#   bash tests/interop/run.sh BUILD_DIR [WORK_DIR]
#
# 1. finds npm's node-llama-cpp and @node-llama-cpp/linux-x64 (pinned 3.22.1), installed
#    beforehand by scripts/setup-llama-cpp.sh DIR (CI: test-all.sh's setup stage): DIR is
#    DSI_LCPP_NPM_DIR, or derived from DSI_LLAMA_CPP_LIBDIR (the bins folder that script
#    prints). Nothing is downloaded here; without the package the stage skips (fails when
#    DSI_REQUIRE_LLAMA_CPP=1);
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
if [ -n "${DSI_LCPP_NPM_DIR:-}" ]; then npm_dir=$DSI_LCPP_NPM_DIR
elif [ -n "${DSI_LLAMA_CPP_LIBDIR:-}" ]; then npm_dir=${DSI_LLAMA_CPP_LIBDIR%/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
else npm_dir=""
fi
pkg=$npm_dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
bundle=$npm_dir/node_modules/node-llama-cpp/llama/gitRelease.bundle
find_libllama() { ls "$pkg"/libllama.v*.so "$pkg"/libllama.so 2>/dev/null | head -1; }
if [ -z "$npm_dir" ] || [ -z "$(find_libllama)" ]; then
  msg="llama.cpp (npm node-llama-cpp@$LCPP_NPM_VERSION) is not installed: run scripts/setup-llama-cpp.sh DIR and set DSI_LCPP_NPM_DIR=DIR (DSI_LCPP_NPM_DIR='${DSI_LCPP_NPM_DIR:-}', DSI_LLAMA_CPP_LIBDIR='${DSI_LLAMA_CPP_LIBDIR:-}')"
  [ "${DSI_REQUIRE_LLAMA_CPP:-0}" = 1 ] && { echo "FAIL: $msg"; exit 1; }
  skip "$msg"
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
