/* Growable arrays and a byte buffer: the two containers every module uses. */
#ifndef CP_VEC_H
#define CP_VEC_H

#include <stddef.h>
#include <stdint.h>

/* A typed growable array: CP_VEC(int) v = {0}; cp_vec_push(&v, 3). Free with free(v.v). */
#define CP_VEC(T)                                                                      \
    struct {                                                                           \
        T *v;                                                                          \
        uint32_t n, cap;                                                               \
    }

/* Makes room for need elements of size elt; returns 0 or CP_ENOMEM (contents kept). */
int cp_vec_grow_(void **v, uint32_t *cap, size_t need, size_t elt);

#define cp_vec_reserve(vec, need)                                                      \
    ((need) <= (vec)->cap ? 0                                                          \
                          : cp_vec_grow_((void **)&(vec)->v, &(vec)->cap, (need),      \
                                         sizeof(*(vec)->v)))
/* Appends val; evaluates to 0 or CP_ENOMEM. */
#define cp_vec_push(vec, val)                                                          \
    (cp_vec_reserve((vec), (size_t)(vec)->n + 1) ? CP_ENOMEM                           \
                                                 : ((vec)->v[(vec)->n++] = (val), 0))

/* A growable byte buffer. Owned by whoever init'ed it; cp_buf_close frees it. */
typedef struct cp_buf {
    uint8_t *data;
    size_t len, cap;
} cp_buf;

void cp_buf_close(cp_buf *b);
int cp_buf_reserve(cp_buf *b, size_t extra);
int cp_buf_append(cp_buf *b, const void *p, size_t n);
int cp_buf_printf(cp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Takes the bytes out of b; b is left empty. The caller frees the result. */
uint8_t *cp_buf_steal(cp_buf *b, size_t *len);

/* Reads a whole file ("-" is stdin) into out. Returns 0, CP_EIO or CP_ENOMEM. */
int cp_read_file(const char *path, cp_buf *out);
/* Writes len bytes to path ("-" is stdout), replacing it. Returns 0 or CP_EIO. */
int cp_write_file(const char *path, const void *data, size_t len);

/* 64-bit hashing for the intern tables. */
uint64_t cp_hash_bytes(const void *p, size_t n, uint64_t seed);
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
