/* Real programs nobody here wrote, under the agent, must work as without it: Debian's
 * redis-server (its zmalloc writes up to malloc_usable_size and reallocs: issue 24) with
 * every allocation sampled and at the default rate, the data read back checked against
 * values computed here; and a part of CPython's own test suite, whose pass/fail set must be
 * the same with every allocation sampled. Each TEST is its own ctest process. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"
#include "test.h"

#define PRELOAD "LD_PRELOAD=" CP_LIB
#define REDIS_SERVER "/usr/bin/redis-server"
#define REDIS_BENCHMARK "/usr/bin/redis-benchmark"

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/contprof-hosts-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(g_dir, 0755) == 0);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* Files in g_dir whose names contain part. */
static int count_files(const char *part)
{
    int n = 0;
    DIR *d = opendir(g_dir);
    CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

/* Starts argv with stdout and stderr appended to log and each "K=V" of env added (env
 * may be NULL), LD_PRELOAD and CONTPROF_ALLOC_RATE removed first. Killed at the test's
 * exit if still running (proc.h). */
static pid_t spawn_env(const char *const *argv, const char *const *env, const char *log)
{
    fflush(NULL);
    if (!proc_nchildren) atexit(proc_kill_children);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid > 0 && proc_nchildren < 8) proc_children[proc_nchildren++] = pid;
    if (pid == 0) {
        unsetenv("LD_PRELOAD");
        unsetenv("CONTPROF_ALLOC_RATE");
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        FILE *f = freopen(log, "a", stdout);
        f = f ? freopen(log, "a", stderr) : NULL;
        (void)f;
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    return pid;
}

/* ------------------------------------------------------------------------------------
 * A tiny RESP client: pipelined commands, replies parsed into one buffer */

typedef struct conn {
    int fd;
    char in[1 << 16];
    size_t lo, hi;
    char *out;
    size_t nout, capout;
} conn;

static int try_connect(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(s >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 30}; /* a server that stops answering fails the test */
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return s;
}

static void out_put(conn *c, const void *p, size_t n)
{
    if (c->nout + n > c->capout) {
        c->capout = (c->nout + n) * 2;
        c->out = realloc(c->out, c->capout);
        CHECK(c->out != NULL);
    }
    memcpy(c->out + c->nout, p, n);
    c->nout += n;
}

/* Queues one command of argc arguments (lengths in lens). */
static void cmd(conn *c, int argc, const char *const *argv, const size_t *lens)
{
    char h[32];
    out_put(c, h, (size_t)snprintf(h, sizeof h, "*%d\r\n", argc));
    for (int i = 0; i < argc; i++) {
        out_put(c, h, (size_t)snprintf(h, sizeof h, "$%zu\r\n", lens[i]));
        out_put(c, argv[i], lens[i]);
        out_put(c, "\r\n", 2);
    }
}

static void cmd2(conn *c, const char *a, const char *b)
{
    const char *v[] = {a, b};
    size_t l[] = {strlen(a), strlen(b)};
    cmd(c, 2, v, l);
}

static void cmd3(conn *c, const char *a, const char *b, const char *x, size_t xlen)
{
    const char *v[] = {a, b, x};
    size_t l[] = {strlen(a), strlen(b), xlen};
    cmd(c, 3, v, l);
}

static void flush_out(conn *c)
{
    for (size_t off = 0; off < c->nout;) {
        ssize_t k = write(c->fd, c->out + off, c->nout - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) fprintf(stderr, "write to redis: %s\n", strerror(errno));
        CHECK(k > 0);
        off += (size_t)k;
    }
    c->nout = 0;
}

static const char *g_server_log; /* shown when the server stops answering */

static int getbyte(conn *c)
{
    if (c->lo == c->hi) {
        ssize_t k;
        do
            k = read(c->fd, c->in, sizeof c->in);
        while (k < 0 && errno == EINTR);
        if (k <= 0) {
            fprintf(stderr, "redis closed the connection or stopped answering (%s)\n",
                    k < 0 ? strerror(errno) : "EOF");
            static char log[1 << 16];
            if (g_server_log) slurp(g_server_log, log, sizeof log);
            /* redis's crash report, from its start, or else the log's last lines */
            char *at = strstr(log, "BUG REPORT START");
            if (at)
                at[at + 2000 - log < (long)sizeof log ? 2000 : 0] = 0;
            else
                at = log + (strlen(log) > 2000 ? strlen(log) - 2000 : 0);
            fprintf(stderr, "its log says:\n%s\n", at);
            CHECK(0);
        }
        c->lo = 0;
        c->hi = (size_t)k;
    }
    return (unsigned char)c->in[c->lo++];
}

/* One line of a reply, without its CRLF, into line (cap bytes). */
static void getline_(conn *c, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        int b = getbyte(c);
        if (b == '\r') {
            CHECK(getbyte(c) == '\n');
            break;
        }
        if (n + 1 < cap) line[n++] = (char)b;
    }
    line[n] = 0;
}

/* Reads one reply. A bulk string goes into *val (malloc'ed, *len bytes; NULL for a nil);
 * an integer into *len; a simple string into *val; an error fails the test. Returns the
 * reply's type byte. Arrays are not used here. */
static int reply(conn *c, char **val, long long *len)
{
    char line[256];
    int t = getbyte(c);
    getline_(c, line, sizeof line);
    *val = NULL;
    *len = 0;
    switch (t) {
    case '+':
        *val = strdup(line);
        break;
    case ':':
        *len = atoll(line);
        break;
    case '$': {
        long long n = atoll(line);
        *len = n;
        if (n < 0) break;
        *val = malloc((size_t)n + 1);
        CHECK(*val != NULL);
        for (long long i = 0; i < n; i++)
            (*val)[i] = (char)getbyte(c);
        (*val)[n] = 0;
        CHECK(getbyte(c) == '\r' && getbyte(c) == '\n');
        break;
    }
    case '-':
        fprintf(stderr, "redis error: %s\n", line);
        CHECK(0);
        break;
    default:
        fprintf(stderr, "unexpected reply type %c\n", t);
        CHECK(0);
    }
    return t;
}

/* ------------------------------------------------------------------------------------
 * redis-server under the agent */

typedef struct redis {
    pid_t pid;
    int port;
    char log[300];
    conn c;
} redis;

/* Starts redis-server on a free loopback port, under the agent at rate (NULL: the
 * default), or without it (agent 0); connects. */
static void redis_start(redis *r, int agent, const char *rate)
{
    if (access(REDIS_SERVER, X_OK) != 0) {
        fprintf(stderr, REDIS_SERVER " is missing: sh .ci/deps installs redis-server\n");
        CHECK(0);
    }
    make_dir();
    char port[16], dirarg[300];
    static char outdir[320];
    snprintf(outdir, sizeof outdir, "CONTPROF_OUTPUT_DIR=%s", g_dir);
    snprintf(dirarg, sizeof dirarg, "%s", g_dir);
    snprintf(r->log, sizeof r->log, "%s/redis.log", g_dir);
    g_server_log = r->log;
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = free_port();
        snprintf(port, sizeof port, "%d", r->port);
        const char *argv[] = {REDIS_SERVER, "--port",      port,   "--bind",
                              "127.0.0.1",  "--save",      "",     "--appendonly",
                              "no",         "--dir",       dirarg, "--protected-mode",
                              "no",         "--daemonize", "no",   NULL};
        const char *env[] = {PRELOAD, outdir, rate, NULL};
        r->pid = spawn_env(argv, agent ? env : NULL, r->log);
        for (int64_t end = mono_ns() + 20 * SEC; mono_ns() < end; usleep(20000)) {
            int st;
            if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
                r->pid = 0;
                break; /* the port was taken meanwhile: another one */
            }
            int fd = try_connect(r->port);
            if (fd < 0) continue;
            memset(&r->c, 0, sizeof r->c);
            r->c.fd = fd;
            cmd(&r->c, 1, (const char *[]){"PING"}, (size_t[]){4});
            flush_out(&r->c);
            char *v;
            long long n;
            reply(&r->c, &v, &n);
            CHECK(v && !strcmp(v, "PONG"));
            free(v);
            return;
        }
        if (r->pid) break;
    }
    char buf[4096];
    slurp(r->log, buf, sizeof buf);
    fprintf(stderr, "redis-server did not answer:\n%s\n", buf);
    CHECK(0);
}

/* The server is still alive and answering, then shuts down cleanly (exit 0). */
static void redis_stop(redis *r, int agent)
{
    cmd(&r->c, 1, (const char *[]){"PING"}, (size_t[]){4});
    flush_out(&r->c);
    char *v;
    long long n;
    reply(&r->c, &v, &n);
    CHECK(v && !strcmp(v, "PONG"));
    free(v);
    cmd2(&r->c, "SHUTDOWN", "NOSAVE");
    flush_out(&r->c);
    int st = wait_exit(r->pid, 30);
    close(r->c.fd);
    free(r->c.out);
    if (st != 0) {
        char buf[1 << 14];
        slurp(r->log, buf, sizeof buf);
        fprintf(stderr, "redis-server exited with %d:\n%s\n", st, buf);
    }
    CHECK_EQ(st, 0);
    if (agent) CHECK(count_files(".alloc.") > 0); /* the agent ran in it */
    remove_dir();
}

#define NKEYS 200
#define NAPPENDS 60000

/* The i-th APPEND: its key and its piece (1..400 bytes, known from i alone). */
static size_t piece(unsigned i, char *buf)
{
    size_t n = 1 + (i * 2654435761u >> 7) % 400;
    for (size_t k = 0; k < n; k++)
        buf[k] = (char)('a' + (i * 31 + k * 7) % 26);
    return n;
}

/* 60,000 APPENDs over 200 keys (redis grows each string with sdsMakeRoomFor: realloc to
 * about twice, writing up to malloc_usable_size), then every key read back and compared
 * with the concatenation computed here. */
static void appends(redis *r)
{
    char *want[NKEYS];
    size_t wlen[NKEYS] = {0}, wcap[NKEYS];
    for (int k = 0; k < NKEYS; k++) {
        wcap[k] = 1024;
        want[k] = malloc(wcap[k]);
    }
    char key[32], buf[512];
    cmd2(&r->c, "FLUSHALL", "SYNC");
    flush_out(&r->c);
    char *v;
    long long n;
    reply(&r->c, &v, &n);
    free(v);
    static size_t lens[1000]; /* what each APPEND of a batch must answer */
    for (unsigned i = 0; i < NAPPENDS; i += 1000) {
        for (unsigned j = i; j < i + 1000; j++) {
            unsigned k = (j * 7919u) % NKEYS;
            size_t len = piece(j, buf);
            snprintf(key, sizeof key, "key:%u", k);
            cmd3(&r->c, "APPEND", key, buf, len);
            while (wlen[k] + len > wcap[k])
                want[k] = realloc(want[k], wcap[k] *= 2);
            memcpy(want[k] + wlen[k], buf, len);
            wlen[k] += len;
            lens[j - i] = wlen[k];
        }
        flush_out(&r->c);
        for (unsigned j = i; j < i + 1000; j++) {
            reply(&r->c, &v, &n);
            CHECK_EQ(n, lens[j - i]);
        }
    }
    int wrong = 0;
    for (int k = 0; k < NKEYS; k++) {
        snprintf(key, sizeof key, "key:%d", k);
        cmd2(&r->c, "GET", key);
    }
    flush_out(&r->c);
    for (int k = 0; k < NKEYS; k++) {
        reply(&r->c, &v, &n);
        if (!v || (size_t)n != wlen[k] || memcmp(v, want[k], wlen[k]) != 0) {
            if (wrong < 5) {
                size_t at = 0;
                while (v && at < wlen[k] && at < (size_t)n && v[at] == want[k][at])
                    at++;
                fprintf(stderr, "key:%d: %lld bytes read, %zu written, first difference at %zu\n",
                        k, n, wlen[k], at);
            }
            wrong++;
        }
        free(v);
        free(want[k]);
    }
    printf("%d appends over %d keys: %d keys read back wrong\n", NAPPENDS, NKEYS, wrong);
    CHECK_EQ(wrong, 0);
}

#define NLISTS 50
#define NLISTOPS 100000

/* The i-th element pushed: a number (listpack's integer encoding) or 1..300 letters. */
static size_t elem(unsigned i, char *buf)
{
    if (i % 5 == 0) return (size_t)snprintf(buf, 32, "%u", i * 2654435761u);
    size_t n = 1 + (i * 40503u >> 3) % 300;
    for (size_t k = 0; k < n; k++)
        buf[k] = (char)('A' + (i + k * 13) % 26);
    return n;
}

/* RPUSH and LPOP interleaved over 50 lists (listpacks grow and shrink by realloc), every
 * pop compared with a model of the queues kept here; then every list drained the same way. */
static void lists(redis *r)
{
    static unsigned q[NLISTS][NLISTOPS];
    unsigned head[NLISTS] = {0}, tail[NLISTS] = {0};
    static unsigned expect[1000]; /* per command of a batch: an element, or a length */
    static int is_pop[1000];
    char key[32], buf[512];
    long bad = 0, pops = 0;
    for (unsigned i = 0; i < NLISTOPS; i += 1000) {
        for (unsigned j = i; j < i + 1000; j++) {
            unsigned l = (j * 7u) % NLISTS;
            snprintf(key, sizeof key, "list:%u", l);
            is_pop[j - i] = j % 3 == 2;
            if (is_pop[j - i]) {
                cmd2(&r->c, "LPOP", key);
                expect[j - i] = head[l] < tail[l] ? q[l][head[l]++] : UINT32_MAX;
            } else {
                size_t len = elem(j, buf);
                cmd3(&r->c, "RPUSH", key, buf, len);
                q[l][tail[l]++] = j;
                expect[j - i] = tail[l] - head[l];
            }
        }
        flush_out(&r->c);
        for (unsigned j = i; j < i + 1000; j++) {
            char *v;
            long long n;
            reply(&r->c, &v, &n);
            if (is_pop[j - i]) {
                pops++;
                size_t len = expect[j - i] == UINT32_MAX ? 0 : elem(expect[j - i], buf);
                if (expect[j - i] == UINT32_MAX ? v != NULL
                                                : !v || (size_t)n != len || memcmp(v, buf, len))
                    bad++;
            } else if ((unsigned)n != expect[j - i])
                bad++;
            free(v);
        }
    }
    for (unsigned l = 0; l < NLISTS; l++) {
        snprintf(key, sizeof key, "list:%u", l);
        for (unsigned h = head[l]; h < tail[l]; h++)
            cmd2(&r->c, "LPOP", key);
        flush_out(&r->c);
        for (; head[l] < tail[l]; head[l]++) {
            char *v;
            long long n;
            reply(&r->c, &v, &n);
            size_t len = elem(q[l][head[l]], buf);
            pops++;
            bad += !v || (size_t)n != len || memcmp(v, buf, len) != 0;
            free(v);
        }
    }
    printf("%d list operations over %d lists, %ld pops: %ld wrong\n", NLISTOPS, NLISTS, pops, bad);
    CHECK_EQ(bad, 0);
}

/* redis-benchmark's LPUSH/LPOP load, pipelined (it once left redis dead on an assertion in
 * listpack.c under the agent). */
static void benchmark(redis *r)
{
    char port[16], log[320];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(log, sizeof log, "%s/benchmark.log", g_dir);
    const char *argv[] = {
        REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", port, "-n", "100000", "-P", "16", "-t",
        "lpush,lpop",    "-q", NULL};
    pid_t pid = spawn_env(argv, NULL, log);
    int st = wait_exit(pid, 60);
    char buf[4096];
    slurp(log, buf, sizeof buf);
    printf("redis-benchmark: %s", buf);
    CHECK_EQ(st, 0);
}

static void redis_case(int agent, const char *rate)
{
    redis r;
    redis_start(&r, agent, rate);
    lists(&r);
    benchmark(&r);
    appends(&r);
    redis_stop(&r, agent);
}

/* The workloads' own check: they pass without the agent. */
TEST(redis_native)
{
    redis_case(0, NULL);
}

TEST(redis_rate_1)
{
    redis_case(1, "CONTPROF_ALLOC_RATE=1");
}

TEST(redis_default_rate)
{
    redis_case(1, NULL);
}

/* Eight times the default's samples, with the interior blocks' reserve not yet exhausted
 * by the server's long-lived blocks (at rate 1 it is, and most samples are memalign'd). */
TEST(redis_rate_64k)
{
    redis_case(1, "CONTPROF_ALLOC_RATE=65536");
}

/* ------------------------------------------------------------------------------------
 * CPython's own test suite with every allocation sampled: pysuite.py runs 56 modules of it
 * (about 12,000 test cases) without the agent and under it at the same time, and compares
 * each test case's outcome. About 25 s of CPU natively, 75-100 s under the agent. */

TEST(python_suite_rate_1)
{
    if (access("/usr/lib/python3.11/test/test_json/__init__.py", R_OK) != 0) {
        fprintf(stderr, "CPython's test suite is missing: sh .ci/deps installs "
                        "libpython3.11-testsuite\n");
        CHECK(0);
    }
    make_dir();
    const char *src = getenv("CP_SOURCE_DIR");
    char script[512];
    snprintf(script, sizeof script, "%s/tests/collector/pysuite.py", src ? src : ".");
    /* every allocation sampled (and its Python stack walked), CPU at 1 kHz */
    const char *args[] = {script, CP_LIB, g_dir, "CONTPROF_ALLOC_RATE=1", "CONTPROF_CPU_HZ=1000",
                          NULL};
    static char out[1 << 16];
    int st = run_capture("/usr/bin/python3", args, NULL, NULL, out, sizeof out);
    printf("%s", out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "pysuite.py: status %d\n", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(out, "\n0 test cases differ");
    remove_dir();
}

TEST_MAIN(T(redis_native), T(redis_rate_1), T(redis_default_rate), T(redis_rate_64k),
          T(python_suite_rate_1))
