#!/usr/bin/env bash
# Installs the Debian packages needed to build libdsinfer and run every test.
# Idempotent: installs only what is missing. Run as root (or with sudo available).
set -euo pipefail
pkgs=(gcc g++ clang cmake ninja-build meson pkg-config binutils make
      libcmocka-dev libclang-rt-14-dev python3 python3-numpy python3-regex unicode-data
      mesa-vulkan-drivers glslc libvulkan-dev vulkan-validationlayers vulkan-tools libxxhash-dev)
# the trained models' tools (tools/train, docs/trained-models.md)
pkgs+=(python3-torch libopenblas0-pthread bible-kjv)
# bindings and the server (docs/bindings.md, docs/server.md); jansson also for dsinfer-convert
pkgs+=(libmicrohttpd-dev libjansson-dev curl python3-pytest python3-venv python3-setuptools
       python3-wheel golang-go)
# git: the interop stage takes llama.h from node-llama-cpp's source bundle (tests/interop)
pkgs+=(git)
# Rust and Node.js: Debian's packages unless another installation is on PATH (rustup, nodesource);
# npm also fetches the real llama.cpp for the interop tests (scripts/setup-llama-cpp.sh)
command -v cargo >/dev/null 2>&1 || pkgs+=(cargo rustc)
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#pkgs[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages of the server tests (tests/server/run.sh), pinned, into a scratch prefix:
# installed here, never while tests run.
node_dir=${DSI_NODE_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.cache/node}
openai_version=6.30.1
if ! grep -qs "\"version\": \"$openai_version\"" "$node_dir/node_modules/openai/package.json"; then
  echo "setup-deps: npm install openai@$openai_version into $node_dir"
  mkdir -p "$node_dir"
  npm install --prefix "$node_dir" --no-audit --no-fund --loglevel=error "openai@$openai_version" >/dev/null
fi
