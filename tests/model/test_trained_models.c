/*
 * The trained models (models/kjv-v41.gguf, models/kjv-v4.gguf; docs/trained-models.md):
 *
 *   - tokenizer: the library tokenizes each held-out chunk to exactly the ids the training
 *     tokenizer (tools/train/bpe.py, an independent BPE implementation) produced;
 *   - perplexity agreement with the PyTorch implementation (tools/train/model.py, written
 *     from model-spec.md independently of the C code) on the same weights, over 8 held-out
 *     chunks of 256 tokens (2040 predicted tokens): with the fake-quant rounding off on both
 *     sides (DSI_SESSION_FLAG_NO_FAKE_QUANT) mean |Δ log p| <= 1e-5 and max <= 2e-4; with it
 *     on, the held-out perplexities agree to 3 significant digits (relative 1e-3). The
 *     expected values in tests/model/data/<model>.logprobs come from
 *     tools/train/expected_logprobs.py (PyTorch; nothing in them comes from this library);
 *   - readable text: >= 90 % of the words of greedy and seeded generations occur in the
 *     training split's vocabulary of words (tests/model/data/kjv-words.txt);
 *   - chat: of 25 seeded answers (temperature 0.8; 4 questions x 3 seeds, thinking off and on,
 *     and one second turn) >= 80 % end with the end-of-turn token (<｜end▁of▁sentence｜>,
 *     finish EOS) and >= 45 % are clean turns (no turn marker of their own; with thinking, one
 *     </think> and then the answer);
 *   - the draft blocks (tools/train/train_drafts.py, trained on the target's own greedy text):
 *     greedy speculative decoding (dsi_session_generate, DSI_SPEC_ON) from the first 12 tokens
 *     of each held-out chunk (text the drafters and the backbone never trained on), 96 tokens
 *     each: the output equals plain greedy decoding, and the drafts accepted per verify step
 *     reach a floor (kjv-v41: 5 DSpark drafts, kjv-v4: 1 MTP draft).
 *
 * The models are committed and copied into $DSI_MODELS_DIR by the build: a missing model is a
 * failure, not a skip.
 */
#define _POSIX_C_SOURCE 200809L
#define DSI_EXPERIMENTAL /* DSI_SPEC_ON (speculative decoding) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model_test_util.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256
#define MAX_CHUNKS 16
#define TOL_MEAN_NOFQ 1e-5 /* measured 9.5e-7 on both models */
#define TOL_MAX_NOFQ 2e-4  /* measured 5.4e-6 (v41), 6.3e-6 (v4) */
#define TOL_PPL_REL 1e-3
/* The default CPU matmul path (int8 activations for Q8_0 weights, docs/performance.md) is
 * not the exact forward pass: bounded separately. Measured on kjv-v41 (Q8_0): mean |d logp|
 * 0.0183, max 0.947, perplexity rel 1.2e-3 (rounding on) and 2.8e-3 (off). */
#define TOL_MEAN_DEFAULT 0.05
#define TOL_MAX_DEFAULT 2.5
#define TOL_PPL_REL_DEFAULT 1e-2
#define MIN_WORD_FRAC 0.90
/* Chat answers are sampled (seeded): greedy decoding of models this small falls into loops
 * ("and the LORD, and the LORD, ...") that never end a verse (docs/trained-models.md). */
#define CHAT_TEMP 0.8f
#define CHAT_SEED 1
#define CHAT_SEEDS 3
#define CHAT_MAX 300
/* Of all sampled answers (4 questions x 3 seeds, thinking off and on, + one second turn),
 * at least this share must end with the end-of-turn token within CHAT_MAX tokens, and this
 * share must be clean turns (no turn marker of their own before that EOS). The models cannot
 * always tell a user verse from an answer verse (both are verses in the training
 * conversations, and the turn marker is often outside the 32-token window), so some answers
 * run on into "<｜Assistant｜></think>..." before ending: measured on the committed models,
 * docs/trained-models.md "Chat". */
#define MIN_CHAT_EOS 0.80   /* measured (exact path): kjv-v41 23 of 25, kjv-v4 23 of 25;
                               (default path): kjv-v41 23 of 24, kjv-v4 20 of 24 */
#define MIN_CHAT_CLEAN 0.45 /* measured: kjv-v41 15 of 25, kjv-v4 14 of 25 */

/* Drafts accepted per verify step, greedy speculative decoding from 8 held-out prompts x
 * SPEC_GEN tokens (test_speculative_acceptance), default CPU path. Measured: kjv-v41 3.214 of
 * 5 (585 accepted in 182 steps; the text-trained draft blocks before train_drafts.py: 0.742,
 * which this floor rejects), kjv-v4 0.984 of 1 (381 in 387; MTP not retrained). The floor of
 * kjv-v41 is the aim (mean accepted length >= 2.5 of 5 DSpark drafts). */
#define MIN_ACC_V41 2.5
#define MIN_ACC_V4 0.9
#define SPEC_GEN 96
#define SPEC_PROMPT 12
static const double k_min_accepted[] = {MIN_ACC_V41, MIN_ACC_V4};

static const char *k_models[] = {"kjv-v41", "kjv-v4"};

/* ---- held-out data -------------------------------------------------------------------- */

typedef struct chunk {
    char *text;
    size_t text_len;
    dsi_token tok[CHUNK];
    size_t n;
    double lp_round[CHUNK], lp_noround[CHUNK];
} chunk;

static char *src_path(const char *rel) {
    static char buf[4096];
    const char *src = getenv("DSI_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", src ? src : ".", rel);
    return buf;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Reads tests/model/data/<name>.logprobs; returns the chunk count (0 on error). */
static size_t read_expected(const char *name, chunk *ch) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/model/data/%s.logprobs", name);
    FILE *f = fopen(src_path(rel), "r");
    if (!f) {
        print_error("cannot open %s\n", src_path(rel));
        return 0;
    }
    size_t cap = 1 << 16, n = 0;
    char *line = malloc(cap);
    size_t got = 0;
    long idx = -1;
    while (line && fgets(line + got, (int)(cap - got), f)) {
        got += strlen(line + got);
        if (got == cap - 1 && line[got - 1] != '\n') {
            cap *= 2;
            char *nl = realloc(line, cap);
            if (!nl) break;
            line = nl;
            continue;
        }
        got = 0;
        char *sp = strchr(line, ' ');
        if (!sp || line[0] == '#') continue;
        *sp = '\0';
        char *v = sp + 1;
        if (!strcmp(line, "text")) {
            if (++idx >= MAX_CHUNKS) break;
            chunk *c = &ch[idx];
            size_t hl = strcspn(v, "\n");
            c->text = malloc(hl / 2 + 1);
            c->text_len = hl / 2;
            for (size_t i = 0; i < hl / 2; i++)
                c->text[i] = (char)(hexval(v[2 * i]) * 16 + hexval(v[2 * i + 1]));
            c->text[hl / 2] = '\0';
            n = (size_t)idx + 1;
        } else if (idx >= 0) {
            chunk *c = &ch[idx];
            char *e;
            size_t k = 0;
            if (!strcmp(line, "tokens")) {
                for (long t = strtol(v, &e, 10); e != v && k < CHUNK; v = e, t = strtol(v, &e, 10))
                    c->tok[k++] = (dsi_token)t;
                c->n = k;
            } else if (!strcmp(line, "lp_round") || !strcmp(line, "lp_noround")) {
                double *dst = line[3] == 'r' ? c->lp_round : c->lp_noround;
                for (double d = strtod(v, &e); e != v && k < CHUNK; v = e, d = strtod(v, &e)) dst[k++] = d;
                if (c->n && k != c->n - 1) {
                    print_error("%s: chunk %ld has %zu log-probs for %zu tokens\n", name, idx, k, c->n);
                    n = 0;
                    break;
                }
            }
        }
    }
    free(line);
    fclose(f);
    return n;
}

static void free_chunks(chunk *ch, size_t n) {
    for (size_t i = 0; i < n; i++) free(ch[i].text);
}

/* Loads models/<name>.gguf from $DSI_MODELS_DIR; a missing or unloadable model fails. */
static void open_model(const char *name, int32_t threads, dsi_context **ctx, dsi_model **model) {
    char file[128];
    snprintf(file, sizeof file, "%s.gguf", name);
    const char *p = mt_model_path(file, NULL);
    if (!p) print_error("model %s not found in $DSI_MODELS_DIR (%s)\n", file, getenv("DSI_MODELS_DIR"));
    assert_non_null(p);
    assert_int_equal(mt_open(p, threads, ctx, model), 0);
}

/* ---- tokenizer -------------------------------------------------------------------------- */

static void test_tokenizer_matches_training(void **state) {
    (void)state;
    for (size_t m = 0; m < 2; m++) {
        static chunk ch[MAX_CHUNKS];
        size_t n = read_expected(k_models[m], ch);
        assert_true(n >= 8);
        dsi_context *ctx;
        dsi_model *model;
        open_model(k_models[m], 1, &ctx, &model);
        for (size_t i = 0; i < n; i++) {
            dsi_token out[CHUNK + 8];
            size_t need = 0;
            assert_int_equal(dsi_tokenize(model, ch[i].text, ch[i].text_len, DSI_TOKENIZE_ADD_BOS, out,
                                          CHUNK + 8, &need), DSI_OK);
            assert_int_equal(need, ch[i].n);
            for (size_t k = 0; k < need; k++)
                if (out[k] != ch[i].tok[k]) fail_msg("%s chunk %zu token %zu: %d vs %d", k_models[m], i, k, out[k], ch[i].tok[k]);
        }
        mt_close(ctx, model);
        free_chunks(ch, n);
    }
}

/* ---- perplexity agreement --------------------------------------------------------------- */

static double logprob_of(const float *row, int32_t V, dsi_token t) {
    double mx = row[0];
    for (int32_t i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0;
    for (int32_t i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return (double)row[t] - mx - log(s);
}

static void test_logprobs_agree_with_pytorch(void **state) {
    (void)state;
    for (size_t m = 0; m < 2; m++) {
        static chunk ch[MAX_CHUNKS];
        size_t n = read_expected(k_models[m], ch);
        assert_true(n >= 8);
      for (int exact = 1; exact >= 0; exact--) {
        /* the exact path is the forward pass the third implementation checks; the default
         * path (quantised activations) is what applications get, with its own bounds */
        dsi_context *ctx;
        dsi_model *model;
        char file[128];
        snprintf(file, sizeof file, "%s.gguf", k_models[m]);
        const char *mp = mt_model_path(file, NULL);
        assert_non_null(mp);
        assert_int_equal(mt_open_flags(mp, 2, exact ? DSI_CONTEXT_FLAG_EXACT_MATMUL : 0u, &ctx, &model), 0);
        dsi_model_info info;
        dsi_model_info_init(&info);
        assert_int_equal(dsi_model_get_info(model, &info), DSI_OK);
        const int32_t V = info.n_vocab;
        double sum_abs = 0, max_abs = 0, nll_lib = 0, nll_ref = 0, nll_lib_nofq = 0, nll_ref_nofq = 0;
        size_t cnt = 0, worst_chunk = 0, worst_pos = 0, top1 = 0;
        for (size_t i = 0; i < n; i++) {
            float *lg_nofq = mt_all_logits(model, ch[i].tok, ch[i].n, 256, DSI_SESSION_FLAG_NO_FAKE_QUANT, 0);
            float *lg_fq = mt_all_logits(model, ch[i].tok, ch[i].n, 256, 0, 0);
            assert_non_null(lg_nofq);
            assert_non_null(lg_fq);
            for (size_t p = 0; p + 1 < ch[i].n; p++) {
                double a = logprob_of(lg_nofq + p * (size_t)V, V, ch[i].tok[p + 1]);
                double b = logprob_of(lg_fq + p * (size_t)V, V, ch[i].tok[p + 1]);
                int32_t am = 0; /* the target's own top-1, reported (what drafts are compared with) */
                for (int32_t v = 1; v < V; v++)
                    if (lg_fq[p * (size_t)V + (size_t)v] > lg_fq[p * (size_t)V + (size_t)am]) am = v;
                top1 += am == ch[i].tok[p + 1];
                double d = fabs(a - ch[i].lp_noround[p]);
                sum_abs += d;
                if (d > max_abs) max_abs = d, worst_chunk = i, worst_pos = p;
                nll_lib_nofq -= a;
                nll_ref_nofq -= ch[i].lp_noround[p];
                nll_lib -= b;
                nll_ref -= ch[i].lp_round[p];
                cnt++;
            }
            free(lg_nofq);
            free(lg_fq);
        }
        double ppl_lib = exp(nll_lib / (double)cnt), ppl_ref = exp(nll_ref / (double)cnt);
        double rel = fabs(ppl_lib - ppl_ref) / ppl_ref;
        printf("# %s (%s path): %zu held-out tokens; rounding off: mean |d logp| %.3g, max %.3g (chunk %zu pos %zu), "
               "ppl %.5f vs PyTorch %.5f; rounding on: ppl %.5f vs PyTorch %.5f (rel %.2g), top-1 %.3f\n",
               k_models[m], exact ? "exact" : "default", cnt, sum_abs / (double)cnt, max_abs, worst_chunk, worst_pos,
               exp(nll_lib_nofq / (double)cnt), exp(nll_ref_nofq / (double)cnt), ppl_lib, ppl_ref, rel,
               (double)top1 / (double)cnt);
        assert_true(cnt >= 2000);
        assert_true(sum_abs / (double)cnt <= (exact ? TOL_MEAN_NOFQ : TOL_MEAN_DEFAULT));
        assert_true(max_abs <= (exact ? TOL_MAX_NOFQ : TOL_MAX_DEFAULT));
        assert_true(rel <= (exact ? TOL_PPL_REL : TOL_PPL_REL_DEFAULT));
        mt_close(ctx, model);
      }
        free_chunks(ch, n);
    }
}

/* ---- readable text ---------------------------------------------------------------------- */

typedef struct wordset {
    char **w;
    size_t n;
} wordset;

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static wordset load_words(void) {
    wordset s = {NULL, 0};
    FILE *f = fopen(src_path("tests/model/data/kjv-words.txt"), "r");
    if (!f) return s;
    char line[256];
    size_t cap = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0] || line[0] == '#') continue;
        if (s.n == cap) {
            cap = cap ? 2 * cap : 4096;
            s.w = realloc(s.w, cap * sizeof *s.w);
        }
        s.w[s.n++] = strdup(line);
    }
    fclose(f);
    qsort(s.w, s.n, sizeof *s.w, cmp_str);
    return s;
}

static void free_words(wordset *s) {
    for (size_t i = 0; i < s->n; i++) free(s->w[i]);
    free(s->w);
}

/* Words = maximal runs of ASCII letters, compared lower-cased. Adds to *known / *total. */
static void count_words(const wordset *s, const char *text, size_t *known, size_t *total,
                        char *unknown, size_t ucap) {
    char w[128];
    size_t k = 0;
    for (const char *p = text;; p++) {
        if (isalpha((unsigned char)*p) && !((unsigned char)*p & 0x80)) {
            if (k < sizeof w - 1) w[k++] = (char)tolower((unsigned char)*p);
            continue;
        }
        if (k) {
            w[k] = '\0';
            const char *key = w;
            (*total)++;
            if (bsearch(&key, s->w, s->n, sizeof *s->w, cmp_str)) (*known)++;
            else if (strlen(unknown) + k + 2 < ucap) strcat(strcat(unknown, " "), w);
            k = 0;
        }
        if (!*p) break;
    }
}

typedef struct sink {
    char buf[16384];
    size_t n;
} sink;

static int32_t on_tok(dsi_token t, const char *text, size_t len, void *ud) {
    (void)t;
    sink *s = ud;
    if (s->n + len < sizeof s->buf) {
        memcpy(s->buf + s->n, text, len);
        s->n += len;
        s->buf[s->n] = '\0';
    }
    return 1;
}

/* Generates from `prompt` (text, specials parsed; BOS added for plain prompts, a rendered chat
 * already starts with it) and returns the finish reason. */
static int32_t generate(dsi_model *model, const char *prompt, int chat, float temp, uint64_t seed,
                        int max_tokens, sink *out) {
    dsi_token tok[2048];
    size_t n = 0;
    const uint32_t fl = DSI_TOKENIZE_PARSE_SPECIAL | (chat ? 0u : DSI_TOKENIZE_ADD_BOS);
    assert_int_equal(dsi_tokenize(model, prompt, strlen(prompt), fl, tok, 2048, &n), DSI_OK);
    dsi_session *s = mt_session(model, 2048, 0, 0);
    assert_non_null(s);
    dsi_sampler_options so;
    dsi_sampler_options_init(&so);
    so.temperature = temp;
    so.seed = seed;
    dsi_sampler *smp = NULL;
    assert_int_equal(dsi_sampler_create(&so, &smp), DSI_OK);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.max_tokens = max_tokens;
    go.prompt = tok;
    go.n_prompt = n;
    go.on_token = on_tok;
    out->n = 0;
    out->buf[0] = '\0';
    go.user_data = out;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    assert_int_equal(dsi_session_generate(s, smp, &go, &r), DSI_OK);
    dsi_sampler_free(smp);
    dsi_session_free(s);
    return r.finish_reason;
}

static void test_generated_words_are_kjv_words(void **state) {
    (void)state;
    wordset ws = load_words();
    assert_true(ws.n > 10000);
    static const char *prompts[] = {"In the beginning", "And Jesus said unto them,", "Hello", "The LORD is"};
    for (size_t m = 0; m < 2; m++) {
        dsi_context *ctx;
        dsi_model *model;
        open_model(k_models[m], 2, &ctx, &model);
        for (int mode = 0; mode < 2; mode++) { /* greedy, then seeded sampling at temperature 1 */
            size_t known = 0, total = 0;
            static char unknown[4096];
            unknown[0] = '\0';
            for (size_t p = 0; p < sizeof prompts / sizeof prompts[0]; p++) {
                static sink out;
                generate(model, prompts[p], 0, mode ? 1.0f : 0.0f, 1 + p, 96, &out);
                if (p == 0) printf("# %s %s: %s%s\n", k_models[m], mode ? "seeded" : "greedy", prompts[p], out.buf);
                count_words(&ws, out.buf, &known, &total, unknown, sizeof unknown);
            }
            double frac = total ? (double)known / (double)total : 0.0;
            printf("# %s %s: %zu of %zu words known (%.1f %%); unknown:%s\n", k_models[m],
                   mode ? "seeded" : "greedy", known, total, 100.0 * frac, unknown);
            assert_true(total >= 100);
            assert_true(frac >= MIN_WORD_FRAC);
        }
        mt_close(ctx, model);
    }
    free_words(&ws);
}

/* ---- chat --------------------------------------------------------------------------------- */

/* An answer is a clean turn when it holds no turn marker of its own (<｜User｜>, <｜Assistant｜>,
 * <｜begin▁of▁sentence｜>) and, with thinking, closes its reasoning with exactly one </think>
 * followed by a non-empty answer (without thinking: no think tag at all). */
static int clean_turn(const char *ans, int think) {
    if (strstr(ans, "<｜User｜>") || strstr(ans, "<｜Assistant｜>") || strstr(ans, "<｜begin▁of▁sentence｜>"))
        return 0;
    if (!think) return !strstr(ans, "<think>") && !strstr(ans, "</think>");
    const char *e = strstr(ans, "</think>");
    return e && !strstr(e + 8, "</think>") && !strstr(ans, "<think>") && e[8] != '\0';
}

static void test_chat_turns_end_with_eos(void **state) {
    (void)state;
    static const char *questions[] = {"Who made the heaven and the earth?", "John 3:16", "What is love?",
                                      "Tell me about David."};
    const size_t nq = sizeof questions / sizeof questions[0];
    for (size_t m = 0; m < 2; m++) {
        dsi_context *ctx;
        dsi_model *model;
        open_model(k_models[m], 2, &ctx, &model);
        size_t n_ans = 0, n_eos = 0, n_clean = 0;
        for (int think = 0; think < 2; think++) {
            for (size_t q = 0; q < nq; q++) {
                for (uint64_t seed = CHAT_SEED; seed < CHAT_SEED + CHAT_SEEDS; seed++) {
                    dsi_chat_message msgs[3];
                    const dsi_chat_message *ptr[3];
                    for (int i = 0; i < 3; i++) dsi_chat_message_init(&msgs[i]), ptr[i] = &msgs[i];
                    msgs[0].role = DSI_ROLE_USER;
                    msgs[0].content = questions[q];
                    static sink ans1, ans2;
                    dsi_chat_options co;
                    dsi_chat_options_init(&co);
                    co.thinking = think ? DSI_THINKING_ON : DSI_THINKING_OFF;
                    char text[8192];
                    size_t need = 0;
                    assert_int_equal(dsi_chat_render(model, ptr, 1, &co, text, sizeof text, &need), DSI_OK);
                    int32_t fin = generate(model, text, 1, CHAT_TEMP, seed, CHAT_MAX, &ans1);
                    int ok = fin == DSI_FINISH_EOS, cl = ok && clean_turn(ans1.buf, think);
                    n_ans++, n_eos += (size_t)ok, n_clean += (size_t)cl;
                    if (seed == CHAT_SEED || !cl)
                        printf("# %s chat%s [%s] seed %d: %s%s%s\n", k_models[m], think ? " (thinking)" : "",
                               questions[q], (int)seed, ans1.buf, ok ? "" : " [no EOS]",
                               ok && !cl ? " [turn marker inside]" : "");
                    if (think || !cl || q != 0 || seed != CHAT_SEED) continue;
                    /* a second turn on top of the first */
                    msgs[1].role = DSI_ROLE_ASSISTANT;
                    msgs[1].content = ans1.buf;
                    msgs[2].role = DSI_ROLE_USER;
                    msgs[2].content = "And what did God say?";
                    assert_int_equal(dsi_chat_render(model, ptr, 3, &co, text, sizeof text, &need), DSI_OK);
                    fin = generate(model, text, 1, CHAT_TEMP, seed, CHAT_MAX, &ans2);
                    ok = fin == DSI_FINISH_EOS, cl = ok && clean_turn(ans2.buf, 0);
                    n_ans++, n_eos += (size_t)ok, n_clean += (size_t)cl;
                    printf("# %s chat turn 2: %s%s%s\n", k_models[m], ans2.buf, ok ? "" : " [no EOS]",
                           ok && !cl ? " [turn marker inside]" : "");
                }
            }
        }
        printf("# %s chat: %zu answers, %zu end with EOS (%.0f %%), %zu clean turns (%.0f %%)\n", k_models[m],
               n_ans, n_eos, 100.0 * (double)n_eos / (double)n_ans, n_clean,
               100.0 * (double)n_clean / (double)n_ans);
        assert_true((double)n_eos >= MIN_CHAT_EOS * (double)n_ans);
        assert_true((double)n_clean >= MIN_CHAT_CLEAN * (double)n_ans);
        mt_close(ctx, model);
    }
}

/* ---- draft blocks: speculative decoding ---------------------------------------------------- */

static void spec_generate(dsi_model *model, uint32_t spec, const dsi_token *prompt, size_t np,
                          dsi_token *out, size_t *n_out, dsi_generate_result *r) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 512;
    so.spec = spec;
    dsi_session *s = NULL;
    if (dsi_session_create(model, &so, &s) != DSI_OK) fail_msg("session: %s", dsi_last_error());
    dsi_sampler_options sopt;
    dsi_sampler_options_init(&sopt);
    sopt.temperature = 0.0f;
    dsi_sampler *smp = NULL;
    assert_int_equal(dsi_sampler_create(&sopt, &smp), DSI_OK);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = np;
    go.max_tokens = SPEC_GEN;
    dsi_generate_result_init(r);
    assert_int_equal(dsi_session_generate(s, smp, &go, r), DSI_OK);
    assert_int_equal(dsi_session_tokens(s, out, 1024, n_out), DSI_OK);
    dsi_sampler_free(smp);
    dsi_session_free(s);
}

static void test_speculative_acceptance(void **state) {
    (void)state;
    for (size_t m = 0; m < 2; m++) {
        static chunk ch[MAX_CHUNKS];
        size_t n = read_expected(k_models[m], ch);
        assert_true(n >= 8);
        dsi_context *ctx;
        dsi_model *model;
        open_model(k_models[m], 2, &ctx, &model);
        uint64_t steps = 0, drafted = 0, accepted = 0;
        for (size_t i = 0; i < 8; i++) {
            static dsi_token on[1024], off[1024];
            size_t n_on = 0, n_off = 0;
            dsi_generate_result r_on, r_off;
            spec_generate(model, DSI_SPEC_OFF, ch[i].tok, SPEC_PROMPT, off, &n_off, &r_off);
            spec_generate(model, DSI_SPEC_ON, ch[i].tok, SPEC_PROMPT, on, &n_on, &r_on);
            if (n_on != n_off || memcmp(on, off, n_on * sizeof *on) != 0)
                fail_msg("%s prompt %zu: speculative output differs from plain greedy decoding", k_models[m], i);
            steps += r_on.n_spec_steps, drafted += r_on.n_drafted, accepted += r_on.n_accepted;
        }
        double per_step = steps ? (double)accepted / (double)steps : 0.0;
        printf("# %s speculative (greedy, 8 held-out prompts x %d tokens): %llu verify steps, %llu drafted, "
               "%llu accepted: %.3f accepted drafts per step (floor %.2f)\n", k_models[m], SPEC_GEN,
               (unsigned long long)steps, (unsigned long long)drafted, (unsigned long long)accepted, per_step,
               k_min_accepted[m]);
        assert_true(steps > 0);
        assert_true(per_step >= k_min_accepted[m]);
        mt_close(ctx, model);
        free_chunks(ch, n);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_matches_training),
        cmocka_unit_test(test_logprobs_agree_with_pytorch),
        cmocka_unit_test(test_generated_words_are_kjv_words),
        cmocka_unit_test(test_chat_turns_end_with_eos),
        cmocka_unit_test(test_speculative_acceptance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
