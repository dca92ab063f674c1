/* Function names from ELF symbol tables (see elfnames.h), read through model/elfread.h's fd
 * back end: the function symbols of one symbol table, sorted by address, with the string
 * section (read once, its last byte made a NUL, so every name ends inside it), and the
 * object's PLT stubs. Names are only looked at when a pc is named: copying them all cost
 * more than the rest of the build. */
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
#include "elfread.h"
#include "error.h"
#include "vec.h"

/* ------------------------------------------------------------------------------------
 * The table */

typedef cp_elf_func fsym; /* [lo, hi), name: an offset in strs */

/* A PLT stub: [lo, hi), its name at name of plt_strs ("memcpy@plt" or "[plt]"); rank unused
 * once the table is built. */
typedef cp_elf_plt_range pltsym;

struct cp_elfnames {
    fsym *f;
    uint32_t n;
    int source;
    char *strs; /* the string section, NUL-terminated */
    size_t strs_len;
    pltsym *plt; /* a partition, apart from f: they win over a sizeless symbol before them */
    uint32_t nplt;
    char *plt_strs;
    size_t plt_strs_len;
};

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
    *len = cp_elf_name_len(nm);
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
        *len = cp_elf_name_len(*name);
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

/* An object open for reading: its descriptor and its headers. */
typedef struct obj {
    int fd;
    cp_elf e;
} obj;

/* Opens the ELF at path: 0, CP_ENOTFOUND (cannot be opened), CP_EPARSE (not a readable
 * 64-bit little-endian ELF), CP_ENOMEM. */
static int obj_open(const char *path, obj *o)
{
    o->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (o->fd < 0) return errno == ENOMEM ? CP_ENOMEM : CP_ENOTFOUND;
    struct stat st;
    int rc = CP_EPARSE;
    if (fstat(o->fd, &st) == 0 && S_ISREG(st.st_mode))
        rc = cp_elf_open_fd(&o->e, o->fd, (uint64_t)st.st_size, NULL);
    if (rc != 0) {
        close(o->fd);
        o->fd = -1;
        return rc == CP_ENOMEM ? CP_ENOMEM : CP_EPARSE;
    }
    return 0;
}

static void obj_close(obj *o)
{
    if (o->fd < 0) return;
    cp_elf_close(&o->e);
    close(o->fd);
    o->fd = -1;
}

/* What is done with a symbol section: build a table (t), or name the sorted addresses
 * va[0..n) into names (scan). */
typedef struct job {
    cp_elfnames *t;
    const uint64_t *va;
    uint32_t n;
    char **names;
} job;

/* Builds t from symbol section s: its function symbols, names from its strings. */
static int build_table(const cp_elf *e, const cp_elf_symsec *s, cp_elfnames *t)
{
    char *owned = NULL;
    int rc;
    const char *strs = cp_elf_strtab(e, &s->str, &owned, &rc);
    if (!strs) return rc;
    if ((rc = cp_elf_funcs_read(e, s, strs, &t->f, &t->n)) != 0) {
        free(owned);
        return rc;
    }
    t->strs = owned;
    t->strs_len = s->str.size;
    return 0;
}

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

/* One pass of a scan: va[0..n), per address the best symbol so far (hi == 0: none). With
 * skip_empty, a symbol whose name is empty is passed over (a byte of its name read for
 * each symbol that would win a place), as a table leaves it out (cp_elf_funcs_read).
 * named: a symbol with a name was seen (a table of none is no table: CP_ENOTFOUND). */
typedef struct pass {
    const uint64_t *va;
    uint32_t n;
    fsym *best;
    const cp_elf *e;
    const cp_elf_sec *str;
    int skip_empty, named;
} pass;

/* Whether the name at off of j's string section is empty; the section's last byte ends
 * every name (cp_elf_strtab), so one there is. */
static int name_empty(const pass *j, uint32_t off)
{
    char ch = 0;
    return off + 1 >= j->str->size || cp_elf_read(j->e, j->str->off + off, 1, &ch) != 0 || !ch;
}

/* Stops cp_elf_funcs_each at the first symbol with a name. */
static int first_named(void *arg, const cp_elf_func *f)
{
    pass *j = arg;
    return (j->named = !name_empty(j, f->name));
}

static int scan_one(void *arg, const cp_elf_func *f)
{
    pass *j = arg;
    if (!j->named) j->named = !name_empty(j, f->name); /* most often at the first symbol */
    uint32_t k = lower_bound(j->va, j->n, f->lo);
    fsym c = *f;
    if (!c.sized) c.hi = UINT64_MAX;
    fsym *b = &j->best[k];
    if (b->hi && c.lo <= b->lo && (c.lo != b->lo || !cp_elf_func_better(&c, b))) return 0;
    if (!j->skip_empty || !name_empty(j, c.name)) *b = c;
    return 0;
}

/* Names va[0..n) into names[0..n) from symbol section s (see scan_names); redo[k] (when
 * redo is not NULL) set where a symbol holds va[k] but gave no name. */
static int scan_pass(const cp_elf *e, const cp_elf_symsec *s, const uint64_t *va, uint32_t n,
                     char **names, int skip_empty, uint8_t *redo)
{
    pass j = {va, n, calloc(n, sizeof(fsym)), e, &s->str, skip_empty, 0};
    if (!j.best) return CP_ENOMEM;
    /* 512 symbols (12 KiB) a read: each page of a bigger buffer was a fault in a short
     * process */
    int rc = cp_elf_funcs_each(e, s, 512, va[n - 1], scan_one, &j);
    if (rc == 0 && !j.named) { /* none at or below the addresses: any above? */
        rc = cp_elf_funcs_each(e, s, 512, UINT64_MAX, first_named, &j);
        rc = rc == 1 ? 0 : rc == 0 ? CP_ENOTFOUND : rc;
    }
    if (rc == 0) {
        /* best[k] so far: the greatest start in (va[k-1], va[k]]; carried forward, the
         * greatest at or below va[k] */
        fsym *best = j.best;
        for (uint32_t k = 1; k < n; k++)
            if (!best[k].hi) best[k] = best[k - 1];
        for (uint32_t k = 0; k < n; k++) {
            if (!best[k].hi || va[k] >= best[k].hi) continue;
            if (k && best[k - 1].hi && best[k - 1].lo == best[k].lo && va[k - 1] < best[k - 1].hi)
                names[k] = names[k - 1] ? strdup(names[k - 1]) : NULL;
            else
                names[k] = cp_elf_str_dup(e, &s->str, best[k].name);
            if (redo) redo[k] = !names[k];
        }
    }
    free(j.best);
    return rc;
}

/* One pass over symbol section s: for each address of j->va, the function symbol with the
 * greatest start at or below it (the best one at that start, as in a table), if it holds
 * the address (sizeless: up to the next symbol). No sort, no copy of the strings: the
 * names of the winners only are read. A winner whose name is empty (a damaged file's) is
 * no symbol to a table: its addresses take a second pass that passes over such symbols. */
static int scan_names(const cp_elf *e, const cp_elf_symsec *s, job *j)
{
    if (j->n == 0) return CP_ENOTFOUND;
    if (s->str.size == 0 || s->str.off > e->size || s->str.size > e->size - s->str.off)
        return CP_EPARSE; /* as a table's cp_elf_strtab */
    uint8_t *redo = calloc(j->n, 1);
    if (!redo) return CP_ENOMEM;
    int rc = scan_pass(e, s, j->va, j->n, j->names, 0, redo);
    uint32_t m = 0;
    for (uint32_t k = 0; k < j->n && rc == 0; k++)
        m += redo[k];
    if (rc != 0 || m == 0) {
        free(redo);
        return rc;
    }
    uint64_t *va = malloc(m * sizeof(uint64_t));
    char **names = calloc(m, sizeof(char *));
    uint32_t *at = malloc(m * sizeof(uint32_t));
    if (!va || !names || !at) {
        rc = CP_ENOMEM;
    } else {
        m = 0;
        for (uint32_t k = 0; k < j->n; k++)
            if (redo[k]) {
                at[m] = k;
                va[m++] = j->va[k];
            }
        rc = scan_pass(e, s, va, m, names, 1, NULL);
        for (uint32_t i = 0; i < m; i++)
            j->names[at[i]] = names[i];
    }
    free(redo);
    free(va);
    free(names);
    free(at);
    return rc;
}

/* Runs j on the symbol section of type want (CP_SHT_SYMTAB or CP_SHT_DYNSYM) of e. */
static int run_on(const cp_elf *e, uint32_t want, job *j)
{
    cp_elf_symsec s;
    int rc = cp_elf_symsec_find(e, want, CP_ELFNAMES_MAX_SECTION, &s);
    if (rc) return rc;
    return j->t ? build_table(e, &s, j->t) : scan_names(e, &s, j);
}

/* ------------------------------------------------------------------------------------
 * PLT stubs (model/elfread.h): named `func@plt` from the object itself (its .plt sections,
 * relocations and .dynsym are allocated, so present in stripped files; a debug file has
 * them as NOBITS). */

/* Appends the stub [lo, hi) named nm (NULL: unnamed, name 0) of section k to *v. */
static int plt_add(pltsym **v, uint32_t *n, uint32_t *cap, cp_buf *strs, uint64_t lo, uint64_t hi,
                   const char *nm, uint32_t k)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 64;
        pltsym *nv = realloc(*v, nc * sizeof(pltsym));
        if (!nv) return CP_ENOMEM;
        *v = nv;
        *cap = nc;
    }
    uint32_t name = nm ? (uint32_t)strs->len : 0;
    if (nm && cp_buf_append(strs, nm, strlen(nm) + 1) != 0) return CP_ENOMEM;
    (*v)[(*n)++] = (pltsym){lo, hi, name, CP_ELF_PLT_RANK(nm != NULL, k)};
    return 0;
}

/* Adds the stubs of e to t: every section's (model/elfread.h), made one partition
 * (cp_elf_plt_partition, as the server's table is), contiguous pieces of one name joined
 * (a run of "[plt]"). A section whose bytes cannot be read is one unnamed stub, as one past
 * the end of the file is. */
static int plt_table(const cp_elf *e, cp_elfnames *t)
{
    cp_elf_plt p;
    if (cp_elf_plt_open(&p, e) != 0) return 0;
    cp_buf strs = {0};
    pltsym *v = NULL, *part = NULL;
    uint32_t n = 0, cap = 0, np = 0;
    int rc = cp_buf_append(&strs, CP_PLT_UNNAMED, sizeof(CP_PLT_UNNAMED)) ? CP_ENOMEM : 0;
    uint8_t *bytes = NULL;
    char nm[CP_ELF_PLT_NAME_MAX];
    for (uint32_t k = 0; k < p.nsec && rc == 0; k++) {
        uint64_t size = p.sec[k].size, ent = p.sec[k].ent;
        if (!cp_elf_plt_sec_whole(&p, k) &&
            (!(bytes = malloc(size)) || cp_elf_read(e, p.sec[k].off, size, bytes) != 0)) {
            free(bytes);
            bytes = NULL;
        }
        if (!bytes) ent = size;
        for (uint64_t off = 0; ent <= size - off && rc == 0; off += ent) {
            uint64_t a = p.sec[k].addr + off;
            int r = bytes ? cp_elf_plt_name(&p, bytes + off, ent, a, nm, sizeof(nm)) : 0;
            rc = r < 0 ? r : plt_add(&v, &n, &cap, &strs, a, a + ent, r == 1 ? nm : NULL, k);
        }
        free(bytes);
        bytes = NULL;
    }
    cp_elf_plt_close(&p);
    if (rc == 0) rc = cp_elf_plt_partition(v, n, &part, &np);
    free(v);
    const char *sd = (const char *)strs.data;
    uint32_t w = 0;
    for (uint32_t i = 0; i < np; i++) {
        if (w && part[w - 1].hi == part[i].lo && !strcmp(sd + part[w - 1].name, sd + part[i].name))
            part[w - 1].hi = part[i].hi;
        else
            part[w++] = part[i];
    }
    if (rc != 0 || w == 0) {
        free(part);
        cp_buf_close(&strs);
        return rc;
    }
    t->plt = part;
    t->nplt = w;
    size_t len;
    t->plt_strs = (char *)cp_buf_steal(&strs, &len);
    t->plt_strs_len = len;
    return 0;
}

/* Names the addresses of vaddrs[0..n) that fall in stubs of e, replacing names[i]: of the
 * stubs covering an address (at most one a section), the one plt_table's partition gives it
 * (model/elfread.h). A stub whose bytes cannot be read here is unnamed. */
static void plt_scan(const cp_elf *e, const uint64_t *vaddrs, uint32_t n, char **names)
{
    cp_elf_plt p;
    if (cp_elf_plt_open(&p, e) != 0) return;
    char nm[CP_ELF_PLT_NAME_MAX], best[CP_ELF_PLT_NAME_MAX];
    for (uint32_t i = 0; i < n; i++) {
        uint64_t va = vaddrs[i], blo = 0;
        uint32_t brank = UINT32_MAX;
        for (uint32_t k = 0; k < p.nsec; k++) {
            uint64_t addr = p.sec[k].addr, size = p.sec[k].size, ent = p.sec[k].ent;
            if (va < addr || va - addr >= size) continue;
            uint64_t lo = addr;
            int named = 0;
            if (!cp_elf_plt_sec_whole(&p, k)) {
                uint64_t idx = (va - addr) / ent;
                if ((idx + 1) * ent > size) continue; /* past the last whole stub */
                lo = addr + idx * ent;
                uint8_t stub[16];
                named = ent <= sizeof(stub) &&
                        cp_elf_read(e, p.sec[k].off + idx * ent, ent, stub) == 0 &&
                        cp_elf_plt_name(&p, stub, ent, lo, nm, sizeof(nm)) == 1;
            }
            uint32_t rank = CP_ELF_PLT_RANK(named, k);
            if (brank != UINT32_MAX && (lo < blo || (lo == blo && rank > brank))) continue;
            blo = lo;
            brank = rank;
            const char *use = named ? nm : CP_PLT_UNNAMED;
            memcpy(best, use, strlen(use) + 1);
        }
        if (brank == UINT32_MAX) continue;
        char *d = strdup(best);
        if (!d) continue;
        free(names[i]);
        names[i] = d;
    }
    cp_elf_plt_close(&p);
}

/* Runs j on the first source that has function symbols (see elfnames.h), then adds the
 * PLT stubs of the object at path; returns which source in *source. */
static int run_job(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                   const char *debug_dir, job *j, int *source)
{
    int rc = CP_ENOTFOUND;
    obj o;
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
        if (n > 0 && (size_t)n < sizeof(dpath) && (rc = obj_open(dpath, &o)) == 0) {
            rc = run_on(&o.e, CP_SHT_SYMTAB, j);
            obj_close(&o);
            if (rc == 0) *source = CP_ELFNAMES_DEBUG_SYMTAB;
        }
    }
    if (rc == CP_ENOMEM) return rc;
    int orc = obj_open(path, &o);
    if (orc != 0) return rc == 0 ? 0 : orc;
    if (rc != 0) {
        rc = run_on(&o.e, CP_SHT_SYMTAB, j);
        if (rc == 0) *source = CP_ELFNAMES_SYMTAB;
    }
    if (rc != 0 && rc != CP_ENOMEM && rc != CP_EPARSE) {
        rc = run_on(&o.e, CP_SHT_DYNSYM, j);
        if (rc == 0) *source = CP_ELFNAMES_DYNSYM;
    }
    if (rc == 0) rc = j->t ? plt_table(&o.e, j->t) : (plt_scan(&o.e, j->va, j->n, j->names), 0);
    obj_close(&o);
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
    if (source_out) *source_out = rc == 0 ? source : 0;
    if (rc != 0)
        for (uint32_t i = 0; i < n; i++) {
            free(names[i]);
            names[i] = NULL;
        }
    return rc;
}
