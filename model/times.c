/* The time and duration grammar every stage shares (see times.h): RFC 3339, unix seconds,
 * now and offsets from it; durations as number+unit terms, a bare number being seconds. */
#include "times.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NS 1000000000LL

int64_t cp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * NS + ts.tv_nsec;
}

int64_t cp_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS + ts.tv_nsec;
}

/* ---- durations ---------------------------------------------------------------------- */

static int unit_ns(const char *u, size_t n, int64_t *out)
{
    static const struct {
        const char *name;
        int64_t ns;
    } units[] = {{"ns", 1},      {"us", 1000},     {"ms", 1000000},   {"s", NS},
                 {"m", 60 * NS}, {"h", 3600 * NS}, {"d", 86400 * NS}, {"w", 604800 * NS}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strlen(units[i].name) == n && memcmp(units[i].name, u, n) == 0) {
            *out = units[i].ns;
            return 0;
        }
    return -1;
}

/* Parses a decimal number (digits with optional fraction) at s; returns bytes used or 0. */
static size_t parse_number(const char *s, long double *out)
{
    size_t i = 0;
    long double v = 0;
    int digits = 0;
    while (s[i] >= '0' && s[i] <= '9') {
        v = v * 10 + (s[i] - '0');
        i++;
        digits++;
        if (digits > 30) return 0;
    }
    if (s[i] == '.') {
        i++;
        long double f = 0.1L;
        int fd = 0;
        while (s[i] >= '0' && s[i] <= '9') {
            v += f * (s[i] - '0');
            f /= 10;
            i++;
            fd++;
            if (fd > 18) return 0;
        }
        if (!digits && !fd) return 0;
    } else if (!digits) {
        return 0;
    }
    *out = v;
    return i;
}

int cp_parse_duration(const char *s, int allow_zero, int64_t *out_ns, cp_err *err)
{
    const char *p = s ? s : "";
    long double total = 0;
    int terms = 0;
    while (*p) {
        long double v;
        size_t n = parse_number(p, &v);
        if (!n) goto bad;
        p += n;
        size_t ul = 0;
        while ((p[ul] >= 'a' && p[ul] <= 'z'))
            ul++;
        int64_t mul;
        if (ul == 0) {
            if (terms || *p) goto bad; /* a bare number must stand alone */
            mul = NS;
        } else if (unit_ns(p, ul, &mul)) {
            goto bad;
        }
        total += v * (long double)mul;
        p += ul;
        terms++;
        if (total > 9.2e18L)
            return cp_err_set(err, CP_EPARSE,
                              "bad duration '%.64s': longer than the longest duration, 15250w "
                              "(292 years, 64-bit nanoseconds)",
                              s);
    }
    if (!terms) goto bad;
    if (total < 1 && !(allow_zero && total == 0))
        return cp_err_set(err, CP_EPARSE, "bad duration '%.64s': must be %s", s,
                          allow_zero ? "0 or at least 1ns" : "positive (at least 1ns)");
    *out_ns = (int64_t)(total + 0.5L);
    return 0;
bad:
    return cp_err_set(err, CP_EPARSE,
                      "bad duration '%.64s' (expected e.g. 90s, 15m, 1h30m, 7d; units ns us ms "
                      "s m h d w; a bare number is seconds)",
                      s ? s : "");
}

/* ---- times -------------------------------------------------------------------------- */

static int digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* 0; -1 when s is not RFC 3339; 1 (after) or 2 (before) when it is but lies outside the
 * representable range. */
static int parse_rfc3339(const char *s, int64_t *out)
{
    int Y, M, D, h, m, sec;
    size_t len = strlen(s);
    if (len < 20) return -1;
    if (digits(s, 4, &Y) || s[4] != '-' || digits(s + 5, 2, &M) || s[7] != '-' ||
        digits(s + 8, 2, &D) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        digits(s + 11, 2, &h) || s[13] != ':' || digits(s + 14, 2, &m) || s[16] != ':' ||
        digits(s + 17, 2, &sec))
        return -1;
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (M < 1 || M > 12 || D < 1 || D > mdays[M - 1] || h > 23 || m > 59 || sec > 60) return -1;
    if (M == 2 && D == 29 && !((Y % 4 == 0 && Y % 100 != 0) || Y % 400 == 0)) return -1;
    const char *p = s + 19;
    int64_t frac = 0;
    if (*p == '.') {
        p++;
        int nd = 0;
        int64_t scale = 100000000;
        while (*p >= '0' && *p <= '9') {
            if (nd < 9) frac += (*p - '0') * scale;
            scale /= 10;
            nd++;
            p++;
        }
        if (!nd) return -1;
    }
    int64_t off = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om;
        if (digits(p + 1, 2, &oh) || p[3] != ':' || digits(p + 4, 2, &om) || oh > 23 || om > 59)
            return -1;
        off = (int64_t)(oh * 60 + om) * 60;
        if (*p == '-') off = -off;
        p += 6;
    } else {
        return -1;
    }
    if (*p) return -1;
    int64_t secs = days_from_civil(Y, M, D) * 86400 + h * 3600 + m * 60 + sec - off;
    if (secs > CP_TIME_MAX_S) return 1;
    if (secs < CP_TIME_MIN_S) return 2;
    *out = secs * NS + frac;
    return 0;
}

static int out_of_range(const char *s, int after, cp_err *err)
{
    return cp_err_set(err, CP_EPARSE,
                      "bad time '%.64s': %s %s, the %s time contprof can represent (unix "
                      "nanoseconds in 64 bits)",
                      s, after ? "after" : "before",
                      after ? "2262-04-11T23:47:16Z" : "1677-09-21T00:12:44Z",
                      after ? "latest" : "earliest");
}

int cp_parse_time(const char *s, int64_t now_ns, int64_t *out_ns, cp_err *err)
{
    int64_t d;
    if (!s || !*s) goto bad;
    if (strncmp(s, "now", 3) == 0 || s[0] == '-') {
        const char *r = s[0] == '-' ? s : s + 3;
        if (!*r) {
            *out_ns = now_ns;
            return 0;
        }
        cp_err derr = {0};
        if ((*r != '-' && *r != '+') || !r[1]) goto bad;
        int rc = cp_parse_duration(r + 1, 0, &d, &derr);
        if (rc && strstr(derr.msg, "longest")) return out_of_range(s, *r == '+', err);
        if (rc) goto bad;
        if (*r == '-' ? __builtin_sub_overflow(now_ns, d, out_ns)
                      : __builtin_add_overflow(now_ns, d, out_ns))
            return out_of_range(s, *r == '+', err);
        return 0;
    }
    if (strlen(s) >= 20 && s[4] == '-') {
        int rc = parse_rfc3339(s, out_ns);
        if (rc > 0) return out_of_range(s, rc == 1, err);
        if (rc) goto bad;
        return 0;
    }
    long double v;
    size_t n = parse_number(s, &v);
    if (!n || s[n]) goto bad;
    if (v > (long double)CP_TIME_MAX_S) return out_of_range(s, 1, err);
    *out_ns = (int64_t)(v * 1e9L + 0.5L);
    return 0;
bad:
    return cp_err_set(err, CP_EPARSE,
                      "bad time '%.64s' (expected RFC 3339 like 2026-11-29T14:00:00Z, unix "
                      "seconds, now, now-15m or -1h)",
                      s ? s : "");
}

void cp_format_time(int64_t ns, char *buf, size_t len)
{
    int64_t secs = ns / NS, rem = ns % NS;
    if (rem < 0) {
        rem += NS;
        secs--;
    }
    time_t t = (time_t)secs;
    struct tm tm;
    gmtime_r(&t, &tm);
    char tmp[32];
    strftime(tmp, sizeof tmp, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%03dZ", tmp, (int)(rem / 1000000));
}
