/* The varint and the protobuf wire format: bounds-checked cursors over a buffer, shared by
 * the pprof and envelope decoders and by the store's block format (store/format.h), and the
 * one varint writer. Every reader returns 0 or -1 on malformed input and never reads
 * outside [p, end). */
#ifndef CP_WIRE_H
#define CP_WIRE_H

#include <stdint.h>
#include <stddef.h>

typedef struct rd {
    const uint8_t *p, *end;
} rd;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* The value of up to eight varint bytes loaded little-endian into w (the bytes after the
 * varint's last one cleared): their 7-bit groups joined pairwise, 7 into 14, 14 into 28,
 * 28 into 56 bits (three steps rather than one shift and mask per byte). */
static inline __attribute__((always_inline)) uint64_t varint_fold(uint64_t w)
{
    w = (w & 0x007f007f007f007full) | (w & 0x7f007f007f007f00ull) >> 1;
    w = (w & 0x00003fff00003fffull) | (w & 0x3fff00003fff0000ull) >> 2;
    return (w & 0x000000000fffffffull) | (w & 0x0fffffff00000000ull) >> 4;
}
#endif

/* Reads a varint of at most 10 bytes into *out: 0, or -1 when it runs past the end or is
 * longer (r->p is then somewhere inside it). */
static inline __attribute__((always_inline)) int rd_varint(rd *r, uint64_t *out)
{
    if (r->p < r->end && *r->p < 0x80) { /* most varints here are one or two bytes */
        *out = *r->p++;
        return 0;
    }
    if (r->end - r->p >= 2 && r->p[1] < 0x80) {
        *out = (uint64_t)(r->p[0] & 0x7f) | (uint64_t)r->p[1] << 7;
        r->p += 2;
        return 0;
    }
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (r->end - r->p >= 8) { /* up to eight bytes from one load: values, addresses */
        uint64_t w;
        __builtin_memcpy(&w, r->p, 8);
        uint64_t stop = ~w & 0x8080808080808080ull; /* bytes without a continuation bit */
        if (stop) {
            unsigned n = (unsigned)__builtin_ctzll(stop) / 8 + 1;
            if (n < 8) w &= (1ull << (8 * n)) - 1;
            *out = varint_fold(w);
            r->p += n;
            return 0;
        }
    }
#endif
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return -1;
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1; /* more than 10 bytes */
}

/* rd_varint for a cursor over part of a larger buffer that goes on at least to lim
 * (lim >= r->end): the one-load path may read up to lim, so the last varints of a short
 * field (a sample's values) take it too. The same results as rd_varint. */
static inline __attribute__((always_inline)) int rd_varint_in(rd *r, const uint8_t *lim,
                                                              uint64_t *out)
{
    if (r->p < r->end && *r->p < 0x80) {
        *out = *r->p++;
        return 0;
    }
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (lim - r->p >= 8) {
        uint64_t w;
        __builtin_memcpy(&w, r->p, 8);
        uint64_t stop = ~w & 0x8080808080808080ull;
        if (stop) {
            unsigned n = (unsigned)__builtin_ctzll(stop) / 8 + 1;
            if (n > (size_t)(r->end - r->p)) return -1; /* runs past the end */
            if (n < 8) w &= (1ull << (8 * n)) - 1;
            *out = varint_fold(w);
            r->p += n;
            return 0;
        }
    }
#else
    (void)lim;
#endif
    return rd_varint(r, out);
}

/* Writes v as a varint (LEB128) at p, which has room for 10 bytes; returns the new end. */
static inline uint8_t *wr_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Reads a field key; 0 ok, -1 on a malformed key. */
static inline __attribute__((always_inline)) int rd_key(rd *r, uint32_t *field, uint32_t *wt)
{
    uint64_t k;
    if (rd_varint(r, &k) || (k >> 3) == 0 || (k >> 3) > 0x1fffffff) return -1;
    *field = (uint32_t)(k >> 3);
    *wt = (uint32_t)(k & 7);
    return 0;
}

/* Reads a length-delimited payload into sub. */
static inline __attribute__((always_inline)) int rd_len(rd *r, rd *sub)
{
    uint64_t n;
    if (rd_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return -1;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 0;
}

static inline int rd_skip(rd *r, uint32_t wt)
{
    uint64_t v;
    rd sub;
    switch (wt) {
    case WT_VARINT:
        return rd_varint(r, &v);
    case WT_LEN:
        return rd_len(r, &sub);
    case WT_I64:
        if (r->end - r->p < 8) return -1;
        r->p += 8;
        return 0;
    case WT_I32:
        if (r->end - r->p < 4) return -1;
        r->p += 4;
        return 0;
    }
    return -1;
}

#endif
