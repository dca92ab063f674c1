/* The capture tests' workload: two named threads, "alpha" and "beta", that burn CPU or
 * allocate at the same time, then print what they really did (thread CPU in ns, bytes
 * allocated) so the profiles can be compared with it. Usage: cpcap cpu|alloc SECS. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static volatile uint64_t sink;
static double secs;
static int alloc_mode;

typedef struct result {
    double cpu;
    uint64_t bytes;
} result;

#define BURN(name)                                                                                 \
    __attribute__((noinline)) void name(result *r)                                                 \
    {                                                                                              \
        double t0 = thread_cpu();                                                                  \
        uint64_t x = 1;                                                                            \
        while (thread_cpu() - t0 < secs)                                                           \
            for (int i = 0; i < 20000; i++)                                                        \
                x = x * 6364136223846793005ULL + 1;                                                \
        sink += x;                                                                                 \
        r->cpu = thread_cpu();                                                                     \
    }
BURN(burn_alpha)
BURN(burn_beta)

#define ALLOC(name)                                                                                \
    __attribute__((noinline)) void name(result *r)                                                 \
    {                                                                                              \
        double t0 = thread_cpu();                                                                  \
        uint64_t s = 7;                                                                            \
        while (thread_cpu() - t0 < secs) {                                                         \
            for (int i = 0; i < 1000; i++) {                                                       \
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;                           \
                size_t n = 64 + (size_t)((s >> 33) % 8192);                                        \
                char *p = malloc(n);                                                               \
                if (!p) continue;                                                                  \
                p[0] = 1;                                                                          \
                sink += (uint64_t)p[0];                                                            \
                free(p);                                                                           \
                r->bytes += n;                                                                     \
            }                                                                                      \
        }                                                                                          \
        r->cpu = thread_cpu();                                                                     \
    }
ALLOC(alloc_alpha)
ALLOC(alloc_beta)

static void *alpha(void *a)
{
    pthread_setname_np(pthread_self(), "alpha");
    if (alloc_mode)
        alloc_alpha(a);
    else
        burn_alpha(a);
    return NULL;
}

static void *beta(void *a)
{
    pthread_setname_np(pthread_self(), "beta");
    if (alloc_mode)
        alloc_beta(a);
    else
        burn_beta(a);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cpcap cpu|alloc SECS\n");
        return 2;
    }
    alloc_mode = !strcmp(argv[1], "alloc");
    secs = atof(argv[2]);
    result ra = {0}, rb = {0};
    pthread_t a, b;
    pthread_create(&a, NULL, alpha, &ra);
    pthread_create(&b, NULL, beta, &rb);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("alpha_cpu_ns=%lld beta_cpu_ns=%lld alpha_bytes=%llu beta_bytes=%llu\n",
           (long long)(ra.cpu * 1e9), (long long)(rb.cpu * 1e9), (unsigned long long)ra.bytes,
           (unsigned long long)rb.bytes);
    return 0;
}
