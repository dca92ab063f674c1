/* Module snapshots published from several threads at once (unwind.c): host threads after
 * their dlopen/dlclose (cp_modules_refresh_host), the agent at its windows
 * (cp_modules_refresh, cp_modules_current), and readers unwinding meanwhile. Nothing the
 * agent holds or a reader reads may be unmapped under it; nothing replaced may stay
 * mapped once the agent refreshed. Runs in the sanitizer build too. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "unwind.h"

/* A library the test does not link: each dlopen/dlclose pair moves the loader's counters. */
#define EXTRA_LIB "libdw.so.1"
#define HOSTS 3
#define HOST_ROUNDS 200
#define AGENT_ROUNDS 200

static atomic_int g_hosts_left;

static void *host_main(void *arg)
{
    int rounds = *(int *)arg;
    for (int i = 0; i < rounds; i++) {
        void *h = dlopen(EXTRA_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen %s: %s\n", EXTRA_LIB, dlerror());
            abort();
        }
        if (cp_modules_refresh_host() != 0) abort();
        dlclose(h);
        if (cp_modules_refresh_host() != 0) abort();
    }
    atomic_fetch_sub(&g_hosts_left, 1);
    return NULL;
}

/* The agent: refreshes, then reads every byte of the snapshot it holds. */
static void *agent_main(void *arg)
{
    int rounds = *(int *)arg;
    unsigned long sum = 0;
    for (int i = 0; i < rounds || atomic_load(&g_hosts_left) > 0; i++) {
        if (cp_modules_refresh(0) != 0) abort();
        const cp_modules *m = cp_modules_current();
        if (!m) abort();
        const unsigned char *p = (const unsigned char *)m;
        for (size_t k = 0; k < sizeof(*m) + m->n * sizeof(cp_module); k += 64)
            sum += p[k];
        if (cp_modules_find(m, (uintptr_t)&host_main) == NULL) abort();
    }
    return (void *)(uintptr_t)(sum | 1);
}

static cp_ucache g_cache;

/* A reader: unwinds its own stack (what a signal handler does) until the hosts are done. */
static void *reader_main(void *arg)
{
    (void)arg;
    uint64_t pcs[CP_MAX_FRAMES];
    pthread_attr_t at;
    void *lo;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &at) != 0 || pthread_attr_getstack(&at, &lo, &size))
        abort();
    pthread_attr_destroy(&at);
    long n = 0;
    while (atomic_load(&g_hosts_left) > 0) {
        if (cp_unwind_here((uintptr_t)lo, (uintptr_t)lo + size, pcs, CP_MAX_FRAMES, 0, &g_cache) <
            2)
            abort();
        n++;
    }
    return (void *)n;
}

static void round_of(int host_rounds, int agent_rounds)
{
    pthread_t h[HOSTS], a, r;
    atomic_store(&g_hosts_left, HOSTS);
    CHECK(pthread_create(&a, NULL, agent_main, &agent_rounds) == 0);
    CHECK(pthread_create(&r, NULL, reader_main, NULL) == 0);
    for (int i = 0; i < HOSTS; i++)
        CHECK(pthread_create(&h[i], NULL, host_main, &host_rounds) == 0);
    for (int i = 0; i < HOSTS; i++)
        CHECK(pthread_join(h[i], NULL) == 0);
    CHECK(pthread_join(a, NULL) == 0);
    CHECK(pthread_join(r, NULL) == 0);
    CHECK_EQ(cp_modules_refresh(0), 0); /* the agent's next window */
}

TEST(publishers_take_turns)
{
    CHECK_EQ(cp_modules_refresh_host(), 0); /* before the agent's first: nothing */
    CHECK(cp_modules_current() == NULL);
    CHECK_EQ(cp_modules_refresh(1), 0);
    const cp_modules *first = cp_modules_current();
    CHECK(first != NULL);
    uint64_t gen = first->gen;
    /* warm-up: thread stacks, malloc arenas and the library's first load exist from here */
    round_of(2, 2);
    round_of(HOST_ROUNDS, AGENT_ROUNDS);
    const cp_modules *last = cp_modules_current();
    printf("%llu snapshots published; mapped after the agent's refresh: %u\n",
           (unsigned long long)(last->gen - gen), cp_modules_mapped());
    CHECK_EQ(cp_modules_mapped(), 1); /* what was replaced was unmapped */
    /* one host alone: a snapshot for each dlopen and each dlclose */
    gen = last->gen;
    int one = 20;
    host_main(&one);
    /* the host unmapped what it replaced, but for the one the agent holds */
    CHECK(cp_modules_mapped() <= 2);
    CHECK_EQ(cp_modules_refresh(0), 0);
    last = cp_modules_current();
    printf("one host, %d dlopen/dlclose pairs: %llu snapshots\n", one,
           (unsigned long long)(last->gen - gen));
    CHECK(last->gen - gen >= 2 * (uint64_t)one);
    CHECK_EQ(cp_modules_mapped(), 1);
    /* dlopen'ed, published by the host's refresh: found in the snapshot */
    void *h = dlopen(EXTRA_LIB, RTLD_NOW | RTLD_LOCAL);
    CHECK(h);
    CHECK_EQ(cp_modules_refresh_host(), 0);
    void *fn = dlsym(h, "dwfl_begin");
    CHECK(fn);
    const cp_module *mod = cp_modules_find(cp_modules_current(), (uintptr_t)fn);
    CHECK(mod != NULL);
    CHECK(strstr(mod->path, "libdw") != NULL);
    dlclose(h);
}

TEST_MAIN(T(publishers_take_turns))
