/* The next allocator (found with dlsym(RTLD_NEXT)) and the static pool that serves dlsym's
 * own requests before it is known, and later the agent's threads when it fails them. */
#include "nextmalloc.h"
#include "guard.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

cp_next_fns cp_next;
static void free_checked(void *p);
static size_t usable_checked(void *p);
void *(*cp_next_hot_malloc)(size_t) = cp_next_malloc_boot;
void (*_Atomic cp_next_hot_free)(void *) = free_checked;
size_t (*_Atomic cp_next_hot_usable)(void *) = usable_checked;
static int resolving;
/* The next allocator is glibc's: its chunk header can tell fresh mmapped blocks. */
static int next_is_glibc;

/* dlsym itself allocates: those requests are served from here and never freed. The same
 * pool is the agent's emergency reserve: when the allocator fails the agent's own threads,
 * they are served from here, because libdw and librdkafka do not survive a NULL from
 * malloc (measured: libdw crashes in dwarf_getsrclines). The agent then degrades
 * (cp_agent_oom). In .bss: untouched pages cost nothing. */
_Alignas(4096) char cp_next_pool[CP_NEXT_POOL_SIZE] CP_BIG;
atomic_int cp_agent_oom;
static atomic_size_t pool_used;
/* A pool block that is not page-aligned was handed out (the agent's reserve): from then
 * on free checks the pool's range on every call (free_checked). */
static atomic_int pool_mixed;

static void *pool_alloc(size_t n, size_t align)
{
    if (align < 16) align = 16;
    size_t cur = atomic_load(&pool_used), start;
    do {
        start = (cur + align - 1) & ~(align - 1);
        if (start + n > CP_NEXT_POOL_SIZE) return NULL;
    } while (!atomic_compare_exchange_weak(&pool_used, &cur, start + n));
    if (start & 4095) {
        /* free's page test would let this block through to the next free */
        atomic_store(&pool_mixed, 1);
        atomic_store(&cp_next_hot_free, free_checked);
        atomic_store(&cp_next_hot_usable, usable_checked);
    }
    return cp_next_pool + start; /* zeroed: static storage, never reused */
}

/* Bootstrap requests (before the next allocator is found): page-aligned, so that free's
 * page test catches them and the common free needs no range check. */
void *cp_next_boot_alloc(size_t n, size_t align)
{
    return pool_alloc(n, align > 4096 ? align : 4096);
}

void *cp_next_reserve(size_t n, size_t align)
{
    atomic_store(&cp_agent_oom, 1);
    return pool_alloc(n, align);
}

/* glibc's chunk header (the size word before the block) has IS_MMAPPED (2) for blocks of
 * their own mapping, which are fresh zero pages unless MALLOC_PERTURB_ is set. */
static int glibc_perturb;
int cp_next_fresh_zeroed(const void *p)
{
    return next_is_glibc && !glibc_perturb && (((const size_t *)p)[-1] & 2);
}

void cp_next_resolve(void)
{
    if (cp_next.free || resolving) return;
    resolving = 1;
    int saved_errno = errno; /* a host's successful malloc leaves errno alone */
    cp_next_fns r;
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
    void *libc_calloc = dlsym(RTLD_NEXT, "__libc_calloc");
    next_is_glibc = r.calloc && libc_calloc == (void *)r.calloc;
    const char *pert = getenv("MALLOC_PERTURB_");
    const char *tun = getenv("GLIBC_TUNABLES");
    glibc_perturb = (pert && *pert && strcmp(pert, "0") != 0) || (tun && strstr(tun, "perturb"));
    cp_next = r;
    if (r.malloc) cp_next_hot_malloc = r.malloc;
    if (r.free) {
        /* seq_cst, against pool_alloc: either it sees this store, or this sees its flag */
        atomic_store(&cp_next_hot_free, r.free);
        if (atomic_load(&pool_mixed)) atomic_store(&cp_next_hot_free, free_checked);
    }
    if (r.malloc_usable_size) {
        atomic_store(&cp_next_hot_usable, r.malloc_usable_size);
        if (atomic_load(&pool_mixed)) atomic_store(&cp_next_hot_usable, usable_checked);
    }
    resolving = 0;
    errno = saved_errno;
}

__attribute__((noinline, cold)) void *cp_next_malloc_boot(size_t n)
{
    cp_next_resolve();
    if (!cp_next.malloc) return cp_next_boot_alloc(n, 16); /* dlsym's own requests */
    return cp_next.malloc(n);
}

void *cp_real_malloc(size_t n)
{
    cp_next_resolve();
    return cp_next.malloc ? cp_next.malloc(n) : cp_next_boot_alloc(n, 16);
}

void cp_real_free(void *p)
{
    if (!p || cp_next_in_pool(p)) return;
    cp_next_resolve();
    if (cp_next.free) cp_next.free(p);
}

/* cp_next_hot_free while the pool may hold blocks that are not page-aligned. */
__attribute__((noinline)) static void free_checked(void *p)
{
    if (cp_next_in_pool(p)) return;
    if (__builtin_expect(!cp_next.free, 0)) {
        cp_next_resolve();
        if (!cp_next.free) return; /* during dlsym itself; the block is kept */
    }
    cp_next.free(p);
}

size_t cp_next_pool_usable(const void *p)
{
    return (size_t)(cp_next_pool + CP_NEXT_POOL_SIZE - (const char *)p);
}

/* cp_next_hot_usable while the pool may hold blocks that the page test does not catch. */
__attribute__((noinline)) static size_t usable_checked(void *p)
{
    if (cp_next_in_pool(p)) return cp_next_pool_usable(p);
    if (__builtin_expect(!cp_next.malloc_usable_size, 0)) {
        cp_next_resolve();
        if (!cp_next.malloc_usable_size) return 0;
    }
    return cp_next.malloc_usable_size(p);
}
