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

/* Zeroes the slot table, which holds a slot per row and nothing else (so an acc without
 * rows has a zeroed table: resetting it again costs nothing). A window's table is several
 * times its rows (16 KB for 567 rows) and was cleared twice per window: for a sparse table
 * each row's cluster is zeroed from the row's home slot on instead. Zeroing whole runs in
 * any order clears everything: what is left of a cluster is always a prefix of it, and
 * the row of any slot still set starts its own run at or before that slot. */
static void acc_clear_slots(cp_acc *a)
{
    if (!a->slots || !a->ids.n) return;
    if ((size_t)a->ids.n * 8 >= a->nslots) {
        memset(a->slots, 0, sizeof *a->slots * a->nslots);
        return;
    }
    const uint32_t mask = a->nslots - 1;
    uint64_t *sl = a->slots;
    for (uint32_t i = 0; i < a->ids.n; i++)
        for (uint32_t h = cp_acc_hash(a->ids.v[i]) & mask; sl[h]; h = (h + 1) & mask)
            sl[h] = 0;
}

void cp_acc_reset(cp_acc *a, uint32_t ntypes)
{
    acc_clear_slots(a);
    a->ids.n = 0;
    a->vals.n = 0;
    a->ntypes = ntypes;
    a->time_ns = 0;
    a->windows = 0;
}

static int acc_rehash(cp_acc *a, uint32_t nslots)
{
    uint64_t *s = calloc(nslots, sizeof *s);
    if (!s) return CP_ENOMEM;
    for (uint32_t i = 0; i < a->ids.n; i++) {
        uint32_t h = cp_acc_hash(a->ids.v[i]) & (nslots - 1);
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
    /* from 8 slots: most open rollup buckets of many small series hold a row or two, and
     * 64 slots made a one-row bucket 800 bytes, 290 now (store.memory_budget, issue 27) */
    uint32_t ns = a->nslots ? a->nslots : 8;
    while (nrows * 2 > ns)
        ns *= 2;
    if (ns != a->nslots && acc_rehash(a, ns)) return CP_ENOMEM;
    if (cp_vec_reserve(&a->ids, nrows) || cp_vec_reserve(&a->vals, (size_t)nrows * a->ntypes))
        return CP_ENOMEM;
    return 0;
}

/* Room for every row of src is reserved once, so the loop is only probes and adds; the
 * common widths get a loop of their own. */
static inline __attribute__((always_inline)) int acc_add(cp_acc *dst, const cp_acc *src,
                                                         int64_t factor, int prefetch)
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
    const uint32_t *ids = src->ids.v, n = src->ids.n, snt = src->ntypes, dnt = dst->ntypes;
    for (uint32_t c = 0; c < n; c += CHUNK) {
        uint32_t cn = n - c < CHUNK ? n - c : CHUNK;
        if (cp_acc_reserve(dst, dst->ids.n + cn)) return CP_ENOMEM;
        /* dst's arrays and count in locals for the chunk (cp_acc_row_reserved's probe and
         * append): a row written through dst would make every field be read again */
        const uint32_t mask = dst->nslots - 1, end = c + cn, n0 = dst->ids.n;
        uint64_t *slots = dst->slots;
        uint32_t *dids = dst->ids.v, dn = n0;
        int64_t *dvals = dst->vals.v;
        for (uint32_t i = c; i < end; i++, s += snt) {
            if (prefetch && i + PF_FAR < n)
                __builtin_prefetch(&slots[cp_acc_hash(ids[i + PF_FAR]) & mask]);
            if (prefetch && i + PF_NEAR < n) {
                uint64_t sl = slots[cp_acc_hash(ids[i + PF_NEAR]) & mask];
                if (sl && (uint32_t)(sl >> 32) == ids[i + PF_NEAR])
                    __builtin_prefetch(dvals + (size_t)((uint32_t)sl - 1) * dnt, 1);
            }
            const uint32_t id = ids[i];
            uint32_t h = cp_acc_hash(id) & mask;
            int64_t *row = NULL;
            for (uint64_t sl; (sl = slots[h]); h = (h + 1) & mask)
                if ((uint32_t)(sl >> 32) == id) {
                    row = dvals + (size_t)((uint32_t)sl - 1) * dnt;
                    break;
                }
            if (!row) {
                dids[dn++] = id;
                slots[h] = (uint64_t)id << 32 | dn;
                row = dvals + (size_t)(dn - 1) * dnt;
                if (dnt == 2) {
                    row[0] = 0;
                    row[1] = 0;
                } else {
                    for (uint32_t t = 0; t < dnt; t++)
                        row[t] = 0;
                }
            }
            if (w == 2) {
                row[0] = cp_add_wrap(row[0], (int64_t)((uint64_t)s[0] * f));
                row[1] = cp_add_wrap(row[1], (int64_t)((uint64_t)s[1] * f));
            } else {
                for (uint32_t t = 0; t < w; t++)
                    row[t] = cp_add_wrap(row[t], (int64_t)((uint64_t)s[t] * f));
            }
        }
        dst->ids.n = dn;
        dst->vals.n += (dn - n0) * dnt;
    }
    return 0;
}

int cp_acc_add(cp_acc *dst, const cp_acc *src, int64_t factor)
{
    return acc_add(dst, src, factor, 1);
}

/* Without the prefetches: they cost a third of the loop's instructions, for nothing when
 * dst is in cache anyway (a stage, written by the previous window). */
int cp_acc_add_hot(cp_acc *dst, const cp_acc *src)
{
    return acc_add(dst, src, 1, 0);
}

void cp_acc_swap(cp_acc *a, cp_acc *b)
{
    cp_acc t = *a;
    *a = *b;
    *b = t;
}

void cp_acc_take(cp_acc *dst, cp_acc *src)
{
    /* a window's slot table is zeroed (by its rows) for the next window, where a new one
     * was a calloc and a rehash for every window */
    acc_clear_slots(src);
    free(dst->slots);
    uint64_t *slots = src->slots;
    uint32_t nslots = src->nslots;
    src->slots = NULL;
    src->nslots = 0;
    cp_acc_swap(dst, src);
    src->slots = slots;
    src->nslots = nslots;
    cp_acc_reset(src, dst->ntypes); /* (no rows: the table is not read again) */
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

/* A divisor d = odd << shift, for exact divisions and divisibility tests by multiplication
 * (Granlund-Montgomery): for odd d, x -> x * inv mod 2^64 maps the multiples of d onto
 * 0..UINT64_MAX / d, and a multiple's image is its quotient. A 64-bit division is tens of
 * cycles; the CPU column (nanoseconds, multiples of the period) needed one per row twice. */
typedef struct xdiv {
    uint64_t d, inv, lim, mask;
    int shift;
} xdiv;

static xdiv xdiv_make(uint64_t d)
{
    xdiv x = {.d = d, .shift = __builtin_ctzll(d)};
    uint64_t odd = d >> x.shift, inv = odd; /* correct to 3 bits; each step doubles them */
    for (int i = 0; i < 5; i++)
        inv *= 2 - odd * inv;
    x.inv = inv;
    x.lim = UINT64_MAX / odd;
    x.mask = ((uint64_t)1 << x.shift) - 1;
    return x;
}

static inline int xdiv_divides(const xdiv *x, uint64_t v)
{
    return !(v & x->mask) && (v >> x->shift) * x->inv <= x->lim;
}

/* v / d for a v that is a multiple of d (the shift is arithmetic, as in cp_zz). */
static inline int64_t xdiv_exact(const xdiv *x, int64_t v)
{
    return (int64_t)((uint64_t)(v >> x->shift) * x->inv);
}

/* The GCD of column t's absolute values (1 if all are 0): a row that is a multiple of the
 * GCD so far costs a multiplication, not a division. */
static uint64_t col_gcd(const cp_acc *a, uint32_t t)
{
    const int64_t *v = a->vals.v + t;
    uint32_t n = a->ids.n, nt = a->ntypes;
    uint64_t g = 0;
    xdiv x = {0};
    for (uint32_t i = 0; i < n; i++, v += nt) {
        uint64_t av = *v < 0 ? (uint64_t)0 - (uint64_t)*v : (uint64_t)*v;
        if (!av || (g && xdiv_divides(&x, av))) continue;
        g = gcd64(g, av);
        if (g == 1) break;
        x = xdiv_make(g);
    }
    return g ? g : 1;
}

/* Makes *p hold at least need bytes (contents not kept). */
static int scratch(void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *n = malloc(c);
    if (!n) return CP_ENOMEM;
    free(*p);
    *p = n;
    *cap = c;
    return 0;
}

/* Sorts rows by stack id: LSD radix sort of (id << 32 | row) keys on the id's bytes,
 * skipping bytes that are the same in every key. */
static int sort_rows_radix(cp_block_enc *e, const cp_acc *a, uint32_t *ord)
{
    uint32_t n = a->ids.n;
    if (scratch(&e->tmp, &e->tmpcap, sizeof(uint64_t) * (size_t)n * 2)) return CP_ENOMEM;
    uint64_t *k = e->tmp, *tmp = k + n;
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
    return 0;
}

/* The order of a's rows by stack id. An acc's ids are distinct, and a block's usually span a
 * range of a few times its row count (a window's stacks among a service's; up to 64 times):
 * then a bitmap of the range (one bit per id, cleared; the bench's 567 rows in 2,000 ids:
 * 250 bytes), and the row of each id written where its bit is set (and read only there, so
 * never cleared), give the order in one pass over the rows; the encoder walks the bitmap
 * itself (o->bits) or has it listed (row_order_list). Sparse ids, and ranges whose row array
 * (4 bytes an id) would not stay in cache, take a radix sort (o->ord). Neither: in order. */
enum { BITMAP_IDS_MAX = 1 << 18 };
typedef struct row_order {
    const uint32_t *ord;  /* the rows in id order, or NULL */
    const uint64_t *bits; /* or, if set: bit id - lo set for each row, and row[id - lo] */
    const uint32_t *row;
    size_t words;
    uint32_t lo;
} row_order;

static int order_rows(cp_block_enc *e, const cp_acc *a, row_order *o)
{
    uint32_t n = a->ids.n;
    const uint32_t *ids = a->ids.v;
    memset(o, 0, sizeof *o);
    if (n < 2) return 0;
    uint32_t lo = ids[0], hi = ids[0], sorted = 1;
    for (uint32_t i = 1; i < n; i++) {
        uint32_t v = ids[i];
        sorted &= v > ids[i - 1];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (sorted) return 0;
    uint64_t range = (uint64_t)hi - lo + 1;
    if (range <= (uint64_t)n * 64 && range <= BITMAP_IDS_MAX) {
        size_t words = (size_t)(range + 63) / 64;
        if (scratch(&e->tmp, &e->tmpcap,
                    words * sizeof(uint64_t) + (size_t)range * sizeof(uint32_t)))
            return CP_ENOMEM;
        uint64_t *bits = e->tmp, dup = 0;
        uint32_t *row = (uint32_t *)(bits + words);
        memset(bits, 0, words * sizeof(uint64_t));
        for (uint32_t i = 0; i < n; i++) {
            uint32_t d = ids[i] - lo;
            uint64_t m = (uint64_t)1 << (d & 63);
            dup |= bits[d >> 6] & m;
            bits[d >> 6] |= m;
            row[d] = i;
        }
        if (!dup) {
            *o = (row_order){NULL, bits, row, words, lo};
            return 0;
        }
        /* a repeated id, which an acc never holds: sort anyway */
    }
    if (scratch(&e->ord, &e->ordcap, sizeof(uint32_t) * n)) return CP_ENOMEM;
    o->ord = e->ord;
    return sort_rows_radix(e, a, e->ord);
}

/* Lists a bitmap order's rows in o->ord (the encoder's general width walks a list). */
static int row_order_list(cp_block_enc *e, uint32_t n, row_order *o)
{
    if (!o->bits) return 0;
    if (scratch(&e->ord, &e->ordcap, sizeof(uint32_t) * n)) return CP_ENOMEM;
    uint32_t *ord = e->ord, k = 0;
    for (size_t w = 0; w < o->words; w++)
        for (uint64_t b = o->bits[w]; b; b &= b - 1)
            ord[k++] = o->row[w * 64 + (size_t)__builtin_ctzll(b)];
    o->ord = ord;
    o->bits = NULL;
    return 0;
}

void cp_block_enc_close(cp_block_enc *e)
{
    if (!e) return;
    if (e->lz4) LZ4_freeStream(e->lz4);
    free(e->raw);
    free(e->ord);
    free(e->tmp);
    memset(e, 0, sizeof *e);
}

int cp_block_encode_with(cp_block_enc *e, cp_acc *a, cp_buf *out)
{
    uint32_t n = a->ids.n, nt = a->ntypes;
    row_order ro;
    if (order_rows(e, a, &ro) || (nt != 2 && row_order_list(e, n, &ro))) return CP_ENOMEM;
    const uint32_t *ord = ro.ord;
    xdiv div[CP_MAX_TYPES];
    for (uint32_t t = 0; t < nt; t++)
        div[t] = xdiv_make(col_gcd(a, t));
    /* the rows first, after room for the header: the header's totals are summed on the way */
    size_t hmax = 3 * 10 + 2 * 10 * (size_t)nt + 10;
    if (scratch(&e->raw, &e->rawcap, hmax + (size_t)n * 10 * (1 + nt))) return CP_ENOMEM;
    uint8_t *rows = (uint8_t *)e->raw + hmax, *p = rows;
    int64_t tot[CP_MAX_TYPES] = {0};
    uint32_t prev = 0;
    if (nt == 2) { /* the common width (cpu, alloc), with its divisors and totals in registers */
        const xdiv d0 = div[0], d1 = div[1];
        int64_t t0 = 0, t1 = 0;
#define EMIT2(i, id)                                                                               \
    do {                                                                                           \
        p = cp_put_uv(p, (id)-prev);                                                               \
        prev = (id);                                                                               \
        const int64_t *row = a->vals.v + (size_t)(i)*2;                                            \
        t0 = cp_add_wrap(t0, row[0]);                                                              \
        t1 = cp_add_wrap(t1, row[1]);                                                              \
        p = cp_put_uv(p, cp_zz(xdiv_exact(&d0, row[0])));                                          \
        p = cp_put_uv(p, cp_zz(xdiv_exact(&d1, row[1])));                                          \
    } while (0)
        if (ro.bits) { /* the bitmap walked here: the id is its bit, no list of rows */
            for (size_t w = 0; w < ro.words; w++)
                for (uint64_t b = ro.bits[w]; b; b &= b - 1) {
                    uint32_t d = (uint32_t)(w * 64) + (uint32_t)__builtin_ctzll(b);
                    EMIT2(ro.row[d], ro.lo + d);
                }
        } else {
            for (uint32_t k = 0; k < n; k++) {
                uint32_t i = ord ? ord[k] : k;
                EMIT2(i, a->ids.v[i]);
            }
        }
#undef EMIT2
        tot[0] = t0;
        tot[1] = t1;
    } else {
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = ord ? ord[k] : k, id = a->ids.v[i];
            p = cp_put_uv(p, id - prev);
            prev = id;
            const int64_t *row = a->vals.v + (size_t)i * nt;
            for (uint32_t t = 0; t < nt; t++) {
                tot[t] = cp_add_wrap(tot[t], row[t]);
                p = cp_put_uv(p, cp_zz(xdiv_exact(&div[t], row[t])));
            }
        }
    }
    uint8_t head[3 * 10 + 2 * 10 * CP_MAX_TYPES + 10], *h = head;
    h = cp_put_uv(h, cp_zz(a->time_ns));
    h = cp_put_uv(h, a->windows);
    h = cp_put_uv(h, nt);
    for (uint32_t t = 0; t < nt; t++) {
        h = cp_put_uv(h, div[t].d);
        h = cp_put_uv(h, cp_zz(tot[t]));
    }
    h = cp_put_uv(h, n);
    size_t hlen = (size_t)(h - head);
    uint8_t *raw = rows - hlen;
    memcpy(raw, head, hlen);
    size_t rawlen = (size_t)(p - raw);

    int bound = LZ4_compressBound((int)rawlen);
    if (cp_buf_reserve(out, 11 + (size_t)bound)) return CP_ENOMEM;
    uint8_t *o = out->data + out->len;
    uint8_t *q = o + 1;
    q = cp_put_uv(q, rawlen);
    int clen = 0;
    if (rawlen > 64) {
        /* one stream for every block: reset (cheap) rather than cleared (16 KB) each time;
         * each block is still independent (no dictionary) */
        if (!e->lz4 && !(e->lz4 = LZ4_createStream())) return CP_ENOMEM;
        LZ4_resetStream_fast(e->lz4);
        clen =
            LZ4_compress_fast_continue(e->lz4, (const char *)raw, (char *)q, (int)rawlen, bound, 1);
    }
    if (clen > 0 && (size_t)clen < rawlen) {
        o[0] = CP_BLOCK_LZ4;
        out->len += (size_t)(q - o) + (size_t)clen;
    } else {
        o[0] = CP_BLOCK_RAW;
        memcpy(q, raw, rawlen);
        out->len += (size_t)(q - o) + rawlen;
    }
    return 0;
}

int cp_block_encode(cp_acc *a, cp_buf *out)
{
    cp_block_enc e = {0};
    int rc = cp_block_encode_with(&e, a, out);
    cp_block_enc_close(&e);
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
