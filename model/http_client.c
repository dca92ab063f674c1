/* The HTTP/1.1 client: getaddrinfo, a non-blocking socket waited on with poll against one
 * deadline, and a small incremental response reader (status line, headers, then a body
 * framed by Content-Length, chunked encoding or the end of the connection). Its own reader
 * rather than http-parser: the agent links this file and must not pull a library into the
 * programs it lives in. */
#include "http_client.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "json.h"
#include "times.h"

#define MAX_BODY_DEFAULT ((size_t)1 << 30)

static int64_t now_ms(void)
{
    return cp_mono_ns() / 1000000;
}

/* Waits until fd is ready for ev or the deadline passes: 0, or -1 (time-out, poll error). */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = ev};
        int rc = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

/* ===== the URL ======================================================================== */

typedef struct url_parts {
    char host[256];     /* without the brackets of an IPv6 literal */
    char port[8];       /* "80" unless given */
    char hostport[280]; /* for the Host header and messages, as written */
    char prefix[1024];  /* path prefix without trailing slashes, "" for none */
} url_parts;

static int parse_url(const char *url, url_parts *u, cp_err *err)
{
    const char *h = url;
    if (!strncasecmp(h, "http://", 7))
        h += 7;
    else if (strstr(h, "://"))
        return cp_err_set(err, CP_EINVAL, "server URL '%.200s': only http:// is supported", url);
    size_t hl = strcspn(h, "/?#");
    if (hl == 0 || hl >= sizeof u->hostport)
        return cp_err_set(err, CP_EINVAL, "bad server URL '%.200s' (expected http://host:port)",
                          url);
    memcpy(u->hostport, h, hl);
    u->hostport[hl] = 0;
    if (strchr(u->hostport, '@'))
        return cp_err_set(err, CP_EINVAL, "server URL '%.200s': user names are not supported", url);
    const char *port = NULL;
    if (u->hostport[0] == '[') { /* [v6]:port */
        const char *close = strchr(u->hostport, ']');
        if (!close || (close[1] && close[1] != ':'))
            return cp_err_set(err, CP_EINVAL, "bad server URL '%.200s' (unclosed '[')", url);
        snprintf(u->host, sizeof u->host, "%.*s", (int)(close - u->hostport - 1), u->hostport + 1);
        if (close[1] == ':') port = close + 2;
    } else {
        const char *colon = strchr(u->hostport, ':');
        snprintf(u->host, sizeof u->host, "%.*s", (int)(colon ? (size_t)(colon - u->hostport) : hl),
                 u->hostport);
        if (colon) port = colon + 1;
    }
    if (!u->host[0]) return cp_err_set(err, CP_EINVAL, "bad server URL '%.200s': no host", url);
    if (port) {
        char *end;
        errno = 0;
        long p = strtol(port, &end, 10);
        if (!*port || *end || errno || p < 1 || p > 65535)
            return cp_err_set(err, CP_EINVAL, "bad server URL '%.200s': port '%s'", url, port);
        snprintf(u->port, sizeof u->port, "%ld", p);
    } else {
        snprintf(u->port, sizeof u->port, "80");
    }
    const char *path = h + hl;
    size_t pl = strcspn(path, "?#");
    while (pl && path[pl - 1] == '/')
        pl--;
    if (pl >= sizeof u->prefix)
        return cp_err_set(err, CP_EINVAL, "server URL '%.200s': path too long", url);
    memcpy(u->prefix, path, pl);
    u->prefix[pl] = 0;
    return 0;
}

int cp_http_resolve_url(const char *url, char *out, size_t cap, cp_err *err)
{
    url_parts u;
    int rc = parse_url(url, &u, err);
    if (rc) return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(u.host, u.port, &hints, &res);
    if (g) return cp_err_set(err, CP_EIO, "cannot resolve %s: %s", u.host, gai_strerror(g));
    char num[64];
    g = getnameinfo(res->ai_addr, res->ai_addrlen, num, sizeof num, NULL, 0, NI_NUMERICHOST);
    int v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    if (g) return cp_err_set(err, CP_EIO, "cannot resolve %s: %s", u.host, gai_strerror(g));
    int n = snprintf(out, cap, "http://%s%s%s:%s%s", v6 ? "[" : "", num, v6 ? "]" : "", u.port,
                     u.prefix);
    if (n < 0 || (size_t)n >= cap)
        return cp_err_set(err, CP_ELIMIT, "server URL '%.200s' resolved is too long", url);
    return 0;
}

/* ===== connecting ===================================================================== */

/* Returns a connected non-blocking socket, or CP_EIO with err naming host and cause. */
static int connect_to(const char *host, const char *port, int64_t deadline, cp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g) return cp_err_set(err, CP_EIO, "cannot resolve %s: %s", host, gai_strerror(g));
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            if (wait_fd(fd, POLLOUT, deadline) == 0) {
                int so = 0;
                socklen_t sl = sizeof so;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0) so = errno;
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

/* ===== reading the response =========================================================== */

enum { R_HEAD, R_LENGTH, R_CLOSE, R_CHUNK_SIZE, R_CHUNK_DATA, R_CHUNK_END, R_TRAILER, R_DONE };

typedef struct resp_rd {
    cp_http_result *out;
    const char *who;
    size_t max_body;
    int state;
    cp_buf head;   /* R_HEAD: the bytes so far */
    uint64_t left; /* R_LENGTH, R_CHUNK_DATA: body bytes still to come */
    char line[80]; /* R_CHUNK_SIZE, R_CHUNK_END, R_TRAILER: the current line (cut) */
    size_t line_len;
} resp_rd;

static int body_add(resp_rd *r, const char *p, size_t n, cp_err *err)
{
    if (r->out->body.len + n > r->max_body)
        return cp_err_set(err, CP_ELIMIT, "%s: response larger than %zu bytes", r->who,
                          r->max_body);
    if (cp_buf_append(&r->out->body, p, n))
        return cp_err_set(err, CP_ENOMEM, "%s: out of memory", r->who);
    return 0;
}

/* Copies one header's value, trimmed, into v[0..cap). */
static void header_value(const char *s, size_t n, char *v, size_t cap)
{
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        n--;
    if (n >= cap) n = cap - 1;
    memcpy(v, s, n);
    v[n] = 0;
}

/* Parses the status line and headers in head[0..n) (ending with the blank line) and sets
 * the body's framing. */
static int parse_head(resp_rd *r, const char *head, size_t n, cp_err *err)
{
    int major = 0, minor = 0, status = 0, used = 0;
    if (sscanf(head, "HTTP/%1d.%1d %3d%n", &major, &minor, &status, &used) != 3 || major != 1 ||
        status < 100 || status > 999 ||
        (head[used] != ' ' && head[used] != '\r' && head[used] != '\n'))
        return cp_err_set(err, CP_EIO, "%s: malformed response: bad status line '%.40s'", r->who,
                          head);
    r->out->status = status;
    r->out->content_type[0] = 0;
    r->out->partial[0] = 0;
    int chunked = 0, have_len = 0;
    uint64_t len = 0;
    const char *p = memchr(head, '\n', n) + 1, *end = head + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = (size_t)(nl - p);
        if (ll == 0 || (ll == 1 && *p == '\r')) break; /* the blank line */
        const char *colon = memchr(p, ':', ll);
        if (!colon || colon == p)
            return cp_err_set(err, CP_EIO, "%s: malformed response: header line '%.40s'", r->who,
                              p);
        size_t nl_name = (size_t)(colon - p), vl = ll - nl_name - 1;
        char v[128];
        if (nl_name == 12 && !strncasecmp(p, "content-type", 12)) {
            header_value(colon + 1, vl, r->out->content_type, sizeof r->out->content_type);
        } else if (nl_name == 16 && !strncasecmp(p, "contprof-partial", 16)) {
            header_value(colon + 1, vl, r->out->partial, sizeof r->out->partial);
        } else if (nl_name == 14 && !strncasecmp(p, "content-length", 14)) {
            header_value(colon + 1, vl, v, sizeof v);
            char *e;
            errno = 0;
            unsigned long long x = strtoull(v, &e, 10);
            if (!v[0] || *e || errno || v[0] == '-' || (have_len && x != len))
                return cp_err_set(err, CP_EIO, "%s: malformed response: Content-Length '%s'",
                                  r->who, v);
            len = x;
            have_len = 1;
        } else if (nl_name == 17 && !strncasecmp(p, "transfer-encoding", 17)) {
            header_value(colon + 1, vl, v, sizeof v);
            size_t l = strlen(v);
            chunked = l >= 7 && !strcasecmp(v + l - 7, "chunked");
        }
        p = nl + 1;
    }
    if (status < 200) { /* an interim answer (100 Continue): the real one follows */
        r->state = R_HEAD;
        return 0;
    }
    if (status == 204 || status == 304) {
        r->state = R_DONE;
    } else if (chunked) {
        r->state = R_CHUNK_SIZE;
        r->line_len = 0;
    } else if (have_len) {
        if (len > r->max_body)
            return cp_err_set(err, CP_ELIMIT, "%s: response of %llu bytes, larger than %zu", r->who,
                              (unsigned long long)len, r->max_body);
        r->left = len;
        r->state = len ? R_LENGTH : R_DONE;
    } else {
        r->state = R_CLOSE;
    }
    return 0;
}

/* Gathers one line (up to '\n') into r->line; returns the bytes used, and sets *whole
 * when the line ended. Longer lines are cut (chunk extensions are not read). */
static size_t take_line(resp_rd *r, const char *p, size_t n, int *whole)
{
    const char *nl = memchr(p, '\n', n);
    size_t use = nl ? (size_t)(nl - p) + 1 : n;
    size_t room = sizeof r->line - 1 - r->line_len, c = use < room ? use : room;
    memcpy(r->line + r->line_len, p, c);
    r->line_len += c;
    r->line[r->line_len] = 0;
    *whole = nl != NULL;
    return use;
}

/* Reads p[0..n) of the response. */
static int feed(resp_rd *r, const char *p, size_t n, cp_err *err)
{
    while (n && r->state != R_DONE) {
        int rc, whole;
        size_t use;
        switch (r->state) {
        case R_HEAD: {
            size_t from = r->head.len > 3 ? r->head.len - 3 : 0;
            size_t room = CP_HTTP_MAX_HEAD - r->head.len, c = n < room ? n : room;
            if (cp_buf_append(&r->head, p, c) || cp_buf_reserve(&r->head, 1))
                return cp_err_set(err, CP_ENOMEM, "%s: out of memory", r->who);
            r->head.data[r->head.len] = 0;
            const char *h = (const char *)r->head.data, *e = NULL;
            for (size_t i = from; i < r->head.len && !e; i++) /* "\n\n" or "\n\r\n" */
                if (h[i] == '\n' && i > 0 &&
                    (h[i - 1] == '\n' || (h[i - 1] == '\r' && i > 1 && h[i - 2] == '\n')))
                    e = h + i + 1;
            if (!e) {
                if (r->head.len >= CP_HTTP_MAX_HEAD)
                    return cp_err_set(err, CP_ELIMIT, "%s: response headers larger than %u bytes",
                                      r->who, CP_HTTP_MAX_HEAD);
                p += c;
                n -= c;
                break;
            }
            size_t hl = (size_t)(e - h), rest = r->head.len - hl;
            if ((rc = parse_head(r, h, hl, err))) return rc;
            /* what came after the blank line is read again in the new state */
            p += c - rest;
            n -= c - rest;
            r->head.len = 0;
            break;
        }
        case R_LENGTH:
        case R_CHUNK_DATA:
            use = n < r->left ? n : (size_t)r->left;
            if ((rc = body_add(r, p, use, err))) return rc;
            r->left -= use;
            p += use;
            n -= use;
            if (!r->left) r->state = r->state == R_LENGTH ? R_DONE : R_CHUNK_END;
            break;
        case R_CLOSE:
            if ((rc = body_add(r, p, n, err))) return rc;
            n = 0;
            break;
        case R_CHUNK_SIZE:
            use = take_line(r, p, n, &whole);
            p += use;
            n -= use;
            if (!whole) break;
            {
                char *e;
                errno = 0;
                unsigned long long x = strtoull(r->line, &e, 16);
                if (e == r->line || errno ||
                    (*e != ';' && *e != '\r' && *e != '\n' && *e != ' ' && *e != '\t'))
                    return cp_err_set(err, CP_EIO, "%s: malformed response: chunk size '%.20s'",
                                      r->who, r->line);
                if (x > r->max_body)
                    return cp_err_set(err, CP_ELIMIT, "%s: response larger than %zu bytes", r->who,
                                      r->max_body);
                r->left = x;
                r->line_len = 0;
                r->state = x ? R_CHUNK_DATA : R_TRAILER;
            }
            break;
        case R_CHUNK_END: /* the CRLF after a chunk's data */
            use = take_line(r, p, n, &whole);
            p += use;
            n -= use;
            if (!whole) break;
            if (r->line_len > 2 || (r->line_len == 2 && r->line[0] != '\r'))
                return cp_err_set(err, CP_EIO, "%s: malformed response: no CRLF after a chunk",
                                  r->who);
            r->line_len = 0;
            r->state = R_CHUNK_SIZE;
            break;
        case R_TRAILER: /* trailer fields up to an empty line, ignored */
            use = take_line(r, p, n, &whole);
            p += use;
            n -= use;
            if (!whole) break;
            if (r->line_len <= 2 && (r->line_len == 1 || r->line[0] == '\r')) r->state = R_DONE;
            r->line_len = 0;
            break;
        }
    }
    return 0;
}

/* ===== one exchange =================================================================== */

/* Sends req on fd and reads one response into out. */
static int exchange(int fd, const char *who, const void *req, size_t len, int64_t deadline,
                    size_t max_body, cp_http_result *out, cp_err *err)
{
    const char *p = req;
    while (len) {
        if (wait_fd(fd, POLLOUT, deadline))
            return cp_err_set(err, CP_EIO, "%s: timed out sending the request", who);
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) break; /* read its answer */
        if (n < 0) return cp_err_set(err, CP_EIO, "%s: send: %s", who, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    resp_rd r = {.out = out, .who = who, .max_body = max_body ? max_body : MAX_BODY_DEFAULT};
    char buf[16384];
    int rc = 0;
    while (r.state != R_DONE) {
        if (wait_fd(fd, POLLIN, deadline)) {
            rc = cp_err_set(err, CP_EIO, "%s: timed out waiting for the response", who);
            break;
        }
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) {
            rc = cp_err_set(err, CP_EIO, "%s: recv: %s", who, strerror(errno));
            break;
        }
        if (n == 0) {
            if (r.state == R_CLOSE)
                r.state = R_DONE;
            else
                rc =
                    cp_err_set(err, CP_EIO, "%s: connection closed before the response ended", who);
            break;
        }
        if ((rc = feed(&r, buf, (size_t)n, err))) break;
    }
    cp_buf_close(&r.head);
    if (!rc && cp_buf_reserve(&out->body, 1))
        rc = cp_err_set(err, CP_ENOMEM, "%s: out of memory", who);
    if (!rc) out->body.data[out->body.len] = 0;
    return rc;
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
    if (rc) cp_buf_close(&out->body);
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
    url_parts u;
    int rc = parse_url(base_url, &u, err);
    if (rc) return rc;
    cp_buf req = {0};
    rc = cp_buf_printf(&req,
                       "%s %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: contprof\r\n"
                       "Accept: application/json, */*\r\nConnection: close\r\n",
                       method, u.prefix, path_query, u.hostport);
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
    snprintf(who, sizeof who, "%s:%s", u.host, u.port);
    int64_t deadline = now_ms() + timeout_ms;
    int fd = connect_to(u.host, u.port, deadline, err);
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

int cp_http_delete(const char *base_url, const char *path_query, const char *token,
                   int64_t timeout_ms, size_t max_body, cp_http_result *out, cp_err *err)
{
    return request("DELETE", base_url, path_query, token, NULL, 0, timeout_ms, max_body, out, err);
}

/* ===== the brokers question =========================================================== */

int cp_http_get_brokers(const char *url, const char *token, char *out, size_t cap, int timeout_ms,
                        cp_err *err)
{
    return cp_http_get_transport(url, token, out, cap, NULL, 0, timeout_ms, err);
}

int cp_http_get_transport(const char *url, const char *token, char *out, size_t cap, char *relay,
                          size_t rcap, int timeout_ms, cp_err *err)
{
    if (cap) out[0] = 0;
    if (relay && rcap) relay[0] = 0;
    cp_http_result res;
    int rc = cp_http_get(url, "/api/v1/brokers", token, timeout_ms, 64u << 10, &res, err);
    if (rc) return rc;
    cp_json *j = NULL;
    cp_err jerr = {0};
    if (res.status != 200) {
        rc = cp_err_set(err, CP_EIO, "%s/api/v1/brokers answered %d: %.200s", url, res.status,
                        (const char *)res.body.data);
    } else if ((rc = cp_json_parse((const char *)res.body.data, res.body.len, &j, &jerr))) {
        rc = cp_err_set(err, rc, "%s/api/v1/brokers: %s", url, jerr.msg);
    } else {
        const char *b = cp_json_str(cp_json_get(j, "brokers"), NULL);
        if (!b)
            rc = cp_err_set(err, CP_EPARSE,
                            "%s/api/v1/brokers: no \"brokers\" string in the answer", url);
        else if (!*b) /* a contprofd that is starting answers before its broker is up */
            rc = cp_err_set(err, CP_ENOTFOUND,
                            "%s has no Kafka brokers to offer yet (GET /api/v1/brokers)", url);
        else if (strlen(b) >= cap)
            rc = cp_err_set(err, CP_ELIMIT, "%s/api/v1/brokers: a list of %zu bytes, room for %zu",
                            url, strlen(b), cap ? cap - 1 : 0);
        else
            memcpy(out, b, strlen(b) + 1);
        const char *r = cp_json_str(cp_json_get(j, "relay"), "");
        if (!rc && relay && rcap && strlen(r) < rcap) memcpy(relay, r, strlen(r) + 1);
    }
    cp_json_free(j);
    cp_buf_close(&res.body);
    return rc;
}
