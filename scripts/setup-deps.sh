#!/usr/bin/env bash
# Installs the Debian packages needed to build libdsinfer and run every test.
# Idempotent: installs only what is missing. Run as root (or with sudo available).
set -euo pipefail
pkgs=(gcc g++ clang cmake ninja-build meson pkg-config binutils make
      libcmocka-dev libclang-rt-14-dev python3 python3-numpy python3-regex unicode-data
      mesa-vulkan-drivers glslc libvulkan-dev vulkan-validationlayers vulkan-tools libxxhash-dev
      libjansson-dev git)
# node + npm for the llama.cpp interop stage (tests/interop): Debian's, unless a node with npm
# is already there (e.g. NodeSource's nodejs, which bundles npm and conflicts with Debian's)
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# npm fetches the real llama.cpp for the interop tests (scripts/setup-llama-cpp.sh); any
# node/npm on PATH will do (Debian's packages when there is none).
command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
