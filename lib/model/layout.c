/* Layout spellings shared by the loader and the writers (layout.h, docs/model-files.md §7). */
#include "model/layout.h"

#include <string.h>

const char *dsii_layout_name(int layout) {
    switch (layout) {
    case DSII_LAYOUT_NATIVE: return "native";
    case DSII_LAYOUT_LLAMACPP: return "llama.cpp";
    case DSII_LAYOUT_DS4: return "ds4";
    }
    return "?";
}

int dsii_layout_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "native")) return DSII_LAYOUT_NATIVE;
    if (!strcmp(s, "llama.cpp") || !strcmp(s, "llamacpp") || !strcmp(s, "llama"))
        return DSII_LAYOUT_LLAMACPP;
    if (!strcmp(s, "ds4")) return DSII_LAYOUT_DS4;
    return -1;
}

/* Canonical suffix -> ds4 deepseek41 suffix (antirez/ds4 gguf-tools/deepseek41_metadata.py:
 * the text_config names of the Hugging Face config, rope_scaling.* nested names). Keys both
 * spell alike (vocab_size, kv_source_layer_ids, index_source_layer_ids, engram.layer_ids,
 * engram.pad_id, engram.compressed_vocab_size, engram.token_map, engram.primes,
 * engram.multipliers) are not listed. */
static const struct {
    const char *canon, *ds4;
} k_ds4v41_keys[] = {
    {"block_count", "num_hidden_layers"},
    {"context_length", "max_position_embeddings"},
    {"embedding_length", "hidden_size"},
    {"attention.head_count", "num_attention_heads"},
    {"attention.head_count_kv", "num_key_value_heads"},
    {"attention.key_length", "head_dim"},
    {"attention.value_length", "head_dim"},
    {"rope.dimension_count", "qk_rope_head_dim"},
    {"attention.q_lora_rank", "q_lora_rank"},
    {"attention.output_lora_rank", "o_lora_rank"},
    {"attention.output_group_count", "o_groups"},
    {"attention.sliding_window", "sliding_window"},
    {"attention.indexer.head_count", "index_n_heads"},
    {"attention.indexer.key_length", "index_head_dim"},
    {"attention.indexer.top_k", "index_topk"},
    {"attention.compress_ratios", "compress_ratios"},
    {"attention.compress_rope_freq_base", "compress_rope_theta"},
    {"attention.candidate_source_layer_id", "candidate_source_layer_id"},
    {"attention.candidate_topk_blocks", "candidate_topk_blocks"},
    {"attention.candidate_block_size", "candidate_block_size"},
    {"rope.freq_base", "rope_theta"},
    {"rope.scaling.factor", "rope_scaling.factor"},
    {"rope.scaling.original_context_length", "rope_scaling.original_max_position_embeddings"},
    {"rope.scaling.yarn_beta_fast", "rope_scaling.beta_fast"},
    {"rope.scaling.yarn_beta_slow", "rope_scaling.beta_slow"},
    {"attention.layer_norm_rms_epsilon", "rms_norm_eps"},
    {"expert_count", "n_routed_experts"},
    {"expert_used_count", "num_experts_per_tok"},
    {"expert_feed_forward_length", "moe_intermediate_size"},
    {"expert_shared_count", "n_shared_experts"},
    {"expert_weights_scale", "routed_scaling_factor"},
    {"expert_weights_norm", "norm_topk_prob"},
    {"expert_gating_func", "scoring_func"},
    {"swiglu_clamp_exp", "swiglu_limit"},
    {"hyper_connection.count", "hc_mult"},
    {"hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters"},
    {"hyper_connection.epsilon", "hc_eps"},
};

const char *dsii_layout_ds4v41_key(const char *canon) {
    if (!canon) return NULL;
    for (size_t i = 0; i < sizeof k_ds4v41_keys / sizeof k_ds4v41_keys[0]; i++)
        if (!strcmp(k_ds4v41_keys[i].canon, canon)) return k_ds4v41_keys[i].ds4;
    return NULL;
}

/* antirez/ds4 gguf-tools/deepseek41_quantize.py build_plan(): engram_embd (I8 row264 table),
 * engram_q_norm / engram_k_norm (the q_weight / k_weight vectors), engram_kv (wkv). */
static const struct {
    const char *canon, *ds4;
} k_ds4v41_tensors[] = {
    {"engram.embd.weight", "engram_embd.weight"},
    {"engram.wkv.weight", "engram_kv.weight"},
    {"engram.q.weight", "engram_q_norm.weight"},
    {"engram.k.weight", "engram_k_norm.weight"},
};

const char *dsii_layout_ds4v41_tensor(const char *canon) {
    if (!canon) return NULL;
    for (size_t i = 0; i < sizeof k_ds4v41_tensors / sizeof k_ds4v41_tensors[0]; i++)
        if (!strcmp(k_ds4v41_tensors[i].canon, canon)) return k_ds4v41_tensors[i].ds4;
    return NULL;
}
