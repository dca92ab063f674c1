/* Source map v3 decoding without a JSON tree: one pass checks the JSON and notes where the
 * members it needs lie, a second decodes them into one string arena (sources, names,
 * sourcesContent, file) and two packed tables (segments; the first segment of each
 * generated line), each sized exactly before it is allocated, so that a map holds no more
 * than it says (cp_v8_smap_bytes) and a hostile one is refused before it is built. */
#include "sourcemap.h"
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "times.h"

#define NO_INDEX UINT32_MAX

typedef struct seg {
    uint32_t gen_col, src, line, col, name; /* src/name NO_INDEX when absent */
} seg;

struct cp_v8_smap {
    char *arena; /* every string, NUL-terminated */
    size_t arena_len;
    uint32_t file;     /* arena offset of the "file" member, "" when absent */
    uint32_t *sources; /* arena offsets of sourceRoot + sources[i] */
    uint32_t nsources;
    uint32_t *contents; /* arena offsets of sourcesContent[i] ("" when null) */
    uint32_t ncontents;
    uint32_t *src_lines;    /* every content's line starts, relative to the content */
    uint32_t *src_lines_at; /* [ncontents + 1]: content i's first in src_lines */
    uint32_t *names;        /* arena offsets of names[i] */
    uint32_t nnames;
    seg *segs;
    uint32_t nsegs;
    uint32_t *line_at; /* [nlines + 1]: first segment of each generated line */
    uint32_t nlines;
    size_t bytes; /* everything above, allocated */
};

/* ---- the JSON reader ------------------------------------------------------------------ */

/* What a member's value is found by: its offset in the text, SIZE_MAX when absent. */
enum { K_VERSION, K_FILE, K_ROOT, K_SOURCES, K_NAMES, K_CONTENT, K_MAPPINGS, K_SECTIONS, K_N };
static const char *const key_names[K_N] = {"version", "file",           "sourceRoot", "sources",
                                           "names",   "sourcesContent", "mappings",   "sections"};

typedef struct reader {
    const char *s;
    size_t len, at;
    int64_t deadline_ns; /* 0 = none */
    uint32_t tick;
    cp_err *err;
} reader;

/* CP_ELIMIT once the deadline has passed (read every 64 Ki steps). */
static int step(reader *r)
{
    if ((++r->tick & 0xffff) || !r->deadline_ns || cp_mono_ns() < r->deadline_ns) return 0;
    return cp_err_set(r->err, CP_ELIMIT,
                      "source map: reading stopped at byte %zu: past the deadline", r->at);
}

static int bad_json(reader *r, const char *what)
{
    return cp_err_set(r->err, CP_EPARSE, "source map: not JSON: %s at byte %zu", what, r->at);
}

static void ws(reader *r)
{
    while (r->at < r->len && (r->s[r->at] == ' ' || r->s[r->at] == '\t' || r->s[r->at] == '\n' ||
                              r->s[r->at] == '\r'))
        r->at++;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const reader *r, size_t at, uint32_t *out)
{
    if (r->len - at < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(r->s[at + i]);
        if (d < 0) return -1;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* The string at r->at (its opening quote): decoded into dst (NULL: only checked; room for
 * its encoded length is enough: no escape decodes longer than it is written), NUL-
 * terminated; *n its decoded length. \u0000 is refused (names are C strings). */
static int string(reader *r, char *dst, size_t *n)
{
    size_t k = 0;
    r->at++;
    for (;;) {
        /* a run of plain bytes at once (sourcesContent is megabytes of them) */
        const unsigned char *t = (const unsigned char *)r->s;
        size_t run = r->at;
        while (r->at < r->len && t[r->at] != '"' && t[r->at] != '\\' && t[r->at] >= 0x20)
            r->at++;
        if (dst && r->at > run) memcpy(dst + k, r->s + run, r->at - run);
        k += r->at - run;
        if (r->at >= r->len) return bad_json(r, "string not closed");
        unsigned char c = t[r->at];
        if (c == '"') break;
        if (c < 0x20) return bad_json(r, "control character in a string");
        if (r->at + 1 >= r->len) return bad_json(r, "string not closed");
        char e = r->s[r->at + 1];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(from, e) : NULL;
        if (hit) {
            if (dst) dst[k] = to[hit - from];
            k++;
            r->at += 2;
            continue;
        }
        uint32_t u, lo;
        if (e != 'u' || hex4(r, r->at + 2, &u)) return bad_json(r, "bad escape");
        r->at += 6;
        if (u >= 0xd800 && u < 0xdc00) {
            if (r->len - r->at < 6 || r->s[r->at] != '\\' || r->s[r->at + 1] != 'u' ||
                hex4(r, r->at + 2, &lo) || lo < 0xdc00 || lo >= 0xe000)
                return bad_json(r, "lone surrogate");
            r->at += 6;
            u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
        } else if (u >= 0xdc00 && u < 0xe000) {
            return bad_json(r, "lone surrogate");
        }
        if (!u) return bad_json(r, "\\u0000 in a string");
        char b[4];
        size_t nb = cp_utf8_put(u, b);
        if (dst) memcpy(dst + k, b, nb);
        k += nb;
    }
    r->at++;
    if (dst) dst[k] = 0;
    *n = k;
    return 0;
}

static int literal(reader *r, const char *w)
{
    size_t n = strlen(w);
    if (r->len - r->at < n || memcmp(r->s + r->at, w, n)) return bad_json(r, "unexpected byte");
    r->at += n;
    return 0;
}

static int number(reader *r)
{
    size_t a = r->at;
    const char *s = r->s;
#define DIGITS(min)                                                                                \
    do {                                                                                           \
        size_t d0 = r->at;                                                                         \
        while (r->at < r->len && s[r->at] >= '0' && s[r->at] <= '9')                               \
            r->at++;                                                                               \
        if (r->at - d0 < (min)) return bad_json(r, "bad number");                                  \
    } while (0)
    if (r->at < r->len && s[r->at] == '-') r->at++;
    if (r->at < r->len && s[r->at] == '0')
        r->at++;
    else
        DIGITS(1);
    if (r->at < r->len && s[r->at] == '.') {
        r->at++;
        DIGITS(1);
    }
    if (r->at < r->len && (s[r->at] == 'e' || s[r->at] == 'E')) {
        r->at++;
        if (r->at < r->len && (s[r->at] == '+' || s[r->at] == '-')) r->at++;
        DIGITS(1);
    }
#undef DIGITS
    return r->at > a ? 0 : bad_json(r, "unexpected byte");
}

/* Checks the value at r->at and moves past it. Nesting deeper than 64 is refused: the
 * reader keeps no stack, but a map has no reason for it. */
static int skip_value(reader *r, int depth)
{
    int rc;
    size_t n;
    if (depth > 64) return bad_json(r, "nested over 64 deep");
    ws(r);
    if (r->at >= r->len) return bad_json(r, "ends where a value was expected");
    if ((rc = step(r))) return rc;
    char c = r->s[r->at];
    if (c == '"') return string(r, NULL, &n);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->at++;
        ws(r);
        if (r->at < r->len && r->s[r->at] == close) {
            r->at++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                ws(r);
                if (r->at >= r->len || r->s[r->at] != '"') return bad_json(r, "expected a key");
                if ((rc = string(r, NULL, &n))) return rc;
                ws(r);
                if (r->at >= r->len || r->s[r->at] != ':') return bad_json(r, "expected ':'");
                r->at++;
            }
            if ((rc = skip_value(r, depth + 1))) return rc;
            ws(r);
            if (r->at < r->len && r->s[r->at] == ',') {
                r->at++;
                continue;
            }
            if (r->at < r->len && r->s[r->at] == close) {
                r->at++;
                return 0;
            }
            return bad_json(r, "expected ',' or a closing bracket");
        }
    }
    if (c == 't') return literal(r, "true");
    if (c == 'f') return literal(r, "false");
    if (c == 'n') return literal(r, "null");
    if (c == '-' || (c >= '0' && c <= '9')) return number(r);
    return bad_json(r, "unexpected byte");
}

/* The first pass: the text is one JSON object; at[k] gets where member k's value starts. */
static int find_members(reader *r, size_t at[K_N])
{
    for (int k = 0; k < K_N; k++)
        at[k] = SIZE_MAX;
    ws(r);
    if (r->at >= r->len) return bad_json(r, "empty");
    int is_object = r->s[r->at] == '{';
    size_t start = r->at;
    int rc = skip_value(r, 0);
    if (rc) return rc;
    ws(r);
    if (r->at != r->len) return bad_json(r, "bytes after the value");
    if (!is_object) return cp_err_set(r->err, CP_EPARSE, "source map: not a JSON object");
    /* again, one level: the checks are done, only the keys are read */
    r->at = start + 1;
    ws(r);
    if (r->s[r->at] == '}') return 0;
    for (;;) {
        ws(r);
        char key[16];
        size_t kl = 0, ks = r->at;
        if ((rc = string(r, NULL, &kl))) return rc;
        int which = -1;
        if (kl < sizeof key) {
            r->at = ks;
            if ((rc = string(r, key, &kl))) return rc;
            for (int k = 0; k < K_N; k++)
                if (!strcmp(key, key_names[k])) which = k;
        }
        ws(r);
        r->at++; /* ':' */
        ws(r);
        if (which >= 0) {
            if (at[which] != SIZE_MAX)
                return cp_err_set(r->err, CP_EPARSE, "source map: member \"%s\" twice", key);
            at[which] = r->at;
        }
        if ((rc = skip_value(r, 1))) return rc;
        ws(r);
        if (r->s[r->at] == '}') return 0;
        r->at++; /* ',' */
    }
}

/* ---- decoding ------------------------------------------------------------------------- */

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

/* What building a map may hold: budget bytes in all. */
typedef struct build {
    cp_v8_smap *m;
    reader *r;
    size_t budget;
    const char *budget_name; /* what sets it, for errors */
} build;

/* Counts n more bytes against the budget, before they are allocated. */
static int charge(build *b, size_t n, const char *what)
{
    if (n > b->budget || b->m->bytes > b->budget - n)
        return cp_err_set(b->r->err, CP_ELIMIT,
                          "source map: decoded, its %s would bring it to %zu bytes, over the limit "
                          "of %zu bytes (%s)",
                          what, b->m->bytes + n, b->budget, b->budget_name);
    b->m->bytes += n;
    return 0;
}

static void *alloc_charged(build *b, size_t count, size_t size, const char *what, int *rc)
{
    if (count && size > SIZE_MAX / count) {
        *rc = cp_err_set(b->r->err, CP_ELIMIT, "source map: %s: too large", what);
        return NULL;
    }
    if ((*rc = charge(b, count * size, what))) return NULL;
    void *p = malloc(count ? count * size : 1);
    if (!p) *rc = CP_ENOMEM;
    return p;
}

static int decode_mappings(build *b, const char *s, size_t len)
{
    cp_v8_smap *m = b->m;
    cp_err *err = b->r->err;
    /* exact counts first: the lines (';' + 1) and the segments (runs between ',' and ';') */
    size_t semis = 0, nsegs = 0;
    for (size_t i = 0; i < len; i++) {
        semis += s[i] == ';';
        nsegs += s[i] != ';' && s[i] != ',' && (i == 0 || s[i - 1] == ';' || s[i - 1] == ',');
    }
    if (semis + 1 > CP_V8_SMAP_MAX_SEGMENTS)
        return cp_err_set(err, CP_ELIMIT, "source map: %zu generated lines: over the limit of %u",
                          semis + 1, CP_V8_SMAP_MAX_SEGMENTS);
    if (nsegs > CP_V8_SMAP_MAX_SEGMENTS)
        return cp_err_set(err, CP_ELIMIT, "source map: %zu segments: over the limit of %u", nsegs,
                          CP_V8_SMAP_MAX_SEGMENTS);
    int rc = 0;
    m->nlines = (uint32_t)semis + 1;
    if (!(m->line_at =
              alloc_charged(b, (size_t)m->nlines + 1, sizeof(uint32_t), "line index", &rc)) ||
        !(m->segs = alloc_charged(b, nsegs, sizeof(seg), "segments", &rc)))
        return rc;
    uint32_t src = 0, line = 0, col = 0, name = 0, gline = 0, gcol = 0;
    size_t at = 0;
    m->line_at[0] = 0;
    while (at <= len) {
        if (at == len || s[at] == ';') {
            /* the end of generated line gline: sort its segments (the format says they
             * are sorted; a map that is not must still look up right) */
            uint32_t first = m->line_at[gline], sorted = 1;
            for (uint32_t k = first + 1; k < m->nsegs && sorted; k++)
                sorted = m->segs[k - 1].gen_col <= m->segs[k].gen_col;
            if (!sorted) qsort(m->segs + first, m->nsegs - first, sizeof(seg), cmp_seg);
            m->line_at[++gline] = m->nsegs;
            gcol = 0;
            at++;
            continue;
        }
        if (s[at] == ',') {
            at++;
            continue;
        }
        if ((rc = step(b->r))) return rc;
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
        m->segs[m->nsegs++] = g; /* nsegs counted the runs this loop reads */
    }
    return 0;
}

/* A list member (sources, names, sourcesContent) measured: *count entries of *bytes in
 * all, decoded and NUL-terminated (null reads as ""). Absent: 0 and 0. */
static int list_measure(reader *r, size_t at, const char *what, uint32_t max, uint32_t *count,
                        size_t *bytes)
{
    *count = 0;
    *bytes = 0;
    if (at == SIZE_MAX) return 0;
    r->at = at;
    if (r->s[at] != '[')
        return cp_err_set(r->err, CP_EPARSE, "source map: %s is not an array", what);
    r->at++;
    size_t k = 0;
    int rc;
    for (;;) {
        ws(r);
        if (r->s[r->at] == ']') break;
        if (r->s[r->at] == ',') {
            r->at++;
            continue;
        }
        if ((rc = step(r))) return rc;
        size_t n = 0;
        if (r->s[r->at] == '"') {
            if ((rc = string(r, NULL, &n))) return rc;
        } else if (r->s[r->at] == 'n') {
            r->at += 4;
        } else {
            return cp_err_set(r->err, CP_EPARSE, "source map: %s[%zu] is not a string", what, k);
        }
        if (++k > max)
            return cp_err_set(r->err, CP_ELIMIT, "source map: %s: over the limit of %u entries",
                              what, max);
        *bytes += n + 1;
    }
    *count = (uint32_t)k;
    return 0;
}

/* Decodes a measured list into the arena at *used, each entry after prefix; offs[i] gets
 * entry i's offset. */
static int list_decode(build *b, size_t at, const char *prefix, uint32_t *offs, size_t *used)
{
    reader *r = b->r;
    cp_v8_smap *m = b->m;
    size_t pl = strlen(prefix);
    r->at = at + 1;
    int rc;
    for (uint32_t k = 0;;) {
        ws(r);
        if (r->s[r->at] == ']') return 0;
        if (r->s[r->at] == ',') {
            r->at++;
            continue;
        }
        if ((rc = step(r))) return rc;
        offs[k++] = (uint32_t)*used;
        memcpy(m->arena + *used, prefix, pl);
        *used += pl;
        size_t n = 0;
        if (r->s[r->at] == '"') {
            if ((rc = string(r, m->arena + *used, &n))) return rc;
        } else {
            r->at += 4;
            m->arena[*used] = 0;
        }
        *used += n + 1;
    }
}

/* A string or null member: 0 with its span (the text between the quotes) or none; else
 * CP_EPARSE "source map: WHAT is not a string". */
static int string_member(reader *r, size_t at, const char *what, int *present)
{
    *present = 0;
    if (at == SIZE_MAX || r->s[at] == 'n') return 0;
    if (r->s[at] != '"')
        return cp_err_set(r->err, CP_EPARSE, "source map: %s is not a string", what);
    *present = 1;
    return 0;
}

/* The line starts of every source's content, for enclosing_class. */
static int index_lines(build *b)
{
    cp_v8_smap *m = b->m;
    size_t total = 0;
    int rc = 0;
    for (uint32_t i = 0; i < m->ncontents; i++) {
        const char *c = m->arena + m->contents[i];
        total++;
        for (; *c; c++)
            total += *c == '\n';
    }
    if (!(m->src_lines_at = alloc_charged(b, (size_t)m->ncontents + 1, sizeof(uint32_t),
                                          "content line index", &rc)) ||
        !(m->src_lines = alloc_charged(b, total, sizeof(uint32_t), "content line index", &rc)))
        return rc;
    size_t l = 0;
    for (uint32_t i = 0; i < m->ncontents; i++) {
        const char *c = m->arena + m->contents[i];
        m->src_lines_at[i] = (uint32_t)l;
        m->src_lines[l++] = 0;
        for (size_t k = 0; c[k]; k++)
            if (c[k] == '\n') m->src_lines[l++] = (uint32_t)(k + 1);
    }
    m->src_lines_at[m->ncontents] = (uint32_t)l;
    return 0;
}

static const char *content_of(const cp_v8_smap *m, uint32_t i)
{
    return m->arena + m->contents[i];
}

static uint32_t content_lines(const cp_v8_smap *m, uint32_t i)
{
    return m->src_lines_at[i + 1] - m->src_lines_at[i];
}

/* The indentation of line l of source i (columns of leading blanks), -1 for a line that
 * says nothing of nesting (blank, or a comment). */
static int indent_of(const cp_v8_smap *m, uint32_t i, uint32_t l, const char **text)
{
    const char *c = content_of(m, i) + m->src_lines[m->src_lines_at[i] + l];
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
    if (i >= m->ncontents || l >= content_lines(m, i)) return 0;
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
    return cp_v8_smap_create_within(text, len, NULL, out, err);
}

int cp_v8_smap_create_within(const char *text, size_t len, const cp_v8_smap_limits *lim,
                             cp_v8_smap **out, cp_err *err)
{
    *out = NULL;
    if (len > CP_V8_SMAP_MAX_BYTES)
        return cp_err_set(err, CP_ELIMIT, "source map: %zu bytes: over %zu MiB", len,
                          CP_V8_SMAP_MAX_BYTES >> 20);
    cp_err scratch = {0};
    reader r = {.s = text, .len = len, .err = err ? err : &scratch};
    /* what the decoded map may hold: the caller's limit, and never over
     * CP_V8_SMAP_MAX_RATIO times the text */
    build b = {.r = &r,
               .budget = CP_V8_SMAP_MAX_RATIO * len + CP_V8_SMAP_MIN_BUDGET,
               .budget_name = "8 times the map's size plus 64 KiB"};
    _Static_assert(CP_V8_SMAP_MAX_RATIO == 8 && CP_V8_SMAP_MIN_BUDGET == 64 << 10,
                   "the message above names them");
    if (lim) {
        r.deadline_ns = lim->deadline_ns;
        if (lim->max_bytes && lim->max_bytes < b.budget) {
            b.budget = lim->max_bytes;
            b.budget_name = lim->max_bytes_name ? lim->max_bytes_name : "the caller's limit";
        }
    }
    size_t at[K_N];
    int rc = find_members(&r, at);
    if (rc) return rc;
    cp_v8_smap *m = calloc(1, sizeof(*m));
    if (!m) return CP_ENOMEM;
    b.m = m;
    m->bytes = sizeof(*m);
    char *maps_copy = NULL;
    int has_file, has_root;
    const char *v = at[K_VERSION] != SIZE_MAX ? text + at[K_VERSION] : NULL;
    if (at[K_SECTIONS] != SIZE_MAX) {
        rc = cp_err_set(r.err, CP_EPARSE, "source map: index maps (sections) are not supported");
    } else if (!v || v[0] != '3' ||
               (v + 1 < text + len && ((v[1] >= '0' && v[1] <= '9') || strchr(".eE", v[1])))) {
        rc = cp_err_set(r.err, CP_EPARSE, "source map: version is not 3");
    } else if (at[K_MAPPINGS] == SIZE_MAX || text[at[K_MAPPINGS]] != '"') {
        rc = cp_err_set(r.err, CP_EPARSE, "source map: mappings is not a string");
    } else if (!(rc = string_member(&r, at[K_ROOT], "sourceRoot", &has_root)) &&
               !(rc = string_member(&r, at[K_FILE], "file", &has_file))) {
        /* the sizes of everything the arena holds, then the arena, then the strings */
        char root[1024] = "", prefix[1030] = "";
        size_t n = 0, fl = 0;
        r.at = at[K_ROOT];
        if (has_root && !(rc = string(&r, NULL, &n)) && n >= sizeof root)
            rc = cp_err_set(r.err, CP_ELIMIT, "source map: sourceRoot of %zu bytes: over %zu", n,
                            sizeof root - 1);
        if (has_root && !rc) {
            r.at = at[K_ROOT];
            rc = string(&r, root, &n);
        }
        if (!rc && root[0])
            snprintf(prefix, sizeof prefix, "%s%s", root, root[strlen(root) - 1] == '/' ? "" : "/");
        r.at = at[K_FILE];
        if (!rc && has_file) rc = string(&r, NULL, &fl);
        uint32_t ns = 0, nn = 0, nc = 0;
        size_t bs = 0, bn = 0, bc = 0;
        if (!rc) rc = list_measure(&r, at[K_SOURCES], "sources", CP_V8_SMAP_MAX_SOURCES, &ns, &bs);
        if (!rc) rc = list_measure(&r, at[K_NAMES], "names", CP_V8_SMAP_MAX_NAMES, &nn, &bn);
        if (!rc)
            rc =
                list_measure(&r, at[K_CONTENT], "sourcesContent", CP_V8_SMAP_MAX_SOURCES, &nc, &bc);
        size_t pl = strlen(prefix);
        size_t arena = fl + 1 + (size_t)ns * pl + bs + bn + bc;
        if (!rc && arena > UINT32_MAX)
            rc =
                cp_err_set(r.err, CP_ELIMIT, "source map: %zu bytes of strings: over 4 GiB", arena);
        if (!rc && (m->arena = alloc_charged(&b, arena, 1, "strings", &rc)) &&
            (m->sources = alloc_charged(&b, ns, sizeof(uint32_t), "sources", &rc)) &&
            (m->names = alloc_charged(&b, nn, sizeof(uint32_t), "names", &rc)) &&
            (m->contents = alloc_charged(&b, nc, sizeof(uint32_t), "sourcesContent", &rc))) {
            size_t used = 0;
            m->file = 0;
            r.at = at[K_FILE];
            if (has_file)
                rc = string(&r, m->arena, &fl);
            else
                m->arena[0] = 0;
            used = fl + 1;
            if (!rc && ns) rc = list_decode(&b, at[K_SOURCES], prefix, m->sources, &used);
            m->nsources = ns;
            if (!rc && nn) rc = list_decode(&b, at[K_NAMES], "", m->names, &used);
            m->nnames = nn;
            if (!rc && nc) rc = list_decode(&b, at[K_CONTENT], "", m->contents, &used);
            m->ncontents = nc;
            m->arena_len = used;
        }
        if (!rc) rc = index_lines(&b);
        /* the mappings: read in place unless written with escapes */
        const char *ms = text + at[K_MAPPINGS] + 1;
        size_t ml = 0;
        while (!rc && ms + ml < text + len && ms[ml] != '"' && ms[ml] != '\\')
            ml++;
        if (!rc && ms[ml] == '\\') {
            r.at = at[K_MAPPINGS];
            rc = string(&r, NULL, &ml);
            if (!rc && !(maps_copy = malloc(ml + 1))) rc = CP_ENOMEM;
            r.at = at[K_MAPPINGS];
            if (!rc) rc = string(&r, maps_copy, &ml);
            ms = maps_copy;
        }
        if (!rc) rc = decode_mappings(&b, ms, ml);
    }
    free(maps_copy);
    if (rc) {
        cp_v8_smap_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void cp_v8_smap_destroy(cp_v8_smap *m)
{
    if (!m) return;
    free(m->arena);
    free(m->sources);
    free(m->names);
    free(m->contents);
    free(m->src_lines);
    free(m->src_lines_at);
    free(m->segs);
    free(m->line_at);
    free(m);
}

size_t cp_v8_smap_bytes(const cp_v8_smap *m)
{
    return m ? m->bytes : 0;
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
    out->source = m->arena + m->sources[g->src];
    out->source_index = g->src;
    out->name = g->name == NO_INDEX ? NULL : m->arena + m->names[g->name];
    out->line = g->line;
    out->column = g->col;
    out->gen_column = g->gen_col;
    return 0;
}

static int64_t int_member(const cp_json *o, const char *k)
{
    const cp_json *v = cp_json_get(o, k);
    return cp_json_is_int(v) ? v->i64 : -1;
}

const char *cp_v8_smap_file(const cp_v8_smap *m)
{
    return m->arena + m->file;
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

int cp_v8_smap_apply(const cp_v8_smap *m, cp_json *frame)
{
    int64_t line = int_member(frame, "lineNumber"), col = int_member(frame, "columnNumber");
    const char *fn = cp_json_str(cp_json_get(frame, "functionName"), "");
    if (line < 0 || col < 0 || line > UINT32_MAX || col > UINT32_MAX) return 0;
    cp_v8_smap_frame o;
    if (!cp_v8_smap_resolve(m, fn, (uint32_t)line, (uint32_t)col, &o)) return 0;
    /* each set takes its value, even NULL (out of memory) */
    if (cp_json_set(frame, "url", cp_json_new_str(o.source)) ||
        cp_json_set(frame, "lineNumber", cp_json_new_int(o.line)) ||
        cp_json_set(frame, "columnNumber", cp_json_new_int(o.column)) ||
        (o.name[0] && cp_json_set(frame, "functionName", cp_json_new_str(o.name))))
        return CP_ENOMEM;
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
