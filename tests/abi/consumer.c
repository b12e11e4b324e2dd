/* A downstream program built with nothing but `pkg-config --cflags --libs dsinfer`
 * against an install tree. It creates a context, lists devices and, when given a model
 * path, loads it and prints its architecture. */
#include <dsinfer.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    printf("libdsinfer %s (ABI %u)\n", dsi_version_string(), dsi_abi_version());
    if (strcmp(dsi_version_string(), DSI_VERSION_STRING) != 0) {
        printf("header/library version mismatch: %s vs %s\n", DSI_VERSION_STRING, dsi_version_string());
        return 1;
    }
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.n_threads = 1;
    dsi_context *ctx = NULL;
    dsi_status st = dsi_context_create(&o, &ctx);
    if (st != DSI_OK) {
        printf("dsi_context_create: %s: %s\n", dsi_status_string(st), dsi_last_error());
        return 1;
    }
    int32_t n = 0;
    if (dsi_context_device_count(ctx, &n) != DSI_OK || n < 1) return 1;
    for (int32_t i = 0; i < n; i++) {
        dsi_device_info info;
        dsi_device_info_init(&info);
        if (dsi_context_device_info(ctx, i, &info) != DSI_OK) return 1;
        printf("device %d: [%s] %s\n", i, info.backend, info.name);
    }
    int rc = 0;
    if (argc > 1) {
        dsi_model *model = NULL;
        st = dsi_model_load(ctx, argv[1], NULL, &model);
        if (st != DSI_OK) {
            printf("dsi_model_load: %s: %s\n", dsi_status_string(st), dsi_last_error());
            rc = 1;
        } else {
            dsi_model_info mi;
            dsi_model_info_init(&mi);
            dsi_model_get_info(model, &mi);
            printf("model: %s, %d layers, vocab %d\n", mi.arch_name, mi.n_layers, mi.n_vocab);
            dsi_model_free(model);
        }
    }
    dsi_context_free(ctx);
    return rc;
}
