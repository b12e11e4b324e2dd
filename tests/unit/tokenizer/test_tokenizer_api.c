/*
 * Public tokenizer / detokenizer / chat functions on the build's tiny-v41.gguf
 * (dsinfer-mkmodel): argument checks, the two-call pattern, special tokens, round trips,
 * and incremental detokenizing. Exits 77 (skip) when the model file has not been built.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsinfer.h"
#include "tests/common/skip.h"

#define S_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define S_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define S_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

static char model_path[4096];
static dsi_context *ctx;
static dsi_model *model;

static int setup(void **state) {
    (void)state;
    if (dsi_context_create(NULL, &ctx) != DSI_OK) return -1;
    if (dsi_model_load(ctx, model_path, NULL, &model) != DSI_OK) {
        fprintf(stderr, "load %s: %s\n", model_path, dsi_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dsi_model_free(model);
    dsi_context_free(ctx);
    return 0;
}

static void test_tokenize_roundtrip(void **state) {
    (void)state;
    const char *texts[] = {"Hello world, this is a test.\n", "\xe4\xbd\xa0\xe5\xa5\xbd 123456",
                           "\xff\xfe bad \xe4\xb8", "", "  \t\r\n "};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        size_t len = strlen(texts[k]), need = 0;
        dsi_status st = dsi_tokenize(model, texts[k], len, 0, NULL, 0, &need);
        if (len == 0) {
            assert_int_equal(st, DSI_OK);
            assert_int_equal(need, 0);
            continue;
        }
        assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        assert_true(need > 0);
        assert_true(strlen(dsi_model_last_error(model)) > 0);
        dsi_token *ids = malloc(need * sizeof *ids);
        size_t n2 = 0;
        assert_int_equal(dsi_tokenize(model, texts[k], len, 0, ids, need, &n2), DSI_OK);
        assert_int_equal(n2, need);
        char buf[512];
        size_t bl = 0;
        assert_int_equal(dsi_detokenize(model, ids, n2, buf, sizeof buf, &bl), DSI_OK);
        assert_int_equal(bl, len);
        assert_memory_equal(buf, texts[k], len);
        /* token_to_bytes concatenated equals detokenize */
        size_t off = 0;
        for (size_t i = 0; i < n2; i++) {
            size_t tl = 0;
            assert_int_equal(dsi_token_to_bytes(model, ids[i], buf + off, sizeof buf - off, &tl), DSI_OK);
            off += tl;
        }
        assert_int_equal(off, len);
        free(ids);
    }
}

static void test_special_api(void **state) {
    (void)state;
    dsi_token bos, eos, user, asst, tb, te;
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_BOS, &bos), DSI_OK);
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_EOS, &eos), DSI_OK);
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_USER, &user), DSI_OK);
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_ASSISTANT, &asst), DSI_OK);
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_THINK_BEGIN, &tb), DSI_OK);
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_THINK_END, &te), DSI_OK);
    assert_int_equal(dsi_model_special_token(model, 99, &bos), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_model_last_error(model), "DSI_SPECIAL"));
    assert_int_equal(dsi_model_special_token(model, DSI_SPECIAL_BOS, NULL), DSI_ERR_INVALID_ARGUMENT);
    char buf[64];
    size_t n;
    assert_int_equal(dsi_token_to_bytes(model, user, buf, sizeof buf, &n), DSI_OK);
    assert_int_equal(n, strlen(S_USER));
    assert_memory_equal(buf, S_USER, n);

    const char *text = S_USER "hi" S_ASSISTANT "</think>";
    dsi_token ids[64];
    assert_int_equal(dsi_tokenize(model, text, strlen(text), DSI_TOKENIZE_PARSE_SPECIAL | DSI_TOKENIZE_ADD_BOS,
                                  ids, 64, &n), DSI_OK);
    assert_true(n >= 5);
    assert_int_equal(ids[0], bos);
    assert_int_equal(ids[1], user);
    assert_int_equal(ids[n - 2], asst);
    assert_int_equal(ids[n - 1], te);
    assert_int_equal(dsi_tokenize(model, text, strlen(text), 0, ids, 64, &n), DSI_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_not_equal(ids[i], user);
        assert_int_not_equal(ids[i], asst);
        assert_int_not_equal(ids[i], te);
    }
    /* errors */
    assert_int_equal(dsi_tokenize(model, NULL, 3, 0, ids, 64, &n), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_tokenize(model, "a", 1, 0, ids, 64, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_tokenize(model, "a", 1, 1u << 7, ids, 64, &n), DSI_ERR_INVALID_ARGUMENT);
    dsi_model_info info;
    dsi_model_info_init(&info);
    assert_int_equal(dsi_model_get_info(model, &info), DSI_OK);
    assert_int_equal(dsi_token_to_bytes(model, info.n_vocab, buf, sizeof buf, &n), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_token_to_bytes(model, -1, buf, sizeof buf, &n), DSI_ERR_INVALID_ARGUMENT);
    dsi_token badv[2] = {0, info.n_vocab};
    assert_int_equal(dsi_detokenize(model, badv, 2, buf, sizeof buf, &n), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_model_last_error(model), "tokens[1]"));
}

static void test_detokenizer_stream(void **state) {
    (void)state;
    /* a string whose characters are split over byte tokens: 中 (3 bytes), 😀 (4 bytes) */
    const char *text = "a\xe4\xb8\xad\xf0\x9f\x98\x80z";
    dsi_token ids[64];
    size_t n;
    assert_int_equal(dsi_tokenize(model, text, strlen(text), 0, ids, 64, &n), DSI_OK);
    dsi_detokenizer *d = NULL;
    assert_int_equal(dsi_detokenizer_create(model, &d), DSI_OK);
    char out[256];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t need = 0;
        /* too small first: nothing consumed */
        dsi_status st = dsi_detokenizer_feed(d, ids[i], NULL, 0, &need);
        if (need > 0) assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        size_t got = 0;
        if (st == DSI_OK) {
            assert_int_equal(need, 0); /* nothing to write: the token was consumed */
        } else {
            assert_int_equal(dsi_detokenizer_feed(d, ids[i], out + o, sizeof out - o, &got), DSI_OK);
            assert_int_equal(got, need);
        }
        /* every piece is complete UTF-8 */
        for (size_t k = o; k < o + got;) {
            unsigned char c = (unsigned char)out[k];
            size_t cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            assert_true(k + cl <= o + got);
            k += cl;
        }
        o += got;
    }
    size_t fl = 9;
    assert_int_equal(dsi_detokenizer_flush(d, out + o, sizeof out - o, &fl), DSI_OK);
    assert_int_equal(fl, 0);
    assert_int_equal(o, strlen(text));
    assert_memory_equal(out, text, o);
    /* an unfinished character at the end comes out as U+FFFD at flush */
    const char *cut = "\xe4\xb8";
    assert_int_equal(dsi_tokenize(model, cut, 2, 0, ids, 64, &n), DSI_OK);
    for (size_t i = 0; i < n; i++) {
        size_t got;
        assert_int_equal(dsi_detokenizer_feed(d, ids[i], out, sizeof out, &got), DSI_OK);
        assert_int_equal(got, 0);
    }
    assert_int_equal(dsi_detokenizer_flush(d, out, sizeof out, &fl), DSI_OK);
    assert_int_equal(fl, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    assert_int_equal(dsi_detokenizer_feed(d, -5, out, sizeof out, &fl), DSI_ERR_INVALID_ARGUMENT);
    dsi_detokenizer_free(d);
    assert_int_equal(dsi_detokenizer_create(model, NULL), DSI_ERR_INVALID_ARGUMENT);
}

static void test_chat_render_api(void **state) {
    (void)state;
    dsi_chat_message u;
    dsi_chat_message_init(&u);
    u.role = DSI_ROLE_USER;
    u.content = "hi";
    const dsi_chat_message *msgs[1] = {&u};
    size_t need = 0;
    assert_int_equal(dsi_chat_render(model, msgs, 1, NULL, NULL, 0, &need), DSI_ERR_INVALID_ARGUMENT);
    const char *want = S_BOS S_USER "hi" S_ASSISTANT "</think>";
    assert_int_equal(need, strlen(want));
    char buf[256];
    memset(buf, 'X', sizeof buf);
    assert_int_equal(dsi_chat_render(model, msgs, 1, NULL, buf, sizeof buf, &need), DSI_OK);
    assert_string_equal(buf, want);
    /* rendered text tokenizes with the specials as single ids */
    dsi_token ids[64];
    size_t n;
    assert_int_equal(dsi_tokenize(model, buf, need, DSI_TOKENIZE_PARSE_SPECIAL, ids, 64, &n), DSI_OK);
    dsi_token bos, te;
    dsi_model_special_token(model, DSI_SPECIAL_BOS, &bos);
    dsi_model_special_token(model, DSI_SPECIAL_THINK_END, &te);
    assert_int_equal(ids[0], bos);
    assert_int_equal(ids[n - 1], te);
    /* bad role / options / message size */
    u.role = 9;
    assert_int_equal(dsi_chat_render(model, msgs, 1, NULL, buf, sizeof buf, &need), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_model_last_error(model), "messages[0].role"));
    u.role = DSI_ROLE_USER;
    dsi_chat_options o;
    dsi_chat_options_init(&o);
    o.thinking = 7;
    assert_int_equal(dsi_chat_render(model, msgs, 1, &o, buf, sizeof buf, &need), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_model_last_error(model), "thinking"));
    u.struct_size = 2;
    assert_int_equal(dsi_chat_render(model, msgs, 1, NULL, buf, sizeof buf, &need), DSI_ERR_INVALID_ARGUMENT);
    u.struct_size = sizeof u;
    const dsi_chat_message *nullmsg[1] = {NULL};
    assert_int_equal(dsi_chat_render(model, nullmsg, 1, NULL, buf, sizeof buf, &need), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_chat_render(model, NULL, 1, NULL, buf, sizeof buf, &need), DSI_ERR_INVALID_ARGUMENT);
    /* an older caller's smaller options struct: fields it lacks take defaults */
    o.thinking = DSI_THINKING_ON;
    o.struct_size = (uint32_t)(offsetof(dsi_chat_options, thinking) + sizeof o.thinking);
    assert_int_equal(dsi_chat_render(model, msgs, 1, &o, buf, sizeof buf, &need), DSI_OK);
    assert_string_equal(buf, S_BOS S_USER "hi" S_ASSISTANT "<think>");
}

int main(void) {
    const char *dir = getenv("DSI_MODELS_DIR");
    snprintf(model_path, sizeof model_path, "%s/tiny-v41.gguf", dir ? dir : "models");
    if (access(model_path, R_OK) != 0)
        return dsit_absent("MODELS", "%s not built (dsinfer-mkmodel writes it)", model_path);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_roundtrip),
        cmocka_unit_test(test_special_api),
        cmocka_unit_test(test_detokenizer_stream),
        cmocka_unit_test(test_chat_render_api),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
