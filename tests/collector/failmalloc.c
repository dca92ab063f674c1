/* Fault injection for test_agent: preloaded after libcontprof, it makes every Nth
 * allocation made on the agent's thread ("contprof-agent") fail, so the agent's
 * out-of-memory paths run for real. CP_FAIL_EVERY=N (default 5). */
#include <dlfcn.h>
#include <sys/prctl.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static atomic_ulong calls, failed;
static unsigned long every = 5;
static __thread int state; /* 0 unknown, 1 the agent thread, 2 another thread */
static __thread int looks;
static char pool[4096];
static size_t pool_used;

static int on_agent_thread(void)
{
    if (state) return state == 1;
    char name[17] = "";
    prctl(PR_GET_NAME, name, 0, 0, 0);
    if (!strcmp(name, "contprof-agent"))
        state = 1;
    else if (++looks > 64)
        state = 2; /* the agent names itself before it allocates */
    return state == 1;
}

static int should_fail(void)
{
    if (!on_agent_thread()) return 0;
    if (atomic_fetch_add(&calls, 1) % every != every - 1) return 0;
    atomic_fetch_add(&failed, 1);
    errno = ENOMEM;
    return 1;
}

static void init(void)
{
    if (next_malloc) return;
    const char *e = getenv("CP_FAIL_EVERY");
    if (e && atoi(e) > 0) every = (unsigned long)atoi(e);
    next_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
}

__attribute__((visibility("default"))) void *malloc(size_t n)
{
    if (!next_malloc) init();
    if (should_fail()) return NULL;
    return next_malloc(n);
}

__attribute__((visibility("default"))) void *calloc(size_t a, size_t b)
{
    if (!next_calloc) {
        /* dlsym's own calloc, before init finished */
        if (pool_used + a * b > sizeof(pool)) return NULL;
        void *p = pool + pool_used;
        pool_used += (a * b + 15) & ~(size_t)15;
        return p;
    }
    if (should_fail()) return NULL;
    return next_calloc(a, b);
}

__attribute__((visibility("default"))) void *realloc(void *p, size_t n)
{
    if (!next_realloc) init();
    if (n && should_fail()) return NULL;
    return next_realloc(p, n);
}

__attribute__((visibility("default"))) void free(void *p)
{
    static void (*next_free)(void *);
    if ((char *)p >= pool && (char *)p < pool + sizeof(pool)) return;
    if (!next_free) next_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    next_free(p);
}

__attribute__((destructor)) static void report(void)
{
    const char *out = getenv("CP_FAIL_REPORT");
    if (!out) return;
    FILE *f = fopen(out, "w");
    if (f) {
        fprintf(f, "%lu %lu\n", (unsigned long)atomic_load(&calls),
                (unsigned long)atomic_load(&failed));
        fclose(f);
    }
}
