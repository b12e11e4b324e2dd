#!/usr/bin/env bash
# The prepared device check for a session lent a GPU machine (see docs/backends.md):
# one short run that builds with the CUDA module for sm_90, runs every test labelled gpu
# and the CUDA-capable parts of the suite, and writes the log under $OUT (or ./gpu-out).
# Usage on the device machine: bash tests/gpu/run-gpu-checks.sh
# It fails unless the tests really ran on the GPU: on that machine the CUDA toolkit and a
# device are present, so their absence is a failure (DSI_REQUIRE_CUDA_TOOLKIT / _DEVICE,
# tests/common/skip.h), and a label that selects no test is an error (--no-tests=error).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export DSI_REQUIRE_CUDA_TOOLKIT=1 DSI_REQUIRE_CUDA_DEVICE=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  cmake -S "$root" -B /tmp/dsi-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSI_CUDA=on \
        -DDSI_VULKAN=off -DDSI_BUILD_EXAMPLES=ON >/dev/null &&
  cmake --build /tmp/dsi-gpu -j"$(nproc)" &&
  (cd /tmp/dsi-gpu && ctest -L gpu --no-tests=error --output-on-failure)
} 2>&1 | tee "$out/gpu-checks.log"
rc=${PIPESTATUS[0]}
# ctest counts a skip as "not run" but exits 0: a skipped gpu test is a failure here too
if [ "$rc" -eq 0 ] && grep -qE '\*\*\*Skipped|Not Run' "$out/gpu-checks.log"; then
  echo "run-gpu-checks: a gpu test was skipped on the GPU machine" | tee -a "$out/gpu-checks.log"
  rc=1
fi
exit "$rc"
