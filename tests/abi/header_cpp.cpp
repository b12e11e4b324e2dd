// The public header compiled as C++17 with -Wall -Wextra -Werror -pedantic, and linked
// and run against the shared library.
#include "dsinfer.h"

#include <cstdio>
#include <cstring>

int main() {
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    dsi_context *ctx = nullptr;
    if (dsi_context_create(&o, &ctx) != DSI_OK || ctx == nullptr) {
        std::printf("context creation failed: %s\n", dsi_last_error());
        return 1;
    }
    if (std::strcmp(dsi_version_string(), DSI_VERSION_STRING) != 0) return 1;
    if (dsi_context_free(ctx) != DSI_OK) return 1;
    std::printf("C++ consumer ok (%s)\n", dsi_version_string());
    return 0;
}
