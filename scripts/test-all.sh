#!/usr/bin/env bash
# Sets up and runs every test of libdsinfer, the way CI does:
#   1. CMake build (warnings are errors) + ctest, install to a scratch prefix
#   2. Meson build (warnings are errors) + meson test, install to a scratch prefix
#   3. pkg-config consumers against both install trees
#   4. ASan + UBSan build of the unit, abi and model tiers
#   5. Vulkan tests with the Khronos validation layer on lavapipe
#   6. bounded libFuzzer run of the GGUF reader (clang)
#   7. ThreadSanitizer build of the concurrency tests (label concurrency)
#   8. GGUF interop with the real llama.cpp (npm's node-llama-cpp, CPU; tests/interop)
# Ends with a summary line "N passed, N failed, N skipped"; exits non-zero on any failure.
# Environment: DSI_JOBS (parallel jobs, default nproc), DSI_FUZZ_SECONDS (default 60),
#              DSI_SKIP_SANITIZE=1 / DSI_SKIP_FUZZ=1 / DSI_SKIP_MESON=1 / DSI_SKIP_TSAN=1 /
#              DSI_SKIP_INTEROP=1 to shorten local runs; DSI_LCPP_NPM_DIR reuses an installed
#              node-llama-cpp.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${DSI_JOBS:-$(nproc)}
out=${DSI_TEST_OUT:-$root/build-ci}
mkdir -p "$out"
passed=0 failed=0 skipped=0
failures=()

stage() { printf '\n=== %s ===\n' "$*"; }
record() { # name status(0 ok, 77 skip, else fail)
  if [ "$2" -eq 0 ]; then passed=$((passed + 1));
  elif [ "$2" -eq 77 ]; then skipped=$((skipped + 1));
  else failed=$((failed + 1)); failures+=("$1"); fi
}
# Adds the counts of a ctest log.
count_ctest() { # label logfile rc
  local p f s
  p=$(grep -cE 'Test +#[0-9]+: .* Passed' "$2")
  s=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$2")
  f=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run|\*\*\*Not)' "$2")
  if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  [ "$f" -eq 0 ] || failures+=("$1: $(grep -E 'Test +#[0-9]+: .*(Failed|Timeout|Exception|Not Run)' "$2" | sed 's/.*: \([^ ]*\) .*/\1/' | tr '\n' ' ')")
  echo "[$1] $p passed, $f failed, $s skipped"
}
count_meson() { # label logfile rc
  local p f s t
  p=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  f=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  t=$(sed -n 's/^Timeout: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  s=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  p=${p:-0}; f=$(( ${f:-0} + ${t:-0} )); s=${s:-0}
  if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  [ "$f" -eq 0 ] || failures+=("$1: see $2")
  echo "[$1] $p passed, $f failed, $s skipped"
}

stage "setup"
bash scripts/setup-deps.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
# lavapipe is installed by setup: Vulkan tests must run, not skip.
export DSI_REQUIRE_VULKAN=1
# The real llama.cpp for the interop tests (npm's node-llama-cpp, no scripts, no GPU variants).
if DSI_LLAMA_CPP_LIBDIR=$(bash scripts/setup-llama-cpp.sh "$out/llama-cpp"); then
  export DSI_LLAMA_CPP_LIBDIR DSI_REQUIRE_LLAMA_CPP=1
else
  echo "setup: llama.cpp (npm node-llama-cpp) could not be installed"; record setup-llama-cpp 1
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
t0=$(date +%s)

stage "CMake build (Release, -Werror)"
rm -rf "$out/cmake" "$out/cmake-prefix"
if cmake -S . -B "$out/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSI_WERROR=ON \
     -DDSI_VULKAN=auto -DCMAKE_INSTALL_PREFIX="$out/cmake-prefix" >"$out/cmake-configure.log" 2>&1 &&
   cmake --build "$out/cmake" -j"$jobs" >"$out/cmake-build.log" 2>&1; then
  record cmake-build 0
  stage "CMake tests (ctest)"
  (cd "$out/cmake" && ctest -j"$jobs" --output-on-failure --timeout 1200) 2>&1 | tee "$out/ctest.log"
  count_ctest ctest "$out/ctest.log" "${PIPESTATUS[0]}"
  cmake --install "$out/cmake" >"$out/cmake-install.log" 2>&1; record cmake-install $?
else
  cat "$out/cmake-configure.log" "$out/cmake-build.log" 2>/dev/null | tail -60
  record cmake-build 1
fi

if [ "${DSI_SKIP_MESON:-0}" != 1 ]; then
  stage "Meson build (--werror)"
  rm -rf "$out/meson" "$out/meson-prefix"
  if meson setup "$out/meson" --werror --buildtype=release --prefix="$out/meson-prefix" \
       >"$out/meson-configure.log" 2>&1 &&
     meson compile -C "$out/meson" -j "$jobs" >"$out/meson-build.log" 2>&1; then
    record meson-build 0
    stage "Meson tests"
    meson test -C "$out/meson" --num-processes "$jobs" --print-errorlogs -t 2 2>&1 | tee "$out/meson-test.log"
    count_meson meson "$out/meson-test.log" "${PIPESTATUS[0]}"
    meson install -C "$out/meson" >"$out/meson-install.log" 2>&1; record meson-install $?
  else
    cat "$out/meson-configure.log" "$out/meson-build.log" 2>/dev/null | tail -60
    record meson-build 1
  fi
fi

stage "pkg-config consumers"
model=""
[ -f "$out/cmake/models/tiny-v41.gguf" ] && model="$out/cmake/models/tiny-v41.gguf"
for tree in cmake-prefix meson-prefix; do
  if [ -d "$out/$tree" ]; then
    bash tests/abi/consumer-test.sh "$out/$tree" $model; record "consumer-$tree" $?
  fi
done

if [ "${DSI_SKIP_SANITIZE:-0}" != 1 ]; then
  stage "ASan + UBSan build (unit, abi, model tiers)"
  rm -rf "$out/asan"
  if cmake -S . -B "$out/asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSI_WERROR=ON \
       -DDSI_SANITIZE=ON -DDSI_VULKAN=off >"$out/asan-configure.log" 2>&1 &&
     cmake --build "$out/asan" -j"$jobs" >"$out/asan-build.log" 2>&1; then
    record asan-build 0
    (cd "$out/asan" && ctest -j"$jobs" --output-on-failure --timeout 1800 -L 'unit|abi|model') 2>&1 | tee "$out/ctest-asan.log"
    count_ctest asan "$out/ctest-asan.log" "${PIPESTATUS[0]}"
  else
    tail -60 "$out/asan-build.log" 2>/dev/null
    record asan-build 1
  fi
fi

if [ -d "$out/cmake" ] && [ "$(cd "$out/cmake" && ctest -N -L backend | grep -c 'Test *#')" -gt 0 ]; then
  stage "Vulkan tests under the Khronos validation layer"
  (cd "$out/cmake" && DSINFER_VULKAN_VALIDATION=1 ctest -j1 --output-on-failure --timeout 1800 -L backend) 2>&1 | tee "$out/ctest-vkval.log"
  count_ctest vulkan-validation "$out/ctest-vkval.log" "${PIPESTATUS[0]}"
fi

if [ "${DSI_SKIP_FUZZ:-0}" != 1 ] && [ -f tests/fuzz/run.sh ]; then
  stage "libFuzzer: GGUF reader, ${DSI_FUZZ_SECONDS:-60} s; safetensors header parser, a third of that"
  rm -rf "$out/fuzz"
  if CC=clang CXX=clang++ cmake -S . -B "$out/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DDSI_FUZZ=ON -DDSI_WERROR=ON -DDSI_VULKAN=off -DDSI_CUDA=off -DDSI_BUILD_EXAMPLES=OFF \
       >"$out/fuzz-configure.log" 2>&1 &&
     cmake --build "$out/fuzz" -j"$jobs" --target fuzz_gguf fuzz_gguf_seeds fuzz_safetensors >"$out/fuzz-build.log" 2>&1; then
    sh tests/fuzz/run.sh "$out/fuzz" >"$out/fuzz-run.log" 2>&1
    rc=$?
    tail -8 "$out/fuzz-run.log"
    record fuzz-gguf $rc
  else
    cat "$out/fuzz-configure.log" "$out/fuzz-build.log" | tail -40
    record fuzz-build 1
  fi
fi

if [ "${DSI_SKIP_TSAN:-0}" != 1 ]; then
  stage "ThreadSanitizer build (concurrency tests)"
  rm -rf "$out/tsan"
  if cmake -S . -B "$out/tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSI_WERROR=ON \
       -DDSI_TSAN=ON -DDSI_VULKAN=off -DDSI_CUDA=off >"$out/tsan-configure.log" 2>&1 &&
     cmake --build "$out/tsan" -j"$jobs" >"$out/tsan-build.log" 2>&1; then
    record tsan-build 0
    (cd "$out/tsan" && ctest -j"$jobs" --output-on-failure --timeout 1800 -L concurrency) 2>&1 | tee "$out/ctest-tsan.log"
    count_ctest tsan "$out/ctest-tsan.log" "${PIPESTATUS[0]}"
  else
    tail -60 "$out/tsan-build.log" 2>/dev/null
    record tsan-build 1
  fi
fi

if [ "${DSI_SKIP_INTEROP:-0}" != 1 ] && [ -f tests/interop/run.sh ] && [ -x "$out/cmake/tests/dsi_logits" ]; then
  stage "llama.cpp interop (npm node-llama-cpp, CPU)"
  bash tests/interop/run.sh "$out/cmake" "$out/interop" 2>&1 | tee "$out/interop.log"
  record interop "${PIPESTATUS[0]}"
fi

t1=$(date +%s)
stage "summary ($((t1 - t0)) s)"
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
