/* The inspector side of the V8 source: each host's /json/list, one WebSocket per target
 * (libwebsockets: one context, one thread), Node's worker sessions multiplexed over their
 * parent's socket (NodeWorker domain), and synchronous calls: a call serves every
 * connection until its reply, and every message arrives in a callback nested in it. */
#include <libwebsockets.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http_client.h"
#include "log.h"
#include "times.h"
#include "v8conv.h"
#include "v8source_int.h"

#define MAX_MESSAGE ((size_t)256 << 20) /* one inspector message (a CPU profile) at most */
#define CALL_TIMEOUT_MS 10000
#define BACKOFF_MIN_NS (250 * 1000000LL)
#define BACKOFF_MAX_NS (10 * 1000000000LL)
#define POLL_NS (1000 * 1000000LL) /* /json/list of a host that answers */
#define STOP_NS (3 * 1000000000LL) /* what a stop signal leaves the last windows */

static struct lws_context *ctx;
static lws_sorted_usec_list_t tick;
static int in_callback; /* ws_cb's depth (v8source_int.h "The callback rule") */
static int in_call;     /* a call is waiting for its reply */

int cp_v8_in_callback(void)
{
    return in_callback;
}

int cp_v8_in_call(void)
{
    return in_call;
}

void cp_v8_callback_enter(void)
{
    in_callback++;
}

void cp_v8_callback_leave(void)
{
    CP_ASSERT(in_callback > 0);
    in_callback--;
}

/* ------------------------------------------------------------------------------------
 * The WebSocket side: libwebsockets calls back here for every connection. */

int cp_v8_loopback(const char *addr)
{
    return !strncmp(addr, "127.", 4) || !strcmp(addr, "localhost") || !strcmp(addr, "::1") ||
           !strcmp(addr, "[::1]");
}

static session *find_session(conn *c, const char *sid)
{
    for (session *s = c->sessions; s; s = s->next)
        if (sid ? (s->sid && !strcmp(s->sid, sid)) : !s->sid) return s;
    return NULL;
}

const char *cp_v8_jstr(const cp_json *o, const char *name)
{
    return cp_json_str(cp_json_get(o, name), NULL);
}

/* Takes m: a reply goes to the session waiting for it, a worker's message is unwrapped,
 * worker attach/detach events are noted for the main loop, the rest is dropped. */
static void deliver(conn *c, const char *sid, cp_json *m)
{
    if (cp_log_level >= CP_LOG_DEBUG) {
        cp_buf t = {0};
        int rc = cp_json_write(&t, m) || cp_buf_append(&t, "", 1);
        cp_log_debug("v8: %s session %s: %.300s", c->target, sid ? sid : "-",
                     rc ? "?" : (const char *)t.data);
        cp_buf_close(&t);
    }
    const cp_json *id = cp_json_get(m, "id");
    const char *method = cp_v8_jstr(m, "method");
    const cp_json *params = cp_json_get(m, "params");
    if (cp_json_is_int(id)) {
        session *s = find_session(c, sid);
        if (s && !s->reply && s->want_id == id->i64) {
            s->reply = m;
            return;
        }
    } else if (!sid && method && !strcmp(method, "NodeWorker.receivedMessageFromWorker")) {
        const char *ws;
        cp_json *inner;
        cp_err e = {0};
        if (cp_v8_worker_message(params, &ws, &inner, &e) != 0)
            cp_log_warn("v8: %s target %s: %s", c->h->hostport, c->target, e.msg);
        else
            deliver(c, ws, inner);
    } else if (!sid && method && !strcmp(method, "NodeWorker.attachedToWorker")) {
        const char *ws = cp_v8_jstr(params, "sessionId");
        char iso[128];
        /* node titles a worker "[worker N] NAME": the isolate is NAME */
        cp_v8_worker_isolate(cp_v8_jstr(cp_json_get(params, "workerInfo"), "title"), iso,
                             sizeof(iso));
        attach a = {ws ? strdup(ws) : NULL, strdup(iso)};
        if (!a.sid || !a.title || cp_vec_push(&c->attaches, a)) {
            free(a.sid);
            free(a.title);
        }
    } else if (method && !strcmp(method, "HeapProfiler.addHeapSnapshotChunk")) {
        session *s = find_session(c, sid);
        const char *chunk = cp_v8_jstr(params, "chunk");
        if (s && s->snap && !s->snap_rc && chunk)
            s->snap_rc = cp_heapsnap_feed(s->snap, chunk, strlen(chunk), &s->snap_err);
    } else if (method && !strcmp(method, "Debugger.scriptParsed")) {
        session *s = find_session(c, sid);
        if (s) cp_v8_script_parsed(s, params);
    } else if (!sid && method && !strcmp(method, "NodeRuntime.waitingForDisconnect")) {
        if (c->state == CONN_OPEN) cp_v8_conn_set(c, CONN_FINISHING, "node waits to disconnect");
    } else if (!sid && method && !strcmp(method, "NodeWorker.detachedFromWorker")) {
        const char *ws = cp_v8_jstr(params, "sessionId");
        session *s = ws ? find_session(c, ws) : NULL;
        if (s) cp_v8_session_gone(s, "the worker detached");
    }
    cp_json_free(m);
}

static const char *const conn_names[] = {"idle",    "connecting", "open", "finishing",
                                         "closing", "closed",     "ended"};

/* The diagram's edges (v8source_int.h), a bit per state reached from each state. */
#define CONN_EDGE(to) (1u << (to))
static const unsigned conn_edges[] = {
    [CONN_IDLE] = CONN_EDGE(CONN_CONNECTING),
    [CONN_CONNECTING] = CONN_EDGE(CONN_OPEN) | CONN_EDGE(CONN_CLOSED),
    [CONN_OPEN] = CONN_EDGE(CONN_FINISHING) | CONN_EDGE(CONN_CLOSING) | CONN_EDGE(CONN_CLOSED),
    [CONN_FINISHING] = CONN_EDGE(CONN_CLOSING) | CONN_EDGE(CONN_CLOSED),
    [CONN_CLOSING] = CONN_EDGE(CONN_ENDED),
    [CONN_CLOSED] = CONN_EDGE(CONN_CONNECTING),
    [CONN_ENDED] = 0,
};

void cp_v8_conn_set(conn *c, conn_state to, const char *why)
{
    CP_ASSERT(conn_edges[c->state] & CONN_EDGE(to));
    cp_log_debug("v8: %s target %s: connection %s -> %s (%s)", c->h->hostport, c->target,
                 conn_names[c->state], conn_names[to], why);
    c->state = to;
}

static void conn_closed(conn *c, const char *why)
{
    if (cp_v8_conn_open(c) || c->state == CONN_CONNECTING)
        cp_log_info("v8: %s target %s (%s): %s", c->h->hostport, c->target, c->title, why);
    /* closed after we asked: ended; else retried (a second report of one close: no edge) */
    conn_state to = c->state == CONN_CLOSING || c->state == CONN_ENDED ? CONN_ENDED : CONN_CLOSED;
    if (c->state != to) cp_v8_conn_set(c, to, why);
    c->wsi = NULL;
    c->backoff_ns = c->backoff_ns ? c->backoff_ns * 2 : BACKOFF_MIN_NS;
    if (c->backoff_ns > BACKOFF_MAX_NS) c->backoff_ns = BACKOFF_MAX_NS;
    c->retry_at = cp_mono_ns() + c->backoff_ns;
    for (session *s = c->sessions; s; s = s->next)
        cp_v8_session_gone(s, why);
    for (uint32_t i = 0; i < c->tx.n; i++)
        free(c->tx.v[i].buf);
    c->tx.n = 0;
    cp_buf_close(&c->rx);
}

static int ws_event(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len)
{
    conn *c = user;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        if (c) {
            cp_v8_conn_set(c, CONN_OPEN, "connected");
            c->backoff_ns = 0;
        }
        break;
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        if (c) {
            char why[200];
            snprintf(why, sizeof(why), "connection failed: %.*s",
                     in ? (int)(len < 150 ? len : 150) : 7, in ? (const char *)in : "unknown");
            conn_closed(c, why);
        }
        break;
    case LWS_CALLBACK_CLIENT_CLOSED:
        if (c) conn_closed(c, "connection closed");
        break;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        if (!c) break;
        if (c->rx.len + len > MAX_MESSAGE)
            c->rx_over = 1;
        else if (cp_buf_append(&c->rx, in, len) != 0)
            c->rx_over = 1;
        if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
            if (c->rx_over) {
                cp_log_warn("v8: %s target %s: message over %zu MiB (or no memory): dropped",
                            c->h->hostport, c->target, MAX_MESSAGE >> 20);
            } else {
                cp_json *m;
                cp_err e = {0};
                if (cp_v8_message_parse((const char *)c->rx.data, c->rx.len, &m, &e) != 0)
                    cp_log_warn("v8: %s target %s: %s", c->h->hostport, c->target, e.msg);
                else
                    deliver(c, NULL, m);
            }
            c->rx.len = 0;
            c->rx_over = 0;
        }
        break;
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        if (c && c->state == CONN_CLOSING) return -1;
        if (!c || !c->tx.n) break;
        {
            out_msg m = c->tx.v[0];
            memmove(c->tx.v, c->tx.v + 1, (c->tx.n - 1) * sizeof(out_msg));
            c->tx.n--;
            int w = lws_write(wsi, m.buf + LWS_PRE, m.len, LWS_WRITE_TEXT);
            free(m.buf);
            if (w < (int)m.len) return -1;
            if (c->tx.n) lws_callback_on_writable(wsi);
        }
        break;
    default:
        break;
    }
    return 0;
}

/* Every libwebsockets callback: the callback rule holds inside (v8source_int.h). */
static int ws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                 size_t len)
{
    cp_v8_callback_enter();
    int rc = ws_event(wsi, reason, user, in, len);
    cp_v8_callback_leave();
    return rc;
}

static const struct lws_protocols protocols[] = {
    {"cdp", ws_cb, 0, 1 << 16, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* Makes lws_service return at least every 20 ms. */
static void tick_cb(lws_sorted_usec_list_t *sul)
{
    lws_sul_schedule(ctx, 0, sul, tick_cb, 20 * LWS_US_PER_MS);
}

static int queue_text(conn *c, const char *text)
{
    size_t n = strlen(text);
    out_msg m = {malloc(LWS_PRE + n), n};
    if (!m.buf) return CP_ENOMEM;
    memcpy(m.buf + LWS_PRE, text, n);
    if (cp_vec_push(&c->tx, m)) {
        free(m.buf);
        return CP_ENOMEM;
    }
    lws_callback_on_writable(c->wsi);
    return 0;
}

/* The text of call id: {"id":ID,"method":METHOD,"params":PARAMS}, wrapped for a Node
 * worker's session in NodeWorker.sendMessageToWorker (as its message, a string) on c's
 * own id. 0 or CP_ENOMEM. */
static int call_text(session *s, int64_t id, const char *method, const char *params, cp_buf *out)
{
    cp_buf in = {0};
    int rc = cp_buf_printf(&in, "{\"id\":%lld,\"method\":\"", (long long)id) ||
             cp_json_escape(&in, method, strlen(method)) ||
             cp_buf_printf(&in, "\",\"params\":%s}", params ? params : "{}");
    if (!rc && s->sid)
        rc = cp_buf_printf(out,
                           "{\"id\":%lld,\"method\":\"NodeWorker.sendMessageToWorker\","
                           "\"params\":{\"message\":\"",
                           (long long)++s->c->outer_id) ||
             cp_json_escape(out, (const char *)in.data, in.len) ||
             cp_buf_append(out, "\",\"sessionId\":\"", 15) ||
             cp_json_escape(out, s->sid, strlen(s->sid)) || cp_buf_append(out, "\"}}", 3);
    else if (!rc)
        rc = cp_buf_append(out, in.data, in.len);
    cp_buf_close(&in);
    return rc || cp_buf_append(out, "", 1) ? CP_ENOMEM : 0; /* NUL-terminated */
}

/* Sends method(params) to s (params: a JSON object's text, NULL = {}) and serves every
 * connection until the reply comes. Returns 0 with *result (may be NULL: dropped; the
 * caller's, cp_json_free) the reply's result, or CP_EIO (closed, time-out, an error reply)
 * with err saying which. */
int cp_v8_call_within(session *s, const char *method, const char *params, cp_json **result,
                      int64_t timeout_ms, cp_err *err)
{
    CP_V8_ASSERT_NOT_IN_CALLBACK();
    CP_ASSERT(!in_call); /* one call at a time: s->want_id is the only one awaited */
    conn *c = s->c;
    if (result) *result = NULL;
    if (!cp_v8_conn_open(c) || !cp_v8_session_alive(s))
        return cp_err_set(err, CP_EIO, "%s: isolate %s is not connected", method, s->isolate);
    int64_t id = ++s->next_id;
    cp_buf text = {0};
    if (call_text(s, id, method, params, &text) || queue_text(c, (const char *)text.data) != 0) {
        cp_buf_close(&text);
        return CP_ENOMEM;
    }
    cp_buf_close(&text);
    s->want_id = id;
    cp_json_free(s->reply);
    s->reply = NULL;
    int64_t deadline = cp_mono_ns() + timeout_ms * 1000000LL;
    in_call = 1;
    while (!s->reply && cp_v8_conn_open(c) && cp_v8_session_alive(s) && cp_mono_ns() < deadline) {
        /* once stopping, every call (the last windows among them) ends within STOP_NS */
        if (*cp_v8src.o->stop && !cp_v8src.stop_at) cp_v8src.stop_at = cp_mono_ns();
        if (cp_v8src.stop_at && cp_mono_ns() > cp_v8src.stop_at + STOP_NS) break;
        lws_service(ctx, 0);
    }
    in_call = 0;
    s->want_id = 0;
    if (!s->reply) {
        char why[64];
        snprintf(why, sizeof(why), "no reply in %lld s", (long long)timeout_ms / 1000);
        return cp_err_set(err, CP_EIO, "%s on isolate %s: %s", method, s->isolate,
                          !cp_v8_conn_open(c) || !cp_v8_session_alive(s) ? "disconnected"
                          : cp_v8src.stop_at ? "no reply before the stop"
                                             : why);
    }
    const cp_json *e = cp_json_get(s->reply, "error");
    int rc = 0;
    if (e) {
        const char *em = cp_v8_jstr(e, "message");
        rc = cp_err_set(err, CP_EIO, "%s on isolate %s: %s", method, s->isolate,
                        em ? em : "error reply");
    } else if (result) {
        cp_json *r = cp_json_take(s->reply, "result");
        *result = r ? r : cp_json_new(CP_JSON_OBJECT);
        if (!*result) rc = CP_ENOMEM;
    }
    cp_json_free(s->reply);
    s->reply = NULL;
    return rc;
}

int cp_v8_call(session *s, const char *method, const char *params, cp_json **result, cp_err *err)
{
    return cp_v8_call_within(s, method, params, result, CALL_TIMEOUT_MS, err);
}

/* ------------------------------------------------------------------------------------
 * Discovery: /json/list of every host, a connection per target. */

void cp_v8_conn_free(conn *c)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    while (c->sessions) {
        session *s = c->sessions;
        c->sessions = s->next;
        cp_v8_session_free(s);
    }
    for (uint32_t i = 0; i < c->tx.n; i++)
        free(c->tx.v[i].buf);
    free(c->tx.v);
    for (uint32_t i = 0; i < c->attaches.n; i++) {
        free(c->attaches.v[i].sid);
        free(c->attaches.v[i].title);
    }
    free(c->attaches.v);
    cp_buf_close(&c->rx);
    free(c);
}

void cp_v8_discover(host *h)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    cp_http_result res;
    cp_err e = {0};
    char base[200];
    snprintf(base, sizeof(base), "http://%s", h->hostport);
    int64_t now = cp_mono_ns();
    if (cp_http_get(base, "/json/list", NULL, 1000, 16u << 20, &res, &e) != 0 ||
        res.status != 200) {
        if (h->answering || !h->backoff_ns)
            cp_log_info("v8: inspector %s not answering: %s", h->hostport,
                        e.msg[0] ? e.msg : "status not 200");
        if (!e.msg[0]) cp_buf_close(&res.body);
        h->answering = 0;
        h->backoff_ns = h->backoff_ns ? h->backoff_ns * 2 : BACKOFF_MIN_NS;
        if (h->backoff_ns > BACKOFF_MAX_NS) h->backoff_ns = BACKOFF_MAX_NS;
        h->next_poll = now + h->backoff_ns;
        for (conn *c = h->conns; c; c = c->next)
            c->listed = 0;
        return;
    }
    h->answering = h->seen = 1;
    h->backoff_ns = 0;
    h->next_poll = now + POLL_NS;
    cp_v8_target *tv = NULL;
    size_t nt = 0;
    int rc = cp_v8_targets_parse((const char *)res.body.data, res.body.len, &tv, &nt, &e);
    cp_buf_close(&res.body);
    if (rc) {
        cp_log_warn("v8: inspector %s: %s", h->hostport, e.msg);
        return;
    }
    for (conn *c = h->conns; c; c = c->next)
        c->listed = 0;
    for (size_t i = 0; i < nt; i++) {
        const cp_v8_target *t = &tv[i];
        conn *c = h->conns;
        while (c && strcmp(c->target, t->id))
            c = c->next;
        if (c) {
            c->listed = 1;
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (!c) continue;
        c->h = h;
        c->listed = 1;
        snprintf(c->target, sizeof(c->target), "%s", t->id);
        snprintf(c->title, sizeof(c->title), "%s", t->title);
        snprintf(c->path, sizeof(c->path), "%s", t->path);
        c->outer_id = INT64_C(1) << 30; /* node wants 32-bit ids; ours count from 1 */
        c->next = h->conns;
        h->conns = c;
        cp_log_info("v8: %s: target %s (%s)", h->hostport, t->id, c->title);
    }
    free(tv);
}

void cp_v8_connect(conn *c)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    struct lws_client_connect_info i;
    memset(&i, 0, sizeof(i));
    i.context = ctx;
    i.address = c->h->addr;
    i.port = c->h->port;
    i.path = c->path;
    i.host = c->h->hostport;
    i.local_protocol_name = "cdp";
    i.userdata = c;
    i.pwsi = &c->wsi;
    cp_v8_conn_set(c, CONN_CONNECTING, "connecting");
    if (!lws_client_connect_via_info(&i)) {
        c->wsi = NULL;
        conn_closed(c, "connection refused by libwebsockets");
    }
}

int cp_v8_inspector_open(cp_err *err)
{
    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info ci;
    memset(&ci, 0, sizeof(ci));
    ci.port = CONTEXT_PORT_NO_LISTEN;
    ci.protocols = protocols;
    ci.gid = -1;
    ci.uid = -1;
    ctx = lws_create_context(&ci);
    if (!ctx) return cp_err_set(err, CP_ENOMEM, "libwebsockets: cannot create a context");
    lws_sul_schedule(ctx, 0, &tick, tick_cb, 20 * LWS_US_PER_MS);

    return 0;
}

void cp_v8_inspector_service(void)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    lws_service(ctx, 0);
}

void cp_v8_inspector_close(void)
{
    lws_sul_cancel(&tick);
    lws_context_destroy(ctx);
    ctx = NULL;
}

void cp_v8_conn_close(conn *c)
{
    if (c->wsi) lws_callback_on_writable(c->wsi);
}
