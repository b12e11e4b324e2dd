/*
 * The three GGUF layouts of deepseek4 / deepseek41 files (docs/model-files.md §7):
 *
 *   native    libdsinfer's own naming (mtp.i.* draft blocks inside, FP8 block types)
 *   llama.cpp llama.cpp's deepseek4 (MTP as blk.{L}.nextn.* counted in block_count, or in a
 *             second file; per-layer arrays exactly block_count long; ggml types only)
 *   ds4       antirez/ds4 (deepseek4: the llama.cpp trunk names, MTP as mtp.0.* in a second
 *             file; deepseek41: Hugging Face config key names, engram_* tensors, the Engram
 *             tables as raw I8 [264, rows] rows at the end of the file, 16 KiB alignment)
 *
 * One table of spellings serves the loader (lib/model/hparams.c, model_load.c) and the
 * writers (tools/common: dsinfer-mkmodel, dsinfer-convert, dsinfer-quantize), so that what
 * is written is exactly what is read.
 */
#ifndef DSI_MODEL_LAYOUT_H
#define DSI_MODEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

enum { DSII_LAYOUT_NATIVE = 0, DSII_LAYOUT_LLAMACPP = 1, DSII_LAYOUT_DS4 = 2, DSII_LAYOUT_COUNT };

/* "native", "llama.cpp", "ds4"; "?" otherwise. */
const char *dsii_layout_name(int layout);
/* Parses a layout name ("llamacpp" and "llama" are accepted too); -1 if unknown. */
int dsii_layout_parse(const char *s);

/* ds4's deepseek41 files spell the hyperparameters with the Hugging Face config names
 * (deepseek41.hidden_size, …, deepseek41.rope_scaling.factor). Returns the ds4 suffix for a
 * canonical suffix ("embedding_length" -> "hidden_size"), or NULL when both spell it the
 * same or ds4 has no such key. */
const char *dsii_layout_ds4v41_key(const char *canonical_suffix);

/* ds4's deepseek41 Engram tensors: canonical per-layer suffix ("engram.embd.weight") ->
 * ds4 suffix ("engram_embd.weight"), or NULL. */
const char *dsii_layout_ds4v41_tensor(const char *canonical_suffix);

/* The ds4 row encoding of Engram tables: per row, 256 E4M3 bytes then 8 E8M0 scales (one per
 * 32 values), stored as GGUF type I8 with ne = [264, rows] (model-spec §5.2). */
#define DSII_ENGRAM_ROW264_ENCODING "e4m3_e8m0_32_row264"

/* ds4 deepseek41 files align tensor data to 16 KiB (Apple's VM page) so that the Engram
 * extent at the end can be unmapped without touching resident tensors. */
#define DSII_DS4_V41_ALIGNMENT 16384u

#endif /* DSI_MODEL_LAYOUT_H */
