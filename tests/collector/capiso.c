/* The capture tests' API-isolate workload: linked with libcontprof and started through
 * contprof_start (CONTPROF_* from the environment), one thread "runner" alternates between
 * isolates js-a and js-b (30 ms of CPU each, contprof_isolate_enter/leave) for SECS of CPU
 * in each; prints each isolate's real CPU. Usage: cpcap_iso SECS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "contprof.h"

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static volatile uint64_t sink;

#define BURN(name)                                                                                 \
    __attribute__((noinline)) double name(double secs)                                             \
    {                                                                                              \
        double t0 = thread_cpu(), t;                                                               \
        uint64_t x = 1;                                                                            \
        while ((t = thread_cpu()) - t0 < secs)                                                     \
            for (int i = 0; i < 20000; i++)                                                        \
                x = x * 6364136223846793005ULL + 1;                                                \
        sink += x;                                                                                 \
        return t - t0;                                                                             \
    }
BURN(burn_js_a)
BURN(burn_js_b)

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2;
    if (contprof_start(NULL) != 0) return 1;
    contprof_isolate *a = contprof_isolate_create("js-a", "app=shop");
    contprof_isolate *b = contprof_isolate_create("js-b", "app=blog");
    if (!a || !b) return 1;
    double ca = 0, cb = 0;
    while (ca < secs || cb < secs) {
        contprof_isolate_enter(a);
        ca += burn_js_a(0.03);
        contprof_isolate_leave();
        contprof_isolate_enter(b);
        cb += burn_js_b(0.03);
        contprof_isolate_leave();
    }
    contprof_stop();
    printf("a_cpu_ns=%lld b_cpu_ns=%lld\n", (long long)(ca * 1e9), (long long)(cb * 1e9));
    return 0;
}
