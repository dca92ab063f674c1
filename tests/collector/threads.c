/* Thread shapes the CPU engines must see (test_threads.c): a server that blocks every
 * signal before starting its workers, a worker that blocks them once running, and many
 * short threads at once. Each mode prints, on its last line, the CPU seconds its threads
 * used (CLOCK_THREAD_CPUTIME_ID of each, read at its end), which the profiles must show.
 * Usage: cpt MODE N SECS. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static volatile uint64_t sink;
static _Atomic double g_cpu; /* the threads' CPU seconds, each added at its end */
static double g_secs;

/* k tells the bodies apart: GCC folds identical functions into one name */
#define BURN(name, k)                                                                              \
    __attribute__((noinline)) void name(double secs)                                               \
    {                                                                                              \
        double t0 = thread_cpu();                                                                  \
        uint64_t x = 1;                                                                            \
        while (thread_cpu() - t0 < secs)                                                           \
            for (int i = 0; i < 20000; i++)                                                        \
                x = x * 6364136223846793005ULL + k;                                                \
        sink += x;                                                                                 \
    }
BURN(burn_blocked, 1)
BURN(burn_late, 3)
BURN(burn_short, 5)

static void add_cpu(void)
{
    double c = thread_cpu(), old = atomic_load(&g_cpu);
    while (!atomic_compare_exchange_weak(&g_cpu, &old, old + c)) {
    }
}

static void *blocked_worker(void *a)
{
    (void)a;
    burn_blocked(g_secs);
    add_cpu();
    return NULL;
}

/* Starts with the signals of its creator, then blocks them all for good. */
static void *late_worker(void *a)
{
    (void)a;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    burn_late(g_secs);
    add_cpu();
    return NULL;
}

static void *short_worker(void *a)
{
    (void)a;
    burn_short(g_secs);
    add_cpu();
    return NULL;
}

/* n threads of fn at once; the main thread only starts and joins them. */
static void run(int n, void *(*fn)(void *))
{
    pthread_t *th = calloc((size_t)n, sizeof(pthread_t));
    if (!th) exit(2);
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, fn, NULL) != 0) exit(3);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    free(th);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: cpt blocked|late|short N SECS\n");
        return 2;
    }
    int n = atoi(argv[2]);
    g_secs = atof(argv[3]);
    if (!strcmp(argv[1], "blocked")) {
        /* as servers do before starting workers, so that one thread takes the signals */
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL);
        run(n, blocked_worker);
    } else if (!strcmp(argv[1], "late")) {
        run(n, late_worker);
    } else if (!strcmp(argv[1], "short")) {
        run(n, short_worker);
    } else {
        return 2;
    }
    printf("%.6f\n", atomic_load(&g_cpu));
    return 0;
}
