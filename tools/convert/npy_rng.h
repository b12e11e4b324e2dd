/* NumPy's default_rng(seed).integers(0, bound, size=n, dtype=int64), reproduced (npy_rng.c). */
#ifndef DSI_TOOLS_NPY_RNG_H
#define DSI_TOOLS_NPY_RNG_H
#include <stdint.h>
/* bound in (2^32, 2^63]: returns 0 and fills out[0..n); -1 for a bound outside that range. */
int npy_rng_integers(uint64_t seed, uint64_t bound, uint64_t n, int64_t *out);
#endif
