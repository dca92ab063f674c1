/* A process of named isolates for the capture test: one thread per name given, each named
 * so (pthread_setname_np) and burning CPU for SECONDS in a function of its own
 * (burn_<name>, one of counter, other: the latter half the time); at the end each prints "cpu NAME
 * NS" with the CPU time it burned (CLOCK_THREAD_CPUTIME_ID). usage: capwork SECONDS NAME... */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double g_seconds;
static volatile uint64_t g_sink;

static int64_t ns_of(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until the wall clock passes the end; the work is one function per isolate. */
#define BURN(name)                                                                                 \
    __attribute__((noinline)) void burn_##name(int64_t end)                                        \
    {                                                                                              \
        uint64_t x = 1;                                                                            \
        while (ns_of(CLOCK_MONOTONIC) < end)                                                       \
            for (int i = 0; i < 20000; i++)                                                        \
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;                           \
        g_sink += x;                                                                               \
    }
BURN(counter)

/* The other isolate burns half the time (5 ms on, 5 ms off): on a shared machine the
 * captured thread then gets more of a core, and this one still has CPU to count. */
__attribute__((noinline)) void burn_other(int64_t end)
{
    uint64_t x = 1;
    for (int64_t now = ns_of(CLOCK_MONOTONIC); now < end; now = ns_of(CLOCK_MONOTONIC)) {
        int64_t until = now + 5000000;
        while (ns_of(CLOCK_MONOTONIC) < until)
            for (int i = 0; i < 2000; i++)
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    g_sink += x;
}

static void *run(void *arg)
{
    const char *name = arg;
    pthread_setname_np(pthread_self(), name);
    int64_t end = ns_of(CLOCK_MONOTONIC) + (int64_t)(g_seconds * 1e9);
    if (strcmp(name, "counter") == 0)
        burn_counter(end);
    else
        burn_other(end);
    printf("cpu %s %lld\n", name, (long long)ns_of(CLOCK_THREAD_CPUTIME_ID));
    fflush(stdout);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (g_seconds = atof(argv[1])) <= 0) {
        fprintf(stderr, "usage: capwork SECONDS NAME...\n");
        return 2;
    }
    pthread_t t[8];
    int n = argc - 2 < 8 ? argc - 2 : 8;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, run, argv[i + 2])) return 1;
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    return 0;
}
