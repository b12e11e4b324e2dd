#!/usr/bin/python3
"""Trains only the draft blocks of a trained model on the target's own greedy text
(docs/trained-models.md "Draft blocks on the target's greedy text"); the backbone is frozen,
so every backbone weight, and everything computed from them, stays as it was.

  train_drafts.py --arch v41 --work WORK --corpus WORK/greedy.npz [--minutes 40]

WORK holds merges.txt, ckpt.pt and log.csv (tools/train/ckpt_from_gguf.py makes them from a
committed GGUF); the corpus comes from tools/train/greedy_corpus.py (the library's greedy
continuations of training prompts). ckpt.pt is rewritten with the new draft weights; rows of
phase 4 are appended to log.csv.

1. Features: one no-grad forward of the frozen target over every corpus sequence (fake-quant
   rounding on, as in the library) gives the inputs the drafters read at every position —
   V4.1: the mean HC state entering each DSpark target layer (`mains`, §4.5), V4: the final
   HC state (§3.7). They do not depend on any trained weight, so they are computed once
   (cached in WORK/feats-<n>.npy) and training runs the draft blocks alone.
2. Anchors are positions of the greedy part: the known token t_a is the target's greedy
   pick, the labels t_{a+1..a+5} (V4: t_{a+2}) its greedy continuation — exactly what greedy
   verification compares the drafts with. The Markov inputs are teacher-forced (under greedy
   verification a slot only counts when every earlier draft equalled these tokens).
3. Loss per anchor (V4.1): mean cross-entropy of the valid slots, minus lambda × the
   expected accepted length under teacher forcing, sum_i prod_{j<=i} p_j(t_j) (the chance
   that the drafter's distribution proposes the first i+1 tokens in a row: its gradient
   weights slot j by the acceptance mass that depends on it, DeepSpec's point that a later
   slot only pays when the earlier ones are accepted), plus 0.1 × the binary cross-entropy of
   the confidence head against "slot i's top-1 is the target's token" (§4.5 confidence,
   DeepSpec's acceptance target, here with the greedy rule). V4 MTP: cross-entropy.
4. Validation: the last --val-frac of the sequences, drafting as the library does (slot i's
   Markov input = the drafter's own pick of slot i-1): mean accepted length of 5 and the
   per-position acceptance, printed and logged (held_draft_acc = acceptance per position).
"""
import argparse
import csv
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import train as TR  # noqa: E402


def load_corpus(path):
    z = np.load(path)
    toks, offs, gs = z["tokens"].astype(np.int64), z["offsets"], z["greedy_start"]
    return toks, offs, gs


@torch.no_grad()
def features(m, toks, offs, batch=8):
    """Per position of the corpus: V4.1 concat(mains) [n, 3D]; V4 final HC state [n, hc, D].
    Also the share of greedy-part labels that are the PyTorch model's argmax too."""
    cfg = m.cfg
    n = len(toks)
    if cfg.v41:
        out = np.zeros((n, len(cfg.targets) * cfg.dim), np.float32)
    else:
        out = np.zeros((n, cfg.hc, cfg.dim), np.float32)
    am = np.zeros(n, np.int64)
    S = len(offs) - 1
    order = np.argsort([offs[i + 1] - offs[i] for i in range(S)])
    t0 = time.time()
    for k in range(0, S, batch):
        ids = order[k:k + batch]
        L = max(offs[i + 1] - offs[i] for i in ids)
        x = torch.zeros(len(ids), L, dtype=torch.long)
        for j, i in enumerate(ids):
            x[j, :offs[i + 1] - offs[i]] = torch.from_numpy(toks[offs[i]:offs[i + 1]])
        r = m(x)                          # right padding is harmless: everything is causal
        f = torch.cat(r["mains"], -1) if cfg.v41 else r["X"]
        a = r["logits"].argmax(-1)
        for j, i in enumerate(ids):
            ln = offs[i + 1] - offs[i]
            out[offs[i]:offs[i + 1]] = f[j, :ln].numpy()
            am[offs[i]:offs[i + 1]] = a[j, :ln].numpy()
        if (k // batch) % 20 == 0:
            print("train_drafts: features %d/%d sequences, %.0f s" % (k + len(ids), S, time.time() - t0), flush=True)
    return out, am


def anchors_of(offs, gs, seqs, S):
    """(sequence, position) pairs: anchor a of the greedy part (t_a and every later token are
    the target's greedy picks) with at least one label; a from the first greedy token on, like
    the library's first draft after the prompt."""
    out = []
    for i in seqs:
        L = offs[i + 1] - offs[i]
        for a in range(max(gs[i], 1), L - 1):
            out.append((i, a))
    return np.asarray(out, np.int64).reshape(-1, 2)


class V41Batch:
    def __init__(self, m, toks, offs, feats):
        self.m, self.toks, self.offs, self.feats = m, toks, offs, torch.from_numpy(feats)
        self.S, self.W = m.cfg.dspark_block, m.cfg.window

    def make(self, anc):
        """anc [N,2] -> (mx rows [N,W,3D] raw, first [N], pos [N], tokens after [N,S], valid [N,S])."""
        S, W = self.S, self.W
        seq, a = anc[:, 0], anc[:, 1]
        base = self.offs[seq]
        L = self.offs[seq + 1] - base
        cpos = a[:, None] - W + np.arange(W)[None]
        rows = self.feats[torch.from_numpy(base[:, None] + np.maximum(cpos, 0))]
        rows[torch.from_numpy(cpos < 0)] = 0.0
        tp = a[:, None] + np.arange(S + 1)[None]                 # t_a .. t_{a+S}
        valid = tp < L[:, None]
        t = self.toks[base[:, None] + np.minimum(tp, L[:, None] - 1)]
        return (rows, torch.from_numpy(t[:, 0]), torch.from_numpy(a), torch.from_numpy(t),
                torch.from_numpy(valid[:, 1:]))


def v41_forward(m, rows, first, pos, prev):
    mx = m.main_norm(F.linear(rows, m.main_proj))
    return m.dspark_rows(mx, first, pos, prev)


def v41_loss(m, bt, anc, lam):
    rows, first, pos, t, valid = bt.make(anc)
    S = bt.S
    logits, conf = v41_forward(m, rows, first, pos, t[:, :S])
    y = t[:, 1:]
    vf = valid.float()
    lp = torch.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1) * vf
    ce = -lp.sum() / vf.sum()
    acc = (torch.exp(torch.cumsum(lp, -1)) * vf).sum(-1).mean()   # expected accepted length
    hit = (logits.argmax(-1) == y).float()
    closs = (F.binary_cross_entropy_with_logits(conf, hit, reduction="none") * vf).sum() / vf.sum()
    top1 = ((hit * vf).sum(0) / vf.sum(0).clamp_min(1)).tolist()
    return ce - lam * acc / S, ce, acc, closs, top1


@torch.no_grad()
def v41_validate(m, bt, anc, chunk=256):
    """Greedy drafting as the library does; anchors with all S labels present."""
    S = bt.S
    n_acc, per, tot = 0.0, torch.zeros(S), 0
    for k in range(0, len(anc), chunk):
        rows, first, pos, t, valid = bt.make(anc[k:k + chunk])
        keep = valid.all(-1)
        if not bool(keep.any()):
            continue
        rows, first, pos, t = rows[keep], first[keep], pos[keep], t[keep]
        prev = torch.zeros(len(first), S, dtype=torch.long)
        prev[:, 0] = first
        lg, _ = v41_forward(m, rows, first, pos, prev)
        base = lg - F.linear(m.markov_embed[prev], m.markov_head)
        drafts = torch.zeros_like(prev)
        for i in range(S):
            li = base[:, i] + F.linear(m.markov_embed[prev[:, i]], m.markov_head)
            drafts[:, i] = li.argmax(-1)
            if i + 1 < S:
                prev[:, i + 1] = drafts[:, i]
        run = (drafts == t[:, 1:]).long().cumprod(-1)
        n_acc += float(run.sum())
        per += run.float().sum(0)
        tot += len(first)
    return n_acc / max(tot, 1), (per / max(tot, 1)).tolist(), tot


def v4_seq_batch(m, toks, offs, gs, feats, seqs):
    """Padded sequences for the MTP: state q + token q+1 -> token q+2, labels in the greedy part."""
    L = max(offs[i + 1] - offs[i] for i in seqs)
    B = len(seqs)
    X = torch.zeros(B, L, m.cfg.hc, m.cfg.dim)
    x = torch.zeros(B, L, dtype=torch.long)
    lab_ok = torch.zeros(B, L - 2, dtype=torch.bool)
    for j, i in enumerate(seqs):
        ln = offs[i + 1] - offs[i]
        X[j, :ln] = torch.from_numpy(feats[offs[i]:offs[i + 1]])
        x[j, :ln] = torch.from_numpy(toks[offs[i]:offs[i + 1]])
        q = torch.arange(L - 2)
        lab_ok[j] = (q + 2 < ln) & (q + 1 >= max(gs[i], 1))     # t_{q+1} greedy -> the library's anchor
    lg = m.mtp(X[:, :-1], x[:, 1:])[:, :L - 2]
    return lg, x[:, 2:], lab_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["v41", "v4"], required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=0, help="stop after this many minutes of training")
    ap.add_argument("--batch", type=int, default=128, help="anchors per step (V4: sequences x 16)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--lam", type=float, default=1.0, help="weight of the expected accepted length")
    ap.add_argument("--val-frac", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = bpe.Tokenizer.load(os.path.join(a.work, "merges.txt"))
    m = TR.build(a.arch, tok, a.seed)
    ck = os.path.join(a.work, "ckpt.pt")
    st = torch.load(ck)
    m.load_state_dict(st["model"])
    cfg = m.cfg
    before = {n: p.detach().clone() for n, p in m.named_parameters() if not TR.is_draft_param(n)}
    toks, offs, gs = load_corpus(a.corpus)
    S_seq = len(offs) - 1
    fpath = os.path.join(a.work, "feats-%d.npy" % len(toks))
    m.train(False)
    t0 = time.time()
    if os.path.exists(fpath):
        feats = np.load(fpath)
        am = np.load(fpath.replace(".npy", "-argmax.npy"))
    else:
        feats, am = features(m, toks, offs)
        np.save(fpath, feats)
        np.save(fpath.replace(".npy", "-argmax.npy"), am)
    # the library's greedy tokens vs the PyTorch argmax (prefill) at the same positions
    agree, cnt = 0, 0
    for i in range(S_seq):
        o, L = offs[i], offs[i + 1] - offs[i]
        p = np.arange(max(gs[i], 1) - 1, L - 1)
        agree += int((am[o + p] == toks[o + p + 1]).sum())
        cnt += len(p)
    print("train_drafts: %d sequences, %d tokens; features %.0f s; PyTorch argmax = library greedy "
          "token at %d of %d greedy positions" % (S_seq, len(toks), time.time() - t0, agree, cnt), flush=True)
    n_val = max(1, int(S_seq * a.val_frac))
    tr_seqs, va_seqs = np.arange(S_seq - n_val), np.arange(S_seq - n_val, S_seq)
    for n, p in m.named_parameters():
        p.requires_grad_(TR.is_draft_param(n))
    opt = TR.make_opt([p for n, p in m.named_parameters() if TR.is_draft_param(n)], 0.0)
    logp = os.path.join(a.work, "log.csv")
    step0 = st["step"]
    extra = dict(st["extra"])
    rng = np.random.default_rng([a.seed, 44])
    if cfg.v41:
        bt = V41Batch(m, toks, offs, feats)
        tr_anc = anchors_of(offs, gs, tr_seqs, cfg.dspark_block)
        va_anc = anchors_of(offs, gs, va_seqs, cfg.dspark_block)
        print("train_drafts: %d training anchors, %d validation anchors" % (len(tr_anc), len(va_anc)), flush=True)

        def evaluate():
            m.train(False)
            r = v41_validate(m, bt, va_anc)
            return r[0], r[1], "mean accepted length %.3f of %d, per position %s (%d anchors)" % (
                r[0], cfg.dspark_block, " ".join("%.3f" % v for v in r[1]), r[2])
    else:
        def evaluate():
            m.train(False)
            hit, n = 0, 0
            with torch.no_grad():
                for k in range(0, len(va_seqs), 8):
                    lg, y, ok = v4_seq_batch(m, toks, offs, gs, feats, va_seqs[k:k + 8])
                    hit += int(((lg.argmax(-1) == y) & ok).sum())
                    n += int(ok.sum())
            return hit / max(n, 1), [hit / max(n, 1)], "MTP acceptance %.3f (%d positions)" % (hit / max(n, 1), n)
    acc0, per0, msg = evaluate()
    print("train_drafts: before: %s" % msg, flush=True)
    t_train = time.time()
    step = 0
    for step in range(1, a.steps + 1):
        lr = TR.lr_at(step - 1, a.steps, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        m.train(True)
        if cfg.v41:
            anc = tr_anc[rng.choice(len(tr_anc), a.batch, replace=False)]
            loss, ce, acc, closs, top1 = v41_loss(m, bt, anc, a.lam)
            total = loss + 0.1 * closs
        else:
            seqs = rng.choice(tr_seqs, max(1, a.batch // 16), replace=False)
            lg, y, ok = v4_seq_batch(m, toks, offs, gs, feats, seqs)
            ce = (F.cross_entropy(lg.flatten(0, 1), y.flatten(), reduction="none") * ok.flatten()).sum() / ok.sum()
            loss, acc, closs, top1 = ce, torch.zeros(()), torch.zeros(()), []
            total = ce
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        for mb in TR.moe_blocks(m, drafts=True):
            mb.update_bias(1e-3)
        el = time.time() - t_train
        row = {k: "" for k in TR.LOG_FIELDS}
        row.update(step=step0 + step, phase=4, tokens=extra["tokens"], lr="%.6f" % lr,
                   draft_loss="%.5f" % float(ce), conf_loss="%.5f" % float(closs),
                   elapsed_s="%.1f" % (extra["elapsed"] + el))
        last = step == a.steps or (a.minutes and el > a.minutes * 60)
        if step % a.eval_every == 0 or last:
            accv, per, msg = evaluate()
            row["held_draft_acc"] = " ".join("%.4f" % v for v in per)
            print("train_drafts: step %d: validation %s" % (step, msg), flush=True)
        with open(logp, "a", newline="") as f:
            csv.writer(f).writerow([row[k] for k in TR.LOG_FIELDS])
        if step % 10 == 0:
            print("step %d lr %.5f ce %.4f E[accepted] %.3f conf %.4f top1 %s %.0fs" % (
                step, lr, float(ce), float(acc), float(closs), " ".join("%.2f" % v for v in top1), el), flush=True)
        if last:
            break
    for n, p in m.named_parameters():
        if n in before and not torch.equal(before[n], p.detach()):
            raise SystemExit("train_drafts: backbone parameter %s changed" % n)
    extra["elapsed"] += time.time() - t_train
    extra["phase"] = 4
    TR.save_ckpt(ck, m, None, step0 + step, extra)
    print("train_drafts: done, %d steps in %.0f s (features %.0f s); before: %.3f %s; after: %s" % (
        step, time.time() - t_train, t_train - t0, acc0, " ".join("%.3f" % v for v in per0), msg), flush=True)


if __name__ == "__main__":
    main()
