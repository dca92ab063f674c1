/* Helpers for black-box tests that run real processes: the build directory, a monotonic
 * clock, reading a log, starting programs with their output in a log (killed at exit if
 * still running, so a failed CHECK leaves nothing behind), waiting for their exit or a log
 * line with a deadline, and contprofd on a kernel-chosen port found by its log line. */
#ifndef CP_TEST_PROC_H
#define CP_TEST_PROC_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#ifndef SEC
#define SEC 1000000000LL
#endif

/* ---- basics -------------------------------------------------------------------------- */

/* The build directory (CP_BINARY_DIR, set by cp_add_tests), or "build". */
static inline const char *bindir(void)
{
    const char *b = getenv("CP_BINARY_DIR");
    return b ? b : "build";
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * SEC + ts.tv_nsec;
}

/* A loopback port nobody has bound now (the kernel's choice, released before returning: a
 * fixed or computed port may be any other socket's, e.g. an outgoing connection's). */
static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    socklen_t len = sizeof(a);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Reads at most len-1 bytes of path into out, NUL-terminated; "" if it cannot be opened. */
static inline void slurp(const char *path, char *out, size_t len)
{
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(out, 1, len - 1, f);
    out[n] = 0;
    fclose(f);
}

/* ---- programs ------------------------------------------------------------------------ */

/* Every process spawn() started, killed at exit if still running. */
static pid_t proc_children[8];
static int proc_nchildren;

static inline void proc_kill_children(void)
{
    for (int i = 0; i < proc_nchildren; i++)
        if (proc_children[i] > 0 && waitpid(proc_children[i], NULL, WNOHANG) == 0) {
            kill(proc_children[i], SIGKILL);
            waitpid(proc_children[i], NULL, 0);
        }
}

/* Starts argv (argv[0] a path, NULL-terminated) with stdout and stderr appended to log.
 * The child is killed at the test's exit if still running. */
static inline pid_t spawn(const char *const *argv, const char *log)
{
    fflush(NULL);
    if (!proc_nchildren) atexit(proc_kill_children);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid > 0 && proc_nchildren < 8) proc_children[proc_nchildren++] = pid;
    if (pid == 0) {
        FILE *f = freopen(log, "a", stdout);
        f = f ? freopen(log, "a", stderr) : NULL;
        (void)f;
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    return pid;
}

/* Waits at most timeout_s for pid; returns its exit status (128+signal if killed). A pid
 * still running then is killed and the test fails. */
static inline int wait_exit(pid_t pid, int timeout_s)
{
    int st = 0;
    for (int64_t end = mono_ns() + timeout_s * SEC; mono_ns() < end; usleep(20000))
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fprintf(stderr, "process %d did not exit within %d s\n", (int)pid, timeout_s);
    CHECK(0);
    return -1;
}

/* Forks with the child's stdout going into a pipe. Returns 0 in the child (the pipe's own
 * descriptors closed); in the parent the child's pid, with the read end in *rd, to be read
 * and the child reaped by cp_test_collect(). */
static inline pid_t fork_stdout_pipe(int *rd)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        return 0;
    }
    close(fd[1]);
    *rd = fd[0];
    return pid;
}

/* Runs fn(arg) in a forked child whose stdout and stderr go into out (cap bytes,
 * NUL-terminated); returns its wait status. For the checks that must kill a process. */
static inline int run_in_child(void (*fn)(void *), void *arg, char *out, size_t cap)
{
    int rd;
    pid_t pid = fork_stdout_pipe(&rd);
    if (pid == 0) {
        dup2(1, 2);
        fn(arg);
        _exit(0);
    }
    return cp_test_collect(rd, pid, out, cap);
}

/* That a child of run_in_child died of a failed check (model/check.h) in func. */
static inline void check_died_of_assert(int st, const char *out, const char *func)
{
    fprintf(stderr, "child said: %s", out);
    CHECK(WIFSIGNALED(st));
    CHECK_EQ(WTERMSIG(st), SIGABRT);
    CHECK_CONTAINS(out, "assertion failed: ");
    CHECK_CONTAINS(out, func);
}

/* Runs prog with args (after argv[0], NULL-terminated, at most 30) in directory cwd (NULL:
 * this one), with LD_PRELOAD removed from its environment and each "K=V" of env (may be
 * NULL) added; collects its stdout into out (cap bytes, NUL-terminated). Returns its wait
 * status; fails the test if the child cannot be collected. The strings of env must stay
 * valid until the child starts (putenv keeps them). */
static inline int run_capture(const char *prog, const char *const *args, const char *cwd,
                              const char *const *env, char *out, size_t cap)
{
    int rd;
    pid_t pid = fork_stdout_pipe(&rd);
    if (pid == 0) {
        if (cwd && chdir(cwd) != 0) _exit(126);
        unsetenv("LD_PRELOAD");
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)prog;
        for (int i = 0; args[i] && n < 31; i++)
            argv[n++] = (char *)args[i];
        argv[n] = NULL;
        execv(prog, argv);
        _exit(127);
    }
    int status = cp_test_collect(rd, pid, out, cap);
    CHECK(status != -1);
    return status;
}

/* Waits at most timeout_s for needle in log and returns the text after it (valid until the
 * next call). Fails the test if pid exits first or the time runs out. */
static inline const char *wait_for_log(pid_t pid, const char *log, const char *needle,
                                       int timeout_s)
{
    static char buf[1 << 16];
    for (int64_t end = mono_ns() + timeout_s * SEC; mono_ns() < end; usleep(20000)) {
        slurp(log, buf, sizeof buf);
        const char *m = strstr(buf, needle);
        if (m) return m + strlen(needle);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) break;
    }
    fprintf(stderr, "no \"%s\" in %s within %d s:\n%s\n", needle, log, timeout_s, buf);
    CHECK(0);
    return NULL;
}

/* ---- go tool pprof ------------------------------------------------------------------- */

/* Sums each value column of the samples `go tool pprof -raw FILES` prints into tot[0..max).
 * FILES goes on a shell command line as it is: quote paths; globs work. Returns the number
 * of columns; fails the test if go fails. */
static inline int pprof_raw_totals(const char *files, int64_t *tot, int max)
{
    char cmd[1200];
    CHECK((size_t)snprintf(cmd, sizeof cmd, "go tool pprof -raw %s 2>/dev/null", files) <
          sizeof cmd);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    static char line[1 << 16];
    int in_samples = 0, header = 0, ncols = 0, done = 0;
    memset(tot, 0, sizeof(int64_t) * (size_t)max);
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "Samples:", 8)) {
            in_samples = header = 1;
            continue;
        }
        if (!strncmp(line, "Locations", 9)) done = 1; /* read on: go must not see EPIPE */
        if (!in_samples || done) continue;
        if (header) {
            header = 0;
            continue;
        }
        char *colon = strchr(line, ':');
        if (!colon || strchr(line, '[')) continue;
        *colon = 0;
        int c = 0;
        char *save = NULL;
        for (char *t = strtok_r(line, " \t", &save); t && c < max; t = strtok_r(NULL, " \t", &save))
            tot[c++] += strtoll(t, NULL, 10);
        if (c > ncols) ncols = c;
    }
    CHECK(pclose(f) == 0);
    return ncols;
}

/* ---- contprofd ------------------------------------------------------------------------ */

#define PROC_QUERY_API "query API on http://127.0.0.1:"

/* In a child: execs contprofd of the build with args (NULL-terminated, at most 30); exits
 * 127 if it cannot. */
static inline _Noreturn void exec_contprofd(const char *const *args)
{
    char bin[512];
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    const char *argv[32] = {bin};
    int n = 1;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    execv(bin, (char **)argv);
    _exit(127);
}

typedef struct proc {
    pid_t pid;
    char log[600];
    int port;
} proc;

/* Starts contprofd with args (NULL-terminated), its stdout and stderr written to log, killed if the
 * test dies (PR_SET_PDEATHSIG); waits at most timeout_s for its port. Fails the test if it
 * exits or does not start in time. */
static inline void start_daemon_log(proc *p, const char *log, const char *const *args,
                                    int timeout_s)
{
    CHECK((size_t)snprintf(p->log, sizeof p->log, "%s", log) < sizeof p->log);
    unlink(p->log);
    fflush(NULL);
    p->pid = fork();
    CHECK(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed CHECK leaves no daemon behind */
        FILE *f = freopen(p->log, "w", stderr);
        if (f) dup2(2, 1);
        exec_contprofd(args);
    }
    static char buf[65536];
    for (int64_t end = mono_ns() + timeout_s * SEC; mono_ns() < end; usleep(20000)) {
        slurp(p->log, buf, sizeof buf);
        const char *m = strstr(buf, PROC_QUERY_API);
        if (m) {
            p->port = atoi(m + strlen(PROC_QUERY_API));
            return;
        }
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            fprintf(stderr, "contprofd exited early:\n%s\n", buf);
            CHECK(0);
        }
    }
    fprintf(stderr, "contprofd did not start within %d s:\n%s\n", timeout_s, buf);
    CHECK(0);
}

/* start_daemon_log() with the log dir/contprofd-PID.log and 6 s to start. */
static inline void start_daemon(proc *p, const char *dir, const char *const *args)
{
    char log[600];
    snprintf(log, sizeof log, "%s/contprofd-%d.log", dir, (int)getpid());
    start_daemon_log(p, log, args, 6);
}

/* Sends sig to the daemon and waits at most timeout_s for it; returns its exit status
 * (128+signal if killed). Fails the test if it does not stop in time. */
static inline int stop_daemon_within(proc *p, int sig, int timeout_s)
{
    kill(p->pid, sig);
    int st = 0;
    for (int64_t end = mono_ns() + timeout_s * SEC; mono_ns() < end; usleep(10000))
        if (waitpid(p->pid, &st, WNOHANG) == p->pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    fprintf(stderr, "contprofd did not stop within %d s\n", timeout_s);
    CHECK(0);
    return -1;
}

/* stop_daemon_within() 10 s. */
static inline int stop_daemon(proc *p, int sig)
{
    return stop_daemon_within(p, sig, 10);
}

/* contprofd on DIR/data at 127.0.0.1:port (0: the kernel's choice), its log DIR/contprofd-N.log,
 * with the configuration file conf (NULL: none); a restart on the same port retries while the
 * old listener's port is not free yet. */
static inline void start_daemon_data(proc *p, const char *dir, int port, int n, const char *conf)
{
    char data[512], log[600], http[64];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/contprofd-%d.log", dir, n);
    snprintf(http, sizeof http, "127.0.0.1:%d", port);
    const char *args[] = {"--data", data, "--http", http, conf ? "--config" : NULL, conf, NULL};
    for (int t = 0;; t++) {
        start_daemon_log(p, log, args, 30);
        if (!port || p->port == port) return;
        CHECK(t < 3);
    }
}

/* ---- files and commands -------------------------------------------------------------- */

/* Runs cmd with the shell; fails the test, naming it, unless it exits 0. */
static inline void proc_sh(const char *cmd)
{
    int st = system(cmd);
    if (st != 0) fprintf(stderr, "command failed (%d): %s\n", st, cmd);
    CHECK(st == 0);
}

/* A new directory /tmp/cp-TAG-WHAT-XXXXXX; malloc'd, the caller frees the name. */
static inline char *proc_tmpdir(const char *tag, const char *what)
{
    char *d = malloc(256);
    CHECK(d);
    snprintf(d, 256, "/tmp/cp-%s-%s-XXXXXX", tag, what);
    CHECK(mkdtemp(d));
    return d;
}

/* ---- HTTP (for tests that include http_client.h before this header) ----------------- */

#ifdef CP_HTTP_CLIENT_H
/* GET pq from url with token (NULL for none) and timeout_ms to answer; the body is
 * NUL-terminated (not counted in len). Any status is returned; a transport error fails the
 * test. The caller frees r.body. */
static inline cp_http_result http_get_from(const char *url, const char *pq, const char *token,
                                           int timeout_ms)
{
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_get(url, pq, token, timeout_ms, 0, &r, &err);
    if (rc) fprintf(stderr, "GET %s: %s\n", pq, err.msg);
    CHECK(rc == 0);
    return r;
}

/* Fails the test, printing the answer, unless r (the answer to GET pq) is a 200. */
static inline void http_expect_200(const char *pq, const cp_http_result *r)
{
    if (r->status != 200)
        fprintf(stderr, "GET %s: %d %.*s\n", pq, r->status, (int)r->body.len, (char *)r->body.data);
    CHECK_EQ(r->status, 200);
}

/* http_get_from() http://127.0.0.1:port with 30 s to answer. */
static inline cp_http_result http_get(int port, const char *pq, const char *token)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    return http_get_from(url, pq, token, 30000);
}

/* http_get() that must answer 200; returns the body, which the caller frees. */
static inline cp_buf http_get_ok(int port, const char *pq, const char *token)
{
    cp_http_result r = http_get(port, pq, token);
    http_expect_200(pq, &r);
    return r.body;
}

/* The value of one /metrics line ("name{labels}" exactly) of the daemon on port, or -1
 * when absent. */
static inline long long http_metric(int port, const char *name, const char *token)
{
    cp_buf b = http_get_ok(port, "/metrics", token);
    char key[256];
    CHECK((size_t)snprintf(key, sizeof key, "\n%s ", name) < sizeof key);
    const char *m = strstr((char *)b.data, key);
    long long v = m ? strtoll(m + strlen(key), NULL, 10) : -1;
    cp_buf_close(&b);
    return v;
}
#endif

#endif
