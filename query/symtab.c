/* The compact symbol table of server-side symbolization. Untrusted uploads are walked by
 * model/elfread.h's memory back end (header, section headers, notes, function symbols, PLT
 * stubs: the agent's rules, so both name an address alike) with our own check of every
 * section and program header, so that every defect gets a precise message; only a file
 * that passed is handed to libdw (lines, inlined calls).
 *
 * Table layout (little-endian, fixed width, all arrays sorted by address):
 *   "CPSYMT01" magic, u32 nseg, nfunc, ninl, nline, strbytes
 *   nseg  x {u64 file offset, u64 vaddr, u64 size}           PT_LOAD segments
 *   nfunc x {u64 lo, u64 hi, u32 name, u32 pad}              function symbols
 *   ninl  x {u64 lo, u64 hi, u32 name, u32 call_file, u32 call_line, u32 depth}
 *   nline x {u64 addr, u32 file, u32 line}                   file 0 line 0 = end of sequence
 *   strbytes of NUL-terminated strings (offset 0 is "")                                    */
#include "symtab.h"

#include "elfplt.h"
#include "elfread.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "CPSYMT01"
#define HDR_BYTES 28
#define SEG_BYTES 24
#define FUNC_BYTES 24
#define INL_BYTES 32
#define LINE_BYTES 16
#define MAX_INLINE_DEPTH 64 /* inlined calls within inlined calls followed */
#define MAX_NESTING 256     /* DIE nesting followed (scopes, namespaces); deeper is ignored */

/* ------------------------------------------------------------------------------------
 * Building */

typedef struct seg {
    uint64_t off, vaddr, size;
} seg;
typedef struct func {
    uint64_t lo, hi;
    uint32_t name, global; /* global: 3 a PLT stub, 2 global, 1 weak, 0 local */
} func;
typedef struct inl {
    uint64_t lo, hi;
    uint32_t name, call_file, call_line, depth;
} inl;
typedef struct line {
    uint64_t addr;
    uint32_t file, line, ord;
} line;

typedef struct builder {
    cp_buf strs;
    uint64_t *slots; /* hash << 32 | offset + 1 */
    uint32_t nslots, nstrs;
    CP_VEC(seg) segs;
    CP_VEC(func) funcs;
    CP_VEC(inl) inls;
    CP_VEC(line) lines;
    size_t max_table;
    int over, nomem;
} builder;

static size_t b_size(const builder *b)
{
    return HDR_BYTES + (size_t)b->segs.n * SEG_BYTES + (size_t)b->funcs.n * FUNC_BYTES +
           (size_t)b->inls.n * INL_BYTES + (size_t)b->lines.n * LINE_BYTES + b->strs.len;
}

/* 1 when nothing more may be added (the bound is passed or memory ran out). */
static int b_full(builder *b)
{
    if (!b->over && b_size(b) > b->max_table) b->over = 1;
    return b->over || b->nomem;
}

static uint32_t b_str(builder *b, const char *s)
{
    if (!s || !*s) return 0;
    size_t n = strlen(s);
    uint64_t h = cp_hash_bytes(s, n, 0) >> 32;
    if (b->nstrs * 2 >= b->nslots) {
        uint32_t nc = b->nslots ? b->nslots * 2 : 4096;
        uint64_t *ns = calloc(nc, sizeof *ns);
        if (!ns) {
            b->nomem = 1;
            return 0;
        }
        for (uint32_t i = 0; i < b->nslots; i++) {
            if (!b->slots[i]) continue;
            uint32_t j = (uint32_t)(b->slots[i] >> 32) & (nc - 1);
            while (ns[j])
                j = (j + 1) & (nc - 1);
            ns[j] = b->slots[i];
        }
        free(b->slots);
        b->slots = ns;
        b->nslots = nc;
    }
    uint32_t mask = b->nslots - 1, i = (uint32_t)h & mask;
    for (; b->slots[i]; i = (i + 1) & mask) {
        if (b->slots[i] >> 32 != h) continue;
        uint32_t off = (uint32_t)b->slots[i] - 1;
        if (strcmp((const char *)b->strs.data + off, s) == 0) return off;
    }
    if (b->strs.len == 0 && cp_buf_append(&b->strs, "", 1)) { /* offset 0 is "" */
        b->nomem = 1;
        return 0;
    }
    if (b->strs.len + n + 1 > UINT32_MAX - 1) {
        b->over = 1;
        return 0;
    }
    uint32_t off = (uint32_t)b->strs.len;
    if (cp_buf_append(&b->strs, s, n + 1)) {
        b->nomem = 1;
        return 0;
    }
    b->slots[i] = h << 32 | (off + 1);
    b->nstrs++;
    return off;
}

static void b_close(builder *b)
{
    cp_buf_close(&b->strs);
    free(b->slots);
    free(b->segs.v);
    free(b->funcs.v);
    free(b->inls.v);
    free(b->lines.v);
}

/* --- the headers (model/elfread.h) ---------------------------------------------------- */

/* Checks the headers and finds the build ID and the loadable segments. */
static int check_elf(const cp_elf *e, builder *b, char *build_id, cp_err *err)
{
    int rc = cp_elf_check(e, err);
    if (rc) return rc;
    uint8_t bid[CP_BUILD_ID_HEX_MAX / 2];
    uint32_t bid_len = 0;
    rc = cp_elf_build_id(e, bid, sizeof bid, &bid_len);
    if (rc == CP_ELIMIT)
        return cp_err_set(err, CP_EPARSE, "build ID of %u bytes (at most %d accepted)", bid_len,
                          CP_BUILD_ID_HEX_MAX / 2);
    if (rc)
        return cp_err_set(err, CP_EPARSE,
                          "no GNU build ID note (.note.gnu.build-id): link with -Wl,--build-id "
                          "so that profiles can be matched to this file");
    static const char hex[] = "0123456789abcdef";
    for (uint32_t i = 0; i < bid_len; i++) {
        build_id[2 * i] = hex[bid[i] >> 4];
        build_id[2 * i + 1] = hex[bid[i] & 15];
    }
    build_id[2 * bid_len] = 0;
    int text_nobits = 0;
    for (uint32_t i = 0; i < e->shnum; i++)
        if (e->sec[i].type == CP_SHT_NOBITS && strcmp(cp_elf_sec_name(e, i), ".text") == 0)
            text_nobits = 1;

    /* Loadable segments: file offset -> virtual address. A separate debug file keeps the
     * program headers' addresses and sizes but not their file offsets (its sections are
     * NOBITS), so there the offsets are rebuilt the way linkers lay segments out: the first
     * at 0, each next one at the first offset past the previous segment's end that is
     * congruent to its address modulo its alignment. Uploading the binary itself is exact. */
    uint64_t prev_end = 0;
    for (uint16_t i = 0; i < e->phnum; i++) {
        Elf64_Phdr ph;
        memcpy(&ph, e->mem + e->phoff + (size_t)i * sizeof ph, sizeof ph);
        if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
        seg s = {ph.p_offset, ph.p_vaddr, ph.p_filesz};
        if (text_nobits) {
            uint64_t al = ph.p_align > 1 ? ph.p_align : 1;
            uint64_t want = ph.p_vaddr % al, off = prev_end;
            if (b->segs.n == 0)
                off = ph.p_vaddr % al == 0 ? 0 : want;
            else if (off % al != want)
                off = off - off % al + want + (off % al > want ? al : 0);
            s.off = off;
            s.size = ph.p_memsz;
            prev_end = off + ph.p_memsz;
        }
        if (b->segs.n >= 64) break; /* no real object has more */
        if (cp_vec_push(&b->segs, s)) return cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    if (!b->segs.n)
        return cp_err_set(err, CP_EPARSE,
                          "no loadable segment (PT_LOAD): not an executable, "
                          "shared library or its debug file");
    return 0;
}

/* --- symbols and PLT stubs (model/elfread.h) ------------------------------------------- */

static int func_cmp(const void *a, const void *b)
{
    const func *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->global > y->global ? -1 : x->global < y->global; /* a PLT stub first */
}

/* Interns the name nm without its symbol version ("memcpy@@GLIBC_2.14"). */
static uint32_t b_name(builder *b, const char *nm)
{
    size_t n = cp_elf_name_len(nm);
    if (nm[n] == 0) return b_str(b, nm);
    char stack[512], *s = n < sizeof stack ? stack : malloc(n + 1);
    if (!s) {
        b->nomem = 1;
        return 0;
    }
    memcpy(s, nm, n);
    s[n] = 0;
    uint32_t off = b_str(b, s);
    if (s != stack) free(s);
    return off;
}

/* The stubs of e (one function each, ranked 3): `func@plt`, else "[plt]", every section's
 * (model/elfread.h) made one partition, as the agent's table is (collector/elfnames.c).
 * *out is malloc'd. */
static void read_plt(const cp_elf *e, builder *b, cp_elf_plt_range **out, uint32_t *nout)
{
    *out = NULL;
    *nout = 0;
    cp_elf_plt p;
    if (cp_elf_plt_open(&p, e) != 0) return;
    CP_VEC(cp_elf_plt_range) v = {0};
    char nm[CP_ELF_PLT_NAME_MAX];
    for (uint32_t k = 0; k < p.nsec && !b_full(b); k++) {
        uint64_t addr = p.sec[k].addr, size = p.sec[k].size, ent = p.sec[k].ent;
        const uint8_t *bytes =
            cp_elf_plt_sec_whole(&p, k) ? NULL : cp_elf_view(e, p.sec[k].off, size, NULL);
        if (!bytes) ent = size;
        for (uint64_t off = 0; ent <= size - off && !b_full(b); off += ent) {
            int r = bytes ? cp_elf_plt_name(&p, bytes + off, ent, addr + off, nm, sizeof nm) : 0;
            if (r < 0) b->nomem = 1;
            cp_elf_plt_range x = {addr + off, addr + off + ent,
                                  b_str(b, r == 1 ? nm : CP_PLT_UNNAMED),
                                  CP_ELF_PLT_RANK(r == 1, k)};
            if (cp_vec_push(&v, x)) b->nomem = 1;
        }
    }
    cp_elf_plt_close(&p);
    if (cp_elf_plt_partition(v.v, v.n, out, nout) != 0) b->nomem = 1;
    free(v.v);
}

/* The function symbols of e (its .symtab, else its .dynsym), then its PLT stubs over them:
 * an address in a stub is the stub's, as the agent's lookup answers (collector/elfnames.c),
 * so a function reaching over stubs is cut into the pieces around them. */
static int read_symbols(const cp_elf *e, builder *b)
{
    cp_elf_symsec s;
    int rc = cp_elf_symsec_find(e, CP_SHT_SYMTAB, UINT64_MAX, &s);
    if (rc != 0 && rc != CP_ENOMEM && rc != CP_EPARSE)
        rc = cp_elf_symsec_find(e, CP_SHT_DYNSYM, UINT64_MAX, &s);
    if (rc) return rc == CP_ENOMEM ? rc : 0;
    char *owned = NULL;
    const char *strs = cp_elf_strtab(e, &s.str, &owned, &rc);
    cp_elf_func *f = NULL;
    uint32_t n = 0;
    if (strs) rc = cp_elf_funcs_read(e, &s, strs, &f, &n);
    cp_elf_plt_range *plt = NULL;
    uint32_t nplt = 0;
    if (rc == 0) read_plt(e, b, &plt, &nplt);
    /* funcs (non-overlapping, by start) minus the stubs (by start), then the stubs */
    uint32_t j = 0;
    for (uint32_t i = 0; i < n && !b_full(b); i++) {
        uint64_t cur = f[i].lo, hi = f[i].hi;
        uint32_t name = b_name(b, strs + f[i].name);
        while (j < nplt && plt[j].hi <= cur)
            j++;
        for (uint32_t k = j; cur < hi;) {
            while (k < nplt && plt[k].hi <= cur)
                k++;
            uint64_t end = k < nplt && plt[k].lo < hi ? plt[k].lo : hi;
            if (end > cur) {
                func x = {cur, end, name, f[i].rank};
                if (cp_vec_push(&b->funcs, x)) b->nomem = 1;
            }
            if (end == hi) break;
            cur = plt[k].hi > cur ? plt[k].hi : cur;
            k++;
        }
    }
    for (uint32_t i = 0; i < nplt; i++) {
        func x = {plt[i].lo, plt[i].hi, plt[i].name, 3};
        if (cp_vec_push(&b->funcs, x)) b->nomem = 1;
    }
    free(plt);
    free(f);
    free(owned);
    if (rc == CP_ENOMEM) return rc;
    if (!b->funcs.n) return 0;
    qsort(b->funcs.v, b->funcs.n, sizeof(func), func_cmp);
    /* one entry per address (a hostile file's stubs may overlap: the stub wins) */
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->funcs.n; i++) {
        if (k && b->funcs.v[k - 1].lo == b->funcs.v[i].lo) continue;
        b->funcs.v[k++] = b->funcs.v[i];
    }
    b->funcs.n = k;
    return 0;
}

/* --- lines and inlined calls (libdw) ----------------------------------------------------- */

static const char *file_name(Dwarf_Files *files, size_t nfiles, Dwarf_Word idx)
{
    if (!files || idx >= nfiles) return NULL;
    return dwarf_filesrc(files, idx, NULL, NULL);
}

static void walk_dies(Dwarf_Die *die, int depth, int nest, Dwarf_Files *files, size_t nfiles,
                      builder *b)
{
    if (depth > MAX_INLINE_DEPTH || nest > MAX_NESTING) return;
    Dwarf_Die child;
    if (dwarf_child(die, &child) != 0) return;
    do {
        if (b_full(b)) return;
        int tag = dwarf_tag(&child);
        int d = depth;
        /* an inlined call whose name cannot be read (e.g. in a dwz alternate file that is not
         * here) is left out: its caller's frame still names the place */
        const char *nm = tag == DW_TAG_inlined_subroutine ? dwarf_diename(&child) : NULL;
        if (nm) {
            d = depth + 1;
            Dwarf_Attribute at;
            Dwarf_Word cf = 0, cl = 0;
            if (dwarf_attr(&child, DW_AT_call_file, &at)) dwarf_formudata(&at, &cf);
            if (dwarf_attr(&child, DW_AT_call_line, &at)) dwarf_formudata(&at, &cl);
            uint32_t name = b_str(b, nm);
            uint32_t call_file = b_str(b, file_name(files, nfiles, cf));
            Dwarf_Addr base, lo, hi;
            ptrdiff_t off = 0;
            int nr = 0;
            while ((off = dwarf_ranges(&child, off, &base, &lo, &hi)) > 0 && nr++ < 1024) {
                if (hi <= lo) continue;
                inl x = {lo, hi, name, call_file, cl > UINT32_MAX ? 0 : (uint32_t)cl, (uint32_t)d};
                if (cp_vec_push(&b->inls, x)) {
                    b->nomem = 1;
                    return;
                }
            }
        }
        if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine ||
            tag == DW_TAG_lexical_block || tag == DW_TAG_namespace || tag == DW_TAG_class_type ||
            tag == DW_TAG_structure_type)
            walk_dies(&child, d, nest + 1, files, nfiles, b);
    } while (dwarf_siblingof(&child, &child) == 0);
}

static void read_dwarf(Elf *elf, builder *b)
{
    Dwarf *dw = dwarf_begin_elf(elf, DWARF_C_READ, NULL);
    if (!dw) return;
    Dwarf_Off off = 0, next;
    size_t hsize;
    uint32_t ord = 0, ncu = 0;
    while (!b_full(b) && ncu++ < 1000000 &&
           dwarf_nextcu(dw, off, &next, &hsize, NULL, NULL, NULL) == 0) {
        Dwarf_Die cu;
        Dwarf_Off at = off + hsize;
        off = next;
        if (!dwarf_offdie(dw, at, &cu)) continue;
        Dwarf_Lines *lines;
        size_t nl = 0;
        if (dwarf_getsrclines(&cu, &lines, &nl) == 0) {
            uint32_t last_file = UINT32_MAX, last_line = UINT32_MAX;
            for (size_t i = 0; i < nl && !b_full(b); i++) {
                Dwarf_Line *l = dwarf_onesrcline(lines, i);
                Dwarf_Addr a;
                int ln = 0;
                bool end = false;
                if (!l || dwarf_lineaddr(l, &a) || dwarf_lineno(l, &ln)) continue;
                dwarf_lineendsequence(l, &end);
                line x = {a, 0, 0, ord++};
                if (!end) {
                    x.file = b_str(b, dwarf_linesrc(l, NULL, NULL));
                    x.line = ln > 0 ? (uint32_t)ln : 0;
                    if (x.file == last_file && x.line == last_line) continue;
                }
                last_file = end ? UINT32_MAX : x.file;
                last_line = end ? UINT32_MAX : x.line;
                if (cp_vec_push(&b->lines, x)) b->nomem = 1;
            }
        }
        Dwarf_Files *files = NULL;
        size_t nfiles = 0;
        if (dwarf_getsrcfiles(&cu, &files, &nfiles) != 0) files = NULL;
        walk_dies(&cu, 0, 0, files, nfiles, b);
    }
    dwarf_end(dw);
}

static int line_cmp(const void *a, const void *b)
{
    const line *x = a, *y = b;
    if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
    /* at one address an end of sequence sorts before the rows that start there */
    int xe = x->file == 0 && x->line == 0, ye = y->file == 0 && y->line == 0;
    if (xe != ye) return xe ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static int inl_cmp(const void *a, const void *b)
{
    const inl *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->depth < y->depth ? -1 : x->depth > y->depth;
}

static void w64(uint8_t **p, uint64_t v)
{
    memcpy(*p, &v, 8);
    *p += 8;
}
static void w32(uint8_t **p, uint32_t v)
{
    memcpy(*p, &v, 4);
    *p += 4;
}

int cp_symtab_build_id_valid(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++)
        if (n >= CP_BUILD_ID_HEX_MAX ||
            !((id[n] >= '0' && id[n] <= '9') || (id[n] >= 'a' && id[n] <= 'f')))
            return 0;
    return n >= 2 && n % 2 == 0;
}

int cp_symtab_build(const uint8_t *e, size_t len, size_t max_table, cp_buf *out,
                    char build_id[CP_BUILD_ID_HEX_MAX + 1], cp_err *err)
{
    builder b = {.max_table = max_table};
    cp_elf ef;
    int rc = cp_elf_open_mem(&ef, e, len, err);
    if (rc) goto done;
    rc = check_elf(&ef, &b, build_id, err);
    if (rc == 0 && read_symbols(&ef, &b) != 0) b.nomem = 1;
    cp_elf_close(&ef);
    if (rc) goto done;
    elf_version(EV_CURRENT);
    /* libelf reads the caller's bytes in place; libdw may rewrite a compressed section's
     * header there (a second build of the same bytes then fails: libc's debug file did),
     * so each upload is built once */
    Elf *elf = elf_memory((char *)(uintptr_t)e, len);
    if (!elf) {
        rc = cp_err_set(err, CP_EPARSE, "libelf cannot read the file: %s", elf_errmsg(-1));
        goto done;
    }
    if (!b_full(&b)) read_dwarf(elf, &b);
    elf_end(elf);
    if (b.nomem) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory while reading the symbols");
        goto done;
    }
    if (b.over) {
        rc = cp_err_set(err, CP_ELIMIT,
                        "the symbol table would exceed the limit of %zu bytes "
                        "(symbols.max_table_bytes)",
                        max_table);
        goto done;
    }
    if (!b.funcs.n) {
        rc = cp_err_set(err, CP_EPARSE,
                        "no function symbols (.symtab or .dynsym): upload the unstripped "
                        "binary or its debug file");
        goto done;
    }
    if (b.lines.n) qsort(b.lines.v, b.lines.n, sizeof(line), line_cmp);
    if (b.inls.n) qsort(b.inls.v, b.inls.n, sizeof(inl), inl_cmp);
    if (b.strs.len == 0 && cp_buf_append(&b.strs, "", 1)) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        goto done;
    }
    size_t total = b_size(&b);
    if (total > max_table) {
        rc = cp_err_set(err, CP_ELIMIT,
                        "the symbol table of %zu bytes exceeds the limit of %zu bytes "
                        "(symbols.max_table_bytes)",
                        total, max_table);
        goto done;
    }
    if (cp_buf_reserve(out, total)) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        goto done;
    }
    uint8_t *p = out->data + out->len;
    memcpy(p, MAGIC, 8);
    p += 8;
    w32(&p, b.segs.n);
    w32(&p, b.funcs.n);
    w32(&p, b.inls.n);
    w32(&p, b.lines.n);
    w32(&p, (uint32_t)b.strs.len);
    for (uint32_t i = 0; i < b.segs.n; i++) {
        w64(&p, b.segs.v[i].off);
        w64(&p, b.segs.v[i].vaddr);
        w64(&p, b.segs.v[i].size);
    }
    for (uint32_t i = 0; i < b.funcs.n; i++) {
        w64(&p, b.funcs.v[i].lo);
        w64(&p, b.funcs.v[i].hi);
        w32(&p, b.funcs.v[i].name);
        w32(&p, 0);
    }
    for (uint32_t i = 0; i < b.inls.n; i++) {
        const inl *x = &b.inls.v[i];
        w64(&p, x->lo);
        w64(&p, x->hi);
        w32(&p, x->name);
        w32(&p, x->call_file);
        w32(&p, x->call_line);
        w32(&p, x->depth);
    }
    for (uint32_t i = 0; i < b.lines.n; i++) {
        w64(&p, b.lines.v[i].addr);
        w32(&p, b.lines.v[i].file);
        w32(&p, b.lines.v[i].line);
    }
    memcpy(p, b.strs.data, b.strs.len);
    out->len += total;
done:
    b_close(&b);
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Reading */

int cp_symtab_open(cp_symtab *t, const uint8_t *blob, size_t len, cp_err *err)
{
    memset(t, 0, sizeof *t);
    if (len < HDR_BYTES || memcmp(blob, MAGIC, 8) != 0)
        return cp_err_set(err, CP_ESTORE, "symbol table: bad header (%zu bytes)", len);
    t->nseg = cp_ld32(blob + 8);
    t->nfunc = cp_ld32(blob + 12);
    t->ninl = cp_ld32(blob + 16);
    t->nline = cp_ld32(blob + 20);
    t->strbytes = cp_ld32(blob + 24);
    uint64_t need = HDR_BYTES + (uint64_t)t->nseg * SEG_BYTES + (uint64_t)t->nfunc * FUNC_BYTES +
                    (uint64_t)t->ninl * INL_BYTES + (uint64_t)t->nline * LINE_BYTES + t->strbytes;
    if (need != len || t->strbytes == 0 || blob[len - 1] != 0)
        return cp_err_set(err, CP_ESTORE, "symbol table: %zu bytes where the header says %llu", len,
                          (unsigned long long)need);
    const uint8_t *p = blob + HDR_BYTES;
    t->segs = p;
    p += (size_t)t->nseg * SEG_BYTES;
    t->funcs = p;
    p += (size_t)t->nfunc * FUNC_BYTES;
    t->inls = p;
    p += (size_t)t->ninl * INL_BYTES;
    t->lines = p;
    p += (size_t)t->nline * LINE_BYTES;
    t->strs = (const char *)p;
    return 0;
}

void cp_symtab_info_get(const cp_symtab *t, cp_symtab_info *out)
{
    out->functions = t->nfunc;
    out->inlines = t->ninl;
    out->lines = t->nline;
    out->segments = t->nseg;
}

static const char *str_at(const cp_symtab *t, uint32_t off)
{
    return off < t->strbytes ? t->strs + off : "";
}

/* Index of the last element whose u64 key at its start is <= key, or -1. */
static int64_t last_le(const uint8_t *arr, uint32_t n, size_t stride, uint64_t key)
{
    int64_t lo = 0, hi = (int64_t)n - 1, best = -1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cp_ld64(arr + (size_t)mid * stride) <= key) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

/* The function entry whose range holds va (an address as the object's symbols give it), or
 * NULL. */
static const uint8_t *func_at(const cp_symtab *t, uint64_t va)
{
    int64_t fi = last_le(t->funcs, t->nfunc, FUNC_BYTES, va);
    if (fi < 0) return NULL;
    const uint8_t *f = t->funcs + (size_t)fi * FUNC_BYTES;
    return va < cp_ld64(f + 8) ? f : NULL;
}

const char *cp_symtab_function_at(const cp_symtab *t, uint64_t va)
{
    const uint8_t *f = func_at(t, va);
    uint32_t nm = f ? cp_ld32(f + 16) : 0;
    return f && nm < t->strbytes ? t->strs + nm : NULL;
}

uint32_t cp_symtab_lookup(const cp_symtab *t, uint64_t file_offset, cp_symframe *out, uint32_t max)
{
    if (!max) return 0;
    uint64_t va = 0;
    int found = 0;
    for (uint32_t i = 0; i < t->nseg && !found; i++) {
        const uint8_t *s = t->segs + (size_t)i * SEG_BYTES;
        uint64_t off = cp_ld64(s), size = cp_ld64(s + 16);
        if (file_offset >= off && file_offset - off < size) {
            va = cp_ld64(s + 8) + (file_offset - off);
            found = 1;
        }
    }
    if (!found) return 0;
    const uint8_t *f = func_at(t, va);
    if (!f) return 0;
    uint64_t flo = cp_ld64(f);
    /* the source line of the address */
    const char *file = "";
    int64_t ln = 0;
    int64_t li = last_le(t->lines, t->nline, LINE_BYTES, va);
    if (li >= 0) {
        const uint8_t *l = t->lines + (size_t)li * LINE_BYTES;
        uint32_t lf = cp_ld32(l + 8), ll = cp_ld32(l + 12);
        if (lf || ll) {
            file = str_at(t, lf);
            ln = ll;
        }
    }
    /* inlined calls covering va inside this function: deepest first */
    const uint8_t *chain[CP_SYMTAB_MAX_FRAMES];
    uint32_t nc = 0;
    int64_t ii = last_le(t->inls, t->ninl, INL_BYTES, va);
    for (int64_t k = ii, scanned = 0; k >= 0 && scanned < 4096; k--, scanned++) {
        const uint8_t *x = t->inls + (size_t)k * INL_BYTES;
        if (cp_ld64(x) < flo) break;
        if (va >= cp_ld64(x + 8)) continue;
        uint32_t depth = cp_ld32(x + 28);
        /* keep one range per depth (the innermost start wins) */
        int dup = 0;
        for (uint32_t j = 0; j < nc; j++)
            if (cp_ld32(chain[j] + 28) == depth) dup = 1;
        if (!dup && nc < CP_SYMTAB_MAX_FRAMES - 1) chain[nc++] = x;
    }
    /* sort by depth, deepest first */
    for (uint32_t i = 1; i < nc; i++)
        for (uint32_t j = i; j > 0 && cp_ld32(chain[j - 1] + 28) < cp_ld32(chain[j] + 28); j--) {
            const uint8_t *tmp = chain[j];
            chain[j] = chain[j - 1];
            chain[j - 1] = tmp;
        }
    uint32_t n = 0;
    for (uint32_t i = 0; i < nc && n + 1 < max; i++) {
        out[n].name = str_at(t, cp_ld32(chain[i] + 16));
        out[n].file = file;
        out[n].line = ln;
        n++;
        /* the caller's position is where this call was inlined */
        file = str_at(t, cp_ld32(chain[i] + 20));
        ln = cp_ld32(chain[i] + 24);
    }
    out[n].name = str_at(t, cp_ld32(f + 16));
    out[n].file = file;
    out[n].line = ln;
    return n + 1;
}
