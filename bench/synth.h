/* Synthetic but realistic profiles for tests and benchmarks: a "service" with long C++-like
 * function names and a fixed population of distinct stacks (depth 10-60), from which CPU
 * windows are drawn with a skewed (Zipf-like) distribution, deterministically per seed. */
#ifndef CP_SYNTH_H
#define CP_SYNTH_H

#include <stdint.h>
#include "profile.h"

typedef struct cp_synth cp_synth;

/* A service with nstacks distinct stacks (2,000 is realistic). NULL on out of memory. */
cp_synth *cp_synth_create(uint64_t seed, uint32_t nstacks);
void cp_synth_destroy(cp_synth *s);

/* One CPU window: nsamples samples (1,000 is a busy 10 s at 100 Hz) spread over the
 * service's stacks, sample types samples/count and cpu/nanoseconds, period 10 ms. The
 * caller owns the result. */
cp_profile *cp_synth_cpu_window(cp_synth *s, uint32_t nsamples, int64_t start_ns, int64_t dur_ns);

#endif
