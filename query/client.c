/* The CLI's HTTP client: getaddrinfo + blocking sockets with poll timeouts, and http-parser
 * in response mode so that no HTTP is parsed by hand. */
#include "client.h"

#include <errno.h>
#include <http_parser.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct resp_ctx {
    cp_http_result *out;
    size_t max_body;
    int done, too_big, nomem;
    int in_ct;      /* current header is Content-Type */
    int in_partial; /* current header is Contprof-Partial */
    char field[32];
    size_t field_len;
    int in_value;
} resp_ctx;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int on_hfield(http_parser *p, const char *at, size_t n)
{
    resp_ctx *c = p->data;
    if (c->in_value) {
        c->in_value = 0;
        c->field_len = 0;
    }
    if (c->field_len + n < sizeof c->field) {
        memcpy(c->field + c->field_len, at, n);
        c->field_len += n;
    } else {
        c->field_len = sizeof c->field; /* too long to be Content-Type */
    }
    return 0;
}

static int on_hvalue(http_parser *p, const char *at, size_t n)
{
    resp_ctx *c = p->data;
    if (!c->in_value) {
        c->in_value = 1;
        c->in_ct = c->field_len == 12 && strncasecmp(c->field, "content-type", 12) == 0;
        if (c->in_ct) c->out->content_type[0] = 0;
        c->in_partial = c->field_len == 16 && strncasecmp(c->field, "contprof-partial", 16) == 0;
    }
    if (c->in_partial) {
        size_t l = strlen(c->out->partial), room = sizeof c->out->partial - 1 - l;
        if (n > room) n = room;
        memcpy(c->out->partial + l, at, n);
        c->out->partial[l + n] = 0;
        return 0;
    }
    if (c->in_ct) {
        size_t l = strlen(c->out->content_type);
        size_t room = sizeof c->out->content_type - 1 - l;
        if (n > room) n = room;
        memcpy(c->out->content_type + l, at, n);
        c->out->content_type[l + n] = 0;
    }
    return 0;
}

static int on_rbody(http_parser *p, const char *at, size_t n)
{
    resp_ctx *c = p->data;
    if (c->out->body.len + n > c->max_body) {
        c->too_big = 1;
        return 1;
    }
    if (cp_buf_append(&c->out->body, at, n)) {
        c->nomem = 1;
        return 1;
    }
    return 0;
}

static int on_rdone(http_parser *p)
{
    resp_ctx *c = p->data;
    c->done = 1;
    c->out->status = (int)p->status_code;
    http_parser_pause(p, 1); /* one response per request: ignore anything after it */
    return 0;
}

static int connect_to(const char *host, const char *port, int64_t deadline, cp_err *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g) return cp_err_set(err, CP_EIO, "cannot resolve %s: %s", host, gai_strerror(g));
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int64_t left = deadline - now_ms();
            if (left > 0 && poll(&pf, 1, (int)left) == 1) {
                int so = 0;
                socklen_t sl = sizeof so;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl);
                if (so == 0) break;
                last = so;
            } else {
                last = ETIMEDOUT;
            }
        } else {
            last = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return cp_err_set(err, CP_EIO, "cannot connect to %s:%s: %s", host, port,
                          strerror(last ? last : ECONNREFUSED));
    return fd;
}

/* Sends req on fd and parses one response into out. */
static int exchange(int fd, const char *who, const void *req, size_t len, int64_t deadline,
                    size_t max_body, cp_http_result *out, cp_err *err)
{
    const char *p = req;
    while (len) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - now_ms();
        if (left <= 0 || poll(&pf, 1, (int)left) != 1)
            return cp_err_set(err, CP_EIO, "%s: timed out sending the request", who);
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) break; /* read its answer */
        if (n < 0) return cp_err_set(err, CP_EIO, "%s: send: %s", who, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    http_parser_settings st;
    http_parser_settings_init(&st);
    st.on_header_field = on_hfield;
    st.on_header_value = on_hvalue;
    st.on_body = on_rbody;
    st.on_message_complete = on_rdone;
    http_parser hp;
    http_parser_init(&hp, HTTP_RESPONSE);
    resp_ctx c = {.out = out, .max_body = max_body ? max_body : (size_t)1 << 30};
    hp.data = &c;
    char buf[65536];
    while (!c.done) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - now_ms();
        if (left <= 0 || poll(&pf, 1, (int)left) != 1)
            return cp_err_set(err, CP_EIO, "%s: timed out waiting for the response", who);
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return cp_err_set(err, CP_EIO, "%s: recv: %s", who, strerror(errno));
        size_t used = http_parser_execute(&hp, &st, buf, (size_t)n);
        if (c.too_big)
            return cp_err_set(err, CP_ELIMIT, "%s: response larger than %zu bytes", who,
                              c.max_body);
        if (c.nomem) return cp_err_set(err, CP_ENOMEM, "%s: out of memory", who);
        if (c.done) break;
        if (HTTP_PARSER_ERRNO(&hp) != HPE_OK || used != (size_t)n)
            return cp_err_set(err, CP_EIO, "%s: malformed response: %s", who,
                              http_errno_description(HTTP_PARSER_ERRNO(&hp)));
        if (n == 0 && !c.done)
            return cp_err_set(err, CP_EIO, "%s: connection closed before the response ended",
                              who);
    }
    return 0;
}

int cp_http_raw(const char *host, int port, const void *req, size_t len, int64_t timeout_ms,
                cp_http_result *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    char ps[16], who[300];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(who, sizeof who, "%s:%d", host, port);
    int64_t deadline = now_ms() + timeout_ms;
    int fd = connect_to(host, ps, deadline, err);
    if (fd < 0) return fd;
    int rc = exchange(fd, who, req, len, deadline, 0, out, err);
    close(fd);
    return rc;
}

int cp_url_encode(cp_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~') {
            if (cp_buf_append(b, s, 1)) return CP_ENOMEM;
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            if (cp_buf_append(b, e, 3)) return CP_ENOMEM;
        }
    }
    return 0;
}

/* One request: method, optional body. */
static int request(const char *method, const char *base_url, const char *path_query,
                   const char *token, const void *body, size_t body_len, int64_t timeout_ms,
                   size_t max_body, cp_http_result *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    struct http_parser_url u;
    http_parser_url_init(&u);
    size_t ul = strlen(base_url);
    if (ul > 2048 || http_parser_parse_url(base_url, ul, 0, &u) ||
        !(u.field_set & (1 << UF_SCHEMA)) || !(u.field_set & (1 << UF_HOST)))
        return cp_err_set(err, CP_EINVAL, "bad server URL '%.200s' (expected http://host:port)",
                          base_url);
    if (u.field_data[UF_SCHEMA].len != 4 ||
        strncasecmp(base_url + u.field_data[UF_SCHEMA].off, "http", 4) != 0)
        return cp_err_set(err, CP_EINVAL, "server URL '%.200s': only http:// is supported",
                          base_url);
    char host[256], port[8], prefix[1024] = "";
    snprintf(host, sizeof host, "%.*s", u.field_data[UF_HOST].len,
             base_url + u.field_data[UF_HOST].off);
    snprintf(port, sizeof port, "%u", (u.field_set & (1 << UF_PORT)) ? u.port : 80);
    if (u.field_set & (1 << UF_PATH)) {
        snprintf(prefix, sizeof prefix, "%.*s", u.field_data[UF_PATH].len,
                 base_url + u.field_data[UF_PATH].off);
        size_t pl = strlen(prefix);
        while (pl && prefix[pl - 1] == '/') prefix[--pl] = 0;
    }
    cp_buf req = {0};
    int rc = cp_buf_printf(&req,
                           "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: contprof\r\n"
                           "Connection: close\r\n",
                           method, prefix, path_query, host, port);
    if (!rc && token && *token) rc = cp_buf_printf(&req, "Authorization: Bearer %s\r\n", token);
    if (!rc && body)
        rc = cp_buf_printf(&req,
                           "Content-Type: application/octet-stream\r\n"
                           "Content-Length: %zu\r\n",
                           body_len);
    if (!rc) rc = cp_buf_printf(&req, "\r\n");
    if (!rc && body_len) rc = cp_buf_append(&req, body, body_len);
    if (rc) {
        cp_buf_close(&req);
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    char who[300];
    snprintf(who, sizeof who, "%s:%s", host, port);
    int64_t deadline = now_ms() + timeout_ms;
    int fd = connect_to(host, port, deadline, err);
    if (fd < 0) {
        cp_buf_close(&req);
        return fd;
    }
    rc = exchange(fd, who, req.data, req.len, deadline, max_body, out, err);
    close(fd);
    cp_buf_close(&req);
    if (rc) cp_buf_close(&out->body);
    return rc;
}

int cp_http_get(const char *base_url, const char *path_query, const char *token, int64_t timeout_ms,
                size_t max_body, cp_http_result *out, cp_err *err)
{
    return request("GET", base_url, path_query, token, NULL, 0, timeout_ms, max_body, out, err);
}

int cp_http_post(const char *base_url, const char *path_query, const char *token, const void *body,
                 size_t body_len, int64_t timeout_ms, size_t max_body, cp_http_result *out,
                 cp_err *err)
{
    return request("POST", base_url, path_query, token, body ? body : "", body_len, timeout_ms,
                   max_body, out, err);
}
