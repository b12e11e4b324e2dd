/* Every public function survives NULL handles, NULL out-parameters and nonsense sizes:
 * it returns an error status (never DSI_OK) with a message, and nothing is printed. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dsinfer.h"

#define EXPECT_ERR(call)                                                           \
    do {                                                                           \
        dsi_status st_ = (call);                                                   \
        if (st_ == DSI_OK) fail_msg("%s returned DSI_OK", #call);                  \
        assert_true(st_ < 0);                                                      \
    } while (0)

static void test_null_handles(void **state) {
    (void)state;
    char buf[64];
    size_t n = 0;
    int32_t i32 = 0;
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    dsi_token tok = 0;
    const float *fp = NULL;

    /* Context. */
    EXPECT_ERR(dsi_context_create(NULL, NULL));
    EXPECT_ERR(dsi_context_device_count(NULL, &i32));
    EXPECT_ERR(dsi_context_device_info(NULL, 0, NULL));
    assert_string_equal(dsi_context_last_error(NULL), "");
    assert_string_equal(dsi_context_backend(NULL), "");
    assert_int_equal(dsi_context_n_threads(NULL), 0);
    assert_int_equal(dsi_context_free(NULL), DSI_OK);
    dsi_device_info_init(NULL);

    /* Model. */
    dsi_model *m = (dsi_model *)(uintptr_t)1;
    EXPECT_ERR(dsi_model_load(NULL, "x.gguf", NULL, &m));
    assert_null(m);
    EXPECT_ERR(dsi_model_load(NULL, NULL, NULL, NULL));
    EXPECT_ERR(dsi_model_load_from_reader(NULL, NULL, NULL, NULL));
    assert_int_equal(dsi_model_free(NULL), DSI_OK);
    (void)dsi_model_last_error(NULL);
    EXPECT_ERR(dsi_model_get_info(NULL, NULL));
    EXPECT_ERR(dsi_model_type_bytes(NULL, DSI_TYPE_F32, &u64));
    EXPECT_ERR(dsi_model_meta_count(NULL, &i32));
    EXPECT_ERR(dsi_model_meta_key(NULL, 0, buf, sizeof buf, &n));
    EXPECT_ERR(dsi_model_meta_value(NULL, 0, buf, sizeof buf, &n));
    EXPECT_ERR(dsi_model_meta_find(NULL, "general.architecture", buf, sizeof buf, &n));
    dsi_model_options_init(NULL);
    dsi_model_info_init(NULL);
    dsi_reader_init(NULL);
    assert_non_null(dsi_type_name(DSI_TYPE_F32));
    assert_null(dsi_type_name(-5));
    assert_null(dsi_type_name(99999));

    /* Tokenizer and chat. */
    EXPECT_ERR(dsi_tokenize(NULL, "a", 1, 0, NULL, 0, &n));
    EXPECT_ERR(dsi_token_to_bytes(NULL, 0, buf, sizeof buf, &n));
    EXPECT_ERR(dsi_detokenize(NULL, &tok, 1, buf, sizeof buf, &n));
    EXPECT_ERR(dsi_model_special_token(NULL, DSI_SPECIAL_BOS, &tok));
    dsi_detokenizer *d = (dsi_detokenizer *)(uintptr_t)1;
    EXPECT_ERR(dsi_detokenizer_create(NULL, &d));
    EXPECT_ERR(dsi_detokenizer_feed(NULL, 0, buf, sizeof buf, &n));
    EXPECT_ERR(dsi_detokenizer_flush(NULL, buf, sizeof buf, &n));
    dsi_detokenizer_free(NULL);
    EXPECT_ERR(dsi_chat_render(NULL, NULL, 0, NULL, buf, sizeof buf, &n));
    dsi_chat_message_init(NULL);
    dsi_chat_options_init(NULL);

    /* Session. */
    dsi_session *s = (dsi_session *)(uintptr_t)1;
    EXPECT_ERR(dsi_session_create(NULL, NULL, &s));
    dsi_session_free(NULL);
    (void)dsi_session_last_error(NULL);
    EXPECT_ERR(dsi_session_sync(NULL, &tok, 1, &n));
    EXPECT_ERR(dsi_session_append(NULL, &tok, 1));
    EXPECT_ERR(dsi_session_logits(NULL, &fp, &i32));
    EXPECT_ERR(dsi_session_position(NULL, &u32));
    EXPECT_ERR(dsi_session_tokens(NULL, &tok, 1, &n));
    EXPECT_ERR(dsi_session_reset(NULL));
    dsi_session_cancel(NULL);
    dsi_session_options_init(NULL);

    /* Sampler and generation. */
    dsi_sampler *smp = (dsi_sampler *)(uintptr_t)1;
    EXPECT_ERR(dsi_sampler_create(NULL, NULL));
    dsi_sampler_free(NULL);
    (void)dsi_sampler_last_error(NULL);
    float logits[4] = {0, 1, 2, 3};
    EXPECT_ERR(dsi_sampler_sample(NULL, logits, 4, &tok));
    EXPECT_ERR(dsi_sampler_accept(NULL, 0));
    EXPECT_ERR(dsi_sampler_reset(NULL));
    EXPECT_ERR(dsi_sampler_probs(NULL, &fp, &i32));
    dsi_sampler_options_init(NULL);
    dsi_generate_options_init(NULL);
    dsi_generate_result_init(NULL);
    EXPECT_ERR(dsi_session_generate(NULL, NULL, NULL, NULL));
    (void)smp;
}

/* A real context, with bad arguments to everything that takes it. */
static void test_bad_arguments_with_context(void **state) {
    (void)state;
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(NULL, &ctx), DSI_OK);
    dsi_model *m = NULL;
    EXPECT_ERR(dsi_model_load(ctx, NULL, NULL, &m));
    EXPECT_ERR(dsi_model_load(ctx, "/nonexistent/model.gguf", NULL, &m));
    assert_null(m);
    assert_true(strlen(dsi_last_error()) > 0);
    EXPECT_ERR(dsi_model_load(ctx, "/", NULL, &m)); /* a directory */
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.struct_size = 3;
    EXPECT_ERR(dsi_model_load(ctx, "/nonexistent/model.gguf", &mo, &m));
    dsi_model_options_init(&mo);
    mo.access = 42;
    EXPECT_ERR(dsi_model_load(ctx, "/nonexistent/model.gguf", &mo, &m));
    dsi_reader r;
    dsi_reader_init(&r);
    EXPECT_ERR(dsi_model_load_from_reader(ctx, &r, NULL, &m)); /* no pread_fn */
    assert_null(m);

    /* Sampler options. */
    dsi_sampler_options so;
    dsi_sampler *smp = NULL;
    dsi_sampler_options_init(&so);
    so.temperature = -1.0f;
    EXPECT_ERR(dsi_sampler_create(&so, &smp));
    assert_null(smp);
    dsi_sampler_options_init(&so);
    so.top_p = 0.0f;
    EXPECT_ERR(dsi_sampler_create(&so, &smp));
    dsi_sampler_options_init(&so);
    so.struct_size = 0;
    EXPECT_ERR(dsi_sampler_create(&so, &smp));
    dsi_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_handles),
        cmocka_unit_test(test_bad_arguments_with_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
