#!/bin/sh
# Bounded fuzzing runs of the GGUF reader (with dsinfer-convert's safetensors header parser)
# or of the snapshot loader.
#   tests/fuzz/run.sh [BUILD_DIR] [gguf|snapshot]   (default: $DSI_BUILD_DIR, else ./build; gguf)
# Needs a clang build configured with -DDSI_FUZZ=ON. Builds the seed corpora into a temporary
# directory, runs fuzz_<target> for ${DSI_FUZZ_SECONDS:-60} seconds and, for gguf,
# fuzz_safetensors for ${DSI_FUZZ_ST_SECONDS:-DSI_FUZZ_SECONDS/3} seconds (when built: it needs
# jansson), and exits nonzero on a crash, leak, timeout or oversized allocation. Crash inputs
# are kept in
# BUILD_DIR/tests/fuzz/artifacts/.
set -eu
build=${1:-${DSI_BUILD_DIR:-build}}
target=${2:-gguf}
bin="$build/tests/fuzz"
if [ ! -x "$bin/fuzz_$target" ] || [ ! -x "$bin/fuzz_${target}_seeds" ]; then
  echo "run.sh: $bin/fuzz_$target not found (configure with CC=clang -DDSI_FUZZ=ON and build)" >&2
  exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsi_fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
"$bin/fuzz_${target}_seeds" "$tmp/corpus"
mkdir -p "$bin/artifacts"
# -malloc_limit_mb: any single allocation above it is reported as a failure — the reader must
# never allocate far beyond the size of its input.
"$bin/fuzz_$target" -max_total_time="${DSI_FUZZ_SECONDS:-60}" -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=256 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$bin/artifacts/" "$tmp/corpus"
if [ "$target" = gguf ] && [ -x "$bin/fuzz_safetensors" ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  /usr/bin/python3 "$here/gen_st_seeds.py" "$tmp/st-corpus"
  st_seconds=${DSI_FUZZ_ST_SECONDS:-$(( ${DSI_FUZZ_SECONDS:-60} / 3 ))}
  "$bin/fuzz_safetensors" -max_total_time="$st_seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=256 -max_len=65536 -print_final_stats=1 -dict="$here/safetensors.dict" \
    -artifact_prefix="$bin/artifacts/st-" "$tmp/st-corpus"
fi
