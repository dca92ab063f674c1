/* Benchmark workloads for the collector: a fixed amount of work, timed by the program
 * itself (the work phase only, so start-up and exit are not counted). Prints the wall time
 * and the CPU time of the whole process (every thread, the agent's included) in seconds,
 * then the peak RSS in KiB. On a shared machine the CPU time is the steadier measure.
 *   cpb cpu THREADS UNITS     CPU-bound, recursive calls (stacks ~20 deep)
 *   cpb malloc THREADS UNITS  malloc/free-heavy: 16-527 bytes, one in 64 of 4-8 KiB, 256
 *                             blocks per thread kept live at any time, each block
 *                             written in full; about 40% of the time is in malloc/free */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long maxrss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static long units;
static volatile uint64_t sink;

__attribute__((noinline)) static uint64_t leaf(uint64_t x)
{
    for (int i = 0; i < 200; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

__attribute__((noinline)) static uint64_t deep(uint64_t x, int d)
{
    if (d == 0) return leaf(x);
    uint64_t r = deep(x ^ (uint64_t)d, d - 1);
    __asm__ volatile("" : "+r"(r));
    return r;
}

static void *cpu_thread(void *a)
{
    uint64_t x = (uintptr_t)a;
    for (long i = 0; i < units * 20000; i++)
        x = deep(x, 20);
    sink += x;
    return NULL;
}

static void *malloc_thread(void *a)
{
    uint64_t s = (uintptr_t)a + 1;
    void *slot[256] = {0};
    for (long i = 0; i < units * 200000; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        unsigned k = (unsigned)(s >> 40) & 255;
        free(slot[k]);
        /* mostly small objects, one in 64 of 4-8 KiB */
        size_t n = 16 + ((s >> 20) & 511);
        if (((s >> 8) & 63) == 0) n = 4096 + ((s >> 30) & 4095);
        char *p = malloc(n);
        memset(p, (int)i, n); /* programs initialise what they allocate */
        slot[k] = p;
    }
    for (int k = 0; k < 256; k++)
        free(slot[k]);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: cpb cpu|malloc THREADS UNITS\n");
        return 2;
    }
    int n = atoi(argv[2]);
    units = atol(argv[3]);
    void *(*fn)(void *) = strcmp(argv[1], "cpu") == 0 ? cpu_thread : malloc_thread;
    pthread_t t[64];
    if (n < 1 || n > 64) return 2;
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, fn, (void *)(uintptr_t)i);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("%.6f %.6f %ld\n", now_s() - t0, cpu_s() - c0, maxrss_kib());
    return 0;
}
