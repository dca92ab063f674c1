/* The shared HTTP/1.1 client (model/http_client.c) against a scripted server on a real
 * loopback socket: body framings, limits, malformed answers, deadlines, the brokers
 * question. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_client.h"
#include "test.h"

/* ===== a scripted server: one connection, one canned reply ============================ */

typedef struct srv {
    int fd, port;
    const char *reply; /* NULL: never answer, wait until the client goes */
    size_t reply_len;
    int bytewise; /* send the reply one byte at a time */
    char request[8192];
    size_t req_len;
    pthread_t th;
} srv;

static void *serve_one(void *arg)
{
    srv *s = arg;
    int c = accept(s->fd, NULL, NULL);
    if (c < 0) return NULL;
    /* the request: headers, then Content-Length bytes of body */
    size_t want = 0;
    for (;;) {
        ssize_t n = recv(c, s->request + s->req_len, sizeof s->request - 1 - s->req_len, 0);
        if (n <= 0) break;
        s->req_len += (size_t)n;
        s->request[s->req_len] = 0;
        char *e = strstr(s->request, "\r\n\r\n");
        if (!e) continue;
        char *cl = strstr(s->request, "Content-Length: ");
        want = (size_t)(e + 4 - s->request) + (cl ? strtoul(cl + 16, NULL, 10) : 0);
        if (s->req_len >= want || s->req_len == sizeof s->request - 1) break;
    }
    if (s->reply) {
        size_t step = s->bytewise ? 1 : s->reply_len;
        for (size_t o = 0; o < s->reply_len; o += step)
            if (send(c, s->reply + o, step, MSG_NOSIGNAL) < 0) break;
    } else { /* silent until the client hangs up (at most 60 s) */
        struct pollfd p = {.fd = c, .events = POLLIN};
        char b[64];
        while (poll(&p, 1, 60000) == 1 && recv(c, b, sizeof b, 0) > 0)
            ;
    }
    close(c);
    return NULL;
}

static void srv_start(srv *s, const char *reply, int bytewise)
{
    memset(s, 0, sizeof *s);
    s->reply = reply;
    s->reply_len = reply ? strlen(reply) : 0;
    s->bytewise = bytewise;
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(s->fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t l = sizeof a;
    CHECK(getsockname(s->fd, (struct sockaddr *)&a, &l) == 0);
    s->port = ntohs(a.sin_port);
    CHECK(listen(s->fd, 1) == 0);
    CHECK(pthread_create(&s->th, NULL, serve_one, s) == 0);
}

static void srv_stop(srv *s)
{
    pthread_join(s->th, NULL);
    close(s->fd);
}

static const char *url_of(const srv *s, const char *suffix)
{
    static char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, suffix);
    return url;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ===== framings ======================================================================= */

TEST(content_length_body)
{
    srv s;
    /* bytes after the announced body are not part of it */
    srv_start(&s,
              "HTTP/1.1 200 OK\r\nContent-Type:  application/json \r\ncontent-length: 11\r\n"
              "\r\n{\"a\":\"bc\"}\nGARBAGE",
              0);
    cp_http_result r;
    cp_err err = {0};
    CHECK_EQ(cp_http_get(url_of(&s, "/pre/"), "/api/v1/x?y=1", "tok", 10000, 0, &r, &err), 0);
    srv_stop(&s);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(r.content_type, "application/json");
    CHECK_EQ(r.body.len, 11);
    CHECK_STREQ((const char *)r.body.data, "{\"a\":\"bc\"}\n"); /* NUL-terminated */
    CHECK_CONTAINS(s.request, "GET /pre/api/v1/x?y=1 HTTP/1.1\r\n");
    CHECK_CONTAINS(s.request, "\r\nAuthorization: Bearer tok\r\n");
    CHECK_CONTAINS(s.request, "\r\nConnection: close\r\n");
    cp_buf_close(&r.body);

    /* an empty body still reads as "" and a status other than 200 is returned as it is */
    srv_start(&s, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/nothing", NULL, 10000, 0, &r, &err), 0);
    srv_stop(&s);
    CHECK_EQ(r.status, 404);
    CHECK(r.body.data != NULL);
    CHECK_STREQ((const char *)r.body.data, "");
    CHECK(strstr(s.request, "Authorization") == NULL);
    cp_buf_close(&r.body);
}

TEST(chunked_body_one_byte_at_a_time)
{
    srv s;
    /* an interim 100 first, chunk extensions, a trailer, and each byte in its own read */
    srv_start(&s,
              "HTTP/1.1 100 Continue\r\n\r\n"
              "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n"
              "\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\nA\r\n 012345678\r\n0\r\nX-T: 1\r\n\r\n",
              1);
    cp_http_result r;
    cp_err err = {0};
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/c", NULL, 20000, 0, &r, &err), 0);
    srv_stop(&s);
    CHECK_EQ(r.status, 201);
    CHECK_STREQ(r.content_type, "text/plain");
    CHECK_STREQ((const char *)r.body.data, "hello, world 012345678");
    CHECK_EQ(r.body.len, 22);
    cp_buf_close(&r.body);

    /* a chunk size that is not hex */
    srv_start(&s, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/c", NULL, 10000, 0, &r, &err), CP_EIO);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "chunk size 'zz");
    CHECK(r.body.data == NULL);
}

TEST(body_until_close)
{
    srv s;
    srv_start(&s, "HTTP/1.0 200 OK\r\n\r\nall of it, until the end", 0);
    cp_http_result r;
    cp_err err = {0};
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 0, &r, &err), 0);
    srv_stop(&s);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(r.content_type, "");
    CHECK_STREQ((const char *)r.body.data, "all of it, until the end");
    cp_buf_close(&r.body);
}

TEST(post_sends_the_body)
{
    srv s;
    srv_start(&s, "HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\nok", 0);
    cp_http_result r;
    cp_err err = {0};
    CHECK_EQ(cp_http_post(url_of(&s, ""), "/up", NULL, "12345\0x", 7, 10000, 0, &r, &err), 0);
    srv_stop(&s);
    CHECK_EQ(r.status, 202);
    CHECK_CONTAINS(s.request, "POST /up HTTP/1.1\r\n");
    CHECK_CONTAINS(s.request, "\r\nContent-Length: 7\r\n");
    const char *body = strstr(s.request, "\r\n\r\n") + 4;
    CHECK_EQ(s.req_len - (size_t)(body - s.request), 7);
    CHECK(memcmp(body, "12345\0x", 7) == 0);
    cp_buf_close(&r.body);
}

/* ===== what is refused ================================================================ */

TEST(limits)
{
    srv s;
    cp_http_result r;
    cp_err err = {0};
    /* announced larger than allowed: refused before reading it */
    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 10, &r, &err), CP_ELIMIT);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "larger than 10");
    CHECK(r.body.data == NULL);
    /* unannounced, growing past the limit */
    srv_start(&s, "HTTP/1.0 200 OK\r\n\r\n0123456789abcdef", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 10, &r, &err), CP_ELIMIT);
    srv_stop(&s);
    CHECK(r.body.data == NULL);
    /* headers without end */
    size_t n = CP_HTTP_MAX_HEAD + 100;
    char *big = malloc(n + 1);
    memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
    memset(big + 20, 'a', n - 20);
    big[n] = 0;
    srv_start(&s, big, 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 0, &r, &err), CP_ELIMIT);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "headers larger than");
    free(big);
}

TEST(malformed_answers)
{
    srv s;
    cp_http_result r;
    cp_err err = {0};
    srv_start(&s, "SSH-2.0-OpenSSH\r\n\r\n", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 0, &r, &err), CP_EIO);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "bad status line 'SSH-2.0");
    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 0, &r, &err), CP_EIO);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "Content-Length '12x'");
    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0);
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 10000, 0, &r, &err), CP_EIO);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "closed before the response ended");
    CHECK_CONTAINS(err.msg, "127.0.0.1:");
}

TEST(deadline_and_refusal)
{
    srv s;
    cp_http_result r;
    cp_err err = {0};
    srv_start(&s, NULL, 0); /* accepts, never answers */
    double t0 = now_s();
    CHECK_EQ(cp_http_get(url_of(&s, ""), "/x", NULL, 300, 0, &r, &err), CP_EIO);
    double took = now_s() - t0;
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "timed out waiting for the response");
    CHECK(took >= 0.25);
    CHECK(took < 20); /* bounded by the deadline, not by the server (which waits 60 s) */

    /* a port nobody listens on (bound, then closed, without listening) */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &l) == 0);
    int port = ntohs(a.sin_port);
    close(fd);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    CHECK_EQ(cp_http_get(url, "/x", NULL, 5000, 0, &r, &err), CP_EIO);
    CHECK_CONTAINS(err.msg, "cannot connect to 127.0.0.1:");
}

TEST(bad_urls)
{
    cp_http_result r;
    cp_err err = {0};
    CHECK_EQ(cp_http_get("ftp://x", "/", NULL, 1000, 0, &r, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "only http:// is supported");
    CHECK_EQ(cp_http_get("http://", "/", NULL, 1000, 0, &r, &err), CP_EINVAL);
    CHECK_EQ(cp_http_get("http://h:99999", "/", NULL, 1000, 0, &r, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "port '99999'");
    CHECK_EQ(cp_http_get("http://h:", "/", NULL, 1000, 0, &r, &err), CP_EINVAL);
    CHECK_EQ(cp_http_get("http://[::1", "/", NULL, 1000, 0, &r, &err), CP_EINVAL);
    CHECK_EQ(cp_http_get("http://u@h:1", "/", NULL, 1000, 0, &r, &err), CP_EINVAL);
}

/* A URL resolved once for a poller: the host numeric, port and prefix kept; refusals named. */
TEST(resolve_url)
{
    char out[128];
    cp_err err = {0};
    CHECK_EQ(cp_http_resolve_url("localhost:7070/cp/", out, sizeof out, &err), 0);
    CHECK(strcmp(out, "http://127.0.0.1:7070/cp") == 0 || strcmp(out, "http://[::1]:7070/cp") == 0);
    CHECK_EQ(cp_http_resolve_url("http://127.0.0.1", out, sizeof out, &err), 0);
    CHECK_STREQ(out, "http://127.0.0.1:80");
    CHECK_EQ(cp_http_resolve_url("http://[::1]:9/", out, sizeof out, &err), 0);
    CHECK_STREQ(out, "http://[::1]:9");
    CHECK_EQ(cp_http_resolve_url("ftp://x", out, sizeof out, &err), CP_EINVAL);
    CHECK_EQ(cp_http_resolve_url("http://no-such-host.invalid:1", out, sizeof out, &err), CP_EIO);
    CHECK_CONTAINS(err.msg, "cannot resolve no-such-host.invalid");
    CHECK_EQ(cp_http_resolve_url("http://127.0.0.1:1/a", out, 10, &err), CP_ELIMIT);
}

/* ===== GET /api/v1/brokers ============================================================ */

TEST(brokers)
{
    srv s;
    char out[256];
    cp_err err = {0};
    srv_start(&s,
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 35\r\n"
              "\r\n{\"brokers\":\"k1:9092,k\\u0032:9092\"}\n",
              0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, "/"), NULL, out, sizeof out, 10000, &err), 0);
    srv_stop(&s);
    CHECK_STREQ(out, "k1:9092,k2:9092");
    CHECK_CONTAINS(s.request, "GET /api/v1/brokers HTTP/1.1\r\n");
    CHECK(strstr(s.request, "Authorization") == NULL);

    /* with a token (CONTPROF_TOKEN), sent as a bearer token */
    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 21\r\n\r\n{\"brokers\":\"k3:9092\"}", 0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, ""), "s3cret-token", out, sizeof out, 10000, &err), 0);
    srv_stop(&s);
    CHECK_STREQ(out, "k3:9092");
    CHECK_CONTAINS(s.request, "\r\nAuthorization: Bearer s3cret-token\r\n");

    srv_start(&s, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 19\r\n\r\n{\"error\":\"no tok\"}\n",
              0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, ""), NULL, out, sizeof out, 10000, &err), CP_EIO);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "answered 401");
    CHECK_CONTAINS(err.msg, "no tok");
    CHECK_STREQ(out, "");

    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"brokers\":\"\"}", 0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, ""), NULL, out, sizeof out, 10000, &err), CP_ENOTFOUND);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "no Kafka brokers to offer yet");

    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"broker\":1}", 0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, ""), NULL, out, sizeof out, 10000, &err), CP_EPARSE);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "no \"brokers\" string");

    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nnot json", 0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, ""), NULL, out, sizeof out, 10000, &err), CP_EPARSE);
    srv_stop(&s);

    srv_start(&s, "HTTP/1.1 200 OK\r\nContent-Length: 21\r\n\r\n{\"brokers\":\"k3:9092\"}", 0);
    CHECK_EQ(cp_http_get_brokers(url_of(&s, ""), NULL, out, 7, 10000, &err), CP_ELIMIT);
    srv_stop(&s);
    CHECK_CONTAINS(err.msg, "7 bytes, room for 6");
    CHECK_STREQ(out, "");
}

TEST_MAIN(T(content_length_body), T(chunked_body_one_byte_at_a_time), T(body_until_close),
          T(post_sends_the_body), T(limits), T(malformed_answers), T(deadline_and_refusal),
          T(bad_urls), T(resolve_url), T(brokers))
