/* The stack accumulator (stack id -> values) and the block codec: sorted (stack id delta,
 * values / column divisor) varints, lz4-compressed. See format.h for the layout. */
#include "store_int.h"

#include <lz4.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------
 * Accumulator
 * --------------------------------------------------------------------------------- */

void cp_acc_init(cp_acc *a, uint32_t ntypes)
{
    memset(a, 0, sizeof *a);
    a->ntypes = ntypes;
}

void cp_acc_close(cp_acc *a)
{
    if (!a) return;
    free(a->ids.v);
    free(a->vals.v);
    free(a->slots);
    memset(a, 0, sizeof *a);
}

void cp_acc_reset(cp_acc *a, uint32_t ntypes)
{
    a->ids.n = 0;
    a->vals.n = 0;
    a->ntypes = ntypes;
    a->time_ns = 0;
    a->windows = 0;
    if (a->slots) memset(a->slots, 0, sizeof *a->slots * a->nslots);
}

static inline uint32_t acc_hash(uint32_t id)
{
    return id * 2654435761u;
}

static int acc_rehash(cp_acc *a, uint32_t nslots)
{
    uint64_t *s = calloc(nslots, sizeof *s);
    if (!s) return CP_ENOMEM;
    for (uint32_t i = 0; i < a->ids.n; i++) {
        uint32_t h = acc_hash(a->ids.v[i]) & (nslots - 1);
        while (s[h])
            h = (h + 1) & (nslots - 1);
        s[h] = (uint64_t)a->ids.v[i] << 32 | (i + 1);
    }
    free(a->slots);
    a->slots = s;
    a->nslots = nslots;
    return 0;
}

int cp_acc_reserve(cp_acc *a, uint32_t nrows)
{
    if (nrows > UINT32_MAX / 4) return CP_ENOMEM;
    uint32_t ns = a->nslots ? a->nslots : 64;
    while (nrows * 2 > ns)
        ns *= 2;
    if (ns != a->nslots && acc_rehash(a, ns)) return CP_ENOMEM;
    if (cp_vec_reserve(&a->ids, nrows) || cp_vec_reserve(&a->vals, (size_t)nrows * a->ntypes))
        return CP_ENOMEM;
    return 0;
}

/* The probe and append of a row, with room already reserved for it. */
static inline int64_t *acc_row_reserved(cp_acc *a, uint32_t id)
{
    uint32_t mask = a->nslots - 1, h = acc_hash(id) & mask;
    for (uint64_t sl; (sl = a->slots[h]); h = (h + 1) & mask)
        if ((uint32_t)(sl >> 32) == id) return a->vals.v + (size_t)((uint32_t)sl - 1) * a->ntypes;
    a->ids.v[a->ids.n++] = id;
    int64_t *row = a->vals.v + a->vals.n;
    if (a->ntypes == 2) { /* the common width, without a call to memset per row */
        row[0] = 0;
        row[1] = 0;
    } else {
        for (uint32_t t = 0; t < a->ntypes; t++)
            row[t] = 0;
    }
    a->vals.n += a->ntypes;
    a->slots[h] = (uint64_t)id << 32 | a->ids.n;
    return row;
}

/* The row of stack id, created (zeroed) if absent. A slot holds the id next to the row
 * number, so a probe reads one word. */
int64_t *cp_acc_row(cp_acc *a, uint32_t id)
{
    if (((a->ids.n + 1) * 2 > a->nslots || a->ids.n == a->ids.cap ||
         a->vals.n + a->ntypes > a->vals.cap) &&
        cp_acc_reserve(a, a->ids.n + 1))
        return NULL; /* (the arrays grow by doubling) */
    return acc_row_reserved(a, id);
}

/* Room for every row of src is reserved once, so the loop is only probes and adds; the
 * common widths get a loop of their own. */
int cp_acc_add(cp_acc *dst, const cp_acc *src, int64_t factor)
{
    if (!src->ids.n) return 0;
    if ((uint64_t)dst->ids.n + src->ids.n > UINT32_MAX / 4) return CP_ENOMEM;
    uint32_t w = dst->ntypes < src->ntypes ? dst->ntypes : src->ntypes;
    const int64_t *s = src->vals.v;
    uint64_t f = (uint64_t)factor;
    /* A rollup bucket's slots and rows are tens of KB, read in random order: most probes
     * miss the cache. So the slot of the row PF_FAR ahead is fetched early, and the row of
     * the one PF_NEAR ahead too, once its (by then cached) slot says where it is. Room is
     * reserved a chunk of rows at a time: reserving for all of src at once would size the
     * slot table for dst.n + src.n rows, twice what a bucket holding most of src's stacks
     * already needs, and a larger table misses the cache more. */
    enum { PF_FAR = 16, PF_NEAR = 8, CHUNK = 256 };
    const uint32_t *ids = src->ids.v, n = src->ids.n;
    for (uint32_t c = 0; c < n; c += CHUNK) {
        uint32_t cn = n - c < CHUNK ? n - c : CHUNK;
        if (cp_acc_reserve(dst, dst->ids.n + cn)) return CP_ENOMEM;
        const uint32_t mask = dst->nslots - 1, end = c + cn;
        for (uint32_t i = c; i < end; i++, s += src->ntypes) {
            if (i + PF_FAR < n) __builtin_prefetch(&dst->slots[acc_hash(ids[i + PF_FAR]) & mask]);
            if (i + PF_NEAR < n) {
                uint64_t sl = dst->slots[acc_hash(ids[i + PF_NEAR]) & mask];
                if (sl && (uint32_t)(sl >> 32) == ids[i + PF_NEAR])
                    __builtin_prefetch(dst->vals.v + (size_t)((uint32_t)sl - 1) * dst->ntypes, 1);
            }
            int64_t *row = acc_row_reserved(dst, ids[i]);
            if (w == 2) {
                row[0] = cp_add_wrap(row[0], (int64_t)((uint64_t)s[0] * f));
                row[1] = cp_add_wrap(row[1], (int64_t)((uint64_t)s[1] * f));
            } else {
                for (uint32_t t = 0; t < w; t++)
                    row[t] = cp_add_wrap(row[t], (int64_t)((uint64_t)s[t] * f));
            }
        }
    }
    return 0;
}

void cp_acc_swap(cp_acc *a, cp_acc *b)
{
    cp_acc t = *a;
    *a = *b;
    *b = t;
}

void cp_acc_take(cp_acc *dst, cp_acc *src)
{
    /* a window's slot table is a few KB to zero, where a new one was a calloc and a
     * rehash for every window */
    free(dst->slots);
    uint64_t *slots = src->slots;
    uint32_t nslots = src->nslots;
    src->slots = NULL;
    src->nslots = 0;
    cp_acc_swap(dst, src);
    src->slots = slots;
    src->nslots = nslots;
    cp_acc_reset(src, dst->ntypes);
}

int cp_acc_copy(cp_acc *dst, const cp_acc *src)
{
    cp_acc_reset(dst, src->ntypes);
    dst->time_ns = src->time_ns;
    dst->windows = src->windows;
    return cp_acc_add(dst, src, 1);
}

/* ---------------------------------------------------------------------------------
 * Block codec
 * --------------------------------------------------------------------------------- */

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Sorts rows by stack id: LSD radix sort of (id << 32 | row) keys on the id's bytes,
 * skipping bytes that are the same in every key. */
static int sort_rows(const cp_acc *a, uint32_t *ord)
{
    uint32_t n = a->ids.n;
    uint64_t *k = malloc(sizeof(uint64_t) * (n ? n : 1) * 2);
    if (!k) return CP_ENOMEM;
    uint64_t *tmp = k + n;
    uint32_t all_or = 0, all_and = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        k[i] = (uint64_t)a->ids.v[i] << 32 | i;
        all_or |= a->ids.v[i];
        all_and &= a->ids.v[i];
    }
    for (int shift = 32; shift < 64; shift += 8) {
        if (!(((all_or ^ all_and) >> (shift - 32)) & 0xff)) continue;
        uint32_t cnt[257] = {0};
        for (uint32_t i = 0; i < n; i++)
            cnt[((k[i] >> shift) & 0xff) + 1]++;
        for (int b = 0; b < 256; b++)
            cnt[b + 1] += cnt[b];
        for (uint32_t i = 0; i < n; i++)
            tmp[cnt[(k[i] >> shift) & 0xff]++] = k[i];
        uint64_t *t = k;
        k = tmp;
        tmp = t;
    }
    for (uint32_t i = 0; i < n; i++)
        ord[i] = (uint32_t)k[i];
    free(k < tmp ? k : tmp);
    return 0;
}

int cp_block_encode(cp_acc *a, cp_buf *out)
{
    uint32_t n = a->ids.n, nt = a->ntypes;
    uint32_t *ord = malloc(sizeof(uint32_t) * (n ? n : 1));
    uint8_t *raw = NULL;
    int rc = CP_ENOMEM;
    if (!ord) return CP_ENOMEM;
    if (sort_rows(a, ord)) {
        free(ord);
        return CP_ENOMEM;
    }

    uint64_t div[CP_MAX_TYPES];
    for (uint32_t t = 0; t < nt; t++) {
        uint64_t g = 0;
        for (uint32_t i = 0; i < n && g != 1; i++) {
            int64_t v = a->vals.v[(size_t)i * nt + t];
            uint64_t av = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            g = gcd64(g, av);
        }
        div[t] = g ? g : 1;
    }
    size_t cap = 32 + 20 * (size_t)nt + (size_t)n * 10 * (1 + nt);
    raw = malloc(cap);
    if (!raw) goto done;
    uint8_t *p = raw;
    p = cp_put_uv(p, cp_zz(a->time_ns));
    p = cp_put_uv(p, a->windows);
    p = cp_put_uv(p, nt);
    for (uint32_t t = 0; t < nt; t++) {
        int64_t tot = 0;
        for (uint32_t i = 0; i < n; i++)
            tot = cp_add_wrap(tot, a->vals.v[(size_t)i * nt + t]);
        p = cp_put_uv(p, div[t]);
        p = cp_put_uv(p, cp_zz(tot));
    }
    p = cp_put_uv(p, n);
    uint32_t prev = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = ord[k], id = a->ids.v[i];
        p = cp_put_uv(p, id - prev);
        prev = id;
        const int64_t *row = a->vals.v + (size_t)i * nt;
        for (uint32_t t = 0; t < nt; t++) {
            /* exact: every value is a multiple of div[t]; divide in the unsigned domain so
             * INT64_MIN stays well defined */
            int64_t q = div[t] == 1 ? row[t] : (int64_t)((uint64_t)row[t] / div[t]);
            if (row[t] < 0 && div[t] != 1)
                q = -(int64_t)(((uint64_t)0 - (uint64_t)row[t]) / div[t]);
            p = cp_put_uv(p, cp_zz(q));
        }
    }
    size_t rawlen = (size_t)(p - raw);
    int bound = LZ4_compressBound((int)rawlen);
    if ((rc = cp_buf_reserve(out, 11 + (size_t)bound))) goto done;
    uint8_t *o = out->data + out->len;
    uint8_t *q = o + 1;
    q = cp_put_uv(q, rawlen);
    int clen =
        rawlen > 64 ? LZ4_compress_default((const char *)raw, (char *)q, (int)rawlen, bound) : 0;
    if (clen > 0 && (size_t)clen < rawlen) {
        o[0] = CP_BLOCK_LZ4;
        out->len += (size_t)(q - o) + (size_t)clen;
    } else {
        o[0] = CP_BLOCK_RAW;
        memcpy(q, raw, rawlen);
        out->len += (size_t)(q - o) + rawlen;
    }
    rc = 0;
done:
    free(ord);
    free(raw);
    return rc;
}

int cp_block_it_init(cp_block_it *it, const uint8_t *v, size_t len, cp_buf *scratch, cp_err *err)
{
    memset(it, 0, sizeof *it);
    if (len < 2) return cp_err_set(err, CP_ESTORE, "block of %zu bytes is too short", len);
    cp_rd r = {v + 1, v + len, 0};
    uint64_t rawlen = cp_get_uv(&r);
    if (r.bad || rawlen > CP_BLOCK_MAX_RAW)
        return cp_err_set(err, CP_ESTORE, "block: bad raw length");
    if (v[0] == CP_BLOCK_RAW) {
        if ((uint64_t)(r.end - r.p) != rawlen)
            return cp_err_set(err, CP_ESTORE, "block: raw length %llu but %zu bytes stored",
                              (unsigned long long)rawlen, (size_t)(r.end - r.p));
        it->r = r;
    } else if (v[0] == CP_BLOCK_LZ4) {
        scratch->len = 0;
        if (cp_buf_reserve(scratch, rawlen + 1)) return cp_err_set(err, CP_ENOMEM, "block");
        int got = LZ4_decompress_safe((const char *)r.p, (char *)scratch->data, (int)(r.end - r.p),
                                      (int)rawlen);
        if (got < 0 || (uint64_t)got != rawlen)
            return cp_err_set(err, CP_ESTORE, "block: lz4 payload does not decompress");
        it->r.p = scratch->data;
        it->r.end = scratch->data + rawlen;
    } else {
        return cp_err_set(err, CP_ESTORE, "block: unknown codec %u", v[0]);
    }
    it->time_ns = cp_get_sv(&it->r);
    it->windows = cp_get_uv(&it->r);
    uint64_t nt = cp_get_uv(&it->r);
    if (it->r.bad || nt == 0 || nt > CP_MAX_TYPES)
        return cp_err_set(err, CP_ESTORE, "block: bad type count %llu (1 to %d)",
                          (unsigned long long)nt, CP_MAX_TYPES);
    it->ntypes = (uint32_t)nt;
    for (uint32_t t = 0; t < nt; t++) {
        it->div[t] = cp_get_uv(&it->r);
        it->total[t] = cp_get_sv(&it->r);
        if (!it->div[t]) it->r.bad = 1;
    }
    it->left = cp_get_uv(&it->r);
    if (it->r.bad || it->left > (uint64_t)(it->r.end - it->r.p))
        return cp_err_set(err, CP_ESTORE, "block: bad header");
    return 0;
}

int cp_block_it_next(cp_block_it *it, uint32_t *id, int64_t *vals)
{
    if (!it->left) return 0;
    it->left--;
    uint64_t d = cp_get_uv(&it->r);
    for (uint32_t t = 0; t < it->ntypes; t++)
        vals[t] = (int64_t)((uint64_t)cp_get_sv(&it->r) * it->div[t]);
    if (it->r.bad || d > UINT32_MAX - it->id || (d == 0 && it->id != 0)) return CP_ESTORE;
    it->id += (uint32_t)d;
    *id = it->id;
    return 1;
}

int cp_block_load(cp_acc *a, const uint8_t *v, size_t len, cp_buf *scratch, cp_err *err)
{
    cp_block_it it;
    int rc = cp_block_it_init(&it, v, len, scratch, err);
    if (rc) return rc;
    cp_acc_reset(a, it.ntypes);
    a->time_ns = it.time_ns;
    a->windows = it.windows;
    int64_t vals[CP_MAX_TYPES];
    uint32_t id;
    while ((rc = cp_block_it_next(&it, &id, vals)) == 1) {
        int64_t *row = cp_acc_row(a, id);
        if (!row) return cp_err_set(err, CP_ENOMEM, "block");
        memcpy(row, vals, sizeof(int64_t) * it.ntypes);
    }
    if (rc < 0) return cp_err_set(err, CP_ESTORE, "block: corrupt entry");
    return 0;
}
