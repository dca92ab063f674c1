/* The malloc family under the agent gives a program exactly what glibc gives it:
 * malloc_conf's transcript (every entry point, sizes, alignment, usable bytes kept by
 * realloc, zeroing, errno, failures) is the same without the agent, with every allocation
 * sampled (CONTPROF_ALLOC_RATE=1) and at the default rate. Each TEST is its own ctest
 * process. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"
#include "test.h"

#define PRELOAD "LD_PRELOAD=" CP_LIB

typedef struct run_res {
    int status;
    char out[1 << 16];
} run_res;

static char g_dir[256], g_env_dir[300];

/* A fresh output directory for the agent's windows (the agent's files prove it ran). */
static const char *outdir_env(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/contprof-malloc-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(g_dir, 0755) == 0);
    snprintf(g_env_dir, sizeof g_env_dir, "CONTPROF_OUTPUT_DIR=%s", g_dir);
    return g_env_dir;
}

/* Alloc profiles the agent left in g_dir; removes the directory. */
static int alloc_profiles_then_remove(void)
{
    int n = 0;
    DIR *d = opendir(g_dir);
    CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".alloc.") != NULL;
    closedir(d);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return n;
}

/* Runs malloc_conf mode: without the agent, or (agent set) under it with rate (a
 * "CONTPROF_ALLOC_RATE=..." string; NULL: the default). */
static void conf(const char *mode, int agent, const char *rate, run_res *r)
{
    const char *args[] = {mode, NULL};
    unsetenv("CONTPROF_ALLOC_RATE");
    if (!agent) {
        const char *env[] = {NULL};
        r->status = run_capture(MALLOC_CONF, args, NULL, env, r->out, sizeof r->out);
        return;
    }
    const char *env[] = {PRELOAD, outdir_env(), rate, NULL};
    r->status = run_capture(MALLOC_CONF, args, NULL, env, r->out, sizeof r->out);
    int n = alloc_profiles_then_remove();
    if (n == 0) fprintf(stderr, "no alloc profile left: the agent did not run\n");
    CHECK(n > 0);
}

static int exited_ok(const run_res *r)
{
    return WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0;
}

/* The transcript under the agent at rate (see conf) equals the one without it. */
static void same_transcript(const char *rate)
{
    run_res *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    conf("conf", 0, NULL, a);
    conf("conf", 1, rate, b);
    if (!exited_ok(a) || !exited_ok(b) || strcmp(a->out, b->out) != 0)
        fprintf(stderr, "without the agent (status %d):\n%s\nwith it, %s (status %d):\n%s\n",
                a->status, a->out, rate ? rate : "default rate", b->status, b->out);
    CHECK(exited_ok(a));
    CHECK_STREQ(a->out, b->out);
    CHECK(exited_ok(b));
    free(a);
    free(b);
}

/* glibc itself keeps every promise malloc_conf checks (the test's own sanity). */
TEST(conformance_native)
{
    run_res *a = malloc(sizeof *a);
    conf("conf", 0, NULL, a);
    if (!exited_ok(a)) fprintf(stderr, "%s\n", a->out);
    CHECK(exited_ok(a));
    CHECK_CONTAINS(a->out, "mallopt(M_CHECK_ACTION, 3)");
    free(a);
}

TEST(conformance_rate_1)
{
    same_transcript("CONTPROF_ALLOC_RATE=1");
}

TEST(conformance_default_rate)
{
    same_transcript(NULL);
}

/* Issue 24: blocks written up to malloc_usable_size, then realloc'ed (grow, same, shrink):
 * a moving realloc of a sampled block copied only the size asked for. */
static void realloc_keeps_usable(const char *rate)
{
    run_res *r = malloc(sizeof *r);
    conf("usable", 1, rate, r);
    if (!exited_ok(r))
        fprintf(stderr, "%s: status %d\n%s\n", rate ? rate : "default rate", r->status, r->out);
    CHECK(exited_ok(r));
    CHECK_CONTAINS(r->out, "200000 reallocs, 0 lost bytes");
    free(r);
}

TEST(realloc_keeps_usable_rate_1)
{
    realloc_keeps_usable("CONTPROF_ALLOC_RATE=1");
}

TEST(realloc_keeps_usable_default_rate)
{
    realloc_keeps_usable(NULL);
}

TEST_MAIN(T(conformance_native), T(conformance_rate_1), T(conformance_default_rate),
          T(realloc_keeps_usable_rate_1), T(realloc_keeps_usable_default_rate))
