/*
 * libFuzzer target of dsinfer-convert's safetensors header parser (tools/convert/
 * safetensors.c, st_parse_header): the input's first 8 bytes are the size of the data section
 * the header may address (little-endian), the rest is the header JSON. The parser must
 * accept or refuse every input without crashing, leaking or allocating far beyond its size;
 * what it accepts must satisfy its own invariants (offsets inside the data section, sizes
 * matching dtype x shape, no overlap), which this target re-checks.
 */
#include "safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t ds = 0;
    for (int i = 0; i < 8; i++) ds |= (uint64_t)data[i] << (8 * i);
    ds &= (1ull << 40) - 1;
    st_header h;
    char err[512];
    if (st_parse_header((const char *)data + 8, size - 8, ds, "fuzz", &h, err, sizeof err) != 0) {
        if (!err[0]) abort(); /* a refusal always says why */
        return 0;
    }
    for (size_t i = 0; i < h.n; i++) {
        const st_tensor *t = &h.t[i];
        if (t->end > ds || t->begin > t->end || t->end - t->begin != st_numel(t) * st_dtype_size(t->dtype)) abort();
        for (size_t j = 0; j < i; j++) {
            const st_tensor *u = &h.t[j];
            if (t->begin < u->end && u->begin < t->end && t->begin != t->end && u->begin != u->end) abort();
        }
    }
    st_header_free(&h);
    return 0;
}
