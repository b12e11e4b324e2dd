/*
 * Writing deepseek4 / deepseek41 GGUF files in any of the three layouts (layout.h,
 * docs/model-files.md §7). Used by the tools only (dsinfer-mkmodel, dsinfer-convert,
 * dsinfer-quantize): each describes its model as canonical hyperparameters (dsii_hparams)
 * plus tensors under their native names, and the emitter writes the keys and tensor names
 * of the requested layout, moves draft blocks to a second file where the layout keeps them
 * there, fuses / re-encodes tensors where the layout stores them differently, and puts the
 * ds4 Engram extent at the end. Output is deterministic (same calls → same bytes).
 *
 * Type rules: the llama.cpp and ds4 layouts carry ggml types only — a tensor of a libdsinfer
 * FP8 type fails with INVALID_ARGUMENT (the tool converts first); ds4's deepseek41 Engram
 * table must come as FP8_E4M3_R32 (it is re-encoded losslessly to I8 row264 rows).
 */
#ifndef DSI_MODEL_EMIT_H
#define DSI_MODEL_EMIT_H

#include "gguf/gguf.h"
#include "model/layout.h"
#include "model/model.h"

/* The files a layout writes: the model, and the draft blocks' file when the layout keeps the
 * V4 MTP apart (llama.cpp, ds4). */
enum { DSII_EMIT_MAIN = 0, DSII_EMIT_DRAFT = 1, DSII_EMIT_PARTS = 2 };

typedef struct dsii_emitter dsii_emitter;

/* `hp` must describe a valid model (the loader's rules) and stay valid until free. Engram
 * arrays are read from hp->engram. `name` goes to general.name. `drop_draft`: leave the
 * draft blocks out (no second file). Fails (INVALID_ARGUMENT) for what a layout cannot
 * express (e.g. per-layer SwiGLU limits in ds4's deepseek41 dialect). */
dsi_status dsii_emitter_create(const dsii_hparams *hp, int layout, const char *name,
                               int drop_draft, dsii_emitter **out, dsii_error *err);
void dsii_emitter_free(dsii_emitter *e);

/* 1 if the layout writes a second (draft) file for this model. */
int dsii_emitter_has_part(const dsii_emitter *e, int part);
/* The writer of a part, to add keys the emitter does not own (tokenizer.*, general.*):
 * call after create and before the first add_tensor. NULL for a part not written. */
dsii_gguf_writer *dsii_emitter_writer(dsii_emitter *e, int part);

/* Adds a tensor under its native name (docs/model-files.md §3–§4); `fill` produces the
 * native bytes of `type` (called at write time, possibly more than once). Tensors the
 * layout leaves out (draft blocks when dropped; vision) are accepted and skipped. */
dsi_status dsii_emitter_add(dsii_emitter *e, const char *name, int32_t type, uint32_t n_dims,
                            const int64_t *ne, dsii_gguf_fill_fn fill, void *user,
                            dsii_error *err);

/* Same, streamed: `fill` produces runs of whole rows (dsii_gguf_writer_add_tensor_rows), a
 * multiple of `row_align` rows each — for tensors too large to hold. */
dsi_status dsii_emitter_add_rows(dsii_emitter *e, const char *name, int32_t type, uint32_t n_dims,
                                 const int64_t *ne, uint32_t row_align, dsii_gguf_fill_rows_fn fill,
                                 void *user, dsii_error *err);

/* Writes the part's file (after all tensors were added). */
dsi_status dsii_emitter_write(dsii_emitter *e, int part, const char *path, dsii_error *err);
uint64_t dsii_emitter_size(dsii_emitter *e, int part);

/* Writes the hyperparameter keys of `hp` for `layout` into `w` (part as above): used by the
 * emitter; exposed for tests. */
dsi_status dsii_layout_write_hparams(dsii_gguf_writer *w, const dsii_hparams *hp, int layout,
                                     int part, int n_draft, dsii_error *err);

/* The usual second-file name: "<path without .gguf>-mtp.gguf" (llama.cpp's converter names
 * it mtp-<name>.gguf; any name works, the file is passed as draft_path). */
void dsii_emit_draft_path(const char *path, char *out, size_t cap);

#endif /* DSI_MODEL_EMIT_H */
