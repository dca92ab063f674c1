/* JSON: string escaping for every writer, and a recursive-descent reader (RFC 8259)
 * building a tree; \u escapes become UTF-8. */
#include "json.h"

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

/* ===== reading ======================================================================= */

/* Objects and arrays open at once. The API's trees nest two per frame (a node, its children):
 * 64 was 31 frames, and a 64-frame agent stack's diff could not be read. Recursion: ~200
 * bytes of stack a level (the agent's thread, reading /api/v1/brokers, has 1 MiB). */
#define MAX_DEPTH 1024

typedef struct rd {
    const char *s;
    size_t len, i;
    int depth;
    int nomem, deep;
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
    r->i++;
    char *d = malloc(r->len - r->i + 1);
    if (!d) {
        r->nomem = 1;
        return NULL;
    }
    size_t j = 0;
    while (r->i < r->len) {
        unsigned char c = (unsigned char)r->s[r->i++];
        if (c == '"') {
            d[j] = 0;
            return d;
        }
        if (c < 0x20) break;
        if (c != '\\') {
            d[j++] = (char)c;
            continue;
        }
        if (r->i >= r->len) break;
        char e = r->s[r->i++];
        const char *map = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e);
        if (e && map && ((map - "\"\"\\\\//b\bf\fn\nr\rt\t") % 2) == 0) {
            d[j++] = map[1];
            continue;
        }
        unsigned u;
        if (e != 'u' || r->i + 4 > r->len || hex4(r->s + r->i, &u) || u == 0) break;
        r->i += 4;
        if (u >= 0xd800 && u < 0xdc00) { /* a surrogate pair */
            unsigned lo;
            if (r->i + 6 > r->len || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u' ||
                hex4(r->s + r->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                break;
            r->i += 6;
            u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
        }
        j += cp_utf8_put(u, d + j);
    }
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
            r->nomem = 1;
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
    if (++r->depth > MAX_DEPTH) {
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
        char buf[64];
        size_t n = 0;
        int integer = 1;
        while (r->i + n < r->len && n < sizeof buf - 1 && r->s[r->i + n] &&
               strchr("-+.eE0123456789", r->s[r->i + n])) {
            if (strchr(".eE", r->s[r->i + n])) integer = 0;
            n++;
        }
        memcpy(buf, r->s + r->i, n);
        buf[n] = 0;
        char *end;
        j->type = CP_JSON_NUMBER;
        j->num = strtod(buf, &end);
        if (end != buf + n || n == 0) {
            ok = NULL;
        } else {
            r->i += n;
            long long v = strtoll(buf, &end, 10);
            j->is_int = integer && end == buf + n && fabs(j->num) < 9.2e18;
            j->i64 = j->is_int ? v : cp_math_llround(j->num);
        }
    } else {
        ok = NULL;
    }
    if (!ok) {
        cp_json_free(j);
        return NULL;
    }
    return j;
}

int cp_json_parse(const char *text, size_t len, cp_json **out, cp_err *err)
{
    rd r = {.s = text, .len = len};
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
            return cp_err_set(err, CP_EPARSE, "JSON nested deeper than %d at byte %zu", MAX_DEPTH,
                              r.i);
        return cp_err_set(err, CP_EPARSE, "malformed JSON at byte %zu", r.i);
    }
    *out = j;
    return 0;
}

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
