/* Function names from ELF symbol tables (see elfnames.h): the section headers, one symbol
 * table and its strings are read with pread and checked against the file's size, then
 * only the function symbols are kept, sorted by address, with the string section (read
 * once, its last byte made a NUL, so every name ends inside it). Names are only looked at
 * when a pc is named: copying them all cost more than the rest of the build. */
#include "elfnames.h"
#include "guard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elfplt.h"
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

/* A PLT stub: [lo, hi), its name at name of plt_strs ("memcpy@plt" or "[plt]"). */
typedef struct pltsym {
    uint64_t lo, hi;
    uint32_t name;
} pltsym;

struct cp_elfnames {
    fsym *f;
    uint32_t n;
    int source;
    char *strs; /* the string section, NUL-terminated */
    size_t strs_len;
    pltsym *plt; /* sorted, apart from f: they win over a sizeless symbol before them */
    uint32_t nplt;
    char *plt_strs;
    size_t plt_strs_len;
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
    if (t && t->nplt && vaddr >= t->plt[0].lo && vaddr < t->plt[t->nplt - 1].hi) {
        uint32_t lo = 0, hi = t->nplt;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (t->plt[mid].lo <= vaddr)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo && vaddr < t->plt[lo - 1].hi) {
            const char *nm = t->plt_strs + t->plt[lo - 1].name;
            *len = strlen(nm); /* "@plt" is part of the name */
            return nm;
        }
    }
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

uint32_t cp_elfnames_plt_count(const cp_elfnames *t)
{
    return t ? t->nplt : 0;
}

int cp_elfnames_entry(const cp_elfnames *t, int plt, uint32_t i, uint64_t *lo, uint64_t *hi,
                      const char **name, size_t *len)
{
    if (!t || i >= (plt ? t->nplt : t->n)) return CP_EINVAL;
    if (plt) {
        *lo = t->plt[i].lo;
        *hi = t->plt[i].hi;
        *name = t->plt_strs + t->plt[i].name;
        *len = strlen(*name); /* "@plt" is part of the name, as in cp_elfnames_lookup */
    } else {
        *lo = t->f[i].lo;
        *hi = t->f[i].hi;
        *name = t->strs + t->f[i].name;
        *len = name_len(*name);
    }
    return 0;
}

size_t cp_elfnames_bytes(const cp_elfnames *t)
{
    return t ? sizeof(*t) + (size_t)t->n * sizeof(fsym) + t->strs_len +
                   (size_t)t->nplt * sizeof(pltsym) + t->plt_strs_len
             : 0;
}

void cp_elfnames_destroy(cp_elfnames *t)
{
    if (!t) return;
    free(t->f);
    free(t->strs);
    free(t->plt);
    free(t->plt_strs);
    free(t);
}

/* ------------------------------------------------------------------------------------
 * Reading a file */

enum {
    SHT_SYMTAB_ = 2,
    SHT_STRTAB_ = 3,
    SHT_DYNSYM_ = 11,
    SHT_PROGBITS_ = 1,
    SHT_RELA_ = 4,
    RELA_BYTES = 24,
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
    enum { CHUNK = 512 }; /* 12 KiB: each page of a bigger buffer was a fault in a short process */
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

/* ------------------------------------------------------------------------------------
 * PLT stubs (model/elfplt.h): named `func@plt` from the object itself (its .plt sections,
 * relocations and .dynsym are allocated, so present in stripped files; a debug file has
 * them as NOBITS), as binutils does: the stub's `jmp *GOT` slot, then the JUMP_SLOT or
 * GLOB_DAT relocation of that slot, then its symbol. */

#define PLT_SECS 4
#define PLT_BYTES_MAX ((uint64_t)4 << 20) /* a stub section larger than this: all "[plt]" */

struct plt_slot {
    uint64_t got;
    uint32_t sym;
};

typedef struct plt_src {
    int fd;
    uint64_t fsize;
    struct {
        uint64_t addr, off, size;
        uint32_t ent;
    } sec[PLT_SECS];
    uint32_t nsec;
    sec rela[2], dynsym, dynstr; /* .rela.plt, .rela.dyn (type 0: none) */
    struct plt_slot *slot;       /* GOT slots with a named symbol, sorted by slot */
    uint32_t nslot;
    int relocs_read;
    /* .dynsym and .dynstr read whole when small (a pread per stub cost 10x the table) */
    uint8_t *dynsym_bytes;
    char *dynstr_bytes;
} plt_src;

#define PLT_DYN_WHOLE_MAX ((uint64_t)4 << 20)

static void plt_close(plt_src *p)
{
    if (p->fd >= 0) close(p->fd);
    free(p->slot);
    free(p->dynsym_bytes);
    free(p->dynstr_bytes);
    memset(p, 0, sizeof(*p));
    p->fd = -1;
}

/* Opens path and finds its stub sections; 0, or CP_ENOTFOUND (none, or not a readable ELF). */
static int plt_open(const char *path, plt_src *p)
{
    memset(p, 0, sizeof(*p));
    p->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (p->fd < 0) return CP_ENOTFOUND;
    uint8_t eh[EHDR_BYTES], *shdrs = NULL;
    char *names = NULL;
    struct stat st;
    int rc = CP_ENOTFOUND;
    if (fstat(p->fd, &st) != 0 || !S_ISREG(st.st_mode)) goto out;
    p->fsize = (uint64_t)st.st_size;
    if (read_at(p->fd, p->fsize, 0, EHDR_BYTES, eh) != 0) goto out;
    if (memcmp(eh, "\177ELF", 4) != 0 || eh[4] != 2 || eh[5] != 1 || cp_ld16(eh + 0x12) != 62)
        goto out; /* 64-bit little-endian x86-64 only */
    uint64_t shoff = cp_ld64(eh + 0x28);
    uint16_t shentsize = cp_ld16(eh + 0x3a), shnum = cp_ld16(eh + 0x3c),
             shstrndx = cp_ld16(eh + 0x3e);
    if (shoff == 0 || shnum == 0 || shentsize != SHDR_BYTES || shstrndx >= shnum) goto out;
    if (!(shdrs = malloc((size_t)shnum * SHDR_BYTES)) ||
        read_at(p->fd, p->fsize, shoff, (uint64_t)shnum * SHDR_BYTES, shdrs) != 0)
        goto out;
    const uint8_t *sh = shdrs + (size_t)shstrndx * SHDR_BYTES;
    uint64_t noff = cp_ld64(sh + 0x18), nsize = cp_ld64(sh + 0x20);
    if (nsize == 0 || nsize > (1u << 20) || !(names = malloc(nsize)) ||
        read_at(p->fd, p->fsize, noff, nsize, names) != 0)
        goto out;
    names[nsize - 1] = 0;
    for (uint32_t i = 0; i < shnum; i++) {
        const uint8_t *h = shdrs + (size_t)i * SHDR_BYTES;
        uint32_t nm = cp_ld32(h), type = cp_ld32(h + 4), link = cp_ld32(h + 0x28);
        if (nm >= nsize) continue;
        const char *name = names + nm;
        sec s = {.type = type,
                 .off = cp_ld64(h + 0x18),
                 .size = cp_ld64(h + 0x20),
                 .link = link,
                 .entsize = cp_ld64(h + 0x38)};
        uint32_t ent = type == SHT_PROGBITS_ ? cp_plt_entry_size(name, s.entsize) : 0;
        if (ent && p->nsec < PLT_SECS && s.size >= ent &&
            cp_ld64(h + 0x10) + s.size > cp_ld64(h + 0x10)) {
            p->sec[p->nsec].addr = cp_ld64(h + 0x10);
            p->sec[p->nsec].off = s.off;
            p->sec[p->nsec].size = s.size;
            p->sec[p->nsec++].ent = ent;
        }
        int r = !strcmp(name, ".rela.plt") ? 0 : !strcmp(name, ".rela.dyn") ? 1 : -1;
        if (r >= 0 && type == SHT_RELA_ && s.entsize == RELA_BYTES && link < shnum) {
            p->rela[r] = s;
            const uint8_t *d = shdrs + (size_t)link * SHDR_BYTES;
            uint32_t dl = cp_ld32(d + 0x28);
            if (cp_ld32(d + 4) == SHT_DYNSYM_ && dl < shnum && !p->dynsym.type) {
                const uint8_t *ds = shdrs + (size_t)dl * SHDR_BYTES;
                p->dynsym = (sec){.type = SHT_DYNSYM_,
                                  .off = cp_ld64(d + 0x18),
                                  .size = cp_ld64(d + 0x20),
                                  .entsize = cp_ld64(d + 0x38)};
                p->dynstr = (sec){
                    .type = cp_ld32(ds + 4), .off = cp_ld64(ds + 0x18), .size = cp_ld64(ds + 0x20)};
            }
        }
    }
    rc = p->nsec ? 0 : CP_ENOTFOUND;
out:
    free(shdrs);
    free(names);
    if (rc != 0) plt_close(p);
    return rc;
}

/* The section of p holding va, or -1. */
static int plt_sec_of(const plt_src *p, uint64_t va)
{
    for (uint32_t i = 0; i < p->nsec; i++)
        if (va >= p->sec[i].addr && va - p->sec[i].addr < p->sec[i].size) return (int)i;
    return -1;
}

static int slot_cmp(const void *a, const void *b)
{
    const struct plt_slot *x = a, *y = b;
    return x->got < y->got ? -1 : x->got > y->got;
}

/* Reads the GOT slots named by .rela.plt (and .rela.dyn when there is a .plt.got). */
static int plt_read_relocs(plt_src *p)
{
    p->relocs_read = 1;
    int want_dyn = 0;
    for (uint32_t i = 0; i < p->nsec; i++)
        want_dyn |= p->sec[i].ent == 8 || p->sec[i].ent == 16;
    enum { CHUNK = 2048 };
    uint8_t *buf = malloc((size_t)CHUNK * RELA_BYTES);
    if (!buf) return CP_ENOMEM;
    uint32_t cap = 0;
    for (int r = 0; r < 2; r++) {
        const sec *s = &p->rela[r];
        if (!s->type || (r == 1 && !want_dyn) || s->size > CP_ELFNAMES_MAX_SECTION) continue;
        uint64_t n = s->size / RELA_BYTES;
        for (uint64_t i = 0; i < n; i++) {
            if (i % CHUNK == 0) {
                uint64_t c = n - i < CHUNK ? n - i : CHUNK;
                if (read_at(p->fd, p->fsize, s->off + i * RELA_BYTES, c * RELA_BYTES, buf) != 0)
                    break;
            }
            const uint8_t *e = buf + (i % CHUNK) * RELA_BYTES;
            uint64_t info = cp_ld64(e + 8);
            if (!cp_plt_reloc_names_slot((uint32_t)info) || !(info >> 32)) continue;
            if (p->nslot == cap) {
                uint32_t nc = cap ? cap * 2 : 256;
                struct plt_slot *g = realloc(p->slot, nc * sizeof(*g));
                if (!g) {
                    free(buf);
                    return CP_ENOMEM;
                }
                p->slot = g;
                cap = nc;
            }
            p->slot[p->nslot].got = cp_ld64(e);
            p->slot[p->nslot++].sym = (uint32_t)(info >> 32);
        }
    }
    free(buf);
    if (p->nslot) qsort(p->slot, p->nslot, sizeof(*p->slot), slot_cmp);
    if (p->nslot > 16 && p->dynsym.size <= PLT_DYN_WHOLE_MAX &&
        p->dynstr.size <= PLT_DYN_WHOLE_MAX && p->dynstr.size > 0) {
        p->dynsym_bytes = malloc(p->dynsym.size);
        p->dynstr_bytes = malloc(p->dynstr.size);
        if (!p->dynsym_bytes || !p->dynstr_bytes ||
            read_at(p->fd, p->fsize, p->dynsym.off, p->dynsym.size, p->dynsym_bytes) != 0 ||
            read_at(p->fd, p->fsize, p->dynstr.off, p->dynstr.size, p->dynstr_bytes) != 0) {
            free(p->dynsym_bytes);
            free(p->dynstr_bytes);
            p->dynsym_bytes = NULL;
            p->dynstr_bytes = NULL;
        } else {
            p->dynstr_bytes[p->dynstr.size - 1] = 0;
        }
    }
    return 0;
}

/* The name of the stub whose bytes are e[0..n) at addr: "func@plt" (malloc'd) or NULL
 * (CP_PLT_UNNAMED). */
static char *plt_stub_name(plt_src *p, const uint8_t *e, size_t n, uint64_t addr)
{
    uint64_t got;
    if (cp_plt_entry_got(e, n, addr, &got) != 0) return NULL;
    if (!p->relocs_read && plt_read_relocs(p) != 0) return NULL;
    uint32_t lo = 0, hi = p->nslot;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->slot[mid].got < got)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == p->nslot || p->slot[lo].got != got) return NULL;
    uint8_t sym[SYM_BYTES];
    uint64_t at = (uint64_t)p->slot[lo].sym * SYM_BYTES;
    if (p->dynsym.entsize != SYM_BYTES || p->dynstr.type != SHT_STRTAB_ ||
        (uint64_t)p->slot[lo].sym >= p->dynsym.size / SYM_BYTES)
        return NULL;
    if (p->dynsym_bytes)
        memcpy(sym, p->dynsym_bytes + at, SYM_BYTES);
    else if (read_at(p->fd, p->fsize, p->dynsym.off + at, SYM_BYTES, sym) != 0)
        return NULL;
    uint32_t nm = cp_ld32(sym);
    if (nm == 0 || nm >= p->dynstr.size) return NULL;
    char *base = p->dynstr_bytes ? NULL : read_name(p->fd, p->fsize, &p->dynstr, nm);
    const char *b = p->dynstr_bytes ? p->dynstr_bytes + nm : base;
    if (!b) return NULL;
    size_t bl = name_len(b);
    char *full = bl ? malloc(bl + 5) : NULL;
    if (full) {
        memcpy(full, b, bl);
        memcpy(full + bl, "@plt", 5);
    }
    free(base);
    return full;
}

/* The stub holding va (section k of p): its name, malloc'd ("[plt]" when unknown). */
static char *plt_name_at(plt_src *p, int k, uint64_t va)
{
    uint64_t ent = p->sec[k].ent, idx = (va - p->sec[k].addr) / ent;
    uint8_t e[16];
    char *nm = NULL;
    if ((idx + 1) * ent <= p->sec[k].size &&
        read_at(p->fd, p->fsize, p->sec[k].off + idx * ent, ent, e) == 0)
        nm = plt_stub_name(p, e, ent, p->sec[k].addr + idx * ent);
    return nm ? nm : strdup(CP_PLT_UNNAMED);
}

/* Adds the stubs of path to t (one entry per stub, an unnamed run as one "[plt]"). */
static int plt_table(const char *path, cp_elfnames *t)
{
    plt_src p;
    if (plt_open(path, &p) != 0) return 0;
    cp_buf strs = {0};
    pltsym *v = NULL;
    uint32_t n = 0, cap = 0;
    int rc = 0;
    uint8_t *bytes = NULL;
    for (uint32_t k = 0; k < p.nsec && rc == 0; k++) {
        uint64_t size = p.sec[k].size, ent = p.sec[k].ent;
        if (size > PLT_BYTES_MAX || !(bytes = malloc(size)) ||
            read_at(p.fd, p.fsize, p.sec[k].off, size, bytes) != 0) {
            free(bytes);
            bytes = NULL;
            /* unreadable (or a hostile size): one "[plt]" over the section, not a loop */
            ent = size;
        }
        for (uint64_t off = 0; off + ent <= size && rc == 0; off += ent) {
            uint64_t a = p.sec[k].addr + off;
            char *nm = bytes ? plt_stub_name(&p, bytes + off, ent, a) : NULL;
            const char *use = nm ? nm : CP_PLT_UNNAMED;
            if (!nm && n && v[n - 1].hi == a &&
                !strcmp((const char *)strs.data + v[n - 1].name, use)) {
                v[n - 1].hi = a + ent; /* a run of unnamed stubs */
                continue;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                pltsym *nv = realloc(v, cap * sizeof(pltsym));
                if (!nv)
                    rc = CP_ENOMEM;
                else
                    v = nv;
            }
            if (rc == 0) {
                v[n++] = (pltsym){.lo = a, .hi = a + ent, .name = (uint32_t)strs.len};
                if (cp_buf_append(&strs, use, strlen(use) + 1) != 0) rc = CP_ENOMEM;
            }
            free(nm);
        }
        free(bytes);
        bytes = NULL;
    }
    plt_close(&p);
    if (rc != 0 || n == 0) {
        free(v);
        cp_buf_close(&strs);
        return rc;
    }
    /* sections in address order (a table is searched as one sorted array) */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j && v[j - 1].lo > v[j].lo; j--) {
            pltsym x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    t->plt = v;
    t->nplt = n;
    size_t len;
    t->plt_strs = (char *)cp_buf_steal(&strs, &len);
    t->plt_strs_len = len;
    return 0;
}

/* Names the addresses of vaddrs[0..n) that fall in stubs of path, replacing names[i]. */
static void plt_scan(const char *path, const uint64_t *vaddrs, uint32_t n, char **names)
{
    plt_src p;
    if (plt_open(path, &p) != 0) return;
    for (uint32_t i = 0; i < n; i++) {
        int k = plt_sec_of(&p, vaddrs[i]);
        if (k < 0) continue;
        char *nm = plt_name_at(&p, k, vaddrs[i]);
        if (!nm) continue;
        free(names[i]);
        names[i] = nm;
    }
    plt_close(&p);
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
    CP_ASSERT_AGENT_THREAD();
    *out = NULL;
    cp_elfnames *t = calloc(1, sizeof(*t));
    if (!t) return CP_ENOMEM;
    job j = {.t = t};
    int rc = run_job(path, build_id, build_id_len, debug_dir, &j, &t->source);
    if (rc == 0) rc = plt_table(path, t);
    if (rc != 0) {
        cp_elfnames_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int cp_elfnames_scan(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                     const char *debug_dir, const uint64_t *vaddrs, uint32_t n, char **names,
                     int *source_out)
{
    CP_ASSERT_AGENT_THREAD();
    for (uint32_t i = 0; i < n; i++)
        names[i] = NULL;
    for (uint32_t i = 1; i < n; i++)
        if (vaddrs[i] <= vaddrs[i - 1]) return CP_EINVAL;
    job j = {.va = vaddrs, .n = n, .names = names};
    int source = 0;
    int rc = run_job(path, build_id, build_id_len, debug_dir, &j, &source);
    if (rc == 0) plt_scan(path, vaddrs, n, names);
    if (source_out) *source_out = rc == 0 ? source : 0;
    if (rc != 0)
        for (uint32_t i = 0; i < n; i++) {
            free(names[i]);
            names[i] = NULL;
        }
    return rc;
}
