"""Skips of the Python test programs: the twin of tests/common/skip.h (docs/CONTRIBUTING.md
"Skips and requirements").

A skip means only: hardware or software this test needs is absent here. absent() (the whole
program) and status() (also one check inside a program that goes on) are the one way for a
Python test to skip:
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


def status(what, reason, check=None):
    """Reports that `what` is absent — of the whole program, or of one check inside a program
    that goes on (`check` names it) — and returns the exit status that means it: 77 (skip,
    logged) or 1 where DSI_REQUIRE_<what>=1."""
    # the program's name without ".py": test-all.sh matches it against the test's name
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "?"
    prog = prog[:-3] if prog.endswith(".py") else prog
    prog = os.environ.get("DSI_TEST_NAME") or prog  # one program under several test names
    if required(what):
        print("FAIL: %s — but DSI_REQUIRE_%s=1 says it is present here" % (reason, what),
              flush=True)
        return 1
    print("SKIP: " + reason, flush=True)
    log = os.environ.get("DSI_SKIP_LOG")
    if log:
        try:
            with open(log, "a") as f:
                f.write("%s\t%s%s\t%s\n" % ("test" if check else "program", prog,
                                            "/" + check if check else "", reason))
        except OSError:
            pass
    return 77


def absent(what, reason):
    """The whole program: never returns; exits 77 (skip), or 1 where DSI_REQUIRE_<what>=1."""
    sys.exit(status(what, reason))
