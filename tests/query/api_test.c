/* The query API end to end: a real on-disk store filled through the store's writer API,
 * the real HTTP server on 127.0.0.1, requests from the real client. Every endpoint, format
 * and error; inuse semantics; diffs; tokens and tenants; pprof read back by the model and
 * by `go tool pprof` with totals equal to the sum of the windows. */
#include <stdarg.h>
#include <sys/stat.h>

#include "fanout.h"
#include "fixture.h"
#include "merge.h"
#include "pprof.h"
#include "qtest.h"

#define S(x) ((int64_t)(x)*1000000000LL)
static const int64_t T0 = 1764000000; /* an hour boundary, in seconds */

/* Percent-encodes s into a rotating static buffer (for building paths in tests). */
static const char *enc(const char *s)
{
    static char bufs[8][2048];
    static int k;
    char *b = bufs[k++ & 7];
    cp_buf tmp = {0};
    CHECK(cp_url_encode(&tmp, s) == 0);
    snprintf(b, 2048, "%.*s", (int)tmp.len, (const char *)tmp.data);
    cp_buf_close(&tmp);
    return b;
}

static cp_http_result getf(qfx *f, const char *token, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cp_http_result getf(qfx *f, const char *token, const char *fmt, ...)
{
    char pq[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pq, sizeof pq, fmt, ap);
    va_end(ap);
    return qfx_get(f, pq, token);
}

static const char *body(cp_http_result *r)
{
    return (const char *)r->body.data;
}

static void expect_error(qfx *f, int status, const char *needle, const char *pq)
{
    cp_http_result r = qfx_get(f, pq, NULL);
    if (r.status != status) fprintf(stderr, "%s -> %d %s\n", pq, r.status, body(&r));
    CHECK_EQ(r.status, status);
    CHECK_STREQ(r.content_type, "application/json");
    CHECK(strncmp(body(&r), "{\"error\":\"", 10) == 0);
    CHECK_CONTAINS(body(&r), needle);
    cp_buf_close(&r.body);
}

/* cpu windows for service api: 360 windows (1 h) from T0, each with main;a;b 1..3 and
 * main;c 5 samples; version 1 for the first half hour and 2 after. */
static int64_t fill_cpu(qfx *f, const char *tenant, int nwin)
{
    int64_t total = 0;
    for (int w = 0; w < nwin; w++) {
        cp_profile *p = qt_cpu_profile();
        int64_t x = 1 + w % 3;
        qt_add(p, "main;a;b", x, x * 10000000);
        qt_add(p, "main;c", 5, 50000000);
        if (w >= nwin / 2) qt_add(p, "main;d;slow", 7, 70000000);
        p->time_nanos = S(T0 + 10 * w);
        p->duration_nanos = S(10);
        total += cp_profile_total(p, 0);
        qfx_add(f, tenant, CP_KIND_CPU,
                w < nwin / 2 ? "service=api,version=1,instance=i1"
                             : "service=api,version=2,instance=i1",
                S(T0 + 10 * w), p);
        cp_profile_destroy(p);
    }
    qfx_commit(f);
    return total;
}

static cp_profile *decode(cp_http_result *r)
{
    cp_profile *p = NULL;
    cp_err err = {0};
    int rc = cp_pprof_decode(r->body.data, r->body.len, NULL, &p, &err);
    if (rc) fprintf(stderr, "decode: %s\n", err.msg);
    CHECK(rc == 0);
    return p;
}

/* The sums of each value column as `go tool pprof -raw` sees them ("a b"). */
static void go_pprof_sums(const char *file, char *out, size_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "GOCACHE=/tmp/cpq-gocache HOME=${HOME:-/tmp} go tool pprof -raw '%s' 2>/dev/null | "
             "awk '/^Samples:/ {s=1; next} /^Locations/ {s=0} "
             "s && /^ *-?[0-9]+( +-?[0-9]+)*:/ { sub(/:.*/, \"\"); for (i = 1; i <= NF; i++) "
             "t[i] += $i; n = NF } END { for (i = 1; i <= n; i++) printf \"%%s%%.0f\", (i > 1 ? "
             "\" \" : \"\"), t[i]; print \"\" }'",
             file);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    out[0] = 0;
    if (!fgets(out, (int)len, p)) out[0] = 0;
    pclose(p);
    size_t n = strlen(out);
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
}

TEST(profile_formats)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    int64_t total = fill_cpu(&f, "default", 360);
    qfx_serve(&f, NULL, 2);
    const char *sel = enc("{service=\"api\"}");

    /* pprof: decodes, carries the window and the inputs' types and period. */
    cp_http_result r = getf(&f, NULL, "/api/v1/profile?type=cpu&select=%s&from=%lld&to=%lld", sel,
                            (long long)T0, (long long)T0 + 3600);
    CHECK_EQ(r.status, 200);
    CHECK(cp_is_gzip(r.body.data, r.body.len));
    cp_profile *p = decode(&r);
    CHECK_EQ(cp_profile_total(p, 0), total);
    CHECK_EQ(p->time_nanos, S(T0));
    CHECK_EQ(p->duration_nanos, S(3600));
    CHECK_EQ(p->period, 10000000);
    CHECK_EQ(p->sample_types.n, 2);
    CHECK_STREQ(cp_profile_str(p, p->sample_types.v[1].type), "cpu");
    CHECK_STREQ(cp_profile_str(p, p->sample_types.v[1].unit), "nanoseconds");
    cp_profile_destroy(p);

    /* go tool pprof reads it, with the same totals. */
    char file[200], sums[128], want[128];
    snprintf(file, sizeof file, "%s/cpu.pb.gz", f.dir);
    CHECK(cp_write_file(file, r.body.data, r.body.len, NULL) == 0);
    go_pprof_sums(file, sums, sizeof sums);
    snprintf(want, sizeof want, "%lld %lld", (long long)total, (long long)total * 10000000);
    CHECK_STREQ(sums, want);
    cp_buf_close(&r.body);

    /* An unaligned sub-window: exactly the windows starting in [from, to). */
    r = getf(&f, NULL,
             "/api/v1/profile?select=%s&from=%lld&to=%lld&format=folded&sample_type=samples", sel,
             (long long)T0 + 15, (long long)T0 + 45);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(r.content_type, "text/plain; charset=utf-8");
    /* windows at +20 (x=3) and +30 (x=1), +40 (x=2) */
    CHECK_STREQ(body(&r), "main;a;b 6\nmain;c 15\n");
    cp_buf_close(&r.body);

    r = getf(&f, NULL, "/api/v1/profile?from=%lld&to=%lld&format=top", (long long)T0,
             (long long)T0 + 3600);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r), "Type: cpu\n");
    CHECK_CONTAINS(body(&r), "      flat  flat%   sum%        cum   cum%\n");
    CHECK_CONTAINS(body(&r), "  slow\n");
    cp_buf_close(&r.body);

    r = getf(&f, NULL, "/api/v1/profile?from=%lld&to=%lld&format=json&sample_type=samples",
             (long long)T0, (long long)T0 + 3600);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(r.content_type, "application/json");
    char tot[64];
    snprintf(tot, sizeof tot, "\"total\":%lld,", (long long)total);
    CHECK_CONTAINS(body(&r), tot);
    CHECK_CONTAINS(body(&r), "\"type\":\"cpu\",\"from\":\"2025-11-24T16:00:00.000Z\"");
    CHECK_CONTAINS(body(&r), "{\"name\":\"c\",\"self\":1800,\"total\":1800}");

    /* A client that accepts gzip gets the same JSON compressed. */
    {
        char req[512];
        int n = snprintf(req, sizeof req,
                         "GET /api/v1/profile?from=%lld&to=%lld&format=json&sample_type=samples "
                         "HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, deflate\r\n\r\n",
                         (long long)T0, (long long)T0 + 3600);
        cp_http_result z;
        cp_err err = {0};
        CHECK(cp_http_raw("127.0.0.1", f.port, req, (size_t)n, 10000, &z, &err) == 0);
        CHECK_EQ(z.status, 200);
        CHECK(cp_is_gzip(z.body.data, z.body.len));
        cp_buf plain = {0};
        CHECK(cp_gunzip(z.body.data, z.body.len, 1 << 24, &plain, &err) == 0);
        CHECK_EQ(plain.len, r.body.len);
        CHECK(memcmp(plain.data, r.body.data, plain.len) == 0);
        cp_buf_close(&plain);
        cp_buf_close(&z.body);
    }
    cp_buf_close(&r.body);

    /* max_nodes keeps totals honest. */
    r = getf(&f, NULL,
             "/api/v1/profile?from=%lld&to=%lld&format=json&max_nodes=2&sample_type=samples",
             (long long)T0, (long long)T0 + 3600);
    CHECK_CONTAINS(body(&r), tot);
    CHECK_CONTAINS(body(&r), "\"nodes\":2,\"total_nodes\":6");
    cp_buf_close(&r.body);

    /* focus / ignore */
    r = getf(&f, NULL,
             "/api/v1/profile?from=%lld&to=%lld&format=folded&focus=slow&sample_type=samples",
             (long long)T0, (long long)T0 + 3600);
    CHECK_STREQ(body(&r), "main;d;slow 1260\n");
    cp_buf_close(&r.body);
    r = getf(&f, NULL, "/api/v1/profile?from=%lld&to=%lld&format=pprof&ignore=%s", (long long)T0,
             (long long)T0 + 3600, enc("^(c|slow)$"));
    p = decode(&r);
    CHECK_EQ(cp_profile_total(p, 0), 720);
    cp_profile_destroy(p);
    cp_buf_close(&r.body);

    /* Selecting by version; nothing matched gives an empty profile. */
    r = getf(&f, NULL,
             "/api/v1/profile?select=%s&from=%lld&to=%lld&format=folded&sample_type=samples",
             enc("{version=~\"2|3\"}"), (long long)T0, (long long)T0 + 3600);
    CHECK_CONTAINS(body(&r), "main;d;slow 1260\n");
    cp_buf_close(&r.body);
    r = getf(&f, NULL, "/api/v1/profile?select=%s&from=%lld&to=%lld&format=folded",
             enc("{service=\"nope\"}"), (long long)T0, (long long)T0 + 3600);
    CHECK_EQ(r.status, 200);
    CHECK_EQ(r.body.len, 0);
    cp_buf_close(&r.body);
    qfx_close(&f, 1);
}

TEST(bad_requests_are_4xx_json)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_cpu(&f, "default", 6);
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.max_range_ns = S(8 * 86400);
    qfx_serve(&f, &ao, 2);
    char pq[512];
    snprintf(pq, sizeof pq, "/api/v1/profile?select=%s", enc("{service=\"api\""));
    expect_error(&f, 400, "bad select: selector: expected ',' or '}' at byte 14", pq);
    snprintf(pq, sizeof pq, "/api/v1/profile?select=%s", enc("{a=~\"(\"}"));
    expect_error(&f, 400, "bad regular expression at byte 4", pq);
    expect_error(&f, 400, "bad from: bad time 'yesterday'", "/api/v1/profile?from=yesterday");
    expect_error(&f, 400, "bad to: bad time '2025-13-01T00:00:00Z'",
                 "/api/v1/profile?to=2025-13-01T00:00:00Z");
    expect_error(&f, 400, "from (2025-11-24T17:00:00.000Z) is after to (2025-11-24T16:00:00.000Z)",
                 "/api/v1/profile?from=1764003600&to=1764000000");
    expect_error(&f, 400, "exceeds the longest allowed window of 691200 s",
                 "/api/v1/profile?from=-30d");
    expect_error(&f, 400,
                 "unknown type 'leak' (expected cpu, alloc, inuse, wall, mutex, block, "
                 "goroutines or heap)",
                 "/api/v1/profile?type=leak");
    expect_error(&f, 400, "unknown format 'svg' (expected one of pprof, json, folded, top)",
                 "/api/v1/profile?format=svg");
    expect_error(&f, 400, "unknown parameter 'frm'", "/api/v1/profile?frm=now");
    expect_error(&f, 400, "parameter 'from' given more than once",
                 "/api/v1/profile?from=-1h&from=-2h");
    expect_error(&f, 400, "bad percent escape", "/api/v1/profile?select=%zz");
    expect_error(&f, 400, "bad focus regex '('", "/api/v1/profile?format=top&focus=(");
    expect_error(&f, 400, "bad max_nodes 'lots'", "/api/v1/profile?format=json&max_nodes=lots");
    expect_error(&f, 400, "unknown sample type 'bytes' (profile has: samples, cpu)",
                 "/api/v1/profile?format=top&sample_type=bytes&from=1764000000&to=1764000060");
    expect_error(&f, 400, "unknown format 'top' (expected one of json, pprof)",
                 "/api/v1/diff?format=top");
    expect_error(&f, 400, "bad base_from", "/api/v1/diff?base_from=soon");
    expect_error(&f, 400, "bad step", "/api/v1/timeline?step=0s");
    expect_error(&f, 400, "gives more than 11000 points", "/api/v1/timeline?from=-7d&step=1s");
    expect_error(&f, 400, "bad label name '9x'", "/api/v1/labels/9x/values");
    expect_error(&f, 404, "unknown path '/api/v1/labels/x/valuez'", "/api/v1/labels/x/valuez");
    expect_error(&f, 404, "unknown path '/api/v2/profile'", "/api/v2/profile");
    expect_error(&f, 404, "unknown path '/nothing'", "/nothing");
    /* Not GET. */
    const char *post = "POST /api/v1/profile HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    cp_http_result r;
    cp_err err = {0};
    CHECK(cp_http_raw("127.0.0.1", f.port, post, strlen(post), 5000, &r, &err) == 0);
    CHECK_EQ(r.status, 405);
    cp_buf_append(&r.body, "", 1);
    CHECK_CONTAINS((char *)r.body.data, "method POST not allowed");
    cp_buf_close(&r.body);
    /* Oversized headers. */
    char big[40000];
    int n = snprintf(big, sizeof big, "GET /api/v1/labels HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    memset(big + n, 'p', 30000);
    n += 30000;
    n += snprintf(big + n, sizeof big - (size_t)n, "\r\n\r\n");
    CHECK(cp_http_raw("127.0.0.1", f.port, big, (size_t)n, 5000, &r, &err) == 0);
    CHECK_EQ(r.status, 431);
    cp_buf_append(&r.body, "", 1);
    CHECK_CONTAINS((char *)r.body.data, "{\"error\":\"request headers exceed 16384 bytes\"}");
    cp_buf_close(&r.body);
    qfx_close(&f, 1);
}

/* A query that would read more store blocks than allowed is a 400 naming the limit. */
TEST(block_limit_is_400)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_cpu(&f, "default", 360);
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.max_blocks = 2;
    qfx_serve(&f, &ao, 2);
    char pq[256];
    snprintf(pq, sizeof pq, "/api/v1/profile?from=%lld&to=%lld&format=top", (long long)T0 + 5,
             (long long)T0 + 3595);
    expect_error(&f, 400, "query exceeds a limit: ", pq);
    snprintf(pq, sizeof pq, "/api/v1/profile?from=%lld&to=%lld&format=top", (long long)T0,
             (long long)T0 + 10);
    cp_http_result r = qfx_get(&f, pq, NULL);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    qfx_close(&f, 1);
}

TEST(series_labels_timeline_metrics)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_cpu(&f, "default", 360);
    qfx_serve(&f, NULL, 2);
    cp_http_result r = qfx_get(&f, "/api/v1/series", NULL);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r),
                   "{\"type\":\"cpu\",\"labels\":{\"instance\":\"i1\",\"service\":\"api\","
                   "\"version\":\"1\"},\"first\":\"2025-11-24T16:00:00.000Z\",\"last\":"
                   "\"2025-11-24T16:29:50.000Z\"}");
    CHECK_CONTAINS(body(&r), "\"count\":2}");
    cp_buf_close(&r.body);
    r = getf(&f, NULL, "/api/v1/series?select=%s&from=%lld&to=%lld", enc("{version=\"2\"}"),
             (long long)T0, (long long)T0 + 3600);
    CHECK_CONTAINS(body(&r), "\"count\":1}");
    cp_buf_close(&r.body);
    r = getf(&f, NULL, "/api/v1/series?type=alloc");
    CHECK_CONTAINS(body(&r), "{\"series\":[],\"count\":0}");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/labels", NULL);
    CHECK_STREQ(body(&r), "{\"labels\":[\"instance\",\"service\",\"version\"]}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/labels/version/values", NULL);
    CHECK_STREQ(body(&r), "{\"name\":\"version\",\"values\":[\"1\",\"2\"]}\n");
    cp_buf_close(&r.body);
    r = getf(&f, NULL, "/api/v1/timeline?from=%lld&to=%lld&step=10m", (long long)T0,
             (long long)T0 + 3600);
    CHECK_EQ(r.status, 200);
    /* 60 windows per 10 min: 20 each of x = 1, 2, 3 -> 120 + 300 samples, +420 after 30 min */
    CHECK_CONTAINS(body(&r), "\"sample_types\":[{\"type\":\"samples\",\"unit\":\"count\"},"
                             "{\"type\":\"cpu\",\"unit\":\"nanoseconds\"}]");
    CHECK_CONTAINS(body(&r), "\"points\":[[1764000000.000,420,4200000000],[1764000600.000,420,");
    CHECK_CONTAINS(body(&r), "[1764003000.000,840,8400000000]]}");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/healthz", NULL);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(body(&r), "{\"status\":\"ok\"}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/brokers", NULL);
    CHECK_STREQ(body(&r), "{\"brokers\":\"\"}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/metrics", NULL);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r), "contprof_query_duration_seconds_count{endpoint=\"timeline\"} 1\n");
    CHECK_CONTAINS(body(&r), "contprof_query_duration_seconds_count{endpoint=\"series\"} 3\n");
    CHECK_CONTAINS(body(&r), "contprof_store_disk_bytes ");
    CHECK_CONTAINS(body(&r), "contprof_store_series 2\n");
    cp_buf_close(&r.body);
    /* A metric a stage adds: registered where it is counted, printed with nothing in the
     * API changed (the registry, model/metrics.h). */
    static cp_counter hits;
    int stage;
    CHECK_EQ(cp_metrics_counter(f.metrics, &stage, "contprof_test_hits_total", "Hits counted.",
                                (cp_metric_label[]){{"stage", "test"}}, 1, &hits),
             0);
    cp_counter_add(&hits, 3);
    r = qfx_get(&f, "/metrics", NULL);
    CHECK_CONTAINS(body(&r), "# HELP contprof_test_hits_total Hits counted.\n"
                             "# TYPE contprof_test_hits_total counter\n"
                             "contprof_test_hits_total{stage=\"test\"} 3\n");
    cp_buf_close(&r.body);
    cp_metrics_remove(f.metrics, &stage);
    qfx_close(&f, 1);
}

/* An inuse profile: init;keep holds 1000 objects / 1 MB from start-up on; work;tmp varies. */
static cp_profile *inuse_snapshot(int64_t tmp)
{
    cp_profile *p = cp_profile_create();
    CHECK(cp_profile_add_sample_type(p, "inuse_objects", "count") == 0);
    CHECK(cp_profile_add_sample_type(p, "inuse_space", "bytes") == 0);
    qt_add(p, "main;init;keep", 1000, 1048576);
    if (tmp) qt_add(p, "main;work;tmp", tmp, tmp * 100);
    return p;
}

TEST(inuse_is_last_snapshot_per_instance)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    /* Two instances, a snapshot every 10 s for 2 hours. */
    for (int w = 0; w < 720; w++) {
        for (int i = 0; i < 2; i++) {
            cp_profile *p = inuse_snapshot(w + 1);
            qfx_add(&f, "default", CP_KIND_INUSE,
                    i ? "service=api,instance=i2" : "service=api,instance=i1", S(T0 + 10 * w), p);
            cp_profile_destroy(p);
        }
    }
    qfx_commit(&f);
    qfx_serve(&f, NULL, 2);
    /* A window long after start-up: the start-up allocation is there once per instance. */
    cp_http_result r = getf(&f, NULL,
                            "/api/v1/profile?type=inuse&from=%lld&to=%lld&format=folded&"
                            "sample_type=inuse_objects",
                            (long long)T0 + 5000, (long long)T0 + 5100);
    CHECK_EQ(r.status, 200);
    /* last windows in range start at +5090: w = 509, tmp = 510, two instances */
    CHECK_STREQ(body(&r), "main;init;keep 2000\nmain;work;tmp 1020\n");
    cp_buf_close(&r.body);
    r = getf(&f, NULL, "/api/v1/profile?type=inuse&from=%lld&to=%lld&format=pprof", (long long)T0,
             (long long)T0 + 7200);
    cp_profile *p = decode(&r);
    CHECK_EQ(cp_profile_total(p, 1), 2 * 1048576 + 2 * 720 * 100);
    cp_profile_destroy(p);
    cp_buf_close(&r.body);
    /* One instance only. */
    r = getf(&f, NULL,
             "/api/v1/profile?type=inuse&select=%s&from=-100000d&to=now&format=folded&"
             "sample_type=inuse_space",
             enc("{instance=\"i2\"}"));
    CHECK_EQ(r.status, 400); /* longer than the default longest window */
    cp_buf_close(&r.body);
    r = getf(&f, NULL,
             "/api/v1/profile?type=inuse&select=%s&from=%lld&to=%lld&format=folded&"
             "sample_type=inuse_space",
             enc("{instance=\"i2\"}"), (long long)T0, (long long)T0 + 86400);
    CHECK_STREQ(body(&r), "main;init;keep 1048576\nmain;work;tmp 72000\n");
    cp_buf_close(&r.body);
    qfx_close(&f, 1);
}

TEST(diff_of_windows_and_versions)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_cpu(&f, "default", 360);
    qfx_serve(&f, NULL, 2);
    /* Two windows of the same selection: the second half hour has main;d;slow. */
    cp_http_result r =
        getf(&f, NULL,
             "/api/v1/diff?from=%lld&to=%lld&base_from=%lld&base_to=%lld&"
             "sample_type=samples",
             (long long)T0 + 1800, (long long)T0 + 3600, (long long)T0, (long long)T0 + 1800);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r), "\"total\":2520,\"base_total\":1260,");
    CHECK_CONTAINS(body(&r), "{\"name\":\"slow\",\"self\":1260,\"total\":1260,\"base_self\":0,"
                             "\"base_total\":0}");
    CHECK_CONTAINS(body(&r), "{\"name\":\"c\",\"self\":900,\"total\":900,\"base_self\":900,"
                             "\"base_total\":900}");
    cp_buf_close(&r.body);
    /* Two versions over the same window, as pprof: target minus base. */
    r = getf(&f, NULL, "/api/v1/diff?select=%s&base_select=%s&from=%lld&to=%lld&format=pprof",
             enc("{version=\"2\"}"), enc("{version=\"1\"}"), (long long)T0, (long long)T0 + 3600);
    CHECK_EQ(r.status, 200);
    cp_profile *p = decode(&r);
    CHECK_EQ(cp_profile_total(p, 0), 2520 - 1260);
    /* a and c cancel exactly; slow is new */
    cp_buf_close(&r.body);
    char file[200], sums[128];
    snprintf(file, sizeof file, "%s/diff.pb.gz", f.dir);
    cp_buf enc_out = {0};
    CHECK(cp_pprof_encode(p, 6, &enc_out) == 0);
    CHECK(cp_write_file(file, enc_out.data, enc_out.len, NULL) == 0);
    cp_buf_close(&enc_out);
    go_pprof_sums(file, sums, sizeof sums);
    CHECK_STREQ(sums, "1260 12600000000");
    cp_profile_destroy(p);
    qfx_close(&f, 1);
}

static int run_cli(const char *args, char *out, size_t len);

TEST(tokens_and_tenant_isolation)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    int64_t ta = fill_cpu(&f, "alpha", 36);
    for (int w = 0; w < 6; w++) {
        cp_profile *p = qt_cpu_profile();
        qt_add(p, "beta_main;beta_only", 100, 1000000000);
        qfx_add(&f, "beta", CP_KIND_CPU, "service=billing,instance=b1", S(T0 + 10 * w), p);
        cp_profile_destroy(p);
    }
    qfx_commit(&f);
    cp_api_token toks[] = {{"s3cret-alpha", "alpha"}, {"s3cret-beta", "beta"}};
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.tokens = toks;
    ao.ntokens = 2;
    qfx_serve(&f, &ao, 2);
    char pq[256];
    snprintf(pq, sizeof pq, "/api/v1/profile?from=%lld&to=%lld&format=folded&sample_type=samples",
             (long long)T0, (long long)T0 + 3600);
    cp_http_result r = qfx_get(&f, pq, NULL);
    CHECK_EQ(r.status, 401);
    CHECK_STREQ(body(&r), "{\"error\":\"missing Authorization: Bearer token\"}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, pq, "s3cret-alph");
    CHECK_EQ(r.status, 401);
    CHECK_STREQ(body(&r), "{\"error\":\"invalid token\"}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/labels", "wrong");
    CHECK_EQ(r.status, 401);
    cp_buf_close(&r.body);
    /* what the store has reached needs a token too; with no ingest here it is a 503 */
    r = qfx_get(&f, "/api/v1/ingest/offsets", NULL);
    CHECK_EQ(r.status, 401);
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/ingest/offsets", "s3cret-beta");
    CHECK_EQ(r.status, 503);
    CHECK_STREQ(body(&r), "{\"error\":\"no ingest runs in this process\"}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, pq, "s3cret-alpha");
    CHECK_EQ(r.status, 200);
    int64_t sum = 0;
    for (const char *l = body(&r); (l = strchr(l, ' ')); l++)
        sum += atoll(l + 1);
    CHECK_EQ(sum, ta);
    CHECK(!strstr(body(&r), "beta"));
    cp_buf_close(&r.body);
    r = qfx_get(&f, pq, "s3cret-beta");
    CHECK_STREQ(body(&r), "beta_main;beta_only 600\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/labels/service/values", "s3cret-beta");
    CHECK_STREQ(body(&r), "{\"name\":\"service\",\"values\":[\"billing\"]}\n");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/labels/service/values", "s3cret-alpha");
    CHECK_STREQ(body(&r), "{\"name\":\"service\",\"values\":[\"api\"]}\n");
    cp_buf_close(&r.body);
    /* The default tenant does not exist when tokens are configured. */
    r = qfx_get(&f, "/api/v1/series", "s3cret-beta");
    CHECK_CONTAINS(body(&r), "\"count\":1}");
    cp_buf_close(&r.body);
    /* The CLI passes --token or CONTPROF_TOKEN, and shows the 401 as it came. */
    static char out[8192];
    char args[512];
    snprintf(args, sizeof args, "top --server %s --from %lld --to %lld --sample-type samples",
             f.url, (long long)T0, (long long)T0 + 3600);
    CHECK_EQ(run_cli(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "server answered 401: {\"error\":\"missing Authorization: Bearer token\"}");
    char args2[600];
    snprintf(args2, sizeof args2, "%s --token s3cret-beta", args);
    CHECK_EQ(run_cli(args2, out, sizeof out), 0);
    CHECK_CONTAINS(out, "  beta_only\n");
    setenv("CONTPROF_TOKEN", "s3cret-alpha", 1);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "  slow\n");
    CHECK(!strstr(out, "beta_only"));
    unsetenv("CONTPROF_TOKEN");
    /* Health stays open. */
    r = qfx_get(&f, "/healthz", NULL);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    qfx_close(&f, 1);
}

/* Runs the contprof CLI with args; returns its exit status and its stdout+stderr. */
static int run_cli(const char *args, char *out, size_t len)
{
    const char *bin = getenv("CP_BINARY_DIR");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/query/contprof %s 2>&1", bin ? bin : "build", args);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(cli_against_the_server)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_cpu(&f, "default", 60);
    qfx_serve(&f, NULL, 2);
    static char out[65536];
    char args[1024];
    snprintf(args, sizeof args,
             "top --server %s --type cpu --select '{service=\"api\"}' --from %lld --to %lld", f.url,
             (long long)T0, (long long)T0 + 600);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "Showing nodes accounting for 6.30s, 100.00% of 6.30s total");
    CHECK_CONTAINS(out, "  slow\n");
    char file[256];
    snprintf(file, sizeof file, "%s/q.pb.gz", f.dir);
    snprintf(args, sizeof args, "query --server %s --from %lld --to %lld -o %s", f.url,
             (long long)T0, (long long)T0 + 600, file);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    cp_buf b = {0};
    CHECK(cp_read_file(file, &b, NULL) == 0);
    cp_profile *p = NULL;
    CHECK(cp_pprof_decode(b.data, b.len, NULL, &p, NULL) == 0);
    CHECK_EQ(cp_profile_total(p, 1), 6300000000LL);
    cp_profile_destroy(p);
    cp_buf_close(&b);
    snprintf(args, sizeof args, "series --server %s -o json", f.url);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "\"count\":2}");
    snprintf(args, sizeof args, "labels --server %s version -o json", f.url);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "\"values\":[\"1\",\"2\"]");
    snprintf(args, sizeof args, "timeline --server %s --from %lld --to %lld --step 5m -o json",
             f.url, (long long)T0, (long long)T0 + 600);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "\"points\":[[1764000000.000,");
    snprintf(args, sizeof args,
             "diff --server %s --from %lld --to %lld --base-from %lld --base-to %lld -o json",
             f.url, (long long)T0 + 300, (long long)T0 + 600, (long long)T0, (long long)T0 + 300);
    CHECK_EQ(run_cli(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "\"base_total\":");
    /* Server errors are shown as they are, with a non-zero exit. */
    snprintf(args, sizeof args, "top --server %s --select '{service=\"api\"'", f.url);
    CHECK_EQ(run_cli(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "server answered 400: {\"error\":\"bad select: selector: expected ',' or "
                        "'}' at byte 14");
    /* Times are checked before sending, with the server's grammar: a usage error. */
    snprintf(args, sizeof args, "top --server %s --from tomorrow", f.url);
    CHECK_EQ(run_cli(args, out, sizeof out), 2);
    CHECK_CONTAINS(out, "contprof top: --from: bad time 'tomorrow'");
    CHECK_EQ(run_cli("top --server http://127.0.0.1:1", out, sizeof out), 1);
    CHECK_CONTAINS(out, "cannot connect to 127.0.0.1:1");
    qfx_close(&f, 1);
}

/* The peers' lane (own slots, normal priority) is for peers: with a cluster token, a
 * tenant's local=1 query takes its turn in the heavy lane like any other query. */
TEST(peers_lane_is_for_the_cluster_token)
{
    cp_err err = {0};
    cp_fanout *fan = NULL;
    cp_fanout_options fo = {.peers = "http://127.0.0.1:1", .token = "cluster-s3cret"};
    CHECK(cp_fanout_create(&fo, &fan, &err) == 0 && fan);
    cp_api_token toks[] = {{"s3cret-alpha", "alpha"}};
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.tokens = toks;
    ao.ntokens = 1;
    ao.fanout = fan;
    cp_api *api = cp_api_create(&ao);
    CHECK(api);
    cp_http_request rq = {.method = "GET",
                          .path = "/api/v1/profile",
                          .query = "format=pprof&local=1&tenant=alpha",
                          .authorization = "Bearer cluster-s3cret"};
    CHECK_EQ(cp_api_is_light(api, &rq), CP_HTTP_LANE_PEER);
    rq.query = "format=pprof&local=1";
    rq.authorization = "Bearer s3cret-alpha";
    CHECK_EQ(cp_api_is_light(api, &rq), CP_HTTP_LANE_HEAVY);
    rq.path = "/api/v1/series";
    CHECK_EQ(cp_api_is_light(api, &rq), CP_HTTP_LANE_CHEAP);
    rq.authorization = NULL;
    CHECK_EQ(cp_api_is_light(api, &rq), CP_HTTP_LANE_CHEAP);
    cp_api_destroy(api);
    cp_fanout_destroy(fan);
    /* without tenant tokens too, only the cluster token makes a request a peer's (issue
     * 36): any other local=1 is not one, and is refused when it runs */
    CHECK(cp_fanout_create(&fo, &fan, &err) == 0 && fan);
    ao.tokens = NULL;
    ao.ntokens = 0;
    ao.fanout = fan;
    api = cp_api_create(&ao);
    CHECK(api);
    rq.path = "/api/v1/profile";
    rq.authorization = NULL;
    CHECK_EQ(cp_api_is_light(api, &rq), CP_HTTP_LANE_HEAVY);
    rq.authorization = "Bearer cluster-s3cret";
    CHECK_EQ(cp_api_is_light(api, &rq), CP_HTTP_LANE_PEER);
    cp_api_destroy(api);
    cp_fanout_destroy(fan);
}

TEST_MAIN(T(profile_formats), T(bad_requests_are_4xx_json), T(block_limit_is_400),
          T(series_labels_timeline_metrics), T(inuse_is_last_snapshot_per_instance),
          T(diff_of_windows_and_versions), T(tokens_and_tenant_isolation),
          T(cli_against_the_server), T(peers_lane_is_for_the_cluster_token))
