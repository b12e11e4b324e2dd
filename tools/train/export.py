#!/usr/bin/python3
"""Exports a trained checkpoint as a GGUF through the project's own writer: this script
writes a typed dump (metadata values + f32/i32 tensors, format below) and runs
`dsinfer-mkmodel --import DUMP -o FILE.gguf`, which quantises the tensors with lib/quant and
writes the file with lib/gguf's writer (examples/mkmodel/import.c).

Dump format (little-endian): "DSIDUMP1", u32 n_kv, then per key: str key, u32 gguf type
(4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array), value (array: u32 element type, u64 n,
elements; strings: u64 length + bytes); u32 n_tensors, then per tensor: str name, i32 target
type (DSI_TYPE_*), u32 n_dims, i64 ne[n_dims], the values (f32, or i32 for I32 tensors).
"""
import argparse
import os
import struct
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import ggufmap  # noqa: E402
import train as TR  # noqa: E402

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


class Dump:
    def __init__(self):
        self.kv = []
        self.t = []

    def add(self, key, typ, val, elem=None):
        self.kv.append((key, typ, val, elem))

    @staticmethod
    def _s(b):
        if isinstance(b, str):
            b = b.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def write(self, path):
        out = [b"DSIDUMP1", struct.pack("<I", len(self.kv))]
        fm = {U32: "I", I32: "i", F32: "f", U64: "Q"}
        for key, typ, val, elem in self.kv:
            out += [self._s(key), struct.pack("<I", typ)]
            if typ == STR:
                out.append(self._s(val))
            elif typ == BOOL:
                out.append(struct.pack("<B", 1 if val else 0))
            elif typ == ARR:
                out.append(struct.pack("<IQ", elem, len(val)))
                if elem == STR:
                    out += [self._s(v) for v in val]
                else:
                    out.append(struct.pack("<%d%s" % (len(val), fm[elem]), *val))
            else:
                out.append(struct.pack("<" + fm[typ], val))
        out.append(struct.pack("<I", len(self.t)))
        for name, typ, t in self.t:
            ne = ggufmap.gguf_ne(t)
            out += [self._s(name), struct.pack("<iI", typ, len(ne)), struct.pack("<%dq" % len(ne), *ne)]
            a = t.detach().cpu().numpy()
            a = a.astype(np.int32) if typ == ggufmap.I32 else a.astype(np.float32)
            out.append(np.ascontiguousarray(a).tobytes())
        with open(path + ".tmp", "wb") as f:
            f.write(b"".join(out))
        os.replace(path + ".tmp", path)


def metadata(d, m, tok):
    cfg = m.cfg
    A = "deepseek41" if cfg.v41 else "deepseek4"
    n_draft = cfg.n_dspark if cfg.v41 else cfg.n_mtp
    L = cfg.n_layers

    def k(s):
        return "%s.%s" % (A, s)
    d.add("general.architecture", STR, A)
    d.add("general.name", STR, cfg.name)
    d.add("general.description", STR, "tiny %s trained on the King James Bible (Debian bible-kjv); "
          "docs/trained-models.md" % ("DeepSeek V4.1" if cfg.v41 else "DeepSeek V4"))
    for key, v in (("block_count", L), ("context_length", cfg.ctx), ("embedding_length", cfg.dim),
                   ("vocab_size", cfg.vocab), ("attention.head_count", cfg.n_heads),
                   ("attention.head_count_kv", 1), ("attention.key_length", cfg.head_dim),
                   ("attention.value_length", cfg.head_dim), ("rope.dimension_count", cfg.rope_dim),
                   ("attention.q_lora_rank", cfg.q_lora), ("attention.output_lora_rank", cfg.o_lora),
                   ("attention.output_group_count", cfg.o_groups),
                   ("attention.sliding_window", cfg.window),
                   ("attention.indexer.head_count", cfg.idx_heads),
                   ("attention.indexer.key_length", cfg.idx_dim),
                   ("attention.indexer.top_k", cfg.idx_topk)):
        d.add(k(key), U32, v)
    d.add(k("attention.compress_ratios"), ARR, list(cfg.ratios) + [0] * n_draft, U32)
    d.add(k("attention.compress_rope_freq_base"), F32, cfg.rope_base_c)
    d.add(k("rope.freq_base"), F32, cfg.rope_base)
    d.add(k("rope.scaling.factor"), F32, cfg.yarn_factor)
    d.add(k("rope.scaling.original_context_length"), U32, cfg.yarn_orig)
    d.add(k("rope.scaling.yarn_beta_fast"), F32, cfg.beta_fast)
    d.add(k("rope.scaling.yarn_beta_slow"), F32, cfg.beta_slow)
    d.add(k("attention.layer_norm_rms_epsilon"), F32, cfg.norm_eps)
    d.add(k("expert_count"), U32, cfg.n_experts)
    d.add(k("expert_used_count"), U32, cfg.n_used)
    d.add(k("expert_feed_forward_length"), U32, cfg.ff)
    d.add(k("expert_shared_count"), U32, cfg.n_shared)
    d.add(k("expert_weights_scale"), F32, cfg.route_scale)
    d.add(k("expert_weights_norm"), BOOL, True)
    d.add(k("expert_gating_func"), U32, 4)
    d.add(k("hash_layer_count"), U32, cfg.n_hash)
    d.add(k("swiglu_clamp_exp"), ARR, [cfg.swiglu] * (L + n_draft), F32)
    d.add(k("hyper_connection.count"), U32, cfg.hc)
    d.add(k("hyper_connection.sinkhorn_iterations"), U32, cfg.sinkhorn)
    d.add(k("hyper_connection.epsilon"), F32, cfg.hc_eps)
    d.add(k("nextn_predict_layers"), U32, n_draft)
    if cfg.v41:
        d.add(k("kv_source_layer_ids"), ARR, cfg.kv_src, U32)
        d.add(k("index_source_layer_ids"), ARR, cfg.idx_src, U32)
        if cfg.cand_src >= 0:
            d.add(k("attention.candidate_source_layer_id"), U32, cfg.cand_src)
            d.add(k("attention.candidate_topk_blocks"), U32, cfg.cand_topk_blocks)
            d.add(k("attention.candidate_block_size"), U32, cfg.cand_block)
        if cfg.engram_layers:
            d.add(k("engram.layer_ids"), ARR, cfg.engram_layers, U32)
            d.add(k("engram.head_count"), U32, cfg.engram_heads)
            d.add(k("engram.key_length"), U32, cfg.engram_dim)
            d.add(k("engram.max_ngram_size"), U32, cfg.engram_ngram)
            d.add(k("engram.multipliers"), ARR, [v for ms in m.mults for v in ms], U64)
            d.add(k("engram.primes"), ARR, [p for pr in m.primes for p in pr[0]], U64)
            d.add(k("engram.offsets"), ARR, [o for pr in m.primes for o in pr[1]], U64)
            d.add(k("engram.token_map"), ARR, [int(v) for v in m.tmap], I32)
            d.add(k("engram.pad_id"), U32, int(m.tmap[cfg.pad_id]))
            d.add(k("engram.compressed_vocab_size"), U32, m.n_comp)
        if cfg.n_dspark:
            d.add(k("dspark_target_layer_ids"), ARR, cfg.targets, U32)
            d.add(k("dspark_block_size"), U32, cfg.dspark_block)
            d.add(k("dspark_noise_token_id"), U32, cfg.noise_id)
            d.add(k("dspark_markov_rank"), U32, cfg.markov_rank)
            d.add(k("dspark_expert_count"), U32, cfg.dspark_experts)
            d.add(k("dspark_expert_used_count"), U32, cfg.dspark_used)
    toks, types, merges = tok.gguf_tokens()
    d.add("tokenizer.ggml.model", STR, "gpt2")
    d.add("tokenizer.ggml.pre", STR, "joyai-llm")
    d.add("tokenizer.ggml.tokens", ARR, toks, STR)
    d.add("tokenizer.ggml.token_type", ARR, types, I32)
    d.add("tokenizer.ggml.merges", ARR, merges, STR)
    d.add("tokenizer.ggml.bos_token_id", U32, tok.sid(bpe.BOS))
    d.add("tokenizer.ggml.eos_token_id", U32, tok.sid(bpe.EOS))
    d.add("tokenizer.ggml.padding_token_id", U32, tok.sid(bpe.PAD))
    d.add("tokenizer.ggml.add_bos_token", BOOL, True)


def export(model, tok, dump_path, gguf_path, mkmodel):
    d = Dump()
    metadata(d, model, tok)
    for name, t, typ in ggufmap.tensors(model):
        d.t.append((name, typ, t))
    d.write(dump_path)
    subprocess.run([mkmodel, "--import", dump_path, "-o", gguf_path], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["v41", "v4"], required=True)
    ap.add_argument("--work", required=True, help="training folder (merges.txt, ckpt.pt)")
    ap.add_argument("--mkmodel", required=True, help="path of dsinfer-mkmodel")
    ap.add_argument("-o", required=True)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    tok = bpe.Tokenizer.load(os.path.join(a.work, "merges.txt"))
    m = TR.build(a.arch, tok, a.seed)
    st = torch.load(os.path.join(a.work, "ckpt.pt"))
    m.load_state_dict(st["model"])
    export(m, tok, os.path.join(a.work, "model.dsdump"), a.o, a.mkmodel)


if __name__ == "__main__":
    main()
