/* Workload programs the collector tests run with and without the agent. Each mode prints
 * a deterministic result (so outputs can be compared) and, where a test needs it, the
 * quantity the profiles must show. Usage: cpw MODE [ARGS]. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static volatile uint64_t sink;

#define BURN(name)                                                                                 \
    __attribute__((noinline)) void name(double secs)                                               \
    {                                                                                              \
        double t0 = thread_cpu();                                                                  \
        uint64_t x = 1;                                                                            \
        while (thread_cpu() - t0 < secs)                                                           \
            for (int i = 0; i < 20000; i++)                                                        \
                x = x * 6364136223846793005ULL + 1;                                                \
        sink += x;                                                                                 \
    }
BURN(burn_alpha)
BURN(burn_beta)
BURN(burn_solo)
BURN(burn_early)
BURN(burn_late)

static void *alpha(void *a)
{
    pthread_setname_np(pthread_self(), "alpha");
    burn_alpha(*(double *)a * 3);
    return NULL;
}

static void *beta(void *a)
{
    pthread_setname_np(pthread_self(), "beta");
    burn_beta(*(double *)a);
    return NULL;
}

/* Two named threads burning CPU 3:1. */
static int mode_ratio(double unit)
{
    pthread_t a, b;
    pthread_create(&a, NULL, alpha, &unit);
    pthread_create(&b, NULL, beta, &unit);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("done\n");
    return 0;
}

static void *phased(void *a)
{
    pthread_setname_np(pthread_self(), "alpha");
    burn_early(*(double *)a);
    burn_late(*(double *)a * 2);
    return NULL;
}

/* One thread named alpha burning unit seconds of CPU in burn_early, then twice that in
 * burn_late: the windows after the first phase have no sample in burn_early. */
static int mode_phases(double unit)
{
    pthread_t a;
    pthread_create(&a, NULL, phased, &unit);
    pthread_join(a, NULL);
    printf("done\n");
    return 0;
}

/* One thread burning secs of CPU; prints the CPU time it measured. */
static int mode_solo(double secs)
{
    double t0 = thread_cpu();
    burn_solo(secs);
    printf("%.6f\n", thread_cpu() - t0);
    return 0;
}

/* --- allocation workloads ---------------------------------------------------------- */

static void *volatile keep_ctor, *volatile keep_main;

__attribute__((constructor)) static void before_main(void);
void *ctor_alloc(size_t n);
__attribute__((noinline)) void *ctor_alloc(size_t n)
{
    char *p = malloc(n);
    memset(p, 1, n);
    return p;
}
static void before_main(void)
{
    if (getenv("CPW_CTOR_ALLOC")) keep_ctor = ctor_alloc(8u << 20);
}

__attribute__((noinline)) void *startup_alloc(size_t n)
{
    char *p = malloc(n);
    memset(p, 7, n);
    return p;
}

__attribute__((noinline)) void churn_small(void)
{
    for (int i = 0; i < 1000; i++) {
        void *p = malloc(64 + (size_t)(i % 100));
        sink += (uintptr_t)p;
        free(p);
    }
}

/* 64 MiB at start, kept; then `secs` seconds of light work. */
static int mode_startup(double secs)
{
    keep_main = startup_alloc(64u << 20);
    double end = (double)time(NULL) + secs;
    while ((double)time(NULL) < end) {
        churn_small();
        usleep(20000);
    }
    printf("%d\n", ((char *)keep_main)[12345]);
    return 0;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* The empty asm keeps these frames: no tail call into malloc. */
__attribute__((noinline)) void *mixed_alloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

/* Allocates a known volume of mixed sizes and frees it; prints the volume in bytes. */
static int mode_mixed(double mib)
{
    uint64_t s = 42, total = 0, target = (uint64_t)(mib * 1048576);
    while (total < target) {
        uint64_t r = lcg(&s) % 100;
        size_t n = r < 60   ? 16 + lcg(&s) % 256
                   : r < 95 ? 1024 + lcg(&s) % 16384
                            : 65536 + lcg(&s) % (1 << 20);
        char *p = mixed_alloc(n);
        p[0] = 1;
        total += n;
        free(p);
    }
    printf("%llu\n", (unsigned long long)total);
    return 0;
}

__attribute__((noinline)) void *churn_alloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

static _Atomic uint64_t churn_alloc_bytes; /* what churn_alloc itself was asked for */

static void *churn_thread(void *a)
{
    uint64_t s = (uintptr_t)a, sum = 0, in_alloc = 0;
    void *slots[64] = {0};
    for (int i = 0; i < 400000; i++) {
        int k = (int)(lcg(&s) % 64);
        free(slots[k]);
        size_t n = 32 + lcg(&s) % 8192;
        slots[k] = i % 3 ? churn_alloc(n) : realloc(churn_alloc(n / 2 + 1), n);
        ((char *)slots[k])[0] = (char)i;
        sum += n;
        in_alloc += i % 3 ? n : n / 2 + 1;
    }
    for (int k = 0; k < 64; k++)
        free(slots[k]);
    churn_alloc_bytes += in_alloc;
    return (void *)(uintptr_t)sum;
}

/* Allocation/free loops on 2 threads; nothing stays live. Prints the bytes allocated and,
 * of those, the bytes asked of churn_alloc (the rest grew by realloc). */
static int mode_churn(void)
{
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, churn_thread, (void *)(uintptr_t)(i + 1));
    uint64_t total = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (uintptr_t)r;
    }
    printf("%llu %llu\n", (unsigned long long)total, (unsigned long long)churn_alloc_bytes);
    return 0;
}

/* --- output-equivalence workloads ---------------------------------------------------- */

typedef struct mt_arg {
    int id;
    uint64_t out;
} mt_arg;

static void *mt_thread(void *p)
{
    mt_arg *a = p;
    uint64_t s = (uint64_t)a->id, h = 1469598103934665603ULL;
    for (int i = 0; i < 200000; i++) {
        size_t n = 1 + lcg(&s) % 300;
        unsigned char *b = malloc(n);
        for (size_t j = 0; j < n; j++)
            b[j] = (unsigned char)(lcg(&s));
        for (size_t j = 0; j < n; j++)
            h = (h ^ b[j]) * 1099511628211ULL;
        if (i % 7 == 0) {
            void *al;
            if (posix_memalign(&al, 64, n) == 0) {
                memcpy(al, b, n);
                h ^= ((unsigned char *)al)[n - 1];
                free(al);
            }
        }
        b = realloc(b, n * 2);
        h ^= b[0];
        free(b);
    }
    a->out = h;
    return NULL;
}

static int mode_mt(void)
{
    pthread_t t[4];
    mt_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].id = i + 1;
        pthread_create(&t[i], NULL, mt_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        printf("thread %d: %016llx\n", i, (unsigned long long)a[i].out);
    }
    return 0;
}

static int mode_realloc(void)
{
    uint64_t s = 7, h = 0;
    char *buf = NULL;
    size_t len = 0;
    for (int i = 0; i < 300000; i++) {
        size_t n = (size_t)(lcg(&s) % 20000) + 1;
        buf = reallocarray(buf, n, 1);
        if (n > len) memset(buf + len, (int)(i & 0xff), n - len);
        len = n;
        h = h * 31 + (unsigned char)buf[n / 2];
        void *a = aligned_alloc(256, 512);
        void *m = memalign(128, 100);
        void *v = valloc(100);
        h += (((uintptr_t)a & 255) == 0) + (((uintptr_t)m & 127) == 0) +
             (((uintptr_t)v & 4095) == 0) + (malloc_usable_size(m) >= 100);
        free(a);
        free(m);
        free(v);
        void *c = calloc(10, 10);
        h += ((char *)c)[99] == 0;
        free(c);
    }
    free(buf);
    printf("%llu\n", (unsigned long long)h);
    return 0;
}

static int mode_forkexec(const char *self)
{
    burn_solo(0.3);
    for (int i = 0; i < 3; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            if (i == 0) {
                /* a forked child that keeps running the same program */
                burn_solo(1.0); /* long enough for a few windows: _exit skips the last */
                printf("child %d ran\n", i);
                fflush(stdout);
                _exit(0);
            }
            char arg[16];
            snprintf(arg, sizeof(arg), "%d", i);
            execl(self, self, "echo", arg, (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(p, &st, 0);
        printf("child %d status %d\n", i, WEXITSTATUS(st));
    }
    return 0;
}

/* Replaces itself n times, burning a little CPU in each image (a sample signal pending
 * at exec must not reach the next image). */
static int mode_execchain(const char *self, int n)
{
    if (n <= 0) {
        printf("chain done\n");
        return 0;
    }
    burn_solo(0.01);
    char arg[16];
    snprintf(arg, sizeof(arg), "%d", n - 1);
    if (n % 2)
        execl(self, self, "execchain", arg, (char *)NULL);
    else {
        char *argv[] = {(char *)self, "execchain", arg, NULL};
        execvp(self, argv);
    }
    return 127;
}

int cpw_cxx(void); /* work_cxx.cc */

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *m = argv[1];
    double x = argc > 2 ? atof(argv[2]) : 1;
    if (!strcmp(m, "ratio")) return mode_ratio(x);
    if (!strcmp(m, "phases")) return mode_phases(x);
    if (!strcmp(m, "solo")) return mode_solo(x);
    if (!strcmp(m, "startup")) return mode_startup(x);
    if (!strcmp(m, "mixed")) return mode_mixed(x);
    if (!strcmp(m, "churn")) return mode_churn();
    if (!strcmp(m, "mt")) return mode_mt();
    if (!strcmp(m, "realloc")) return mode_realloc();
    if (!strcmp(m, "forkexec")) return mode_forkexec(argv[0]);
    if (!strcmp(m, "cxx")) return cpw_cxx();
    if (!strcmp(m, "execchain")) return mode_execchain(argv[0], (int)x);
    if (!strcmp(m, "renamed")) { /* a short process renaming its main thread as it ends */
        burn_solo(x);
        prctl(PR_SET_NAME, "renamed-main", 0, 0, 0);
        return 0;
    }
    if (!strcmp(m, "echo")) {
        burn_solo(0.3); /* enough CPU to leave a profile behind */
        printf("echo %s\n", argc > 2 ? argv[2] : "");
        return 0;
    }
    return 2;
}
