/* lib/place/place.c — the placement planner and its query (place.h, docs/placement.md). */
#define DSI_EXPERIMENTAL
#include "place/place.h"

#include "arch/arch.h"
#include "base/context_impl.h"
#include "model/model.h"
#include "moe/moe.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#if !defined(_WIN32)
#include <unistd.h>
#endif

_Static_assert(DSI_PLACE_AUTO == DSII_PLACE_AUTO && DSI_PLACE_ALL_RESIDENT == DSII_PLACE_ALL_RESIDENT &&
                   DSI_PLACE_EXPERTS_HOST == DSII_PLACE_EXPERTS_HOST &&
                   DSI_PLACE_EXPERTS_STREAMED == DSII_PLACE_EXPERTS_STREAMED,
               "policy values");
_Static_assert(DSI_TIER_DEVICE == DSII_TIER_DEVICE && DSI_TIER_HOST == DSII_TIER_HOST &&
                   DSI_TIER_DISK == DSII_TIER_DISK,
               "tier values");
_Static_assert(DSI_CACHE_LRU == DSII_CACHE_LRU && DSI_CACHE_LFU == DSII_CACHE_LFU, "cache values");
_Static_assert(DSI_PLACE_MAX_CLASSES == DSII_PC_COUNT, "classes");

#define TRY(x)                                                                               \
    do {                                                                                     \
        dsi_status t_ = (x);                                                                 \
        if (t_ != DSI_OK) return t_;                                                         \
    } while (0)

static const char *const k_class_names[DSII_PC_COUNT] = {
    "embeddings", "attention", "router", "experts", "shared_experts", "engram", "draft", "other"};
static const char *const k_tier_names[3] = {"device", "host", "disk"};

DSI_API void dsi_place_options_init(dsi_place_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
}

DSI_API void dsi_place_info_init(dsi_place_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

/* ---- glob patterns ------------------------------------------------------------------------ */

/* '*' any run, '?' one character, '[a-z0-9]' a class ('!' or '^' first negates). */
static int glob_match(const char *p, const char *pe, const char *s) {
    while (p < pe) {
        if (*p == '*') {
            while (p < pe && *p == '*') p++;
            if (p == pe) return 1;
            for (; *s; s++)
                if (glob_match(p, pe, s)) return 1;
            return 0;
        }
        if (!*s) return 0;
        if (*p == '?') {
            p++;
            s++;
            continue;
        }
        if (*p == '[') {
            const char *q = p + 1;
            int neg = 0, ok = 0;
            if (q < pe && (*q == '!' || *q == '^')) {
                neg = 1;
                q++;
            }
            const char *start = q;
            while (q < pe && (*q != ']' || q == start)) {
                if (q + 2 < pe && q[1] == '-' && q[2] != ']') {
                    if ((unsigned char)*s >= (unsigned char)q[0] && (unsigned char)*s <= (unsigned char)q[2]) ok = 1;
                    q += 3;
                } else {
                    if (*s == *q) ok = 1;
                    q++;
                }
            }
            if (q >= pe) return 0; /* unterminated: the parser refused it */
            if (ok == neg) return 0;
            p = q + 1;
            s++;
            continue;
        }
        if (*p != *s) return 0;
        p++;
        s++;
    }
    return *s == '\0';
}

typedef struct ovr {
    const char *pat, *pe;
    int tier;
} ovr;

#define MAX_OVR 32

static dsi_status parse_overrides(const char *s, ovr *out, int *n, dsii_error *e) {
    *n = 0;
    if (!s) return DSI_OK;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *eq = NULL;
        for (const char *q = p; q < end; q++)
            if (*q == '=') eq = q;
        if (!eq || eq == p)
            return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                             "dsi_place_options.overrides: entry '%.*s' is not PATTERN=TIER", (int)(end - p), p);
        int tier = -1;
        for (int t = 0; t < 3; t++)
            if ((size_t)(end - eq - 1) == strlen(k_tier_names[t]) &&
                memcmp(eq + 1, k_tier_names[t], strlen(k_tier_names[t])) == 0)
                tier = t;
        if (tier < 0)
            return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                             "dsi_place_options.overrides: tier '%.*s' is not device, host or disk",
                             (int)(end - eq - 1), eq + 1);
        int depth = 0;
        for (const char *q = p; q < eq; q++) {
            if (*q == '[') depth++;
            else if (*q == ']' && depth) depth--;
        }
        if (depth)
            return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                             "dsi_place_options.overrides: pattern '%.*s' has an unterminated '['",
                             (int)(eq - p), p);
        if (*n >= MAX_OVR)
            return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT, "dsi_place_options.overrides: more than %d entries",
                             MAX_OVR);
        out[*n].pat = p;
        out[*n].pe = eq;
        out[*n].tier = tier;
        (*n)++;
        p = *end ? end + 1 : end;
    }
    return DSI_OK;
}

/* ---- classes --------------------------------------------------------------------------------- */

static void set_cls(const dsi_model *m, uint8_t *cls, const dsii_tensor *t, int c) {
    if (t) cls[t - m->tensors] = (uint8_t)c;
}

static void classify_layer(const dsi_model *m, uint8_t *cls, const dsii_layer_tensors *T, int draft) {
    const dsii_tensor *attn[] = {T->attn_q_a, T->attn_q_a_norm, T->attn_q_b, T->attn_kv,
                                 T->attn_kv_norm, T->attn_sinks, T->attn_out_a, T->attn_out_b,
                                 T->hc_attn_fn, T->hc_attn_base, T->hc_attn_scale, T->hc_ffn_fn,
                                 T->hc_ffn_base, T->hc_ffn_scale, T->comp_ape, T->comp_kv,
                                 T->comp_gate, T->comp_norm, T->idx_q_b, T->idx_proj,
                                 T->idx_comp_ape, T->idx_comp_kv, T->idx_comp_gate,
                                 T->idx_comp_norm, T->idx_k, T->idx_k_norm};
    const dsii_tensor *router[] = {T->ffn_gate_inp, T->exp_probs_b, T->exp_probs_b_vl, T->tid2eid};
    const dsii_tensor *shared[] = {T->ffn_gate_shexp, T->ffn_up_shexp, T->ffn_down_shexp};
    const dsii_tensor *engram[] = {T->engram_embd, T->engram_wkv, T->engram_q, T->engram_k};
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) set_cls(m, cls, attn[i], draft ? DSII_PC_DRAFT : DSII_PC_ATTN);
    for (size_t i = 0; i < sizeof router / sizeof router[0]; i++) set_cls(m, cls, router[i], draft ? DSII_PC_DRAFT : DSII_PC_ROUTER);
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) set_cls(m, cls, shared[i], draft ? DSII_PC_DRAFT : DSII_PC_SHARED);
    for (size_t i = 0; i < sizeof engram / sizeof engram[0]; i++) set_cls(m, cls, engram[i], DSII_PC_ENGRAM);
    set_cls(m, cls, T->ffn_gate_exps, draft ? DSII_PC_DRAFT : DSII_PC_EXPERTS);
    set_cls(m, cls, T->ffn_up_exps, draft ? DSII_PC_DRAFT : DSII_PC_EXPERTS);
    set_cls(m, cls, T->ffn_down_exps, draft ? DSII_PC_DRAFT : DSII_PC_EXPERTS);
    if (draft) {
        set_cls(m, cls, T->attn_norm, DSII_PC_DRAFT);
        set_cls(m, cls, T->ffn_norm, DSII_PC_DRAFT);
    }
}

static uint64_t al64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* Bytes of one expert's slice of a [in, out, E] expert tensor. */
static uint64_t expert_slice(const dsii_tensor *t) { return (uint64_t)t->ne[1] * t->row_stride; }

static uint64_t phys_half(void) {
#if !defined(_WIN32)
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) return (uint64_t)pages * (uint64_t)psz / 2;
#endif
    return (uint64_t)8 << 30;
}

/* ---- the plan --------------------------------------------------------------------------------- */

/* The m most often routed of E experts by the profile row c (ties: the lower id) into
 * out[0..m), ascending. */
static void pick_hot(const uint64_t *c, uint32_t E, uint32_t m, uint32_t *out) {
    uint8_t taken[65536 / 8] = {0};
    if (E > 65536) E = 65536;
    if (m > E) m = E;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t x = 0; x < E; x++)
            if (!(taken[x >> 3] & (1u << (x & 7))) && (best == UINT32_MAX || c[x] > c[best])) best = x;
        taken[best >> 3] |= (uint8_t)(1u << (best & 7));
    }
    for (uint32_t x = 0, i = 0; x < E && i < m; x++)
        if (taken[x >> 3] & (1u << (x & 7))) out[i++] = x;
}

void dsii_place_free(dsi_model *m) {
    dsii_place *pl = m ? m->place : NULL;
    if (!pl) return;
    dsii_free(m->ctx, pl->tier);
    dsii_free(m->ctx, pl->cls);
    dsii_free(m->ctx, pl->dev_ids);
    dsii_free(m->ctx, pl->profile);
    dsii_free(m->ctx, pl);
    m->place = NULL;
}

dsi_status dsii_place_plan(dsi_model *m, const void *popt, dsii_error *e) {
    dsi_place_options o;
    dsi_place_options_init(&o);
    dsi_status st = dsii_read_options(&o, sizeof o, popt, "dsi_place_options", e);
    if (st != DSI_OK) return st;
    if (o.policy > DSI_PLACE_EXPERTS_STREAMED)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_place_options.policy %u is not DSI_PLACE_AUTO, _ALL_RESIDENT, _EXPERTS_HOST or _EXPERTS_STREAMED",
                         o.policy);
    if (o.cache_policy > DSI_CACHE_LFU)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_place_options.cache_policy %u is not DSI_CACHE_LRU or DSI_CACHE_LFU", o.cache_policy);
    if (o.hybrid > DSI_HYBRID_AUTO)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_place_options.hybrid %u is not DSI_HYBRID_CPU, DSI_HYBRID_UPLOAD or DSI_HYBRID_AUTO",
                         o.hybrid);
    if (o.hybrid == DSI_HYBRID_AUTO && o.device_experts)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_place_options.device_experts is for DSI_HYBRID_CPU (DSI_HYBRID_AUTO keeps an expert "
                         "cache on the GPU instead)");
    const uint32_t known_flags = DSI_PLACE_FLAG_NO_PREFETCH | DSI_PLACE_FLAG_DIRECT_IO;
    if (o.flags & ~known_flags)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT, "dsi_place_options.flags has unknown bits 0x%x",
                         o.flags & ~known_flags);
    if ((o.flags & DSI_PLACE_FLAG_DIRECT_IO) && m->access != DSI_ACCESS_PREAD)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "DSI_PLACE_FLAG_DIRECT_IO needs a model loaded from a path with DSI_ACCESS_PREAD");
    const uint64_t n_counts = (uint64_t)m->counts_layers * m->counts_experts;
    if (o.expert_counts && o.n_expert_counts != n_counts)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_place_options.n_expert_counts %" PRIu64 " is not the model's n_layers x n_experts = %u x %u"
                         " (dsi_model_expert_counts of this model)",
                         o.n_expert_counts, m->counts_layers, m->counts_experts);
    if (!o.expert_counts && o.n_expert_counts)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_place_options.expert_counts is NULL with n_expert_counts %" PRIu64, o.n_expert_counts);
    ovr ov[MAX_OVR];
    int n_ov = 0;
    TRY(parse_overrides(o.overrides, ov, &n_ov, e));

    dsii_place *pl = dsii_calloc(m->ctx, 1, sizeof *pl);
    if (!pl) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    m->place = pl;
    uint32_t nt = m->n_tensors ? m->n_tensors : 1;
    pl->tier = dsii_calloc(m->ctx, nt, 1);
    pl->cls = dsii_calloc(m->ctx, nt, 1);
    if (!pl->tier || !pl->cls) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    pl->cache_policy = o.cache_policy;
    pl->flags = o.flags;
    if (o.expert_counts && n_counts) {
        if (!(pl->profile = dsii_malloc(m->ctx, (size_t)n_counts * sizeof *pl->profile)))
            return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        memcpy(pl->profile, o.expert_counts, (size_t)n_counts * sizeof *pl->profile);
        pl->profile_stride = m->counts_experts;
    }
    pl->hybrid = o.hybrid;
    pl->hybrid_rows = o.hybrid_rows ? o.hybrid_rows : 16;
    const dsii_device *dev = m->ctx ? dsii_context_compute(m->ctx) : NULL;
    pl->cpu_compute = !dev || strcmp(dev->name, "cpu") == 0;
    pl->host_budget = o.host_budget ? o.host_budget : phys_half();
    pl->device_budget = o.device_budget ? o.device_budget
                        : pl->cpu_compute ? pl->host_budget
                        : dev->desc.memory_free ? dev->desc.memory_free : dev->desc.memory_total;

    /* classes */
    const dsii_hparams *hp = &m->hp;
    for (uint32_t i = 0; i < m->n_tensors; i++) pl->cls[i] = DSII_PC_OTHER;
    set_cls(m, pl->cls, m->w.token_embd, DSII_PC_EMBED);
    set_cls(m, pl->cls, m->w.output, DSII_PC_EMBED);
    for (uint32_t l = 0; l < hp->n_layer; l++) classify_layer(m, pl->cls, &m->w.layer[l], 0);
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        const dsii_draft_tensors *dt = &m->w.draft[d];
        classify_layer(m, pl->cls, &dt->blk, 1);
        const dsii_tensor *x[] = {dt->e_proj, dt->h_proj, dt->enorm, dt->hnorm, dt->norm,
                                  dt->hc_head_fn, dt->hc_head_base, dt->hc_head_scale, dt->main_proj,
                                  dt->main_norm, dt->markov_embd, dt->markov_head, dt->confidence};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) set_cls(m, pl->cls, x[i], DSII_PC_DRAFT);
    }

    /* tiers: the defaults */
    const int mmap = m->access == DSI_ACCESS_MMAP;
    const int resident_flag = (m->load_flags & DSI_MODEL_FLAG_RESIDENT) != 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) pl->tier[i] = m->tensors[i].lazy ? DSII_TIER_DISK : DSII_TIER_DEVICE;
    uint32_t policy = o.policy;
    if (policy == DSII_PLACE_AUTO) {
        /* all resident when it fits: owned bytes (pread / reader) vs the host budget, device
         * copies vs the device budget; else the routed experts leave the device: into host
         * RAM next to a GPU when they fit there (mapped, or owned within the host budget),
         * else to the disk tier */
        uint64_t owned = 0, experts = 0;
        for (uint32_t i = 0; i < m->n_tensors; i++)
            if (!m->tensors[i].is_view && !m->tensors[i].lazy) owned += al64(m->tensors[i].nbytes);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const dsii_layer_tensors *T = &m->w.layer[l];
            const dsii_tensor *x[3] = {T->ffn_gate_exps, T->ffn_up_exps, T->ffn_down_exps};
            for (int j = 0; j < 3; j++)
                if (x[j] && !x[j]->lazy) experts += al64(x[j]->nbytes);
        }
        int host_fits = mmap || owned <= pl->host_budget;
        int fits = host_fits && (pl->cpu_compute || owned <= pl->device_budget);
        if (fits || resident_flag) policy = DSII_PLACE_ALL_RESIDENT;
        else if (!pl->cpu_compute && host_fits && owned - experts <= pl->device_budget) policy = DSII_PLACE_EXPERTS_HOST;
        else policy = DSII_PLACE_EXPERTS_STREAMED;
    }
    pl->policy = policy;
    if (policy == DSII_PLACE_EXPERTS_STREAMED || (policy == DSII_PLACE_EXPERTS_HOST && !pl->cpu_compute))
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const dsii_layer_tensors *T = &m->w.layer[l];
            const dsii_tensor *x[3] = {T->ffn_gate_exps, T->ffn_up_exps, T->ffn_down_exps};
            for (int j = 0; j < 3; j++)
                if (x[j]) pl->tier[x[j] - m->tensors] = policy == DSII_PLACE_EXPERTS_HOST ? DSII_TIER_HOST : DSII_TIER_DISK;
        }
    /* overrides: first matching pattern wins */
    for (uint32_t i = 0; i < m->n_tensors && n_ov; i++) {
        const dsii_tensor *t = &m->tensors[i];
        if (t->is_view) continue;
        for (int k = 0; k < n_ov; k++) {
            if (!glob_match(ov[k].pat, ov[k].pe, t->name)) continue;
            int tier = ov[k].tier;
            if (tier == DSII_TIER_HOST && pl->cpu_compute) tier = DSII_TIER_DEVICE; /* one memory */
            int table = 0;
            for (uint32_t g = 0; g < hp->engram.n_layer && !table; g++) {
                uint32_t l = hp->engram.layer_ids[g];
                if (l < hp->n_layer && m->w.layer[l].engram_embd == t) table = 1;
            }
            if (tier == DSII_TIER_DISK && pl->cls[i] != DSII_PC_EXPERTS && !table)
                return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_place_options.overrides: '%.*s=disk' matches tensor '%s' (class %s); the disk tier "
                                 "holds routed experts and Engram tables only",
                                 (int)(ov[k].pe - ov[k].pat), ov[k].pat, t->name, k_class_names[pl->cls[i]]);
            if (tier == DSII_TIER_HOST && table) tier = DSII_TIER_DEVICE; /* rows are gathered on the host */
            if (tier == DSII_TIER_HOST && pl->cls[i] != DSII_PC_EXPERTS)
                return dsii_fail(e, DSI_ERR_UNSUPPORTED,
                                 "dsi_place_options.overrides: '%.*s=host' matches tensor '%s' (class %s); next to "
                                 "%s only routed experts and Engram tables can be placed in host RAM",
                                 (int)(ov[k].pe - ov[k].pat), ov[k].pat, t->name, k_class_names[pl->cls[i]],
                                 dev->name);
            if (tier == DSII_TIER_DISK && resident_flag)
                return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_place_options: tensor '%s' in the disk tier, but DSI_MODEL_FLAG_RESIDENT "
                                 "closes the file at load", t->name);
            pl->tier[i] = (uint8_t)tier;
            break;
        }
    }
    if (pl->policy == DSII_PLACE_EXPERTS_STREAMED && resident_flag)
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "DSI_PLACE_EXPERTS_STREAMED reads experts from the file, but DSI_MODEL_FLAG_RESIDENT "
                         "closes it at load");
    /* the routed experts of a layer share one tier (one cache slot holds an expert's three
     * slices) */
    pl->max_k = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const dsii_layer_tensors *T = &m->w.layer[l];
        const dsii_tensor *x[3] = {T->ffn_gate_exps, T->ffn_up_exps, T->ffn_down_exps};
        if (!x[0] || !x[1] || !x[2]) continue;
        int t0 = pl->tier[x[0] - m->tensors];
        for (int j = 1; j < 3; j++)
            if (pl->tier[x[j] - m->tensors] != t0)
                return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_place_options.overrides: the routed experts of layer %u ('%s', '%s', '%s') "
                                 "must share one tier", l, x[0]->name, x[1]->name, x[2]->name);
        if (t0 == DSII_TIER_DEVICE) continue;
        if (l >= 128) return dsii_fail(e, DSI_ERR_UNSUPPORTED, "layer %u: too many layers for the expert tier", l);
        pl->layer_streamed[l] = 1;
        pl->layer_host[l] = t0 == DSII_TIER_HOST;
        pl->n_tiered_layers++;
        uint64_t u = al64(expert_slice(x[0])) + al64(expert_slice(x[1])) + al64(expert_slice(x[2]));
        if (u > pl->expert_unit_bytes) pl->expert_unit_bytes = u;
        pl->n_experts_tiered += hp->layer[l].n_expert;
        if (t0 == DSII_TIER_DISK) pl->n_experts_streamed += hp->layer[l].n_expert;
        if (hp->layer[l].n_expert_used > pl->max_k) pl->max_k = hp->layer[l].n_expert_used;
    }
    if (pl->cpu_compute || !pl->n_tiered_layers) pl->hybrid = 0;
    /* Engram tables: disk <-> resident by the tier (lazy reads work in every access mode) */
    for (uint32_t g = 0; g < hp->engram.n_layer; g++) {
        uint32_t l = hp->engram.layer_ids[g];
        const dsii_tensor *t = l < hp->n_layer ? m->w.layer[l].engram_embd : NULL;
        if (!t) continue;
        dsii_tensor *mt = &m->tensors[t - m->tensors];
        mt->lazy = pl->tier[t - m->tensors] == DSII_TIER_DISK;
    }
    /* streamed experts stay in the file (pread / reader: never read at load) */
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (!pl->layer_streamed[l] || pl->layer_host[l]) continue; /* the host tier is read at load */
        const dsii_layer_tensors *T = &m->w.layer[l];
        const dsii_tensor *x[3] = {T->ffn_gate_exps, T->ffn_up_exps, T->ffn_down_exps};
        for (int j = 0; j < 3; j++)
            if (!mmap) m->tensors[x[j] - m->tensors].lazy = 1;
    }
    /* the Engram row cache covers the disk-tier tables */
    for (uint32_t g = 0; g < hp->engram.n_layer; g++) {
        uint32_t l = hp->engram.layer_ids[g];
        const dsii_tensor *t = l < hp->n_layer ? m->w.layer[l].engram_embd : NULL;
        if (t && t->lazy) pl->n_engram_disk++;
    }
    pl->engram_cache_bytes = pl->n_engram_disk ? o.engram_cache_bytes : 0;
    /* views follow their parents */
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dsii_tensor *t = &m->tensors[i];
        uint64_t b = t->is_view ? 0 : t->nbytes;
        int tier = pl->tier[i];
        int c = pl->cls[i];
        if (!t->is_view) pl->class_tensors[c]++;
        pl->class_bytes[c][tier] += b;
        if (tier == DSII_TIER_DISK) pl->disk_bytes += b;
        else if (tier == DSII_TIER_HOST) pl->host_bytes += b;
        else pl->device_bytes += b;
        if (tier != DSII_TIER_DISK && !t->is_view) {
            if (mmap) pl->mapped_bytes += b;
            else pl->owned_bytes += al64(b);
        }
    }
    /* budgets */
    if (pl->owned_bytes > pl->host_budget)
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY,
                         "placement: the resident weights need %" PRIu64 " bytes of host memory, the host budget is %" PRIu64
                         " (stream the routed experts: DSI_PLACE_EXPERTS_STREAMED, or DSI_ACCESS_MMAP)",
                         pl->owned_bytes, pl->host_budget);
    if (pl->engram_cache_bytes > pl->host_budget - pl->owned_bytes)
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY,
                         "placement: the resident weights (%" PRIu64 " bytes) and the Engram row cache (%" PRIu64
                         ") exceed the host budget %" PRIu64,
                         pl->owned_bytes, pl->engram_cache_bytes, pl->host_budget);
    if (!pl->cpu_compute && pl->device_bytes > pl->device_budget)
        return dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                         "placement: the weights need %" PRIu64 " bytes on %s, the device budget is %" PRIu64
                         " (place the routed experts in host RAM or on disk: DSI_PLACE_EXPERTS_HOST or "
                         "_EXPERTS_STREAMED, or overrides)",
                         pl->device_bytes, dev->name, pl->device_budget);
    if (!pl->cpu_compute && pl->n_tiered_layers && (pl->hybrid == DSII_HYBRID_UPLOAD || pl->hybrid == DSII_HYBRID_AUTO)) {
        /* an expert cache on the GPU: what the budget leaves after the resident weights, at
         * least k slots, at most every tiered expert; disk reads go through one host staging
         * piece per reader (DSII_XTIER_STAGES) */
        uint64_t avail = pl->device_budget - pl->device_bytes;
        uint64_t need = (uint64_t)pl->max_k * pl->expert_unit_bytes;
        if (avail < need)
            return dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                             "placement: an expert cache on %s needs at least %" PRIu64 " bytes (%u slots of %" PRIu64
                             ") beside the resident weights (%" PRIu64 "), the device budget is %" PRIu64
                             " (or use DSI_HYBRID_CPU)",
                             dev->name, need, pl->max_k, pl->expert_unit_bytes, pl->device_bytes, pl->device_budget);
        uint64_t fixed = 0, per_slot = 0;
        dsii_xtier_cost(pl->n_experts_tiered, &fixed, &per_slot);
        fixed += pl->n_experts_streamed ? (uint64_t)DSII_XTIER_STAGES * (DSII_XTIER_PIECE + 2 * DSII_XTIER_DIO_ALIGN) : 0;
        uint64_t slots = avail / pl->expert_unit_bytes;
        if (slots > pl->n_experts_tiered) slots = pl->n_experts_tiered;
        if (slots > (1u << 20)) slots = 1u << 20;
        uint64_t hfree = pl->host_budget - pl->owned_bytes - pl->engram_cache_bytes;
        if (hfree < fixed + slots * per_slot)
            return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY,
                             "placement: the expert tier's bookkeeping needs %" PRIu64 " bytes of host memory beside "
                             "the resident weights (%" PRIu64 "), the host budget is %" PRIu64,
                             fixed + slots * per_slot, pl->owned_bytes, pl->host_budget);
        pl->cache_on_device = 1;
        pl->tier_fixed = fixed;
        pl->cache_slots = (uint32_t)slots;
        pl->cache_bytes = slots * pl->expert_unit_bytes;
        pl->tier_bytes = fixed + slots * per_slot;
    } else if (pl->n_experts_streamed) {
        uint64_t avail = pl->host_budget - pl->owned_bytes - pl->engram_cache_bytes;
        uint64_t fixed = 0, per_slot = 0;
        dsii_xtier_cost(pl->n_experts_tiered, &fixed, &per_slot);
        if (pl->flags & DSII_PLACE_FLAG_DIRECT_IO) /* aligned bounce pieces */
            fixed += (uint64_t)DSII_XTIER_STAGES * (DSII_XTIER_PIECE + 2 * DSII_XTIER_DIO_ALIGN);
        uint64_t need = fixed + (uint64_t)pl->max_k * (pl->expert_unit_bytes + per_slot);
        if (avail < need)
            return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY,
                             "placement: streaming experts needs at least %" PRIu64 " bytes of host memory (resident "
                             "weights %" PRIu64 " + %u expert slots of %" PRIu64 " + %" PRIu64 " of bookkeeping), "
                             "the host budget is %" PRIu64,
                             pl->owned_bytes + need, pl->owned_bytes, pl->max_k, pl->expert_unit_bytes, fixed,
                             pl->host_budget);
        pl->tier_fixed = fixed;
        uint64_t slots = (avail - fixed) / (pl->expert_unit_bytes + per_slot);
        if (slots > pl->n_experts_streamed) slots = pl->n_experts_streamed;
        if (slots > (1u << 20)) slots = 1u << 20;
        pl->cache_slots = (uint32_t)slots;
        pl->cache_bytes = slots * pl->expert_unit_bytes;
        pl->tier_bytes = fixed + slots * per_slot;
    }
    if (!pl->cpu_compute && pl->n_tiered_layers && pl->hybrid == DSII_HYBRID_CPU && o.device_experts) {
        /* nd experts of every tiered layer on the GPU: what the device budget leaves,
         * or the number asked for (at most the smallest layer's experts) */
        uint32_t emin = UINT32_MAX;
        for (uint32_t l = 0; l < hp->n_layer && l < 128; l++)
            if (pl->layer_streamed[l] && hp->layer[l].n_expert < emin) emin = hp->layer[l].n_expert;
        uint64_t per = (uint64_t)pl->n_tiered_layers * pl->expert_unit_bytes; /* one expert per layer */
        uint64_t avail = pl->device_budget - pl->device_bytes;
        uint64_t nd = o.device_experts == DSI_DEVICE_EXPERTS_AUTO ? (per ? avail / per : 0) : o.device_experts;
        if (nd > emin) nd = emin;
        if (nd * per > avail)
            return dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                             "placement: %u experts of each of %u tiered layers on %s need %" PRIu64
                             " bytes beside the resident weights (%" PRIu64 "), the device budget is %" PRIu64,
                             (unsigned)nd, pl->n_tiered_layers, dev->name, nd * per, pl->device_bytes, pl->device_budget);
        pl->dev_experts = (uint32_t)nd;
        pl->dev_split_bytes = nd * per;
        if (nd && o.expert_counts) {
            /* the routing profile: each tiered layer's nd most often routed experts (ties: the
             * lower id), kept in ascending id order */
            if (!(pl->dev_ids = dsii_calloc(m->ctx, (size_t)128 * nd, sizeof *pl->dev_ids)))
                return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
            for (uint32_t l = 0; l < hp->n_layer && l < 128; l++)
                if (pl->layer_streamed[l])
                    pick_hot(o.expert_counts + (uint64_t)l * m->counts_experts, hp->layer[l].n_expert,
                             (uint32_t)nd, pl->dev_ids + (size_t)l * nd);
        }
    }
    if (!pl->cpu_compute && pl->n_tiered_layers && !pl->tier_bytes) {
        /* hybrid CPU over host-tier layers only: no cache, the tier's maps */
        uint64_t fixed = 0, per_slot = 0;
        dsii_xtier_cost(pl->n_experts_tiered, &fixed, &per_slot);
        if (pl->host_budget - pl->owned_bytes - pl->engram_cache_bytes < fixed)
            return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY,
                             "placement: the expert tier's bookkeeping needs %" PRIu64 " bytes of host memory beside "
                             "the resident weights (%" PRIu64 "), the host budget is %" PRIu64,
                             fixed, pl->owned_bytes, pl->host_budget);
        pl->tier_fixed = pl->tier_bytes = fixed;
    }
    if (pl->engram_cache_bytes)
        dsii_log(m->ctx, DSI_LOG_INFO, "placement: Engram row cache %" PRIu64 " bytes over %u tables",
                 pl->engram_cache_bytes, pl->n_engram_disk);
    atomic_store(&pl->host_used, pl->owned_bytes);
    atomic_store(&pl->host_peak, pl->owned_bytes);
    dsii_log(m->ctx, DSI_LOG_INFO,
             "placement: policy %u, %u streamed experts, cache %u slots (%" PRIu64 " bytes), owned %" PRIu64
             ", mapped %" PRIu64 ", disk %" PRIu64,
             pl->policy, pl->n_experts_streamed, pl->cache_slots, pl->cache_bytes, pl->owned_bytes,
             pl->mapped_bytes, pl->disk_bytes);
    return DSI_OK;
}

void dsii_place_count_step(dsi_model *m) {
    if (m && m->place) atomic_fetch_add_explicit(&m->place->steps, 1, memory_order_relaxed);
}

DSI_API dsi_status dsi_model_place_info(const dsi_model *model, dsi_place_info *info) {
    if (!model || !info)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_place_info: %s is NULL",
                                !model ? "model" : "info");
    if (info->struct_size < 8 || info->struct_size > sizeof *info)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_place_info.struct_size %u is invalid (use dsi_place_info_init)",
                                info->struct_size);
    dsi_place_info f;
    dsi_place_info_init(&f);
    const dsii_place *pl = model->place;
    if (pl) {
        f.policy = pl->policy;
        f.device_budget = pl->device_budget;
        f.host_budget = pl->host_budget;
        f.device_bytes = pl->device_bytes;
        f.host_bytes = pl->owned_bytes + (pl->cache_on_device ? 0 : pl->cache_bytes) + pl->tier_bytes +
                       pl->engram_cache_bytes;
        f.hybrid = pl->hybrid;
        f.device_experts_per_layer = pl->dev_experts;
        f.overlap_cpu_ns = atomic_load(&((dsii_place *)(uintptr_t)pl)->overlap_cpu_ns);
        f.overlap_wait_ns = atomic_load(&((dsii_place *)(uintptr_t)pl)->overlap_wait_ns);
        f.expert_cache_tier = pl->cache_on_device ? DSI_TIER_DEVICE : DSI_TIER_HOST;
        if (model->exec) {
            const dsii_exec *ex = model->exec;
            f.device_weight_bytes = ex->wt.bytes + (pl->cache_on_device ? pl->cache_bytes : 0) + pl->dev_split_bytes;
            if (ex->dev && ex->dev->be->memory_used) f.device_used = ex->dev->be->memory_used(ex->dev->inst);
        }
        f.engram_cache_bytes = pl->engram_cache_bytes;
        f.engram_hits = atomic_load(&((dsii_place *)(uintptr_t)pl)->engram_hits);
        f.engram_misses = atomic_load(&((dsii_place *)(uintptr_t)pl)->engram_misses);
        f.engram_bytes_read = atomic_load(&((dsii_place *)(uintptr_t)pl)->engram_bytes_read);
        f.disk_bytes = pl->disk_bytes;
        f.mapped_bytes = pl->mapped_bytes;
        f.expert_cache_bytes = pl->cache_bytes;
        f.expert_cache_slots = pl->cache_slots;
        f.cache_policy = pl->cache_policy;
        f.n_experts_streamed = pl->n_experts_streamed;
        f.n_classes = DSII_PC_COUNT;
        for (int c = 0; c < DSII_PC_COUNT; c++) {
            dsi_place_class *pc = &f.classes[c];
            snprintf(pc->name, sizeof pc->name, "%s", k_class_names[c]);
            pc->n_tensors = pl->class_tensors[c];
            pc->device_bytes = pl->class_bytes[c][DSII_TIER_DEVICE];
            pc->host_bytes = pl->class_bytes[c][DSII_TIER_HOST];
            pc->disk_bytes = pl->class_bytes[c][DSII_TIER_DISK];
            pc->bytes = pc->device_bytes + pc->host_bytes + pc->disk_bytes;
            pc->tier = pc->disk_bytes > pc->device_bytes && pc->disk_bytes > pc->host_bytes ? DSI_TIER_DISK
                       : pc->host_bytes > pc->device_bytes                                  ? DSI_TIER_HOST
                                                                                            : DSI_TIER_DEVICE;
        }
        dsii_place *mp = (dsii_place *)(uintptr_t)pl; /* counters are atomics */
        f.cache_hits = atomic_load(&mp->hits);
        f.cache_misses = atomic_load(&mp->misses);
        f.prefetches = atomic_load(&mp->prefetches);
        f.prefetch_hits = atomic_load(&mp->prefetch_hits);
        f.bytes_read = atomic_load(&mp->bytes_read);
        f.bytes_uploaded = atomic_load(&mp->bytes_uploaded);
        f.read_ns = atomic_load(&mp->read_ns);
        f.steps = atomic_load(&mp->steps);
        f.cpu_experts = atomic_load(&mp->cpu_experts);
        f.device_experts = atomic_load(&mp->device_experts);
        f.host_peak = atomic_load(&mp->host_peak);
    }
    f.struct_size = info->struct_size;
    memcpy(info, &f, info->struct_size);
    return DSI_OK;
}

DSI_API dsi_status dsi_model_expert_counts(const dsi_model *model, uint64_t *counts, uint64_t cap,
                                           uint64_t *n_needed, uint32_t *n_layers, uint32_t *n_experts) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_expert_counts: model is NULL");
    if (!counts && cap)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_expert_counts: counts is NULL with cap %" PRIu64,
                                cap);
    const uint64_t need = (uint64_t)model->counts_layers * model->counts_experts;
    if (n_needed) *n_needed = need;
    if (n_layers) *n_layers = model->counts_layers;
    if (n_experts) *n_experts = model->counts_experts;
    if (!model->expert_counts || !model->exec)
        return dsii_thread_fail(DSI_ERR_UNSUPPORTED, "dsi_model_expert_counts: the model has %s",
                                model->expert_counts ? "no forward pass" : "no routed experts");
    if (cap < need)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_model_expert_counts: cap %" PRIu64 " < %" PRIu64 " (n_layers %u x n_experts %u)",
                                cap, need, model->counts_layers, model->counts_experts);
    for (uint64_t i = 0; i < need; i++) counts[i] = atomic_load_explicit(&model->expert_counts[i], memory_order_relaxed);
    return DSI_OK;
}
