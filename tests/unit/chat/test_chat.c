/*
 * DeepSeek V4 chat encoding: byte-exact fixtures. Every expected string is written by hand
 * from the format description (model-spec.md §6 and the official encoding_dsv4.py rules
 * summarized in docs/tokenizer.md), not produced by the code under test.
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

#include "tokenizer/chat.h"

#define BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define ASST "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define MAXP "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n" \
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n" \
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"

static dsi_chat_message msg(int32_t role, const char *content, const char *reasoning) {
    dsi_chat_message m;
    dsi_chat_message_init(&m);
    m.role = role;
    m.content = content;
    m.reasoning = reasoning;
    return m;
}

static void expect(const dsi_chat_message *ms, size_t n, int32_t thinking, int32_t gen,
                   int32_t bos, const char *want) {
    const dsi_chat_message *ptr[16];
    for (size_t i = 0; i < n; i++) ptr[i] = &ms[i];
    dsi_chat_options o;
    dsi_chat_options_init(&o);
    o.thinking = thinking;
    o.add_generation_prompt = gen;
    o.add_bos = bos;
    char *out = NULL;
    size_t len = 0;
    dsii_error e;
    dsi_status st = dsii_chat_render(NULL, ptr, n, &o, &out, &len, &e);
    if (st != DSI_OK) fail_msg("render: %s", e.msg);
    if (len != strlen(want) || memcmp(out, want, len) != 0)
        fail_msg("rendered\n[%s]\nexpected\n[%s]", out, want);
    dsii_free(NULL, out);
}

static void test_single_turn(void **state) {
    (void)state;
    dsi_chat_message m[] = {msg(DSI_ROLE_USER, "Hello", NULL)};
    expect(m, 1, DSI_THINKING_OFF, 1, 1, BOS USER "Hello" ASST "</think>");
    expect(m, 1, DSI_THINKING_ON, 1, 1, BOS USER "Hello" ASST "<think>");
    expect(m, 1, DSI_THINKING_OFF, 0, 1, BOS USER "Hello");
    expect(m, 1, DSI_THINKING_ON, 1, 0, USER "Hello" ASST "<think>");
}

static void test_system(void **state) {
    (void)state;
    dsi_chat_message m[] = {msg(DSI_ROLE_SYSTEM, "You are helpful.", NULL), msg(DSI_ROLE_USER, "Hi", NULL)};
    expect(m, 2, DSI_THINKING_OFF, 1, 1, BOS "You are helpful." USER "Hi" ASST "</think>");
    /* §8: the official vectors render an empty system the same way as none */
    dsi_chat_message e[] = {msg(DSI_ROLE_SYSTEM, "", NULL), msg(DSI_ROLE_USER, "Hi", NULL)};
    expect(e, 2, DSI_THINKING_OFF, 1, 1, BOS USER "Hi" ASST "</think>");
}

static void test_multi_turn_off(void **state) {
    (void)state;
    dsi_chat_message m[] = {
        msg(DSI_ROLE_SYSTEM, "S", NULL), msg(DSI_ROLE_USER, "A", NULL),
        msg(DSI_ROLE_ASSISTANT, "B", "hidden reasoning"), msg(DSI_ROLE_USER, "C", NULL)};
    expect(m, 4, DSI_THINKING_OFF, 1, 1, BOS "S" USER "A" ASST "</think>B" EOS USER "C" ASST "</think>");
}

static void test_multi_turn_thinking(void **state) {
    (void)state;
    /* earlier reasoning is dropped; the completed turn reads </think> + content + EOS */
    dsi_chat_message m[] = {
        msg(DSI_ROLE_USER, "A", NULL), msg(DSI_ROLE_ASSISTANT, "B", "R1"), msg(DSI_ROLE_USER, "C", NULL)};
    expect(m, 3, DSI_THINKING_ON, 1, 1, BOS USER "A" ASST "</think>B" EOS USER "C" ASST "<think>");
    /* an assistant turn after the last user turn keeps its reasoning */
    dsi_chat_message k[] = {msg(DSI_ROLE_USER, "A", NULL), msg(DSI_ROLE_ASSISTANT, "B", "R")};
    expect(k, 2, DSI_THINKING_ON, 1, 1, BOS USER "A" ASST "<think>R</think>B" EOS);
    expect(k, 2, DSI_THINKING_OFF, 1, 1, BOS USER "A" ASST "</think>B" EOS);
    dsi_chat_message nr[] = {msg(DSI_ROLE_USER, "A", NULL), msg(DSI_ROLE_ASSISTANT, "B", NULL)};
    expect(nr, 2, DSI_THINKING_ON, 1, 1, BOS USER "A" ASST "<think></think>B" EOS);
}

static void test_tool_results(void **state) {
    (void)state;
    dsi_chat_message m[] = {
        msg(DSI_ROLE_USER, "Weather?", NULL), msg(DSI_ROLE_ASSISTANT, "calling", NULL),
        msg(DSI_ROLE_TOOL, "Sunny", NULL), msg(DSI_ROLE_TOOL, "Windy", NULL),
        msg(DSI_ROLE_USER, "thanks", NULL)};
    expect(m, 5, DSI_THINKING_OFF, 1, 1,
           BOS USER "Weather?" ASST "</think>calling" EOS
           USER "<tool_result>Sunny</tool_result>\n\n<tool_result>Windy</tool_result>\n\nthanks" ASST "</think>");
    /* a tool result as the last message: the assistant prefix follows it */
    expect(m, 3, DSI_THINKING_ON, 1, 1,
           BOS USER "Weather?" ASST "</think>calling" EOS USER "<tool_result>Sunny</tool_result>" ASST "<think>");
}

static void test_consecutive_users_merge(void **state) {
    (void)state;
    dsi_chat_message m[] = {msg(DSI_ROLE_USER, "one", NULL), msg(DSI_ROLE_USER, "two", NULL)};
    expect(m, 2, DSI_THINKING_OFF, 1, 1, BOS USER "one\n\ntwo" ASST "</think>");
}

static void test_think_max(void **state) {
    (void)state;
    dsi_chat_message m[] = {msg(DSI_ROLE_USER, "Prove it.", NULL)};
    expect(m, 1, DSI_THINKING_MAX, 1, 1, BOS MAXP USER "Prove it." ASST "<think>");
    dsi_chat_message s[] = {msg(DSI_ROLE_SYSTEM, "Sys", NULL), msg(DSI_ROLE_USER, "Q", NULL)};
    expect(s, 2, DSI_THINKING_MAX, 1, 1, BOS MAXP "Sys" USER "Q" ASST "<think>");
    assert_int_equal(strcmp(dsii_chat_think_max_prefix, MAXP), 0);
}

static void test_edges(void **state) {
    (void)state;
    expect(NULL, 0, DSI_THINKING_OFF, 1, 1, BOS);
    dsi_chat_message m[] = {msg(DSI_ROLE_USER, NULL, NULL)};
    expect(m, 1, DSI_THINKING_OFF, 1, 1, BOS USER ASST "</think>");
    /* UTF-8 and special-looking text pass through verbatim */
    dsi_chat_message u[] = {msg(DSI_ROLE_USER, "\xe4\xbd\xa0\xe5\xa5\xbd <think>", NULL)};
    expect(u, 1, DSI_THINKING_OFF, 1, 1, BOS USER "\xe4\xbd\xa0\xe5\xa5\xbd <think>" ASST "</think>");
    /* assistant first (no user turn at all) */
    dsi_chat_message a[] = {msg(DSI_ROLE_ASSISTANT, "x", "r")};
    expect(a, 1, DSI_THINKING_ON, 1, 1, BOS "r</think>x" EOS);
}

static void test_errors(void **state) {
    (void)state;
    dsi_chat_options o;
    dsi_chat_options_init(&o);
    char *out = NULL;
    size_t len;
    dsii_error e;
    dsi_chat_message m = msg(7, "x", NULL);
    const dsi_chat_message *p[1] = {&m};
    assert_int_equal(dsii_chat_render(NULL, p, 1, &o, &out, &len, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "messages[0].role"));
    assert_null(out);
    m.role = DSI_ROLE_USER;
    m.struct_size = 1000;
    assert_int_equal(dsii_chat_render(NULL, p, 1, &o, &out, &len, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "messages[0]"));
    /* an older, smaller message struct (no reasoning field) is fine */
    m.struct_size = (uint32_t)offsetof(dsi_chat_message, reasoning);
    assert_int_equal(dsii_chat_render(NULL, p, 1, &o, &out, &len, &e), DSI_OK);
    dsii_free(NULL, out);
    assert_int_equal(dsii_chat_render(NULL, NULL, 2, &o, &out, &len, &e), DSI_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_turn),
        cmocka_unit_test(test_system),
        cmocka_unit_test(test_multi_turn_off),
        cmocka_unit_test(test_multi_turn_thinking),
        cmocka_unit_test(test_tool_results),
        cmocka_unit_test(test_consecutive_users_merge),
        cmocka_unit_test(test_think_max),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
