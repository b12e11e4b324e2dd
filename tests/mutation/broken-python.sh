#!/bin/sh
# A Python that passes the tests' probe for NumPy ("-c 'import numpy'") and fails every real
# run: the "reference cannot run" injected failure of tests/mutation/mutants/11-*.
case "$1" in -c) exec /usr/bin/python3 "$@" ;; esac
echo "broken-python.sh: injected failure" >&2
exit 3
