#!/usr/bin/env bash
# Runs one binding's test suite against a CMake build tree (docs/bindings.md).
# Usage: scripts/test-bindings.sh python|rust|go BUILD_DIR [INSTALL_PREFIX]
#   BUILD_DIR       the build tree: libdsinfer.so.0, bin/dsinfer-cli, models/
#   INSTALL_PREFIX  an install of that build (cmake --install): the Python package is
#                   pip-installed and finds it through pkg-config; the Go package builds
#                   against it through pkg-config. Without it, both use the build tree.
# Environment: DSI_CARGO_TARGET_DIR (default BUILD_DIR/cargo), DSI_GOCACHE (default
#   BUILD_DIR/go-cache).
# Last line: "RESULT: N passed, N failed, N skipped" (test counts of the suite).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:?python, rust or go}
build=$(cd "${2:?build dir}" && pwd)
prefix=${3:-}
[ -n "$prefix" ] && prefix=$(cd "$prefix" && pwd)
export DSI_CLI=$build/bin/dsinfer-cli
result() { echo "RESULT: $1 passed, $2 failed, $3 skipped"; [ "$2" -eq 0 ]; exit; }
num() { grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' | awk '{s += $1} END {print s + 0}'; }

case $what in
python)
  export DSINFER_LIBRARY=$build/libdsinfer.so.0
  [ -n "$prefix" ] && export DSI_PREFIX=$prefix
  log=$(mktemp)
  (cd "$root/bindings/python" && /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider tests) >"$log" 2>&1
  rc=$?
  cat "$log"
  last=$(tail -n1 "$log")
  p=$(printf '%s' "$last" | num passed); f=$(printf '%s' "$last" | num failed)
  e=$(printf '%s' "$last" | num error); s=$(printf '%s' "$last" | num skipped)
  rm -f "$log"
  f=$((f + e))
  [ $rc -ne 0 ] && [ $f -eq 0 ] && f=1
  result $p $f $s
  ;;
rust)
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is not installed (scripts/setup-deps.sh installs Debian's cargo)"
    result 0 0 1
  fi
  export DSINFER_LIB_DIR=$build
  export CARGO_TARGET_DIR=${DSI_CARGO_TARGET_DIR:-$build/cargo}
  log=$(mktemp)
  cargo --version
  cargo test --offline --manifest-path "$root/bindings/rust/Cargo.toml" >"$log" 2>&1
  rc=$?
  grep -vE '^\s+(Compiling|Running|Doc-tests)' "$log" | tail -60
  p=$(grep -E '^test result:' "$log" | num passed); f=$(grep -E '^test result:' "$log" | num failed)
  s=$(grep -E '^test result:' "$log" | num ignored)
  rm -f "$log"
  [ $rc -ne 0 ] && [ $f -eq 0 ] && f=1
  result $p $f $s
  ;;
go)
  if ! command -v go >/dev/null 2>&1; then
    echo "go is not installed (scripts/setup-deps.sh installs golang-go)"
    result 0 0 1
  fi
  export GOCACHE=${DSI_GOCACHE:-$build/go-cache} GOFLAGS=-count=1 GOPATH=${GOPATH:-$build/go-path}
  if [ -n "$prefix" ]; then
    pc=$(find "$prefix" -name dsinfer.pc -path '*pkgconfig*' | head -n1)
    export PKG_CONFIG_PATH=$(dirname "$pc")
    export LD_LIBRARY_PATH=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir dsinfer)
    tags=()
  else
    export CGO_CFLAGS="-I$root/include" CGO_LDFLAGS="-L$build -Wl,-rpath,$build"
    tags=(-tags dsinfer_env)
  fi
  log=$(mktemp)
  go version
  (cd "$root/bindings/go" && go vet "${tags[@]}" . && go test "${tags[@]}" -v .) >"$log" 2>&1
  rc=$?
  grep -vE '^=== (RUN|PAUSE|CONT)' "$log" | tail -60
  p=$(grep -cE '^\s*--- PASS' "$log"); f=$(grep -cE '^\s*--- FAIL' "$log"); s=$(grep -cE '^\s*--- SKIP' "$log")
  rm -f "$log"
  [ $rc -ne 0 ] && [ $f -eq 0 ] && f=1
  result $p $f $s
  ;;
*)
  echo "usage: $0 python|rust|go BUILD_DIR [INSTALL_PREFIX]"
  exit 2
  ;;
esac
