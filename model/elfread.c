/* The one ELF symbol layer (elfread.h): the reader's two back ends, the header walk, function
 * symbols and PLT stubs. */
#include "elfread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elfplt.h"
#include "vec.h"

enum {
    EHDR_BYTES = 64,
    SHDR_BYTES = 64,
    PHDR_BYTES = 56,
    SYM_BYTES = 24,
    RELA_BYTES = 24,
    STT_FUNC_ = 2,
    STT_GNU_IFUNC_ = 10,
    STB_GLOBAL_ = 1,
    STB_WEAK_ = 2,
    NT_GNU_BUILD_ID_ = 3,
    EM_X86_64_ = 62,
};

#define NAMES_MAX ((uint64_t)1 << 20)         /* section name table read at most */
#define PLT_DYN_WHOLE_MAX ((uint64_t)4 << 20) /* .dynsym/.dynstr read whole up to this */
#define RELA_MAX ((uint64_t)64 << 20)         /* relocation sections read at most */

/* ------------------------------------------------------------------------------------
 * The reader */

int cp_elf_read(const cp_elf *e, uint64_t off, uint64_t len, void *out)
{
    if (off > e->size || len > e->size - off) return CP_EPARSE;
    if (e->mem) {
        memcpy(out, e->mem + off, len);
        return 0;
    }
    uint8_t *p = out;
    while (len) {
        ssize_t r = pread(e->fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return CP_EIO; /* a file that shrank since its size was taken */
        p += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

const uint8_t *cp_elf_view(const cp_elf *e, uint64_t off, uint64_t len, void *scratch)
{
    if (off > e->size || len > e->size - off) return NULL;
    if (e->mem) return e->mem + off;
    return cp_elf_read(e, off, len, scratch) == 0 ? scratch : NULL;
}

const char *cp_elf_strtab(const cp_elf *e, const cp_elf_sec *s, char **owned, int *rc)
{
    *owned = NULL;
    *rc = CP_EPARSE;
    if (s->size == 0 || s->off > e->size || s->size > e->size - s->off) return NULL;
    if (e->mem && e->mem[s->off + s->size - 1] == 0) {
        *rc = 0;
        return (const char *)e->mem + s->off;
    }
    char *t = malloc(s->size);
    if (!t) {
        *rc = CP_ENOMEM;
        return NULL;
    }
    if ((*rc = cp_elf_read(e, s->off, s->size, t)) != 0) {
        free(t);
        return NULL;
    }
    t[s->size - 1] = 0; /* every name ends inside the section */
    *owned = t;
    return t;
}

/* ------------------------------------------------------------------------------------
 * The header walk */

static int open_common(cp_elf *e, cp_err *err)
{
    uint8_t eh[EHDR_BYTES];
    if (e->size < 4 || cp_elf_read(e, 0, 4, eh) != 0 || memcmp(eh, "\177ELF", 4) != 0)
        return cp_err_set(err, CP_EPARSE,
                          "not an ELF file (it does not start with the ELF magic 7f 45 4c 46)");
    if (e->size < EHDR_BYTES)
        return cp_err_set(err, CP_EPARSE,
                          "truncated ELF: %llu bytes, the ELF header alone needs 64",
                          (unsigned long long)e->size);
    int rc = cp_elf_read(e, 0, EHDR_BYTES, eh);
    if (rc) return cp_err_set(err, rc, "cannot read the ELF header");
    if (eh[4] != 2 || eh[5] != 1)
        return cp_err_set(err, CP_EPARSE,
                          "unsupported ELF: only 64-bit little-endian objects are read "
                          "(class %u, data %u)",
                          eh[4], eh[5]);
    e->machine = cp_ld16(eh + 0x12);
    e->phoff = cp_ld64(eh + 0x20);
    uint64_t shoff = cp_ld64(eh + 0x28);
    uint16_t phentsize = cp_ld16(eh + 0x36), shentsize = cp_ld16(eh + 0x3a);
    e->phnum = cp_ld16(eh + 0x38);
    e->shnum = cp_ld16(eh + 0x3c);
    e->shstrndx = cp_ld16(eh + 0x3e);
    if (e->phnum && phentsize != PHDR_BYTES)
        return cp_err_set(err, CP_EPARSE, "malformed ELF: program header size %u (expected %d)",
                          phentsize, PHDR_BYTES);
    if (e->shnum && shentsize != SHDR_BYTES)
        return cp_err_set(err, CP_EPARSE, "malformed ELF: section header size %u (expected %d)",
                          shentsize, SHDR_BYTES);
    if (e->phnum && (e->phoff > e->size || (uint64_t)e->phnum * PHDR_BYTES > e->size - e->phoff))
        return cp_err_set(err, CP_EPARSE,
                          "truncated ELF: the program headers end at byte %llu, past the "
                          "file's %llu bytes",
                          (unsigned long long)(e->phoff + (uint64_t)e->phnum * PHDR_BYTES),
                          (unsigned long long)e->size);
    if (e->shnum && (shoff > e->size || (uint64_t)e->shnum * SHDR_BYTES > e->size - shoff))
        return cp_err_set(err, CP_EPARSE,
                          "truncated ELF: the section headers end at byte %llu, past the "
                          "file's %llu bytes",
                          (unsigned long long)(shoff + (uint64_t)e->shnum * SHDR_BYTES),
                          (unsigned long long)e->size);
    if (!e->shnum || !shoff) return cp_err_set(err, CP_EPARSE, "malformed ELF: no section headers");
    uint8_t *raw = malloc((size_t)e->shnum * SHDR_BYTES);
    e->sec = malloc((size_t)e->shnum * sizeof(cp_elf_sec));
    if (!raw || !e->sec) {
        free(raw);
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    if ((rc = cp_elf_read(e, shoff, (uint64_t)e->shnum * SHDR_BYTES, raw)) != 0) {
        free(raw);
        return cp_err_set(err, rc, "cannot read the section headers");
    }
    for (uint32_t i = 0; i < e->shnum; i++) {
        const uint8_t *h = raw + (size_t)i * SHDR_BYTES;
        e->sec[i] = (cp_elf_sec){.name = cp_ld32(h),
                                 .type = cp_ld32(h + 4),
                                 .addr = cp_ld64(h + 0x10),
                                 .off = cp_ld64(h + 0x18),
                                 .size = cp_ld64(h + 0x20),
                                 .link = cp_ld32(h + 0x28),
                                 .entsize = cp_ld64(h + 0x38)};
    }
    free(raw);
    /* the section names, when readable (the symbols do not need them) */
    if (e->shstrndx < e->shnum) {
        const cp_elf_sec *s = &e->sec[e->shstrndx];
        if (s->type != CP_SHT_NOBITS && s->size > 0 && s->size <= NAMES_MAX &&
            (e->names = malloc(s->size)) != NULL) {
            if (cp_elf_read(e, s->off, s->size, e->names) == 0) {
                e->names[s->size - 1] = 0;
                e->names_len = s->size;
            } else {
                free(e->names);
                e->names = NULL;
            }
        }
    }
    return 0;
}

int cp_elf_open_fd(cp_elf *e, int fd, uint64_t size, cp_err *err)
{
    memset(e, 0, sizeof(*e));
    e->fd = fd;
    e->size = size;
    int rc = open_common(e, err);
    if (rc) cp_elf_close(e);
    return rc;
}

int cp_elf_open_mem(cp_elf *e, const uint8_t *mem, size_t len, cp_err *err)
{
    memset(e, 0, sizeof(*e));
    e->fd = -1;
    e->mem = mem;
    e->size = len;
    int rc = open_common(e, err);
    if (rc) cp_elf_close(e);
    return rc;
}

void cp_elf_close(cp_elf *e)
{
    free(e->sec);
    free(e->names);
    e->sec = NULL;
    e->names = NULL;
    e->shnum = 0;
    e->names_len = 0;
}

const char *cp_elf_sec_name(const cp_elf *e, uint32_t i)
{
    if (i >= e->shnum || !e->names || e->sec[i].name >= e->names_len) return "";
    return e->names + e->sec[i].name;
}

int cp_elf_check(const cp_elf *e, cp_err *err)
{
    if (e->shstrndx >= e->shnum)
        return cp_err_set(err, CP_EPARSE, "malformed ELF: section name table index %u of %u",
                          e->shstrndx, e->shnum);
    const cp_elf_sec *ns = &e->sec[e->shstrndx];
    if (ns->type == CP_SHT_NOBITS || ns->off > e->size || ns->size > e->size - ns->off)
        return cp_err_set(err, CP_EPARSE,
                          "truncated ELF: the section name table lies past the file's end");
    if (!e->names && ns->size > 0)
        return cp_err_set(err, CP_EPARSE, "malformed ELF: section name table of %llu bytes",
                          (unsigned long long)ns->size);
    for (uint32_t i = 0; i < e->shnum; i++) {
        const cp_elf_sec *s = &e->sec[i];
        if (s->type == CP_SHT_NOBITS || s->type == 0) continue;
        if (s->off > e->size || s->size > e->size - s->off) {
            const char *nm = cp_elf_sec_name(e, i);
            return cp_err_set(err, CP_EPARSE,
                              "truncated ELF: section %u (%.64s) ends at byte %llu, past the "
                              "file's %llu bytes",
                              i, *nm ? nm : "?", (unsigned long long)(s->off + s->size),
                              (unsigned long long)e->size);
        }
    }
    return 0;
}

/* The GNU build ID among the notes p[0..size): 0 (copied into out), CP_ELIMIT (longer than
 * max; *len says how long), CP_ENOTFOUND. */
static int note_build_id(const uint8_t *p, uint64_t size, uint8_t *out, uint32_t max, uint32_t *len)
{
    const uint8_t *end = p + size;
    /* notes: namesz, descsz, type, name (padded to 4), desc (padded to 4) */
    while (end - p >= 12) {
        uint32_t nsz = cp_ld32(p), dsz = cp_ld32(p + 4), ty = cp_ld32(p + 8);
        uint64_t na = ((uint64_t)nsz + 3) & ~3ULL, da = ((uint64_t)dsz + 3) & ~3ULL;
        if (na > (uint64_t)(end - p - 12) || dsz > (uint64_t)(end - p - 12) - na) break;
        if (ty == NT_GNU_BUILD_ID_ && nsz == 4 && memcmp(p + 12, "GNU", 4) == 0) {
            if (dsz == 0) break;
            *len = dsz;
            if (dsz > max) return CP_ELIMIT;
            memcpy(out, p + 12 + na, dsz);
            return 0;
        }
        if (da > (uint64_t)(end - p - 12) - na) break;
        p += 12 + na + da;
    }
    return CP_ENOTFOUND;
}

enum { NOTE_MAX = 4096 }; /* the fd back end reads a note section's first 4 KiB */

int cp_elf_build_id(const cp_elf *e, uint8_t *out, uint32_t max, uint32_t *len)
{
    uint8_t scratch[NOTE_MAX];
    for (uint32_t i = 0; i < e->shnum; i++) {
        const cp_elf_sec *s = &e->sec[i];
        if (s->type != CP_SHT_NOTE) continue;
        uint64_t size = !e->mem && s->size > NOTE_MAX ? NOTE_MAX : s->size;
        const uint8_t *p = cp_elf_view(e, s->off, size, scratch);
        if (!p) continue;
        int rc = note_build_id(p, size, out, max, len);
        if (rc != CP_ENOTFOUND) return rc;
    }
    return CP_ENOTFOUND;
}

int cp_elf_build_id_fd(int fd, uint64_t size, uint8_t *out, uint32_t max, uint32_t *len)
{
    enum { PT_NOTE_ = 4 };
    const cp_elf e = {.fd = fd, .size = size};
    uint8_t eh[EHDR_BYTES];
    if (cp_elf_read(&e, 0, EHDR_BYTES, eh) != 0 || memcmp(eh, "\177ELF", 4) != 0 || eh[4] != 2 ||
        eh[5] != 1)
        return CP_EPARSE;
    uint64_t phoff = cp_ld64(eh + 0x20);
    uint16_t phentsize = cp_ld16(eh + 0x36), phnum = cp_ld16(eh + 0x38);
    if (phentsize != PHDR_BYTES || phnum == 0 || phnum > 256) return CP_EPARSE;
    uint8_t note[NOTE_MAX];
    for (uint32_t i = 0; i < phnum; i++) {
        uint8_t ph[PHDR_BYTES];
        if (cp_elf_read(&e, phoff + (uint64_t)i * PHDR_BYTES, PHDR_BYTES, ph) != 0)
            return CP_EPARSE;
        if (cp_ld32(ph) != PT_NOTE_) continue;
        uint64_t off = cp_ld64(ph + 8), n = cp_ld64(ph + 0x20);
        if (n > sizeof(note)) n = sizeof(note);
        if (cp_elf_read(&e, off, n, note) != 0) continue;
        int rc = note_build_id(note, n, out, max, len);
        if (rc != CP_ENOTFOUND) return rc;
    }
    return CP_ENOTFOUND;
}

/* ------------------------------------------------------------------------------------
 * Function symbols */

size_t cp_elf_name_len(const char *nm)
{
    size_t len = strlen(nm);
    const char *at = memchr(nm, '@', len);
    return at && at > nm ? (size_t)(at - nm) : len;
}

char *cp_elf_str_dup(const cp_elf *e, const cp_elf_sec *strs, uint64_t off)
{
    if (off >= strs->size) return NULL;
    char stack[256];
    uint64_t max = strs->size - off, want = sizeof(stack);
    char *buf = stack;
    for (;;) {
        uint64_t len = want < max ? want : max;
        if (cp_elf_read(e, strs->off + off, len, buf) != 0) break;
        const char *end = memchr(buf, 0, len);
        if (!end && len == max) { /* the section's last byte ends it, as cp_elf_strtab's */
            buf[len - 1] = 0;
            end = buf + len - 1;
        }
        if (end) {
            char *r = end > buf ? strndup(buf, cp_elf_name_len(buf)) : NULL;
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

int cp_elf_symsec_find(const cp_elf *e, uint32_t type, uint64_t max, cp_elf_symsec *out)
{
    for (uint32_t i = 0; i < e->shnum; i++) {
        const cp_elf_sec *s = &e->sec[i];
        if (s->type != type) continue;
        if (s->link == 0 || s->link >= e->shnum || s->link == i) return CP_EPARSE;
        const cp_elf_sec *t = &e->sec[s->link];
        if (t->type != CP_SHT_STRTAB) return CP_EPARSE;
        if (s->entsize != SYM_BYTES || s->size % SYM_BYTES) return CP_EPARSE;
        if (s->size > max || t->size > max) return CP_ELIMIT;
        if (s->off > e->size || s->size > e->size - s->off) return CP_EPARSE;
        if (t->off > e->size || t->size > e->size - t->off) return CP_EPARSE;
        if (s->size == 0 || t->size == 0) return CP_ENOTFOUND;
        out->sym = *s;
        out->str = *t;
        return 0; /* one table of a type per file */
    }
    return CP_ENOTFOUND;
}

int cp_elf_funcs_each(const cp_elf *e, const cp_elf_symsec *s, uint32_t chunk, uint64_t max_lo,
                      int (*fn)(void *arg, const cp_elf_func *f), void *arg)
{
    uint64_t nsym = s->sym.size / SYM_BYTES;
    if (chunk == 0) chunk = 512;
    if (e->mem) chunk = nsym > UINT32_MAX ? UINT32_MAX : (uint32_t)nsym; /* one view */
    uint8_t *buf = e->mem ? NULL : malloc((size_t)chunk * SYM_BYTES);
    if (!e->mem && !buf) return CP_ENOMEM;
    int rc = 0;
    for (uint64_t first = 0; first < nsym && rc == 0; first += chunk) {
        uint64_t c = nsym - first < chunk ? nsym - first : chunk;
        const uint8_t *syms = cp_elf_view(e, s->sym.off + first * SYM_BYTES, c * SYM_BYTES, buf);
        if (!syms) {
            rc = CP_EIO;
            break;
        }
        for (const uint8_t *p = syms, *end = syms + c * SYM_BYTES; p < end && rc == 0;
             p += SYM_BYTES) {
            uint8_t info = p[4];
            int type = info & 0xf, bind = info >> 4;
            if (type != STT_FUNC_ && type != STT_GNU_IFUNC_) continue;
            uint64_t value = cp_ld64(p + 8);
            if (value > max_lo) continue; /* a scan's addresses are all below: most symbols */
            uint32_t name = cp_ld32(p);
            uint64_t size = cp_ld64(p + 16);
            if (cp_ld16(p + 6) == 0 || value == 0 || name == 0 || name >= s->str.size) continue;
            if (value + size < value) continue;
            cp_elf_func f = {.lo = value,
                             .hi = value + size,
                             .name = name,
                             .rank = bind == STB_GLOBAL_ ? 2
                                     : bind == STB_WEAK_ ? 1
                                                         : 0,
                             .sized = size > 0};
            rc = fn(arg, &f);
        }
    }
    free(buf);
    return rc;
}

int cp_elf_func_better(const cp_elf_func *a, const cp_elf_func *b)
{
    if (a->rank != b->rank) return a->rank > b->rank;
    return a->sized > b->sized;
}

/* Sorts f[0..n) by lo, stably (LSD radix, 11 bits a pass, passes whose digit is the same
 * for every entry skipped): qsort took half of a table's build on cc1's 26k functions. */
static int sort_by_lo(cp_elf_func *f, uint32_t n)
{
    cp_elf_func *tmp = malloc((size_t)n * sizeof(cp_elf_func));
    if (!tmp) return CP_ENOMEM;
    uint64_t all_or = 0;
    for (uint32_t i = 0; i < n; i++)
        all_or |= f[i].lo;
    cp_elf_func *src = f, *dst = tmp;
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
        cp_elf_func *x = src;
        src = dst;
        dst = x;
    }
    if (src != f) memcpy(f, src, (size_t)n * sizeof(cp_elf_func));
    free(tmp);
    return 0;
}

typedef struct collect {
    cp_elf_func *f;
    uint32_t n;
} collect;

static int collect_one(void *arg, const cp_elf_func *f)
{
    collect *c = arg;
    c->f[c->n++] = *f;
    return 0;
}

int cp_elf_funcs_read(const cp_elf *e, const cp_elf_symsec *s, const char *strs, cp_elf_func **out,
                      uint32_t *nout)
{
    *out = NULL;
    *nout = 0;
    uint64_t nsym = s->sym.size / SYM_BYTES;
    if (nsym == 0 || nsym > UINT32_MAX) return CP_ENOTFOUND;
    collect c = {malloc(nsym * sizeof(cp_elf_func)), 0};
    if (!c.f) return CP_ENOMEM;
    /* the symbols are read in chunks into one small buffer (fewer fresh pages to fault in
     * than the whole section) */
    int rc = cp_elf_funcs_each(e, s, 2048, UINT64_MAX, collect_one, &c);
    if (rc == 0 && c.n == 0) rc = CP_ENOTFOUND;
    if (rc == 0) rc = sort_by_lo(c.f, c.n);
    if (rc != 0) {
        free(c.f);
        return rc;
    }
    cp_elf_func *f = c.f;
    /* one symbol per address, the best (the sort is stable: the first in the table wins
     * ties); sizeless ones reach the next */
    uint32_t k = 0;
    for (uint32_t i = 0; i < c.n; i++) {
        if (strs[f[i].name] == 0) continue;
        if (k && f[k - 1].lo == f[i].lo) {
            if (cp_elf_func_better(&f[i], &f[k - 1])) f[k - 1] = f[i];
            continue;
        }
        f[k++] = f[i];
    }
    if (k == 0) {
        free(f);
        return CP_ENOTFOUND;
    }
    for (uint32_t i = 0; i < k; i++) {
        uint64_t next = i + 1 < k ? f[i + 1].lo : UINT64_MAX;
        if (!f[i].sized || f[i].hi > next) f[i].hi = next;
    }
    cp_elf_func *shrunk = realloc(f, (size_t)k * sizeof(cp_elf_func));
    *out = shrunk ? shrunk : f;
    *nout = k;
    return 0;
}

/* ------------------------------------------------------------------------------------
 * PLT stubs */

void cp_elf_plt_close(cp_elf_plt *p)
{
    free(p->slot);
    free(p->dynsym_owned);
    free(p->dynstr_owned);
    memset(p, 0, sizeof(*p));
}

int cp_elf_plt_open(cp_elf_plt *p, const cp_elf *e)
{
    memset(p, 0, sizeof(*p));
    p->e = e;
    if (e->machine != EM_X86_64_ || !e->names) return CP_ENOTFOUND;
    for (uint32_t i = 0; i < e->shnum; i++) {
        const cp_elf_sec *s = &e->sec[i];
        const char *name = cp_elf_sec_name(e, i);
        uint32_t ent = s->type == CP_SHT_PROGBITS || s->type == CP_SHT_NOBITS
                           ? cp_plt_entry_size(name, s->entsize)
                           : 0;
        if (ent && p->nsec < CP_ELF_PLT_SECS && s->size >= ent && s->addr + s->size > s->addr) {
            p->sec[p->nsec].addr = s->addr;
            p->sec[p->nsec].off = s->off;
            p->sec[p->nsec].size = s->size;
            p->sec[p->nsec].nobits = s->type == CP_SHT_NOBITS;
            p->sec[p->nsec++].ent = ent;
        }
        int r = !strcmp(name, ".rela.plt") ? 0 : !strcmp(name, ".rela.dyn") ? 1 : -1;
        if (r >= 0 && s->type == CP_SHT_RELA && s->entsize == RELA_BYTES && s->link < e->shnum) {
            p->rela[r] = *s;
            const cp_elf_sec *d = &e->sec[s->link];
            if (d->type == CP_SHT_DYNSYM && d->link < e->shnum && !p->dynsym.type) {
                p->dynsym = *d;
                p->dynstr = e->sec[d->link];
            }
        }
    }
    return p->nsec ? 0 : CP_ENOTFOUND;
}

int cp_elf_plt_sec_whole(const cp_elf_plt *p, uint32_t k)
{
    uint64_t stubs = 0; /* of the sections before k that are cut into stubs */
    for (uint32_t i = 0; i <= k && i < p->nsec; i++) {
        uint64_t size = p->sec[i].size, off = p->sec[i].off, n = size / p->sec[i].ent;
        int whole = p->sec[i].nobits || size > CP_ELF_PLT_BYTES_MAX || off > p->e->size ||
                    size > p->e->size - off || stubs + n > CP_ELF_PLT_STUBS_MAX;
        if (i == k) return whole;
        if (!whole) stubs += n;
    }
    return 1;
}

static int range_cmp(const void *a, const void *b)
{
    const cp_elf_plt_range *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* A sweep over the starts: the stubs covering the current address are on a stack, the one
 * starting last on top (at one start the lowest rank is pushed last); a stub whose end is
 * passed is popped when it surfaces. A piece ends at the top's end or at the next start. */
int cp_elf_plt_partition(cp_elf_plt_range *v, uint32_t n, cp_elf_plt_range **out, uint32_t *nout)
{
    *out = NULL;
    *nout = 0;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) /* an empty range covers nothing */
        if (v[i].hi > v[i].lo) v[m++] = v[i];
    if (!m) return 0;
    qsort(v, m, sizeof(*v), range_cmp);
    cp_elf_plt_range *o = malloc((size_t)2 * m * sizeof(*o));
    uint32_t *st = malloc((size_t)m * sizeof(*st));
    if (!o || !st) {
        free(o);
        free(st);
        return CP_ENOMEM;
    }
    /* each piece ends at a start (at most m) or at the end of the stub then popped (m) */
    uint32_t no = 0, ns = 0, i = 0;
    uint64_t cur = v[0].lo;
    for (;;) {
        while (ns && v[st[ns - 1]].hi <= cur)
            ns--;
        if (i < m && v[i].lo == cur) {
            uint32_t j = i;
            while (j < m && v[j].lo == cur)
                j++;
            for (uint32_t k = j; k-- > i;)
                st[ns++] = k;
            i = j;
            continue;
        }
        if (!ns) {
            if (i == m) break;
            cur = v[i].lo;
            continue;
        }
        const cp_elf_plt_range *t = &v[st[ns - 1]];
        uint64_t end = i < m && v[i].lo < t->hi ? v[i].lo : t->hi;
        o[no++] = (cp_elf_plt_range){cur, end, t->name, t->rank};
        cur = end;
    }
    free(st);
    *out = o;
    *nout = no;
    return 0;
}

static int slot_cmp(const void *a, const void *b)
{
    const cp_elf_plt_slot *x = a, *y = b;
    return x->got < y->got ? -1 : x->got > y->got;
}

/* Reads the GOT slots named by .rela.plt (and .rela.dyn when there is a .plt.got). */
static int plt_read_relocs(cp_elf_plt *p)
{
    const cp_elf *e = p->e;
    p->relocs_read = 1;
    int want_dyn = 0;
    for (uint32_t i = 0; i < p->nsec; i++)
        want_dyn |= p->sec[i].ent == 8 || p->sec[i].ent == 16;
    enum { CHUNK = 2048 };
    uint8_t *buf = e->mem ? NULL : malloc((size_t)CHUNK * RELA_BYTES);
    if (!e->mem && !buf) return CP_ENOMEM;
    uint32_t cap = 0;
    for (int r = 0; r < 2; r++) {
        const cp_elf_sec *s = &p->rela[r];
        if (!s->type || (r == 1 && !want_dyn) || s->size > RELA_MAX) continue;
        uint64_t n = s->size / RELA_BYTES;
        const uint8_t *rel = NULL;
        for (uint64_t i = 0; i < n; i++) {
            if (i % CHUNK == 0) {
                uint64_t c = n - i < CHUNK ? n - i : CHUNK;
                if (!(rel = cp_elf_view(e, s->off + i * RELA_BYTES, c * RELA_BYTES, buf))) break;
            }
            const uint8_t *x = rel + (i % CHUNK) * RELA_BYTES;
            uint64_t info = cp_ld64(x + 8);
            if (!cp_plt_reloc_names_slot((uint32_t)info) || !(info >> 32)) continue;
            if (p->nslot == cap) {
                uint32_t nc = cap ? cap * 2 : 256;
                cp_elf_plt_slot *g = realloc(p->slot, nc * sizeof(*g));
                if (!g) {
                    free(buf);
                    return CP_ENOMEM;
                }
                p->slot = g;
                cap = nc;
            }
            p->slot[p->nslot].got = cp_ld64(x);
            p->slot[p->nslot++].sym = (uint32_t)(info >> 32);
        }
    }
    free(buf);
    if (p->nslot) qsort(p->slot, p->nslot, sizeof(*p->slot), slot_cmp);
    if (p->dynsym.type && p->dynstr.type == CP_SHT_STRTAB && p->dynstr.size > 0 &&
        (e->mem || (p->nslot > 16 && p->dynsym.size <= PLT_DYN_WHOLE_MAX &&
                    p->dynstr.size <= PLT_DYN_WHOLE_MAX))) {
        int rc;
        p->dynstr_bytes = cp_elf_strtab(e, &p->dynstr, &p->dynstr_owned, &rc);
        if (e->mem) {
            p->dynsym_bytes = cp_elf_view(e, p->dynsym.off, p->dynsym.size, NULL);
        } else if (p->dynstr_bytes && (p->dynsym_owned = malloc(p->dynsym.size)) != NULL &&
                   cp_elf_read(e, p->dynsym.off, p->dynsym.size, p->dynsym_owned) == 0) {
            p->dynsym_bytes = p->dynsym_owned;
        }
        if (!p->dynsym_bytes || !p->dynstr_bytes) {
            free(p->dynsym_owned);
            free(p->dynstr_owned);
            p->dynsym_owned = NULL;
            p->dynstr_owned = NULL;
            p->dynsym_bytes = NULL;
            p->dynstr_bytes = NULL;
        }
    }
    return 0;
}

int cp_elf_plt_name(cp_elf_plt *p, const uint8_t *stub, size_t n, uint64_t addr, char *out,
                    size_t cap)
{
    uint64_t got;
    if (cap < 8 || cp_plt_entry_got(stub, n, addr, &got) != 0) return 0;
    if (!p->relocs_read) {
        int rc = plt_read_relocs(p);
        if (rc) return rc;
    }
    uint32_t lo = 0, hi = p->nslot;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->slot[mid].got < got)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == p->nslot || p->slot[lo].got != got) return 0;
    uint32_t si = p->slot[lo].sym;
    if (p->dynsym.entsize != SYM_BYTES || p->dynstr.type != CP_SHT_STRTAB ||
        (uint64_t)si >= p->dynsym.size / SYM_BYTES)
        return 0;
    uint8_t sym[SYM_BYTES];
    uint64_t at = (uint64_t)si * SYM_BYTES;
    if (p->dynsym_bytes)
        memcpy(sym, p->dynsym_bytes + at, SYM_BYTES);
    else if (cp_elf_read(p->e, p->dynsym.off + at, SYM_BYTES, sym) != 0)
        return 0;
    uint32_t nm = cp_ld32(sym);
    if (nm == 0 || nm >= p->dynstr.size) return 0;
    /* the name without its version, then "@plt" */
    size_t room = cap - 5, bl;
    if (p->dynstr_bytes) {
        const char *b = p->dynstr_bytes + nm;
        bl = cp_elf_name_len(b);
        if (bl > room) bl = room;
        memcpy(out, b, bl);
    } else {
        char *b = cp_elf_str_dup(p->e, &p->dynstr, nm);
        if (!b) return 0;
        bl = strlen(b);
        if (bl > room) bl = room;
        memcpy(out, b, bl);
        free(b);
    }
    if (bl == 0) return 0;
    memcpy(out + bl, "@plt", 5);
    return 1;
}
