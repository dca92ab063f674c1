/* The accumulator and the block codec (store/block.c) against the format's definition
 * (format.h): an encoder kept from block to block (lz4 stream and buffers reused, rows of
 * any count, id spread and width) writes what a plain reading of the format says, and
 * blocks load back equal. */
#include <lz4.h>

#include "store_int.h"
#include "test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* A block's payload, as the format describes it, written the obvious way: entries sorted
 * by id (qsort), divisors by Euclid, values divided with '/'. */
static uint8_t *put(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}
static uint64_t zz(int64_t v)
{
    return ((uint64_t)v << 1) ^ (v < 0 ? UINT64_MAX : 0);
}
static uint64_t mag(int64_t v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}
static const cp_acc *sorting;
static int by_id(const void *x, const void *y)
{
    uint32_t a = sorting->ids.v[*(const uint32_t *)x], b = sorting->ids.v[*(const uint32_t *)y];
    return a < b ? -1 : a > b;
}
static size_t reference(const cp_acc *a, uint8_t *out)
{
    uint32_t n = a->ids.n, nt = a->ntypes;
    uint32_t *ord = malloc(sizeof *ord * (n + 1));
    CHECK(ord);
    for (uint32_t i = 0; i < n; i++)
        ord[i] = i;
    sorting = a;
    qsort(ord, n, sizeof *ord, by_id);
    uint8_t *p = out;
    p = put(p, zz(a->time_ns));
    p = put(p, a->windows);
    p = put(p, nt);
    uint64_t div[CP_MAX_TYPES];
    for (uint32_t t = 0; t < nt; t++) {
        uint64_t g = 0;
        int64_t tot = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t x = mag(a->vals.v[(size_t)i * nt + t]);
            while (x) {
                uint64_t r = g % x;
                g = x;
                x = r;
            }
            tot = (int64_t)((uint64_t)tot + (uint64_t)a->vals.v[(size_t)i * nt + t]);
        }
        div[t] = g ? g : 1;
        p = put(p, div[t]);
        p = put(p, zz(tot));
    }
    p = put(p, n);
    uint32_t prev = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = ord[k];
        p = put(p, a->ids.v[i] - prev);
        prev = a->ids.v[i];
        for (uint32_t t = 0; t < nt; t++) {
            int64_t v = a->vals.v[(size_t)i * nt + t];
            uint64_t q = mag(v) / div[t];
            p = put(p, zz(v < 0 ? (int64_t)((uint64_t)0 - q) : (int64_t)q));
        }
    }
    free(ord);
    return (size_t)(p - out);
}

/* The payload of the block at v (decompressed if lz4'd) into out; its length. */
static size_t payload(const uint8_t *v, size_t len, uint8_t *out, size_t cap)
{
    cp_rd r = {v + 1, v + len, 0};
    uint64_t rawlen = cp_get_uv(&r);
    CHECK(!r.bad && rawlen <= cap);
    if (v[0] == CP_BLOCK_RAW) {
        CHECK_EQ(r.end - r.p, rawlen);
        memcpy(out, r.p, rawlen);
    } else {
        CHECK_EQ(v[0], CP_BLOCK_LZ4);
        int got = LZ4_decompress_safe((const char *)r.p, (char *)out, (int)(r.end - r.p), (int)cap);
        CHECK_EQ(got, rawlen);
    }
    return (size_t)rawlen;
}

/* Fills a with n rows of distinct ids of the given spread (0 dense and shuffled, 1 sparse
 * over all of uint32, 2 ascending, 3 shuffled over 40 times n: block.c orders 0 and small
 * 3s by a bitmap, 1 and large 3s by a radix sort) and values that are multiples of a
 * per-column divisor. */
static void fill(cp_acc *a, uint32_t n, uint32_t nt, int spread)
{
    cp_acc_reset(a, nt);
    a->time_ns = (int64_t)(next() % 2000000000000) - 1000000000000;
    a->windows = next() % 1000;
    static const int64_t divs[] = {1, 2, 3, 10000000, 1LL << 40, 7 * 1024, 999983};
    int64_t d[CP_MAX_TYPES];
    for (uint32_t t = 0; t < nt; t++)
        d[t] = divs[next() % (sizeof divs / sizeof divs[0])];
    uint32_t base = (uint32_t)(next() % 100000) + 1;
    while (a->ids.n < n) {
        uint32_t i = a->ids.n, id;
        if (spread == 0 || spread == 3)
            id = base + (uint32_t)(next() % ((uint64_t)n * (spread ? 40 : 3) + 1));
        else if (spread == 1)
            id = (uint32_t)next() | 1;
        else
            id = base + 3 * i + (uint32_t)(next() % 3);
        int64_t *row = cp_acc_row(a, id);
        CHECK(row);
        if (a->ids.n == i) continue; /* an id already there: ids in an acc are distinct */
        for (uint32_t t = 0; t < nt; t++) {
            uint64_t r = next();
            int64_t m = (int64_t)(r % 5000) - (r % 7 == 0 ? 2500 : 0);
            if (r % 97 == 0) m = 0;
            row[t] = m * d[t];
            if (r % 1009 == 0) row[t] = INT64_MIN; /* and the extremes */
            if (r % 1013 == 0) row[t] = INT64_MAX;
        }
    }
}

/* Every block of one encoder, through counts that shrink and grow (so each block runs over
 * what the previous left in the reused buffers and lz4 stream), id spreads and widths,
 * appended one after another into one buffer: each payload is the reference's, a fresh
 * encoder writes the same payload, and each block loads back to the same rows. */
TEST(encoder_reused_writes_the_format)
{
    static const uint32_t counts[] = {3000, 0,  1, 2,    700, 5000, 10,  65,   4000, 3,
                                      1500, 64, 1, 9000, 40,  2,    600, 7000, 5,    0};
    cp_block_enc enc = {0};
    cp_buf out = {0}, fresh = {0}, scratch = {0};
    cp_acc a, back;
    cp_acc_init(&a, 1);
    cp_acc_init(&back, 1);
    size_t cap = 64 << 20;
    uint8_t *want = malloc(cap), *got = malloc(cap);
    CHECK(want && got);
    for (int round = 0; round < 120; round++) {
        uint32_t n = round < 40 ? counts[round % 20] : (uint32_t)(next() % 12000);
        uint32_t nt = round % 11 == 5 ? CP_MAX_TYPES : 1 + (uint32_t)(next() % 4);
        fill(&a, n, nt, round % 4);
        size_t at = out.len;
        CHECK_EQ(cp_block_encode_with(&enc, &a, &out), 0);
        size_t wl = reference(&a, want), gl = payload(out.data + at, out.len - at, got, cap);
        CHECK_EQ(gl, wl);
        CHECK(memcmp(got, want, wl) == 0);
        fresh.len = 0;
        CHECK_EQ(cp_block_encode(&a, &fresh), 0);
        CHECK_EQ(payload(fresh.data, fresh.len, got, cap), wl);
        CHECK(memcmp(got, want, wl) == 0);
        CHECK_EQ(cp_block_load(&back, out.data + at, out.len - at, &scratch, NULL), 0);
        CHECK_EQ(back.ids.n, a.ids.n);
        CHECK_EQ(back.ntypes, nt);
        CHECK_EQ(back.time_ns, a.time_ns);
        CHECK_EQ(back.windows, a.windows);
        for (uint32_t i = 0; i < a.ids.n; i++) {
            uint32_t rows = back.ids.n;
            int64_t *r = cp_acc_row(&back, a.ids.v[i]);
            CHECK(r && back.ids.n == rows); /* found, not added */
            CHECK(memcmp(r, a.vals.v + (size_t)i * nt, sizeof(int64_t) * nt) == 0);
        }
    }
    free(want);
    free(got);
    cp_acc_close(&a);
    cp_acc_close(&back);
    cp_buf_close(&out);
    cp_buf_close(&fresh);
    cp_buf_close(&scratch);
    cp_block_enc_close(&enc);
}

static int slots_zero(const cp_acc *a)
{
    for (uint32_t i = 0; i < a->nslots; i++)
        if (a->slots[i]) return 0;
    return 1;
}

/* cp_acc_reset and cp_acc_take clear a sparse slot table by its rows' clusters, not all of
 * it: after every reset the table is all zeroes whatever the rows were (few or many, ids
 * colliding in long runs or wrapping around the table's end), and a row is new again. */
TEST(acc_reset_clears_every_slot)
{
    cp_acc a, b;
    cp_acc_init(&a, 2);
    cp_acc_init(&b, 2);
    CHECK_EQ(cp_acc_reserve(&a, 20000), 0);
    uint32_t nslots = a.nslots;
    for (int round = 0; round < 300; round++) {
        uint32_t n = round % 7 == 0 ? (uint32_t)(next() % 9000) : 1 + (uint32_t)(next() % 600);
        /* ids spaced by a multiple of the table size land on one home slot: long runs */
        uint32_t step = round % 3 == 0 ? nslots : round % 3 == 1 ? 1 : (uint32_t)next() | 1;
        uint32_t base = (uint32_t)next();
        for (uint32_t i = 0; i < n; i++) {
            int64_t *r = cp_acc_row(&a, base + i * step);
            CHECK(r);
            r[0] += 1;
        }
        uint32_t rows = a.ids.n;
        CHECK(rows <= n);
        if (round % 2) {
            cp_acc_take(&b, &a);
            CHECK_EQ(b.ids.n, rows);
            cp_acc_reset(&b, 2);
        } else {
            cp_acc_reset(&a, 2);
        }
        CHECK_EQ(a.ids.n, 0);
        CHECK_EQ(a.nslots, nslots); /* (the table is kept, so the sparse path is taken) */
        CHECK(slots_zero(&a));
        int64_t *r = cp_acc_row(&a, base);
        CHECK(r && r[0] == 0 && r[1] == 0 && a.ids.n == 1);
        cp_acc_reset(&a, 2);
        cp_acc_reset(&a, 2); /* an empty acc: nothing to clear */
        CHECK(slots_zero(&a));
    }
    cp_acc_close(&a);
    cp_acc_close(&b);
}

TEST_MAIN(T(encoder_reused_writes_the_format), T(acc_reset_clears_every_slot))
