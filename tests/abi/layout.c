/* Prints the offset and size of every field of every public struct. The output is
 * compared with the committed tests/abi/struct-layout.txt: public structs only ever grow
 * at the end, so an existing line may never change (new lines may be appended, together
 * with a DSI_ABI_VERSION bump). */
#include "dsinfer.h"

#include <stddef.h>
#include <stdio.h>

#define F(T, f) printf("%s.%s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))
#define S(T) printf("%s sizeof %zu\n", #T, sizeof(T))

int main(void) {
    S(dsi_context_options);
    F(dsi_context_options, struct_size); F(dsi_context_options, abi_version);
    F(dsi_context_options, log_fn); F(dsi_context_options, log_user_data);
    F(dsi_context_options, log_level); F(dsi_context_options, n_threads);
    F(dsi_context_options, malloc_fn); F(dsi_context_options, realloc_fn);
    F(dsi_context_options, free_fn); F(dsi_context_options, alloc_user_data);
    F(dsi_context_options, backend); F(dsi_context_options, backend_dir);
    F(dsi_context_options, device_index); F(dsi_context_options, flags);
    S(dsi_device_info);
    F(dsi_device_info, struct_size); F(dsi_device_info, type); F(dsi_device_info, backend);
    F(dsi_device_info, name); F(dsi_device_info, memory_total); F(dsi_device_info, memory_free);
    F(dsi_device_info, max_buffer_size); F(dsi_device_info, features);
    F(dsi_device_info, subgroup_size); F(dsi_device_info, index);
    S(dsi_model_options);
    F(dsi_model_options, struct_size); F(dsi_model_options, access);
    F(dsi_model_options, progress_fn); F(dsi_model_options, progress_user_data);
    F(dsi_model_options, flags); F(dsi_model_options, draft_path);
    F(dsi_model_options, place);
    S(dsi_reader);
    F(dsi_reader, struct_size); F(dsi_reader, size); F(dsi_reader, pread_fn);
    F(dsi_reader, close_fn); F(dsi_reader, user_data);
    S(dsi_model_info);
    F(dsi_model_info, struct_size); F(dsi_model_info, arch); F(dsi_model_info, arch_name);
    F(dsi_model_info, name); F(dsi_model_info, n_layers); F(dsi_model_info, n_embd);
    F(dsi_model_info, n_vocab); F(dsi_model_info, n_heads); F(dsi_model_info, n_ctx_train);
    F(dsi_model_info, n_experts); F(dsi_model_info, n_experts_used);
    F(dsi_model_info, n_draft_layers); F(dsi_model_info, has_mtp); F(dsi_model_info, has_dspark);
    F(dsi_model_info, has_engram); F(dsi_model_info, n_params); F(dsi_model_info, weight_bytes);
    F(dsi_model_info, fingerprint);
    S(dsi_chat_message);
    F(dsi_chat_message, struct_size); F(dsi_chat_message, role);
    F(dsi_chat_message, content); F(dsi_chat_message, reasoning);
    S(dsi_chat_options);
    F(dsi_chat_options, struct_size); F(dsi_chat_options, thinking);
    F(dsi_chat_options, add_generation_prompt); F(dsi_chat_options, add_bos);
    S(dsi_session_options);
    F(dsi_session_options, struct_size); F(dsi_session_options, n_ctx);
    F(dsi_session_options, n_batch); F(dsi_session_options, flags);
    F(dsi_session_options, spec); F(dsi_session_options, draft_max);
    F(dsi_session_options, draft_confidence); F(dsi_session_options, spec_reserved);
    S(dsi_logit_bias);
    F(dsi_logit_bias, token); F(dsi_logit_bias, bias);
    S(dsi_sampler_options);
    F(dsi_sampler_options, struct_size); F(dsi_sampler_options, temperature);
    F(dsi_sampler_options, top_k); F(dsi_sampler_options, top_p); F(dsi_sampler_options, min_p);
    F(dsi_sampler_options, repetition_penalty); F(dsi_sampler_options, frequency_penalty);
    F(dsi_sampler_options, presence_penalty); F(dsi_sampler_options, penalty_last_n);
    F(dsi_sampler_options, seed); F(dsi_sampler_options, logit_bias);
    F(dsi_sampler_options, n_logit_bias);
    S(dsi_generate_options);
    F(dsi_generate_options, struct_size); F(dsi_generate_options, max_tokens);
    F(dsi_generate_options, prompt); F(dsi_generate_options, n_prompt);
    F(dsi_generate_options, stop_tokens); F(dsi_generate_options, n_stop_tokens);
    F(dsi_generate_options, stop_strings); F(dsi_generate_options, n_stop_strings);
    F(dsi_generate_options, on_token); F(dsi_generate_options, user_data);
    F(dsi_generate_options, flags);
    S(dsi_generate_result);
    F(dsi_generate_result, struct_size); F(dsi_generate_result, finish_reason);
    F(dsi_generate_result, n_prompt); F(dsi_generate_result, n_reused);
    F(dsi_generate_result, n_generated); F(dsi_generate_result, prefill_ms);
    F(dsi_generate_result, decode_ms); F(dsi_generate_result, n_spec_steps);
    F(dsi_generate_result, n_drafted); F(dsi_generate_result, n_accepted);
    /* appended fields (ABI 2) */
    F(dsi_context_options, devices);
    return 0;
}
