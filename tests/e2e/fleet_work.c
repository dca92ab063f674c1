/* The fleet test's program (fleet_test in e2e_test.c): two threads burning CPU in a few
 * functions for argv[1] seconds. Built -O2 without frame pointers and stripped, like a
 * distribution's binary: the agent can unwind it (.eh_frame) but not name its frames. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static uint64_t mix(uint64_t x, int n)
{
    for (int i = 0; i < n; i++)
        x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull + (uint64_t)i;
    return x;
}

__attribute__((noinline)) static uint64_t hash_rows(uint64_t seed)
{
    uint64_t x = seed;
    for (int r = 0; r < 64; r++)
        x += mix(x + (uint64_t)r, 2000);
    return x;
}

__attribute__((noinline)) static uint64_t compress_block(uint64_t seed)
{
    uint64_t x = seed;
    for (int r = 0; r < 32; r++)
        x ^= mix(x * 3 + (uint64_t)r, 4000);
    return x;
}

static double until;

static void *worker(void *arg)
{
    uint64_t x = (uint64_t)(uintptr_t)arg;
    while (now_s() < until)
        x = compress_block(x);
    sink = x;
    return NULL;
}

int main(int argc, char **argv)
{
    until = now_s() + (argc > 1 ? atof(argv[1]) : 5);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, (void *)(uintptr_t)7)) return 1;
    uint64_t x = 1;
    while (now_s() < until)
        x = hash_rows(x);
    sink = x;
    pthread_join(t, NULL);
    return 0;
}
