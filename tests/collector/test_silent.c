/* Issue 24, black-box: where the agent used to lose data without a word. Stacks through an
 * object dlopen'ed during the window (python3 importing _json); `contprof run` on programs
 * the agent cannot enter (static, set-user-ID, file capabilities, Go without cgo); a Go
 * program with cgo whose runtime takes the sampling signal. Real programs, built here.
 * CP_SILENT_LIB and CP_SILENT_CLI point the tests at another build (main's, say). */
#include <dirent.h>
#include <errno.h>
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

static const char *lib(void)
{
    const char *e = getenv("CP_SILENT_LIB");
    return e && *e ? e : CP_LIB;
}

__attribute__((unused)) static const char *cli(void)
{
    const char *e = getenv("CP_SILENT_CLI");
    return e && *e ? e : CP_CLI;
}

static char g_dir[256];

/* A fresh directory for this test, readable by everyone (the set-user-ID test runs as
 * nobody). */
static const char *make_dir(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/contprof-silent-%d", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -p %s/out && chmod -R 0777 %s", g_dir, g_dir,
             g_dir);
    CHECK(system(cmd) == 0);
    return g_dir;
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

__attribute__((unused)) static void sh(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "failed (%d): %s\n", rc, cmd);
    CHECK(rc == 0);
}

/* ------------------------------------------------------------------------------------
 * dlopen: the unwinder knows a new object before the next sample needs its CFI */

static const char *map_file(const cp_profile *p, uint32_t loc_id)
{
    const cp_location *l = &p->locations.v[loc_id - 1];
    if (!l->mapping_id) return "";
    return cp_profile_str(p, p->mappings.v[l->mapping_id - 1].filename);
}

/* python3 imports json (dlopen of _json.cpython-*.so) after the agent started and spends
 * 1.5 s decoding in _json's C scanner, at 1000 Hz, all in the first window. Stacks with a
 * _json frame must go on below it into the interpreter (python3's own frames) down to
 * main: before, the module was learnt only at the window's end, and about half of them
 * stopped at the _json frame (no CFI, no frame pointer). */
TEST(dlopen_then_sample)
{
    const char *dir = make_dir();
    char script[300], out_env[300];
    snprintf(script, sizeof(script), "%s/json_loop.py", dir);
    write_file(script, "import time\n"
                       "t = time.time()\n"
                       "import json\n"
                       "s = '[\"' + 'a\\\\u00e9b' * 200000 + '\"]'\n"
                       "n = 0\n"
                       "while time.time() - t < 1.5:\n"
                       "    json.loads(s)\n"
                       "    n += 1\n"
                       "print('decoded', n > 0)\n");
    snprintf(out_env, sizeof(out_env), "CONTPROF_OUTPUT_DIR=%s/out", dir);
    char preload[600];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", lib());
    const char *env[] = {preload,
                         out_env,
                         "CONTPROF_CPU_HZ=1000",
                         "CONTPROF_WINDOW=60s",
                         "CONTPROF_SYMBOLIZE=server",
                         "CONTPROF_SERVICE=py",
                         NULL};
    const char *args[] = {script, NULL};
    char out[4096];
    int st = run_capture("/usr/bin/python3", args, NULL, env, out, sizeof(out));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(out, "decoded True");

    char odir[300];
    snprintf(odir, sizeof(odir), "%s/out", dir);
    pset s;
    pset_load(odir, &s);
    int64_t through = 0, deep = 0, cut = 0;
    int windows = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].kind, "cpu")) continue;
        windows++;
        const cp_profile *p = s.f[i].p;
        for (uint32_t k = 0; k < p->samples.n; k++) {
            const cp_sample *sm = &p->samples.v[k];
            int last_json = -1;
            for (uint32_t j = 0; j < sm->nlocs; j++)
                if (strstr(map_file(p, p->stack.v[sm->loc_off + j]), "/_json.")) last_json = (int)j;
            if (last_json < 0) continue;
            int below = 0;
            for (uint32_t j = (uint32_t)last_json + 1; j < sm->nlocs; j++)
                if (strstr(map_file(p, p->stack.v[sm->loc_off + j]), "/python3")) below++;
            int64_t w = cp_profile_sample_values(p, k)[0];
            through += w;
            if (below >= 3 && sm->nlocs >= 8)
                deep += w;
            else
                cut += w;
        }
    }
    pset_free(&s);
    remove_dir();
    printf("%d cpu window(s); samples through _json: %lld, reaching python3's frames below "
           "it: %lld, cut at or near _json: %lld\n",
           windows, (long long)through, (long long)deep, (long long)cut);
    CHECK_EQ(windows, 1);
    CHECK(through >= 100);
    CHECK(cut * 50 <= through); /* at most 2% */
}

TEST_MAIN(T(dlopen_then_sample))
