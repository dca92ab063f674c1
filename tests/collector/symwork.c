/* A workload for test_symbolize: burns CPU in a local (static) function, an exported one,
 * or libc's qsort, then says whether libdw is mapped into the process. Built as cpsym (with
 * .symtab) and cpsym_stripped (strip --strip-all: .dynsym only; exported with -rdynamic and
 * default visibility, the build hides symbols by default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile unsigned long sink;

__attribute__((noinline)) static void symwork_local_burn(double secs)
{
    double end = now_s() + secs;
    unsigned long x = 1;
    while (now_s() < end)
        for (int i = 0; i < 100000; i++)
            x = x * 6364136223846793005ul + 1442695040888963407ul;
    sink = x;
}

__attribute__((noinline, visibility("default"))) void symwork_exported_burn(double secs)
{
    double end = now_s() + secs;
    unsigned long x = 3;
    while (now_s() < end)
        for (int i = 0; i < 100000; i++)
            x = x * 2862933555777941757ul + 3037000493ul;
    sink = x;
}

/* Mangled names (asm labels): a C++ one, a Rust v0 one and a legacy Rust one, each a third
 * of the "mangled" mode's CPU. */
void mangled_cxx(double secs) __asm__("_ZN3foo3barEv");
void mangled_rust_v0(double secs) __asm__("_RNvCs1234_7mycrate4main");
void mangled_rust_legacy(double secs) __asm__("_ZN7mycrate6legacy17h0123456789abcdefE");
#define BURN_AS(fn, k)                                                                             \
    __attribute__((noinline)) void fn(double secs)                                                 \
    {                                                                                              \
        double end = now_s() + secs;                                                               \
        unsigned long x = k;                                                                       \
        while (now_s() < end)                                                                      \
            for (int i = 0; i < 100000; i++)                                                       \
                x = x * 6364136223846793005ul + k;                                                 \
        sink = x;                                                                                  \
    }
BURN_AS(mangled_cxx, 5)
BURN_AS(mangled_rust_v0, 7)
BURN_AS(mangled_rust_legacy, 11)

static void mangled_burn(double secs)
{
    for (double t = 0; t < secs; t += 0.3) {
        mangled_cxx(0.1);
        mangled_rust_v0(0.1);
        mangled_rust_legacy(0.1);
    }
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* qsort spends its time in libc's own functions (msort_with_tmp: in no .dynsym) */
static void qsort_burn(double secs)
{
    enum { N = 4096 };
    static int v[N];
    double end = now_s() + secs;
    unsigned s = 1;
    while (now_s() < end) {
        for (int i = 0; i < N; i++)
            v[i] = (int)(s = s * 1103515245u + 12345u);
        qsort(v, N, sizeof(int), cmp_int);
    }
    sink = (unsigned long)v[0];
}

static int libdw_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "libdw")) found = 1;
    fclose(f);
    return found;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s local|exported|qsort|mangled SECONDS\n", argv[0]);
        return 2;
    }
    double secs = atof(argv[2]);
    if (!strcmp(argv[1], "local"))
        symwork_local_burn(secs);
    else if (!strcmp(argv[1], "exported"))
        symwork_exported_burn(secs);
    else if (!strcmp(argv[1], "mangled"))
        mangled_burn(secs);
    else if (!strcmp(argv[1], "qsort"))
        qsort_burn(secs);
    else
        return 2;
    printf("libdw=%d\n", libdw_mapped());
    return 0;
}
