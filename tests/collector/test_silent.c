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
#include <sys/statvfs.h>
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

static const char *cli(void)
{
    const char *e = getenv("CP_SILENT_CLI");
    return e && *e ? e : CP_CLI;
}

static char g_dir[256];

/* A fresh directory for this test, readable by everyone (the set-user-ID test runs as
 * nobody). */
static const char *make_dir(void)
{
    /* set-user-ID bits do nothing on a nosuid mount: then in the build tree */
    struct statvfs vfs;
    const char *bin = getenv("CP_BINARY_DIR");
    int nosuid = statvfs("/tmp", &vfs) == 0 && (vfs.f_flag & ST_NOSUID);
    snprintf(g_dir, sizeof(g_dir), "%s/contprof-silent-%d", nosuid && bin ? bin : "/tmp",
             (int)getpid());
    char cmd[1400];
    /* out: shared by root and nobody, so sticky (the agent refuses a directory others may
     * write that is not: README "Files") */
    snprintf(cmd, sizeof(cmd),
             "rm -rf %s && mkdir -p %s/out && chmod -R 0777 %s && chmod 1777 %s/out", g_dir, g_dir,
             g_dir, g_dir);
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

static void sh(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "failed (%d): %s\n", rc, cmd);
    CHECK(rc == 0);
}

/* A new test directory with file (its text) in it, and build run there; returns the
 * directory. */
static const char *build_in(const char *file, const char *text, const char *build)
{
    const char *dir = make_dir();
    char path[400], cmd[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_file(path, text);
    snprintf(cmd, sizeof cmd, "cd %s && %s", dir, build);
    sh(cmd);
    return dir;
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
        if (strcmp(s.f[i].kind, "cpu") || !strcmp(s.f[i].iso, "contprof-agent")) continue;
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

/* ------------------------------------------------------------------------------------
 * `contprof run` on programs the agent cannot enter: one line on stderr says why, the
 * program runs as it would without contprof (its output and exit code) */

/* 8 MiB allocated: sampled for sure (mean 512 KiB), so the agent writes a profile */
static const char hello_c[] = "#include <stdio.h>\n"
                              "#include <stdlib.h>\n"
                              "int main(void) {\n"
                              "    volatile char *p = malloc(8 << 20); p[0] = 1;\n"
                              "    puts(\"hello\"); return 3;\n"
                              "}\n";

static const char hello_go[] = "package main\n"
                               "import (\"fmt\"; \"os\")\n"
                               "func main() { fmt.Println(\"hello\"); os.Exit(3) }\n";

/* The Go toolchain is a CI dependency (.ci/deps: golang-go): missing is a failure. */
static void go_build(const char *dir, const char *src, const char *bin, int cgo)
{
    if (system("command -v go >/dev/null") != 0) {
        fprintf(stderr, "go not found: golang-go is installed by .ci/deps\n");
        CHECK(0);
    }
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "cd %s && HOME=%s GOCACHE=%s/gocache GOPATH=%s/gopath GOPROXY=off GOFLAGS= "
             "CGO_ENABLED=%d go build -o %s %s",
             dir, dir, dir, dir, cgo, bin, src);
    sh(cmd);
}

typedef struct run_out {
    int rc;
    char out[4096], err[8192];
    int err_lines;
} run_out;

static void slurp_file(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    CHECK(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* Runs `contprof run --output-dir DIR/out -- PROG` in dir, as `as` (a command prefix such as
 * setpriv's, or ""). */
static void run_under(const char *dir, const char *as, const char *prog, const char *extra_env,
                      run_out *r)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "cd %s && env -u LD_PRELOAD CONTPROF_LIB=%s %s %s %s run --output-dir %s/out -- %s "
             ">%s/stdout.txt 2>%s/stderr.txt; echo $? >%s/rc.txt",
             dir, lib(), extra_env ? extra_env : "", as, cli(), dir, prog, dir, dir, dir);
    sh(cmd);
    char path[600], rc[32];
    snprintf(path, sizeof(path), "%s/rc.txt", dir);
    slurp_file(path, rc, sizeof(rc));
    r->rc = atoi(rc);
    snprintf(path, sizeof(path), "%s/stdout.txt", dir);
    slurp_file(path, r->out, sizeof(r->out));
    snprintf(path, sizeof(path), "%s/stderr.txt", dir);
    slurp_file(path, r->err, sizeof(r->err));
    r->err_lines = 0;
    for (const char *c = r->err; *c; c++)
        r->err_lines += *c == '\n';
    printf("%s%s%s: exit %d, stdout \"%.40s\", stderr: %s", as, as[0] ? " " : "", prog, r->rc,
           r->out, r->err[0] ? r->err : "(nothing)\n");
}

/* One line, "contprof run: ...", naming the program and the reason. */
static void expect_reason(const run_out *r, const char *prog, const char *reason)
{
    CHECK_EQ(r->rc, 3);
    CHECK_STREQ(r->out, "hello\n");
    CHECK_EQ(r->err_lines, 1);
    CHECK(!strncmp(r->err, "contprof run: ", 14));
    CHECK_CONTAINS(r->err, prog);
    CHECK_CONTAINS(r->err, reason);
    CHECK_CONTAINS(r->err, "no profile");
}

#define NOBODY "setpriv --reuid=65534 --regid=65534 --clear-groups"

TEST(run_static)
{
    const char *dir =
        build_in("hello.c", hello_c, "cc -static -o hello_static hello.c && cc -o hello hello.c");
    run_out r;
    run_under(dir, "", "./hello_static", NULL, &r);
    expect_reason(&r, "hello_static", "statically linked");
    /* the same program linked dynamically: no word, the agent is in it */
    run_under(dir, "", "./hello", NULL, &r);
    CHECK_EQ(r.rc, 3);
    CHECK_STREQ(r.out, "hello\n");
    CHECK_EQ(r.err_lines, 0);
    char odir[300];
    snprintf(odir, sizeof(odir), "%s/out", dir);
    pset s;
    pset_load(odir, &s);
    CHECK(s.n >= 1);
    pset_free(&s);
    remove_dir();
}

TEST(run_setuid_as_nobody)
{
    const char *dir =
        build_in("hello.c", hello_c,
                 "cc -o hello_suid hello.c && chown 0:0 hello_suid && chmod 4755 hello_suid && cp "
                 "hello_suid hello_plain && chmod 0755 hello_plain && chown 65534 hello_plain");
    run_out r;
    run_under(dir, NOBODY, "./hello_suid", NULL, &r);
    expect_reason(&r, "hello_suid", "set-user-ID");
    /* found through PATH too */
    char env[600];
    snprintf(env, sizeof(env), "PATH=%s:/usr/bin:/bin", dir);
    run_under(dir, NOBODY, "hello_suid", env, &r);
    expect_reason(&r, "hello_suid", "set-user-ID");
    /* not set-user-ID: no word */
    run_under(dir, NOBODY, "./hello_plain", NULL, &r);
    CHECK_EQ(r.rc, 3);
    CHECK_EQ(r.err_lines, 0);
    remove_dir();
}

TEST(run_file_caps_as_nobody)
{
    const char *dir = build_in(
        "hello.c", hello_c, "cc -o hello_cap hello.c && setcap cap_net_bind_service+ep hello_cap");
    run_out r;
    run_under(dir, NOBODY, "./hello_cap", NULL, &r);
    expect_reason(&r, "hello_cap", "file capabilities");
    remove_dir();
}

TEST(run_go_without_cgo)
{
    const char *dir = make_dir();
    write_file(strcat(strcpy((char[400]){0}, dir), "/hello.go"), hello_go);
    go_build(dir, "hello.go", "hello_go", 0);
    run_out r;
    run_under(dir, "", "./hello_go", NULL, &r);
    expect_reason(&r, "hello_go", "Go program built without cgo");
    /* a script whose interpreter is that program (through env and PATH) */
    char path[400], env[600];
    snprintf(path, sizeof(path), "%s/script", dir);
    write_file(path, "#!/usr/bin/env hello_go\n");
    CHECK(chmod(path, 0755) == 0);
    snprintf(env, sizeof(env), "PATH=%s:/usr/bin:/bin", dir);
    run_under(dir, "", "./script", env, &r);
    expect_reason(&r, "hello_go", "Go program built without cgo");
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * The program takes the sampling signal: the agent says so once on stderr and in every
 * profile's comments, stops CPU sampling, goes on sampling allocations */

/* Whether any profile of dir/out carries a comment containing needle; *allocs gets the
 * number of alloc profiles with samples. */
static int comment_in_profiles(const char *dir, const char *needle, int *allocs)
{
    char odir[300];
    snprintf(odir, sizeof(odir), "%s/out", dir);
    pset s;
    pset_load(odir, &s);
    int hit = 0;
    *allocs = 0;
    for (int i = 0; i < s.n; i++) {
        const cp_profile *p = s.f[i].p;
        for (uint32_t k = 0; k < p->comments.n; k++)
            if (strstr(cp_profile_str(p, p->comments.v[k]), needle)) hit = 1;
        if (!strcmp(s.f[i].kind, "alloc") && p->samples.n) (*allocs)++;
    }
    pset_free(&s);
    return hit;
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *c = strstr(text, needle); c; c = strstr(c + 1, needle))
        n++;
    return n;
}

/* Go's runtime with cgo installs its handler on every signal at start (through libc's
 * sigaction on linux/amd64, past it elsewhere): the agent moved from SIGPROF down the real-
 * time signals until none was left, and CPU sampling ended in "engine=off" without a word. */
static const char cgo_go[] =
    "package main\n"
    "// #include <stdlib.h>\n"
    "// static int twice(int x) { return 2 * x; }\n"
    "import \"C\"\n"
    "import (\"fmt\"; \"os\"; \"time\")\n"
    "func main() {\n"
    "    p := C.malloc(8 << 20)\n"
    "    C.free(p)\n"
    "    x := uint64(1)\n"
    "    for t := time.Now(); time.Since(t) < 1500*time.Millisecond; {\n"
    "        for i := 0; i < 100000; i++ { x = x*6364136223846793005 + 1 }\n"
    "    }\n"
    "    fmt.Println(\"hello cgo\", C.twice(21), x != 0)\n"
    "    os.Exit(3)\n"
    "}\n";

TEST(cgo_takes_signals)
{
    const char *dir = make_dir();
    write_file(strcat(strcpy((char[400]){0}, dir), "/cgo.go"), cgo_go);
    go_build(dir, "cgo.go", "hello_cgo", 1);
    run_out r;
    /* windows of 0.5 s: os.Exit leaves through the exit_group system call, past libc's exit
     * and the agent's destructor, so the last window of a Go program is not written */
    run_under(dir, "", "./hello_cgo", "CONTPROF_CPU_HZ=1000 CONTPROF_WINDOW=500ms", &r);
    CHECK_EQ(r.rc, 3);
    CHECK_STREQ(r.out, "hello cgo 42 true\n");
    CHECK_EQ(r.err_lines, 1);
    CHECK_EQ(count_lines_with(r.err, "contprof: "), 1);
    CHECK_CONTAINS(r.err, "CPU sampling stopped");
    int allocs;
    CHECK(comment_in_profiles(dir, "cpu_sampling_lost=signal taken", &allocs));
    CHECK(allocs >= 1); /* the 8 MiB C.malloc */
    remove_dir();
}

/* A C program that sets SIG_IGN on every signal the agent samples on with the raw system
 * call (a syscall instruction: no hook sees it), after 0.3 s of CPU, then burns 1.5 s. The
 * agent notices at its next check (once a second) that the kernel no longer calls its
 * handler. */
static const char raw_c[] =
    "#include <signal.h>\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <sys/syscall.h>\n"
    "#include <time.h>\n"
    "static long raw_sigaction(long sig, const void *act) {\n"
    "    long ret;\n"
    "    register long r10 __asm__(\"r10\") = 8;\n"
    "    __asm__ volatile(\"syscall\" : \"=a\"(ret) : \"0\"((long)SYS_rt_sigaction), \"D\"(sig),\n"
    "                     \"S\"(act), \"d\"(0L), \"r\"(r10) : \"rcx\", \"r11\", \"memory\");\n"
    "    return ret;\n"
    "}\n"
    "static volatile unsigned long x = 1;\n"
    "static void burn(double s) {\n"
    "    clock_t end = clock() + (clock_t)(s * CLOCKS_PER_SEC);\n"
    "    while (clock() < end) for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1;\n"
    "}\n"
    "int main(void) {\n"
    "    burn(0.3);\n"
    "    struct { void *h; unsigned long flags; void *restorer; unsigned long mask; } ign = {\n"
    "        (void *)SIG_IGN, 0, 0, 0};\n"
    "    int sigs[] = {SIGPROF, SIGVTALRM, 64, 63, 62, 61, 60, 59, 58, 57};\n"
    "    for (int i = 0; i < 10; i++) if (raw_sigaction(sigs[i], &ign) != 0) return 9;\n"
    "    burn(1.5);\n"
    "    volatile char *p = malloc(8 << 20); p[0] = 1;\n"
    "    puts(\"hello\");\n"
    "    return 3;\n"
    "}\n";

TEST(raw_sigaction_takes_signal)
{
    const char *dir = build_in("raw.c", raw_c, "cc -O1 -o raw raw.c");
    run_out r;
    run_under(dir, "", "./raw", "CONTPROF_CPU_HZ=1000 CONTPROF_WINDOW=60s", &r);
    CHECK_EQ(r.rc, 3);
    CHECK_STREQ(r.out, "hello\n");
    CHECK_EQ(r.err_lines, 1);
    CHECK_CONTAINS(r.err, "contprof: the program replaced the agent's handler of SIGPROF");
    int allocs;
    CHECK(comment_in_profiles(dir, "cpu_sampling_lost=signal taken", &allocs));
    CHECK(allocs >= 1);
    remove_dir();
}

/* A C program that deletes every POSIX timer id of the process with the raw system call
 * after 0.3 s of CPU, then burns 2.5 s: the agent's timer for its thread is gone. The agent
 * notices at its next check (once a second), re-arms it, says so once and counts it in
 * the engine string. */
static const char timers_c[] =
    "#include <stdio.h>\n"
    "#include <sys/syscall.h>\n"
    "#include <time.h>\n"
    "static long raw_timer_delete(long id) {\n"
    "    long ret;\n"
    "    __asm__ volatile(\"syscall\" : \"=a\"(ret) : \"0\"((long)SYS_timer_delete), \"D\"(id)\n"
    "                     : \"rcx\", \"r11\", \"memory\");\n"
    "    return ret;\n"
    "}\n"
    "static volatile unsigned long x = 1;\n"
    "static void burn(double s) {\n"
    "    clock_t end = clock() + (clock_t)(s * CLOCKS_PER_SEC);\n"
    "    while (clock() < end) for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1;\n"
    "}\n"
    "int main(void) {\n"
    "    burn(0.3);\n"
    "    int n = 0;\n"
    "    for (long id = 0; id < 4096; id++) n += raw_timer_delete(id) == 0;\n"
    "    burn(2.5);\n"
    "    printf(\"deleted %d\\n\", n > 0);\n"
    "    return 3;\n"
    "}\n";

TEST(timers_deleted_rearmed)
{
    const char *dir = build_in("timers.c", timers_c, "cc -O1 -o timers timers.c");
    run_out r;
    run_under(dir, "", "./timers",
              "CONTPROF_CPU_HZ=100 CONTPROF_CPU_ENGINE=timer CONTPROF_WINDOW=60s", &r);
    CHECK_EQ(r.rc, 3);
    CHECK_STREQ(r.out, "deleted 1\n");
    CHECK_EQ(r.err_lines, 1);
    CHECK_CONTAINS(r.err, "contprof: the program deleted the agent's CPU timers");
    int allocs;
    CHECK(comment_in_profiles(dir, "cpu_timers_rearmed=", &allocs));
    /* sampled on after the re-arm: 2.8 s of CPU, at least 0.8 s of it in the profile (the
     * first 0.3 s only, without the re-arm) */
    char odir[300];
    snprintf(odir, sizeof(odir), "%s/out", dir);
    pset s;
    pset_load(odir, &s);
    int64_t cpu_ns = sum_kind(&s, "cpu", NULL, NULL, 1);
    pset_free(&s);
    printf("CPU in the profiles: %.2f s\n", cpu_ns / 1e9);
    CHECK(cpu_ns >= 800000000);
    remove_dir();
}

TEST_MAIN(T(timers_deleted_rearmed), T(cgo_takes_signals), T(raw_sigaction_takes_signal),
          T(dlopen_then_sample), T(run_static), T(run_setuid_as_nobody), T(run_file_caps_as_nobody),
          T(run_go_without_cgo))
