/* Query parameters: URL query strings decoded into name/value pairs. Times and durations
 * (RFC 3339, unix seconds, now, -1h, now-15m; 90s, 1h30m) are model/times.h, included here
 * for the API's callers. */
#ifndef CP_QUERY_PARAMS_H
#define CP_QUERY_PARAMS_H

#include <stdint.h>

#include "error.h"
#include "labels.h"
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

#endif
