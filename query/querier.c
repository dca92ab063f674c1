/* querier.v1 over Connect (querier.h): requests read with the JSON reader (application/json)
 * or decoded by the schemas below into the same tree (application/proto), answered from the
 * readers; SelectMergeStacktraces as Pyroscope's FlameGraph (levels of 4-int groups). */
#include "querier.h"
#include "json.h"
#include "pbjson.h"
#include "params.h"
#include "pprof.h"
#include "pyro.h"
#include "times.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Every profile type ID served: a kind and one of its sample types. */
static const struct ptype {
    cp_kind kind;
    const char *id, *sample_type;
} g_types[] = {
    {CP_KIND_CPU, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", "cpu"},
    {CP_KIND_CPU, "process_cpu:samples:count:cpu:nanoseconds", "samples"},
    {CP_KIND_WALL, "wall:wall:nanoseconds:wall:nanoseconds", "wall"},
    {CP_KIND_WALL, "wall:samples:count:wall:nanoseconds", "samples"},
    {CP_KIND_ALLOC, "memory:alloc_objects:count:space:bytes", "alloc_objects"},
    {CP_KIND_ALLOC, "memory:alloc_space:bytes:space:bytes", "alloc_space"},
    {CP_KIND_INUSE, "memory:inuse_objects:count:space:bytes", "inuse_objects"},
    {CP_KIND_INUSE, "memory:inuse_space:bytes:space:bytes", "inuse_space"},
    {CP_KIND_MUTEX, "mutex:contentions:count:contentions:count", "contentions"},
    {CP_KIND_MUTEX, "mutex:delay:nanoseconds:contentions:count", "delay"},
    {CP_KIND_BLOCK, "block:contentions:count:contentions:count", "contentions"},
    {CP_KIND_BLOCK, "block:delay:nanoseconds:contentions:count", "delay"},
    {CP_KIND_GOROUTINES, "goroutines:goroutine:count:goroutine:count", "goroutine"},
};
#define NTYPES (sizeof g_types / sizeof g_types[0])

int cp_querier_profile_type(const char *id, cp_kind *kind, const char **sample_type)
{
    for (size_t i = 0; id && i < NTYPES; i++)
        if (!strcmp(g_types[i].id, id)) {
            *kind = g_types[i].kind;
            *sample_type = g_types[i].sample_type;
            return 0;
        }
    return CP_EINVAL;
}

#define connect_error cp_pyro_connect_error

/* ---- querier.v1 and types.v1 on the wire ---------------------------------------------- */

/* The field numbers served, from the public protocol description (query/README.md
 * "Pyroscope"); names are proto3 JSON's, what the JSON handlers read and write:
 *
 * | message                                   | fields                                       |
 * | types.v1.LabelPair                        | 1 name, 2 value                              |
 * | types.v1.ProfileType                      | 1 ID, 2 name, 4 sample_type, 5 sample_unit,  |
 * |                                           | 6 period_type, 7 period_unit (3 unused)      |
 * | types.v1.Point                            | 1 value (double), 2 timestamp (int64 ms)     |
 * | types.v1.Series                           | 1 labels (LabelPair), 2 points (Point)       |
 * | types.v1.LabelNamesRequest                | 1 matchers, 2 start, 3 end                   |
 * | types.v1.LabelNamesResponse, LabelValuesResponse | 1 names                               |
 * | types.v1.LabelValuesRequest               | 1 name, 2 matchers, 3 start, 4 end           |
 * | querier.v1.ProfileTypesRequest            | 1 start, 2 end                               |
 * | querier.v1.ProfileTypesResponse           | 1 profile_types (ProfileType)                |
 * | querier.v1.SelectMergeStacktracesRequest  | 1 profile_typeID, 2 label_selector, 3 start, |
 * |                                           | 4 end, 5 max_nodes, 6 format (enum),         |
 * |                                           | 7 stack_trace_selector                       |
 * | types.v1.StackTraceSelector               | 1 call_site (Location), 2 go_pgo (GoPGO)     |
 * | types.v1.Location                         | 1 name                                       |
 * | types.v1.GoPGO                            | 1 keep_locations, 2 aggregate_callees        |
 * | querier.v1.SelectMergeStacktracesResponse | 1 flamegraph (FlameGraph)                    |
 * | querier.v1.FlameGraph                     | 1 names, 2 levels (Level), 3 total,          |
 * |                                           | 4 max_self                                   |
 * | querier.v1.Level                          | 1 values (packed int64)                      |
 * | querier.v1.SelectSeriesRequest            | 1 profile_typeID, 2 label_selector, 3 start, |
 * |                                           | 4 end, 5 group_by, 6 step (double s),        |
 * |                                           | 7 aggregation (enum, SUM 0),                 |
 * |                                           | 8 stack_trace_selector, 9 limit              |
 * | querier.v1.SelectSeriesResponse           | 1 series (Series)                            |
 * | querier.v1.SeriesRequest                  | 1 matchers, 2 label_names, 3 start, 4 end    |
 * | querier.v1.SeriesResponse                 | 2 labels_set (types.v1.Labels{1 labels})     |
 * | querier.v1.SelectMergeProfileRequest      | 1 profile_typeID, 2 label_selector, 3 start, |
 * |                                           | 4 end, 5 max_nodes (read, not applied),      |
 * |                                           | 6 stack_trace_selector (its answer:          |
 * |                                           | google.v1.Profile, pprof)                    |
 * | querier.v1.DiffRequest                    | 1 left, 2 right (SelectMergeStacktracesReq.) |
 * | querier.v1.DiffResponse                   | 1 flamegraph (FlameGraphDiff)                |
 * | querier.v1.FlameGraphDiff                 | 1 names, 2 levels (Level: 7-int groups),     |
 * |                                           | 3 total, 4 max_self, 5 leftTicks,            |
 * |                                           | 6 rightTicks                                 |
 * | types.v1.GetProfileStatsRequest           | (none)                                       |
 * | types.v1.GetProfileStatsResponse          | 1 data_ingested (bool), 2 oldest_profile_time|
 * |                                           | 3 newest_profile_time (int64 ms)             |
 *
 * start and end are int64 milliseconds. Fields not listed are skipped when read. */
#define F(n, name, t, rep, m)                                                                      \
    {                                                                                              \
        n, name, CP_PBJ_##t, rep, m                                                                \
    }
#define MSG(var, pname, ...)                                                                       \
    static const cp_pbj_field var##_f[] = {__VA_ARGS__};                                           \
    static const cp_pbj_msg var = {pname, var##_f, sizeof var##_f / sizeof var##_f[0]}

MSG(pb_label_pair, "types.v1.LabelPair", F(1, "name", STRING, 0, NULL),
    F(2, "value", STRING, 0, NULL));
MSG(pb_profile_type, "types.v1.ProfileType", F(1, "ID", STRING, 0, NULL),
    F(2, "name", STRING, 0, NULL), F(4, "sampleType", STRING, 0, NULL),
    F(5, "sampleUnit", STRING, 0, NULL), F(6, "periodType", STRING, 0, NULL),
    F(7, "periodUnit", STRING, 0, NULL));
MSG(pb_point, "types.v1.Point", F(1, "value", DOUBLE, 0, NULL), F(2, "timestamp", INT64, 0, NULL));
MSG(pb_series, "types.v1.Series", F(1, "labels", MSG, 1, &pb_label_pair),
    F(2, "points", MSG, 1, &pb_point));
MSG(pb_names_req, "types.v1.LabelNamesRequest", F(1, "matchers", STRING, 1, NULL),
    F(2, "start", INT64, 0, NULL), F(3, "end", INT64, 0, NULL));
MSG(pb_names_resp, "types.v1.LabelNamesResponse", F(1, "names", STRING, 1, NULL));
MSG(pb_values_req, "types.v1.LabelValuesRequest", F(1, "name", STRING, 0, NULL),
    F(2, "matchers", STRING, 1, NULL), F(3, "start", INT64, 0, NULL), F(4, "end", INT64, 0, NULL));
MSG(pb_types_req, "querier.v1.ProfileTypesRequest", F(1, "start", INT64, 0, NULL),
    F(2, "end", INT64, 0, NULL));
MSG(pb_types_resp, "querier.v1.ProfileTypesResponse",
    F(1, "profileTypes", MSG, 1, &pb_profile_type));
MSG(pb_location, "types.v1.Location", F(1, "name", STRING, 0, NULL));
MSG(pb_go_pgo, "types.v1.GoPGO", F(1, "keepLocations", INT64, 0, NULL),
    F(2, "aggregateCallees", BOOL, 0, NULL));
MSG(pb_sts, "types.v1.StackTraceSelector", F(1, "callSite", MSG, 1, &pb_location),
    F(2, "goPgo", MSG, 0, &pb_go_pgo));
MSG(pb_sms_req, "querier.v1.SelectMergeStacktracesRequest", F(1, "profileTypeID", STRING, 0, NULL),
    F(2, "labelSelector", STRING, 0, NULL), F(3, "start", INT64, 0, NULL),
    F(4, "end", INT64, 0, NULL), F(5, "maxNodes", INT64, 0, NULL), F(6, "format", ENUM, 0, NULL),
    F(7, "stackTraceSelector", MSG, 0, &pb_sts));
MSG(pb_level, "querier.v1.Level", F(1, "values", INT64, 1, NULL));
MSG(pb_flamegraph, "querier.v1.FlameGraph", F(1, "names", STRING, 1, NULL),
    F(2, "levels", MSG, 1, &pb_level), F(3, "total", INT64, 0, NULL),
    F(4, "maxSelf", INT64, 0, NULL));
MSG(pb_sms_resp, "querier.v1.SelectMergeStacktracesResponse",
    F(1, "flamegraph", MSG, 0, &pb_flamegraph));
MSG(pb_ss_req, "querier.v1.SelectSeriesRequest", F(1, "profileTypeID", STRING, 0, NULL),
    F(2, "labelSelector", STRING, 0, NULL), F(3, "start", INT64, 0, NULL),
    F(4, "end", INT64, 0, NULL), F(5, "groupBy", STRING, 1, NULL), F(6, "step", DOUBLE, 0, NULL),
    F(7, "aggregation", ENUM, 0, NULL), F(8, "stackTraceSelector", MSG, 0, &pb_sts),
    F(9, "limit", INT64, 0, NULL));
MSG(pb_ss_resp, "querier.v1.SelectSeriesResponse", F(1, "series", MSG, 1, &pb_series));
MSG(pb_series_req, "querier.v1.SeriesRequest", F(1, "matchers", STRING, 1, NULL),
    F(2, "labelNames", STRING, 1, NULL), F(3, "start", INT64, 0, NULL),
    F(4, "end", INT64, 0, NULL));
MSG(pb_labels, "types.v1.Labels", F(1, "labels", MSG, 1, &pb_label_pair));
MSG(pb_series_resp, "querier.v1.SeriesResponse", F(2, "labelsSet", MSG, 1, &pb_labels));
MSG(pb_smp_req, "querier.v1.SelectMergeProfileRequest", F(1, "profileTypeID", STRING, 0, NULL),
    F(2, "labelSelector", STRING, 0, NULL), F(3, "start", INT64, 0, NULL),
    F(4, "end", INT64, 0, NULL), F(5, "maxNodes", INT64, 0, NULL),
    F(6, "stackTraceSelector", MSG, 0, &pb_sts));
MSG(pb_diff_req, "querier.v1.DiffRequest", F(1, "left", MSG, 0, &pb_sms_req),
    F(2, "right", MSG, 0, &pb_sms_req));
MSG(pb_fgdiff, "querier.v1.FlameGraphDiff", F(1, "names", STRING, 1, NULL),
    F(2, "levels", MSG, 1, &pb_level), F(3, "total", INT64, 0, NULL),
    F(4, "maxSelf", INT64, 0, NULL), F(5, "leftTicks", INT64, 0, NULL),
    F(6, "rightTicks", INT64, 0, NULL));
MSG(pb_diff_resp, "querier.v1.DiffResponse", F(1, "flamegraph", MSG, 0, &pb_fgdiff));
static const cp_pbj_msg pb_stats_req = {"types.v1.GetProfileStatsRequest", NULL, 0};
MSG(pb_stats_resp, "types.v1.GetProfileStatsResponse", F(1, "dataIngested", BOOL, 0, NULL),
    F(2, "oldestProfileTime", INT64, 0, NULL), F(3, "newestProfileTime", INT64, 0, NULL));
#undef F
#undef MSG

static void store_failed(cp_http_response *r, int rc, const cp_err *err)
{
    const char *m = err->msg[0] ? err->msg : cp_strerror(rc);
    if (rc == CP_EINVAL || rc == CP_EPARSE)
        connect_error(r, 400, "invalid_argument", m);
    else if (rc == CP_ELIMIT)
        connect_error(r, 429, "resource_exhausted", m);
    else
        connect_error(r, 503, "unavailable", m);
}

/* A member by its camelCase or original name. */
static const cp_json *member(const cp_json *o, const char *camel, const char *orig)
{
    const cp_json *v = cp_json_get(o, camel);
    return v ? v : cp_json_get(o, orig);
}

/* int64 in proto3 JSON: a number or a string of digits. 0 with *out, or -1. */
static int json_i64(const cp_json *v, int64_t dflt, int64_t *out)
{
    *out = dflt;
    if (!v || v->type == CP_JSON_NULL) return 0;
    if (v->type == CP_JSON_NUMBER && v->is_int) {
        *out = v->i64;
        return 0;
    }
    if (v->type == CP_JSON_STRING && v->str[0]) {
        char *end;
        long long x = strtoll(v->str, &end, 10);
        if (*end) return -1;
        *out = x;
        return 0;
    }
    return -1;
}

#define TYPES_ALL ((1u << NTYPES) - 1)
#define CP_MAX_CALL_SITE 256 /* locations in a stack_trace_selector's call_site */

/* The index in g_types of a profile type ID, or -1. */
static int type_index(const char *id)
{
    for (size_t i = 0; id && i < NTYPES; i++)
        if (!strcmp(g_types[i].id, id)) return (int)i;
    return -1;
}

/* v quoted for a selector: raw in backticks (exactly as long) unless it holds one, else in
 * double quotes with its quotes, backslashes and control characters escaped. */
static int quoted_out(cp_buf *b, const char *v)
{
    if (!strchr(v, '`')) return cp_buf_printf(b, "`%s`", v) ? CP_ENOMEM : 0;
    int rc = cp_buf_append(b, "\"", 1);
    for (; !rc && *v; v++)
        rc = *v == '"' || *v == '\\' ? cp_buf_printf(b, "\\%c", *v)
             : *v == '\n'            ? cp_buf_append(b, "\\n", 2)
             : *v == '\r'            ? cp_buf_append(b, "\\r", 2)
             : *v == '\t'            ? cp_buf_append(b, "\\t", 2)
                                     : cp_buf_append(b, v, 1);
    return rc || cp_buf_append(b, "\"", 1) ? CP_ENOMEM : 0;
}

/* The selector text of cp_querier_selector (querier.h). */
int cp_querier_selector(const char *in, cp_buf *out, uint32_t *types, cp_err *err)
{
    cp_selector sel = {0};
    *types = TYPES_ALL;
    out->len = 0;
    int rc = cp_selector_parse(in, &sel, err);
    static const char *const ops[] = {"=", "!=", "=~", "!~"};
    if (!rc) rc = cp_buf_append(out, "{", 1);
    int n = 0;
    for (uint32_t i = 0; !rc && i < sel.n; i++) {
        const cp_matcher *m = &sel.m[i];
        if (!strcmp(m->name, "__profile_type__") || !strcmp(m->name, "__name__")) {
            int whole = m->name[2] == 'p';
            for (size_t t = 0; t < NTYPES; t++) {
                char name[32];
                snprintf(name, sizeof name, "%.*s", (int)strcspn(g_types[t].id, ":"),
                         g_types[t].id);
                if (!cp_matcher_match(m, whole ? g_types[t].id : name)) *types &= ~(1u << t);
            }
            continue;
        }
        const char *nm = strcmp(m->name, "service_name") ? m->name : "service";
        rc = cp_buf_printf(out, "%s%s%s", n++ ? "," : "", nm, ops[m->op]) ||
             quoted_out(out, m->value);
    }
    if (!rc) rc = cp_buf_append(out, "}", 2) ? CP_ENOMEM : 0;
    cp_selector_close(&sel);
    if (rc == CP_ENOMEM) cp_err_set(err, CP_ENOMEM, "selector: out of memory");
    return rc;
}

/* The query of a call: the window (start/end in ms, default the last hour), the selector
 * (cp_querier_selector's: the profile types it allows into *types), the limits. 0, or -1 with the
 * error answer set. */
static int window_query(const cp_querier_call *c, const cp_http_request *req, int64_t start,
                        int64_t end, const char *sel, cp_query *q, cp_buf *seltext, uint32_t *types,
                        cp_http_response *r);

static int make_query(const cp_querier_call *c, const cp_http_request *req, const cp_json *body,
                      const char *sel, cp_query *q, cp_buf *seltext, uint32_t *types,
                      cp_http_response *r)
{
    *types = TYPES_ALL;
    memset(q, 0, sizeof *q);
    int64_t now_ms = cp_now_ns() / 1000000, start, end;
    if (json_i64(member(body, "start", "start"), now_ms - 3600000, &start) ||
        json_i64(member(body, "end", "end"), now_ms, &end)) {
        connect_error(r, 400, "invalid_argument", "start/end: expected int64 milliseconds");
        return -1;
    }
    return window_query(c, req, start, end, sel, q, seltext, types, r);
}

/* The query of [start, end) in ms with selector sel, as make_query's. */
static int window_query(const cp_querier_call *c, const cp_http_request *req, int64_t start,
                        int64_t end, const char *sel, cp_query *q, cp_buf *seltext, uint32_t *types,
                        cp_http_response *r)
{
    memset(q, 0, sizeof *q);
    *types = TYPES_ALL;
    if (end <= start) {
        connect_error(r, 400, "invalid_argument", "end is not after start");
        return -1;
    }
    if (start < -9223372036854LL || end > 9223372036854LL) {
        connect_error(r, 400, "invalid_argument", "start/end out of range");
        return -1;
    }
    q->tenant = c->tenant;
    q->from_ns = start * 1000000;
    q->to_ns = end * 1000000;
    q->lim.max_range_ns = c->max_range_ns;
    q->lim.max_blocks = c->max_blocks;
    q->lim.deadline_ns = req->deadline_ns;
    if (c->max_range_ns && q->to_ns - q->from_ns > c->max_range_ns) {
        char m[160];
        snprintf(m, sizeof m, "the window exceeds the longest allowed window of %lld s",
                 (long long)(c->max_range_ns / 1000000000));
        connect_error(r, 400, "invalid_argument", m);
        return -1;
    }
    cp_err err = {0};
    int rc = cp_querier_selector(sel ? sel : "", seltext, types, &err);
    if (rc == CP_ENOMEM) {
        connect_error(r, 503, "unavailable", "out of memory");
        return -1;
    }
    if (!rc) {
        q->select = (const char *)seltext->data;
        rc = cp_selector_parse(q->select, &q->sel, &err);
    }
    if (rc) {
        char m[300];
        snprintf(m, sizeof m, "label_selector: %s", err.msg);
        connect_error(r, 400, "invalid_argument", m);
        return -1;
    }
    return 0;
}

/* The first of a matchers array, or NULL. */
static const char *first_matcher(const cp_json *body)
{
    const cp_json *m = member(body, "matchers", "matchers");
    if (m && m->type == CP_JSON_ARRAY && m->n && m->items[0]->type == CP_JSON_STRING)
        return m->items[0]->str;
    return NULL;
}

static int json_str_out(cp_buf *b, const char *s)
{
    return cp_buf_append(b, "\"", 1) || cp_json_escape(b, s, strlen(s)) ||
           cp_buf_append(b, "\"", 1);
}

/* ---- ProfileTypes, LabelNames, LabelValues ------------------------------------------- */

/* The kinds with a series in q's window (bit per kind). */
static int kinds_present(const cp_querier_call *c, cp_query *q, unsigned *mask, cp_err *err)
{
    cp_series_list l = {0};
    q->kind = 0;
    int rc = c->rd->series(c->rd, q, &l, err);
    *mask = 0;
    for (uint32_t i = 0; !rc && i < l.n; i++)
        *mask |= 1u << l.v[i].kind;
    cp_series_list_close(&l);
    return rc;
}

static int type_json(cp_buf *b, const struct ptype *t)
{
    char f[5][48] = {{0}};
    const char *p = t->id;
    for (int i = 0; i < 5; i++) {
        size_t n = strcspn(p, ":");
        snprintf(f[i], sizeof f[i], "%.*s", (int)n, p);
        p += n + (p[n] == ':');
    }
    return cp_buf_printf(
        b,
        "{\"ID\":\"%s\",\"name\":\"%s\",\"sampleType\":\"%s\",\"sampleUnit\":\"%s\","
        "\"periodType\":\"%s\",\"periodUnit\":\"%s\"}",
        t->id, f[0], f[1], f[2], f[3], f[4]);
}

static void profile_types(const cp_querier_call *c, cp_query *q, uint32_t types, int ids_only,
                          cp_http_response *r)
{
    cp_err err = {0};
    unsigned mask;
    int rc = kinds_present(c, q, &mask, &err);
    if (rc) {
        store_failed(r, rc, &err);
        return;
    }
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b, ids_only ? "{\"names\":[" : "{\"profileTypes\":[");
    int n = 0;
    for (size_t i = 0; !rc && i < NTYPES; i++) {
        if (!(mask & (1u << g_types[i].kind)) || !(types & (1u << i))) continue;
        if (n++) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = ids_only ? json_str_out(b, g_types[i].id) : type_json(b, &g_types[i]);
    }
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    if (rc) connect_error(r, 503, "unavailable", "out of memory");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The label names (label NULL) or the values of label among q's series in its window, of
 * the kinds the profile types in types belong to: sorted, each once, into out (the
 * caller's). What LabelNames and LabelValues answer when the request selects (the store's
 * own lists are of every series of the tenant, whatever the selector and window). */
static int names_of_series(const cp_querier_call *c, const cp_query *q, uint32_t types,
                           const char *label, cp_string_list *out, cp_err *err)
{
    unsigned kinds = 0;
    for (size_t i = 0; i < NTYPES; i++)
        if (types & (1u << i)) kinds |= 1u << g_types[i].kind;
    cp_series_list l = {0};
    cp_query sq = *q;
    sq.kind = 0;
    int rc = c->rd->series(c->rd, &sq, &l, err);
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        if (!(kinds & (1u << l.v[i].kind))) continue;
        const cp_labels *ls = &l.v[i].labels;
        for (uint32_t k = 0; !rc && k < ls->p.n; k++) {
            if (label && strcmp(ls->p.v[k].name, label)) continue;
            char *s = strdup(label ? ls->p.v[k].value : ls->p.v[k].name);
            if (!s || cp_vec_push(out, s)) {
                free(s);
                rc = cp_err_set(err, CP_ENOMEM, "out of memory");
            }
        }
    }
    cp_series_list_close(&l);
    if (rc) return rc;
    if (out->n) qsort(out->v, out->n, sizeof *out->v, cmp_str);
    uint32_t w = 0;
    for (uint32_t i = 0; i < out->n; i++) {
        if (w && !strcmp(out->v[w - 1], out->v[i]))
            free(out->v[i]);
        else
            out->v[w++] = out->v[i];
    }
    out->n = w;
    return 0;
}

/* Whether a request narrows its series (a matcher, or a profile type). */
static int selects(const cp_query *q, uint32_t types)
{
    return q->sel.n || types != TYPES_ALL;
}

static void label_names(const cp_querier_call *c, cp_query *q, uint32_t types, cp_http_response *r)
{
    cp_err err = {0};
    cp_string_list l = {0};
    int rc = selects(q, types) ? names_of_series(c, q, types, NULL, &l, &err)
                               : c->rd->labels(c->rd, q, &l, &err);
    if (rc) {
        cp_string_list_close(&l);
        store_failed(r, rc, &err);
        return;
    }
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b, "{\"names\":[\"__profile_type__\"");
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = json_str_out(b, strcmp(l.v[i], "service") ? l.v[i] : "service_name");
    }
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    cp_string_list_close(&l);
    if (rc) connect_error(r, 503, "unavailable", "out of memory");
}

static void label_values(const cp_querier_call *c, cp_query *q, uint32_t types, const cp_json *body,
                         cp_http_response *r)
{
    const char *name = cp_json_str(member(body, "name", "name"), NULL);
    if (!name || !*name) {
        connect_error(r, 400, "invalid_argument", "name: missing");
        return;
    }
    if (!strcmp(name, "__profile_type__")) {
        profile_types(c, q, types, 1, r);
        return;
    }
    if (!strcmp(name, "service_name")) name = "service";
    if (!cp_label_name_valid(name)) {
        connect_error(r, 400, "invalid_argument", "name: not a label name");
        return;
    }
    q->label = name;
    cp_err err = {0};
    cp_string_list l = {0};
    int rc = selects(q, types) ? names_of_series(c, q, types, name, &l, &err)
                               : c->rd->values(c->rd, q, &l, &err);
    if (rc) {
        cp_string_list_close(&l);
        store_failed(r, rc, &err);
        return;
    }
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b, "{\"names\":[");
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        if (i) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = json_str_out(b, l.v[i]);
    }
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    cp_string_list_close(&l);
    if (rc) connect_error(r, 503, "unavailable", "out of memory");
}

/* ---- SelectMergeStacktraces: the flame graph ------------------------------------------ */

typedef struct fnode {
    uint32_t name;                /* index into names */
    uint32_t parent, child, next; /* node indexes; 0 = none (node 0 is the root) */
    int64_t total, self;
    int64_t total2, self2; /* Diff's right side */
} fnode;

typedef struct fgraph {
    CP_VEC(fnode) n;
    uint64_t *slots; /* (parent << 32 | name) + 1 -> node index, open addressing */
    uint32_t nslots;
    CP_VEC(uint32_t) name_of_str; /* profile string id -> names index + 1 */
    CP_VEC(const char *) names;   /* borrowed from the profile */
    uint32_t *slot_node;
    int by_content; /* names matched by their text (a second profile's strings) */
} fgraph;

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static int fg_grow(fgraph *g)
{
    uint32_t ns = g->nslots ? g->nslots * 2 : 1024;
    uint64_t *s = calloc(ns, sizeof *s);
    uint32_t *v = calloc(ns, sizeof *v);
    if (!s || !v) {
        free(s);
        free(v);
        return CP_ENOMEM;
    }
    for (uint32_t i = 0; i < g->nslots; i++)
        if (g->slots[i]) {
            uint32_t j = (uint32_t)mix(g->slots[i]) & (ns - 1);
            while (s[j])
                j = (j + 1) & (ns - 1);
            s[j] = g->slots[i];
            v[j] = g->slot_node[i];
        }
    free(g->slots);
    free(g->slot_node);
    g->slots = s;
    g->slot_node = v;
    g->nslots = ns;
    return 0;
}

/* The child of parent named name, made if new. 0 with *out, or CP_ENOMEM. */
static int fg_child(fgraph *g, uint32_t parent, uint32_t name, uint32_t *out)
{
    if ((g->n.n + 1) * 2 >= g->nslots && fg_grow(g)) return CP_ENOMEM;
    uint64_t key = ((uint64_t)parent << 32 | name) + 1;
    uint32_t j = (uint32_t)mix(key) & (g->nslots - 1);
    for (; g->slots[j]; j = (j + 1) & (g->nslots - 1))
        if (g->slots[j] == key) {
            *out = g->slot_node[j];
            return 0;
        }
    fnode f = {name, parent, 0, g->n.v[parent].child, 0, 0, 0, 0};
    if (cp_vec_push(&g->n, f)) return CP_ENOMEM;
    *out = g->n.n - 1;
    g->n.v[parent].child = *out;
    g->slots[j] = key;
    g->slot_node[j] = *out;
    return 0;
}

/* The names index of a function's name (string id s of p). */
static int fg_name(fgraph *g, const cp_profile *p, uint32_t s, uint32_t *out)
{
    while (g->name_of_str.n <= s)
        if (cp_vec_push(&g->name_of_str, 0)) return CP_ENOMEM;
    if (!g->name_of_str.v[s]) {
        const char *nm = cp_profile_str(p, s);
        nm = *nm ? nm : "unknown";
        for (uint32_t i = 1; g->by_content && i < g->names.n && !g->name_of_str.v[s]; i++)
            if (!strcmp(g->names.v[i], nm)) g->name_of_str.v[s] = i + 1;
        if (!g->name_of_str.v[s]) {
            if (cp_vec_push(&g->names, nm)) return CP_ENOMEM;
            g->name_of_str.v[s] = g->names.n;
        }
    }
    *out = g->name_of_str.v[s] - 1;
    return 0;
}

static void fg_close(fgraph *g)
{
    free(g->n.v);
    free(g->slots);
    free(g->slot_node);
    free(g->name_of_str.v);
    free(g->names.v);
}

/* The root "total" of an empty graph. */
static int fg_init(fgraph *g)
{
    fnode root = {0};
    return cp_vec_push(&g->names, "total") || cp_vec_push(&g->n, root) || fg_grow(g) ? CP_ENOMEM
                                                                                     : 0;
}

/* Adds p's column col to the tree (side 1: the right side of a Diff, whose names are p's
 * strings matched by text): each sample's frames root first (inlined lines innermost last).
 * p must outlive g (names are borrowed). */
static int fg_add(fgraph *g, const cp_profile *p, int col, int side)
{
    g->name_of_str.n = 0;
    g->by_content = side;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        int64_t v = cp_profile_sample_values(p, i)[col];
        if (!v) continue;
        uint32_t at = 0;
        *(side ? &g->n.v[0].total2 : &g->n.v[0].total) += v;
        for (uint32_t k = s->nlocs; k-- > 0;) {
            const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
            for (uint32_t ln = l->nlines; ln-- > 0;) {
                const cp_line *line = &p->lines.v[l->line_off + ln];
                uint32_t sid = line->function_id ? p->functions.v[line->function_id - 1].name : 0;
                uint32_t nm;
                if (fg_name(g, p, sid, &nm) || fg_child(g, at, nm, &at)) return CP_ENOMEM;
                *(side ? &g->n.v[at].total2 : &g->n.v[at].total) += v;
            }
            if (!l->nlines) {
                uint32_t nm;
                if (fg_name(g, p, 0, &nm) || fg_child(g, at, nm, &at)) return CP_ENOMEM;
                *(side ? &g->n.v[at].total2 : &g->n.v[at].total) += v;
            }
        }
        *(side ? &g->n.v[at].self2 : &g->n.v[at].self) += v;
    }
    return 0;
}

static int cmp_i64_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

enum { FG_GRAPH, FG_DIFF, FG_BEARER, FG_BEARER_DIFF };

/* The k-th child left to right of nk kids plus more (linked newest first). */
static uint32_t idx_kid(const uint32_t *kids, uint32_t nk, const uint32_t *more, uint32_t n,
                        uint32_t k)
{
    uint32_t idx = n - 1 - k;
    return idx < nk ? kids[idx] : more[idx - nk];
}

/* The flame graph of g as Pyroscope's FlameGraph: levels of [offset from the previous bar's
 * end, total, self, name] in the order a depth-first walk lays the bars left to right. At
 * most max_nodes bars kept; the others under a parent summed into one "other" bar after its
 * kept children (totals exact).
 * style FG_GRAPH: FlameGraph; FG_DIFF: FlameGraphDiff; FG_BEARER: the legacy flamebearer's
 * names, levels (plain ints), numTicks and maxSelf, its object left open; FG_BEARER_DIFF: the
 * same with 7-int bars, leftTicks and rightTicks. */
static int fg_write(fgraph *g, uint32_t max_nodes, int style, cp_buf *b)
{
    int diff = style == FG_DIFF || style == FG_BEARER_DIFF;
    int q = style == FG_BEARER || style == FG_BEARER_DIFF ? 0 : '"';
    int64_t threshold = INT64_MIN;
    if (max_nodes && g->n.n > max_nodes) {
        int64_t *t = malloc(g->n.n * sizeof *t);
        if (!t) return CP_ENOMEM;
        for (uint32_t i = 0; i < g->n.n; i++)
            t[i] = g->n.v[i].total + g->n.v[i].total2;
        qsort(t, g->n.n, sizeof *t, cmp_i64_desc);
        threshold = t[max_nodes - 1];
        free(t);
    }
    /* bars under the threshold are summed into one "other" bar after their kept siblings */
    uint32_t other_name = 0;
    if (threshold != INT64_MIN) {
        if (cp_vec_push(&g->names, "other")) return CP_ENOMEM;
        other_name = g->names.n - 1;
    }
    /* depth-first, children in the order met (most recent first: reversed for stability) */
    typedef struct item {
        uint32_t node, depth; /* node UINT32_MAX: an "other" bar of totals ot, ot2 */
        int64_t x, x2;        /* left edges, of each side */
        int64_t ot, ot2;
    } item;
    CP_VEC(item) stack = {0};
    CP_VEC(cp_buf) levels = {0};
    CP_VEC(int64_t) ends = {0};
    CP_VEC(int64_t) ends2 = {0};
    int64_t max_self = 0;
    int rc = cp_vec_push(&stack, ((item){0, 0, 0, 0, 0, 0}));
    while (!rc && stack.n) {
        item it = stack.v[--stack.n];
        fnode other = {other_name, 0, 0, 0, it.ot, it.ot, it.ot2, it.ot2};
        fnode *f = it.node == UINT32_MAX ? &other : &g->n.v[it.node];
        int64_t self = f->self, self2 = f->self2, fold = 0, fold2 = 0;
        /* children kept, left to right; the others summed */
        uint32_t kids[64], nk = 0;
        CP_VEC(uint32_t) more = {0};
        for (uint32_t c = f->child; c; c = g->n.v[c].next) {
            if (g->n.v[c].total + g->n.v[c].total2 < threshold) {
                fold += g->n.v[c].total;
                fold2 += g->n.v[c].total2;
                continue;
            }
            if (nk < 64)
                kids[nk++] = c;
            else if (cp_vec_push(&more, c))
                rc = CP_ENOMEM;
        }
        while (!rc && levels.n <= it.depth) {
            cp_buf z = {0};
            rc = cp_vec_push(&levels, z) || cp_vec_push(&ends, 0) || cp_vec_push(&ends2, 0);
        }
        if (rc) {
            free(more.v);
            break;
        }
        cp_buf *lv = &levels.v[it.depth];
        rc = q ? cp_buf_printf(lv, "%s\"%lld\",\"%lld\",\"%lld\",", lv->len ? "," : "",
                               (long long)(it.x - ends.v[it.depth]), (long long)f->total,
                               (long long)self)
               : cp_buf_printf(lv, "%s%lld,%lld,%lld,", lv->len ? "," : "",
                               (long long)(it.x - ends.v[it.depth]), (long long)f->total,
                               (long long)self);
        if (!rc && diff)
            rc = cp_buf_printf(lv, q ? "\"%lld\",\"%lld\",\"%lld\"," : "%lld,%lld,%lld,",
                               (long long)(it.x2 - ends2.v[it.depth]), (long long)f->total2,
                               (long long)self2);
        if (!rc) rc = cp_buf_printf(lv, q ? "\"%u\"" : "%u", f->name);
        ends.v[it.depth] = it.x + f->total;
        ends2.v[it.depth] = it.x2 + f->total2;
        if (self > max_self) max_self = self;
        if (self2 > max_self) max_self = self2;
        /* the first child lies leftmost: pushed last; children were linked newest first */
        int64_t x = it.x, x2 = it.x2;
        uint32_t total_kids = nk + more.n;
        item *tmp = malloc((total_kids ? total_kids : 1) * sizeof *tmp);
        if (!tmp) rc = CP_ENOMEM;
        for (uint32_t k = 0; !rc && k < total_kids; k++)
            x += g->n.v[idx_kid(kids, nk, more.v, total_kids, k)].total,
                x2 += g->n.v[idx_kid(kids, nk, more.v, total_kids, k)].total2;
        if (!rc && (fold || fold2)) /* after the kept children: pushed first */
            rc = cp_vec_push(&stack, ((item){UINT32_MAX, it.depth + 1, x, x2, fold, fold2}));
        x = it.x;
        x2 = it.x2;
        for (uint32_t k = 0; !rc && k < total_kids; k++) {
            /* oldest first: reverse of the link order */
            uint32_t idx = total_kids - 1 - k;
            uint32_t c = idx < nk ? kids[idx] : more.v[idx - nk];
            tmp[k] = (item){c, it.depth + 1, x, x2, 0, 0};
            x += g->n.v[c].total;
            x2 += g->n.v[c].total2;
        }
        for (uint32_t k = total_kids; !rc && k-- > 0;)
            rc = cp_vec_push(&stack, tmp[k]);
        free(tmp);
        free(more.v);
    }
    if (!rc)
        rc = cp_buf_printf(b, q ? "{\"flamegraph\":{\"names\":["
                                : "{\"version\":1,\"flamebearer\":{\"names\":[");
    for (uint32_t i = 0; !rc && i < g->names.n; i++) {
        if (i) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = json_str_out(b, g->names.v[i]);
    }
    if (!rc) rc = cp_buf_printf(b, "],\"levels\":[");
    for (uint32_t i = 0; !rc && i < levels.n; i++)
        rc = cp_buf_printf(b, q ? "%s{\"values\":[%.*s]}" : "%s[%.*s]", i ? "," : "",
                           (int)levels.v[i].len,
                           levels.v[i].data ? (const char *)levels.v[i].data : "");
    if (!rc && style == FG_BEARER)
        rc = cp_buf_printf(b, "],\"numTicks\":%lld,\"maxSelf\":%lld}", (long long)g->n.v[0].total,
                           (long long)max_self);
    if (!rc && style == FG_GRAPH)
        rc = cp_buf_printf(b, "],\"total\":\"%lld\",\"maxSelf\":\"%lld\"}}\n",
                           (long long)g->n.v[0].total, (long long)max_self);
    if (!rc && style == FG_BEARER_DIFF)
        rc = cp_buf_printf(b,
                           "],\"numTicks\":%lld,\"maxSelf\":%lld,\"leftTicks\":%lld,"
                           "\"rightTicks\":%lld}",
                           (long long)(g->n.v[0].total + g->n.v[0].total2), (long long)max_self,
                           (long long)g->n.v[0].total, (long long)g->n.v[0].total2);
    if (!rc && style == FG_DIFF)
        rc = cp_buf_printf(b,
                           "],\"total\":\"%lld\",\"maxSelf\":\"%lld\",\"leftTicks\":\"%lld\","
                           "\"rightTicks\":\"%lld\"}}\n",
                           (long long)(g->n.v[0].total + g->n.v[0].total2), (long long)max_self,
                           (long long)g->n.v[0].total, (long long)g->n.v[0].total2);
    for (uint32_t i = 0; i < levels.n; i++)
        cp_buf_close(&levels.v[i]);
    free(levels.v);
    free(ends.v);
    free(ends2.v);
    free(stack.v);
    return rc ? CP_ENOMEM : 0;
}

/* ---- stack_trace_selector: the samples under a call site ------------------------------ */

/* A StackTraceSelector's call_site: function names from the root (borrowed from the
 * request's tree). */
typedef struct call_site {
    const char *name[CP_MAX_CALL_SITE];
    uint32_t n;
} call_site;

/* The stack_trace_selector of body (camelCase or original names) into *cs (n 0: none).
 * go_pgo is refused unless empty. 0, or -1 with the error answer set. */
static int read_call_site(const cp_json *body, call_site *cs, cp_http_response *r)
{
    cs->n = 0;
    const cp_json *sts = member(body, "stackTraceSelector", "stack_trace_selector");
    if (!sts || sts->type == CP_JSON_NULL) return 0;
    if (sts->type != CP_JSON_OBJECT) {
        connect_error(r, 400, "invalid_argument", "stack_trace_selector: expected an object");
        return -1;
    }
    const cp_json *pgo = member(sts, "goPgo", "go_pgo");
    if (pgo && pgo->type == CP_JSON_OBJECT) {
        const cp_json *k = member(pgo, "keepLocations", "keep_locations");
        const cp_json *a = member(pgo, "aggregateCallees", "aggregate_callees");
        int64_t keep = 0;
        if (json_i64(k, 0, &keep) || keep || (a && a->type == CP_JSON_BOOL && a->num)) {
            connect_error(r, 400, "invalid_argument",
                          "stack_trace_selector.go_pgo: not served (call_site is)");
            return -1;
        }
    }
    const cp_json *site = member(sts, "callSite", "call_site");
    if (!site || site->type == CP_JSON_NULL) return 0;
    if (site->type != CP_JSON_ARRAY) {
        connect_error(r, 400, "invalid_argument",
                      "stack_trace_selector.call_site: expected an array of locations");
        return -1;
    }
    if (site->n > CP_MAX_CALL_SITE) {
        char m[160];
        snprintf(m, sizeof m, "stack_trace_selector.call_site: %u locations (at most %d)", site->n,
                 CP_MAX_CALL_SITE);
        connect_error(r, 400, "invalid_argument", m);
        return -1;
    }
    for (uint32_t i = 0; i < site->n; i++) {
        /* proto3 leaves an empty name out: {} is the name "" */
        const cp_json *loc = site->items[i], *nj = member(loc, "name", "name");
        const char *nm = loc->type == CP_JSON_OBJECT ? cp_json_str(nj, nj ? NULL : "") : NULL;
        if (!nm) {
            char m[160];
            snprintf(m, sizeof m,
                     "stack_trace_selector.call_site[%u]: expected a Location {\"name\": string}",
                     i);
            connect_error(r, 400, "invalid_argument", m);
            return -1;
        }
        cs->name[cs->n++] = nm;
    }
    return 0;
}

/* Whether sample i of p's stack, root first (a location's inlined lines outermost first,
 * each frame its function's name, "unknown" without one: the flame graph's frames), begins
 * with cs's names. */
static int under_call_site(const cp_profile *p, uint32_t i, const call_site *cs)
{
    const cp_sample *s = &p->samples.v[i];
    uint32_t d = 0;
    for (uint32_t k = s->nlocs; k-- > 0 && d < cs->n;) {
        const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
        for (uint32_t ln = l->nlines; ln-- > 0 && d < cs->n;) {
            const cp_line *line = &p->lines.v[l->line_off + ln];
            uint32_t sid = line->function_id ? p->functions.v[line->function_id - 1].name : 0;
            const char *nm = cp_profile_str(p, sid);
            if (strcmp(*nm ? nm : "unknown", cs->name[d++])) return 0;
        }
        if (!l->nlines && strcmp("unknown", cs->name[d++])) return 0;
    }
    return d == cs->n;
}

/* Keeps only p's samples under cs (all when cs is empty), their stacks, labels and values
 * moved down in place. */
static void keep_call_site(cp_profile *p, const call_site *cs)
{
    if (!cs || !cs->n) return;
    uint32_t ns = 0, nst = 0, nl = 0, nt = p->sample_types.n;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        if (!under_call_site(p, i, cs)) continue;
        cp_sample s = p->samples.v[i];
        memmove(p->stack.v + nst, p->stack.v + s.loc_off, s.nlocs * sizeof *p->stack.v);
        if (s.nlabels)
            memmove(p->labels.v + nl, p->labels.v + s.label_off, s.nlabels * sizeof *p->labels.v);
        if (nt) memmove(p->values.v + (size_t)ns * nt, p->values.v + (size_t)i * nt, nt * 8);
        s.loc_off = nst;
        s.label_off = nl;
        nst += s.nlocs;
        nl += s.nlabels;
        p->samples.v[ns++] = s;
    }
    p->samples.n = ns;
    p->stack.n = nst;
    p->labels.n = nl;
    p->values.n = ns * nt;
}

/* ---- SelectSeries: points per step, by the group_by labels -------------------------- */

/* The column of sample type st in kind's timeline (its types in cp_store_kind_types' order). */
static int timeline_col(cp_kind kind, const char *st)
{
    if (kind == CP_KIND_GOROUTINES) return 0;
    static const char *const first[] = {"samples", "alloc_objects", "inuse_objects",
                                        "samples", "contentions",   "contentions"};
    return strcmp(first[kind - 1], st) ? 1 : 0;
}

/* Steps of a SelectSeries with a stack_trace_selector: each is a profile read. */
#define CP_MAX_CALL_SITE_STEPS 1500

/* q's timeline in column col, or (cs given) each step's merged profile of sample type st
 * filtered by cs and summed: the step values into *out (nsteps of them, malloc'd). */
static int step_values(const cp_querier_call *c, const cp_query *q, int col, const char *st,
                       const call_site *cs, int64_t **out, uint32_t *nsteps, cp_err *err)
{
    *out = NULL;
    *nsteps = 0;
    if (!cs || !cs->n) {
        cp_timeline tl = {0};
        int rc = c->rd->timeline(c->rd, q, &tl, err);
        if (rc) return rc;
        for (uint32_t s = 0; s < tl.nsteps; s++) /* in place: column col of each step */
            tl.v[s] = tl.v[(size_t)s * tl.ntypes + (uint32_t)col];
        *out = tl.v;
        *nsteps = tl.nsteps;
        return 0;
    }
    uint64_t n = (uint64_t)((q->to_ns - q->from_ns + q->step_ns - 1) / q->step_ns);
    if (n > CP_MAX_CALL_SITE_STEPS)
        return cp_err_set(err, CP_EINVAL,
                          "step: %llu points with a stack_trace_selector (at most %d: each is "
                          "a profile read)",
                          (unsigned long long)n, CP_MAX_CALL_SITE_STEPS);
    int64_t *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return cp_err_set(err, CP_ENOMEM, "out of memory");
    int rc = 0;
    for (uint64_t k = 0; !rc && k < n; k++) {
        cp_query sq = *q;
        sq.from_ns = q->from_ns + (int64_t)k * q->step_ns;
        sq.to_ns = sq.from_ns + q->step_ns < q->to_ns ? sq.from_ns + q->step_ns : q->to_ns;
        cp_profile *p = NULL;
        rc = c->rd->profile(c->rd, &sq, &p, err);
        int t = rc ? -1 : cp_profile_find_type(p, st);
        if (t >= 0) {
            keep_call_site(p, cs);
            v[k] = cp_profile_total(p, (uint32_t)t);
        }
        cp_profile_destroy(p);
    }
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    *nsteps = (uint32_t)n;
    return 0;
}

/* Appends one series {"labels":[...],"points":[...]} of q's timeline (step_values') to b. */
static int series_json(const cp_querier_call *c, const cp_query *q, int col, const char *st,
                       const call_site *cs, const cp_labels *group, int first, cp_buf *b,
                       int64_t *sum, cp_err *err)
{
    *sum = 0;
    int64_t *v = NULL;
    uint32_t nsteps = 0;
    int rc = step_values(c, q, col, st, cs, &v, &nsteps, err);
    if (rc) return rc;
    rc = cp_buf_printf(b, "%s{\"labels\":[", first ? "" : ",");
    for (uint32_t i = 0; !rc && group && i < group->p.n; i++) {
        const char *nm = group->p.v[i].name;
        rc = cp_buf_printf(b, "%s{\"name\":", i ? "," : "") ||
             json_str_out(b, strcmp(nm, "service") ? nm : "service_name") ||
             cp_buf_printf(b, ",\"value\":") || json_str_out(b, group->p.v[i].value) ||
             cp_buf_append(b, "}", 1);
    }
    if (!rc) rc = cp_buf_printf(b, "],\"points\":[");
    int n = 0;
    for (uint32_t s = 0; !rc && s < nsteps; s++) {
        if (!v[s]) continue; /* Pyroscope leaves empty steps out */
        *sum += v[s];
        rc = cp_buf_printf(b, "%s{\"value\":%lld,\"timestamp\":\"%lld\"}", n++ ? "," : "",
                           (long long)v[s],
                           (long long)((q->from_ns + (int64_t)s * q->step_ns) / 1000000));
    }
    if (!rc) rc = cp_buf_printf(b, "]}");
    free(v);
    return rc ? CP_ENOMEM : 0;
}

/* sel (translated selector text) with name="value" for each label of g, into out. */
static int group_selector(const char *sel, const cp_labels *g, cp_buf *out)
{
    out->len = 0;
    size_t n = strlen(sel);
    while (n && (sel[n - 1] == ' ' || sel[n - 1] == '}'))
        n--;
    int rc = n ? cp_buf_append(out, sel, n) : cp_buf_append(out, "{", 1);
    int any = n > 1;
    for (uint32_t i = 0; !rc && i < g->p.n; i++) {
        rc = cp_buf_printf(out, "%s%s=\"", any++ ? "," : "", g->p.v[i].name);
        for (const char *v = g->p.v[i].value; !rc && *v; v++)
            rc = (*v == '"' || *v == '\\') ? cp_buf_printf(out, "\\%c", *v)
                                           : cp_buf_append(out, v, 1);
        if (!rc) rc = cp_buf_append(out, "\"", 1);
    }
    if (!rc) rc = cp_buf_append(out, "}", 2);
    return rc ? CP_ENOMEM : 0;
}

typedef CP_VEC(cp_labels) label_sets;

/* The distinct values of the group_by labels among q's series of q->kind, into groups. */
static int find_groups(const cp_querier_call *c, cp_query *q, const cp_json *gb, label_sets *groups,
                       cp_err *err)
{
    cp_series_list l = {0};
    cp_kind kind = q->kind;
    q->kind = 0;
    int rc = c->rd->series(c->rd, q, &l, err);
    q->kind = kind;
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        if (l.v[i].kind != kind) continue;
        cp_labels g = {0};
        for (uint32_t k = 0; !rc && k < gb->n; k++) {
            const char *nm = cp_json_str(gb->items[k], "");
            if (!strcmp(nm, "service_name")) nm = "service";
            const char *v = cp_labels_get(&l.v[i].labels, nm);
            if (cp_label_name_valid(nm) && cp_labels_set(&g, nm, v ? v : "")) rc = CP_ENOMEM;
        }
        int seen = 0;
        cp_buf f1 = {0}, f2 = {0};
        if (!rc && cp_labels_format(&g, &f1)) rc = CP_ENOMEM;
        for (uint32_t k = 0; !rc && !seen && k < groups->n; k++) {
            f2.len = 0;
            if (cp_labels_format(&groups->v[k], &f2)) rc = CP_ENOMEM;
            seen = f1.len == f2.len && !memcmp(f1.data, f2.data, f1.len);
        }
        cp_buf_close(&f1);
        cp_buf_close(&f2);
        if (!rc && !seen && cp_vec_push(groups, g))
            rc = CP_ENOMEM;
        else if (rc || seen)
            cp_labels_close(&g);
    }
    cp_series_list_close(&l);
    return rc;
}

/* One series of an answer, its JSON text, its values' sum and where it was found. */
typedef struct ranked {
    cp_buf text;
    int64_t sum;
    uint32_t order;
} ranked;
typedef CP_VEC(ranked) ranked_series;

static int cmp_ranked_sum(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return x->sum < y->sum   ? 1
           : x->sum > y->sum ? -1
                             : (x->order > y->order) - (x->order < y->order);
}

static int cmp_ranked_order(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return (x->order > y->order) - (x->order < y->order);
}

static void select_series(const cp_querier_call *c, cp_query *q, uint32_t types,
                          const cp_json *body, cp_http_response *r)
{
    const char *id = cp_json_str(member(body, "profileTypeID", "profile_typeID"), NULL);
    const char *st;
    call_site cs;
    if (cp_querier_profile_type(id, &q->kind, &st)) {
        connect_error(r, 400, "invalid_argument", "profile_typeID: not a profile type served");
        return;
    }
    if (read_call_site(body, &cs, r)) return;
    const cp_json *sj = member(body, "step", "step");
    double step = sj && sj->type == CP_JSON_NUMBER ? sj->num : 15;
    const cp_json *agg = member(body, "aggregation", "aggregation");
    if (agg && agg->type != CP_JSON_NULL && !(agg->type == CP_JSON_NUMBER && agg->num == 0) &&
        !(agg->type == CP_JSON_STRING && !strcmp(agg->str, "TIME_SERIES_AGGREGATION_TYPE_SUM"))) {
        connect_error(r, 400, "invalid_argument", "aggregation: only the sum is served");
        return;
    }
    if (!(step > 0) || step > 86400 * 400.0) {
        connect_error(r, 400, "invalid_argument", "step: expected seconds, > 0");
        return;
    }
    q->step_ns = (int64_t)(step * 1e9);
    if (q->step_ns < 10000000000LL) q->step_ns = 10000000000LL; /* a window is 10 s */
    if ((q->to_ns - q->from_ns) / q->step_ns > 11000) {
        connect_error(r, 400, "invalid_argument", "step: more than 11,000 points");
        return;
    }
    int64_t limit;
    if (json_i64(member(body, "limit", "limit"), 0, &limit) || limit < 0) {
        connect_error(r, 400, "invalid_argument", "limit: expected an int64 >= 0");
        return;
    }
    if (!(types & (1u << type_index(id)))) { /* the selector's __profile_type__ is another */
        if (cp_buf_printf(&r->body, "{\"series\":[]}\n"))
            connect_error(r, 503, "unavailable", "out of memory");
        return;
    }
    int col = timeline_col(q->kind, st);
    const cp_json *gb = member(body, "groupBy", "group_by");
    cp_err err = {0};
    ranked_series rs = {0};
    int rc = 0;
    if (!gb || gb->type != CP_JSON_ARRAY || !gb->n) {
        ranked one = {0};
        rc = series_json(c, q, col, st, &cs, NULL, 1, &one.text, &one.sum, &err);
        if (!rc && cp_vec_push(&rs, one)) rc = CP_ENOMEM;
        if (rc) cp_buf_close(&one.text);
    } else {
        label_sets groups = {0};
        rc = find_groups(c, q, gb, &groups, &err);
        cp_buf gs = {0};
        for (uint32_t k = 0; !rc && k < groups.n; k++) {
            cp_query gq = *q;
            memset(&gq.sel, 0, sizeof gq.sel);
            rc = group_selector(q->select, &groups.v[k], &gs);
            if (!rc) rc = cp_selector_parse((const char *)gs.data, &gq.sel, &err);
            gq.select = (const char *)gs.data;
            ranked one = {0};
            one.order = k;
            if (!rc)
                rc = series_json(c, &gq, col, st, &cs, &groups.v[k], 1, &one.text, &one.sum, &err);
            if (!rc && cp_vec_push(&rs, one)) rc = CP_ENOMEM;
            if (rc) cp_buf_close(&one.text);
            cp_selector_close(&gq.sel);
        }
        cp_buf_close(&gs);
        for (uint32_t k = 0; k < groups.n; k++)
            cp_labels_close(&groups.v[k]);
        free(groups.v);
    }
    /* limit: the heaviest series, in the order found */
    if (!rc && limit && rs.n > (uint64_t)limit) {
        qsort(rs.v, rs.n, sizeof *rs.v, cmp_ranked_sum);
        for (uint32_t k = (uint32_t)limit; k < rs.n; k++)
            cp_buf_close(&rs.v[k].text);
        rs.n = (uint32_t)limit;
        qsort(rs.v, rs.n, sizeof *rs.v, cmp_ranked_order);
    }
    cp_buf *b = &r->body;
    if (!rc && cp_buf_printf(b, "{\"series\":[")) rc = CP_ENOMEM;
    for (uint32_t k = 0; !rc && k < rs.n; k++)
        if ((k && cp_buf_append(b, ",", 1)) ||
            cp_buf_append(b, rs.v[k].text.data, rs.v[k].text.len))
            rc = CP_ENOMEM;
    if (!rc && cp_buf_printf(b, "]}\n")) rc = CP_ENOMEM;
    for (uint32_t k = 0; k < rs.n; k++)
        cp_buf_close(&rs.v[k].text);
    free(rs.v);
    if (rc == CP_ENOMEM)
        connect_error(r, 503, "unavailable", "out of memory");
    else if (rc)
        store_failed(r, rc, &err);
}

static void merge_stacktraces(const cp_querier_call *c, cp_query *q, uint32_t types,
                              const cp_json *body, cp_http_response *r)
{
    const char *id = cp_json_str(member(body, "profileTypeID", "profile_typeID"), NULL);
    const char *st;
    if (cp_querier_profile_type(id, &q->kind, &st)) {
        char m[200];
        snprintf(m, sizeof m,
                 "profile_typeID '%.100s' is not a profile type served (ProfileTypes "
                 "lists them)",
                 id ? id : "");
        connect_error(r, 400, "invalid_argument", m);
        return;
    }
    int64_t mn;
    if (json_i64(member(body, "maxNodes", "max_nodes"), c->max_nodes_default, &mn) || mn < 0 ||
        (c->max_nodes_limit && mn > c->max_nodes_limit)) {
        connect_error(r, 400, "invalid_argument", "max_nodes: out of range");
        return;
    }
    call_site cs;
    if (read_call_site(body, &cs, r)) return;
    cp_err err = {0};
    cp_profile *p = NULL;
    /* the selector's __profile_type__ another type: an empty graph */
    int rc = types & (1u << type_index(id)) ? c->rd->profile(c->rd, q, &p, &err) : 0;
    if (rc) {
        store_failed(r, rc, &err);
        cp_profile_destroy(p);
        return;
    }
    int col = p ? cp_profile_find_type(p, st) : -1;
    if (col >= 0) keep_call_site(p, &cs);
    fgraph g = {0};
    rc = fg_init(&g);
    if (!rc && col >= 0) rc = fg_add(&g, p, col, 0); /* else no series: an empty graph */
    if (!rc) rc = fg_write(&g, (uint32_t)mn, FG_GRAPH, &r->body);
    if (rc) connect_error(r, 503, "unavailable", "out of memory");
    fg_close(&g);
    cp_profile_destroy(p);
}

/* ---- Diff: two flame graphs in one ------------------------------------------------------ */

/* One side of a Diff: its SelectMergeStacktracesRequest's profile, column col (-1: none).
 * 0, or -1 with the error answer set (name: "left" or "right"). */
static int diff_side(const cp_querier_call *c, const cp_http_request *req, const cp_json *side,
                     const char *name, cp_profile **p, int *col, cp_http_response *r)
{
    char m[300];
    if (!side || side->type != CP_JSON_OBJECT) {
        snprintf(m, sizeof m, "%s: missing (a SelectMergeStacktracesRequest)", name);
        connect_error(r, 400, "invalid_argument", m);
        return -1;
    }
    const char *id = cp_json_str(member(side, "profileTypeID", "profile_typeID"), NULL);
    const char *st;
    cp_query q;
    cp_buf seltext = {0};
    uint32_t types;
    call_site cs;
    if (make_query(c, req, side, cp_json_str(member(side, "labelSelector", "label_selector"), NULL),
                   &q, &seltext, &types, r) ||
        read_call_site(side, &cs, r)) {
        cp_query_close(&q);
        cp_buf_close(&seltext);
        return -1;
    }
    int rc = 0;
    if (cp_querier_profile_type(id, &q.kind, &st)) {
        snprintf(m, sizeof m, "%s.profile_typeID '%.100s' is not a profile type served", name,
                 id ? id : "");
        connect_error(r, 400, "invalid_argument", m);
        rc = -1;
    } else if (types & (1u << type_index(id))) { /* else another __profile_type__: empty */
        cp_err err = {0};
        int src = c->rd->profile(c->rd, &q, p, &err);
        if (src) {
            store_failed(r, src, &err);
            rc = -1;
        } else {
            *col = cp_profile_find_type(*p, st);
            if (*col >= 0) keep_call_site(*p, &cs);
        }
    }
    cp_query_close(&q);
    cp_buf_close(&seltext);
    return rc;
}

/* Diff: left and right merged into one tree, each bar [left offset, left total, left self,
 * right offset, right total, right self, name]; total the two sides' sum. */
static void diff(const cp_querier_call *c, const cp_http_request *req, const cp_json *body,
                 cp_http_response *r)
{
    cp_profile *lp = NULL, *rp = NULL;
    int lc = -1, rcol = -1;
    if (!diff_side(c, req, member(body, "left", "left"), "left", &lp, &lc, r) &&
        !diff_side(c, req, member(body, "right", "right"), "right", &rp, &rcol, r)) {
        fgraph g = {0};
        int rc = fg_init(&g);
        if (!rc && lc >= 0) rc = fg_add(&g, lp, lc, 0);
        if (!rc && rcol >= 0) rc = fg_add(&g, rp, rcol, 1);
        if (!rc) rc = fg_write(&g, c->max_nodes_default, FG_DIFF, &r->body);
        if (rc) connect_error(r, 503, "unavailable", "out of memory");
        fg_close(&g);
    }
    cp_profile_destroy(lp);
    cp_profile_destroy(rp);
}

/* ---- Series, SelectMergeProfile, GetProfileStats ------------------------------------- */

static int pair_json(cp_buf *b, int first, const char *name, const char *value)
{
    return cp_buf_printf(b, "%s{\"name\":", first ? "" : ",") || json_str_out(b, name) ||
           cp_buf_printf(b, ",\"value\":") || json_str_out(b, value) || cp_buf_append(b, "}", 1);
}

/* 1 if name is wanted: names empty (all), or among them. */
static int wanted(const cp_json *names, const char *name)
{
    if (!names || names->type != CP_JSON_ARRAY || !names->n) return 1;
    for (uint32_t i = 0; i < names->n; i++)
        if (!strcmp(cp_json_str(names->items[i], ""), name)) return 1;
    return 0;
}

/* Series: one label set per series and profile type of its kind, with __profile_type__,
 * __name__ and service_name, in name order; only label_names when given; each set once. */
static void series(const cp_querier_call *c, cp_query *q, uint32_t types, const cp_json *body,
                   cp_http_response *r)
{
    const cp_json *names = member(body, "labelNames", "label_names");
    cp_err err = {0};
    cp_series_list l = {0};
    q->kind = 0;
    int rc = c->rd->series(c->rd, q, &l, &err);
    if (rc) {
        store_failed(r, rc, &err);
        return;
    }
    CP_VEC(cp_buf) sets = {0};
    cp_buf one = {0};
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        for (size_t t = 0; !rc && t < NTYPES; t++) {
            if (g_types[t].kind != l.v[i].kind || !(types & (1u << t))) continue;
            cp_labels ls = {0};
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(g_types[t].id, ":"), g_types[t].id);
            const cp_labels *sl = &l.v[i].labels;
            if (wanted(names, "__profile_type__"))
                rc = cp_labels_set(&ls, "__profile_type__", g_types[t].id);
            if (!rc && wanted(names, "__name__")) rc = cp_labels_set(&ls, "__name__", name);
            for (uint32_t k = 0; !rc && k < sl->p.n; k++) {
                const char *nm =
                    strcmp(sl->p.v[k].name, "service") ? sl->p.v[k].name : "service_name";
                if (wanted(names, nm)) rc = cp_labels_set(&ls, nm, sl->p.v[k].value);
            }
            one.len = 0;
            if (!rc) rc = cp_buf_printf(&one, "{\"labels\":[");
            for (uint32_t k = 0; !rc && k < ls.p.n; k++)
                rc = pair_json(&one, k == 0, ls.p.v[k].name, ls.p.v[k].value);
            if (!rc) rc = cp_buf_append(&one, "]}", 2);
            cp_labels_close(&ls);
            int seen = 0;
            for (uint32_t k = 0; !rc && !seen && k < sets.n; k++)
                seen = sets.v[k].len == one.len && !memcmp(sets.v[k].data, one.data, one.len);
            if (!rc && !seen) {
                if (cp_vec_push(&sets, one))
                    rc = CP_ENOMEM;
                else
                    memset(&one, 0, sizeof one);
            }
        }
    }
    cp_buf_close(&one);
    cp_series_list_close(&l);
    cp_buf *b = &r->body;
    if (!rc) rc = cp_buf_printf(b, "{\"labelsSet\":[");
    for (uint32_t k = 0; !rc && k < sets.n; k++)
        rc = (k && cp_buf_append(b, ",", 1)) || cp_buf_append(b, sets.v[k].data, sets.v[k].len);
    if (!rc) rc = cp_buf_printf(b, "]}\n");
    for (uint32_t k = 0; k < sets.n; k++)
        cp_buf_close(&sets.v[k]);
    free(sets.v);
    if (rc) connect_error(r, 503, "unavailable", "out of memory");
}

/* p as google.v1.Profile in proto3 JSON (camelCase, int64 and uint64 as strings, zero and
 * empty fields left out as proto3's JSON writers do) into b. */
static int pprof_json(const cp_profile *p, cp_buf *b)
{
#define I(v) ((long long)(v))
#define U(v) ((unsigned long long)(v))
    int rc = cp_buf_append(b, "{", 1);
    const char *sep = "";
    if (!rc && p->sample_types.n) {
        rc = cp_buf_printf(b, "\"sampleType\":[");
        for (uint32_t i = 0; !rc && i < p->sample_types.n; i++)
            rc = cp_buf_printf(b, "%s{\"type\":\"%u\",\"unit\":\"%u\"}", i ? "," : "",
                               p->sample_types.v[i].type, p->sample_types.v[i].unit);
        if (!rc) rc = cp_buf_append(b, "]", 1);
        sep = ",";
    }
    if (!rc && p->samples.n) {
        rc = cp_buf_printf(b, "%s\"sample\":[", sep);
        for (uint32_t i = 0; !rc && i < p->samples.n; i++) {
            const cp_sample *s = &p->samples.v[i];
            const int64_t *v = cp_profile_sample_values(p, i);
            rc = cp_buf_printf(b, "%s{\"locationId\":[", i ? "," : "");
            for (uint32_t k = 0; !rc && k < s->nlocs; k++)
                rc = cp_buf_printf(b, "%s\"%u\"", k ? "," : "", p->stack.v[s->loc_off + k]);
            if (!rc) rc = cp_buf_printf(b, "],\"value\":[");
            for (uint32_t k = 0; !rc && k < p->sample_types.n; k++)
                rc = cp_buf_printf(b, "%s\"%lld\"", k ? "," : "", I(v[k]));
            if (!rc) rc = cp_buf_append(b, "]", 1);
            if (!rc && s->nlabels) {
                rc = cp_buf_printf(b, ",\"label\":[");
                for (uint32_t k = 0; !rc && k < s->nlabels; k++) {
                    const cp_label *l = &p->labels.v[s->label_off + k];
                    rc = cp_buf_printf(b, "%s{\"key\":\"%u\"", k ? "," : "", l->key);
                    if (!rc && l->str) rc = cp_buf_printf(b, ",\"str\":\"%u\"", l->str);
                    if (!rc && l->num) rc = cp_buf_printf(b, ",\"num\":\"%lld\"", I(l->num));
                    if (!rc && l->num_unit)
                        rc = cp_buf_printf(b, ",\"numUnit\":\"%u\"", l->num_unit);
                    if (!rc) rc = cp_buf_append(b, "}", 1);
                }
                if (!rc) rc = cp_buf_append(b, "]", 1);
            }
            if (!rc) rc = cp_buf_append(b, "}", 1);
        }
        if (!rc) rc = cp_buf_append(b, "]", 1);
        sep = ",";
    }
    if (!rc && p->mappings.n) {
        rc = cp_buf_printf(b, "%s\"mapping\":[", sep);
        for (uint32_t i = 0; !rc && i < p->mappings.n; i++) {
            const cp_mapping *m = &p->mappings.v[i];
            rc = cp_buf_printf(b,
                               "%s{\"id\":\"%u\",\"memoryStart\":\"%llu\",\"memoryLimit\":"
                               "\"%llu\",\"fileOffset\":\"%llu\",\"filename\":\"%u\","
                               "\"buildId\":\"%u\"",
                               i ? "," : "", i + 1, U(m->start), U(m->limit), U(m->offset),
                               m->filename, m->build_id);
            static const char *const has[] = {"hasFunctions", "hasFilenames", "hasLineNumbers",
                                              "hasInlineFrames"};
            for (int f = 0; !rc && f < 4; f++)
                if (m->flags & (1u << f)) rc = cp_buf_printf(b, ",\"%s\":true", has[f]);
            if (!rc) rc = cp_buf_append(b, "}", 1);
        }
        if (!rc) rc = cp_buf_append(b, "]", 1);
        sep = ",";
    }
    if (!rc && p->locations.n) {
        rc = cp_buf_printf(b, "%s\"location\":[", sep);
        for (uint32_t i = 0; !rc && i < p->locations.n; i++) {
            const cp_location *l = &p->locations.v[i];
            rc = cp_buf_printf(b, "%s{\"id\":\"%u\"", i ? "," : "", i + 1);
            if (!rc && l->mapping_id) rc = cp_buf_printf(b, ",\"mappingId\":\"%u\"", l->mapping_id);
            if (!rc && l->address) rc = cp_buf_printf(b, ",\"address\":\"%llu\"", U(l->address));
            if (!rc && l->nlines) {
                rc = cp_buf_printf(b, ",\"line\":[");
                for (uint32_t k = 0; !rc && k < l->nlines; k++) {
                    const cp_line *ln = &p->lines.v[l->line_off + k];
                    rc = cp_buf_printf(b, "%s{\"functionId\":\"%u\",\"line\":\"%lld\"}",
                                       k ? "," : "", ln->function_id, I(ln->line));
                }
                if (!rc) rc = cp_buf_append(b, "]", 1);
            }
            if (!rc && l->is_folded) rc = cp_buf_printf(b, ",\"isFolded\":true");
            if (!rc) rc = cp_buf_append(b, "}", 1);
        }
        if (!rc) rc = cp_buf_append(b, "]", 1);
        sep = ",";
    }
    if (!rc && p->functions.n) {
        rc = cp_buf_printf(b, "%s\"function\":[", sep);
        for (uint32_t i = 0; !rc && i < p->functions.n; i++) {
            const cp_function *f = &p->functions.v[i];
            rc = cp_buf_printf(b,
                               "%s{\"id\":\"%u\",\"name\":\"%u\",\"systemName\":\"%u\","
                               "\"filename\":\"%u\",\"startLine\":\"%lld\"}",
                               i ? "," : "", i + 1, f->name, f->system_name, f->filename,
                               I(f->start_line));
        }
        if (!rc) rc = cp_buf_append(b, "]", 1);
        sep = ",";
    }
    if (!rc) rc = cp_buf_printf(b, "%s\"stringTable\":[", sep);
    for (uint32_t i = 0; !rc && i < p->strs.off.n; i++)
        rc = (i && cp_buf_append(b, ",", 1)) || json_str_out(b, cp_profile_str(p, i));
    if (!rc) rc = cp_buf_append(b, "]", 1);
    if (!rc && p->drop_frames) rc = cp_buf_printf(b, ",\"dropFrames\":\"%u\"", p->drop_frames);
    if (!rc && p->keep_frames) rc = cp_buf_printf(b, ",\"keepFrames\":\"%u\"", p->keep_frames);
    if (!rc && p->time_nanos) rc = cp_buf_printf(b, ",\"timeNanos\":\"%lld\"", I(p->time_nanos));
    if (!rc && p->duration_nanos)
        rc = cp_buf_printf(b, ",\"durationNanos\":\"%lld\"", I(p->duration_nanos));
    if (!rc && (p->period_type.type || p->period_type.unit))
        rc = cp_buf_printf(b, ",\"periodType\":{\"type\":\"%u\",\"unit\":\"%u\"}",
                           p->period_type.type, p->period_type.unit);
    if (!rc && p->period) rc = cp_buf_printf(b, ",\"period\":\"%lld\"", I(p->period));
    if (!rc && p->comments.n) {
        rc = cp_buf_printf(b, ",\"comment\":[");
        for (uint32_t i = 0; !rc && i < p->comments.n; i++)
            rc = cp_buf_printf(b, "%s\"%u\"", i ? "," : "", p->comments.v[i]);
        if (!rc) rc = cp_buf_append(b, "]", 1);
    }
    if (!rc && p->default_sample_type)
        rc = cp_buf_printf(b, ",\"defaultSampleType\":\"%u\"", p->default_sample_type);
    if (!rc) rc = cp_buf_append(b, "}\n", 2);
    return rc ? CP_ENOMEM : 0;
#undef I
#undef U
}

/* SelectMergeProfile: the merged profile of the one sample type, under the call site, as
 * pprof (raw: application/proto) or its proto3 JSON (application/json). */
static void merge_profile(const cp_querier_call *c, cp_query *q, uint32_t types,
                          const cp_json *body, int proto, cp_http_response *r)
{
    const char *id = cp_json_str(member(body, "profileTypeID", "profile_typeID"), NULL);
    const char *st;
    call_site cs;
    if (cp_querier_profile_type(id, &q->kind, &st)) {
        connect_error(r, 400, "invalid_argument", "profile_typeID: not a profile type served");
        return;
    }
    if (read_call_site(body, &cs, r)) return;
    cp_err err = {0};
    cp_profile *p = NULL;
    int rc = 0;
    if (types & (1u << type_index(id))) {
        rc = c->rd->profile(c->rd, q, &p, &err);
    } else if (!(p = cp_profile_create())) { /* another __profile_type__: an empty profile */
        rc = cp_err_set(&err, CP_ENOMEM, "out of memory");
    }
    if (rc) {
        store_failed(r, rc, &err);
        cp_profile_destroy(p);
        return;
    }
    if (cp_profile_find_type(p, st) >= 0) {
        rc = cp_profile_select_types(p, &st, 1, &err);
        keep_call_site(p, &cs);
    }
    if (!rc) rc = proto ? cp_pprof_encode(p, 0, &r->body) : pprof_json(p, &r->body);
    cp_profile_destroy(p);
    if (rc) {
        store_failed(r, rc, &err);
        return;
    }
    snprintf(r->content_type, sizeof r->content_type,
             proto ? "application/proto" : "application/json");
}

/* GetProfileStats: whether the tenant has any series, and its oldest and newest times. */
static void profile_stats(const cp_querier_call *c, const cp_http_request *req, cp_http_response *r)
{
    cp_query q;
    memset(&q, 0, sizeof q);
    q.tenant = c->tenant;
    q.from_ns = 0;
    q.to_ns = cp_now_ns() + 86400 * 1000000000LL;
    q.lim.max_blocks = c->max_blocks;
    q.lim.deadline_ns = req->deadline_ns;
    q.select = "";
    cp_err err = {0};
    cp_series_list l = {0};
    int rc = c->rd->series(c->rd, &q, &l, &err);
    if (rc) {
        store_failed(r, rc, &err);
        cp_query_close(&q);
        return;
    }
    int64_t oldest = INT64_MAX, newest = INT64_MIN;
    for (uint32_t i = 0; i < l.n; i++) {
        if (l.v[i].first_ns < oldest) oldest = l.v[i].first_ns;
        if (l.v[i].last_ns > newest) newest = l.v[i].last_ns;
    }
    if (l.n)
        rc = cp_buf_printf(&r->body,
                           "{\"dataIngested\":true,\"oldestProfileTime\":\"%lld\","
                           "\"newestProfileTime\":\"%lld\"}\n",
                           (long long)(oldest / 1000000), (long long)(newest / 1000000));
    else
        rc = cp_buf_printf(&r->body, "{\"dataIngested\":false,\"oldestProfileTime\":\"0\","
                                     "\"newestProfileTime\":\"0\"}\n");
    cp_series_list_close(&l);
    cp_query_close(&q);
    if (rc) connect_error(r, 503, "unavailable", "out of memory");
}

/* ---- the legacy HTTP API: /pyroscope/render, /pyroscope/label-values ------------------ */

/* A legacy time: digits as cp_pyro_parse_time (seconds, 13 ms, 16 us, 19 ns), else
 * contprof's grammar ("now", "now-1h", RFC 3339). Into ms. 0, or -1 with the answer set. */
static int legacy_time(const char *name, const char *v, int64_t dflt_ms, int64_t *ms,
                       cp_http_response *r)
{
    if (!v || !*v) {
        *ms = dflt_ms;
        return 0;
    }
    cp_err err = {0};
    int64_t ns;
    int rc = strspn(v, "0123456789") == strlen(v) ? cp_pyro_parse_time(v, 0, &ns, &err)
                                                  : cp_parse_time(v, cp_now_ns(), &ns, &err);
    if (rc) {
        char m[300];
        snprintf(m, sizeof m, "%s: %s", name, err.msg);
        connect_error(r, 400, "invalid_argument", m);
        return -1;
    }
    *ms = ns / 1000000;
    return 0;
}

/* The unit the flamebearer's metadata names for a profile type's sample type and unit. */
static const char *legacy_units(const char *id)
{
    const char *st = strchr(id, ':') + 1;
    if (!strncmp(st, "alloc_objects", 13) || !strncmp(st, "inuse_objects", 13)) return "objects";
    if (!strncmp(st, "alloc_space", 11) || !strncmp(st, "inuse_space", 11)) return "bytes";
    if (!strncmp(st, "goroutine", 9)) return "goroutines";
    if (!strncmp(st, "contentions", 11)) return "lock_samples";
    if (!strncmp(st, "delay", 5)) return "lock_nanoseconds";
    if (!strncmp(st, "samples", 7)) return "samples";
    return "nanoseconds";
}

/* One side of /pyroscope/render-diff: PREFIXQuery, PREFIXFrom, PREFIXUntil of pa. 0 with *p
 * (the caller's) and *col, or -1 with the answer set. */
static int legacy_side(const cp_querier_call *c, const cp_http_request *req, const cp_params *pa,
                       const char *prefix, cp_profile **p, int *col, char id[128],
                       cp_http_response *r)
{
    char k[3][24], m[300];
    snprintf(k[0], sizeof k[0], "%sQuery", prefix);
    snprintf(k[1], sizeof k[1], "%sFrom", prefix);
    snprintf(k[2], sizeof k[2], "%sUntil", prefix);
    const char *query = cp_params_get(pa, k[0]);
    if (!query) query = "";
    size_t idn = strcspn(query, "{");
    snprintf(id, 128, "%.*s", (int)(idn < 128 ? idn : 127), query);
    cp_kind kind;
    const char *st;
    if (idn >= 128 || cp_querier_profile_type(id, &kind, &st)) {
        snprintf(m, sizeof m, "%s: '%.100s' does not start with a profile type served", k[0],
                 query);
        connect_error(r, 400, "invalid_argument", m);
        return -1;
    }
    int64_t now_ms = cp_now_ns() / 1000000, from, until;
    cp_query q;
    memset(&q, 0, sizeof q);
    cp_buf seltext = {0};
    int rc = -1;
    uint32_t types;
    if (!legacy_time(k[1], cp_params_get(pa, k[1]), now_ms - 3600000, &from, r) &&
        !legacy_time(k[2], cp_params_get(pa, k[2]), now_ms, &until, r) &&
        !window_query(c, req, from, until, query + idn, &q, &seltext, &types, r)) {
        q.kind = kind;
        cp_err err = {0};
        /* the selector's __profile_type__ another type: an empty side */
        int src = types & (1u << type_index(id)) ? c->rd->profile(c->rd, &q, p, &err) : 0;
        if (src)
            store_failed(r, src, &err);
        else
            *col = *p ? cp_profile_find_type(*p, st) : -1, rc = 0;
    }
    cp_query_close(&q);
    cp_buf_close(&seltext);
    return rc;
}

/* /pyroscope/render-diff: leftQuery/leftFrom/leftUntil against the right's, the flamebearer
 * of format "double". */
static void render_diff(const cp_querier_call *c, const cp_http_request *req, cp_http_response *r)
{
    static const char *const allowed[] = {"leftQuery", "leftFrom",   "leftUntil", "rightQuery",
                                          "rightFrom", "rightUntil", "format",    "max-nodes",
                                          "maxNodes",  NULL};
    cp_params pa = {0};
    cp_err err = {0};
    cp_profile *lp = NULL, *rp = NULL;
    int lc = -1, rcol = -1;
    char lid[128], rid[128];
    const char *fmt, *mns;
    int64_t mn = c->max_nodes_default;
    if (cp_params_parse(req->query, &pa, &err) || cp_params_check(&pa, allowed, &err)) {
        connect_error(r, 400, "invalid_argument", err.msg);
    } else if ((fmt = cp_params_get(&pa, "format")) && strcmp(fmt, "json")) {
        connect_error(r, 400, "invalid_argument", "format: only json is served");
    } else if (((mns = cp_params_get(&pa, "max-nodes")) ||
                (mns = cp_params_get(&pa, "maxNodes"))) &&
               (!*mns || strspn(mns, "0123456789") != strlen(mns) || strlen(mns) > 9 ||
                (mn = atoll(mns), c->max_nodes_limit && mn > c->max_nodes_limit))) {
        connect_error(r, 400, "invalid_argument", "max-nodes: out of range");
    } else if (!legacy_side(c, req, &pa, "left", &lp, &lc, lid, r) &&
               !legacy_side(c, req, &pa, "right", &rp, &rcol, rid, r)) {
        fgraph g = {0};
        int rc = fg_init(&g);
        if (!rc && lc >= 0) rc = fg_add(&g, lp, lc, 0);
        if (!rc && rcol >= 0) rc = fg_add(&g, rp, rcol, 1);
        if (!rc) rc = fg_write(&g, (uint32_t)mn, FG_BEARER_DIFF, &r->body);
        if (!rc && cp_buf_printf(&r->body,
                                 ",\"metadata\":{\"format\":\"double\",\"spyName\":\"\","
                                 "\"sampleRate\":100,\"units\":\"%s\",\"name\":\"%s\"},"
                                 "\"timeline\":null}\n",
                                 legacy_units(lid), lid))
            rc = CP_ENOMEM;
        if (rc) connect_error(r, 503, "unavailable", "out of memory");
        fg_close(&g);
    }
    cp_profile_destroy(lp);
    cp_profile_destroy(rp);
    cp_params_close(&pa);
}

/* /pyroscope/render (query=TYPE{selector}, from, until, format=json, max-nodes): the
 * flamebearer; /pyroscope/label-values (label, query=[TYPE]{selector}, from, until): a JSON
 * array of values. */
void cp_querier_legacy(const cp_querier_call *c, const cp_http_request *req, cp_http_response *r)
{
    if (!strcmp(req->path, "/pyroscope/render-diff")) {
        render_diff(c, req, r);
        return;
    }
    int render = !strcmp(req->path, "/pyroscope/render");
    static const char *const render_params[] = {"query",     "from",     "until",       "format",
                                                "max-nodes", "maxNodes", "aggregation", NULL};
    static const char *const values_params[] = {"label", "query", "from", "until", NULL};
    cp_params pa = {0};
    cp_err err = {0};
    char m[400];
    if (cp_params_parse(req->query, &pa, &err) ||
        cp_params_check(&pa, render ? render_params : values_params, &err)) {
        connect_error(r, 400, "invalid_argument", err.msg);
        cp_params_close(&pa);
        return;
    }
    const char *query = cp_params_get(&pa, "query"), *fmt = cp_params_get(&pa, "format");
    const char *agg = cp_params_get(&pa, "aggregation");
    const char *mns = cp_params_get(&pa, "max-nodes");
    if (!mns) mns = cp_params_get(&pa, "maxNodes");
    if (!query) query = "";
    size_t idn = strcspn(query, "{");
    char id[128];
    snprintf(id, sizeof id, "%.*s", (int)(idn < sizeof id ? idn : sizeof id - 1), query);
    const char *sel = query + idn;
    int64_t now_ms = cp_now_ns() / 1000000, from, until, mn = c->max_nodes_default;
    const char *st = NULL;
    cp_query q;
    memset(&q, 0, sizeof q);
    cp_buf seltext = {0};
    uint32_t types;
    if (render && (idn >= sizeof id || cp_querier_profile_type(id, &q.kind, &st))) {
        snprintf(m, sizeof m,
                 "query: '%.100s' does not start with a profile type served (TYPE{selector}, "
                 "e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"app\"})",
                 query);
        connect_error(r, 400, "invalid_argument", m);
    } else if (render && fmt && strcmp(fmt, "json")) {
        connect_error(r, 400, "invalid_argument", "format: only json is served");
    } else if (render && agg && strcmp(agg, "sum")) {
        connect_error(r, 400, "invalid_argument", "aggregation: only sum is served");
    } else if (render && mns &&
               (strspn(mns, "0123456789") != strlen(mns) || !*mns || strlen(mns) > 9 ||
                (mn = atoll(mns), c->max_nodes_limit && mn > c->max_nodes_limit))) {
        connect_error(r, 400, "invalid_argument", "max-nodes: out of range");
    } else if (!render && (!cp_params_get(&pa, "label") || !*cp_params_get(&pa, "label"))) {
        connect_error(r, 400, "invalid_argument", "label: missing");
    } else if (!legacy_time("from", cp_params_get(&pa, "from"), now_ms - 3600000, &from, r) &&
               !legacy_time("until", cp_params_get(&pa, "until"), now_ms, &until, r) &&
               !window_query(c, req, from, until, sel, &q, &seltext, &types, r)) {
        if (render) {
            if (cp_querier_profile_type(id, &q.kind, &st)) st = NULL; /* window_query reset */
            cp_profile *p = NULL;
            int mine = (types >> type_index(id)) & 1; /* else another __profile_type__: empty */
            int rc = mine ? c->rd->profile(c->rd, &q, &p, &err) : 0;
            fgraph g = {0};
            int col = rc || !p ? -1 : cp_profile_find_type(p, st);
            if (!rc) rc = fg_init(&g) ? cp_err_set(&err, CP_ENOMEM, "out of memory") : 0;
            if (!rc && col >= 0 && fg_add(&g, p, col, 0))
                rc = cp_err_set(&err, CP_ENOMEM, "out of memory");
            cp_buf fb = {0};
            if (!rc && fg_write(&g, (uint32_t)mn, FG_BEARER, &fb))
                rc = cp_err_set(&err, CP_ENOMEM, "out of memory");
            /* the timeline: about 300 steps in whole 10 s windows, from the window's start */
            cp_timeline tl = {0};
            int64_t span = q.to_ns - q.from_ns, w = 10000000000LL;
            q.step_ns = span / 300 <= w ? w : (span / 300 + w - 1) / w * w;
            if (!rc && mine) rc = c->rd->timeline(c->rd, &q, &tl, &err);
            uint32_t nsteps = (uint32_t)((span + q.step_ns - 1) / q.step_ns);
            int tcol = timeline_col(q.kind, st);
            if (!rc)
                rc =
                    cp_buf_append(&r->body, fb.data, fb.len) ||
                            cp_buf_printf(&r->body,
                                          ",\"metadata\":{\"format\":\"single\",\"spyName\":"
                                          "\"\",\"sampleRate\":100,\"units\":\"%s\",\"name\":"
                                          "\"%s\"},\"timeline\":{\"startTime\":%lld,\"samples\":[",
                                          legacy_units(id), id, (long long)(q.from_ns / 1000000000))
                        ? cp_err_set(&err, CP_ENOMEM, "out of memory")
                        : 0;
            for (uint32_t k = 0; !rc && k < nsteps; k++) {
                int64_t v = k < tl.nsteps ? tl.v[(size_t)k * tl.ntypes + (uint32_t)tcol] : 0;
                if (cp_buf_printf(&r->body, "%s%lld", k ? "," : "", (long long)v))
                    rc = cp_err_set(&err, CP_ENOMEM, "out of memory");
            }
            if (!rc && cp_buf_printf(&r->body, "],\"durationDelta\":%lld}}\n",
                                     (long long)(q.step_ns / 1000000000)))
                rc = cp_err_set(&err, CP_ENOMEM, "out of memory");
            free(tl.v);
            cp_buf_close(&fb);
            fg_close(&g);
            cp_profile_destroy(p);
            if (rc) {
                r->body.len = 0;
                store_failed(r, rc, &err);
            }
        } else {
            const char *name = cp_params_get(&pa, "label");
            if (!strcmp(name, "service_name")) name = "service";
            if (!cp_label_name_valid(name)) {
                connect_error(r, 400, "invalid_argument", "label: not a label name");
            } else {
                q.label = name;
                cp_string_list l = {0};
                int rc = selects(&q, types) ? names_of_series(c, &q, types, name, &l, &err)
                                            : c->rd->values(c->rd, &q, &l, &err);
                if (!rc) rc = cp_buf_append(&r->body, "[", 1);
                for (uint32_t i = 0; !rc && i < l.n; i++)
                    rc = (i && cp_buf_append(&r->body, ",", 1)) || json_str_out(&r->body, l.v[i])
                             ? CP_ENOMEM
                             : 0;
                if (!rc) rc = cp_buf_append(&r->body, "]\n", 2);
                cp_string_list_close(&l);
                if (rc) store_failed(r, rc, &err);
            }
        }
    }
    cp_query_close(&q);
    cp_buf_close(&seltext);
    cp_params_close(&pa);
}

/* The methods served, each with its messages in application/proto (SelectMergeProfile's
 * answer is pprof itself: no response table, and proto only). */
enum { PT, LN, LV, SMS, SS, SER, SMP, GPS, DIFF, NMETHODS };
static const struct method {
    const char *name;
    const cp_pbj_msg *req, *resp;
} g_methods[NMETHODS] = {
    [PT] = {"ProfileTypes", &pb_types_req, &pb_types_resp},
    [LN] = {"LabelNames", &pb_names_req, &pb_names_resp},
    [LV] = {"LabelValues", &pb_values_req, &pb_names_resp},
    [SMS] = {"SelectMergeStacktraces", &pb_sms_req, &pb_sms_resp},
    [SS] = {"SelectSeries", &pb_ss_req, &pb_ss_resp},
    [SER] = {"Series", &pb_series_req, &pb_series_resp},
    [SMP] = {"SelectMergeProfile", &pb_smp_req, NULL},
    [GPS] = {"GetProfileStats", &pb_stats_req, &pb_stats_resp},
    [DIFF] = {"Diff", &pb_diff_req, &pb_diff_resp},
};

/* req's body as the tree its JSON would parse to: JSON read, or proto decoded (gunzip'd by
 * Content-Encoding). 0 with *out, or -1 with the error answer set. */
static int read_body(const cp_http_request *req, int proto, const cp_pbj_msg *m, cp_json **out,
                     cp_http_response *r)
{
    cp_err err = {0};
    char msg[300];
    *out = NULL;
    if (!proto) {
        if (cp_json_parse(req->body_len ? (const char *)req->body : "{}",
                          req->body_len ? req->body_len : 2, out, &err) ||
            (*out)->type != CP_JSON_OBJECT) {
            snprintf(msg, sizeof msg, "the request is not a JSON object: %s", err.msg);
            connect_error(r, 400, "invalid_argument", msg);
            return -1;
        }
        return 0;
    }
    const uint8_t *body = req->body;
    size_t len = req->body_len;
    cp_buf gz = {0};
    int rc = 0;
    if (!strcasecmp(req->content_encoding, "gzip")) {
        rc = cp_gunzip(body, len, 1 << 20, &gz, &err);
        body = gz.data;
        len = gz.len;
    } else if (req->content_encoding[0] && strcasecmp(req->content_encoding, "identity")) {
        rc = cp_err_set(&err, CP_EINVAL, "Content-Encoding '%.32s': expected gzip or identity",
                        req->content_encoding);
    }
    if (!rc) rc = cp_pbj_decode(m, body, len, out, &err);
    cp_buf_close(&gz);
    if (rc == CP_ENOMEM) {
        connect_error(r, 503, "unavailable", "out of memory");
    } else if (rc) {
        snprintf(msg, sizeof msg, "the request body: %s", err.msg);
        connect_error(r, 400, "invalid_argument", msg);
    }
    return rc ? -1 : 0;
}

/* Replaces r's JSON answer by its encoding as m (errors stay JSON, as Connect's are). */
static void answer_proto(const cp_pbj_msg *m, cp_http_response *r)
{
    if (r->status && r->status != 200) return; /* 0: 200, unset */
    cp_json *j = NULL;
    cp_err err = {0};
    cp_buf out = {0};
    int rc = cp_json_parse((const char *)r->body.data, r->body.len, &j, &err);
    if (!rc) rc = cp_pbj_encode(m, j, &out, &err);
    cp_json_free(j);
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "encoding the answer as %s: %s", m->name, err.msg);
        cp_buf_close(&out);
        connect_error(r, rc == CP_ENOMEM ? 503 : 500, rc == CP_ENOMEM ? "unavailable" : "internal",
                      msg);
        return;
    }
    cp_buf_close(&r->body);
    r->body = out;
    snprintf(r->content_type, sizeof r->content_type, "application/proto");
}

void cp_querier_handle(const cp_querier_call *c, const char *method, const cp_http_request *req,
                       cp_http_response *r)
{
    int proto = !strncasecmp(req->content_type, "application/proto", 17);
    if (!proto && strncasecmp(req->content_type, "application/json", 16)) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "Content-Type '%.64s': expected application/proto or application/json",
                 req->content_type);
        connect_error(r, 415, "unimplemented", msg);
        return;
    }
    int m = 0;
    while (m < NMETHODS && strcmp(method, g_methods[m].name))
        m++;
    if (m == NMETHODS) {
        char msg[200];
        snprintf(msg, sizeof msg, "querier.v1.QuerierService/%.64s is not served", method);
        connect_error(r, 404, "unimplemented", msg);
        return;
    }
    cp_json *body = NULL;
    if (read_body(req, proto, g_methods[m].req, &body, r)) return;
    if (m == GPS || m == DIFF) {
        if (m == GPS) profile_stats(c, req, r);
        if (m == DIFF) diff(c, req, body, r);
        if (proto) answer_proto(g_methods[m].resp, r);
        cp_json_free(body);
        return;
    }
    const char *sel = m == SMS || m == SS || m == SMP
                          ? cp_json_str(member(body, "labelSelector", "label_selector"), NULL)
                          : first_matcher(body);
    cp_query q;
    cp_buf seltext = {0};
    uint32_t types;
    if (!make_query(c, req, body, sel, &q, &seltext, &types, r)) {
        if (m == PT) profile_types(c, &q, types, 0, r);
        if (m == LN) label_names(c, &q, types, r);
        if (m == LV) label_values(c, &q, types, body, r);
        if (m == SMS) merge_stacktraces(c, &q, types, body, r);
        if (m == SS) select_series(c, &q, types, body, r);
        if (m == SER) series(c, &q, types, body, r);
        if (m == SMP) merge_profile(c, &q, types, body, proto, r);
        if (proto && g_methods[m].resp) answer_proto(g_methods[m].resp, r);
    }
    cp_query_close(&q);
    cp_buf_close(&seltext);
    cp_json_free(body);
}
