/*
 * libFuzzer target for the snapshot loader (lib/kv/snapshot.c, docs/snapshots.md): header
 * check and full validation of arbitrary bytes against a fixed target layout (a ring, row
 * arrays with and without a ratio). Built with -DDSII_SNAP_FUZZ, which makes checksum
 * mismatches non-fatal so that mutations get past them into the section and layout checks
 * (the checksums themselves are covered by tests/model/test_snapshot.c).
 *
 * The same file with -DFUZZ_GEN_SEEDS is the seed generator: `fuzz_snapshot_seeds DIR`
 * writes valid snapshots for that layout (hand-encoded here, independently of the writer).
 */
#include "kv/snapshot.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t k_fp[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void target(dsii_kv_layout *l, dsii_snap_target *t) {
    dsii_kv_layout_init(l, NULL, 4);
    dsii_kv_add(l, DSII_KV_RING, 8 + 4, 8);       /* span 8 */
    uint32_t r = dsii_kv_add(l, DSII_KV_ROWS, 33, 4);
    dsii_kv_set_ratio(l, r, 2);
    dsii_kv_add(l, DSII_KV_ROWS, 5, 2);           /* ratio unknown */
    memset(t, 0, sizeof *t);
    memcpy(t->id.fingerprint, k_fp, 16);
    t->id.arch = 2;
    t->id.n_vocab = 50;
    t->id.state_flags = 0;
    t->n_ctx = 64;
    t->layout = l;
}

#ifndef FUZZ_GEN_SEEDS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dsii_kv_layout l;
    static dsii_snap_target t;
    static int init;
    if (!init) {
        target(&l, &t);
        init = 1;
    }
    dsii_error e;
    dsii_error_clear(&e);
    uint64_t total = 0;
    dsii_snap_check_header(data, size, &t, &total, &e);
    dsii_snap_view v;
    if (dsii_snap_validate(data, size, &t, 50, &v, &e) == DSI_OK) {
        /* a validated view must be readable in full */
        int32_t tok[64];
        float lg[50];
        if (v.n_tokens > 64) abort();
        dsii_snap_tokens(&v, tok);
        dsii_snap_logits(&v, 50, lg);
        uint64_t s = v.state_bytes;
        volatile uint8_t x = 0;
        for (uint64_t i = 0; i < s; i++) x ^= v.state[i];
        (void)x;
    }
    return 0;
}

#else /* seed generator */

static uint8_t buf[1 << 16];
static size_t n;

static void p32(uint32_t v) {
    for (int i = 0; i < 4; i++) buf[n++] = (uint8_t)(v >> (8 * i));
}
static void p64(uint64_t v) {
    for (int i = 0; i < 8; i++) buf[n++] = (uint8_t)(v >> (8 * i));
}

static void section(uint32_t tag, const uint8_t *payload, size_t len) {
    size_t h = n;
    p32(tag);
    p32(0);
    p64(len);
    memcpy(buf + n, payload, len);
    n += len;
    p64(XXH3_64bits(buf + h, 16 + len));
}

static int write_seed(const char *dir, int k, uint32_t L, int logits) {
    dsii_kv_layout l;
    dsii_snap_target t;
    target(&l, &t);
    uint8_t pay[1 << 15];
    n = 0;
    memcpy(buf, "DSISNAP\x1a", 8);
    n = 8;
    p32(1);
    p32(128);
    memcpy(buf + n, k_fp, 16);
    n += 16;
    p32(2);
    p32(50);
    p32(0);
    p32(L);
    p32(logits ? 1 : 0);
    p32(l.n);
    p32(4);
    p32(4);
    size_t total_at = n;
    p64(0);
    memset(buf + n, 0, 48);
    memcpy(buf + n, "cpu", 3);
    n += 48;
    size_t hc = n;
    p64(0);
    /* sections */
    size_t pl = 0;
    for (uint32_t i = 0; i < L; i++) {
        uint32_t tk = (i * 7 + 3) % 50;
        for (int b = 0; b < 4; b++) pay[pl++] = (uint8_t)(tk >> (8 * b));
    }
    section(0x4E4B4F54u, pay, pl);
    pl = 0;
    if (logits)
        for (int i = 0; i < 50; i++) {
            float f = (float)i * 0.25f;
            memcpy(pay + pl, &f, 4);
            pl += 4;
        }
    section(0x54474F4Cu, pay, pl);
    pl = 0;
    uint32_t cnt[3], first[3];
    for (uint32_t i = 0; i < l.n; i++) {
        const dsii_kv_comp *c = &l.c[i];
        if (c->kind == DSII_KV_RING) {
            first[i] = L > c->rows ? L - c->rows : 0;
            cnt[i] = L - first[i];
        } else {
            first[i] = 0;
            cnt[i] = c->ratio ? L / c->ratio : c->rows;
        }
        uint32_t e[6] = {c->kind, c->rows, c->ld, c->ratio, first[i], cnt[i]};
        for (int j = 0; j < 6; j++)
            for (int b = 0; b < 4; b++) pay[pl++] = (uint8_t)(e[j] >> (8 * b));
    }
    section(0x5459414Cu, pay, pl);
    pl = 0;
    for (uint32_t i = 0; i < l.n; i++)
        for (uint32_t r = 0; r < cnt[i] * l.c[i].ld; r++) {
            float f = (float)(r % 17) - 8.0f;
            memcpy(pay + pl, &f, 4);
            pl += 4;
        }
    section(0x54415453u, pay, pl);
    size_t save = n;
    n = total_at;
    p64(save);
    n = hc;
    p64(XXH3_64bits(buf, 120));
    n = save;
    dsii_kv_layout_free(&l);
    /* self-check with the library's validator */
    dsii_kv_layout l2;
    dsii_snap_target t2;
    target(&l2, &t2);
    dsii_error e;
    dsii_error_clear(&e);
    dsii_snap_view v;
    if (dsii_snap_validate(buf, n, &t2, 50, &v, &e) != DSI_OK) {
        fprintf(stderr, "seed %d invalid: %s\n", k, e.msg);
        return 1;
    }
    dsii_kv_layout_free(&l2);
    char path[4096];
    snprintf(path, sizeof path, "%s/seed%d.dsis", dir, k);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) return 1;
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", argv[1]);
    if (system(cmd) != 0) return 1;
    const uint32_t lens[] = {1, 3, 8, 13, 30, 64};
    for (int k = 0; k < 6; k++)
        if (write_seed(argv[1], k, lens[k], k % 2)) return 1;
    return 0;
}

#endif
