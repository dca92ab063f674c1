/* Source map v3 decoding: the JSON by jansson, the mappings' base64 VLQ here, into one
 * segment table sorted by generated line and column (as the format writes it), with the
 * first segment of each generated line indexed for lookups. */
#include "sourcemap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_INDEX UINT32_MAX

typedef struct seg {
    uint32_t gen_col, src, line, col, name; /* src/name NO_INDEX when absent */
} seg;

struct cp_v8_smap {
    char *file;     /* the "file" member, "" when absent */
    char **sources; /* sourceRoot + sources[i] */
    uint32_t nsources;
    char **contents; /* sourcesContent[i] ("" when absent), nsources of them or NULL */
    uint32_t ncontents;
    uint32_t **line_at_src; /* per source: the offset of each line of its content */
    uint32_t *nlines_src;
    char **names;
    uint32_t nnames;
    seg *segs;
    uint32_t nsegs;
    uint32_t *line_at; /* [nlines + 1]: first segment of each generated line */
    uint32_t nlines;
};

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int b64_digit(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* One VLQ value from s[*at], advancing *at. Values beyond 31 bits are refused. */
static int vlq(const char *s, size_t len, size_t *at, int64_t *out, cp_err *err)
{
    uint64_t v = 0;
    unsigned shift = 0;
    for (;;) {
        if (*at >= len)
            return cp_err_set(err, CP_EPARSE, "source map: mappings end inside a VLQ value");
        int d = b64_digit((unsigned char)s[*at]);
        if (d < 0)
            return cp_err_set(err, CP_EPARSE,
                              "source map: mappings[%zu] '%c' is not a base64 VLQ digit", *at,
                              s[*at] >= 32 && s[*at] < 127 ? s[*at] : '?');
        (*at)++;
        if (shift > 30)
            return cp_err_set(err, CP_EPARSE,
                              "source map: VLQ value before mappings[%zu] over 31 bits", *at);
        v |= (uint64_t)(d & 31) << shift;
        shift += 5;
        if (!(d & 32)) break;
    }
    if (v > 0xffffffffu)
        return cp_err_set(err, CP_EPARSE, "source map: VLQ value before mappings[%zu] over 31 bits",
                          *at);
    *out = (v & 1) ? -(int64_t)(v >> 1) : (int64_t)(v >> 1);
    return 0;
}

/* Adds delta to *field, which must stay in [0, limit). */
static int advance(uint32_t *field, int64_t delta, uint64_t limit, const char *what, size_t at,
                   cp_err *err)
{
    int64_t v = (int64_t)*field + delta;
    if (v < 0 || (uint64_t)v >= limit)
        return cp_err_set(
            err, CP_EPARSE,
            "source map: segment before mappings[%zu]: %s %lld out of range [0, %llu)", at, what,
            (long long)v, (unsigned long long)limit);
    *field = (uint32_t)v;
    return 0;
}

static int cmp_seg(const void *a, const void *b)
{
    const seg *x = a, *y = b;
    return x->gen_col < y->gen_col ? -1 : x->gen_col > y->gen_col;
}

static int decode_mappings(cp_v8_smap *m, const char *s, size_t len, cp_err *err)
{
    /* generous bounds first: a segment is at least one character, a line one ';' */
    size_t semis = 0;
    for (size_t i = 0; i < len; i++)
        semis += s[i] == ';';
    if (semis + 1 > CP_V8_SMAP_MAX_SEGMENTS)
        return cp_err_set(err, CP_ELIMIT, "source map: %zu generated lines: too many", semis + 1);
    m->nlines = (uint32_t)semis + 1;
    m->line_at = calloc((size_t)m->nlines + 1, sizeof(uint32_t));
    if (!m->line_at) return CP_ENOMEM;
    size_t cap = 0;
    uint32_t src = 0, line = 0, col = 0, name = 0, gline = 0, gcol = 0;
    size_t at = 0;
    int rc;
    m->line_at[0] = 0;
    while (at <= len) {
        if (at == len || s[at] == ';') {
            /* the end of generated line gline: sort its segments (the format says they
             * are sorted; a map that is not must still look up right) */
            uint32_t first = m->line_at[gline];
            if (m->nsegs - first > 1)
                qsort(m->segs + first, m->nsegs - first, sizeof(seg), cmp_seg);
            m->line_at[++gline] = m->nsegs;
            gcol = 0;
            at++;
            continue;
        }
        if (s[at] == ',') {
            at++;
            continue;
        }
        int64_t f[5];
        int nf = 0;
        while (at < len && s[at] != ',' && s[at] != ';') {
            if (nf == 5)
                return cp_err_set(err, CP_EPARSE,
                                  "source map: segment before mappings[%zu] has over 5 fields", at);
            if ((rc = vlq(s, len, &at, &f[nf++], err))) return rc;
        }
        if (nf != 1 && nf != 4 && nf != 5)
            return cp_err_set(err, CP_EPARSE,
                              "source map: segment before mappings[%zu] has %d fields (1, 4 or 5)",
                              at, nf);
        seg g = {.src = NO_INDEX, .name = NO_INDEX};
        if ((rc = advance(&gcol, f[0], UINT32_MAX, "generated column", at, err))) return rc;
        g.gen_col = gcol;
        if (nf >= 4) {
            if ((rc = advance(&src, f[1], m->nsources, "source index", at, err)) ||
                (rc = advance(&line, f[2], UINT32_MAX, "original line", at, err)) ||
                (rc = advance(&col, f[3], UINT32_MAX, "original column", at, err)))
                return rc;
            g.src = src;
            g.line = line;
            g.col = col;
        }
        if (nf == 5) {
            if ((rc = advance(&name, f[4], m->nnames, "name index", at, err))) return rc;
            g.name = name;
        }
        if (m->nsegs == cap) {
            if (cap >= CP_V8_SMAP_MAX_SEGMENTS)
                return cp_err_set(err, CP_ELIMIT, "source map: over %u segments",
                                  CP_V8_SMAP_MAX_SEGMENTS);
            size_t nc = cap ? cap * 2 : 256;
            seg *ns = realloc(m->segs, nc * sizeof(seg));
            if (!ns) return CP_ENOMEM;
            m->segs = ns;
            cap = nc;
        }
        m->segs[m->nsegs++] = g;
    }
    return 0;
}

/* A JSON array of strings (null entries read as ""), each prefixed with prefix. */
static int string_list(const json_t *a, const char *prefix, const char *what, char ***out,
                       uint32_t *n, cp_err *err)
{
    *out = NULL;
    *n = 0;
    if (!a) return 0;
    if (!json_is_array(a))
        return cp_err_set(err, CP_EPARSE, "source map: %s is not an array", what);
    size_t k = json_array_size(a);
    if (k > CP_V8_SMAP_MAX_SEGMENTS)
        return cp_err_set(err, CP_ELIMIT, "source map: %zu %s: too many", k, what);
    *out = calloc(k ? k : 1, sizeof(char *));
    if (!*out) return CP_ENOMEM;
    for (size_t i = 0; i < k; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_string(v) && !json_is_null(v))
            return cp_err_set(err, CP_EPARSE, "source map: %s[%zu] is not a string", what, i);
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        size_t pl = strlen(prefix), sl = strlen(s);
        char *c = malloc(pl + sl + 1);
        if (!c) return CP_ENOMEM;
        memcpy(c, prefix, pl);
        memcpy(c + pl, s, sl + 1);
        (*out)[i] = c;
        *n = (uint32_t)(i + 1);
    }
    return 0;
}

/* The line starts of every source's content, for enclosing_class. */
static int index_lines(cp_v8_smap *m)
{
    if (!m->ncontents) return 0;
    m->line_at_src = calloc(m->ncontents, sizeof(uint32_t *));
    m->nlines_src = calloc(m->ncontents, sizeof(uint32_t));
    if (!m->line_at_src || !m->nlines_src) return CP_ENOMEM;
    for (uint32_t i = 0; i < m->ncontents; i++) {
        const char *c = m->contents[i];
        size_t len = strlen(c), n = 1;
        if (len > UINT32_MAX) continue;
        for (size_t k = 0; k < len; k++)
            n += c[k] == '\n';
        uint32_t *at = malloc(n * sizeof(uint32_t));
        if (!at) return CP_ENOMEM;
        at[0] = 0;
        for (size_t k = 0, l = 1; k < len; k++)
            if (c[k] == '\n') at[l++] = (uint32_t)(k + 1);
        m->line_at_src[i] = at;
        m->nlines_src[i] = (uint32_t)n;
    }
    return 0;
}

/* The indentation of line l of source i (columns of leading blanks), -1 for a line that
 * says nothing of nesting (blank, or a comment). */
static int indent_of(const cp_v8_smap *m, uint32_t i, uint32_t l, const char **text)
{
    const char *c = m->contents[i] + m->line_at_src[i][l];
    int n = 0;
    while (*c == ' ' || *c == '\t') {
        n++;
        c++;
    }
    *text = c;
    if (*c == '\n' || *c == '\r' || !*c || *c == '*' || (c[0] == '/' && c[1] == '/') ||
        (c[0] == '/' && c[1] == '*'))
        return -1;
    return n;
}

/* The class a function at original (source i, line l) is a method of, read from the
 * source's content by layout: the nearest line above indented less than l that is a
 * class header (`[export] [default] [abstract] class NAME`). Formatted sources (what a
 * source map points to) nest by indentation; a line indented less that is not a class
 * header means l is not a method. Returns 1 with the name in out, else 0. */
static int enclosing_class(const cp_v8_smap *m, uint32_t i, uint32_t l, char *out, size_t cap)
{
    if (i >= m->ncontents || !m->line_at_src || !m->line_at_src[i] || l >= m->nlines_src[i])
        return 0;
    const char *t;
    int in = indent_of(m, i, l, &t);
    if (in <= 0) return 0;
    for (uint32_t k = l, steps = 0; k-- > 0 && steps < 5000; steps++) {
        int ik = indent_of(m, i, k, &t);
        if (ik < 0 || ik >= in) continue;
        static const char *const mods[] = {"export ", "default ", "abstract ", "declare "};
        for (int again = 1; again;) {
            again = 0;
            for (size_t q = 0; q < sizeof(mods) / sizeof(mods[0]); q++)
                if (!strncmp(t, mods[q], strlen(mods[q]))) {
                    t += strlen(mods[q]);
                    while (*t == ' ')
                        t++;
                    again = 1;
                }
        }
        if (strncmp(t, "class", 5) || (t[5] != ' ' && t[5] != '\t')) return 0;
        t += 5;
        while (*t == ' ' || *t == '\t')
            t++;
        size_t n = 0;
        while (t[n] && (t[n] == '_' || t[n] == '$' || (t[n] >= 'a' && t[n] <= 'z') ||
                        (t[n] >= 'A' && t[n] <= 'Z') || (n && t[n] >= '0' && t[n] <= '9')))
            n++;
        if (!n || n >= cap) return 0;
        memcpy(out, t, n);
        out[n] = 0;
        return 1;
    }
    return 0;
}

int cp_v8_smap_create(const char *text, size_t len, cp_v8_smap **out, cp_err *err)
{
    *out = NULL;
    if (len > CP_V8_SMAP_MAX_BYTES)
        return cp_err_set(err, CP_ELIMIT, "source map: %zu bytes: over %zu MiB", len,
                          CP_V8_SMAP_MAX_BYTES >> 20);
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j)
        return cp_err_set(err, CP_EPARSE, "source map: not JSON: %s (line %d column %d)", je.text,
                          je.line, je.column);
    int rc;
    cp_v8_smap *m = calloc(1, sizeof(*m));
    if (!m) {
        rc = CP_ENOMEM;
        goto fail;
    }
    const json_t *ver = json_object_get(j, "version"), *maps = json_object_get(j, "mappings");
    const json_t *root = json_object_get(j, "sourceRoot");
    if (!json_is_object(j)) {
        rc = cp_err_set(err, CP_EPARSE, "source map: not a JSON object");
    } else if (json_object_get(j, "sections")) {
        rc = cp_err_set(err, CP_EPARSE, "source map: index maps (sections) are not supported");
    } else if (!json_is_integer(ver) || json_integer_value(ver) != 3) {
        rc = cp_err_set(err, CP_EPARSE, "source map: version is not 3");
    } else if (!json_is_string(maps)) {
        rc = cp_err_set(err, CP_EPARSE, "source map: mappings is not a string");
    } else if (root && !json_is_string(root) && !json_is_null(root)) {
        rc = cp_err_set(err, CP_EPARSE, "source map: sourceRoot is not a string");
    } else if (json_object_get(j, "file") && !json_is_string(json_object_get(j, "file")) &&
               !json_is_null(json_object_get(j, "file"))) {
        rc = cp_err_set(err, CP_EPARSE, "source map: file is not a string");
    } else {
        const json_t *file = json_object_get(j, "file");
        m->file = strdup(json_is_string(file) ? json_string_value(file) : "");
        if (!m->file) {
            rc = CP_ENOMEM;
            goto fail;
        }
        char prefix[1024] = "";
        const char *r = json_is_string(root) ? json_string_value(root) : "";
        if (r[0])
            snprintf(prefix, sizeof(prefix), "%.1000s%s", r, r[strlen(r) - 1] == '/' ? "" : "/");
        rc = string_list(json_object_get(j, "sources"), prefix, "sources", &m->sources,
                         &m->nsources, err);
        if (!rc)
            rc = string_list(json_object_get(j, "names"), "", "names", &m->names, &m->nnames, err);
        if (!rc)
            rc = string_list(json_object_get(j, "sourcesContent"), "", "sourcesContent",
                             &m->contents, &m->ncontents, err);
        if (!rc) rc = index_lines(m);
        if (!rc) rc = decode_mappings(m, json_string_value(maps), json_string_length(maps), err);
    }
    if (rc) goto fail;
    json_decref(j);
    *out = m;
    return 0;
fail:
    json_decref(j);
    cp_v8_smap_destroy(m);
    return rc;
}

void cp_v8_smap_destroy(cp_v8_smap *m)
{
    if (!m) return;
    free(m->file);
    for (uint32_t i = 0; i < m->nsources; i++)
        free(m->sources[i]);
    free(m->sources);
    for (uint32_t i = 0; i < m->ncontents; i++) {
        free(m->contents[i]);
        if (m->line_at_src) free(m->line_at_src[i]);
    }
    free(m->contents);
    free(m->line_at_src);
    free(m->nlines_src);
    for (uint32_t i = 0; i < m->nnames; i++)
        free(m->names[i]);
    free(m->names);
    free(m->segs);
    free(m->line_at);
    free(m);
}

int cp_v8_smap_lookup(const cp_v8_smap *m, uint32_t line, uint32_t column, cp_v8_smap_pos *out)
{
    if (line >= m->nlines) return -1;
    uint32_t lo = m->line_at[line], hi = m->line_at[line + 1];
    /* the last segment at or before column */
    uint32_t a = lo, b = hi;
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if (m->segs[mid].gen_col <= column)
            a = mid + 1;
        else
            b = mid;
    }
    if (a == lo) return -1;
    const seg *g = &m->segs[a - 1];
    if (g->src == NO_INDEX) return -1;
    out->source = m->sources[g->src];
    out->source_index = g->src;
    out->name = g->name == NO_INDEX ? NULL : m->names[g->name];
    out->line = g->line;
    out->column = g->col;
    out->gen_column = g->gen_col;
    return 0;
}

static int64_t int_member(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

const char *cp_v8_smap_file(const cp_v8_smap *m)
{
    return m->file;
}

void cp_v8_smap_counts(const cp_v8_smap *m, uint32_t *sources, uint32_t *segments)
{
    *sources = m->nsources;
    *segments = m->nsegs;
}

int cp_v8_smap_resolve(const cp_v8_smap *m, const char *fn, uint32_t line, uint32_t col,
                       cp_v8_smap_frame *out)
{
    cp_v8_smap_pos pos, before;
    if (cp_v8_smap_lookup(m, line, col, &pos) != 0) return 0;
    out->source = pos.source;
    out->line = pos.line;
    out->column = pos.column;
    out->name[0] = 0;
    /* V8 places a function at its parameter list; the identifier before it names it: the
     * map names it (minified: renamed) when a segment starts exactly V8's name's length
     * before that position */
    const char *name = NULL;
    size_t fl = strlen(fn);
    if (fl && (uint64_t)col >= fl &&
        cp_v8_smap_lookup(m, line, (uint32_t)(col - fl), &before) == 0 &&
        before.gen_column == (uint32_t)(col - fl) && before.name)
        name = before.name;
    /* a method reads as Class.method when the map holds its class's source */
    char cls[128];
    const char *base = name ? name : fn;
    if (base[0] && !strchr(base, '.') &&
        enclosing_class(m, pos.source_index, pos.line, cls, sizeof(cls)) && strcmp(base, cls)) {
        /* V8 names a constructor after its (minified) class */
        const char *t;
        if (indent_of(m, pos.source_index, pos.line, &t) >= 0 && !strncmp(t, "constructor", 11))
            base = "constructor";
        snprintf(out->name, sizeof(out->name), "%s.%.300s", cls, base);
    } else if (name) {
        snprintf(out->name, sizeof(out->name), "%s", name);
    }
    return 1;
}

int cp_v8_smap_apply(const cp_v8_smap *m, json_t *frame)
{
    int64_t line = int_member(frame, "lineNumber"), col = int_member(frame, "columnNumber");
    const json_t *fnv = json_object_get(frame, "functionName");
    const char *fn = json_is_string(fnv) ? json_string_value(fnv) : "";
    if (line < 0 || col < 0 || line > UINT32_MAX || col > UINT32_MAX) return 0;
    cp_v8_smap_frame o;
    if (!cp_v8_smap_resolve(m, fn, (uint32_t)line, (uint32_t)col, &o)) return 0;
    const char *keys[4] = {"url", "lineNumber", "columnNumber", "functionName"};
    json_t *v[4] = {json_string(o.source), json_integer(o.line), json_integer(o.column),
                    o.name[0] ? json_string(o.name) : NULL};
    int nv = o.name[0] ? 4 : 3, rc = 0;
    for (int i = 0; i < nv; i++)
        if (!v[i]) rc = CP_ENOMEM;
    for (int i = 0; i < nv; i++) {
        if (rc)
            json_decref(v[i]);
        else if (json_object_set_new(frame, keys[i], v[i])) /* takes v[i] even on failure */
            rc = CP_ENOMEM;
    }
    if (rc) return rc;
    return 1;
}

int cp_v8_data_url_decode(const char *url, cp_buf *out, cp_err *err)
{
    if (strncmp(url, "data:", 5))
        return cp_err_set(err, CP_EPARSE, "data URL: does not start with data:");
    const char *comma = strchr(url, ',');
    if (!comma) return cp_err_set(err, CP_EPARSE, "data URL: no ','");
    int b64 = comma - url >= 12 && !strncmp(comma - 7, ";base64", 7);
    const char *d = comma + 1;
    size_t n = strlen(d);
    if (n > CP_V8_SMAP_MAX_BYTES * 2)
        return cp_err_set(err, CP_ELIMIT, "data URL: %zu bytes: over %zu MiB", n,
                          (CP_V8_SMAP_MAX_BYTES * 2) >> 20);
    if (cp_buf_reserve(out, n)) return CP_ENOMEM;
    if (b64) {
        uint32_t acc = 0;
        int bits = 0;
        for (size_t i = 0; i < n; i++) {
            if (d[i] == '=') break;
            int v = b64_digit((unsigned char)d[i]);
            if (v < 0)
                return cp_err_set(err, CP_EPARSE, "data URL: byte %zu is not base64",
                                  (size_t)(d + i - url));
            acc = (acc << 6) | (uint32_t)v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                out->data[out->len++] = (uint8_t)(acc >> bits);
                acc &= (1u << bits) - 1;
            }
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            int hi, lo;
            if (d[i] == '%' && i + 2 < n && (hi = hex_digit(d[i + 1])) >= 0 &&
                (lo = hex_digit(d[i + 2])) >= 0) {
                out->data[out->len++] = (uint8_t)(hi * 16 + lo);
                i += 2;
            } else {
                out->data[out->len++] = (uint8_t)d[i];
            }
        }
    }
    if (out->len > CP_V8_SMAP_MAX_BYTES)
        return cp_err_set(err, CP_ELIMIT, "data URL: over %zu MiB", CP_V8_SMAP_MAX_BYTES >> 20);
    return 0;
}
