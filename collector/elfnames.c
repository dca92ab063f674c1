/* Function names from ELF symbol tables (see elfnames.h): the section headers, one symbol
 * table and its strings are read with pread and checked against the file's size, then
 * only the function symbols are kept, sorted by address, with the string section (read
 * once, its last byte made a NUL, so every name ends inside it). Names are only looked at
 * when a pc is named: copying them all cost more than the rest of the build. */
#include "elfnames.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "vec.h"

/* ------------------------------------------------------------------------------------
 * The table */

typedef struct fsym {
    uint64_t lo, hi; /* [lo, hi) */
    uint32_t name;   /* offset in strs */
    uint8_t rank;    /* which of several symbols at one address names it */
    uint8_t sized;
} fsym;

struct cp_elfnames {
    fsym *f;
    uint32_t n;
    int source;
    char *strs; /* the string section, NUL-terminated */
    size_t strs_len;
};

/* The length of a terminated symbol name without its version ("memcpy@@GLIBC_2.14"). */
static size_t name_len(const char *nm)
{
    size_t len = strlen(nm);
    const char *at = memchr(nm, '@', len);
    return at && at > nm ? (size_t)(at - nm) : len;
}

const char *cp_elfnames_lookup(const cp_elfnames *t, uint64_t vaddr, size_t *len)
{
    if (!t || !t->n) return NULL;
    uint32_t lo = 0, hi = t->n; /* the last entry with f.lo <= vaddr */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->f[mid].lo <= vaddr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return NULL;
    const fsym *s = &t->f[lo - 1];
    if (vaddr >= s->hi) return NULL;
    const char *nm = t->strs + s->name;
    *len = name_len(nm);
    return nm;
}

int cp_elfnames_source(const cp_elfnames *t)
{
    return t ? t->source : 0;
}

uint32_t cp_elfnames_count(const cp_elfnames *t)
{
    return t ? t->n : 0;
}

size_t cp_elfnames_bytes(const cp_elfnames *t)
{
    return t ? sizeof(*t) + (size_t)t->n * sizeof(fsym) + t->strs_len : 0;
}

void cp_elfnames_destroy(cp_elfnames *t)
{
    if (!t) return;
    free(t->f);
    free(t->strs);
    free(t);
}

/* ------------------------------------------------------------------------------------
 * Reading a file */

enum {
    SHT_SYMTAB_ = 2,
    SHT_STRTAB_ = 3,
    SHT_DYNSYM_ = 11,
    STT_FUNC_ = 2,
    STT_GNU_IFUNC_ = 10,
    STB_LOCAL_ = 0,
    STB_GLOBAL_ = 1,
    STB_WEAK_ = 2,
    SYM_BYTES = 24,
    SHDR_BYTES = 64,
    EHDR_BYTES = 64,
};

/* Reads exactly len bytes at off of a file of size fsize; a file that shrank since gives a
 * short read, an error. */
static int read_at(int fd, uint64_t fsize, uint64_t off, uint64_t len, void *out)
{
    if (off > fsize || len > fsize - off) return CP_EPARSE;
    uint8_t *p = out;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return CP_EIO;
        p += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

typedef struct sec {
    uint32_t type, link;
    uint64_t off, size, entsize;
} sec;

/* Whether a names an address better than b: global, then weak, then local; sized
 * before sizeless; then the first in the file. */
static int fsym_better(const fsym *a, const fsym *b)
{
    if (a->rank != b->rank) return a->rank > b->rank;
    return a->sized > b->sized;
}

/* Sorts f[0..n) by lo, stably (LSD radix, 11 bits a pass, passes whose digit is the same
 * for every entry skipped): qsort took half of a table's build on cc1's 26k functions. */
static int sort_by_lo(fsym *f, uint32_t n)
{
    fsym *tmp = malloc((size_t)n * sizeof(fsym));
    if (!tmp) return CP_ENOMEM;
    uint64_t all_or = 0;
    for (uint32_t i = 0; i < n; i++)
        all_or |= f[i].lo;
    fsym *src = f, *dst = tmp;
    for (unsigned shift = 0; shift < 64 && (all_or >> shift); shift += 11) {
        uint32_t count[2048] = {0};
        for (uint32_t i = 0; i < n; i++)
            count[(src[i].lo >> shift) & 2047]++;
        if (count[(src[0].lo >> shift) & 2047] == n) continue; /* one digit: in order */
        uint32_t sum = 0;
        for (uint32_t d = 0; d < 2048; d++) {
            uint32_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (uint32_t i = 0; i < n; i++)
            dst[count[(src[i].lo >> shift) & 2047]++] = src[i];
        fsym *x = src;
        src = dst;
        dst = x;
    }
    if (src != f) memcpy(f, src, (size_t)n * sizeof(fsym));
    free(tmp);
    return 0;
}

/* Builds t from symbol section s of a file: its function symbols, names from strtab. */
static int build_table(int fd, uint64_t fsize, const sec *s, const sec *strs, cp_elfnames *t)
{
    if (s->entsize != SYM_BYTES || s->size % SYM_BYTES) return CP_EPARSE;
    if (s->size > CP_ELFNAMES_MAX_SECTION || strs->size > CP_ELFNAMES_MAX_SECTION) return CP_ELIMIT;
    if (s->off > fsize || s->size > fsize - s->off) return CP_EPARSE; /* chunks stay inside */
    uint64_t nsym = s->size / SYM_BYTES;
    if (nsym == 0 || strs->size == 0) return CP_ENOTFOUND;
    int rc = CP_ENOMEM;
    /* the symbols are read in chunks into one small buffer (fewer fresh pages to fault in
     * than the whole section); the strings are kept */
    enum { CHUNK = 2048 };
    uint8_t *syms = malloc((size_t)CHUNK * SYM_BYTES);
    char *str = malloc(strs->size);
    fsym *f = NULL;
    if (!syms || !str) goto out;
    if ((rc = read_at(fd, fsize, strs->off, strs->size, str)) != 0) goto out;

    /* pass 1: the functions, with their names' offsets in str */
    uint32_t n = 0;
    f = malloc(nsym * sizeof(fsym));
    if (!f) {
        rc = CP_ENOMEM;
        goto out;
    }
    for (uint64_t i = 0; i < nsym; i++) {
        if (i % CHUNK == 0) {
            uint64_t c = nsym - i < CHUNK ? nsym - i : CHUNK;
            if ((rc = read_at(fd, fsize, s->off + i * SYM_BYTES, c * SYM_BYTES, syms)) != 0)
                goto out;
        }
        const uint8_t *p = syms + (i % CHUNK) * SYM_BYTES;
        uint32_t name = cp_ld32(p);
        uint8_t info = p[4];
        uint16_t shndx = cp_ld16(p + 6);
        uint64_t value = cp_ld64(p + 8), size = cp_ld64(p + 16);
        int type = info & 0xf, bind = info >> 4;
        if (type != STT_FUNC_ && type != STT_GNU_IFUNC_) continue;
        if (shndx == 0 || value == 0 || name == 0 || name >= strs->size) continue;
        if (value + size < value) continue;
        f[n] = (fsym){.lo = value,
                      .hi = value + size,
                      .name = name,
                      .rank = bind == STB_GLOBAL_ ? 2
                              : bind == STB_WEAK_ ? 1
                                                  : 0,
                      .sized = size > 0};
        n++;
    }
    if (n == 0) {
        rc = CP_ENOTFOUND;
        goto out;
    }
    if ((rc = sort_by_lo(f, n)) != 0) goto out;
    /* pass 2: one symbol per address, the best; sizeless ones reach the next */
    str[strs->size - 1] = 0; /* every name ends inside the section */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (str[f[i].name] == 0) continue;
        if (k && f[k - 1].lo == f[i].lo) {
            if (fsym_better(&f[i], &f[k - 1])) f[k - 1] = f[i];
            continue;
        }
        f[k++] = f[i];
    }
    if (k == 0) {
        rc = CP_ENOTFOUND;
        goto out;
    }
    for (uint32_t i = 0; i < k; i++) {
        uint64_t next = i + 1 < k ? f[i + 1].lo : UINT64_MAX;
        if (!f[i].sized || f[i].hi > next) f[i].hi = next;
    }
    fsym *shrunk = realloc(f, (size_t)k * sizeof(fsym));
    if (shrunk) f = shrunk;
    t->f = f;
    t->n = k;
    t->strs = str;
    t->strs_len = strs->size;
    str = NULL;
    f = NULL;
    rc = 0;
out:
    free(syms);
    free(str);
    free(f);
    return rc;
}

/* What is done with a symbol section: build a table (t), or name the sorted addresses
 * va[0..n) into names (scan). */
typedef struct job {
    cp_elfnames *t;
    const uint64_t *va;
    uint32_t n;
    char **names;
} job;

/* The first index of va[0..n) (ascending) with va[i] >= x. */
static uint32_t lower_bound(const uint64_t *va, uint32_t n, uint64_t x)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (va[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The name at off of the string section, read with pread (its end found within 64 KiB and
 * the section), without its version; malloc'd, or NULL. */
static char *read_name(int fd, uint64_t fsize, const sec *strs, uint64_t off)
{
    char stack[256];
    uint64_t max = strs->size - off, want = sizeof(stack);
    char *buf = stack;
    for (;;) {
        uint64_t len = want < max ? want : max;
        if (read_at(fd, fsize, strs->off + off, len, buf) != 0) break;
        const char *end = memchr(buf, 0, len);
        if (end) {
            char *r = end > buf ? strndup(buf, name_len(buf)) : NULL;
            if (buf != stack) free(buf);
            return r;
        }
        if (len == max || want >= ((uint64_t)64 << 10)) break; /* not terminated */
        want *= 8;
        char *nb = buf == stack ? malloc(want) : realloc(buf, want);
        if (!nb) break;
        buf = nb;
    }
    if (buf != stack) free(buf);
    return NULL;
}

/* One pass over symbol section s: for each address of j->va, the function symbol with the
 * greatest start at or below it (the best one at that start, as in a table), if it holds
 * the address (sizeless: up to the next symbol). No sort, no copy of the strings: the
 * names of the winners only are read. */
static int scan_names(int fd, uint64_t fsize, const sec *s, const sec *strs, const job *j)
{
    if (s->entsize != SYM_BYTES || s->size % SYM_BYTES) return CP_EPARSE;
    if (s->off > fsize || s->size > fsize - s->off) return CP_EPARSE;
    if (strs->off > fsize || strs->size > fsize - strs->off) return CP_EPARSE;
    if (s->size > CP_ELFNAMES_MAX_SECTION) return CP_ELIMIT;
    uint64_t nsym = s->size / SYM_BYTES;
    if (nsym == 0 || strs->size == 0 || j->n == 0) return CP_ENOTFOUND;
    enum { CHUNK = 2048 };
    uint8_t *syms = malloc((size_t)CHUNK * SYM_BYTES);
    fsym *best = calloc(j->n, sizeof(fsym)); /* hi == 0: none */
    int rc = CP_ENOMEM;
    if (!syms || !best) goto out;
    for (uint64_t i = 0; i < nsym; i++) {
        if (i % CHUNK == 0) {
            uint64_t c = nsym - i < CHUNK ? nsym - i : CHUNK;
            if ((rc = read_at(fd, fsize, s->off + i * SYM_BYTES, c * SYM_BYTES, syms)) != 0)
                goto out;
        }
        const uint8_t *p = syms + (i % CHUNK) * SYM_BYTES;
        uint32_t name = cp_ld32(p);
        uint8_t info = p[4];
        uint64_t value = cp_ld64(p + 8), size = cp_ld64(p + 16);
        int type = info & 0xf, bind = info >> 4;
        if (type != STT_FUNC_ && type != STT_GNU_IFUNC_) continue;
        if (value > j->va[j->n - 1]) continue; /* above every address: most symbols */
        if (cp_ld16(p + 6) == 0 || value == 0 || name == 0 || name >= strs->size) continue;
        if (value + size < value) continue;
        uint32_t k = lower_bound(j->va, j->n, value);
        if (k == j->n) continue;
        fsym c = {.lo = value,
                  .hi = size ? value + size : UINT64_MAX,
                  .name = name,
                  .rank = bind == STB_GLOBAL_ ? 2
                          : bind == STB_WEAK_ ? 1
                                              : 0,
                  .sized = size > 0};
        fsym *b = &best[k];
        if (!b->hi || c.lo > b->lo || (c.lo == b->lo && fsym_better(&c, b))) *b = c;
    }
    /* best[k] so far: the greatest start in (va[k-1], va[k]]; carried forward, the greatest
     * at or below va[k] */
    for (uint32_t k = 1; k < j->n; k++)
        if (!best[k].hi) best[k] = best[k - 1];
    for (uint32_t k = 0; k < j->n; k++) {
        if (!best[k].hi || j->va[k] >= best[k].hi) continue;
        if (k && best[k - 1].hi && best[k - 1].lo == best[k].lo && j->va[k - 1] < best[k - 1].hi)
            j->names[k] = j->names[k - 1] ? strdup(j->names[k - 1]) : NULL;
        else
            j->names[k] = read_name(fd, fsize, strs, best[k].name);
    }
    rc = 0;
out:
    free(syms);
    free(best);
    return rc;
}

/* Reads the section of type want (SHT_SYMTAB_ or SHT_DYNSYM_) of the ELF at path for j. */
static int read_file(const char *path, uint32_t want, const job *j)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOMEM ? CP_ENOMEM : CP_ENOTFOUND;
    int rc = CP_EPARSE;
    uint8_t *shdrs = NULL;
    struct stat st;
    uint8_t eh[EHDR_BYTES];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) goto out;
    uint64_t fsize = (uint64_t)st.st_size;
    if (read_at(fd, fsize, 0, EHDR_BYTES, eh) != 0) goto out;
    /* 64-bit, little-endian, version 1 */
    if (memcmp(eh, "\177ELF", 4) != 0 || eh[4] != 2 || eh[5] != 1 || eh[6] != 1) goto out;
    uint64_t shoff = cp_ld64(eh + 0x28);
    uint16_t shentsize = cp_ld16(eh + 0x3a), shnum = cp_ld16(eh + 0x3c);
    if (shoff == 0 || shnum == 0 || shentsize != SHDR_BYTES) goto out;
    if ((rc = CP_ENOMEM, !(shdrs = malloc((size_t)shnum * SHDR_BYTES)))) goto out;
    if ((rc = read_at(fd, fsize, shoff, (uint64_t)shnum * SHDR_BYTES, shdrs)) != 0) goto out;
    rc = CP_ENOTFOUND;
    for (uint32_t i = 0; i < shnum; i++) {
        const uint8_t *h = shdrs + (size_t)i * SHDR_BYTES;
        sec s = {.type = cp_ld32(h + 4),
                 .off = cp_ld64(h + 0x18),
                 .size = cp_ld64(h + 0x20),
                 .link = cp_ld32(h + 0x28),
                 .entsize = cp_ld64(h + 0x38)};
        if (s.type != want) continue;
        if (s.link == 0 || s.link >= shnum || s.link == i) {
            rc = CP_EPARSE;
            break;
        }
        const uint8_t *lh = shdrs + (size_t)s.link * SHDR_BYTES;
        sec strs = {.type = cp_ld32(lh + 4), .off = cp_ld64(lh + 0x18), .size = cp_ld64(lh + 0x20)};
        if (strs.type != SHT_STRTAB_) {
            rc = CP_EPARSE;
            break;
        }
        rc = j->t ? build_table(fd, fsize, &s, &strs, j->t) : scan_names(fd, fsize, &s, &strs, j);
        break; /* one table of a type per file */
    }
out:
    free(shdrs);
    close(fd);
    return rc;
}

/* Runs j on the first source that has function symbols (see elfnames.h); returns which
 * source in *source. */
static int run_job(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                   const char *debug_dir, const job *j, int *source)
{
    int rc = CP_ENOTFOUND;
    if (debug_dir && build_id_len >= 2 && build_id_len <= 64) {
        static const char hex[] = "0123456789abcdef";
        char id[2 * 64 + 1];
        for (uint32_t i = 0; i < build_id_len; i++) {
            id[2 * i] = hex[build_id[i] >> 4];
            id[2 * i + 1] = hex[build_id[i] & 15];
        }
        id[2 * build_id_len] = 0;
        char dpath[4096];
        int n = snprintf(dpath, sizeof(dpath), "%s/.build-id/%.2s/%s.debug", debug_dir, id, id + 2);
        if (n > 0 && (size_t)n < sizeof(dpath)) {
            rc = read_file(dpath, SHT_SYMTAB_, j);
            if (rc == 0) *source = CP_ELFNAMES_DEBUG_SYMTAB;
        }
    }
    if (rc != 0 && rc != CP_ENOMEM) {
        rc = read_file(path, SHT_SYMTAB_, j);
        if (rc == 0) *source = CP_ELFNAMES_SYMTAB;
    }
    if (rc != 0 && rc != CP_ENOMEM && rc != CP_EPARSE) {
        rc = read_file(path, SHT_DYNSYM_, j);
        if (rc == 0) *source = CP_ELFNAMES_DYNSYM;
    }
    return rc;
}

int cp_elfnames_create(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                       const char *debug_dir, cp_elfnames **out)
{
    *out = NULL;
    cp_elfnames *t = calloc(1, sizeof(*t));
    if (!t) return CP_ENOMEM;
    job j = {.t = t};
    int rc = run_job(path, build_id, build_id_len, debug_dir, &j, &t->source);
    if (rc != 0) {
        cp_elfnames_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int cp_elfnames_scan(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                     const char *debug_dir, const uint64_t *vaddrs, uint32_t n, char **names)
{
    for (uint32_t i = 0; i < n; i++)
        names[i] = NULL;
    for (uint32_t i = 1; i < n; i++)
        if (vaddrs[i] <= vaddrs[i - 1]) return CP_EINVAL;
    job j = {.va = vaddrs, .n = n, .names = names};
    int source = 0;
    int rc = run_job(path, build_id, build_id_len, debug_dir, &j, &source);
    if (rc != 0)
        for (uint32_t i = 0; i < n; i++) {
            free(names[i]);
            names[i] = NULL;
        }
    return rc;
}
