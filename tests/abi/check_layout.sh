#!/usr/bin/env bash
# Compares the public struct layout printed by the layout program with the committed one.
# Usage: check_layout.sh LAYOUT_PROGRAM SOURCE_DIR
set -u
out=$("$1") || { echo "FAIL: layout program failed"; exit 1; }
if ! diff -u "$2/tests/abi/struct-layout.txt" <(printf '%s\n' "$out"); then
  echo "FAIL: public struct layout changed (existing lines must never change; append fields"
  echo "      at the end and update tests/abi/struct-layout.txt deliberately)"
  exit 1
fi
echo "ok: $(printf '%s\n' "$out" | wc -l) layout lines unchanged"
