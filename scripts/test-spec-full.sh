#!/usr/bin/env bash
# Opt-in: speculative decoding's greedy exactness at the size issue 15 asks for — both tiny
# random models AND both trained models, >= 50 prompts x 200 tokens each (speculation on vs
# off, byte for byte, with the model's own drafter and with an oracle drafter), on the CPU and
# on Vulkan (lavapipe without a GPU). scripts/test-all.sh runs the same programs with fewer
# prompts (CPU: 6 per tiny model, 1 per trained model; Vulkan: 1 per tiny model) to stay
# within CI time; this reruns them through ctest with DSI_SPEC_PROMPTS set.
#   bash scripts/test-spec-full.sh [CMAKE_BUILD_DIR] [PROMPTS]
# CMAKE_BUILD_DIR: default build-ci/cmake (the build scripts/test-all.sh makes); PROMPTS:
# default 50. test_spec_vulkan skips (reported by ctest) without a Vulkan device; on
# lavapipe it takes far longer than the CPU part.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bd=${1:-$root/build-ci/cmake}
[ -f "$bd/CTestTestfile.cmake" ] || { echo "no CMake build in $bd"; exit 1; }
cd "$bd" && DSI_SPEC_PROMPTS=${2:-50} ctest --output-on-failure --timeout 36000 -V \
  -R '^test_spec(_vulkan)?$'
