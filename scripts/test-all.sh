#!/usr/bin/env bash
# Sets up and runs every test of libdsinfer, the way CI does:
#   1. CMake build (warnings are errors) + ctest
#   2. Meson build (warnings are errors) + meson test
#   3. installs (both builds configured with default install settings): `cmake --install
#      --prefix <scratch>`, DESTDIR / `meson install --destdir` staging of both (same tree),
#      C and C++ pkg-config consumers and the installed dsinfer-cli in a clean environment
#   4. ASan + UBSan build of the unit, abi and model tiers
#   5. Vulkan tests with the Khronos validation layer on lavapipe
#   6. mutation checks: deliberate defects the suite must catch (tests/mutation/run.py)
#   7. bounded libFuzzer run of the GGUF reader (clang)
#   8. ThreadSanitizer build of the concurrency, cancellation and error-path tests (label
#      concurrency; only those tests and the tiny models are built)
#   9. Python, Rust and Go bindings; dsinfer-server (curl, OpenAI Node SDK, load test,
#      malformed input), also under ASan
#  10. GGUF interop with the real llama.cpp (npm's node-llama-cpp, CPU; tests/interop)
# Ends with a summary line "N passed, N failed, N skipped [who: why; ...]"; exits non-zero on
# any failure. A skip means only "absent here" (tests/common/skip.h): every program logs its
# skips (whole program, or one test inside it) to $DSI_SKIP_LOG, and since setup-deps.sh
# installed the Debian packages, their absence is a failure here (DSI_REQUIRE_*). Stages
# disabled by the environment count as skipped.
# Environment: DSI_JOBS (parallel jobs, default nproc), DSI_FUZZ_SECONDS (default 60),
#              DSI_SKIP_SANITIZE=1 / DSI_SKIP_FUZZ=1 / DSI_SKIP_MESON=1 / DSI_SKIP_MUTATION=1 /
#              DSI_SKIP_TSAN=1 / DSI_SKIP_BINDINGS=1 / DSI_SKIP_INTEROP=1 to shorten local runs
#              (reported as skipped); DSI_REQUIRE_<WHAT>=0 to let a local run skip what setup
#              could not install (DSI_REQUIRE_LLAMA_CPP=0: the npm package of the interop tests).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${DSI_JOBS:-$(nproc)}
out=${DSI_TEST_OUT:-$root/build-ci}
mkdir -p "$out"
passed=0 failed=0 skipped=0
failures=() skips=()

# Each stage header also closes the previous stage with its wall time, and the summary lists
# them all (where CI time goes: it must stay well under 60 minutes on 2 cores).
stage_name="" stage_t=$(date +%s) stage_times=()
stage() {
  local now; now=$(date +%s)
  if [ -n "$stage_name" ]; then
    stage_times+=("$((now - stage_t)) s  $stage_name"); echo "[time] $((now - stage_t)) s: $stage_name"
  fi
  stage_name=$*; stage_t=$now
  printf '\n=== %s ===\n' "$*"
}
skip_stage() { # name reason
  skipped=$((skipped + 1)); skips+=("$1: $2"); echo "[$1] skipped: $2"
}
# Skips a harness reported: $1 label, $2 skip log of the stage (lines "kind<TAB>program<TAB>
# reason", tests/common/skip.h), then the names of the tests the harness reported skipped
# (already counted). Each gets its logged reason; skips of single tests inside programs that
# went on ("test" lines) are counted here.
count_skips() {
  local label=$1 log=$2 name why kind prog reason
  shift 2
  for name in "$@"; do
    why=$(awk -F'\t' -v n="$name" '$1 == "program" && index(n, $2) == 1 { print $3; exit }' "$log" 2>/dev/null)
    skips+=("$label: $name: ${why:-(no reason logged)}")
  done
  [ -f "$log" ] || return 0
  while IFS=$'\t' read -r kind prog reason; do
    [ "$kind" = test ] || continue
    skipped=$((skipped + 1)); skips+=("$label: $prog: $reason")
  done < <(sort -u "$log")
}
record() { # name status(0 ok, 77 skip, else fail)
  if [ "$2" -eq 0 ]; then passed=$((passed + 1));
  elif [ "$2" -eq 77 ]; then skipped=$((skipped + 1));
  else failed=$((failed + 1)); failures+=("$1"); fi
}
# Adds the counts of a ctest log.
count_ctest() { # label logfile rc skiplog
  local p f s
  p=$(grep -cE 'Test +#[0-9]+: .* Passed' "$2")
  s=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$2")
  f=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run|\*\*\*Not)' "$2")
  if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  [ "$f" -eq 0 ] || failures+=("$1: $(grep -E 'Test +#[0-9]+: .*(Failed|Timeout|Exception|Not Run)' "$2" | sed 's/.*: \([^ ]*\) .*/\1/' | tr '\n' ' ')")
  # shellcheck disable=SC2046
  count_skips "$1" "$4" $(grep -E 'Test +#[0-9]+: .*\*\*\*Skipped' "$2" | sed 's/.*Test *#[0-9]*: \([^ ]*\) .*/\1/')
  echo "[$1] $p passed, $f failed, $s skipped (+ single tests skipped inside programs, if any)"
}
count_meson() { # label logfile rc skiplog
  local p f s t
  p=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  f=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  t=$(sed -n 's/^Timeout: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  s=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$2" | tail -n1)
  p=${p:-0}; f=$(( ${f:-0} + ${t:-0} )); s=${s:-0}
  if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  # the --no-tests=error of meson: a suite that ran nothing is a failure
  if [ $((p + f + s)) -eq 0 ]; then f=1; failures+=("$1: meson ran no tests"); fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  [ "$f" -eq 0 ] || failures+=("$1: see $2")
  # shellcheck disable=SC2046
  count_skips "$1" "$4" $(grep -E '^ *[0-9]+/[0-9]+ .* SKIP ' "$2" | sed 's|.* / \([^ ]*\) .*|\1|')
  echo "[$1] $p passed, $f failed, $s skipped (+ single tests skipped inside programs, if any)"
}

stage "setup"
bash scripts/setup-deps.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
# setup installed lavapipe, Python with NumPy + regex and unicode-data, and the build writes
# the example programs and tiny models: tests needing them must run, not skip
# (tests/common/skip.h). Where nvcc is found the CUDA module must build (DSI_CUDA=on) and
# load; only the CUDA device stays optional (no GPU in CI).
export DSI_REQUIRE_VULKAN=${DSI_REQUIRE_VULKAN:-1} DSI_REQUIRE_PYTHON=${DSI_REQUIRE_PYTHON:-1}
export DSI_REQUIRE_UNICODE_DATA=${DSI_REQUIRE_UNICODE_DATA:-1} DSI_REQUIRE_MODELS=${DSI_REQUIRE_MODELS:-1}
# setup-deps.sh installs python3-torch and bible-kjv for tools/train's tests
export DSI_REQUIRE_TRAIN=${DSI_REQUIRE_TRAIN:-1}
cuda_cmake=() cuda_meson=()
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export DSI_REQUIRE_CUDA_TOOLKIT=${DSI_REQUIRE_CUDA_TOOLKIT:-1}
  # the main CMake stage builds the CUDA module's fat binary (sm_80/86/89/90/120 + PTX) once;
  # Meson and the sanitizer stages build one architecture (docs/cuda.md "Building")
  if [ "$DSI_REQUIRE_CUDA_TOOLKIT" = 1 ]; then cuda_cmake=(-DDSI_CUDA=on -DDSI_CUDA_FAT=ON); cuda_meson=(-Dcuda=enabled); fi
fi
# The real llama.cpp for the interop tests (npm's node-llama-cpp, no scripts, no GPU variants),
# installed here once; no test downloads anything (tests/interop/README.md).
export DSI_REQUIRE_LLAMA_CPP=${DSI_REQUIRE_LLAMA_CPP:-1}
if DSI_LLAMA_CPP_LIBDIR=$(bash scripts/setup-llama-cpp.sh "$out/llama-cpp"); then
  export DSI_LLAMA_CPP_LIBDIR
elif [ "$DSI_REQUIRE_LLAMA_CPP" = 1 ]; then
  echo "setup: llama.cpp (npm node-llama-cpp) could not be installed"; record setup-llama-cpp 1
else
  skip_stage setup-llama-cpp "npm node-llama-cpp could not be installed (DSI_REQUIRE_LLAMA_CPP=0)"
fi
skiplog() { rm -f "$out/skips-$1.log"; echo "$out/skips-$1.log"; } # a fresh skip log per stage
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
t0=$(date +%s)

stage "CMake build (Release, -Werror)"
rm -rf "$out/cmake" "$out/cmake-prefix" "$out/ctest.log"
# No install prefix here (default settings): the install stage below installs with
# --prefix / DESTDIR.
if cmake -S . -B "$out/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSI_WERROR=ON \
     -DDSI_VULKAN=auto "${cuda_cmake[@]}" >"$out/cmake-configure.log" 2>&1 &&
   cmake --build "$out/cmake" -j"$jobs" >"$out/cmake-build.log" 2>&1; then
  record cmake-build 0
  stage "CMake tests (ctest)"
  sl=$(skiplog ctest)
  (cd "$out/cmake" && DSI_SKIP_LOG=$sl ctest -j"$jobs" --no-tests=error --output-on-failure --timeout 1200) 2>&1 | tee "$out/ctest.log"
  count_ctest ctest "$out/ctest.log" "${PIPESTATUS[0]}" "$sl"
else
  cat "$out/cmake-configure.log" "$out/cmake-build.log" 2>/dev/null | tail -60
  record cmake-build 1
fi

if [ "${DSI_SKIP_MESON:-0}" != 1 ]; then
  stage "Meson build (--werror)"
  rm -rf "$out/meson" "$out/meson-prefix"
  if meson setup "$out/meson" --werror --buildtype=release "${cuda_meson[@]}" \
       >"$out/meson-configure.log" 2>&1 &&
     meson compile -C "$out/meson" -j "$jobs" >"$out/meson-build.log" 2>&1; then
    record meson-build 0
    stage "Meson tests"
    sl=$(skiplog meson)
    # suite train (tools/train/test_train.py: Python only, the same run as in ctest) is left
    # to the CMake stage; so is suite heavy (whole-model runs on lavapipe: test_backend_model,
    # test_batch_vulkan*, test_spec_vulkan, test_snapshot_vulkan), which the CMake stage runs
    # and the validation stage runs again
    DSI_SKIP_LOG=$sl meson test -C "$out/meson" --num-processes "$jobs" --print-errorlogs -t 2 \
      --no-suite train --no-suite heavy 2>&1 | tee "$out/meson-test.log"
    count_meson meson "$out/meson-test.log" "${PIPESTATUS[0]}" "$sl"
  else
    cat "$out/meson-configure.log" "$out/meson-build.log" 2>/dev/null | tail -60
    record meson-build 1
  fi
else
  skip_stage meson "disabled by DSI_SKIP_MESON=1"
fi

if [ -d "$out/cmake" ]; then
  # The tiny model the installed CLI and consumers run on is part of the default build: its
  # absence fails the stage (check-install.sh), as DSI_REQUIRE_MODELS asks.
  stage "installs: --prefix, DESTDIR and --destdir trees, pkg-config consumers, installed CLI"
  meson_dir=-
  [ "${DSI_SKIP_MESON:-0}" != 1 ] && [ -f "$out/meson/build.ninja" ] && meson_dir=$out/meson
  bash tests/install/check-install.sh "$out/cmake" "$meson_dir" "$out/install" 2>&1 | tee "$out/install.log"
  record installs "${PIPESTATUS[0]}"
else
  skip_stage installs "no CMake build"
fi

if [ "${DSI_SKIP_SANITIZE:-0}" != 1 ]; then
  stage "ASan + UBSan build (unit, abi, model tiers)"
  rm -rf "$out/asan"
  # the tests' further models written by the plain build's dsinfer-mkmodel where there is one
  # (the same bytes; its quantizers run sanitized in test_quant_ggml; CMakeLists.txt
  # DSI_TEST_MKMODEL); the models of the build itself still come from the sanitized one
  mk=()
  [ -x "$out/cmake/bin/dsinfer-mkmodel" ] && mk=(-DDSI_TEST_MKMODEL="$(cd "$out/cmake/bin" && pwd)/dsinfer-mkmodel")
  if cmake -S . -B "$out/asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSI_WERROR=ON \
       -DDSI_SANITIZE=ON -DDSI_VULKAN=off "${mk[@]}" >"$out/asan-configure.log" 2>&1 &&
     cmake --build "$out/asan" -j"$jobs" >"$out/asan-build.log" 2>&1; then
    record asan-build 0
    sl=$(skiplog asan)
    (cd "$out/asan" && DSI_SKIP_LOG=$sl ctest -j"$jobs" --no-tests=error --output-on-failure --timeout 1800 -L 'unit|abi|model') 2>&1 | tee "$out/ctest-asan.log"
    count_ctest asan "$out/ctest-asan.log" "${PIPESTATUS[0]}" "$sl"
  else
    tail -60 "$out/asan-build.log" 2>/dev/null
    record asan-build 1
  fi
else
  skip_stage asan "disabled by DSI_SKIP_SANITIZE=1"
fi

if [ -f "$out/cmake/CTestTestfile.cmake" ]; then
  # every test of the label reads the layer's error count (tests/common/vk_validation.h)
  stage "Vulkan tests under the Khronos validation layer"
  sl=$(skiplog vkval)
  (cd "$out/cmake" && DSI_SKIP_LOG=$sl DSINFER_VULKAN_VALIDATION=1 ctest -j"$jobs" --no-tests=error --output-on-failure --timeout 1800 -L backend) 2>&1 | tee "$out/ctest-vkval.log"
  count_ctest vulkan-validation "$out/ctest-vkval.log" "${PIPESTATUS[0]}" "$sl"
fi

if [ "${DSI_SKIP_MUTATION:-0}" != 1 ]; then
  # deliberate defects the suite must catch (tests/mutation/, docs/CONTRIBUTING.md)
  stage "Mutation checks"
  if [ -x /usr/bin/python3 ]; then
    # the unmutated tests already ran in this tree's ctest stage: those that passed there
    # need no second baseline run (the rest get one)
    base=()
    [ -f "$out/ctest.log" ] && base=(--baselines-from "$out/ctest.log")
    /usr/bin/python3 tests/mutation/run.py --out "$out/mutation" --jobs "$jobs" "${base[@]}" 2>&1 | tee "$out/mutation-run.log"
    rc=${PIPESTATUS[0]}
    k=$(sed -n 's/^mutation: \([0-9]*\) of \([0-9]*\) mutants killed.*/\1 \2/p' "$out/mutation-run.log")
    if [ -n "$k" ]; then # each mutant counts: killed = passed
      read -r killed total <<<"$k"
      passed=$((passed + killed)); failed=$((failed + total - killed))
      [ "$killed" -eq "$total" ] || failures+=("mutation: $((total - killed)) of $total mutants not killed (see $out/mutation-run.log)")
    fi
    # mutants whose code this CPU cannot run ("needs:" flags it lacks): skips, with the reason
    ms=$(sed -n 's/^mutation: .*; \([0-9]*\) skipped (\([^)]*\)).*/\1/p' "$out/mutation-run.log")
    if [ -n "$ms" ]; then
      skipped=$((skipped + ms))
      skips+=("mutation: $(sed -n 's/^mutation: .*; [0-9]* skipped (\([^)]*\)).*/\1/p' "$out/mutation-run.log")")
    fi
    [ "$rc" -eq 0 ] || [ -n "$k" ] || record mutation-stage 1
  elif [ "${DSI_REQUIRE_PYTHON:-0}" = 1 ]; then
    record mutation-python 1
  else
    skip_stage mutation "/usr/bin/python3 absent"
  fi
else
  skip_stage mutation "disabled by DSI_SKIP_MUTATION=1"
fi

if [ "${DSI_SKIP_FUZZ:-0}" != 1 ] && [ -f tests/fuzz/run.sh ]; then
  stage "libFuzzer: GGUF reader and snapshot loader, ${DSI_FUZZ_SECONDS:-60} s each (side by side); safetensors header parser, a third of that"
  rm -rf "$out/fuzz"
  if CC=clang CXX=clang++ cmake -S . -B "$out/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DDSI_FUZZ=ON -DDSI_WERROR=ON -DDSI_VULKAN=off -DDSI_CUDA=off -DDSI_BUILD_EXAMPLES=OFF \
       >"$out/fuzz-configure.log" 2>&1 &&
     cmake --build "$out/fuzz" -j"$jobs" --target fuzz_gguf fuzz_gguf_seeds fuzz_safetensors fuzz_snapshot fuzz_snapshot_seeds >"$out/fuzz-build.log" 2>&1; then
    # libFuzzer runs on one core: with two or more jobs the two targets fuzz side by side
    # (the same seconds each, about a minute less of CI time)
    snap_pid=""
    if [ "$jobs" -ge 2 ]; then
      sh tests/fuzz/run.sh "$out/fuzz" snapshot >"$out/fuzz-snapshot-run.log" 2>&1 &
      snap_pid=$!
    fi
    sh tests/fuzz/run.sh "$out/fuzz" >"$out/fuzz-run.log" 2>&1
    rc=$?
    tail -8 "$out/fuzz-run.log"
    record fuzz-gguf $rc
    if [ -n "$snap_pid" ]; then
      wait "$snap_pid"
      rc=$?
    else
      sh tests/fuzz/run.sh "$out/fuzz" snapshot >"$out/fuzz-snapshot-run.log" 2>&1
      rc=$?
    fi
    tail -8 "$out/fuzz-snapshot-run.log"
    record fuzz-snapshot $rc
  else
    cat "$out/fuzz-configure.log" "$out/fuzz-build.log" | tail -40
    record fuzz-build 1
  fi
elif [ "${DSI_SKIP_FUZZ:-0}" = 1 ]; then
  skip_stage fuzz "disabled by DSI_SKIP_FUZZ=1"
else
  record fuzz-missing 1 # tests/fuzz/run.sh is part of the tree
fi

if [ "${DSI_SKIP_TSAN:-0}" != 1 ]; then
  # Only the programs of the tests labelled concurrency and the tiny models they load are
  # built (target dsinfer-concurrency-tests), not the whole tree.
  stage "ThreadSanitizer (concurrency, cancellation and error-path tests: label concurrency)"
  rm -rf "$out/tsan"
  if cmake -S . -B "$out/tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSI_WERROR=ON \
       -DDSI_TSAN=ON -DDSI_VULKAN=off -DDSI_CUDA=off >"$out/tsan-configure.log" 2>&1 &&
     cmake --build "$out/tsan" -j"$jobs" --target dsinfer-concurrency-tests \
       >"$out/tsan-build.log" 2>&1; then
    record tsan-build 0
    sl=$(skiplog tsan)
    (cd "$out/tsan" && DSI_SKIP_LOG=$sl ctest -j"$jobs" --no-tests=error --output-on-failure --timeout 1800 -L concurrency) 2>&1 | tee "$out/ctest-tsan.log"
    count_ctest tsan "$out/ctest-tsan.log" "${PIPESTATUS[0]}" "$sl"
  else
    tail -20 "$out/tsan-configure.log" 2>/dev/null
    tail -60 "$out/tsan-build.log" 2>/dev/null
    record tsan-build 1
  fi
else
  skip_stage tsan "disabled by DSI_SKIP_TSAN=1"
fi

# Bindings and the server (docs/bindings.md, docs/server.md): each prints a last line
# "RESULT: N passed, N failed, N skipped".
count_result() { # label logfile rc
  local line p f s
  line=$(grep -E '^RESULT: ' "$2" | tail -n1)
  p=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) passed.*/\1/p')
  f=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
  s=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')
  p=${p:-0}; f=${f:-1}; s=${s:-0}
  if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  [ "$f" -eq 0 ] || failures+=("$1: see $2")
  [ "$s" -eq 0 ] || skips+=("$1: $s skipped (reasons in $2)")
  echo "[$1] $p passed, $f failed, $s skipped ($(( $(date +%s) - ts )) s)"
}
if [ "${DSI_SKIP_BINDINGS:-0}" != 1 ] && [ -x "$out/cmake/bin/dsinfer-cli" ]; then
  # an install of the CMake build: Python is pip-installed and Go builds against it through
  # pkg-config (the installed dsinfer.pc relocates with the tree)
  rm -rf "$out/bindings-prefix"
  cmake --install "$out/cmake" --prefix "$out/bindings-prefix" >"$out/bindings-install.log" 2>&1
  record bindings-install $?
  for b in python rust go; do
    stage "$b binding"
    ts=$(date +%s)
    bash scripts/test-bindings.sh $b "$out/cmake" "$out/bindings-prefix" >"$out/bindings-$b.log" 2>&1
    rc=$?
    tail -5 "$out/bindings-$b.log"
    count_result "$b-binding" "$out/bindings-$b.log" $rc
  done
  stage "dsinfer-server: curl, OpenAI Node SDK, 16-client load, malformed input"
  ts=$(date +%s)
  bash tests/server/run.sh "$out/cmake" >"$out/server.log" 2>&1
  rc=$?
  grep -E '^(FAIL|skip|server|RESULT)|passed|failed' "$out/server.log" | tail -12
  count_result server "$out/server.log" $rc
  if [ -x "$out/asan/bin/dsinfer-server" ]; then
    stage "dsinfer-server under ASan + UBSan (no leaks at shutdown)"
    ts=$(date +%s)
    DSI_CLI="$out/cmake/bin/dsinfer-cli" DSI_LOAD_PER_CLIENT=2 bash tests/server/run.sh "$out/asan" asan \
      >"$out/server-asan.log" 2>&1
    rc=$?
    grep -E '^(FAIL|skip|server|RESULT)|passed|failed' "$out/server-asan.log" | tail -12
    count_result server-asan "$out/server-asan.log" $rc
  else
    skip_stage server-asan "no ASan build"
  fi
elif [ "${DSI_SKIP_BINDINGS:-0}" = 1 ]; then
  skip_stage bindings "disabled by DSI_SKIP_BINDINGS=1"
else
  record bindings-cli 1 # the CMake build gave no dsinfer-cli to compare against
fi


if [ "${DSI_SKIP_INTEROP:-0}" = 1 ]; then
  skip_stage interop "disabled by DSI_SKIP_INTEROP=1"
elif [ ! -x "$out/cmake/tests/dsi_logits" ]; then
  record interop 1; echo "[interop] the CMake build did not produce tests/dsi_logits"
else
  stage "llama.cpp interop (npm node-llama-cpp, CPU)"
  bash tests/interop/run.sh "$out/cmake" "$out/interop" 2>&1 | tee "$out/interop.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 77 ]; then skip_stage interop "$(grep -m1 '^SKIP' "$out/interop.log")"; else record interop "$rc"; fi
fi

t1=$(date +%s)
stage "summary ($((t1 - t0)) s)"
for f in "${stage_times[@]}"; do echo "TIME: $f"; done
for f in "${failures[@]}"; do echo "FAILED: $f"; done
for f in "${skips[@]}"; do echo "SKIPPED: $f"; done
why=""
for f in "${skips[@]}"; do why+="${why:+; }$f"; done
echo "$passed passed, $failed failed, $skipped skipped${why:+ [$why]}"
[ "$failed" -eq 0 ]
