/* The HTTP/1.1 server behind contprofd's API: libuv for I/O, Debian's http-parser for the
 * protocol. One connection handles one request at a time (pipelined requests wait in the
 * input buffer); heavy requests go through a bounded FIFO onto libuv's threadpool. */
#include "http.h"
#include "json.h"

#include <errno.h>
#include <http_parser.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "defaults.h"
#include "log.h"
#include "pprof.h" /* cp_gzip */

typedef struct conn conn;
typedef struct job job;

/* A FIFO of requests waiting for the threadpool, with its own number of slots. */
typedef struct lane {
    job *qhead, *qtail;
    uint32_t nqueued, nrunning, concurrency;
} lane;

struct cp_http_server {
    uv_loop_t *loop;
    /* The thread running the loop: everything here but work_cb and cheap_main runs on it
     * (checked in debug builds at the entries from libuv and the API). */
    cp_thread_owner loop_thread;
    uv_tcp_t listener;
    int listening;
    int port;
    cp_http_options opt;
    int base_nice;   /* the nice value of the thread that created the server */
    conn *conns;     /* doubly linked */
    uint32_t nconns; /* allocated, closing ones included */
    uint32_t nlive;  /* not closing */
    lane lanes[3];   /* 0: heavy (libuv's threadpool), 1: cheap and 2: peer (the threads below) */
    /* The cheap lane's own threads, so that merges on libuv's threadpool (at a lower CPU
     * priority) never hold the thread a cheap request needs. */
    pthread_t *cheap_threads;
    uint32_t ncheap_threads;
    pthread_mutex_t cheap_mu;
    pthread_cond_t cheap_cv;
    job *cheap_todo, *cheap_done; /* guarded by cheap_mu */
    int cheap_stop;
    uv_async_t cheap_async; /* a cheap job is done */
    int cheap_async_open;
    size_t out_bytes;     /* answer bytes queued for writing, not yet written */
    size_t refused_bytes; /* the last answer refused for the budget, until a write ends */
    size_t rendering;     /* budget reserved by heavy requests running (their estimates) */
    size_t estimate;      /* what a heavy answer may take: recent sizes, decaying */
    uint32_t uploads;     /* requests holding an upload-sized body (receiving or answering) */
    uint32_t ingests;     /* requests holding an ingest-sized body (opt.ingest_paths) */
    int shutting_down, listener_closed;
    void (*shutdown_cb)(void *);
    void *shutdown_arg;
};

struct job {
    uv_work_t work;
    job *next;
    conn *c;
    cp_http_request req;
    cp_http_response resp;
    int heavy;
    int upload_slot; /* SLOT_UPLOAD: one of s->uploads; SLOT_INGEST: one of s->ingests */
    char hdr[CP_HTTP_NHDR][CP_HTTP_HDR_MAX]; /* req's content_type, content_encoding, org_id */
    int lane;                                /* index into lanes */
    size_t reserved;                         /* of the budget, while running */
};

struct conn {
    uv_tcp_t tcp; /* first: handle->data is not needed to find the conn */
    uv_timer_t idle;
    int nhandles; /* open handles; freed at 0 */
    cp_http_server *srv;
    conn *prev, *next;
    http_parser parser;
    cp_buf in; /* received bytes not yet parsed */
    /* The request being parsed. */
    cp_buf url, body, auth;
    char field[32];
    size_t field_len;
    int field_overflow, in_value, is_auth, is_ae;
    int accepts_gzip; /* Accept-Encoding names gzip */
    char ae[64];      /* the start of the Accept-Encoding header */
    size_t ae_len;
    int is_hdr;                              /* the value being read is hdr[is_hdr - 1]'s */
    char hdr[CP_HTTP_NHDR][CP_HTTP_HDR_MAX]; /* Content-Type, Content-Encoding, X-Scope-OrgID */
    size_t hdr_len[CP_HTTP_NHDR];
    size_t header_bytes;
    int err_status;
    char err_msg[160];
    int complete;   /* a whole request was parsed and waits to be dispatched */
    int in_message; /* a request has begun: its bytes must all arrive within the idle timeout */
    int busy;       /* a request is being answered */
    int keep_alive;
    int closing;
    int reading;
    int writing;      /* an answer is being written */
    int overflow;     /* accepted beyond max_connections: may only ask /healthz */
    size_t wq_last;   /* bytes still to write at the last write-timeout check */
    int64_t since_ns; /* accepted, or last answer written: the age eviction goes by */
    struct sockaddr_storage peer;
    char method[16];
    size_t body_max; /* this request's body limit (set when its headers are complete) */
    int upload_slot; /* SLOT_*: holds one of srv->uploads or ingests until its job takes it */
};

enum { SLOT_NONE, SLOT_UPLOAD, SLOT_INGEST };
/* The headers kept (their values, truncated to CP_HTTP_HDR_MAX - 1 bytes), in hdr order. */
static const char *const g_hdr_names[CP_HTTP_NHDR] = {"content-type", "content-encoding",
                                                      "x-scope-orgid"};

typedef struct write_req {
    uv_write_t w;
    conn *c;
    char *head;
    cp_buf body;
    size_t accounted; /* bytes counted in out_bytes */
    int close_after;
} write_req;

static http_parser_settings g_settings;

/* ---- JSON helpers ------------------------------------------------------------------- */

const char *cp_http_bearer(const cp_http_request *req, size_t *len)
{
    const char *h = req->authorization;
    if (!h) return NULL;
    while (*h == ' ')
        h++;
    if (strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    *len = n;
    return h;
}

int cp_http_token_eq(const char *tok, size_t len, const char *want)
{
    size_t wlen = strlen(want);
    unsigned char d = (unsigned char)(len != wlen);
    for (size_t i = 0; i < wlen; i++)
        d |= (unsigned char)(want[i] ^ (i < len ? tok[i] : 0));
    return d == 0;
}

void cp_http_error(cp_http_response *resp, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    resp->status = status;
    snprintf(resp->content_type, sizeof resp->content_type, "application/json");
    resp->body.len = 0;
    if (cp_buf_append(&resp->body, "{\"error\":\"", 10) ||
        cp_json_escape(&resp->body, msg, strlen(msg)) || cp_buf_append(&resp->body, "\"}\n", 3)) {
        /* Out of memory: an empty body still carries the status. */
        resp->body.len = 0;
    }
}

/* ---- connections -------------------------------------------------------------------- */

static void conn_process(conn *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void server_maybe_finished(cp_http_server *s);

static void release_upload(cp_http_server *s, int *slot)
{
    if (*slot == SLOT_UPLOAD) s->uploads--;
    if (*slot == SLOT_INGEST) s->ingests--;
    *slot = SLOT_NONE;
}

static void conn_reset_request(conn *c)
{
    release_upload(c->srv, &c->upload_slot);
    c->url.len = c->body.len = c->auth.len = 0;
    c->field_len = 0;
    c->field_overflow = c->in_value = c->is_auth = c->is_ae = 0;
    c->ae_len = 0;
    c->is_hdr = 0;
    memset(c->hdr_len, 0, sizeof c->hdr_len);
    for (int i = 0; i < CP_HTTP_NHDR; i++)
        c->hdr[i][0] = 0;
    c->accepts_gzip = 0;
    c->header_bytes = 0;
    c->err_status = 0;
    c->err_msg[0] = 0;
    c->complete = 0;
}

static void conn_free_if_closed(conn *c)
{
    if (c->nhandles > 0) return;
    cp_http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->nconns--;
    release_upload(s, &c->upload_slot);
    cp_buf_close(&c->in);
    cp_buf_close(&c->url);
    cp_buf_close(&c->body);
    cp_buf_close(&c->auth);
    free(c);
    server_maybe_finished(s);
}

static void on_handle_closed(uv_handle_t *h)
{
    conn *c = h->data;
    c->nhandles--;
    conn_free_if_closed(c);
}

static void conn_close(conn *c)
{
    if (c->closing) return;
    c->closing = 1;
    c->srv->nlive--;
    uv_timer_stop(&c->idle);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->idle, on_handle_closed);
}

static uint64_t ns_to_ms(int64_t ns)
{
    return ns >= 1000000 ? (uint64_t)(ns / 1000000) : 1;
}

/* One timer per connection: idle, request arrival, or write progress, by state. */
static void on_idle(uv_timer_t *t)
{
    conn *c = t->data;
    if (c->writing) {
        /* A client that does not read must not hold its answer forever: the write has to
         * make progress every write_timeout. */
        size_t q = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
        if (q && q < c->wq_last) {
            c->wq_last = q;
            uv_timer_start(&c->idle, on_idle, ns_to_ms(c->srv->opt.write_timeout_ns), 0);
            return;
        }
        if (q) {
            cp_log_info("http: closing a connection whose answer made no progress for %.0f s "
                        "(%zu bytes unwritten)",
                        (double)c->srv->opt.write_timeout_ns / 1e9, q);
            /* An abortive close (RST): the kernel drops what is still in the socket's send
             * buffer too, instead of holding it for a peer that does not read. */
            uv_os_fd_t fd;
            struct linger lg = {1, 0};
            if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            conn_close(c);
        }
        return;
    }
    if (!c->busy) conn_close(c);
}

static void conn_arm_idle(conn *c)
{
    uv_timer_start(&c->idle, on_idle, ns_to_ms(c->srv->opt.idle_timeout_ns), 0);
}

/* A request has begun: all of it must arrive within the request timeout (slowloris). */
static void conn_arm_request(conn *c)
{
    const cp_http_options *o = &c->srv->opt;
    int64_t t = o->request_timeout_ns;
    if (!t || t > o->idle_timeout_ns) t = o->idle_timeout_ns;
    uv_timer_start(&c->idle, on_idle, ns_to_ms(t), 0);
}

static void pump(cp_http_server *s);

static void on_written(uv_write_t *w, int status)
{
    write_req *wr = (write_req *)w;
    conn *c = wr->c;
    cp_http_server *srv = c->srv;
    srv->out_bytes -= wr->accounted;
    if (wr->accounted > 65536) {
        srv->refused_bytes = 0; /* room again: worth a try */
        if (srv->lanes[0].qhead) pump(srv);
    }
    free(wr->head);
    cp_buf_close(&wr->body);
    int close_after = wr->close_after;
    free(wr);
    c->busy = 0;
    c->writing = 0;
    c->since_ns = cp_mono_ns();
    if (c->closing) return;
    uv_timer_stop(&c->idle);
    if (status < 0 || close_after || c->srv->shutting_down) {
        conn_close(c);
        return;
    }
    conn_arm_idle(c);
    conn_process(c);
    if (!c->reading && !c->closing) {
        c->reading = 1;
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    }
}

/* Queues resp on c (taking its body) and closes afterwards unless keep-alive. */
static void conn_send(conn *c, cp_http_response *resp, int keep_alive)
{
    cp_http_server *s = c->srv;
    CP_ASSERT_THREAD(&s->loop_thread, "loop thread only");
    if (resp->body.len > s->opt.max_response_bytes) {
        size_t n = resp->body.len;
        cp_buf_close(&resp->body);
        cp_http_error(resp, 400,
                      "response of %zu bytes exceeds the limit of %zu bytes; narrow the "
                      "selector or window, or use max_nodes",
                      n, s->opt.max_response_bytes);
    }
    /* Errors are small; an answer that would pass the budget of answers held until written
     * is dropped: memory is bounded by configuration, not by clients that do not read. */
    if (s->opt.max_inflight_bytes && resp->body.len > 65536 &&
        s->out_bytes + resp->body.len > s->opt.max_inflight_bytes) {
        size_t n = resp->body.len;
        s->refused_bytes = n;
        cp_buf_close(&resp->body);
        cp_http_error(resp, 503,
                      "answer of %zu bytes would exceed the budget of %zu bytes for answers "
                      "being written (%zu in use); retry later",
                      n, s->opt.max_inflight_bytes, s->out_bytes);
        snprintf(resp->extra_headers, sizeof resp->extra_headers, "Retry-After: 2\r\n");
    }
    if (!resp->status) resp->status = 200;
    if (!resp->content_type[0])
        snprintf(resp->content_type, sizeof resp->content_type, "application/json");
    if (c->closing) {
        cp_buf_close(&resp->body);
        return;
    }
    write_req *wr = calloc(1, sizeof *wr);
    char *head = malloc(512 + sizeof resp->extra_headers);
    if (!wr || !head) {
        free(wr);
        free(head);
        cp_buf_close(&resp->body);
        conn_close(c);
        return;
    }
    if (s->shutting_down) keep_alive = 0;
    const char *reason = http_status_str((enum http_status)resp->status);
    int hl = snprintf(head, 512 + sizeof resp->extra_headers,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                      "Cache-Control: no-store\r\n%sConnection: %s\r\n\r\n",
                      resp->status, reason, resp->content_type, resp->body.len, resp->extra_headers,
                      keep_alive ? "keep-alive" : "close");
    wr->c = c;
    wr->head = head;
    wr->body = resp->body;
    memset(&resp->body, 0, sizeof resp->body);
    wr->close_after = !keep_alive;
    wr->accounted = wr->body.len + (size_t)hl;
    uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)hl),
                        uv_buf_init((char *)wr->body.data, (unsigned)wr->body.len)};
    c->busy = 1;
    uv_timer_stop(&c->idle);
    if (uv_write(&wr->w, (uv_stream_t *)&c->tcp, bufs, wr->body.len ? 2 : 1, on_written)) {
        free(head);
        cp_buf_close(&wr->body);
        free(wr);
        c->busy = 0;
        conn_close(c);
        return;
    }
    s->out_bytes += wr->accounted;
    c->writing = 1;
    c->wq_last = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (c->wq_last && s->opt.write_timeout_ns)
        uv_timer_start(&c->idle, on_idle, ns_to_ms(s->opt.write_timeout_ns), 0);
}

static void conn_send_error(conn *c, int status, const char *msg, int keep_alive)
{
    cp_http_response resp = {0};
    cp_http_error(&resp, status, "%s", msg);
    conn_send(c, &resp, keep_alive);
}

/* ---- http-parser callbacks ---------------------------------------------------------- */

static int fail(conn *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(conn *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    c->err_status = status;
    return 1; /* stops the parser */
}

static int count_header(conn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->srv->opt.max_header_bytes)
        return fail(c, 431, "request headers exceed %zu bytes", c->srv->opt.max_header_bytes);
    return 0;
}

static int on_message_begin(http_parser *p)
{
    conn *c = p->data;
    conn_reset_request(c);
    c->in_message = 1;
    conn_arm_request(c);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    conn *c = p->data;
    if (c->url.len + n > c->srv->opt.max_url_bytes)
        return fail(c, 414, "request URL exceeds %zu bytes", c->srv->opt.max_url_bytes);
    if (count_header(c, n)) return 1;
    return cp_buf_append(&c->url, at, n) ? fail(c, 503, "out of memory") : 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    conn *c = p->data;
    if (count_header(c, n)) return 1;
    if (c->in_value) {
        c->in_value = 0;
        c->field_len = 0;
        c->field_overflow = 0;
    }
    if (c->field_len + n >= sizeof c->field) {
        c->field_overflow = 1;
    } else {
        memcpy(c->field + c->field_len, at, n);
        c->field_len += n;
    }
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    conn *c = p->data;
    if (count_header(c, n)) return 1;
    if (!c->in_value) {
        c->in_value = 1;
        c->is_auth = !c->field_overflow && c->field_len == 13 &&
                     strncasecmp(c->field, "authorization", 13) == 0;
        if (c->is_auth) c->auth.len = 0;
        c->is_ae = !c->field_overflow && c->field_len == 15 &&
                   strncasecmp(c->field, "accept-encoding", 15) == 0;
        if (c->is_ae) c->ae_len = 0;
        c->is_hdr = 0;
        for (int i = 0; i < CP_HTTP_NHDR && !c->field_overflow; i++)
            if (c->field_len == strlen(g_hdr_names[i]) &&
                strncasecmp(c->field, g_hdr_names[i], c->field_len) == 0) {
                c->is_hdr = i + 1;
                c->hdr_len[i] = 0;
            }
    }
    if (c->is_hdr) {
        int i = c->is_hdr - 1;
        size_t room = CP_HTTP_HDR_MAX - 1 - c->hdr_len[i], k = n < room ? n : room;
        memcpy(c->hdr[i] + c->hdr_len[i], at, k);
        c->hdr_len[i] += k;
        c->hdr[i][c->hdr_len[i]] = 0;
    }
    if (c->is_auth && cp_buf_append(&c->auth, at, n)) return fail(c, 503, "out of memory");
    if (c->is_ae) {
        size_t k = n < sizeof c->ae - 1 - c->ae_len ? n : sizeof c->ae - 1 - c->ae_len;
        memcpy(c->ae + c->ae_len, at, k);
        c->ae_len += k;
        c->ae[c->ae_len] = 0;
        /* "gzip" listed, and not refused with q=0 (a rare form, treated as no). */
        c->accepts_gzip = strstr(c->ae, "gzip") && !strstr(c->ae, "gzip;q=0");
    }
    return 0;
}

/* 1 if the request being parsed is a POST to path (its query string aside). */
static int is_post_to(const conn *c, const http_parser *p, const char *path)
{
    size_t ul = path ? strlen(path) : 0;
    if (!ul || p->method != HTTP_POST || c->url.len < ul || memcmp(c->url.data, path, ul) != 0)
        return 0;
    return c->url.len == ul || c->url.data[ul] == '?';
}

/* SLOT_UPLOAD for a POST to the upload path, SLOT_INGEST to one of the ingest paths, else
 * SLOT_NONE. */
static int body_kind(const conn *c, const http_parser *p)
{
    if (is_post_to(c, p, c->srv->opt.upload_path)) return SLOT_UPLOAD;
    for (const char *const *ip = c->srv->opt.ingest_paths; ip && *ip; ip++)
        if (is_post_to(c, p, *ip)) return SLOT_INGEST;
    return SLOT_NONE;
}

/* The request's admission before its body: its target and token as the handler will see
 * them (opt.admit). 0, or 1 with the refusal set. */
static int admit(conn *c, const http_parser *p)
{
    const cp_http_options *o = &c->srv->opt;
    int chunked = (p->flags & F_CHUNKED) != 0;
    if (!o->admit || (!chunked && (p->content_length == 0 || p->content_length == ULLONG_MAX)))
        return 0;
    const char *u = c->url.len ? (const char *)c->url.data : "/";
    struct http_parser_url pu;
    http_parser_url_init(&pu);
    if (http_parser_parse_url(u, c->url.len ? c->url.len : 1, 0, &pu) ||
        !(pu.field_set & (1 << UF_PATH)))
        return fail(c, 400, "malformed request target");
    char *path = strndup(u + pu.field_data[UF_PATH].off, pu.field_data[UF_PATH].len);
    char *query = (pu.field_set & (1 << UF_QUERY))
                      ? strndup(u + pu.field_data[UF_QUERY].off, pu.field_data[UF_QUERY].len)
                      : strdup("");
    char *auth = c->auth.len ? strndup((const char *)c->auth.data, c->auth.len) : NULL;
    int rc = 0;
    if (!path || !query || (c->auth.len && !auth)) {
        rc = fail(c, 503, "out of memory");
    } else {
        cp_http_request head = {.method = http_method_str((enum http_method)p->method),
                                .path = path,
                                .query = query,
                                .authorization = auth,
                                .content_type = c->hdr[0],
                                .content_encoding = c->hdr[1],
                                .org_id = c->hdr[2],
                                .body_len = chunked ? 0 : (size_t)p->content_length};
        char why[200] = "";
        int st = o->admit(o->ctx, &head, why, sizeof why);
        if (st) rc = fail(c, st, "%s", why[0] ? why : "refused");
    }
    free(path);
    free(query);
    free(auth);
    return rc;
}

static int on_headers_complete(http_parser *p)
{
    conn *c = p->data;
    int kind = body_kind(c, p);
    const cp_http_options *o = &c->srv->opt;
    c->body_max = kind == SLOT_UPLOAD   ? o->max_upload_bytes
                  : kind == SLOT_INGEST ? o->max_ingest_bytes
                                        : o->max_body_bytes;
    /* who asks and how much, before a byte of the body is read (issue 36: a 500 MB upload
     * without a token was read whole, then answered 401) */
    if (admit(c, p)) return 1;
    if (p->content_length != ULLONG_MAX && p->content_length > c->body_max)
        return fail(c, 413, "request body of %llu bytes exceeds %zu bytes%s",
                    (unsigned long long)p->content_length, c->body_max,
                    kind == SLOT_UPLOAD   ? " (symbols.max_upload_bytes)"
                    : kind == SLOT_INGEST ? " (ingest.max_body_bytes)"
                                          : "");
    if (kind == SLOT_UPLOAD && !c->upload_slot) {
        /* each upload may hold max_upload_bytes: only a few at once */
        if (c->srv->uploads >= o->max_uploads)
            return fail(c, 503, "%u uploads in progress already; retry later", c->srv->uploads);
        c->srv->uploads++;
        c->upload_slot = SLOT_UPLOAD;
    }
    if (kind == SLOT_INGEST && !c->upload_slot) {
        /* each may hold max_ingest_bytes; a client over the limit retries (Pyroscope's 429) */
        if (c->srv->ingests >= o->max_ingests)
            return fail(c, 429,
                        "%u ingest requests in progress already (ingest.max_concurrent); "
                        "retry later",
                        c->srv->ingests);
        c->srv->ingests++;
        c->upload_slot = SLOT_INGEST;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    conn *c = p->data;
    if (c->body.len + n > c->body_max)
        return fail(c, 413, "request body exceeds %zu bytes", c->body_max);
    return cp_buf_append(&c->body, at, n) ? fail(c, 503, "out of memory") : 0;
}

static int on_message_complete(http_parser *p)
{
    conn *c = p->data;
    c->complete = 1;
    c->in_message = 0;
    c->keep_alive = http_should_keep_alive(p);
    snprintf(c->method, sizeof c->method, "%s", http_method_str((enum http_method)p->method));
    http_parser_pause(p, 1); /* one request at a time; the rest stays in c->in */
    return 0;
}

/* ---- dispatch ----------------------------------------------------------------------- */

static void job_free(job *j)
{
    free((char *)j->req.path);
    free((char *)j->req.query);
    free((char *)j->req.authorization);
    free((uint8_t *)j->req.body);
    cp_buf_close(&j->resp.body);
    free(j);
}

static void job_finish(job *j)
{
    conn *c = j->c;
    cp_http_server *s = c->srv;
    int heavy = j->heavy;
    int status = j->resp.status ? j->resp.status : 200;
    release_upload(s, &j->upload_slot);
    conn_send(c, &j->resp, c->keep_alive);
    if (s->opt.observe)
        s->opt.observe(s->opt.ctx, &j->req, status, heavy,
                       (double)(cp_mono_ns() - j->req.received_ns) / 1e9);
    job_free(j);
}

/* gzip's a compressible answer for a client that accepts it (on the thread that made it). */
static void maybe_gzip(const cp_http_server *s, const cp_http_request *req, cp_http_response *r)
{
    if (!s->opt.gzip_min_bytes || !req->accepts_gzip || !r->compressible ||
        r->body.len < s->opt.gzip_min_bytes)
        return;
    size_t hl = strlen(r->extra_headers);
    static const char h[] = "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n";
    if (hl + sizeof h > sizeof r->extra_headers) return;
    cp_buf z = {0};
    if (cp_gzip(r->body.data, r->body.len, 1, &z)) {
        cp_buf_close(&z);
        return; /* send it uncompressed */
    }
    cp_buf_close(&r->body);
    r->body = z;
    memcpy(r->extra_headers + hl, h, sizeof h);
}

static void work_cb(uv_work_t *w)
{
    job *j = (job *)w;
    cp_http_server *s = j->c->srv;
    /* Heavy requests run only on libuv's threadpool: its threads drop to a lower CPU
     * priority (the server's nice + heavy_nice; once per thread, as an unprivileged
     * process cannot raise it back), so that the loop and the cheap lane win the CPU from
     * merges. */
    if (s->opt.heavy_nice > 0) {
        pid_t tid = (pid_t)syscall(SYS_gettid);
        int want = s->base_nice + s->opt.heavy_nice > 19 ? 19 : s->base_nice + s->opt.heavy_nice;
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, (id_t)tid);
        if (errno == 0 && cur < want) setpriority(PRIO_PROCESS, (id_t)tid, want);
    }
    s->opt.handle(s->opt.ctx, &j->req, &j->resp);
    maybe_gzip(s, &j->req, &j->resp);
}

static void *cheap_main(void *arg)
{
    cp_http_server *s = arg;
    pthread_mutex_lock(&s->cheap_mu);
    for (;;) {
        while (!s->cheap_todo && !s->cheap_stop)
            pthread_cond_wait(&s->cheap_cv, &s->cheap_mu);
        if (!s->cheap_todo) break;
        job *j = s->cheap_todo;
        s->cheap_todo = j->next;
        pthread_mutex_unlock(&s->cheap_mu);
        s->opt.handle(s->opt.ctx, &j->req, &j->resp);
        maybe_gzip(s, &j->req, &j->resp);
        pthread_mutex_lock(&s->cheap_mu);
        j->next = s->cheap_done;
        s->cheap_done = j;
        uv_async_send(&s->cheap_async);
    }
    pthread_mutex_unlock(&s->cheap_mu);
    return NULL;
}

/* Hands a cheap job to the cheap lane's threads (FIFO). */
static void cheap_submit(cp_http_server *s, job *j)
{
    pthread_mutex_lock(&s->cheap_mu);
    j->next = NULL;
    job **t = &s->cheap_todo;
    while (*t)
        t = &(*t)->next;
    *t = j;
    pthread_cond_signal(&s->cheap_cv);
    pthread_mutex_unlock(&s->cheap_mu);
}

static void after_work_cb(uv_work_t *w, int status);

static void on_cheap_done(uv_async_t *a)
{
    cp_http_server *s = a->data;
    pthread_mutex_lock(&s->cheap_mu);
    job *d = s->cheap_done;
    s->cheap_done = NULL;
    pthread_mutex_unlock(&s->cheap_mu);
    /* The list is newest first: answer in the order the jobs finished. */
    job *rev = NULL;
    while (d) {
        job *n = d->next;
        d->next = rev;
        rev = d;
        d = n;
    }
    while (rev) {
        job *n = rev->next;
        after_work_cb(&rev->work, 0);
        rev = n;
    }
}

static void after_work_cb(uv_work_t *w, int status)
{
    job *j = (job *)w;
    cp_http_server *s = j->c->srv;
    CP_ASSERT_THREAD(&s->loop_thread, "loop thread only");
    s->lanes[j->lane].nrunning--;
    s->rendering -= j->reserved;
    if (j->lane == 0) {
        size_t n = j->resp.body.len;
        s->estimate = n > s->estimate - s->estimate / 4 ? n : s->estimate - s->estimate / 4;
    }
    if (status == UV_ECANCELED) cp_http_error(&j->resp, 503, "query cancelled");
    j->heavy = 1;
    job_finish(j);
    pump(s);
    server_maybe_finished(s);
}

static void pump_lane(cp_http_server *s, lane *l)
{
    while (l->nrunning < l->concurrency && l->qhead) {
        size_t budget = s->opt.max_inflight_bytes;
        /* A heavy answer is rendered only when the budget has room for it, judged by the
         * recent answers' sizes; it waits in the queue (bounded by its deadline) while
         * others render, so that renders in flight stay within the budget too. */
        if (budget && l == &s->lanes[0] && s->rendering &&
            s->out_bytes + s->rendering + s->estimate > budget &&
            s->out_bytes + s->refused_bytes < budget) {
            job *h = l->qhead;
            if (!h->req.deadline_ns || cp_mono_ns() < h->req.deadline_ns) break;
        }
        job *j = l->qhead;
        l->qhead = j->next;
        if (!l->qhead) l->qtail = NULL;
        l->nqueued--;
        j->heavy = 1;
        if (j->req.deadline_ns && cp_mono_ns() >= j->req.deadline_ns) {
            cp_http_error(&j->resp, 503,
                          "query waited past its deadline, query.timeout (%.1f s), in the queue "
                          "(server busy)",
                          (double)s->opt.query_timeout_ns / 1e9);
            job_finish(j);
            continue;
        }
        if (l == &s->lanes[0] && s->opt.max_inflight_bytes &&
            s->out_bytes + s->refused_bytes >= s->opt.max_inflight_bytes) {
            /* Answers not yet taken by their clients fill the budget (or leave less room
             * than the last answer that was refused needed): rendering another one would
             * only add memory. */
            cp_http_error(&j->resp, 503,
                          "%zu bytes of answers wait to be written, the budget is %zu bytes; "
                          "retry later",
                          s->out_bytes, s->opt.max_inflight_bytes);
            snprintf(j->resp.extra_headers, sizeof j->resp.extra_headers, "Retry-After: 2\r\n");
            job_finish(j);
            continue;
        }
        l->nrunning++;
        if (l != &s->lanes[0]) { /* the threads run at most as many jobs as both lanes' slots */
            cheap_submit(s, j);
            continue;
        }
        j->reserved = s->estimate;
        s->rendering += j->reserved;
        if (uv_queue_work(s->loop, &j->work, work_cb, after_work_cb)) {
            l->nrunning--;
            s->rendering -= j->reserved;
            j->reserved = 0;
            cp_http_error(&j->resp, 503, "cannot schedule the query");
            job_finish(j);
        }
    }
}

static void pump(cp_http_server *s)
{
    CP_ASSERT_THREAD(&s->loop_thread, "loop thread only");
    pump_lane(s, &s->lanes[2]);
    pump_lane(s, &s->lanes[1]);
    pump_lane(s, &s->lanes[0]);
}

/* Turns the parsed request into a job and runs it inline or queues it. */
static void conn_dispatch(conn *c)
{
    cp_http_server *s = c->srv;
    CP_ASSERT_THREAD(&s->loop_thread, "loop thread only");
    job *j = calloc(1, sizeof *j);
    if (!j) {
        conn_send_error(c, 503, "out of memory", 0);
        return;
    }
    j->c = c;
    c->busy = 1;
    uv_timer_stop(&c->idle);
    const char *u = c->url.len ? (const char *)c->url.data : "/";
    size_t ulen = c->url.len ? c->url.len : 1;
    struct http_parser_url pu;
    http_parser_url_init(&pu);
    if (http_parser_parse_url(u, ulen, 0, &pu) || !(pu.field_set & (1 << UF_PATH))) {
        cp_http_error(&j->resp, 400, "malformed request target");
        goto respond;
    }
    char *path = strndup(u + pu.field_data[UF_PATH].off, pu.field_data[UF_PATH].len);
    char *query = (pu.field_set & (1 << UF_QUERY))
                      ? strndup(u + pu.field_data[UF_QUERY].off, pu.field_data[UF_QUERY].len)
                      : strdup("");
    char *auth = c->auth.len ? strndup((const char *)c->auth.data, c->auth.len) : NULL;
    uint8_t *body = NULL;
    size_t body_len = c->body.len;
    if (c->upload_slot) {
        /* an upload's body is handed over, not copied (it may be hundreds of MB) */
        body = cp_buf_steal(&c->body, &body_len);
        j->upload_slot = c->upload_slot;
        c->upload_slot = SLOT_NONE;
    } else if (c->body.len) {
        body = malloc(c->body.len);
        if (body) memcpy(body, c->body.data, c->body.len);
    }
    j->req.method = c->method;
    j->req.path = path;
    j->req.query = query;
    j->req.authorization = auth;
    memcpy(j->hdr, c->hdr, sizeof j->hdr);
    j->req.content_type = j->hdr[0];
    j->req.content_encoding = j->hdr[1];
    j->req.org_id = j->hdr[2];
    j->req.accepts_gzip = c->accepts_gzip;
    j->req.body = body;
    j->req.body_len = body ? body_len : 0;
    j->req.received_ns = cp_mono_ns();
    j->req.deadline_ns = s->opt.query_timeout_ns ? j->req.received_ns + s->opt.query_timeout_ns : 0;
    if (!path || !query || (c->auth.len && !auth) || (body_len && !body)) {
        cp_http_error(&j->resp, 503, "out of memory");
        goto respond;
    }
    if (c->overflow && strcmp(j->req.path, "/healthz") != 0) {
        /* A slot beyond max_connections, reserved so that health checks get through. */
        cp_http_error(&j->resp, 503, "too many connections (limit %u); retry later",
                      s->opt.max_connections);
        snprintf(j->resp.extra_headers, sizeof j->resp.extra_headers, "Retry-After: 2\r\n");
        c->keep_alive = 0;
        goto respond;
    }
    int ln = s->opt.is_light ? s->opt.is_light(s->opt.ctx, &j->req) : CP_HTTP_LANE_HEAVY;
    if (ln != CP_HTTP_LANE_LOOP) {
        j->lane = ln == CP_HTTP_LANE_CHEAP                             ? 1
                  : ln == CP_HTTP_LANE_PEER && s->opt.peer_concurrency ? 2
                                                                       : 0;
        lane *l = &s->lanes[j->lane];
        if (l->nqueued >= s->opt.max_queued) {
            cp_http_error(&j->resp, 503,
                          "too many queries in flight (%u running, %u queued); retry later",
                          l->nrunning, l->nqueued);
            snprintf(j->resp.extra_headers, sizeof j->resp.extra_headers, "Retry-After: 1\r\n");
            j->heavy = 1;
            goto respond;
        }
        if (l->qtail)
            l->qtail->next = j;
        else
            l->qhead = j;
        l->qtail = j;
        l->nqueued++;
        pump(s);
        return;
    }
    s->opt.handle(s->opt.ctx, &j->req, &j->resp);
    maybe_gzip(s, &j->req, &j->resp);
respond:
    job_finish(j);
}

/* Parses buffered input until a request is complete (and dispatched) or input runs out. */
static void conn_process(conn *c)
{
    while (!c->busy && !c->closing && c->in.len > 0) {
        if (HTTP_PARSER_ERRNO(&c->parser) == HPE_PAUSED) http_parser_pause(&c->parser, 0);
        size_t n =
            http_parser_execute(&c->parser, &g_settings, (const char *)c->in.data, c->in.len);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->err_status) {
            conn_send_error(c, c->err_status, c->err_msg, 0);
            c->in.len = 0;
            return;
        }
        if (e != HPE_OK && e != HPE_PAUSED) {
            char msg[160];
            snprintf(msg, sizeof msg, "malformed HTTP request: %s", http_errno_description(e));
            int status = e == HPE_HEADER_OVERFLOW ? 431 : 400;
            conn_send_error(c, status, msg, 0);
            c->in.len = 0;
            return;
        }
        if (n > c->in.len) n = c->in.len;
        memmove(c->in.data, c->in.data + n, c->in.len - n);
        c->in.len -= n;
        if (c->parser.upgrade) {
            conn_send_error(c, 400, "protocol upgrades are not supported", 0);
            c->in.len = 0;
            return;
        }
        if (c->complete) {
            c->complete = 0;
            conn_dispatch(c);
            continue;
        }
        if (n == 0) break;
    }
    if (!c->busy && !c->closing && c->srv->shutting_down) conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *c = h->data;
    (void)suggested;
    if (cp_buf_reserve(&c->in, 65536)) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    buf->base = (char *)c->in.data + c->in.len;
    buf->len = c->in.cap - c->in.len;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *c = st->data;
    (void)buf;
    if (nread < 0) {
        if (!c->busy)
            conn_close(c);
        else {
            uv_read_stop(st);
            c->keep_alive = 0;
        }
        return;
    }
    if (nread == 0) return;
    c->in.len += (size_t)nread;
    /* Bound what a client may pipeline while a request is being answered. */
    size_t cap = c->srv->opt.max_header_bytes + c->srv->opt.max_body_bytes + 65536;
    if (c->busy && c->in.len > cap) {
        uv_read_stop(st);
        c->reading = 0;
    }
    /* A trickling client cannot stretch one request past the idle timeout (slowloris). */
    if (!c->busy && !c->in_message) conn_arm_idle(c);
    conn_process(c);
}

static int same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return 0;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
    return 0;
}

/* At the connection cap: closes the connection that has gone longest without an answer
 * being made for it (idle keep-alive, or trickling a request), so that clients holding
 * connections open cannot lock others out. Connections being answered are kept. */
static int evict_oldest(cp_http_server *s, conn *except)
{
    conn *old = NULL;
    for (conn *c = s->conns; c; c = c->next)
        if (c != except && !c->closing && !c->busy && (!old || c->since_ns < old->since_ns))
            old = c;
    if (!old) return 0;
    conn_close(old);
    return 1;
}

static void on_connection(uv_stream_t *ls, int status)
{
    cp_http_server *s = ls->data;
    CP_ASSERT_THREAD(&s->loop_thread, "loop thread only");
    if (status < 0) {
        cp_log_warn("http: accept failed: %s", uv_strerror(status));
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->idle);
    c->tcp.data = c;
    c->idle.data = c;
    c->nhandles = 2;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    s->nlive++;
    c->since_ns = cp_mono_ns();
    if (uv_accept(ls, (uv_stream_t *)&c->tcp)) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    int plen = sizeof c->peer;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &plen))
        memset(&c->peer, 0, sizeof c->peer);
    if (s->shutting_down) {
        conn_send_error(c, 503, "server is shutting down", 0);
        return;
    }
    if (s->opt.max_conns_per_client) {
        uint32_t same = 0;
        for (conn *o = s->conns; o; o = o->next)
            if (o != c && !o->closing && same_peer(&o->peer, &c->peer)) same++;
        if (same >= s->opt.max_conns_per_client) {
            char msg[96];
            snprintf(msg, sizeof msg, "too many connections from this address (limit %u)",
                     s->opt.max_conns_per_client);
            conn_send_error(c, 503, msg, 0);
            return;
        }
    }
    if (s->nlive > s->opt.max_connections && !evict_oldest(s, c)) {
        if (s->nlive > s->opt.max_connections + s->opt.reserved_connections) {
            char msg[96];
            snprintf(msg, sizeof msg, "too many connections (limit %u)", s->opt.max_connections);
            conn_send_error(c, 503, msg, 0);
            return;
        }
        c->overflow = 1;
    }
    conn_arm_idle(c);
    c->reading = 1;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ---- server ------------------------------------------------------------------------- */

void cp_http_options_default(cp_http_options *o)
{
    memset(o, 0, sizeof *o);
    o->host = CP_DEFAULT_HOST;
    o->port = CP_DEFAULT_PORT;
    o->max_url_bytes = 8192;
    o->max_header_bytes = 16384;
    o->max_body_bytes = 65536;
    o->max_uploads = 2;
    o->max_ingest_bytes = 16u << 20;
    o->max_ingests = 16;
    o->max_response_bytes = 256u << 20;
    o->gzip_min_bytes = 8192;
    o->max_connections = 1024;
    o->concurrency = 4;
    o->max_queued = 256;
    o->query_timeout_ns = 30000000000LL;
    o->idle_timeout_ns = 60000000000LL;
    o->request_timeout_ns = 10000000000LL;
    o->write_timeout_ns = 30000000000LL;
    o->max_inflight_bytes = 512u << 20;
    o->cheap_concurrency = 2;
    o->max_conns_per_client = 256;
    o->reserved_connections = 16;
    o->heavy_nice = 10;
}

int cp_http_server_create(uv_loop_t *loop, const cp_http_options *opt, cp_http_server **out,
                          cp_err *err)
{
    *out = NULL;
    if (!g_settings.on_message_complete) {
        g_settings.on_message_begin = on_message_begin;
        g_settings.on_url = on_url;
        g_settings.on_header_field = on_header_field;
        g_settings.on_header_value = on_header_value;
        g_settings.on_headers_complete = on_headers_complete;
        g_settings.on_body = on_body;
        g_settings.on_message_complete = on_message_complete;
    }
    cp_http_server *s = calloc(1, sizeof *s);
    if (!s) return cp_err_set(err, CP_ENOMEM, "http: out of memory");
    s->loop = loop;
    s->opt = *opt;
    errno = 0;
    s->base_nice = getpriority(PRIO_PROCESS, 0); /* the loop thread's: threads start at it */
    if (errno) s->base_nice = 0;
    if (!s->opt.concurrency) s->opt.concurrency = 1;
    if (!s->opt.max_connections) s->opt.max_connections = 1;
    if (!s->opt.cheap_concurrency) s->opt.cheap_concurrency = 1;
    s->lanes[0].concurrency = s->opt.concurrency;
    s->lanes[1].concurrency = s->opt.cheap_concurrency;
    s->lanes[2].concurrency = s->opt.peer_concurrency;
    s->listener_closed = 1;
    struct sockaddr_storage addr;
    int rc;
    if (strchr(opt->host, ':'))
        rc = uv_ip6_addr(opt->host, opt->port, (struct sockaddr_in6 *)&addr);
    else
        rc = uv_ip4_addr(opt->host, opt->port, (struct sockaddr_in *)&addr);
    if (rc) {
        free(s);
        return cp_err_set(err, CP_EINVAL, "http: bad listen address '%s': %s", opt->host,
                          uv_strerror(rc));
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->listener_closed = 0;
    rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0);
    if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc) {
        cp_err_set(err, CP_EIO, "http: cannot listen on %s:%d: %s", opt->host, opt->port,
                   uv_strerror(rc));
        *out = s; /* the caller must shut it down to close the handle */
        s->shutting_down = 1;
        return CP_EIO;
    }
    s->listening = 1;
    /* The cheap lane's threads. */
    pthread_mutex_init(&s->cheap_mu, NULL);
    pthread_cond_init(&s->cheap_cv, NULL);
    uv_async_init(loop, &s->cheap_async, on_cheap_done);
    s->cheap_async.data = s;
    s->cheap_async_open = 1;
    uint32_t nthreads = s->opt.cheap_concurrency + s->opt.peer_concurrency;
    s->cheap_threads = calloc(nthreads, sizeof *s->cheap_threads);
    if (!s->cheap_threads) {
        cp_err_set(err, CP_ENOMEM, "http: out of memory");
        *out = s;
        s->shutting_down = 1;
        return CP_ENOMEM;
    }
    for (uint32_t i = 0; i < nthreads; i++) {
        if (pthread_create(&s->cheap_threads[i], NULL, cheap_main, s)) {
            cp_err_set(err, CP_EIO, "http: cannot start the cheap lane's threads");
            *out = s;
            s->shutting_down = 1;
            return CP_EIO;
        }
        s->ncheap_threads++;
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = s;
    return 0;
}

int cp_http_server_port(const cp_http_server *s)
{
    return s->port;
}

static void on_listener_closed(uv_handle_t *h)
{
    cp_http_server *s = h->data;
    s->listener_closed = 1;
    server_maybe_finished(s);
}

static void server_maybe_finished(cp_http_server *s)
{
    if (!s->shutting_down || !s->listener_closed || s->nconns || s->lanes[0].nrunning ||
        s->lanes[0].nqueued || s->lanes[1].nrunning || s->lanes[1].nqueued ||
        s->lanes[2].nrunning || s->lanes[2].nqueued)
        return;
    if (s->cheap_async_open) {
        s->cheap_async_open = 0;
        uv_close((uv_handle_t *)&s->cheap_async, NULL);
    }
    if (s->shutdown_cb) {
        void (*cb)(void *) = s->shutdown_cb;
        s->shutdown_cb = NULL;
        cb(s->shutdown_arg);
    }
}

void cp_http_server_shutdown(cp_http_server *s, void (*cb)(void *arg), void *arg)
{
    CP_ASSERT_THREAD(&s->loop_thread, "loop thread only");
    s->shutting_down = 1;
    s->shutdown_cb = cb;
    s->shutdown_arg = arg;
    if (!uv_is_closing((uv_handle_t *)&s->listener)) {
        s->listener_closed = 0;
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    }
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (!c->busy) conn_close(c);
    }
    server_maybe_finished(s);
}

void cp_http_server_destroy(cp_http_server *s)
{
    if (!s) return;
    if (s->listening) {
        pthread_mutex_lock(&s->cheap_mu);
        s->cheap_stop = 1;
        pthread_cond_broadcast(&s->cheap_cv);
        pthread_mutex_unlock(&s->cheap_mu);
        for (uint32_t i = 0; i < s->ncheap_threads; i++)
            pthread_join(s->cheap_threads[i], NULL);
        free(s->cheap_threads);
        pthread_mutex_destroy(&s->cheap_mu);
        pthread_cond_destroy(&s->cheap_cv);
    }
    free(s);
}
