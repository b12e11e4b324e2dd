/* A fake backend module for the loader tests: with FAKE_NO_ENTRY it lacks the entry symbol,
 * otherwise its table claims backend API FAKE_API (a mismatch unless equal to
 * DSIB_API_VERSION) and struct_size FAKE_SIZE. */
#include "backends/backend.h"

#ifndef FAKE_NO_ENTRY
static const dsib_backend fake = {.struct_size = FAKE_SIZE, .api_version = FAKE_API, .name = "vulkan"};
__attribute__((visibility("default"))) const dsib_backend *dsi_backend_module_entry(void) {
    return &fake;
}
#else
__attribute__((visibility("default"))) int dsi_fake_module_marker(void) { return 42; }
#endif
