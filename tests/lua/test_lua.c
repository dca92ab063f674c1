/* Black-box tests of the Lua adapter: contprof-lua-host runs real Lua scripts, each in its
 * own lua_State and isolate, with the agent in output-dir mode; the pprof files it leaves
 * are decoded and checked. Each TEST is its own ctest process. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pprof.h"
#include "profile.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

/* ------------------------------------------------------------------------------------
 * Running the host */

typedef struct run_res {
    int status;
    char out[1 << 16];
} run_res;

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/contprof-lua-test-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(g_dir, 0755) == 0);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* Runs the host with args (scripts given as NAME=FILE relative to tests/lua) and env
 * ("K=V" strings); the agent writes into g_dir. */
static void run_host(const char *const *args, const char *const *env, run_res *r)
{
    char dir[300];
    snprintf(dir, sizeof(dir), "CONTPROF_OUTPUT_DIR=%s", g_dir);
    const char *all[40] = {dir, "CONTPROF_SERVICE=luahost"};
    for (int i = 0, n = 2; env && env[i] && n < 39; i++)
        all[n++] = env[i];
    r->status = run_capture(CP_LUA_HOST, args, CP_LUA_TESTS, all, r->out, sizeof(r->out));
    fputs(r->out, stdout);
    CHECK(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0);
    CHECK(strstr(r->out, "\nok\n"));
}

/* The number after "script NAME ... KEY " in the host's report, or -1. */
static long script_num(const run_res *r, const char *name, const char *key)
{
    char pfx[96];
    snprintf(pfx, sizeof(pfx), "script %s ", name);
    const char *l = strstr(r->out, pfx);
    if (!l) return -1;
    const char *end = strchr(l, '\n');
    char k[64];
    snprintf(k, sizeof(k), " %s ", key);
    const char *v = strstr(l, k);
    if (!v || (end && v > end)) return -1;
    return atol(v + strlen(k));
}

static double total_num(const run_res *r, const char *key)
{
    const char *l = strstr(r->out, "total requests");
    CHECK(l);
    char k[64];
    snprintf(k, sizeof(k), " %s ", key);
    const char *v = strstr(l, k);
    CHECK(v);
    return atof(v + strlen(k));
}

/* ------------------------------------------------------------------------------------
 * Reading the profiles (loaded and summed by pfiles.h) */

static int has_func(const cp_profile *p, const char *fn)
{
    for (uint32_t i = 0; i < p->functions.n; i++)
        if (!strcmp(cp_profile_str(p, p->functions.v[i].name), fn)) return 1;
    return 0;
}

/* Does any profile of kind (NULL: any) of isolate iso have function fn? */
static int iso_has_func(const pset *s, const char *kind, const char *iso, const char *fn)
{
    for (int i = 0; i < s->n; i++)
        if ((!kind || !strcmp(s->f[i].kind, kind)) && !strcmp(s->f[i].iso, iso) &&
            has_func(s->f[i].p, fn))
            return 1;
    return 0;
}

static const cp_profile *last_of(const pset *s, const char *kind, const char *iso, int *seq)
{
    const cp_profile *p = NULL;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->f[i].kind, kind) && !strcmp(s->f[i].iso, iso)) {
            p = s->f[i].p;
            if (seq) *seq = i;
        }
    return p;
}

static int count_kind(const pset *s, const char *kind, const char *iso)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += !strcmp(s->f[i].kind, kind) && !strcmp(s->f[i].iso, iso);
    return n;
}

/* The file and line of the first location of function fn in p (file "" if none). */
static const char *func_file(const cp_profile *p, const char *fn, int64_t *line)
{
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        if (!l->nlines) continue;
        const cp_line *ln = &p->lines.v[l->line_off];
        if (!ln->function_id) continue;
        const cp_function *f = &p->functions.v[ln->function_id - 1];
        if (strcmp(cp_profile_str(p, f->name), fn) != 0) continue;
        *line = ln->line;
        return cp_profile_str(p, f->filename);
    }
    return "";
}

/* ------------------------------------------------------------------------------------
 * 1. Two Lua functions burning CPU 3:1 in one isolate */

TEST(cpu_ratio)
{
    make_dir();
    const char *env[] = {"CONTPROF_CPU_HZ=1000", "CONTPROF_WINDOW=10s", NULL};
    const char *args[] = {"-t", "1", "-n", "1000", "-a", "1000", "ratio=ratio.lua", NULL};
    run_res r;
    run_host(args, env, &r);
    pset s;
    pset_load(g_dir, &s);
    int64_t a = sum_kind(&s, "cpu", "ratio", "burn_a", 1);
    int64_t b = sum_kind(&s, "cpu", "ratio", "burn_b", 1);
    int64_t all = sum_kind(&s, "cpu", "ratio", NULL, 1);
    double cpu = total_num(&r, "cpu");
    printf("burn_a %.3fs burn_b %.3fs ratio %.3f; isolate %.3fs, workers' process cpu %.3fs\n",
           a / 1e9, b / 1e9, b ? (double)a / (double)b : 0, all / 1e9, cpu);
    CHECK(a > 0 && b > 0);
    CHECK(fabs((double)a / (double)b - 3.0) <= 0.15);
    /* nearly all of the isolate's CPU has its Lua frames */
    CHECK((double)(a + b) >= 0.9 * (double)all);
    /* samples stand for the CPU time they were taken for */
    CHECK((double)all > 0.8 * cpu * 1e9 && (double)all < 1.1 * cpu * 1e9);
    /* Lua frames are functions with a file name and a line */
    const cp_profile *p = last_of(&s, "cpu", "ratio", NULL);
    int64_t line = 0;
    CHECK_STREQ(func_file(p, "burn_a", &line), "ratio.lua");
    CHECK(line == 14); /* where burn_a calls spin */
    CHECK_STREQ(func_file(p, "spin", &line), "ratio.lua");
    CHECK(line >= 5 && line <= 10);
    pset_free(&s);
    remove_dir();
}

/* CPU inside a long C call (the hook can only fire after it returns) is weighted in full
 * and lands on the Lua function that made the call: sort_big (C sort) and spin_for (Lua)
 * get the same CPU time per request. */
TEST(cpu_in_long_c_call)
{
    make_dir();
    const char *env[] = {"CONTPROF_CPU_HZ=1000", "CONTPROF_WINDOW=10s", NULL};
    const char *args[] = {"-t", "1", "-d", "4", "cfunc=cfunc.lua", NULL};
    run_res r;
    run_host(args, env, &r);
    pset s;
    pset_load(g_dir, &s);
    int64_t c = sum_kind(&s, "cpu", "cfunc", "sort_big", 1);
    int64_t l = sum_kind(&s, "cpu", "cfunc", "spin_for", 1);
    int64_t all = sum_kind(&s, "cpu", "cfunc", NULL, 1);
    printf("sort_big %.3fs spin_for %.3fs ratio %.3f; isolate %.3fs\n", c / 1e9, l / 1e9,
           l ? (double)c / (double)l : 0, all / 1e9);
    CHECK(c > 0 && l > 0);
    CHECK(fabs((double)c / (double)l - 1.0) <= 0.05);
    CHECK((double)(c + l) >= 0.9 * (double)all);
    pset_free(&s);
    remove_dir();
}

/* A script with its own hook never reaches our safe point: its CPU time still reaches
 * every window (as native samples), not only when the request ends. */
TEST(cpu_with_script_hook)
{
    make_dir();
    const char *env[] = {"CONTPROF_CPU_HZ=1000", "CONTPROF_WINDOW=1s", NULL};
    const char *args[] = {"-t", "1", "-n", "1", "-a", "3500", "hooked=hooked.lua", NULL};
    run_res r;
    run_host(args, env, &r);
    pset s;
    pset_load(g_dir, &s);
    int64_t most = 0; /* the most CPU any one window holds */
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.f[i].kind, "cpu") && !strcmp(s.f[i].iso, "hooked")) {
            int64_t v = func_total(s.f[i].p, NULL, 1);
            if (v > most) most = v;
        }
    int64_t all = sum_kind(&s, "cpu", "hooked", NULL, 1);
    double cpu = total_num(&r, "cpu");
    printf("busiest window %.3fs; isolate %.3fs of %.3fs\n", most / 1e9, all / 1e9, cpu);
    CHECK((double)all > 0.8 * cpu * 1e9);
    /* 3.5 s of CPU spread over the 1 s windows it ran in, not all shipped at the end */
    CHECK((double)most < 0.6 * (double)all);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 2. Three isolates on a pool of two threads: each profile holds only its own functions */

TEST(three_isolates_two_threads)
{
    make_dir();
    const char *env[] = {"CONTPROF_CPU_HZ=500", "CONTPROF_WINDOW=1s", "CONTPROF_ALLOC_RATE=65536",
                         NULL};
    const char *args[] = {
        "-t", "2", "-d", "3", "-a", "20000", "alpha=alpha.lua", "beta=beta.lua", "gamma=gamma.lua",
        NULL};
    run_res r;
    run_host(args, env, &r);
    const char *names[] = {"alpha", "beta", "gamma"};
    pset s;
    pset_load(g_dir, &s);
    for (int i = 0; i < 3; i++) {
        char own[32];
        snprintf(own, sizeof(own), "work_%s", names[i]);
        /* states really moved between the two threads */
        CHECK(script_num(&r, names[i], "moves") > 10);
        int64_t mine = sum_kind(&s, "cpu", names[i], own, 1);
        int64_t all = sum_kind(&s, "cpu", names[i], NULL, 1);
        printf("%s: %s %.3fs of %.3fs\n", names[i], own, mine / 1e9, all / 1e9);
        CHECK(mine > 0 && (double)mine >= 0.8 * (double)all);
        CHECK(iso_has_func(&s, "alloc", names[i], own));
        for (int j = 0; j < 3; j++) {
            if (j == i) continue;
            char other[32];
            snprintf(other, sizeof(other), "work_%s", names[j]);
            CHECK(!iso_has_func(&s, NULL, names[i], other));
        }
    }
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 3. A 32 MiB table built while the script loads stays in its isolate's inuse */

TEST(inuse_built_at_load)
{
    make_dir();
    const char *env[] = {"CONTPROF_WINDOW=1s", NULL};
    const char *args[] = {"-t", "2", "-d", "6", "-a", "1000", "big=bigtable.lua", "alpha=alpha.lua",
                          NULL};
    run_res r;
    run_host(args, env, &r);
    pset s;
    pset_load(g_dir, &s);
    CHECK(count_kind(&s, "inuse", "big") >= 4);
    int idx = -1;
    const cp_profile *p = last_of(&s, "inuse", "big", &idx);
    CHECK(p);
    double mib = (double)func_total(p, "build_table", 1) / 1048576.0;
    double all = (double)func_total(p, NULL, 1) / 1048576.0;
    printf("last inuse window of big: build_table %.1f MiB of %.1f MiB\n", mib, all);
    CHECK(fabs(mib - 32.0) <= 3.2);
    /* under the script's main chunk, in the isolate that built it, not the other one */
    CHECK(func_total(p, "main chunk", 1) >= func_total(p, "build_table", 1));
    const cp_profile *q = last_of(&s, "inuse", "alpha", NULL);
    CHECK(!q || !has_func(q, "build_table"));
    CHECK(!q || (double)func_total(q, NULL, 1) < 4.0 * 1048576.0);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * 4. Lua errors, coroutines and states closed while profiled: no crash, no leak */

TEST(errors_coroutines_close)
{
    make_dir();
    const char *env[] = {"CONTPROF_CPU_HZ=1000", "CONTPROF_WINDOW=1s", "CONTPROF_ALLOC_RATE=16384",
                         NULL};
    const char *args[] = {
        "-t", "2", "-d", "3", "-a", "400", "err=errors.lua", "coro=coro.lua", "closer=closer.lua",
        NULL};
    run_res r;
    run_host(args, env, &r);
    long req = script_num(&r, "err", "requests");
    CHECK(req > 10 && script_num(&r, "err", "errors") == req);
    CHECK(script_num(&r, "coro", "requests") > 10 && script_num(&r, "coro", "errors") == 0);
    CHECK(script_num(&r, "closer", "errors") == 0 && script_num(&r, "closer", "reopens") >= 10);
    pset s;
    pset_load(g_dir, &s);
    /* frames from inside coroutines, through wrap and resume */
    CHECK(iso_has_func(&s, NULL, "coro", "gen_body"));
    CHECK(iso_has_func(&s, NULL, "coro", "inner"));
    CHECK(sum_kind(&s, "cpu", "err", NULL, 1) > 0);
    pset_free(&s);
    remove_dir();
}

/* Closing and reopening states for longer does not grow the process: the states, their
 * handles and isolates are all released. */
TEST(close_reopen_no_growth)
{
    make_dir();
    const char *env[] = {"CONTPROF_WINDOW=500ms", "CONTPROF_ALLOC_RATE=65536", NULL};
    /* by request count, not run time: under load a 4 s run may get less CPU than a 1 s
     * run did (seen in CI: 84 reopens against 52), and the check is about reopens */
    const char *a1[] = {"-t", "2", "-n", "250", "-a", "10", "closer=closer.lua", NULL};
    const char *a4[] = {"-t", "2", "-n", "1000", "-a", "10", "closer=closer.lua", NULL};
    run_res r1, r4;
    run_host(a1, env, &r1);
    run_host(a4, env, &r4);
    long n1 = script_num(&r1, "closer", "reopens"), n4 = script_num(&r4, "closer", "reopens");
    double m1 = total_num(&r1, "maxrss_kb"), m4 = total_num(&r4, "maxrss_kb");
    printf("reopens %ld -> %ld, maxrss %.0f kB -> %.0f kB\n", n1, n4, m1, m4);
    CHECK(n1 > 10 && n4 > 2 * n1);
#ifndef __SANITIZE_ADDRESS__
    /* a leaked state of this script is ~0.6 MiB: hundreds more would show */
    CHECK(m4 < m1 + 8 * 1024);
#else
    /* ASan's quarantine holds freed memory; its leak check at the host's exit (a nonzero
     * status, caught by run_host) is the test here */
    (void)m1;
    (void)m4;
#endif
    remove_dir();
}

TEST_MAIN(T(cpu_ratio), T(cpu_in_long_c_call), T(cpu_with_script_hook),
          T(three_isolates_two_threads), T(inuse_built_at_load), T(errors_coroutines_close),
          T(close_reopen_no_growth))
