#!/usr/bin/python3
"""Held-out per-token log-probabilities of an exported model, computed by the PyTorch
implementation (model.py) on the weights read back from the GGUF (dequantised here, by our
own reader) — the expected values of tests/model/test_trained_models.c.

  expected_logprobs.py --model models/kjv-v41.gguf -o tests/model/data/kjv-v41.logprobs
  expected_logprobs.py --model models/kjv-v41.gguf --check tests/model/data/kjv-v41.logprobs

The held-out text is part of the file (hex), so neither the test nor --check needs the Bible.
File format (text): "# ..." comments; "model NAME"; "chunks N"; then per chunk:
"text HEX" (UTF-8 bytes of the chunk after BOS), "tokens t0 t1 ..." (BOS first),
"lp_round v1 ..." and "lp_noround v1 ..." (log p of tokens[i+1] given tokens[0..i], i =
0 .. n-2; fake-quant rounding on / off).
"""
import argparse
import os
import sys


def _pin_openblas_kernels():
    """The same BLAS kernels on every x86 machine with AVX2 and FMA. OpenBLAS picks its
    kernels by CPU model and falls back to its generic SSE3 ones ("Prescott") on CPUs it does
    not know (Debian's 0.3.21 on Intel Emerald Rapids, family 6 model 207); their different
    summation order flips one near-tie of kjv-v4 with rounding off (held-out chunk 0,
    position 95: |d logp| 2.7e-3 against the committed values, then ~1e-5 for the positions
    after it), while the Haswell, Zen, SkylakeX and SapphireRapids kernels all reproduce the
    committed values within 4.3e-6. Must run before numpy or torch loads OpenBLAS; an
    OPENBLAS_CORETYPE already set wins."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return
    if "avx2" in flags and "fma" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


_pin_openblas_kernels()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import ggufmap  # noqa: E402
import model as M  # noqa: E402

N_CHUNKS = 8
CHUNK = 256


def model_from_gguf(path):
    """Builds the PyTorch model described by an exported GGUF and loads its weights."""
    g = ggufmap.GGUF(path)
    kv = g.kv
    A = kv["general.architecture"]
    v41 = A == "deepseek41"

    def k(s):
        return kv["%s.%s" % (A, s)]
    L = k("block_count")
    c = dict(name=kv["general.name"], v41=v41, vocab=k("vocab_size"), dim=k("embedding_length"),
             n_layers=L, n_heads=k("attention.head_count"), head_dim=k("attention.key_length"),
             rope_dim=k("rope.dimension_count"), q_lora=k("attention.q_lora_rank"),
             o_groups=k("attention.output_group_count"), o_lora=k("attention.output_lora_rank"),
             window=k("attention.sliding_window"), ctx=k("context_length"),
             ratios=list(k("attention.compress_ratios")[:L]), idx_heads=k("attention.indexer.head_count"),
             idx_dim=k("attention.indexer.key_length"), idx_topk=k("attention.indexer.top_k"),
             n_experts=k("expert_count"), n_used=k("expert_used_count"),
             n_shared=k("expert_shared_count"), ff=k("expert_feed_forward_length"),
             n_hash=k("hash_layer_count"), hc=k("hyper_connection.count"),
             sinkhorn=k("hyper_connection.sinkhorn_iterations"), hc_eps=k("hyper_connection.epsilon"),
             norm_eps=k("attention.layer_norm_rms_epsilon"), rope_base=k("rope.freq_base"),
             rope_base_c=k("attention.compress_rope_freq_base"), yarn_factor=k("rope.scaling.factor"),
             yarn_orig=k("rope.scaling.original_context_length"),
             beta_fast=k("rope.scaling.yarn_beta_fast"), beta_slow=k("rope.scaling.yarn_beta_slow"),
             swiglu=k("swiglu_clamp_exp")[0], route_scale=k("expert_weights_scale"),
             pad_id=kv["tokenizer.ggml.padding_token_id"])
    nd = k("nextn_predict_layers")
    if v41:
        c.update(kv_src=list(k("kv_source_layer_ids")), idx_src=list(k("index_source_layer_ids")),
                 cand_src=k("attention.candidate_source_layer_id"),
                 cand_topk_blocks=k("attention.candidate_topk_blocks"),
                 cand_block=k("attention.candidate_block_size"),
                 engram_layers=list(k("engram.layer_ids")), engram_heads=k("engram.head_count"),
                 engram_dim=k("engram.key_length"), engram_ngram=k("engram.max_ngram_size"),
                 n_dspark=nd, dspark_block=k("dspark_block_size"), targets=list(k("dspark_target_layer_ids")),
                 markov_rank=k("dspark_markov_rank"), dspark_experts=k("dspark_expert_count"),
                 dspark_used=k("dspark_expert_used_count"), noise_id=k("dspark_noise_token_id"), n_mtp=0)
        # engram_vocab: the primes start above it; recover it from the first prime's search start
        primes = k("engram.primes")
        c["engram_vocab"] = _vocab_from_primes(primes[0])
    else:
        c.update(kv_src=[], idx_src=[], cand_src=-1, engram_layers=[], n_dspark=0, targets=[], n_mtp=nd)
    cfg = M.Config(**c)
    tmap = k("engram.token_map") if v41 and cfg.engram_layers else None
    m = M.Model(cfg, tmap=tmap)
    if v41 and cfg.engram_layers:
        # the file's hashing constants are the ones the weights were trained with
        if [p for pr in m.primes for p in pr[0]] != list(k("engram.primes")):
            raise SystemExit("engram primes differ from the §4.6 rule")
        m.mults = [list(k("engram.multipliers")[i * cfg.engram_ngram:(i + 1) * cfg.engram_ngram])
                   for i in range(len(cfg.engram_layers))]
    ggufmap.load_weights(m, path)
    m.train(False)
    return m, g


def _vocab_from_primes(p0):
    # the first prime is the smallest prime > engram_vocab - 1; any vocab in (prev_prime, p0]
    # gives the same primes. Use p0 itself minus the gap to the previous prime.
    v = p0
    while v > 2:
        v -= 1
        if all(v % d for d in range(2, int(v ** 0.5) + 1)):
            return v + 1
    return 2


def tokenizer_from_gguf(g):
    """Our Tokenizer from the GGUF merges (tokens 0..255 are the bytes, then the merges)."""
    toks = g.kv["tokenizer.ggml.tokens"]
    inv = {v: k for k, v in bpe.byte_to_unicode().items()}
    index = {t: i for i, t in enumerate(toks)}
    merges = []
    for mline in g.kv["tokenizer.ggml.merges"]:
        a, b = mline.split(" ")
        merges.append((index[a], index[b]))
    tb = [bytes([inv[ch] for ch in toks[i]]) for i in range(256)]
    for a, b in merges:
        tb.append(tb[a] + tb[b])
    return bpe.Tokenizer(tb, merges)


def held_chunks(tok, bible=None):
    import data as D
    import kjv
    corpus = D.Corpus(kjv.read_bible(bible), tok)
    return corpus.held_chunks(CHUNK, N_CHUNKS)


@torch.no_grad()
def logprobs(m, chunks, fake_round):
    m.fake_round = fake_round
    out = []
    for ch in chunks:
        x = torch.from_numpy(np.asarray(ch, dtype=np.int64)).view(1, -1)
        lg = m(x)["logits"][0].double()
        lp = torch.log_softmax(lg, -1)[:-1].gather(-1, x[0, 1:].view(-1, 1)).view(-1)
        out.append(lp.numpy())
    m.fake_round = True
    return out


def write(path, name, tok, chunks, lr, ln):
    with open(path + ".tmp", "w") as f:
        f.write("# held-out per-token log-probs of %s, PyTorch (tools/train/model.py) on the GGUF weights\n" % name)
        f.write("# regenerate: tools/train/expected_logprobs.py --model models/%s.gguf -o %s\n"
                % (name, os.path.join("tests/model/data", os.path.basename(path))))
        f.write("model %s\nchunks %d\n" % (name, len(chunks)))
        for ch, a, b in zip(chunks, lr, ln):
            text = tok.decode([int(t) for t in ch[1:]]).encode("utf-8")
            f.write("text %s\n" % text.hex())
            f.write("tokens %s\n" % " ".join(str(int(t)) for t in ch))
            f.write("lp_round %s\n" % " ".join("%.9g" % v for v in a))
            f.write("lp_noround %s\n" % " ".join("%.9g" % v for v in b))
    os.replace(path + ".tmp", path)


def read(path):
    chunks, lr, ln = [], [], []
    for line in open(path):
        if line.startswith("tokens "):
            chunks.append([int(v) for v in line.split()[1:]])
        elif line.startswith("lp_round "):
            lr.append(np.array([float(v) for v in line.split()[1:]]))
        elif line.startswith("lp_noround "):
            ln.append(np.array([float(v) for v in line.split()[1:]]))
    return chunks, lr, ln


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("-o", help="write the expected log-probs here")
    ap.add_argument("--check", help="recompute and compare with this committed file")
    ap.add_argument("--bible", default=None)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m, g = model_from_gguf(a.model)
    tok = tokenizer_from_gguf(g)
    if a.check:
        chunks, er, en = read(a.check)
    else:
        chunks = [list(c) for c in held_chunks(tok, a.bible)]
    lr = logprobs(m, chunks, True)
    ln = logprobs(m, chunks, False)
    n = sum(len(v) for v in lr)
    ppl_r = float(np.exp(-np.mean(np.concatenate(lr))))
    ppl_n = float(np.exp(-np.mean(np.concatenate(ln))))
    print("%s: %d chunks, %d predicted tokens, held-out ppl %.4f (rounding on) %.4f (off)"
          % (m.cfg.name, len(chunks), n, ppl_r, ppl_n))
    if a.o:
        write(a.o, m.cfg.name, tok, chunks, lr, ln)
    if a.check:
        dn = np.abs(np.concatenate(ln) - np.concatenate(en))
        pr = float(np.exp(-np.mean(np.concatenate(er))))
        rel = abs(ppl_r - pr) / pr
        print("check: rounding off max |d logp| %.3g mean %.3g; rounding on ppl %.6g vs %.6g (rel %.2g)"
              % (dn.max(), dn.mean(), ppl_r, pr, rel))
        if dn.max() > 1e-4 or rel > 1e-4:
            print("check: FAILED (limits: max |d logp| 1e-4 with rounding off, ppl rel 1e-4 with it on)")
            sys.exit(1)
        print("check: ok")


if __name__ == "__main__":
    main()
