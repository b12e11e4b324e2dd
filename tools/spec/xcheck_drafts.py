#!/usr/bin/python3
"""Cross-checks the library's drafters against the PyTorch implementation of the draft blocks
in tools/train/model.py (train11; an independent implementation written from model-spec
§3.7 / §4.5 for training): usage  xcheck_drafts.py MODEL.gguf OUT.bin  where OUT.bin comes
from tools/spec/draft_dump (a test helper of both build systems: $BUILD/tests/draft_dump with
CMake, $BUILD/tests/reference/draft_dump with Meson). The CI check of the drafters is
tests/reference/test_reference_drafts.py (the NumPy reference). V4.1: DSpark logits of every
drafted slot (Markov bias with the library's own greedy picks as the previous ids); V4: the
MTP logits (DeepSeek-V3 pairing). Prints the largest |Δlogit|, relative to the row's range,
and argmax mismatches. DSI_TRAIN_TOOLS overrides the directory of tools/train."""
import os, sys, numpy as np, torch
sys.path.insert(0, os.environ.get("DSI_TRAIN_TOOLS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train")))
import expected_logprobs as EL
torch.set_num_threads(2)
model_path, out_path = sys.argv[1], sys.argv[2]
m, _ = EL.model_from_gguf(model_path)
m.eval()
cfg = m.cfg
V = cfg.vocab
raw = np.fromfile(out_path, dtype=np.int32)
n = int(raw[0]); toks = raw[1:1 + n].astype(np.int64); o = 1 + n
recs = []
while o < len(raw):
    P, nd = int(raw[o]), int(raw[o + 1]); o += 2
    ids = raw[o:o + nd].copy(); o += nd
    lg = raw[o:o + nd * V].view(np.float32).reshape(nd, V).copy(); o += nd * V
    recs.append((P, nd, ids, lg))
x = torch.tensor(toks)[None, :]
with torch.no_grad():
    out = m(x)
    worst, worst_rel, idmis, npos = 0.0, 0.0, 0, 0
    for P, nd, ids, lg in recs:
        if cfg.v41:
            main_x = m.dspark_ctx(out["mains"])
            S = cfg.dspark_block
            prev = torch.zeros(1, S, dtype=torch.long)
            prev[0, 0] = int(toks[P])
            for i in range(1, S):
                prev[0, i] = int(ids[i - 1]) if i - 1 < nd else 0
            tl, conf = m.dspark(main_x, torch.tensor([int(toks[P])]), torch.tensor([P]), prev, torch.tensor([0]))
            tl = tl[0, :nd].numpy()
        else:
            Xm = out["X"][:, :P]
            nt = x[:, 1:P + 1]
            tl = m.mtp(Xm, nt)[0, P - 1:P].numpy()
        d = np.abs(tl - lg).max(axis=1)
        rng = tl.max(axis=1) - tl.min(axis=1)
        worst = max(worst, float(d.max())); worst_rel = max(worst_rel, float((d / rng).max()))
        idmis += int((tl.argmax(axis=1) != ids).sum())
        npos += nd
print("%s: %d draft rows at %d positions: max |dlogit| %.3g, max rel (to the row's range) %.3g, argmax mismatches %d" % (model_path.split('/')[-1], npos, len(recs), worst, worst_rel, idmis))
