/* Black-box tests of libcontprof: real programs (work.c) run under LD_PRELOAD in
 * output-dir mode; the pprof files they leave are decoded with cp_pprof_decode and checked.
 * Each TEST is its own ctest process. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pprof.h"
#include "profile.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

/* ------------------------------------------------------------------------------------
 * Running programs */

typedef struct run_res {
    int status;
    double secs;
    char out[1 << 16];
} run_res;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs prog with args; env: NULL-terminated "K=V" strings added to the environment. */
static void run_prog(const char *prog, const char *const *args, const char *const *env, run_res *r)
{
    double t0 = now_s();
    r->status = run_capture(prog, args, NULL, env, r->out, sizeof(r->out));
    r->secs = now_s() - t0;
}

static void run(const char *const *args, const char *const *env, run_res *r)
{
    run_prog(CPW, args, env, r);
}

static char g_dir[256];

static const char *make_dir(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/contprof-test-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(g_dir, 0755) == 0);
    return g_dir;
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* ------------------------------------------------------------------------------------
 * Reading the profiles (loaded and summed by pfiles.h) */

static const char *loc_file(const cp_profile *p, uint32_t loc_id)
{
    const cp_location *l = &p->locations.v[loc_id - 1];
    if (!l->mapping_id) return "";
    return cp_profile_str(p, p->mappings.v[l->mapping_id - 1].filename);
}

/* Sum of column t over samples where a frame of an object whose path contains obj lies
 * below (callers' side of) function fn. */
static int64_t below_in(const cp_profile *p, const char *fn, const char *obj, int t)
{
    int64_t sum = 0;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        int seen = 0, hit = 0;
        for (uint32_t j = 0; j < s->nlocs && !hit; j++) {
            uint32_t id = p->stack.v[s->loc_off + j];
            if (!strcmp(loc_func(p, id), fn))
                seen = 1;
            else if (seen && strstr(loc_file(p, id), obj))
                hit = 1;
        }
        if (hit) sum += cp_profile_sample_values(p, i)[t];
    }
    return sum;
}

/* The last profile of kind for isolate (highest sequence of the first pid). */
static const cp_profile *last_of(const pset *s, const char *kind, const char *iso)
{
    const cp_profile *p = NULL;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->f[i].kind, kind) && !strcmp(s->f[i].iso, iso) && s->f[i].pid == s->f[0].pid)
            p = s->f[i].p;
    return p;
}

/* The value after "name=" in the profile's comments, or -1. */
static long long comment_num(const cp_profile *p, const char *name)
{
    char key[64];
    snprintf(key, sizeof(key), "%s=", name);
    for (uint32_t i = 0; i < p->comments.n; i++) {
        const char *c = strstr(cp_profile_str(p, p->comments.v[i]), key);
        if (c) return atoll(c + strlen(key));
    }
    return -1;
}

static const char *comment_str(const cp_profile *p, const char *prefix)
{
    for (uint32_t i = 0; i < p->comments.n; i++) {
        const char *c = cp_profile_str(p, p->comments.v[i]);
        if (!strncmp(c, prefix, strlen(prefix))) return c + strlen(prefix);
    }
    return "";
}

static int count_iso(const pset *s, const char *kind, const char *iso)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += !strcmp(s->f[i].kind, kind) && !strcmp(s->f[i].iso, iso);
    return n;
}

#define PRELOAD "LD_PRELOAD=" CP_LIB

static char env_dir[300];
static const char *outdir_env(void)
{
    snprintf(env_dir, sizeof(env_dir), "CONTPROF_OUTPUT_DIR=%s", g_dir);
    return env_dir;
}

/* ------------------------------------------------------------------------------------
 * 1. Two named threads, 3:1 CPU, each its own isolate */

TEST(cpu_ratio)
{
    make_dir();
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_CPU_HZ=250", "CONTPROF_WINDOW=1s", NULL};
    const char *args[] = {"ratio", "0.4", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    CHECK_STREQ(r.out, "done\n");
    pset s;
    pset_load(g_dir, &s);
    CHECK(count_iso(&s, "cpu", "alpha") > 0);
    CHECK(count_iso(&s, "cpu", "beta") > 0);
    int64_t a = sum_kind(&s, "cpu", "alpha", "burn_alpha", 1);
    int64_t b = sum_kind(&s, "cpu", "beta", "burn_beta", 1);
    /* each thread's isolate holds only its own function */
    CHECK_EQ(sum_kind(&s, "cpu", "alpha", "burn_beta", 1), 0);
    CHECK_EQ(sum_kind(&s, "cpu", "beta", "burn_alpha", 1), 0);
    /* the stack goes below the thread function into libc (start_thread, clone3: no frame
     * pointers there); those frames stay unsymbolized addresses in libc's mapping unless
     * CONTPROF_DEBUGINFO=1, for a server to resolve by build id */
    int64_t below = 0;
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.f[i].kind, "cpu") && !strcmp(s.f[i].iso, "alpha"))
            below += below_in(s.f[i].p, "alpha", "libc.so", 1);
    CHECK(below > a / 2);
    /* mappings carry build ids and addresses for that */
    const cp_profile *ap = last_of(&s, "cpu", "alpha");
    int libc_ok = 0;
    for (uint32_t i = 0; i < ap->mappings.n; i++) {
        const cp_mapping *m = &ap->mappings.v[i];
        if (strstr(cp_profile_str(ap, m->filename), "libc.so") &&
            strlen(cp_profile_str(ap, m->build_id)) == 40 && m->limit > m->start)
            libc_ok = 1;
    }
    CHECK(libc_ok);
    double ratio = (double)a / (double)b;
    printf("alpha %.3fs beta %.3fs ratio %.3f\n", a / 1e9, b / 1e9, ratio);
    CHECK(b > 0);
    CHECK(fabs(ratio - 3.0) <= 0.15);
    CHECK(fabs(a / 1e9 - 1.2) < 0.2);
    pset_free(&s);
    remove_dir();
}

/* A short process's samples are drained at its exit (the agent's first tick comes 500 ms
 * after its start at 100 Hz), where the exiting thread says its own name
 * (cp_thread_say_name) instead of the agent reading /proc: a main thread that renames
 * itself just before it returns has its samples under the new name. A tick that came
 * before the rename (a machine slowed 5x) drains the samples before it under the old one,
 * so only the new name's are required. */
TEST(renamed_at_exit)
{
    make_dir();
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_CPU_HZ=100", NULL};
    const char *args[] = {"renamed", "0.1", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    pset s;
    pset_load(g_dir, &s);
    int64_t n = sum_kind(&s, "cpu", "renamed-main", "burn_solo", 0);
    printf("%lld samples in burn_solo under renamed-main, %lld under cpw\n", (long long)n,
           (long long)sum_kind(&s, "cpu", "cpw", "burn_solo", 0));
    CHECK(n >= 3);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 2. 64 MiB allocated at start and kept: inuse of the last window shows it */

TEST(inuse_startup)
{
    make_dir();
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_WINDOW=2s", "CPW_CTOR_ALLOC=1", NULL};
    const char *args[] = {"startup", "30", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    CHECK_STREQ(r.out, "7\n");
    pset s;
    pset_load(g_dir, &s);
    const cp_profile *last = last_of(&s, "inuse", "cpw");
    CHECK(last != NULL);
    int64_t bytes = func_total(last, "startup_alloc", 1);
    printf("inuse in startup_alloc: %.2f MiB (of %.2f MiB)\n", bytes / 1048576.0,
           func_total(last, NULL, 1) / 1048576.0);
    CHECK(fabs((double)bytes - 64.0 * 1048576) <= 0.10 * 64 * 1048576);
    /* allocated in a constructor of the program, before main: captured too */
    int64_t ctor = func_total(last, "ctor_alloc", 1);
    printf("inuse in ctor_alloc: %.2f MiB (of 8)\n", ctor / 1048576.0);
    CHECK(fabs((double)ctor - 8.0 * 1048576) <= 0.25 * 8 * 1048576);
    /* about 15 windows in 30 s, each with an inuse profile */
    CHECK(count_iso(&s, "inuse", "cpw") >= 12);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 3. A known volume of mixed sizes is estimated within 10% */

TEST(alloc_volume)
{
    make_dir();
    const char *env[] = {PRELOAD, outdir_env(), NULL};
    const char *args[] = {"mixed", "1024", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    double truth = atof(r.out);
    CHECK(truth >= 1024.0 * 1048576);
    pset s;
    pset_load(g_dir, &s);
    double est = (double)sum_kind(&s, "alloc", "cpw", "mixed_alloc", 1);
    printf("true %.1f MiB, estimated %.1f MiB (%.2f%%)\n", truth / 1048576, est / 1048576,
           100 * (est - truth) / truth);
    CHECK(fabs(est - truth) <= 0.10 * truth);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 4. Allocate/free loops leave inuse near zero */

TEST(churn_inuse_zero)
{
    make_dir();
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_WINDOW=500ms", NULL};
    const char *args[] = {"churn", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    double total = 0, truth = 0;
    CHECK(sscanf(r.out, "%lf %lf", &total, &truth) == 2);
    pset s;
    pset_load(g_dir, &s);
    /* The frees were matched against real samples: the estimate of what churn_alloc was asked
     * (5/6 of all: a third of its blocks are grown by realloc) holds. Sampling every 512 KiB
     * on average, blocks of at most 8 KiB: Poisson, sd = sqrt(truth * 512 KiB), about 1.4%. */
    double alloc = (double)sum_kind(&s, "alloc", NULL, "churn_alloc", 1);
    double sd = sqrt(truth * 524288.0);
    printf("allocated %.1f MiB, %.1f MiB in churn_alloc, estimated %.1f MiB (5 sd %.1f MiB)\n",
           total / 1048576, truth / 1048576, alloc / 1048576, 5 * sd / 1048576);
    CHECK(fabs(alloc - truth) <= 5 * sd);
    /* inuse at the end, over every isolate: what the churn threads left is nothing. The end
     * is the last window (the one written at exit, after the threads freed everything), not
     * the last few files: a window taken during the churn (one comes when load stretches the
     * run past 500 ms) holds what was live then, and its files can be among the last few. */
    int64_t end = 0, left = 0;
    int inuse_at_end = 0;
    for (int i = 0; i < s.n; i++)
        if (s.f[i].p->time_nanos > end) end = s.f[i].p->time_nanos;
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.f[i].kind, "inuse") && s.f[i].p->time_nanos == end) {
            left += func_total(s.f[i].p, "churn_alloc", 1);
            inuse_at_end++;
        }
    printf("inuse left in churn_alloc: %lld bytes in %d inuse profiles of the last window\n",
           (long long)left, inuse_at_end);
    CHECK(inuse_at_end > 0);
    CHECK(left == 0);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 5. Same output with and without the agent */

/* Frames, over every profile of kind, in objects whose path contains obj. */
static int64_t frames_in(const pset *s, const char *kind, const char *obj)
{
    int64_t n = 0;
    for (int i = 0; i < s->n; i++) {
        const cp_profile *p = s->f[i].p;
        if (strcmp(s->f[i].kind, kind)) continue;
        for (uint32_t k = 0; k < p->samples.n; k++) {
            const cp_sample *sm = &p->samples.v[k];
            int64_t hits = 0;
            for (uint32_t j = 0; j < sm->nlocs; j++)
                hits += strstr(loc_file(p, p->stack.v[sm->loc_off + j]), obj) != NULL;
            if (!hits) continue;
            n += hits;
            fprintf(stderr, "%s sample with frames in %s:", kind, obj); /* where, leaf first */
            for (uint32_t j = 0; j < sm->nlocs; j++) {
                uint32_t id = p->stack.v[sm->loc_off + j];
                fprintf(stderr, " %s(%s)", loc_func(p, id), loc_file(p, id));
            }
            fprintf(stderr, "\n");
        }
    }
    return n;
}

static void same_output(const char *mode, int expect_child_profiles)
{
    make_dir();
    const char *args[] = {mode, NULL};
    const char *plain_env[] = {NULL};
    const char *env[] = {PRELOAD,
                         outdir_env(),
                         "CONTPROF_CPU_HZ=1000",
                         "CONTPROF_ALLOC_RATE=4096",
                         "CONTPROF_WINDOW=200ms",
                         NULL};
    run_res *a = malloc(sizeof(run_res)), *b = malloc(sizeof(run_res));
    run(args, plain_env, a);
    run(args, env, b);
    CHECK(WIFEXITED(a->status) && WEXITSTATUS(a->status) == 0);
    CHECK(WIFEXITED(b->status) && WEXITSTATUS(b->status) == 0);
    if (strcmp(a->out, b->out) != 0) fprintf(stderr, "without:\n%s\nwith:\n%s\n", a->out, b->out);
    CHECK_STREQ(a->out, b->out);
    pset s;
    pset_load(g_dir, &s);
    CHECK(s.n > 0); /* the agent really ran (at a high sampling rate) */
    int pids = 1;
    for (int i = 1; i < s.n; i++)
        pids += s.f[i].pid != s.f[i - 1].pid;
    printf("%s: %d profiles from %d processes\n", mode, s.n, pids);
    CHECK(pids >= expect_child_profiles);
    /* allocation stacks start at the hook's caller: no frame of the agent's own */
    CHECK_EQ(frames_in(&s, "alloc", "libcontprof"), 0);
    pset_free(&s);
    free(a);
    free(b);
    remove_dir();
}

TEST(same_output_threads)
{
    same_output("mt", 1);
}

TEST(same_output_realloc_memalign)
{
    same_output("realloc", 1);
}

TEST(same_output_cxx)
{
    same_output("cxx", 1);
}

/* C++ allocations: operator new demangled (system_name keeps the symbol), inlined
 * functions as inline frames of their location */
TEST(cxx_names_demangled)
{
    make_dir();
    /* inline frames come from libdw's DWARF reading: CONTPROF_SYMBOLIZE=lines */
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_ALLOC_RATE=65536",
                         "CONTPROF_SYMBOLIZE=lines", NULL};
    const char *args[] = {"cxx", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    pset s;
    pset_load(g_dir, &s);
    int found = 0;
    for (int i = 0; i < s.n; i++) {
        const cp_profile *p = s.f[i].p;
        if (strcmp(s.f[i].kind, "alloc")) continue;
        for (uint32_t j = 0; j < p->functions.n; j++)
            if (!strcmp(cp_profile_str(p, p->functions.v[j].name), "operator new(unsigned long)") &&
                !strcmp(cp_profile_str(p, p->functions.v[j].system_name), "_Znwm"))
                found = 1;
    }
    CHECK(found);
    CHECK(sum_kind(&s, "alloc", "cpw", "operator new(unsigned long)", 1) > 0);
    /* std::make_unique is inlined into cpw_cxx: it appears as an inline frame */
    CHECK(sum_kind(&s, "alloc", "cpw",
                   "std::__detail::_MakeUniq<Wide>::__single_object std::make_unique<Wide>()",
                   1) > 0);
    pset_free(&s);
    remove_dir();
}

/* fork+exec: the parent, the forked child (a new instance) and the two exec'd children
 * each leave profiles of their own */
TEST(same_output_fork_exec)
{
    same_output("forkexec", 4);
}

/* Allocations of the agent's thread fail on a schedule (every 3rd, every 17th): the host
 * runs as without the agent, and the agent degrades (says so) instead of crashing. */
TEST(agent_out_of_memory)
{
    make_dir();
    const char *args[] = {"mt", NULL};
    const char *plain_env[] = {NULL};
    run_res *a = malloc(sizeof(run_res)), *b = malloc(sizeof(run_res));
    run(args, plain_env, a);
    const char *every[] = {"CP_FAIL_EVERY=3", "CP_FAIL_EVERY=17"};
    char report[300];
    snprintf(report, sizeof(report), "CP_FAIL_REPORT=%s/failures", g_dir);
    for (int i = 0; i < 2; i++) {
        const char *env[] = {"LD_PRELOAD=" CP_LIB ":" CP_FAILMALLOC,
                             outdir_env(),
                             every[i],
                             report,
                             "CONTPROF_CPU_HZ=1000",
                             "CONTPROF_ALLOC_RATE=8192",
                             "CONTPROF_WINDOW=200ms",
                             NULL};
        run(args, env, b);
        if (WIFSIGNALED(b->status)) fprintf(stderr, "killed by signal %d\n", WTERMSIG(b->status));
        CHECK(WIFEXITED(b->status) && WEXITSTATUS(b->status) == 0);
        CHECK_STREQ(a->out, b->out);
        char path[320];
        snprintf(path, sizeof(path), "%s/failures", g_dir);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL);
        unsigned long calls = 0, failed = 0;
        CHECK(fscanf(f, "%lu %lu", &calls, &failed) == 2);
        fclose(f);
        unlink(path);
        printf("%s: %lu of %lu agent allocations failed\n", every[i], failed, calls);
        CHECK(failed > 0);
    }
    pset s;
    pset_load(g_dir, &s);
    int degraded = 0;
    for (int i = 0; i < s.n; i++)
        for (uint32_t j = 0; j < s.f[i].p->comments.n; j++)
            if (strstr(cp_profile_str(s.f[i].p, s.f[i].p->comments.v[j]), "agent_out_of_memory=1"))
                degraded = 1;
    CHECK(s.n > 0 && degraded);
    pset_free(&s);
    free(a);
    free(b);
    remove_dir();
}

/* A chain of 60 execs at 1000 Hz on both engines: a sample signal pending at exec would
 * kill the next image (default action of SIGPROF). */
TEST(exec_chain_survives)
{
    make_dir();
    const char *args[] = {"execchain", "60", NULL};
    const char *engines[] = {"CONTPROF_CPU_ENGINE=perf", "CONTPROF_CPU_ENGINE=timer"};
    for (int i = 0; i < 2; i++) {
        const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_CPU_HZ=1000", engines[i], NULL};
        run_res r;
        run(args, env, &r);
        if (WIFSIGNALED(r.status)) fprintf(stderr, "killed by signal %d\n", WTERMSIG(r.status));
        CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
        CHECK_STREQ(r.out, "chain done\n");
    }
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 6. No reachable broker: the host is unaffected and the drops are counted */

TEST(unreachable_broker)
{
    make_dir();
    const char *args[] = {"startup", "3", NULL};
    const char *plain_env[] = {NULL};
    const char *env[] = {PRELOAD,
                         outdir_env(),
                         "CONTPROF_BROKERS=127.0.0.1:1",
                         "CONTPROF_WINDOW=200ms",
                         "CONTPROF_KAFKA_QUEUE=4",
                         "CONTPROF_FLUSH=500ms",
                         NULL};
    run_res *a = malloc(sizeof(run_res)), *b = malloc(sizeof(run_res));
    run(args, plain_env, a);
    run(args, env, b);
    CHECK(WIFEXITED(b->status) && WEXITSTATUS(b->status) == 0);
    CHECK_STREQ(a->out, b->out);
    printf("without %.2fs, with an unreachable broker %.2fs\n", a->secs, b->secs);
    /* bounded flush at exit: at most the flush time and a little more */
    CHECK(b->secs < a->secs + 1.5);
    pset s;
    pset_load(g_dir, &s);
    long long dropped = 0;
    for (int i = 0; i < s.n; i++) {
        long long d = comment_num(s.f[i].p, "dropped_windows");
        CHECK(d >= 0);
        dropped += d;
    }
    printf("%d windows written, dropped_windows reported: %lld\n", s.n, dropped);
    CHECK(dropped > 0);
    pset_free(&s);
    free(a);
    free(b);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 7. 1000 Hz on the perf-event engine: about 1000 samples per CPU second */

TEST(perf_1000hz)
{
    make_dir();
    /* file:line come from libdw: CONTPROF_SYMBOLIZE=lines */
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_CPU_HZ=1000", "CONTPROF_SYMBOLIZE=lines",
                         NULL};
    const char *args[] = {"solo", "1.5", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    double cpu = atof(r.out);
    pset s;
    pset_load(g_dir, &s);
    const cp_profile *p = last_of(&s, "cpu", "cpw");
    CHECK(p != NULL);
    printf("engine: %s\n", comment_str(p, "engine="));
    CHECK_STREQ(comment_str(p, "engine="), "perf-task-clock 1ms");
    int64_t n = sum_kind(&s, "cpu", "cpw", "burn_solo", 0);
    double rate = (double)n / cpu;
    printf("%lld samples in burn_solo over %.3f CPU s: %.1f per CPU second\n", (long long)n, cpu,
           rate);
    CHECK(rate > 950 && rate < 1050);
    /* symbolized with file:line from the program's own debug info */
    int file_ok = 0;
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        if (!l->nlines) continue;
        const cp_line *ln = &p->lines.v[l->line_off];
        const cp_function *f = &p->functions.v[ln->function_id - 1];
        if (!strcmp(cp_profile_str(p, f->name), "burn_solo") &&
            strstr(cp_profile_str(p, f->filename), "work.c") && ln->line > 0)
            file_ok = 1;
    }
    CHECK(file_ok);
    pset_free(&s);
    remove_dir();
}

/* The timer fallback reports its real resolution and weights samples by overruns. */
TEST(timer_fallback_1000hz)
{
    make_dir();
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_CPU_HZ=1000", "CONTPROF_CPU_ENGINE=timer",
                         NULL};
    const char *args[] = {"solo", "1.5", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    double cpu = atof(r.out);
    pset s;
    pset_load(g_dir, &s);
    const cp_profile *p = last_of(&s, "cpu", "cpw");
    CHECK(p != NULL);
    CHECK_STREQ(comment_str(p, "engine="), "posix-cpu-timer 4ms");
    double ns = (double)sum_kind(&s, "cpu", "cpw", "burn_solo", 1);
    printf("timer engine: %.3f s of CPU attributed, %.3f s measured\n", ns / 1e9, cpu);
    CHECK(fabs(ns / 1e9 - cpu) <= 0.1 * cpu);
    pset_free(&s);
    remove_dir();
}

/* The engine by rate: POSIX timers for periods of two ticks and more (the 100 Hz default),
 * perf below; CONTPROF_CPU_ENGINE=perf forces perf. The timers at 100 Hz attribute the
 * CPU time measured. */
TEST(engine_by_rate)
{
    struct {
        const char *hz, *engine_env, *want;
    } cases[] = {
        {NULL, NULL, "posix-cpu-timer 10ms"}, /* the default rate */
        {"CONTPROF_CPU_HZ=125", NULL, "posix-cpu-timer 8ms"},
        {"CONTPROF_CPU_HZ=200", NULL, "perf-task-clock 5ms"},
        {NULL, "CONTPROF_CPU_ENGINE=perf", "perf-task-clock 10ms"},
        {"CONTPROF_CPU_HZ=200", "CONTPROF_CPU_ENGINE=timer", "posix-cpu-timer 5ms"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        make_dir();
        const char *env[5] = {PRELOAD, outdir_env()};
        int k = 2;
        if (cases[c].hz) env[k++] = cases[c].hz;
        if (cases[c].engine_env) env[k++] = cases[c].engine_env;
        env[k] = NULL;
        const char *args[] = {"solo", c == 0 ? "1.5" : "0.3", NULL};
        run_res r;
        run(args, env, &r);
        CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
        pset s;
        pset_load(g_dir, &s);
        const cp_profile *p = last_of(&s, "cpu", "cpw");
        CHECK(p != NULL);
        printf("%s %s: %s\n", cases[c].hz ? cases[c].hz : "(default rate)",
               cases[c].engine_env ? cases[c].engine_env : "", comment_str(p, "engine="));
        CHECK_STREQ(comment_str(p, "engine="), cases[c].want);
        if (c == 0) {
            double cpu = atof(r.out);
            double ns = (double)sum_kind(&s, "cpu", "cpw", "burn_solo", 1);
            int64_t n = sum_kind(&s, "cpu", "cpw", "burn_solo", 0);
            printf("timers at 100 Hz: %lld samples, %.3f s of CPU attributed, %.3f s measured\n",
                   (long long)n, ns / 1e9, cpu);
            CHECK(fabs(ns / 1e9 - cpu) <= 0.1 * cpu);
            /* A POSIX CPU timer fires on a scheduler tick that finds the thread running, at
             * most once per 10 ms period of its CPU time: about 100 signals per CPU second
             * alone, fewer under load, where one signal carries its overruns (the CPU time
             * check above). More than the rate would mean a shorter period. */
            CHECK(n > 0 && (double)n <= cpu * 100 + 2);
        }
        pset_free(&s);
        remove_dir();
    }
}

/* Output files are gzip either way: payloads of up to 4 KiB in stored blocks (deflate
 * BTYPE 00, the payload plus 23 bytes), larger ones compressed. */
TEST(output_files_gzip)
{
    make_dir();
    /* file:line and inline frames (CONTPROF_SYMBOLIZE=lines) make some windows over 4 KiB */
    const char *env[] = {PRELOAD,
                         outdir_env(),
                         "CONTPROF_CPU_HZ=1000",
                         "CONTPROF_WINDOW=200ms",
                         "CONTPROF_SYMBOLIZE=lines",
                         NULL};
    const char *args[] = {"cxx", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    DIR *d = opendir(g_dir);
    CHECK(d);
    int stored = 0, compressed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".pb.gz") || strstr(e->d_name, ".tmp")) continue;
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", g_dir, e->d_name);
        cp_buf b = {0}, raw = {0};
        cp_err err = {0};
        CHECK(cp_read_file(path, &b, NULL) == 0);
        CHECK(cp_is_gzip(b.data, b.len));
        CHECK(cp_gunzip(b.data, b.len, 1 << 26, &raw, &err) == 0);
        if (raw.len <= 4096) {
            CHECK_EQ(b.len, raw.len + 23);
            CHECK_EQ(b.data[10] & 6, 0); /* the first block's BTYPE: stored */
            stored++;
        } else {
            CHECK(b.len < raw.len);
            CHECK(b.data[10] & 6);
            compressed++;
        }
        cp_buf_close(&b);
        cp_buf_close(&raw);
    }
    closedir(d);
    printf("%d files stored, %d compressed\n", stored, compressed);
    CHECK(stored > 0 && compressed > 0);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * Isolates through the API: a linked program runs two isolates on one thread */

static int has_func(const cp_profile *p, const char *fn)
{
    for (uint32_t i = 0; i < p->functions.n; i++)
        if (!strcmp(cp_profile_str(p, p->functions.v[i].name), fn)) return 1;
    return 0;
}

TEST(isolates_api)
{
    make_dir();
    /* 1000 Hz: at 100 Hz the smaller isolate gets about 13 samples, and Poisson noise
     * alone (28%) exceeds the 20% the ratio is allowed */
    const char *env[] = {outdir_env(), "CONTPROF_WINDOW=10s", "CONTPROF_CPU_HZ=1000", NULL};
    const char *args[] = {NULL};
    run_res r;
    run_prog(CPW_ISO, args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    CHECK_STREQ(r.out, "ok\n");
    pset s;
    pset_load(g_dir, &s);
    const cp_profile *a = last_of(&s, "cpu", "js-a"), *b = last_of(&s, "cpu", "js-b");
    CHECK(a && b);
    int64_t na = func_total(a, "interp_loop", 1), nb = func_total(b, "interp_loop", 1);
    printf("js-a %.3fs js-b %.3fs\n", na / 1e9, nb / 1e9);
    CHECK(na > 0 && nb > 0);
    CHECK(fabs((double)na / (double)nb - 3.0) < 0.6);
    /* language frames from the walker, on top of the native stack */
    CHECK(has_func(a, "renderCart") && !has_func(a, "computeTax"));
    CHECK(has_func(b, "computeTax") && !has_func(b, "renderCart"));
    CHECK(func_total(a, "renderCart", 1) > na / 2);
    CHECK(func_total(a, "main.js:<toplevel>", 1) > na / 2);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * Durations: a bare number is seconds; a bare CONTPROF_WINDOW that was milliseconds in
 * earlier versions is refused, loudly, and the program runs as without the agent. */

TEST(bare_window_refused)
{
    make_dir();
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "exec %s echo hi 2>&1", CPW);
    const char *args[] = {"-c", cmd, NULL};
    const char *env[] = {PRELOAD, outdir_env(), "CONTPROF_WINDOW=1000", NULL};
    run_res *r = malloc(sizeof(run_res));
    CHECK(r);
    run_prog("/bin/sh", args, env, r);
    printf("%s", r->out);
    CHECK(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0);
    CHECK_CONTAINS(r->out, "echo hi\n");
    CHECK_CONTAINS(r->out, "contprof: CONTPROF_WINDOW='1000': a bare number is seconds");
    CHECK_CONTAINS(r->out, "(1000ms or 1000s); the agent is not started\n");
    pset s;
    pset_load(g_dir, &s);
    CHECK_EQ(s.n, 0); /* not started: no window */
    pset_free(&s);

    /* the same with the unit: profiled */
    const char *env_ms[] = {PRELOAD, outdir_env(), "CONTPROF_WINDOW=1000ms", NULL};
    run_prog("/bin/sh", args, env_ms, r);
    CHECK(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0);
    CHECK(strstr(r->out, "contprof:") == NULL);
    CHECK_CONTAINS(r->out, "echo hi\n");
    pset_load(g_dir, &s);
    CHECK(s.n > 0);
    pset_free(&s);
    free(r);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * Epochs: successive windows of one stream share their tables (collector/README.md) */

/* Whether b's mappings, locations (with their lines) and functions start with a's entry for
 * entry, and b's strings with a's epoch strings (those before a's first comment, the
 * window's own). Prints the first difference. */
static int tables_prefix(const cp_profile *a, const cp_profile *b)
{
    const char *why = NULL;
    uint32_t cut = a->strs.off.n;
    for (uint32_t i = 0; i < a->comments.n; i++)
        if (a->comments.v[i] < cut) cut = a->comments.v[i];
    if (b->mappings.n < a->mappings.n || b->locations.n < a->locations.n ||
        b->functions.n < a->functions.n || b->strs.off.n < cut)
        why = "fewer entries";
    for (uint32_t i = 0; !why && i < a->mappings.n; i++) {
        const cp_mapping *x = &a->mappings.v[i], *y = &b->mappings.v[i];
        if (x->start != y->start || x->limit != y->limit || x->offset != y->offset ||
            x->filename != y->filename || x->build_id != y->build_id || x->flags != y->flags)
            why = "a mapping differs";
    }
    for (uint32_t i = 0; !why && i < a->locations.n; i++) {
        const cp_location *x = &a->locations.v[i], *y = &b->locations.v[i];
        if (x->address != y->address || x->mapping_id != y->mapping_id || x->nlines != y->nlines)
            why = "a location differs";
        for (uint32_t j = 0; !why && j < x->nlines; j++)
            if (a->lines.v[x->line_off + j].function_id !=
                    b->lines.v[y->line_off + j].function_id ||
                a->lines.v[x->line_off + j].line != b->lines.v[y->line_off + j].line)
                why = "a location's line differs";
    }
    for (uint32_t i = 0; !why && i < a->functions.n; i++) {
        const cp_function *x = &a->functions.v[i], *y = &b->functions.v[i];
        if (x->name != y->name || x->system_name != y->system_name || x->filename != y->filename)
            why = "a function differs";
    }
    for (uint32_t i = 0; !why && i < cut; i++)
        if (strcmp(cp_profile_str(a, i), cp_profile_str(b, i)) != 0) why = "a string differs";
    if (why) fprintf(stderr, "tables_prefix: %s\n", why);
    return why == NULL;
}

/* Locations of p that none of its samples uses (kept from an earlier window of the epoch). */
static uint32_t unused_locations(const cp_profile *p)
{
    uint8_t *used = calloc(p->locations.n + 1, 1);
    CHECK(used != NULL);
    for (uint32_t i = 0; i < p->stack.n; i++)
        used[p->stack.v[i]] = 1;
    uint32_t n = 0;
    for (uint32_t i = 1; i <= p->locations.n; i++)
        n += !used[i];
    free(used);
    return n;
}

/* Whether a sample of p has fn in its stack. */
static int samples_use_func(const cp_profile *p, const char *fn)
{
    for (uint32_t i = 0; i < p->stack.n; i++) {
        const cp_location *l = &p->locations.v[p->stack.v[i] - 1];
        for (uint32_t j = 0; j < l->nlines; j++) {
            uint64_t f = p->lines.v[l->line_off + j].function_id;
            if (f && !strcmp(cp_profile_str(p, p->functions.v[f - 1].name), fn)) return 1;
        }
    }
    return 0;
}

/* cpw's thread alpha under the agent with 200 ms windows, burning CPU in burn_early and
 * then in burn_late: each window starts with the tables of the one before, the windows of
 * the second phase still list burn_early's locations (unused), and go tool pprof reads
 * one. The phases make the unused locations certain; with one hot loop they were left
 * to chance (a run where every window sampled every pc of the loop failed). */
static void windows_share_tables(const char *symbolize)
{
    make_dir();
    char sym_env[64];
    snprintf(sym_env, sizeof sym_env, "CONTPROF_SYMBOLIZE=%s", symbolize);
    const char *env[] = {
        PRELOAD, outdir_env(), sym_env, "CONTPROF_CPU_HZ=250", "CONTPROF_WINDOW=200ms", NULL};
    const char *args[] = {"phases", "0.4", NULL};
    run_res r;
    run(args, env, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    pset s;
    pset_load(g_dir, &s);
    const cp_profile *prev = NULL;
    int pairs = 0, nwin = 0, early = 0, late_listing_early = 0;
    uint32_t unused = 0;
    char path[600] = "";
    int agent = strcmp(symbolize, "server") != 0; /* named in the agent */
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].kind, "cpu") || strcmp(s.f[i].iso, "alpha")) continue;
        const cp_profile *p = s.f[i].p;
        if (prev) {
            CHECK(tables_prefix(prev, p));
            pairs++;
        }
        unused += unused_locations(p);
        if (agent && samples_use_func(p, "burn_early")) early++;
        if (agent && early && !samples_use_func(p, "burn_early") && has_func(p, "burn_early"))
            late_listing_early++;
        if (++nwin == 3)
            snprintf(path, sizeof path, "%s/cpw.%d-%llx.%06d.cpu.alpha.pb.gz", g_dir, s.f[i].pid,
                     s.f[i].image, s.f[i].seq);
        prev = p;
    }
    printf("%s: %d windows of alpha, %d pairs sharing their tables, %u locations listed "
           "unused, %d windows sampling burn_early, %d later ones listing it unsampled\n",
           symbolize, nwin, pairs, unused, early, late_listing_early);
    CHECK(pairs >= 3);
    CHECK(unused > 0); /* burn_early's locations, listed after its phase */
    if (agent) CHECK(early > 0 && late_listing_early > 0);
    CHECK(access(path, R_OK) == 0);
    /* go tool pprof reads a window of an epoch */
    char cmd[800], out[1 << 14];
    snprintf(cmd, sizeof cmd, "go tool pprof -top %s 2>&1", path);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int st = pclose(f);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(out, "Showing nodes");
    if (agent) CHECK_CONTAINS(out, "burn_");
    pset_free(&s);
    remove_dir();
}

TEST(windows_share_tables_server)
{
    windows_share_tables("server");
}

TEST(windows_share_tables_agent)
{
    windows_share_tables("agent");
}

TEST(windows_share_tables_lines)
{
    windows_share_tables("lines");
}

TEST_MAIN(T(isolates_api), T(cpu_ratio), T(renamed_at_exit), T(inuse_startup), T(alloc_volume),
          T(churn_inuse_zero), T(same_output_threads), T(same_output_realloc_memalign),
          T(same_output_cxx), T(cxx_names_demangled), T(same_output_fork_exec),
          T(exec_chain_survives), T(agent_out_of_memory), T(unreachable_broker), T(perf_1000hz),
          T(timer_fallback_1000hz), T(engine_by_rate), T(output_files_gzip), T(bare_window_refused),
          T(windows_share_tables_server), T(windows_share_tables_agent),
          T(windows_share_tables_lines))
