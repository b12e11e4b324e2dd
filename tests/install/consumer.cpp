// A C++ program built against an install tree with nothing but pkg-config (check-install.sh):
// loads the model given on the command line, runs the chat template through the session and
// generates a few greedy tokens.
#include <dsinfer.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char **argv) {
    if (argc < 2) {
        std::printf("usage: consumer-cpp MODEL.gguf\n");
        return 2;
    }
    if (std::strcmp(dsi_version_string(), DSI_VERSION_STRING) != 0) {
        std::printf("header %s, library %s\n", DSI_VERSION_STRING, dsi_version_string());
        return 1;
    }
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 1;
    dsi_context *ctx = nullptr;
    dsi_model *model = nullptr;
    dsi_session *s = nullptr;
    dsi_sampler *smp = nullptr;
    if (dsi_context_create(&co, &ctx) != DSI_OK || dsi_model_load(ctx, argv[1], nullptr, &model) != DSI_OK ||
        dsi_session_create(model, nullptr, &s) != DSI_OK ||
        dsi_sampler_create_with_context(ctx, nullptr, &smp) != DSI_OK) {
        std::printf("setup failed: %s\n", dsi_last_error());
        return 1;
    }
    dsi_chat_message m;
    dsi_chat_message_init(&m);
    m.content = "Hello from C++";
    const dsi_chat_message *msgs[1] = {&m};
    size_t n = 0;
    dsi_chat_tokenize(model, msgs, 1, nullptr, nullptr, 0, &n);
    std::vector<dsi_token> toks(n);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.max_tokens = 3;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    if (dsi_chat_tokenize(model, msgs, 1, nullptr, toks.data(), toks.size(), &n) != DSI_OK) return 1;
    go.prompt = toks.data();
    go.n_prompt = n;
    if (dsi_session_generate(s, smp, &go, &r) != DSI_OK) {
        std::printf("generate: %s\n", dsi_session_last_error(s));
        return 1;
    }
    std::printf("C++ consumer: %zu prompt tokens, %llu generated (libdsinfer %s)\n", n,
                (unsigned long long)r.n_generated, dsi_version_string());
    dsi_sampler_free(smp);
    dsi_session_free(s);
    dsi_model_free(model);
    return dsi_context_free(ctx) == DSI_OK && r.n_generated > 0 ? 0 : 1;
}
