/* pprof decoding with strict validation, and encoding: both read and write the protobuf
 * wire format directly from and into the flat model (see model/README.md). */
#include "pprof.h"
#include "wire.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libdeflate.h>
#include <zlib.h>

/* ===== gzip ========================================================================= */

int cp_is_gzip(const uint8_t *buf, size_t len)
{
    return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
}

/* Why a gzip stream is bad, for the error message: zlib's streaming inflate tells a
 * truncated stream from a corrupt one. Runs only after the fast path has failed. */
static int gunzip_diagnose(const uint8_t *src, size_t len, cp_err *err)
{
    z_stream z;
    uint8_t sink[16384];
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)len;
    int rc;
    do {
        z.next_out = sink;
        z.avail_out = sizeof sink;
        rc = inflate(&z, Z_NO_FLUSH);
    } while (rc == Z_OK);
    size_t at = (size_t)z.total_in;
    const char *msg = z.msg ? z.msg : "corrupt data";
    inflateEnd(&z);
    if (rc == Z_BUF_ERROR || (rc == Z_OK && z.avail_in == 0))
        return cp_err_set(err, CP_EGZIP, "gzip data truncated after %zu bytes", len);
    if (rc == Z_STREAM_END)
        return cp_err_set(err, CP_EGZIP, "bad gzip data: %zu trailing bytes after the stream",
                          len - at);
    return cp_err_set(err, CP_EGZIP, "bad gzip data at input byte %zu: %s", at, msg);
}

/* libdeflate decompresses whole buffers 2-3x faster than zlib's streaming inflate; the
 * gzip trailer's ISIZE (size mod 2^32) is the first guess for the output size. */
static int gunzip_with(struct libdeflate_decompressor *d, const uint8_t *src, size_t len,
                       size_t max_out, cp_buf *out, cp_err *err)
{
    if (len < 18 || !cp_is_gzip(src, len))
        return cp_err_set(err, CP_EGZIP,
                          "gzip data truncated: %zu bytes, shorter than a gzip header and trailer",
                          len);
    size_t guess = (size_t)src[len - 4] | (size_t)src[len - 3] << 8 | (size_t)src[len - 2] << 16 |
                   (size_t)src[len - 1] << 24;
    if (guess > max_out) guess = max_out;
    if (guess < 64) guess = 64;
    int rc = 0;
    for (;;) {
        size_t got = 0, used = 0;
        if (cp_buf_reserve(out, guess)) {
            rc = cp_err_set(err, CP_ENOMEM, "out of memory inflating %zu bytes", len);
            break;
        }
        enum libdeflate_result r =
            libdeflate_gzip_decompress_ex(d, src, len, out->data + out->len, guess, &used, &got);
        if (r == LIBDEFLATE_SUCCESS) {
            out->len += got;
            if (used != len)
                rc = cp_err_set(err, CP_EGZIP,
                                "gzip data has %zu trailing bytes after the first member",
                                len - used);
            break;
        }
        if (r == LIBDEFLATE_INSUFFICIENT_SPACE) {
            if (guess >= max_out) {
                rc = cp_err_set(err, CP_ELIMIT, "gzip data inflates past the %zu-byte limit",
                                max_out);
                break;
            }
            guess = guess > max_out / 2 ? max_out : guess * 2;
            continue;
        }
        rc = gunzip_diagnose(src, len, err);
        break;
    }
    return rc;
}

int cp_gunzip(const uint8_t *src, size_t len, size_t max_out, cp_buf *out, cp_err *err)
{
    struct libdeflate_decompressor *d = libdeflate_alloc_decompressor();
    if (!d) return cp_err_set(err, CP_ENOMEM, "out of memory allocating a decompressor");
    int rc = gunzip_with(d, src, len, max_out, out, err);
    libdeflate_free_decompressor(d);
    return rc;
}

static int gzip_with(struct libdeflate_compressor *c, const uint8_t *src, size_t len, cp_buf *out)
{
    size_t bound = libdeflate_gzip_compress_bound(c, len);
    if (cp_buf_reserve(out, bound)) return CP_ENOMEM;
    size_t n = libdeflate_gzip_compress(c, src, len, out->data + out->len, bound);
    if (!n) return CP_ENOMEM;
    out->len += n;
    return 0;
}

int cp_gzip(const uint8_t *src, size_t len, int level, cp_buf *out)
{
    struct libdeflate_compressor *c = libdeflate_alloc_compressor(level);
    if (!c) return CP_ENOMEM;
    int rc = gzip_with(c, src, len, out);
    libdeflate_free_compressor(c);
    return rc;
}

struct cp_gzipper {
    struct libdeflate_compressor *c;
};

int cp_gzipper_create(int level, cp_gzipper **out)
{
    *out = NULL;
    cp_gzipper *g = malloc(sizeof(*g));
    if (!g) return CP_ENOMEM;
    if (!(g->c = libdeflate_alloc_compressor(level))) {
        free(g);
        return CP_ENOMEM;
    }
    *out = g;
    return 0;
}

int cp_gzipper_run(cp_gzipper *g, const uint8_t *src, size_t len, cp_buf *out)
{
    return gzip_with(g->c, src, len, out);
}

void cp_gzipper_destroy(cp_gzipper *g)
{
    if (!g) return;
    libdeflate_free_compressor(g->c);
    free(g);
}

void cp_pprof_limits_default(cp_pprof_limits *lim)
{
    lim->max_bytes = 64u << 20;
    lim->max_samples = 4u << 20;
    lim->max_locations = 4u << 20;
    lim->max_depth = 1024;
    lim->max_strings = 4u << 20;
    lim->max_string_bytes = 32u << 20;
}

/* ===== wire reading ================================================================
 * The decoder reads the protobuf wire format itself, straight into the flat model: no
 * intermediate message tree, no allocation per submessage, no strlen. protoc-c's generated
 * code is used only by tests, to build inputs. The cursor is in wire.h. */

/* Appends a packed run of varints to dst, which must have room for (end - p) values (each
 * takes at least one byte). Returns the count, or -1 if a varint is malformed. */
static inline long rd_packed(rd *pk, uint64_t *dst)
{
    long n = 0;
    const uint8_t *p = pk->p, *end = pk->end;
    while (p < end) {
        uint8_t b0 = *p;
        if (b0 < 0x80) {
            dst[n++] = b0;
            p++;
        } else if (end - p >= 2 && p[1] < 0x80) {
            dst[n++] = (uint64_t)(b0 & 0x7f) | (uint64_t)p[1] << 7;
            p += 2;
        } else {
            rd r = {p, end};
            if (rd_varint(&r, &dst[n])) return -1;
            n++;
            p = r.p;
        }
    }
    pk->p = p;
    return n;
}

/* ===== location ids, eight bytes at a time (SSSE3) ==================================
 * A sample's packed location ids are one- and two-byte varints mixed at random (ids below
 * 16,384). The continuation bits of eight bytes (one pmovmskb) index a table that says
 * where each id's bytes are: one pshufb puts every id of the eight bytes in a 16-bit lane,
 * four more instructions drop the continuation bits, two compares check the ids against
 * the profile's locations. Anything else (a longer varint, an id 0 or out of range, the
 * last bytes of the run) is left to the scalar loops, which say what is wrong. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define IDS_SIMD 1

typedef struct ids_entry {
    uint8_t shuf[16]; /* pshufb control: lane j = its id's first byte, then its second or 0 */
    uint8_t n;        /* ids complete in the eight bytes (up to a longer varint, if any) */
    uint8_t used;     /* their bytes */
} ids_entry;

static ids_entry ids_table[256];
static int ids_simd;
static pthread_once_t ids_once = PTHREAD_ONCE_INIT;

static void ids_init(void)
{
    for (unsigned m = 0; m < 256; m++) {
        ids_entry *e = &ids_table[m];
        memset(e->shuf, 0x80, sizeof e->shuf);
        unsigned pos = 0, n = 0;
        while (pos < 8) {
            if (!(m >> pos & 1)) { /* one byte */
                e->shuf[2 * n] = (uint8_t)pos;
                pos += 1;
            } else if (pos + 1 < 8 && !(m >> (pos + 1) & 1)) { /* two bytes */
                e->shuf[2 * n] = (uint8_t)pos;
                e->shuf[2 * n + 1] = (uint8_t)(pos + 1);
                pos += 2;
            } else { /* a longer varint, or one that goes on past these eight bytes */
                break;
            }
            n++;
        }
        e->n = (uint8_t)n;
        e->used = (uint8_t)pos;
    }
    /* cpuid here, when the first profile is decoded: __builtin_cpu_supports would link
     * libgcc's __cpu_indicator_init, a constructor that runs a dozen cpuids (each a VM
     * exit) in every process that loads the library, the agent's host included */
    unsigned a, b, c, d;
    ids_simd = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSSE3);
}

/* Decodes the ids of [*qp, end) into *dstp while at least eight bytes remain and every id
 * is in 1..nloc; advances both. dst must have room for (end - *qp) + 8 ids. */
__attribute__((target("ssse3"))) static void ids_ssse3(const uint8_t **qp, const uint8_t *end,
                                                       uint64_t nloc, uint32_t **dstp)
{
    const uint8_t *q = *qp;
    uint32_t *dst = *dstp;
    const __m128i low7 = _mm_set1_epi16(0x7f), high7 = _mm_set1_epi16(0x3f80);
    const __m128i zero = _mm_setzero_si128();
    const __m128i max = _mm_set1_epi16((short)(nloc < 16383 ? nloc : 16383));
    while (end - q >= 8) {
        __m128i in = _mm_loadl_epi64((const __m128i *)(const void *)q);
        const ids_entry *e = &ids_table[_mm_movemask_epi8(in) & 0xff];
        if (!e->n) break;
        __m128i v = _mm_shuffle_epi8(in, _mm_loadu_si128((const __m128i *)(const void *)e->shuf));
        __m128i id =
            _mm_or_si128(_mm_and_si128(v, low7), _mm_and_si128(_mm_srli_epi16(v, 1), high7));
        __m128i bad = _mm_or_si128(_mm_cmpeq_epi16(id, zero), _mm_cmpgt_epi16(id, max));
        if ((unsigned)_mm_movemask_epi8(bad) & ((1u << (2 * e->n)) - 1)) break;
        _mm_storeu_si128((__m128i *)(void *)dst, _mm_unpacklo_epi16(id, zero));
        _mm_storeu_si128((__m128i *)(void *)(dst + 4), _mm_unpackhi_epi16(id, zero));
        dst += e->n;
        q += e->used;
    }
    *qp = q;
    *dstp = dst;
}
#endif

/* Decodes the packed location ids [q, end) of sample i into dst, which must have room for
 * (end - q) + 8 ids, each checked to be in 1..nloc; at is how many of the sample's ids came
 * before (for the message). Returns the count, or -1 with err set (CP_EPPROF). */
static long ids_decode(const uint8_t *q, const uint8_t *end, uint32_t nloc, uint32_t *dst0,
                       uint32_t i, uint32_t at, cp_err *err)
{
    uint32_t *dst = dst0;
#ifdef IDS_SIMD
    if (ids_simd) ids_ssse3(&q, end, nloc, &dst);
#endif
    /* Ids of one or two bytes, without a branch on which (they mix at random): four
     * two-byte ids at once when the continuation bits say so, else three ids from each
     * 8-byte load, so that finding where the next id starts costs shifts, not loads.
     * Anything else (a longer varint, a bad id, the last bytes) goes to the general loop
     * below. */
    while (end - q >= 8) {
        uint64_t w;
        memcpy(&w, q, 8);
        unsigned used = 0;
        uint64_t cont = w & 0x8080808080808080ull; /* continuation bits */
        if (cont == 0x0080008000800080ull) {       /* four two-byte ids (ids 128-16383) */
            uint64_t i0 = (w & 0x7f) | (w >> 1 & 0x3f80),
                     i1 = (w >> 16 & 0x7f) | (w >> 17 & 0x3f80),
                     i2 = (w >> 32 & 0x7f) | (w >> 33 & 0x3f80),
                     i3 = (w >> 48 & 0x7f) | (w >> 49 & 0x3f80);
            if (i0 - 1 < nloc && i1 - 1 < nloc && i2 - 1 < nloc && i3 - 1 < nloc) {
                dst[0] = (uint32_t)i0;
                dst[1] = (uint32_t)i1;
                dst[2] = (uint32_t)i2;
                dst[3] = (uint32_t)i3;
                dst += 4;
                q += 8;
                continue;
            }
        }
        for (int k = 0; k < 3; k++) {
            uint32_t b0 = (uint32_t)w & 0xff, b1 = (uint32_t)(w >> 8) & 0xff, c = b0 >> 7;
            uint64_t id = (b0 & 0x7f) | ((b1 << 7) & (0u - c));
            if ((c & (b1 >> 7)) || id - 1 >= nloc) goto general;
            *dst++ = (uint32_t)id;
            w >>= 8 + 8 * c;
            used += 1 + c;
        }
        q += used;
        continue;
    general:
        q += used;
        break;
    }
    while (q < end) {
        uint64_t id;
        if (q[0] < 0x80) {
            id = q[0];
            q++;
        } else if (end - q >= 2 && q[1] < 0x80) {
            id = (uint64_t)(q[0] & 0x7f) | (uint64_t)q[1] << 7;
            q += 2;
        } else {
            rd one = {q, end};
            if (rd_varint(&one, &id)) {
                cp_err_set(err, CP_EPPROF,
                           "sample[%u].location_id: malformed field (truncated or bad length)", i);
                return -1;
            }
            q = one.p;
        }
        if (id - 1 >= nloc) {
            cp_err_set(err, CP_EPPROF,
                       "sample[%u].location_id[%u]: location %llu not found (profile has %u "
                       "locations)",
                       i, at + (uint32_t)(dst - dst0), (unsigned long long)id, nloc);
            return -1;
        }
        *dst++ = (uint32_t)id;
    }
    return dst - dst0;
}

/* Appends the packed location ids *pk of sample i (whose ids start at p->stack[loc_off]) to
 * p->stack, each checked to be in 1..nloc; marks *pk used (p = NULL). Returns 0, CP_EPPROF or
 * CP_ENOMEM. */
static int stack_run(cp_profile *p, rd *pk, uint32_t i, uint32_t loc_off, uint32_t nloc,
                     cp_err *err)
{
    if (cp_vec_reserve(&p->stack, (size_t)p->stack.n + (size_t)(pk->end - pk->p) + 8))
        return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
    long n =
        ids_decode(pk->p, pk->end, nloc, p->stack.v + p->stack.n, i, p->stack.n - loc_off, err);
    if (n < 0) return CP_EPPROF;
    p->stack.n += (uint32_t)n;
    pk->p = NULL;
    return 0;
}

/* Reads one element or a packed run of a repeated varint field into a CP_VEC of int64_t or
 * uint64_t (an int64 is the varint of its two's complement: the same bits). */
#define READ_REPEATED64(r, wt, vec, ...)                                                           \
    do {                                                                                           \
        if ((wt) == WT_LEN) {                                                                      \
            rd pk_;                                                                                \
            if (rd_len((r), &pk_)) MALFORMED(__VA_ARGS__);                                         \
            if (pk_.p < pk_.end) { /* an empty run: nothing (and no NULL + 0) */                   \
                if (cp_vec_reserve((vec), (size_t)(vec)->n + (size_t)(pk_.end - pk_.p)))           \
                    goto nomem;                                                                    \
                long got_ = rd_packed(&pk_, (uint64_t *)(void *)((vec)->v + (vec)->n));            \
                if (got_ < 0) MALFORMED(__VA_ARGS__);                                              \
                (vec)->n += (uint32_t)got_;                                                        \
            }                                                                                      \
        } else if ((wt) == WT_VARINT) {                                                            \
            uint64_t v_;                                                                           \
            if (rd_varint((r), &v_)) MALFORMED(__VA_ARGS__);                                       \
            if (cp_vec_push((vec), v_)) goto nomem;                                                \
        } else {                                                                                   \
            MALFORMED(__VA_ARGS__);                                                                \
        }                                                                                          \
    } while (0)

/* A scalar field: a varint, or (for repeated fields) a packed run handled by the caller. */
#define WANT_VARINT(wt, what)                                                                      \
    do {                                                                                           \
        if ((wt) != WT_VARINT) {                                                                   \
            rc = cp_err_set(err, CP_EPPROF, "%s: wire type %u, expected varint", what, wt);        \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Walks the top-level fields once before decoding so that the two commonest kinds of
 * damage get their own message: input that ends inside a field (truncated) and a length
 * prefix larger than anything allowed. */
static int wire_scan(const uint8_t *b, size_t len, size_t max_len, cp_err *err)
{
    rd r = {b, b + len};
    while (r.p < r.end) {
        size_t start = (size_t)(r.p - b);
        uint64_t key, v;
        if (rd_varint(&r, &key))
            return cp_err_set(err, CP_EPPROF,
                              "truncated: field key at byte %zu runs past the end (%zu bytes)",
                              start, len);
        unsigned field = (unsigned)(key >> 3), wt = key & 7;
        if (field == 0) return cp_err_set(err, CP_EPPROF, "field number 0 at byte %zu", start);
        size_t vstart = (size_t)(r.p - b);
        if (wt == WT_VARINT || wt == WT_LEN) {
            if (rd_varint(&r, &v))
                return cp_err_set(
                    err, CP_EPPROF,
                    "truncated: field %u at byte %zu: varint runs past the end (%zu bytes)", field,
                    vstart, len);
            if (wt == WT_LEN) {
                if (v > max_len)
                    return cp_err_set(
                        err, CP_EPPROF,
                        "field %u at byte %zu declares length %llu, beyond the %zu-byte limit",
                        field, start, (unsigned long long)v, max_len);
                if (v > (uint64_t)(r.end - r.p))
                    return cp_err_set(
                        err, CP_EPPROF,
                        "truncated: field %u at byte %zu needs %llu bytes, %zu remain", field,
                        start, (unsigned long long)v, (size_t)(r.end - r.p));
                r.p += v;
            }
        } else if (wt == WT_I64 || wt == WT_I32) {
            size_t w = wt == WT_I64 ? 8 : 4;
            if (w > (size_t)(r.end - r.p))
                return cp_err_set(err, CP_EPPROF,
                                  "truncated: field %u at byte %zu needs %zu bytes, %zu remain",
                                  field, start, w, (size_t)(r.end - r.p));
            r.p += w;
        } else {
            return cp_err_set(err, CP_EPPROF, "field %u at byte %zu has invalid wire type %u",
                              field, start, wt);
        }
    }
    return 0;
}

/* ===== id maps ====================================================================== */

/* Maps pprof's arbitrary nonzero uint64 ids to dense indices. Producers almost always
 * number 1..n in order; then the map is the identity and costs nothing. */
typedef struct idmap {
    int dense;      /* id == index + 1 for all */
    uint64_t *keys; /* open addressing, 0 = empty */
    uint32_t *vals;
    uint32_t mask;
    size_t n;
} idmap;

static void idmap_close(idmap *m)
{
    free(m->keys);
    free(m->vals);
}

/* Builds the map over ids[0..n); fails naming the first zero or duplicate id. */
static int idmap_build(idmap *m, const char *what, const uint64_t *ids, size_t n, cp_err *err)
{
    memset(m, 0, sizeof *m);
    m->dense = 1;
    m->n = n;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == 0)
            return cp_err_set(err, CP_EPPROF, "%s[%zu]: id is 0 (ids must be nonzero)", what, i);
        if (ids[i] != i + 1) m->dense = 0;
    }
    if (m->dense) return 0;
    uint32_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals)
        return cp_err_set(err, CP_ENOMEM, "out of memory mapping %s ids", what);
    m->mask = cap - 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t j = (uint32_t)cp_hash_u64(0, ids[i]) & m->mask;
        while (m->keys[j]) {
            if (m->keys[j] == ids[i])
                return cp_err_set(err, CP_EPPROF, "%s[%zu]: duplicate id %llu", what, i,
                                  (unsigned long long)ids[i]);
            j = (j + 1) & m->mask;
        }
        m->keys[j] = ids[i];
        m->vals[j] = (uint32_t)i;
    }
    return 0;
}

/* Dense index + 1 of id, or 0 if absent. */
static inline uint32_t idmap_get(const idmap *m, uint64_t id)
{
    if (m->dense) return id >= 1 && id <= m->n ? (uint32_t)id : 0;
    if (!m->keys || id == 0) return 0;
    uint32_t j = (uint32_t)cp_hash_u64(0, id) & m->mask;
    while (m->keys[j]) {
        if (m->keys[j] == id) return m->vals[j] + 1;
        j = (j + 1) & m->mask;
    }
    return 0;
}

/* ===== decoding ===================================================================== */

typedef CP_VEC(rd) rd_vec;
typedef CP_VEC(uint64_t) u64_vec;
typedef CP_VEC(int64_t) i64_vec;

/* Scratch memory of the decoder, kept between profiles so that decoding a stream of
 * windows does not allocate once it has warmed up. */
typedef struct scratch {
    rd_vec types, samples, maps;
    rd_vec locs; /* lazy: the location messages, parsed after the pass (or not at all) */
    u64_vec ids, tmp;
    u64_vec fn_ids, loc_ids, loc_maps, line_fns; /* raw ids, resolved once all are known */
    i64_vec comments;
} scratch;

static void scratch_close(scratch *sc)
{
    free(sc->types.v);
    free(sc->samples.v);
    free(sc->maps.v);
    free(sc->locs.v);
    free(sc->fn_ids.v);
    free(sc->loc_ids.v);
    free(sc->loc_maps.v);
    free(sc->line_fns.v);
    free(sc->ids.v);
    free(sc->tmp.v);
    free(sc->comments.v);
}

/* Checks a string index: in [0, nstr). */
#define CHECK_STR(val, ...)                                                                        \
    do {                                                                                           \
        if ((uint64_t)(val) >= nstr) {                                                             \
            char where_[160];                                                                      \
            snprintf(where_, sizeof where_, __VA_ARGS__);                                          \
            rc = cp_err_set(err, CP_EPPROF,                                                        \
                            "%s: string index %lld out of range (string_table has %zu)", where_,   \
                            (long long)(val), nstr);                                               \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define MALFORMED(...)                                                                             \
    do {                                                                                           \
        char where_[160];                                                                          \
        snprintf(where_, sizeof where_, __VA_ARGS__);                                              \
        rc = cp_err_set(err, CP_EPPROF, "%s: malformed field (truncated or bad length)", where_);  \
        goto out;                                                                                  \
    } while (0)

/* Reads one element or a packed run of a repeated varint field into a vector. */
#define READ_REPEATED(r, wt, vec, T, ...)                                                          \
    do {                                                                                           \
        uint64_t v_;                                                                               \
        if ((wt) == WT_LEN) {                                                                      \
            rd pk_;                                                                                \
            if (rd_len((r), &pk_)) MALFORMED(__VA_ARGS__);                                         \
            while (pk_.p < pk_.end) {                                                              \
                if (rd_varint(&pk_, &v_)) MALFORMED(__VA_ARGS__);                                  \
                if (cp_vec_push((vec), (T)v_)) goto nomem;                                         \
            }                                                                                      \
        } else if ((wt) == WT_VARINT) {                                                            \
            if (rd_varint((r), &v_)) MALFORMED(__VA_ARGS__);                                       \
            if (cp_vec_push((vec), (T)v_)) goto nomem;                                             \
        } else {                                                                                   \
            MALFORMED(__VA_ARGS__);                                                                \
        }                                                                                          \
    } while (0)

/* A string index as stored in the model (uint32); larger ones are out of range whatever
 * the table, and are clamped so that the range check below catches them. */
static inline uint32_t str_idx(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* Parses one Function message into p (string indices checked later, once the table is
 * known) and its id into ids. */
static int parse_function(rd r, uint32_t i, cp_profile *p, u64_vec *ids, cp_err *err)
{
    int rc = 0;
    uint32_t field, wt;
    uint64_t v[6] = {0};
    while (r.p < r.end) {
        if (rd_key(&r, &field, &wt)) MALFORMED("function[%u]", i);
        if (field >= 1 && field <= 5) {
            WANT_VARINT(wt, "function");
            if (rd_varint(&r, &v[field])) MALFORMED("function[%u]", i);
        } else if (rd_skip(&r, wt))
            MALFORMED("function[%u]", i);
    }
    if (cp_vec_push(ids, v[1]) ||
        cp_vec_push(&p->functions,
                    ((cp_function){str_idx(v[2]), str_idx(v[3]), str_idx(v[4]), (int64_t)v[5]})))
        return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
out:
    return rc;
}

/* Parses one Location message into p; its id, its mapping id and its lines' function ids
 * go to scratch, to be resolved once every mapping and function is known. */
static int parse_location(rd r, uint32_t i, cp_profile *p, scratch *sc, cp_err *err)
{
    int rc = 0;
    uint32_t field, wt;
    uint64_t v[6] = {0};
    cp_location cl = {.line_off = p->lines.n};
    while (r.p < r.end) {
        if (rd_key(&r, &field, &wt)) MALFORMED("location[%u]", i);
        if (field == 4) {
            rd ln;
            uint64_t fid = 0, line = 0, x;
            if (wt != WT_LEN || rd_len(&r, &ln)) MALFORMED("location[%u].line[%u]", i, cl.nlines);
            while (ln.p < ln.end) {
                uint32_t lf, lw;
                if (rd_key(&ln, &lf, &lw)) MALFORMED("location[%u].line[%u]", i, cl.nlines);
                if (lf >= 1 && lf <= 3) {
                    WANT_VARINT(lw, "line");
                    if (rd_varint(&ln, &x)) MALFORMED("location[%u].line[%u]", i, cl.nlines);
                    if (lf == 1)
                        fid = x;
                    else if (lf == 2)
                        line = x;
                } else if (rd_skip(&ln, lw))
                    MALFORMED("location[%u].line[%u]", i, cl.nlines);
            }
            if (cp_vec_push(&p->lines, ((cp_line){0, (int64_t)line})) ||
                cp_vec_push(&sc->line_fns, fid))
                goto nomem;
            cl.nlines++;
        } else if (field >= 1 && field <= 5) {
            WANT_VARINT(wt, "location");
            if (rd_varint(&r, &v[field])) MALFORMED("location[%u]", i);
        } else if (rd_skip(&r, wt))
            MALFORMED("location[%u]", i);
    }
    cl.address = v[3];
    cl.is_folded = v[5] != 0;
    if (cp_vec_push(&sc->loc_ids, v[1]) || cp_vec_push(&sc->loc_maps, v[2]) ||
        cp_vec_push(&p->locations, cl))
        goto nomem;
    return 0;
nomem:
    rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
out:
    return rc;
}

/* Whether message m starts with field 1 (a varint) equal to want: how the lazy decoder
 * sees that location ids are 1..n in order, without parsing the messages (an id given
 * again later in a message is caught when it is parsed: cp_pprof_lazy_locations). */
static inline int first_id_is(rd m, uint64_t want)
{
    uint64_t id;
    if (m.p >= m.end || m.p[0] != 0x08) return 0;
    m.p++;
    return !rd_varint(&m, &id) && id == want;
}

/* Pushes the location messages of [a, b), a run of whole Location fields whose framing
 * the pass has checked, onto v: the lazy decoder keeps only a run's bounds while it may
 * stay lazy, and lists its messages once it cannot. Returns 0 or -1 (out of memory). */
static int locs_collect(rd_vec *v, const uint8_t *a, const uint8_t *b)
{
    rd r = {a, b}, f;
    uint32_t field, wt;
    while (r.p < r.end)
        if (rd_key(&r, &field, &wt) || rd_len(&r, &f) || cp_vec_push(v, f)) return -1;
    return 0;
}

/* Resolves the mapping and function ids of locations [from, n) of p (raw ids in sc, as
 * parse_location left them) through mm and fm; the error names the first unknown one. */
static int resolve_locations(cp_profile *p, const scratch *sc, uint32_t from, const idmap *mm,
                             const idmap *fm, cp_err *err)
{
    for (uint32_t i = from; i < p->locations.n; i++) {
        cp_location *cl = &p->locations.v[i];
        uint64_t mid = sc->loc_maps.v[i - from];
        if (mid) {
            cl->mapping_id = idmap_get(mm, mid);
            if (!cl->mapping_id)
                return cp_err_set(
                    err, CP_EPPROF,
                    "location[%u] (id %llu): mapping_id %llu not found (profile has %u mappings)",
                    i, (unsigned long long)sc->loc_ids.v[i - from], (unsigned long long)mid,
                    p->mappings.n);
        }
        for (uint32_t k = 0; k < cl->nlines; k++) {
            uint64_t fid = sc->line_fns.v[cl->line_off - p->locations.v[from].line_off + k];
            uint32_t d = idmap_get(fm, fid);
            if (!d)
                return cp_err_set(err, CP_EPPROF,
                                  "location[%u] (id %llu).line[%u]: function_id %llu not found "
                                  "(profile has %u functions)",
                                  i, (unsigned long long)sc->loc_ids.v[i - from], k,
                                  (unsigned long long)fid, p->functions.n);
            p->lines.v[cl->line_off + k].function_id = d;
        }
    }
    return 0;
}

/* The state of one decode_wire call, shared by its steps: the pass over the top-level
 * fields, then one step per field group (header, mappings, functions, locations,
 * samples). */
typedef struct wire {
    scratch *sc;
    const uint8_t *buf;
    size_t len;
    const cp_pprof_limits *lim;
    cp_profile *p;
    cp_pprof_lazy *lz; /* NULL: not lazy */
    cp_err *err;
    /* Lazy: while the location messages are one run of bytes, each starting with its id
     * (1..n in order), only the run's bounds and count are kept (loc_run); once they are
     * not, they are listed in sc->locs, to be parsed after the pass. */
    const uint8_t *loc_start, *loc_end;
    int loc_run;
    uint32_t nloc; /* lazy: location messages seen */
    rd period_type;
    int64_t scal[15];
    size_t nstr;   /* strings seen by the pass; from check_limits on, the table's size */
    size_t sbytes; /* bytes the strings take, each with its terminator */
    int first_str_empty;
    idmap mm, lm, fm;
    uint32_t nlocs_total; /* locations the samples may refer to (lazy ones included) */
} wire;

static int too_many(const wire *w)
{
    return cp_err_set(w->err, CP_ELIMIT,
                      "profile has over %u locations, functions or mappings (limit %u each)",
                      w->lim->max_locations, w->lim->max_locations);
}

/* --- the pass over the top-level fields --- */

/* A run of samples, as encoders write them: a one-byte key and a length each, kept as
 * byte ranges in one tight loop. Anything unusual (a bad length) sets *bad and is left at
 * top for the general path, which names it. Returns 0 or CP_ENOMEM. */
static inline int pass_samples(wire *w, rd *top, int *bad)
{
    rd_vec *samples = &w->sc->samples;
    rd *sv = samples->v, f;
    uint32_t ns = samples->n, scap = samples->cap;
    *bad = 0;
    while (top->p < top->end && *top->p == 0x12) {
        rd t = {top->p + 1, top->end};
        if ((*bad = rd_len(&t, &f) != 0)) break;
        if (ns == scap) {
            samples->n = ns;
            if (cp_vec_push(samples, f))
                return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
            sv = samples->v;
            ns = samples->n;
            scap = samples->cap;
        } else {
            sv[ns++] = f;
        }
        top->p = t.p;
    }
    samples->n = ns;
    return 0;
}

/* Lazy: a run of location messages. While the run stays lazy, each message's framing and
 * first field is all there is to check (the store may never parse it); a message that
 * breaks the run is left at top for the general path. Returns 0 or an error. */
static inline int pass_lazy_locations(wire *w, rd *top)
{
    rd f;
    if (w->nloc && w->loc_end != top->p) { /* not one run: listed, parsed after */
        if (locs_collect(&w->sc->locs, w->loc_start, w->loc_end)) goto nomem;
        w->loc_run = 0;
        return 0;
    }
    const uint8_t *run = top->p;
    uint32_t nloc = w->nloc, n0 = nloc, maxl = w->lim->max_locations;
    while (top->p < top->end && *top->p == 0x22) {
        const uint8_t *q = top->p + 1;
        if (q < top->end && q[0] < 0x80) { /* a length under 128, in one byte */
            f.p = q + 1;
            if (q[0] > top->end - f.p) break;
            f.end = f.p + q[0];
        } else {
            rd t = {q, top->end};
            if (rd_len(&t, &f)) break;
        }
        if (nloc >= maxl) return too_many(w);
        /* the id in its shortest form, compared as bytes (ids under 16384); any other
         * form still counts, through first_id_is */
        uint32_t id = nloc + 1;
        size_t ml = (size_t)(f.end - f.p);
        int same = id < 128     ? ml >= 2 && f.p[0] == 0x08 && f.p[1] == id
                   : id < 16384 ? ml >= 3 && f.p[0] == 0x08 && f.p[1] == (uint8_t)(id | 0x80) &&
                                      f.p[2] == id >> 7
                                : 0;
        if (!same && !first_id_is(f, id)) break;
        nloc++;
        top->p = f.end;
    }
    w->nloc = nloc;
    if (nloc > n0) {
        if (!n0) w->loc_start = run;
        w->loc_end = top->p;
    }
    if (top->p < top->end && *top->p == 0x22) { /* bad framing or id: listed, then */
        if (nloc && locs_collect(&w->sc->locs, w->loc_start, w->loc_end)) goto nomem;
        w->loc_run = 0; /* the general path takes (or names) this message */
    }
    return 0;
nomem:
    return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
}

/* A Location field f at byte `at`: parsed where it stands, or (lazy) kept as bytes to be
 * parsed after the pass, if at all (see decode_locations). */
static int pass_location(wire *w, rd f, size_t at)
{
    cp_profile *p = w->p;
    scratch *sc = w->sc;
    if (p->locations.n + w->nloc >= w->lim->max_locations) return too_many(w);
    if (!w->lz) return parse_location(f, p->locations.n, p, sc, w->err);
    if (w->loc_run && ((w->nloc && w->loc_end != w->buf + at) || !first_id_is(f, w->nloc + 1))) {
        if (w->nloc && locs_collect(&sc->locs, w->loc_start, w->loc_end)) goto nomem;
        w->loc_run = 0;
    }
    if (w->loc_run) {
        if (!w->nloc) w->loc_start = w->buf + at;
        w->loc_end = f.end;
    } else if (cp_vec_push(&sc->locs, f)) {
        goto nomem;
    }
    w->nloc++;
    return 0;
nomem:
    return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
}

/* A string_table entry, within the limits. */
static int pass_string(wire *w, rd f)
{
    const cp_pprof_limits *lim = w->lim;
    if (w->nstr == 0) w->first_str_empty = f.p == f.end;
    if (++w->nstr > lim->max_strings)
        return cp_err_set(w->err, CP_ELIMIT, "string_table has more than %u strings (limit %u)",
                          lim->max_strings, lim->max_strings);
    w->sbytes += (size_t)(f.end - f.p) + 1;
    if (w->sbytes > lim->max_string_bytes)
        return cp_err_set(w->err, CP_ELIMIT, "strings take more than %zu bytes (limit %zu)",
                          lim->max_string_bytes, lim->max_string_bytes);
    if (cp_profile_append_str(w->p, (const char *)f.p, (size_t)(f.end - f.p)))
        return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
    return 0;
}

/* One top-level field by its key, the general path: strings, functions and locations are
 * parsed where they stand; sample types, samples and mappings are remembered for after. */
static int pass_field(wire *w, rd *top)
{
    int rc = 0;
    cp_err *err = w->err;
    scratch *sc = w->sc;
    uint32_t field, wt;
    rd f;
    size_t at = (size_t)(top->p - w->buf);
    if (rd_key(top, &field, &wt)) MALFORMED("field key at byte %zu", at);
    if ((field >= 1 && field <= 6) || field == 11) {
        if (wt != WT_LEN)
            return cp_err_set(err, CP_EPPROF,
                              "field %u at byte %zu: wire type %u, expected length-delimited",
                              field, at, wt);
        if (rd_len(top, &f)) MALFORMED("field %u at byte %zu", field, at);
        switch (field) {
        case 1:
            if (cp_vec_push(&sc->types, f)) goto nomem;
            return 0;
        case 2:
            if (cp_vec_push(&sc->samples, f)) goto nomem;
            return 0;
        case 3:
            if (cp_vec_push(&sc->maps, f)) goto nomem;
            return 0;
        case 4:
            return pass_location(w, f, at);
        case 5:
            if (w->p->functions.n >= w->lim->max_locations) return too_many(w);
            return parse_function(f, w->p->functions.n, w->p, &sc->fn_ids, err);
        case 6:
            return pass_string(w, f);
        default:
            w->period_type = f;
            return 0;
        }
    } else if (field == 13) {
        READ_REPEATED(top, wt, &sc->comments, int64_t, "comment at byte %zu", at);
    } else if (field >= 7 && field <= 14) {
        uint64_t v;
        if (wt != WT_VARINT)
            return cp_err_set(err, CP_EPPROF, "field %u at byte %zu: wire type %u, expected varint",
                              field, at, wt);
        if (rd_varint(top, &v)) MALFORMED("field %u at byte %zu", field, at);
        w->scal[field] = (int64_t)v;
    } else if (rd_skip(top, wt)) {
        MALFORMED("unknown field %u at byte %zu", field, at);
    }
    return 0;
nomem:
    rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
out:
    return rc;
}

/* The one pass over the top-level fields. */
static int wire_pass(wire *w)
{
    int rc;
    rd top = {w->buf, w->buf + w->len};
    while (top.p < top.end) {
        if (*top.p == 0x12) {
            int bad;
            if ((rc = pass_samples(w, &top, &bad))) return rc;
            if (!bad) continue;
        }
        if (w->lz && w->loc_run && *top.p == 0x22) {
            if ((rc = pass_lazy_locations(w, &top))) return rc;
            continue;
        }
        if ((rc = pass_field(w, &top))) return rc;
    }
    return 0;
}

/* --- limits and the string table --- */
static int check_limits(wire *w)
{
    const cp_pprof_limits *lim = w->lim;
    const scratch *sc = w->sc;
    if (w->nstr == 0)
        return cp_err_set(w->err, CP_EPPROF,
                          "string_table is empty (string_table[0] must be \"\")");
    if (!w->first_str_empty)
        return cp_err_set(w->err, CP_EPPROF, "string_table[0] is not the empty string");
    if (sc->samples.n > lim->max_samples)
        return cp_err_set(w->err, CP_ELIMIT, "profile has %u samples (limit %u)", sc->samples.n,
                          lim->max_samples);
    if (sc->maps.n > lim->max_locations) return too_many(w);
    if (sc->types.n > 64)
        return cp_err_set(w->err, CP_ELIMIT, "profile has %u sample types (limit 64)", sc->types.n);
    w->nstr = w->p->strs.off.n;
    return 0;
}

/* --- header --- */

/* A ValueType message (a sample type or the period type; `what`, with index i unless i is
 * negative, names it in errors): its type and unit, as string indices checked. */
static int parse_value_type(rd r, size_t nstr, const char *what, long i, uint64_t *t, uint64_t *u,
                            cp_err *err)
{
    int rc = 0;
    uint32_t field, wt;
    uint64_t v;
    *t = *u = 0;
    while (r.p < r.end) {
        if (rd_key(&r, &field, &wt)) goto bad;
        if (field == 1 || field == 2) {
            WANT_VARINT(wt, what);
            if (rd_varint(&r, &v)) goto bad;
            if (field == 1)
                *t = v;
            else
                *u = v;
        } else if (rd_skip(&r, wt))
            goto bad;
    }
    if (i < 0) {
        CHECK_STR(*t, "%s.type", what);
        CHECK_STR(*u, "%s.unit", what);
    } else {
        CHECK_STR(*t, "%s[%ld].type", what, i);
        CHECK_STR(*u, "%s[%ld].unit", what, i);
    }
    return 0;
bad:
    if (i < 0) MALFORMED("%s", what);
    MALFORMED("%s[%ld]", what, i);
out:
    return rc;
}

static int decode_header(wire *w)
{
    int rc = 0;
    cp_err *err = w->err;
    cp_profile *p = w->p;
    const scratch *sc = w->sc;
    size_t nstr = w->nstr;
    uint64_t t, u;
    for (uint32_t i = 0; i < sc->types.n; i++) {
        if ((rc = parse_value_type(sc->types.v[i], nstr, "sample_type", i, &t, &u, err))) return rc;
        if (cp_vec_push(&p->sample_types, ((cp_value_type){(uint32_t)t, (uint32_t)u})))
            return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
    }
    if (w->period_type.p) {
        if ((rc = parse_value_type(w->period_type, nstr, "period_type", -1, &t, &u, err)))
            return rc;
        p->period_type.type = (uint32_t)t;
        p->period_type.unit = (uint32_t)u;
    }
    const int64_t *scal = w->scal;
    CHECK_STR(scal[7], "drop_frames");
    CHECK_STR(scal[8], "keep_frames");
    CHECK_STR(scal[14], "default_sample_type");
    p->drop_frames = (uint32_t)scal[7];
    p->keep_frames = (uint32_t)scal[8];
    p->default_sample_type = (uint32_t)scal[14];
    p->time_nanos = scal[9];
    p->duration_nanos = scal[10];
    p->period = scal[12];
    for (uint32_t i = 0; i < sc->comments.n; i++) {
        CHECK_STR(sc->comments.v[i], "comment[%u]", i);
        if (cp_vec_push(&p->comments, (uint32_t)sc->comments.v[i]))
            return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
    }
out:
    return rc;
}

/* --- mappings, then their id map --- */
static int decode_mappings(wire *w)
{
    int rc = 0;
    cp_err *err = w->err;
    cp_profile *p = w->p;
    rd_vec *maps = &w->sc->maps;
    u64_vec *ids = &w->sc->ids;
    size_t nstr = w->nstr;
    uint32_t field, wt;
    if (cp_vec_reserve(&p->mappings, maps->n) || cp_vec_reserve(ids, maps->n))
        return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
    ids->n = 0;
    for (uint32_t i = 0; i < maps->n; i++) {
        rd r = maps->v[i];
        uint64_t v[11] = {0};
        while (r.p < r.end) {
            if (rd_key(&r, &field, &wt)) MALFORMED("mapping[%u]", i);
            if (field >= 1 && field <= 10) {
                WANT_VARINT(wt, "mapping");
                if (rd_varint(&r, &v[field])) MALFORMED("mapping[%u]", i);
            } else if (rd_skip(&r, wt))
                MALFORMED("mapping[%u]", i);
        }
        CHECK_STR(v[5], "mapping[%u] (id %llu).filename", i, (unsigned long long)v[1]);
        CHECK_STR(v[6], "mapping[%u] (id %llu).build_id", i, (unsigned long long)v[1]);
        ids->v[ids->n++] = v[1];
        p->mappings.v[p->mappings.n++] = (cp_mapping){
            .start = v[2],
            .limit = v[3],
            .offset = v[4],
            .filename = (uint32_t)v[5],
            .build_id = (uint32_t)v[6],
            .flags = (v[7] ? CP_MAP_HAS_FUNCTIONS : 0) | (v[8] ? CP_MAP_HAS_FILENAMES : 0) |
                     (v[9] ? CP_MAP_HAS_LINE_NUMBERS : 0) | (v[10] ? CP_MAP_HAS_INLINE_FRAMES : 0)};
    }
    rc = idmap_build(&w->mm, "mapping", ids->v, ids->n, err);
out:
    return rc;
}

/* --- functions: string indices, then the id map --- */
static int decode_functions(wire *w)
{
    int rc = 0;
    cp_err *err = w->err;
    const cp_profile *p = w->p;
    const scratch *sc = w->sc;
    size_t nstr = w->nstr;
    for (uint32_t i = 0; i < p->functions.n; i++) {
        const cp_function *fn = &p->functions.v[i];
        unsigned long long id = (unsigned long long)sc->fn_ids.v[i];
        CHECK_STR(fn->name, "function[%u] (id %llu).name", i, id);
        CHECK_STR(fn->system_name, "function[%u] (id %llu).system_name", i, id);
        CHECK_STR(fn->filename, "function[%u] (id %llu).filename", i, id);
    }
    rc = idmap_build(&w->fm, "function", sc->fn_ids.v, sc->fn_ids.n, err);
out:
    return rc;
}

/* --- locations: parsed now when lazy (unless they can stay lazy), then their mappings
 * and functions resolved, then the id map --- */
static int decode_locations(wire *w)
{
    int rc;
    cp_profile *p = w->p;
    scratch *sc = w->sc;
    int lazy = w->lz != NULL;
    /* (ids not 1..n in order, or not first in their messages: parsed as usual) */
    int lazy_locs = lazy && w->loc_run && w->mm.dense && w->fm.dense && w->nloc > 0;
    if (lazy && !lazy_locs && w->loc_run && w->nloc &&
        locs_collect(&sc->locs, w->loc_start, w->loc_end))
        return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
    if (lazy && !lazy_locs)
        for (uint32_t i = 0; i < sc->locs.n; i++)
            if ((rc = parse_location(sc->locs.v[i], p->locations.n, p, sc, w->err))) return rc;
    if ((rc = resolve_locations(p, sc, 0, &w->mm, &w->fm, w->err))) return rc;
    if (lazy_locs) { /* checked above: dense */
        w->lm.dense = 1;
        w->lm.n = w->nloc;
        w->lz->locs = w->loc_start;
        w->lz->locs_len = (size_t)(w->loc_end - w->loc_start);
        w->lz->nloc = w->nloc;
    } else if ((rc = idmap_build(&w->lm, "location", sc->loc_ids.v, sc->loc_ids.n, w->err))) {
        return rc;
    }
    w->nlocs_total = lazy_locs ? w->nloc : p->locations.n;
    return 0;
}

/* --- samples --- */

/* The agent's shape, read at once from sample i on: packed ids (kept lazy), then two
 * packed values, nothing else. What decode_sample would make of it, in a fraction of its
 * steps, for a run of such samples (counts kept in locals, as nothing else is written
 * meanwhile). Returns the first sample of another shape (or the count). */
static inline uint32_t samples_agent_run(wire *w, uint32_t i)
{
    cp_profile *p = w->p;
    const rd_vec *samples = &w->sc->samples;
    const uint8_t *buf_end = w->buf + w->len; /* a value's varint may be loaded up to here */
    const cp_sample cs = {.loc_off = p->stack.n, .label_off = p->labels.n};
    cp_sample *sv = p->samples.v;
    int64_t *vv = p->values.v;
    cp_pprof_ids *iv = w->lz->ids.v;
    uint32_t ns = p->samples.n, nvals = p->values.n, i0 = i;
    size_t max_depth = w->lim->max_depth;
    for (; i < samples->n; i++) {
        rd r = samples->v[i], t = {r.p + 1, r.end}, ids, vals;
        uint64_t v0, v1;
        if (r.p >= r.end || r.p[0] != 0x0a || rd_len(&t, &ids) || ids.p == ids.end ||
            (size_t)(ids.end - ids.p) > max_depth || t.p >= t.end || t.p[0] != 0x12)
            break;
        t.p++;
        if (rd_len(&t, &vals) || t.p != r.end || rd_varint_in(&vals, buf_end, &v0) ||
            rd_varint_in(&vals, buf_end, &v1) || vals.p != vals.end)
            break;
        vv[nvals++] = (int64_t)v0;
        vv[nvals++] = (int64_t)v1;
        iv[i] = (cp_pprof_ids){ids.p, (uint32_t)(ids.end - ids.p)};
        sv[ns++] = cs;
    }
    p->samples.n = ns;
    p->values.n = nvals;
    w->lz->nlazy += i - i0;
    return i;
}

/* Label message r of sample i, appended to the profile's labels (cs counts it). */
static int parse_label(wire *w, rd lb, uint32_t i, cp_sample *cs)
{
    int rc = 0;
    cp_err *err = w->err;
    size_t nstr = w->nstr;
    uint64_t v[5] = {0};
    while (lb.p < lb.end) {
        uint32_t lf, lw;
        if (rd_key(&lb, &lf, &lw)) MALFORMED("sample[%u].label[%u]", i, cs->nlabels);
        if (lf >= 1 && lf <= 4) {
            WANT_VARINT(lw, "label");
            if (rd_varint(&lb, &v[lf])) MALFORMED("sample[%u].label[%u]", i, cs->nlabels);
        } else if (rd_skip(&lb, lw))
            MALFORMED("sample[%u].label[%u]", i, cs->nlabels);
    }
    CHECK_STR(v[1], "sample[%u].label[%u].key", i, cs->nlabels);
    CHECK_STR(v[2], "sample[%u].label[%u].str", i, cs->nlabels);
    CHECK_STR(v[4], "sample[%u].label[%u].num_unit", i, cs->nlabels);
    if (v[1] == 0)
        return cp_err_set(err, CP_EPPROF, "sample[%u].label[%u]: key is the empty string", i,
                          cs->nlabels);
    if (cp_vec_push(&w->p->labels,
                    ((cp_label){(uint32_t)v[1], (uint32_t)v[2], (uint32_t)v[4], (int64_t)v[3]})))
        return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
    cs->nlabels++;
out:
    return rc;
}

/* Ids of sample i that came one by one (unpacked) or need the id map, collected in tmp:
 * resolved onto the stack, within the depth limit. */
static int sample_stack_tmp(wire *w, uint32_t i, const cp_sample *cs)
{
    cp_profile *p = w->p;
    const u64_vec *tmp = &w->sc->tmp;
    uint32_t nlocs_total = w->nlocs_total;
    uint32_t depth = p->stack.n - cs->loc_off + tmp->n;
    if (depth > w->lim->max_depth)
        return cp_err_set(w->err, CP_ELIMIT, "sample[%u] has %u locations (stack depth limit %u)",
                          i, depth, w->lim->max_depth);
    if (cp_vec_reserve(&p->stack, (size_t)p->stack.n + tmp->n))
        return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
    for (uint32_t k = 0; k < tmp->n; k++) {
        uint32_t lid = w->lm.dense ? (tmp->v[k] - 1 < nlocs_total ? (uint32_t)tmp->v[k] : 0)
                                   : idmap_get(&w->lm, tmp->v[k]);
        if (!lid)
            return cp_err_set(w->err, CP_EPPROF,
                              "sample[%u].location_id[%u]: location %llu not found (profile "
                              "has %u locations)",
                              i, p->stack.n - cs->loc_off, (unsigned long long)tmp->v[k],
                              nlocs_total);
        p->stack.v[p->stack.n++] = lid;
    }
    return 0;
}

/* Sample i in any shape (the general path). */
static int decode_sample(wire *w, uint32_t i)
{
    int rc = 0;
    cp_err *err = w->err;
    cp_profile *p = w->p;
    cp_pprof_lazy *lz = w->lz;
    u64_vec *tmp = &w->sc->tmp;
    uint32_t field, wt, nlocs_total = w->nlocs_total;
    size_t nv = w->sc->types.n;
    rd r = w->sc->samples.v[i];
    cp_sample cs = {.loc_off = p->stack.n, .label_off = p->labels.n};
    if (lz) lz->ids.v[i] = (cp_pprof_ids){NULL, 0};
    uint32_t values_at = p->values.n;
    rd span = {NULL, NULL}; /* lazy: the sample's packed ids, not decoded yet */
    tmp->n = 0;
    while (r.p < r.end) {
        if (rd_key(&r, &field, &wt)) MALFORMED("sample[%u]", i);
        if (field == 1 && wt == WT_LEN && w->lm.dense && tmp->n == 0) {
            /* the common case: a packed run of dense ids, checked and stored at once
             * (once an id went to tmp, the rest follow it there, keeping the order);
             * with lazy ids, a sample's first run is kept as bytes instead */
            rd pk;
            if (rd_len(&r, &pk)) MALFORMED("sample[%u].location_id", i);
            if (pk.p == pk.end) continue;
            if (lz && !span.p && p->stack.n == cs.loc_off) {
                span = pk;
                continue;
            }
            if (span.p && (rc = stack_run(p, &span, i, cs.loc_off, nlocs_total, err))) goto out;
            if ((rc = stack_run(p, &pk, i, cs.loc_off, nlocs_total, err))) goto out;
        } else if (field == 1) {
            if (span.p && (rc = stack_run(p, &span, i, cs.loc_off, nlocs_total, err))) goto out;
            READ_REPEATED64(&r, wt, tmp, "sample[%u].location_id", i);
        } else if (field == 2) {
            READ_REPEATED64(&r, wt, &p->values, "sample[%u].value", i);
        } else if (field == 3) {
            rd lb;
            if (wt != WT_LEN || rd_len(&r, &lb)) MALFORMED("sample[%u].label[%u]", i, cs.nlabels);
            if ((rc = parse_label(w, lb, i, &cs))) goto out;
        } else if (rd_skip(&r, wt)) {
            MALFORMED("sample[%u]", i);
        }
    }
    if (p->values.n - values_at != nv)
        return cp_err_set(err, CP_EPPROF, "sample[%u] has %u values (profile has %zu sample types)",
                          i, p->values.n - values_at, nv);
    if (span.p) { /* kept as bytes when one byte an id cannot pass the depth limit */
        if ((size_t)(span.end - span.p) > w->lim->max_depth) {
            if ((rc = stack_run(p, &span, i, cs.loc_off, nlocs_total, err))) goto out;
        } else {
            lz->ids.v[i] = (cp_pprof_ids){span.p, (uint32_t)(span.end - span.p)};
            lz->nlazy++;
        }
    }
    if ((rc = sample_stack_tmp(w, i, &cs))) goto out;
    cs.nlocs = p->stack.n - cs.loc_off;
    p->samples.v[p->samples.n++] = cs;
    return 0;
nomem:
    rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
out:
    return rc;
}

static int decode_samples(wire *w)
{
    int rc;
    cp_profile *p = w->p;
    const rd_vec *samples = &w->sc->samples;
    size_t nv = w->sc->types.n;
    if (cp_vec_reserve(&p->samples, samples->n) ||
        cp_vec_reserve(&p->values, (size_t)samples->n * nv))
        goto nomem;
    if (w->lz && samples->n) {
        if (cp_vec_reserve(&w->lz->ids, samples->n)) goto nomem;
        w->lz->ids.n = samples->n; /* each one set below */
    }
    int agent = w->lz && w->lm.dense && nv == 2;
    for (uint32_t i = 0; i < samples->n; i++) {
        if (agent && (i = samples_agent_run(w, i)) == samples->n) break;
        if ((rc = decode_sample(w, i))) return rc;
    }
    return 0;
nomem:
    return cp_err_set(w->err, CP_ENOMEM, "out of memory decoding profile");
}

/* Decodes buf into p (lazy: lz keeps what may stay undecoded), one field group at a time:
 * one pass over the top-level fields (strings, functions and locations parsed where they
 * stand; sample types, samples and mappings remembered for after, since they are checked
 * against, or refer to, what may come later), then the limits, the header, mappings,
 * functions, locations and samples. */
static int decode_wire(scratch *sc, const uint8_t *buf, size_t len, const cp_pprof_limits *lim,
                       cp_profile *p, cp_pprof_lazy *lz, cp_err *err)
{
    wire w = {.sc = sc,
              .buf = buf,
              .len = len,
              .lim = lim,
              .p = p,
              .lz = lz,
              .err = err,
              .loc_run = 1,
              .first_str_empty = 1};
    sc->types.n = sc->samples.n = sc->maps.n = sc->ids.n = sc->tmp.n = sc->comments.n = sc->locs.n =
        0;
    sc->fn_ids.n = sc->loc_ids.n = sc->loc_maps.n = sc->line_fns.n = 0;
    p->strs.len = 0;
    p->strs.off.n = 0;
    if (p->strs.slots) { /* the intern index is rebuilt by the next intern, if any */
        free(p->strs.slots);
        p->strs.slots = NULL;
        p->strs.nslots = 0;
    }
    int rc;
    (void)((rc = wire_pass(&w)) || (rc = check_limits(&w)) || (rc = decode_header(&w)) ||
           (rc = decode_mappings(&w)) || (rc = decode_functions(&w)) ||
           (rc = decode_locations(&w)) || (rc = decode_samples(&w)));
    idmap_close(&w.mm);
    idmap_close(&w.lm);
    idmap_close(&w.fm);
    return rc;
}

struct cp_pprof_decoder {
    cp_pprof_limits lim;
    struct libdeflate_decompressor *inflater;
    cp_buf raw;
    scratch sc;
};

cp_pprof_decoder *cp_pprof_decoder_create(const cp_pprof_limits *lim)
{
    cp_pprof_decoder *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    if (lim)
        d->lim = *lim;
    else
        cp_pprof_limits_default(&d->lim);
#ifdef IDS_SIMD
    pthread_once(&ids_once, ids_init);
#endif
    if (!(d->inflater = libdeflate_alloc_decompressor())) {
        free(d);
        return NULL;
    }
    return d;
}

void cp_pprof_decoder_destroy(cp_pprof_decoder *d)
{
    if (!d) return;
    if (d->inflater) libdeflate_free_decompressor(d->inflater);
    cp_buf_close(&d->raw);
    scratch_close(&d->sc);
    free(d);
}

/* Nothing lazy in lz (its memory kept). */
static void lazy_clear(cp_pprof_lazy *lz)
{
    lz->ids.n = lz->nlazy = lz->nloc = 0;
    lz->locs = NULL;
    lz->locs_len = 0;
}

int cp_pprof_decoder_decode_lazy(cp_pprof_decoder *d, const uint8_t *buf, size_t len, cp_profile *p,
                                 cp_pprof_lazy *lz, cp_err *err)
{
    int rc;
    cp_profile_reset(p);
    if (lz) {
        lazy_clear(lz);
        lz->buf = buf;
        lz->len = len;
        lz->lim = d->lim;
    }
    if (cp_is_gzip(buf, len)) {
        /* the inflated bytes are the decoder's and the next call's: nothing stays lazy */
        lz = NULL;
        d->raw.len = 0;
        if ((rc = gunzip_with(d->inflater, buf, len, d->lim.max_bytes, &d->raw, err))) return rc;
        buf = d->raw.data;
        len = d->raw.len;
    } else if (len > d->lim.max_bytes) {
        return cp_err_set(err, CP_ELIMIT, "profile is %zu bytes (limit %zu)", len,
                          d->lim.max_bytes);
    }
    /* The wire scan only explains failures: damage to the framing (truncation, a huge
     * length) gets its own message rather than whatever the decoder tripped over first. */
    if ((rc = decode_wire(&d->sc, buf, len, &d->lim, p, lz, err))) {
        cp_profile_reset(p);
        if (lz) lazy_clear(lz);
        if (rc != CP_ENOMEM) {
            int wrc = wire_scan(buf, len, d->lim.max_bytes, err);
            if (wrc) rc = wrc;
        }
    }
    /* a huge input must not pin its scratch memory for the decoder's lifetime */
    if (d->raw.cap > (4u << 20)) cp_buf_close(&d->raw);
    return rc;
}

int cp_pprof_decoder_decode(cp_pprof_decoder *d, const uint8_t *buf, size_t len, cp_profile *p,
                            cp_err *err)
{
    return cp_pprof_decoder_decode_lazy(d, buf, len, p, NULL, err);
}

int cp_pprof_lazy_ids(const cp_profile *p, const cp_pprof_lazy *lz, uint32_t i, uint32_t *dst,
                      uint32_t *n, cp_err *err)
{
    const cp_pprof_ids *ids = &lz->ids.v[i];
    uint32_t nloc = lz->nloc ? lz->nloc : p->locations.n;
    long got = ids_decode(ids->p, ids->p + ids->len, nloc, dst, i, 0, err);
    if (got < 0) return CP_EPPROF; /* err says which id */
    *n = (uint32_t)got;
    return 0;
}

/* The input of lz decoded in full into p, as cp_pprof_decoder_decode would; lz no longer
 * lazy. */
static int lazy_undo(cp_profile *p, cp_pprof_lazy *lz, cp_err *err)
{
    cp_pprof_decoder *d = cp_pprof_decoder_create(&lz->lim);
    if (!d) return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
    int rc = cp_pprof_decoder_decode(d, lz->buf, lz->len, p, err);
    cp_pprof_decoder_destroy(d);
    lazy_clear(lz);
    return rc;
}

int cp_pprof_lazy_locations(cp_profile *p, cp_pprof_lazy *lz, uint32_t from, size_t from_at,
                            cp_err *err)
{
    if (!lz->nloc || p->locations.n) return 0; /* parsed by the decoder, or already here */
    if (from > lz->nloc || from_at > lz->locs_len || (from == 0) != (from_at == 0))
        from = 0, from_at = 0; /* not a place in this run: parse them all */
    /* [0, from) not written: the caller knows them (pprof.h), and clearing them cost as
     * much memory traffic as parsing the new ones */
    if (cp_vec_reserve(&p->locations, lz->nloc)) goto nomem;
    p->locations.n = from;
    if (from == lz->nloc) return 0;
    scratch sc = {0};
    rd top = {lz->locs + from_at, lz->locs + lz->locs_len}, f;
    uint32_t field, wt;
    int rc = 0, undo = 0;
    /* the decoder checked the framing of every message */
    for (uint32_t i = from; i < lz->nloc && !rc && !undo; i++) {
        if (rd_key(&top, &field, &wt) || field != 4 || rd_len(&top, &f)) {
            rc = cp_err_set(err, CP_EPPROF, "location[%u]: malformed field", i);
            break;
        }
        rc = parse_location(f, i, p, &sc, err);
        /* the decoder looked at each message's first field only: an id given again later
         * in the message (the last one counts) makes the ids other than 1..n */
        undo = !rc && sc.loc_ids.v[i - from] != (uint64_t)i + 1;
    }
    /* dense mapping and function ids (the decoder kept locations lazy only then) */
    idmap mm = {.dense = 1, .n = p->mappings.n}, fm = {.dense = 1, .n = p->functions.n};
    if (!rc && !undo && p->locations.n > from) rc = resolve_locations(p, &sc, from, &mm, &fm, err);
    scratch_close(&sc);
    if (undo) return lazy_undo(p, lz, err);
    if (rc) p->locations.n = 0;
    return rc;
nomem:
    return cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
}

void cp_pprof_lazy_close(cp_pprof_lazy *lz)
{
    free(lz->ids.v);
    memset(lz, 0, sizeof *lz);
}

int cp_pprof_decode(const uint8_t *buf, size_t len, const cp_pprof_limits *lim, cp_profile **out,
                    cp_err *err)
{
    cp_pprof_decoder *d = cp_pprof_decoder_create(lim);
    cp_profile *p = cp_profile_create();
    int rc;
    *out = NULL;
    if (!d || !p) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory");
    } else if ((rc = cp_pprof_decoder_decode(d, buf, len, p, err)) == 0) {
        *out = p;
        p = NULL;
    }
    cp_profile_destroy(p);
    cp_pprof_decoder_destroy(d);
    return rc;
}

/* ===== encoding ===================================================================== */

/* The encoder writes the wire format straight from the flat model, in field-number order
 * as protoc-c does, omitting zero scalars (proto3), with packed repeated scalars. Each
 * message's length is computed before it is written, so lengths are minimal varints. */

static inline size_t vsz(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A scalar field (numbers below 16: one-byte keys), left out when zero. */
static inline size_t fsz(uint64_t v)
{
    return v ? 1 + vsz(v) : 0;
}

static inline uint8_t *put_f(uint8_t *o, unsigned field, uint64_t v)
{
    if (!v) return o;
    *o++ = (uint8_t)(field << 3 | WT_VARINT);
    return wr_varint(o, v);
}

/* A length-delimited field of n bytes: key and length (the caller writes the bytes). */
static inline size_t lsz(size_t n)
{
    return 1 + vsz(n) + n;
}

static inline uint8_t *put_l(uint8_t *o, unsigned field, size_t n)
{
    *o++ = (uint8_t)(field << 3 | WT_LEN);
    return wr_varint(o, n);
}

static size_t vt_size(cp_value_type vt)
{
    return fsz(vt.type) + fsz(vt.unit);
}

static uint8_t *put_vt(uint8_t *o, unsigned field, cp_value_type vt)
{
    o = put_l(o, field, vt_size(vt));
    o = put_f(o, 1, vt.type);
    return put_f(o, 2, vt.unit);
}

/* Payload sizes of a sample's packed location ids and values. */
static void sample_sizes(const cp_profile *p, uint32_t i, size_t *locs, size_t *vals, size_t *total)
{
    const cp_sample *s = &p->samples.v[i];
    uint32_t nv = p->sample_types.n;
    const int64_t *v = cp_profile_sample_values(p, i);
    size_t nl = 0, nvb = 0, t = 0;
    for (uint32_t k = 0; k < s->nlocs; k++)
        nl += vsz(p->stack.v[s->loc_off + k]);
    for (uint32_t k = 0; k < nv; k++)
        nvb += vsz((uint64_t)v[k]);
    if (s->nlocs) t += lsz(nl);
    if (nv) t += lsz(nvb);
    for (uint32_t k = 0; k < s->nlabels; k++) {
        const cp_label *l = &p->labels.v[s->label_off + k];
        t += lsz(fsz(l->key) + fsz(l->str) + fsz((uint64_t)l->num) + fsz(l->num_unit));
    }
    *locs = nl;
    *vals = nvb;
    *total = t;
}

static size_t mapping_size(const cp_mapping *m, uint32_t id)
{
    return fsz(id) + fsz(m->start) + fsz(m->limit) + fsz(m->offset) + fsz(m->filename) +
           fsz(m->build_id) + fsz(!!(m->flags & CP_MAP_HAS_FUNCTIONS)) +
           fsz(!!(m->flags & CP_MAP_HAS_FILENAMES)) + fsz(!!(m->flags & CP_MAP_HAS_LINE_NUMBERS)) +
           fsz(!!(m->flags & CP_MAP_HAS_INLINE_FRAMES));
}

static size_t line_size(const cp_line *ln)
{
    return fsz(ln->function_id) + fsz((uint64_t)ln->line);
}

static size_t location_size(const cp_profile *p, const cp_location *l, uint32_t id)
{
    size_t n = fsz(id) + fsz(l->mapping_id) + fsz(l->address) + fsz(l->is_folded != 0);
    for (uint32_t k = 0; k < l->nlines; k++)
        n += lsz(line_size(&p->lines.v[l->line_off + k]));
    return n;
}

static size_t function_size(const cp_function *f, uint32_t id)
{
    return fsz(id) + fsz(f->name) + fsz(f->system_name) + fsz(f->filename) +
           fsz((uint64_t)f->start_line);
}

static size_t string_len(const cp_profile *p, uint32_t i)
{
    size_t end = i + 1 < p->strs.off.n ? p->strs.off.v[i + 1] : p->strs.len;
    return end - p->strs.off.v[i] - 1;
}

static size_t comments_size(const cp_profile *p)
{
    size_t n = 0;
    for (uint32_t i = 0; i < p->comments.n; i++)
        n += vsz(p->comments.v[i]);
    return n;
}

static size_t profile_size(const cp_profile *p)
{
    size_t n = 0, a, b, t;
    for (uint32_t i = 0; i < p->sample_types.n; i++)
        n += lsz(vt_size(p->sample_types.v[i]));
    for (uint32_t i = 0; i < p->samples.n; i++) {
        sample_sizes(p, i, &a, &b, &t);
        n += lsz(t);
    }
    for (uint32_t i = 0; i < p->mappings.n; i++)
        n += lsz(mapping_size(&p->mappings.v[i], i + 1));
    for (uint32_t i = 0; i < p->locations.n; i++)
        n += lsz(location_size(p, &p->locations.v[i], i + 1));
    for (uint32_t i = 0; i < p->functions.n; i++)
        n += lsz(function_size(&p->functions.v[i], i + 1));
    for (uint32_t i = 0; i < p->strs.off.n; i++)
        n += lsz(string_len(p, i));
    n += fsz(p->drop_frames) + fsz(p->keep_frames) + fsz((uint64_t)p->time_nanos) +
         fsz((uint64_t)p->duration_nanos);
    if (p->period_type.type || p->period_type.unit) n += lsz(vt_size(p->period_type));
    n += fsz((uint64_t)p->period);
    if (p->comments.n) n += lsz(comments_size(p));
    return n + fsz(p->default_sample_type);
}

static uint8_t *put_profile(const cp_profile *p, uint8_t *o)
{
    size_t a, b, t;
    uint32_t nv = p->sample_types.n;
    for (uint32_t i = 0; i < nv; i++)
        o = put_vt(o, 1, p->sample_types.v[i]);
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        const int64_t *v = cp_profile_sample_values(p, i);
        sample_sizes(p, i, &a, &b, &t);
        o = put_l(o, 2, t);
        if (s->nlocs) {
            o = put_l(o, 1, a);
            for (uint32_t k = 0; k < s->nlocs; k++)
                o = wr_varint(o, p->stack.v[s->loc_off + k]);
        }
        if (nv) {
            o = put_l(o, 2, b);
            for (uint32_t k = 0; k < nv; k++)
                o = wr_varint(o, (uint64_t)v[k]);
        }
        for (uint32_t k = 0; k < s->nlabels; k++) {
            const cp_label *l = &p->labels.v[s->label_off + k];
            o = put_l(o, 3, fsz(l->key) + fsz(l->str) + fsz((uint64_t)l->num) + fsz(l->num_unit));
            o = put_f(o, 1, l->key);
            o = put_f(o, 2, l->str);
            o = put_f(o, 3, (uint64_t)l->num);
            o = put_f(o, 4, l->num_unit);
        }
    }
    for (uint32_t i = 0; i < p->mappings.n; i++) {
        const cp_mapping *m = &p->mappings.v[i];
        o = put_l(o, 3, mapping_size(m, i + 1));
        o = put_f(o, 1, i + 1);
        o = put_f(o, 2, m->start);
        o = put_f(o, 3, m->limit);
        o = put_f(o, 4, m->offset);
        o = put_f(o, 5, m->filename);
        o = put_f(o, 6, m->build_id);
        o = put_f(o, 7, !!(m->flags & CP_MAP_HAS_FUNCTIONS));
        o = put_f(o, 8, !!(m->flags & CP_MAP_HAS_FILENAMES));
        o = put_f(o, 9, !!(m->flags & CP_MAP_HAS_LINE_NUMBERS));
        o = put_f(o, 10, !!(m->flags & CP_MAP_HAS_INLINE_FRAMES));
    }
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        o = put_l(o, 4, location_size(p, l, i + 1));
        o = put_f(o, 1, i + 1);
        o = put_f(o, 2, l->mapping_id);
        o = put_f(o, 3, l->address);
        for (uint32_t k = 0; k < l->nlines; k++) {
            const cp_line *ln = &p->lines.v[l->line_off + k];
            o = put_l(o, 4, line_size(ln));
            o = put_f(o, 1, ln->function_id);
            o = put_f(o, 2, (uint64_t)ln->line);
        }
        o = put_f(o, 5, l->is_folded != 0);
    }
    for (uint32_t i = 0; i < p->functions.n; i++) {
        const cp_function *f = &p->functions.v[i];
        o = put_l(o, 5, function_size(f, i + 1));
        o = put_f(o, 1, i + 1);
        o = put_f(o, 2, f->name);
        o = put_f(o, 3, f->system_name);
        o = put_f(o, 4, f->filename);
        o = put_f(o, 5, (uint64_t)f->start_line);
    }
    for (uint32_t i = 0; i < p->strs.off.n; i++) {
        size_t n = string_len(p, i);
        o = put_l(o, 6, n);
        memcpy(o, p->strs.buf + p->strs.off.v[i], n);
        o += n;
    }
    o = put_f(o, 7, p->drop_frames);
    o = put_f(o, 8, p->keep_frames);
    o = put_f(o, 9, (uint64_t)p->time_nanos);
    o = put_f(o, 10, (uint64_t)p->duration_nanos);
    if (p->period_type.type || p->period_type.unit) o = put_vt(o, 11, p->period_type);
    o = put_f(o, 12, (uint64_t)p->period);
    if (p->comments.n) {
        o = put_l(o, 13, comments_size(p));
        for (uint32_t i = 0; i < p->comments.n; i++)
            o = wr_varint(o, p->comments.v[i]);
    }
    return put_f(o, 14, p->default_sample_type);
}

int cp_pprof_encode(const cp_profile *p, int gzip_level, cp_buf *out)
{
    size_t size = profile_size(p);
    if (gzip_level > 0) {
        uint8_t *tmp = malloc(size ? size : 1);
        if (!tmp) return CP_ENOMEM;
        uint8_t *end = put_profile(p, tmp);
        int rc = (size_t)(end - tmp) == size
                     ? cp_gzip(tmp, size, gzip_level > 9 ? 9 : gzip_level, out)
                     : CP_EINVAL;
        free(tmp);
        return rc;
    }
    if (cp_buf_reserve(out, size)) return CP_ENOMEM;
    uint8_t *end = put_profile(p, out->data + out->len);
    if ((size_t)(end - (out->data + out->len)) != size) return CP_EINVAL; /* a sizing bug: never */
    out->len += size;
    return 0;
}

/* ------------------------------------------------------------------------------------
 * Peeking */

int cp_pprof_peek_time(const uint8_t *buf, size_t len, int64_t *out)
{
    *out = 0;
    cp_buf plain = {0};
    if (cp_is_gzip(buf, len)) {
        int rc = cp_gunzip(buf, len, (size_t)64 << 20, &plain, NULL);
        if (rc) {
            cp_buf_close(&plain);
            return rc;
        }
        buf = plain.data;
        len = plain.len;
    }
    rd r = {buf, buf + len};
    int rc = 0;
    while (r.p < r.end && !rc) {
        uint64_t key, v;
        if (rd_varint(&r, &key)) {
            rc = CP_EPPROF;
            break;
        }
        switch (key & 7) {
        case 0:
            if (rd_varint(&r, &v))
                rc = CP_EPPROF;
            else if (key >> 3 == 9)
                *out = (int64_t)v;
            break;
        case 1:
            if (r.end - r.p < 8) rc = CP_EPPROF;
            r.p += 8;
            break;
        case 2:
            if (rd_varint(&r, &v) || v > (uint64_t)(r.end - r.p))
                rc = CP_EPPROF;
            else
                r.p += v;
            break;
        case 5:
            if (r.end - r.p < 4) rc = CP_EPPROF;
            r.p += 4;
            break;
        default:
            rc = CP_EPPROF;
        }
    }
    cp_buf_close(&plain);
    return rc;
}
