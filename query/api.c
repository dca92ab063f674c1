/* The query API: each endpoint parses and checks its parameters (every mistake is a 4xx
 * naming it), asks the store for the tenant's data, and renders the answer. Endpoints that
 * touch the store run on the threadpool; health, metrics and brokers on the loop. */
#include "api.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "envelope.h"
#include "json.h"
#include "fanout.h"
#include "http_client.h"
#include "log.h"
#include "merge.h"
#include "params.h"
#include "pprof.h"
#include "querier.h"
#include "render.h"
#include "selector.h"
#include "symbols.h"
#include "ui.h"

/* Upper bounds (seconds) of the query latency histogram. */
static const double g_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                   0.25,  0.5,    1,     2.5,  5,     10,   30};
#define NBUCKETS (sizeof g_buckets / sizeof g_buckets[0])

enum {
    EP_PROFILE,
    EP_DIFF,
    EP_TIMELINE,
    EP_SERIES,
    EP_LABELS,
    EP_VALUES,
    EP_SYMBOLS,
    EP_CAPTURES,
    EP_OTHER,
    EP_COUNT
};
static const char *const g_ep_names[EP_COUNT] = {
    "profile", "diff", "timeline", "series", "labels", "values", "symbols", "captures", "other"};

struct cp_api {
    cp_api_options o;
    char *brokers, *relay;
    char *metrics_token; /* NULL: any tenant's token opens /metrics */
    cp_api_token *tokens;
    size_t ntokens;
    /* Metrics, touched only on the loop thread (observe and /metrics; checked in debug
     * builds). */
    cp_thread_owner loop_thread;
    uint64_t hist[EP_COUNT][NBUCKETS + 1];
    double hist_sum[EP_COUNT];
    uint64_t hist_count[EP_COUNT];
    cp_counter by_class[6]; /* 1xx..5xx */
    int64_t started_ns;
    cp_metrics *own_metrics;   /* when the options gave none: /metrics still has the API's */
    cp_captures *own_captures; /* when the options gave none */
    cp_pyro_stats pyro;        /* Pyroscope's endpoints (any thread adds) */
};

static int collect_latency(void *arg, cp_metrics_out *o);
static int collect_uptime(void *arg, cp_metrics_out *o);

/* The API's families in the registry: responses by class, the latency histogram and the
 * uptime, ahead of the stages that register after it. */
static int register_metrics(cp_api *a)
{
    static const char *const classes[6] = {"", "1xx", "2xx", "3xx", "4xx", "5xx"};
    if (!a->o.metrics && cp_metrics_create(&a->own_metrics)) return CP_ENOMEM;
    if (!a->o.metrics) a->o.metrics = a->own_metrics;
    int rc = 0;
    for (int c = 1; c <= 5 && !rc; c++)
        rc = cp_metrics_counter(a->o.metrics, a, "contprof_http_responses_total",
                                "HTTP responses by status class.",
                                (cp_metric_label[]){{"code", classes[c]}}, 1, &a->by_class[c]);
    if (!rc) rc = cp_metrics_collector(a->o.metrics, a, collect_latency, a);
    if (!rc) rc = cp_metrics_collector(a->o.metrics, a, collect_uptime, a);
    if (!rc) rc = cp_pyro_register_metrics(&a->pyro, a->o.metrics, a);
    return rc;
}

void cp_api_options_default(cp_api_options *o)
{
    memset(o, 0, sizeof *o);
    o->max_range_ns = 400LL * 86400 * 1000000000LL;
    o->max_nodes_default = 20000;
    o->max_nodes_limit = 200000;
    o->max_steps = 11000;
    o->brokers = "";
}

/* Without a captures object in the options: one of the API's own, over its store, peers and
 * tokens, with the default limits and no writer. 0 or CP_ENOMEM. */
static int own_captures(cp_api *a)
{
    if (a->o.captures) return 0;
    cp_captures_options co;
    cp_captures_options_default(&co);
    co.store = a->o.store;
    co.fanout = a->o.fanout;
    const char **pairs = calloc(2 * a->ntokens + 1, sizeof *pairs);
    if (!pairs) return CP_ENOMEM;
    for (size_t i = 0; i < a->ntokens; i++) {
        pairs[2 * i] = a->tokens[i].tenant;
        pairs[2 * i + 1] = a->tokens[i].token;
    }
    co.tenant_tokens = pairs;
    int rc = cp_captures_create(&co, &a->own_captures);
    free(pairs);
    a->o.captures = a->own_captures;
    return rc;
}

cp_api *cp_api_create(const cp_api_options *o)
{
    cp_api *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->o = *o;
    a->brokers = strdup(o->brokers ? o->brokers : "");
    if (!a->brokers) goto fail;
    if (o->metrics_token && *o->metrics_token && !(a->metrics_token = strdup(o->metrics_token)))
        goto fail;
    if (o->ntokens) {
        a->tokens = calloc(o->ntokens, sizeof *a->tokens);
        if (!a->tokens) goto fail;
        for (size_t i = 0; i < o->ntokens; i++) {
            a->tokens[i].token = strdup(o->tokens[i].token);
            a->tokens[i].tenant = strdup(o->tokens[i].tenant);
            a->ntokens = i + 1;
            if (!a->tokens[i].token || !a->tokens[i].tenant) goto fail;
        }
    }
    a->o.tokens = NULL;
    a->o.brokers = NULL;
    a->o.metrics_token = NULL;
    a->started_ns = cp_now_ns();
    if (register_metrics(a) || own_captures(a)) goto fail;
    return a;
fail:
    cp_api_destroy(a);
    return NULL;
}

void cp_api_destroy(cp_api *a)
{
    if (!a) return;
    cp_captures_destroy(a->own_captures);
    cp_metrics_remove(a->o.metrics, a);
    cp_metrics_destroy(a->own_metrics);
    for (size_t i = 0; i < a->ntokens; i++) {
        free((char *)a->tokens[i].token);
        free((char *)a->tokens[i].tenant);
    }
    free(a->tokens);
    free(a->brokers);
    free(a->relay);
    free(a->metrics_token);
    free(a);
}

int cp_api_set_brokers(cp_api *a, const char *brokers)
{
    char *d = strdup(brokers ? brokers : "");
    if (!d) return CP_ENOMEM;
    free(a->brokers);
    a->brokers = d;
    return 0;
}

int cp_api_set_relay(cp_api *a, const char *dir)
{
    char *d = strdup(dir ? dir : "");
    if (!d) return CP_ENOMEM;
    free(a->relay);
    a->relay = d;
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------ */

static void set_type(cp_http_response *r, const char *t)
{
    snprintf(r->content_type, sizeof r->content_type, "%s", t);
}

static void oom(cp_http_response *r)
{
    cp_buf_close(&r->body);
    cp_http_error(r, 503, "out of memory while answering");
}

/* Resolves the tenant; on failure sets a 401 and returns NULL. */
static const char *authenticate(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    if (a->ntokens == 0) return CP_DEFAULT_TENANT;
    size_t n = 0;
    const char *h = cp_http_bearer(req, &n);
    if (!h) {
        cp_http_error(r, 401,
                      req->authorization ? "Authorization header is not a Bearer token"
                                         : "missing Authorization: Bearer token");
        snprintf(r->extra_headers, sizeof r->extra_headers,
                 "WWW-Authenticate: Bearer realm=\"contprof\"\r\n");
        return NULL;
    }
    const char *tenant = NULL;
    for (size_t i = 0; i < a->ntokens; i++)
        if (cp_http_token_eq(h, n, a->tokens[i].token) && !tenant) tenant = a->tokens[i].tenant;
    if (!tenant) {
        cp_http_error(r, 401, "invalid token");
        snprintf(r->extra_headers, sizeof r->extra_headers,
                 "WWW-Authenticate: Bearer realm=\"contprof\", error=\"invalid_token\"\r\n");
    }
    return tenant;
}

/* /metrics counts across tenants: with metrics.token only that token opens it, else (with
 * tenants configured) any tenant's token. 1 if allowed, else 0 with a 401 set. */
static int metrics_allowed(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    if (!a->metrics_token) return a->ntokens == 0 || authenticate(a, req, r) != NULL;
    size_t n = 0;
    const char *h = cp_http_bearer(req, &n);
    if (h && cp_http_token_eq(h, n, a->metrics_token)) return 1;
    cp_http_error(r, 401, "/metrics needs Authorization: Bearer <metrics.token>");
    snprintf(r->extra_headers, sizeof r->extra_headers,
             "WWW-Authenticate: Bearer realm=\"contprof\"\r\n");
    return 0;
}

/* If req's deadline has passed: sets a 503 naming query.timeout and what was being done,
 * drops any body made so far, and returns 1. */
static int over_time(const cp_http_request *req, const char *during, cp_http_response *r)
{
    if (!req->deadline_ns || cp_mono_ns() < req->deadline_ns) return 0;
    cp_buf_close(&r->body);
    cp_http_error(r, 503, "query exceeded query.timeout (%.1f s) while %s",
                  (double)(req->deadline_ns - req->received_ns) / 1e9, during);
    r->extra_headers[0] = 0;
    return 1;
}

/* Maps a store failure to a response. */
static void store_error(const cp_http_request *req, int rc, const cp_err *err, cp_http_response *r)
{
    const char *msg = err->msg[0] ? err->msg : cp_strerror(rc);
    if (rc == CP_ELIMIT) {
        if (req->deadline_ns && cp_mono_ns() >= req->deadline_ns)
            cp_http_error(r, 503, "query exceeded query.timeout (%.1f s): %s",
                          (double)(req->deadline_ns - req->received_ns) / 1e9, msg);
        else
            cp_http_error(r, 400, "query exceeds a limit: %s", msg);
    } else if (rc == CP_EINVAL || rc == CP_EPARSE) {
        cp_http_error(r, 400, "%s", msg);
    } else if (rc == CP_ENOMEM) {
        cp_http_error(r, 503, "out of memory: %s", msg);
    } else {
        cp_log_error("query %s: %s", req->path, msg);
        cp_http_error(r, 500, "%s", msg);
    }
}

static int parse_max_nodes(cp_api *a, const char *s, uint32_t def, uint32_t *out,
                           cp_http_response *r)
{
    if (!s || !*s) {
        *out = def;
        return 0;
    }
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || s[0] == '-' || v > a->o.max_nodes_limit) {
        cp_http_error(r, 400,
                      "bad max_nodes '%.32s' (expected 0..%u; 0 = no pruning up to the limit)", s,
                      a->o.max_nodes_limit);
        return -1;
    }
    *out = v ? (uint32_t)v : a->o.max_nodes_limit;
    return 0;
}

static int json_str(cp_buf *b, const char *s)
{
    if (cp_buf_append(b, "\"", 1) || cp_json_escape(b, s, strlen(s)) || cp_buf_append(b, "\"", 1))
        return CP_ENOMEM;
    return 0;
}

/* Names the frames agents left unsymbolized (CONTPROF_SYMBOLIZE=server, stripped objects)
 * from the tenant's uploaded symbols and the configured directories, until the query's
 * deadline (CP_ELIMIT past it: store_error answers 503 naming query.timeout). */
static int name_frames(cp_api *a, const char *tenant, cp_profile *p, int64_t deadline_ns,
                       cp_err *err)
{
    if (!a->o.symbols || !p) return 0;
    int rc = cp_symbols_name_until(a->o.symbols, tenant, p, deadline_ns, NULL);
    if (rc == CP_ELIMIT)
        return cp_err_set(err, CP_ELIMIT, "naming frames through symbols and source maps");
    if (rc) return cp_err_set(err, CP_ENOMEM, "out of memory while naming frames");
    return 0;
}

/* ---- one request ------------------------------------------------------------------ */

/* A store-backed request on its way through its endpoint: built once by the dispatch. */
typedef struct api_call {
    cp_api *a;
    const cp_http_request *req; /* its deadline is the query's */
    const cp_params *pa;        /* the rendering parameters (format, focus, max_nodes...) */
    cp_query_req *qr;           /* the query (and a diff's base), parsed */
    cp_reader *rd;              /* the readers: this store's, across the cluster */
    cp_fanout_req *fr;          /* the cluster's side of the request (uploads) */
} api_call;

/* ---- /api/v1/symbols ---------------------------------------------------------------- */

/* A refused upload's answer: 400 for what the body holds, 413 past a limit, else as a
 * store failure. */
static void upload_error(const cp_http_request *req, int rc, const cp_err *err, cp_http_response *r)
{
    if (rc == CP_EPARSE || rc == CP_EINVAL)
        cp_http_error(r, 400, "%s", err->msg);
    else if (rc == CP_ELIMIT)
        cp_http_error(r, 413, "%s", err->msg);
    else
        store_error(req, rc, err, r);
}

/* POST of a source map (the body starts with '{'): kept for the tenant and the script it
 * maps (its "file", else name=), it rewrites that script's V8 frames in every later answer,
 * old windows included. */
static void symbols_map(const api_call *c, cp_http_response *r)
{
    cp_api *a = c->a;
    const cp_http_request *req = c->req;
    const char *tenant = c->qr->q.tenant, *name = cp_params_get(c->pa, "name");
    cp_err err = {0};
    cp_symbols_map_result res;
    cp_symbols_map_upload up = {tenant, (const char *)req->body, req->body_len, name};
    int rc = cp_symbols_upload_map(a->o.symbols, &up, &res, &err);
    if (rc) {
        upload_error(req, rc, &err, r);
        return;
    }
    cp_log_info("symbols: tenant %s uploaded the source map of %s (%u sources, %u segments, "
                "%zu bytes, %zu decoded)",
                tenant, res.script, res.sources, res.segments, res.map_bytes, res.held_bytes);
    /* every node names its part: every node keeps the map, under the same script */
    cp_buf pq = {0};
    if (cp_buf_printf(&pq, "/api/v1/symbols?name=") || cp_url_encode(&pq, res.script) ||
        cp_buf_append(&pq, "", 1) ||
        cp_fanout_upload(c->fr, &c->qr->q, (const char *)pq.data, req->body, req->body_len, &err)) {
        cp_buf_close(&pq);
        oom(r);
        return;
    }
    cp_buf_close(&pq);
    if (cp_buf_printf(&r->body, "{\"tenant\":") || json_str(&r->body, tenant) ||
        cp_buf_printf(&r->body, ",\"script\":") || json_str(&r->body, res.script) ||
        cp_buf_printf(&r->body,
                      ",\"sources\":%u,\"segments\":%u,\"map_bytes\":%zu,\"held_bytes\":%zu}\n",
                      res.sources, res.segments, res.map_bytes, res.held_bytes))
        oom(r);
}

/* POST: the body is an ELF binary or separate debug file (or a source map, above); its
 * symbol table is kept for the tenant and names that build ID's frames in every later
 * answer, old windows included. */
static void ep_symbols(const api_call *c, cp_http_response *r)
{
    cp_api *a = c->a;
    const cp_http_request *req = c->req;
    const char *tenant = c->qr->q.tenant;
    cp_err err = {0};
    const char *want = cp_params_get(c->pa, "tenant");
    if (want && *want && strcmp(want, tenant) != 0) {
        cp_http_error(r, 403, "tenant '%.64s' requested, but this token is for tenant '%s'", want,
                      tenant);
        return;
    }
    if (!a->o.symbols) {
        cp_http_error(r, 404, "this server does not keep symbols");
        return;
    }
    if (!req->body_len) {
        cp_http_error(r, 400,
                      "empty body: send the ELF file (binary or debug file) or the source "
                      "map as the request body");
        return;
    }
    if (cp_symbols_is_map(req->body, req->body_len)) {
        symbols_map(c, r);
        return;
    }
    cp_symbols_result res;
    int rc = cp_symbols_upload(a->o.symbols, tenant, req->body, req->body_len, &res, &err);
    if (rc) {
        upload_error(req, rc, &err, r);
        return;
    }
    cp_log_info("symbols: tenant %s uploaded build ID %s (%u functions, %u lines, %u inlines, "
                "%zu bytes)",
                tenant, res.build_id, res.info.functions, res.info.lines, res.info.inlines,
                res.table_bytes);
    /* every node names frames (each its own part, the asking one after the merge), so every
     * node keeps the table; a node that did not get it makes this answer partial */
    if (cp_fanout_upload(c->fr, &c->qr->q, "/api/v1/symbols", req->body, req->body_len, &err)) {
        oom(r);
        return;
    }
    if (cp_buf_printf(&r->body, "{\"tenant\":") || json_str(&r->body, tenant) ||
        cp_buf_printf(&r->body,
                      ",\"build_id\":\"%s\",\"functions\":%u,\"lines\":%u,\"inlines\":%u,"
                      "\"table_bytes\":%zu}\n",
                      res.build_id, res.info.functions, res.info.lines, res.info.inlines,
                      res.table_bytes))
        oom(r);
}

/* ---- /api/v1/profile ---------------------------------------------------------------- */

/* Renders p, the answer to c's query, in c's format; the profile may be filtered in place. */
static void render_profile(const api_call *c, cp_profile *p, cp_http_response *r)
{
    cp_api *a = c->a;
    const cp_params *pa = c->pa;
    const cp_http_request *req = c->req;
    const cp_query *q = &c->qr->q;
    const char *format = c->qr->format, *kind = cp_kind_name(q->kind);
    int64_t from = q->from_ns, to = q->to_ns;
    cp_err err = {0};
    if (cp_render_filter_until(p, cp_params_get(pa, "focus"), cp_params_get(pa, "ignore"),
                               req->deadline_ns, &err)) {
        if (!over_time(req, "filtering with focus/ignore", r)) cp_http_error(r, 400, "%s", err.msg);
        return;
    }
    int vi = 0;
    if (strcmp(format, "pprof") != 0 &&
        cp_render_value_index(p, cp_params_get(pa, "sample_type"), &vi, &err)) {
        cp_http_error(r, 400, "%s", err.msg);
        return;
    }
    int rc;
    if (strcmp(format, "pprof") == 0) {
        rc = cp_pprof_encode(
            p, 1,
            &r->body); /* level 1: 11 ms instead of 16 ms at level 6 for a 7-day merge, 8% larger */
        set_type(r, "application/octet-stream");
        snprintf(r->extra_headers, sizeof r->extra_headers,
                 "Content-Disposition: attachment; filename=\"%s.pb.gz\"\r\n", kind);
    } else if (strcmp(format, "folded") == 0) {
        rc = cp_render_folded(p, vi, &r->body);
        set_type(r, "text/plain; charset=utf-8");
    } else if (strcmp(format, "top") == 0) {
        uint32_t rows;
        if (parse_max_nodes(a, cp_params_get(pa, "max_nodes"), 0, &rows, r)) return;
        rc = cp_render_top(p, vi, rows, &r->body);
        set_type(r, "text/plain; charset=utf-8");
    } else {
        uint32_t mn;
        if (parse_max_nodes(a, cp_params_get(pa, "max_nodes"), a->o.max_nodes_default, &mn, r))
            return;
        char f[40], t[40], extra[256];
        cp_format_time(from, f, sizeof f);
        cp_format_time(to, t, sizeof t);
        snprintf(extra, sizeof extra,
                 "\"type\":\"%s\",\"from\":\"%s\",\"to\":\"%s\",\"duration_ns\":%" PRId64
                 ",\"period\":%" PRId64 ",",
                 kind, f, t, to - from, p->period);
        rc = cp_render_tree_json(p, vi, NULL, 0, &(cp_render_tree_opts){mn, extra}, &r->body);
        set_type(r, "application/json");
    }
    if (rc)
        oom(r);
    else
        over_time(req, "rendering", r);
}

static void ep_profile(const api_call *c, cp_http_response *r)
{
    const cp_query *q = &c->qr->q;
    cp_err err = {0};
    cp_profile *p = NULL;
    int rc = c->rd->profile(c->rd, q, &p, &err);
    if (!rc) rc = name_frames(c->a, q->tenant, p, c->req->deadline_ns, &err);
    if (rc) {
        store_error(c->req, rc, &err, r);
        cp_profile_destroy(p);
        return;
    }
    if (!over_time(c->req, "merging", r)) render_profile(c, p, r);
    cp_profile_destroy(p);
}

/* ---- /api/v1/diff ------------------------------------------------------------------- */

/* pprof's -base: the target merged with the base scaled by -1. */
static void diff_pprof(const api_call *c, cp_profile *p, cp_profile *b, cp_http_response *r)
{
    const cp_query *q = &c->qr->q;
    cp_err err = {0};
    cp_merger *m = cp_merger_create();
    cp_profile *d = NULL;
    if (!m) {
        oom(r);
        return;
    }
    int rc = cp_merger_add(m, p, &err);
    if (!rc) rc = cp_merger_add_scaled(m, b, -1, &err);
    if (!rc) d = cp_merger_finish(m);
    cp_merger_destroy(m);
    if (rc) {
        cp_http_error(r, 400, "cannot diff: %s", err.msg);
        return;
    }
    if (!d) {
        oom(r);
        return;
    }
    if (over_time(c->req, "merging the diff", r)) {
        cp_profile_destroy(d);
        return;
    }
    d->time_nanos = q->from_ns;
    d->duration_nanos = q->to_ns - q->from_ns;
    rc = cp_pprof_encode(d, 1, &r->body);
    cp_profile_destroy(d);
    if (rc) {
        oom(r);
        return;
    }
    set_type(r, "application/octet-stream");
    snprintf(r->extra_headers, sizeof r->extra_headers,
             "Content-Disposition: attachment; filename=\"%s-diff.pb.gz\"\r\n",
             cp_kind_name(q->kind));
}

static void diff_json(const api_call *c, cp_profile *p, cp_profile *b, cp_http_response *r)
{
    const cp_query *q = &c->qr->q, *bq = &c->qr->base;
    cp_err err = {0};
    int vi = 0, bvi = 0;
    const char *st = cp_params_get(c->pa, "sample_type");
    if (cp_render_value_index(p, st, &vi, &err) || cp_render_value_index(b, st, &bvi, &err)) {
        cp_http_error(r, 400, "%s", err.msg);
        return;
    }
    uint32_t mn;
    if (parse_max_nodes(c->a, cp_params_get(c->pa, "max_nodes"), c->a->o.max_nodes_default, &mn, r))
        return;
    char f[40], t[40], f2[40], t2[40], extra[320];
    cp_format_time(q->from_ns, f, sizeof f);
    cp_format_time(q->to_ns, t, sizeof t);
    cp_format_time(bq->from_ns, f2, sizeof f2);
    cp_format_time(bq->to_ns, t2, sizeof t2);
    snprintf(extra, sizeof extra,
             "\"type\":\"%s\",\"from\":\"%s\",\"to\":\"%s\",\"base_from\":\"%s\",\"base_to\":"
             "\"%s\",",
             cp_kind_name(q->kind), f, t, f2, t2);
    if (cp_render_tree_json(p, vi, b, bvi, &(cp_render_tree_opts){mn, extra}, &r->body))
        oom(r);
    else
        over_time(c->req, "rendering", r);
}

static void ep_diff(const api_call *c, cp_http_response *r)
{
    const cp_query *q = &c->qr->q, *bq = &c->qr->base;
    const cp_http_request *req = c->req;
    cp_err err = {0};
    cp_profile *p = NULL, *b = NULL;
    int rc = c->rd->profile(c->rd, q, &p, &err);
    if (!rc) rc = c->rd->profile(c->rd, bq, &b, &err);
    if (!rc) rc = name_frames(c->a, q->tenant, p, c->req->deadline_ns, &err);
    if (!rc) rc = name_frames(c->a, q->tenant, b, c->req->deadline_ns, &err);
    if (rc) {
        store_error(req, rc, &err, r);
        goto out;
    }
    const char *focus = cp_params_get(c->pa, "focus"), *ignore = cp_params_get(c->pa, "ignore");
    if (cp_render_filter_until(p, focus, ignore, req->deadline_ns, &err) ||
        cp_render_filter_until(b, focus, ignore, req->deadline_ns, &err)) {
        if (!over_time(req, "filtering with focus/ignore", r)) cp_http_error(r, 400, "%s", err.msg);
        goto out;
    }
    if (strcmp(c->qr->format, "pprof") == 0)
        diff_pprof(c, p, b, r);
    else
        diff_json(c, p, b, r);
out:
    cp_profile_destroy(p);
    cp_profile_destroy(b);
}

/* ---- /api/v1/timeline --------------------------------------------------------------- */

static void kind_types(cp_kind k, uint32_t i, const char **type, const char **unit)
{
    static const char *const names[CP_KIND_MAX][2][2] = {
        {{"samples", "count"}, {"cpu", "nanoseconds"}},
        {{"alloc_objects", "count"}, {"alloc_space", "bytes"}},
        {{"inuse_objects", "count"}, {"inuse_space", "bytes"}},
        {{"samples", "count"}, {"wall", "nanoseconds"}},
        {{"contentions", "count"}, {"delay", "nanoseconds"}},
        {{"contentions", "count"}, {"delay", "nanoseconds"}},
        {{"goroutine", "count"}, {"value", "count"}},
        {{"retained_objects", "count"}, {"retained_space", "bytes"}},
    };
    if (k >= CP_KIND_CPU && k <= CP_KIND_MAX && i < (k == CP_KIND_GOROUTINES ? 1u : 2u)) {
        *type = names[k - 1][i][0];
        *unit = names[k - 1][i][1];
    } else {
        *type = "value";
        *unit = "count";
    }
}

static void ep_timeline(const api_call *c, cp_http_response *r)
{
    const cp_query *q = &c->qr->q;
    cp_err err = {0};
    cp_timeline tl = {0};
    int rc = c->rd->timeline(c->rd, q, &tl, &err);
    if (rc) {
        store_error(c->req, rc, &err, r);
        return;
    }
    char f[40], t[40];
    cp_format_time(q->from_ns, f, sizeof f);
    cp_format_time(q->to_ns, t, sizeof t);
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b,
                       "{\"type\":\"%s\",\"from\":\"%s\",\"to\":\"%s\",\"step_seconds\":%.3f,"
                       "\"sample_types\":[",
                       cp_kind_name(q->kind), f, t, (double)q->step_ns / 1e9);
    for (uint32_t i = 0; !rc && i < tl.ntypes; i++) {
        const char *ty, *un;
        kind_types(q->kind, i, &ty, &un);
        rc = cp_buf_printf(b, "%s{\"type\":\"%s\",\"unit\":\"%s\"}", i ? "," : "", ty, un);
    }
    if (!rc) rc = cp_buf_printf(b, "],\"points\":[");
    for (uint32_t s = 0; !rc && s < tl.nsteps; s++) {
        int64_t ts = q->from_ns + (int64_t)s * q->step_ns;
        rc = cp_buf_printf(b, "%s[%.3f", s ? "," : "", (double)ts / 1e9);
        for (uint32_t i = 0; !rc && i < tl.ntypes; i++)
            rc = cp_buf_printf(b, ",%" PRId64, tl.v[(size_t)s * tl.ntypes + i]);
        if (!rc) rc = cp_buf_append(b, "]", 1);
    }
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    free(tl.v);
    if (rc) oom(r);
}

/* ---- /api/v1/series, labels, values ------------------------------------------------- */

static void ep_series(const api_call *c, cp_http_response *r)
{
    const cp_query *q = &c->qr->q;
    cp_err err = {0};
    cp_series_list l = {0};
    int rc = c->rd->series(c->rd, q, &l, &err);
    if (rc) {
        store_error(c->req, rc, &err, r);
        return;
    }
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b, "{\"series\":[");
    uint32_t shown = 0;
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        const cp_series_info *s = &l.v[i];
        if (q->kind && s->kind != q->kind) continue;
        char f[40], t[40];
        cp_format_time(s->first_ns, f, sizeof f);
        cp_format_time(s->last_ns, t, sizeof t);
        rc = cp_buf_printf(b, "%s{\"type\":\"%s\",\"labels\":{", shown ? "," : "",
                           cp_kind_name(s->kind) ? cp_kind_name(s->kind) : "unknown");
        for (uint32_t j = 0; !rc && j < s->labels.p.n; j++) {
            if (j) rc = cp_buf_append(b, ",", 1);
            if (!rc) rc = json_str(b, s->labels.p.v[j].name);
            if (!rc) rc = cp_buf_append(b, ":", 1);
            if (!rc) rc = json_str(b, s->labels.p.v[j].value);
        }
        if (!rc) rc = cp_buf_printf(b, "},\"first\":\"%s\",\"last\":\"%s\"", f, t);
        if (!rc && s->cap_windows) { /* a capture's series: what GET /api/v1/captures/ID sums */
            rc = cp_buf_printf(b,
                               ",\"capture\":{\"windows\":%u,\"samples\":%" PRIu64
                               ",\"end_ns\":%" PRId64 ",\"engine\":",
                               s->cap_windows, s->cap_samples, s->cap_end_ns);
            if (!rc) rc = json_str(b, s->cap_engine ? s->cap_engine : "");
            if (!rc) rc = cp_buf_append(b, "}", 1);
        }
        if (!rc) rc = cp_buf_append(b, "}", 1);
        shown++;
    }
    if (!rc) rc = cp_buf_printf(b, "],\"count\":%u}\n", shown);
    cp_series_list_close(&l);
    if (rc) oom(r);
}

static void string_list_json(const char *key, const char *name, cp_string_list *l,
                             cp_http_response *r)
{
    cp_buf *b = &r->body;
    int rc = cp_buf_printf(b, "{");
    if (!rc && name) {
        rc = cp_buf_printf(b, "\"name\":");
        if (!rc) rc = json_str(b, name);
        if (!rc) rc = cp_buf_printf(b, ",");
    }
    if (!rc) rc = cp_buf_printf(b, "\"%s\":[", key);
    for (uint32_t i = 0; !rc && i < l->n; i++) {
        if (i) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = json_str(b, l->v[i]);
    }
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    if (rc) oom(r);
}

static void ep_labels(const api_call *c, cp_http_response *r)
{
    cp_err err = {0};
    cp_string_list l = {0};
    int rc = c->rd->labels(c->rd, &c->qr->q, &l, &err);
    if (rc)
        store_error(c->req, rc, &err, r);
    else
        string_list_json("labels", NULL, &l, r);
    cp_string_list_close(&l);
}

static void ep_values(const api_call *c, cp_http_response *r)
{
    const cp_http_request *req = c->req;
    cp_err err = {0};
    const char *rest = req->path + strlen("/api/v1/labels/");
    size_t n = strlen(rest);
    if (n < 8 || strcmp(rest + n - 7, "/values") != 0) {
        cp_http_error(r, 404, "unknown path '%.128s' (expected /api/v1/labels/NAME/values)",
                      req->path);
        return;
    }
    char name[CP_LABEL_NAME_MAX + 1];
    size_t nl = n - 7;
    if (nl > CP_LABEL_NAME_MAX) nl = CP_LABEL_NAME_MAX;
    memcpy(name, rest, nl);
    name[nl] = 0;
    if (n - 7 > CP_LABEL_NAME_MAX || !cp_label_name_valid(name)) {
        cp_http_error(r, 400, "bad label name '%.*s' (expected [A-Za-z_][A-Za-z0-9_]*)",
                      (int)(n - 7 > 128 ? 128 : n - 7), rest);
        return;
    }
    cp_query q = c->qr->q; /* the label's name comes from the path */
    q.label = name;
    cp_string_list l = {0};
    int rc = c->rd->values(c->rd, &q, &l, &err);
    if (rc)
        store_error(req, rc, &err, r);
    else
        string_list_json("values", name, &l, r);
    cp_string_list_close(&l);
}
/* ---- /api/v1/captures (captures.c) ---------------------------------------------------- */

/* The first token of tenant (signs its control messages), or NULL. */
static const char *tenant_token(const cp_api *a, const char *tenant)
{
    for (size_t i = 0; i < a->ntokens; i++)
        if (strcmp(a->tokens[i].tenant, tenant) == 0) return a->tokens[i].token;
    return NULL;
}

static void ep_capture_post(const api_call *c, cp_http_response *r)
{
    cp_captures_post(c->a->o.captures, c->req, &c->qr->q, c->pa, c->fr, r);
}

static void ep_capture_list(const api_call *c, cp_http_response *r)
{
    cp_captures_list(c->a->o.captures, &c->qr->q, r);
}

static void ep_capture_get(const api_call *c, cp_http_response *r)
{
    cp_captures_get(c->a->o.captures, c->req, &c->qr->q, c->fr, r);
}

static void ep_capture_delete(const api_call *c, cp_http_response *r)
{
    cp_captures_delete(c->a->o.captures, c->req, &c->qr->q, c->fr, r);
}

static void ep_capture_control(const api_call *c, cp_http_response *r)
{
    cp_captures_control(c->a->o.captures, &c->qr->q, r);
}

/* ---- light endpoints ---------------------------------------------------------------- */

/* The latency histogram, per endpoint; read on the loop thread, where it is written (only
 * /metrics prints the registry). */
static int collect_latency(void *arg, cp_metrics_out *o)
{
    cp_api *a = arg;
    CP_ASSERT_THREAD(&a->loop_thread, "loop thread only");
    int rc = cp_metrics_out_family(o, "contprof_query_duration_seconds",
                                   "Time to answer store-backed queries, arrival to response.",
                                   CP_METRIC_HISTOGRAM);
    char le[32];
    for (int ep = 0; ep < EP_OTHER && !rc; ep++) {
        cp_metric_label l[2] = {{"endpoint", g_ep_names[ep]}, {"le", le}};
        uint64_t cum = 0;
        for (size_t i = 0; i <= NBUCKETS && !rc; i++) {
            cum += a->hist[ep][i];
            if (i < NBUCKETS)
                snprintf(le, sizeof le, "%g", g_buckets[i]);
            else
                snprintf(le, sizeof le, "+Inf");
            rc = cp_metrics_out_u64(o, "_bucket", l, 2, cum);
        }
        if (!rc) rc = cp_metrics_out_f64(o, "_sum", l, 1, a->hist_sum[ep], 6);
        if (!rc) rc = cp_metrics_out_u64(o, "_count", l, 1, a->hist_count[ep]);
    }
    return rc;
}

static int collect_uptime(void *arg, cp_metrics_out *o)
{
    cp_api *a = arg;
    int rc = cp_metrics_out_family(o, "contprof_uptime_seconds",
                                   "Seconds since the query API started.", CP_METRIC_GAUGE);
    if (!rc)
        rc = cp_metrics_out_f64(o, NULL, NULL, 0, (double)(cp_now_ns() - a->started_ns) / 1e9, 0);
    return rc;
}

static void ep_metrics(cp_api *a, cp_http_response *r)
{
    CP_ASSERT_THREAD(&a->loop_thread, "loop thread only");
    set_type(r, "text/plain; version=0.0.4; charset=utf-8");
    if (cp_metrics_write(a->o.metrics, &r->body)) oom(r);
}

/* GET /api/v1/ingest/offsets: per partition, the offset the store has durably reached and
 * the offsets below it that are not stored (DLQ, lost), so that a sender that knows its
 * messages' offsets (from the delivery reports) can tell when, and whether, they are stored.
 * Not per tenant: partitions are shared, and offsets say nothing of anyone's data. */
static void ep_offsets(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    cp_api_ingest_stats in = {0};
    if (a->o.ingest_stats) a->o.ingest_stats(a->o.ingest_arg, &in);
    if (!in.available) {
        cp_http_error(r, 503, "no ingest runs in this process");
        return;
    }
    cp_buf *b = &r->body;
    int rc = cp_buf_printf(b, "{\"topic\":");
    if (!rc) rc = json_str(b, in.topic ? in.topic : "");
    if (!rc)
        rc = cp_buf_printf(b,
                           ",\"running\":%s,\"ready\":%s,\"max_message_bytes\":%" PRIu64
                           ",\"max_in_flight_bytes\":%" PRIu64,
                           in.running ? "true" : "false", in.ready ? "true" : "false",
                           in.max_message_bytes, in.max_in_flight_bytes);
    /* what a sender of old windows must know (contprof import --at): seconds, 0 = forever */
    int64_t raw = 0, rollup = 0;
    if (a->o.store) cp_store_get_retention(a->o.store, &raw, &rollup);
    if (!rc)
        rc = cp_buf_printf(b,
                           ",\"retention_raw_s\":%" PRId64 ",\"retention_rollup_s\":%" PRId64
                           ",\"partitions\":[",
                           raw / 1000000000, rollup / 1000000000);
    for (uint32_t i = 0; i < in.nparts && !rc; i++) {
        rc = cp_buf_printf(b, "%s", i ? "," : "");
        if (!rc) rc = cp_offsets_write(b, &in.parts[i]);
    }
    if (!rc) rc = cp_fanout_offsets(a->o.fanout, req, r, in.nparts > 0); /* a cluster's */
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    if (rc) oom(r);
}

/* ---- routing and dispatch ----------------------------------------------------------- */

static void loop_healthz(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    (void)req;
    cp_api_ingest_stats in = {0};
    if (a->o.ingest_stats) a->o.ingest_stats(a->o.ingest_arg, &in);
    char damage[512];
    if (a->o.store && cp_store_damage(a->o.store, damage, sizeof damage)) {
        /* a damaged table answers some queries with errors: not healthy, and the message
         * names the table and the repair (issue 27) */
        r->status = 503;
        if (cp_buf_printf(&r->body, "{\"status\":\"degraded\",\"reason\":") ||
            json_str(&r->body, damage) || cp_buf_printf(&r->body, "}\n"))
            oom(r);
    } else if (in.available && in.paused) {
        /* a store write failed: not healthy until ingest is back by itself */
        r->status = 503;
        if (cp_buf_printf(&r->body, "{\"status\":\"paused\",\"reason\":") ||
            json_str(&r->body, in.paused_reason) || cp_buf_printf(&r->body, "}\n"))
            oom(r);
    } else if (in.available && !in.ready) {
        /* the consumer has no partitions yet: what is sent now waits in the broker (and on
         * the embedded one may be dropped), so not ready */
        r->status = 503;
        cp_buf_printf(&r->body, "{\"status\":\"starting\",\"reason\":\"the ingest "
                                "consumer has not been assigned its partitions yet\"}\n");
    } else {
        cp_buf_printf(&r->body, "{\"status\":\"ok\"}\n");
    }
}

static void loop_metrics(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    if (!metrics_allowed(a, req, r)) return;
    ep_metrics(a, r);
    r->compressible = 1;
}

static void loop_offsets(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    if (cp_fanout_is_self(a->o.fanout, req))
        cp_http_error(r, 421, "this node is the asking node itself");
    else if (cp_fanout_is_peer(a->o.fanout, req) || authenticate(a, req, r))
        ep_offsets(a, req, r);
}

static void loop_brokers(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    /* Where to write is for producers holding a token: with tokens configured, a process
     * without one learns nothing from here. */
    if (!authenticate(a, req, r)) return;
    if (cp_buf_printf(&r->body, "{\"brokers\":") || json_str(&r->body, a->brokers) ||
        (a->relay && (cp_buf_printf(&r->body, ",\"relay\":") || json_str(&r->body, a->relay))) ||
        cp_buf_printf(&r->body, "}\n"))
        oom(r);
}

static void loop_ui(cp_api *a, const cp_http_request *req, cp_http_response *r)
{
    (void)a;
    if (!cp_ui_serve(req->path, r)) cp_http_error(r, 404, "unknown path '%.128s'", req->path);
}

/* ---- Pyroscope's ingest (pyro.c) ---------------------------------------------------- */

/* The token of a Basic credential (base64 of user:password): the password, or the user
 * when the password is empty (Grafana's clients put a token in either). Into out (cap
 * bytes); NULL when the header is no Basic credential. */
static const char *basic_token(const char *auth, char *out, size_t cap)
{
    if (!auth || strncasecmp(auth, "Basic ", 6)) return NULL;
    const char *b = auth + 6;
    while (*b == ' ')
        b++;
    size_t n = strcspn(b, " \t\r\n");
    cp_buf d = {0};
    if (cp_pyro_base64(b, n, &d) || !d.len || d.len >= cap || memchr(d.data, 0, d.len)) {
        cp_buf_close(&d);
        return NULL;
    }
    memcpy(out, d.data, d.len);
    out[d.len] = 0;
    cp_buf_close(&d);
    char *colon = strchr(out, ':');
    if (!colon) return out;
    if (colon[1]) return colon + 1;
    *colon = 0;
    return out;
}

#define QUERIER_PREFIX "/querier.v1.QuerierService/"

/* Pyroscope's read side: querier.v1, or the legacy /pyroscope/render and label-values. */
static int is_pyro_read(const char *path)
{
    return !strncmp(path, QUERIER_PREFIX, strlen(QUERIER_PREFIX)) ||
           !strcmp(path, "/pyroscope/render") || !strcmp(path, "/pyroscope/render-diff") ||
           !strcmp(path, "/pyroscope/label-values");
}

static int is_pyro_path(const char *path)
{
    return !strcmp(path, "/ingest") || !strcmp(path, "/pyroscope/ingest") ||
           !strcmp(path, "/push.v1.PusherService/Push") || is_pyro_read(path);
}

/* The tenant of a Pyroscope client: with tokens, a Bearer or Basic credential's; then
 * X-Scope-OrgID, when given, must name that tenant. NULL with the status in *st (401, 403)
 * and why set. */
static const char *pyro_tenant(cp_api *a, const cp_http_request *req, int *st, char *why,
                               size_t cap)
{
    const char *tenant = CP_DEFAULT_TENANT;
    if (a->ntokens) {
        char buf[512];
        size_t n = 0;
        const char *tok = cp_http_bearer(req, &n);
        if (!tok && (tok = basic_token(req->authorization, buf, sizeof buf))) n = strlen(tok);
        tenant = NULL;
        for (size_t i = 0; tok && i < a->ntokens; i++)
            if (cp_http_token_eq(tok, n, a->tokens[i].token) && !tenant)
                tenant = a->tokens[i].tenant;
        if (!tenant) {
            *st = 401;
            snprintf(why, cap, "%s",
                     tok                  ? "invalid token"
                     : req->authorization ? "Authorization is neither a Bearer token nor Basic "
                                            "credentials"
                                          : "missing Authorization (Bearer token or Basic "
                                            "credentials with the token as password)");
            return NULL;
        }
        if (req->org_id && req->org_id[0] && strcmp(req->org_id, tenant)) {
            *st = 403;
            snprintf(why, cap, "X-Scope-OrgID '%.64s' is not this token's tenant '%s'", req->org_id,
                     tenant);
            return NULL;
        }
    }
    return tenant;
}

static void pyro_call(cp_api *a, const cp_http_request *head, cp_http_response *r)
{
    /* the headers pyro.c and querier.c read, "" when a caller left them out */
    cp_http_request rq = *head;
    const cp_http_request *req = &rq;
    if (!rq.content_type) rq.content_type = "";
    if (!rq.content_encoding) rq.content_encoding = "";
    if (!rq.org_id) rq.org_id = "";
    int st = 0, push = !strcmp(req->path, "/push.v1.PusherService/Push");
    char why[200];
    const char *tenant = pyro_tenant(a, req, &st, why, sizeof why);
    int querier = is_pyro_read(req->path);
    if (!tenant) {
        if (!querier) cp_pyro_count(&a->pyro, st);
        if (push || querier) {
            cp_pyro_connect_error(r, st, st == 401 ? "unauthenticated" : "permission_denied", why);
        } else {
            cp_http_error(r, st, "%s", why);
        }
        return;
    }
    if (querier) {
        /* Grafana's read side: the store's readers across the cluster */
        cp_fanout_req fr;
        cp_querier_call qc = {tenant,
                              cp_fanout_req_init(&fr, a->o.fanout, cp_store_reader(a->o.store)),
                              a->o.max_range_ns,
                              a->o.max_blocks,
                              a->o.max_nodes_default,
                              a->o.max_nodes_limit};
        if (!strncmp(req->path, QUERIER_PREFIX, strlen(QUERIER_PREFIX)))
            cp_querier_handle(&qc, req->path + strlen(QUERIER_PREFIX), req, r);
        else
            cp_querier_legacy(&qc, req, r);
        cp_fanout_end(&fr, r);
        return;
    }
    cp_pyro_call c = {tenant, tenant_token(a, tenant), a->o.pyro_produce, a->o.pyro_arg, &a->pyro};
    if (push)
        cp_pyro_push(&c, req, r);
    else
        cp_pyro_ingest(&c, req, r);
}

static const char *const g_none[] = {NULL};
static const char *const g_profile_params[] = {
    "type", "select", "from", "to", "format", "focus", "ignore", "max_nodes", "sample_type", NULL};
static const char *const g_profile_formats[] = {"pprof", "json", "folded", "top", NULL};
static const char *const g_diff_params[] = {
    "type",   "select", "from",   "to",        "base_select", "base_from", "base_to",
    "format", "focus",  "ignore", "max_nodes", "sample_type", NULL};
static const char *const g_diff_formats[] = {"json", "pprof", NULL};
static const char *const g_timeline_params[] = {"type", "select", "from", "to", "step", NULL};
static const char *const g_series_params[] = {"select", "from", "to", "type", NULL};
static const char *const g_symbols_params[] = {"tenant", "name", NULL};
static const char *const g_capture_params[] = {"select", "type",       "duration",
                                               "hz",     "alloc_rate", NULL};

/* Every path: its method, its lane, its handler and, for the store-backed ones, how its
 * query string becomes a query. The one place routing is decided: cp_api_is_light (lanes),
 * cp_api_handle (handlers) and cp_api_observe (the latency histogram) read it. */
typedef struct endpoint {
    const char *path; /* exact, or a prefix when it ends in '/' */
    int ep;           /* EP_*: the histogram's endpoint */
    const char *method;
    int lane; /* CP_HTTP_LANE_*; a store-backed request from a peer goes in its own lane */
    void (*on_loop)(cp_api *a, const cp_http_request *req, cp_http_response *r);
    void (*on_query)(const api_call *c, cp_http_response *r);
    cp_query_form form;
} endpoint;

#define WINDOWED (CP_FORM_KIND | CP_FORM_WINDOW | CP_FORM_SELECT)
static const endpoint g_endpoints[] = {
    {"/api/v1/profile",
     EP_PROFILE,
     "GET",
     CP_HTTP_LANE_HEAVY,
     NULL,
     ep_profile,
     {g_profile_params, g_profile_formats, WINDOWED}},
    {"/api/v1/diff",
     EP_DIFF,
     "GET",
     CP_HTTP_LANE_HEAVY,
     NULL,
     ep_diff,
     {g_diff_params, g_diff_formats, WINDOWED | CP_FORM_BASE}},
    {"/api/v1/timeline",
     EP_TIMELINE,
     "GET",
     CP_HTTP_LANE_HEAVY,
     NULL,
     ep_timeline,
     {g_timeline_params, NULL, WINDOWED | CP_FORM_STEP}},
    /* index reads stay quick whatever the window: their own slots, never behind merges */
    {"/api/v1/series",
     EP_SERIES,
     "GET",
     CP_HTTP_LANE_CHEAP,
     NULL,
     ep_series,
     {g_series_params, NULL, CP_FORM_ANY_KIND | CP_FORM_ALL_TIME | CP_FORM_SELECT}},
    {"/api/v1/labels", EP_LABELS, "GET", CP_HTTP_LANE_CHEAP, NULL, ep_labels, {g_none, NULL, 0}},
    {"/api/v1/labels/", EP_VALUES, "GET", CP_HTTP_LANE_CHEAP, NULL, ep_values, {g_none, NULL, 0}},
    /* an upload is parsed and stored on a worker */
    {"/api/v1/symbols",
     EP_SYMBOLS,
     "POST",
     CP_HTTP_LANE_HEAVY,
     NULL,
     ep_symbols,
     {g_symbols_params, NULL, 0}},
    /* captures: starting and cancelling wait for the control topic; reading one fans
     * out like /api/v1/series */
    {"/api/v1/captures",
     EP_CAPTURES,
     "POST",
     CP_HTTP_LANE_HEAVY,
     NULL,
     ep_capture_post,
     {g_capture_params, NULL, 0}},
    {"/api/v1/captures",
     EP_CAPTURES,
     "GET",
     CP_HTTP_LANE_CHEAP,
     NULL,
     ep_capture_list,
     {g_none, NULL, 0}},
    {"/api/v1/captures/",
     EP_CAPTURES,
     "GET",
     CP_HTTP_LANE_CHEAP,
     NULL,
     ep_capture_get,
     {g_none, NULL, 0}},
    {"/api/v1/captures/",
     EP_CAPTURES,
     "DELETE",
     CP_HTTP_LANE_HEAVY,
     NULL,
     ep_capture_delete,
     {g_none, NULL, 0}},
    /* agents polling for captures (collector/watch.c): this node's records only */
    {"/api/v1/control/captures",
     EP_CAPTURES,
     "GET",
     CP_HTTP_LANE_CHEAP,
     NULL,
     ep_capture_control,
     {g_none, NULL, 0}},
    {"/healthz", EP_OTHER, "GET", CP_HTTP_LANE_LOOP, loop_healthz, NULL, {0}},
    {"/metrics", EP_OTHER, "GET", CP_HTTP_LANE_LOOP, loop_metrics, NULL, {0}},
    {"/api/v1/ingest/offsets", EP_OTHER, "GET", CP_HTTP_LANE_LOOP, loop_offsets, NULL, {0}},
    {"/api/v1/brokers", EP_OTHER, "GET", CP_HTTP_LANE_LOOP, loop_brokers, NULL, {0}},
    /* Pyroscope's ingest: parsed, then produced to Kafka and acknowledged, on a worker */
    {"/ingest", EP_OTHER, "POST", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
    {"/pyroscope/ingest", EP_OTHER, "POST", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
    {"/push.v1.PusherService/Push", EP_OTHER, "POST", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
    /* Grafana's data source: querier.v1 in JSON (querier.c), on a worker like any query */
    {QUERIER_PREFIX, EP_OTHER, "POST", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
    /* and its legacy read API (querier.c) */
    {"/pyroscope/render", EP_OTHER, "GET", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
    {"/pyroscope/render-diff", EP_OTHER, "GET", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
    {"/pyroscope/label-values", EP_OTHER, "GET", CP_HTTP_LANE_HEAVY, pyro_call, NULL, {0}},
};
/* Anything else: the web UI's files, or 404. */
static const endpoint g_ui = {"", EP_OTHER, "GET", CP_HTTP_LANE_LOOP, loop_ui, NULL, {0}};

#define NENDPOINTS (sizeof g_endpoints / sizeof g_endpoints[0])

static int path_is(const endpoint *e, const char *path)
{
    size_t l = strlen(e->path);
    return e->path[l - 1] == '/' ? strncmp(path, e->path, l) == 0 : strcmp(path, e->path) == 0;
}

/* The endpoint of path and method; for a path served under other methods only, the first
 * of them (answered 405). */
static const endpoint *route(const char *path, const char *method)
{
    const endpoint *first = NULL;
    for (size_t i = 0; i < NENDPOINTS; i++) {
        const endpoint *e = &g_endpoints[i];
        if (!path_is(e, path)) continue;
        if (!first) first = e;
        if (strcmp(e->method, method) == 0) return e;
    }
    return first ? first : &g_ui;
}

int cp_api_is_light(void *api, const cp_http_request *req)
{
    const endpoint *e = route(req->path, req->method);
    /* a wrong method is refused at once */
    if (e->lane == CP_HTTP_LANE_LOOP || strcmp(req->method, e->method) != 0)
        return CP_HTTP_LANE_LOOP;
    /* A peer's request for its part (or an upload passed on) never waits on other nodes:
     * its own lane (fanout.h). */
    if (cp_fanout_peer_lane(((cp_api *)api)->o.fanout, req)) return CP_HTTP_LANE_PEER;
    return e->lane;
}

int cp_api_admit(void *api, const cp_http_request *head, char *why, size_t cap)
{
    cp_api *a = api;
    cp_fanout *fo = a->o.fanout;
    if (cp_fanout_is_peer(fo, head)) return 0;
    if (cp_fanout_is_part_request(head)) {
        snprintf(why, cap,
                 "local=1 is a cluster node's part request: it needs Authorization: "
                 "Bearer <cluster.token>");
        return 403;
    }
    if (!a->ntokens) return 0;
    if (is_pyro_path(head->path)) {
        int st = 0;
        if (!pyro_tenant(a, head, &st, why, cap)) {
            if (!is_pyro_read(head->path)) cp_pyro_count(&a->pyro, st);
            snprintf(why + strlen(why), cap - strlen(why), " (the body was not read)");
            return st;
        }
        return 0;
    }
    size_t n = 0;
    const char *h = cp_http_bearer(head, &n);
    for (size_t i = 0; h && i < a->ntokens; i++)
        if (cp_http_token_eq(h, n, a->tokens[i].token)) return 0;
    snprintf(why, cap, "%s (the body was not read)",
             h                     ? "invalid token"
             : head->authorization ? "Authorization header is not a Bearer token"
                                   : "missing Authorization: Bearer token");
    return 401;
}

void cp_api_observe(void *api, const cp_http_request *req, int status, int heavy, double seconds)
{
    cp_api *a = api;
    CP_ASSERT_THREAD(&a->loop_thread, "loop thread only");
    int cls = status / 100;
    if (cls >= 1 && cls <= 5) cp_counter_add(&a->by_class[cls], 1);
    if (!heavy) return;
    int ep = route(req->path, req->method)->ep;
    size_t b = 0;
    while (b < NBUCKETS && seconds > g_buckets[b])
        b++;
    a->hist[ep][b]++;
    a->hist_sum[ep] += seconds;
    a->hist_count[ep]++;
}

/* A store-backed request: the tenant, the query parsed once, the readers across the cluster,
 * the endpoint, and the answer marked partial if a peer was missing. */
static void run_query(cp_api *a, const endpoint *e, const cp_http_request *req, cp_http_response *r)
{
    cp_fanout *fo = a->o.fanout;
    /* a peer asking for its part, or passing an upload on, presents the cluster token and
     * names the tenant */
    const char *tenant = cp_fanout_is_peer(fo, req) ? "" : authenticate(a, req, r);
    if (!tenant) return;
    /* a part request reads or keeps things as a node of the cluster does (capture records
     * as sent): the cluster token's alone, tokens or not (issue 36) */
    if (*tenant && cp_fanout_is_part_request(req)) {
        cp_http_error(r, 403,
                      fo ? "local=1 is a cluster node's part request: it needs Authorization: "
                           "Bearer <cluster.token>"
                         : "local=1 is a cluster node's part request, and this server is in no "
                           "cluster (cluster.peers)");
        return;
    }
    cp_params pa = {0};
    cp_err err = {0};
    if (cp_params_parse(req->query, &pa, &err)) {
        cp_http_error(r, err.code == CP_ENOMEM ? 503 : 400, "%s", err.msg);
        cp_params_close(&pa);
        return;
    }
    if (cp_fanout_is_self(fo, req)) {
        cp_http_error(r, 421, "node %s is the asking node itself", cp_fanout_node(fo));
        cp_params_close(&pa);
        return;
    }
    cp_query_env env = {.tenant = tenant,
                        .now_ns = cp_now_ns(),
                        .deadline_ns = req->deadline_ns,
                        .max_range_ns = a->o.max_range_ns,
                        .max_blocks = a->o.max_blocks,
                        .max_steps = a->o.max_steps};
    cp_query_req qr;
    if (cp_query_parse(&pa, &e->form, &env, &qr, r)) {
        cp_params_close(&pa);
        return;
    }
    cp_http_request rq = *req; /* a peer's request keeps the asking node's deadline */
    rq.deadline_ns = qr.q.lim.deadline_ns;
    cp_fanout_req fr;
    api_call c = {a, &rq, &pa, &qr, cp_fanout_req_init(&fr, fo, cp_store_reader(a->o.store)), &fr};
    r->compressible = 1; /* unset below for answers that are gzip'd pprof already */
    e->on_query(&c, r);
    cp_fanout_end(&fr, r);
    cp_query_req_close(&qr);
    cp_params_close(&pa);
    if (strcmp(r->content_type, "application/octet-stream") == 0) r->compressible = 0;
}

void cp_api_handle(void *api, const cp_http_request *req, cp_http_response *r)
{
    cp_api *a = api;
    const endpoint *e = route(req->path, req->method);
    if (strcmp(req->method, e->method) != 0) {
        char allow[64] = "";
        for (size_t i = 0; i < NENDPOINTS; i++)
            if (path_is(&g_endpoints[i], req->path) && strlen(allow) + 10 < sizeof allow)
                snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s",
                         allow[0] ? ", " : "", g_endpoints[i].method);
        if (!allow[0]) snprintf(allow, sizeof allow, "%s", e->method);
        cp_http_error(r, 405, "method %s not allowed on %.128s (only %s)", req->method, req->path,
                      allow);
        snprintf(r->extra_headers, sizeof r->extra_headers, "Allow: %s\r\n", allow);
        return;
    }
    if (e->on_loop)
        e->on_loop(a, req, r); /* on the loop, or a worker for a heavy one (Pyroscope's) */
    else
        run_query(a, e, req, r);
}
