/* Black-box helpers for tests that run the real contprofd: start it on a kernel-chosen
 * port (found by its log line), stop it by signal. Shared by daemon_test.c and cli_test.c. */
#ifndef CP_TEST_QUERY_DAEMON_H
#define CP_TEST_QUERY_DAEMON_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

typedef struct proc {
    pid_t pid;
    char log[256];
    int port;
} proc;

static inline const char *bindir(void)
{
    const char *b = getenv("CP_BINARY_DIR");
    return b ? b : "build";
}

static inline void slurp(const char *path, char *out, size_t len)
{
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(out, 1, len - 1, f);
    out[n] = 0;
    fclose(f);
}

/* Starts contprofd with args (NULL-terminated), stderr to a log; waits for its port. */
static inline void start_daemon(proc *p, const char *dir, const char *const *args)
{
    snprintf(p->log, sizeof p->log, "%s/contprofd-%d.log", dir, (int)getpid());
    unlink(p->log);
    char bin[512];
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    p->pid = fork();
    CHECK(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed CHECK leaves no daemon behind */
        FILE *f = freopen(p->log, "w", stderr);
        (void)f;
        const char *argv[32] = {bin};
        int n = 1;
        for (; args[n - 1] && n < 31; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        execv(bin, (char **)argv);
        _exit(127);
    }
    char buf[8192];
    for (int i = 0; i < 300; i++) {
        slurp(p->log, buf, sizeof buf);
        const char *m = strstr(buf, "query API on http://127.0.0.1:");
        if (m) {
            p->port = atoi(m + strlen("query API on http://127.0.0.1:"));
            return;
        }
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            fprintf(stderr, "contprofd exited early:\n%s\n", buf);
            CHECK(0);
        }
        usleep(20000);
    }
    fprintf(stderr, "contprofd did not start:\n%s\n", buf);
    CHECK(0);
}

static inline int stop_daemon(proc *p, int sig)
{
    kill(p->pid, sig);
    int st = 0;
    for (int i = 0; i < 1000; i++) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    CHECK(!"contprofd did not stop within 10 s");
    return -1;
}

#endif
