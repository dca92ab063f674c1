/* contprofd's query API under hostile and careless clients, over real TCP on loopback with a
 * real store: costly focus regexes meet query.timeout, cheap requests are not starved by
 * expensive ones, clients that do not read hold a bounded amount of memory and are cut off
 * by the write timeout, and trickling clients (slowloris) lock nobody out. */
#include <errno.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <time.h>

#include "config.h"
#include "fixture.h"
#include "qtest.h"
#include "synth.h"

#ifdef __SANITIZE_ADDRESS__
/* ASan keeps freed memory in a quarantine (256 MiB by default): it would count as held here.
 * Its redzones and shadow still add a little to what the test measures. */
const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void)
{
    return "quarantine_size_mb=0";
}
#endif

#define S(x) ((int64_t)(x)*1000000000LL)
static const int64_t T0 = 1764000000;

static int64_t ms_now(void)
{
    return cp_mono_ns() / 1000000;
}

static const char *body(cp_http_result *r)
{
    return (const char *)r->body.data;
}

/* Resident set size of this process (the server runs in it), bytes. */
static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f);
    unsigned long size = 0, res = 0;
    CHECK(fscanf(f, "%lu %lu", &size, &res) == 2);
    fclose(f);
    return (size_t)res * 4096;
}

/* A connected TCP socket to port from the loopback address src ("127.0.0.2"), with a
 * receive buffer of rcvbuf bytes (0 = default). */
static int dial(const char *src, int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    if (rcvbuf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (src) {
        CHECK(inet_pton(AF_INET, src, &a.sin_addr) == 1);
        CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    }
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(0x7f000001);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static void send_all(int fd, const char *s)
{
    size_t n = strlen(s);
    CHECK(send(fd, s, n, MSG_NOSIGNAL) == (ssize_t)n);
}

/* 0 once the peer closed or reset the connection (seen without reading what it holds). */
static int open_(int fd)
{
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    CHECK(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) == 0);
    return ti.tcpi_state == TCP_ESTABLISHED;
}

/* ---- costly regexes and the deadline ----------------------------------------------- */

typedef struct bgq {
    qfx *f;
    char pq[1024];
    cp_http_result r;
    int64_t ms;
    atomic_int done;
    pthread_t th;
} bgq;

static void *bg_run(void *arg)
{
    bgq *b = arg;
    int64_t t0 = ms_now();
    b->r = qfx_get(b->f, b->pq, NULL);
    b->ms = ms_now() - t0;
    atomic_store(&b->done, 1);
    return NULL;
}

/* 2,000 functions with 1 KB names, each under main: the filter must run the regex against
 * every one of them. */
static void fill_long_names(qfx *f)
{
    cp_profile *p = qt_cpu_profile();
    char stack[1200];
    for (int i = 0; i < 2000; i++) {
        int n = snprintf(stack, sizeof stack, "main;fn_%04d_", i);
        memset(stack + n, 'x', 1000);
        stack[n + 1000] = 0;
        qt_add(p, stack, 1, 10000000);
    }
    p->time_nanos = S(T0);
    p->duration_nanos = S(10);
    qfx_add(f, "default", CP_KIND_CPU, "service=api", S(T0), p);
    qfx_commit(f);
    cp_profile_destroy(p);
}

TEST(costly_focus_meets_the_deadline_and_series_is_not_starved)
{
    signal(SIGPIPE, SIG_IGN); /* as contprofd: the server writes to clients that go away */
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_long_names(&f);
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.concurrency = 2;
    ho.query_timeout_ns = S(2);
    qfx_serve_with(&f, NULL, &ho);
    char pq[1024];
    const char *range = "from=1764000000&to=1764000010&format=folded";

    /* The regex, ".{0,255}" 39 times then Q, is refused before it runs. */
    char re[512] = "";
    for (int i = 0; i < 39; i++)
        strcat(re, ".%7B0,255%7D");
    snprintf(pq, sizeof pq, "/api/v1/profile?%s&focus=%sQ", range, re);
    cp_http_result r = qfx_get(&f, pq, NULL);
    CHECK_EQ(r.status, 400);
    CHECK_CONTAINS(body(&r), "bad focus regex");
    CHECK_CONTAINS(body(&r), "too complex");
    cp_buf_close(&r.body);

    /* A cheap focus still filters. */
    snprintf(pq, sizeof pq, "/api/v1/profile?%s&focus=fn_0007_", range);
    r = qfx_get(&f, pq, NULL);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r), "main;fn_0007_x");
    CHECK(strstr(body(&r), "fn_0008_") == NULL);
    cp_buf_close(&r.body);

    /* ".{0,60}" 8 times then Q passes the filters' budget but takes tens of milliseconds
     * per 1 KB name (a minute or more for all 2,000): every such query is cut at
     * query.timeout (2 s) with a 503 naming it, the heavy lane stays full meanwhile, and
     * /api/v1/series is answered while they run. */
    re[0] = 0;
    for (int i = 0; i < 8; i++)
        strcat(re, ".%7B0,60%7D");
    enum { NQ = 3 };
    static bgq q[NQ];
    for (int i = 0; i < NQ; i++) {
        q[i].f = &f;
        atomic_store(&q[i].done, 0);
        snprintf(q[i].pq, sizeof q[i].pq, "/api/v1/profile?%s&focus=%sQ", range, re);
        pthread_create(&q[i].th, NULL, bg_run, &q[i]);
    }
    usleep(300000); /* the queries are queued and running (an ordering aid, not a bound) */
    for (int k = 0; k < 5; k++) {
        r = qfx_get(&f, "/api/v1/series", NULL);
        CHECK_EQ(r.status, 200);
        CHECK_CONTAINS(body(&r), "\"service\":\"api\"");
        cp_buf_close(&r.body);
    }
    /* The series answers came while the costly queries were still running (they end at
     * their 2 s deadline at the earliest). */
    int finished = 0;
    for (int i = 0; i < NQ; i++)
        finished += atomic_load(&q[i].done);
    CHECK(finished == 0);
    for (int i = 0; i < NQ; i++) {
        pthread_join(q[i].th, NULL);
        if (q[i].r.status != 503) fprintf(stderr, "%d %s\n", q[i].r.status, body(&q[i].r));
        CHECK_EQ(q[i].r.status, 503);
        CHECK_STREQ(q[i].r.content_type, "application/json");
        CHECK_CONTAINS(body(&q[i].r), "query.timeout (2.0 s)");
        /* Without the deadline each would have run for a minute or more. */
        CHECK(q[i].ms < 30000);
        cp_buf_close(&q[i].r.body);
    }
    qfx_close(&f, 1);
}

/* ---- clients that do not read --------------------------------------------------------- */

/* One synthetic window whose folded answer is several MB. */
static void fill_big(qfx *f, uint32_t nstacks, uint32_t nsamples)
{
    cp_synth *sy = cp_synth_create(7, nstacks);
    CHECK(sy);
    cp_profile *p = cp_synth_cpu_window(sy, nsamples, S(T0), S(10));
    CHECK(p);
    qfx_add(f, "default", CP_KIND_CPU, "service=big", S(T0), p);
    qfx_commit(f);
    cp_profile_destroy(p);
    cp_synth_destroy(sy);
}

#define BIG_PQ                                                                                     \
    "/api/v1/profile?from=1764000000&to=1764000010&format=folded&select=%7Bservice%3D%22big%22%7D"
static const char g_big_req[] = "GET " BIG_PQ " HTTP/1.1\r\nHost: x\r\n\r\n";

/* How many bytes are waiting on fd (without consuming them); -1 once it is closed. */
static ssize_t peek(int fd, char *buf, size_t len)
{
    ssize_t n = recv(fd, buf, len, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) return -1;
    return n;
}

TEST(non_reading_clients_hold_bounded_memory_and_are_cut_off)
{
    signal(SIGPIPE, SIG_IGN); /* as contprofd: the server writes to clients that go away */
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_big(&f, 2000, 40000);
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.concurrency = 2;
    ho.gzip_min_bytes = 0; /* the whole answer, uncompressed */
    ho.max_inflight_bytes = 32u << 20;
    ho.write_timeout_ns = S(2);
    qfx_serve_with(&f, NULL, &ho);

    /* A normal client reads the answer: its size, and the memory of a warmed-up server. */
    cp_http_result r = qfx_get(&f, BIG_PQ, NULL);
    CHECK_EQ(r.status, 200);
    size_t answer = r.body.len;
    fprintf(stderr, "answer: %zu bytes\n", answer);
    CHECK(answer > (4u << 20)); /* 50 of them are far more than the budget */
    cp_buf_close(&r.body);
    size_t base = rss_bytes();

    enum { N = 50 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = dial(NULL, f.port, 1024);
        send_all(fds[i], g_big_req);
    }
    /* Wait until every client has the start of an answer, watching the server's memory. */
    size_t peak = base;
    int answered = 0;
    char head[256];
    for (int64_t t0 = ms_now(); answered < N && ms_now() - t0 < 60000;) {
        answered = 0;
        for (int i = 0; i < N; i++)
            answered += peek(fds[i], head, 12) >= 12;
        size_t now = rss_bytes();
        if (now > peak) peak = now;
        usleep(20000);
    }
    CHECK_EQ(answered, N);
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        ssize_t n = peek(fds[i], head, sizeof head - 1);
        CHECK(n >= 12);
        head[n] = 0;
        if (strncmp(head, "HTTP/1.1 200", 12) == 0) ok++;
        if (strncmp(head, "HTTP/1.1 503", 12) == 0) {
            busy++;
            CHECK_CONTAINS(head, "Retry-After: ");
        }
    }
    fprintf(stderr, "200: %d, 503: %d; rss %zu MiB at rest, peak %zu MiB (+%zu MiB)\n", ok, busy,
            base >> 20, peak >> 20, (peak - base) >> 20);
    CHECK(ok >= 1 && busy >= 1 && ok + busy == N);
    /* Held: at most the 32 MiB budget, plus what the two running queries render. */
    CHECK(peak - base <= (32u << 20) + (64u << 20));

    /* The write timeout (2 s) closes every connection whose answer stalls. */
    int closed = 0;
    for (int64_t t0 = ms_now(); closed < ok && ms_now() - t0 < 30000;) {
        closed = 0;
        for (int i = 0; i < N; i++) {
            if (fds[i] < 0) {
                closed++;
                continue;
            }
            if (!open_(fds[i])) {
                close(fds[i]);
                fds[i] = -1;
                closed++;
            }
        }
        usleep(100000);
    }
    fprintf(stderr, "closed by the server: %d\n", closed);
    CHECK(closed >= ok);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0) close(fds[i]);
    /* And the server still answers. */
    r = qfx_get(&f, "/healthz", NULL);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    qfx_close(&f, 1);
}

/* ---- slowloris, connection limits ---------------------------------------------------- */

static int raise_nofile(void)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 4096 && rl.rlim_max >= 4096) rl.rlim_cur = 4096;
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    return (int)rl.rlim_cur;
}

/* 1,100 connections trickle a request's headers; a new client, from another address or
 * (with no per-address limit) from the same one, is still answered, and the trickling
 * connections are closed by the request timeout. */
static void slowloris(uint32_t per_client, const char *attacker)
{
    CHECK(raise_nofile() >= 4096);
    signal(SIGPIPE, SIG_IGN); /* as contprofd: the server writes to clients that go away */
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_big(&f, 50, 100);
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.request_timeout_ns = S(3);
    ho.max_conns_per_client = per_client;
    qfx_serve_with(&f, NULL, &ho);
    enum { N = 1100 };
    static int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = dial(attacker, f.port, 0);
        send_all(fds[i], "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a");
    }
    for (int i = 0; i < N; i++)
        send(fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    int64_t t0 = ms_now();
    cp_http_result r = qfx_get(&f, "/api/v1/series", NULL);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r), "\"service\":\"big\"");
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/healthz", NULL);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    fprintf(stderr, "new client answered %lld ms after the attack began\n",
            (long long)(ms_now() - t0));
    /* Every attacking connection ends: refused (per-address limit), evicted, or cut by the
     * 3 s request timeout. */
    int closed = 0;
    char b[512];
    for (int64_t t1 = ms_now(); closed < N && ms_now() - t1 < 60000;) {
        closed = 0;
        for (int i = 0; i < N; i++) {
            if (fds[i] >= 0) {
                ssize_t n = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                    close(fds[i]);
                    fds[i] = -1;
                }
            }
            closed += fds[i] < 0;
        }
        usleep(100000);
    }
    CHECK_EQ(closed, N);
    qfx_close(&f, 1);
}

TEST(slowloris_from_another_address)
{
    slowloris(256, "127.0.0.2");
}

TEST(slowloris_from_the_same_address)
{
    slowloris(0, NULL);
}

/* With every connection busy writing to clients that do not read, /healthz still gets
 * one of the reserved slots; other requests get a 503 there. */
TEST(healthz_keeps_a_reserved_slot)
{
    signal(SIGPIPE, SIG_IGN); /* as contprofd: the server writes to clients that go away */
    qfx f = {0};
    qfx_open_store(&f, NULL);
    fill_big(&f, 2000, 40000);
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.gzip_min_bytes = 0;
    ho.max_connections = 4;
    ho.reserved_connections = 2;
    qfx_serve_with(&f, NULL, &ho);
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = dial(NULL, f.port, 1024);
        send_all(fds[i], g_big_req);
    }
    char head[16];
    for (int64_t t0 = ms_now(); ms_now() - t0 < 60000;) {
        int answered = 0;
        for (int i = 0; i < 4; i++)
            answered += peek(fds[i], head, 12) >= 12;
        if (answered == 4) break;
        usleep(20000);
    }
    for (int i = 0; i < 4; i++) {
        CHECK(peek(fds[i], head, 12) == 12);
        CHECK(strncmp(head, "HTTP/1.1 200", 12) == 0);
    }
    cp_http_result r = qfx_get(&f, "/healthz", NULL);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    r = qfx_get(&f, "/api/v1/series", NULL);
    CHECK_EQ(r.status, 503);
    CHECK_CONTAINS(body(&r), "too many connections (limit 4)");
    cp_buf_close(&r.body);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    qfx_close(&f, 1);
}

/* ---- the write path and /metrics need tokens ---------------------------------------- */

static void expect_status(qfx *f, const char *pq, const char *token, int status)
{
    cp_http_result r = qfx_get(f, pq, token);
    if (r.status != status) fprintf(stderr, "%s (%s): %d %s\n", pq, token, r.status, body(&r));
    CHECK_EQ(r.status, status);
    cp_buf_close(&r.body);
}

TEST(tokens_guard_brokers_and_metrics)
{
    cp_api_token toks[2] = {{"token-of-team-a", "a"}, {"token-of-team-b", "b"}};
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.tokens = toks;
    ao.ntokens = 2;
    ao.brokers = "127.0.0.1:9092";
    qfx f = {0};
    qfx_open_store(&f, NULL);
    qfx_serve(&f, &ao, 2);
    expect_status(&f, "/api/v1/brokers", NULL, 401);
    expect_status(&f, "/api/v1/brokers", "wrong-token", 401);
    cp_http_result r = qfx_get(&f, "/api/v1/brokers", "token-of-team-b");
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS(body(&r), "\"brokers\":\"127.0.0.1:9092\"");
    cp_buf_close(&r.body);
    expect_status(&f, "/metrics", NULL, 401);
    expect_status(&f, "/metrics", "token-of-team-a", 200);
    expect_status(&f, "/healthz", NULL, 200);
    qfx_close(&f, 1);

    /* With metrics.token, only it opens /metrics. */
    ao.metrics_token = "scraper-secret";
    qfx g = {0};
    qfx_open_store(&g, NULL);
    qfx_serve(&g, &ao, 2);
    expect_status(&g, "/metrics", "token-of-team-a", 401);
    expect_status(&g, "/metrics", "scraper-secret", 200);
    expect_status(&g, "/api/v1/brokers", "scraper-secret", 401);
    qfx_close(&g, 1);

    /* Without tokens everything stays open (loopback only). */
    cp_api_options_default(&ao);
    qfx h = {0};
    qfx_open_store(&h, NULL);
    qfx_serve(&h, &ao, 2);
    expect_status(&h, "/metrics", NULL, 200);
    expect_status(&h, "/api/v1/brokers", NULL, 200);
    qfx_close(&h, 1);
}

/* The settings of this file's limits, as contprofd reads them. */
TEST(config_keys_for_the_limits)
{
    cp_config c;
    cp_err err = {0};
    CHECK(cp_config_init(&c) == 0);
    CHECK_EQ(c.output_budget, (size_t)512 << 20);
    CHECK_EQ(c.write_timeout_ns, S(30));
    CHECK_EQ(c.request_timeout_ns, S(10));
    CHECK_EQ(c.max_conns_per_client, 256u);
    CHECK_EQ(c.healthz_connections, 16u);
    CHECK_EQ(c.cheap_concurrency, 2u);
    CHECK(c.metrics_token == NULL);
    CHECK(cp_config_set(&c, "http.output_budget", "64M", &err) == 0);
    CHECK(cp_config_set(&c, "http.write_timeout", "5s", &err) == 0);
    CHECK(cp_config_set(&c, "http.request_timeout", "2s", &err) == 0);
    CHECK(cp_config_set(&c, "http.max_connections_per_client", "0", &err) == 0);
    CHECK(cp_config_set(&c, "http.healthz_connections", "4", &err) == 0);
    CHECK(cp_config_set(&c, "query.cheap_concurrency", "3", &err) == 0);
    CHECK(cp_config_set(&c, "metrics.token", "scrape-me-please", &err) == 0);
    CHECK_EQ(c.output_budget, (size_t)64 << 20);
    CHECK_EQ(c.write_timeout_ns, S(5));
    CHECK_EQ(c.request_timeout_ns, S(2));
    CHECK_EQ(c.max_conns_per_client, 0u);
    CHECK_EQ(c.healthz_connections, 4u);
    CHECK_EQ(c.cheap_concurrency, 3u);
    CHECK_STREQ(c.metrics_token, "scrape-me-please");
    CHECK_EQ(cp_config_set(&c, "metrics.token", "short", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "at least 8 characters");
    CHECK_EQ(cp_config_set(&c, "http.output_budget", "lots", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "http.output_budget");
    CHECK_EQ(cp_config_set(&c, "query.cheap_concurrency", "0", &err), CP_EPARSE);
    cp_config_close(&c);
}

TEST_MAIN(T(config_keys_for_the_limits), T(tokens_guard_brokers_and_metrics),
          T(costly_focus_meets_the_deadline_and_series_is_not_starved),
          T(non_reading_clients_hold_bounded_memory_and_are_cut_off),
          T(slowloris_from_another_address), T(slowloris_from_the_same_address),
          T(healthz_keeps_a_reserved_slot))
