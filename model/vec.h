/* Growable arrays and a byte buffer: the two containers every module uses; whole-file
 * reading and writing into them; the hashes of the intern tables. Nothing here is
 * thread-safe: a container belongs to one thread at a time. */
#ifndef CP_VEC_H
#define CP_VEC_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* A typed growable array: CP_VEC(int) v = {0}; cp_vec_push(&v, 3). The owner frees it with
 * free(v.v). Growing moves the elements: pointers into v.v do not survive a push. */
#define CP_VEC(T)                                                                                  \
    struct {                                                                                       \
        T *v;                                                                                      \
        uint32_t n, cap;                                                                           \
    }

/* Makes room for need elements of size elt; returns 0 or CP_ENOMEM (contents kept). The
 * engine of cp_vec_reserve; capacities double, and stay below 2^31 elements. */
int cp_vec_grow_(void **v, uint32_t *cap, size_t need, size_t elt);

/* Makes room for need elements in vec (n unchanged); evaluates to 0 or CP_ENOMEM. */
#define cp_vec_reserve(vec, need)                                                                  \
    ((need) <= (vec)->cap                                                                          \
         ? 0                                                                                       \
         : cp_vec_grow_((void **)&(vec)->v, &(vec)->cap, (need), sizeof(*(vec)->v)))
/* Appends val; evaluates to 0 or CP_ENOMEM. */
#define cp_vec_push(vec, val)                                                                      \
    (cp_vec_reserve((vec), (size_t)(vec)->n + 1) ? CP_ENOMEM : ((vec)->v[(vec)->n++] = (val), 0))

/* A growable byte buffer: zero it ({0}) to start; owned by whoever did, who frees it with
 * cp_buf_close. data is NULL until something is reserved. Growing moves data. */
typedef struct cp_buf {
    uint8_t *data;
    size_t len, cap;
} cp_buf;

/* Frees the bytes and leaves b empty (and reusable). A zeroed or closed b is fine. */
void cp_buf_close(cp_buf *b);
/* Makes room for extra more bytes after len. Returns 0 or CP_ENOMEM (b unchanged). */
int cp_buf_reserve(cp_buf *b, size_t extra);
/* Appends p[0..n). Returns 0 or CP_ENOMEM (b unchanged). */
int cp_buf_append(cp_buf *b, const void *p, size_t n);
/* Appends printf-formatted text (a NUL is written after it, not counted in len). Returns 0,
 * CP_ENOMEM, or CP_EINVAL for a format vsnprintf refuses (b unchanged either way). */
int cp_buf_printf(cp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Takes the bytes out of b (NULL if none); b is left empty. The caller frees the result. */
uint8_t *cp_buf_steal(cp_buf *b, size_t *len);

/* Appends the whole file at path ("-" is stdin) to out. Returns 0, or CP_EIO / CP_ENOMEM
 * with err (may be NULL) naming the path and the cause; out may then hold part of it. */
int cp_read_file(const char *path, cp_buf *out, cp_err *err);
/* Writes len bytes to fd, again after EINTR and short writes. Returns 0 or the errno value
 * of the failure (ENOSPC for a write that wrote nothing). */
int cp_write_all(int fd, const void *data, size_t len);
/* Writes len bytes to path ("-" is stdout), replacing it (not atomically). Returns 0, or
 * CP_EIO with err (may be NULL) naming the path and the cause. */
int cp_write_file(const char *path, const void *data, size_t len, cp_err *err);

/* 64-bit hashing for the intern tables: p[0..n) under seed. Not stable across versions:
 * nothing stored or sent may depend on its values. */
uint64_t cp_hash_bytes(const void *p, size_t n, uint64_t seed);

/* Unaligned loads of native-order integers: the ELF readers (collector/elfnames.c,
 * query/symtab.c) check that a file is little-endian, as every host we run on is. */
static inline uint16_t cp_ld16(const uint8_t *p)
{
    uint16_t v;
    __builtin_memcpy(&v, p, 2);
    return v;
}
static inline uint32_t cp_ld32(const uint8_t *p)
{
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}
static inline uint64_t cp_ld64(const uint8_t *p)
{
    uint64_t v;
    __builtin_memcpy(&v, p, 8);
    return v;
}

/* cp_hash_bytes' pieces, for hashes inlined where they run per sample (the store's stack
 * cache): the folded 64x64->128 multiply, and an unaligned little-endian 8-byte load. */
static inline uint64_t cp_hash_fold(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t cp_hash_load64(const uint8_t *s)
{
    uint64_t w;
    __builtin_memcpy(&w, s, 8);
    return w;
}

#define CP_HASH_K0 0xa0761d6478bd642fULL
#define CP_HASH_K1 0xe7037ed1a0b428dbULL

/* The end of cp_hash_bytes for an input of n bytes: h covers what came before s, and
 * s[0..left) is the rest (when n >= 16, the 16 bytes before s + left are readable too: the
 * last 16 bytes of the input are folded, overlapping what came before if need be). With
 * s the whole input, left = n and h = cp_hash_fold(seed ^ CP_HASH_K0, n ^ CP_HASH_K1) it
 * is a one-lane hash, the same as cp_hash_bytes up to 48 bytes. */
static inline uint64_t cp_hash_finish(const uint8_t *s, size_t left, size_t n, uint64_t h)
{
    uint64_t a, b;
    if (n >= 16) {
        for (; left > 16; s += 16, left -= 16)
            h = cp_hash_fold(cp_hash_load64(s) ^ CP_HASH_K1, cp_hash_load64(s + 8) ^ h);
        a = cp_hash_load64(s + left - 16);
        b = cp_hash_load64(s + left - 8);
    } else if (n >= 8) {
        a = cp_hash_load64(s);
        b = cp_hash_load64(s + n - 8);
    } else {
        a = b = 0;
        for (size_t i = 0; i < n; i++)
            a |= (uint64_t)s[i] << (8 * i);
    }
    return cp_hash_fold(CP_HASH_K1 ^ (uint64_t)n, cp_hash_fold(a ^ CP_HASH_K1, b ^ h) ^ CP_HASH_K0);
}
/* Folds v into h (a boost-style combine, then a 64-bit finalizer). */
static inline uint64_t cp_hash_u64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}
/* Hashes two words with one folded 64x64->128 multiply: cheaper than two cp_hash_u64 and
 * as well mixed for table keys (equal keys are always compared in full). */
static inline uint64_t cp_hash_mix(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)(a ^ 0xa0761d6478bd642fULL) * (b ^ 0xe7037ed1a0b428dbULL);
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

#endif
