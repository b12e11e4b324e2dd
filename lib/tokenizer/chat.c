/*
 * DeepSeek V4 chat encoding (model-spec.md §6). Follows the official renderer
 * (encoding/encoding_dsv4.py, `encode_messages` with drop_thinking = True and no tools):
 *
 *   prompt = [BOS] + render(0) + render(1) + …   over the messages after tool merging:
 *   - tool results become "<tool_result>{content}</tool_result>" blocks of a user message;
 *     a run of consecutive user / tool messages is ONE user turn whose blocks are joined
 *     with "\n\n" (merge_tool_messages);
 *   - message 0 starts with the Think Max instruction when thinking is MAX;
 *   - system:    {content}
 *   - user:      <｜User｜>{blocks joined by "\n\n"}
 *                + if the next message is an assistant turn or there is none:
 *                  <｜Assistant｜> + "<think>" (thinking on, this is the last user turn)
 *                                  or "</think>" (thinking off, or an earlier turn)
 *   - assistant: [{reasoning}</think>  — only with thinking on and after the last user
 *                 turn; earlier reasoning is dropped] {content}<｜end▁of▁sentence｜>
 * add_generation_prompt = 0 leaves out the <｜Assistant｜>… suffix after a final user turn
 * (the official renderer always writes it).
 */
#include "tokenizer/chat.h"

#include <stdio.h>
#include <string.h>

void dsii_chat_message_defaults(dsi_chat_message *msg) {
    if (!msg) return;
    memset(msg, 0, sizeof *msg);
    msg->struct_size = sizeof *msg;
    msg->role = DSI_ROLE_USER;
}

#define S_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define S_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define S_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define S_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"

const char dsii_chat_think_max_prefix[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n";

typedef struct {
    const dsi_context *ctx;
    char *p;
    uint8_t *mask;     /* NULL unless the caller wants the template mask */
    int want_mask;
    size_t n, cap;
    int oom;
} sbuf;

/* Appends `s`; `tmpl` says whether the bytes are the template's own (1) or a message's (0). */
static void put_as(sbuf *b, const char *s, uint8_t tmpl) {
    size_t l = strlen(s);
    if (b->oom || l == 0) return;
    if (b->n + l + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + l + 1) c *= 2;
        char *np = dsii_realloc(b->ctx, b->p, c);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        if (b->want_mask) {
            uint8_t *nm = dsii_realloc(b->ctx, b->mask, c);
            if (!nm) { b->oom = 1; return; }
            b->mask = nm;
        }
        b->cap = c;
    }
    memcpy(b->p + b->n, s, l);
    if (b->want_mask) memset(b->mask + b->n, tmpl, l);
    b->n += l;
    b->p[b->n] = 0;
}

static void put(sbuf *b, const char *s) { put_as(b, s, 1); }
static void put_content(sbuf *b, const char *s) { put_as(b, s, 0); }

/* A merged message: a run [first, last] of input messages (a user turn may span several). */
typedef struct {
    int32_t role;
    size_t first, last;
} turn;

dsi_status dsii_chat_render(const dsi_context *ctx, const dsi_chat_message *const *messages,
                            size_t n, const dsi_chat_options *opt, char **out, size_t *len,
                            dsii_error *err) {
    return dsii_chat_render_masked(ctx, messages, n, opt, out, len, NULL, err);
}

dsi_status dsii_chat_render_masked(const dsi_context *ctx,
                                   const dsi_chat_message *const *messages, size_t n,
                                   const dsi_chat_options *opt, char **out, size_t *len,
                                   uint8_t **template_mask, dsii_error *err) {
    *out = NULL;
    *len = 0;
    if (template_mask) *template_mask = NULL;
    if (n > 0 && !messages)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_chat_render: messages is NULL but n is %zu", n);
    dsi_chat_message *m = dsii_calloc(ctx, n ? n : 1, sizeof *m);
    turn *tv = dsii_calloc(ctx, n ? n : 1, sizeof *tv);
    sbuf b = {ctx, NULL, NULL, template_mask != NULL, 0, 0, 0};
    dsi_status st = DSI_OK;
    if (!m || !tv) { st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_chat_render: out of memory"); goto done; }
    for (size_t i = 0; i < n; i++) {
        if (!messages[i]) { st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_chat_render: messages[%zu] is NULL", i); goto done; }
        dsii_chat_message_defaults(&m[i]);
        char what[64];
        snprintf(what, sizeof what, "dsi_chat_message (messages[%zu])", i);
        st = dsii_read_options(&m[i], sizeof m[i], messages[i], what, err);
        if (st != DSI_OK) goto done;
        if (m[i].role < DSI_ROLE_SYSTEM || m[i].role > DSI_ROLE_TOOL) {
            st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_chat_render: messages[%zu].role = %d is not a DSI_ROLE_* value",
                           i, (int)m[i].role);
            goto done;
        }
    }
    /* merge_tool_messages: user and tool messages in a row form one user turn */
    size_t nt = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t r = m[i].role == DSI_ROLE_TOOL ? DSI_ROLE_USER : m[i].role;
        if (r == DSI_ROLE_USER && nt > 0 && tv[nt - 1].role == DSI_ROLE_USER) {
            tv[nt - 1].last = i;
            continue;
        }
        tv[nt].role = r;
        tv[nt].first = tv[nt].last = i;
        nt++;
    }
    const int thinking = opt->thinking != DSI_THINKING_OFF;
    size_t last_user = SIZE_MAX;
    for (size_t k = 0; k < nt; k++)
        if (tv[k].role == DSI_ROLE_USER) last_user = k;

    if (opt->add_bos) put(&b, S_BOS);
    for (size_t k = 0; k < nt; k++) {
        if (k == 0 && opt->thinking == DSI_THINKING_MAX) put(&b, dsii_chat_think_max_prefix);
        const turn *t = &tv[k];
        const dsi_chat_message *mm = &m[t->first];
        if (t->role == DSI_ROLE_SYSTEM) {
            put_content(&b, mm->content ? mm->content : "");
        } else if (t->role == DSI_ROLE_USER) {
            put(&b, S_USER);
            for (size_t i = t->first; i <= t->last; i++) {
                if (i > t->first) put(&b, "\n\n");
                const char *c = m[i].content ? m[i].content : "";
                if (m[i].role == DSI_ROLE_TOOL) {
                    put(&b, "<tool_result>");
                    put_content(&b, c);
                    put(&b, "</tool_result>");
                } else {
                    put_content(&b, c);
                }
            }
        } else { /* assistant */
            if (thinking && (last_user == SIZE_MAX || k > last_user)) {
                put_content(&b, mm->reasoning ? mm->reasoning : "");
                put(&b, "</think>");
            }
            put_content(&b, mm->content ? mm->content : "");
            put(&b, S_EOS);
        }
        /* transition after a user turn followed by an assistant turn or by nothing */
        if (t->role == DSI_ROLE_USER) {
            int next_is_assistant = k + 1 < nt && tv[k + 1].role == DSI_ROLE_ASSISTANT;
            int is_end = k + 1 == nt;
            if (next_is_assistant || (is_end && opt->add_generation_prompt)) {
                put(&b, S_ASSISTANT);
                put(&b, thinking && k >= last_user ? "<think>" : "</think>");
            }
        }
    }
    if (b.oom) { st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_chat_render: out of memory"); goto done; }
    if (!b.p) {
        b.p = dsii_malloc(ctx, 1);
        if (!b.p) { st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_chat_render: out of memory"); goto done; }
        b.p[0] = 0;
    }
    if (template_mask && !b.mask) {
        b.mask = dsii_malloc(ctx, 1);
        if (!b.mask) { st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_chat_render: out of memory"); goto done; }
    }
    *out = b.p;
    *len = b.n;
    if (template_mask) *template_mask = b.mask;
    b.p = NULL;
    b.mask = NULL;
done:
    dsii_free(ctx, b.p);
    dsii_free(ctx, b.mask);
    dsii_free(ctx, m);
    dsii_free(ctx, tv);
    return st;
}
