/* Compiled as C99 and C11 with -Wall -Wextra -Werror -pedantic: the public header must be
 * valid, warning-free C on its own. Also checks the layout rules every options/info
 * struct follows (struct_size first). */
#include "dsinfer.h"
#include "dsinfer.h" /* include guard works */

#include <stddef.h>

#define CHECK(name, cond) typedef char check_##name[(cond) ? 1 : -1]

CHECK(ctx_opt_first, offsetof(dsi_context_options, struct_size) == 0);
CHECK(dev_info_first, offsetof(dsi_device_info, struct_size) == 0);
CHECK(model_opt_first, offsetof(dsi_model_options, struct_size) == 0);
CHECK(reader_first, offsetof(dsi_reader, struct_size) == 0);
CHECK(model_info_first, offsetof(dsi_model_info, struct_size) == 0);
CHECK(chat_msg_first, offsetof(dsi_chat_message, struct_size) == 0);
CHECK(chat_opt_first, offsetof(dsi_chat_options, struct_size) == 0);
CHECK(session_opt_first, offsetof(dsi_session_options, struct_size) == 0);
CHECK(sampler_opt_first, offsetof(dsi_sampler_options, struct_size) == 0);
CHECK(gen_opt_first, offsetof(dsi_generate_options, struct_size) == 0);
CHECK(gen_res_first, offsetof(dsi_generate_result, struct_size) == 0);
CHECK(status_is_int32, sizeof(dsi_status) == 4);
CHECK(token_is_int32, sizeof(dsi_token) == 4);
/* Flag values are ABI: pinned, and the stable and experimental bits of one field distinct. */
CHECK(abi_version_2, DSI_ABI_VERSION == 2);
CHECK(model_flag_verify_file, DSI_MODEL_FLAG_VERIFY_FILE == 2u);
CHECK(model_flag_resident, DSI_MODEL_FLAG_RESIDENT == 4u);
CHECK(session_flag_no_fake_quant, DSI_SESSION_FLAG_NO_FAKE_QUANT == 1u);
#if defined(DSI_EXPERIMENTAL)
CHECK(model_flag_coalesce, DSI_MODEL_FLAG_COALESCE == 1u);
CHECK(session_flag_no_capture, DSI_SESSION_FLAG_NO_CAPTURE == (1u << 16));
CHECK(session_flag_f32_state, DSI_SESSION_FLAG_F32_STATE == (1u << 17));
CHECK(model_flags_distinct, (DSI_MODEL_FLAG_COALESCE &
                             (DSI_MODEL_FLAG_VERIFY_FILE | DSI_MODEL_FLAG_RESIDENT)) == 0);
CHECK(session_flags_distinct, (DSI_SESSION_FLAG_NO_CAPTURE & DSI_SESSION_FLAG_NO_FAKE_QUANT) == 0);
#endif

int abi_header_c_probe(void);
int abi_header_c_probe(void) {
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    return (int)o.struct_size + (dsi_status_string(DSI_OK) != NULL);
}
