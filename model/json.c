/* JSON: string escaping for every writer, and a recursive-descent reader (RFC 8259)
 * building a tree; \u escapes become UTF-8. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmath.h"

/* ===== writing ======================================================================= */

int cp_json_escape(cp_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (cp_buf_reserve(b, n + 2)) return CP_ENOMEM;
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f) continue;
        if (i > run && cp_buf_append(b, s + run, i - run)) return CP_ENOMEM;
        run = i + 1;
        char esc[7];
        size_t el = 2;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            el = 6;
        }
        if (cp_buf_append(b, esc, el)) return CP_ENOMEM;
    }
    if (n > run && cp_buf_append(b, s + run, n - run)) return CP_ENOMEM;
    return 0;
}

size_t cp_utf8_put(uint32_t cp, char out[4])
{
    if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) cp = 0xfffd; /* not a character */
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int cp_utf8_valid(const void *p, size_t n)
{
    const uint8_t *s = p;
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k = c >= 0xc2 && c <= 0xdf   ? 1
                   : c >= 0xe0 && c <= 0xef ? 2
                   : c >= 0xf0 && c <= 0xf4 ? 3
                                            : 0;
        if (!k || n - i <= k) return 0;
        uint8_t lo = 0x80, hi = 0xbf; /* the second byte's range, narrower after some leads */
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
        else if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

/* ===== reading ======================================================================= */

typedef struct rd {
    const char *s;
    size_t len, i;
    int depth;
    unsigned flags;
    int nomem, deep, bad_utf8, bad_number;
} rd;

static void ws(rd *r)
{
    while (r->i < r->len &&
           (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

void cp_json_free(cp_json *j)
{
    if (!j) return;
    for (uint32_t k = 0; k < j->n; k++) {
        if (j->keys) free(j->keys[k]);
        cp_json_free(j->items[k]);
    }
    free(j->keys);
    free(j->items);
    free(j->str);
    free(j);
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Reads a string at r->i (the opening quote) into a new NUL-terminated buffer. */
static char *string(rd *r)
{
    size_t start = ++r->i, end = start;
    /* its raw length bounds the decoded one: no escape decodes longer than it is written */
    while (end < r->len && r->s[end] != '"')
        end += r->s[end] == '\\' ? 2 : 1;
    if (end >= r->len) {
        r->i = r->len;
        return NULL;
    }
    char *d = malloc(end - start + 1);
    if (!d) {
        r->nomem = 1;
        return NULL;
    }
    size_t j = 0;
    while (r->i < end) {
        unsigned char c = (unsigned char)r->s[r->i++];
        if (c < 0x20) goto bad;
        if (c != '\\') {
            d[j++] = (char)c;
            continue;
        }
        char e = r->s[r->i++];
        const char *map = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e);
        if (e && map && ((map - "\"\"\\\\//b\bf\fn\nr\rt\t") % 2) == 0) {
            d[j++] = map[1];
            continue;
        }
        unsigned u;
        if (e != 'u' || r->i + 4 > end || hex4(r->s + r->i, &u) || u == 0) goto bad;
        r->i += 4;
        if (u >= 0xd800 && u < 0xdc00) { /* a surrogate pair */
            unsigned lo;
            if (r->i + 6 > end || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u' ||
                hex4(r->s + r->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                goto bad;
            r->i += 6;
            u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
        }
        j += cp_utf8_put(u, d + j);
    }
    if ((r->flags & CP_JSON_UTF8) && !cp_utf8_valid(d, j)) {
        r->bad_utf8 = 1;
        r->i = start - 1; /* the offset names the string (its opening quote) */
        free(d);
        return NULL;
    }
    r->i++; /* the closing quote */
    d[j] = 0;
    return d;
bad:
    r->i--;
    free(d);
    return NULL;
}

static cp_json *value(rd *r);

static int push(rd *r, cp_json *j, char *key, cp_json *item)
{
    if (j->n == 0 || (j->n >= 4 && (j->n & (j->n - 1)) == 0)) { /* capacity 4, 8, 16... */
        size_t cap = j->n ? (size_t)j->n * 2 : 4;
        cp_json **ni = realloc(j->items, cap * sizeof *ni);
        if (ni) j->items = ni;
        char **nk = ni && j->type == CP_JSON_OBJECT ? realloc(j->keys, cap * sizeof *nk) : NULL;
        if (nk) j->keys = nk;
        if (!ni || (j->type == CP_JSON_OBJECT && !nk)) {
            if (r) r->nomem = 1;
            free(key);
            cp_json_free(item);
            return -1;
        }
    }
    if (j->type == CP_JSON_OBJECT) j->keys[j->n] = key;
    j->items[j->n++] = item;
    return 0;
}

static cp_json *container(rd *r, cp_json *j, char close)
{
    if (++r->depth > CP_JSON_MAX_DEPTH) {
        r->deep = 1;
        return NULL;
    }
    r->i++;
    ws(r);
    if (r->i < r->len && r->s[r->i] == close) {
        r->i++;
        r->depth--;
        return j;
    }
    for (;;) {
        char *key = NULL;
        ws(r);
        if (close == '}') {
            if (r->i >= r->len || r->s[r->i] != '"' || !(key = string(r))) return NULL;
            ws(r);
            if (r->i >= r->len || r->s[r->i] != ':') {
                free(key);
                return NULL;
            }
            r->i++;
        }
        cp_json *item = value(r);
        if (!item) {
            free(key);
            return NULL;
        }
        if (push(r, j, key, item)) return NULL;
        ws(r);
        if (r->i < r->len && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->len && r->s[r->i] == close) {
            r->i++;
            r->depth--;
            return j;
        }
        return NULL;
    }
}

static size_t digits(const rd *r, size_t k)
{
    while (k < r->len && r->s[k] >= '0' && r->s[k] <= '9')
        k++;
    return k;
}

/* A number at r->i (RFC 8259's grammar: no leading zeros, '+', bare '.' or hex) into j. */
static int number(rd *r, cp_json *j)
{
    size_t k = r->i + (r->s[r->i] == '-'), d0 = k;
    k = digits(r, k);
    if (k == d0 || (r->s[d0] == '0' && k - d0 > 1)) return -1;
    int integer = 1;
    if (k < r->len && r->s[k] == '.') {
        size_t f = digits(r, k + 1);
        if (f == k + 1) return -1;
        k = f;
        integer = 0;
    }
    if (k < r->len && (r->s[k] == 'e' || r->s[k] == 'E')) {
        size_t e = k + 1 + (k + 1 < r->len && (r->s[k + 1] == '+' || r->s[k + 1] == '-'));
        size_t f = digits(r, e);
        if (f == e) return -1;
        k = f;
        integer = 0;
    }
    size_t n = k - r->i;
    j->type = CP_JSON_NUMBER;
    if (integer && k - d0 <= 18) { /* exact in an int64_t: the common case, no copy */
        int64_t v = 0;
        for (size_t m = d0; m < k; m++)
            v = v * 10 + (r->s[m] - '0');
        j->i64 = d0 > r->i ? -v : v;
        j->num = (double)j->i64;
        j->is_int = 1;
        r->i = k;
        return 0;
    }
    char small[64], *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) {
        r->nomem = 1;
        return -1;
    }
    memcpy(buf, r->s + r->i, n);
    buf[n] = 0;
    char *end;
    j->num = strtod(buf, &end);
    errno = 0;
    long long v = integer ? strtoll(buf, &end, 10) : 0;
    j->is_int = integer && errno != ERANGE; /* an int64_t holds it */
    j->i64 = j->is_int ? v : cp_math_llround(j->num);
    if (buf != small) free(buf);
    r->i = k;
    return 0;
}

static cp_json *value(rd *r)
{
    ws(r);
    if (r->i >= r->len) return NULL;
    cp_json *j = calloc(1, sizeof *j);
    if (!j) {
        r->nomem = 1;
        return NULL;
    }
    char c = r->s[r->i];
    cp_json *ok = j;
    if (c == '{' || c == '[') {
        j->type = c == '{' ? CP_JSON_OBJECT : CP_JSON_ARRAY;
        ok = container(r, j, c == '{' ? '}' : ']');
    } else if (c == '"') {
        j->type = CP_JSON_STRING;
        ok = (j->str = string(r)) ? j : NULL;
    } else if (r->len - r->i >= 4 && !memcmp(r->s + r->i, "null", 4)) {
        r->i += 4;
    } else if (r->len - r->i >= 4 && !memcmp(r->s + r->i, "true", 4)) {
        j->type = CP_JSON_BOOL;
        j->num = 1;
        r->i += 4;
    } else if (r->len - r->i >= 5 && !memcmp(r->s + r->i, "false", 5)) {
        j->type = CP_JSON_BOOL;
        r->i += 5;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (number(r, j)) ok = NULL;
    } else {
        ok = NULL;
    }
    if (!ok) {
        cp_json_free(j);
        return NULL;
    }
    return j;
}

int cp_json_parse_flags(const char *text, size_t len, unsigned flags, cp_json **out, cp_err *err)
{
    rd r = {.s = text, .len = len, .flags = flags};
    *out = NULL;
    cp_json *j = value(&r);
    if (j) {
        ws(&r);
        if (r.i != len) {
            cp_json_free(j);
            j = NULL;
        }
    }
    if (!j) {
        if (r.nomem) return cp_err_set(err, CP_ENOMEM, "out of memory reading JSON");
        if (r.deep)
            return cp_err_set(err, CP_EPARSE, "JSON nested deeper than %d at byte %zu",
                              CP_JSON_MAX_DEPTH, r.i);
        if (r.bad_utf8)
            return cp_err_set(err, CP_EPARSE, "JSON string at byte %zu is not valid UTF-8", r.i);
        return cp_err_set(err, CP_EPARSE, "malformed JSON at byte %zu", r.i);
    }
    *out = j;
    return 0;
}

int cp_json_parse(const char *text, size_t len, cp_json **out, cp_err *err)
{
    return cp_json_parse_flags(text, len, 0, out, err);
}

/* ===== access ======================================================================== */

const cp_json *cp_json_get(const cp_json *o, const char *key)
{
    if (!o || o->type != CP_JSON_OBJECT) return NULL;
    for (uint32_t k = 0; k < o->n; k++)
        if (strcmp(o->keys[k], key) == 0) return o->items[k];
    return NULL;
}

const char *cp_json_str(const cp_json *j, const char *def)
{
    return j && j->type == CP_JSON_STRING ? j->str : def;
}

int64_t cp_json_int(const cp_json *j, int64_t def)
{
    return j && j->type == CP_JSON_NUMBER ? j->i64 : def;
}

double cp_json_num(const cp_json *j, double def)
{
    return j && j->type == CP_JSON_NUMBER ? j->num : def;
}

int cp_json_is(const cp_json *j, cp_json_type t)
{
    return j && j->type == t;
}

int cp_json_is_int(const cp_json *j)
{
    return j && j->type == CP_JSON_NUMBER && j->is_int;
}

size_t cp_json_len(const cp_json *a)
{
    return a && a->type == CP_JSON_ARRAY ? a->n : 0;
}

const cp_json *cp_json_at(const cp_json *a, size_t i)
{
    return a && a->type == CP_JSON_ARRAY && i < a->n ? a->items[i] : NULL;
}

/* ===== building and editing ========================================================== */

cp_json *cp_json_new(cp_json_type t)
{
    cp_json *j = calloc(1, sizeof *j);
    if (j) j->type = t;
    return j;
}

cp_json *cp_json_new_int(int64_t v)
{
    cp_json *j = cp_json_new(CP_JSON_NUMBER);
    if (j) {
        j->i64 = v;
        j->num = (double)v;
        j->is_int = 1;
    }
    return j;
}

cp_json *cp_json_new_str(const char *s)
{
    cp_json *j = cp_json_new(CP_JSON_STRING);
    if (j && !(j->str = strdup(s))) {
        free(j);
        return NULL;
    }
    return j;
}

int cp_json_add(cp_json *a, const char *key, cp_json *v)
{
    if (!v) return CP_ENOMEM;
    char *k = NULL;
    if (a->type == CP_JSON_OBJECT && !(k = strdup(key))) {
        cp_json_free(v);
        return CP_ENOMEM;
    }
    return push(NULL, a, k, v) ? CP_ENOMEM : 0;
}

int cp_json_set(cp_json *o, const char *key, cp_json *v)
{
    if (!v) return CP_ENOMEM;
    if (o->type != CP_JSON_OBJECT) {
        cp_json_free(v);
        return CP_EINVAL;
    }
    for (uint32_t k = 0; k < o->n; k++) {
        if (strcmp(o->keys[k], key)) continue;
        cp_json_free(o->items[k]);
        o->items[k] = v;
        return 0;
    }
    return cp_json_add(o, key, v);
}

cp_json *cp_json_take(cp_json *o, const char *key)
{
    if (!o || o->type != CP_JSON_OBJECT) return NULL;
    for (uint32_t k = 0; k < o->n; k++) {
        if (strcmp(o->keys[k], key)) continue;
        cp_json *v = o->items[k];
        free(o->keys[k]);
        /* the capacity push assumes stays: removing never shrinks the arrays */
        memmove(o->keys + k, o->keys + k + 1, (o->n - k - 1) * sizeof *o->keys);
        memmove(o->items + k, o->items + k + 1, (o->n - k - 1) * sizeof *o->items);
        o->n--;
        return v;
    }
    return NULL;
}

cp_json *cp_json_copy(const cp_json *j)
{
    if (!j) return NULL;
    cp_json *c = cp_json_new(j->type);
    if (!c) return NULL;
    c->num = j->num;
    c->i64 = j->i64;
    c->is_int = j->is_int;
    if (j->str && !(c->str = strdup(j->str))) goto fail;
    for (uint32_t k = 0; k < j->n; k++)
        if (cp_json_add(c, j->keys ? j->keys[k] : NULL, cp_json_copy(j->items[k]))) goto fail;
    return c;
fail:
    cp_json_free(c);
    return NULL;
}

int cp_json_write(cp_buf *b, const cp_json *j)
{
    switch (j->type) {
    case CP_JSON_NULL:
        return cp_buf_append(b, "null", 4) ? CP_ENOMEM : 0;
    case CP_JSON_BOOL:
        return cp_buf_printf(b, "%s", j->num ? "true" : "false") ? CP_ENOMEM : 0;
    case CP_JSON_NUMBER:
        if (j->is_int) return cp_buf_printf(b, "%lld", (long long)j->i64) ? CP_ENOMEM : 0;
        if (!isfinite(j->num)) return cp_buf_append(b, "null", 4) ? CP_ENOMEM : 0;
        return cp_buf_printf(b, "%.17g", j->num) ? CP_ENOMEM : 0;
    case CP_JSON_STRING:
        return cp_buf_append(b, "\"", 1) || cp_json_escape(b, j->str, strlen(j->str)) ||
                       cp_buf_append(b, "\"", 1)
                   ? CP_ENOMEM
                   : 0;
    case CP_JSON_ARRAY:
    case CP_JSON_OBJECT:
        break;
    }
    int obj = j->type == CP_JSON_OBJECT;
    if (cp_buf_append(b, obj ? "{" : "[", 1)) return CP_ENOMEM;
    for (uint32_t k = 0; k < j->n; k++) {
        if (k && cp_buf_append(b, ",", 1)) return CP_ENOMEM;
        if (obj &&
            (cp_buf_append(b, "\"", 1) || cp_json_escape(b, j->keys[k], strlen(j->keys[k])) ||
             cp_buf_append(b, "\":", 2)))
            return CP_ENOMEM;
        if (cp_json_write(b, j->items[k])) return CP_ENOMEM;
    }
    return cp_buf_append(b, obj ? "}" : "]", 1) ? CP_ENOMEM : 0;
}
