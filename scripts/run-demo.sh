#!/usr/bin/env bash
# The main job: set up, build (CMake), and generate text with dsinfer-cli on the built-in
# default model (the trained kjv-v41 model, models/kjv-v41.gguf). Extra arguments go to the CLI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup-deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)"
cli="$root/build/bin/dsinfer-cli"
"$cli" --version
"$cli" --list-devices
if [ $# -eq 0 ]; then
  # sampled (seeded, so reproducible): greedy decoding of a model this small loops
  # ("and the LORD, and the LORD, ..."), see docs/trained-models.md
  set -- -p "In the beginning" -n 64 --temp 0.7 --seed 1
fi
exec "$cli" "$@"
