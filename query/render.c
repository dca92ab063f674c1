/* Table and folded-stack views of a profile. */
#include "render.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cp_render_default_index(const cp_profile *p)
{
    if (p->default_sample_type)
        for (uint32_t i = 0; i < p->sample_types.n; i++)
            if (p->sample_types.v[i].type == p->default_sample_type) return (int)i;
    return (int)p->sample_types.n - 1;
}

int cp_render_find_index(const cp_profile *p, const char *type)
{
    if (!type || !*type) return cp_render_default_index(p);
    return cp_profile_find_type(p, type);
}

void cp_render_value(int64_t v, const char *unit, char *buf, size_t len)
{
    double a = (double)(v < 0 ? -v : v);
    if (strcmp(unit, "nanoseconds") == 0) {
        if (a >= 1e9) snprintf(buf, len, "%.2fs", (double)v / 1e9);
        else if (a >= 1e6) snprintf(buf, len, "%.2fms", (double)v / 1e6);
        else if (a >= 1e3) snprintf(buf, len, "%.2fus", (double)v / 1e3);
        else snprintf(buf, len, "%" PRId64 "ns", v);
    } else if (strcmp(unit, "bytes") == 0) {
        if (a >= 1073741824.0) snprintf(buf, len, "%.2fGB", (double)v / 1073741824.0);
        else if (a >= 1048576.0) snprintf(buf, len, "%.2fMB", (double)v / 1048576.0);
        else if (a >= 1024.0) snprintf(buf, len, "%.2fkB", (double)v / 1024.0);
        else snprintf(buf, len, "%" PRId64 "B", v);
    } else {
        snprintf(buf, len, "%" PRId64, v);
    }
}

typedef struct row {
    uint32_t fn; /* function id */
    int64_t flat, cum;
} row;

static int row_cmp(const void *a, const void *b)
{
    const row *x = a, *y = b;
    int64_t fx = x->flat < 0 ? -x->flat : x->flat, fy = y->flat < 0 ? -y->flat : y->flat;
    if (fx != fy) return fx > fy ? -1 : 1;
    int64_t cx = x->cum < 0 ? -x->cum : x->cum, cy = y->cum < 0 ? -y->cum : y->cum;
    if (cx != cy) return cx > cy ? -1 : 1;
    return x->fn < y->fn ? -1 : x->fn > y->fn;
}

/* Name of a location's innermost function, or its address. */
static const char *frame_name(const cp_profile *p, const cp_location *l, uint32_t line, char *tmp, size_t n)
{
    if (line < l->nlines) {
        const cp_function *f = &p->functions.v[p->lines.v[l->line_off + line].function_id - 1];
        const char *s = cp_profile_str(p, f->name);
        if (*s) return s;
        s = cp_profile_str(p, f->system_name);
        if (*s) return s;
    }
    snprintf(tmp, n, "0x%" PRIx64, l->address);
    return tmp;
}

int cp_render_top(const cp_profile *p, int index, uint32_t max_rows, cp_buf *out)
{
    uint32_t nv = p->sample_types.n, nf = p->functions.n;
    if (index < 0 || (uint32_t)index >= nv) return CP_EINVAL;
    row *rows = calloc((size_t)nf + 1, sizeof *rows);
    uint32_t *seen = calloc((size_t)nf + 1, sizeof *seen);
    if (!rows || !seen) {
        free(rows);
        free(seen);
        return CP_ENOMEM;
    }
    int64_t total = 0;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        int64_t v = p->values.v[(size_t)i * nv + (uint32_t)index];
        if (!v) continue;
        total += v;
        for (uint32_t k = 0; k < s->nlocs; k++) {
            const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
            for (uint32_t j = 0; j < l->nlines; j++) {
                uint32_t f = p->lines.v[l->line_off + j].function_id;
                if (k == 0 && j == 0) rows[f].flat += v;
                if (seen[f] != i + 1) { /* count each function once per sample */
                    seen[f] = i + 1;
                    rows[f].cum += v;
                }
            }
        }
    }
    uint32_t n = 0;
    for (uint32_t f = 1; f <= nf; f++)
        if (rows[f].flat || rows[f].cum) rows[n++] = (row){f, rows[f].flat, rows[f].cum};
    qsort(rows, n, sizeof *rows, row_cmp);
    const char *type = cp_profile_str(p, p->sample_types.v[index].type);
    const char *unit = cp_profile_str(p, p->sample_types.v[index].unit);
    char tb[32], fb[32], cb[32];
    cp_render_value(total, unit, tb, sizeof tb);
    int rc = cp_buf_printf(out, "Type: %s\nShowing nodes accounting for %s, 100%% of %s total\n", type, tb, tb);
    rc |= cp_buf_printf(out, "%10s %6s %6s %10s %6s\n", "flat", "flat%", "sum%", "cum", "cum%");
    double d = total ? (double)total : 1.0, sum = 0;
    for (uint32_t i = 0; i < n && (!max_rows || i < max_rows) && !rc; i++) {
        const cp_function *f = &p->functions.v[rows[i].fn - 1];
        const char *name = cp_profile_str(p, f->name);
        sum += (double)rows[i].flat;
        cp_render_value(rows[i].flat, unit, fb, sizeof fb);
        cp_render_value(rows[i].cum, unit, cb, sizeof cb);
        rc = cp_buf_printf(out, "%10s %5.2f%% %5.2f%% %10s %5.2f%%  %s\n", fb, 100.0 * (double)rows[i].flat / d,
                           100.0 * sum / d, cb, 100.0 * (double)rows[i].cum / d, *name ? name : "?");
    }
    free(rows);
    free(seen);
    return rc ? CP_ENOMEM : 0;
}

typedef struct folded_row {
    size_t off, len; /* stack text in the scratch buffer */
    int64_t v;
} folded_row;

/* Compares two stacks by text; ctx is the scratch buffer (qsort_r: renderers run on
 * several threads at once, so no global). */
static int folded_cmp(const void *a, const void *b, void *ctx)
{
    const folded_row *x = a, *y = b;
    const char *text = ctx;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(text + x->off, text + y->off, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Appends the root-first frame names of sample i to b, ';'-separated. */
static int folded_stack(const cp_profile *p, const cp_sample *s, cp_buf *b)
{
    char tmp[32];
    int first = 1;
    /* root first: the last location, and within a location the caller (last line) first */
    for (uint32_t k = s->nlocs; k-- > 0;) {
        const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
        uint32_t nl = l->nlines ? l->nlines : 1;
        for (uint32_t j = nl; j-- > 0;) {
            const char *name = frame_name(p, l, j, tmp, sizeof tmp);
            if (!first && cp_buf_append(b, ";", 1)) return CP_ENOMEM;
            first = 0;
            /* ';' separates frames and a newline ends the stack: keep them out of names */
            for (const char *c = name; *c; c++) {
                char ch = *c == ';' ? ':' : *c == '\n' ? ' ' : *c;
                if (cp_buf_append(b, &ch, 1)) return CP_ENOMEM;
            }
        }
    }
    return 0;
}

int cp_render_folded(const cp_profile *p, int index, cp_buf *out)
{
    uint32_t nv = p->sample_types.n;
    if (index < 0 || (uint32_t)index >= nv) return CP_EINVAL;
    /* Samples that differ only in addresses or line numbers fold to the same names: sum
     * them, so each stack is one line. */
    cp_buf text = {0};
    folded_row *rows = malloc(((size_t)p->samples.n + 1) * sizeof *rows);
    uint32_t n = 0;
    int rc = rows ? 0 : CP_ENOMEM;
    for (uint32_t i = 0; i < p->samples.n && !rc; i++) {
        int64_t v = p->values.v[(size_t)i * nv + (uint32_t)index];
        if (!v) continue;
        size_t off = text.len;
        rc = folded_stack(p, &p->samples.v[i], &text);
        rows[n++] = (folded_row){off, text.len - off, v};
    }
    if (!rc) {
        qsort_r(rows, n, sizeof *rows, folded_cmp, text.data);
        for (uint32_t i = 0; i < n && !rc; i++) {
            int64_t v = rows[i].v;
            while (i + 1 < n && folded_cmp(&rows[i], &rows[i + 1], text.data) == 0) v += rows[++i].v;
            if (v == 0) continue;
            rc = cp_buf_append(out, text.data + rows[i].off, rows[i].len) ||
                 cp_buf_printf(out, " %" PRId64 "\n", v) ? CP_ENOMEM : 0;
        }
    }
    free(rows);
    cp_buf_close(&text);
    return rc;
}
