/* Query benchmarks: a store holding 7 days of 10 s windows of one realistic service (60,480
 * windows, ~2,000 distinct stacks of depth 10-60, 1,000 samples each), then
 *   - the merged profile of the whole 7 days (store call, and over HTTP as gzip'd pprof),
 *   - unaligned 24 h and 1 h windows over HTTP,
 *   - `go tool pprof -proto` merging the first N of the same windows from files, linearly
 *     extrapolated to 7 days (pprof's merge is linear in its input), and the ratio,
 *   - wrk with 64 connections on mixed queries: errors, p50, p99.
 * Prints rows "name | value | floor | ok". */
#include <signal.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "fixture.h"
#include "http_client.h"
#include "http.h"
#include "pprof.h"
#include "render.h"
#include "store.h"
#include "synth.h"
#include "report.h"
#include "clock.h"

#define S(x) ((int64_t)(x)*1000000000LL)
static const int64_t T0 = 1763596800; /* 2025-11-20T00:00:00Z */
static int g_fail;

static void row(const char *name, double v, const char *unit, const char *cmp, double floor)
{
    if (cp_bench_row(44, 12, name, v, unit, cmp, floor)) g_fail = 1;
}

static void die(const char *what, const cp_err *err)
{
    fprintf(stderr, "bench_query: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* ---- the store ---------------------------------------------------------------------- */

static cp_profile *window(cp_synth *sy, int w)
{
    return cp_synth_cpu_window(sy, 1000, S(T0 + 10LL * w), S(10));
}

static void build_store(const char *dir, int nwin)
{
    char marker[1100];
    snprintf(marker, sizeof marker, "%s/bench-complete-%d", dir, nwin);
    struct stat st;
    if (stat(marker, &st) == 0) {
        fprintf(stderr, "bench_query: reusing the store in %s\n", dir);
        return;
    }
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) die("rm", NULL);
    cp_store_options so = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&so, &s, &err)) die("store open", &err);
    cp_store_batch *b = cp_store_batch_create(s);
    cp_synth *sy = cp_synth_create(1, 2000);
    double t0 = now_s(), tgen = 0;
    for (int w = 0; w < nwin; w++) {
        double g0 = now_s();
        cp_profile *p = window(sy, w);
        tgen += now_s() - g0;
        cp_envelope e = {0};
        e.tenant = "default";
        e.kind = CP_KIND_CPU;
        e.window_start_ns = S(T0 + 10LL * w);
        e.window_duration_ns = S(10);
        e.producer_id = "bench";
        e.sequence = (uint64_t)w + 1;
        cp_labels_set(&e.labels, "service", "checkout");
        cp_labels_set(&e.labels, "instance", "host-1");
        cp_labels_set(&e.labels, "version", w < nwin / 2 ? "1.4.0" : "1.5.0");
        if (cp_store_batch_add(b, &e, p, 0, &err)) die("batch add", &err);
        cp_labels_close(&e.labels);
        cp_profile_destroy(p);
        if ((w + 1) % 500 == 0 || w + 1 == nwin) {
            if (cp_store_batch_commit(b, &err)) die("commit", &err);
            if ((w + 1) % 10000 == 0) fprintf(stderr, "bench_query: %d windows stored\n", w + 1);
        }
    }
    double dt = now_s() - t0;
    cp_store_batch_destroy(b);
    cp_store_close(s);
    cp_synth_destroy(sy);
    row("build: windows stored per second (incl. synth)", nwin / dt, "/s", NULL, 0);
    row("build: of which synthesizing windows", tgen, "s", NULL, 0);
    FILE *f = fopen(marker, "w");
    if (f) fclose(f);
}

/* ---- the server: the query tests' fixture (tests/query/fixture.h) ------------------- */

static void serve(qfx *v, cp_store *s, uint32_t concurrency)
{
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.concurrency = concurrency;
    ho.max_queued = 1024;
    v->store = s;
    qfx_serve_with(v, NULL, &ho);
}

/* Times one GET; checks 200 and returns seconds; *bytes gets the body size. */
static double timed_get(const qfx *v, const char *pq, size_t *bytes, cp_buf *keep)
{
    cp_http_result r;
    cp_err err = {0};
    double t0 = now_s();
    if (cp_http_get(v->url, pq, NULL, 120000, 0, &r, &err)) die(pq, &err);
    double dt = now_s() - t0;
    if (r.status != 200) {
        fprintf(stderr, "bench_query: %s -> %d %.*s\n", pq, r.status, (int)r.body.len,
                (char *)r.body.data);
        exit(1);
    }
    if (bytes) *bytes = r.body.len;
    if (keep) {
        cp_buf_close(keep);
        *keep = r.body;
    } else {
        cp_buf_close(&r.body);
    }
    return dt;
}

/* ---- go tool pprof ------------------------------------------------------------------ */

static double go_merge(const char *dir, int n, int64_t *go_total)
{
    char wdir[1100];
    snprintf(wdir, sizeof wdir, "%s/go-windows-%d", dir, n);
    mkdir(wdir, 0755);
    cp_synth *sy = cp_synth_create(1, 2000);
    cp_buf b = {0};
    for (int w = 0; w < n; w++) {
        cp_profile *p = window(sy, w);
        b.len = 0;
        if (cp_pprof_encode(p, 6, &b)) die("encode", NULL);
        char f[1200];
        snprintf(f, sizeof f, "%s/w%05d.pb.gz", wdir, w);
        if (cp_write_file(f, b.data, b.len, NULL)) die("write window", NULL);
        cp_profile_destroy(p);
    }
    cp_buf_close(&b);
    cp_synth_destroy(sy);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && GOCACHE=/tmp/cpq-gocache HOME=${HOME:-/tmp} go tool pprof -proto "
             "w*.pb.gz > ../go-merged-%d.pb.gz 2>/dev/null",
             wdir, n);
    double t0 = now_s();
    if (system(cmd) != 0) die("go tool pprof -proto (is golang-go installed?)", NULL);
    double dt = now_s() - t0;
    char out[1200];
    snprintf(out, sizeof out, "%s/go-merged-%d.pb.gz", dir, n);
    cp_buf in = {0};
    cp_profile *m = NULL;
    if (cp_read_file(out, &in, NULL) || cp_pprof_decode(in.data, in.len, NULL, &m, NULL))
        die("reading go's merged profile", NULL);
    *go_total = cp_profile_total(m, 0);
    cp_profile_destroy(m);
    cp_buf_close(&in);
    return dt;
}

/* ---- wrk ---------------------------------------------------------------------------- */

static double parse_ms(const char *s)
{
    double v = atof(s);
    if (strstr(s, "us") == s + strspn(s, "0123456789.")) return v / 1000;
    if (s[strspn(s, "0123456789.")] == 's') return v * 1000;
    if (s[strspn(s, "0123456789.")] == 'm' && s[strspn(s, "0123456789.") + 1] == 's') return v;
    if (s[strspn(s, "0123456789.")] == 'm') return v * 60000;
    return v;
}

static void run_wrk(const char *dir, const qfx *v, int seconds)
{
    char lua[1100];
    snprintf(lua, sizeof lua, "%s/mixed.lua", dir);
    FILE *f = fopen(lua, "w");
    if (!f) die("lua script", NULL);
    long long d = 86400, t = T0;
    fprintf(f, "local paths = {\n");
    for (int i = 0; i < 7; i++) {
        long long a = t + i * 77777 % (6 * d), h = 3600;
        fprintf(f, "  '/api/v1/profile?type=cpu&from=%lld&to=%lld&format=json',\n", a, a + h);
        fprintf(f, "  '/api/v1/profile?from=%lld&to=%lld&format=top&max_nodes=30',\n", a + 13,
                a + d);
        fprintf(f, "  '/api/v1/profile?from=%lld&to=%lld&format=folded',\n", a + 7, a + 6 * h);
        fprintf(f,
                "  '/api/v1/profile?select=%%7Bservice%%3D%%22checkout%%22%%7D&from=%lld&to=%lld"
                "&format=pprof',\n",
                a, a + 15 * 60);
        fprintf(f, "  '/api/v1/timeline?from=%lld&to=%lld',\n", a, a + d);
        fprintf(f,
                "  '/api/v1/diff?from=%lld&to=%lld&base_from=%lld&base_to=%lld&max_nodes=2000',\n",
                a + h, a + 2 * h, a, a + h);
        fprintf(f, "  '/api/v1/series',\n  '/api/v1/labels/version/values',\n");
    }
    fprintf(f, "  '/api/v1/profile?from=%lld&to=%lld&format=pprof',\n", t, t + 7 * d);
    fprintf(f, "}\nlocal i = 0\nrequest = function()\n  i = i + 1\n"
               "  return wrk.format('GET', paths[(i %% #paths) + 1])\nend\n");
    fclose(f);
    char cmd[4096], out[1100];
    snprintf(out, sizeof out, "%s/wrk.out", dir);
    snprintf(cmd, sizeof cmd, "wrk -t2 -c64 -d%ds --timeout 30s --latency -s '%s' '%s' > '%s' 2>&1",
             seconds, lua, v->url, out);
    /* wrk's exit status is not its verdict: judge by what it reports (read below) */
    int wst = system(cmd);
    FILE *o = fopen(out, "r");
    char line[512];
    double p50 = -1, p99 = -1, rps = 0;
    long non2xx = 0, sock = 0, total = 0;
    while (o && fgets(line, sizeof line, o)) {
        char *s = line + strspn(line, " \t");
        if (strncmp(s, "50%", 3) == 0) p50 = parse_ms(s + 3 + strspn(s + 3, " \t"));
        if (strncmp(s, "99%", 3) == 0) p99 = parse_ms(s + 3 + strspn(s + 3, " \t"));
        if (strncmp(s, "Requests/sec:", 13) == 0) rps = atof(s + 13);
        if (strncmp(s, "Non-2xx or 3xx responses:", 25) == 0) non2xx = atol(s + 25);
        if (strncmp(s, "Socket errors:", 14) == 0) {
            long a = 0, b = 0, c = 0, e = 0;
            sscanf(s, "Socket errors: connect %ld, read %ld, write %ld, timeout %ld", &a, &b, &c,
                   &e);
            sock = a + b + c + e;
        }
        char *r = strstr(s, " requests in ");
        if (r) total = atol(s);
    }
    if (o) fclose(o);
    row("wrk 64 conns mixed: requests", (double)total, "", NULL, 0);
    row("wrk 64 conns mixed: requests per second", rps, "/s", NULL, 0);
    row("wrk 64 conns mixed: errors (non-2xx + socket)", (double)(non2xx + sock), "", "==", 0);
    row("wrk 64 conns mixed: latency p50", p50, "ms", NULL, 0);
    row("wrk 64 conns mixed: latency p99", p99, "ms", NULL, 0);
    if (p50 < 0 || total == 0) {
        fflush(stdout);
        fprintf(stderr,
                "bench_query: wrk (exit status %d) reported no requests; its output is in %s\n",
                wst, out);
        g_fail = 1;
    }
}

/* The whole range (7 d at the default --windows) in one store call, 7 times: checks the
 * total against what build_store wrote. */
static void bench_store_call(cp_store *s, const cp_query *week, int nwin)
{
    cp_err err = {0};
    double ts[7];
    int64_t total7 = 0;
    for (int i = 0; i < 7; i++) {
        cp_profile *p = NULL;
        double t0 = now_s();
        if (cp_store_query(s, week, &p, &err)) die("store query", &err);
        ts[i] = now_s() - t0;
        total7 = cp_profile_total(p, 0);
        cp_profile_destroy(p);
    }
    double first = ts[0];
    row("7 d merged, store call: first", first * 1000, "ms", NULL, 0);
    row("7 d merged, store call: median of 7", median(ts, 7) * 1000, "ms", "<=", 50);
    if (total7 != (int64_t)nwin * 1000) {
        fprintf(stderr, "bench_query: 7 d total %lld, want %lld\n", (long long)total7,
                (long long)nwin * 1000);
        g_fail = 1;
    }
}

/* The renderers alone, on the 7 d profile. */
static void bench_renderers(cp_store *s, const cp_query *week)
{
    cp_err err = {0};
    double ts[7];
    cp_profile *p = NULL;
    if (cp_store_query(s, week, &p, &err)) die("store query", &err);
    const char *names[] = {"render json tree, 20,000 nodes", "render folded", "render top",
                           "encode pprof (gzip level 1)"};
    for (int r = 0; r < 4; r++) {
        size_t len = 0;
        for (int i = 0; i < 7; i++) {
            cp_buf b = {0};
            double t0 = now_s();
            int rc =
                r == 0 ? cp_render_tree_json(p, 1, NULL, 0, &(cp_render_tree_opts){20000, NULL}, &b)
                : r == 1 ? cp_render_folded(p, 1, &b)
                : r == 2 ? cp_render_top(p, 1, 0, &b)
                         : cp_pprof_encode(p, 1, &b);
            ts[i] = now_s() - t0;
            if (rc) die(names[r], NULL);
            len = b.len;
            cp_buf_close(&b);
        }
        char name[96];
        snprintf(name, sizeof name, "7 d: %s (%zu kB): median", names[r], len / 1024);
        row(name, median(ts, 7) * 1000, "ms", NULL, 0);
    }
    cp_profile_destroy(p);
}

/* Queries over HTTP (the server v answers from the store): 7 d merged as pprof and as the
 * JSON tree, unaligned 24 h and 1 h windows. Returns the 7 d pprof median (s). */
static double bench_http(qfx *v, int64_t span)
{
    double ts[7];
    char pq[512];
    size_t bytes = 0;
    snprintf(pq, sizeof pq, "/api/v1/profile?type=cpu&from=%lld&to=%lld&format=pprof",
             (long long)T0, (long long)(T0 + span));
    for (int i = 0; i < 7; i++)
        ts[i] = timed_get(v, pq, &bytes, NULL);
    double ours7 = median(ts, 7);
    row("7 d merged, HTTP gzip'd pprof: median of 7", ours7 * 1000, "ms", "<=", 50);
    row("7 d merged, HTTP gzip'd pprof: bytes", (double)bytes, "B", NULL, 0);
    snprintf(pq, sizeof pq, "/api/v1/profile?type=cpu&from=%lld&to=%lld&format=json", (long long)T0,
             (long long)(T0 + span));
    for (int i = 0; i < 7; i++)
        ts[i] = timed_get(v, pq, &bytes, NULL);
    row("7 d merged, HTTP json tree: median of 7", median(ts, 7) * 1000, "ms", NULL, 0);

    /* Unaligned 24 h windows. */
    double t24[10], worst = 0;
    int n24 = 0;
    for (int i = 0; i < 10 && span > 86400 + 1000; i++) {
        int64_t a = T0 + 1237 + (int64_t)i * ((span - 86400 - 2000) / 10) + i * 37;
        snprintf(pq, sizeof pq, "/api/v1/profile?type=cpu&from=%lld&to=%lld&format=pprof",
                 (long long)a, (long long)(a + 86400));
        t24[n24] = timed_get(v, pq, NULL, NULL);
        if (t24[n24] > worst) worst = t24[n24];
        n24++;
    }
    if (n24) {
        row("unaligned 24 h, HTTP gzip'd pprof: median of 10", median(t24, n24) * 1000, "ms", NULL,
            0);
        row("unaligned 24 h, HTTP gzip'd pprof: worst of 10", worst * 1000, "ms", "<=", 100);
    }

    /* Unaligned 1 h windows (the UI's default range), pprof and the UI's JSON tree. */
    for (int f = 0; f < 2 && span > 3600 + 2000; f++) {
        double t1[20];
        for (int i = 0; i < 20; i++) {
            int64_t a = T0 + 1237 + (int64_t)i * ((span - 3600 - 2000) / 20) + i * 37;
            snprintf(pq, sizeof pq, "/api/v1/profile?type=cpu&from=%lld&to=%lld&format=%s",
                     (long long)a, (long long)(a + 3600), f ? "json" : "pprof");
            t1[i] = timed_get(v, pq, NULL, NULL);
        }
        row(f ? "unaligned 1 h, HTTP json tree: median of 20"
              : "unaligned 1 h, HTTP gzip'd pprof: median of 20",
            median(t1, 20) * 1000, "ms", NULL, 0);
    }

    return ours7;
}

/* go tool pprof -proto merging the first go_n windows, against ours over the whole range
 * (ours7, s); the totals must agree. */
static void bench_go(const char *dir, int go_n, cp_store *s, const cp_query *week, int nwin,
                     double ours7)
{
    cp_err err = {0};
    int64_t gt = 0;
    double g = go_merge(dir, go_n, &gt);
    /* Same windows through us, for a like-for-like check of the totals. */
    cp_profile *p = NULL;
    cp_query head = *week; /* the windows go merges */
    head.to_ns = S(T0 + 10LL * go_n);
    if (cp_store_query(s, &head, &p, &err)) die("store query", &err);
    if (cp_profile_total(p, 0) != gt) {
        fprintf(stderr, "bench_query: go's merge of %d windows has %lld samples, ours %lld\n", go_n,
                (long long)gt, (long long)cp_profile_total(p, 0));
        g_fail = 1;
    }
    cp_profile_destroy(p);
    char name[96];
    snprintf(name, sizeof name, "go tool pprof -proto, %d windows (measured)", go_n);
    row(name, g, "s", NULL, 0);
    double g7 = g * (double)nwin / go_n;
    row("go tool pprof -proto, 7 d (extrapolated)", g7, "s", NULL, 0);
    row("speed-up vs go tool pprof over 7 d", g7 / ours7, "x", ">=", 1000);
}

/* ---- main --------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    /* the HTTP server runs in this process, as in contprofd, which ignores SIGPIPE too: a
     * client (wrk) closing a connection mid-answer must not kill the benchmark */
    signal(SIGPIPE, SIG_IGN);
    const char *dir = "/tmp/contprof-bench-query";
    int nwin = 60480, go_n = 360, wrk_s = 30;
    static const struct option opts[] = {{"dir", required_argument, 0, 'd'},
                                         {"windows", required_argument, 0, 'w'},
                                         {"go-windows", required_argument, 0, 'g'},
                                         {"wrk-seconds", required_argument, 0, 'k'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            dir = optarg;
            break;
        case 'w':
            nwin = atoi(optarg);
            break;
        case 'g':
            go_n = atoi(optarg);
            break;
        case 'k':
            wrk_s = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: bench_query [--dir DIR] [--windows N] [--go-windows N (0 = "
                            "skip)] [--wrk-seconds S (0 = skip)]\n");
            return 2;
        }
    }
    setenv("UV_THREADPOOL_SIZE", "4", 0);
    char sdir[1024];
    snprintf(sdir, sizeof sdir, "%s/store", dir);
    mkdir(dir, 0755);
    build_store(sdir, nwin);

    cp_store_options so = {.path = sdir};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&so, &s, &err)) die("store open", &err);
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    row("store: bytes on disk per window", (double)st.disk_bytes / nwin, "B", NULL, 0);

    int64_t span = 10LL * nwin;
    cp_query week = {.tenant = "default", .kind = CP_KIND_CPU}; /* every series */
    week.from_ns = S(T0);
    week.to_ns = S(T0 + span);
    bench_store_call(s, &week, nwin);
    bench_renderers(s, &week);

    qfx v = {0};
    serve(&v, s, 4);
    double ours7 = bench_http(&v, span);
    if (go_n > 0) bench_go(dir, go_n, s, &week, nwin, ours7);
    if (wrk_s > 0) run_wrk(dir, &v, wrk_s);
    qfx_unserve(&v);
    cp_store_close(s);
    return g_fail;
}
