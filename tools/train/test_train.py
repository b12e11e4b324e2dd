#!/usr/bin/python3
"""CI checks of the training tools (docs/trained-models.md "Tests"):

  smoke     trains both architectures for a few steps on a few hundred tokens (the first
            1200 verses, a 512-token vocabulary, batches of 2 x 64), including the draft
            phase; exports through dsinfer-mkmodel --import ($DSI_MKMODEL); reads the GGUF
            back into PyTorch and checks that its held-out loss matches the checkpoint's
            (Q8_0 weights: within 2 %) and that the training loss stayed finite.
  agreement recomputes the committed PyTorch log-probs of models/*.gguf
            (tests/model/data/*.logprobs) and compares (expected_logprobs.py --check), so the
            data the C test compares the library against is reproducible.

Exit 77 (skip) when python3-torch or the bible-kjv package (smoke only) is absent.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


sys.path.insert(0, os.path.join(SRC, "tests", "common"))
from skip import absent  # noqa: E402


def skip(why):
    """python3-torch or bible-kjv absent (TRAIN): tests/common/skip.py."""
    absent("TRAIN", why)


def run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def smoke():
    if not shutil.which("bible"):
        skip("the bible-kjv package (bible) is not installed")
    mk = os.environ.get("DSI_MKMODEL")
    if not mk or not os.path.exists(mk):
        print("FAIL: DSI_MKMODEL (dsinfer-mkmodel) not found: %s" % mk)
        sys.exit(1)
    import torch  # noqa: F401
    sys.path.insert(0, HERE)
    import numpy as np
    import bpe
    import data as D
    import expected_logprobs as EL
    import torch as T
    import train as TR
    tmp = tempfile.mkdtemp(prefix="dsi-train-smoke-")
    try:
        for arch in ("v41", "v4"):
            w = os.path.join(tmp, arch)
            run([sys.executable, os.path.join(HERE, "train.py"), "--arch", arch, "--out", w,
                 "--steps", "3", "--draft-steps", "2", "--batch", "2", "--seq", "64", "--vocab", "512",
                 "--max-verses", "1200", "--eval-every", "3", "--held-chunks", "2", "--anchors", "8"])
            log = open(os.path.join(w, "log.csv")).read().splitlines()
            if len(log) != 1 + 5:
                raise SystemExit("FAIL: log.csv has %d rows" % (len(log) - 1))
            for row in log[1:]:
                for v in row.split(","):
                    if v in ("nan", "inf", "-inf"):
                        raise SystemExit("FAIL: non-finite value in %s" % row)
            gguf = os.path.join(w, "smoke.gguf")
            run([sys.executable, os.path.join(HERE, "export.py"), "--arch", arch, "--work", w,
                 "--mkmodel", mk, "-o", gguf])
            # the exported file read back into PyTorch vs the checkpoint itself
            tok = bpe.Tokenizer.load(os.path.join(w, "merges.txt"))
            ref = TR.build(arch, tok, 11)
            ref.load_state_dict(T.load(os.path.join(w, "ckpt.pt"))["model"])
            ref.train(False)
            back, _ = EL.model_from_gguf(gguf)
            corpus = D.load(w, 512, max_verses=1200, log=lambda *a: None)
            x = T.from_numpy(corpus.held_chunks(64, 2))
            with T.no_grad():
                la = T.nn.functional.cross_entropy(ref(x)["logits"][:, :-1].flatten(0, 1), x[:, 1:].flatten())
                lb = T.nn.functional.cross_entropy(back(x)["logits"][:, :-1].flatten(0, 1), x[:, 1:].flatten())
            print("%s: held-out loss checkpoint %.4f, exported GGUF %.4f" % (arch, float(la), float(lb)))
            if not np.isfinite(float(la)) or abs(float(la) - float(lb)) > 0.02 * float(la):
                raise SystemExit("FAIL: exported model differs from the checkpoint")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("smoke: ok")


def agreement():
    import torch  # noqa: F401
    for name in ("kjv-v41", "kjv-v4"):
        run([sys.executable, os.path.join(HERE, "expected_logprobs.py"),
             "--model", os.path.join(SRC, "models", name + ".gguf"),
             "--check", os.path.join(SRC, "tests", "model", "data", name + ".logprobs")])
    print("agreement: ok")


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        skip("python3-torch is not installed")
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "smoke":
        smoke()
    elif what == "agreement":
        agreement()
    else:
        print("usage: test_train.py smoke|agreement")
        sys.exit(2)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        print("FAIL: %s" % e)
        sys.exit(1)
