/* Query-string decoding and the time and duration grammars of the query API. */
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t cp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

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
    for (uint32_t i = 0; i < p->p.n; i++) {
        free(p->p.v[i].name);
        free(p->p.v[i].value);
    }
    free(p->p.v);
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
            if (!rc) rc = eq ? url_decode(eq + 1, n - nl - 1, &prm.value, &bad)
                             : ((prm.value = strdup("")) ? 0 : CP_ENOMEM);
            if (rc == CP_EPARSE) {
                free(prm.name);
                return cp_err_set(err, CP_EPARSE,
                                  "query string: bad percent escape in '%.*s'", (int)(n > 64 ? 64 : n), s);
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

int cp_params_check(const cp_params *p, const char *const *allowed, cp_err *err)
{
    for (uint32_t i = 0; i < p->p.n; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, p->p.v[i].name) == 0) ok = 1;
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

/* ---- durations ---------------------------------------------------------------------- */

static int unit_ns(const char *u, size_t n, int64_t *out)
{
    static const struct {
        const char *name;
        int64_t ns;
    } units[] = {{"ns", 1},
                 {"us", 1000},
                 {"ms", 1000000},
                 {"s", 1000000000LL},
                 {"m", 60000000000LL},
                 {"h", 3600000000000LL},
                 {"d", 86400000000000LL},
                 {"w", 604800000000000LL}};
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
    const char *p = s;
    long double total = 0;
    int terms = 0;
    while (*p) {
        long double v;
        size_t n = parse_number(p, &v);
        if (!n) goto bad;
        p += n;
        size_t ul = 0;
        while ((p[ul] >= 'a' && p[ul] <= 'z')) ul++;
        int64_t mul;
        if (ul == 0) {
            if (terms || *p) goto bad; /* a bare number must stand alone */
            mul = 1000000000LL;
        } else if (unit_ns(p, ul, &mul)) {
            goto bad;
        }
        total += v * (long double)mul;
        p += ul;
        terms++;
        if (total > 9.2e18L) goto bad;
    }
    if (!terms) goto bad;
    if (total < 1 && !(allow_zero && total == 0)) goto bad;
    *out_ns = (int64_t)(total + 0.5L);
    return 0;
bad:
    return cp_err_set(err, CP_EPARSE,
                      "bad duration '%.64s' (expected e.g. 90s, 15m, 1h30m, 7d; units ns us ms "
                      "s m h d w)",
                      s);
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
    if (M < 1 || M > 12 || D < 1 || D > mdays[M - 1] || h > 23 || m > 59 || sec > 60)
        return -1;
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
    if (secs < -9200000000LL || secs > 9200000000LL) return -1; /* beyond int64 nanoseconds */
    *out = secs * 1000000000LL + frac;
    return 0;
}

int cp_parse_time(const char *s, int64_t now_ns, int64_t *out_ns, cp_err *err)
{
    int64_t d;
    if (!s || !*s) goto bad;
    if (strncmp(s, "now", 3) == 0) {
        const char *r = s + 3;
        if (!*r) {
            *out_ns = now_ns;
            return 0;
        }
        if ((*r != '-' && *r != '+') || cp_parse_duration(r + 1, 0, &d, NULL)) goto bad;
        *out_ns = *r == '-' ? now_ns - d : now_ns + d;
        return 0;
    }
    if (s[0] == '-') {
        if (cp_parse_duration(s + 1, 0, &d, NULL)) goto bad;
        /* "-1700000000" would be a time before 1970: not supported, reported as bad. */
        *out_ns = now_ns - d;
        return 0;
    }
    if (strlen(s) >= 20 && s[4] == '-') {
        if (parse_rfc3339(s, out_ns)) goto bad;
        return 0;
    }
    long double v;
    size_t n = parse_number(s, &v);
    if (!n || s[n] || v > 9.2e9L) goto bad;
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
    int64_t secs = ns / 1000000000LL, rem = ns % 1000000000LL;
    if (rem < 0) {
        rem += 1000000000LL;
        secs--;
    }
    time_t t = (time_t)secs;
    struct tm tm;
    gmtime_r(&t, &tm);
    char tmp[32];
    strftime(tmp, sizeof tmp, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%03dZ", tmp, (int)(rem / 1000000));
}
