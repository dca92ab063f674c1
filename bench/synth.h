/* Synthetic but realistic profiles for tests and benchmarks: a "service" with long C++-like
 * function names and a fixed population of distinct stacks (depth 10-60), from which CPU
 * windows are drawn with a skewed (Zipf-like) distribution, deterministically per seed. */
#ifndef CP_SYNTH_H
#define CP_SYNTH_H

#include <stdint.h>
#include "envelope.h"
#include "profile.h"

typedef struct cp_synth cp_synth;

/* A service with nstacks distinct stacks (2,000 is realistic). NULL on out of memory. */
cp_synth *cp_synth_create(uint64_t seed, uint32_t nstacks);
void cp_synth_destroy(cp_synth *s);

/* One CPU window: nsamples samples (1,000 is a busy 10 s at 100 Hz) spread over the
 * service's stacks, sample types samples/count and cpu/nanoseconds, period 10 ms. The
 * caller owns the result. */
cp_profile *cp_synth_cpu_window(cp_synth *s, uint32_t nsamples, int64_t start_ns, int64_t dur_ns);

/* An agent's stream that keeps its tables between windows (collector/README.md): appends
 * w's samples to stream e, adding the frames of w that e does not have yet (a frame is its
 * address: the synthetic service's frames each have their own) after e's, with the
 * mappings, functions and strings they need. e's sample types and period must be w's. The
 * caller encodes e, then starts the next window with cp_profile_next_window. Returns 0 or
 * -1 (out of memory). */
int cp_synth_stream_add(cp_profile *e, const cp_profile *w);

/* A 10 s window of kind (cpu, or inuse for CP_KIND_INUSE) with one stack of depth 10, the
 * same for every call (holder_0..holder_9), and values {v, v * 4096}: many series that
 * differ only in labels. NULL on out of memory. */
cp_profile *cp_synth_one_stack(cp_kind kind, int64_t start_ns, int64_t v);

#endif
