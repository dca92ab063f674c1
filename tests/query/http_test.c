/* Tests of the HTTP server with a stub handler, over real TCP on 127.0.0.1: keep-alive and
 * pipelining, size limits, malformed requests, the query queue (503), deadlines, response
 * limits, and that slow queries do not stall light requests. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "http_client.h"
#include "http.h"
#include "serve.h"
#include "test.h"

typedef qsrv server;

static atomic_int g_running;
static int64_t g_idle_ms = 60000;

static void handler(void *ctx, const cp_http_request *req, cp_http_response *resp)
{
    (void)ctx;
    if (strcmp(req->path, "/sleep") == 0) {
        atomic_fetch_add(&g_running, 1);
        int ms = atoi(req->query + 2);
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        atomic_fetch_sub(&g_running, 1);
        cp_buf_printf(&resp->body, "{\"slept\":%d}", ms);
    } else if (strcmp(req->path, "/big") == 0) {
        size_t n = (size_t)atol(req->query + 2);
        cp_buf_reserve(&resp->body, n);
        memset(resp->body.data, 'x', n);
        resp->body.len = n;
        snprintf(resp->content_type, sizeof resp->content_type, "text/plain");
    } else if (strncmp(req->path, "/light", 6) == 0 || strcmp(req->path, "/echo") == 0) {
        cp_buf_printf(&resp->body, "%s %s?%s auth=%s", req->method, req->path, req->query,
                      req->authorization ? req->authorization : "-");
        snprintf(resp->content_type, sizeof resp->content_type, "text/plain");
    } else {
        cp_http_error(resp, 404, "unknown path '%s'", req->path);
    }
}

static int is_light(void *ctx, const cp_http_request *req)
{
    (void)ctx;
    return strncmp(req->path, "/light", 6) == 0;
}

static server *start(uint32_t concurrency, uint32_t max_queued, int64_t timeout_ms)
{
    server *sv = calloc(1, sizeof *sv);
    cp_http_options o;
    cp_http_options_default(&o);
    o.handle = handler;
    o.is_light = is_light;
    o.concurrency = concurrency;
    o.max_queued = max_queued;
    o.max_header_bytes = 4096;
    o.max_url_bytes = 2048;
    o.max_body_bytes = 1024;
    o.max_response_bytes = 1 << 20;
    o.query_timeout_ns = timeout_ms * 1000000LL;
    o.idle_timeout_ns = g_idle_ms * 1000000LL;
    qsrv_start(sv, &o);
    return sv;
}

static void stop(server *sv)
{
    qsrv_stop(sv);
    free(sv);
}

static char *body(cp_http_result *r)
{
    cp_buf_append(&r->body, "", 1);
    return (char *)r->body.data;
}

static cp_http_result get(server *sv, const char *pq, const char *token)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", sv->port);
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_get(url, pq, token, 10000, 0, &r, &err);
    if (rc) fprintf(stderr, "get %s: %s\n", pq, err.msg);
    CHECK(rc == 0);
    return r;
}

static cp_http_result raw(server *sv, const char *req, size_t len)
{
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_raw("127.0.0.1", sv->port, req, len, 10000, &r, &err);
    if (rc) fprintf(stderr, "raw: %s\n", err.msg);
    CHECK(rc == 0);
    return r;
}

TEST(get_and_errors_are_json)
{
    server *sv = start(2, 8, 5000);
    cp_http_result r = get(sv, "/echo?a=1&b=%7B", "tok");
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(body(&r), "GET /echo?a=1&b=%7B auth=Bearer tok");
    cp_buf_close(&r.body);
    r = get(sv, "/nope", NULL);
    CHECK_EQ(r.status, 404);
    CHECK_STREQ(r.content_type, "application/json");
    CHECK_CONTAINS(body(&r), "{\"error\":\"unknown path '/nope'\"}");
    cp_buf_close(&r.body);
    stop(sv);
}

TEST(keep_alive_and_pipelining)
{
    server *sv = start(2, 8, 5000);
    /* Three pipelined requests in one write, the last one closing the connection. */
    const char *req = "GET /light/1 HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /sleep?x=50 HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /light/3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv->port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
    char buf[8192];
    size_t got = 0;
    ssize_t n;
    while ((n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = 0;
    close(fd);
    const char *p1 = strstr(buf, "GET /light/1?");
    const char *p2 = strstr(buf, "{\"slept\":50}");
    const char *p3 = strstr(buf, "GET /light/3?");
    CHECK(p1 && p2 && p3 && p1 < p2 && p2 < p3); /* answered in order */
    CHECK_CONTAINS(buf, "Connection: keep-alive");
    CHECK_CONTAINS(buf, "Connection: close");
    stop(sv);
}

TEST(limits_give_4xx_json)
{
    server *sv = start(2, 8, 5000);
    char big[8192];
    int n = snprintf(big, sizeof big, "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(big + n, 'a', 5000);
    n += 5000;
    n += snprintf(big + n, sizeof big - (size_t)n, "\r\n\r\n");
    cp_http_result r = raw(sv, big, (size_t)n);
    CHECK_EQ(r.status, 431);
    CHECK_CONTAINS(body(&r), "{\"error\":\"request headers exceed 4096 bytes\"}");
    cp_buf_close(&r.body);

    n = snprintf(big, sizeof big, "GET /echo?");
    memset(big + n, 'a', 3000);
    n += 3000;
    n += snprintf(big + n, sizeof big - (size_t)n, " HTTP/1.1\r\nHost: x\r\n\r\n");
    r = raw(sv, big, (size_t)n);
    CHECK_EQ(r.status, 414);
    CHECK_CONTAINS(body(&r), "request URL exceeds 2048 bytes");
    cp_buf_close(&r.body);

    const char *post = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n";
    r = raw(sv, post, strlen(post));
    CHECK_EQ(r.status, 413);
    CHECK_CONTAINS(body(&r), "request body of 5000 bytes exceeds 1024 bytes");
    cp_buf_close(&r.body);

    const char *junk = "HELLO WORLD\r\n\r\n";
    r = raw(sv, junk, strlen(junk));
    CHECK_EQ(r.status, 400);
    CHECK_CONTAINS(body(&r), "{\"error\":\"malformed HTTP request: ");
    cp_buf_close(&r.body);

    const char *bad_target = "GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n";
    r = raw(sv, bad_target, strlen(bad_target));
    CHECK(r.status == 400);
    cp_buf_close(&r.body);

    r = get(sv, "/big?n=2000000", NULL);
    CHECK_EQ(r.status, 400);
    CHECK_CONTAINS(body(&r), "response of 2000000 bytes exceeds the limit of 1048576 bytes");
    cp_buf_close(&r.body);
    r = get(sv, "/big?n=1000", NULL);
    CHECK_EQ(r.status, 200);
    CHECK_EQ(r.body.len, 1000);
    cp_buf_close(&r.body);
    stop(sv);
}

typedef struct bg {
    server *sv;
    const char *pq;
    cp_http_result r;
    pthread_t th;
} bg;

static void *bg_get(void *arg)
{
    bg *b = arg;
    b->r = get(b->sv, b->pq, NULL);
    return NULL;
}

static void wait_running(int n)
{
    for (int i = 0; i < 2000 && atomic_load(&g_running) < n; i++)
        usleep(1000);
    CHECK(atomic_load(&g_running) >= n);
}

TEST(queue_full_is_503_and_loop_stays_responsive)
{
    server *sv = start(1, 1, 10000);
    bg a = {.sv = sv, .pq = "/sleep?x=600"}, b = {.sv = sv, .pq = "/sleep?x=10"};
    pthread_create(&a.th, NULL, bg_get, &a);
    wait_running(1);
    pthread_create(&b.th, NULL, bg_get, &b);
    usleep(100000); /* b is now queued behind a */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cp_http_result r = get(sv, "/light/x", NULL); /* not stalled by the running query */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_EQ(r.status, 200);
    CHECK((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 300);
    cp_buf_close(&r.body);
    r = get(sv, "/sleep?x=1", NULL);
    CHECK_EQ(r.status, 503);
    CHECK_CONTAINS(body(&r), "too many queries in flight (1 running, 1 queued)");
    cp_buf_close(&r.body);
    pthread_join(a.th, NULL);
    pthread_join(b.th, NULL);
    CHECK_EQ(a.r.status, 200);
    CHECK_EQ(b.r.status, 200);
    cp_buf_close(&a.r.body);
    cp_buf_close(&b.r.body);
    stop(sv);
}

TEST(deadline_in_queue_is_503)
{
    server *sv = start(1, 8, 200);
    bg a = {.sv = sv, .pq = "/sleep?x=500"}, b = {.sv = sv, .pq = "/sleep?x=1"};
    pthread_create(&a.th, NULL, bg_get, &a);
    wait_running(1);
    pthread_create(&b.th, NULL, bg_get, &b);
    pthread_join(a.th, NULL);
    pthread_join(b.th, NULL);
    CHECK_EQ(a.r.status, 200);
    CHECK_EQ(b.r.status, 503);
    CHECK_CONTAINS(body(&b.r), "waited past its deadline");
    cp_buf_close(&a.r.body);
    cp_buf_close(&b.r.body);
    stop(sv);
}

TEST(shutdown_answers_in_flight_queries)
{
    server *sv = start(2, 8, 5000);
    bg a = {.sv = sv, .pq = "/sleep?x=300"};
    pthread_create(&a.th, NULL, bg_get, &a);
    wait_running(1);
    stop(sv); /* returns only after the in-flight query was answered */
    pthread_join(a.th, NULL);
    CHECK_EQ(a.r.status, 200);
    CHECK_STREQ(body(&a.r), "{\"slept\":300}");
    cp_buf_close(&a.r.body);
}

TEST(many_concurrent_clients)
{
    server *sv = start(4, 256, 10000);
    enum { N = 48 };
    static bg c[N];
    for (int i = 0; i < N; i++) {
        c[i].sv = sv;
        c[i].pq = i % 2 ? "/sleep?x=5" : "/echo";
        pthread_create(&c[i].th, NULL, bg_get, &c[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(c[i].th, NULL);
        CHECK_EQ(c[i].r.status, 200);
        cp_buf_close(&c[i].r.body);
    }
    stop(sv);
}

/* A client trickling one request byte by byte is cut off after the idle timeout, even though
 * it keeps sending; an idle keep-alive connection is closed too. */
TEST(slow_clients_are_cut_off)
{
    g_idle_ms = 300;
    server *sv = start(2, 8, 5000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv->port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    const char *req = "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    int closed_at = -1;
    for (int i = 0; req[i] && closed_at < 0; i++) {
        if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) closed_at = i;
        usleep(50000);
        char b;
        if (recv(fd, &b, 1, MSG_DONTWAIT) == 0) closed_at = i;
    }
    CHECK(closed_at > 0 && closed_at < 20); /* ~300 ms at 50 ms per byte */
    close(fd);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    char b;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(recv(fd, &b, 1, 0) == 0); /* closed by the server, before the 2 s timeout */
    close(fd);
    stop(sv);
}

/* Mutated and random requests: every answer is a 4xx JSON error (or a 200/404 for a request
 * that still parses), never a crash; the server keeps serving. */
TEST(garbage_requests)
{
    server *sv = start(2, 64, 5000);
    const char *seed = "GET /echo?a=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                       "Content-Length: 3\r\n\r\nabc";
    uint64_t rng = 42;
    for (int i = 0; i < 200; i++) {
        char req[512];
        size_t n = strlen(seed);
        memcpy(req, seed, n);
        int muts = 1 + i % 8;
        for (int m = 0; m < muts; m++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            size_t at = (size_t)(rng % n);
            switch ((rng >> 32) % 4) {
            case 0:
                req[at] = (char)(rng >> 40);
                break; /* flip a byte */
            case 1:
                n = at ? at : 1;
                break; /* truncate */
            case 2:
                memmove(req + at + 1, req + at, n - at);
                n++;
                break; /* insert */
            case 3:
                req[at] = "\r\n: \0"[(rng >> 48) % 5];
                break; /* separators */
            }
            if (n > sizeof req - 2) n = sizeof req - 2;
        }
        cp_http_result r;
        cp_err err = {0};
        /* Truncated requests get no answer until the idle timeout: use a short wait. */
        int rc = cp_http_raw("127.0.0.1", sv->port, req, n, 200, &r, &err);
        if (rc == 0) {
            CHECK(r.status == 200 || (r.status >= 400 && r.status < 500) || r.status == 503);
            if (r.status >= 400) {
                cp_buf_append(&r.body, "", 1);
                if (strncmp((char *)r.body.data, "{\"error\":\"", 10) != 0)
                    fprintf(stderr, "%d [%s] for [%.*s]\n", r.status, (char *)r.body.data, (int)n,
                            req);
                CHECK(strncmp((char *)r.body.data, "{\"error\":\"", 10) == 0);
            }
            cp_buf_close(&r.body);
        }
    }
    cp_http_result r = get(sv, "/echo", NULL);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    stop(sv);
}

TEST_MAIN(T(get_and_errors_are_json), T(garbage_requests), T(slow_clients_are_cut_off),
          T(keep_alive_and_pipelining), T(limits_give_4xx_json),
          T(queue_full_is_503_and_loop_stays_responsive), T(deadline_in_queue_is_503),
          T(shutdown_answers_in_flight_queries), T(many_concurrent_clients))
