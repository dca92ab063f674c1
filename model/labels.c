/* Sorted label sets. */
#include "labels.h"
#include "error.h"

#include <stdlib.h>
#include <string.h>

void cp_label_pairs_free(cp_label_pair *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        free(v[i].name);
        free(v[i].value);
    }
    free(v);
}

void cp_labels_close(cp_labels *l)
{
    cp_label_pairs_free(l->p.v, l->p.n);
    memset(l, 0, sizeof *l);
}

int cp_labels_set(cp_labels *l, const char *name, const char *value)
{
    uint32_t lo = 0, hi = l->p.n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (strcmp(l->p.v[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    char *v = strdup(value);
    if (!v) return CP_ENOMEM;
    if (lo < l->p.n && strcmp(l->p.v[lo].name, name) == 0) {
        free(l->p.v[lo].value);
        l->p.v[lo].value = v;
        return 0;
    }
    char *n = strdup(name);
    if (!n || cp_vec_reserve(&l->p, (size_t)l->p.n + 1)) {
        free(n);
        free(v);
        return CP_ENOMEM;
    }
    memmove(l->p.v + lo + 1, l->p.v + lo, (l->p.n - lo) * sizeof *l->p.v);
    l->p.v[lo].name = n;
    l->p.v[lo].value = v;
    l->p.n++;
    return 0;
}

const char *cp_labels_get(const cp_labels *l, const char *name)
{
    uint32_t lo = 0, hi = l->p.n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        int c = strcmp(l->p.v[mid].name, name);
        if (c == 0) return l->p.v[mid].value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int cp_labels_copy(cp_labels *dst, const cp_labels *src)
{
    for (uint32_t i = 0; i < src->p.n; i++)
        if (cp_labels_set(dst, src->p.v[i].name, src->p.v[i].value)) return CP_ENOMEM;
    return 0;
}

int cp_labels_format(const cp_labels *l, cp_buf *out)
{
    if (cp_buf_append(out, "{", 1)) return CP_ENOMEM;
    for (uint32_t i = 0; i < l->p.n; i++) {
        if (i && cp_buf_append(out, ",", 1)) return CP_ENOMEM;
        if (cp_buf_printf(out, "%s=\"", l->p.v[i].name)) return CP_ENOMEM;
        for (const char *c = l->p.v[i].value; *c; c++) {
            const char *esc = *c == '"' ? "\\\"" : *c == '\\' ? "\\\\" : *c == '\n' ? "\\n" : NULL;
            if (esc ? cp_buf_append(out, esc, 2) : cp_buf_append(out, c, 1)) return CP_ENOMEM;
        }
        if (cp_buf_append(out, "\"", 1)) return CP_ENOMEM;
    }
    return cp_buf_append(out, "}", 1);
}

int cp_label_name_valid(const char *name)
{
    size_t n = 0;
    for (const char *c = name; *c; c++, n++) {
        int alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
        if (!alpha && !(n > 0 && *c >= '0' && *c <= '9')) return 0;
    }
    return n > 0 && n <= CP_LABEL_NAME_MAX;
}

int cp_label_value_check(const char *value)
{
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)value; *c; c++, n++)
        if (*c < 0x20 || *c == 0x7f) return (int)n + 1;
    return n > CP_LABEL_VALUE_MAX ? -1 : 0;
}

unsigned cp_labels_scrub(cp_labels *l)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < l->p.n; i++)
        for (unsigned char *c = (unsigned char *)l->p.v[i].value; *c; c++)
            if (*c < 0x20 || *c == 0x7f) {
                *c = '?';
                n++;
            }
    return n;
}
