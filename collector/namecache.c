/* The host's name cache files (namecache.h): encoded by the relay from an elfnames.c table,
 * mapped read-only by the agent and searched in place. Every offset read from a file is
 * checked against the file's size before it is used: a damaged or truncated file names
 * nothing, it never faults. */
#include "namecache.h"
#include "elfread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char MAGIC[8] = {'C', 'P', 'N', 'A', 'M', 'E', 'S', 0};

/* Header fields' offsets. */
enum {
    H_VERSION = 8,
    H_IDLEN = 12,
    H_FLAGS = 13,
    H_SOURCE = 14,
    H_NFUNC = 16,
    H_NPLT = 20,
    H_STRS = 24,
    H_ID = 32,
};

int cp_namecache_key(const uint8_t *build_id, uint32_t len, unsigned flags, char *out)
{
    static const char hex[] = "0123456789abcdef";
    if (!build_id || len < 2 || len > CP_NAMECACHE_ID_MAX) return CP_EINVAL;
    for (uint32_t i = 0; i < len; i++) {
        out[2 * i] = hex[build_id[i] >> 4];
        out[2 * i + 1] = hex[build_id[i] & 15];
    }
    out[2 * len] = 0;
    if (!(flags & CP_NAMECACHE_DEBUG)) memcpy(out + 2 * len, "-nodebug", 9);
    return 0;
}

int cp_namecache_parse(const uint8_t *p, size_t n, const uint8_t *build_id, uint32_t len,
                       unsigned flags, cp_namecache *out)
{
    memset(out, 0, sizeof(*out));
    if (n < CP_NAMECACHE_HEADER + 1 || n > CP_NAMECACHE_FILE_MAX) return CP_EPARSE;
    if (memcmp(p, MAGIC, sizeof(MAGIC)) != 0 || cp_ld32(p + H_VERSION) != CP_NAMECACHE_VERSION)
        return CP_EPARSE;
    if (p[H_IDLEN] != len || len < 2 || len > CP_NAMECACHE_ID_MAX ||
        memcmp(p + H_ID, build_id, len) != 0 || p[H_FLAGS] != (flags & CP_NAMECACHE_DEBUG))
        return CP_EPARSE;
    uint64_t nfunc = cp_ld32(p + H_NFUNC), nplt = cp_ld32(p + H_NPLT), strs = cp_ld32(p + H_STRS);
    /* 64-bit sums of 32-bit counts: no overflow */
    if (strs == 0 || CP_NAMECACHE_HEADER + (nfunc + nplt) * CP_NAMECACHE_ENTRY + strs != n)
        return CP_EPARSE;
    if (p[n - 1] != 0) return CP_EPARSE; /* every name ends inside the file */
    /* every entry: a start above the one before it in its run, a name offset inside the
     * names (a file that fails here is not used at all: its object is named as if there were
     * no file, never half from it). An empty name (the relay writes none) names nothing at
     * lookup: checking it here read the names' pages, ~40% of libc's file and of this
     * check's cost, in every process. */
    const uint8_t *e = p + CP_NAMECACHE_HEADER;
    for (uint64_t i = 0; i < nfunc + nplt; i++, e += CP_NAMECACHE_ENTRY) {
        uint32_t name = cp_ld32(e + 12);
        if (name >= strs) return CP_EPARSE;
        if (i != 0 && i != nfunc && cp_ld64(e) <= cp_ld64(e - CP_NAMECACHE_ENTRY)) return CP_EPARSE;
    }
    *out = (cp_namecache){.base = p,
                          .size = n,
                          .nfunc = (uint32_t)nfunc,
                          .nplt = (uint32_t)nplt,
                          .strs_len = (uint32_t)strs,
                          .source = p[H_SOURCE]};
    return 0;
}

/* Entry i of the run starting at entry first, n long: its start, end and name offset. */
static void entry(const cp_namecache *c, uint32_t first, uint32_t n, uint32_t i, uint64_t *lo,
                  uint64_t *hi, uint32_t *name)
{
    const uint8_t *e = c->base + CP_NAMECACHE_HEADER + (size_t)(first + i) * CP_NAMECACHE_ENTRY;
    *lo = cp_ld64(e);
    uint32_t size = cp_ld32(e + 8);
    *name = cp_ld32(e + 12);
    if (size != CP_NAMECACHE_TO_NEXT)
        *hi = *lo + size < *lo ? UINT64_MAX : *lo + size;
    else
        *hi = i + 1 < n ? cp_ld64(e + CP_NAMECACHE_ENTRY) : UINT64_MAX;
}

/* The name of the entry of run [first, first + n) holding va, or NULL. */
static const char *run_lookup(const cp_namecache *c, uint32_t first, uint32_t n, uint64_t va,
                              size_t *len)
{
    uint32_t lo = 0, hi = n; /* the last entry with start <= va */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint64_t s =
            cp_ld64(c->base + CP_NAMECACHE_HEADER + (size_t)(first + mid) * CP_NAMECACHE_ENTRY);
        if (s <= va)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return NULL;
    uint64_t s, e;
    uint32_t name;
    entry(c, first, n, lo - 1, &s, &e, &name);
    if (va < s || va >= e || name >= c->strs_len) return NULL; /* checked by parse: kept */
    const char *nm = (const char *)c->base + (c->size - c->strs_len) + name;
    *len = strlen(nm); /* the file's last byte is a NUL */
    return *len ? nm : NULL;
}

const char *cp_namecache_lookup(const cp_namecache *c, uint64_t vaddr, size_t *len)
{
    if (!c || !c->base) return NULL;
    const char *nm = c->nplt ? run_lookup(c, c->nfunc, c->nplt, vaddr, len) : NULL;
    return nm ? nm : run_lookup(c, 0, c->nfunc, vaddr, len);
}

/* ------------------------------------------------------------------------------------
 * The agent's side */

/* A directory or file others could have planted or changed: not the relay's, or writable
 * by someone else. */
static const char *untrusted(const struct stat *st)
{
    if (st->st_uid != 0 && st->st_uid != geteuid()) return "owned by neither root nor this user";
    if (st->st_mode & (S_IWGRP | S_IWOTH)) return "writable by its group or others";
    return NULL;
}

int cp_namecache_dir_open(const char *relay_dir, int *dfd, cp_err *err)
{
    *dfd = -1;
    char path[1100];
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", relay_dir, CP_NAMECACHE_DIR) >= sizeof(path))
        return cp_err_set(err, CP_EIO, "names directory under %s: path too long", relay_dir);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return cp_err_set(err, CP_EIO, "names directory %s: %s", path,
                          errno == ELOOP || errno == ENOTDIR ? "a link or not a directory"
                                                             : strerror(errno));
    struct stat st;
    const char *why = fstat(fd, &st) != 0 ? strerror(errno) : untrusted(&st);
    if (why) {
        close(fd);
        return cp_err_set(err, CP_EIO, "names directory %s: %s: not used", path, why);
    }
    *dfd = fd;
    return 0;
}

int cp_namecache_dir_check(const char *relay_dir, cp_err *err)
{
    char path[1100];
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", relay_dir, CP_NAMECACHE_DIR) >= sizeof(path))
        return cp_err_set(err, CP_EIO, "names directory under %s: path too long", relay_dir);
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT
                   ? CP_ENOTFOUND
                   : cp_err_set(err, CP_EIO, "names directory %s: %s", path, strerror(errno));
    const char *why = !S_ISDIR(st.st_mode) ? "a link or not a directory" : untrusted(&st);
    if (why) return cp_err_set(err, CP_EIO, "names directory %s: %s: not used", path, why);
    return 0;
}

/* Maps the file open on fd (closed here) and checks it. */
static int map_file(int fd, const uint8_t *build_id, uint32_t len, unsigned flags,
                    cp_namecache *out);

int cp_namecache_open_path(const char *relay_dir, const uint8_t *build_id, uint32_t len,
                           unsigned flags, cp_namecache *out)
{
    memset(out, 0, sizeof(*out));
    char name[CP_NAMECACHE_KEY_MAX], path[1100 + CP_NAMECACHE_KEY_MAX];
    if (cp_namecache_key(build_id, len, flags, name) != 0) return CP_ENOTFOUND;
    if ((size_t)snprintf(path, sizeof(path), "%s/%s/%s", relay_dir, CP_NAMECACHE_DIR, name) >=
        sizeof(path))
        return CP_ENOTFOUND;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOENT ? CP_ENOTFOUND : errno == ELOOP ? CP_EPARSE : CP_EIO;
    return map_file(fd, build_id, len, flags, out);
}

int cp_namecache_open(int dfd, const uint8_t *build_id, uint32_t len, unsigned flags,
                      cp_namecache *out)
{
    memset(out, 0, sizeof(*out));
    char name[CP_NAMECACHE_KEY_MAX];
    if (cp_namecache_key(build_id, len, flags, name) != 0) return CP_ENOTFOUND;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOENT ? CP_ENOTFOUND : errno == ELOOP ? CP_EPARSE : CP_EIO;
    return map_file(fd, build_id, len, flags, out);
}

static int map_file(int fd, const uint8_t *build_id, uint32_t len, unsigned flags,
                    cp_namecache *out)
{
    struct stat st;
    int rc = CP_EPARSE;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || untrusted(&st) ||
        st.st_size <= (off_t)CP_NAMECACHE_HEADER || st.st_size > (off_t)CP_NAMECACHE_FILE_MAX)
        goto out;
    /* the file is never changed in place (renamed over): the mapping cannot shrink under us */
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = CP_EIO;
        goto out;
    }
    rc = cp_namecache_parse(m, (size_t)st.st_size, build_id, len, flags, out);
    if (rc == 0) out->mapped = 1;
out:
    if (rc != 0 && m != MAP_FAILED) munmap(m, (size_t)st.st_size);
    close(fd);
    return rc;
}

void cp_namecache_close(cp_namecache *c)
{
    if (c->mapped) munmap((void *)c->base, c->size);
    memset(c, 0, sizeof(*c));
}

/* ------------------------------------------------------------------------------------
 * The relay's side */

static int put32(cp_buf *b, uint32_t v)
{
    return cp_buf_append(b, &v, 4);
}

/* Appends the entries of t's run (plt) to out and their names to strs. */
static int encode_run(const cp_elfnames *t, int plt, cp_buf *out, cp_buf *strs)
{
    uint32_t n = plt ? cp_elfnames_plt_count(t) : cp_elfnames_count(t);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t lo, hi, next = UINT64_MAX, nlo, nhi;
        const char *nm, *nn;
        size_t len, nl;
        if (cp_elfnames_entry(t, plt, i, &lo, &hi, &nm, &len) != 0) return CP_EINVAL;
        if (i + 1 < n && cp_elfnames_entry(t, plt, i + 1, &nlo, &nhi, &nn, &nl) == 0) next = nlo;
        uint32_t size;
        if (hi == next)
            size = CP_NAMECACHE_TO_NEXT;
        else if (hi > lo && hi - lo < CP_NAMECACHE_TO_NEXT)
            size = (uint32_t)(hi - lo);
        else
            return CP_ELIMIT;
        if (strs->len > UINT32_MAX - len - 1) return CP_ELIMIT;
        uint32_t off = (uint32_t)strs->len;
        if (cp_buf_append(out, &lo, 8) || put32(out, size) || put32(out, off) ||
            cp_buf_append(strs, nm, len) || cp_buf_append(strs, "", 1))
            return CP_ENOMEM;
    }
    return 0;
}

int cp_namecache_encode(const cp_elfnames *t, const uint8_t *build_id, uint32_t len, unsigned flags,
                        cp_buf *out)
{
    if (!build_id || len < 2 || len > CP_NAMECACHE_ID_MAX) return CP_EINVAL;
    uint8_t h[CP_NAMECACHE_HEADER] = {0};
    memcpy(h, MAGIC, sizeof(MAGIC));
    uint32_t v = CP_NAMECACHE_VERSION, nf = cp_elfnames_count(t), np = cp_elfnames_plt_count(t);
    memcpy(h + H_VERSION, &v, 4);
    h[H_IDLEN] = (uint8_t)len;
    h[H_FLAGS] = (uint8_t)(flags & CP_NAMECACHE_DEBUG);
    h[H_SOURCE] = (uint8_t)cp_elfnames_source(t);
    memcpy(h + H_NFUNC, &nf, 4);
    memcpy(h + H_NPLT, &np, 4);
    memcpy(h + H_ID, build_id, len);
    cp_buf strs = {0};
    size_t start = out->len;
    int rc = cp_buf_append(out, h, sizeof(h)) ? CP_ENOMEM : 0;
    if (!rc) rc = encode_run(t, 0, out, &strs);
    if (!rc) rc = encode_run(t, 1, out, &strs);
    if (!rc && strs.len == 0 && cp_buf_append(&strs, "", 1)) rc = CP_ENOMEM;
    if (!rc && out->len - start + strs.len > CP_NAMECACHE_FILE_MAX) rc = CP_ELIMIT;
    if (!rc && cp_buf_append(out, strs.data, strs.len)) rc = CP_ENOMEM;
    if (!rc) {
        uint32_t sl = (uint32_t)strs.len;
        memcpy(out->data + start + H_STRS, &sl, 4);
    } else {
        out->len = start;
    }
    cp_buf_close(&strs);
    return rc;
}

int cp_namecache_write(int dfd, const char *name, const uint8_t *data, size_t len, cp_err *err)
{
    char tmp[CP_NAMECACHE_KEY_MAX + 48];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(tmp, sizeof(tmp), ".tmp-%d-%ld-%s", (int)getpid(), (long)ts.tv_nsec, name);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return cp_err_set(err, CP_EIO, "names file %s: %s", tmp, strerror(errno));
    int saved = cp_write_all(fd, data, len);
    /* 0644 whatever the umask: every user's processes read it */
    int ok = !saved && fchmod(fd, 0644) == 0;
    if (!saved) saved = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok || renameat(dfd, tmp, dfd, name) != 0) {
        if (ok) saved = errno;
        unlinkat(dfd, tmp, 0);
        return cp_err_set(err, CP_EIO, "names file %s: %s", name, strerror(saved ? saved : EIO));
    }
    return 0;
}

int cp_namecache_file_build_id(int fd, uint64_t fsize, uint8_t *out, uint32_t *len)
{
    uint32_t n = 0;
    int rc = cp_elf_build_id_fd(fd, fsize, out, CP_NAMECACHE_ID_MAX, &n);
    if (rc == CP_ELIMIT || (rc == 0 && n < 2)) return CP_ENOTFOUND;
    if (rc == 0) *len = n;
    return rc;
}
