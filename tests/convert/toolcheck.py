"""Shared helpers of the tool tests (test_convert.py, test_quantize.py): one line per check,
a failure count, running a tool, dequantizing a GGUF tensor with the NumPy reader."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from skip import absent  # noqa: E402

try:
    import numpy as np
except ImportError:
    absent("PYTHON", "python3-numpy missing")

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import gguf_reader as gr  # noqa: E402,F401

BUILD = os.environ.get("DSI_BUILD_DIR", "")
failed = 0


def tool(*parts, env=None):
    """Path of a built tool: $env (Meson sets it) or BUILD/parts... (CMake's layout); a skip
    (tests/common/skip.py, MODELS) when it is not there."""
    p = os.environ.get(env) if env and os.environ.get(env) else os.path.join(BUILD, *parts)
    if not os.access(p, os.X_OK):
        absent("MODELS", "%s not built (DSI_BUILD_DIR)" % p)
    return p


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failed += 0 if ok else 1


def run(*cmd, ok=True):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if ok and r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit("FAIL: %s exited %d" % (os.path.basename(cmd[0]), r.returncode))
    return r


def deq(g, name):
    t = g.tensors[name]
    raw = g.buf[g.data_offset + t.offset: g.data_offset + t.offset + t.nbytes]
    return np.asarray(gr.dequantize(t.type, raw, t.n, t.ne)).reshape(t.shape)


def finish(what):
    print("%d failed" % failed if failed else "all %s checks passed" % what)
    sys.exit(1 if failed else 0)
