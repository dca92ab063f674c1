/* Black-box tests of where the agent writes and when it says it cannot (issue: shared
 * output directory, ulimit -n): real programs (edges.c, `cpe`) under LD_PRELOAD with stdout
 * and stderr captured. The default directory is per user and checked before use; a planted
 * symbolic link, a directory of another user's or one others may write are refused with one
 * stderr line naming the path, and the program runs on. Every test works under its own
 * TMPDIR, never the machine's real default directory. */
#include <fcntl.h>
#include <stdint.h>
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

static char g_tmp[256];
static char g_out[1 << 16];

/* A fresh private TMPDIR for the test. */
static void tmp_make(void)
{
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/contprof-output-test-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_tmp);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(g_tmp, 0700) == 0);
}

static void tmp_remove(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
}

/* Runs sh -c script (or CPE with args when script is NULL) with the agent preloaded into it,
 * TMPDIR=g_tmp, XDG_RUNTIME_DIR and CONTPROF_* unset, then the variables of env; stdout and
 * stderr into g_out. Returns the wait status. */
static int run_agent(const char *script, const char *const *args, const char *const *env)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        extern char **environ;
        for (int again = 1; again;) { /* unsetenv shifts environ: start over after each */
            again = 0;
            for (char **e = environ; *e; e++)
                if (!strncmp(*e, "CONTPROF_", 9)) {
                    char name[128];
                    snprintf(name, sizeof(name), "%.*s", (int)(strcspn(*e, "=")), *e);
                    unsetenv(name);
                    again = 1;
                    break;
                }
        }
        unsetenv("XDG_RUNTIME_DIR");
        setenv("TMPDIR", g_tmp, 1);
        const char *lib = getenv("CP_TEST_LIB");
        setenv("LD_PRELOAD", lib ? lib : CP_LIB, 1);
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        char *argv[16];
        int n = 0;
        if (script) {
            argv[n++] = "/bin/sh";
            argv[n++] = "-c";
            argv[n++] = (char *)script;
        } else {
            argv[n++] = (char *)CPE;
            for (int i = 0; args[i] && n < 15; i++)
                argv[n++] = (char *)args[i];
        }
        argv[n] = NULL;
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    int st = cp_test_collect(fd[0], pid, g_out, sizeof(g_out));
    printf("--- output ---\n%s--------------\n", g_out);
    return st;
}

/* Files in dir (0 if it cannot be read). */
static int count_files(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "ls -A %s 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

/* The number of lines of out holding needle. */
static int count_lines(const char *out, const char *needle)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* cpe return 0.3 under the agent must exit 0 and print its CPU time (it ran). */
static void run_cpe_ok(const char *const *env)
{
    const char *args[] = {"return", "0.3", NULL};
    int st = run_agent(NULL, args, env);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strtod(g_out + strspn(g_out, "contprof:"), NULL) >= 0); /* printed something */
}

static void default_dir(char *out, size_t cap)
{
    snprintf(out, cap, "%s/contprof-%u", g_tmp, (unsigned)geteuid());
}

/* A normal run without a transport writes into ${TMPDIR}/contprof-EUID, made 0700. */
TEST(default_dir_is_per_user)
{
    tmp_make();
    run_cpe_ok(NULL);
    char dir[300];
    default_dir(dir, sizeof(dir));
    struct stat st;
    CHECK(lstat(dir, &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK_EQ(st.st_mode & 0777, 0700);
    CHECK_EQ(st.st_uid, geteuid());
    CHECK(!strstr(g_out, "contprof:"));
    pset s;
    pset_load(dir, &s);
    printf("%d files in %s\n", s.n, dir);
    CHECK(s.n >= 1);
    pset_free(&s);
    tmp_remove();
}

/* XDG_RUNTIME_DIR of ours (0700) is preferred: XDG_RUNTIME_DIR/contprof. One that is not
 * private is passed over for the TMPDIR default. */
TEST(default_dir_in_xdg_runtime_dir)
{
    tmp_make();
    char xdg[300], env[320], dir[320];
    snprintf(xdg, sizeof(xdg), "%s/run-user", g_tmp);
    CHECK(mkdir(xdg, 0700) == 0);
    snprintf(env, sizeof(env), "XDG_RUNTIME_DIR=%s", xdg);
    const char *e[] = {env, NULL};
    run_cpe_ok(e);
    snprintf(dir, sizeof(dir), "%s/contprof", xdg);
    CHECK(count_files(dir) >= 1);
    CHECK(chmod(xdg, 0755) == 0); /* not private: not used */
    run_cpe_ok(e);
    default_dir(dir, sizeof(dir));
    CHECK(count_files(dir) >= 1);
    tmp_remove();
}

/* Someone plants a symbolic link at the default path, to a directory of theirs: refused,
 * one line naming the path and the reason, nothing written through it, the program runs. */
TEST(planted_symlink_refused)
{
    tmp_make();
    char dir[300], victim[300];
    default_dir(dir, sizeof(dir));
    snprintf(victim, sizeof(victim), "%s/theirs", g_tmp);
    CHECK(mkdir(victim, 0777) == 0);
    CHECK(symlink(victim, dir) == 0);
    run_cpe_ok(NULL);
    CHECK_CONTAINS(g_out, dir);
    CHECK_CONTAINS(g_out, "symbolic link");
    CHECK_EQ(count_lines(g_out, "contprof:"), 1);
    CHECK_EQ(count_files(victim), 0);
    /* an explicit CONTPROF_OUTPUT_DIR that is a link is refused the same way */
    char env[400];
    snprintf(env, sizeof(env), "CONTPROF_OUTPUT_DIR=%s", dir);
    const char *e[] = {env, NULL};
    run_cpe_ok(e);
    CHECK_CONTAINS(g_out, "symbolic link");
    CHECK_EQ(count_files(victim), 0);
    tmp_remove();
}

/* The default path made first by another user (root chowns it to nobody here): refused. An
 * explicit directory of another user's: refused too. */
TEST(foreign_owner_refused)
{
    if (geteuid() != 0) {
        printf("skipped: needs root to chown\n");
        return;
    }
    tmp_make();
    char dir[300];
    default_dir(dir, sizeof(dir));
    CHECK(mkdir(dir, 0700) == 0);
    CHECK(chown(dir, 65534, 65534) == 0);
    run_cpe_ok(NULL);
    CHECK_CONTAINS(g_out, dir);
    CHECK_CONTAINS(g_out, "owned by uid 65534");
    CHECK_EQ(count_lines(g_out, "contprof:"), 1);
    CHECK_EQ(count_files(dir), 0);
    char other[300], env[400];
    snprintf(other, sizeof(other), "%s/other", g_tmp);
    CHECK(mkdir(other, 0755) == 0);
    CHECK(chown(other, 65534, 65534) == 0);
    snprintf(env, sizeof(env), "CONTPROF_OUTPUT_DIR=%s", other);
    const char *e[] = {env, NULL};
    run_cpe_ok(e);
    CHECK_CONTAINS(g_out, "owned by uid 65534");
    CHECK_EQ(count_files(other), 0);
    tmp_remove();
}

/* Writable by others: the default refused (a 0777 default path was not made by us); an
 * explicit one unless sticky (a shared /tmp-like directory is fine: files are made O_EXCL
 * and published without replacing). */
TEST(writable_by_others_refused)
{
    tmp_make();
    char dir[300];
    default_dir(dir, sizeof(dir));
    CHECK(mkdir(dir, 0700) == 0);
    CHECK(chmod(dir, 0777) == 0);
    run_cpe_ok(NULL);
    CHECK_CONTAINS(g_out, "writable by group or others");
    CHECK_EQ(count_files(dir), 0);
    char env[400];
    snprintf(env, sizeof(env), "CONTPROF_OUTPUT_DIR=%s", dir);
    const char *e[] = {env, NULL};
    run_cpe_ok(e);
    CHECK_CONTAINS(g_out, "not sticky");
    CHECK_EQ(count_files(dir), 0);
    CHECK(chmod(dir, 01777) == 0);
    run_cpe_ok(e);
    CHECK(!strstr(g_out, "contprof:"));
    CHECK(count_files(dir) >= 1);
    tmp_remove();
}

/* ulimit -n 8 (the agent's fds go above 4, fd.c): the profile is written. */
TEST(ulimit_8_gives_profile)
{
    tmp_make();
    char dir[300], env[400], script[600];
    snprintf(dir, sizeof(dir), "%s/out", g_tmp);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(env, sizeof(env), "CONTPROF_OUTPUT_DIR=%s", dir);
    snprintf(script, sizeof(script), "ulimit -n 8; exec %s return 0.3", CPE);
    const char *e[] = {env, NULL};
    int st = run_agent(script, NULL, e);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(!strstr(g_out, "contprof:"));
    pset s;
    pset_load(dir, &s);
    CHECK(s.n >= 1);
    pset_free(&s);
    tmp_remove();
}

/* ulimit -n 8 and a program that holds every fd left (python3 opens /dev/null until EMFILE,
 * then burns 0.5 s of CPU): no fd for the window's files, and the agent says so once,
 * naming the limit; the program's own output and exit are untouched. Before, nothing was
 * written and nothing said. */
TEST(ulimit_8_full_says_why)
{
    tmp_make();
    char dir[300], env[400], script[1200];
    snprintf(dir, sizeof(dir), "%s/out", g_tmp);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(env, sizeof(env), "CONTPROF_OUTPUT_DIR=%s", dir);
    snprintf(script, sizeof(script),
             "ulimit -n 8; exec /usr/bin/python3 -c '\n"
             "import os, time\n"
             "fs = []\n"
             "try:\n"
             "    while True: fs.append(os.open(\"/dev/null\", 0))\n"
             "except OSError: pass\n"
             "t = time.process_time()\n"
             "while time.process_time() - t < 0.5: pass\n"
             "print(\"held\", len(fs))\n"
             "'");
    const char *e[] = {env, NULL};
    int st = run_agent(script, NULL, e);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(g_out, "held ");
    int files = count_files(dir);
    printf("%d files\n", files);
    if (files == 0) {
        CHECK_CONTAINS(g_out, "Too many open files");
        CHECK_CONTAINS(g_out, "ulimit -n");
        CHECK_EQ(count_lines(g_out, "contprof:"), 1);
    }
    tmp_remove();
}

TEST_MAIN(T(default_dir_is_per_user), T(default_dir_in_xdg_runtime_dir), T(planted_symlink_refused),
          T(foreign_owner_refused), T(writable_by_others_refused), T(ulimit_8_gives_profile),
          T(ulimit_8_full_says_why))
