#!/usr/bin/python3
"""Draft-block figures of an exported model, computed in PyTorch on the GGUF weights
(docs/trained-models.md "Draft blocks"):

  * teacher-forced top-1 accuracy per position on held-out text: V4 MTP = the token after
    next; V4.1 DSpark slot i (i = 0..4) = token a+i+1 given the known token a and the true
    tokens before each slot (Markov head inputs);
  * greedy verification: at anchors of the held-out chunks the target decodes greedily; the
    drafter proposes from the target's own next token (V4.1: 5 DSpark drafts chained through
    the Markov head with its own greedy picks; V4: 1 MTP draft); accepted length = the number
    of leading drafts equal to the target's greedy tokens. Reports the mean accepted length
    and the per-position acceptance rate.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expected_logprobs as EL  # noqa: E402


@torch.no_grad()
def greedy_continue(m, seqs, steps):
    """seqs: list of 1-D int64 arrays (any lengths); returns [len(seqs), steps] greedy tokens."""
    out = [list(s) for s in seqs]
    n0 = [len(s) for s in seqs]
    for _ in range(steps):
        L = max(len(s) for s in out)
        x = torch.zeros(len(out), L, dtype=torch.long)
        for i, s in enumerate(out):
            x[i, :len(s)] = torch.tensor(s)      # right padding is harmless (causal)
        lg = m(x)["logits"]
        for i, s in enumerate(out):
            s.append(int(lg[i, len(s) - 1].argmax()))
    return np.array([s[n:] for s, n in zip(out, n0)])


@torch.no_grad()
def dspark_draft(m, main_x_row, anchor, first_tok, batch_idx):
    """Greedy DSpark proposal: slot i's Markov input is the previous draft (slot 0: first_tok)."""
    cfg = m.cfg
    S = cfg.dspark_block
    N = anchor.shape[0]
    prev = torch.zeros(N, S, dtype=torch.long)
    prev[:, 0] = first_tok
    drafts = torch.zeros(N, S, dtype=torch.long)
    # the Markov term of slot i depends on the draft of slot i-1: run the blocks once, then
    # add the Markov bias slot by slot (the blocks do not see the drafts: slots 1.. are noise)
    logits0, _ = m.dspark(main_x_row, first_tok, anchor, prev, batch_idx)
    base = logits0 - torch.nn.functional.linear(m.markov_embed[prev], m.markov_head)
    for i in range(S):
        li = base[:, i] + torch.nn.functional.linear(m.markov_embed[prev[:, i]], m.markov_head)
        drafts[:, i] = li.argmax(-1)
        if i + 1 < S:
            prev[:, i + 1] = drafts[:, i]
    return drafts


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expected", required=True, help="tests/model/data/<model>.logprobs (held-out chunks)")
    ap.add_argument("--stride", type=int, default=16, help="anchor spacing in each chunk")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m, _ = EL.model_from_gguf(a.model)
    cfg = m.cfg
    chunks, _, _ = EL.read(a.expected)
    T = len(chunks[0])
    x = torch.tensor(chunks, dtype=torch.long)
    out = m(x)
    tgt_logits = out["logits"]
    anchors = list(range(a.stride, T - 8, a.stride))
    B = x.shape[0]
    if cfg.v41:
        S = cfg.dspark_block
        main_x = m.dspark_ctx(out["mains"])
        # teacher forced: anchor a (known token x[a]), slot i predicts x[a+i+1]
        an = torch.arange(1, T - S - 1)
        bi = torch.arange(B).repeat_interleave(len(an))
        ana = an.repeat(B)
        prev = x[bi.view(-1, 1), ana.view(-1, 1) + torch.arange(S).view(1, S)]
        lg, conf = m.dspark(main_x, x[bi, ana], ana, prev, bi)
        tgt = x[bi.view(-1, 1), ana.view(-1, 1) + torch.arange(S).view(1, S) + 1]
        acc = (lg.argmax(-1) == tgt).float().mean(0)
        print("%s DSpark teacher-forced top-1 per slot (%d anchors): %s" % (
            cfg.name, len(ana), " ".join("%.3f" % v for v in acc)))
        # greedy verification
        seqs, meta = [], []
        for b in range(B):
            for p in anchors:
                g0 = int(tgt_logits[b, p - 1].argmax())      # target's greedy token at p
                seqs.append(list(chunks[b][:p]) + [g0])
                meta.append((b, p, g0))
        cont = greedy_continue(m, seqs, S)                   # target greedy tokens p+1 .. p+S
        bi = torch.tensor([t[0] for t in meta])
        ap_ = torch.tensor([t[1] for t in meta])
        g0 = torch.tensor([t[2] for t in meta])
        # the drafter's context: main hiddens of positions < p (true text), anchor p = g0
        drafts = dspark_draft(m, main_x, ap_, g0, bi)
        match = torch.from_numpy(cont) == drafts
        accepted = match.long().cumprod(-1).sum(-1).float()
        per_pos = match.long().cumprod(-1).float().mean(0)
        print("%s DSpark greedy verification (%d anchors): mean accepted length %.3f of %d; "
              "P(position i accepted) %s" % (cfg.name, len(meta), float(accepted.mean()), S,
                                              " ".join("%.3f" % v for v in per_pos)))
        cond = [float(match[:, i][match[:, :i].all(-1)].float().mean()) if i else float(match[:, 0].float().mean())
                for i in range(S)]
        print("%s DSpark conditional acceptance per position: %s" % (cfg.name, " ".join("%.3f" % v for v in cond)))
    else:
        lg = m.mtp(out["X"][:, :-1], x[:, 1:])               # position p: state p + token p+1
        tf = (lg[:, :-1].argmax(-1) == x[:, 2:]).float().mean()
        print("%s MTP teacher-forced top-1 (token after next, %d positions): %.3f" % (
            cfg.name, lg[:, :-1].numel() // lg.shape[-1], float(tf)))
        # greedy verification: draft from (state p, target's greedy token p+1)
        g1 = tgt_logits.argmax(-1)                            # greedy token for p+1 given x[..p]
        seqs = []
        for b in range(B):
            for p in anchors:
                seqs.append(list(chunks[b][:p + 1]) + [int(g1[b, p])])
        cont = greedy_continue(m, seqs, 1)[:, 0]              # target greedy token p+2
        # the MTP's window holds the accepted history: positions q < p paired with the true
        # token q+1; position p with the target's greedy token
        d = []
        for b in range(B):
            for p in anchors:
                nt = torch.cat([x[b, 1:p + 1], g1[b, p:p + 1]]).view(1, -1)
                dl = m.mtp(out["X"][b:b + 1, :p + 1], nt)
                d.append(int(dl[0, p].argmax()))
        d = torch.tensor(d)
        accr = float((d == torch.from_numpy(cont)).float().mean())
        print("%s MTP greedy verification (%d anchors): acceptance %.3f (mean accepted length %.3f of 1)"
              % (cfg.name, len(seqs), accr, accr))


if __name__ == "__main__":
    main()
