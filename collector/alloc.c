/* Allocation sampling: the malloc family interposed over the next allocator (nextmalloc.c),
 * byte-based Poisson sampling with a thread-local countdown, and
 * the table of sampled live blocks that matches frees. Unsampled paths cost a subtraction
 * in thread-local memory (allocations) or a test of the pointer's low bits (frees): every
 * sampled block is page-aligned. */
#include "alloc.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fmath.h"
#include "guard.h"
#include "isolate.h"
#include "nextmalloc.h"
#include "python.h"
#include "thread.h"
#include "times.h"
#include "unwind.h"
#include "vec.h"

/* ------------------------------------------------------------------------------------
 * The free filter */

#define FILTER_BITS 16 /* 64 KiB of counters */
/* Counting filter over sampled live pointers, consulted only for page-aligned frees and
 * runtime blocks (contprof_alloc_through). In .bss: pages never written cost nothing. */
static atomic_uchar filter[1u << FILTER_BITS] CP_BIG;

/* The free filter's slot. Chunks are 16-aligned; bits 16-31 are folded in so that
 * page-aligned blocks (whose bits 4-11 are 0) do not share a few slots. */
static inline uint32_t filter_idx(uintptr_t p)
{
    return (uint32_t)((p >> 4) ^ (p >> 16)) & ((1u << FILTER_BITS) - 1);
}

/* ------------------------------------------------------------------------------------
 * Sampled state */

#define LIVE_BITS 15 /* a 32768-slot table, 1.25 MiB, at most 3/4 full */
#define LIVE_CAP (1u << LIVE_BITS)
/* Sampled live blocks the table holds: plain ones beyond this are dropped (counted)... */
#define LIVE_MAX_PLAIN (LIVE_CAP / 2)
/* ...interior ones (see tagged_alloc) are never dropped: free needs their entry to find
 * the next allocator's block. A place is reserved before one is allocated. */
#define LIVE_MAX_INTERIOR (LIVE_CAP / 4)
#define INTERIOR_MAX_SIZE (64u << 10)
#define BUCKET_CAP 16384u
#define BUCKET_IDX_CAP (BUCKET_CAP * 2)

typedef struct live_entry {
    uintptr_t ptr;   /* 0 = empty */
    uintptr_t base;  /* interior: the next allocator's block that holds ptr; else 0 */
    uint32_t bucket; /* UINT32_MAX: none (buckets were full) */
    uint32_t _pad;
    double w; /* 1 / P(sampled) */
    uint64_t size;
} live_entry;

typedef struct alloc_state {
    live_entry live[LIVE_CAP];
    uint32_t nlive, ninterior;
    uint32_t bidx[BUCKET_IDX_CAP]; /* bucket index + 1 */
    uint32_t nbuckets;
    cp_alloc_bucket buckets[BUCKET_CAP];
} alloc_state;

static alloc_state *S; /* mmap'd: untouched pages cost no memory */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_llong g_rate;           /* mean bytes between samples; 0 = off */
static atomic_uint interior_reserved; /* interior blocks allocated or about to be */
atomic_uint_fast64_t cp_alloc_dropped;

static void (*g_sample_hook)(void);
static CP_TLS int64_t t_until;
static CP_TLS uint64_t t_rng;
static CP_TLS int t_init;
static CP_TLS volatile sig_atomic_t t_poked;

static inline uint64_t ptr_hash(uintptr_t p)
{
    uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 29);
}

int cp_alloc_init(void)
{
    if (S) return 0;
    void *m = mmap(NULL, sizeof(alloc_state), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CP_ENOMEM;
    S = m;
    return 0;
}

void cp_alloc_set_sample_hook(void (*fn)(void))
{
    g_sample_hook = fn;
}

void cp_alloc_poke(void)
{
    if (cp_agent_thread) return;
    t_poked = 1;
    t_until = INT64_MIN / 4;
}

void cp_alloc_set_rate(int64_t rate)
{
    atomic_store(&g_rate, S ? rate : 0);
    t_until = 0; /* the calling thread (the constructor's) re-draws at once */
    t_init = 0;
}

static double draw(int64_t rate)
{
    uint64_t x = t_rng ? t_rng : ((uint64_t)cp_mono_ns() ^ (uint64_t)(uintptr_t)&t_rng) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t_rng = x;
    double u = ((x >> 11) + 0.5) / 9007199254740992.0; /* (0,1) */
    return -cp_math_log(u) * (double)rate;
}

static uint32_t bucket_find(uint32_t iso, const char *thread, const uint64_t *pcs, uint32_t n,
                            uint32_t boosted)
{
    uint64_t h = cp_hash_bytes(pcs, n * sizeof(uint64_t), iso + ((uint64_t)boosted << 32));
    if (!iso) h = cp_hash_bytes(thread, strnlen(thread, 16), h);
    uint32_t mask = BUCKET_IDX_CAP - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        uint32_t b = S->bidx[i];
        if (b == 0) {
            if (S->nbuckets == BUCKET_CAP) return UINT32_MAX;
            cp_alloc_bucket *nb = &S->buckets[S->nbuckets];
            memset(nb, 0, offsetof(cp_alloc_bucket, pcs));
            nb->hash = h;
            nb->isolate = iso;
            nb->boosted = boosted;
            if (!iso) memcpy(nb->thread, thread, sizeof(nb->thread));
            nb->nframes = n;
            memcpy(nb->pcs, pcs, n * sizeof(uint64_t));
            S->bidx[i] = ++S->nbuckets;
            return S->nbuckets - 1;
        }
        cp_alloc_bucket *c = &S->buckets[b - 1];
        if (c->hash == h && c->isolate == iso && c->nframes == n && c->boosted == boosted &&
            (iso || strncmp(c->thread, thread, 16) == 0) &&
            memcmp(c->pcs, pcs, n * sizeof(uint64_t)) == 0)
            return b - 1;
    }
}

/* The slot of p, or the empty slot where its probe ends. */
static uint32_t live_slot(uintptr_t p)
{
    uint32_t mask = LIVE_CAP - 1;
    uint32_t i = (uint32_t)ptr_hash(p) & mask;
    while (S->live[i].ptr && S->live[i].ptr != p)
        i = (i + 1) & mask;
    return i;
}

static void inuse_add(uint32_t bucket, double w, uint64_t size, double sign)
{
    if (bucket == UINT32_MAX) return;
    cp_alloc_bucket *b = &S->buckets[bucket];
    b->inuse_objects += sign * w;
    b->inuse_bytes += sign * w * (double)size;
}

/* Lists sampled block p (base: see live_entry). A plain one is dropped (counted) when the
 * table holds LIVE_MAX_PLAIN of them; an interior one always has a place. */
static void live_insert(uintptr_t p, uintptr_t base, uint32_t bucket, double w, uint64_t size)
{
    if (!base && S->nlive - S->ninterior >= LIVE_MAX_PLAIN) {
        atomic_fetch_add(&cp_alloc_dropped, 1);
        return;
    }
    uint32_t i = live_slot(p);
    S->live[i] = (live_entry){.ptr = p, .base = base, .bucket = bucket, .w = w, .size = size};
    S->nlive++;
    S->ninterior += base != 0;
    /* saturating: a counter at 255 stays there (always "maybe"), never wraps to 0 */
    atomic_uchar *c = &filter[filter_idx(p)];
    if (atomic_load_explicit(c, memory_order_relaxed) != 255)
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    inuse_add(bucket, w, size, 1);
}

/* Removes p if it is listed (unless it is interior and keep_interior is set), with
 * backward-shift deletion, which keeps probes short. Returns 1 and the entry if removed. */
static int live_remove(uintptr_t p, live_entry *out, int keep_interior)
{
    uint32_t mask = LIVE_CAP - 1;
    uint32_t i = live_slot(p);
    if (!S->live[i].ptr || (keep_interior && S->live[i].base)) return 0;
    if (out) *out = S->live[i];
    inuse_add(S->live[i].bucket, S->live[i].w, S->live[i].size, -1);
    atomic_uchar *c = &filter[filter_idx(p)];
    if (atomic_load_explicit(c, memory_order_relaxed) != 255)
        atomic_fetch_sub_explicit(c, 1, memory_order_relaxed);
    S->nlive--;
    if (S->live[i].base) {
        S->ninterior--;
        atomic_fetch_sub(&interior_reserved, 1);
    }
    uint32_t j = i;
    for (;;) {
        S->live[i].ptr = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (!S->live[j].ptr) return 1;
            uint32_t k = (uint32_t)ptr_hash(S->live[j].ptr) & mask;
            /* move j back to i if its home k is not cyclically in (i, j] */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
            break;
        }
        S->live[i] = S->live[j];
        i = j;
    }
}

/* Whom an allocation on thread t belongs to: the isolate entered innermost, or (iso 0)
 * the thread, by its name. t may be NULL (not registered: no isolate, no name). */
static void sample_owner(const cp_thread *t, uint32_t *iso, char thread[16])
{
    if (!t) return;
    unsigned d = atomic_load(&t->iso_depth);
    if (d) *iso = t->iso_stack[(d > 16 ? 16 : d) - 1];
    if (!*iso) memcpy(thread, t->name, 16);
}

/* The countdown ran out on an allocation of n bytes (t_until < 0). Re-arms it; returns
 * the rate if this allocation is to be sampled, else 0. Decided before the allocation,
 * because a sampled block must be page-aligned (see free). */
__attribute__((noinline)) static int64_t sample_decide(size_t n)
{
    int64_t rate = atomic_load_explicit(&g_rate, memory_order_relaxed);
    if (cp_agent_thread) {
        t_until = INT64_MIN / 4; /* every allocation takes the checked path */
        return 0;
    }
    if (t_poked && !cp_in_agent) {
        t_poked = 0;
        t_init = 0; /* a fresh countdown below */
        if (g_sample_hook) g_sample_hook();
    }
    if (rate <= 0) {
        /* Look again later: sampling may be switched on (cp_alloc_set_rate resets the
         * starting thread's countdown; other threads catch up within 64 MiB). */
        t_until = (int64_t)64 << 20;
        return 0;
    }
    if (cp_in_agent) {
        t_until = (int64_t)draw(rate);
        return 0;
    }
    if (!t_init) {
        /* a new thread's first countdown is drawn now, not from the zeroed TLS */
        t_init = 1;
        t_until = (int64_t)draw(rate) - (int64_t)n;
        if (t_until >= 0) return 0;
    }
    /* a captured isolate's thread samples at the capture's rate (captable.c) */
    cp_thread *t = cp_self;
    if (t) {
        int64_t b = atomic_load_explicit(&t->alloc_boost, memory_order_relaxed);
        if (b > 0 && b < rate) rate = b;
    }
    t_until = (int64_t)draw(rate);
    if (S && g_sample_hook) g_sample_hook();
    return S ? rate : 0;
}

/* Uniform in (0, 1) from the thread's generator. */
static double uniform(void)
{
    uint64_t x = t_rng ? t_rng : ((uint64_t)cp_mono_ns() ^ (uint64_t)(uintptr_t)&t_rng) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t_rng = x;
    return ((x >> 11) + 0.5) / 9007199254740992.0;
}

/* Records sampled block p of n bytes (base: see live_entry): stack (skipping `skip`
 * frames, this one included), owner, unbiased weight; m language frame ids (from a
 * walker) go on top as contprof_isolate_set_runtime_code says. */
__attribute__((noinline)) static void sample_record(void *p, uintptr_t base, size_t n, int64_t rate,
                                                    int skip, const uint64_t *ids, uint32_t m)
{
    int saved = cp_in_agent, saved_errno = errno;
    cp_in_agent = 1; /* registering and unwinding do not sample themselves */
    cp_thread *t = cp_self ? cp_self : cp_thread_register_self();
    uint64_t pcs[CP_MAX_FRAMES];
    int nf =
        t ? cp_unwind_here(t->stack_lo, t->stack_hi, pcs, CP_MAX_FRAMES, skip, &t->ucache_alloc)
          : 0;
    uint32_t iso = 0;
    char thread[16] = "";
    sample_owner(t, &iso, thread);
    if (t) {
        uint32_t interp;
        nf = (int)cp_py_merge(pcs, (uint32_t)nf, CP_MAX_FRAMES, t->tid, t->stack_lo, t->stack_hi,
                              &interp);
        uint32_t pi = !iso && interp ? cp_py_interp_isolate(interp, 1) : 0;
        if (pi) iso = pi; /* a sub-interpreter's allocation: its isolate */
    }
    if (m) nf = (int)cp_lang_join(iso, pcs, (uint32_t)nf, ids, m);
    double w = 1.0 / (1.0 - cp_math_exp(-(double)n / (double)rate));
    int64_t base_rate = atomic_load_explicit(&g_rate, memory_order_relaxed);
    int keep = 1;
    if (base_rate > rate) {
        /* A capture's rate: the capture gets every sample; the always-on totals keep a
         * sample with P(base)/P(capture), weighted 1/P(base): exactly the base rate's
         * Poisson sampling, so they stay unbiased. */
        double pb = 1.0 - cp_math_exp(-(double)n / (double)base_rate), pc = 1.0 / w;
        keep = uniform() < pb / pc;
        pthread_mutex_lock(&g_lock);
        uint32_t cb = bucket_find(iso, thread, pcs, (uint32_t)nf, 1);
        if (cb == UINT32_MAX) {
            atomic_fetch_add(&cp_alloc_dropped, 1);
        } else {
            S->buckets[cb].alloc_objects += w;
            S->buckets[cb].alloc_bytes += w * (double)n;
        }
        if (!keep && base) live_insert((uintptr_t)p, base, UINT32_MAX, 0, n); /* free finds it */
        pthread_mutex_unlock(&g_lock);
        w = 1.0 / pb;
    }
    if (!keep) {
        cp_in_agent = saved;
        errno = saved_errno;
        return;
    }
    pthread_mutex_lock(&g_lock);
    uint32_t b = bucket_find(iso, thread, pcs, (uint32_t)nf, 0);
    if (b == UINT32_MAX) {
        atomic_fetch_add(&cp_alloc_dropped, 1);
        if (base) live_insert((uintptr_t)p, base, b, w, n); /* free must find it */
    } else {
        S->buckets[b].alloc_objects += w;
        S->buckets[b].alloc_bytes += w * (double)n;
        live_insert((uintptr_t)p, base, b, w, n);
    }
    pthread_mutex_unlock(&g_lock);
    cp_in_agent = saved;
    /* a host's successful call leaves errno alone: registering the thread may fail a
     * system call */
    errno = saved_errno;
}

/* ------------------------------------------------------------------------------------
 * Runtime allocators (contprof.h): blocks a runtime reports itself. Their addresses are
 * the runtime's, not page-aligned: their frees are matched here, by the counting filter. */

/* The countdown ran out: decide as the malloc family does, walk, call, record. */
__attribute__((noinline, cold)) static void *through_sampled(contprof_realloc_fn fn, void *ud,
                                                             void *ptr, size_t osize, size_t nsize,
                                                             contprof_walker walker,
                                                             void *walker_arg)
{
    int64_t rate = sample_decide(nsize);
    uint64_t ids[32];
    uint32_t m = 0;
    if (rate && walker) {
        cp_in_agent = 1; /* the walker's and interning's allocations are not sampled */
        contprof_frame fr[32];
        int k = walker(walker_arg, fr, 32);
        if (k > 32) k = 32;
        if (k > 0) m = (uint32_t)cp_lang_ids(fr, k, ids);
        cp_in_agent = 0;
    }
    int64_t saved = t_until;
    t_until = INT64_MAX / 2;
    void *r = fn(ud, ptr, osize, nsize);
    t_until = saved;
    /* frames to skip: sample_record, through_sampled, contprof_alloc_through (when it
     * tail-calls through_sampled, the runtime's allocator function goes instead: the stack
     * then starts in the runtime, whose frames the language frames replace) */
    if (rate && r) sample_record(r, 0, nsize, rate, 3, ids, m);
    return r;
}

/* Runtime block p leaves the sampled live table if it is in it. (An interior block of
 * the malloc family stays: the free hook that the runtime's allocator reaches next needs
 * its entry.) */
static inline void forget_runtime_block(void *p)
{
    if (__builtin_expect(
            atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed) != 0,
            0)) {
        pthread_mutex_lock(&g_lock);
        if (S) live_remove((uintptr_t)p, NULL, 1);
        pthread_mutex_unlock(&g_lock);
    }
}

CONTPROF_EXTERN void *contprof_alloc_through(contprof_realloc_fn fn, void *ud, void *ptr,
                                             size_t osize, size_t nsize, contprof_walker walker,
                                             void *walker_arg)
{
    /* A sampled block leaves the table before the allocator can hand it out again. */
    if (ptr) forget_runtime_block(ptr);
    int64_t left = t_until - (int64_t)nsize;
    if (__builtin_expect(nsize != 0 && left < 0, 0))
        return through_sampled(fn, ud, ptr, osize, nsize, walker, walker_arg);
    /* the malloc family underneath does not count these bytes again */
    t_until = INT64_MAX / 2;
    void *r = fn(ud, ptr, osize, nsize);
    t_until = left;
    return r;
}

uint32_t cp_alloc_nbuckets(void)
{
    if (!S) return 0;
    pthread_mutex_lock(&g_lock);
    uint32_t n = S->nbuckets;
    pthread_mutex_unlock(&g_lock);
    return n;
}

static uint32_t snapshot(cp_alloc_bucket *out, uint32_t cap, uint32_t boosted)
{
    if (!S) return 0;
    pthread_mutex_lock(&g_lock);
    uint32_t n = 0;
    for (uint32_t i = 0; i < S->nbuckets && n < cap; i++) {
        if (S->buckets[i].boosted != boosted) continue;
        out[n++] = S->buckets[i];
        S->buckets[i].alloc_objects = 0;
        S->buckets[i].alloc_bytes = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

uint32_t cp_alloc_snapshot(cp_alloc_bucket *out, uint32_t cap)
{
    return snapshot(out, cap, 0);
}

uint32_t cp_alloc_snapshot_boosted(cp_alloc_bucket *out, uint32_t cap)
{
    return snapshot(out, cap, 1);
}

void cp_alloc_atfork_prepare(void)
{
    pthread_mutex_lock(&g_lock);
}

void cp_alloc_atfork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
}

void cp_alloc_atfork_child(void)
{
    /* The child's window starts now; what is live in it stays live. */
    if (S)
        for (uint32_t i = 0; i < S->nbuckets; i++) {
            S->buckets[i].alloc_objects = 0;
            S->buckets[i].alloc_bytes = 0;
        }
    pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------------------------
 * The interposed family
 *
 * Common paths: an allocation subtracts its size from the thread's countdown in place and
 * tail-calls the next allocator (4 instructions in malloc); a free tests the pointer's low
 * 12 bits and tail-calls the next free (3 instructions). Every sampled block the family
 * returns is page-aligned, so free only looks further at page-aligned pointers (NULL,
 * sampled blocks, the rare unsampled block that happens to be page-aligned, valloc):
 * then the counting filter, then the table under the lock. */

/* Subtracts n from the thread's countdown in place and jumps to `label` when it went
 * negative. C would load, subtract, store and test: GCC does not fuse them. */
#if defined(__x86_64__)
#define COUNT_DOWN(n, label)                                                                       \
    __asm__ goto("subq %1, %0\n\tjs %l[" #label "]"                                                \
                 : /* no outputs: GCC 12 drops the label's code with one */                        \
                 : "m"(t_until), "r"((uint64_t)(n))                                                \
                 : "cc", "memory"                                                                  \
                 : label)
#else
#define COUNT_DOWN(n, label)                                                                       \
    do {                                                                                           \
        t_until -= (int64_t)(n);                                                                   \
        if (__builtin_expect(t_until < 0, 0)) goto label;                                          \
    } while (0)
#endif

#define PAGE_MASK ((uintptr_t)4095)

static inline int page_aligned(const void *p)
{
    return ((uintptr_t)p & PAGE_MASK) == 0;
}

/* A block of n bytes for a sample: page-aligned (align: what the caller asked for, a
 * power of two), zeroed if zero is set (all of its usable size, as glibc's calloc does);
 * NULL if the allocator has none. errno is left as it was either way: on NULL the caller
 * asks the allocator itself, which says why if it fails too.
 *
 * Small ones are *interior*: a plain block of n + 4096 bytes from the next allocator
 * (*base), and the page boundary inside it. The allocator never sees the page-aligned
 * address, so when the block is freed and its chunk reused, the addresses it hands out
 * again are as aligned as any other: with memalign, a freed sampled block's page-aligned
 * address kept coming back (glibc's caches are LIFO), to every later free's slow path and
 * into one L1 cache set. Big ones (mmapped by glibc, unmapped when freed) and stricter
 * alignments come from memalign (*base = 0). */
static void *tagged_alloc(size_t align, size_t n, int zero, uintptr_t *base)
{
    *base = 0;
    int saved_errno = errno;
    void *p = NULL;
    if (n <= INTERIOR_MAX_SIZE && align <= PAGE_MASK + 1 && S) {
        if (atomic_fetch_add(&interior_reserved, 1) < LIVE_MAX_INTERIOR) {
            void *q =
                zero ? cp_next.calloc(1, n + PAGE_MASK + 1) : cp_next.malloc(n + PAGE_MASK + 1);
            if (q) {
                *base = (uintptr_t)q;
                p = (void *)(((uintptr_t)q + PAGE_MASK) & ~PAGE_MASK);
                goto out;
            }
        }
        atomic_fetch_sub(&interior_reserved, 1);
    }
    if (!cp_next.memalign) goto out;
    p = cp_next.memalign(align > PAGE_MASK ? align : PAGE_MASK + 1, n);
    /* glibc's mmapped chunks are fresh zero pages (what its calloc relies on): not
     * touching them keeps a big sparse calloc sparse. */
    if (p && zero && !cp_next_fresh_zeroed(p))
        memset(p, 0, cp_next.malloc_usable_size ? cp_next.malloc_usable_size(p) : n);
out:
    errno = saved_errno;
    return p;
}

/* An allocation of the agent's own threads failed: serve it from the reserve. */
#define AGENT_RESCUE(p, n, align)                                                                  \
    do {                                                                                           \
        if (__builtin_expect(!(p), 0) && cp_agent_thread) (p) = cp_next_reserve((n), (align));     \
    } while (0)

/* The slow paths below are reached by tail calls from the hooks, so the stack a sample
 * records starts at the hook's caller: 2 frames to skip (sample_record, the slow path),
 * one more where a hook calls its slow path (posix_memalign, realloc_listed). */
#define HOOK_SKIP 2

/* The countdown ran out in a hook's slow path: a sampled block (recorded; skip as for
 * sample_record, which inlining leaves unchanged) if this allocation is to be sampled and
 * one could be had, else NULL, and the slow path allocates as usual. */
static inline __attribute__((always_inline)) void *try_sampled(size_t align, size_t n, int zero,
                                                               int skip)
{
    int64_t rate = sample_decide(n);
    uintptr_t base;
    void *p = rate ? tagged_alloc(align, n, zero, &base) : NULL;
    if (p) sample_record(p, base, n, rate, skip, NULL, 0);
    return p;
}

__attribute__((noinline, cold)) static void *malloc_slow(size_t n)
{
    if (!cp_next.malloc) return cp_next_malloc_boot(n);
    void *p = try_sampled(16, n, 0, HOOK_SKIP);
    if (p) return p;
    p = cp_next.malloc(n);
    AGENT_RESCUE(p, n, 16);
    return p;
}

CONTPROF_EXTERN void *malloc(size_t n)
{
    COUNT_DOWN(n, slow);
    return cp_next_hot_malloc(n);
slow:
    return malloc_slow(n);
}

__attribute__((noinline, cold)) static void *calloc_slow(size_t a, size_t b, size_t n)
{
    if (!cp_next.calloc) {
        cp_next_resolve();
        if (!cp_next.calloc) return cp_next_boot_alloc(n, 16); /* zeroed: static, never reused */
    }
    void *p = try_sampled(16, n, 1, HOOK_SKIP);
    if (p) return p;
    p = cp_next.calloc(a, b);
    AGENT_RESCUE(p, n, 16); /* the pool is zeroed and never reused */
    return p;
}

CONTPROF_EXTERN void *calloc(size_t a, size_t b)
{
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    COUNT_DOWN(n, slow);
    if (__builtin_expect(!cp_next.calloc, 0)) goto slow;
    void *p = cp_next.calloc(a, b);
    AGENT_RESCUE(p, n, 16);
    return p;
slow:
    return calloc_slow(a, b, n);
}

/* The filter said maybe: p may be a sampled block (an interior one goes back as the
 * block that holds it). */
__attribute__((noinline, cold)) static void free_listed(void *p)
{
    live_entry e = {0};
    pthread_mutex_lock(&g_lock);
    if (S) live_remove((uintptr_t)p, &e, 0);
    pthread_mutex_unlock(&g_lock);
    atomic_load_explicit(&cp_next_hot_free, memory_order_relaxed)(e.base ? (void *)e.base : p);
}

/* A page-aligned pointer: NULL, a bootstrap block (kept), possibly a sampled one (it
 * leaves the table before the allocator can hand its address out again), or an
 * unsampled one. No call on the common way through, so no frame: glibc's caches hand a
 * freed sampled block's address out again, and its later frees come here too. */
__attribute__((noinline)) static void free_aligned(void *p)
{
    if (!p || cp_next_in_pool(p)) return;
    if (__builtin_expect(
            atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed) != 0,
            0)) {
        free_listed(p);
        return;
    }
    atomic_load_explicit(&cp_next_hot_free, memory_order_relaxed)(p);
}

CONTPROF_EXTERN void free(void *p)
{
    if (__builtin_expect(page_aligned(p), 0)) {
        free_aligned(p);
        return;
    }
    atomic_load_explicit(&cp_next_hot_free, memory_order_relaxed)(p);
}

/* realloc(p, n), p a heap block, n > 0, when the countdown ran out. A sampled result
 * must be page-aligned: a block that is not moves into one (one copy, which glibc's own
 * realloc would often have made; a page-aligned block then stays so where glibc grows it
 * in place or by mremap). */
__attribute__((noinline, cold)) static void *realloc_slow(void *p, size_t n, int skip)
{
    int64_t rate = sample_decide(n);
    void *q;
    if (!rate) {
        q = cp_next.realloc(p, n);
        goto unsampled;
    }
    uintptr_t base = 0;
    if (page_aligned(p)) { /* not interior: realloc_listed moved those */
        q = cp_next.realloc(p, n);
        if (!q || page_aligned(q)) goto sampled;
        void *r = tagged_alloc(16, n, 0, &base);
        if (!r) return q; /* cannot tag it: it stays unsampled */
        memcpy(r, q, n);
        cp_next.free(q);
        q = r;
        goto sampled;
    }
    q = tagged_alloc(16, n, 0, &base);
    if (!q) {
        q = cp_next.realloc(p, n);
        goto unsampled;
    }
    size_t have = cp_next.malloc_usable_size ? cp_next.malloc_usable_size(p) : n;
    memcpy(q, p, have < n ? have : n);
    cp_next.free(p);
sampled:
    if (q) sample_record(q, base, n, rate, skip, NULL, 0);
    return q;
unsampled:
    if (!q && cp_agent_thread && (q = cp_next_reserve(n, 16)) != NULL) {
        size_t have = cp_next.malloc_usable_size ? cp_next.malloc_usable_size(p) : 0;
        memcpy(q, p, have < n ? have : n);
        cp_next.free(p);
    }
    return q;
}

/* realloc of a bootstrap block: it moves to the real heap (all of the usable size
 * malloc_usable_size gave, up to n: what is left of the pool), or with n == 0 it is freed
 * (kept: pool blocks are never reused) and NULL returned, as glibc's realloc(p, 0). */
__attribute__((noinline, cold)) static void *realloc_pool(void *p, size_t n)
{
    if (n == 0) return NULL;
    void *q = malloc(n);
    if (q) {
        size_t have = cp_next_pool_usable(p);
        memcpy(q, p, have < n ? have : n);
    }
    return q;
}

/* What malloc_usable_size said of interior block e: the rest of the block that holds it.
 * The caller may have written all of it, and realloc keeps all of it (up to the new size). */
static size_t interior_usable(const live_entry *e)
{
    if (!cp_next.malloc_usable_size) return e->size;
    return cp_next.malloc_usable_size((void *)e->base) - (e->ptr - e->base);
}

/* realloc of interior block old to n bytes: it moves (bounded copy: interior blocks are
 * small), into a sampled block if the countdown says so; skip counts this frame. What it
 * keeps is min(n, the usable size the caller had), not the size it asked for (issue 24:
 * redis's zmalloc writes up to malloc_usable_size). */
__attribute__((noinline, cold)) static void *realloc_move(const live_entry *old, size_t n, int skip)
{
    int64_t rate = 0;
    COUNT_DOWN(n, decide);
    goto alloc;
decide:
    rate = sample_decide(n);
alloc:;
    uintptr_t base = 0;
    void *q = rate ? tagged_alloc(16, n, 0, &base) : NULL;
    if (!q) {
        rate = 0;
        q = cp_next.malloc(n);
        if (!q) return NULL;
    }
    size_t have = interior_usable(old);
    memcpy(q, (const void *)old->ptr, have < n ? have : n);
    cp_next.free((void *)old->base);
    if (rate) sample_record(q, base, n, rate, skip, NULL, 0);
    return q;
}

/* realloc(p, n) of a page-aligned p, n > 0: p may be a sampled block. It leaves the
 * table first (its address may be handed to another thread as soon as realloc moves it)
 * and comes back if realloc fails. */
__attribute__((noinline, cold)) static void *realloc_listed(void *p, size_t n)
{
    live_entry old = {0};
    int had = 0;
    if (atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed)) {
        pthread_mutex_lock(&g_lock);
        had = S && live_remove((uintptr_t)p, &old, 0);
        pthread_mutex_unlock(&g_lock);
    }
    void *q;
    if (had && old.base) {
        q = realloc_move(&old, n, HOOK_SKIP + 1);
        goto done;
    }
    COUNT_DOWN(n, slow);
    q = cp_next.realloc(p, n);
    if (__builtin_expect(!q, 0) && cp_agent_thread) q = realloc_slow(p, n, HOOK_SKIP + 1);
    goto done;
slow:
    q = realloc_slow(p, n, HOOK_SKIP + 1);
done:
    if (!q && had) { /* p is still valid and still live */
        pthread_mutex_lock(&g_lock);
        if (old.base) atomic_fetch_add(&interior_reserved, 1); /* live_remove gave it back */
        live_insert(old.ptr, old.base, old.bucket, old.w, old.size);
        pthread_mutex_unlock(&g_lock);
    }
    return q;
}

CONTPROF_EXTERN void *realloc(void *p, size_t n)
{
    if (!p) return malloc(n);
    if (__builtin_expect(!cp_next.realloc || cp_next_in_pool(p), 0)) {
        cp_next_resolve();
        if (cp_next_in_pool(p)) return realloc_pool(p, n);
        if (!cp_next.realloc) return errno = ENOMEM, NULL;
    }
    if (n == 0) {
        if (!page_aligned(p)) return cp_next.realloc(p, 0);
        free_aligned(p); /* glibc's realloc(p, 0) frees p and returns NULL */
        return NULL;
    }
    if (__builtin_expect(page_aligned(p), 0)) return realloc_listed(p, n);
    COUNT_DOWN(n, slow);
    void *q = cp_next.realloc(p, n);
    if (__builtin_expect(!q, 0) && cp_agent_thread) return realloc_slow(p, n, HOOK_SKIP);
    return q;
slow:
    return realloc_slow(p, n, HOOK_SKIP);
}

CONTPROF_EXTERN void *reallocarray(void *p, size_t a, size_t b)
{
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n);
}

/* posix_memalign, aligned_alloc and memalign: align is a power of two (the caller checked).
 * A sampled block gets at least page alignment. */
__attribute__((noinline, cold)) static void *memalign_slow(size_t align, size_t n, int skip)
{
    void *p = try_sampled(align, n, 0, skip);
    if (p) return p;
    p = cp_next.memalign(align, n);
    AGENT_RESCUE(p, n, align);
    return p;
}

static int pow2(size_t a)
{
    return a && !(a & (a - 1));
}

CONTPROF_EXTERN int posix_memalign(void **out, size_t align, size_t n)
{
    cp_next_resolve();
    if (!cp_next.posix_memalign) {
        void *p = cp_next_boot_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    if (!pow2(align) || align % sizeof(void *) || !cp_next.memalign)
        return cp_next.posix_memalign(out, align, n); /* EINVAL, or not sampled */
    COUNT_DOWN(n, slow);
    int rc = cp_next.posix_memalign(out, align, n);
    if (rc != 0 && cp_agent_thread && (*out = cp_next_reserve(n, align)) != NULL) rc = 0;
    return rc;
slow:;
    /* errno as glibc's leaves it: untouched on success, ENOMEM (set by the memalign that
     * failed) on failure */
    void *p = memalign_slow(align, n, HOOK_SKIP + 1); /* called, not tail-called */
    if (!p) return errno == EINVAL ? EINVAL : ENOMEM;
    *out = p;
    return 0;
}

CONTPROF_EXTERN void *aligned_alloc(size_t align, size_t n)
{
    cp_next_resolve();
    if (!cp_next.aligned_alloc) return cp_next_boot_alloc(n, align);
    if (!pow2(align) || !cp_next.memalign) return cp_next.aligned_alloc(align, n);
    COUNT_DOWN(n, slow);
    void *p = cp_next.aligned_alloc(align, n);
    AGENT_RESCUE(p, n, align);
    return p;
slow:
    return memalign_slow(align, n, HOOK_SKIP);
}

CONTPROF_EXTERN void *memalign(size_t align, size_t n)
{
    cp_next_resolve();
    if (!cp_next.memalign) return cp_next_boot_alloc(n, align);
    if (!pow2(align)) return cp_next.memalign(align, n); /* glibc rounds it up */
    COUNT_DOWN(n, slow);
    void *p = cp_next.memalign(align, n);
    AGENT_RESCUE(p, n, align);
    return p;
slow:
    return memalign_slow(align, n, HOOK_SKIP);
}

/* valloc and pvalloc: page-aligned anyway. */
__attribute__((noinline, cold)) static void *page_alloc_slow(void *(*fn)(size_t), size_t n)
{
    int64_t rate = sample_decide(n);
    void *p = fn(n);
    if (p && rate) sample_record(p, 0, n, rate, HOOK_SKIP, NULL, 0);
    return p;
}

CONTPROF_EXTERN void *valloc(size_t n)
{
    cp_next_resolve();
    if (!cp_next.valloc) return cp_next_boot_alloc(n, 4096);
    COUNT_DOWN(n, slow);
    return cp_next.valloc(n);
slow:
    return page_alloc_slow(cp_next.valloc, n);
}

CONTPROF_EXTERN void *pvalloc(size_t n)
{
    cp_next_resolve();
    if (!cp_next.pvalloc) return cp_next_boot_alloc(n, 4096);
    COUNT_DOWN(n, slow);
    return cp_next.pvalloc(n);
slow:
    return page_alloc_slow(cp_next.pvalloc, n);
}

/* Not interposed: malloc_trim, mallinfo, mallinfo2, malloc_stats, malloc_info and mallopt
 * reach glibc as they are (they look at the heap, where every block of ours lives). C23's
 * free_sized and free_aligned_sized are not in Debian 12's glibc (2.36): when a glibc
 * brings them they must be hooked too, or a sampled interior block would reach the next
 * allocator's free at its page-aligned address. */

/* malloc_usable_size of a page-aligned pointer: NULL, a bootstrap block, maybe a sampled
 * block (interior ones answer for the rest of the block that holds them). Not cold: with
 * jemalloc every block of 4 KiB or more is page-aligned (redis's 16 KiB buffers). */
__attribute__((noinline)) static size_t usable_aligned(void *p)
{
    if (!p) return 0;
    if (cp_next_in_pool(p)) return cp_next_pool_usable(p);
    if (__builtin_expect(!cp_next.malloc_usable_size, 0)) {
        cp_next_resolve();
        if (!cp_next.malloc_usable_size) return 0;
    }
    uintptr_t base = 0;
    if (atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed)) {
        pthread_mutex_lock(&g_lock);
        if (S) {
            uint32_t i = live_slot((uintptr_t)p);
            if (S->live[i].ptr == (uintptr_t)p) base = S->live[i].base;
        }
        pthread_mutex_unlock(&g_lock);
    }
    if (base) return interior_usable(&(live_entry){.ptr = (uintptr_t)p, .base = base});
    return cp_next.malloc_usable_size(p);
}

/* As free: a test of the pointer's low 12 bits and a tail call (3 instructions; redis's
 * zmalloc calls it at every allocation and free). */
CONTPROF_EXTERN size_t malloc_usable_size(void *p)
{
    if (__builtin_expect(page_aligned(p), 0)) return usable_aligned(p);
    return atomic_load_explicit(&cp_next_hot_usable, memory_order_relaxed)(p);
}

/* ------------------------------------------------------------------------------------
 * A program with an allocator of its own */

/* Our own malloc, whatever the loader binds the name to. */
extern __typeof__(malloc) cp_malloc_self
    __attribute__((alias("malloc"), visibility("hidden"), copy(malloc)));

int cp_alloc_host_owns_malloc(void)
{
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    if (!m || m == (void *)cp_malloc_self) return 0;
    /* Another address may still be ours: a program built without PIE that takes malloc's
     * address makes its PLT entry the canonical one (python3.11 here), and that entry calls
     * the agent. Only a malloc the program defines is a symbol there. */
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    return dladdr1(m, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && info.dli_sname &&
           !strcmp(info.dli_sname, "malloc") && info.dli_saddr == m && sym->st_shndx != SHN_UNDEF;
}
