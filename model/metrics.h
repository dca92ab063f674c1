/* The statistics registry: a stage registers each counter and gauge once, with its name,
 * help and labels (as a Prometheus client library does), and /metrics prints the registry
 * in the Prometheus text format 0.0.4. Adding a metric touches the file that counts it. */
#ifndef CP_METRICS_H
#define CP_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vec.h"

/* ---- values: owned by the stage that counts, updated without locks ------------------ */

/* A monotonic count. Zero it ({0}) to start; any thread may add (relaxed atomics: a
 * scrape sees each increment at most once, in no particular order with the others). */
typedef struct cp_counter {
    _Atomic uint64_t v;
} cp_counter;
/* A value that goes up and down (an integer). */
typedef struct cp_gauge {
    _Atomic int64_t v;
} cp_gauge;
/* A gauge holding a double (a rate); printed with the decimals given at registration. */
typedef struct cp_gauge_f {
    _Atomic uint64_t bits;
} cp_gauge_f;

static inline void cp_counter_add(cp_counter *c, uint64_t n)
{
    atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}
static inline uint64_t cp_counter_get(const cp_counter *c)
{
    return atomic_load_explicit(&((cp_counter *)c)->v, memory_order_relaxed);
}
static inline void cp_gauge_set(cp_gauge *g, int64_t v)
{
    atomic_store_explicit(&g->v, v, memory_order_relaxed);
}
/* Sets the gauge and returns the value it held (a flag raised once by one of many threads). */
static inline int64_t cp_gauge_swap(cp_gauge *g, int64_t v)
{
    return atomic_exchange_explicit(&g->v, v, memory_order_relaxed);
}
static inline void cp_gauge_add(cp_gauge *g, int64_t d)
{
    atomic_fetch_add_explicit(&g->v, d, memory_order_relaxed);
}
static inline int64_t cp_gauge_get(const cp_gauge *g)
{
    return atomic_load_explicit(&((cp_gauge *)g)->v, memory_order_relaxed);
}
static inline void cp_gauge_f_set(cp_gauge_f *g, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    atomic_store_explicit(&g->bits, bits, memory_order_relaxed);
}
static inline double cp_gauge_f_get(const cp_gauge_f *g)
{
    uint64_t bits = atomic_load_explicit(&((cp_gauge_f *)g)->bits, memory_order_relaxed);
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* ---- the registry ------------------------------------------------------------------- */

typedef enum cp_metric_type {
    CP_METRIC_COUNTER,
    CP_METRIC_GAUGE,
    CP_METRIC_HISTOGRAM,
} cp_metric_type;

/* One label of a series: name="value" (the value is escaped when printed). */
typedef struct cp_metric_label {
    const char *name, *value;
} cp_metric_label;

/* Registration takes a mutex; printing holds it while it reads every value and calls every
 * collector. Increments never take it. */
typedef struct cp_metrics cp_metrics;

/* *out = a new, empty registry. Returns 0 or CP_ENOMEM. */
int cp_metrics_create(cp_metrics **out);
/* Frees the registry (NULL is fine). The values stay their owners'. */
void cp_metrics_destroy(cp_metrics *r);

/* Register one series of the family `name` (created at its first series, printed in the
 * order families were first registered; its series in registration order). `labels`
 * (nlabels of them, may be NULL when 0) and the strings are copied. The value stays the
 * caller's and must outlive the registration: `owner` tags it, and cp_metrics_remove(r,
 * owner) ends it (a stage's destroy). Returns 0, CP_ENOMEM, or CP_EINVAL when the family
 * exists with another type or help, or the series exists already. `decimals`: digits after
 * the point that cp_gauge_f's value is printed with. */
int cp_metrics_counter(cp_metrics *r, const void *owner, const char *name, const char *help,
                       const cp_metric_label *labels, size_t nlabels, cp_counter *c);
int cp_metrics_gauge(cp_metrics *r, const void *owner, const char *name, const char *help,
                     const cp_metric_label *labels, size_t nlabels, cp_gauge *g);
int cp_metrics_gauge_f(cp_metrics *r, const void *owner, const char *name, const char *help,
                       const cp_metric_label *labels, size_t nlabels, int decimals, cp_gauge_f *g);

/* Values that are not a cp_counter or cp_gauge (label sets that change: partitions,
 * services, the last error; numbers read under a stage's own lock; histograms) come from
 * a collector: fn(arg, out) is called at every print, under the registry's mutex (so it
 * must not register), at its place in registration order, and writes its families with
 * cp_metrics_out_*. It returns 0 or the first error of those calls. */
typedef struct cp_metrics_out cp_metrics_out;
typedef int (*cp_metrics_collect_fn)(void *arg, cp_metrics_out *out);
int cp_metrics_collector(cp_metrics *r, const void *owner, cp_metrics_collect_fn fn, void *arg);

/* Ends every registration of owner (series and collectors; a family left with no series
 * goes too). Safe with r NULL or nothing registered. */
void cp_metrics_remove(cp_metrics *r, const void *owner);

/* Appends the exposition text to b. Returns 0, CP_ENOMEM, or a collector's error. */
int cp_metrics_write(cp_metrics *r, cp_buf *b);

/* In a collector: starts a family (its # HELP and # TYPE lines), then its samples.
 * `suffix` follows the family's name ("_bucket", "_sum", "_count" for a histogram; NULL
 * for none). Each returns 0 or CP_ENOMEM. */
int cp_metrics_out_family(cp_metrics_out *o, const char *name, const char *help,
                          cp_metric_type type);
int cp_metrics_out_u64(cp_metrics_out *o, const char *suffix, const cp_metric_label *labels,
                       size_t nlabels, uint64_t v);
int cp_metrics_out_i64(cp_metrics_out *o, const char *suffix, const cp_metric_label *labels,
                       size_t nlabels, int64_t v);
int cp_metrics_out_f64(cp_metrics_out *o, const char *suffix, const cp_metric_label *labels,
                       size_t nlabels, double v, int decimals);
/* A family of one unlabelled sample: cp_metrics_out_family, then cp_metrics_out_u64. */
int cp_metrics_out_scalar(cp_metrics_out *o, const char *name, const char *help,
                          cp_metric_type type, uint64_t v);

#endif
