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
#include "log.h"
#include "merge.h"
#include "params.h"
#include "pprof.h"
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
    EP_OTHER,
    EP_COUNT
};
static const char *const g_ep_names[EP_COUNT] = {"profile", "diff",   "timeline", "series",
                                                 "labels",  "values", "symbols",  "other"};

struct cp_api {
    cp_api_options o;
    char *brokers;
    char *metrics_token; /* NULL: any tenant's token opens /metrics */
    cp_api_token *tokens;
    size_t ntokens;
    /* Metrics, touched only on the loop thread (observe and /metrics; checked in debug
     * builds). */
    cp_thread_owner loop_thread;
    uint64_t hist[EP_COUNT][NBUCKETS + 1];
    double hist_sum[EP_COUNT];
    uint64_t hist_count[EP_COUNT];
    uint64_t by_class[6]; /* 1xx..5xx */
    int64_t started_ns;
};

void cp_api_options_default(cp_api_options *o)
{
    memset(o, 0, sizeof *o);
    o->max_range_ns = 400LL * 86400 * 1000000000LL;
    o->max_nodes_default = 20000;
    o->max_nodes_limit = 200000;
    o->max_steps = 11000;
    o->brokers = "";
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
    return a;
fail:
    cp_api_destroy(a);
    return NULL;
}

void cp_api_destroy(cp_api *a)
{
    if (!a) return;
    for (size_t i = 0; i < a->ntokens; i++) {
        free((char *)a->tokens[i].token);
        free((char *)a->tokens[i].tenant);
    }
    free(a->tokens);
    free(a->brokers);
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

/* ---- routing ------------------------------------------------------------------------ */

static int ep_of(const char *path)
{
    if (strcmp(path, "/api/v1/profile") == 0) return EP_PROFILE;
    if (strcmp(path, "/api/v1/diff") == 0) return EP_DIFF;
    if (strcmp(path, "/api/v1/timeline") == 0) return EP_TIMELINE;
    if (strcmp(path, "/api/v1/series") == 0) return EP_SERIES;
    if (strcmp(path, "/api/v1/labels") == 0) return EP_LABELS;
    if (strncmp(path, "/api/v1/labels/", 15) == 0) return EP_VALUES;
    if (strcmp(path, "/api/v1/symbols") == 0) return EP_SYMBOLS;
    return EP_OTHER;
}

int cp_api_is_light(void *api, const cp_http_request *req)
{
    const cp_fanout *fo = ((cp_api *)api)->o.fanout;
    int ep = ep_of(req->path);
    /* An upload is parsed and stored on a worker; anything else there is refused at once. */
    if (ep == EP_SYMBOLS && strcmp(req->method, "POST") != 0) return CP_HTTP_LANE_LOOP;
    /* an upload passed on by a peer never waits on other nodes either: the peers' lane */
    if (ep == EP_SYMBOLS)
        return cp_fanout_peer_lane(fo, req) ? CP_HTTP_LANE_PEER : CP_HTTP_LANE_HEAVY;
    if (ep == EP_OTHER || strcmp(req->method, "GET") != 0) return CP_HTTP_LANE_LOOP;
    /* A peer's request for its part never waits on other nodes: its own lane (fanout.h). */
    if (cp_fanout_peer_lane(fo, req)) return CP_HTTP_LANE_PEER;
    /* Index reads stay quick whatever the window: their own slots, never behind merges. */
    if (ep == EP_SERIES || ep == EP_LABELS || ep == EP_VALUES) return CP_HTTP_LANE_CHEAP;
    return CP_HTTP_LANE_HEAVY;
}

void cp_api_observe(void *api, const cp_http_request *req, int status, int heavy, double seconds)
{
    cp_api *a = api;
    CP_ASSERT_THREAD(&a->loop_thread, "loop thread only");
    int cls = status / 100;
    if (cls >= 1 && cls <= 5) a->by_class[cls]++;
    if (!heavy) return;
    int ep = ep_of(req->path);
    size_t b = 0;
    while (b < NBUCKETS && seconds > g_buckets[b])
        b++;
    a->hist[ep][b]++;
    a->hist_sum[ep] += seconds;
    a->hist_count[ep]++;
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

/* The common parameters of profile-like endpoints. */
typedef struct qargs {
    cp_kind kind;
    cp_selector sel;
    int64_t from, to;
} qargs;

/* 0 if every parameter in pa is in allowed (NULL-terminated); else -1 with a 400 naming the
 * first unknown one set in r. */
static int check_params(const cp_params *pa, const char *const *allowed, cp_http_response *r)
{
    cp_err err = {0};
    if (!cp_params_check(pa, allowed, &err)) return 0;
    cp_http_error(r, 400, "%s", err.msg);
    return -1;
}

static int parse_kind(const char *s, cp_kind *out, const char *pname, cp_http_response *r)
{
    if (!s || !*s) s = "cpu";
    int k = cp_kind_parse(s);
    if (!k) {
        cp_http_error(r, 400, "unknown %s '%.64s' (expected cpu, alloc or inuse)", pname, s);
        return -1;
    }
    *out = (cp_kind)k;
    return 0;
}

static int parse_selector(const char *s, cp_selector *out, const char *pname, cp_http_response *r)
{
    cp_err err = {0};
    if (cp_selector_parse(s ? s : "", out, &err)) {
        cp_http_error(r, 400, "bad %s: %s", pname, err.msg);
        return -1;
    }
    return 0;
}

/* Parses from/to (names given) with defaults now-1h / now and checks the range. */
static int parse_range(cp_api *a, const char *fs, const char *ts, const char *fname,
                       const char *tname, int64_t now, int64_t *from, int64_t *to,
                       cp_http_response *r)
{
    cp_err err = {0};
    if (!fs || !*fs)
        *from = now - 3600LL * 1000000000LL;
    else if (cp_parse_time(fs, now, from, &err)) {
        cp_http_error(r, 400, "bad %s: %s", fname, err.msg);
        return -1;
    }
    if (!ts || !*ts)
        *to = now;
    else if (cp_parse_time(ts, now, to, &err)) {
        cp_http_error(r, 400, "bad %s: %s", tname, err.msg);
        return -1;
    }
    if (*from > *to) {
        char f[40], t[40];
        cp_format_time(*from, f, sizeof f);
        cp_format_time(*to, t, sizeof t);
        cp_http_error(r, 400, "%s (%s) is after %s (%s)", fname, f, tname, t);
        return -1;
    }
    int64_t span;
    if (__builtin_sub_overflow(*to, *from, &span) || span >= (1LL << 62)) {
        cp_http_error(r, 400, "window %s..%s spans more than 146 years", fname, tname);
        return -1;
    }
    if (a->o.max_range_ns && span > a->o.max_range_ns) {
        cp_http_error(r, 400,
                      "window %s..%s of %.0f s exceeds the longest allowed window of %.0f s", fname,
                      tname, (double)span / 1e9, (double)a->o.max_range_ns / 1e9);
        return -1;
    }
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

static void limits_of(cp_api *a, const cp_http_request *req, cp_query_limits *lim)
{
    lim->max_range_ns = a->o.max_range_ns;
    lim->max_blocks = a->o.max_blocks;
    lim->deadline_ns = req->deadline_ns;
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
 * from the tenant's uploaded symbols and the configured directories. */
static int name_frames(cp_api *a, const char *tenant, cp_profile *p, cp_err *err)
{
    if (!a->o.symbols || !p) return 0;
    if (cp_symbols_name(a->o.symbols, tenant, p, NULL))
        return cp_err_set(err, CP_ENOMEM, "out of memory while naming frames");
    return 0;
}

/* ---- /api/v1/symbols ---------------------------------------------------------------- */

/* POST: the body is an ELF binary or separate debug file; its symbol table is kept for the
 * tenant and names that build ID's frames in every later answer, old windows included. */
static void ep_symbols(cp_api *a, const char *tenant, const cp_params *pa,
                       const cp_http_request *req, cp_http_response *r)
{
    static const char *const allowed[] = {"tenant", NULL};
    cp_err err = {0};
    if (check_params(pa, allowed, r)) return;
    const char *want = cp_params_get(pa, "tenant");
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
                      "empty body: send the ELF file (binary or debug file) as the "
                      "request body");
        return;
    }
    cp_symbols_result res;
    int rc = cp_symbols_upload(a->o.symbols, tenant, req->body, req->body_len, &res, &err);
    if (rc == CP_EPARSE || rc == CP_EINVAL) {
        cp_http_error(r, 400, "%s", err.msg);
        return;
    }
    if (rc == CP_ELIMIT) {
        cp_http_error(r, 413, "%s", err.msg);
        return;
    }
    if (rc) {
        store_error(req, rc, &err, r);
        return;
    }
    cp_log_info("symbols: tenant %s uploaded build ID %s (%u functions, %u lines, %u inlines, "
                "%zu bytes)",
                tenant, res.build_id, res.info.functions, res.info.lines, res.info.inlines,
                res.table_bytes);
    /* every node names frames (each its own part, the asking one after the merge), so every
     * node keeps the table; a node that did not get it makes this answer partial */
    if (cp_fanout_upload(a->o.fanout, "/api/v1/symbols", tenant, req->body, req->body_len,
                         req->deadline_ns, &err)) {
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

static const char *const g_profile_params[] = {
    "type", "select", "from", "to", "format", "focus", "ignore", "max_nodes", "sample_type", NULL};

/* Renders p in format; the profile may be filtered in place. */
static void render_profile(cp_api *a, const cp_params *pa, cp_profile *p, const char *kind,
                           int64_t from, int64_t to, const char *format, const cp_http_request *req,
                           cp_http_response *r)
{
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
        rc = cp_render_tree_json(p, vi, NULL, 0, mn, extra, &r->body);
        set_type(r, "application/json");
    }
    if (rc)
        oom(r);
    else
        over_time(req, "rendering", r);
}

static int parse_format(const char *s, const char *const *allowed, const char **out,
                        cp_http_response *r)
{
    if (!s || !*s) {
        *out = allowed[0];
        return 0;
    }
    for (const char *const *f = allowed; *f; f++)
        if (strcmp(*f, s) == 0) {
            *out = *f;
            return 0;
        }
    char list[96] = "";
    size_t l = 0;
    for (const char *const *f = allowed; *f; f++)
        l += (size_t)snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", *f);
    cp_http_error(r, 400, "unknown format '%.32s' (expected one of %s)", s, list);
    return -1;
}

static void ep_profile(cp_api *a, const char *tenant, const cp_params *pa,
                       const cp_http_request *req, cp_http_response *r)
{
    static const char *const formats[] = {"pprof", "json", "folded", "top", NULL};
    cp_err err = {0};
    if (check_params(pa, g_profile_params, r)) return;
    qargs q = {0};
    const char *format;
    int64_t now = cp_now_ns();
    if (parse_kind(cp_params_get(pa, "type"), &q.kind, "type", r) ||
        parse_format(cp_params_get(pa, "format"), formats, &format, r) ||
        parse_range(a, cp_params_get(pa, "from"), cp_params_get(pa, "to"), "from", "to", now,
                    &q.from, &q.to, r) ||
        parse_selector(cp_params_get(pa, "select"), &q.sel, "select", r))
        return;
    cp_query_limits lim;
    limits_of(a, req, &lim);
    cp_profile *p = NULL;
    int rc = cp_fanout_query(a->o.fanout, a->o.store, tenant, q.kind, &q.sel,
                             cp_params_get(pa, "select"), q.from, q.to, &lim, &p, &err);
    cp_selector_close(&q.sel);
    if (!rc) rc = name_frames(a, tenant, p, &err);
    if (rc) {
        store_error(req, rc, &err, r);
        cp_profile_destroy(p);
        return;
    }
    if (!over_time(req, "merging", r))
        render_profile(a, pa, p, cp_kind_name(q.kind), q.from, q.to, format, req, r);
    cp_profile_destroy(p);
}

/* ---- /api/v1/diff ------------------------------------------------------------------- */

static void ep_diff(cp_api *a, const char *tenant, const cp_params *pa, const cp_http_request *req,
                    cp_http_response *r)
{
    static const char *const allowed[] = {
        "type",   "select", "from",   "to",        "base_select", "base_from", "base_to",
        "format", "focus",  "ignore", "max_nodes", "sample_type", NULL};
    static const char *const formats[] = {"json", "pprof", NULL};
    cp_err err = {0};
    if (check_params(pa, allowed, r)) return;
    cp_kind kind;
    const char *format;
    int64_t now = cp_now_ns(), from, to, bfrom, bto;
    cp_selector sel = {0}, bsel = {0};
    cp_profile *p = NULL, *b = NULL;
    const char *bs = cp_params_get(pa, "base_select");
    const char *bf = cp_params_get(pa, "base_from"), *bt = cp_params_get(pa, "base_to");
    if (parse_kind(cp_params_get(pa, "type"), &kind, "type", r) ||
        parse_format(cp_params_get(pa, "format"), formats, &format, r) ||
        parse_range(a, cp_params_get(pa, "from"), cp_params_get(pa, "to"), "from", "to", now, &from,
                    &to, r) ||
        parse_range(a, bf ? bf : cp_params_get(pa, "from"), bt ? bt : cp_params_get(pa, "to"),
                    "base_from", "base_to", now, &bfrom, &bto, r) ||
        parse_selector(cp_params_get(pa, "select"), &sel, "select", r) ||
        parse_selector(bs ? bs : cp_params_get(pa, "select"), &bsel, "base_select", r))
        goto out;
    cp_query_limits lim;
    limits_of(a, req, &lim);
    int rc = cp_fanout_query(a->o.fanout, a->o.store, tenant, kind, &sel,
                             cp_params_get(pa, "select"), from, to, &lim, &p, &err);
    if (!rc)
        rc = cp_fanout_query(a->o.fanout, a->o.store, tenant, kind, &bsel,
                             bs ? bs : cp_params_get(pa, "select"), bfrom, bto, &lim, &b, &err);
    if (!rc) rc = name_frames(a, tenant, p, &err);
    if (!rc) rc = name_frames(a, tenant, b, &err);
    if (rc) {
        store_error(req, rc, &err, r);
        goto out;
    }
    const char *focus = cp_params_get(pa, "focus"), *ignore = cp_params_get(pa, "ignore");
    if (cp_render_filter_until(p, focus, ignore, req->deadline_ns, &err) ||
        cp_render_filter_until(b, focus, ignore, req->deadline_ns, &err)) {
        if (!over_time(req, "filtering with focus/ignore", r)) cp_http_error(r, 400, "%s", err.msg);
        goto out;
    }
    if (strcmp(format, "pprof") == 0) {
        /* pprof's -base: the target merged with the base scaled by -1. */
        cp_merger *m = cp_merger_create();
        cp_profile *d = NULL;
        if (!m) {
            oom(r);
            goto out;
        }
        rc = cp_merger_add(m, p, &err);
        if (!rc) rc = cp_merger_add_scaled(m, b, -1, &err);
        if (!rc) d = cp_merger_finish(m);
        cp_merger_destroy(m);
        if (rc) {
            cp_http_error(r, 400, "cannot diff: %s", err.msg);
            goto out;
        }
        if (!d) {
            oom(r);
            goto out;
        }
        if (over_time(req, "merging the diff", r)) {
            cp_profile_destroy(d);
            goto out;
        }
        d->time_nanos = from;
        d->duration_nanos = to - from;
        rc = cp_pprof_encode(d, 1, &r->body);
        cp_profile_destroy(d);
        if (rc) {
            oom(r);
            goto out;
        }
        set_type(r, "application/octet-stream");
        snprintf(r->extra_headers, sizeof r->extra_headers,
                 "Content-Disposition: attachment; filename=\"%s-diff.pb.gz\"\r\n",
                 cp_kind_name(kind));
        goto out;
    }
    int vi = 0, bvi = 0;
    const char *st = cp_params_get(pa, "sample_type");
    if (cp_render_value_index(p, st, &vi, &err) || cp_render_value_index(b, st, &bvi, &err)) {
        cp_http_error(r, 400, "%s", err.msg);
        goto out;
    }
    uint32_t mn;
    if (parse_max_nodes(a, cp_params_get(pa, "max_nodes"), a->o.max_nodes_default, &mn, r))
        goto out;
    char f[40], t[40], f2[40], t2[40], extra[320];
    cp_format_time(from, f, sizeof f);
    cp_format_time(to, t, sizeof t);
    cp_format_time(bfrom, f2, sizeof f2);
    cp_format_time(bto, t2, sizeof t2);
    snprintf(extra, sizeof extra,
             "\"type\":\"%s\",\"from\":\"%s\",\"to\":\"%s\",\"base_from\":\"%s\",\"base_to\":"
             "\"%s\",",
             cp_kind_name(kind), f, t, f2, t2);
    if (cp_render_tree_json(p, vi, b, bvi, mn, extra, &r->body))
        oom(r);
    else
        over_time(req, "rendering", r);
out:
    cp_selector_close(&sel);
    cp_selector_close(&bsel);
    cp_profile_destroy(p);
    cp_profile_destroy(b);
}

/* ---- /api/v1/timeline --------------------------------------------------------------- */

static void kind_types(cp_kind k, uint32_t i, const char **type, const char **unit)
{
    static const char *const names[3][2][2] = {
        {{"samples", "count"}, {"cpu", "nanoseconds"}},
        {{"alloc_objects", "count"}, {"alloc_space", "bytes"}},
        {{"inuse_objects", "count"}, {"inuse_space", "bytes"}},
    };
    if (k >= CP_KIND_CPU && k <= CP_KIND_INUSE && i < 2) {
        *type = names[k - 1][i][0];
        *unit = names[k - 1][i][1];
    } else {
        *type = "value";
        *unit = "count";
    }
}

static void ep_timeline(cp_api *a, const char *tenant, const cp_params *pa,
                        const cp_http_request *req, cp_http_response *r)
{
    static const char *const allowed[] = {"type", "select", "from", "to", "step", NULL};
    cp_err err = {0};
    if (check_params(pa, allowed, r)) return;
    qargs q = {0};
    int64_t now = cp_now_ns(), step = 0;
    if (parse_kind(cp_params_get(pa, "type"), &q.kind, "type", r) ||
        parse_range(a, cp_params_get(pa, "from"), cp_params_get(pa, "to"), "from", "to", now,
                    &q.from, &q.to, r))
        return;
    const char *ss = cp_params_get(pa, "step");
    if (ss && *ss) {
        if (cp_parse_duration(ss, 0, &step, &err)) {
            cp_http_error(r, 400, "bad step: %s", err.msg);
            return;
        }
    } else {
        /* About 300 points, in whole multiples of the 10 s window. */
        int64_t w = 10LL * 1000000000LL;
        step = (q.to - q.from) / 300;
        step = step <= w ? w : (step + w - 1) / w * w;
    }
    if (q.to > q.from && (q.to - q.from) / step >= (int64_t)a->o.max_steps) {
        cp_http_error(r, 400, "step %.3f s gives more than %u points for this window",
                      (double)step / 1e9, a->o.max_steps);
        return;
    }
    if (parse_selector(cp_params_get(pa, "select"), &q.sel, "select", r)) return;
    cp_query_limits lim;
    limits_of(a, req, &lim);
    int64_t *vals = NULL;
    uint32_t nsteps = 0, ntypes = 0;
    int rc = cp_fanout_timeline(a->o.fanout, a->o.store, tenant, q.kind, &q.sel,
                                cp_params_get(pa, "select"), q.from, q.to, step, &lim, &vals,
                                &nsteps, &ntypes, &err);
    cp_selector_close(&q.sel);
    if (rc) {
        store_error(req, rc, &err, r);
        return;
    }
    char f[40], t[40];
    cp_format_time(q.from, f, sizeof f);
    cp_format_time(q.to, t, sizeof t);
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b,
                       "{\"type\":\"%s\",\"from\":\"%s\",\"to\":\"%s\",\"step_seconds\":%.3f,"
                       "\"sample_types\":[",
                       cp_kind_name(q.kind), f, t, (double)step / 1e9);
    for (uint32_t i = 0; !rc && i < ntypes; i++) {
        const char *ty, *un;
        kind_types(q.kind, i, &ty, &un);
        rc = cp_buf_printf(b, "%s{\"type\":\"%s\",\"unit\":\"%s\"}", i ? "," : "", ty, un);
    }
    if (!rc) rc = cp_buf_printf(b, "],\"points\":[");
    for (uint32_t s = 0; !rc && s < nsteps; s++) {
        int64_t ts = q.from + (int64_t)s * step;
        rc = cp_buf_printf(b, "%s[%.3f", s ? "," : "", (double)ts / 1e9);
        for (uint32_t i = 0; !rc && i < ntypes; i++)
            rc = cp_buf_printf(b, ",%" PRId64, vals[(size_t)s * ntypes + i]);
        if (!rc) rc = cp_buf_append(b, "]", 1);
    }
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    free(vals);
    if (rc) oom(r);
}

/* ---- /api/v1/series, labels, values ------------------------------------------------- */

static void ep_series(cp_api *a, const char *tenant, const cp_params *pa,
                      const cp_http_request *req, cp_http_response *r)
{
    static const char *const allowed[] = {"select", "from", "to", "type", NULL};
    cp_err err = {0};
    if (check_params(pa, allowed, r)) return;
    /* Default: all of time the store accepts (2^62 ns is year 2116). */
    int64_t now = cp_now_ns(), from = 0, to = (1LL << 62) - 1;
    const char *fs = cp_params_get(pa, "from"), *ts = cp_params_get(pa, "to");
    if (fs && *fs && cp_parse_time(fs, now, &from, &err)) {
        cp_http_error(r, 400, "bad from: %s", err.msg);
        return;
    }
    if (ts && *ts && cp_parse_time(ts, now, &to, &err)) {
        cp_http_error(r, 400, "bad to: %s", err.msg);
        return;
    }
    if (from > to) {
        cp_http_error(r, 400, "from is after to");
        return;
    }
    cp_kind kind = 0;
    const char *tys = cp_params_get(pa, "type");
    if (tys && *tys && parse_kind(tys, &kind, "type", r)) return;
    cp_selector sel = {0};
    if (parse_selector(cp_params_get(pa, "select"), &sel, "select", r)) return;
    cp_series_list l = {0};
    int rc = cp_fanout_series(a->o.fanout, a->o.store, tenant, &sel, cp_params_get(pa, "select"),
                              from, to, req->deadline_ns, &l, &err);
    cp_selector_close(&sel);
    if (rc) {
        store_error(req, rc, &err, r);
        return;
    }
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b, "{\"series\":[");
    uint32_t shown = 0;
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        const cp_series_info *s = &l.v[i];
        if (kind && s->kind != kind) continue;
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
        if (!rc) rc = cp_buf_printf(b, "},\"first\":\"%s\",\"last\":\"%s\"}", f, t);
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

static void ep_labels(cp_api *a, const char *tenant, const cp_params *pa,
                      const cp_http_request *req, cp_http_response *r)
{
    static const char *const allowed[] = {NULL};
    cp_err err = {0};
    if (check_params(pa, allowed, r)) return;
    cp_string_list l = {0};
    int rc = cp_fanout_labels(a->o.fanout, a->o.store, tenant, NULL, req->deadline_ns, &l, &err);
    if (rc)
        store_error(req, rc, &err, r);
    else
        string_list_json("labels", NULL, &l, r);
    cp_string_list_close(&l);
}

static void ep_values(cp_api *a, const char *tenant, const cp_params *pa,
                      const cp_http_request *req, cp_http_response *r)
{
    static const char *const allowed[] = {NULL};
    cp_err err = {0};
    if (check_params(pa, allowed, r)) return;
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
    cp_string_list l = {0};
    int rc = cp_fanout_labels(a->o.fanout, a->o.store, tenant, name, req->deadline_ns, &l, &err);
    if (rc)
        store_error(req, rc, &err, r);
    else
        string_list_json("values", name, &l, r);
    cp_string_list_close(&l);
}

/* ---- light endpoints ---------------------------------------------------------------- */

static void ep_metrics(cp_api *a, cp_http_response *r)
{
    CP_ASSERT_THREAD(&a->loop_thread, "loop thread only");
    cp_buf *b = &r->body;
    int rc = 0;
    set_type(r, "text/plain; version=0.0.4; charset=utf-8");
#define P(...)                                                                                     \
    if (!rc) rc = cp_buf_printf(b, __VA_ARGS__)
    P("# HELP contprof_http_responses_total HTTP responses by status class.\n"
      "# TYPE contprof_http_responses_total counter\n");
    for (int c = 1; c <= 5; c++)
        P("contprof_http_responses_total{code=\"%dxx\"} %" PRIu64 "\n", c, a->by_class[c]);
    P("# HELP contprof_query_duration_seconds Time to answer store-backed queries, arrival to "
      "response.\n# TYPE contprof_query_duration_seconds histogram\n");
    for (int ep = 0; ep < EP_OTHER; ep++) {
        uint64_t cum = 0;
        for (size_t i = 0; i < NBUCKETS; i++) {
            cum += a->hist[ep][i];
            P("contprof_query_duration_seconds_bucket{endpoint=\"%s\",le=\"%g\"} %" PRIu64 "\n",
              g_ep_names[ep], g_buckets[i], cum);
        }
        cum += a->hist[ep][NBUCKETS];
        P("contprof_query_duration_seconds_bucket{endpoint=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
          g_ep_names[ep], cum);
        P("contprof_query_duration_seconds_sum{endpoint=\"%s\"} %.6f\n", g_ep_names[ep],
          a->hist_sum[ep]);
        P("contprof_query_duration_seconds_count{endpoint=\"%s\"} %" PRIu64 "\n", g_ep_names[ep],
          a->hist_count[ep]);
    }
    if (!rc && a->o.metrics) rc = cp_metrics_write(a->o.metrics, b);
    P("# HELP contprof_uptime_seconds Seconds since the query API started.\n"
      "# TYPE contprof_uptime_seconds gauge\ncontprof_uptime_seconds %.0f\n",
      (double)(cp_now_ns() - a->started_ns) / 1e9);
#undef P
    if (!rc) rc = cp_fanout_metrics(a->o.fanout, b);
    if (rc) oom(r);
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
                           ",\"max_in_flight_bytes\":%" PRIu64 ",\"partitions\":[",
                           in.running ? "true" : "false", in.ready ? "true" : "false",
                           in.max_message_bytes, in.max_in_flight_bytes);
    for (uint32_t i = 0; i < in.nparts && !rc; i++) {
        const cp_api_partition *p = &in.parts[i];
        rc = cp_buf_printf(b,
                           "%s{\"partition\":%d,\"stored\":%" PRId64 ",\"known_from\":%" PRId64
                           ",\"lost\":%" PRIu64 ",\"not_stored\":[",
                           i ? "," : "", p->partition, p->stored, p->known_from, p->lost);
        for (uint32_t k = 0; k < p->nranges && k < CP_API_RANGES && !rc; k++) {
            rc = cp_buf_printf(b,
                               "%s{\"from\":%" PRId64 ",\"to\":%" PRId64 ",\"why\":", k ? "," : "",
                               p->not_stored[k].from, p->not_stored[k].to);
            if (!rc) rc = json_str(b, p->not_stored[k].why ? p->not_stored[k].why : "");
            if (!rc) rc = cp_buf_printf(b, "}");
        }
        if (!rc) rc = cp_buf_printf(b, "]}");
    }
    if (!rc) rc = cp_fanout_offsets(a->o.fanout, req, r, in.nparts > 0); /* a cluster's */
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    if (rc) oom(r);
}

/* ---- dispatch ----------------------------------------------------------------------- */

void cp_api_handle(void *api, const cp_http_request *req, cp_http_response *r)
{
    cp_api *a = api;
    int ep = ep_of(req->path);
    if (ep == EP_SYMBOLS && strcmp(req->method, "POST") != 0) {
        cp_http_error(r, 405, "method %s not allowed on %.128s (only POST)", req->method,
                      req->path);
        snprintf(r->extra_headers, sizeof r->extra_headers, "Allow: POST\r\n");
        return;
    }
    if (ep != EP_SYMBOLS && strcmp(req->method, "GET") != 0) {
        cp_http_error(r, 405, "method %s not allowed on %.128s (only GET)", req->method, req->path);
        snprintf(r->extra_headers, sizeof r->extra_headers, "Allow: GET\r\n");
        return;
    }
    if (ep == EP_OTHER) {
        if (strcmp(req->path, "/healthz") == 0) {
            cp_api_ingest_stats in = {0};
            if (a->o.ingest_stats) a->o.ingest_stats(a->o.ingest_arg, &in);
            if (in.available && in.paused) {
                /* a store write failed: not healthy until ingest is back by itself */
                r->status = 503;
                if (cp_buf_printf(&r->body, "{\"status\":\"paused\",\"reason\":") ||
                    json_str(&r->body, in.paused_reason) || cp_buf_printf(&r->body, "}\n"))
                    oom(r);
            } else if (in.available && !in.ready) {
                /* the consumer has no partitions yet: what is sent now waits in the broker
                 * (and on the embedded one may be dropped), so not ready */
                r->status = 503;
                cp_buf_printf(&r->body, "{\"status\":\"starting\",\"reason\":\"the ingest "
                                        "consumer has not been assigned its partitions yet\"}\n");
            } else {
                cp_buf_printf(&r->body, "{\"status\":\"ok\"}\n");
            }
        } else if (strcmp(req->path, "/metrics") == 0) {
            if (!metrics_allowed(a, req, r)) return;
            ep_metrics(a, r);
            r->compressible = 1;
        } else if (strcmp(req->path, "/api/v1/ingest/offsets") == 0) {
            if (cp_fanout_is_self(a->o.fanout, req))
                cp_http_error(r, 421, "this node is the asking node itself");
            else if (cp_fanout_is_peer(a->o.fanout, req) || authenticate(a, req, r))
                ep_offsets(a, req, r);
        } else if (strcmp(req->path, "/api/v1/brokers") == 0) {
            /* Where to write is for producers holding a token: with tokens configured, a
             * process without one learns nothing from here. */
            if (!authenticate(a, req, r)) return;
            if (cp_buf_printf(&r->body, "{\"brokers\":") || json_str(&r->body, a->brokers) ||
                cp_buf_printf(&r->body, "}\n"))
                oom(r);
        } else if (!cp_ui_serve(req->path, r)) {
            cp_http_error(r, 404, "unknown path '%.128s'", req->path);
        }
        return;
    }
    /* a peer asking for its part, or passing an upload on, presents the cluster token and
     * names the tenant */
    const char *tenant = cp_fanout_is_peer(a->o.fanout, req) ? "" : authenticate(a, req, r);
    if (!tenant) return;
    cp_params pa = {0};
    cp_err err = {0};
    if (cp_params_parse(req->query, &pa, &err)) {
        cp_http_error(r, err.code == CP_ENOMEM ? 503 : 400, "%s", err.msg);
        cp_params_close(&pa);
        return;
    }
    if (cp_fanout_begin(a->o.fanout, &pa, &tenant, r)) {
        cp_params_close(&pa);
        return;
    }
    cp_http_request rq = *req; /* a peer's request keeps the asking node's deadline */
    rq.deadline_ns = cp_fanout_deadline(req->deadline_ns);
    req = &rq;
    r->compressible = 1; /* unset below for answers that are gzip'd pprof already */
    switch (ep) {
    case EP_PROFILE:
        ep_profile(a, tenant, &pa, req, r);
        break;
    case EP_DIFF:
        ep_diff(a, tenant, &pa, req, r);
        break;
    case EP_TIMELINE:
        ep_timeline(a, tenant, &pa, req, r);
        break;
    case EP_SERIES:
        ep_series(a, tenant, &pa, req, r);
        break;
    case EP_LABELS:
        ep_labels(a, tenant, &pa, req, r);
        break;
    case EP_VALUES:
        ep_values(a, tenant, &pa, req, r);
        break;
    case EP_SYMBOLS:
        ep_symbols(a, tenant, &pa, req, r);
        break;
    }
    cp_fanout_end(a->o.fanout, r);
    cp_params_close(&pa);
    if (strcmp(r->content_type, "application/octet-stream") == 0) r->compressible = 0;
}
