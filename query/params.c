/* Query-string decoding for the query API (times and durations: model/times.c). */
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cp_label_pairs_free(p->p.v, p->p.n);
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
            if (!rc)
                rc = eq ? url_decode(eq + 1, n - nl - 1, &prm.value, &bad)
                        : ((prm.value = strdup("")) ? 0 : CP_ENOMEM);
            if (rc == CP_EPARSE) {
                free(prm.name);
                return cp_err_set(err, CP_EPARSE, "query string: bad percent escape in '%.*s'",
                                  (int)(n > 64 ? 64 : n), s);
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
