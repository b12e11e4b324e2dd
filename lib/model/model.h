/*
 * The internal model: hyperparameters of DeepSeek V4 Flash (`deepseek4`) and V4.1 Flash
 * (`deepseek41`) read from GGUF metadata, every tensor bound to a typed reference, the
 * tokenizer, and the dsi_model handle itself.
 *
 * File contract (key and tensor names, shapes, types): docs/model-files.md.
 * Section numbers (§1, §3.4, §4.6 …) refer to shared/docs/model-spec.md.
 *
 * Nothing is fixed to the released shapes: every constant of §1 is a runtime field here, and
 * any configuration that passes the consistency checks of docs/model-files.md loads.
 *
 * Lifetime and threading: a loaded dsi_model is immutable (except its dependant counters
 * `n_sessions` / `n_detokenizers` and `last_error`); every field may be read from any thread without locking. Tensor data
 * pointers stay valid until dsi_model_free.
 */
#ifndef DSI_MODEL_MODEL_H
#define DSI_MODEL_MODEL_H

#include "base/base.h"
#include "base/file.h"
#include "gguf/gguf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct dsii_tokenizer; /* lib/tokenizer/tokenizer.h */

/* Upper bounds for the fixed-size per-layer arrays. The releases use 43+1 (V4) and 40+3
 * (V4.1) layers, 2 Engram layers and 3 DSpark targets. Files beyond these fail with
 * DSI_ERR_UNSUPPORTED naming the key. */
#define DSII_MAX_LAYERS 128        /* backbone layers (block_count) */
#define DSII_MAX_DRAFT 4           /* MTP / DSpark blocks */
#define DSII_MAX_ENGRAM_LAYERS 16
#define DSII_MAX_DSPARK_TARGETS 8
#define DSII_MAX_HC 16             /* mHC streams */

/* ------------------------------------------------------------------------------------ */
/* Tensor references                                                                      */
/* ------------------------------------------------------------------------------------ */

/* One bound tensor. `data` points at the first byte of row 0:
 *   - DSI_ACCESS_MMAP: into the read-only mapping (never copied, never touched at load);
 *   - DSI_ACCESS_PREAD / READER: into a library-owned buffer filled at load;
 *   - Engram tables in PREAD / READER mode: NULL (`lazy` = 1) — rows are read on demand with
 *     dsii_model_tensor_read() (a real V4.1 table is ~98 GB, §4.6).
 * Row r of matrix slice (i2, i3) starts at
 *   data + (i3*ne[2] + i2) * ne[1] * row_stride + r * row_stride.
 * row_stride == row_bytes except for strided views (llama.cpp nextn `eh_proj` split into
 * e_proj / h_proj, docs/model-files.md §4.1), where row_stride is the parent's row size. */
typedef struct dsii_tensor {
    const char *name;      /* GGUF name (owned by the model's dsii_gguf) */
    int32_t type;          /* DSI_TYPE_* */
    uint32_t n_dims;       /* 1..4 as stored */
    int64_t ne[4];         /* ne[0] = row length (input dim of a linear map); unused dims 1 */
    uint64_t n_elements;   /* product of ne */
    uint64_t row_bytes;    /* bytes of one row of ne[0] elements (dsii_type_row_size) */
    uint64_t row_stride;   /* bytes from one row to the next */
    uint64_t nbytes;       /* bytes covered by this tensor as stored */
    uint64_t file_offset;  /* absolute file offset of row 0 */
    const void *data;      /* see above; NULL only when lazy */
    int32_t lazy;          /* 1: data not resident, read through dsii_model_tensor_read */
    int32_t is_view;       /* 1: a strided view into another tensor's bytes (not counted) */
} dsii_tensor;

/* Per-layer tensor bindings. A NULL pointer means "absent in this layer" — which tensors a
 * layer has follows from its hyperparameters (dsii_layer_hparams); the loader has already
 * checked presence, shapes and types against docs/model-files.md §3, so a consumer may rely
 * on e.g. `comp_kv != NULL` exactly when the layer compresses. Shapes in comments are GGUF
 * ne order ([in, out]). */
typedef struct dsii_layer_tensors {
    /* attention, every layer (§3.4, §4.3) */
    const dsii_tensor *attn_norm;      /* [D] */
    const dsii_tensor *attn_q_a;       /* [D, Q] */
    const dsii_tensor *attn_q_a_norm;  /* [Q] */
    const dsii_tensor *attn_q_b;       /* [Q, H*hd] */
    const dsii_tensor *attn_kv;        /* [D, hd] */
    const dsii_tensor *attn_kv_norm;   /* [hd]  (attn_kv_a_norm) */
    const dsii_tensor *attn_sinks;     /* [H] */
    const dsii_tensor *attn_out_a;     /* [H*hd/G, G*R] grouped LoRA, group-major rows */
    const dsii_tensor *attn_out_b;     /* [G*R, D] */
    /* mHC (§3.3, §4.2) */
    const dsii_tensor *hc_attn_fn;     /* [hc*D, M] */
    const dsii_tensor *hc_attn_base;   /* [M] */
    const dsii_tensor *hc_attn_scale;  /* [3] */
    const dsii_tensor *hc_ffn_fn;
    const dsii_tensor *hc_ffn_base;
    const dsii_tensor *hc_ffn_scale;
    /* main-KV compressor: V4 every ratio>0 layer; V4.1 KV sources only */
    const dsii_tensor *comp_ape;       /* V4: [coff*hd, ratio]; V4.1: NULL (no ape) */
    const dsii_tensor *comp_kv;        /* [D, coff*hd] */
    const dsii_tensor *comp_gate;      /* [D, coff*hd]; V4.1 ratio-1 sources: NULL */
    const dsii_tensor *comp_norm;      /* [hd] */
    /* indexer: V4 ratio-4 layers; V4.1 index sources (q/proj) and KV sources (k/k_norm) */
    const dsii_tensor *idx_q_b;        /* [Q, IH*ID]  indexer.attn_q_b */
    const dsii_tensor *idx_proj;       /* [D, IH]     indexer.proj (head weights) */
    const dsii_tensor *idx_comp_ape;   /* V4: [2*ID, 4] */
    const dsii_tensor *idx_comp_kv;    /* V4: [D, 2*ID] */
    const dsii_tensor *idx_comp_gate;  /* V4: [D, 2*ID] */
    const dsii_tensor *idx_comp_norm;  /* V4: [ID] */
    const dsii_tensor *idx_k;          /* V4.1: [hd, ID]  indexer.attn_k (from the latent) */
    const dsii_tensor *idx_k_norm;     /* V4.1: [ID]      indexer.k_norm */
    /* MoE (§3.5, §4.4) */
    const dsii_tensor *ffn_norm;       /* [D] */
    const dsii_tensor *ffn_gate_inp;   /* [D, E] router */
    const dsii_tensor *exp_probs_b;    /* [E] selection bias; NULL on V4 hash layers */
    const dsii_tensor *exp_probs_b_vl; /* [E] V4.1 image-token bias; optional */
    const dsii_tensor *tid2eid;        /* [k, V] I32; V4 hash layers only */
    const dsii_tensor *ffn_gate_exps;  /* [D, F, E] */
    const dsii_tensor *ffn_up_exps;    /* [D, F, E] */
    const dsii_tensor *ffn_down_exps;  /* [F, D, E] */
    const dsii_tensor *ffn_gate_shexp; /* [D, S*F] */
    const dsii_tensor *ffn_up_shexp;   /* [D, S*F] */
    const dsii_tensor *ffn_down_shexp; /* [S*F, D] */
    /* Engram (§4.6), V4.1 engram layers only */
    const dsii_tensor *engram_embd;    /* [K, rows] table (FP8_E4M3_R32); lazy in pread mode */
    const dsii_tensor *engram_wkv;     /* [C*K, (hc+1)*D] */
    const dsii_tensor *engram_q;       /* [D, hc] */
    const dsii_tensor *engram_k;       /* [D, hc] */
} dsii_layer_tensors;

/* A draft block: V4 MTP (§3.7) or V4.1 DSpark stage (§4.5). `blk` has the per-layer
 * tensors of a window-only layer (no compressor / indexer / hash / engram). */
typedef struct dsii_draft_tensors {
    dsii_layer_tensors blk;
    /* V4 MTP (ds4 mtp.0.* names) */
    const dsii_tensor *e_proj;         /* [D, D] (view into nextn eh_proj when read that way) */
    const dsii_tensor *h_proj;         /* [D, D] */
    const dsii_tensor *enorm;          /* [D] */
    const dsii_tensor *hnorm;          /* [D] */
    const dsii_tensor *norm;           /* [D] V4 MTP: its own output norm; DSpark: last stage */
    const dsii_tensor *hc_head_fn;     /* [hc*D, hc] */
    const dsii_tensor *hc_head_base;   /* [hc] */
    const dsii_tensor *hc_head_scale;  /* [1] */
    /* V4.1 DSpark */
    const dsii_tensor *main_proj;      /* stage 0: [T*D, D] */
    const dsii_tensor *main_norm;      /* stage 0: [D] */
    const dsii_tensor *markov_embd;    /* last stage: [rank, V] */
    const dsii_tensor *markov_head;    /* last stage: [rank, V] */
    const dsii_tensor *confidence;     /* last stage: [D + rank, 1] */
} dsii_draft_tensors;

typedef struct dsii_model_tensors {
    const dsii_tensor *token_embd;     /* [D, V] */
    const dsii_tensor *output_norm;    /* [D] */
    const dsii_tensor *output;         /* [D, V] */
    const dsii_tensor *output_hc_fn;   /* V4: [hc*D, hc] (§3.6); V4.1: NULL */
    const dsii_tensor *output_hc_base; /* V4: [hc] */
    const dsii_tensor *output_hc_scale;/* V4: [1] */
    dsii_layer_tensors layer[DSII_MAX_LAYERS];  /* [0, n_layer) */
    dsii_draft_tensors draft[DSII_MAX_DRAFT];   /* [0, n_draft) */
} dsii_model_tensors;

/* ------------------------------------------------------------------------------------ */
/* Hyperparameters                                                                        */
/* ------------------------------------------------------------------------------------ */

/* Per-layer configuration. Index 0..n_layer-1 are backbone layers; the draft blocks have
 * their own entries in dsii_hparams.draft_layer (ratio 0, base rope, no roles). */
typedef struct dsii_layer_hparams {
    uint32_t compress_ratio;   /* §1.1 compress_ratios; 0 = window only */
    uint32_t coff;             /* V4: 2 if ratio == 4 (overlapping windows, §3.4) else 1;
                                  V4.1: 1 */
    int32_t yarn;              /* 1: RoPE base rope_base_compress + YaRN (ratio > 0, §3.9) */
    float rope_base;           /* effective base of every RoPE in this layer (§3.9) */
    float swiglu_limit;        /* routed experts (§3.5); 0 = no clamp */
    float swiglu_limit_shexp;  /* shared expert */
    uint32_t n_expert;         /* E of this layer (DSpark blocks differ, §4.5) */
    uint32_t n_expert_used;    /* k of this layer */
    int32_t is_hash;           /* V4: routes by tid2eid (layer < n_hash_layer, §3.5) */
    int32_t has_indexer;       /* V4: ratio 4; V4.1: index source (own q/weights) */
    int32_t engram_index;      /* index into hparams.engram arrays, or -1 (§4.6) */
    /* V4.1 roles (§4.3 table); -1 / 0 for ratio-0 layers and for V4 */
    int32_t is_kv_source;      /* writes the shared compressed KV + index keys */
    int32_t is_index_source;   /* computes its own top-k */
    int32_t is_candidate_source; /* computes candidate blocks (and uses unmasked scores) */
    int32_t cand_masked;       /* index source after the candidate source that is not a
                                  KV source: scores masked to candidate blocks */
    int32_t kv_src;            /* layer whose compressed KV this layer attends (self for a
                                  source; V4: self when ratio > 0) */
    int32_t key_src;           /* layer whose index keys this layer's indexer scores
                                  (V4.1: = kv_src; V4: self when ratio 4) */
    int32_t topk_src;          /* layer whose top-k selection this layer uses (self for an
                                  index source; else the most recent index source) */
    int32_t cand_src;          /* candidate source whose mask applies (cand_masked), or -1 */
} dsii_layer_hparams;

/* Engram configuration (§4.6), V4.1. Arrays are model-owned. */
typedef struct dsii_engram_hparams {
    uint32_t n_layer;          /* number of engram layers (0: none) */
    uint32_t layer_ids[DSII_MAX_ENGRAM_LAYERS];
    uint32_t n_head;           /* heads per n-gram size */
    uint32_t key_length;       /* K, row width of the table */
    uint32_t max_ngram;        /* n-gram sizes 2..max_ngram */
    uint32_t n_cols;           /* C = (max_ngram-1) * n_head columns per layer */
    uint32_t compressed_vocab; /* bound of token_map values (multiplier bound, §4.6) */
    uint32_t pad_id;           /* compressed id used past the sequence start */
    uint32_t n_token_map;      /* = n_vocab */
    const uint64_t *multipliers; /* [n_layer][max_ngram] */
    const uint64_t *primes;      /* [n_layer][n_cols], column (n-2)*n_head + head */
    const uint64_t *offsets;     /* [n_layer][n_cols], per-layer prefix sums of primes */
    const int32_t *token_map;    /* [n_vocab] compressed ids */
    uint64_t rows[DSII_MAX_ENGRAM_LAYERS]; /* table rows = Σ primes of the layer */
    int32_t row264;            /* tables stored as ds4's I8 [264, rows] rows (layout.h) */
} dsii_engram_hparams;

/* DSpark configuration (§4.5), V4.1. */
typedef struct dsii_dspark_hparams {
    uint32_t block_size;       /* 5 */
    int32_t noise_token;       /* 128799 */
    uint32_t n_target;         /* T = number of target layers */
    uint32_t target_layer_ids[DSII_MAX_DSPARK_TARGETS]; /* main hidden taken at their input */
    uint32_t markov_rank;      /* 256 */
    uint32_t n_expert;         /* 128 */
    uint32_t n_expert_used;    /* 3 */
} dsii_dspark_hparams;

typedef struct dsii_hparams {
    int32_t arch;              /* DSI_ARCH_DEEPSEEK4 / DSI_ARCH_DEEPSEEK41 */
    uint32_t n_layer;          /* backbone layers (§1.1: 43 / 40) */
    uint32_t n_embd;           /* D (4096 / 5120) */
    uint32_t n_vocab;          /* V (129280) */
    uint32_t n_ctx_train;      /* 1048576 */
    uint32_t n_head;           /* H (64) */
    uint32_t head_dim;         /* hd (512) = key and value length */
    uint32_t rope_dim;         /* rd (64): the last rd dims of each head rotate */
    uint32_t nope_dim;         /* hd - rd (448) */
    uint32_t q_lora_rank;      /* Q (1024 / 1280) */
    uint32_t o_lora_rank;      /* R (1024) */
    uint32_t o_groups;         /* G (8) */
    uint32_t window;           /* sliding window incl. current token (128) */
    uint32_t idx_n_head;       /* IH (64 / 32) */
    uint32_t idx_head_dim;     /* ID (128) */
    uint32_t idx_topk;         /* 512 */
    /* V4.1 two-level indexer (§4.3) */
    int32_t candidate_source;  /* layer id or -1 */
    uint32_t candidate_topk_blocks; /* 2048 */
    uint32_t candidate_block_size;  /* 8 */
    /* MoE (§3.5, §4.4) */
    uint32_t n_expert;         /* E (256 / 384) */
    uint32_t n_expert_used;    /* k (6) */
    uint32_t expert_ff;        /* F (2048 / 2304) */
    uint32_t n_expert_shared;  /* S (1) */
    uint32_t n_hash_layer;     /* V4: 3; V4.1: 0 */
    float route_scale;         /* 1.5 */
    /* RoPE / YaRN (§3.9) */
    float rope_base;           /* 10000: ratio-0 layers and draft blocks */
    float rope_base_compress;  /* 160000: ratio>0 layers, with YaRN */
    float yarn_factor;         /* 16 */
    uint32_t yarn_orig_ctx;    /* 65536 */
    float yarn_beta_fast;      /* 32 */
    float yarn_beta_slow;      /* 1 */
    /* norms */
    float rms_eps;             /* 1e-6 (V4) / 1e-20 (V4.1): every RMSNorm, HC rsqrt */
    /* mHC (§3.3) */
    uint32_t hc_mult;          /* hc (4) */
    uint32_t hc_mix;           /* M = (2+hc)*hc (24) */
    uint32_t hc_sinkhorn_iters;/* 20 */
    float hc_eps;              /* 1e-6 */
    int32_t hc_lagged;         /* V4.1: "single-pass" lagged mHC, no HC head (§4.2) */
    /* per-layer */
    dsii_layer_hparams layer[DSII_MAX_LAYERS];
    /* draft blocks */
    uint32_t n_draft;          /* 0, V4 MTP: 1, V4.1 DSpark: 3 */
    int32_t has_mtp;           /* V4 MTP block bound (§3.7) */
    int32_t has_dspark;        /* V4.1 DSpark blocks bound (§4.5) */
    int32_t mtp_from_nextn;    /* MTP read from llama.cpp nextn tensors (docs §4.1) */
    int32_t draft_file;        /* draft blocks bound from a second file (opt draft_path) */
    int32_t mtp_hc_from_trunk; /* llama.cpp file with MTP inside: the MTP head uses the
                                  trunk's output_hc_* (llama.cpp's semantics, docs §4.1) */
    dsii_layer_hparams draft_layer[DSII_MAX_DRAFT];
    dsii_dspark_hparams dspark;
    /* Engram (§4.6) */
    int32_t has_engram;
    dsii_engram_hparams engram;
    /* file dialect (lib/model/layout.h): which spellings the metadata used */
    int32_t key_dialect;       /* DSII_LAYOUT_NATIVE, or DSII_LAYOUT_DS4 for ds4 deepseek41 */
    int32_t rope_type_defaulted; /* rope.scaling.type absent, YaRN assumed (logged) */
} dsii_hparams;

/* ------------------------------------------------------------------------------------ */
/* The model handle                                                                       */
/* ------------------------------------------------------------------------------------ */

/* Slots of the per-type byte counters: ggml ids 0..DSII_TYPE_SLOTS_GGML-1 map to
 * themselves, the FP8 extension ids 1024.. to the slots after them. */
#define DSII_TYPE_SLOTS_GGML 64
#define DSII_TYPE_SLOTS (DSII_TYPE_SLOTS_GGML + 3)

struct dsi_model {
    dsi_context *ctx;               /* owning context (its n_models counts this model) */
    dsii_gguf *gguf;                /* reader kept alive: names, metadata, the file */
    dsii_gguf *draft_gguf;          /* second file with the draft blocks, or NULL (§4.3) */
    int32_t access;                 /* DSI_ACCESS_* actually used */
    uint32_t load_flags;            /* DSI_MODEL_FLAG_* it was loaded with */
    char name[128];                 /* general.name */
    dsii_hparams hp;
    dsii_model_tensors w;
    dsii_tensor *tensors;           /* every bound tensor (+ views), model-owned */
    uint32_t n_tensors;
    uint32_t n_ignored;             /* vision tensors skipped (docs §5) */
    dsii_bigbuf weights_buf;        /* PREAD / READER: the resident weights (huge pages) */
    uint64_t weights_buf_size;
    void *hp_arrays;                /* engram multipliers/primes/offsets/token_map storage */
    struct dsii_tokenizer *tokenizer; /* built from the GGUF at load; NULL only while the
                                         tokenizer module is absent */
    atomic_int n_sessions;          /* live sessions; dsi_model_free is BUSY while > 0 */
    atomic_int n_detokenizers;      /* live detokenizers; likewise (docs/api.md "Lifetimes") */
    atomic_flag error_lock;         /* guards last_error (written by failing thread-safe
                                       calls, read by dsi_model_last_error) */
    dsii_error last_error;
    uint8_t fingerprint[32];        /* hash of arch + hparams + tensor names/types/shapes */
    uint64_t n_params;              /* elements of all bound tensors (views excluded) */
    uint64_t weight_bytes;          /* bytes of all bound tensors as stored */
    uint64_t type_bytes[DSII_TYPE_SLOTS]; /* weight_bytes split by tensor type */
    /* The execution side of the model (lib/arch/exec.c), created at load: the weight table
     * bound on the context's compute device (one device copy per model on GPU backends, the
     * mmapped bytes wrapped in place on the CPU), the state pools of its sessions and the
     * step scheduler. Freed by exec_free at destroy. NULL for architectures without a
     * forward pass. */
    struct dsii_exec *exec;
    void (*exec_free)(dsi_model *m);
    /* Memory tiers (lib/place): the placement plan made at load, NULL when the loader was
     * not asked for one (every tensor resident). */
    struct dsii_place *place;
    /* Routing counts (dsi_model_expert_counts): [counts_layers][counts_experts] over the
     * backbone's layers, bumped by lib/moe where the ids are on the host; NULL for a model
     * without routed experts. */
    _Atomic uint64_t *expert_counts;
    uint32_t counts_layers, counts_experts;
};

/* ---- loading (lib/model/model_load.c) -------------------------------------------------- */

/* Loads from an already opened file (ownership of `file` passes to the call in every case).
 * `opt` has been validated by the API layer (access mode is taken from the file). The model
 * registers itself in ctx->n_models. On failure *out is NULL and `err` says why. */
dsi_status dsii_model_load_file(dsi_context *ctx, dsii_file *file, const dsi_model_options *opt,
                                dsi_model **out, dsii_error *err);

/* Reads and checks the hyperparameters only (used by the loader and by tests). `hp` is
 * filled; engram arrays are allocated into *arrays (free with dsii_free(ctx, *arrays)). */
dsi_status dsii_hparams_load(const dsi_context *ctx, const dsii_gguf *g, dsii_hparams *hp,
                             void **arrays, dsii_error *err);

/* Adds the draft blocks of a second file `dg` (dsi_model_options.draft_path, docs §4.3) to
 * hparams already loaded from the model file `g`: checks the architecture, finds the draft
 * form (llama.cpp's MTP file blk.L.* + blk.L.nextn.*, or mtp.i.*), sets n_draft and the draft
 * layers. `path` is for messages. */
dsi_status dsii_hparams_draft_file(const dsii_gguf *dg, const char *path, dsii_hparams *hp,
                                   const dsii_gguf *g, dsii_error *err);

/* Frees everything (no session check). NULL accepted. */
void dsii_model_destroy(dsi_model *m);

/* ---- queries ----------------------------------------------------------------------------- */

/* Bound tensor by GGUF name, or NULL. [thread-safe] */
const dsii_tensor *dsii_model_find_tensor(const dsi_model *m, const char *name);

/* Copies `len` bytes at byte `offset` of tensor `t` into `dst` — works for lazy tensors
 * (Engram tables in pread / reader mode) and resident ones alike. [thread-safe] */
dsi_status dsii_model_tensor_read(const dsi_model *m, const dsii_tensor *t, uint64_t offset,
                                  uint64_t len, void *dst, dsii_error *err);

/* DSI_OK, or IO when the model was loaded with DSI_MODEL_FLAG_VERIFY_FILE and its file has
 * been truncated or modified in place since (sessions call it before every evaluation step).
 * [thread-safe] */
dsi_status dsii_model_check_file(const dsi_model *m, dsii_error *err);

/* Counter slot of a type id, or -1. */
int dsii_model_type_slot(int32_t type);

/* Session accounting for lib/api/session.c: acquire when a session is created, release when
 * it is freed. dsi_model_free refuses (BUSY) while the count is > 0. */
static inline void dsii_model_session_acquire(dsi_model *m) {
    atomic_fetch_add_explicit(&m->n_sessions, 1, memory_order_acq_rel);
}
static inline void dsii_model_session_release(dsi_model *m) {
    atomic_fetch_sub_explicit(&m->n_sessions, 1, memory_order_acq_rel);
}

/* Records `e` as the model's last error (and the thread's). Returns e->status. */
dsi_status dsii_model_fail(dsi_model *m, const dsii_error *e);
/* Copies the model's last error message into `out` under the error lock. */
void dsii_model_error_copy(const dsi_model *m, char out[DSII_ERROR_MSG_MAX]);

#endif /* DSI_MODEL_MODEL_H */
