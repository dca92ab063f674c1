/* Pyroscope's wire protocol against the real contprofd, its embedded Kafka and its store
 * (issue 37): Grafana Pyroscope's own Node SDK pointed at contprofd, and hand-made requests
 * over TCP built from the protocol's public description: folded text in each time unit,
 * multipart with sample_type_config, Push in protobuf (gzip'd) and JSON, tenants, and bad
 * input, each answered with its code and nothing of it stored. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_client.h"
#include "json.h"
#include "pprof.h"
#include "times.h"
#include "proc.h"

/* ---- a raw HTTP client: any header, any declared length ------------------------------ */

typedef struct answer {
    int status;
    size_t len; /* of body, which may hold NULs (application/proto) */
    char body[16384];
} answer;

/* POSTs body (len bytes, Content-Length declared unless declared is nonzero) to pq on port
 * with the extra header lines hdrs ("Name: value\r\n"...), and reads the answer until the
 * server closes. */
static answer request(const char *method, int port, const char *pq, const char *hdrs,
                      const void *body, size_t len, size_t declared)
{
    answer a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char head[4096];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Length: %zu\r\n%s\r\n",
                      method, pq, declared ? declared : len, hdrs ? hdrs : "");
    CHECK(hn > 0 && (size_t)hn < sizeof head);
    signal(SIGPIPE, SIG_IGN);
    CHECK(send(fd, head, (size_t)hn, 0) == hn);
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, (const char *)body + off, len - off, 0);
        if (w <= 0) break; /* the server refused and closed: its answer is read below */
        off += (size_t)w;
    }
    static char buf[1 << 20];
    size_t n = 0;
    for (ssize_t r; n < sizeof buf - 1 && (r = recv(fd, buf + n, sizeof buf - 1 - n, 0)) > 0;)
        n += (size_t)r;
    buf[n] = 0;
    close(fd);
    CHECK(n > 12);
    a.status = atoi(buf + 9);
    const char *b = strstr(buf, "\r\n\r\n");
    if (b) {
        a.len = n - (size_t)(b + 4 - buf);
        if (a.len > sizeof a.body - 1) a.len = sizeof a.body - 1;
        memcpy(a.body, b + 4, a.len);
    }
    return a;
}

static answer post(int port, const char *pq, const char *hdrs, const void *body, size_t len,
                   size_t declared)
{
    return request("POST", port, pq, hdrs, body, len, declared);
}

static void expect(const answer *a, int status, const char *needle)
{
    if (a->status != status || (needle && !strstr(a->body, needle)))
        fprintf(stderr, "expected %d with '%s', got %d %s\n", status, needle ? needle : "",
                a->status, a->body);
    CHECK_EQ(a->status, status);
    if (needle) CHECK_CONTAINS(a->body, needle);
}

/* GET pq (with token) until its body contains needle, at most 30 s; returns the body
 * (malloc'd). Fails the test, printing the last body, if it never does. */
static char *wait_for(int port, const char *pq, const char *token, const char *needle)
{
    cp_buf b = {0};
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(50000)) {
        cp_buf_close(&b);
        b = http_get_ok(port, pq, token);
        if (strstr((char *)b.data, needle)) return (char *)b.data;
    }
    fprintf(stderr, "GET %s never showed '%s'; last: %s\n", pq, needle, (char *)b.data);
    CHECK(0);
    return NULL;
}

static int count_of(const char *series_json)
{
    const char *c = strstr(series_json, "\"count\":");
    CHECK(c);
    return atoi(c + 8);
}

/* ---- profiles made here --------------------------------------------------------------- */

static int64_t g_time_ns; /* make_pprof's time_nanos (0: none), with 10 s duration */

/* A pprof of two sample types (t0/u0, t1/u1): stack main;work;fn with values v0, v1. */
static void make_pprof(cp_buf *out, const char *t0, const char *u0, const char *t1, const char *u1,
                       const char *fn, int64_t v0, int64_t v1)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_profile_add_sample_type(p, t0, u0) == 0);
    CHECK(cp_profile_add_sample_type(p, t1, u1) == 0);
    cp_profile_intern_cstr(p, t0, &p->period_type.type);
    cp_profile_intern_cstr(p, u0, &p->period_type.unit);
    p->period = 1;
    p->time_nanos = g_time_ns;
    p->duration_nanos = g_time_ns ? 10 * SEC : 0;
    const char *names[3] = {fn, "work", "main"}; /* leaf first */
    uint32_t locs[3];
    for (int i = 0; i < 3; i++) {
        cp_function f = {0};
        uint32_t fid;
        cp_profile_intern_cstr(p, names[i], &f.name);
        CHECK(cp_profile_add_function(p, &f, &fid) == 0);
        cp_line ln = {fid, 1};
        CHECK(cp_profile_add_location(p, 0, 0, &ln, 1, &locs[i]) == 0);
    }
    int64_t v[2] = {v0, v1};
    CHECK(cp_profile_add_sample(p, locs, 3, v, NULL, 0) == 0);
    CHECK(cp_pprof_encode(p, 1, out) == 0);
    cp_profile_destroy(p);
}

/* A whole minute 10 minutes ago (unix seconds): the tests' windows start there, inside
 * retention.raw. */
static int64_t base_s(void)
{
    return (int64_t)time(NULL) / 60 * 60 - 600;
}

/* ?from=..&to=.. around the base minute, for queries */
static const char *window_q(void)
{
    static char q[96];
    snprintf(q, sizeof q, "from=%lld&to=%lld", (long long)base_s() - 60, (long long)base_s() + 180);
    return q;
}

static const char *g_folded = "main;work;hot 30\nmain;work;cold 10\nmain;idle 5\n";

/* ---- tests ---------------------------------------------------------------------------- */

static void sdk_flame_graph_totals(int port);

/* Grafana Pyroscope's Node SDK, unchanged, pointed at contprofd: its wall and heap profiles
 * are stored as wall and inuse under the app's name, and its functions show in `contprof
 * top` and the query API. */
TEST(node_sdk_functions_show_in_top_and_the_api)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "sh %s/tests/pyro/install.sh %s", getenv("CP_SOURCE_DIR"), bindir());
    proc_sh(cmd);
    char *dir = proc_tmpdir("pyro", "sdk");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    snprintf(cmd, sizeof cmd,
             "cd %s/tests/pyro && node sdk_app.js http://127.0.0.1:%d nodeapp 4 > %s/node.log "
             "2>&1",
             bindir(), d.port, dir);
    proc_sh(cmd);
    char *s = wait_for(d.port, "/api/v1/series?type=inuse", NULL, "\"service\":\"nodeapp\"");
    CHECK_CONTAINS(s, "\"pyroscope_spy\":\"nodespy\"");
    CHECK_CONTAINS(s, "\"region\":\"test\"");
    CHECK_CONTAINS(s, "\"otel_scope_name\":\"com.grafana.pyroscope/nodejs\"");
    free(s);
    s = wait_for(d.port, "/api/v1/series?type=wall", NULL, "\"service\":\"nodeapp\"");
    free(s);
    /* the SDK's last flush (at stop) is stored before the folded answer is taken */
    s = wait_for(
        d.port,
        "/api/v1/profile?type=wall&from=-10m&format=folded&select=%7Bservice%3D%22nodeapp%22%7D",
        NULL, "pyroHotLoop");
    CHECK_CONTAINS(s, "pyroColdLoop");
    free(s);
    /* the CLI, as a user reads it: the hot loop first (30 ms of every 40 burnt) */
    char out[65536];
    snprintf(cmd, sizeof cmd, "%s/query/contprof", bindir());
    char server[64];
    snprintf(server, sizeof server, "http://127.0.0.1:%d", d.port);
    const char *args[] = {"top", "--server", server, "--type", "wall", "--from", "-10m", NULL};
    CHECK_EQ(run_capture(cmd, args, NULL, NULL, out, sizeof out), 0);
    const char *hot = strstr(out, "pyroHotLoop"), *cold = strstr(out, "pyroColdLoop");
    if (!hot || !cold || hot > cold) fprintf(stderr, "contprof top:\n%s\n", out);
    CHECK(hot && cold && hot < cold);
    sdk_flame_graph_totals(d.port);
    CHECK(http_metric(d.port, "contprof_pyroscope_profiles_total", NULL) >= 2);
    CHECK_EQ(http_metric(d.port, "contprof_pyroscope_refused_total{reason=\"bad_metadata\"}", NULL),
             0);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* Folded text with from/until in seconds, ms, us and ns: each window where it was said. */
TEST(folded_text_in_each_time_unit)
{
    char *dir = proc_tmpdir("pyro", "units");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    const int64_t t = base_s();
    /* the same instants written in seconds, ms, us and ns: 20 s apart */
    const char *app[4] = {"unit_s", "unit_ms", "unit_us", "unit_ns"};
    const char *zeros[4] = {"", "000", "000000", "000000000"};
    char when[4][64];
    for (int i = 0; i < 4; i++) {
        char pq[512];
        snprintf(pq, sizeof pq,
                 "/ingest?name=%s%%7Benv%%3Dprod%%7D&from=%lld%s&until=%lld%s&sampleRate=100&"
                 "spyName=ebpfspy",
                 app[i], (long long)t + 20 * i, zeros[i], (long long)t + 20 * i + 10, zeros[i]);
        cp_format_time((t + 20 * i) * SEC, when[i], sizeof when[i]);
        answer a = post(d.port, pq, NULL, g_folded, strlen(g_folded), 0);
        expect(&a, 200, "\"profiles\":1");
    }
    char *s = wait_for(d.port, "/api/v1/series", NULL, "\"count\":4");
    for (int i = 0; i < 4; i++) {
        char want[200];
        snprintf(want, sizeof want, "\"service\":\"%s\"},\"first\":\"%s\"", app[i], when[i]);
        CHECK_CONTAINS(s, want);
    }
    CHECK_CONTAINS(s, "\"pyroscope_spy\":\"ebpfspy\"");
    free(s);
    /* the counts as sent: cpu = samples at 100 Hz (10 ms each) */
    char q[512];
    snprintf(q, sizeof q,
             "/api/v1/profile?type=cpu&%s&format=folded&sample_type=samples&"
             "select=%%7Bservice%%3D%%22unit_ms%%22%%7D",
             window_q());
    s = wait_for(d.port, q, NULL, "hot");
    CHECK_CONTAINS(s, "main;work;hot 30\n");
    CHECK_CONTAINS(s, "main;idle 5\n");
    free(s);
    snprintf(q, sizeof q, "/api/v1/profile?type=cpu&%s&format=folded&sample_type=cpu", window_q());
    s = wait_for(d.port, q, NULL, "hot");
    CHECK_CONTAINS(s, "main;work;hot 1200000000\n"); /* 4 x 30 x 10 ms */
    free(s);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* A multipart pprof whose sample_type_config names its types, as pyroscope-go sends Go's
 * block profile (contentions, delay shown as block_count, block_duration): stored as block,
 * not mutex nor cpu; a profile whose types no kind takes (lock_count, lock_time) is 422. */
TEST(multipart_with_sample_type_config)
{
    char *dir = proc_tmpdir("pyro", "multipart");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    cp_buf pp = {0}, body = {0};
    cp_buf odd = {0};
    make_pprof(&pp, "contentions", "count", "delay", "nanoseconds", "waitOnChannel", 7, 7000);
    make_pprof(&odd, "lock_count", "count", "lock_time", "nanoseconds", "waitOnChannel", 7, 7000);
    const char *stc =
        "{\"contentions\":{\"units\":\"lock_samples\",\"display-name\":\"block_count\","
        "\"aggregation\":\"sum\",\"cumulative\":true,\"sampled\":true},"
        "\"delay\":{\"units\":\"lock_nanoseconds\",\"display-name\":\"block_duration\","
        "\"aggregation\":\"sum\",\"cumulative\":true,\"sampled\":true}}";
    CHECK(cp_buf_printf(
              &body,
              "--XyZ\r\nContent-Disposition: form-data; name=\"profile\"; "
              "filename=\"profile.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n") == 0);
    CHECK(cp_buf_append(&body, pp.data, pp.len) == 0);
    CHECK(cp_buf_printf(&body,
                        "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"sample_type_config\"; "
                        "filename=\"sample_type_config.json\"\r\n\r\n%s\r\n--XyZ--\r\n",
                        stc) == 0);
    const char *ct = "Content-Type: multipart/form-data; boundary=XyZ\r\n";
    /* without the config no kind takes lock_count/lock_time: 422 naming them */
    cp_buf bare = {0};
    CHECK(cp_buf_printf(&bare,
                        "--XyZ\r\nContent-Disposition: form-data; name=\"profile\"\r\n\r\n") == 0);
    CHECK(cp_buf_append(&bare, odd.data, odd.len) == 0);
    CHECK(cp_buf_printf(&bare, "\r\n--XyZ--\r\n") == 0);
    char pq[256], q[256];
    snprintf(pq, sizeof pq, "/pyroscope/ingest?name=goapp&format=pprof&from=%lld",
             (long long)base_s());
    answer a = post(d.port, pq, ct, bare.data, bare.len, 0);
    expect(&a, 422, "lock_count/count");
    snprintf(pq, sizeof pq,
             "/pyroscope/ingest?name=goapp%%7Bpod%%3Da%%7D&format=pprof&from=%lld&until=%lld",
             (long long)base_s(), (long long)base_s() + 10);
    a = post(d.port, pq, ct, body.data, body.len, 0);
    expect(&a, 200, "\"profiles\":1");
    char *s = wait_for(d.port, "/api/v1/series", NULL, "\"type\":\"block\"");
    CHECK_CONTAINS(s, "\"pod\":\"a\"");
    CHECK_EQ(count_of(s), 1);
    free(s);
    snprintf(q, sizeof q, "/api/v1/profile?type=block&%s&format=folded&sample_type=delay",
             window_q());
    s = wait_for(d.port, q, NULL, "waitOnChannel");
    CHECK_CONTAINS(s, "main;work;waitOnChannel 7000\n");
    free(s);
    cp_buf_close(&pp);
    cp_buf_close(&body);
    cp_buf_close(&bare);
    cp_buf_close(&odd);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* Bad input: each refused with its code and a JSON error naming the problem, nothing of it
 * stored, and a good request after them all stored whole. */
TEST(bad_input_gets_its_code_and_nothing_is_stored)
{
    char *dir = proc_tmpdir("pyro", "bad");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    const char *f = g_folded;
    size_t fl = strlen(f);
    answer a;
    a = post(d.port, "/ingest?name=%7Bk%3Dv%7D&from=1764000000", NULL, f, fl, 0);
    expect(&a, 400, "application name is empty");
    a = post(d.port, "/ingest?name=app%7Bk%3Dv&from=1764000000", NULL, f, fl, 0);
    expect(&a, 400, "expected '}'");
    a = post(d.port, "/ingest?name=app%7B1k%3Dv%7D&from=1764000000", NULL, f, fl, 0);
    expect(&a, 400, "label name '1k'");
    a = post(d.port, "/ingest?from=1764000000", NULL, f, fl, 0);
    expect(&a, 400, "name: missing");
    a = post(d.port, "/ingest?name=app&from=17640000x0", NULL, f, fl, 0);
    expect(&a, 400, "'17640000x0' is not a time");
    a = post(d.port, "/ingest?name=app&from=1764000010&until=1764000000", NULL, f, fl, 0);
    expect(&a, 400, "is before from");
    a = post(d.port, "/ingest?name=app&from=1764000000&color=red", NULL, f, fl, 0);
    expect(&a, 400, "color");
    a = post(d.port, "/ingest?name=app&from=1764000000&units=furlongs", NULL, f, fl, 0);
    expect(&a, 400, "units 'furlongs'");
    a = post(d.port, "/ingest?name=app&from=1764000000", NULL, "main;work\n", 10, 0);
    expect(&a, 422, "folded line 1");
    a = post(d.port, "/ingest?name=app&from=1764000000&format=jfr", NULL, f, fl, 0);
    expect(&a, 422, "format 'jfr'");
    a = post(d.port, "/ingest?name=app&from=1764000000&format=pprof", NULL, "not a pprof", 11, 0);
    expect(&a, 422, NULL);
    /* a truncated multipart body: the profile part never ends */
    cp_buf pp = {0}, mp = {0};
    make_pprof(&pp, "samples", "count", "cpu", "nanoseconds", "spin", 3, 30000000);
    CHECK(cp_buf_printf(&mp, "--B0\r\nContent-Disposition: form-data; name=\"profile\"\r\n\r\n") ==
          0);
    CHECK(cp_buf_append(&mp, pp.data, pp.len / 2) == 0);
    a = post(d.port, "/ingest?name=app&from=1764000000&format=pprof",
             "Content-Type: multipart/form-data; boundary=B0\r\n", mp.data, mp.len, 0);
    expect(&a, 422, "no closing boundary");
    /* 100 MB: refused from its declared length, before the body is read */
    static char chunk[1 << 20];
    a = post(d.port, "/ingest?name=app&from=1764000000", NULL, chunk, sizeof chunk, 100u << 20);
    expect(&a, 413, "exceeds");
    CHECK_EQ(http_metric(d.port, "contprof_pyroscope_profiles_total", NULL), 0);
    CHECK_EQ(http_metric(d.port, "contprof_pyroscope_refused_total{reason=\"bad_metadata\"}", NULL),
             8);
    CHECK_EQ(
        http_metric(d.port, "contprof_pyroscope_refused_total{reason=\"unprocessable\"}", NULL), 4);
    /* nothing else lost: a good one after them is stored, alone */
    char good[128];
    snprintf(good, sizeof good, "/ingest?name=good&from=%lld&format=pprof", (long long)base_s());
    a = post(d.port, good, NULL, pp.data, pp.len, 0);
    expect(&a, 200, "\"profiles\":1");
    char *s = wait_for(d.port, "/api/v1/series", NULL, "\"service\":\"good\"");
    CHECK_EQ(count_of(s), 1);
    free(s);
    char q[256];
    snprintf(q, sizeof q, "/api/v1/profile?type=cpu&%s&format=folded&sample_type=samples",
             window_q());
    s = wait_for(d.port, q, NULL, "spin");
    CHECK_STREQ(s, "main;work;spin 3\n");
    free(s);
    cp_buf_close(&pp);
    cp_buf_close(&mp);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* Tenants: Bearer and Basic credentials map to contprof's tokens, X-Scope-OrgID must name
 * the token's tenant; a wrong one is 403, a missing or bad credential 401, nothing stored. */
TEST(tenants_from_bearer_basic_and_org_id)
{
    char *dir = proc_tmpdir("pyro", "tenants");
    char conf[600];
    snprintf(conf, sizeof conf, "%s/contprofd.conf", dir);
    FILE *cf = fopen(conf, "w");
    CHECK(cf);
    fprintf(cf, "token.team-a = secret-aaaa-1234\ntoken.team-b = secret-bbbb-5678\n");
    fclose(cf);
    proc d;
    start_daemon_data(&d, dir, 0, 0, conf);
    const char *f = g_folded;
    size_t fl = strlen(f);
    const char *pq = "/ingest?name=tenanted&from=1764000000";
    answer a = post(d.port, pq, NULL, f, fl, 0);
    expect(&a, 401, "missing Authorization");
    a = post(d.port, pq, "Authorization: Bearer nope-nope-nope\r\n", f, fl, 0);
    expect(&a, 401, "invalid token");
    a = post(d.port, pq, "Authorization: Bearer secret-aaaa-1234\r\nX-Scope-OrgID: team-b\r\n", f,
             fl, 0);
    expect(&a, 403, "X-Scope-OrgID 'team-b' is not this token's tenant 'team-a'");
    /* the body is not read for a refused credential: a 100 MB one is refused at once */
    static char chunk[1 << 16];
    a = post(d.port, pq, "Authorization: Bearer nope-nope-nope\r\n", chunk, sizeof chunk,
             100u << 20);
    expect(&a, 401, "the body was not read");
    /* Bearer for team-a, with its own org id */
    a = post(d.port, "/ingest?name=app_a",
             "Authorization: Bearer secret-aaaa-1234\r\nX-Scope-OrgID: team-a\r\n", f, fl, 0);
    expect(&a, 200, "\"profiles\":1");
    /* Basic for team-b: user:token ("anyone:secret-bbbb-5678") */
    a = post(d.port, "/ingest?name=app_b",
             "Authorization: Basic YW55b25lOnNlY3JldC1iYmJiLTU2Nzg=\r\n", f, fl, 0);
    expect(&a, 200, "\"profiles\":1");
    char *s = wait_for(d.port, "/api/v1/series", "secret-aaaa-1234", "\"service\":\"app_a\"");
    CHECK_EQ(count_of(s), 1);
    free(s);
    s = wait_for(d.port, "/api/v1/series", "secret-bbbb-5678", "\"service\":\"app_b\"");
    CHECK_EQ(count_of(s), 1);
    free(s);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* ---- Push, from push.v1's field numbers ----------------------------------------------- */

static void pb_varint(cp_buf *b, uint64_t v)
{
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        CHECK(cp_buf_append(b, &c, 1) == 0);
    } while (v);
}

/* field (wire type 2) with n bytes of p */
static void pb_bytes(cp_buf *b, uint32_t field, const void *p, size_t n)
{
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, n);
    CHECK(cp_buf_append(b, p, n) == 0);
}

/* LabelPair{1 name, 2 value} as field 1 of a RawProfileSeries */
static void pb_label(cp_buf *series, const char *k, const char *v)
{
    cp_buf l = {0};
    pb_bytes(&l, 1, k, strlen(k));
    pb_bytes(&l, 2, v, strlen(v));
    pb_bytes(series, 1, l.data, l.len);
    cp_buf_close(&l);
}

static void b64(cp_buf *out, const uint8_t *p, size_t n)
{
    static const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {a[v >> 18], a[v >> 12 & 63], i + 1 < n ? a[v >> 6 & 63] : '=',
                     i + 2 < n ? a[v & 63] : '='};
        CHECK(cp_buf_append(out, q, 4) == 0);
    }
}

/* push.v1.PusherService/Push over Connect: a gzip'd protobuf PushRequest and a JSON one, each
 * stored exactly under its service_name; a series without service_name is invalid_argument,
 * another Content-Type 415, nothing of them stored. */
TEST(push_in_gzipd_protobuf_and_json)
{
    char *dir = proc_tmpdir("pyro", "push");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    const char *path = "/push.v1.PusherService/Push";
    /* protobuf: PushRequest{1: RawProfileSeries{1: labels, 2: RawSample{1 raw, 2 ID}}} */
    cp_buf pp = {0}, sample = {0}, series = {0}, req = {0}, gz = {0};
    make_pprof(&pp, "samples", "count", "cpu", "nanoseconds", "pushFn", 4, 40000000);
    pb_label(&series, "service_name", "pushsvc");
    pb_label(&series, "__name__", "process_cpu");
    pb_label(&series, "pod", "p1");
    pb_bytes(&sample, 1, pp.data, pp.len);
    pb_bytes(&sample, 2, "id-1", 4);
    pb_bytes(&series, 2, sample.data, sample.len);
    pb_bytes(&req, 1, series.data, series.len);
    CHECK(cp_gzip(req.data, req.len, 6, &gz) == 0);
    answer a = post(d.port, path, "Content-Type: application/proto\r\nContent-Encoding: gzip\r\n",
                    gz.data, gz.len, 0);
    expect(&a, 200, NULL);
    CHECK_STREQ(a.body, ""); /* an empty PushResponse */
    /* JSON: rawProfile in base64, camelCase */
    cp_buf pj = {0}, js = {0};
    make_pprof(&pj, "samples", "count", "cpu", "nanoseconds", "jsonFn", 2, 20000000);
    CHECK(cp_buf_printf(&js, "{\"series\":[{\"labels\":[{\"name\":\"service_name\",\"value\":"
                             "\"pushjson\"}],\"samples\":[{\"rawProfile\":\"") == 0);
    b64(&js, pj.data, pj.len);
    CHECK(cp_buf_printf(&js, "\",\"ID\":\"x\"}]}]}") == 0);
    a = post(d.port, path, "Content-Type: application/json\r\n", js.data, js.len, 0);
    expect(&a, 200, "{}");
    /* bad: no service_name; a form body */
    const char *nosvc = "{\"series\":[{\"labels\":[{\"name\":\"pod\",\"value\":\"x\"}],"
                        "\"samples\":[]}]}";
    a = post(d.port, path, "Content-Type: application/json\r\n", nosvc, strlen(nosvc), 0);
    expect(&a, 400, "\"code\":\"invalid_argument\"");
    CHECK_CONTAINS(a.body, "service_name is missing");
    a = post(d.port, path, "Content-Type: text/plain\r\n", "x", 1, 0);
    expect(&a, 415, "application/proto or application/json");
    char *s = wait_for(d.port,
                       "/api/v1/profile?type=cpu&from=-1h&format=folded&sample_type=samples&"
                       "select=%7Bservice%3D%22pushsvc%22%7D",
                       NULL, "pushFn");
    CHECK_STREQ(s, "main;work;pushFn 4\n");
    free(s);
    s = wait_for(d.port,
                 "/api/v1/profile?type=cpu&from=-1h&format=folded&sample_type=samples&"
                 "select=%7Bservice%3D%22pushjson%22%7D",
                 NULL, "jsonFn");
    CHECK_STREQ(s, "main;work;jsonFn 2\n");
    free(s);
    s = wait_for(d.port, "/api/v1/series", NULL, "\"service\":\"pushjson\"");
    CHECK_EQ(count_of(s), 2);
    CHECK_CONTAINS(s, "\"pod\":\"p1\"");
    free(s);
    CHECK_EQ(http_metric(d.port, "contprof_pyroscope_profiles_total", NULL), 2);
    cp_buf_close(&pp);
    cp_buf_close(&sample);
    cp_buf_close(&series);
    cp_buf_close(&req);
    cp_buf_close(&gz);
    cp_buf_close(&pj);
    cp_buf_close(&js);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* ingest.max_concurrent: while one request holds the only slot (its body still arriving),
 * another is 429 naming the setting; once the first is answered, the retry is stored. */
TEST(over_the_concurrent_limit_is_429)
{
    char *dir = proc_tmpdir("pyro", "limit");
    char conf[600];
    snprintf(conf, sizeof conf, "%s/contprofd.conf", dir);
    FILE *cf = fopen(conf, "w");
    CHECK(cf);
    fprintf(cf, "ingest.max_concurrent = 1\n");
    fclose(cf);
    proc d;
    start_daemon_data(&d, dir, 0, 0, conf);
    size_t fl = strlen(g_folded);
    /* the first: headers and half its body, the rest held back */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d.port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "POST /ingest?name=first HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: %zu\r\n\r\n%.10s",
                      fl, g_folded);
    CHECK(send(fd, head, (size_t)hn, 0) == hn);
    /* the second waits for nothing: refused while the first holds the slot. The first's
     * headers are read before the second connects only once the server has seen them:
     * retried until it answers 429 (an answer before is the first still unread: 200) */
    answer a = {0};
    for (int i = 0; i < 200; i++) {
        a = post(d.port, "/ingest?name=second", NULL, g_folded, fl, 0);
        if (a.status == 429) break;
        CHECK_EQ(a.status, 200);
        usleep(10000);
    }
    expect(&a, 429, "ingest.max_concurrent");
    CHECK(send(fd, g_folded + 10, fl - 10, 0) == (ssize_t)(fl - 10));
    char buf[4096];
    ssize_t n = 0, r;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while ((r = recv(fd, buf + n, sizeof buf - 1 - (size_t)n, 0)) > 0)
        n += r;
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    CHECK_CONTAINS(buf, "HTTP/1.1 200");
    a = post(d.port, "/ingest?name=second", NULL, g_folded, fl, 0);
    expect(&a, 200, "\"profiles\":1");
    free(wait_for(d.port, "/api/v1/series", NULL, "\"service\":\"first\""));
    free(wait_for(d.port, "/api/v1/series", NULL, "\"service\":\"second\""));
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* __delta__="false" (Push): a process's allocations since it started, sent twice; the store
 * keeps the second's difference, so the window sum is the last value, not both added. */
TEST(push_cumulative_profiles_are_subtracted)
{
    char *dir = proc_tmpdir("pyro", "cumul");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    const int64_t vals[2][2] = {{10, 1000}, {25, 2500}};
    for (int k = 0; k < 2; k++) {
        cp_buf pp = {0}, sample = {0}, series = {0}, req = {0};
        g_time_ns = (base_s() + 10 * k) * SEC;
        make_pprof(&pp, "alloc_objects", "count", "alloc_space", "bytes", "allocFn", vals[k][0],
                   vals[k][1]);
        g_time_ns = 0;
        pb_label(&series, "service_name", "heapy");
        pb_label(&series, "__delta__", "false");
        pb_bytes(&sample, 1, pp.data, pp.len);
        pb_bytes(&series, 2, sample.data, sample.len);
        pb_bytes(&req, 1, series.data, series.len);
        answer a = post(d.port, "/push.v1.PusherService/Push",
                        "Content-Type: application/proto\r\n", req.data, req.len, 0);
        expect(&a, 200, NULL);
        cp_buf_close(&pp);
        cp_buf_close(&sample);
        cp_buf_close(&series);
        cp_buf_close(&req);
        /* in order: the second is the difference from the first */
        char q[256];
        snprintf(q, sizeof q, "/api/v1/profile?type=alloc&%s&format=folded&sample_type=alloc_space",
                 window_q());
        char want[64];
        snprintf(want, sizeof want, "main;work;allocFn %lld\n", (long long)vals[k][1]);
        char *s = wait_for(d.port, q, NULL, want);
        CHECK_STREQ(s, want); /* 2500, not 3500 */
        free(s);
    }
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* querier.v1 in JSON, as Grafana's data source asks: ProfileTypes, LabelNames, LabelValues,
 * SelectMergeStacktraces of a folded profile stored over /ingest, the flame graph exact;
 * a bad profile type invalid_argument, another method unimplemented; the legacy
 * /pyroscope/render (flamebearer golden) and /pyroscope/label-values, their bad parameters
 * named. */
TEST(querier_json_as_grafana_asks)
{
    const int64_t b0 = base_s(); /* once: base_s() moves at each minute */
    char *dir = proc_tmpdir("pyro", "querier");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    char pq[256];
    snprintf(pq, sizeof pq, "/ingest?name=qapp%%7Benv%%3Dprod%%7D&from=%lld&until=%lld",
             (long long)b0, (long long)b0 + 10);
    answer a = post(d.port, pq, NULL, g_folded, strlen(g_folded), 0);
    expect(&a, 200, "\"profiles\":1");
    free(wait_for(d.port, "/api/v1/profile?type=cpu&from=-1h&format=folded", NULL, "hot"));
    /* the label index may answer after the profile: the selectors below need it */
    free(wait_for(d.port, "/api/v1/series?from=-1h&select=%7Bservice%3D%22qapp%22%7D", NULL,
                  "qapp"));
    const char *H = "Content-Type: application/json\r\n";
    const char *Q = "/querier.v1.QuerierService/";
    char path[128], body[512];
    long long start = (long long)(b0 - 60) * 1000, end = (long long)(b0 + 120) * 1000;
    snprintf(path, sizeof path, "%sProfileTypes", Q);
    snprintf(body, sizeof body, "{\"start\":\"%lld\",\"end\":%lld}", start, end);
    a = post(d.port, path, H, body, strlen(body), 0);
    expect(&a, 200,
           "{\"profileTypes\":[{\"ID\":\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\",\"name\":"
           "\"process_cpu\",\"sampleType\":\"cpu\",\"sampleUnit\":\"nanoseconds\",\"periodType\":"
           "\"cpu\",\"periodUnit\":\"nanoseconds\"},{\"ID\":\"process_cpu:samples:count:cpu:"
           "nanoseconds\"");
    snprintf(path, sizeof path, "%sLabelNames", Q);
    snprintf(body, sizeof body,
             "{\"matchers\":[\"{service_name=\\\"qapp\\\"}\"],\"start\":%lld,\"end\":%lld}", start,
             end);
    a = post(d.port, path, H, body, strlen(body), 0);
    expect(&a, 200, "{\"names\":[\"__profile_type__\",\"env\",\"service_name\"]}");
    snprintf(path, sizeof path, "%sLabelValues", Q);
    snprintf(body, sizeof body, "{\"name\":\"service_name\",\"start\":%lld,\"end\":%lld}", start,
             end);
    a = post(d.port, path, H, body, strlen(body), 0);
    expect(&a, 200, "{\"names\":[\"qapp\"]}");
    snprintf(path, sizeof path, "%sSelectMergeStacktraces", Q);
    snprintf(body, sizeof body,
             "{\"profile_typeID\":\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\","
             "\"labelSelector\":\"{service_name=\\\"qapp\\\"}\",\"start\":%lld,\"end\":\"%lld\"}",
             start, end);
    a = post(d.port, path, H, body, strlen(body), 0);
    /* total 45 samples at 10 ms; levels: total; main; work, idle; hot, cold */
    expect(&a, 200,
           "{\"flamegraph\":{\"names\":[\"total\",\"main\",\"work\",\"hot\",\"cold\",\"idle\"],"
           "\"levels\":[{\"values\":[\"0\",\"450000000\",\"0\",\"0\"]},{\"values\":[\"0\","
           "\"450000000\",\"0\",\"1\"]},{\"values\":[\"0\",\"400000000\",\"0\",\"2\",\"0\","
           "\"50000000\",\"50000000\",\"5\"]},{\"values\":[\"0\",\"300000000\",\"300000000\","
           "\"3\",\"0\",\"100000000\",\"100000000\",\"4\"]}],\"total\":\"450000000\","
           "\"maxSelf\":\"300000000\"}}");
    /* max_nodes 4: total, main, work, hot kept; idle and cold summed into an "other" bar
     * after their kept siblings (totals exact) */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\",\"labelSelector\":"
             "\"{service_name=\\\"qapp\\\"}\",\"start\":%lld,\"end\":%lld,\"maxNodes\":\"4\"}",
             start, end);
    a = post(d.port, path, H, body, strlen(body), 0);
    expect(&a, 200,
           "{\"flamegraph\":{\"names\":[\"total\",\"main\",\"work\",\"hot\",\"cold\",\"idle\","
           "\"other\"],\"levels\":[{\"values\":[\"0\",\"45\",\"0\",\"0\"]},{\"values\":[\"0\","
           "\"45\",\"0\",\"1\"]},{\"values\":[\"0\",\"40\",\"0\",\"2\",\"0\",\"5\",\"5\",\"6\"]},"
           "{\"values\":[\"0\",\"30\",\"30\",\"3\",\"0\",\"10\",\"10\",\"6\"]}],\"total\":\"45\","
           "\"maxSelf\":\"30\"}}");
    /* SelectSeries: the window's step holds the profile's total, per service when grouped */
    snprintf(path, sizeof path, "%sSelectSeries", Q);
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\",\"labelSelector\":"
             "\"{}\",\"start\":%lld,\"end\":%lld,\"step\":30}",
             start, end);
    a = post(d.port, path, H, body, strlen(body), 0);
    char want[1024];
    snprintf(want, sizeof want,
             "{\"series\":[{\"labels\":[],\"points\":[{\"value\":45,\"timestamp\":\"%lld\"}]}]}",
             (long long)b0 * 1000);
    expect(&a, 200, want);
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\",\"labelSelector\":"
             "\"{}\",\"start\":%lld,\"end\":%lld,\"step\":30,\"groupBy\":[\"service_name\"]}",
             start, end);
    a = post(d.port, path, H, body, strlen(body), 0);
    snprintf(want, sizeof want,
             "{\"series\":[{\"labels\":[{\"name\":\"service_name\",\"value\":\"qapp\"}],"
             "\"points\":[{\"value\":450000000,\"timestamp\":\"%lld\"}]}]}",
             (long long)b0 * 1000);
    expect(&a, 200, want);
    snprintf(path, sizeof path, "%sSelectMergeStacktraces", Q);
    /* another service: an empty graph */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\","
             "\"labelSelector\":\"{service_name=\\\"other\\\"}\",\"start\":%lld,\"end\":%lld}",
             start, end);
    a = post(d.port, path, H, body, strlen(body), 0);
    expect(&a, 200, "\"total\":\"0\"");
    snprintf(body, sizeof body, "{\"profileTypeID\":\"cpu\"}");
    a = post(d.port, path, H, body, strlen(body), 0);
    expect(&a, 400, "\"code\":\"invalid_argument\"");
    /* the legacy API: /pyroscope/render's flamebearer, /pyroscope/label-values */
    char lq[512];
    snprintf(lq, sizeof lq,
             "/pyroscope/render?query=process_cpu:samples:count:cpu:nanoseconds%%7Bservice_name"
             "%%3D%%22qapp%%22%%7D&from=%lld&until=%lld&format=json",
             (long long)b0 - 60, (long long)(b0 + 120) * 1000);
    a = request("GET", d.port, lq, NULL, "", 0, 0);
    /* the timeline: 18 steps of 10 s from the window's start, the profile's 45 at b0 */
    snprintf(want, sizeof want,
             "{\"version\":1,\"flamebearer\":{\"names\":[\"total\",\"main\",\"work\",\"hot\","
             "\"cold\",\"idle\"],\"levels\":[[0,45,0,0],[0,45,0,1],[0,40,0,2,0,5,5,5],[0,30,30,"
             "3,0,10,10,4]],\"numTicks\":45,\"maxSelf\":30},\"metadata\":{\"format\":"
             "\"single\",\"spyName\":\"\",\"sampleRate\":100,\"units\":\"samples\",\"name\":"
             "\"process_cpu:samples:count:cpu:nanoseconds\"},\"timeline\":{\"startTime\":%lld,"
             "\"samples\":[0,0,0,0,0,0,45,0,0,0,0,0,0,0,0,0,0,0],\"durationDelta\":10}}\n",
             (long long)b0 - 60);
    expect(&a, 200, want);
    a = request("GET", d.port, "/pyroscope/render?query=cpu%7B%7D&from=now-1h", NULL, "", 0, 0);
    expect(&a, 400, "does not start with a profile type");
    a = request(
        "GET", d.port,
        "/pyroscope/render?query=process_cpu:cpu:nanoseconds:cpu:nanoseconds&from=yesterday", NULL,
        "", 0, 0);
    expect(&a, 400, "from: bad time 'yesterday'");
    a = request("GET", d.port,
                "/pyroscope/render?query=process_cpu:cpu:nanoseconds:cpu:nanoseconds&color=red",
                NULL, "", 0, 0);
    expect(&a, 400, "color");
    snprintf(lq, sizeof lq,
             "/pyroscope/label-values?label=env&query=%%7Bservice_name%%3D%%22qapp%%22%%7D"
             "&from=%lld&until=%lld",
             (long long)b0 - 60, (long long)b0 + 120);
    a = request("GET", d.port, lq, NULL, "", 0, 0);
    expect(&a, 200, "[\"prod\"]");
    a = request("GET", d.port, "/pyroscope/label-values?label=service_name&from=now-1h", NULL, "",
                0, 0);
    expect(&a, 200, "[\"qapp\"]");
    a = request("GET", d.port, "/pyroscope/label-values?from=now-1h", NULL, "", 0, 0);
    expect(&a, 400, "label: missing");
    snprintf(path, sizeof path, "%sNoSuchMethod", Q);
    a = post(d.port, path, H, "{}", 2, 0);
    expect(&a, 404, "\"code\":\"unimplemented\"");
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* ---- querier.v1 in application/proto, from the field numbers --------------------------- */

static void pb_key_varint(cp_buf *b, uint32_t field, uint64_t v)
{
    pb_varint(b, (uint64_t)field << 3);
    pb_varint(b, v);
}

static void pb_str(cp_buf *b, uint32_t field, const char *s)
{
    pb_bytes(b, field, s, strlen(s));
}

/* The varint of field f in message [p, p+n) (fields of other wire types skipped); -1 if none. */
static int64_t pb_find_varint(const uint8_t *p, size_t n, uint32_t f)
{
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key = 0, v = 0;
        for (int s = 0; p < end; s += 7) {
            key |= (uint64_t)(*p & 0x7f) << s;
            if (!(*p++ & 0x80)) break;
        }
        if ((key & 7) == 0 || (key & 7) == 2)
            for (int s = 0; p < end; s += 7) {
                v |= (uint64_t)(*p & 0x7f) << s;
                if (!(*p++ & 0x80)) break;
            }
        if ((key & 7) == 0 && (key >> 3) == f) return (int64_t)v;
        if ((key & 7) == 2) p += v;
        if ((key & 7) == 1) p += 8;
        if ((key & 7) == 5) p += 4;
    }
    return -1;
}

/* The first length-delimited field f of [p, p+n) as (*out, *len); 0, or -1 if none. */
static int pb_find_bytes(const uint8_t *p, size_t n, uint32_t f, const uint8_t **out, size_t *len)
{
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key = 0, v = 0;
        for (int s = 0; p < end; s += 7) {
            key |= (uint64_t)(*p & 0x7f) << s;
            if (!(*p++ & 0x80)) break;
        }
        if ((key & 7) == 0 || (key & 7) == 2)
            for (int s = 0; p < end; s += 7) {
                v |= (uint64_t)(*p & 0x7f) << s;
                if (!(*p++ & 0x80)) break;
            }
        if ((key & 7) == 2 && (key >> 3) == f) {
            *out = p;
            *len = (size_t)v;
            return 0;
        }
        if ((key & 7) == 2) p += v;
        if ((key & 7) == 1) p += 8;
        if ((key & 7) == 5) p += 4;
    }
    return -1;
}

static void expect_bytes(const answer *a, const cp_buf *want)
{
    if (a->status != 200 || a->len != want->len || memcmp(a->body, want->data, want->len)) {
        fprintf(stderr, "expected %zu bytes, got %d with %zu:", want->len, a->status, a->len);
        for (size_t i = 0; i < a->len && i < 400; i++)
            fprintf(stderr, " %02x", (uint8_t)a->body[i]);
        fprintf(stderr, "\n");
    }
    CHECK_EQ(a->status, 200);
    CHECK_EQ(a->len, want->len);
    CHECK(memcmp(a->body, want->data, want->len) == 0);
}

/* The SDK's wall profile through SelectMergeStacktraces as Grafana asks it: JSON with
 * service_name, JSON with the Drilldown app's __profile_type__, and proto, the same total
 * (asked until two JSON answers agree: the SDK's last flush may still be arriving), its
 * functions among the names. */
static void sdk_flame_graph_totals(int port)
{
    const char *W = "wall:wall:nanoseconds:wall:nanoseconds";
    long long end = (long long)time(NULL) * 1000 + 60000, start = end - 20 * 60000;
    char body[512];
    long long t[3] = {-1, -2, -3};
    answer a;
    for (int tries = 0; tries < 50 && !(t[0] == t[1] && t[1] == t[2]); tries++, usleep(200000)) {
        for (int k = 0; k < 3; k++) {
            if (k < 2) {
                snprintf(body, sizeof body,
                         "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{%s%s%sservice_name="
                         "\\\"nodeapp\\\"}\",\"start\":\"%lld\",\"end\":\"%lld\"}",
                         W, k ? "__profile_type__=\\\"" : "", k ? W : "", k ? "\\\"," : "", start,
                         end);
                a = post(port, "/querier.v1.QuerierService/SelectMergeStacktraces",
                         "Content-Type: application/json\r\n", body, strlen(body), 0);
                expect(&a, 200, "\"total\":\"");
                if (!k)
                    CHECK_CONTAINS(a.body,
                                   "sdk_app.js:pyroHotLoop:"); /* the SDK names file:fn:line */
                t[k] = atoll(strstr(a.body, "\"total\":\"") + 9);
            } else {
                cp_buf req = {0};
                pb_str(&req, 1, W);
                pb_str(&req, 2, "{service_name=\"nodeapp\"}");
                pb_key_varint(&req, 3, (uint64_t)start);
                pb_key_varint(&req, 4, (uint64_t)end);
                a = post(port, "/querier.v1.QuerierService/SelectMergeStacktraces",
                         "Content-Type: application/proto\r\n", req.data, req.len, 0);
                cp_buf_close(&req);
                CHECK_EQ(a.status, 200);
                const uint8_t *fg;
                size_t fgn;
                CHECK(pb_find_bytes((const uint8_t *)a.body, a.len, 1, &fg, &fgn) == 0);
                t[k] = pb_find_varint(fg, fgn, 3);
            }
        }
    }
    if (!(t[0] == t[1] && t[1] == t[2]))
        fprintf(stderr, "totals: json %lld, drilldown %lld, proto %lld\n", t[0], t[1], t[2]);
    CHECK(t[0] > 0);
    CHECK_EQ(t[0], t[1]);
    CHECK_EQ(t[0], t[2]);
}

/* querier.v1 in application/proto, as Grafana's server side sends it: requests and golden
 * answers built here from the field numbers; ProfileTypes and SelectMergeStacktraces byte for
 * byte, the flame graph's total the JSON answer's; LabelNames, SelectSeries (the step's
 * double, a double value back), a gzip'd request; a truncated body invalid_argument in JSON. */
TEST(querier_proto_same_answers_as_json)
{
    const int64_t b0 = base_s(); /* once: base_s() moves at each minute */
    char *dir = proc_tmpdir("pyro", "querier_proto");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    char pq[256];
    snprintf(pq, sizeof pq, "/ingest?name=papp%%7Benv%%3Dprod%%7D&from=%lld&until=%lld",
             (long long)b0, (long long)b0 + 10);
    answer a = post(d.port, pq, NULL, g_folded, strlen(g_folded), 0);
    expect(&a, 200, "\"profiles\":1");
    free(wait_for(d.port, "/api/v1/profile?type=cpu&from=-1h&format=folded", NULL, "hot"));
    free(wait_for(d.port, "/api/v1/series?from=-1h&select=%7Bservice%3D%22papp%22%7D", NULL,
                  "papp"));
    const char *P = "Content-Type: application/proto\r\n";
    long long start = (long long)(b0 - 60) * 1000, end = (long long)(b0 + 120) * 1000;

    /* ProfileTypesRequest{1 start, 2 end} -> ProfileTypesResponse{1 ProfileType{1, 2, 4..7}} */
    cp_buf req = {0}, want = {0}, m = {0};
    pb_key_varint(&req, 1, (uint64_t)start);
    pb_key_varint(&req, 2, (uint64_t)end);
    a = post(d.port, "/querier.v1.QuerierService/ProfileTypes", P, req.data, req.len, 0);
    static const char *types[2][6] = {{"process_cpu:cpu:nanoseconds:cpu:nanoseconds", "process_cpu",
                                       "cpu", "nanoseconds", "cpu", "nanoseconds"},
                                      {"process_cpu:samples:count:cpu:nanoseconds", "process_cpu",
                                       "samples", "count", "cpu", "nanoseconds"}};
    for (int t = 0; t < 2; t++) {
        m.len = 0;
        for (int f = 0; f < 6; f++) /* ID 1, name 2, sample_type 4 ... period_unit 7 */
            pb_str(&m, (uint32_t)f + (f < 2 ? 1 : 2), types[t][f]);
        pb_bytes(&want, 1, m.data, m.len);
    }
    expect_bytes(&a, &want);

    /* SelectMergeStacktracesRequest{1 profile_typeID, 2 label_selector, 3 start, 4 end}
     * -> SelectMergeStacktracesResponse{1 FlameGraph{1 names, 2 Level{1 packed values},
     * 3 total, 4 max_self}}: the JSON test's graph */
    req.len = 0;
    pb_str(&req, 1, "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
    pb_str(&req, 2, "{service_name=\"papp\"}");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    a = post(d.port, "/querier.v1.QuerierService/SelectMergeStacktraces", P, req.data, req.len, 0);
    static const char *names[] = {"total", "main", "work", "hot", "cold", "idle"};
    static const int64_t levels[4][9] = {
        {4, 0, 450000000, 0, 0},
        {4, 0, 450000000, 0, 1},
        {8, 0, 400000000, 0, 2, 0, 50000000, 50000000, 5},
        {8, 0, 300000000, 300000000, 3, 0, 100000000, 100000000, 4}};
    m.len = 0;
    for (int i = 0; i < 6; i++)
        pb_str(&m, 1, names[i]);
    for (int l = 0; l < 4; l++) {
        cp_buf packed = {0}, level = {0};
        for (int k = 1; k <= levels[l][0]; k++)
            pb_varint(&packed, (uint64_t)levels[l][k]);
        pb_bytes(&level, 1, packed.data, packed.len);
        pb_bytes(&m, 2, level.data, level.len);
        cp_buf_close(&packed);
        cp_buf_close(&level);
    }
    pb_key_varint(&m, 3, 450000000);
    pb_key_varint(&m, 4, 300000000);
    want.len = 0;
    pb_bytes(&want, 1, m.data, m.len);
    expect_bytes(&a, &want);
    /* the same request in JSON: the same total */
    char body[512];
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\","
             "\"labelSelector\":\"{service_name=\\\"papp\\\"}\",\"start\":%lld,\"end\":%lld}",
             start, end);
    answer j = post(d.port, "/querier.v1.QuerierService/SelectMergeStacktraces",
                    "Content-Type: application/json\r\n", body, strlen(body), 0);
    expect(&j, 200, "\"total\":\"");
    const uint8_t *fg;
    size_t fgn;
    CHECK(pb_find_bytes((const uint8_t *)a.body, a.len, 1, &fg, &fgn) == 0);
    CHECK_EQ(pb_find_varint(fg, fgn, 3), atoll(strstr(j.body, "\"total\":\"") + 9));

    /* gzip'd, by Content-Encoding: the same answer */
    cp_buf gz = {0};
    CHECK(cp_gzip(req.data, req.len, 6, &gz) == 0);
    a = post(d.port, "/querier.v1.QuerierService/SelectMergeStacktraces",
             "Content-Type: application/proto\r\nContent-Encoding: gzip\r\n", gz.data, gz.len, 0);
    expect_bytes(&a, &want);
    cp_buf_close(&gz);

    /* LabelNamesRequest{1 matchers, 2 start, 3 end} -> LabelNamesResponse{1 names} */
    req.len = 0;
    pb_str(&req, 1, "{service_name=\"papp\"}");
    pb_key_varint(&req, 2, (uint64_t)start);
    pb_key_varint(&req, 3, (uint64_t)end);
    a = post(d.port, "/querier.v1.QuerierService/LabelNames", P, req.data, req.len, 0);
    want.len = 0;
    pb_str(&want, 1, "__profile_type__");
    pb_str(&want, 1, "env");
    pb_str(&want, 1, "service_name");
    expect_bytes(&a, &want);

    /* SelectSeriesRequest{1, 2, 3, 4, 6 step 30.0 (fixed64)} -> SelectSeriesResponse{1 Series{
     * 2 Point{1 value 45.0 (fixed64), 2 timestamp}}} */
    req.len = 0;
    pb_str(&req, 1, "process_cpu:samples:count:cpu:nanoseconds");
    pb_str(&req, 2, "{}");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    double step = 30, v45 = 45;
    uint8_t dbl[8];
    memcpy(dbl, &step, 8); /* little-endian, as the wire */
    pb_varint(&req, 6 << 3 | 1);
    CHECK(cp_buf_append(&req, dbl, 8) == 0);
    a = post(d.port, "/querier.v1.QuerierService/SelectSeries", P, req.data, req.len, 0);
    cp_buf point = {0}, series = {0};
    memcpy(dbl, &v45, 8);
    pb_varint(&point, 1 << 3 | 1);
    CHECK(cp_buf_append(&point, dbl, 8) == 0);
    pb_key_varint(&point, 2, (uint64_t)b0 * 1000);
    pb_bytes(&series, 2, point.data, point.len);
    want.len = 0;
    pb_bytes(&want, 1, series.data, series.len);
    expect_bytes(&a, &want);
    cp_buf_close(&point);
    cp_buf_close(&series);

    /* a truncated request: invalid_argument, in JSON as Connect's errors are */
    a = post(d.port, "/querier.v1.QuerierService/ProfileTypes", P, "\x08\xff", 2, 0);
    expect(&a, 400, "\"code\":\"invalid_argument\"");
    CHECK_CONTAINS(a.body, "querier.v1.ProfileTypesRequest");
    a = post(d.port, "/querier.v1.QuerierService/ProfileTypes", "Content-Type: text/plain\r\n", "",
             0, 0);
    expect(&a, 415, "\"code\":\"unimplemented\"");
    cp_buf_close(&req);
    cp_buf_close(&want);
    cp_buf_close(&m);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* A querier test's daemon and the range its requests ask (ms) around the windows stored at
 * b0 (s). */
typedef struct qwin {
    int port;
    int64_t b0;
    long long start, end;
} qwin;

static qwin qwin_at(int port, int64_t b0)
{
    return (qwin){port, b0, (long long)(b0 - 60) * 1000, (long long)(b0 + 120) * 1000};
}

static const char *const H_JSON = "Content-Type: application/json\r\n",
                         *const H_PROTO = "Content-Type: application/proto\r\n";
static const char *const PT_CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
                         *const PT_SMP = "process_cpu:samples:count:cpu:nanoseconds",
                         *const PT_AO = "memory:alloc_objects:count:space:bytes";

/* Series: label sets per profile type, label_names honoured; in proto, one set of one pair. */
static void rest_series(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[512];
    answer a;
    snprintf(body, sizeof body,
             "{\"matchers\":[\"{service_name=\\\"sapp\\\"}\"],\"labelNames\":[\"service_name\","
             "\"__profile_type__\",\"env\"],\"start\":%lld,\"end\":%lld}",
             start, end);
    a = post(q->port, "/querier.v1.QuerierService/Series", H_JSON, body, strlen(body), 0);
    expect(&a, 200,
           "{\"labelsSet\":[{\"labels\":[{\"name\":\"__profile_type__\",\"value\":\"process_cpu:"
           "cpu:nanoseconds:cpu:nanoseconds\"},{\"name\":\"env\",\"value\":\"prod\"},{\"name\":"
           "\"service_name\",\"value\":\"sapp\"}]},{\"labels\":[{\"name\":\"__profile_type__\","
           "\"value\":\"process_cpu:samples:count:cpu:nanoseconds\"},{\"name\":\"env\",\"value\":"
           "\"prod\"},{\"name\":\"service_name\",\"value\":\"sapp\"}]}]}");
    /* in proto, label_names service_name only: one set of one pair */
    cp_buf req = {0}, exp = {0}, m = {0}, l = {0};
    pb_str(&req, 1, "{service_name=\"tapp\"}");
    pb_str(&req, 2, "service_name");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    a = post(q->port, "/querier.v1.QuerierService/Series", H_PROTO, req.data, req.len, 0);
    pb_str(&l, 1, "service_name");
    pb_str(&l, 2, "tapp");
    pb_bytes(&m, 1, l.data, l.len);
    pb_bytes(&exp, 2, m.data, m.len); /* SeriesResponse's labels_set is field 2 */
    expect_bytes(&a, &exp);

    cp_buf_close(&req);
    cp_buf_close(&exp);
    cp_buf_close(&m);
    cp_buf_close(&l);
}

/* SelectSeries and its limit (the heavier service kept); SelectMergeProfile: pprof of the
 * one sample type. */
static void rest_select(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[512], want[1024];
    answer a;
    cp_buf req = {0};
    /* SelectSeries grouped by service, limit 1: the heavier, sapp (45 samples to tapp's 5) */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\",\"labelSelector\":"
             "\"{}\",\"start\":%lld,\"end\":%lld,\"step\":30,\"groupBy\":[\"service_name\"]%s}",
             start, end, "");
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    expect(&a, 200, "\"value\":\"tapp\"}],\"points\":[{\"value\":5,");
    CHECK_CONTAINS(a.body, "\"value\":\"sapp\"}],\"points\":[{\"value\":45,");
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\",\"labelSelector\":"
             "\"{}\",\"start\":%lld,\"end\":%lld,\"step\":30,\"groupBy\":[\"service_name\"],"
             "\"limit\":\"1\"}",
             start, end);
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    snprintf(want, sizeof want,
             "{\"series\":[{\"labels\":[{\"name\":\"service_name\",\"value\":\"sapp\"}],"
             "\"points\":[{\"value\":45,\"timestamp\":\"%lld\"}]}]}",
             (long long)q->b0 * 1000);
    expect(&a, 200, want);
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\",\"limit\":-1}");
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    expect(&a, 400, "limit");

    /* SelectMergeProfile: pprof of cpu alone, sapp's 450 ms */
    req.len = 0;
    pb_str(&req, 1, "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
    pb_str(&req, 2, "{service_name=\"sapp\"}");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeProfile", H_PROTO, req.data, req.len,
             0);
    CHECK_EQ(a.status, 200);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK(cp_pprof_decode((const uint8_t *)a.body, a.len, NULL, &p, &err) == 0);
    CHECK_EQ(p->sample_types.n, 1u);
    CHECK_STREQ(cp_profile_str(p, p->sample_types.v[0].type), "cpu");
    CHECK_EQ(cp_profile_total(p, 0), 450000000);
    cp_profile_destroy(p);
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\"}");

    cp_buf_close(&req);
}

/* Diff in JSON (golden) and proto (totals), its bad requests, and the legacy render-diff. */
static void rest_diff(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[512];
    answer a;
    cp_buf req = {0};
    /* Diff: sapp (left) against tapp (right) in samples; names from the left first, then
     * the right's new ones; each bar [left offset, total, self, right offset, total, self,
     * name] */
    snprintf(body, sizeof body,
             "{\"left\":{\"profileTypeID\":\"process_cpu:samples:count:cpu:nanoseconds\","
             "\"labelSelector\":\"{service_name=\\\"sapp\\\"}\",\"start\":%lld,\"end\":%lld},"
             "\"right\":{\"profile_typeID\":\"process_cpu:samples:count:cpu:nanoseconds\","
             "\"label_selector\":\"{service_name=\\\"tapp\\\"}\",\"start\":%lld,\"end\":%lld}}",
             start, end, start, end);
    a = post(q->port, "/querier.v1.QuerierService/Diff", H_JSON, body, strlen(body), 0);
    expect(&a, 200,
           "{\"flamegraph\":{\"names\":[\"total\",\"main\",\"work\",\"hot\",\"cold\",\"idle\","
           "\"x\"],\"levels\":[{\"values\":[\"0\",\"45\",\"0\",\"0\",\"5\",\"0\",\"0\"]},"
           "{\"values\":[\"0\",\"45\",\"0\",\"0\",\"5\",\"0\",\"1\"]},{\"values\":[\"0\",\"40\","
           "\"0\",\"0\",\"0\",\"0\",\"2\",\"0\",\"5\",\"5\",\"0\",\"0\",\"0\",\"5\",\"0\",\"0\","
           "\"0\",\"0\",\"5\",\"5\",\"6\"]},{\"values\":[\"0\",\"30\",\"30\",\"0\",\"0\",\"0\","
           "\"3\",\"0\",\"10\",\"10\",\"0\",\"0\",\"0\",\"4\"]}],\"total\":\"50\",\"maxSelf\":"
           "\"30\",\"leftTicks\":\"45\",\"rightTicks\":\"5\"}}");
    /* in proto: DiffRequest{1 left, 2 right} -> DiffResponse{1 FlameGraphDiff{3 total,
     * 5 leftTicks, 6 rightTicks}} */
    cp_buf side = {0};
    req.len = 0;
    for (int k = 0; k < 2; k++) {
        side.len = 0;
        pb_str(&side, 1, "process_cpu:samples:count:cpu:nanoseconds");
        pb_str(&side, 2, k ? "{service_name=\"tapp\"}" : "{service_name=\"sapp\"}");
        pb_key_varint(&side, 3, (uint64_t)start);
        pb_key_varint(&side, 4, (uint64_t)end);
        pb_bytes(&req, (uint32_t)k + 1, side.data, side.len);
    }
    cp_buf_close(&side);
    a = post(q->port, "/querier.v1.QuerierService/Diff", H_PROTO, req.data, req.len, 0);
    CHECK_EQ(a.status, 200);
    const uint8_t *fg;
    size_t fgn;
    CHECK(pb_find_bytes((const uint8_t *)a.body, a.len, 1, &fg, &fgn) == 0);
    CHECK_EQ(pb_find_varint(fg, fgn, 3), 50);
    CHECK_EQ(pb_find_varint(fg, fgn, 5), 45);
    CHECK_EQ(pb_find_varint(fg, fgn, 6), 5);
    a = post(q->port, "/querier.v1.QuerierService/Diff", H_JSON, "{\"left\":{}}", 11, 0);
    expect(&a, 400, "left.profile_typeID");
    a = post(q->port, "/querier.v1.QuerierService/Diff", H_JSON, "{}", 2, 0);
    expect(&a, 400, "left: missing");

    /* the legacy /pyroscope/render-diff: the same graph as a "double" flamebearer */
    char lq[768];
    snprintf(lq, sizeof lq,
             "/pyroscope/render-diff?leftQuery=process_cpu:samples:count:cpu:nanoseconds%%7B"
             "service_name%%3D%%22sapp%%22%%7D&leftFrom=%lld&leftUntil=%lld&rightQuery=process_"
             "cpu:samples:count:cpu:nanoseconds%%7Bservice_name%%3D%%22tapp%%22%%7D&rightFrom=%lld"
             "&rightUntil=%lld&format=json",
             (long long)q->b0 - 60, (long long)q->b0 + 120, (long long)q->b0 - 60,
             (long long)q->b0 + 120);
    a = request("GET", q->port, lq, NULL, "", 0, 0);
    expect(&a, 200,
           "{\"version\":1,\"flamebearer\":{\"names\":[\"total\",\"main\",\"work\",\"hot\","
           "\"cold\",\"idle\",\"x\"],\"levels\":[[0,45,0,0,5,0,0],[0,45,0,0,5,0,1],[0,40,0,0,0,0,"
           "2,0,5,5,0,0,0,5,0,0,0,0,5,5,6],[0,30,30,0,0,0,3,0,10,10,0,0,0,4]],\"numTicks\":50,"
           "\"maxSelf\":30,\"leftTicks\":45,\"rightTicks\":5},\"metadata\":{\"format\":"
           "\"double\",\"spyName\":\"\",\"sampleRate\":100,\"units\":\"samples\",\"name\":"
           "\"process_cpu:samples:count:cpu:nanoseconds\"},\"timeline\":null}");
    a = request("GET", q->port,
                "/pyroscope/render-diff?leftQuery=process_cpu:cpu:nanoseconds:cpu:nanoseconds",
                NULL, "", 0, 0);
    expect(&a, 400, "rightQuery");

    cp_buf_close(&req);
}

/* GetProfileStats (the stored window, in ms), JSON and proto; an unknown method. */
static void rest_stats(const qwin *q)
{
    char want[1024];
    answer a;
    cp_buf exp = {0};
    /* GetProfileStats: the stored windows, in ms */
    a = post(q->port, "/querier.v1.QuerierService/GetProfileStats", H_JSON, "{}", 2, 0);
    snprintf(want, sizeof want, "{\"dataIngested\":true,\"oldestProfileTime\":\"%lld\",",
             (long long)q->b0 * 1000);
    expect(&a, 200, want);
    a = post(q->port, "/querier.v1.QuerierService/GetProfileStats", H_PROTO, "", 0, 0);
    exp.len = 0;
    pb_key_varint(&exp, 1, 1);
    CHECK_EQ(a.status, 200);
    CHECK(a.len > 3 && memcmp(a.body, exp.data, exp.len) == 0);
    CHECK_EQ(pb_find_varint((const uint8_t *)a.body, a.len, 2), (int64_t)q->b0 * 1000);

    a = post(q->port, "/querier.v1.QuerierService/NoSuchMethod", H_PROTO, "", 0, 0);
    expect(&a, 404, "\"code\":\"unimplemented\"");
    cp_buf_close(&exp);
}

/* The rest of querier.v1 as Grafana's Profiles Drilldown calls it, over two services stored
 * over /ingest: Series (label sets per profile type, label_names honoured; JSON and proto),
 * SelectSeries' limit (the heavier service kept), SelectMergeProfile (pprof of the one
 * sample type, the flame graph's total), Diff (the two services' graphs in one, JSON golden,
 * proto totals; the legacy render-diff's flamebearer), GetProfileStats (the stored window, in ms);
 * an unknown method unimplemented. */
TEST(querier_series_profile_stats_limit)
{
    const int64_t b0 = base_s(); /* once: base_s() moves at each minute */
    char *dir = proc_tmpdir("pyro", "querier_rest");
    proc d;
    start_daemon_data(&d, dir, 0, 0, NULL);
    char pq[256];
    snprintf(pq, sizeof pq, "/ingest?name=sapp%%7Benv%%3Dprod%%7D&from=%lld&until=%lld",
             (long long)b0, (long long)b0 + 10);
    answer a = post(d.port, pq, NULL, g_folded, strlen(g_folded), 0);
    expect(&a, 200, "\"profiles\":1");
    const char *small = "main;x 5\n";
    snprintf(pq, sizeof pq, "/ingest?name=tapp&from=%lld&until=%lld", (long long)b0,
             (long long)b0 + 10);
    a = post(d.port, pq, NULL, small, strlen(small), 0);
    expect(&a, 200, "\"profiles\":1");
    free(wait_for(
        d.port, "/api/v1/profile?type=cpu&from=-1h&format=folded&select=%7Bservice%3D%22tapp%22%7D",
        NULL, "main;x"));
    free(wait_for(
        d.port, "/api/v1/profile?type=cpu&from=-1h&format=folded&select=%7Bservice%3D%22sapp%22%7D",
        NULL, "hot"));
    free(wait_for(d.port, "/api/v1/series?from=-1h&select=%7Bservice%3D%22sapp%22%7D", NULL,
                  "sapp"));
    const qwin q = qwin_at(d.port, b0);
    rest_series(&q);
    rest_select(&q);
    rest_diff(&q);
    rest_stats(&q);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* Two profile types of one service, fapp: cpu (g_folded, label env) and alloc objects
 * ("main;alloc 7", label pool), stored over /ingest at b0. */
static void store_two_types(proc *d, int64_t b0)
{
    char pq[256];
    snprintf(pq, sizeof pq, "/ingest?name=fapp%%7Benv%%3Dprod%%7D&from=%lld&until=%lld",
             (long long)b0, (long long)b0 + 10);
    answer a = post(d->port, pq, NULL, g_folded, strlen(g_folded), 0);
    expect(&a, 200, "\"profiles\":1");
    snprintf(pq, sizeof pq, "/ingest?name=fapp%%7Bpool%%3Da%%7D&from=%lld&until=%lld&units=objects",
             (long long)b0, (long long)b0 + 10);
    a = post(d->port, pq, NULL, "main;alloc 7\n", 13, 0);
    expect(&a, 200, "\"profiles\":1");
    free(wait_for(d->port, "/api/v1/profile?type=cpu&from=-1h&format=folded", NULL, "hot"));
    free(wait_for(d->port,
                  "/api/v1/profile?type=alloc&from=-1h&format=folded&sample_type=alloc_objects",
                  NULL, "alloc"));
    free(wait_for(d->port, "/api/v1/series?from=-1h&select=%7Bpool%3D%22a%22%7D", NULL, "fapp"));
    free(wait_for(d->port, "/api/v1/series?from=-1h&select=%7Benv%3D%22prod%22%7D", NULL, "fapp"));
}

/* SelectMergeStacktraces, JSON and proto: the request's type in the selector (equal, by
 * regex, by __name__) selects; another type is an empty graph. */
static void ptype_stacktraces(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[1024];
    /* SelectMergeStacktraces: the request's type in the selector, equal or by regex */
    const char *sels[] = {"{__profile_type__=\\\"%s\\\", service_name=\\\"fapp\\\"}",
                          "{__profile_type__=~\\\"process_cpu:.*\\\",service_name=\\\"fapp\\\"}",
                          "{__name__=\\\"process_cpu\\\",service_name=\\\"fapp\\\"}"};
    for (int i = 0; i < 3; i++) {
        char sel[256];
        snprintf(sel, sizeof sel, sels[i], PT_CPU);
        snprintf(body, sizeof body,
                 "{\"profileTypeID\":\"%s\",\"labelSelector\":\"%s\",\"start\":%lld,\"end\":%lld}",
                 PT_CPU, sel, start, end);
        answer a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
                        strlen(body), 0);
        expect(&a, 200, "\"total\":\"450000000\"");
    }
    /* another type than the request's: an empty graph */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{__profile_type__=\\\"%s\\\","
             "service_name=\\\"fapp\\\"}\",\"start\":%lld,\"end\":%lld}",
             PT_CPU, PT_AO, start, end);
    answer a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
                    strlen(body), 0);
    expect(&a, 200,
           "{\"flamegraph\":{\"names\":[\"total\"],\"levels\":[{\"values\":[\"0\",\"0\","
           "\"0\",\"0\"]}],\"total\":\"0\",\"maxSelf\":\"0\"}}");
    /* the same two in proto: total 450000000, then none (proto3 leaves 0 out) */
    for (int k = 0; k < 2; k++) {
        cp_buf req = {0};
        char sel[256];
        snprintf(sel, sizeof sel, "{__profile_type__=\"%s\",service_name=\"fapp\"}",
                 k ? PT_AO : PT_CPU);
        pb_str(&req, 1, PT_CPU);
        pb_str(&req, 2, sel);
        pb_key_varint(&req, 3, (uint64_t)start);
        pb_key_varint(&req, 4, (uint64_t)end);
        a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_PROTO, req.data,
                 req.len, 0);
        CHECK_EQ(a.status, 200);
        const uint8_t *fg;
        size_t fgn;
        CHECK(pb_find_bytes((const uint8_t *)a.body, a.len, 1, &fg, &fgn) == 0);
        CHECK_EQ(pb_find_varint(fg, fgn, 3), k ? -1 : 450000000);
        cp_buf_close(&req);
    }
}

/* LabelNames and LabelValues: the names and values of the selected type's series only. */
static void ptype_labels(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[1024];
    answer a;
    /* LabelNames: the labels of the selected type's series only */
    snprintf(body, sizeof body,
             "{\"matchers\":[\"{__profile_type__=\\\"%s\\\",service_name=\\\"fapp\\\"}\"],"
             "\"start\":%lld,\"end\":%lld}",
             PT_CPU, start, end);
    a = post(q->port, "/querier.v1.QuerierService/LabelNames", H_JSON, body, strlen(body), 0);
    expect(&a, 200, "{\"names\":[\"__profile_type__\",\"env\",\"service_name\"]}");
    cp_buf req = {0}, exp = {0};
    char sel[256];
    snprintf(sel, sizeof sel, "{__profile_type__=\"%s\",service_name=\"fapp\"}", PT_AO);
    pb_str(&req, 1, sel);
    pb_key_varint(&req, 2, (uint64_t)start);
    pb_key_varint(&req, 3, (uint64_t)end);
    a = post(q->port, "/querier.v1.QuerierService/LabelNames", H_PROTO, req.data, req.len, 0);
    pb_str(&exp, 1, "__profile_type__");
    pb_str(&exp, 1, "pool");
    pb_str(&exp, 1, "service_name");
    expect_bytes(&a, &exp);
    /* without a selector: every name of the tenant */
    a = post(q->port, "/querier.v1.QuerierService/LabelNames", H_JSON, "{}", 2, 0);
    expect(&a, 200, "{\"names\":[\"__profile_type__\",\"env\",\"pool\",\"service_name\"]}");

    /* LabelValues: of __profile_type__ narrowed by __name__; of env for the memory type: none */
    snprintf(body, sizeof body,
             "{\"name\":\"__profile_type__\",\"matchers\":[\"{__name__=\\\"memory\\\","
             "service_name=\\\"fapp\\\"}\"],\"start\":%lld,\"end\":%lld}",
             start, end);
    a = post(q->port, "/querier.v1.QuerierService/LabelValues", H_JSON, body, strlen(body), 0);
    expect(&a, 200,
           "{\"names\":[\"memory:alloc_objects:count:space:bytes\","
           "\"memory:alloc_space:bytes:space:bytes\"]}");
    snprintf(body, sizeof body,
             "{\"name\":\"env\",\"matchers\":[\"{__profile_type__=\\\"%s\\\"}\"],\"start\":%lld,"
             "\"end\":%lld}",
             PT_AO, start, end);
    a = post(q->port, "/querier.v1.QuerierService/LabelValues", H_JSON, body, strlen(body), 0);
    expect(&a, 200, "{\"names\":[]}");
    snprintf(body, sizeof body,
             "{\"name\":\"service_name\",\"matchers\":[\"{__profile_type__=\\\"%s\\\"}\"],"
             "\"start\":%lld,\"end\":%lld}",
             PT_AO, start, end);
    a = post(q->port, "/querier.v1.QuerierService/LabelValues", H_JSON, body, strlen(body), 0);
    expect(&a, 200, "{\"names\":[\"fapp\"]}");

    cp_buf_close(&req);
    cp_buf_close(&exp);
}

/* Series, SelectSeries, SelectMergeProfile and Diff: the selected type's, empty for
 * another type. */
static void ptype_series(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[1024], want[1024], sel[256];
    answer a;
    cp_buf req = {0};
    snprintf(sel, sizeof sel, "{__profile_type__=\"%s\",service_name=\"fapp\"}", PT_AO);
    /* Series: only the selected type's label sets */
    snprintf(body, sizeof body,
             "{\"matchers\":[\"{__profile_type__=\\\"memory:alloc_space:bytes:space:bytes\\\"}\"],"
             "\"labelNames\":[\"__profile_type__\",\"service_name\"],\"start\":%lld,\"end\":%lld}",
             start, end);
    a = post(q->port, "/querier.v1.QuerierService/Series", H_JSON, body, strlen(body), 0);
    expect(&a, 200,
           "{\"labelsSet\":[{\"labels\":[{\"name\":\"__profile_type__\",\"value\":\"memory:"
           "alloc_space:bytes:space:bytes\"},{\"name\":\"service_name\",\"value\":\"fapp\"}]}]}");

    /* SelectSeries: the type's points, or none for another type */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{__profile_type__=\\\"%s\\\"}\","
             "\"start\":%lld,\"end\":%lld,\"step\":30}",
             PT_AO, PT_AO, start, end);
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    snprintf(want, sizeof want,
             "{\"series\":[{\"labels\":[],\"points\":[{\"value\":7,\"timestamp\":\"%lld\"}]}]}",
             (long long)q->b0 * 1000);
    expect(&a, 200, want);
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{__profile_type__=\\\"%s\\\"}\","
             "\"start\":%lld,\"end\":%lld,\"step\":30}",
             PT_AO, PT_CPU, start, end);
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    expect(&a, 200, "{\"series\":[]}");

    /* SelectMergeProfile of another type: an empty pprof */
    req.len = 0;
    pb_str(&req, 1, PT_CPU);
    pb_str(&req, 2, sel); /* PT_AO's */
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeProfile", H_PROTO, req.data, req.len,
             0);
    CHECK_EQ(a.status, 200);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK(cp_pprof_decode((const uint8_t *)a.body, a.len, NULL, &p, &err) == 0);
    CHECK_EQ(p->samples.n, 0u);
    cp_profile_destroy(p);

    /* Diff: a right side of another type is empty */
    snprintf(
        body, sizeof body,
        "{\"left\":{\"profileTypeID\":\"%s\",\"labelSelector\":\"{service_name=\\\"fapp\\\"}\","
        "\"start\":%lld,\"end\":%lld},\"right\":{\"profileTypeID\":\"%s\",\"labelSelector\":"
        "\"{__profile_type__=\\\"%s\\\"}\",\"start\":%lld,\"end\":%lld}}",
        PT_CPU, start, end, PT_CPU, PT_AO, start, end);
    a = post(q->port, "/querier.v1.QuerierService/Diff", H_JSON, body, strlen(body), 0);
    expect(&a, 200, "\"leftTicks\":\"450000000\",\"rightTicks\":\"0\"");

    cp_buf_close(&req);
}

/* The legacy render and label-values; a bad regex on __profile_type__ named. */
static void ptype_legacy(const qwin *q)
{
    char body[1024];
    answer a;
    /* the legacy API: render and label-values */
    char lq[512];
    snprintf(
        lq, sizeof lq,
        "/pyroscope/render?query=%s%%7B__profile_type__%%3D%%22%s%%22%%7D&from=%lld&until=%lld",
        PT_AO, PT_AO, (long long)q->b0 - 60, (long long)q->b0 + 120);
    a = request("GET", q->port, lq, NULL, "", 0, 0);
    expect(&a, 200, "\"numTicks\":7,");
    snprintf(
        lq, sizeof lq,
        "/pyroscope/render?query=%s%%7B__profile_type__%%3D%%22%s%%22%%7D&from=%lld&until=%lld",
        PT_AO, PT_CPU, (long long)q->b0 - 60, (long long)q->b0 + 120);
    a = request("GET", q->port, lq, NULL, "", 0, 0);
    expect(&a, 200, "\"numTicks\":0,");
    CHECK_CONTAINS(a.body, "\"samples\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]");
    snprintf(lq, sizeof lq,
             "/pyroscope/label-values?label=pool&query=%%7B__profile_type__%%3D%%22%s%%22%%7D"
             "&from=%lld&until=%lld",
             PT_CPU, (long long)q->b0 - 60, (long long)q->b0 + 120);
    a = request("GET", q->port, lq, NULL, "", 0, 0);
    expect(&a, 200, "[]");
    snprintf(lq, sizeof lq,
             "/pyroscope/label-values?label=pool&query=%%7B__profile_type__%%3D%%22%s%%22%%7D"
             "&from=%lld&until=%lld",
             PT_AO, (long long)q->b0 - 60, (long long)q->b0 + 120);
    a = request("GET", q->port, lq, NULL, "", 0, 0);
    expect(&a, 200, "[\"a\"]");

    /* a bad regex on __profile_type__: invalid_argument naming the selector */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{__profile_type__=~\\\"a++*\\\"}\"}",
             PT_CPU);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
             strlen(body), 0);
    expect(&a, 400, "label_selector: ");
}

/* A daemon in a new directory (name) holding store_two_types' windows at base_s(). */
static qwin start_with_two_types(proc *d, const char *name, char **dir)
{
    const int64_t b0 = base_s();
    *dir = proc_tmpdir("pyro", name);
    start_daemon_data(d, *dir, 0, 0, NULL);
    store_two_types(d, b0);
    return qwin_at(d->port, b0);
}

/* What Grafana's Profiles Drilldown app puts in its selectors: __profile_type__ (and
 * __name__) select the profile type, another type than the request's is an empty answer
 * (not an error), service_name is contprof's service; in every querier method, JSON and
 * proto, and the legacy render and label-values. */
TEST(querier_profile_type_in_selectors)
{
    proc d;
    char *dir;
    const qwin q = start_with_two_types(&d, "ptype", &dir);
    ptype_stacktraces(&q);
    ptype_labels(&q);
    ptype_series(&q);
    ptype_legacy(&q);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

/* The sum of column col of the samples' "value" arrays (proto3 JSON: int64 strings). */
static int64_t sum_json_values(const cp_json *samples, uint32_t col)
{
    int64_t sum = 0;
    for (uint32_t i = 0; i < samples->n; i++) {
        const cp_json *v = cp_json_get(samples->items[i], "value");
        CHECK(v && v->type == CP_JSON_ARRAY && v->n > col);
        CHECK(v->items[col]->type == CP_JSON_STRING); /* int64 as a string */
        sum += atoll(v->items[col]->str);
    }
    return sum;
}

/* A StackTraceSelector of the call site main;idle: its Location{1 name} messages (field 1). */
static void callsite_main_idle(cp_buf *sts)
{
    cp_buf loc = {0};
    const char *site[] = {"main", "idle"};
    for (int i = 0; i < 2; i++) {
        loc.len = 0;
        pb_str(&loc, 1, site[i]);
        pb_bytes(sts, 1, loc.data, loc.len);
    }
    cp_buf_close(&loc);
}

/* SelectMergeStacktraces in JSON: each call site's total, and the graph under main;work. */
static void callsite_stacktraces(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[1024], want[1024];
    /* g_folded: main;work;hot 30, main;work;cold 10, main;idle 5 (10 ms each) */
    static const struct {
        const char *sites;
        int64_t total;
    } cases[] = {{"{\"name\":\"main\"},{\"name\":\"work\"}", 400000000},
                 {"{\"name\":\"main\"},{\"name\":\"work\"},{\"name\":\"hot\"}", 300000000},
                 {"{\"name\":\"main\"}", 450000000},
                 {"{\"name\":\"work\"}", 0},
                 {"", 450000000}};
    for (int i = 0; i < 5; i++) {
        snprintf(body, sizeof body,
                 "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{service_name=\\\"fapp\\\"}\","
                 "\"start\":%lld,\"end\":%lld,\"stackTraceSelector\":{\"callSite\":[%s]}}",
                 PT_CPU, start, end, cases[i].sites);
        answer a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
                        strlen(body), 0);
        snprintf(want, sizeof want, "\"total\":\"%lld\"", (long long)cases[i].total);
        expect(&a, 200, want);
    }
    /* the graph under main;work keeps hot and cold, not idle */
    snprintf(body, sizeof body,
             "{\"profile_typeID\":\"%s\",\"label_selector\":\"{}\",\"start\":%lld,\"end\":%lld,"
             "\"stack_trace_selector\":{\"call_site\":[{\"name\":\"main\"},{\"name\":\"work\"}]}}",
             PT_SMP, start, end);
    answer a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
                    strlen(body), 0);
    expect(&a, 200,
           "{\"flamegraph\":{\"names\":[\"total\",\"main\",\"work\",\"hot\",\"cold\"],\"levels\":"
           "[{\"values\":[\"0\",\"40\",\"0\",\"0\"]},{\"values\":[\"0\",\"40\",\"0\",\"1\"]},"
           "{\"values\":[\"0\",\"40\",\"0\",\"2\"]},{\"values\":[\"0\",\"30\",\"30\",\"3\",\"0\","
           "\"10\",\"10\",\"4\"]}],\"total\":\"40\",\"maxSelf\":\"30\"}}");
}

/* In proto: SelectMergeStacktraces and SelectMergeProfile (pprof) under main;idle. */
static void callsite_proto(const qwin *q)
{
    long long start = q->start, end = q->end;
    answer a;
    cp_buf req = {0}, sts = {0};
    callsite_main_idle(&sts);
    /* proto: SelectMergeStacktracesRequest{7 StackTraceSelector{1 Location{1 name}...}} */
    pb_str(&req, 1, PT_CPU);
    pb_str(&req, 2, "{service_name=\"fapp\"}");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    pb_bytes(&req, 7, sts.data, sts.len);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_PROTO, req.data,
             req.len, 0);
    CHECK_EQ(a.status, 200);
    const uint8_t *fg;
    size_t fgn;
    CHECK(pb_find_bytes((const uint8_t *)a.body, a.len, 1, &fg, &fgn) == 0);
    CHECK_EQ(pb_find_varint(fg, fgn, 3), 50000000);

    /* SelectMergeProfileRequest{6 stack_trace_selector}: pprof of main;idle's 50 ms */
    req.len = 0;
    pb_str(&req, 1, PT_CPU);
    pb_str(&req, 2, "{service_name=\"fapp\"}");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    pb_bytes(&req, 6, sts.data, sts.len);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeProfile", H_PROTO, req.data, req.len,
             0);
    CHECK_EQ(a.status, 200);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK(cp_pprof_decode((const uint8_t *)a.body, a.len, NULL, &p, &err) == 0);
    CHECK_EQ(p->samples.n, 1u);
    CHECK_EQ(cp_profile_total(p, 0), 50000000);
    cp_profile_destroy(p);

    cp_buf_close(&req);
    cp_buf_close(&sts);
}

/* SelectMergeProfile in JSON: the stack under main;work. */
static void callsite_pprof_json(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[1024];
    answer a;
    cp_err err = {0};
    /* SelectMergeProfile in JSON: google.v1.Profile's proto3 JSON, int64s as strings; the
     * stack under main;work: 400 ms over two samples whose frames name hot and cold */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{service_name=\\\"fapp\\\"}\","
             "\"start\":\"%lld\",\"end\":\"%lld\",\"stackTraceSelector\":{\"callSite\":["
             "{\"name\":\"main\"},{\"name\":\"work\"}]}}",
             PT_CPU, start, end);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeProfile", H_JSON, body, strlen(body),
             0);
    CHECK_EQ(a.status, 200);
    cp_json *j = NULL;
    CHECK(cp_json_parse(a.body, a.len, &j, &err) == 0);
    const cp_json *types = cp_json_get(j, "sampleType"), *strs = cp_json_get(j, "stringTable"),
                  *samples = cp_json_get(j, "sample"), *locs = cp_json_get(j, "location"),
                  *fns = cp_json_get(j, "function");
    CHECK(types && types->n == 1 && strs && samples && locs && fns);
    CHECK_STREQ(strs->items[atoi(cp_json_str(cp_json_get(types->items[0], "type"), "0"))]->str,
                "cpu");
    CHECK_EQ(samples->n, 2u);
    CHECK_EQ(sum_json_values(samples, 0), 400000000);
    /* each sample's leaf (its first location) names hot or cold through the tables */
    int seen = 0;
    for (uint32_t i = 0; i < samples->n; i++) {
        const cp_json *ids = cp_json_get(samples->items[i], "locationId");
        CHECK(ids && ids->n == 3 && ids->items[0]->type == CP_JSON_STRING);
        const cp_json *l = locs->items[atoi(ids->items[0]->str) - 1];
        CHECK_STREQ(cp_json_str(cp_json_get(l, "id"), ""), ids->items[0]->str);
        const cp_json *line = cp_json_get(l, "line")->items[0];
        const cp_json *f = fns->items[atoi(cp_json_str(cp_json_get(line, "functionId"), "0")) - 1];
        const char *nm = strs->items[atoi(cp_json_str(cp_json_get(f, "name"), "0"))]->str;
        seen |= !strcmp(nm, "hot") ? 1 : !strcmp(nm, "cold") ? 2 : 4;
    }
    CHECK_EQ(seen, 3);
    cp_json_free(j);
}

/* SelectSeries under a call site, JSON and proto; too many steps; go_pgo and a bad call
 * site refused by name. */
static void callsite_series(const qwin *q)
{
    long long start = q->start, end = q->end;
    char body[1024], want[1024];
    answer a;
    cp_buf req = {0}, sts = {0};
    callsite_main_idle(&sts);
    /* SelectSeries: the step's value under the call site, JSON and proto (field 8) */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"labelSelector\":\"{}\",\"start\":%lld,\"end\":%lld,"
             "\"step\":30,\"groupBy\":[\"service_name\"],\"stackTraceSelector\":{\"callSite\":["
             "{\"name\":\"main\"},{\"name\":\"work\"},{\"name\":\"cold\"}]}}",
             PT_SMP, start, end);
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    snprintf(want, sizeof want,
             "{\"series\":[{\"labels\":[{\"name\":\"service_name\",\"value\":\"fapp\"}],"
             "\"points\":[{\"value\":10,\"timestamp\":\"%lld\"}]}]}",
             (long long)q->b0 * 1000);
    expect(&a, 200, want);
    req.len = 0;
    pb_str(&req, 1, PT_SMP);
    pb_str(&req, 2, "{}");
    pb_key_varint(&req, 3, (uint64_t)start);
    pb_key_varint(&req, 4, (uint64_t)end);
    pb_bytes(&req, 8, sts.data, sts.len); /* main;idle: 5 */
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_PROTO, req.data, req.len, 0);
    CHECK_EQ(a.status, 200);
    const uint8_t *ser, *pt;
    size_t sern, ptn;
    CHECK(pb_find_bytes((const uint8_t *)a.body, a.len, 1, &ser, &sern) == 0);
    CHECK(pb_find_bytes(ser, sern, 2, &pt, &ptn) == 0);
    double v;
    CHECK(ptn > 9 && pt[0] == (1 << 3 | 1));
    memcpy(&v, pt + 1, 8);
    CHECK(v == 5);
    /* too many steps for per-step profile reads; go_pgo */
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"start\":%lld,\"end\":%lld,\"step\":10,"
             "\"stackTraceSelector\":{\"callSite\":[{\"name\":\"main\"}]}}",
             PT_SMP, start - 86400000LL, end);
    a = post(q->port, "/querier.v1.QuerierService/SelectSeries", H_JSON, body, strlen(body), 0);
    expect(&a, 400, "with a stack_trace_selector");
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"stackTraceSelector\":{\"goPgo\":{\"keepLocations\":5}}}",
             PT_CPU);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
             strlen(body), 0);
    expect(&a, 400, "go_pgo");
    snprintf(body, sizeof body,
             "{\"profileTypeID\":\"%s\",\"stackTraceSelector\":{\"callSite\":[{\"name\":1}]}}",
             PT_CPU);
    a = post(q->port, "/querier.v1.QuerierService/SelectMergeStacktraces", H_JSON, body,
             strlen(body), 0);
    expect(&a, 400, "call_site[0]");
    cp_buf_close(&req);
    cp_buf_close(&sts);
}

/* stack_trace_selector's call_site: only the samples whose stack begins at the root with
 * the names, in SelectMergeStacktraces, SelectMergeProfile (pprof and its JSON) and
 * SelectSeries, JSON and proto; a call site not at the root selects nothing; go_pgo
 * refused by name. */
TEST(querier_stack_trace_selector_and_pprof_json)
{
    proc d;
    char *dir;
    const qwin q = start_with_two_types(&d, "callsite", &dir);
    callsite_stacktraces(&q);
    callsite_proto(&q);
    callsite_pprof_json(&q);
    callsite_series(&q);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    free(dir);
}

TEST_MAIN(T(node_sdk_functions_show_in_top_and_the_api), T(folded_text_in_each_time_unit),
          T(multipart_with_sample_type_config), T(bad_input_gets_its_code_and_nothing_is_stored),
          T(tenants_from_bearer_basic_and_org_id), T(push_in_gzipd_protobuf_and_json),
          T(querier_json_as_grafana_asks), T(push_cumulative_profiles_are_subtracted),
          T(over_the_concurrent_limit_is_429), T(querier_proto_same_answers_as_json),
          T(querier_series_profile_stats_limit), T(querier_profile_type_in_selectors),
          T(querier_stack_trace_selector_and_pprof_json))
