#!/usr/bin/python3
"""An independent writer of antirez/ds4-layout GGUF files, for tests (issue 13).

Written from ds4's published layout, not from libdsinfer's writer (lib/model/emit.c):
  * deepseek4: the key list ds4 validates (model-spec §5.1, ds4.c config_validate_model) —
    no rope.scaling.type, expert_gating_func, context_length or nextn_predict_layers, which
    ds4 does not write; tensors under the llama.cpp / ds4 names; the MTP block in a second
    file under mtp.0.* (ds4's `download_model.sh mtp` file, mtp_weights_bind);
  * deepseek41: gguf-tools/deepseek41_metadata.py + deepseek41_quantize.py — Hugging Face
    config key names (deepseek41.hidden_size, …, deepseek41.rope_scaling.*), a JSON copy of the
    config, general.alignment 16384, engram_{embd,kv,q_norm,k_norm} tensors, the Engram tables
    as raw I8 [264, rows] rows (256 E4M3 bytes, then 8 E8M0 scales) at the end of the file,
    Engram constants without head_count / key_length / max_ngram / offsets, no DSpark.

The weights come from a native-layout GGUF (dsinfer-mkmodel --layout native), byte for byte
(the Engram tables re-encoded losslessly from fp8_e4m3_r32), so libdsinfer must compute the
same logits from both files.

  make_ds4_gguf.py NATIVE.gguf OUT.gguf [--mtp-out OUT-mtp.gguf]
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import gguf_reader as gr  # noqa: E402
from make_test_gguf import GGUFWriter  # noqa: E402

I8, FP8_R32 = 24, 1026


def raw(g, name):
    t = g.tensors[name]
    return bytes(g.buf[g.data_offset + t.offset: g.data_offset + t.offset + t.nbytes])


def copy_tokenizer(g, w, add_eos=None):
    for k, v in g.kv.items():
        if k.startswith("tokenizer.ggml."):
            vt, et = g.kv_types[k]
            w.add(k, vt, v.tolist() if isinstance(v, np.ndarray) else v, et)
    if add_eos is not None:
        w.bool("tokenizer.ggml.add_eos_token", add_eos)


def v4_keys(g, w, A, n_arr):
    """ds4's deepseek4 keys (model-spec §5.1), with ds4's value types."""
    kv = g.kv
    u = lambda s: w.u32("%s.%s" % (A, s), int(kv["%s.%s" % (A, s)]))  # noqa: E731
    f = lambda s: w.f32("%s.%s" % (A, s), float(kv["%s.%s" % (A, s)]))  # noqa: E731
    for s in ("block_count", "embedding_length", "vocab_size", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length",
              "rope.dimension_count", "attention.q_lora_rank", "attention.output_lora_rank",
              "attention.output_group_count", "expert_count", "expert_used_count",
              "expert_feed_forward_length", "expert_shared_count", "hash_layer_count",
              "attention.sliding_window", "attention.indexer.head_count",
              "attention.indexer.key_length", "attention.indexer.top_k",
              "hyper_connection.count", "hyper_connection.sinkhorn_iterations",
              "rope.scaling.original_context_length"):
        u(s)
    w.u32(A + ".expert_group_count", 0)
    w.u32(A + ".expert_group_used_count", 0)
    L = int(kv[A + ".block_count"])
    ratios = list(kv[A + ".attention.compress_ratios"])[:L] + [0] * n_arr
    w.arr(A + ".attention.compress_ratios", gr.T_UINT32, ratios)
    clamp = list(kv[A + ".swiglu_clamp_exp"])
    w.arr(A + ".swiglu_clamp_exp", gr.T_FLOAT32, clamp[:L] + clamp[-1:] * n_arr)
    for s in ("rope.freq_base", "rope.scaling.factor", "rope.scaling.yarn_beta_fast",
              "rope.scaling.yarn_beta_slow", "attention.compress_rope_freq_base",
              "expert_weights_scale", "attention.layer_norm_rms_epsilon", "hyper_connection.epsilon"):
        f(s)
    w.bool(A + ".expert_weights_norm", True)


def write_v4(g, out, mtp_out):
    A = "deepseek4"
    w = GGUFWriter(32)
    w.string("general.architecture", A)
    w.string("general.name", "ds4 fixture")
    v4_keys(g, w, A, 0)
    copy_tokenizer(g, w)
    for n in g.tensor_order:
        if n.startswith("mtp."):
            continue
        t = g.tensors[n]
        w.tensor(n, t.ne, t.type, raw(g, n))
    w.write(out)
    if mtp_out:
        m = GGUFWriter(32)
        m.string("general.architecture", A)
        m.string("general.name", "ds4 fixture MTP")
        v4_keys(g, m, A, 1)
        copy_tokenizer(g, m)
        for n in g.tensor_order:
            if n.startswith("mtp.0."):
                t = g.tensors[n]
                m.tensor(n, t.ne, t.type, raw(g, n))
        m.write(mtp_out)


def row264(t, data):
    """fp8_e4m3_r32 rows ([e][32 values] x K/32) -> ds4 rows ([K values][K/32 scales])."""
    K, rows = t.ne[0], t.ne[1]
    b = np.frombuffer(data, dtype=np.uint8).reshape(rows, K // 32, 33)
    out = np.empty((rows, K + K // 32), dtype=np.uint8)
    out[:, :K] = b[:, :, 1:].reshape(rows, K)
    out[:, K:] = b[:, :, 0]
    return out.tobytes()


def write_v41(g, out):
    A = "deepseek41"
    kv = g.kv
    k = lambda s: kv["%s.%s" % (A, s)]  # noqa: E731
    L = int(k("block_count"))
    w = GGUFWriter(16384)
    w.string("general.architecture", A)
    w.string("general.name", "ds4 fixture")
    text = {  # the Hugging Face text_config the ds4 metadata script copies into the file
        "vocab_size": int(k("vocab_size")), "hidden_size": int(k("embedding_length")),
        "num_hidden_layers": L, "compress_ratios": [int(x) for x in k("attention.compress_ratios")][:L],
        "engram_layer_ids": [int(x) for x in k("engram.layer_ids")],
        "engram_n_heads": int(k("engram.head_count")), "engram_head_dim": int(k("engram.key_length")),
        "engram_max_ngram_size": int(k("engram.max_ngram_size")),
    }
    w.string(A + ".config", json.dumps({"model_type": "deepseek_v41", "text_config": text}, sort_keys=True,
                                       separators=(",", ":")))
    w.string(A + ".engram.encoding", "e4m3_e8m0_32_row264")
    layers = [int(x) for x in k("engram.layer_ids")]
    primes = [int(x) for x in k("engram.primes")]
    cols = len(primes) // len(layers)
    rows = [sum(primes[i * cols:(i + 1) * cols]) for i in range(len(layers))]
    w.arr(A + ".engram.layer_ids", gr.T_UINT32, layers)
    w.arr(A + ".engram.rows", gr.T_UINT32, rows)
    w.u32(A + ".engram.compressed_vocab_size", int(k("engram.compressed_vocab_size")))
    w.u32(A + ".engram.pad_id", int(k("engram.pad_id")))
    w.arr(A + ".engram.token_map", gr.T_UINT32, [int(x) for x in k("engram.token_map")])
    w.arr(A + ".engram.primes", gr.T_UINT32, primes)
    w.arr(A + ".engram.multipliers", gr.T_UINT64, [int(x) for x in k("engram.multipliers")])
    copy_tokenizer(g, w, add_eos=False)
    for name, src in (("vocab_size", "vocab_size"), ("hidden_size", "embedding_length"),
                      ("moe_intermediate_size", "expert_feed_forward_length"),
                      ("num_hidden_layers", "block_count"), ("num_attention_heads", "attention.head_count"),
                      ("num_key_value_heads", "attention.head_count_kv"), ("head_dim", "attention.key_length"),
                      ("qk_rope_head_dim", "rope.dimension_count"), ("q_lora_rank", "attention.q_lora_rank"),
                      ("o_lora_rank", "attention.output_lora_rank"), ("o_groups", "attention.output_group_count"),
                      ("n_routed_experts", "expert_count"), ("n_shared_experts", "expert_shared_count"),
                      ("num_experts_per_tok", "expert_used_count"), ("max_position_embeddings", "context_length"),
                      ("sliding_window", "attention.sliding_window"),
                      ("index_n_heads", "attention.indexer.head_count"),
                      ("index_head_dim", "attention.indexer.key_length"), ("index_topk", "attention.indexer.top_k"),
                      ("candidate_source_layer_id", "attention.candidate_source_layer_id"),
                      ("candidate_topk_blocks", "attention.candidate_topk_blocks"),
                      ("candidate_block_size", "attention.candidate_block_size"),
                      ("hc_mult", "hyper_connection.count"), ("hc_sinkhorn_iters", "hyper_connection.sinkhorn_iterations"),
                      ("rope_theta", "rope.freq_base"), ("compress_rope_theta", "attention.compress_rope_freq_base")):
        w.u32("%s.%s" % (A, name), int(k(src)))
    w.f32(A + ".rms_norm_eps", float(k("attention.layer_norm_rms_epsilon")))
    w.f32(A + ".hc_eps", float(k("hyper_connection.epsilon")))
    w.f32(A + ".swiglu_limit", float(k("swiglu_clamp_exp")[0]))
    w.f32(A + ".routed_scaling_factor", float(k("expert_weights_scale")))
    w.string(A + ".scoring_func", "sqrtsoftplus")
    w.string(A + ".hidden_act", "silu")
    w.string(A + ".topk_method", "noaux_tc")
    w.bool(A + ".norm_topk_prob", True)
    w.arr(A + ".compress_ratios", gr.T_UINT32, [int(x) for x in k("attention.compress_ratios")][:L])
    w.arr(A + ".kv_source_layer_ids", gr.T_UINT32, [int(x) for x in k("kv_source_layer_ids")])
    w.arr(A + ".index_source_layer_ids", gr.T_UINT32, [int(x) for x in k("index_source_layer_ids")])
    w.f32(A + ".rope_scaling.factor", float(k("rope.scaling.factor")))
    w.f32(A + ".rope_scaling.beta_fast", float(k("rope.scaling.yarn_beta_fast")))
    w.f32(A + ".rope_scaling.beta_slow", float(k("rope.scaling.yarn_beta_slow")))
    w.f32(A + ".rope_scaling.original_max_position_embeddings", float(k("rope.scaling.original_context_length")))
    rename = {"engram.wkv.weight": "engram_kv.weight", "engram.q.weight": "engram_q_norm.weight",
              "engram.k.weight": "engram_k_norm.weight"}
    tables = []
    for n in g.tensor_order:
        if n.startswith("mtp.") or n.startswith("output_hc_"):
            continue  # DSpark is a separate model in ds4; V4.1 has no HC head
        t = g.tensors[n]
        parts = n.split(".", 2)
        if n.startswith("blk.") and parts[2] == "engram.embd.weight":
            if t.type != FP8_R32:
                raise SystemExit("make_ds4_gguf: %s must be fp8_e4m3_r32 (dsinfer-mkmodel writes it so)" % n)
            tables.append(("blk.%s.engram_embd.weight" % parts[1], [t.ne[0] // 32 * 33, t.ne[1]], row264(t, raw(g, n))))
            continue
        if n.startswith("blk.") and parts[2] in rename:
            n2 = "blk.%s.%s" % (parts[1], rename[parts[2]])
        else:
            n2 = n
        w.tensor(n2, t.ne, t.type, raw(g, n))
    for n, ne, data in tables:  # the Engram extent: last, after every resident tensor
        w.tensor(n, ne, I8, data)
    w.write(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("native")
    ap.add_argument("out")
    ap.add_argument("--mtp-out")
    a = ap.parse_args()
    g = gr.GGUFFile(a.native)
    arch = g.kv["general.architecture"]
    if arch == "deepseek4":
        write_v4(g, a.out, a.mtp_out)
    else:
        write_v41(g, a.out)


if __name__ == "__main__":
    main()
