#!/usr/bin/env bash
# The main job: set up, build (CMake), and generate text with dsinfer-cli on the built-in
# default model (the build's tiny-v41 synthetic model). Extra arguments go to the CLI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup-deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)"
cli="$root/build/bin/dsinfer-cli"
"$cli" --version
"$cli" --list-devices
if [ $# -eq 0 ]; then
  set -- -p "Hello" -n 32 --temp 0 --seed 1
fi
exec "$cli" "$@"
