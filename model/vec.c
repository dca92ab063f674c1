/* Growable arrays, byte buffers, whole-file I/O and hashing. */
#include "vec.h"
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

int cp_vec_grow_(void **v, uint32_t *cap, size_t need, size_t elt)
{
    if (need <= *cap) return 0;
    if (need > UINT32_MAX / 2) return CP_ENOMEM;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need)
        ncap *= 2;
    void *nv = realloc(*v, ncap * elt);
    if (!nv) return CP_ENOMEM;
    *v = nv;
    *cap = (uint32_t)ncap;
    return 0;
}

void cp_buf_close(cp_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int cp_buf_reserve(cp_buf *b, size_t extra)
{
    if (b->len + extra <= b->cap) return 0;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra)
        ncap *= 2;
    uint8_t *nd = realloc(b->data, ncap);
    if (!nd) return CP_ENOMEM;
    b->data = nd;
    b->cap = ncap;
    return 0;
}

int cp_buf_append(cp_buf *b, const void *p, size_t n)
{
    if (cp_buf_reserve(b, n)) return CP_ENOMEM;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int cp_buf_printf(cp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return CP_EINVAL;
    if (cp_buf_reserve(b, (size_t)n + 1)) return CP_ENOMEM;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

uint8_t *cp_buf_steal(cp_buf *b, size_t *len)
{
    uint8_t *d = b->data;
    if (len) *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

int cp_read_file(const char *path, cp_buf *out, cp_err *err)
{
    int fd = strcmp(path, "-") == 0 ? 0 : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cp_err_set(err, CP_EIO, "cannot read %s: %s", path, strerror(errno));
    int rc = 0;
    for (;;) {
        if (cp_buf_reserve(out, 65536)) {
            rc = cp_err_set(err, CP_ENOMEM, "cannot read %s: out of memory", path);
            break;
        }
        ssize_t n = read(fd, out->data + out->len, out->cap - out->len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = cp_err_set(err, CP_EIO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0) break;
        out->len += (size_t)n;
    }
    if (fd) close(fd);
    return rc;
}

int cp_write_all(int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno ? errno : EIO;
        if (n == 0) return ENOSPC;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int cp_write_file(const char *path, const void *data, size_t len, cp_err *err)
{
    int fd =
        strcmp(path, "-") == 0 ? 1 : open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return cp_err_set(err, CP_EIO, "cannot write %s: %s", path, strerror(errno));
    int e = cp_write_all(fd, data, len);
    if (e) {
        if (fd != 1) close(fd);
        return cp_err_set(err, CP_EIO, "cannot write %s: %s", path, strerror(e));
    }
    if (fd != 1 && close(fd) != 0)
        return cp_err_set(err, CP_EIO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* A fast, well-mixed hash for the intern tables (not for persistence: nothing on disk
 * depends on its values). Each 16-byte block is folded by one 64x64->128 multiply, with
 * three independent lanes over 48-byte strides so that long strings (C++ symbol names)
 * hash at several bytes per cycle rather than one. Shaped after wyhash's folded multiply. */
#define HK2 0x8ebc6af09c88c6e3ULL
#define HK3 0x589965cc75374cc3ULL

uint64_t cp_hash_bytes(const void *p, size_t n, uint64_t seed)
{
    const uint8_t *s = p;
    uint64_t h = cp_hash_fold(seed ^ CP_HASH_K0, (uint64_t)n ^ CP_HASH_K1);
    size_t left = n;
    if (left > 48) {
        uint64_t h1 = h, h2 = h;
        do {
            h = cp_hash_fold(cp_hash_load64(s) ^ CP_HASH_K1, cp_hash_load64(s + 8) ^ h);
            h1 = cp_hash_fold(cp_hash_load64(s + 16) ^ HK2, cp_hash_load64(s + 24) ^ h1);
            h2 = cp_hash_fold(cp_hash_load64(s + 32) ^ HK3, cp_hash_load64(s + 40) ^ h2);
            s += 48;
            left -= 48;
        } while (left > 48);
        h ^= h1 ^ h2;
    }
    return cp_hash_finish(s, left, n, h);
}
