#!/usr/bin/python3
"""Makes a training folder (merges.txt, ckpt.pt, log.csv) from an exported GGUF, so that
train.py continues a model whose checkpoint is gone (docs/trained-models.md "Training"):

  ckpt_from_gguf.py --arch v41 --model models/kjv-v41.gguf --log docs/trained/kjv-v41-loss.csv \
                    --step 320 --out WORK

The weights are the GGUF's, dequantised by ggufmap.py (Q8_0, F16 and FP8 dequantise to values
that the export quantises back to the same bytes, so a continued run that trains only the draft
blocks exports the backbone unchanged). The checkpoint is written at --step with no optimizer
state; log.csv is the given loss curve, cut after --step, and elapsed time / token counts
continue from its last row. The tokenizer comes from the GGUF's merges.
"""
import argparse
import csv
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expected_logprobs as EL  # noqa: E402
import train as TR  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["v41", "v4"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--log", required=True, help="the model's loss curve (CSV of train.py)")
    ap.add_argument("--step", type=int, required=True, help="steps the model was trained for")
    ap.add_argument("--phase", type=int, required=True, help="phase of the next step (train.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    g_model, g = EL.model_from_gguf(a.model)
    tok = EL.tokenizer_from_gguf(g)
    tok.save(os.path.join(a.out, "merges.txt"))
    m = TR.build(a.arch, tok, a.seed)
    m.load_state_dict(g_model.state_dict(), strict=True)
    m.train(False)
    # the rebuilt model (hashing constants from the tokenizer, like training) computes what the
    # file's model computes
    x = torch.randint(0, tok.n_vocab - 8, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        d = float((m(x)["logits"] - g_model(x)["logits"]).abs().max())
    if d != 0.0:
        raise SystemExit("ckpt_from_gguf: rebuilt model differs from the GGUF's (max |d logit| %g)" % d)
    rows = list(csv.DictReader(open(a.log)))
    rows = [r for r in rows if int(r["step"]) <= a.step]
    if not rows or int(rows[-1]["step"]) != a.step:
        raise SystemExit("ckpt_from_gguf: %s has no row for step %d" % (a.log, a.step))
    with open(os.path.join(a.out, "log.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TR.LOG_FIELDS)
        for r in rows:
            w.writerow([r[k] for k in TR.LOG_FIELDS])
    extra = {"elapsed": float(rows[-1]["elapsed_s"]), "tokens": int(rows[-1]["tokens"]), "phase": a.phase}
    torch.save({"model": m.state_dict(), "opt": None, "step": a.step, "extra": extra},
               os.path.join(a.out, "ckpt.pt"))
    print("ckpt_from_gguf: %s -> %s at step %d (phase %d next)" % (a.model, a.out, a.step, a.phase))


if __name__ == "__main__":
    main()
