#!/usr/bin/env bash
# Installs that work wherever they land (issue 20). Given a CMake and a Meson build
# configured with default install settings, this script
#   1. installs the CMake build with `cmake --install --prefix <tmp>` and stages both builds
#      with DESTDIR (`DESTDIR=… cmake --install`, `meson install --destdir …`);
#   2. checks that the two staged trees hold the same files, with identical dsinfer.pc and
#      dsinfer.h;
#   3. in each of the --prefix tree and the Meson staged tree, with nothing else set (a clean
#      environment: no LD_LIBRARY_PATH, CPATH, …; PKG_CONFIG_PATH = that tree's pkgconfig/
#      only): compiles a C and a C++ consumer with `pkg-config --cflags --libs dsinfer`
#      (plus the usual -Wl,-rpath to pkg-config's libdir), runs both on the installed default
#      model, links the C one statically through Libs.private, and runs the installed
#      dsinfer-cli on its default model (found the way the CLI finds it: no -m);
#   4. runs every installed executable (--help) in the clean environment, checks that the
#      statically linked dsinfer-bench finds the tree's backend modules, that each
#      one linking libdsinfer.so has the run path $ORIGIN/../lib, and that the library's
#      SONAME is libdsinfer.so.0 with no run path of its own.
# Usage: check-install.sh CMAKE_BUILD_DIR MESON_BUILD_DIR|- SCRATCH_DIR
# Exit status 0 = everything held; failures are printed as "FAIL: …".
set -u
cmake_build=$(cd "$1" && pwd)
meson_build=$2
scratch=$3
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
fail=0
bad() { echo "FAIL: $*"; fail=1; }
rm -rf "$scratch"
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd)
# A clean environment for everything a user would do after installing.
clean_env=(env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$scratch" TMPDIR=/tmp)

# ---- 1. installs -----------------------------------------------------------------------
prefix=$scratch/cmake-prefix
cmake --install "$cmake_build" --prefix "$prefix" >"$scratch/cmake-install.log" 2>&1 ||
  { bad "cmake --install --prefix failed"; tail -20 "$scratch/cmake-install.log"; }
DESTDIR=$scratch/cmake-stage cmake --install "$cmake_build" >"$scratch/cmake-stage.log" 2>&1 ||
  { bad "DESTDIR=… cmake --install failed"; tail -20 "$scratch/cmake-stage.log"; }
trees=("$prefix")
if [ "$meson_build" != - ]; then
  meson install -C "$meson_build" --destdir "$scratch/meson-stage" >"$scratch/meson-stage.log" 2>&1 ||
    { bad "meson install --destdir failed"; tail -20 "$scratch/meson-stage.log"; }
fi

# The prefix both builds were configured with (default /usr/local) inside the staged trees.
staged_prefix() { # stage dir -> the directory holding include/dsinfer.h
  local h
  h=$(find "$1" -path '*/include/dsinfer.h' 2>/dev/null | head -n1)
  [ -n "$h" ] && dirname "$(dirname "$h")"
}

# ---- 2. the same tree from both builds --------------------------------------------------
if [ "$meson_build" != - ]; then
  cs=$(staged_prefix "$scratch/cmake-stage") ms=$(staged_prefix "$scratch/meson-stage")
  if [ -z "$cs" ] || [ -z "$ms" ]; then
    bad "a staged tree has no include/dsinfer.h"
  else
    [ "${cs#"$scratch/cmake-stage"}" = "${ms#"$scratch/meson-stage"}" ] ||
      bad "staged prefixes differ: ${cs#"$scratch/cmake-stage"} vs ${ms#"$scratch/meson-stage"}"
    (cd "$scratch/cmake-stage" && find . \( -type f -o -type l \) | sort) >"$scratch/cmake-files"
    (cd "$scratch/meson-stage" && find . \( -type f -o -type l \) | sort) >"$scratch/meson-files"
    diff -u "$scratch/cmake-files" "$scratch/meson-files" >"$scratch/files.diff" ||
      { bad "CMake and Meson install different files:"; cat "$scratch/files.diff"; }
    for f in lib/pkgconfig/dsinfer.pc include/dsinfer.h; do
      cmp -s "$cs/$f" "$ms/$f" || { bad "$f differs between the CMake and Meson installs"; diff "$cs/$f" "$ms/$f"; }
    done
    # symlinks point the same way (libdsinfer.so -> .so.0 -> .so.0.x.y)
    for l in $(cd "$cs" && find . -type l); do
      [ "$(readlink "$cs/$l")" = "$(readlink "$ms/$l" 2>/dev/null)" ] || bad "link $l differs"
    done
    trees+=("$ms")
  fi
fi

# ---- 3. consumers and the CLI in each tree ----------------------------------------------
for tree in "${trees[@]}"; do
  echo "--- $tree"
  pcdir=$(dirname "$(find "$tree" -name dsinfer.pc -path '*pkgconfig*' | head -n1)")
  [ -f "$pcdir/dsinfer.pc" ] || { bad "no dsinfer.pc under $tree"; continue; }
  pc=("${clean_env[@]}" PKG_CONFIG_PATH="$pcdir" pkg-config)
  libdir=$("${pc[@]}" --variable=libdir dsinfer)
  incdir=$("${pc[@]}" --variable=includedir dsinfer)
  # the .pc points into this very tree, wherever it was installed
  [ "$(realpath -m "$libdir")" = "$(realpath "$tree/lib")" ] || bad "libdir=$libdir is not $tree/lib"
  [ "$(realpath -m "$incdir")" = "$(realpath "$tree/include")" ] || bad "includedir=$incdir is not $tree/include"
  [ "$(realpath -m "$("${pc[@]}" --variable=backenddir dsinfer)")" = "$(realpath "$tree/lib")/dsinfer" ] ||
    bad "backenddir is not $tree/lib/dsinfer"
  model=$(find "$tree/share/dsinfer/models" -name '*.gguf' 2>/dev/null | sort | head -n1)
  [ -n "$model" ] || bad "no model installed under $tree/share/dsinfer/models"
  out=$scratch/bin-$(echo "$tree" | md5sum | cut -c1-8)
  mkdir -p "$out"
  cflags=$("${pc[@]}" --cflags dsinfer) libs=$("${pc[@]}" --libs dsinfer)
  rpath="-Wl,-rpath,$libdir"
  # shellcheck disable=SC2086
  if "${clean_env[@]}" cc -std=c99 -Wall -Wextra -Werror -pedantic "$src/tests/abi/consumer.c" \
       -o "$out/consumer" $cflags $libs "$rpath" 2>"$out/cc.log"; then
    "${clean_env[@]}" "$out/consumer" "$model" >"$out/consumer.log" 2>&1 ||
      { bad "C consumer failed in $tree"; cat "$out/consumer.log"; }
    bound=$("${clean_env[@]}" ldd "$out/consumer" | sed -n 's/.*libdsinfer.so.0 => \([^ ]*\) .*/\1/p')
    [ -n "$bound" ] && [ "$(realpath "$bound")" = "$(realpath "$tree/lib/libdsinfer.so.0")" ] ||
      bad "C consumer bound '$bound', not $tree/lib/libdsinfer.so.0"
  else
    bad "C consumer does not build against $tree with pkg-config"; cat "$out/cc.log"
  fi
  # shellcheck disable=SC2086
  if "${clean_env[@]}" c++ -std=c++17 -Wall -Wextra -Werror -pedantic "$here/consumer.cpp" \
       -o "$out/consumer-cpp" $cflags $libs "$rpath" 2>"$out/cxx.log"; then
    "${clean_env[@]}" "$out/consumer-cpp" "$model" >"$out/consumer-cpp.log" 2>&1 ||
      { bad "C++ consumer failed in $tree"; cat "$out/consumer-cpp.log"; }
  else
    bad "C++ consumer does not build against $tree with pkg-config"; cat "$out/cxx.log"
  fi
  # static, through Libs.private
  # shellcheck disable=SC2086
  if "${clean_env[@]}" cc -std=c99 "$src/tests/abi/consumer.c" -o "$out/consumer-static" $cflags \
       "$libdir/libdsinfer.a" $("${pc[@]}" --libs-only-l --static dsinfer | sed 's/-ldsinfer//') 2>"$out/static.log"; then
    "${clean_env[@]}" "$out/consumer-static" "$model" >"$out/consumer-static.log" 2>&1 ||
      { bad "static consumer failed in $tree"; cat "$out/consumer-static.log"; }
  else
    bad "static consumer does not link against $tree"; cat "$out/static.log"
  fi
  # the installed CLI on its default model
  cli=$tree/bin/dsinfer-cli
  if [ -x "$cli" ]; then
    (cd "$scratch" && "${clean_env[@]}" "$cli" -p "Hello" -n 4 --temp 0 >"$out/cli.out" 2>"$out/cli.err") ||
      { bad "installed dsinfer-cli failed in $tree"; cat "$out/cli.err"; }
    used=$(sed -n 's/.*using the built-in default model \(.*\)$/\1/p' "$out/cli.err")
    case "$(realpath -m "$used")" in
      "$(realpath "$tree")"/*) ;;
      *) bad "installed dsinfer-cli used the default model '$used', not the one in $tree" ;;
    esac
    readelf -d "$cli" | grep -E 'R(UN)?PATH' | grep -q '\$ORIGIN/' ||
      bad "dsinfer-cli has no \$ORIGIN-relative run path"
  else
    bad "no dsinfer-cli in $tree/bin"
  fi
  # every installed executable starts in the clean environment (no LD_LIBRARY_PATH), and
  # each one that links libdsinfer.so carries an $ORIGIN-relative run path to it
  n_exe=0
  for exe in "$tree"/bin/*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    n_exe=$((n_exe + 1))
    if ! (cd "$scratch" && "${clean_env[@]}" "$exe" --help >"$out/help.out" 2>&1); then
      bad "installed $(basename "$exe") --help failed in $tree:"; tail -3 "$out/help.out"
    fi
    if readelf -d "$exe" | grep -q 'NEEDED.*\[libdsinfer\.so'; then
      readelf -d "$exe" | grep -E 'R(UN)?PATH' | grep -q '\[\$ORIGIN/\.\./lib\]' ||
        bad "$(basename "$exe") links libdsinfer.so without the run path \$ORIGIN/../lib"
    fi
  done
  [ "$n_exe" -ge 3 ] || bad "only $n_exe executables installed in $tree/bin (cli, bench, mkmodel expected)"
  # dsinfer-bench links the static library: it finds the tree's backend modules relative to
  # its own location ($prefix/bin/../lib/dsinfer), started through PATH like a user would.
  # A stand-in file (not a module) is put where the tree's module goes, for a backend whose
  # real module is in none of the places searched first (the build trees, the configured
  # install directory); the load must then fail on exactly that file.
  fake_b=
  for b in cuda vulkan; do
    [ -e "$cmake_build/lib/dsinfer/libdsinfer-$b.so" ] && continue
    [ "$meson_build" != - ] && [ -e "$meson_build/backends/$b/libdsinfer-$b.so" ] && continue
    [ -e "$tree/lib/dsinfer/libdsinfer-$b.so" ] && continue
    [ -e "/usr/local/lib/dsinfer/libdsinfer-$b.so" ] && continue
    fake_b=$b
    break
  done
  if [ -n "$fake_b" ] && [ -x "$tree/bin/dsinfer-bench" ] && [ -n "$model" ]; then
    mkdir -p "$tree/lib/dsinfer"
    fake=$tree/lib/dsinfer/libdsinfer-$fake_b.so
    echo "not a module" >"$fake"
    (cd "$scratch" && env -i PATH="$tree/bin:/usr/bin:/bin" HOME="$scratch" dsinfer-bench -m "$model" \
       --backend "$fake_b" -p 1 -n 1 -r 1 --no-limits >"$out/bench-module.out" 2>&1)
    grep -qF "$(realpath "$tree/bin")/../lib/dsinfer/libdsinfer-$fake_b.so cannot be loaded" "$out/bench-module.out" ||
      { bad "installed dsinfer-bench did not look for its backend modules in $tree/lib/dsinfer:"; tail -3 "$out/bench-module.out"; }
    rm -f "$fake"
  else
    echo "note: every backend module is built; the static tools' module lookup in $tree is not checked"
  fi
  lib=$tree/lib/libdsinfer.so.0
  readelf -d "$lib" | grep -q 'SONAME.*\[libdsinfer.so.0\]' || bad "SONAME of $lib is not libdsinfer.so.0"
  ! readelf -d "$lib" | grep -qE 'R(UN)?PATH' || bad "$lib carries a run path"
done

if [ "$fail" -eq 0 ]; then
  echo "ok: installs relocate (cmake --install --prefix, DESTDIR, meson --destdir) and work with pkg-config only"
fi
exit "$fail"
