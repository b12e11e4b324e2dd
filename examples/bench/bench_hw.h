/* dsinfer-bench: machine limits (memory read bandwidth, FMA peak) and kernel benchmarks. */
#ifndef DSI_BENCH_HW_H
#define DSI_BENCH_HW_H

#include "backends/cpu/threadpool.h"

#include <stddef.h>
#include <stdint.h>

double bench_now(void); /* seconds, monotonic */

/* Process CPU time (user + sys, all threads), seconds. A rate "per CPU time" is
 * work × threads / CPU time: what the run would reach with its threads on cores of their
 * own — on a shared machine, the figure that compares across minutes. */
double bench_cpu_seconds(void);

/* Best-of-`reps` multi-threaded streaming read of a `bytes` buffer (allocated, touched,
 * freed here), GB/s (1e9 bytes/s). Returns 0 on allocation failure. per_cpu (may be NULL):
 * the best rate per CPU time. */
double bench_read_bandwidth(dsib_threadpool *pool, size_t bytes, int reps, double *per_cpu);

/* Best-of-`reps` FMA throughput with every pool thread running independent FMA chains at
 * the widest vector width the kernels use; GFLOP/s (an FMA = 2 flops). per_cpu as above. */
double bench_fma_peak(dsib_threadpool *pool, int reps, double *per_cpu);

/* Fills one row of `n_in` elements of `type` with valid random data (finite scales). */
void bench_fill_row(int32_t type, uint8_t *row, int64_t n_in, uint64_t *rng);

/* Last-level cache size in bytes (sysfs), or 32 MiB if unknown. */
size_t bench_llc_bytes(void);

/* CPU model name ("unknown" if not found) into buf. */
void bench_cpu_name(char *buf, size_t size);

/* Bytes of this process's anonymous memory backed by transparent huge pages
 * (/proc/self/smaps_rollup AnonHugePages), or -1 if unknown. */
long long bench_anon_huge_bytes(void);

#endif
