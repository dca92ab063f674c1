/* A program with its own malloc (as workerd with tcmalloc) under the agent: its allocations
 * through it cannot be seen (the loader binds malloc to the program's before the preloaded
 * library's), and the agent says so once on stderr and in every window's engine text,
 * rather than showing a near-empty allocation profile with no word; CPU is still sampled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pprof.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

TEST(own_malloc_is_named_and_cpu_still_sampled)
{
    char dir[128], envdir[300], preload[600], cmd[600];
    snprintf(dir, sizeof(dir), "/tmp/contprof-ownmalloc-%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir %s", dir, dir);
    CHECK(system(cmd) == 0);
    snprintf(envdir, sizeof(envdir), "CONTPROF_OUTPUT_DIR=%s", dir);
    const char *lib = getenv("CP_TEST_LIB");
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", lib ? lib : CP_LIB);
    const char *env[] = {preload, envdir, "CONTPROF_ALLOC_RATE=4096", NULL};
    static char out[1 << 16];
    const char *args[] = {"-c", "exec " CP_OWNMALLOC " 2>&1", NULL};
    int st = run_capture("/bin/sh", args, NULL, env, out, sizeof(out));
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* the program's malloc served its own calls: the agent's never ran */
    unsigned long served = 0;
    const char *sv = strstr(out, "served ");
    CHECK(sv && sscanf(sv, "served %lu", &served) == 1);
    CHECK(served >= 2000);
    CHECK_CONTAINS(out, "cpownmalloc defines its own malloc, which the loader binds before the "
                        "agent's: allocations through it are not seen");
    pset s;
    pset_load(dir, &s);
    int cpu = 0, alloc = 0, said = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].iso, "cpownmalloc")) continue; /* sh's, before its exec */
        cpu += !strcmp(s.f[i].kind, "cpu");
        alloc += !strcmp(s.f[i].kind, "alloc");
        const cp_profile *p = s.f[i].p;
        for (uint32_t k = 0; k < p->comments.n; k++)
            said += strstr(cp_profile_str(p, p->comments.v[k]), "alloc=partial") != NULL;
    }
    printf("cpu windows %d, alloc windows %d, windows saying alloc=partial %d\n", cpu, alloc, said);
    CHECK(cpu >= 1);
    CHECK(said >= cpu + alloc);
    /* what an alloc window holds is the C library's own allocations (stdio's buffer), never
     * the 2,000 x 64 KiB main made through its malloc */
    CHECK(sum_kind(&s, "alloc", "cpownmalloc", "main", 1) == 0);
    CHECK(sum_kind(&s, "cpu", NULL, "main", 1) > 0);
    pset_free(&s);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN(T(own_malloc_is_named_and_cpu_still_sampled))
