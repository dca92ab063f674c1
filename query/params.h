/* Query parameters and the time forms the API accepts: URL query strings decoded into
 * name/value pairs, times (RFC 3339, unix seconds, now, -1h, now-15m) and durations. */
#ifndef CP_QUERY_PARAMS_H
#define CP_QUERY_PARAMS_H

#include <stdint.h>

#include "error.h"
#include "vec.h"

#define CP_PARAMS_MAX 64

typedef struct cp_param {
    char *name, *value; /* owned, percent-decoded */
} cp_param;

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

/* Parses a time into unix nanoseconds: RFC 3339 ("2026-11-29T14:00:00Z",
 * "2026-11-29T14:00:00.5+01:00"), unix seconds with optional fraction ("1764424800.25"),
 * "now", "now-15m", "now+1h", or a negative duration relative to now ("-1h", "-7d").
 * now_ns is the reference for the relative forms. CP_EPARSE with a message naming s. */
int cp_parse_time(const char *s, int64_t now_ns, int64_t *out_ns, cp_err *err);

/* Parses a duration: one or more number+unit terms ("90s", "1h30m", "1.5h", "7d", "2w")
 * with units ns, us, ms, s, m, h, d, w; a bare number is seconds. Must be positive unless
 * allow_zero. CP_EPARSE on anything else, or if it overflows. */
int cp_parse_duration(const char *s, int allow_zero, int64_t *out_ns, cp_err *err);

/* Formats unix nanoseconds as RFC 3339 UTC with millisecond precision into buf (>= 32). */
void cp_format_time(int64_t ns, char *buf, size_t len);

/* CLOCK_REALTIME in unix nanoseconds. */
int64_t cp_now_ns(void);

#endif
