/* contprofd under hostile clients, measured on the real daemon over loopback:
 *   - the p99 latency of /api/v1/series from one client while 4 others run the slowest
 *     queries allowed in a loop (a focus regex at the filters' budget, cut at query.timeout,
 *     and the JSON tree of a ~50 MB profile at the largest max_nodes);
 *   - the memory contprofd holds while 50 clients with a 1 KiB receive buffer ask for a
 *     ~50 MB answer and never read, against the configured output budget; then how long
 *     until the write timeout has closed them.
 * Prints rows "name | value | floor | ok". */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "http_client.h"
#include "http.h"
#include "store.h"
#include "synth.h"
#include "report.h"

#define S(x) ((int64_t)(x)*1000000000LL)
static const int64_t T0 = 1764000000;
static int g_fail;
static int g_port;
static pid_t g_pid;

static void row(const char *name, double v, const char *unit, const char *cmp, double floor)
{
    if (cp_bench_row(60, 14, name, v, unit, cmp, floor)) g_fail = 1;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_hostile: %s\n", what);
    if (g_pid > 0) kill(g_pid, SIGKILL);
    exit(1);
}

static int64_t ms_now(void)
{
    return cp_mono_ns() / 1000000;
}

/* ---- the store and the daemon ------------------------------------------------------- */

/* One window of service "big" whose folded answer is about 50 MB, and one of "api". */
static void build_store(const char *dir, uint32_t nstacks, uint32_t nsamples)
{
    char marker[1200];
    snprintf(marker, sizeof marker, "%s/bench-complete-%u-%u", dir, nstacks, nsamples);
    struct stat st;
    if (stat(marker, &st) == 0) return;
    cp_store_options so = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&so, &s, &err)) die(err.msg);
    cp_store_batch *b = cp_store_batch_create(s);
    const char *svc[2] = {"big", "api"};
    for (int i = 0; i < 2; i++) {
        cp_synth *sy = cp_synth_create(11 + (uint64_t)i, i == 0 ? nstacks : 2000);
        cp_profile *p = cp_synth_cpu_window(sy, i == 0 ? nsamples : 1000, S(T0), S(10));
        cp_envelope e = {0};
        e.tenant = (char *)"default";
        e.kind = CP_KIND_CPU;
        e.window_start_ns = S(T0);
        e.window_duration_ns = S(10);
        e.producer_id = (char *)"bench";
        e.sequence = (uint64_t)i + 1;
        if (!p || cp_labels_set(&e.labels, "service", svc[i]) ||
            cp_store_batch_add(b, &e, p, 0, &err) || cp_store_batch_commit(b, &err))
            die(err.msg[0] ? err.msg : "building the store");
        cp_labels_close(&e.labels);
        cp_profile_destroy(p);
        cp_synth_destroy(sy);
    }
    cp_store_batch_destroy(b);
    cp_store_close(s);
    FILE *f = fopen(marker, "w");
    if (f) fclose(f);
}

static size_t rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static void start_daemon(const char *bin, const char *conf, const char *log)
{
    unlink(log); /* the port is read from it: not a previous run's */
    g_pid = fork();
    if (g_pid < 0) die("fork");
    if (g_pid == 0) {
        if (!freopen(log, "w", stderr)) _exit(127);
        execl(bin, bin, "--config", conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1500; i++) {
        char buf[8192] = "";
        FILE *f = fopen(log, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = 0;
            fclose(f);
        }
        const char *m = strstr(buf, "query API on http://127.0.0.1:");
        if (m) {
            g_port = atoi(m + strlen("query API on http://127.0.0.1:"));
            return;
        }
        int st;
        if (waitpid(g_pid, &st, WNOHANG) == g_pid) {
            fprintf(stderr, "%s\n", buf);
            die("contprofd exited early");
        }
        usleep(20000);
    }
    die("contprofd did not start");
}

static cp_http_result get(const char *pq, int64_t timeout_ms)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", g_port);
    cp_http_result r;
    cp_err err = {0};
    if (cp_http_get(url, pq, NULL, timeout_ms, 0, &r, &err)) {
        fprintf(stderr, "GET %s: %s\n", pq, err.msg);
        memset(&r, 0, sizeof r);
    }
    return r;
}

/* ---- cheap requests beside the slowest ones ----------------------------------------- */

#define BIG "from=1764000000&to=1764000010&select=%7Bservice%3D%22big%22%7D"
static atomic_int g_stop;
static atomic_long g_heavy_done, g_heavy_503;

static void *heavy_loop(void *arg)
{
    long k = (long)(intptr_t)arg;
    /* These clients stand for other machines: on this one they must not take the CPU from
     * the server they load, nor from the client being measured. */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
    char re[256] = "";
    for (int i = 0; i < 8; i++)
        strcat(re, ".%7B0,60%7D");
    char slow_focus[512], big_json[256];
    snprintf(slow_focus, sizeof slow_focus, "/api/v1/profile?%s&format=folded&focus=%sQ", BIG, re);
    snprintf(big_json, sizeof big_json, "/api/v1/profile?%s&format=json&max_nodes=0", BIG);
    while (!atomic_load(&g_stop)) {
        cp_http_result r = get(k % 2 ? big_json : slow_focus, 120000);
        atomic_fetch_add(&g_heavy_done, 1);
        if (r.status == 503) atomic_fetch_add(&g_heavy_503, 1);
        cp_buf_close(&r.body);
        k++;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Latencies of /api/v1/series, one request every 20 ms for seconds; sorted. */
static double *series_latencies(int seconds, int *count, int *errors)
{
    int cap = 100000, n = 0;
    double *lat = malloc(sizeof *lat * (size_t)cap);
    if (!lat) die("out of memory");
    *errors = 0;
    int64_t end = ms_now() + seconds * 1000LL;
    while (ms_now() < end && n < cap) {
        int64_t t0 = cp_mono_ns();
        cp_http_result r = get("/api/v1/series", 60000);
        lat[n++] = (double)(cp_mono_ns() - t0) / 1e6;
        if (r.status != 200) (*errors)++;
        cp_buf_close(&r.body);
        usleep(20000);
    }
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    *count = n;
    return lat;
}

static void series_beside_heavy(int seconds)
{
    /* The baseline, in the same run: the same client against an idle server. */
    int bn, berr;
    double *base = series_latencies(seconds / 2 > 5 ? seconds / 2 : 5, &bn, &berr);
    row("series, idle server (baseline): p50", base[bn / 2], "ms", NULL, 0);
    row("series, idle server (baseline): p99", base[(bn * 99) / 100], "ms", NULL, 0);
    free(base);
    enum { NH = 4 };
    pthread_t th[NH];
    cp_http_result probe = get("/api/v1/profile?" BIG "&format=top", 60000);
    if (probe.status != 200 || probe.body.len < 1000) die("the big profile is missing");
    cp_buf_close(&probe.body);
    for (long i = 0; i < NH; i++)
        pthread_create(&th[i], NULL, heavy_loop, (void *)(intptr_t)i);
    usleep(500000); /* the four are running */
    int n, errors;
    double *lat = series_latencies(seconds, &n, &errors);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < NH; i++)
        pthread_join(th[i], NULL);
    double load[3] = {0};
    if (getloadavg(load, 3) > 0)
        row("machine load average (1 min) during the run", load[0], "", NULL, 0);
    row("series beside 4 slowest queries: requests", n, "", NULL, 0);
    row("series beside 4 slowest queries: errors", errors, "", "<=", 0);
    row("series beside 4 slowest queries: p50", lat[n / 2], "ms", NULL, 0);
    row("series beside 4 slowest queries: p99", lat[(n * 99) / 100], "ms", "<=", 50);
    row("series beside 4 slowest queries: max", lat[n - 1], "ms", NULL, 0);
    row("slowest queries completed by the 4 clients", (double)atomic_load(&g_heavy_done), "", NULL,
        0);
    row("  of which 503 (query.timeout or output budget)", (double)atomic_load(&g_heavy_503), "",
        NULL, 0);
    free(lat);
}

/* ---- clients that do not read ------------------------------------------------------- */

static int dial(int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) die("connect");
    return fd;
}

static int is_open(int fd)
{
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) == 0 && ti.tcpi_state == TCP_ESTABLISHED;
}

static void non_reading_clients(size_t budget, int write_timeout_s)
{
    /* Warm up: one answer read whole (its size), then the memory at rest. */
    cp_http_result r = get("/api/v1/profile?" BIG "&format=folded", 120000);
    size_t answer = r.body.len;
    if (r.status != 200 || answer < (1u << 20)) die("the big answer failed or is empty");
    cp_buf_close(&r.body);
    sleep(1);
    size_t base = rss_of(g_pid);
    enum { N = 50 };
    int fds[N];
    const char *req = "GET /api/v1/profile?" BIG "&format=folded HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < N; i++) {
        fds[i] = dial(1024);
        if (send(fds[i], req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) die("send");
    }
    size_t peak = base;
    int answered = 0;
    char head[16];
    int64_t t0 = ms_now();
    /* Until every client has the start of an answer, and 5 s more while they hold it. */
    int64_t until = 0;
    while (ms_now() - t0 < 300000) {
        size_t m = rss_of(g_pid);
        if (m > peak) peak = m;
        answered = 0;
        for (int i = 0; i < N; i++)
            answered += recv(fds[i], head, 12, MSG_PEEK | MSG_DONTWAIT) >= 12;
        if (answered == N && !until) until = ms_now() + 5000;
        if (until && ms_now() >= until) break;
        usleep(20000);
    }
    int ok = 0, busy = 0, held[N] = {0};
    for (int i = 0; i < N; i++) {
        ssize_t n = recv(fds[i], head, 12, MSG_PEEK | MSG_DONTWAIT);
        if (n == 12 && !memcmp(head, "HTTP/1.1 200", 12)) held[i] = 1, ok++;
        if (n == 12 && !memcmp(head, "HTTP/1.1 503", 12)) busy++;
    }
    double mib = 1024.0 * 1024.0;
    row("non-reading clients: answer size", (double)answer / mib, "MiB", NULL, 0);
    row("non-reading clients: contprofd RSS at rest", (double)base / mib, "MiB", NULL, 0);
    row("non-reading clients: answered 200 (held) / 50", ok, "", NULL, 0);
    row("non-reading clients: answered 503 Retry-After / 50", busy, "", NULL, 0);
    row("non-reading clients: output budget (http.output_budget)", (double)budget / mib, "MiB",
        NULL, 0);
    row("non-reading clients: memory held (peak RSS - at rest)", (double)(peak - base) / mib, "MiB",
        "<=", (double)budget / mib + 64);
    int64_t t1 = ms_now();
    int open = N;
    while (open && ms_now() - t1 < 120000) {
        open = 0;
        for (int i = 0; i < N; i++)
            open += held[i] && is_open(fds[i]);
        usleep(100000);
    }
    row("non-reading clients: s until the write timeout closed all held",
        (double)(ms_now() - t1) / 1000, "s", "<=", write_timeout_s + 10);
    row("non-reading clients: RSS after they were closed", (double)rss_of(g_pid) / mib, "MiB", NULL,
        0);
    for (int i = 0; i < N; i++)
        close(fds[i]);
}

int main(int argc, char **argv)
{
    const char *dir = "/tmp/contprof-bench-hostile";
    const char *bin = NULL;
    int seconds = 30;
    uint32_t nstacks = 11000, nsamples = 220000;
    static const struct option lo[] = {{"dir", 1, 0, 'd'},     {"contprofd", 1, 0, 'b'},
                                       {"seconds", 1, 0, 's'}, {"stacks", 1, 0, 'k'},
                                       {"samples", 1, 0, 'n'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 'd')
            dir = optarg;
        else if (c == 'b')
            bin = optarg;
        else if (c == 's')
            seconds = atoi(optarg);
        else if (c == 'k')
            nstacks = (uint32_t)atoi(optarg);
        else if (c == 'n')
            nsamples = (uint32_t)atoi(optarg);
        else
            return 2;
    }
    if (!bin) die("--contprofd PATH is required");
    signal(SIGPIPE, SIG_IGN);
    char store[1100], conf[1100], log[1100];
    mkdir(dir, 0755);
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(conf, sizeof conf, "%s/contprofd.conf", dir);
    snprintf(log, sizeof log, "%s/contprofd.log", dir);
    build_store(store, nstacks, nsamples);
    size_t budget = 128u << 20;
    int write_timeout = 10;
    FILE *f = fopen(conf, "w");
    if (!f) die("cannot write the config");
    fprintf(f,
            "listen = 127.0.0.1:0\ndata = %s\nbrokers = 127.0.0.1:9\n"
            "retention.raw = 0\nretention.rollup = 0\n" /* the windows are from 2025 */
            "query.concurrency = 4\nquery.timeout = 10s\nhttp.output_budget = %zu\n"
            "http.write_timeout = %ds\n",
            store, budget, write_timeout);
    fclose(f);
    start_daemon(bin, conf, log);
    series_beside_heavy(seconds);
    non_reading_clients(budget, write_timeout);
    kill(g_pid, SIGTERM);
    int st;
    waitpid(g_pid, &st, 0);
    return g_fail;
}
