/* Black-box tests of threads the CPU engines used to miss (threads.c, `cpt`, under
 * LD_PRELOAD in output-dir mode): a server that blocks every signal before it starts its
 * workers, workers that block them once running, and many short threads at once. Their CPU
 * time is in the profiles, or where it could not be sampled it is counted in
 * dropped_samples and the engine string says so. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pprof.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

static char g_dir[256], g_env_dir[300];
static char g_out[1 << 16];

/* Runs cpt under the agent with extra environment (NULL-terminated, ≤ 4); returns the CPU
 * seconds its threads used (its last stdout line). */
static double run_cpt(const char *mode, const char *n, const char *secs, const char *const *extra)
{
    pset_dir_make("threads", g_dir, g_env_dir);
    static char preload[600];
    const char *lib = getenv("CP_TEST_LIB");
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", lib ? lib : CP_LIB);
    const char *env[8] = {preload, g_env_dir};
    int k = 2;
    for (int i = 0; extra && extra[i] && k < 7; i++)
        env[k++] = extra[i];
    env[k] = NULL;
    /* through sh for stderr too: the agent's lines */
    const char *args[] = {"-c", "exec \"$0\" \"$@\" 2>&1", CPT, mode, n, secs, NULL};
    int st = run_capture("/bin/sh", args, NULL, env, g_out, sizeof(g_out));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "status %d: %s\n", st, g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* stderr and stdout are mixed: the number is the last line */
    char *last = g_out, *p = g_out;
    while ((p = strchr(p, '\n')) != NULL && p[1])
        last = ++p;
    return strtod(last, NULL);
}

/* The value after key (such as "dropped_samples=") in p's comments, or -1. */
static long long comment_num(const cp_profile *p, const char *key)
{
    for (uint32_t i = 0; i < p->comments.n; i++) {
        const char *c = strstr(cp_profile_str(p, p->comments.v[i]), key);
        if (c) return atoll(c + strlen(key));
    }
    return -1;
}

/* Does some comment of p contain s? */
static int comment_has(const cp_profile *p, const char *s)
{
    for (uint32_t i = 0; i < p->comments.n; i++)
        if (strstr(cp_profile_str(p, p->comments.v[i]), s)) return 1;
    return 0;
}

typedef struct seen {
    double in_fn;      /* CPU seconds in stacks through fn */
    double all;        /* CPU seconds of the program's own isolates */
    double dropped;    /* dropped_samples in seconds (period: period_ns) */
    int engine_named;  /* some profile's engine string has the text asked for */
    int64_t period_ns; /* the profiles' period */
} seen;

static seen look(const char *fn, const char *engine_text)
{
    seen r = {0};
    pset s;
    pset_load(g_dir, &s);
    long long dropped = 0;
    int64_t last_window = -1;
    for (int i = 0; i < s.n; i++) {
        const cp_profile *p = s.f[i].p;
        /* each window's count is in each of its profiles (one process here) */
        if (p->time_nanos != last_window) {
            long long d = comment_num(p, "dropped_samples=");
            if (d > 0) dropped += d;
            last_window = p->time_nanos;
        }
        if (strcmp(s.f[i].kind, "cpu")) continue;
        if (p->period > 0) r.period_ns = p->period;
        if (engine_text && comment_has(p, engine_text)) r.engine_named = 1;
        if (!strcmp(s.f[i].iso, "contprof-agent")) continue;
        r.in_fn += (double)func_total(p, fn, 1) / 1e9;
        r.all += (double)func_total(p, NULL, 1) / 1e9;
    }
    if (!r.period_ns) r.period_ns = 10000000; /* the default rate's */
    r.dropped = (double)dropped * (double)r.period_ns / 1e9;
    pset_free(&s);
    return r;
}

/* A server blocks every signal in main, then starts two workers that burn secs of CPU
 * each (they inherit the mask): their CPU time is sampled, with their stacks, by the
 * engine that needs no signal, at the default rate and at 1 kHz. */
static void check_blocked(const char *mode, const char *fn, const char *hz, const char *secs)
{
    char hzenv[64];
    snprintf(hzenv, sizeof(hzenv), "CONTPROF_CPU_HZ=%s", hz);
    const char *extra[] = {hzenv, NULL};
    double burnt = run_cpt(mode, "2", secs, extra);
    seen r = look(fn, "signal_blocked=2 perf");
    printf("%s %s Hz: burnt %.3f s, profiled %.3f s in %s (%.0f%%), %.3f s in all, dropped "
           "%.3f s\n",
           mode, hz, burnt, r.in_fn, fn, 100 * r.in_fn / burnt, r.all, r.dropped);
    CHECK(burnt > 2 * atof(secs) - 0.5);
    /* the CPU before the agent found the thread is on contprof:signal-blocked: ≤ 20 ms for
     * one that started blocked (the agent looks at once), up to two checks (1 s) for one
     * that blocked later */
    CHECK(r.in_fn >= 0.7 * burnt);
    CHECK(r.all + r.dropped >= 0.9 * burnt);
    CHECK(r.all <= 1.1 * burnt);
    CHECK(r.engine_named);
    pset_dir_remove(g_dir);
}

TEST(blocked_server_sampled)
{
    check_blocked("blocked", "burn_blocked", "100", "1.5");
    check_blocked("blocked", "burn_blocked", "1000", "1.5");
}

/* Workers that block every signal after they started are found (their CPU clock runs, no
 * sample comes) and sampled from then on. */
TEST(late_blocking_sampled)
{
    check_blocked("late", "burn_late", "100", "3");
}

/* Where perf events are refused (CONTPROF_TEST_NO_PERF stands for a container that forbids
 * perf_event_open), the blocking threads are named once on stderr and in the engine string,
 * and their CPU time is in the profile on the frame contprof:signal-blocked (no stack):
 * never silently absent. */
TEST(blocked_without_perf_counted)
{
    const char *extra[] = {"CONTPROF_TEST_NO_PERF=1", NULL};
    double burnt = run_cpt("blocked", "2", "1.5", extra);
    seen r = look("contprof:signal-blocked", "signal_blocked=2 unsampled=2");
    printf("no perf: burnt %.3f s, on contprof:signal-blocked %.3f s, in all %.3f s, dropped "
           "%.3f s\n",
           burnt, r.in_fn, r.all, r.dropped);
    CHECK_CONTAINS(g_out, "blocks the sampling signal");
    CHECK(r.engine_named);
    CHECK(r.in_fn + r.dropped >= 0.9 * burnt);
    CHECK(r.all <= 1.1 * burnt);
    pset_dir_remove(g_dir);
}

/* 200 threads of 20 ms at once (the tick expires timers only every 4 ms, so a thread's
 * last period used to be lost at its exit): at least 95% of their CPU time is in the
 * profiles or counted in dropped_samples, and no more than they used. */
static void check_short(const char *n, const char *secs, const char *engine)
{
    const char *extra[] = {engine, NULL};
    double burnt = run_cpt("short", n, secs, engine ? extra : NULL);
    seen r = look("burn_short", NULL);
    printf("%s x %s s (%s): burnt %.3f s, profiled %.3f s (%.1f%%), in burn_short %.3f s, "
           "dropped %.3f s\n",
           n, secs, engine ? engine : "default", burnt, r.all, 100 * r.all / burnt, r.in_fn,
           r.dropped);
    CHECK(burnt > 0);
    CHECK(r.all + r.dropped >= 0.95 * burnt);
    CHECK(r.all <= 1.08 * burnt);
    pset_dir_remove(g_dir);
}

TEST(short_threads_add_up)
{
    check_short("200", "0.02", NULL);
}

TEST(short_threads_add_up_perf)
{
    check_short("200", "0.02", "CONTPROF_CPU_HZ=1000");
}

TEST_MAIN(T(blocked_server_sampled), T(late_blocking_sampled), T(blocked_without_perf_counted),
          T(short_threads_add_up), T(short_threads_add_up_perf))
