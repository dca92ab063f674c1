/* The statistics registry (metrics.h): families of series whose values their stages own,
 * and collectors, kept in registration order and printed as Prometheus text. */
#include "metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>

#include "check.h"
#include "json.h"

typedef enum { V_COUNTER, V_GAUGE, V_GAUGE_F } value_kind;

typedef struct series {
    const void *owner;
    char *labels; /* printed form, `{a="b"}`, or "" */
    value_kind kind;
    int decimals;
    void *value;
} series;

/* One entry in print order: a family of owned series, or a collector. */
typedef struct item {
    char *name, *help; /* NULL: a collector */
    cp_metric_type type;
    CP_VEC(series) s;
    const void *owner; /* a collector's */
    cp_metrics_collect_fn fn;
    void *arg;
} item;

struct cp_metrics {
    pthread_mutex_t mu;
    CP_VEC(item *) items;
};

struct cp_metrics_out {
    cp_buf *b;
    const char *name; /* the family being written */
};

static const char *const g_type_names[] = {"counter", "gauge", "histogram"};

int cp_metrics_create(cp_metrics **out)
{
    cp_metrics *r = calloc(1, sizeof *r);
    if (!r) return CP_ENOMEM;
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

static void item_free(item *it)
{
    if (!it) return;
    for (uint32_t i = 0; i < it->s.n; i++)
        free(it->s.v[i].labels);
    free(it->s.v);
    free(it->name);
    free(it->help);
    free(it);
}

void cp_metrics_destroy(cp_metrics *r)
{
    if (!r) return;
    for (uint32_t i = 0; i < r->items.n; i++)
        item_free(r->items.v[i]);
    free(r->items.v);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Appends `{a="b",c="d"}` (nothing when n == 0), values escaped as the API escapes JSON
 * strings (quote, backslash, control bytes). */
static int put_labels(cp_buf *b, const cp_metric_label *l, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *v = l[i].value ? l[i].value : "";
        rc = cp_buf_printf(b, "%s%s=\"", i ? "," : "{", l[i].name);
        if (!rc) rc = cp_json_escape(b, v, strlen(v));
        if (!rc) rc = cp_buf_append(b, "\"", 1);
    }
    if (!rc && n) rc = cp_buf_append(b, "}", 1);
    return rc;
}

/* Help text as the format wants it: backslash and newline escaped. */
static int put_help(cp_buf *b, const char *name, const char *help, cp_metric_type type)
{
    int rc = cp_buf_printf(b, "# HELP %s ", name);
    for (const char *p = help; *p && !rc; p++) {
        if (*p == '\\')
            rc = cp_buf_append(b, "\\\\", 2);
        else if (*p == '\n')
            rc = cp_buf_append(b, "\\n", 2);
        else
            rc = cp_buf_append(b, p, 1);
    }
    if (!rc) rc = cp_buf_printf(b, "\n# TYPE %s %s\n", name, g_type_names[type]);
    return rc;
}

static int add_series(cp_metrics *r, const void *owner, const char *name, const char *help,
                      cp_metric_type type, const cp_metric_label *labels, size_t nlabels,
                      value_kind kind, int decimals, void *value)
{
    CP_ASSERT(r && name && help && value && (labels || !nlabels));
    cp_buf lb = {0};
    if (put_labels(&lb, labels, nlabels) || cp_buf_append(&lb, "", 1)) {
        cp_buf_close(&lb);
        return CP_ENOMEM;
    }
    series s = {owner, (char *)lb.data, kind, decimals, value};
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    item *fam = NULL;
    for (uint32_t i = 0; i < r->items.n && !fam; i++)
        if (r->items.v[i]->name && strcmp(r->items.v[i]->name, name) == 0) fam = r->items.v[i];
    if (fam) {
        if (fam->type != type || strcmp(fam->help, help) != 0) rc = CP_EINVAL;
        for (uint32_t i = 0; i < fam->s.n && !rc; i++)
            if (strcmp(fam->s.v[i].labels, s.labels) == 0) rc = CP_EINVAL;
        if (!rc) rc = cp_vec_push(&fam->s, s);
    } else {
        item *it = calloc(1, sizeof *it);
        if (it) {
            it->type = type;
            it->name = strdup(name);
            it->help = strdup(help);
        }
        if (!it || !it->name || !it->help || cp_vec_push(&it->s, s) || cp_vec_push(&r->items, it)) {
            if (it) it->s.n = 0; /* s.labels is freed below */
            item_free(it);
            rc = CP_ENOMEM;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) free(s.labels);
    return rc;
}

int cp_metrics_counter(cp_metrics *r, const void *owner, const char *name, const char *help,
                       const cp_metric_label *labels, size_t nlabels, cp_counter *c)
{
    return add_series(r, owner, name, help, CP_METRIC_COUNTER, labels, nlabels, V_COUNTER, 0, c);
}

int cp_metrics_gauge(cp_metrics *r, const void *owner, const char *name, const char *help,
                     const cp_metric_label *labels, size_t nlabels, cp_gauge *g)
{
    return add_series(r, owner, name, help, CP_METRIC_GAUGE, labels, nlabels, V_GAUGE, 0, g);
}

int cp_metrics_gauge_f(cp_metrics *r, const void *owner, const char *name, const char *help,
                       const cp_metric_label *labels, size_t nlabels, int decimals, cp_gauge_f *g)
{
    return add_series(r, owner, name, help, CP_METRIC_GAUGE, labels, nlabels, V_GAUGE_F, decimals,
                      g);
}

int cp_metrics_collector(cp_metrics *r, const void *owner, cp_metrics_collect_fn fn, void *arg)
{
    CP_ASSERT(r && fn);
    item *it = calloc(1, sizeof *it);
    if (!it) return CP_ENOMEM;
    it->owner = owner;
    it->fn = fn;
    it->arg = arg;
    pthread_mutex_lock(&r->mu);
    int rc = cp_vec_push(&r->items, it);
    pthread_mutex_unlock(&r->mu);
    if (rc) free(it);
    return rc;
}

void cp_metrics_remove(cp_metrics *r, const void *owner)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    uint32_t keep = 0;
    for (uint32_t i = 0; i < r->items.n; i++) {
        item *it = r->items.v[i];
        if (it->name) {
            uint32_t k = 0;
            for (uint32_t j = 0; j < it->s.n; j++) {
                if (it->s.v[j].owner == owner)
                    free(it->s.v[j].labels);
                else
                    it->s.v[k++] = it->s.v[j];
            }
            it->s.n = k;
        }
        if (it->name ? it->s.n == 0 : it->owner == owner)
            item_free(it);
        else
            r->items.v[keep++] = it;
    }
    r->items.n = keep;
    pthread_mutex_unlock(&r->mu);
}

static int put_series(cp_buf *b, const char *name, const series *s)
{
    switch (s->kind) {
    case V_COUNTER:
        return cp_buf_printf(b, "%s%s %" PRIu64 "\n", name, s->labels,
                             cp_counter_get((const cp_counter *)s->value));
    case V_GAUGE:
        return cp_buf_printf(b, "%s%s %" PRId64 "\n", name, s->labels,
                             cp_gauge_get((const cp_gauge *)s->value));
    case V_GAUGE_F:
        return cp_buf_printf(b, "%s%s %.*f\n", name, s->labels, s->decimals,
                             cp_gauge_f_get((const cp_gauge_f *)s->value));
    }
    return CP_EINVAL;
}

int cp_metrics_write(cp_metrics *r, cp_buf *b)
{
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->items.n && !rc; i++) {
        const item *it = r->items.v[i];
        if (!it->name) {
            cp_metrics_out o = {b, NULL};
            rc = it->fn(it->arg, &o);
            continue;
        }
        rc = put_help(b, it->name, it->help, it->type);
        for (uint32_t j = 0; j < it->s.n && !rc; j++)
            rc = put_series(b, it->name, &it->s.v[j]);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---- collectors' output ------------------------------------------------------------- */

int cp_metrics_out_family(cp_metrics_out *o, const char *name, const char *help,
                          cp_metric_type type)
{
    o->name = name;
    return put_help(o->b, name, help, type);
}

static int out_head(cp_metrics_out *o, const char *suffix, const cp_metric_label *l, size_t n)
{
    CP_ASSERT(o->name); /* a sample belongs to the family cp_metrics_out_family started */
    int rc = cp_buf_printf(o->b, "%s%s", o->name ? o->name : "", suffix ? suffix : "");
    if (!rc) rc = put_labels(o->b, l, n);
    return rc;
}

int cp_metrics_out_u64(cp_metrics_out *o, const char *suffix, const cp_metric_label *labels,
                       size_t nlabels, uint64_t v)
{
    int rc = out_head(o, suffix, labels, nlabels);
    return rc ? rc : cp_buf_printf(o->b, " %" PRIu64 "\n", v);
}

int cp_metrics_out_i64(cp_metrics_out *o, const char *suffix, const cp_metric_label *labels,
                       size_t nlabels, int64_t v)
{
    int rc = out_head(o, suffix, labels, nlabels);
    return rc ? rc : cp_buf_printf(o->b, " %" PRId64 "\n", v);
}

int cp_metrics_out_f64(cp_metrics_out *o, const char *suffix, const cp_metric_label *labels,
                       size_t nlabels, double v, int decimals)
{
    int rc = out_head(o, suffix, labels, nlabels);
    return rc ? rc : cp_buf_printf(o->b, " %.*f\n", decimals, v);
}

int cp_metrics_out_scalar(cp_metrics_out *o, const char *name, const char *help,
                          cp_metric_type type, uint64_t v)
{
    int rc = cp_metrics_out_family(o, name, help, type);
    return rc ? rc : cp_metrics_out_u64(o, NULL, NULL, 0, v);
}
