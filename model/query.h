/* A query as one value: whose data, which kind, which series, which window, what limits.
 * query/params.c builds it once from an HTTP request; the store's readers and the cluster's
 * fan-out (store.h's cp_reader) take it by pointer. Header only: the store includes it
 * without depending on query/. */
#ifndef CP_MODEL_QUERY_H
#define CP_MODEL_QUERY_H

#include <stdint.h>

#include "envelope.h"
#include "selector.h"

/* What a query may cost. */
typedef struct cp_query_limits {
    int64_t max_range_ns; /* longest [from, to); 0 = unlimited */
    uint64_t max_blocks;  /* blocks read per query, 0 = unlimited */
    int64_t deadline_ns;  /* CLOCK_MONOTONIC absolute deadline, 0 = none -> CP_ELIMIT */
} cp_query_limits;

typedef struct cp_query {
    const char *tenant;     /* whose data (not owned) */
    cp_kind kind;           /* profiles, timelines: the kind; series: 0 = every kind */
    cp_selector sel;        /* parsed selector (owned: cp_query_close); empty = everything */
    const char *select;     /* sel's text as given ("" = everything; not owned): sent to peers */
    int64_t from_ns, to_ns; /* windows starting in [from, to) */
    int64_t step_ns;        /* timelines: the width of one point */
    const char *label;      /* label values: the label's name; NULL: label names (not owned) */
    cp_query_limits lim;
    int local;     /* local=1: this node's part only, no peers asked */
    int by_series; /* inuse: each series' last snapshot kept apart (a peer's part) */
} cp_query;

/* Frees what q owns (its parsed selector); the borrowed strings stay the caller's. */
static inline void cp_query_close(cp_query *q)
{
    cp_selector_close(&q->sel);
}

#endif
