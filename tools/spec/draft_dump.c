/*
 * draft_dump MODEL TEXT OUT [BACKEND] — writes the library's drafts at up to 120 positions of
 * TEXT (tokenized by the model's tokenizer) for tools/spec/xcheck_drafts.py: for P = 8, 9, …
 * the session holds tokens[0 .. P) and dsi_session_draft(next = tokens[P]) gives the draft
 * ids and their logits (Markov bias included). OUT: int32 n, tokens[n], then per position
 * int32 P, int32 nd, int32 ids[nd], float logits[nd][V].
 * Build: cc -O2 -Iinclude tools/spec/draft_dump.c build/libdsinfer.a -lm -lpthread -ldl
 */
#define DSI_EXPERIMENTAL
#include "dsinfer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* drv MODEL TOKFILE OUT: tokens (int32) in TOKFILE; for P = 8, 16, ..: drafts after tokens[0..P) + tokens[P] */
int main(int argc, char **argv) {
    static dsi_token tk[4096];
    size_t n = 0;
    dsi_context_options co; dsi_context_options_init(&co, DSI_ABI_VERSION); co.n_threads = 2;
    if (argc > 4) co.backend = argv[4];
    dsi_context *ctx; if (dsi_context_create(&co, &ctx)) { printf("ctx %s\n", dsi_last_error()); return 1; }
    dsi_model *m; if (dsi_model_load(ctx, argv[1], NULL, &m)) { printf("load %s\n", dsi_last_error()); return 1; }
    dsi_model_info info; dsi_model_info_init(&info); dsi_model_get_info(m, &info);
    int V = info.n_vocab;
    dsi_tokenize(m, argv[2], strlen(argv[2]), 0, tk, 4096, &n);
    dsi_session_options so; dsi_session_options_init(&so); so.n_ctx = 1024; so.spec = DSI_SPEC_ON;
    dsi_session *s; if (dsi_session_create(m, &so, &s)) { printf("sess %s\n", dsi_last_error()); return 1; }
    FILE *o = fopen(argv[3], "wb");
    float *lg = malloc(sizeof(float) * 16 * V);
    int cnt = 0;
    for (size_t P = 8; P + 1 < n && cnt < 120; P += 1, cnt++) {
        dsi_session_sync(s, tk, P, NULL);
        dsi_token ids[16]; size_t nd = 0;
        if (dsi_session_draft(s, tk[P], ids, lg, 16, &nd)) { printf("draft %s\n", dsi_session_last_error(s)); return 1; }
        int32_t hdr[2] = {(int32_t)P, (int32_t)nd};
        if (cnt == 0) { int32_t nn = (int32_t)n; fwrite(&nn, 4, 1, o); fwrite(tk, 4, n, o); }
        fwrite(hdr, 4, 2, o); fwrite(ids, 4, nd, o); fwrite(lg, 4, nd * V, o);
    }
    fclose(o);
    printf("ok %d V %d\n", cnt, V);
    return 0;
}
