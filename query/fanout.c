/* Query fan-out: each query asks every peer for its part over HTTP (in parallel, one thread
 * per peer, each bounded by the request's deadline), runs the store's own call meanwhile,
 * and merges: profiles with the pprof merger, series and label lists as sorted unions,
 * timelines step by step. Which peers were missing is per request, in the request's
 * cp_fanout_req (the caller's; nothing here is thread-local). */
#include "fanout.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http_client.h"
#include "envelope.h"
#include "json.h"
#include "log.h"
#include "offsets.h"
#include "merge.h"
#include "params.h"
#include "pprof.h"

#define MAX_PEERS CP_FANOUT_MAX_PEERS

/* What one peer last said of its partitions (GET /api/v1/ingest/offsets?local=1), kept
 * fresh by a thread of its own while senders ask, so that the loop thread answers a
 * sender at once with every node's partitions. */
typedef struct offsets_slot {
    pthread_t th;
    int started;
    struct peer_offsets *parts; /* its "partitions" array, read; NULL while unknown or down */
} offsets_slot;

struct cp_fanout {
    char *peers[MAX_PEERS];
    uint32_t n;
    char *token; /* NULL: none */
    int64_t timeout_ns;
    size_t max_body;
    pthread_mutex_t mu; /* guards slots[].parts, asked_ns, stop */
    pthread_cond_t wake;
    offsets_slot slots[MAX_PEERS];
    int64_t asked_ns; /* CLOCK_MONOTONIC of the last question; 0 = never */
    int stop;
    cp_counter failures[MAX_PEERS]; /* parts a peer did not give (query fan-out) */
    /* This node's own URL may be in the list under another spelling (a host name, 0.0.0.0
     * vs an address): asking itself would count its own data twice. Each request carries
     * node=ID; a node that sees its own ID answers 421, and that peer is skipped after. */
    char id[24];
    _Atomic int self[MAX_PEERS];
    /* This node's partitions: two nodes given one partition both store it, and every
     * query then counts it twice. The offsets poller sees the peers' lists and says so. */
    uint8_t own[CP_MAX_PARTITIONS];
    cp_gauge overlap[MAX_PEERS];
    cp_metrics *metrics; /* where the two families above are registered, or NULL */
};

static int64_t mono_now(void);

/* ---- peers and options ---------------------------------------------------------------- */

uint32_t cp_fanout_npeers(const cp_fanout *f)
{
    return f ? f->n : 0;
}

const char *cp_fanout_peer(const cp_fanout *f, uint32_t i)
{
    return f && i < f->n ? f->peers[i] : NULL;
}

static void offsets_stop(cp_fanout *f);

void cp_fanout_destroy(cp_fanout *f)
{
    if (!f) return;
    cp_metrics_remove(f->metrics, f);
    offsets_stop(f);
    for (uint32_t i = 0; i < f->n; i++)
        free(f->peers[i]);
    free(f->token);
    free(f);
}

/* 1 if u is http://HOST:PORT with a port in 1..65535 and nothing after it. */
static int url_ok(const char *u)
{
    if (strncmp(u, "http://", 7) != 0) return 0;
    const char *h = u + 7, *colon = strrchr(h, ':');
    if (!colon || colon == h || strchr(colon, '/')) return 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    return *end == 0 && colon[1] && port > 0 && port < 65536;
}

int cp_fanout_create(const cp_fanout_options *o, cp_fanout **out, cp_err *err)
{
    *out = NULL;
    if (!o->peers || !*o->peers) return 0;
    cp_fanout *f = calloc(1, sizeof *f);
    char *list = strdup(o->peers);
    if (!f || !list) {
        free(f);
        free(list);
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->wake, NULL);
    uint64_t r = 0;
    FILE *ur = fopen("/dev/urandom", "rb");
    if (!ur || fread(&r, sizeof r, 1, ur) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid() << 32 ^
            (uint64_t)ts.tv_sec;
    }
    if (ur) fclose(ur);
    snprintf(f->id, sizeof f->id, "%016" PRIx64, r);
    int rc = 0;
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ' || *t == '\t')
            t++;
        size_t l = strlen(t);
        while (l && (t[l - 1] == ' ' || t[l - 1] == '\t' || t[l - 1] == '/'))
            t[--l] = 0;
        if (!l) continue;
        if (!url_ok(t)) {
            rc = cp_err_set(err, CP_EINVAL,
                            "cluster.peers: '%.128s' is not a peer's URL (expected "
                            "http://HOST:PORT)",
                            t);
            break;
        }
        if (o->self && strcmp(t, o->self) == 0) continue; /* the same list on every node */
        for (uint32_t i = 0; i < f->n && !rc; i++)
            if (strcmp(f->peers[i], t) == 0) /* asked twice, its part would count twice */
                rc = cp_err_set(err, CP_EINVAL, "cluster.peers: '%.128s' is listed twice", t);
        if (rc) break;
        if (f->n == MAX_PEERS) {
            rc = cp_err_set(err, CP_EINVAL, "cluster.peers: more than %d peers", MAX_PEERS);
            break;
        }
        if (!(f->peers[f->n] = strdup(t)))
            rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        else
            f->n++;
    }
    free(list);
    if (!rc && o->token && *o->token && !(f->token = strdup(o->token)))
        rc = cp_err_set(err, CP_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < o->nown; i++)
        if (o->own[i] >= 0 && o->own[i] < CP_MAX_PARTITIONS) f->own[o->own[i]] = 1;
    f->timeout_ns = o->timeout_ns > 0 ? o->timeout_ns : CP_FANOUT_DEFAULT_PEER_TIMEOUT_NS;
    f->max_body = o->max_body ? o->max_body : (size_t)256 << 20;
    if (rc || !f->n) {
        cp_fanout_destroy(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* ---- per request ---------------------------------------------------------------------- */

int cp_fanout_is_peer(const cp_fanout *f, const cp_http_request *req)
{
    if (!f || !f->token) return 0;
    size_t n = 0;
    const char *h = cp_http_bearer(req, &n);
    return h && cp_http_token_eq(h, n, f->token);
}

int cp_fanout_is_self(const cp_fanout *f, const cp_http_request *req)
{
    if (!f) return 0;
    size_t l = strlen(f->id);
    for (const char *q = req->query; q && (q = strstr(q, "node=")); q += 5)
        if ((q == req->query || q[-1] == '&') && strncmp(q + 5, f->id, l) == 0 &&
            (q[5 + l] == 0 || q[5 + l] == '&'))
            return 1;
    return 0;
}

int cp_fanout_is_part_request(const cp_http_request *req)
{
    for (const char *q = req->query; q && (q = strstr(q, "local=1")); q += 7)
        if ((q == req->query || q[-1] == '&') && (q[7] == 0 || q[7] == '&')) return 1;
    return 0;
}

int cp_fanout_peer_lane(const cp_fanout *f, const cp_http_request *req)
{
    return cp_fanout_is_part_request(req) && cp_fanout_is_peer(f, req);
}

const char *cp_fanout_node(const cp_fanout *f)
{
    return f ? f->id : "";
}

/* Appends `"partial":...,"missing_peers":[...],` after the '{' of a JSON object answer. */
static int splice_partial(const cp_fanout_req *fr, cp_http_response *r)
{
    const cp_fanout *f = fr->f;
    int status = r->status ? r->status : 200; /* unset means 200, as does "" for JSON */
    if (status < 200 || status > 299 ||
        (r->content_type[0] && strcmp(r->content_type, "application/json") != 0) ||
        r->body.len == 0 || r->body.data[0] != '{')
        return 0;
    cp_buf b = {0};
    int rc = cp_buf_printf(&b, "{\"partial\":true,\"missing_peers\":[");
    for (uint32_t i = 0, k = 0; !rc && i < f->n; i++)
        if (fr->missing[i]) rc = cp_buf_printf(&b, "%s\"%s\"", k++ ? "," : "", f->peers[i]);
    if (!rc) rc = cp_buf_printf(&b, "]%s", r->body.len > 1 && r->body.data[1] != '}' ? "," : "");
    if (!rc) rc = cp_buf_append(&b, r->body.data + 1, r->body.len - 1);
    if (rc) {
        cp_buf_close(&b);
        return rc;
    }
    cp_buf_close(&r->body);
    r->body = b;
    return 0;
}

void cp_fanout_end(const cp_fanout_req *fr, cp_http_response *r)
{
    const cp_fanout *f = fr->f;
    if (!f || !fr->fanned) return;
    int any = 0;
    for (uint32_t i = 0; i < f->n; i++)
        any |= fr->missing[i];
    if (!any) return;
    size_t l = strlen(r->extra_headers), room = sizeof r->extra_headers;
    char line[sizeof r->extra_headers];
    size_t n = (size_t)snprintf(line, sizeof line, "%s: ", CP_FANOUT_PARTIAL_HEADER);
    for (uint32_t i = 0, k = 0; i < f->n && n < sizeof line; i++)
        if (fr->missing[i])
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", k++ ? "," : "", f->peers[i]);
    /* the header must stay one whole line: cut the list at a peer if it does not fit */
    if (n + 2 >= sizeof line || l + n + 2 >= room) {
        size_t max = room - l > 8 ? room - l - 8 : 0;
        if (max > sizeof line - 8) max = sizeof line - 8;
        n = max;
        while (n && line[n] != ',' && line[n] != ' ')
            n--;
        if (n) n += (size_t)snprintf(line + n, sizeof line - n, ",...");
    }
    if (n && l + n + 2 < room) snprintf(r->extra_headers + l, room - l, "%.*s\r\n", (int)n, line);
    if (splice_partial(fr, r)) {
        cp_buf_close(&r->body);
        cp_http_error(r, 503, "out of memory while answering");
    }
}

static int fo_profile(cp_reader *rd, const cp_query *q, cp_profile **out, cp_err *err);
static int fo_timeline(cp_reader *rd, const cp_query *q, cp_timeline *out, cp_err *err);
static int fo_series(cp_reader *rd, const cp_query *q, cp_series_list *out, cp_err *err);
static int fo_labels(cp_reader *rd, const cp_query *q, cp_string_list *out, cp_err *err);
static int fo_values(cp_reader *rd, const cp_query *q, cp_string_list *out, cp_err *err);

cp_reader *cp_fanout_req_init(cp_fanout_req *fr, cp_fanout *f, cp_reader *local)
{
    memset(fr, 0, sizeof *fr);
    fr->reader = (cp_reader){fo_profile, fo_timeline, fo_series, fo_labels, fo_values};
    fr->f = f;
    fr->local = local;
    return &fr->reader;
}

/* ---- asking the peers ----------------------------------------------------------------- */

typedef struct call {
    const cp_fanout *f;
    cp_fanout_req *fr; /* the request: its missing peers */
    uint32_t peer;
    const char *pq;
    const void *body; /* an upload to pass on (POST); NULL: GET */
    size_t body_len;
    int64_t timeout_ms;
    pthread_t th;
    int started, ok, self;
    cp_http_result res;
} call;

static void *call_run(void *arg)
{
    call *c = arg;
    cp_err err = {0};
    int rc = c->body ? cp_http_post(c->f->peers[c->peer], c->pq, c->f->token, c->body, c->body_len,
                                    c->timeout_ms, c->f->max_body, &c->res, &err)
                     : cp_http_get(c->f->peers[c->peer], c->pq, c->f->token, c->timeout_ms,
                                   c->f->max_body, &c->res, &err);
    if (rc) {
        cp_log_warn("peer %s: %s", c->f->peers[c->peer], err.msg);
    } else if (c->res.status == 421) {
        c->self = 1;
    } else if (c->res.status != 200) {
        cp_log_warn("peer %s answered %d to %.200s: %.*s", c->f->peers[c->peer], c->res.status,
                    c->pq, (int)(c->res.body.len < 200 ? c->res.body.len : 200),
                    (const char *)c->res.body.data);
    } else {
        c->ok = 1;
    }
    return NULL;
}

/* The calls of one fan-out; NULL calls when there is nothing to ask. The caller sets fr
 * (and, for an upload passed on, body and body_len) before fan_begin. */
typedef struct fan {
    cp_fanout_req *fr;
    const void *body; /* POST this (it must outlive fan_wait); NULL: GET */
    size_t body_len;
    call *calls;
    uint32_t n;
} fan;

/* 1 if q asks peers. */
static int fans(const cp_fanout_req *fr, const cp_query *q)
{
    return fr->f && fr->f->n && !q->local;
}

/* Starts GET pq (to which `local=1`, and `tenant` with a token, are appended) on every
 * peer, or POST of out->body, each allowed until deadline_ns (CLOCK_MONOTONIC; 0 = the
 * fan-out's timeout). */
static int fan_start(fan *out, cp_buf *pq, const char *tenant, int64_t deadline_ns, cp_err *err)
{
    const cp_fanout *f = out->fr->f;
    const void *body = out->body;
    size_t body_len = out->body_len;
    out->calls = NULL;
    out->n = 0;
    int64_t now = mono_now();
    int64_t until = now + f->timeout_ns;
    /* leave the merge and the rendering a tenth of what is left */
    if (deadline_ns && deadline_ns - (deadline_ns - now) / 10 < until)
        until = deadline_ns - (deadline_ns - now) / 10;
    int64_t ms = (until - now) / 1000000;
    if (ms < 1) ms = 1;
    /* the peer stops when this node stops waiting (its query's deadline_ms) */
    int rc = cp_buf_printf(pq, "&local=1&node=%s&deadline_ms=%lld", f->id, (long long)ms);
    if (!rc && f->token) {
        rc = cp_buf_printf(pq, "&tenant=");
        if (!rc) rc = cp_url_encode(pq, tenant);
    }
    if (!rc) rc = cp_buf_append(pq, "", 1);
    if (rc || !(out->calls = calloc(f->n, sizeof *out->calls)))
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    out->fr->fanned = 1;
    out->n = f->n;
    for (uint32_t i = 0; i < f->n; i++) {
        call *c = &out->calls[i];
        *c = (call){.f = f,
                    .fr = out->fr,
                    .peer = i,
                    .pq = (const char *)pq->data,
                    .body = body,
                    .body_len = body_len,
                    .timeout_ms = ms};
        if (atomic_load(&((cp_fanout *)f)->self[i]))
            c->self = 1; /* not asked */
        else if (pthread_create(&c->th, NULL, call_run, c) == 0)
            c->started = 1;
        else
            call_run(c); /* no thread: ask this one in turn */
    }
    return 0;
}

/* Waits for every call; peers that failed are marked missing. */
static void fan_wait(fan *fa)
{
    for (uint32_t i = 0; i < fa->n; i++) {
        call *c = &fa->calls[i];
        if (c->started) pthread_join(c->th, NULL);
        if (c->self) {
            if (!atomic_exchange(&((cp_fanout *)c->f)->self[c->peer], 1))
                cp_log_info("cluster: peer %s is this node itself: not asked again",
                            c->f->peers[c->peer]);
        } else if (!c->ok) {
            c->fr->missing[c->peer] = 1;
            cp_counter_add(&((cp_fanout *)c->f)->failures[c->peer], 1);
        }
    }
}

static void fan_close(fan *fa)
{
    for (uint32_t i = 0; i < fa->n; i++)
        cp_buf_close(&fa->calls[i].res.body);
    free(fa->calls);
    fa->calls = NULL;
    fa->n = 0;
}

/* Marks the peer of c missing after its answer proved unusable. */
static void fan_reject(call *c, const char *why)
{
    cp_log_warn("peer %s: unusable answer to %.200s: %s", c->f->peers[c->peer], c->pq, why);
    c->ok = 0;
    c->fr->missing[c->peer] = 1;
    cp_counter_add(&((cp_fanout *)c->f)->failures[c->peer], 1);
}

/* Appends t as RFC 3339 with nanoseconds: exact, whatever "now" is on the peer. */
static int put_time(cp_buf *b, const char *name, int64_t t)
{
    int64_t s = t / 1000000000LL, ns = t % 1000000000LL;
    if (ns < 0) {
        ns += 1000000000LL;
        s--;
    }
    time_t tt = (time_t)s;
    struct tm tm;
    if (!gmtime_r(&tt, &tm)) return CP_EINVAL;
    return cp_buf_printf(b, "&%s=%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", name, tm.tm_year + 1900,
                         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                         (long long)ns);
}

static int put_select(cp_buf *b, const char *select)
{
    int rc = cp_buf_printf(b, "&select=");
    return rc ? rc : cp_url_encode(b, select ? select : "");
}

/* Appends the selector and the window of q. */
static int put_window(cp_buf *b, const cp_query *q)
{
    int rc = put_select(b, q->select);
    if (!rc) rc = put_time(b, "from", q->from_ns);
    return rc ? rc : put_time(b, "to", q->to_ns);
}

/* fan_start for q's tenant and deadline once the request pq is built (built: the result of
 * building it, nonzero if that ran out of memory); on failure pq is closed and nothing
 * needs fan_close. */
static int fan_begin(fan *fa, cp_buf *pq, int built, const cp_query *q, cp_err *err)
{
    int rc = built ? cp_err_set(err, CP_ENOMEM, "out of memory")
                   : fan_start(fa, pq, q->tenant, q->lim.deadline_ns, err);
    if (rc) cp_buf_close(pq);
    return rc;
}

/* The JSON answer of a peer that answered, parsed (the caller frees it); NULL if the peer
 * did not answer, or answered something that is not JSON (the peer is then missing). */
static cp_json *call_json(call *c)
{
    cp_json *j = NULL;
    cp_err e = {0};
    if (!c->ok) return NULL;
    if (cp_json_parse((const char *)c->res.body.data, c->res.body.len, &j, &e)) {
        fan_reject(c, e.msg);
        return NULL;
    }
    return j;
}

static int64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- profiles ------------------------------------------------------------------------- */

/* inuse across nodes: a series handed over between nodes (`P@N`) has a last snapshot on
 * each node that held it within the range; only the latest counts. The parts come per
 * series (cp_store_query with by_series: samples marked with the series and the snapshot's
 * start); latest_only keeps each series' samples of the one part whose snapshot is the
 * latest (the lowest part index on a tie: the same window stored twice counts once) and
 * strips the marks. */
typedef struct snapkey {
    const char *key; /* the series' labels, in its part's strings */
    int64_t snap;
    uint32_t part;
} snapkey;

static int snapkey_cmp(const void *a, const void *b)
{
    const snapkey *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    if (x->snap != y->snap) return x->snap > y->snap ? -1 : 1; /* latest first */
    return x->part < y->part ? -1 : x->part > y->part;
}

static int snapkey_cmp_key(const void *a, const void *b)
{
    return strcmp(((const snapkey *)a)->key, ((const snapkey *)b)->key);
}

/* The marks of sample i of p: 1 and key/snap if it has the series mark, else 0. */
static int sample_mark(const cp_profile *p, uint32_t i, uint32_t kid, uint32_t tid,
                       const char **key, int64_t *snap)
{
    const cp_sample *sm = &p->samples.v[i];
    int has = 0;
    *snap = 0;
    for (uint32_t j = 0; j < sm->nlabels; j++) {
        const cp_label *l = &p->labels.v[sm->label_off + j];
        if (kid && l->key == kid) {
            *key = cp_profile_str(p, l->str);
            has = 1;
        } else if (tid && l->key == tid) {
            *snap = l->num;
        }
    }
    return has;
}

/* The ids of the two marks' strings in p (0 if absent). */
static void mark_ids(cp_profile *p, uint32_t *kid, uint32_t *tid)
{
    *kid = *tid = 0;
    for (uint32_t i = 1; i < p->strs.off.n; i++) {
        const char *str = cp_profile_str(p, i);
        if (!strcmp(str, CP_STORE_SERIES_LABEL)) *kid = i;
        if (!strcmp(str, CP_STORE_SNAPSHOT_LABEL)) *tid = i;
    }
}

static int latest_only(cp_profile **parts, uint32_t n, cp_err *err)
{
    CP_VEC(snapkey) ks = {0};
    uint32_t *kid = calloc(n + 1, sizeof *kid), *tid = calloc(n + 1, sizeof *tid);
    int rc = kid && tid ? 0 : CP_ENOMEM;
    for (uint32_t pi = 0; pi < n && !rc; pi++) {
        cp_profile *p = parts[pi];
        if (!p) continue;
        mark_ids(p, &kid[pi], &tid[pi]);
        const char *prev = NULL;
        for (uint32_t i = 0; i < p->samples.n && !rc && kid[pi]; i++) {
            snapkey k = {NULL, 0, pi};
            if (!sample_mark(p, i, kid[pi], tid[pi], &k.key, &k.snap)) continue;
            if (prev == k.key) continue; /* a series' samples come together */
            prev = k.key;
            if (cp_vec_push(&ks, k)) rc = CP_ENOMEM;
        }
    }
    if (!rc && ks.n) qsort(ks.v, ks.n, sizeof *ks.v, snapkey_cmp);
    /* the winners: the first entry of each series */
    uint32_t w = 0;
    for (uint32_t i = 0; !rc && i < ks.n; i++)
        if (i == 0 || strcmp(ks.v[i].key, ks.v[w - 1].key)) ks.v[w++] = ks.v[i];
    ks.n = w;
    for (uint32_t pi = 0; pi < n && !rc; pi++) {
        cp_profile *p = parts[pi];
        if (!p || !kid[pi]) continue;
        uint32_t nt = p->sample_types.n, out = 0;
        for (uint32_t i = 0; i < p->samples.n; i++) {
            snapkey k = {NULL, 0, pi};
            cp_sample sm = p->samples.v[i];
            if (sample_mark(p, i, kid[pi], tid[pi], &k.key, &k.snap)) {
                snapkey *win = bsearch(&k, ks.v, ks.n, sizeof *ks.v, snapkey_cmp_key);
                if (!win || win->part != pi) continue; /* another node's snapshot is later */
                int nz = 0;
                for (uint32_t t = 0; t < nt; t++)
                    nz |= p->values.v[(size_t)i * nt + t] != 0;
                if (!sm.nlocs && !nz) continue; /* it only marked an empty snapshot */
            }
            uint32_t nl = 0; /* strip the marks, in place */
            for (uint32_t j = 0; j < sm.nlabels; j++) {
                cp_label l = p->labels.v[sm.label_off + j];
                if (l.key != kid[pi] && (!tid[pi] || l.key != tid[pi]))
                    p->labels.v[sm.label_off + nl++] = l;
            }
            sm.nlabels = nl;
            if (nt && out != i)
                memmove(p->values.v + (size_t)out * nt, p->values.v + (size_t)i * nt,
                        nt * sizeof *p->values.v);
            p->samples.v[out++] = sm;
        }
        p->samples.n = out;
        p->values.n = (size_t)out * nt;
    }
    free(ks.v);
    free(kid);
    free(tid);
    return rc ? cp_err_set(err, rc, "out of memory") : 0;
}

/* Adds *part (NULL: nothing) to m and frees it. A part the merger refuses (checked before
 * anything is added) makes peer c missing; the node's own part (c NULL) fails the query. */
static int merge_part(cp_merger *m, cp_profile **part, call *c, cp_err *err)
{
    if (!*part) return 0;
    cp_err e = {0};
    int rc = cp_merger_add(m, *part, &e);
    cp_profile_destroy(*part);
    *part = NULL;
    if (rc == CP_ENOMEM || (rc && !c)) return cp_err_set(err, rc, "%s", e.msg);
    if (rc) fan_reject(c, e.msg);
    return 0;
}

/* The profile reader: this node's part and every peer's, merged. */
static int fo_profile(cp_reader *rd, const cp_query *q, cp_profile **out, cp_err *err)
{
    cp_fanout_req *fr = (cp_fanout_req *)rd;
    if (!fans(fr, q)) return fr->local->profile(fr->local, q, out, err);
    int by_series = cp_kind_is_gauge(q->kind);
    cp_query own = *q; /* this node's part: per series too, for inuse */
    own.by_series = by_series;
    cp_buf pq = {0};
    fan fa = {.fr = fr};
    int rc = cp_buf_printf(&pq, "/api/v1/profile?format=pprof&type=%s%s", cp_kind_name(q->kind),
                           by_series ? "&by_series=1" : "");
    if (!rc) rc = put_window(&pq, q);
    if ((rc = fan_begin(&fa, &pq, rc, q, err))) return rc;
    /* parts[0] is this node's, parts[1 + i] peer i's (NULL: none) */
    cp_profile **parts = calloc(fa.n + 1, sizeof *parts);
    if (!parts) rc = cp_err_set(err, CP_ENOMEM, "out of memory");
    if (!rc) rc = fr->local->profile(fr->local, &own, &parts[0], err);
    fan_wait(&fa);
    /* the parts of a peer's answer are whole: it may be as large as a merged profile gets */
    cp_pprof_limits pl;
    cp_pprof_limits_default(&pl);
    pl.max_bytes = (size_t)1 << 30;
    pl.max_samples = pl.max_locations = pl.max_strings = UINT32_MAX;
    pl.max_string_bytes = (size_t)1 << 30;
    cp_merger *m = rc ? NULL : cp_merger_create();
    if (!rc && !m) rc = cp_err_set(err, CP_ENOMEM, "out of memory");
    /* cpu and alloc: each part merged as soon as it is decoded, and freed; inuse: every
     * part held until each series' latest snapshot is known */
    if (!rc && !by_series) rc = merge_part(m, &parts[0], NULL, err);
    for (uint32_t i = 0; !rc && i < fa.n; i++) {
        call *c = &fa.calls[i];
        if (!c->ok) continue;
        cp_err e = {0};
        int prc = cp_pprof_decode(c->res.body.data, c->res.body.len, &pl, &parts[1 + i], &e);
        cp_buf_close(&c->res.body); /* decoded: the body is of no more use */
        if (prc == CP_ENOMEM)
            rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        else if (prc)
            fan_reject(c, e.msg);
        else if (!by_series)
            rc = merge_part(m, &parts[1 + i], c, err);
        if (prc) {
            cp_profile_destroy(parts[1 + i]);
            parts[1 + i] = NULL;
        }
    }
    if (!rc && by_series) rc = latest_only(parts, fa.n + 1, err);
    for (uint32_t i = 0; !rc && by_series && i <= fa.n; i++)
        rc = merge_part(m, &parts[i], i ? &fa.calls[i - 1] : NULL, err);
    cp_profile *merged = NULL;
    if (!rc && !(merged = cp_merger_finish(m))) rc = cp_err_set(err, CP_ENOMEM, "out of memory");
    if (merged) {
        /* the window, as the store states it: not the sum of the parts' durations */
        merged->time_nanos = q->from_ns;
        merged->duration_nanos = q->to_ns - q->from_ns;
    }
    cp_merger_destroy(m);
    for (uint32_t i = 0; parts && i <= fa.n; i++)
        cp_profile_destroy(parts[i]);
    free(parts);
    fan_close(&fa);
    cp_buf_close(&pq);
    *out = merged;
    return rc;
}

/* ---- series --------------------------------------------------------------------------- */

typedef struct skey {
    cp_series_info *s;
    char *key; /* kind, then the formatted labels */
} skey;

static int skey_cmp(const void *a, const void *b)
{
    return strcmp(((const skey *)a)->key, ((const skey *)b)->key);
}

/* Adds a peer's {"series":[...]} answer to l; CP_EPARSE for an answer of another shape. */
static int series_add_json(const call *c, cp_series_list *l, cp_err *err)
{
    cp_json *j = NULL;
    int rc = cp_json_parse((const char *)c->res.body.data, c->res.body.len, &j, err);
    if (rc) return rc;
    const cp_json *arr = cp_json_get(j, "series");
    if (!arr || arr->type != CP_JSON_ARRAY) rc = cp_err_set(err, CP_EPARSE, "no series array");
    for (uint32_t i = 0; !rc && i < arr->n; i++) {
        const cp_json *e = arr->items[i], *labels = cp_json_get(e, "labels");
        int kind = cp_kind_parse(cp_json_str(cp_json_get(e, "type"), ""));
        cp_series_info si = {0};
        si.kind = (cp_kind)kind;
        if (!kind || !labels || labels->type != CP_JSON_OBJECT ||
            cp_parse_time(cp_json_str(cp_json_get(e, "first"), ""), 0, &si.first_ns, NULL) ||
            cp_parse_time(cp_json_str(cp_json_get(e, "last"), ""), 0, &si.last_ns, NULL)) {
            rc = cp_err_set(err, CP_EPARSE, "series %u: expected type, labels, first, last", i);
            break;
        }
        for (uint32_t k = 0; !rc && k < labels->n; k++) {
            const char *v = cp_json_str(labels->items[k], NULL);
            if (!v)
                rc = cp_err_set(err, CP_EPARSE, "series %u: label %s is not a string", i,
                                labels->keys[k]);
            else if (cp_labels_set(&si.labels, labels->keys[k], v))
                rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        }
        const cp_json *cap = cp_json_get(e, "capture"); /* a capture's series (api.c) */
        if (!rc && cap && cap->type == CP_JSON_OBJECT) {
            si.cap_windows = (uint32_t)cp_json_int(cp_json_get(cap, "windows"), 0);
            si.cap_samples = (uint64_t)cp_json_int(cp_json_get(cap, "samples"), 0);
            si.cap_end_ns = (int64_t)cp_json_int(cp_json_get(cap, "end_ns"), 0);
            const char *eng = cp_json_str(cp_json_get(cap, "engine"), NULL);
            if (eng && !(si.cap_engine = strdup(eng)))
                rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        }
        if (!rc && cp_vec_push(l, si)) rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        if (rc) {
            cp_labels_close(&si.labels);
            free(si.cap_engine);
        }
    }
    cp_json_free(j);
    return rc;
}

/* Sorts l by kind and labels and folds entries of one series into the widest span. */
static int series_union(cp_series_list *l, cp_err *err)
{
    if (l->n < 2) return 0;
    uint32_t total = l->n;
    skey *k = calloc(l->n, sizeof *k);
    cp_series_info *v = calloc(l->n, sizeof *v);
    int rc = k && v ? 0 : CP_ENOMEM;
    for (uint32_t i = 0; !rc && i < l->n; i++) {
        cp_buf b = {0};
        rc = cp_buf_printf(&b, "%d", (int)l->v[i].kind);
        if (!rc) rc = cp_labels_format(&l->v[i].labels, &b);
        if (!rc) rc = cp_buf_append(&b, "", 1);
        k[i] = (skey){&l->v[i], (char *)b.data};
        if (rc) cp_buf_close(&b);
    }
    uint32_t n = 0;
    if (!rc) {
        qsort(k, l->n, sizeof *k, skey_cmp);
        for (uint32_t i = 0; i < l->n; i++) {
            if (n && strcmp(k[i].key, k[i - 1].key) == 0) {
                cp_series_info *d = &v[n - 1];
                if (k[i].s->first_ns < d->first_ns) d->first_ns = k[i].s->first_ns;
                if (k[i].s->last_ns > d->last_ns) d->last_ns = k[i].s->last_ns;
                /* a capture's series on two nodes (a hand-over): its windows add up */
                d->cap_windows += k[i].s->cap_windows;
                d->cap_samples += k[i].s->cap_samples;
                if (k[i].s->cap_end_ns > d->cap_end_ns) {
                    d->cap_end_ns = k[i].s->cap_end_ns;
                    char *t = d->cap_engine;
                    d->cap_engine = k[i].s->cap_engine;
                    k[i].s->cap_engine = t;
                }
                free(k[i].s->cap_engine);
                cp_labels_close(&k[i].s->labels);
            } else {
                v[n++] = *k[i].s;
            }
        }
        memcpy(l->v, v, n * sizeof *v);
        l->n = n;
    }
    for (uint32_t i = 0; k && i < total; i++)
        free(k[i].key);
    free(k);
    free(v);
    return rc ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
}

/* The series reader: the union of every node's, one entry per (kind, labels) with the
 * widest span, sorted by kind then labels. */
static int fo_series(cp_reader *rd, const cp_query *q, cp_series_list *out, cp_err *err)
{
    cp_fanout_req *fr = (cp_fanout_req *)rd;
    if (!fans(fr, q)) return fr->local->series(fr->local, q, out, err);
    cp_buf pq = {0};
    fan fa = {.fr = fr};
    int rc = cp_buf_printf(&pq, "/api/v1/series?");
    if (!rc) rc = put_window(&pq, q);
    if ((rc = fan_begin(&fa, &pq, rc, q, err))) return rc;
    rc = fr->local->series(fr->local, q, out, err);
    fan_wait(&fa);
    for (uint32_t i = 0; !rc && i < fa.n; i++) {
        if (!fa.calls[i].ok) continue;
        cp_err e = {0};
        uint32_t before = out->n;
        int prc = series_add_json(&fa.calls[i], out, &e);
        if (prc == CP_ENOMEM)
            rc = cp_err_set(err, prc, "out of memory");
        else if (prc) {
            while (out->n > before) {
                cp_labels_close(&out->v[--out->n].labels);
                free(out->v[out->n].cap_engine);
            }
            fan_reject(&fa.calls[i], e.msg);
        }
    }
    if (!rc) rc = series_union(out, err);
    fan_close(&fa);
    cp_buf_close(&pq);
    return rc;
}

/* ---- labels --------------------------------------------------------------------------- */

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Label names (q->label NULL) or one label's values over every node: the sorted union. */
static int fo_strings(cp_fanout_req *fr, const cp_query *q, cp_string_list *out, cp_err *err)
{
    cp_reader *lr = fr->local;
    const char *name = q->label;
    if (!fans(fr, q)) return name ? lr->values(lr, q, out, err) : lr->labels(lr, q, out, err);
    cp_buf pq = {0};
    fan fa = {.fr = fr};
    int rc = name ? cp_buf_printf(&pq, "/api/v1/labels/%s/values?", name)
                  : cp_buf_printf(&pq, "/api/v1/labels?");
    if ((rc = fan_begin(&fa, &pq, rc, q, err))) return rc;
    rc = name ? lr->values(lr, q, out, err) : lr->labels(lr, q, out, err);
    fan_wait(&fa);
    for (uint32_t i = 0; !rc && i < fa.n; i++) {
        call *c = &fa.calls[i];
        cp_json *j = call_json(c);
        if (!j) continue;
        const cp_json *arr = cp_json_get(j, name ? "values" : "labels");
        int ok = arr && arr->type == CP_JSON_ARRAY;
        for (uint32_t k = 0; ok && k < arr->n; k++)
            ok = cp_json_str(arr->items[k], NULL) != NULL;
        /* checked whole first: a garbled list adds nothing */
        if (!ok) fan_reject(c, "not a list of strings in the answer");
        for (uint32_t k = 0; ok && !rc && k < arr->n; k++) {
            const char *v = cp_json_str(arr->items[k], NULL);
            char *d = strdup(v);
            if (!d || cp_vec_push(out, d)) {
                free(d);
                rc = cp_err_set(err, CP_ENOMEM, "out of memory");
            }
        }
        cp_json_free(j);
    }
    if (!rc && out->n > 1) {
        qsort(out->v, out->n, sizeof *out->v, str_cmp);
        uint32_t n = 1;
        for (uint32_t i = 1; i < out->n; i++) {
            if (strcmp(out->v[i], out->v[n - 1]) == 0)
                free(out->v[i]);
            else
                out->v[n++] = out->v[i];
        }
        out->n = n;
    }
    fan_close(&fa);
    cp_buf_close(&pq);
    return rc;
}

static int fo_labels(cp_reader *rd, const cp_query *q, cp_string_list *out, cp_err *err)
{
    cp_query names = *q;
    names.label = NULL;
    return fo_strings((cp_fanout_req *)rd, &names, out, err);
}

static int fo_values(cp_reader *rd, const cp_query *q, cp_string_list *out, cp_err *err)
{
    if (!q->label) return cp_err_set(err, CP_EINVAL, "label name missing");
    return fo_strings((cp_fanout_req *)rd, q, out, err);
}

/* ---- timelines ------------------------------------------------------------------------ */

/* The timeline reader: every node's points added step by step. */
static int fo_timeline(cp_reader *rd, const cp_query *q, cp_timeline *out, cp_err *err)
{
    cp_fanout_req *fr = (cp_fanout_req *)rd;
    if (!fans(fr, q)) return fr->local->timeline(fr->local, q, out, err);
    cp_buf pq = {0};
    fan fa = {.fr = fr};
    int rc = cp_buf_printf(&pq, "/api/v1/timeline?type=%s&step=%lldns", cp_kind_name(q->kind),
                           (long long)q->step_ns);
    if (!rc) rc = put_window(&pq, q);
    if ((rc = fan_begin(&fa, &pq, rc, q, err))) return rc;
    rc = fr->local->timeline(fr->local, q, out, err);
    uint32_t *nsteps = &out->nsteps, *ntypes = &out->ntypes;
    fan_wait(&fa);
    for (uint32_t i = 0; !rc && i < fa.n; i++) {
        call *c = &fa.calls[i];
        cp_json *j = call_json(c);
        if (!j) continue;
        /* checked whole before anything is added: a bad answer adds nothing */
        const cp_json *pts = cp_json_get(j, "points");
        int ok = pts && pts->type == CP_JSON_ARRAY && pts->n == *nsteps;
        for (uint32_t p = 0; ok && p < pts->n; p++) {
            const cp_json *pt = pts->items[p];
            ok = pt->type == CP_JSON_ARRAY && pt->n == *ntypes + 1;
            for (uint32_t t = 1; ok && t < pt->n; t++)
                ok = pt->items[t]->is_int;
        }
        if (!ok) fan_reject(c, "points do not match this node's steps and sample types");
        for (uint32_t p = 0; ok && p < pts->n; p++)
            for (uint32_t t = 0; t < *ntypes; t++)
                out->v[(size_t)p * *ntypes + t] += pts->items[p]->items[t + 1]->i64;
        cp_json_free(j);
    }
    fan_close(&fa);
    cp_buf_close(&pq);
    return rc;
}

/* ---- uploads ------------------------------------------------------------------------- */

int cp_fanout_upload(cp_fanout_req *fr, const cp_query *q, const char *path, const void *body,
                     size_t len, cp_err *err)
{
    if (!fans(fr, q)) return 0;
    cp_buf pq = {0};
    /* body non-NULL even when empty: this is a POST */
    fan fa = {.fr = fr, .body = body ? body : "", .body_len = len};
    int rc = cp_buf_printf(&pq, "%s%c", path, strchr(path, '?') ? '&' : '?');
    if ((rc = fan_begin(&fa, &pq, rc, q, err))) return rc;
    fan_wait(&fa);
    fan_close(&fa);
    cp_buf_close(&pq);
    return 0;
}

/* ---- ingest offsets of the peers ------------------------------------------------------ */

/* Asked within this long, the peers' offsets are refreshed continuously; then they rest. */
#define OFFSETS_ACTIVE_NS (2 * 1000000000LL)
#define OFFSETS_EVERY_US 5000

typedef struct offsets_arg {
    cp_fanout *f;
    uint32_t peer;
} offsets_arg;

/* A peer's partitions, as its answer listed them (model/offsets.h). */
typedef struct peer_offsets {
    uint32_t n;
    cp_partition_offsets v[];
} peer_offsets;

/* The "partitions" array of a peer's answer, read (malloc'd); NULL if the answer is not
 * such an object or a member does not read as a partition's offsets. */
static peer_offsets *partitions_of(const cp_buf *body)
{
    cp_json *j = NULL;
    if (cp_json_parse((const char *)body->data, body->len, &j, NULL)) return NULL;
    const cp_json *arr = cp_json_get(j, "partitions");
    peer_offsets *po = NULL;
    if (arr && arr->type == CP_JSON_ARRAY)
        po = malloc(sizeof *po + (size_t)arr->n * sizeof po->v[0]);
    for (uint32_t i = 0; po && i < arr->n; i++)
        if (cp_offsets_read(arr->items[i], &po->v[i], NULL)) {
            free(po);
            po = NULL;
        }
    if (po) po->n = arr->n;
    cp_json_free(j);
    return po;
}

/* Logs (once) and marks peer i if its partitions name one this node owns. */
static void overlap_check(cp_fanout *f, uint32_t i, const peer_offsets *po)
{
    for (uint32_t k = 0; k < po->n; k++) {
        int32_t p = po->v[k].partition;
        if (p < CP_MAX_PARTITIONS && f->own[p]) {
            if (cp_gauge_swap(&f->overlap[i], 1) == 0)
                cp_log_error("cluster: peer %s owns partition %d too: both nodes store it and "
                             "every query counts it twice; give each partition to one node "
                             "(cluster.partitions)",
                             f->peers[i], p);
            return;
        }
    }
}

static void *offsets_run(void *arg)
{
    offsets_arg *oa = arg;
    cp_fanout *f = oa->f;
    uint32_t i = oa->peer;
    free(oa);
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        if (!f->asked_ns || mono_now() - f->asked_ns > OFFSETS_ACTIVE_NS) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&f->wake, &f->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&f->mu);
        cp_http_result res = {0};
        cp_err err = {0};
        peer_offsets *parts = NULL;
        char pq[96];
        snprintf(pq, sizeof pq, "/api/v1/ingest/offsets?local=1&node=%s", f->id);
        int rc = atomic_load(&f->self[i])
                     ? -1
                     : cp_http_get(f->peers[i], pq, f->token, 2000, (size_t)4 << 20, &res, &err);
        if (!rc && res.status == 200) parts = partitions_of(&res.body);
        if (parts && !cp_gauge_get(&f->overlap[i])) overlap_check(f, i, parts);
        /* this node under another name (fanout_begin's 421): its partitions are listed
         * already, and would be twice */
        if (!rc && res.status == 421 && !atomic_exchange(&f->self[i], 1))
            cp_log_info("cluster: peer %s is this node itself: not asked again", f->peers[i]);
        cp_buf_close(&res.body);
        pthread_mutex_lock(&f->mu);
        free(f->slots[i].parts);
        f->slots[i].parts = parts; /* a peer that is down has no partitions: nothing stored */
        pthread_mutex_unlock(&f->mu);
        usleep(OFFSETS_EVERY_US);
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void offsets_stop(cp_fanout *f)
{
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->wake);
    pthread_mutex_unlock(&f->mu);
    for (uint32_t i = 0; i < f->n; i++) {
        if (f->slots[i].started) pthread_join(f->slots[i].th, NULL);
        free(f->slots[i].parts);
    }
    pthread_cond_destroy(&f->wake);
    pthread_mutex_destroy(&f->mu);
}

int cp_fanout_offsets(cp_fanout *f, const cp_http_request *req, cp_http_response *r, int comma)
{
    if (!f) return 0;
    cp_params pa = {0};
    int local = 0;
    if (!cp_params_parse(req->query, &pa, NULL)) {
        const char *l = cp_params_get(&pa, "local");
        local = l && strcmp(l, "1") == 0;
    }
    cp_params_close(&pa);
    if (local) return 0;
    int rc = 0;
    char missing[sizeof r->extra_headers] = "";
    size_t ml = 0;
    pthread_mutex_lock(&f->mu);
    int first = !f->asked_ns;
    f->asked_ns = mono_now();
    for (uint32_t i = 0; i < f->n; i++) {
        if (!f->slots[i].started) {
            offsets_arg *oa = malloc(sizeof *oa);
            if (oa) *oa = (offsets_arg){f, i};
            if (oa && pthread_create(&f->slots[i].th, NULL, offsets_run, oa) == 0)
                f->slots[i].started = 1;
            else
                free(oa);
        }
        const peer_offsets *p = f->slots[i].parts;
        if (atomic_load(&f->self[i])) continue; /* this node: its partitions are listed */
        if (p) {
            for (uint32_t k = 0; k < p->n && !rc; k++) {
                rc = cp_buf_printf(&r->body, "%s", comma ? "," : "");
                if (!rc) rc = cp_offsets_write(&r->body, &p->v[k]);
                comma = 1;
            }
        } else if (!p && !first && ml + strlen(f->peers[i]) + 2 < sizeof missing) {
            ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%s", ml ? "," : "",
                                   f->peers[i]);
        }
    }
    pthread_cond_broadcast(&f->wake);
    pthread_mutex_unlock(&f->mu);
    size_t l = strlen(r->extra_headers);
    if (ml && l + ml + strlen(CP_FANOUT_PARTIAL_HEADER) + 5 < sizeof r->extra_headers)
        snprintf(r->extra_headers + l, sizeof r->extra_headers - l, "%s: %s\r\n",
                 CP_FANOUT_PARTIAL_HEADER, missing);
    return rc ? CP_ENOMEM : 0;
}

/* ---- metrics -------------------------------------------------------------------------- */

int cp_fanout_register_metrics(cp_fanout *f, cp_metrics *m)
{
    if (!f) return 0;
    f->metrics = m;
    int rc = 0;
    for (uint32_t i = 0; !rc && i < f->n; i++)
        rc = cp_metrics_counter(m, f, "contprof_cluster_peer_failures_total",
                                "Query parts a peer did not give in time or usable (answers "
                                "marked partial).",
                                (cp_metric_label[]){{"peer", f->peers[i]}}, 1, &f->failures[i]);
    for (uint32_t i = 0; !rc && i < f->n; i++)
        rc = cp_metrics_gauge(m, f, "contprof_cluster_peer_partition_overlap",
                              "1 if the peer owns a partition this node owns too (both store it).",
                              (cp_metric_label[]){{"peer", f->peers[i]}}, 1, &f->overlap[i]);
    return rc;
}
