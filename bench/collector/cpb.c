/* Benchmark workloads for the collector: a fixed amount of work, measured by the program
 * itself. Each thread first does WARMUP units (default 0), then all meet, and only the
 * rest is measured: so an agent's start-up (its constructor, loading libdw, the first
 * symbolization) can be left out of a steady-state measurement. Prints the wall time and
 * the CPU time (user + system) of the whole process over the measured part (every thread,
 * the agent's included) in seconds, then the peak RSS in KiB.
 *   cpb cpu THREADS UNITS [WARMUP]     CPU-bound, recursive calls (stacks ~20 deep)
 *   cpb malloc THREADS UNITS [WARMUP]  malloc/free-heavy: 16-527 bytes, one in 64 of
 *                                      4-8 KiB, 256 blocks per thread kept live at any
 *                                      time, each block written in full; about 40% of
 *                                      the time is in malloc/free
 *   cpb sig THREADS UNITS [WARMUP]     the cpu workload plus, at the bottom of every 200th
 *                                      recursion, one SIGPROF sent to itself as the agent's
 *                                      CPU timers send theirs (si_code SI_TIMER, the agent's
 *                                      cookie as value) and a 5 ms sleep: 100 signals per
 *                                      unit per thread, whatever the speed (valgrind).
 *                                      Under the agent its handler takes them as samples;
 *                                      alone, an empty handler does. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

static long units, warmup;
static volatile uint64_t sink;
static pthread_barrier_t start_line;
static double t0, c0;

/* Every thread calls this once between its warm-up and its measured work. */
static void measured_from_here(void)
{
    if (pthread_barrier_wait(&start_line) == PTHREAD_BARRIER_SERIAL_THREAD) {
        t0 = now_s();
        c0 = cpu_s();
    }
    pthread_barrier_wait(&start_line);
}

__attribute__((noinline)) static uint64_t leaf(uint64_t x)
{
    for (int i = 0; i < 200; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

/* ---- sig: one timer signal, handled before this returns ---- */

/* The sigev_value of the agent's CPU timers (collector/thread.c CP_TIMER_COOKIE): the agent
 * samples on signals with it and hands any other to the program. */
#define CP_TIMER_COOKIE 0x636f6e7470726f66ULL

static void on_sig(int s)
{
    (void)s;
}

__attribute__((noinline)) static uint64_t sig_leaf(uint64_t x)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_signo = SIGPROF;
    si.si_code = SI_TIMER;
    si.si_value.sival_ptr = (void *)(uintptr_t)CP_TIMER_COOKIE;
    syscall(SYS_rt_tgsigqueueinfo, getpid(), (pid_t)syscall(SYS_gettid), SIGPROF, &si);
    do
        sigpending(&pend);
    while (!sigismember(&pend, SIGPROF));
    pthread_sigmask(SIG_UNBLOCK, &set, NULL); /* the handler runs here */
    /* A pause, so that the agent drains its rings before they fill (it wakes before a
     * ring is half full at its sampling rate: every 500 ms at low rates, while these
     * signals come regardless of it), even under valgrind, which runs one thread at a
     * time: at most 200 signals a second. */
    struct timespec ms = {0, 5000000};
    nanosleep(&ms, NULL);
    return leaf(x);
}

__attribute__((noinline)) static uint64_t deep(uint64_t x, int d, int sig)
{
    if (d == 0) return sig ? sig_leaf(x) : leaf(x);
    uint64_t r = deep(x ^ (uint64_t)d, d - 1, sig);
    __asm__ volatile("" : "+r"(r));
    return r;
}

static void cpu_units(uint64_t *x, long n, int sig)
{
    for (long i = 0; i < n * 20000; i++)
        *x = deep(*x, 20, sig && i % 200 == 0);
}

static void *cpu_thread(void *a)
{
    uint64_t x = (uintptr_t)a;
    cpu_units(&x, warmup, 0);
    measured_from_here();
    cpu_units(&x, units, 0);
    sink += x;
    return NULL;
}

static void *sig_thread(void *a)
{
    uint64_t x = (uintptr_t)a;
    cpu_units(&x, warmup, 1);
    measured_from_here();
    cpu_units(&x, units, 1);
    sink += x;
    return NULL;
}

static void malloc_units(uint64_t *s, void **slot, long n)
{
    for (long i = 0; i < n * 200000; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        unsigned k = (unsigned)(*s >> 40) & 255;
        free(slot[k]);
        /* mostly small objects, one in 64 of 4-8 KiB */
        size_t sz = 16 + ((*s >> 20) & 511);
        if (((*s >> 8) & 63) == 0) sz = 4096 + ((*s >> 30) & 4095);
        char *p = malloc(sz);
        memset(p, (int)i, sz); /* programs initialise what they allocate */
        slot[k] = p;
    }
}

static void *malloc_thread(void *a)
{
    uint64_t s = (uintptr_t)a + 1;
    void *slot[256] = {0};
    malloc_units(&s, slot, warmup);
    measured_from_here();
    malloc_units(&s, slot, units);
    for (int k = 0; k < 256; k++)
        free(slot[k]);
    return NULL;
}

/* Whether the agent is preloaded (its sigaction hook shows the program SIG_DFL for SIGPROF;
 * /proc's SigCgt does not tell under valgrind, which catches every signal itself). */
static int agent_preloaded(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "libcontprof") != NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: cpb cpu|malloc|sig THREADS UNITS [WARMUP]\n");
        return 2;
    }
    int n = atoi(argv[2]);
    units = atol(argv[3]);
    warmup = argc > 4 ? atol(argv[4]) : 0;
    void *(*fn)(void *) = NULL;
    if (strcmp(argv[1], "cpu") == 0) fn = cpu_thread;
    if (strcmp(argv[1], "malloc") == 0) fn = malloc_thread;
    if (strcmp(argv[1], "sig") == 0) {
        fn = sig_thread;
        /* The agent's handler is installed (it starts before main) and samples on SIGPROF:
         * leave it. Alone, an empty handler stands in, so both runs take the same signals. */
        if (!agent_preloaded()) signal(SIGPROF, on_sig);
    }
    pthread_t t[64];
    if (!fn || n < 1 || n > 64) return 2;
    pthread_barrier_init(&start_line, NULL, (unsigned)n);
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, fn, (void *)(uintptr_t)i);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("%.6f %.6f %ld\n", now_s() - t0, cpu_s() - c0, maxrss_kib());
    return 0;
}
