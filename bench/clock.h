/* Clocks for the benchmarks, in seconds: wall (CLOCK_MONOTONIC) or the calling thread's
 * CPU time (CLOCK_THREAD_CPUTIME_ID). Found through cpsynth's include directory. */
#ifndef CP_BENCH_CLOCK_H
#define CP_BENCH_CLOCK_H

#include <time.h>

static inline double cp_bench_seconds(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double now_s(void)
{
    return cp_bench_seconds(CLOCK_MONOTONIC);
}

static inline double thread_cpu_s(void)
{
    return cp_bench_seconds(CLOCK_THREAD_CPUTIME_ID);
}

#endif
