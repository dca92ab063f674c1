/* Query-string decoding for the query API, and the parser that makes an endpoint's request
 * a cp_query (times and durations: model/times.c). */
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- query strings ------------------------------------------------------------------ */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes s[0..n) into a new string. */
static int url_decode(const char *s, size_t n, char **out, size_t *bad_at)
{
    char *d = malloc(n + 1);
    if (!d) return CP_ENOMEM;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%') {
            if (i + 2 >= n || hexval(s[i + 1]) < 0 || hexval(s[i + 2]) < 0) {
                free(d);
                *bad_at = i;
                return CP_EPARSE;
            }
            c = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
            if (c == 0) {
                free(d);
                *bad_at = i - 2;
                return CP_EPARSE;
            }
        }
        d[j++] = c;
    }
    d[j] = 0;
    *out = d;
    return 0;
}

void cp_params_close(cp_params *p)
{
    cp_label_pairs_free(p->p.v, p->p.n);
    memset(p, 0, sizeof *p);
}

int cp_params_parse(const char *query, cp_params *out, cp_err *err)
{
    const char *s = query ? query : "";
    while (*s) {
        const char *amp = strchr(s, '&');
        size_t n = amp ? (size_t)(amp - s) : strlen(s);
        if (n > 0) {
            const char *eq = memchr(s, '=', n);
            size_t nl = eq ? (size_t)(eq - s) : n;
            cp_param prm = {0};
            size_t bad = 0;
            int rc = url_decode(s, nl, &prm.name, &bad);
            if (!rc)
                rc = eq ? url_decode(eq + 1, n - nl - 1, &prm.value, &bad)
                        : ((prm.value = strdup("")) ? 0 : CP_ENOMEM);
            if (rc == CP_EPARSE) {
                free(prm.name);
                return cp_err_set(err, CP_EPARSE, "query string: bad percent escape in '%.*s'",
                                  (int)(n > 64 ? 64 : n), s);
            }
            if (rc) {
                free(prm.name);
                return cp_err_set(err, CP_ENOMEM, "out of memory");
            }
            if (cp_params_get(out, prm.name)) {
                cp_err_set(err, CP_EPARSE, "parameter '%.64s' given more than once", prm.name);
                free(prm.name);
                free(prm.value);
                return CP_EPARSE;
            }
            if (out->p.n >= CP_PARAMS_MAX || cp_vec_push(&out->p, prm)) {
                free(prm.name);
                free(prm.value);
                if (out->p.n >= CP_PARAMS_MAX)
                    return cp_err_set(err, CP_EPARSE, "more than %d query parameters",
                                      CP_PARAMS_MAX);
                return cp_err_set(err, CP_ENOMEM, "out of memory");
            }
        }
        if (!amp) break;
        s = amp + 1;
    }
    return 0;
}

const char *cp_params_get(const cp_params *p, const char *name)
{
    for (uint32_t i = 0; i < p->p.n; i++)
        if (strcmp(p->p.v[i].name, name) == 0) return p->p.v[i].value;
    return NULL;
}

/* 1 if name is in list (NULL-terminated; NULL: empty). */
static int listed(const char *const *list, const char *name)
{
    for (const char *const *a = list; a && *a; a++)
        if (strcmp(*a, name) == 0) return 1;
    return 0;
}

/* cp_params_check, with the names in also (NULL-terminated; NULL: none) allowed too but not
 * named in the error. */
static int check_names(const cp_params *p, const char *const *allowed, const char *const *also,
                       cp_err *err)
{
    for (uint32_t i = 0; i < p->p.n; i++) {
        int ok = listed(allowed, p->p.v[i].name) || listed(also, p->p.v[i].name);
        if (!ok) {
            char list[256] = "";
            size_t l = 0;
            for (const char *const *a = allowed; *a && l < sizeof list - 40; a++)
                l += (size_t)snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", *a);
            return cp_err_set(err, CP_EPARSE, "unknown parameter '%.64s' (known: %s)",
                              p->p.v[i].name, list);
        }
    }
    return 0;
}

int cp_params_check(const cp_params *p, const char *const *allowed, cp_err *err)
{
    return check_names(p, allowed, NULL, err);
}

/* ---- requests as queries ------------------------------------------------------------ */

void cp_query_req_close(cp_query_req *q)
{
    cp_query_close(&q->q);
    cp_query_close(&q->base);
}

/* The cluster's parameters: local, by_series, deadline_ms and, for a peer, tenant. */
static int parse_cluster(const cp_params *pa, const cp_query_env *env, cp_query *q,
                         cp_http_response *r)
{
    const char *local = cp_params_get(pa, "local");
    if (local && strcmp(local, "1") != 0) {
        cp_http_error(r, 400, "bad local: expected local=1 (this node's part only)");
        return -1;
    }
    q->local = local != NULL;
    /* the asking node's inuse parts: per series, with their snapshots' times */
    const char *bs = cp_params_get(pa, "by_series");
    if (bs && (strcmp(bs, "1") != 0 || !q->local)) {
        cp_http_error(r, 400, "bad by_series: only by_series=1, with local=1 (a peer's part)");
        return -1;
    }
    q->by_series = bs != NULL;
    /* a peer's part is of no use once the asking node stopped waiting: its time is ours */
    const char *dl = cp_params_get(pa, "deadline_ms");
    char *end = NULL;
    long long ms = dl ? strtoll(dl, &end, 10) : 0;
    if (dl && (!*dl || *end || ms < 0 || ms > 86400000LL)) {
        cp_http_error(r, 400, "bad deadline_ms: expected 0..86400000 (milliseconds left)");
        return -1;
    }
    q->lim.deadline_ns = env->deadline_ns;
    if (dl) {
        int64_t asked = cp_mono_ns() + ms * 1000000LL;
        if (!q->lim.deadline_ns || asked < q->lim.deadline_ns) q->lim.deadline_ns = asked;
    }
    q->tenant = env->tenant;
    if (*env->tenant) return 0;
    /* a peer, by the cluster token: its request names the tenant */
    if (!q->local) {
        cp_http_error(r, 403, "the cluster token only serves peers' requests (local=1)");
        return -1;
    }
    const char *t = cp_params_get(pa, "tenant");
    size_t tl = t ? strlen(t) : 0;
    if (tl < 1 || tl > 64) {
        cp_http_error(r, 400, "a peer's request needs tenant=NAME (1..64 characters)");
        return -1;
    }
    q->tenant = t;
    return 0;
}

static int parse_kind(const char *s, cp_kind *out, cp_http_response *r)
{
    if (!s || !*s) s = "cpu";
    int k = cp_kind_parse(s);
    if (!k) {
        cp_http_error(r, 400,
                      "unknown type '%.64s' (expected cpu, alloc, inuse, wall, mutex, block, "
                      "goroutines or heap)",
                      s);
        return -1;
    }
    *out = (cp_kind)k;
    return 0;
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

static int parse_selector(const char *s, const char *pname, cp_query *q, cp_http_response *r)
{
    cp_err err = {0};
    q->select = s ? s : "";
    if (cp_selector_parse(q->select, &q->sel, &err)) {
        cp_http_error(r, 400, "bad %s: %s", pname, err.msg);
        return -1;
    }
    return 0;
}

/* A window's names and texts: from/to, or base_from/base_to. */
typedef struct window {
    const char *fname, *tname;
    const char *fs, *ts;
} window;

/* Parses w into q's from/to with defaults now-1h / now and checks the range. */
static int parse_window(const window *w, const cp_query_env *env, cp_query *q, cp_http_response *r)
{
    cp_err err = {0};
    if (!w->fs || !*w->fs)
        q->from_ns = env->now_ns - 3600LL * 1000000000LL;
    else if (cp_parse_time(w->fs, env->now_ns, &q->from_ns, &err)) {
        cp_http_error(r, 400, "bad %s: %s", w->fname, err.msg);
        return -1;
    }
    if (!w->ts || !*w->ts)
        q->to_ns = env->now_ns;
    else if (cp_parse_time(w->ts, env->now_ns, &q->to_ns, &err)) {
        cp_http_error(r, 400, "bad %s: %s", w->tname, err.msg);
        return -1;
    }
    if (q->from_ns > q->to_ns) {
        char f[40], t[40];
        cp_format_time(q->from_ns, f, sizeof f);
        cp_format_time(q->to_ns, t, sizeof t);
        cp_http_error(r, 400, "%s (%s) is after %s (%s)", w->fname, f, w->tname, t);
        return -1;
    }
    int64_t span;
    if (__builtin_sub_overflow(q->to_ns, q->from_ns, &span) || span >= (1LL << 62)) {
        cp_http_error(r, 400, "window %s..%s spans more than 146 years", w->fname, w->tname);
        return -1;
    }
    if (env->max_range_ns && span > env->max_range_ns) {
        cp_http_error(r, 400,
                      "window %s..%s of %.0f s exceeds the longest allowed window of %.0f s",
                      w->fname, w->tname, (double)span / 1e9, (double)env->max_range_ns / 1e9);
        return -1;
    }
    return 0;
}

/* from/to over all of time (default: everything the store accepts, 2^62 ns is year 2116). */
static int parse_all_time(const cp_params *pa, const cp_query_env *env, cp_query *q,
                          cp_http_response *r)
{
    cp_err err = {0};
    const char *fs = cp_params_get(pa, "from"), *ts = cp_params_get(pa, "to");
    q->from_ns = 0;
    q->to_ns = (1LL << 62) - 1;
    if (fs && *fs && cp_parse_time(fs, env->now_ns, &q->from_ns, &err)) {
        cp_http_error(r, 400, "bad from: %s", err.msg);
        return -1;
    }
    if (ts && *ts && cp_parse_time(ts, env->now_ns, &q->to_ns, &err)) {
        cp_http_error(r, 400, "bad to: %s", err.msg);
        return -1;
    }
    if (q->from_ns > q->to_ns) {
        cp_http_error(r, 400, "from is after to");
        return -1;
    }
    return 0;
}

static int parse_step(const cp_params *pa, const cp_query_env *env, cp_query *q,
                      cp_http_response *r)
{
    cp_err err = {0};
    const char *ss = cp_params_get(pa, "step");
    int64_t step = 0, span = q->to_ns - q->from_ns;
    if (ss && *ss) {
        if (cp_parse_duration(ss, 0, &step, &err)) {
            cp_http_error(r, 400, "bad step: %s", err.msg);
            return -1;
        }
    } else {
        /* About 300 points, in whole multiples of the 10 s window. */
        int64_t w = 10LL * 1000000000LL;
        step = span / 300;
        step = step <= w ? w : (step + w - 1) / w * w;
    }
    if (q->to_ns > q->from_ns && span / step >= (int64_t)env->max_steps) {
        cp_http_error(r, 400, "step %.3f s gives more than %u points for this window",
                      (double)step / 1e9, env->max_steps);
        return -1;
    }
    q->step_ns = step;
    return 0;
}

/* The endpoint's part of the query string, in the order its errors are reported. */
static int parse_form(const cp_params *pa, const cp_query_form *form, const cp_query_env *env,
                      cp_query_req *out, cp_http_response *r)
{
    cp_query *q = &out->q;
    unsigned fl = form->flags;
    const char *ty = cp_params_get(pa, "type");
    if ((fl & CP_FORM_KIND) && parse_kind(ty, &q->kind, r)) return -1;
    if (form->formats && parse_format(cp_params_get(pa, "format"), form->formats, &out->format, r))
        return -1;
    const char *fs = cp_params_get(pa, "from"), *ts = cp_params_get(pa, "to");
    if ((fl & CP_FORM_WINDOW) && parse_window(&(window){"from", "to", fs, ts}, env, q, r))
        return -1;
    if (fl & CP_FORM_BASE) {
        const char *bf = cp_params_get(pa, "base_from"), *bt = cp_params_get(pa, "base_to");
        window bw = {"base_from", "base_to", bf ? bf : fs, bt ? bt : ts};
        if (parse_window(&bw, env, &out->base, r)) return -1;
    }
    if ((fl & CP_FORM_ALL_TIME) && parse_all_time(pa, env, q, r)) return -1;
    if ((fl & CP_FORM_ANY_KIND) && ty && *ty && parse_kind(ty, &q->kind, r)) return -1;
    if ((fl & CP_FORM_STEP) && parse_step(pa, env, q, r)) return -1;
    const char *sel = cp_params_get(pa, "select");
    if ((fl & CP_FORM_SELECT) && parse_selector(sel, "select", q, r)) return -1;
    if (fl & CP_FORM_BASE) {
        const char *bs = cp_params_get(pa, "base_select");
        if (parse_selector(bs ? bs : sel, "base_select", &out->base, r)) return -1;
    }
    return 0;
}

int cp_query_parse(const cp_params *pa, const cp_query_form *form, const cp_query_env *env,
                   cp_query_req *out, cp_http_response *r)
{
    static const char *const cluster[] = {"local", "by_series", "deadline_ms", "node", NULL};
    static const char *const peer[] = {"local", "by_series", "deadline_ms", "node", "tenant", NULL};
    memset(out, 0, sizeof *out);
    cp_query *q = &out->q;
    cp_err err = {0};
    int rc = parse_cluster(pa, env, q, r);
    if (!rc && check_names(pa, form->params, *env->tenant ? cluster : peer, &err)) {
        cp_http_error(r, 400, "%s", err.msg);
        rc = -1;
    }
    q->lim.max_range_ns = env->max_range_ns;
    q->lim.max_blocks = env->max_blocks;
    if (form->flags & CP_FORM_BASE) {
        out->base = *q; /* the same tenant, kind, limits and flags; its own window, selector */
        out->base.sel = (cp_selector){0};
    }
    if (!rc) rc = parse_form(pa, form, env, out, r);
    out->base.kind = q->kind;
    if (rc) cp_query_req_close(out);
    return rc;
}
