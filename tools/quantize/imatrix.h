/* Importance matrix from libdsinfer's forward pass over a text (imatrix.c). */
#ifndef DSI_TOOLS_IMATRIX_H
#define DSI_TOOLS_IMATRIX_H
#include "dsinfer.h"
#include "model/model.h"
#include <stddef.h>
#include <stdint.h>

typedef struct dsii_imatrix {
    size_t n;
    const char **name;   /* the tensors' names in the model file */
    float **val;         /* [n_val]: mean x_j^2 per input column (experts: E vectors) */
    uint64_t *n_val;
    uint64_t *n_call;    /* rows that met the weight */
    uint64_t tokens;
    uint32_t chunks;
} dsii_imatrix;

/* Tokenizes the text file, runs it through `m` (CPU backend of `ctx`) in chunks of n_ctx
 * tokens (at most max_chunks; 0 = all) and returns each matrix's importance. 0 or -1 + err. */
int dsii_imatrix_collect(dsi_context *ctx, dsi_model *m, const char *text_path, uint32_t n_ctx, uint32_t max_chunks,
                         dsii_imatrix *out, char *err, size_t errcap);
/* llama.cpp's legacy imatrix .dat (entries with n_call 0 are left out). 0 or -1. */
int dsii_imatrix_save(const dsii_imatrix *im, const char *path);
void dsii_imatrix_free(dsii_imatrix *im);
#endif
