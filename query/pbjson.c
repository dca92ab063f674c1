/* Protobuf <-> JSON tree by schema (pbjson.h): a reader of the wire format that builds the
 * tree cp_json_parse would, and a writer that walks a parsed JSON answer. */
#include "pbjson.h"

#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 16

/* ---- decoding ------------------------------------------------------------------------ */

typedef struct rd {
    const uint8_t *p, *end, *base;
    const cp_pbj_msg *m;
} rd;

static int rd_varint(rd *r, uint64_t *v)
{
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (r->p >= r->end) return -1;
        uint8_t c = *r->p++;
        *v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

static int decode_msg(const cp_pbj_msg *m, const uint8_t *p, size_t len, const uint8_t *base,
                      int depth, cp_json *obj, cp_err *err);

#define BAD(what)                                                                                  \
    cp_err_set(err, CP_EPARSE, "%s: field %u (%s): %s at byte %zu", r->m->name, f->num, f->name,   \
               what, (size_t)(r->p - r->base))

/* One occurrence of field f (wire type wt) into obj. */
static int decode_field(rd *r, const cp_pbj_field *f, unsigned wt, int depth, cp_json *obj,
                        cp_err *err)
{
    cp_json *slot = NULL; /* the array of a repeated field */
    if (f->repeated) {
        for (uint32_t i = 0; i < obj->n; i++)
            if (!strcmp(obj->keys[i], f->name)) slot = obj->items[i];
        if (!slot) {
            if (cp_json_add(obj, f->name, cp_json_new(CP_JSON_ARRAY))) return CP_ENOMEM;
            slot = obj->items[obj->n - 1];
        }
    } else {
        for (uint32_t i = 0; i < obj->n; i++) /* a scalar's last occurrence wins */
            if (!strcmp(obj->keys[i], f->name)) {
                cp_json_free(obj->items[i]);
                free(obj->keys[i]);
                obj->items[i] = obj->items[obj->n - 1];
                obj->keys[i] = obj->keys[obj->n - 1];
                obj->n--;
                break;
            }
        slot = obj;
    }
    uint64_t v;
    int varint = f->type == CP_PBJ_INT64 || f->type == CP_PBJ_ENUM || f->type == CP_PBJ_BOOL;
    if (varint && wt == 2 && f->repeated) { /* packed */
        if (rd_varint(r, &v) || v > (uint64_t)(r->end - r->p)) return BAD("truncated");
        rd sub = {r->p, r->p + v, r->base, r->m};
        r->p += v;
        while (sub.p < sub.end) {
            uint64_t x;
            if (rd_varint(&sub, &x)) {
                r = &sub;
                return BAD("truncated packed varint");
            }
            if (cp_json_add(slot, f->name, cp_json_new_int((int64_t)x))) return CP_ENOMEM;
        }
        return 0;
    }
    cp_json *val = NULL;
    if (varint) {
        if (wt != 0) return BAD("expected a varint");
        if (rd_varint(r, &v)) return BAD("truncated varint");
        if (f->type == CP_PBJ_BOOL) {
            val = cp_json_new(CP_JSON_BOOL);
            if (val) val->num = v != 0;
        } else {
            val = cp_json_new_int(f->type == CP_PBJ_ENUM ? (int64_t)(int32_t)v : (int64_t)v);
        }
    } else if (f->type == CP_PBJ_DOUBLE) {
        if (wt != 1) return BAD("expected a fixed64 double");
        if (r->end - r->p < 8) return BAD("truncated double");
        uint64_t bits = 0;
        for (int i = 7; i >= 0; i--)
            bits = bits << 8 | r->p[i];
        r->p += 8;
        val = cp_json_new(CP_JSON_NUMBER);
        if (val) memcpy(&val->num, &bits, sizeof val->num);
    } else {
        if (wt != 2) return BAD("expected length-delimited bytes");
        if (rd_varint(r, &v) || v > (uint64_t)(r->end - r->p)) return BAD("truncated");
        const uint8_t *d = r->p;
        r->p += v;
        if (f->type == CP_PBJ_STRING) {
            if (memchr(d, 0, (size_t)v)) return BAD("a NUL byte in a string");
            val = cp_json_new(CP_JSON_STRING);
            if (val && !(val->str = malloc((size_t)v + 1))) {
                free(val);
                val = NULL;
            }
            if (val) {
                memcpy(val->str, d, (size_t)v);
                val->str[v] = 0;
            }
        } else {
            if (depth >= MAX_DEPTH) return BAD("nested too deep");
            val = cp_json_new(CP_JSON_OBJECT);
            if (!val) return CP_ENOMEM;
            int rc = decode_msg(f->msg, d, (size_t)v, r->base, depth + 1, val, err);
            if (rc) {
                cp_json_free(val);
                return rc;
            }
        }
    }
    return cp_json_add(slot, f->name, val);
}

static int decode_msg(const cp_pbj_msg *m, const uint8_t *p, size_t len, const uint8_t *base,
                      int depth, cp_json *obj, cp_err *err)
{
    rd r0 = {p, p + len, base, m}, *r = &r0;
    while (r->p < r->end) {
        uint64_t key, v;
        const uint8_t *at = r->p;
        if (rd_varint(r, &key) || !(key >> 3) || (key >> 3) > UINT32_MAX)
            return cp_err_set(err, CP_EPARSE, "%s: bad field key at byte %zu", m->name,
                              (size_t)(at - base));
        uint32_t num = (uint32_t)(key >> 3);
        unsigned wt = (unsigned)(key & 7);
        const cp_pbj_field *f = NULL;
        for (uint32_t i = 0; i < m->n && !f; i++)
            if (m->f[i].num == num) f = &m->f[i];
        if (f) {
            int rc = decode_field(r, f, wt, depth, obj, err);
            if (rc) return rc;
            continue;
        }
        int bad = 0; /* unknown fields are skipped */
        if (wt == 0)
            bad = rd_varint(r, &v);
        else if (wt == 1 || wt == 5)
            bad = r->end - r->p < (wt == 1 ? 8 : 4) || !(r->p += wt == 1 ? 8 : 4);
        else if (wt == 2)
            bad = rd_varint(r, &v) || v > (uint64_t)(r->end - r->p) || !(r->p += v, 1);
        else
            bad = 1;
        if (bad)
            return cp_err_set(err, CP_EPARSE, "%s: field %u: bad or truncated at byte %zu", m->name,
                              num, (size_t)(at - base));
    }
    return 0;
}

int cp_pbj_decode(const cp_pbj_msg *m, const uint8_t *p, size_t len, cp_json **out, cp_err *err)
{
    *out = cp_json_new(CP_JSON_OBJECT);
    if (!*out) return CP_ENOMEM;
    if (!p) p = (const uint8_t *)""; /* an empty message, as an empty buffer may come */
    int rc = decode_msg(m, p, len, p, 0, *out, err);
    if (rc) {
        cp_json_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- encoding ------------------------------------------------------------------------ */

static int put_varint(cp_buf *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    return cp_buf_append(b, t, n);
}

static int put_bytes(cp_buf *b, uint32_t num, const void *p, size_t n)
{
    return put_varint(b, (uint64_t)num << 3 | 2) || put_varint(b, n) ||
                   (n && cp_buf_append(b, p, n))
               ? CP_ENOMEM
               : 0;
}

/* The integer of a JSON number or string of digits: 0 with *x, or -1. */
static int json_int(const cp_json *v, int64_t *x)
{
    if (v->type == CP_JSON_NUMBER) {
        *x = v->is_int ? v->i64 : (int64_t)v->num;
        return v->is_int || (double)*x == v->num ? 0 : -1;
    }
    if (v->type == CP_JSON_STRING && v->str[0]) {
        char *end;
        *x = strtoll(v->str, &end, 10);
        return *end ? -1 : 0;
    }
    return -1;
}

static int encode_msg(const cp_pbj_msg *m, const cp_json *j, cp_buf *out, int depth, cp_err *err);

#define WRONG(m, f)                                                                                \
    cp_err_set(err, CP_EINVAL, "%s: %s: a JSON value of the wrong type", (m)->name, (f)->name)

/* One value v of field f (not packed). */
static int encode_value(const cp_pbj_msg *m, const cp_pbj_field *f, const cp_json *v, int depth,
                        cp_buf *out, cp_err *err)
{
    int keep = f->repeated;
    switch (f->type) {
    case CP_PBJ_STRING:
        if (v->type != CP_JSON_STRING) return WRONG(m, f);
        if (!keep && !v->str[0]) return 0;
        return put_bytes(out, f->num, v->str, strlen(v->str));
    case CP_PBJ_INT64:
    case CP_PBJ_ENUM: {
        int64_t x;
        if (json_int(v, &x)) return WRONG(m, f);
        if (!keep && !x) return 0;
        return put_varint(out, (uint64_t)f->num << 3) || put_varint(out, (uint64_t)x) ? CP_ENOMEM
                                                                                      : 0;
    }
    case CP_PBJ_BOOL:
        if (v->type != CP_JSON_BOOL) return WRONG(m, f);
        if (!keep && !v->num) return 0;
        return put_varint(out, (uint64_t)f->num << 3) || put_varint(out, v->num != 0) ? CP_ENOMEM
                                                                                      : 0;
    case CP_PBJ_DOUBLE: {
        if (v->type != CP_JSON_NUMBER) return WRONG(m, f);
        if (!keep && v->num == 0) return 0;
        uint64_t bits;
        memcpy(&bits, &v->num, sizeof bits);
        uint8_t t[8];
        for (int i = 0; i < 8; i++)
            t[i] = (uint8_t)(bits >> (8 * i));
        return put_varint(out, (uint64_t)f->num << 3 | 1) || cp_buf_append(out, t, 8) ? CP_ENOMEM
                                                                                      : 0;
    }
    case CP_PBJ_MSG: {
        if (v->type != CP_JSON_OBJECT) return WRONG(m, f);
        if (depth >= MAX_DEPTH)
            return cp_err_set(err, CP_EINVAL, "%s: %s: nested too deep", m->name, f->name);
        cp_buf sub = {0};
        int rc = encode_msg(f->msg, v, &sub, depth + 1, err);
        if (!rc) rc = put_bytes(out, f->num, sub.data, sub.len);
        cp_buf_close(&sub);
        return rc;
    }
    }
    return WRONG(m, f);
}

static int encode_msg(const cp_pbj_msg *m, const cp_json *j, cp_buf *out, int depth, cp_err *err)
{
    for (uint32_t i = 0; i < m->n; i++) {
        const cp_pbj_field *f = &m->f[i];
        const cp_json *v = cp_json_get(j, f->name);
        if (!v || v->type == CP_JSON_NULL) continue;
        if (!f->repeated) {
            int rc = encode_value(m, f, v, depth, out, err);
            if (rc) return rc;
            continue;
        }
        if (v->type != CP_JSON_ARRAY) return WRONG(m, f);
        if (f->type == CP_PBJ_INT64 || f->type == CP_PBJ_ENUM) { /* packed */
            if (!v->n) continue;
            cp_buf pk = {0};
            int rc = 0;
            for (uint32_t k = 0; !rc && k < v->n; k++) {
                int64_t x;
                rc = json_int(v->items[k], &x)      ? WRONG(m, f)
                     : put_varint(&pk, (uint64_t)x) ? CP_ENOMEM
                                                    : 0;
            }
            if (!rc) rc = put_bytes(out, f->num, pk.data, pk.len);
            cp_buf_close(&pk);
            if (rc) return rc;
            continue;
        }
        for (uint32_t k = 0; k < v->n; k++) {
            int rc = encode_value(m, f, v->items[k], depth, out, err);
            if (rc) return rc;
        }
    }
    return 0;
}

int cp_pbj_encode(const cp_pbj_msg *m, const cp_json *j, cp_buf *out, cp_err *err)
{
    if (!j || j->type != CP_JSON_OBJECT)
        return cp_err_set(err, CP_EINVAL, "%s: not a JSON object", m->name);
    return encode_msg(m, j, out, 0, err);
}
