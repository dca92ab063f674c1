/* `contprof run`: options become CONTPROF_* variables and LD_PRELOAD, --server asks a
 * (fake) contprofd for its brokers, and the program really runs under the agent. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd_run.h"
#include "fake_contprofd.h"
#include "proc.h"
#include "test.h"

/* Runs cp_cmd_run(argv) in a child with stdout captured into out. Returns the status. */
static int run_cmd(char **argv, char *out, size_t cap)
{
    int rd;
    pid_t pid = fork_stdout_pipe(&rd);
    if (pid == 0) {
        int argc = 0;
        while (argv[argc])
            argc++;
        _exit(cp_cmd_run(argc, argv));
    }
    int st = cp_test_collect(rd, pid, out, cap);
    CHECK(st != -1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(run_output_dir)
{
    char dir[128];
    snprintf(dir, sizeof(dir), "/tmp/contprof-run-%d", (int)getpid());
    char *argv[] = {"run",    "--output-dir", dir,   "--service", "runsvc", "--label",
                    "team=x", "--cpu-hz",     "250", "--window",  "500ms",  "--",
                    CPW,      "solo",         "0.3", NULL};
    char out[4096];
    CHECK_EQ(run_cmd(argv, out, sizeof(out)), 0);
    CHECK(atof(out) >= 0.3);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int cpu = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strncmp(e->d_name, "runsvc.", 7) && strstr(e->d_name, ".cpu.cpw.pb.gz")) cpu++;
        if (e->d_name[0] != '.') {
            char p[512];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
    printf("%d cpu profiles from `contprof run`\n", cpu);
    CHECK(cpu >= 1);
}

TEST(run_server_env)
{
    fake_contprofd f;
    fake_contprofd_start(&f, "127.0.0.1:1");
    setenv("CONTPROF_FLUSH", "100ms", 1);
    char *argv[] = {"run",           "--server", f.url,          "--tenant", "acme",
                    "--no-children", "--",       "/usr/bin/env", NULL};
    char out[65536];
    CHECK_EQ(run_cmd(argv, out, sizeof(out)), 0);
    fake_contprofd_stop(&f);
    CHECK_CONTAINS(f.last_req, "GET /api/v1/brokers HTTP/1.1");
    CHECK_CONTAINS(out, "CONTPROF_BROKERS=127.0.0.1:1\n");
    CHECK_CONTAINS(out, "CONTPROF_SERVER=http://127.0.0.1:");
    CHECK_CONTAINS(out, "CONTPROF_TENANT=acme\n");
    CHECK_CONTAINS(out, "CONTPROF_CHILDREN=0\n");
    /* --no-children: the agent took itself out of LD_PRELOAD before env ran */
    CHECK(strstr(out, "libcontprof") == NULL);
}

/* --token goes to the agent as CONTPROF_TOKEN and is sent when asking for the brokers. */
TEST(run_token)
{
    fake_contprofd f;
    fake_contprofd_start(&f, "127.0.0.1:1");
    char *argv[] = {"run",           "--server", f.url,          "--token", "tok-12345678",
                    "--no-children", "--",       "/usr/bin/env", NULL};
    char out[65536];
    CHECK_EQ(run_cmd(argv, out, sizeof(out)), 0);
    fake_contprofd_stop(&f);
    CHECK_CONTAINS(f.last_req, "\r\nAuthorization: Bearer tok-12345678\r\n");
    CHECK_CONTAINS(out, "CONTPROF_TOKEN=tok-12345678\n");
}

TEST(run_usage)
{
    char out[256];
    char *a1[] = {"run", "--bogus", "x", "--", "true", NULL};
    CHECK_EQ(run_cmd(a1, out, sizeof(out)), 2);
    char *a2[] = {"run", "--service", NULL};
    CHECK_EQ(run_cmd(a2, out, sizeof(out)), 2);
    char *a3[] = {"run", "--", "/nonexistent/program", NULL};
    CHECK_EQ(run_cmd(a3, out, sizeof(out)), 127);
}

/* --window reads the CLI's one duration grammar (a bare number is seconds) and hands the
 * agent milliseconds. */
TEST(run_window_grammar)
{
    char dir[128];
    snprintf(dir, sizeof(dir), "/tmp/contprof-runw-%d", (int)getpid());
    char *argv[] = {"run", "--output-dir", dir, "--no-children", "--window", "2",
                    "--",  "/usr/bin/env", NULL};
    char out[65536];
    CHECK_EQ(run_cmd(argv, out, sizeof(out)), 0);
    CHECK_CONTAINS(out, "CONTPROF_WINDOW=2000ms\n");
    char *bad[] = {"run", "--window", "5x", "--", "true", NULL};
    CHECK_EQ(run_cmd(bad, out, sizeof(out)), 2); /* the message goes to stderr */
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN(T(run_output_dir), T(run_server_env), T(run_token), T(run_usage), T(run_window_grammar))
