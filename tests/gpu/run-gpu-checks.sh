#!/usr/bin/env bash
# The prepared device check of the CUDA backend (docs/cuda.md "The device check"), for a
# session lent a GPU machine: one run from a fresh checkout, within 8 minutes on one H200.
#   bash tests/gpu/run-gpu-checks.sh            (writes logs and summary.json under $OUT or ./gpu-out)
# It builds what it needs (CMake, Release, the CUDA module for the device's own architecture
# only, Vulkan off), then runs these parts, each under its own time limit; a failing or
# timed-out part does not stop the others, and the JSON summary is printed on every exit:
#   host      test_cuda_host, test_cuda_backend (module, transfers, streams, events, graphs)
#   ops       test_backend_ops cuda: every op vs the CPU backend (NMSE per op, index ops exact)
#   tiny      test_backend_model cuda: tiny-v4 / tiny-v41 vs CPU, rounding on and off,
#             chunked / whole / decode bit-identical, quantized types
#   trained   test_cuda_models: tiny and trained models (models/kjv-v41.gguf, kjv-v4.gguf),
#             320 tokens: argmax equal, max |dlogit| <= 5e-3, three schedules bit-identical
#   batch     test_batch (cuda nocapture / capture): multi-sequence and capture / replay invariance
#   place     test_place_vulkan cuda: hybrid steps (GPU expert cache bit-identical, CPU experts
#             within 2e-3, the split by expert id) and the device budget
#   peak      cuda_peak: copy bandwidth, bf16 and FP8 tensor throughput (cuBLAS / cuBLASLt)
#   bench     dsinfer-bench --backend cuda on bench-v41 and bench-v41-q8 (decode and prefill)
#   place-bench  dsinfer-bench --place --backend cuda on bench-v41-q8: hybrid placements
#   memcheck, racecheck   compute-sanitizer on a short tiny-model run
# Environment: DSI_GPU_BUDGET_S (default 470) bounds the whole run.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
b=${DSI_GPU_BUILD:-/tmp/dsi-gpu}
budget=${DSI_GPU_BUDGET_S:-470}
t_start=$(date +%s)
export DSI_REQUIRE_CUDA_TOOLKIT=1 DSI_REQUIRE_CUDA_DEVICE=1
export DSI_MODELS_DIR=$b/models DSI_BUILD_DIR=$b DSI_MKMODEL=$b/bin/dsinfer-mkmodel
export DSINFER_BACKEND_DIR=$b/lib/dsinfer
parts=()
jobs=$(nproc 2>/dev/null || echo 4)

left() { echo $((budget - ($(date +%s) - t_start))); }

# part NAME LIMIT_S CMD…: runs CMD under min(LIMIT, time left − 20 s), log in $out/NAME.log
part() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  l=$((l - 20))
  if [ "$l" -lt 10 ]; then
    echo "skipped: out of time" >"$out/$name.log"
    parts+=("$name skipped 0 0")
    return 0
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0 rc
  t0=$(date +%s)
  if [ "$(type -t "$1")" = function ]; then # a shell function: run it in a child bash
    timeout -k 5 "$limit" bash -c "$(declare -f "$1"); $*" >"$out/$name.log" 2>&1
  else
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  fi
  rc=$?
  local st=pass
  [ "$rc" -ne 0 ] && st=fail
  { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && st=timeout
  [ "$rc" -eq 77 ] && st=skipped
  parts+=("$name $st $rc $(($(date +%s) - t0))")
  echo "[$name] $st (rc $rc, $(($(date +%s) - t0)) s)"
}

summary() {
  local py=/usr/bin/python3
  command -v "$py" >/dev/null 2>&1 || py=python3
  printf '%s\n' "${parts[@]}" >"$out/parts.txt"
  if command -v "$py" >/dev/null 2>&1; then
    "$py" - "$out" <<'PY' | tee "$out/summary.json"
import json, os, re, sys
out = sys.argv[1]
def read(n):
    try:
        return open(os.path.join(out, n), errors="replace").read()
    except OSError:
        return ""
s = {"parts": {}}
for line in read("parts.txt").splitlines():
    f = line.split()
    if len(f) == 4:
        s["parts"][f[0]] = {"status": f[1], "rc": int(f[2]), "seconds": int(f[3])}
s["device"] = read("device.log").strip()
ops = {}
for m in re.finditer(r"^\s+(.+?)\s+nmse ([0-9.eE+-]+|nan|inf) \(tol ([0-9.eE+-]+)\)(.*)$", read("ops.log"), re.M):
    ops[m.group(1).strip()] = {"nmse": float(m.group(2)), "tol": float(m.group(3)), "ok": "MISMATCH" not in m.group(4) and float(m.group(2)) <= float(m.group(3))}
s["ops_nmse"] = ops
s["ops_failed_tests"] = re.findall(r"^\[  FAILED  \] (\S+)", read("ops.log"), re.M)
s["models"] = [l for l in read("trained.log").splitlines() if l.startswith("MODEL ")]
s["tiny_invariance"] = [l.strip() for l in read("tiny.log").splitlines() if "n_batch" in l]
s["place"] = [l.strip() for l in read("place.log").splitlines() if l.startswith("# ") or "FAILED" in l]
s["place_bench"] = [l.strip() for l in read("place-bench.log").splitlines() if l.startswith("|") or l.startswith("overlap") or l.startswith("routed")]
for k in ("batch", "capture", "memcheck", "racecheck"):
    t = read(k + ".log")
    m = re.search(r"ERROR SUMMARY: (\d+) error", t)
    s[k] = {"errors": int(m.group(1))} if m else {"tail": t.strip().splitlines()[-3:] if t.strip() else []}
try:
    peak = json.loads(read("peak.log").strip().splitlines()[-1])
except Exception:
    peak = None
s["peak"] = peak
bench = {}
for name in ("bench-v41", "bench-v41-q8"):
    try:
        j = json.loads([l for l in read(name + ".log").splitlines() if l.startswith("{")][-1])
    except Exception:
        bench[name] = None
        continue
    d, p = j.get("decode") or {}, j.get("prefill") or {}
    e = {"tests": [{k: t.get(k) for k in ("test", "n_prompt", "n_gen", "avg_ts")} for t in j.get("tests", [])],
         "decode_effective_gbs": d.get("effective_gbs"), "decode_bytes_per_token": d.get("bytes_per_token"),
         "prefill_gflops": p.get("gflops")}
    if peak and peak.get("copy_gbs") and e["decode_effective_gbs"]:
        e["decode_frac_copy_bw"] = round(e["decode_effective_gbs"] / peak["copy_gbs"], 4)
        e["decode_frac_read_bw"] = round(e["decode_effective_gbs"] / peak["read_gbs"], 4)
    if peak and peak.get("bf16_tflops") and e["prefill_gflops"]:
        e["prefill_frac_bf16_peak"] = round(e["prefill_gflops"] / (peak["bf16_tflops"] * 1000), 4)
    bench[name] = e
s["bench"] = bench
s["ok"] = all(v["status"] in ("pass",) for v in s["parts"].values()) and bool(s["parts"])
print(json.dumps(s, indent=1))
PY
  else
    printf '{"parts": ['
    local sep=""
    for p in "${parts[@]}"; do
      set -- $p
      printf '%s{"name": "%s", "status": "%s", "rc": %s, "seconds": %s}' "$sep" "$1" "$2" "$3" "$4"
      sep=", "
    done
    printf ']}\n'
  fi
}
trap summary EXIT

# ---- device and build ---------------------------------------------------------------------
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
  >"$out/device.log" 2>&1 || echo "nvidia-smi failed" >"$out/device.log"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[ -n "$cc" ] || cc=90
export root b cc jobs
build() {
  cmake -S "$root" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSI_CUDA=on -DDSI_VULKAN=off \
        -DDSI_CUDA_ARCHITECTURES="$cc" -DDSI_BUILD_EXAMPLES=ON &&
  cmake --build "$b" -j"$jobs" --target dsinfer-mkmodel &&
  cmake --build "$b" -j"$jobs" --target dsinfer-cuda dsinfer-models test_cuda_models dsinfer-bench
}
# the cmocka programs separately: a machine without cmocka still runs the other parts
build_tests() {
  cmake --build "$b" -j"$jobs" --target test_cuda_host test_cuda_backend test_backend_ops \
        test_backend_model test_batch_vulkan test_place_vulkan
}
peak_build() {
  /usr/local/cuda/bin/nvcc -O2 -arch=native "$root/tests/gpu/cuda_peak.cu" -o "$b/cuda_peak" \
    -lcublasLt -lcublas
}
mkdir -p "$b"
peak_build >"$out/peak-build.log" 2>&1 &
peak_pid=$!
part build 200 build
part build-tests 120 build_tests
wait "$peak_pid" 2>/dev/null
# the bench models (3 + 1.7 GiB) are written in the background while the tests run
bench_models() {
  "$DSI_MKMODEL" --config bench-v41 -o "$b/bench-v41.gguf" &&
  "$DSI_MKMODEL" --config bench-v41-q8 -o "$b/bench-v41-q8.gguf"
}
bench_models >"$out/bench-models.log" 2>&1 &
bm_pid=$!

# ---- correctness -----------------------------------------------------------------------------
T=$b/tests
part host 30 bash -c "'$T/test_cuda_host' && '$T/test_cuda_backend'"
part ops 60 "$T/test_backend_ops" cuda
models=("$b/models/tiny-v4.gguf" "$b/models/tiny-v41.gguf" "$root/models/kjv-v41.gguf" "$root/models/kjv-v4.gguf")
part trained 60 "$T/test_cuda_models" --tokens 320 --tol 5e-3 "${models[@]}"
part tiny 90 "$T/test_backend_model" cuda
part batch 45 "$T/test_batch_vulkan" cuda nocapture
part capture 45 "$T/test_batch_vulkan" cuda capture
# hybrid steps: experts in host RAM / on disk, cached on the GPU or computed by the CPU
part place 60 "$T/test_place_vulkan" cuda

# ---- speed: limits and the bench, same run ----------------------------------------------------
part peak 30 "$b/cuda_peak"
while kill -0 "$bm_pid" 2>/dev/null && [ "$(left)" -gt 150 ]; do sleep 2; done
kill "$bm_pid" 2>/dev/null # out of time: the bench parts then report the missing model
for m in bench-v41 bench-v41-q8; do
  part "$m" 50 "$b/bin/dsinfer-bench" -m "$b/$m.gguf" --backend cuda -p 512 -n 64 -r 2 \
       --no-limits --json
done
# hybrid placements on the GPU (tokens/s against the resident fraction, the split's overlap)
part place-bench 60 "$b/bin/dsinfer-bench" -m "$b/bench-v41-q8.gguf" --place --backend cuda -p 32 -n 16

# ---- compute-sanitizer on a short tiny-model run ----------------------------------------------
cs=/usr/local/cuda/bin/compute-sanitizer
command -v compute-sanitizer >/dev/null 2>&1 && cs=compute-sanitizer
part memcheck 50 "$cs" --tool memcheck --error-exitcode 3 "$T/test_cuda_models" --tokens 66 \
     "$b/models/tiny-v4.gguf"
part racecheck 50 "$cs" --tool racecheck --error-exitcode 3 "$T/test_cuda_models" --tokens 66 \
     "$b/models/tiny-v41.gguf"
echo "run-gpu-checks: $(( $(date +%s) - t_start )) s"
