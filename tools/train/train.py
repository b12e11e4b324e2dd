#!/usr/bin/python3
"""Trains a tiny DeepSeek V4.1 (`--arch v41`) or V4 (`--arch v4`) model on the King James
Bible (docs/trained-models.md). Resumable: rerun the same command and it continues from the
last checkpoint in --out, with the same batches an uninterrupted run would have seen.

  phase 1 (steps 0 .. --steps-1): the backbone (next-token loss + the indexers' KL loss);
  phase 2 (--draft-steps more): the backbone frozen, the draft blocks (V4.1: 3 DSpark
           blocks; V4: the MTP block) trained on its hidden states and distributions;
  phase 3 (--greedy-steps more, optional): the draft blocks trained further on text the
           frozen backbone wrote itself (greedy continuations of training prompts, cached in
           --out/greedy.npy), as DeepSpec trains drafters on target-generated responses: under
           greedy verification the drafts must match the target's own greedy choices.

Outputs in --out: merges.txt (tokenizer), ckpt.pt (latest checkpoint), log.csv (loss curve).
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
import data as D  # noqa: E402
import model as M  # noqa: E402

LOG_FIELDS = ["step", "phase", "tokens", "lr", "loss", "aux", "draft_loss", "conf_loss",
              "elapsed_s", "held_loss", "held_draft_acc"]


def make_config(arch, tok, smoke=False):
    pad = tok.sid(bpe.PAD)
    if arch == "v41":
        cfg = M.Config(vocab=tok.n_vocab, pad_id=pad, noise_id=pad)
    else:
        cfg = M.v4_config(vocab=tok.n_vocab, pad_id=pad, noise_id=pad)
    return cfg


def build(arch, tok, seed):
    torch.manual_seed(seed)
    cfg = make_config(arch, tok)
    tmap = None
    if cfg.v41 and cfg.engram_layers:
        tmap, _ = bpe.engram_token_map(tok)
    return M.Model(cfg, tmap=tmap)


def lr_at(step, total, peak, warm):
    if step < warm:
        return peak * (step + 1) / warm
    f = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * f)))


def main_params(model):
    return [p for n, p in model.named_parameters() if not is_draft_param(n)]


def is_draft_param(n):
    return (n.startswith("drafts.") or n.split(".")[0] in (
        "main_proj", "main_norm", "draft_norm", "markov_embed", "markov_head", "conf_proj",
        "e_proj", "h_proj", "enorm", "hnorm", "mtp_norm", "mtp_hc_fn", "mtp_hc_base", "mtp_hc_scale"))


def make_opt(params, wd):
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": nodecay, "weight_decay": 0.0}], betas=(0.9, 0.95), eps=1e-8)


def moe_blocks(model, drafts):
    out = []
    for n, mod in model.named_modules():
        if isinstance(mod, M.MoE) and (n.startswith("drafts.") == drafts):
            out.append(mod)
    return out


def soft_ce(logits, target_logits):
    return -(torch.softmax(target_logits, -1) * torch.log_softmax(logits, -1)).sum(-1)


def draft_step(model, toks, T, rng, anchors_per_seq, train=True):
    """Runs the backbone without gradients and the draft blocks on toks [B, T+2].
    Returns (loss, conf_loss, per-position (correct vs data, count))."""
    cfg = model.cfg
    B = toks.shape[0]
    inp = toks[:, :T]
    model.train(False)
    with torch.no_grad():
        out = model(inp)
    model.train(train)
    tl = out["logits"]                                          # target logits [B,T,V]
    if cfg.v41:
        S = cfg.dspark_block
        main_x = model.dspark_ctx([h.detach() for h in out["mains"]])
        A = min(anchors_per_seq, T - 2)
        an = np.stack([np.sort(rng.choice(np.arange(1, T - 1), A, replace=False)) for _ in range(B)])
        an = torch.from_numpy(an).reshape(-1)
        bi = torch.arange(B).repeat_interleave(A)
        slot = torch.arange(S).view(1, S)
        tpos = an.view(-1, 1) + slot + 1                          # data target position
        valid = tpos < T
        tposc = tpos.clamp_max(T - 1)
        prev = toks[bi.view(-1, 1), (an.view(-1, 1) + slot).clamp_max(T - 1)]
        logits, conf = model.dspark(main_x, toks[bi, an], an, prev, bi)
        tgt = toks[bi.view(-1, 1), tposc]
        tlog = tl[bi.view(-1, 1), tposc - 1]                       # target's prediction of tpos
        w = torch.exp(-slot.float() / 5.0).expand_as(valid) * valid
        ce = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view_as(w)
        sce = soft_ce(logits, tlog)
        loss = ((0.5 * ce + 0.5 * sce) * w).sum() / w.sum()
        with torch.no_grad():
            pd, pt = torch.softmax(logits, -1), torch.softmax(tlog, -1)
            acc_rate = (1.0 - 0.5 * (pd - pt).abs().sum(-1)).clamp(0, 1)
        closs = (F.binary_cross_entropy_with_logits(conf, acc_rate, reduction="none") * valid).sum() / valid.sum()
        correct = ((logits.argmax(-1) == tgt) & valid).sum(0).float()
        count = valid.sum(0).float()
        return loss, closs, correct, count
    # V4 MTP: main state of p + token p+1 -> token p+2
    lg = model.mtp(out["X"].detach(), toks[:, 1:T + 1])
    lg = lg[:, :T - 1]
    tgt = toks[:, 2:T + 1]
    tlog = tl[:, 1:T]
    ce = F.cross_entropy(lg.flatten(0, 1), tgt.flatten())
    loss = 0.5 * ce + 0.5 * soft_ce(lg, tlog).mean()
    correct = (lg.argmax(-1) == tgt).sum().float().view(1)
    count = torch.tensor([float(tgt.numel())])
    return loss, loss.new_zeros(()), correct, count


@torch.no_grad()
def held_eval(model, chunks, T, draft=False, seed=0):
    model.train(False)
    tot, n = 0.0, 0
    cor, cnt = None, None
    for i in range(0, len(chunks), 4):
        x = torch.from_numpy(chunks[i:i + 4])
        out = model(x[:, :T])
        l = F.cross_entropy(out["logits"][:, :T - 1].flatten(0, 1), x[:, 1:T].flatten(), reduction="sum")
        tot += float(l)
        n += x.shape[0] * (T - 1)
        if draft:
            rng = np.random.default_rng([seed, 99, i])
            _, _, c, k = draft_step(model, x, T - 2, rng, 32, train=False)
            cor = c if cor is None else cor + c
            cnt = k if cnt is None else cnt + k
    acc = (cor / cnt).tolist() if draft else None
    return tot / n, acc


@torch.no_grad()
def greedy_corpus(model, corpus, args, path):
    """Greedy continuations (--greedy-new tokens) of --greedy-prompts training prompts of
    --greedy-prompt-len tokens (BOS + text from a verse start), fake-quant rounding on."""
    if os.path.exists(path):
        return np.load(path)
    rng = np.random.default_rng([args.seed, 31337])
    prompts = np.stack([corpus.plain(rng, args.greedy_prompt_len) for _ in range(args.greedy_prompts)])
    model.train(False)
    out = []
    for i in range(0, len(prompts), 16):
        x = torch.from_numpy(prompts[i:i + 16])
        for _ in range(args.greedy_new):
            nxt = model(x)["logits"][:, -1].argmax(-1, keepdim=True)
            x = torch.cat([x, nxt], 1)
        out.append(x.numpy())
        print("train: greedy corpus %d/%d" % (i + len(x), len(prompts)), flush=True)
    g = np.concatenate(out)
    np.save(path + ".tmp.npy", g)
    os.replace(path + ".tmp.npy", path)
    return g


def save_ckpt(path, model, opt, step, extra):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict() if opt else None,
                "step": step, "extra": extra}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["v41", "v4"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--draft-steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--bible", default=None, help="saved `bible -f Gen1:1-Rev22:21` output (default: run bible)")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--held-chunks", type=int, default=32)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (checkpointed) after this many minutes")
    ap.add_argument("--max-verses", type=int, default=0, help="use only the first N verses (smoke runs)")
    ap.add_argument("--greedy-steps", type=int, default=0)
    ap.add_argument("--greedy-prompts", type=int, default=64)
    ap.add_argument("--greedy-prompt-len", type=int, default=32)
    ap.add_argument("--greedy-new", type=int, default=64)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    corpus = D.load(args.out, args.vocab, args.bible, max_verses=args.max_verses)
    tok = corpus.tok
    model = build(args.arch, tok, args.seed)
    cfg = model.cfg
    T = args.seq
    ck = os.path.join(args.out, "ckpt.pt")
    logp = os.path.join(args.out, "log.csv")
    step = 0
    extra = {"elapsed": 0.0, "tokens": 0}
    total = args.steps + args.draft_steps + args.greedy_steps

    def phase_of(s):
        return 1 if s < args.steps else 2 if s < args.steps + args.draft_steps else 3
    opt = None
    if os.path.exists(ck):
        st = torch.load(ck)
        model.load_state_dict(st["model"])
        step = st["step"]
        extra = st["extra"]
        print("train: resumed at step %d" % step, flush=True)
    else:
        with open(logp, "w", newline="") as f:
            csv.writer(f).writerow(LOG_FIELDS)
    phase = phase_of(step)
    if phase == 1:
        opt = make_opt(main_params(model), 0.1)
    else:
        for n, p in model.named_parameters():
            p.requires_grad_(is_draft_param(n))
        opt = make_opt([p for n, p in model.named_parameters() if is_draft_param(n)], 0.0)
    if os.path.exists(ck) and st.get("opt") and st["extra"].get("phase", 1) == phase:
        opt.load_state_dict(st["opt"])
    nparam = sum(p.numel() for p in model.parameters())
    ndraft = sum(p.numel() for n, p in model.named_parameters() if is_draft_param(n))
    print("train: %s, %d params (%d in draft blocks), %d steps + %d draft steps + %d greedy draft "
          "steps, batch %dx%d" % (cfg.name, nparam, ndraft, args.steps, args.draft_steps,
                                  args.greedy_steps, args.batch, T), flush=True)
    held = corpus.held_chunks(T, args.held_chunks)
    t_start = time.time() - extra["elapsed"]
    t_run = time.time()
    greedy = None
    while step < total:
        if phase_of(step) != phase:
            phase = phase_of(step)
            save_ckpt(ck, model, None, step, dict(extra, phase=phase))
            for n, p in model.named_parameters():
                p.requires_grad_(is_draft_param(n))
            opt = make_opt([p for n, p in model.named_parameters() if is_draft_param(n)], 0.0)
        Ts = T
        if phase == 3:
            if greedy is None:
                greedy = greedy_corpus(model, corpus, args, os.path.join(args.out, "greedy.npy"))
            grng = np.random.default_rng([args.seed, step, 3])
            toks = torch.from_numpy(greedy[grng.choice(len(greedy), args.batch, replace=False)])
            Ts = toks.shape[1] - 2
        else:
            toks = torch.from_numpy(corpus.batch(args.seed, step, args.batch, T + 2))
        row = {k: "" for k in LOG_FIELDS}
        if phase == 1:
            lr = lr_at(step, args.steps, args.lr, args.warmup)
            model.train(True)
            out = model(toks[:, :T])
            loss = F.cross_entropy(out["logits"].flatten(0, 1), toks[:, 1:T + 1].flatten())
            total_loss = loss + 0.5 * out["aux"]
            row.update(loss="%.5f" % float(loss), aux="%.5f" % float(out["aux"]))
        else:
            if phase == 2:
                lr = lr_at(step - args.steps, args.draft_steps, args.draft_lr, 10)
            else:
                lr = lr_at(step - args.steps - args.draft_steps, args.greedy_steps, args.draft_lr, 10)
            rng = np.random.default_rng([args.seed, step, 7])
            dl, cl, _, _ = draft_step(model, toks, Ts, rng, args.anchors)
            total_loss = dl + 0.1 * cl
            row.update(draft_loss="%.5f" % float(dl), conf_loss="%.5f" % float(cl))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        for mb in moe_blocks(model, drafts=(phase >= 2)):
            mb.update_bias(1e-3)
        step += 1
        extra["tokens"] += args.batch * Ts
        extra["elapsed"] = time.time() - t_start
        row.update(step=step, phase=phase, tokens=extra["tokens"], lr="%.6f" % lr,
                   elapsed_s="%.1f" % extra["elapsed"])
        if step % args.eval_every == 0 or step == args.steps or step == total:
            hl, acc = held_eval(model, held, T, draft=(phase >= 2), seed=args.seed)
            row["held_loss"] = "%.5f" % hl
            if acc:
                row["held_draft_acc"] = " ".join("%.4f" % a for a in acc)
        with open(logp, "a", newline="") as f:
            csv.writer(f).writerow([row[k] for k in LOG_FIELDS])
        print("step %d/%d phase %d %s %.0fs" % (step, total, phase,
              " ".join("%s=%s" % (k, row[k]) for k in ("loss", "aux", "draft_loss", "conf_loss",
                                                       "held_loss", "held_draft_acc") if row[k]),
              extra["elapsed"]), flush=True)
        if step % args.ckpt_every == 0 or step == total:
            save_ckpt(ck, model, opt, step, dict(extra, phase=phase))
        if args.max_minutes and time.time() - t_run > args.max_minutes * 60:
            save_ckpt(ck, model, opt, step, dict(extra, phase=phase))
            print("train: time limit, checkpointed at step %d" % step, flush=True)
            return
    print("train: done, %d steps, %.0f s" % (step, extra["elapsed"]), flush=True)


if __name__ == "__main__":
    main()
