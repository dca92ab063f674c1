/* Human tables of the API's JSON answers for the CLI (see views.h): a small aligned-table
 * printer, and one view per endpoint. */
#include "views.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "render.h"
#include "times.h"

/* ---- aligned tables ----------------------------------------------------------------- */

typedef struct table {
    uint32_t ncols;
    uint32_t right; /* bit c: column c (< 32) is right-aligned (numbers) */
    CP_VEC(char *) cells;
    int nomem;
} table;

static void table_close(table *t)
{
    for (uint32_t i = 0; i < t->cells.n; i++)
        free(t->cells.v[i]);
    free(t->cells.v);
}

static void cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cell(table *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, aq);
    va_end(aq);
    if (!s || cp_vec_push(&t->cells, s)) {
        free(s);
        t->nomem = 1;
    }
}

/* Display width: UTF-8 code points (continuation bytes take no column). */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xc0) != 0x80;
    return w;
}

/* Two spaces between columns; no blanks at the end of a line. */
static int table_print(const table *t, cp_buf *out)
{
    if (t->nomem) return CP_ENOMEM;
    size_t *w = calloc(t->ncols, sizeof *w);
    if (!w) return CP_ENOMEM;
    for (uint32_t i = 0; i < t->cells.n; i++) {
        size_t x = width(t->cells.v[i]);
        if (x > w[i % t->ncols]) w[i % t->ncols] = x;
    }
    int rc = 0;
    for (uint32_t i = 0; i < t->cells.n && !rc; i++) {
        uint32_t c = i % t->ncols;
        const char *s = t->cells.v[i];
        int pad = (int)(w[c] - width(s));
        int right = c < 32 && (t->right >> c & 1);
        rc = cp_buf_printf(out, "%s%*s%s%*s", c ? "  " : "", right ? pad : 0, "", s,
                           right ? 0 : pad, "");
        if (!rc && c == t->ncols - 1) {
            while (out->len && out->data[out->len - 1] == ' ')
                out->len--;
            rc = cp_buf_append(out, "\n", 1);
        }
    }
    free(w);
    return rc ? CP_ENOMEM : 0;
}

/* Saturating arithmetic and conversions: the views read whatever a server sent, and a
 * bogus answer must not overflow. */
static int64_t add_sat(int64_t a, int64_t b)
{
    int64_t r;
    if (!__builtin_add_overflow(a, b, &r)) return r;
    return b > 0 ? INT64_MAX : INT64_MIN;
}

static int64_t sub_sat(int64_t a, int64_t b)
{
    int64_t r;
    if (!__builtin_sub_overflow(a, b, &r)) return r;
    return b < 0 ? INT64_MAX : INT64_MIN;
}

static int64_t d2i(double x)
{
    if (!(x == x)) return 0; /* NaN */
    if (x >= 9.2e18) return INT64_MAX;
    if (x <= -9.2e18) return INT64_MIN;
    return (int64_t)(x < 0 ? x - 0.5 : x + 0.5);
}

/* "2025-11-24T16:00:00.000Z" -> "2025-11-24T16:00:00Z" (milliseconds kept when not 0). */
static void short_time(const char *s, char *buf, size_t len)
{
    size_t n = strlen(s);
    if (n == 24 && strcmp(s + 19, ".000Z") == 0)
        snprintf(buf, len, "%.19sZ", s);
    else
        snprintf(buf, len, "%s", s);
}

static void upper(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    for (; s[i] && i + 1 < len; i++)
        buf[i] = (char)(s[i] >= 'a' && s[i] <= 'z' ? s[i] - 'a' + 'A' : s[i]);
    buf[i] = 0;
}

static int parse(const char *json, size_t len, const char *what, cp_json **j, cp_err *err)
{
    cp_err e = {0};
    int rc = cp_json_parse(json, len, j, &e);
    if (rc) return cp_err_set(err, rc, "the server's %s answer: %s", what, e.msg);
    return 0;
}

static int missing(cp_json *j, const char *what, const char *field, cp_err *err)
{
    cp_json_free(j);
    return cp_err_set(err, CP_EPARSE, "the server's %s answer has no %s", what, field);
}

/* ---- series ------------------------------------------------------------------------- */

static const char *const well_known[] = {"service", "version", "instance", "isolate"};

static int name_rank(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, well_known[i]) == 0) return i;
    return 4;
}

static int cmp_names(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    int rx = name_rank(x), ry = name_rank(y);
    return rx != ry ? rx - ry : strcmp(x, y);
}

static int kind_rank(const char *t)
{
    return !strcmp(t, "cpu") ? 0 : !strcmp(t, "alloc") ? 1 : !strcmp(t, "inuse") ? 2 : 3;
}

typedef struct srow {
    char **cells; /* ncols */
    uint32_t ncols;
} srow;

static int cmp_srow(const void *a, const void *b)
{
    const srow *x = a, *y = b;
    int k = kind_rank(x->cells[0]) - kind_rank(y->cells[0]);
    if (k) return k;
    for (uint32_t c = 0; c < x->ncols; c++) {
        int r = strcmp(x->cells[c], y->cells[c]);
        if (r) return r;
    }
    return 0;
}

int cp_view_series(const char *json, size_t len, cp_buf *out, cp_err *err)
{
    cp_json *j;
    int rc = parse(json, len, "series", &j, err);
    if (rc) return rc;
    const cp_json *list = cp_json_get(j, "series");
    if (!list || list->type != CP_JSON_ARRAY) return missing(j, "series", "\"series\" list", err);
    /* The union of label names. */
    CP_VEC(const char *) names = {0};
    for (uint32_t i = 0; i < list->n && !rc; i++) {
        const cp_json *l = cp_json_get(list->items[i], "labels");
        for (uint32_t k = 0; l && l->type == CP_JSON_OBJECT && k < l->n && !rc; k++) {
            int seen = 0;
            for (uint32_t q = 0; q < names.n; q++)
                seen |= !strcmp(names.v[q], l->keys[k]);
            if (!seen) rc = cp_vec_push(&names, l->keys[k]);
        }
    }
    if (names.n) qsort(names.v, names.n, sizeof *names.v, cmp_names);
    uint32_t ncols = names.n + 3;
    table t = {.ncols = ncols};
    srow *rows = calloc(list->n + 1, sizeof *rows);
    if (!rows) rc = CP_ENOMEM;
    if (!rc) {
        cell(&t, "TYPE");
        for (uint32_t q = 0; q < names.n; q++) {
            char h[160];
            upper(names.v[q], h, sizeof h);
            cell(&t, "%s", h);
        }
        cell(&t, "FIRST");
        cell(&t, "LAST");
    }
    for (uint32_t i = 0; i < list->n && !rc; i++) {
        const cp_json *s = list->items[i];
        const cp_json *l = cp_json_get(s, "labels");
        srow *r = &rows[i];
        r->ncols = ncols;
        if (!(r->cells = calloc(ncols, sizeof *r->cells))) {
            rc = CP_ENOMEM;
            break;
        }
        char a[64], b[64];
        short_time(cp_json_str(cp_json_get(s, "first"), "-"), a, sizeof a);
        short_time(cp_json_str(cp_json_get(s, "last"), "-"), b, sizeof b);
        r->cells[0] = strdup(cp_json_str(cp_json_get(s, "type"), "-"));
        for (uint32_t q = 0; q < names.n; q++)
            r->cells[q + 1] = strdup(cp_json_str(cp_json_get(l, names.v[q]), "-"));
        r->cells[ncols - 2] = strdup(a);
        r->cells[ncols - 1] = strdup(b);
        for (uint32_t c = 0; c < ncols; c++)
            if (!r->cells[c]) rc = CP_ENOMEM;
    }
    if (!rc) {
        qsort(rows, list->n, sizeof *rows, cmp_srow);
        for (uint32_t i = 0; i < list->n; i++)
            for (uint32_t c = 0; c < ncols; c++)
                cell(&t, "%s", rows[i].cells[c]);
        rc = table_print(&t, out);
    }
    for (uint32_t i = 0; rows && i < list->n; i++) {
        for (uint32_t c = 0; rows[i].cells && c < ncols; c++)
            free(rows[i].cells[c]);
        free(rows[i].cells);
    }
    free(rows);
    free(names.v);
    table_close(&t);
    cp_json_free(j);
    return rc == CP_ENOMEM ? cp_err_set(err, CP_ENOMEM, "out of memory") : rc;
}

/* ---- labels ------------------------------------------------------------------------- */

int cp_view_labels(const char *json, size_t len, cp_buf *out, cp_err *err)
{
    cp_json *j;
    int rc = parse(json, len, "labels", &j, err);
    if (rc) return rc;
    const char *name = cp_json_str(cp_json_get(j, "name"), NULL);
    const cp_json *l = cp_json_get(j, name ? "values" : "labels");
    if (!l || l->type != CP_JSON_ARRAY)
        return missing(j, "labels", name ? "\"values\" list" : "\"labels\" list", err);
    table t = {.ncols = 1};
    char h[160];
    upper(name ? name : "label", h, sizeof h);
    cell(&t, "%s", h);
    for (uint32_t i = 0; i < l->n; i++)
        cell(&t, "%s", cp_json_str(l->items[i], "?"));
    rc = table_print(&t, out);
    table_close(&t);
    cp_json_free(j);
    return rc ? cp_err_set(err, rc, "out of memory") : 0;
}

/* ---- timeline ----------------------------------------------------------------------- */

#define BAR_WIDTH 40

int cp_view_timeline(const char *json, size_t len, cp_buf *out, cp_err *err)
{
    cp_json *j;
    int rc = parse(json, len, "timeline", &j, err);
    if (rc) return rc;
    const cp_json *types = cp_json_get(j, "sample_types"), *pts = cp_json_get(j, "points");
    if (!types || types->type != CP_JSON_ARRAY || !types->n || types->n > 8 || !pts ||
        pts->type != CP_JSON_ARRAY)
        return missing(j, "timeline", "\"sample_types\" and \"points\"", err);
    uint32_t nt = types->n, last = nt - 1;
    const char *unit = cp_json_str(cp_json_get(types->items[last], "unit"), "count");
    int64_t max = 0, sum = 0;
    for (uint32_t i = 0; i < pts->n; i++) {
        const cp_json *p = pts->items[i];
        if (p->type != CP_JSON_ARRAY || p->n != nt + 1)
            return missing(j, "timeline", "[time, values...] points", err);
        int64_t v = cp_json_int(p->items[nt], 0);
        if (v > max) max = v;
        sum = add_sat(sum, v);
    }
    char f[64], to[64], step[32], total[32];
    short_time(cp_json_str(cp_json_get(j, "from"), "?"), f, sizeof f);
    short_time(cp_json_str(cp_json_get(j, "to"), "?"), to, sizeof to);
    const cp_json *ss = cp_json_get(j, "step_seconds");
    cp_render_value(ss ? d2i(ss->num * 1e9) : 0, "nanoseconds", step, sizeof step);
    cp_render_value(sum, unit, total, sizeof total);
    rc = cp_buf_printf(out, "Type: %s, %s .. %s, step %s, %s total %s\n",
                       cp_json_str(cp_json_get(j, "type"), "?"), f, to, step,
                       cp_json_str(cp_json_get(types->items[last], "type"), "value"), total);
    table t = {.ncols = nt + 2};
    cell(&t, "TIME");
    for (uint32_t k = 0; k < nt; k++) {
        char h[64];
        upper(cp_json_str(cp_json_get(types->items[k], "type"), "value"), h, sizeof h);
        cell(&t, "%s", h);
        t.right |= 1u << (k + 1);
    }
    cell(&t, "%s", "");
    for (uint32_t i = 0; i < pts->n; i++) {
        const cp_json *p = pts->items[i];
        char tb[40], v[32];
        double secs = p->items[0]->num;
        cp_format_time(d2i(secs * 1e9), tb, sizeof tb);
        char ts[40];
        short_time(tb, ts, sizeof ts);
        cell(&t, "%s", ts);
        for (uint32_t k = 0; k < nt; k++) {
            const char *u = cp_json_str(cp_json_get(types->items[k], "unit"), "count");
            cp_render_value(cp_json_int(p->items[k + 1], 0), u, v, sizeof v);
            cell(&t, "%s", v);
        }
        int64_t x = cp_json_int(p->items[nt], 0);
        int n = max > 0 && x > 0 ? (int)((x * (double)BAR_WIDTH) / (double)max + 0.5) : 0;
        if (x > 0 && n == 0) n = 1;
        char bar[BAR_WIDTH + 1];
        memset(bar, '#', (size_t)n);
        bar[n] = 0;
        cell(&t, "%s", bar);
    }
    if (!rc) rc = table_print(&t, out);
    table_close(&t);
    cp_json_free(j);
    return rc ? cp_err_set(err, rc, "out of memory") : 0;
}

/* ---- diff --------------------------------------------------------------------------- */

typedef struct fn {
    const char *name;
    int64_t flat, cum;
} fn;

typedef struct walk {
    CP_VEC(fn) fns;
    CP_VEC(const char *) path;
    int nomem;
} walk;

/* Adds node's self delta to its function's flat, and its total delta to cum unless an
 * ancestor is the same function (recursion counts once, as in pprof). */
static void visit(walk *w, const cp_json *node, int depth)
{
    if (!node || node->type != CP_JSON_OBJECT || w->nomem || depth > 4096) return;
    const char *name = cp_json_str(cp_json_get(node, "name"), NULL);
    int64_t self = cp_json_int(cp_json_get(node, "self"), 0);
    int64_t bself = cp_json_int(cp_json_get(node, "base_self"), 0);
    int64_t total = cp_json_int(cp_json_get(node, "total"), 0);
    int64_t btotal = cp_json_int(cp_json_get(node, "base_total"), 0);
    int pushed = 0;
    if (name && depth > 0) { /* depth 0 is the root, "total" */
        int inside = 0;
        for (uint32_t i = 0; i < w->path.n; i++)
            inside |= !strcmp(w->path.v[i], name);
        fn f = {
            .name = name, .flat = sub_sat(self, bself), .cum = inside ? 0 : sub_sat(total, btotal)};
        if (cp_vec_push(&w->fns, f) || cp_vec_push(&w->path, name)) {
            w->nomem = 1;
            return;
        }
        pushed = 1;
    }
    const cp_json *kids = cp_json_get(node, "children");
    for (uint32_t i = 0; kids && kids->type == CP_JSON_ARRAY && i < kids->n; i++)
        visit(w, kids->items[i], depth + 1);
    if (pushed) w->path.n--;
}

static int cmp_fn_name(const void *a, const void *b)
{
    return strcmp(((const fn *)a)->name, ((const fn *)b)->name);
}

static int64_t abs64(int64_t v)
{
    return v == INT64_MIN ? INT64_MAX : v < 0 ? -v : v;
}

static int cmp_fn_change(const void *a, const void *b)
{
    const fn *x = a, *y = b;
    if (abs64(x->flat) != abs64(y->flat)) return abs64(x->flat) > abs64(y->flat) ? -1 : 1;
    if (abs64(x->cum) != abs64(y->cum)) return abs64(x->cum) > abs64(y->cum) ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A signed value with units: +1.20s, -512kB, 0. */
static void signed_value(int64_t v, const char *unit, char *buf, size_t len)
{
    size_t k = 0;
    if (v > 0 && len > 1) buf[k++] = '+';
    cp_render_value(v, unit, buf + k, len - k);
}

static void pct(int64_t v, int64_t base, char *buf, size_t len)
{
    if (!base)
        snprintf(buf, len, "-");
    else if (!v)
        snprintf(buf, len, "0%%");
    else
        snprintf(buf, len, "%+.2f%%", 100.0 * (double)v / (double)base);
}

int cp_view_diff(const char *json, size_t len, uint32_t rows, cp_buf *out, cp_err *err)
{
    cp_json *j;
    int rc = parse(json, len, "diff", &j, err);
    if (rc) return rc;
    const cp_json *root = cp_json_get(j, "root"), *st = cp_json_get(j, "sample_type");
    if (!root || !cp_json_get(j, "base_total")) return missing(j, "diff", "\"root\" tree", err);
    const char *unit = cp_json_str(cp_json_get(st, "unit"), "count");
    int64_t total = cp_json_int(cp_json_get(j, "total"), 0);
    int64_t btotal = cp_json_int(cp_json_get(j, "base_total"), 0);
    walk w = {0};
    visit(&w, root, 0);
    /* One row per function: sum its nodes. */
    uint32_t n = 0;
    if (!w.nomem && w.fns.n) {
        qsort(w.fns.v, w.fns.n, sizeof *w.fns.v, cmp_fn_name);
        for (uint32_t i = 0; i < w.fns.n; i++) {
            if (n && !strcmp(w.fns.v[n - 1].name, w.fns.v[i].name)) {
                fn *f = &w.fns.v[n - 1];
                f->flat = add_sat(f->flat, w.fns.v[i].flat);
                f->cum = add_sat(f->cum, w.fns.v[i].cum);
            } else {
                w.fns.v[n++] = w.fns.v[i];
            }
        }
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++)
            if (w.fns.v[i].flat || w.fns.v[i].cum) w.fns.v[k++] = w.fns.v[i];
        n = k;
        qsort(w.fns.v, n, sizeof *w.fns.v, cmp_fn_change);
    }
    char f[64], t[64], bf[64], bt[64], a[32], b[32], d[40], p[32];
    short_time(cp_json_str(cp_json_get(j, "from"), "?"), f, sizeof f);
    short_time(cp_json_str(cp_json_get(j, "to"), "?"), t, sizeof t);
    short_time(cp_json_str(cp_json_get(j, "base_from"), "?"), bf, sizeof bf);
    short_time(cp_json_str(cp_json_get(j, "base_to"), "?"), bt, sizeof bt);
    cp_render_value(total, unit, a, sizeof a);
    cp_render_value(btotal, unit, b, sizeof b);
    signed_value(sub_sat(total, btotal), unit, d, sizeof d);
    pct(sub_sat(total, btotal), btotal, p, sizeof p);
    uint32_t shown = rows && rows < n ? rows : n;
    rc = w.nomem
             ? CP_ENOMEM
             : cp_buf_printf(out,
                             "Type: %s\nTarget: %s .. %s, total %s\nBase:   %s .. %s, total "
                             "%s\nChange: %s (%s of base)\n",
                             cp_json_str(cp_json_get(st, "type"), "?"), f, t, a, bf, bt, b, d, p);
    if (!rc && shown < n)
        rc = cp_buf_printf(out, "Showing top %u of %u changed functions\n", shown, n);
    table tb = {.ncols = 5, .right = 0xf};
    cell(&tb, "flat");
    cell(&tb, "flat%%");
    cell(&tb, "cum");
    cell(&tb, "cum%%");
    cell(&tb, "name");
    for (uint32_t i = 0; i < shown; i++) {
        const fn *x = &w.fns.v[i];
        char v1[40], v2[32], v3[40], v4[32];
        signed_value(x->flat, unit, v1, sizeof v1);
        pct(x->flat, btotal, v2, sizeof v2);
        signed_value(x->cum, unit, v3, sizeof v3);
        pct(x->cum, btotal, v4, sizeof v4);
        cell(&tb, "%s", v1);
        cell(&tb, "%s", v2);
        cell(&tb, "%s", v3);
        cell(&tb, "%s", v4);
        cell(&tb, "%s", x->name);
    }
    if (!rc) rc = table_print(&tb, out);
    table_close(&tb);
    free(w.fns.v);
    free(w.path.v);
    cp_json_free(j);
    return rc ? cp_err_set(err, rc, "out of memory") : 0;
}
