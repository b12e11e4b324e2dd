"""Skips of the Python test programs: the twin of tests/common/skip.h (docs/CONTRIBUTING.md
"Skips and requirements").

A skip means only: hardware or software this test needs is absent here. absent() is the one way
for a Python test to skip:
  - it prints "SKIP: <reason>" and appends "program<TAB><name><TAB><reason>" to $DSI_SKIP_LOG
    (if set), so scripts/test-all.sh counts and lists the skip;
  - where the environment says the thing is present (DSI_REQUIRE_<WHAT>=1, set by CI after
    scripts/setup-deps.sh installed it), the absence is a failure instead (exit 1).
WHAT is one of skip.h's names (PYTHON: /usr/bin/python3 with NumPy; MODELS: the built tools,
example programs and tiny models) or TRAIN (python3-torch and bible-kjv, tools/train).
"""
import os
import sys


def required(what):
    return os.environ.get("DSI_REQUIRE_" + what) == "1"


def absent(what, reason):
    """Never returns: exits 77 (skip), or 1 where DSI_REQUIRE_<what>=1."""
    # the program's name without ".py": test-all.sh matches it against the test's name
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "?"
    prog = prog[:-3] if prog.endswith(".py") else prog
    if required(what):
        print("FAIL: %s — but DSI_REQUIRE_%s=1 says it is present here" % (reason, what),
              flush=True)
        sys.exit(1)
    print("SKIP: " + reason, flush=True)
    log = os.environ.get("DSI_SKIP_LOG")
    if log:
        try:
            with open(log, "a") as f:
                f.write("program\t%s\t%s\n" % (prog, reason))
        except OSError:
            pass
    sys.exit(77)
