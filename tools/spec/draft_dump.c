/*
 * draft_dump — writes libdsinfer's drafts (the experimental dsi_session_draft) at a run of
 * positions of one token sequence, for cross-checking the drafters against an independent
 * implementation: tests/reference/test_reference_drafts.py (the NumPy reference, CI) and
 * tools/spec/xcheck_drafts.py (the PyTorch draft blocks of tools/train, by hand).
 *
 *   draft_dump [--exact] [--no-fake-quant] [--first P0] [--count N] [--backend B]
 *              MODEL (TEXT | --tokens-file F) OUT
 *
 * The tokens are TEXT tokenized by the model's tokenizer, or the whitespace-separated ids of
 * F. For P = P0, P0+1, … (at most N positions, P + 1 < n) the session holds tokens[0 .. P)
 * (dsi_session_sync) and dsi_session_draft(next = tokens[P]) gives the draft ids and their
 * logits (Markov bias included). --exact: DSI_CONTEXT_FLAG_EXACT_MATMUL (f32 activations for
 * every weight type); --no-fake-quant: DSI_SESSION_FLAG_NO_FAKE_QUANT (§10.4). Defaults:
 * P0 = 8, N = 120, the context's default backend. OUT (little-endian): int32 n, int32
 * tokens[n], then per position int32 P, int32 nd, int32 ids[nd], float32 logits[nd][V]. Prints
 * "ok <positions> V <n_vocab>" and exits 0; on any error a message and exit 1.
 */
#define DSI_EXPERIMENTAL
#include "dsinfer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 8192
#define MAX_DRAFTS 16

static int usage(void) {
    fprintf(stderr, "usage: draft_dump [--exact] [--no-fake-quant] [--first P0] [--count N] "
                    "[--backend B] MODEL (TEXT | --tokens-file F) OUT\n");
    return 1;
}

static int read_tokens(const char *path, dsi_token *tk, size_t cap, size_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "draft_dump: cannot open %s\n", path);
        return 1;
    }
    long v;
    *n = 0;
    while (fscanf(f, "%ld", &v) == 1) {
        if (*n == cap || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "draft_dump: %s: too many tokens or an id out of range\n", path);
            fclose(f);
            return 1;
        }
        tk[(*n)++] = (dsi_token)v;
    }
    int bad = !feof(f);
    fclose(f);
    if (bad) fprintf(stderr, "draft_dump: %s: not a list of token ids\n", path);
    return bad;
}

static int write_all(FILE *o, const void *p, size_t size, size_t n) {
    return fwrite(p, size, n, o) == n ? 0 : 1;
}

int main(int argc, char **argv) {
    static dsi_token tk[MAX_TOKENS];
    int exact = 0, nofq = 0;
    long first = 8, count = 120;
    const char *backend = NULL, *tokfile = NULL, *pos[3];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--exact")) {
            exact = 1;
        } else if (!strcmp(argv[i], "--no-fake-quant")) {
            nofq = 1;
        } else if (!strcmp(argv[i], "--first") && i + 1 < argc) {
            first = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
            count = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (!strcmp(argv[i], "--tokens-file") && i + 1 < argc) {
            tokfile = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            return usage();
        } else if (npos < 3) {
            pos[npos++] = argv[i];
        } else {
            return usage();
        }
    }
    if (npos != (tokfile ? 2 : 3) || first < 1 || count < 1) return usage();
    const char *model_path = pos[0], *text = tokfile ? NULL : pos[1];
    const char *out_path = pos[npos - 1];

    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    if (backend) co.backend = backend;
    if (exact) co.flags |= DSI_CONTEXT_FLAG_EXACT_MATMUL;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&co, &ctx) != DSI_OK) {
        fprintf(stderr, "draft_dump: context: %s\n", dsi_last_error());
        return 1;
    }
    int rc = 1;
    dsi_model *m = NULL;
    dsi_session *s = NULL;
    FILE *o = NULL;
    float *lg = NULL;
    if (dsi_model_load(ctx, model_path, NULL, &m) != DSI_OK) {
        fprintf(stderr, "draft_dump: load %s: %s\n", model_path, dsi_last_error());
        goto done;
    }
    dsi_model_info info;
    dsi_model_info_init(&info);
    if (dsi_model_get_info(m, &info) != DSI_OK || info.n_vocab <= 0) {
        fprintf(stderr, "draft_dump: model info: %s\n", dsi_last_error());
        goto done;
    }
    size_t V = (size_t)info.n_vocab, n = 0;
    if (tokfile) {
        if (read_tokens(tokfile, tk, MAX_TOKENS, &n)) goto done;
        for (size_t i = 0; i < n; i++) {
            if ((size_t)tk[i] >= V) {
                fprintf(stderr, "draft_dump: token %d outside the vocabulary\n", (int)tk[i]);
                goto done;
            }
        }
    } else if (dsi_tokenize(m, text, strlen(text), 0, tk, MAX_TOKENS, &n) != DSI_OK) {
        fprintf(stderr, "draft_dump: tokenize: %s\n", dsi_last_error());
        goto done;
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 1024;
    so.spec = DSI_SPEC_ON;
    if (nofq) so.flags |= DSI_SESSION_FLAG_NO_FAKE_QUANT;
    while ((size_t)so.n_ctx < n + 2 * MAX_DRAFTS) so.n_ctx *= 2;
    if (dsi_session_create(m, &so, &s) != DSI_OK) {
        fprintf(stderr, "draft_dump: session: %s\n", dsi_last_error());
        goto done;
    }
    o = fopen(out_path, "wb");
    lg = malloc(sizeof(float) * MAX_DRAFTS * V);
    if (!o || !lg) {
        fprintf(stderr, "draft_dump: cannot write %s\n", out_path);
        goto done;
    }
    int32_t nn = (int32_t)n;
    if (write_all(o, &nn, 4, 1) || write_all(o, tk, 4, n)) goto write_error;
    long cnt = 0;
    for (size_t P = (size_t)first; P + 1 < n && cnt < count; P++, cnt++) {
        if (dsi_session_sync(s, tk, P, NULL) != DSI_OK) {
            fprintf(stderr, "draft_dump: sync %zu: %s\n", P, dsi_session_last_error(s));
            goto done;
        }
        dsi_token ids[MAX_DRAFTS];
        size_t nd = 0;
        if (dsi_session_draft(s, tk[P], ids, lg, MAX_DRAFTS, &nd) != DSI_OK) {
            fprintf(stderr, "draft_dump: draft at %zu: %s\n", P, dsi_session_last_error(s));
            goto done;
        }
        int32_t hdr[2] = {(int32_t)P, (int32_t)nd};
        if (write_all(o, hdr, 4, 2) || write_all(o, ids, 4, nd) ||
            write_all(o, lg, sizeof(float), nd * V))
            goto write_error;
    }
    if (fclose(o) != 0) {
        o = NULL;
        goto write_error;
    }
    o = NULL;
    printf("ok %ld V %zu\n", cnt, V);
    rc = 0;
    goto done;
write_error:
    fprintf(stderr, "draft_dump: write error on %s\n", out_path);
done:
    if (o) fclose(o);
    free(lg);
    if (s) dsi_session_free(s);
    if (m) dsi_model_free(m);
    dsi_context_free(ctx);
    return rc;
}
