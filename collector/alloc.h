/* Allocation sampling: the interposed malloc family, byte-based Poisson sampling and the
 * sampled-live table (README.md "Allocations"). What the agent thread and the window read
 * of it. */
#ifndef CP_ALLOC_H
#define CP_ALLOC_H

#include <stdatomic.h>
#include <stdint.h>

#include "unwind.h"

/* One (isolate, stack) with weighted totals; unbiased as in Go's scaleHeapSample. */
typedef struct cp_alloc_bucket {
    uint64_t hash;
    uint32_t isolate;
    char thread[16];
    uint32_t nframes;
    uint32_t boosted; /* a capture's: sampled at a boosted rate, never in the always-on */
    double alloc_objects, alloc_bytes; /* this window */
    double inuse_objects, inuse_bytes; /* since start */
    uint64_t pcs[CP_MAX_FRAMES];
} cp_alloc_bucket;

/* Maps the sampler's tables (mmap, never malloc). Idempotent. Returns 0 or CP_ENOMEM. */
int cp_alloc_init(void);
/* 1 if the loader binds malloc to another definition than the agent's: a program that
 * defines its own (workerd's tcmalloc, any executable exporting malloc) comes before a
 * preloaded library in the lookup order, so the agent sees none of its allocations. */
int cp_alloc_host_owns_malloc(void);
/* Arms sampling with mean rate bytes (0 disables; ignored before cp_alloc_init). */
void cp_alloc_set_rate(int64_t rate);
/* fn is called on a host thread in an allocation's slow path (outside the sampler's lock,
 * not in the agent's own code): before a sample is taken, and at the thread's first
 * allocation after cp_alloc_poke. agent.c starts a fork child's agent thread there. */
void cp_alloc_set_sample_hook(void (*fn)(void));
/* Sends the calling thread's next allocation down the slow path (to the hook above); its
 * countdown is drawn anew there, which keeps the sampling exact (exponential, memoryless).
 * Async-signal-safe: for the signal handler. */
void cp_alloc_poke(void);
/* Number of buckets so far (they are never removed). Takes the sampler's lock. */
uint32_t cp_alloc_nbuckets(void);
/* Agent: copies at most cap buckets to out and zeroes their window counters, under the
 * sampler's lock (nothing allocates while it is held). Returns how many were copied. */
uint32_t cp_alloc_snapshot(cp_alloc_bucket *out, uint32_t cap);
/* The same for the boosted buckets only (a capture's allocations, captable.c); the plain
 * snapshot skips them. */
uint32_t cp_alloc_snapshot_boosted(cp_alloc_bucket *out, uint32_t cap);
/* Samples lost to full tables since start (the agent reports the difference). */
extern atomic_uint_fast64_t cp_alloc_dropped;
/* pthread_atfork: the sampler's lock is held across fork; the child's window starts at
 * the fork (its window counters are zeroed, its live blocks stay). */
void cp_alloc_atfork_prepare(void);
void cp_alloc_atfork_parent(void);
void cp_alloc_atfork_child(void);

#endif
