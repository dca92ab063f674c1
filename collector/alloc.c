/* Allocation sampling: the malloc family interposed over the next allocator (dlsym with a
 * static bootstrap pool), byte-based Poisson sampling with a thread-local countdown, and
 * the table of sampled live blocks that matches frees. The unsampled paths cost a TLS
 * subtraction (allocations) or one byte load from a 64 KiB counting filter (frees). */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collector_int.h"

/* ------------------------------------------------------------------------------------
 * The next allocator */

typedef struct real_fns {
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
} real_fns;

static real_fns real;
/* The fast paths call through these: boot stubs until the next allocator is found, so
 * the fast paths need no NULL test. */
static void *malloc_boot(size_t n);
static void free_boot(void *p);
static void *(*hot_malloc)(size_t) = malloc_boot;
static void (*hot_free)(void *) = free_boot;
static int resolving;

/* dlsym itself allocates: those requests are served from here and never freed. The same
 * pool is the agent's emergency reserve: when the allocator fails the agent's own threads,
 * they are served from here, because libdw and librdkafka do not survive a NULL from
 * malloc (measured: libdw crashes in dwarf_getsrclines). The agent then degrades
 * (cp_agent_oom). In .bss: untouched pages cost nothing. */
static _Alignas(64) char pool[8 << 20];
atomic_int cp_agent_oom;
static atomic_size_t pool_used;

#define FILTER_BITS 16 /* 64 KiB of counters: stays in cache */
/* Counting filter over sampled live pointers. In .bss: pages never written cost nothing. */
static atomic_uchar filter[1u << FILTER_BITS];

/* The free filter's slot: cheap, since every free computes it. Chunks are 16-aligned;
 * the page bits are folded in so page-aligned big blocks do not share a few slots. */
static inline uint32_t filter_idx(uintptr_t p)
{
    return (uint32_t)((p >> 4) ^ (p >> 20)) & ((1u << FILTER_BITS) - 1);
}

static inline int in_pool(const void *p)
{
    return (uintptr_t)p - (uintptr_t)pool < sizeof(pool); /* NULL is not in it */
}

static void *pool_alloc(size_t n, size_t align)
{
    if (align < 16) align = 16;
    size_t cur = atomic_load(&pool_used), start;
    do {
        start = (cur + align - 1) & ~(align - 1);
        if (start + n > sizeof(pool)) return NULL;
    } while (!atomic_compare_exchange_weak(&pool_used, &cur, start + n));
    /* Pool blocks answer "maybe" in the free filter for good, so free's fast path needs
     * no range check: the out-of-line path recognises them. */
    atomic_uchar *c = &filter[filter_idx((uintptr_t)(pool + start))];
    if (atomic_load_explicit(c, memory_order_relaxed) != 255)
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    return pool + start; /* zeroed: static storage, never reused */
}

static void resolve(void)
{
    if (real.free || resolving) return;
    resolving = 1;
    real_fns r;
    r.malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    r.calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    r.realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    r.posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    r.aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    r.memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
    r.valloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "valloc");
    r.pvalloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "pvalloc");
    r.malloc_usable_size = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    r.free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    real = r;
    if (r.malloc) hot_malloc = r.malloc;
    if (r.free) hot_free = r.free;
    resolving = 0;
}

void *cp_real_malloc(size_t n)
{
    resolve();
    return real.malloc ? real.malloc(n) : pool_alloc(n, 16);
}

void cp_real_free(void *p)
{
    if (!p || in_pool(p)) return;
    resolve();
    if (real.free) real.free(p);
}

/* ------------------------------------------------------------------------------------
 * Sampled state */

#define LIVE_BITS 15 /* 32768 sampled live blocks, 1 MiB: beyond that, counted drops */
#define LIVE_CAP (1u << LIVE_BITS)
#define BUCKET_CAP 16384u
#define BUCKET_IDX_CAP (BUCKET_CAP * 2)

typedef struct live_entry {
    uintptr_t ptr; /* 0 = empty */
    uint32_t bucket;
    uint32_t _pad;
    double w; /* 1 / P(sampled) */
    uint64_t size;
} live_entry;

typedef struct alloc_state {
    live_entry live[LIVE_CAP];
    uint32_t nlive;
    uint32_t bidx[BUCKET_IDX_CAP]; /* bucket index + 1 */
    uint32_t nbuckets;
    cp_alloc_bucket buckets[BUCKET_CAP];
} alloc_state;

static alloc_state *S; /* mmap'd: untouched pages cost no memory */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_llong g_rate; /* mean bytes between samples; 0 = off */
atomic_uint_fast64_t cp_alloc_dropped;

static CP_TLS int64_t t_until;
CP_TLS int cp_agent_thread;
static CP_TLS uint64_t t_rng;
static CP_TLS int t_init;

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
    return -log(u) * (double)rate;
}

static uint32_t bucket_find(uint32_t iso, const char *thread, const uint64_t *pcs, uint32_t n)
{
    uint64_t h = cp_hash_bytes(pcs, n * sizeof(uint64_t), iso);
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
            if (!iso) memcpy(nb->thread, thread, sizeof(nb->thread));
            nb->nframes = n;
            memcpy(nb->pcs, pcs, n * sizeof(uint64_t));
            S->bidx[i] = ++S->nbuckets;
            return S->nbuckets - 1;
        }
        cp_alloc_bucket *c = &S->buckets[b - 1];
        if (c->hash == h && c->isolate == iso && c->nframes == n &&
            (iso || strncmp(c->thread, thread, 16) == 0) &&
            memcmp(c->pcs, pcs, n * sizeof(uint64_t)) == 0)
            return b - 1;
    }
}

static void live_insert(uintptr_t p, uint32_t bucket, double w, uint64_t size)
{
    if (S->nlive >= LIVE_CAP - LIVE_CAP / 8) {
        atomic_fetch_add(&cp_alloc_dropped, 1);
        return;
    }
    uint32_t mask = LIVE_CAP - 1;
    uint32_t i = (uint32_t)ptr_hash(p) & mask;
    while (S->live[i].ptr)
        i = (i + 1) & mask;
    S->live[i] = (live_entry){.ptr = p, .bucket = bucket, .w = w, .size = size};
    S->nlive++;
    /* saturating: a counter at 255 stays there (always "maybe"), never wraps to 0 */
    atomic_uchar *c = &filter[filter_idx(p)];
    if (atomic_load_explicit(c, memory_order_relaxed) != 255)
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    cp_alloc_bucket *b = &S->buckets[bucket];
    b->inuse_objects += w;
    b->inuse_bytes += w * (double)size;
}

/* Removes p if it is a sampled live block; backward-shift deletion keeps probes short. */
static int live_remove(uintptr_t p, live_entry *out)
{
    uint32_t mask = LIVE_CAP - 1;
    uint32_t i = (uint32_t)ptr_hash(p) & mask;
    while (S->live[i].ptr && S->live[i].ptr != p)
        i = (i + 1) & mask;
    if (!S->live[i].ptr) return 0;
    if (out) *out = S->live[i];
    cp_alloc_bucket *b = &S->buckets[S->live[i].bucket];
    b->inuse_objects -= S->live[i].w;
    b->inuse_bytes -= S->live[i].w * (double)S->live[i].size;
    atomic_uchar *c = &filter[filter_idx(p)];
    if (atomic_load_explicit(c, memory_order_relaxed) != 255)
        atomic_fetch_sub_explicit(c, 1, memory_order_relaxed);
    S->nlive--;
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


__attribute__((noinline)) static void sample_slow(void *p, size_t n)
{
    int64_t rate = atomic_load_explicit(&g_rate, memory_order_relaxed);
    if (rate <= 0 && !cp_agent_thread) {
        /* Look again later: sampling may be switched on (cp_alloc_set_rate resets the
         * starting thread's countdown; other threads catch up within 64 MiB). */
        t_until = (int64_t)64 << 20;
        return;
    }
    if (cp_agent_thread) {
        t_until = INT64_MIN / 4; /* every allocation takes the checked path */
        return;
    }
    if (cp_in_agent) {
        t_until = (int64_t)draw(rate);
        return;
    }
    if (!t_init) {
        t_init = 1;
        t_until = (int64_t)draw(rate) - (int64_t)n;
        if (t_until > 0) return;
    }
    t_until = (int64_t)draw(rate);
    cp_in_agent = 1;
    cp_thread *t = cp_self ? cp_self : cp_thread_register_self();
    uint64_t pcs[CP_MAX_FRAMES];
    /* frames to skip: sample_slow, then the hook (malloc, calloc, ...) */
    int nf =
        t ? cp_unwind_here(t->stack_lo, t->stack_hi, pcs, CP_MAX_FRAMES, 2, &t->ucache_alloc) : 0;
    uint32_t iso = 0;
    char thread[16] = "";
    sample_owner(t, &iso, thread);
    double w = 1.0 / (1.0 - exp(-(double)n / (double)rate));
    pthread_mutex_lock(&g_lock);
    uint32_t b = bucket_find(iso, thread, pcs, (uint32_t)nf);
    if (b == UINT32_MAX) {
        atomic_fetch_add(&cp_alloc_dropped, 1);
    } else {
        S->buckets[b].alloc_objects += w;
        S->buckets[b].alloc_bytes += w * (double)n;
        live_insert((uintptr_t)p, b, w, n);
    }
    pthread_mutex_unlock(&g_lock);
    cp_in_agent = 0;
}

/* ------------------------------------------------------------------------------------
 * Runtime allocators (contprof.h): blocks a runtime reports itself */

/* Records sampled runtime block p with frames from the walker; the native stack starts at
 * the caller of contprof_alloc_through. */
__attribute__((noinline)) static void record_runtime(void *p, size_t n, int64_t rate,
                                                     const uint64_t *ids, uint32_t m)
{
    cp_thread *t = cp_self ? cp_self : cp_thread_register_self();
    uint64_t pcs[CP_MAX_FRAMES];
    /* frames to skip: record_runtime, through_sampled, contprof_alloc_through (when it
     * tail-calls through_sampled, the runtime's allocator function goes instead: the stack
     * then starts in the runtime, whose frames the language frames replace) */
    int nf =
        t ? cp_unwind_here(t->stack_lo, t->stack_hi, pcs, CP_MAX_FRAMES, 3, &t->ucache_alloc) : 0;
    uint32_t iso = 0;
    char thread[16] = "";
    sample_owner(t, &iso, thread);
    nf = (int)cp_lang_join(iso, pcs, (uint32_t)nf, ids, m);
    double w = 1.0 / (1.0 - exp(-(double)n / (double)rate));
    pthread_mutex_lock(&g_lock);
    uint32_t b = bucket_find(iso, thread, pcs, (uint32_t)nf);
    if (b == UINT32_MAX) {
        atomic_fetch_add(&cp_alloc_dropped, 1);
    } else {
        S->buckets[b].alloc_objects += w;
        S->buckets[b].alloc_bytes += w * (double)n;
        live_insert((uintptr_t)p, b, w, n);
    }
    pthread_mutex_unlock(&g_lock);
}

/* The countdown ran out: decide as sample_slow does, walk, call, record. */
__attribute__((noinline, cold)) static void *through_sampled(contprof_realloc_fn fn, void *ud,
                                                             void *ptr, size_t osize, size_t nsize,
                                                             contprof_walker walker,
                                                             void *walker_arg)
{
    int64_t rate = atomic_load_explicit(&g_rate, memory_order_relaxed);
    int sample = 0;
    if (rate <= 0) {
        t_until = (int64_t)64 << 20; /* as sample_slow: look again later */
    } else if (cp_in_agent || cp_agent_thread) {
        t_until = (int64_t)draw(rate);
    } else if (!t_init) {
        t_init = 1;
        t_until = (int64_t)draw(rate) - (int64_t)nsize;
        sample = t_until <= 0;
        if (sample) t_until = (int64_t)draw(rate);
    } else {
        t_until = (int64_t)draw(rate);
        sample = S != NULL;
    }
    uint64_t ids[32];
    uint32_t m = 0;
    if (sample) {
        cp_in_agent = 1; /* the walker's and interning's allocations are not sampled */
        if (walker) {
            contprof_frame fr[32];
            int k = walker(walker_arg, fr, 32);
            if (k > 32) k = 32;
            if (k > 0) m = (uint32_t)cp_lang_ids(fr, k, ids);
        }
        cp_in_agent = 0;
    }
    int64_t saved = t_until;
    t_until = INT64_MAX / 2;
    void *r = fn(ud, ptr, osize, nsize);
    t_until = saved;
    if (sample && r) {
        cp_in_agent = 1;
        record_runtime(r, nsize, rate, ids, m);
        cp_in_agent = 0;
    }
    return r;
}

__attribute__((noinline, cold)) static void forget_sampled(void *p)
{
    pthread_mutex_lock(&g_lock);
    live_remove((uintptr_t)p, NULL);
    pthread_mutex_unlock(&g_lock);
}

CONTPROF_EXTERN void *contprof_alloc_through(contprof_realloc_fn fn, void *ud, void *ptr,
                                             size_t osize, size_t nsize, contprof_walker walker,
                                             void *walker_arg)
{
    /* A sampled block leaves the table before the allocator can hand it out again. */
    if (ptr && __builtin_expect(atomic_load_explicit(&filter[filter_idx((uintptr_t)ptr)],
                                                     memory_order_relaxed) != 0,
                                0))
        forget_sampled(ptr);
    int64_t left = t_until - (int64_t)nsize;
    if (__builtin_expect(nsize != 0 && left <= 0, 0))
        return through_sampled(fn, ud, ptr, osize, nsize, walker, walker_arg);
    /* the malloc family underneath does not count these bytes again */
    t_until = INT64_MAX / 2;
    void *r = fn(ud, ptr, osize, nsize);
    t_until = left;
    return r;
}

static inline void on_alloc(void *p, size_t n)
{
    if (__builtin_expect(!p, 0)) return;
    t_until -= (int64_t)n;
    if (__builtin_expect(t_until <= 0, 0)) sample_slow(p, n);
}

/* Before the block goes back to the allocator: another thread may get it next. */
static inline void on_free(void *p)
{
    if (!atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed)) return;
    pthread_mutex_lock(&g_lock);
    live_remove((uintptr_t)p, NULL);
    pthread_mutex_unlock(&g_lock);
}

uint32_t cp_alloc_nbuckets(void)
{
    if (!S) return 0;
    pthread_mutex_lock(&g_lock);
    uint32_t n = S->nbuckets;
    pthread_mutex_unlock(&g_lock);
    return n;
}

uint32_t cp_alloc_snapshot(cp_alloc_bucket *out, uint32_t cap)
{
    if (!S) return 0;
    pthread_mutex_lock(&g_lock);
    uint32_t n = S->nbuckets < cap ? S->nbuckets : cap;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = S->buckets[i];
        S->buckets[i].alloc_objects = 0;
        S->buckets[i].alloc_bytes = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return n;
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
 * The interposed family */

/* The sampled case, out of line so the common one is a tail call into the allocator. */
/* An allocation of the agent's own threads failed: serve it from the reserve. */
static void *agent_reserve(size_t n, size_t align)
{
    atomic_store(&cp_agent_oom, 1);
    return pool_alloc(n, align);
}

#define AGENT_RESCUE(p, n, align)                                                                  \
    do {                                                                                           \
        if (__builtin_expect(!(p), 0) && cp_agent_thread) (p) = agent_reserve((n), (align));       \
    } while (0)

__attribute__((noinline, cold)) static void *malloc_sampled(size_t n)
{
    if (!real.malloc) return malloc_boot(n);
    void *p = real.malloc(n);
    if (cp_agent_thread) {
        t_until = INT64_MIN / 4;
        AGENT_RESCUE(p, n, 16);
        return p;
    }
    if (p) sample_slow(p, n);
    return p;
}

__attribute__((noinline, cold)) static void *malloc_boot(size_t n)
{
    resolve();
    if (!real.malloc) return pool_alloc(n, 16); /* dlsym's own requests */
    return real.malloc(n);
}

CONTPROF_EXTERN void *malloc(size_t n)
{
    /* Decided before the call (same distribution): the common path is a tail call. */
    int64_t left = t_until - (int64_t)n;
    t_until = left;
    if (__builtin_expect(left > 0, 1)) return hot_malloc(n);
    return malloc_sampled(n);
}

CONTPROF_EXTERN void *calloc(size_t a, size_t b)
{
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    if (__builtin_expect(!real.calloc, 0)) {
        resolve();
        if (!real.calloc) return pool_alloc(n, 16);
    }
    void *p = real.calloc(a, b);
    AGENT_RESCUE(p, n, 16); /* the pool is zeroed and never reused */
    on_alloc(p, n);
    return p;
}

/* The filter said "maybe": a bootstrap/reserve block (kept), or possibly a sampled one. */
__attribute__((noinline, cold)) static void free_maybe(void *p)
{
    if (in_pool(p)) return;
    pthread_mutex_lock(&g_lock);
    if (S) live_remove((uintptr_t)p, NULL);
    pthread_mutex_unlock(&g_lock);
    hot_free(p);
}

__attribute__((noinline, cold)) static void free_boot(void *p)
{
    resolve();
    if (real.free) real.free(p); /* else: during dlsym itself; the block is kept */
}

CONTPROF_EXTERN void free(void *p)
{
    /* A sampled block leaves the table before the allocator can hand it out again. */
    if (__builtin_expect(
            atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed) != 0,
            0)) {
        free_maybe(p);
        return;
    }
    hot_free(p);
}

CONTPROF_EXTERN void *realloc(void *p, size_t n)
{
    if (p && in_pool(p)) {
        /* a bootstrap block moves to the real heap */
        void *q = malloc(n);
        if (q) {
            size_t have = (size_t)(pool + sizeof(pool) - (char *)p);
            memcpy(q, p, have < n ? have : n);
        }
        return q;
    }
    if (__builtin_expect(!real.realloc, 0)) {
        resolve();
        if (!real.realloc) return pool_alloc(n, 16);
    }
    if (!p) {
        void *q = real.realloc(NULL, n);
        AGENT_RESCUE(q, n, 16);
        on_alloc(q, n);
        return q;
    }
    if (n == 0) {
        on_free(p);
        return real.realloc(p, 0);
    }
    /* The old block may be a sampled one; take it out first (its address may be
     * handed to another thread as soon as realloc moves it). */
    live_entry old = {0};
    int had = 0;
    if (atomic_load_explicit(&filter[filter_idx((uintptr_t)p)], memory_order_relaxed)) {
        pthread_mutex_lock(&g_lock);
        had = live_remove((uintptr_t)p, &old);
        pthread_mutex_unlock(&g_lock);
    }
    void *q = real.realloc(p, n);
    if (!q && cp_agent_thread) {
        q = agent_reserve(n, 16);
        if (q) {
            size_t have = real.malloc_usable_size ? real.malloc_usable_size(p) : 0;
            memcpy(q, p, have < n ? have : n);
            real.free(p);
        }
    }
    if (!q) {
        if (had) { /* p is still valid and still live */
            pthread_mutex_lock(&g_lock);
            live_insert(old.ptr, old.bucket, old.w, old.size);
            pthread_mutex_unlock(&g_lock);
        }
        return NULL;
    }
    on_alloc(q, n);
    return q;
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

CONTPROF_EXTERN int posix_memalign(void **out, size_t align, size_t n)
{
    resolve();
    if (!real.posix_memalign) {
        void *p = pool_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    int rc = real.posix_memalign(out, align, n);
    if (rc != 0 && cp_agent_thread && (*out = agent_reserve(n, align)) != NULL) rc = 0;
    if (rc == 0) on_alloc(*out, n);
    return rc;
}

CONTPROF_EXTERN void *aligned_alloc(size_t align, size_t n)
{
    resolve();
    if (!real.aligned_alloc) return pool_alloc(n, align);
    void *p = real.aligned_alloc(align, n);
    AGENT_RESCUE(p, n, align);
    on_alloc(p, n);
    return p;
}

CONTPROF_EXTERN void *memalign(size_t align, size_t n)
{
    resolve();
    if (!real.memalign) return pool_alloc(n, align);
    void *p = real.memalign(align, n);
    AGENT_RESCUE(p, n, align);
    on_alloc(p, n);
    return p;
}

CONTPROF_EXTERN void *valloc(size_t n)
{
    resolve();
    if (!real.valloc) return pool_alloc(n, 4096);
    void *p = real.valloc(n);
    on_alloc(p, n);
    return p;
}

CONTPROF_EXTERN void *pvalloc(size_t n)
{
    resolve();
    if (!real.pvalloc) return pool_alloc(n, 4096);
    void *p = real.pvalloc(n);
    on_alloc(p, n);
    return p;
}

CONTPROF_EXTERN size_t malloc_usable_size(void *p)
{
    if (!p) return 0;
    if (in_pool(p)) return (size_t)(pool + sizeof(pool) - (char *)p);
    resolve();
    return real.malloc_usable_size ? real.malloc_usable_size(p) : 0;
}
