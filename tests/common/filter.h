/*
 * DSI_TEST_FILTER: runs only the cmocka tests whose names match the pattern (cmocka's
 * test filter: '*' and '?' wildcards). Used by the mutation checks (tests/mutation/) to run
 * just the tests that should kill a mutant, and handy locally. Include after <cmocka.h> and
 * call dsit_filter() at the start of main.
 */
#ifndef DSI_TEST_FILTER_H
#define DSI_TEST_FILTER_H

#include <stdio.h>
#include <stdlib.h>

static inline void dsit_filter(void) {
    const char *f = getenv("DSI_TEST_FILTER");
    if (f && *f) {
        printf("DSI_TEST_FILTER=%s: only the matching tests run\n", f);
        cmocka_set_test_filter(f);
    }
}

#endif
