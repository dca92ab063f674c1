/* The one time and duration grammar of contprof: every command, the HTTP API and
 * `contprof import` read times and durations through these functions, so "now-15m" or
 * "90s" means the same thing everywhere. A bare number is seconds, always. */
#ifndef CP_TIMES_H
#define CP_TIMES_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* The representable range: unix nanoseconds in an int64_t, 1677-09-21T00:12:44Z to
 * 2262-04-11T23:47:16Z. Times outside it are refused with a message naming the bound. */
#define CP_TIME_MIN_S (-9223372036LL)
#define CP_TIME_MAX_S 9223372035LL

/* Parses a time into unix nanoseconds: RFC 3339 ("2026-11-29T14:00:00Z",
 * "2026-11-29T14:00:00.5+01:00"), unix seconds with optional fraction ("1764424800.25"),
 * "now", "now-15m", "now+1h", or a negative duration relative to now ("-1h", "-7d").
 * now_ns is the reference for the relative forms. Returns 0, or CP_EPARSE with err (may be
 * NULL) starting "bad time 'S'" and saying what was wrong: the expected forms, or the
 * representable range that S falls outside of. */
int cp_parse_time(const char *s, int64_t now_ns, int64_t *out_ns, cp_err *err);

/* Parses a duration: one or more number+unit terms ("90s", "1h30m", "1.5h", "7d", "2w")
 * with units ns, us, ms, s, m, h, d, w; a bare number ("90") is seconds. Must be positive
 * unless allow_zero. Returns 0, or CP_EPARSE with err (may be NULL) naming s and the
 * grammar, or the largest duration if s is longer. */
int cp_parse_duration(const char *s, int allow_zero, int64_t *out_ns, cp_err *err);

/* Formats unix nanoseconds as RFC 3339 UTC with millisecond precision into buf (>= 32). */
void cp_format_time(int64_t ns, char *buf, size_t len);

/* CLOCK_REALTIME in unix nanoseconds. Async-signal-safe (clock_gettime). */
int64_t cp_now_ns(void);

/* CLOCK_MONOTONIC in nanoseconds (deadlines, intervals). Async-signal-safe. */
int64_t cp_mono_ns(void);

#endif
