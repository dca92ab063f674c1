/* The next allocator: the malloc family found behind ours with dlsym(RTLD_NEXT), and the
 * static pool that serves dlsym's own requests before it is known and, later, the agent's
 * threads when the allocator fails them (the emergency reserve). A leaf: it knows nothing
 * of sampling, threads or the agent. */
#ifndef CP_NEXTMALLOC_H
#define CP_NEXTMALLOC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Declared hidden (as every definition is), so that the hooks reach these with one
 * PC-relative access, as when they were static in alloc.c. */
#define CP_NEXT_HIDDEN __attribute__((visibility("hidden")))

typedef struct cp_next_fns {
    void *(*malloc)(size_t);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    void *(*memalign)(size_t, size_t);
    void *(*valloc)(size_t);
    void *(*pvalloc)(size_t);
    size_t (*malloc_usable_size)(void *);
} cp_next_fns;

/* The next allocator's functions; each NULL until cp_next_resolve found it (and for good
 * if the next allocator lacks it). Written once, by cp_next_resolve. */
extern CP_NEXT_HIDDEN cp_next_fns cp_next;

/* What the hooks' fast paths call: a boot stub until the next allocator is found (so the
 * fast paths need no NULL test), then cp_next.malloc. */
extern CP_NEXT_HIDDEN void *(*cp_next_hot_malloc)(size_t);
/* The next free, or a checked free (pool blocks kept) while the pool may hold blocks that
 * free's page test does not catch: before the next allocator is found, and for good once
 * the reserve handed out a block that is not page-aligned. */
extern CP_NEXT_HIDDEN void (*_Atomic cp_next_hot_free)(void *);
/* The next malloc_usable_size, or a checked one (pool blocks answered here, the next
 * allocator found first) under the same conditions as cp_next_hot_free. */
extern CP_NEXT_HIDDEN size_t (*_Atomic cp_next_hot_usable)(void *);

/* Finds the next allocator (dlsym: which itself allocates, from the pool). Idempotent and
 * reentrant (a call made while resolving returns at once). Not async-signal-safe. */
void cp_next_resolve(void);

/* The boot stub behind cp_next_hot_malloc: resolves, then allocates from the next
 * allocator, or from the pool for dlsym's own requests. */
void *cp_next_malloc_boot(size_t n);

#define CP_NEXT_POOL_SIZE ((size_t)8 << 20)
/* The pool (in .bss: untouched pages cost nothing). Blocks in it are never freed. */
extern CP_NEXT_HIDDEN char cp_next_pool[CP_NEXT_POOL_SIZE];

/* Whether p is a block of the pool (NULL is not). Async-signal-safe. */
static inline int cp_next_in_pool(const void *p)
{
    return (uintptr_t)p - (uintptr_t)cp_next_pool < CP_NEXT_POOL_SIZE;
}

/* The usable size of pool block p: the rest of the pool (blocks in it are never freed). */
size_t cp_next_pool_usable(const void *p);

/* A bootstrap block of n bytes (before the next allocator is found): page-aligned (or
 * align if stricter), so free's page test catches it; zeroed. NULL when the pool is
 * exhausted. Lock-free. */
void *cp_next_boot_alloc(size_t n, size_t align);

/* Raised once the agent's threads were served from the reserve: the agent degrades
 * (window.c stops using libdw) and says so in every profile. */
extern atomic_int cp_agent_oom;

/* The allocator failed one of the agent's own threads (libdw and librdkafka do not survive
 * a NULL from malloc): n bytes from the reserve (zeroed, never freed), cp_agent_oom raised.
 * NULL once the pool is exhausted. Lock-free. */
void *cp_next_reserve(size_t n, size_t align);

/* Whether p, a block of the next allocator, is one of glibc's fresh mmapped chunks (zero
 * pages: a big calloc need not touch them): only when the next allocator is glibc's and
 * MALLOC_PERTURB_ is off. */
int cp_next_fresh_zeroed(const void *p);

/* The agent's own allocations that must neither be sampled nor reach the hooks'
 * bookkeeping (the hooks' start_arg, for one): the next allocator, or the pool before it
 * is known. cp_real_free ignores pool blocks and NULL. Not async-signal-safe. */
void *cp_real_malloc(size_t n);
void cp_real_free(void *p);

#endif
