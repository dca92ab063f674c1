/* Query parameters: URL query strings decoded into name/value pairs, and the one parser that
 * turns an endpoint's parameters into a cp_query (model/query.h). Times and durations
 * (RFC 3339, unix seconds, now, -1h, now-15m; 90s, 1h30m) are model/times.h, included here
 * for the API's callers. */
#ifndef CP_QUERY_PARAMS_H
#define CP_QUERY_PARAMS_H

#include <stdint.h>

#include "error.h"
#include "http.h"
#include "labels.h"
#include "query.h"
#include "times.h"
#include "vec.h"

#define CP_PARAMS_MAX 64

/* A parameter: name and value owned, percent-decoded; the pair type of labels.h, so that
 * one function frees both kinds of pairs. */
typedef cp_label_pair cp_param;

typedef struct cp_params {
    CP_VEC(cp_param) p;
} cp_params;

/* Decodes a query string ("a=1&b=%7Bx%7D"; '+' is a space). A name given twice, bad
 * percent escapes, NUL bytes or more than CP_PARAMS_MAX parameters are CP_EPARSE with err
 * naming the parameter. *out must be zeroed; cp_params_close frees it on success or not. */
int cp_params_parse(const char *query, cp_params *out, cp_err *err);
void cp_params_close(cp_params *p);
/* The value of name, or NULL if absent. */
const char *cp_params_get(const cp_params *p, const char *name);
/* CP_EPARSE naming the first parameter whose name is not in allowed (NULL-terminated). */
int cp_params_check(const cp_params *p, const char *const *allowed, cp_err *err);

/* ---- requests as queries ------------------------------------------------------------ */

/* What an endpoint's query string holds (cp_query_form.flags). */
#define CP_FORM_KIND 1u     /* type=cpu|alloc|inuse, default cpu */
#define CP_FORM_ANY_KIND 2u /* type= optional: absent is 0, every kind */
#define CP_FORM_WINDOW 4u   /* from, to: default the last hour, at most max_range_ns */
#define CP_FORM_ALL_TIME 8u /* from, to: default all of time, unbounded */
#define CP_FORM_SELECT 16u  /* select= */
#define CP_FORM_STEP 32u    /* step=, a duration: default about 300 points of whole 10 s */
#define CP_FORM_BASE 64u    /* base_select, base_from, base_to: the base of a diff */

/* How one endpoint's request becomes a query. */
typedef struct cp_query_form {
    const char *const *params;  /* the endpoint's own parameters (NULL-terminated) */
    const char *const *formats; /* format=: the values taken, the first the default; NULL */
    unsigned flags;             /* CP_FORM_* */
} cp_query_form;

/* What the server adds to every query. */
typedef struct cp_query_env {
    const char *tenant;   /* the token's tenant; "" for a peer (by the cluster token) */
    int64_t now_ns;       /* wall clock at arrival: relative times count from it */
    int64_t deadline_ns;  /* the server's deadline (CLOCK_MONOTONIC; 0 = none) */
    int64_t max_range_ns; /* longest window (CP_FORM_WINDOW); 0 = unlimited */
    uint64_t max_blocks;  /* store blocks per query; 0 = unlimited */
    uint32_t max_steps;   /* timeline points (CP_FORM_STEP) */
} cp_query_env;

/* A parsed request: its query, a diff's base, the answer's format. */
typedef struct cp_query_req {
    cp_query q;
    cp_query base;      /* CP_FORM_BASE: q with the base's selector and window */
    const char *format; /* one of form->formats; NULL without */
} cp_query_req;

/* Builds out from pa (which must outlive it: out's strings point into pa) for an endpoint
 * of form. First the cluster's parameters, taken by every endpoint: `local=1` (this node's
 * part only), `by_series=1` (only with local=1), `deadline_ms` (the asking node's
 * milliseconds left: the deadline becomes the sooner of it and env's) and `node` (checked by
 * the caller: query/fanout.h); for a peer (env->tenant ""), local=1 and `tenant=NAME` are
 * required. Then any other parameter not in form->params is refused, then the kind, the
 * format, the window, the step and the selectors in that order. Returns 0, or -1 with the
 * error answer (400; 403 for the cluster token without local=1) set in r and out closed.
 * cp_query_req_close frees out either way. */
int cp_query_parse(const cp_params *pa, const cp_query_form *form, const cp_query_env *env,
                   cp_query_req *out, cp_http_response *r);
void cp_query_req_close(cp_query_req *q);

#endif
