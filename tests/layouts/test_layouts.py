#!/usr/bin/python3
"""The three file layouts (docs/model-files.md §7) carry the same model.

For tiny-v4 and tiny-v41 (dsinfer-mkmodel --layout native as the reference):
  * dsinfer-mkmodel --layout llama.cpp and --layout ds4 (libdsinfer's writer, V4 MTP in a
    second file) and make_ds4_gguf.py (an independent writer of ds4's published layout) give
    files whose every bound tensor equals the native file's, bit for bit (dsi_layout_cmp);
  * libdsinfer's logits (fake-quant on: the model as specified) on the ds4 fixtures equal those
    on the native file exactly, for deepseek4 (a ds4 file without rope.scaling.type: loaded as
    YaRN, the documented default) and deepseek41 (Engram tables as ds4's I8 row264 extent at
    the end of a 16 KiB-aligned file), mmap and pread (the extent read row by row);
  * the same for ds4 fixtures whose matrices (experts included) are IQ2_XXS, the type of ds4's
    low-bit files.
Exit 77 when the helpers or numpy are missing.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from skip import absent  # noqa: E402
try:
    import numpy as np
except ImportError:
    absent("PYTHON", "python3-numpy missing")

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("DSI_BUILD_DIR", "")
MK = os.environ.get("DSI_MKMODEL", "")
CMP = os.environ.get("DSI_LAYOUT_CMP") or os.path.join(BUILD, "tests", "dsi_layout_cmp")
LOGITS = os.environ.get("DSI_LOGITS") or os.path.join(BUILD, "tests", "dsi_logits")
for p in (MK, CMP, LOGITS):
    if not p or not os.access(p, os.X_OK):
        absent("MODELS", "helper %r not built (DSI_MKMODEL / DSI_BUILD_DIR)" % p)

failed = 0


def run(*cmd):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit("FAIL: %s exited %d" % (" ".join(os.path.basename(c) for c in cmd[:2]), r.returncode))
    return r.stdout.strip()


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failed += 0 if ok else 1


def logits(model, toks, out, *extra):
    run(LOGITS, model, toks, out, "--fake-quant", "--threads", "2", *extra)
    return np.fromfile(out, dtype="<f4")


with tempfile.TemporaryDirectory(prefix="dsi_layouts_") as d:
    P = lambda n: os.path.join(d, n)  # noqa: E731
    toks = P("tokens.bin")
    np.array((np.arange(96) * 37 + 5) % 1000, dtype="<i4").tofile(toks)
    # f32 in every layout; IQ2_XXS matrices (experts included, as ds4's low-bit files) as an
    # independent ds4 fixture
    for cfg, ty in (("tiny-v4", "f32"), ("tiny-v41", "f32"), ("tiny-v4", "iq2_xxs"), ("tiny-v41", "iq2_xxs")):
        v41 = cfg == "tiny-v41"
        cfg_ = cfg if ty == "f32" else "%s %s" % (cfg, ty)
        nat = P("%s-%s-native.gguf" % (cfg, ty))
        run(MK, "--config", cfg, "--type", ty, "--layout", "native", "-o", nat)
        ref = logits(nat, toks, P(cfg + "-native.f32"))
        files = []
        for lay in ("llama.cpp", "ds4") if ty == "f32" else ():
            f, m = P("%s-%s.gguf" % (cfg, lay)), P("%s-%s-mtp.gguf" % (cfg, lay))
            run(MK, "--config", cfg, "--type", ty, "--layout", lay, "-o", f, "--mtp-out", m)
            files.append(("libdsinfer's %s writer" % lay, f, m if os.path.exists(m) else None,
                          v41 and lay == "ds4"))
        fx, fm = P("%s-%s-ds4fixture.gguf" % (cfg, ty)), P("%s-%s-ds4fixture-mtp.gguf" % (cfg, ty))
        run("/usr/bin/python3", os.path.join(HERE, "make_ds4_gguf.py"), nat, fx, "--mtp-out", fm)
        files.append(("independent ds4 fixture", fx, None if v41 else fm, v41))
        for what, f, m, no_draft in files:
            args = [CMP, nat, f] + (["--draft", m] if m else []) + (["--no-draft"] if no_draft else [])
            out = run(*args)
            check(out.startswith("identical"), "%s, %s: %s" % (cfg_, what, out.split(" between")[0]))
            modes = [[]] + ([["--pread"]] if v41 else [])
            for mode in modes:
                x = logits(f, toks, P("x.f32"), *(mode + (["--draft", m] if m else [])))
                check(x.shape == ref.shape and np.array_equal(x, ref),
                      "%s, %s%s: logits of %d positions equal the native file's (max |d| %.3g)"
                      % (cfg_, what, " (pread)" if mode else "", 96,
                         float(np.abs(x - ref).max()) if x.shape == ref.shape else float("inf")))

print("%d failed" % failed if failed else "all layout checks passed")
sys.exit(1 if failed else 0)
