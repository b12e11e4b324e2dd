#!/usr/bin/python3
"""libdsinfer's drafters against the NumPy reference's (docs/reference.md, docs/spec.md).

  test_reference_drafts.py DRAFT_DUMP      (the tools/spec/draft_dump program the build made)

For tiny-v4 and tiny-v41 (random weights, written by the build) and the trained kjv-v4 /
kjv-v41 (copied from models/), all from $DSI_MODELS_DIR: draft_dump writes the library's
drafts at N_POS positions of one text (the session holds tokens[0 .. P), drafts after
next = tokens[P]) on the exact path (DSI_CONTEXT_FLAG_EXACT_MATMUL) with the fake-quant
rounding off (DSI_SESSION_FLAG_NO_FAKE_QUANT, §10.4); dsref.py's mtp_draft (§3.7) / dspark_draft
(§4.5), on the same tokens with fake_quant=False, must give
  * the same draft ids — DSpark: the reference's own greedy picks, slot by slot, each feeding
    the next slot's Markov bias; a pick may differ only where the reference's top two logits
    lie within TOL_ABS (a near-tie, counted and reported; the reference then follows the
    library's pick so the later slots stay comparable);
  * draft logits within TOL_ABS, and the same number of drafts (DSpark: the block, MTP: 1).
Skips only through tests/common/skip.py (no NumPy: PYTHON; draft_dump or a model not built:
MODELS); anything else that goes wrong fails.
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from skip import absent  # noqa: E402

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # docs/reference.md "Limits"
try:
    import numpy as np
except ImportError:
    absent("PYTHON", "python3-numpy missing")
sys.path.insert(0, HERE)
import dsref  # noqa: E402

# §10.4: tight checks (rounding off) agree within 1e-4 on logits, like the forward tests
# (test_dsv41 TIGHT_TOL). Measured here 3.9e-6 .. 7.5e-6 (docs/spec.md).
TOL_ABS = 1e-4
N_POS = 104          # positions per model (the issue asks for >= 100)
FIRST = 8
MODELS = ["tiny-v4", "tiny-v41", "kjv-v4", "kjv-v41"]
# Genesis 1:1-8 (KJV): meaningful text for the trained models; any ids do for the random ones
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters. And God said, Let there be light: and there was "
        "light. And God saw the light, that it was good: and God divided the light from the "
        "darkness. And God called the light Day, and the darkness he called Night. And the "
        "evening and the morning were the first day. And God said, Let there be a firmament "
        "in the midst of the waters, and let it divide the waters from the waters. And God "
        "made the firmament, and divided the waters which were under the firmament from the "
        "waters which were above the firmament: and it was so. And God called the firmament "
        "Heaven. And the evening and the morning were the second day.")


def read_dump(path, V):
    raw = np.fromfile(path, dtype="<i4")
    n = int(raw[0])
    toks = [int(t) for t in raw[1:1 + n]]
    o, recs = 1 + n, []
    while o < len(raw):
        P, nd = int(raw[o]), int(raw[o + 1])
        o += 2
        ids = raw[o:o + nd].astype(np.int64)
        o += nd
        lg = raw[o:o + nd * V].view("<f4").reshape(nd, V).astype(np.float64)
        o += nd * V
        recs.append((P, ids, lg))
    if o != len(raw):
        raise SystemExit("FAIL: truncated draft dump %s" % path)
    return toks, recs


def check_model(dump, path, tmp):
    name = os.path.basename(path)[:-5]
    out = os.path.join(tmp, name + ".bin")
    t0 = time.time()
    r = subprocess.run([dump, "--exact", "--no-fake-quant", "--first", str(FIRST), "--count",
                        str(N_POS), path, TEXT, out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        return ["%s: draft_dump exited %d" % (name, r.returncode)]
    t_lib = time.time() - t0
    m = dsref.Model(path, fake_quant=False)
    toks, recs = read_dump(out, m.n_vocab)
    fails = []
    if len(recs) < N_POS:
        fails.append("%s: only %d positions drafted (%d tokens)" % (name, len(recs), len(toks)))
    want_nd = m.ds_block if m.arch == "deepseek41" else 1
    st = m.new_state()
    worst = worst_rel = 0.0
    rows = ties = id_bad = 0
    t0 = time.time()
    for P, ids, lg in recs:
        while st["pos"] < P:
            m.forward_token(st, toks[st["pos"]], want_logits=False)
        if len(ids) != want_nd:
            fails.append("%s P %d: %d drafts, expected %d" % (name, P, len(ids), want_nd))
            continue
        rid, rlg = m.draft(st, toks[P])
        if not np.array_equal(rid, ids):
            # slot by slot: the first differing pick must be a near-tie of the reference
            i = int(np.nonzero(rid != ids)[0][0])
            top2 = np.sort(rlg[i])[-2:]
            if top2[1] - top2[0] <= TOL_ABS and rlg[i][ids[i]] >= top2[1] - TOL_ABS:
                ties += 1
                if len(ids) > 1:   # DSpark: later slots' Markov bias follows the picks
                    rid, rlg = m.draft(st, toks[P], picks=ids)
            else:
                id_bad += 1
                fails.append("%s P %d slot %d: draft id %d, reference %d (gap %.3g)"
                             % (name, P, i, int(ids[i]), int(rid[i]), top2[1] - top2[0]))
        d = np.abs(rlg - lg).max(axis=1)
        rng = rlg.max(axis=1) - rlg.min(axis=1)
        worst = max(worst, float(d.max()))
        worst_rel = max(worst_rel, float((d / rng).max()))
        rows += len(ids)
        if d.max() > TOL_ABS:
            fails.append("%s P %d: max |dlogit| %.3g > %g (slot %d)"
                         % (name, P, d.max(), TOL_ABS, int(d.argmax())))
    print("%-9s %s: %d positions, %d draft rows: max |dlogit| %.2e (%.2e of the row's range), "
          "draft ids equal at %d/%d positions (near-ties %d), library %.1f s, reference %.1f s"
          % (name, "DSpark" if m.arch == "deepseek41" else "MTP", len(recs), rows, worst,
             worst_rel, len(recs) - id_bad, len(recs), ties, t_lib, time.time() - t0),
          flush=True)
    return fails


def main():
    if len(sys.argv) != 2:
        print("usage: test_reference_drafts.py DRAFT_DUMP", file=sys.stderr)
        return 2
    dump = sys.argv[1]
    if not os.access(dump, os.X_OK):
        absent("MODELS", "%s not built" % dump)
    mdir = os.environ.get("DSI_MODELS_DIR", "")
    paths = [os.path.join(mdir, n + ".gguf") for n in MODELS]
    for p in paths:
        if not os.path.isfile(p):
            absent("MODELS", "%s not found (DSI_MODELS_DIR; written by the build)" % p)
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            fails += check_model(dump, p, tmp)
    for f in fails[:40]:
        print("FAIL: " + f)
    if fails:
        print("%d failures" % len(fails))
        return 1
    print("drafts agree with the reference (tolerance %g)" % TOL_ABS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
