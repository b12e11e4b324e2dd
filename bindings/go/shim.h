/* C helpers of the Go binding: callback trampolines into Go, counting allocator hooks,
 * and *_init wrappers that run the library's init on a padded scratch buffer. */
#ifndef DSINFER_GO_SHIM_H
#define DSINFER_GO_SHIM_H
#define DSI_EXPERIMENTAL /* DSI_MODEL_FLAG_COALESCE */
#include <dsinfer.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct dsigo_alloc_stats {
    int64_t live;
    int64_t total;
} dsigo_alloc_stats;

void dsigo_set_alloc_hooks(dsi_context_options *o, dsigo_alloc_stats *stats);
int64_t dsigo_alloc_live(dsigo_alloc_stats *stats);
int64_t dsigo_alloc_total(dsigo_alloc_stats *stats);
void dsigo_set_log(dsi_context_options *o, uintptr_t handle);
void dsigo_set_progress(dsi_model_options *o, uintptr_t handle);
void dsigo_set_on_token(dsi_generate_options *o, uintptr_t handle);
void dsigo_set_capture(dsi_generate_options *o, dsi_token *slot);

void dsigo_context_options_init(dsi_context_options *o);
void dsigo_model_options_init(dsi_model_options *o);
void dsigo_session_options_init(dsi_session_options *o);
void dsigo_sampler_options_init(dsi_sampler_options *o);
void dsigo_generate_options_init(dsi_generate_options *o);
void dsigo_chat_options_init(dsi_chat_options *o);
void dsigo_chat_message_init(dsi_chat_message *o);
void dsigo_model_info_init(dsi_model_info *o);
void dsigo_device_info_init(dsi_device_info *o);
void dsigo_generate_result_init(dsi_generate_result *o);

#endif
