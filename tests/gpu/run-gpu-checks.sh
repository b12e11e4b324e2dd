#!/usr/bin/env bash
# The prepared device check for a session lent a GPU machine (see docs/backends.md):
# one short run that builds with the CUDA module for sm_90, runs every test labelled gpu
# and the CUDA-capable parts of the suite, and writes the log under $OUT (or ./gpu-out).
# Usage on the device machine: bash tests/gpu/run-gpu-checks.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  cmake -S "$root" -B /tmp/dsi-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSI_CUDA=on \
        -DDSI_VULKAN=off -DDSI_BUILD_EXAMPLES=ON >/dev/null &&
  cmake --build /tmp/dsi-gpu -j"$(nproc)" &&
  (cd /tmp/dsi-gpu && ctest -L gpu --output-on-failure)
} 2>&1 | tee "$out/gpu-checks.log"
exit "${PIPESTATUS[0]}"
