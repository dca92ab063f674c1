/* libFuzzer target: whole HTTP requests (request line, headers, body; several pipelined in
 * one input) sent over a real loopback connection to the real server and query API over a
 * small real store, with tokens configured. Every answer must be a well-formed HTTP/1.1
 * response whose errors (and 200 application/json answers) are JSON, and the server must close the
 * connection once the input ends. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api.h"
#include "http.h"
#include "json.h"
#include "store.h"

static struct {
    int ready;
    char dir[64];
    cp_store *store;
    cp_api *api;
    uv_loop_t loop;
    cp_http_server *srv;
    int port;
} g;

static void cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g.dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", g.dir);
}

/* One window (main;work 3 samples) of tenant a, so that queries find data. */
static void fill(void)
{
    cp_profile *p = cp_profile_create();
    uint32_t sname, fid, lid[2];
    if (!p || cp_profile_add_sample_type(p, "samples", "count") ||
        cp_profile_add_sample_type(p, "cpu", "nanoseconds"))
        abort();
    const char *names[2] = {"work", "main"};
    for (int i = 0; i < 2; i++) {
        cp_function f = {0};
        if (cp_profile_intern_cstr(p, names[i], &sname)) abort();
        f.name = f.system_name = sname;
        if (cp_profile_add_function(p, &f, &fid)) abort();
        cp_line line = {.function_id = fid, .line = 1};
        if (cp_profile_add_location(p, 0x1000 + 16 * (uint64_t)i, 0, &line, 1, &lid[i])) abort();
    }
    int64_t v[2] = {3, 30000000};
    if (cp_profile_add_sample(p, lid, 2, v, NULL, 0)) abort();
    cp_envelope e = {0};
    e.tenant = (char *)"a";
    e.kind = CP_KIND_CPU;
    e.window_start_ns = 1764000000LL * 1000000000LL;
    e.window_duration_ns = 10000000000LL;
    e.producer_id = (char *)"fuzz";
    e.sequence = 1;
    if (cp_labels_set(&e.labels, "service", "api")) abort();
    cp_err err = {0};
    cp_store_batch *b = cp_store_batch_create(g.store);
    if (!b || cp_store_batch_add(b, &e, p, 0, &err) || cp_store_batch_commit(b, &err)) abort();
    cp_store_batch_destroy(b);
    cp_labels_close(&e.labels);
    cp_profile_destroy(p);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(g.dir, sizeof g.dir, "/tmp/cp-fuzz-http-XXXXXX");
    if (!mkdtemp(g.dir)) abort();
    atexit(cleanup);
    cp_store_options so = {.path = g.dir};
    cp_err err = {0};
    if (cp_store_open(&so, &g.store, &err)) abort();
    fill();
    static cp_api_token toks[1] = {{"fuzz-token-a", "a"}};
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.store = g.store;
    ao.tokens = toks;
    ao.ntokens = 1;
    ao.brokers = "127.0.0.1:9092";
    g.api = cp_api_create(&ao);
    if (!g.api) abort();
    uv_loop_init(&g.loop);
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.port = 0;
    ho.handle = cp_api_handle;
    ho.is_light = cp_api_is_light;
    ho.observe = cp_api_observe;
    ho.ctx = g.api;
    ho.query_timeout_ns = 5000000000LL;
    ho.max_response_bytes = 4u << 20;
    ho.gzip_min_bytes = 256;
    if (cp_http_server_create(&g.loop, &ho, &g.srv, &err)) abort();
    g.port = cp_http_server_port(g.srv);
    g.ready = 1;
}

/* Checks that out holds only complete responses "HTTP/1.1 NNN ..." and that 4xx/5xx bodies
 * are JSON errors and 200 application/json bodies JSON. After a reset (the server closed with input
 * unread) the last one may be cut short. */
static void check_responses(const char *out, size_t n, int reset)
{
    size_t at = 0;
    while (at < n) {
        if (reset && (n - at < 12 || !memmem(out + at, n - at, "\r\n\r\n", 4))) return;
        if (n - at < 12 || memcmp(out + at, "HTTP/1.1 ", 9) != 0) abort();
        int status = atoi(out + at + 9);
        if (status < 200 || status > 599) abort();
        const char *end = memmem(out + at, n - at, "\r\n\r\n", 4);
        if (!end) abort();
        const char *cl = memmem(out + at, (size_t)(end - (out + at)), "Content-Length: ", 16);
        if (!cl) abort();
        size_t len = strtoul(cl + 16, NULL, 10);
        size_t body = (size_t)(end + 4 - out);
        if (body + len > n) {
            if (reset) return;
            abort(); /* a truncated answer */
        }
        int gz = memmem(out + at, (size_t)(end - (out + at)), "Content-Encoding: gzip", 22) != NULL;
        if (status >= 400 && !gz && (len < 10 || memcmp(out + body, "{\"error\":\"", 10) != 0))
            abort();
        /* a JSON answer is JSON (the flamebearer, pprof's proto3 JSON, ...) */
        if (status == 200 && !gz &&
            memmem(out + at, (size_t)(end - (out + at)), "Content-Type: application/json", 30)) {
            cp_json *j = NULL;
            cp_err err = {0};
            if (cp_json_parse(out + body, len, &j, &err) && err.code != CP_ENOMEM) abort();
            cp_json_free(j);
        }
        at = body + len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536) return 0;
    if (!g.ready) setup();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) abort();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g.port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) abort();
    size_t sent = 0, got = 0, cap = 1 << 16;
    char *out = malloc(cap);
    if (!out) abort();
    int shut = 0, eof = 0, reset = 0;
    int64_t deadline = cp_mono_ns() + 15000000000LL; /* under .ci/test's -timeout=20 */
    while (!eof) {
        if (cp_mono_ns() > deadline) abort(); /* the server never closed: a hang */
        uv_run(&g.loop, UV_RUN_NOWAIT);
        if (sent < size) {
            ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)
                sent = size; /* the server closed early (an error answer) */
        }
        if (sent == size && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        for (;;) {
            if (got == cap) {
                char *o = realloc(out, cap *= 2);
                if (!o) abort();
                out = o;
            }
            ssize_t r = recv(fd, out + got, cap - got, 0);
            if (r > 0) {
                got += (size_t)r;
                continue;
            }
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) eof = 1;
            if (r < 0 && eof) reset = 1;
            break;
        }
        if (!eof) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            poll(&p, 1, 1);
        }
    }
    close(fd);
    check_responses(out, got, reset);
    free(out);
    return 0;
}
