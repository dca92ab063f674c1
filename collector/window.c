/* Window building on the agent thread: the CPU aggregation table, the symbol cache (libdw
 * for function and file:line, mappings with build ids from the module snapshot), and the
 * per-isolate cpu/alloc/inuse profiles wrapped in envelopes. */
#include "window.h"

#include <sys/auxv.h>
#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "isolate.h"
#include "labels.h"
#include "nextmalloc.h"
#include "pprof.h"
#include "profile.h"

/* ------------------------------------------------------------------------------------
 * Isolate keys: an explicit isolate id, or a thread name when the id is 0. */

typedef struct iso_key {
    uint32_t iso;
    char thread[16];
} iso_key;

static int key_eq(const iso_key *a, const iso_key *b)
{
    return a->iso == b->iso && (a->iso || strncmp(a->thread, b->thread, 16) == 0);
}

/* ------------------------------------------------------------------------------------
 * CPU aggregation */

typedef struct cpu_entry {
    uint64_t hash;
    iso_key key;
    uint32_t nframes;
    uint64_t count, periods;
    uint64_t *pcs; /* owned */
} cpu_entry;

#define CPU_MAX_ENTRIES (1u << 16)

static struct {
    cpu_entry *e;
    uint32_t n, cap; /* cap: power of two slots; n used */
    uint64_t dropped;
} cpu;

static uint64_t stack_hash(const iso_key *k, const uint64_t *pcs, uint32_t n)
{
    uint64_t h = cp_hash_bytes(pcs, n * sizeof(uint64_t), k->iso);
    if (!k->iso) h = cp_hash_bytes(k->thread, strnlen(k->thread, 16), h);
    return h | 1; /* 0 marks an empty slot */
}

static int cpu_grow(void)
{
    uint32_t ncap = cpu.cap ? cpu.cap * 2 : 1024;
    cpu_entry *ne = calloc(ncap, sizeof(*ne));
    if (!ne) return CP_ENOMEM;
    for (uint32_t i = 0; i < cpu.cap; i++) {
        if (!cpu.e[i].hash) continue;
        uint32_t j = (uint32_t)cpu.e[i].hash & (ncap - 1);
        while (ne[j].hash)
            j = (j + 1) & (ncap - 1);
        ne[j] = cpu.e[i];
    }
    free(cpu.e);
    cpu.e = ne;
    cpu.cap = ncap;
    return 0;
}

void cp_window_add_cpu(const cp_sample_rec *r, const char *thread)
{
    iso_key k = {.iso = r->isolate};
    if (!k.iso) {
        size_t n = strnlen(thread, 15);
        memcpy(k.thread, thread, n);
    }
    uint64_t h = stack_hash(&k, r->pcs, r->nframes);
    if (cpu.n * 2 >= cpu.cap && cpu.n < CPU_MAX_ENTRIES) cpu_grow();
    if (!cpu.cap) {
        cpu.dropped += r->weight;
        return;
    }
    uint32_t mask = cpu.cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        cpu_entry *e = &cpu.e[i];
        if (!e->hash) {
            if (cpu.n * 2 >= cpu.cap) {
                cpu.dropped += r->weight;
                return;
            }
            e->pcs = malloc(r->nframes * sizeof(uint64_t) + 1);
            if (!e->pcs) {
                cpu.dropped += r->weight;
                return;
            }
            memcpy(e->pcs, r->pcs, r->nframes * sizeof(uint64_t));
            e->hash = h;
            e->key = k;
            e->nframes = r->nframes;
            e->count = 1;
            e->periods = r->weight;
            cpu.n++;
            return;
        }
        if (e->hash == h && key_eq(&e->key, &k) && e->nframes == r->nframes &&
            memcmp(e->pcs, r->pcs, r->nframes * sizeof(uint64_t)) == 0) {
            e->count++;
            e->periods += r->weight;
            return;
        }
    }
}

static void cpu_clear(void)
{
    for (uint32_t i = 0; i < cpu.cap; i++)
        free(cpu.e[i].pcs);
    free(cpu.e);
    memset(&cpu, 0, sizeof(cpu));
}

/* ------------------------------------------------------------------------------------
 * Symbols */

/* libdw (with libelf, liblzma, libbz2) is loaded on the agent thread the first time
 * something is symbolized: programs that exit before their first sample never map it. */
/* One function a line, by hand: clang-format 14 lays X-lists out differently on each pass. */
/* clang-format off */
#define CP_DW_FUNCS(X)                                                                             \
    X(dwarf_attr)                                                                                  \
    X(dwarf_attr_integrate)                                                                        \
    X(dwarf_filesrc)                                                                               \
    X(dwarf_formstring)                                                                            \
    X(dwarf_formudata)                                                                             \
    X(dwarf_getscopes)                                                                             \
    X(dwarf_getsrcfiles)                                                                           \
    X(dwarf_tag)                                                                                   \
    X(dwfl_addrmodule)                                                                             \
    X(dwfl_begin)                                                                                  \
    X(dwfl_end)                                                                                    \
    X(dwfl_lineinfo)                                                                               \
    X(dwfl_linux_proc_find_elf)                                                                    \
    X(dwfl_linux_proc_report)                                                                      \
    X(dwfl_module_addrdie)                                                                         \
    X(dwfl_module_addrname)                                                                        \
    X(dwfl_module_getsrc)                                                                          \
    X(dwfl_report_begin)                                                                           \
    X(dwfl_report_end)                                                                             \
    X(dwfl_standard_find_debuginfo)
/* clang-format on */

static struct {
    int tried, ok;
#define CP_DW_FIELD(f) __typeof__(&f) f;
    CP_DW_FUNCS(CP_DW_FIELD)
#undef CP_DW_FIELD
} dw;

static int dw_load(void)
{
    if (dw.tried) return dw.ok;
    dw.tried = 1;
    void *h = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdw.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
#define CP_DW_LOAD(f)                                                                              \
    if (!(dw.f = (__typeof__(dw.f))dlsym(h, #f))) return 0;
    CP_DW_FUNCS(CP_DW_LOAD)
#undef CP_DW_LOAD
    dw.ok = 1;
    return 1;
}

typedef struct sym_line {
    char *name, *file;
    char *mangled; /* the symbol's own name when name was demangled, else NULL */
    int64_t line;
} sym_line;

/* One address: its function (name, file:line) and, when the compiler inlined calls
 * there, the inlined functions innermost first (from DWARF scopes). */
#define SYM_MAX_INLINE 8
typedef struct sym {
    uint64_t pc; /* 0 = empty */
    char *name, *file;
    char *mangled;
    int64_t line;
    uint32_t ninl;
    sym_line *inl; /* owned, ninl entries */
} sym;

/* C++ names are demangled with the program's own C++ runtime: a mangled name comes from
 * C++ code, so __cxa_demangle is loaded whenever it is needed (looked up once). */
typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
static demangle_fn find_demangler(void)
{
    static int looked;
    static demangle_fn fn;
    if (!looked) {
        looked = 1;
        fn = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    }
    return fn;
}

#define SYM_CAP (1u << 15)

static struct {
    Dwfl *dwfl;
    uint64_t adds, subs;
    sym *tab;
    uint32_t n;
} syms;

/* Separate debug files (/usr/lib/debug, libc6-dbg...) are large: reading them would cost
 * the host tens of MiB. By default only an object's own symbols and DWARF are used; the
 * mappings' build ids let a server symbolize the rest. CONTPROF_DEBUGINFO=1 opts in. */
static int own_debuginfo_only(Dwfl_Module *mod, void **userdata, const char *modname,
                              Dwarf_Addr base, const char *file_name, const char *debuglink_file,
                              GElf_Word debuglink_crc, char **debuginfo_file_name)
{
    (void)mod, (void)userdata, (void)modname, (void)base, (void)file_name;
    (void)debuglink_file, (void)debuglink_crc, (void)debuginfo_file_name;
    return -1;
}

static void sym_free(sym *s)
{
    free(s->name);
    free(s->mangled);
    free(s->file);
    for (uint32_t k = 0; k < s->ninl; k++) {
        free(s->inl[k].name);
        free(s->inl[k].mangled);
        free(s->inl[k].file);
    }
    free(s->inl);
}

static char *dwfl_debuginfo_path;
static Dwfl_Callbacks dwfl_cbs = {
    .find_debuginfo = own_debuginfo_only,
    .debuginfo_path = &dwfl_debuginfo_path,
};

static void syms_clear(void)
{
    if (syms.tab) {
        for (uint32_t i = 0; i < SYM_CAP; i++) {
            sym_free(&syms.tab[i]);
        }
        free(syms.tab);
    }
    if (syms.dwfl) dw.dwfl_end(syms.dwfl);
    memset(&syms, 0, sizeof(syms));
}

static void syms_refresh(const cp_modules *mods)
{
    if (atomic_load(&cp_agent_oom)) return; /* see symbolize */
    if (!dw_load()) return;                 /* names stay addresses */
    if (syms.dwfl && mods && mods->adds == syms.adds && mods->subs == syms.subs) return;
    if (syms.dwfl) dw.dwfl_end(syms.dwfl);
    const char *di = getenv("CONTPROF_DEBUGINFO");
    dwfl_cbs.find_elf = dw.dwfl_linux_proc_find_elf;
    dwfl_cbs.find_debuginfo =
        di && strcmp(di, "1") == 0 ? dw.dwfl_standard_find_debuginfo : own_debuginfo_only;
    syms.dwfl = dw.dwfl_begin(&dwfl_cbs);
    if (syms.dwfl) {
        dw.dwfl_report_begin(syms.dwfl);
        if (dw.dwfl_linux_proc_report(syms.dwfl, getpid()) != 0 ||
            dw.dwfl_report_end(syms.dwfl, NULL, NULL) != 0) {
            dw.dwfl_end(syms.dwfl);
            syms.dwfl = NULL;
        }
    }
    if (mods) {
        syms.adds = mods->adds;
        syms.subs = mods->subs;
    }
    /* addresses of unloaded objects may now mean something else */
    if (syms.tab && mods && mods->subs != syms.subs) {
        for (uint32_t i = 0; i < SYM_CAP; i++) {
            sym_free(&syms.tab[i]);
        }
        memset(syms.tab, 0, SYM_CAP * sizeof(sym));
        syms.n = 0;
    }
}

/* Sets *name (demangled when possible) and *mangled from a symbol or linkage name. */
static void set_name(const char *raw, char **name, char **mangled)
{
    if (raw[0] == '_' && raw[1] == 'Z' && find_demangler()) {
        int st = -1;
        char *d = find_demangler()(raw, NULL, NULL, &st);
        if (d && st == 0) {
            *name = d;
            *mangled = strdup(raw);
            return;
        }
        free(d);
    }
    *name = strdup(raw);
}

static const char *die_string(Dwarf_Die *die, int at)
{
    Dwarf_Attribute a;
    return dw.dwarf_attr_integrate(die, at, &a) ? dw.dwarf_formstring(&a) : NULL;
}

/* Fills s->inl from the DWARF scopes at pc; on return *file and *line are where the
 * outermost function is (the call site of the outermost inlined call, if any). */
static void inline_frames(Dwfl_Module *m, uint64_t pc, sym *s, const char **file, int *line)
{
    Dwarf_Addr bias = 0;
    Dwarf_Die *cu = dw.dwfl_module_addrdie(m, pc, &bias);
    if (!cu) return;
    Dwarf_Die *scopes = NULL;
    int n = dw.dwarf_getscopes(cu, pc - bias, &scopes);
    if (n <= 0) return;
    Dwarf_Files *files = NULL;
    size_t nfiles = 0;
    if (dw.dwarf_getsrcfiles(cu, &files, &nfiles) != 0) files = NULL;
    sym_line tmp[SYM_MAX_INLINE];
    uint32_t k = 0;
    for (int i = 0; i < n; i++) {
        int tag = dw.dwarf_tag(&scopes[i]);
        if (tag == DW_TAG_subprogram) break;
        if (tag != DW_TAG_inlined_subroutine) continue;
        const char *raw = die_string(&scopes[i], DW_AT_linkage_name);
        if (!raw) raw = die_string(&scopes[i], DW_AT_MIPS_linkage_name);
        if (!raw) raw = die_string(&scopes[i], DW_AT_name);
        if (raw && k < SYM_MAX_INLINE) { /* deeper chains keep their outer frames only */
            sym_line *l = &tmp[k];
            memset(l, 0, sizeof(*l));
            set_name(raw, &l->name, &l->mangled);
            l->file = *file ? strdup(*file) : NULL;
            l->line = *line;
            k++;
        }
        /* the enclosing function continues at this call site */
        Dwarf_Attribute a;
        Dwarf_Word cf = 0, cl = 0;
        const char *cfile = NULL;
        if (dw.dwarf_formudata(dw.dwarf_attr(&scopes[i], DW_AT_call_file, &a), &cf) == 0 && files)
            cfile = dw.dwarf_filesrc(files, cf, NULL, NULL);
        if (dw.dwarf_formudata(dw.dwarf_attr(&scopes[i], DW_AT_call_line, &a), &cl) != 0) cl = 0;
        *file = cfile;
        *line = (int)cl;
    }
    free(scopes);
    if (k == 0) return;
    s->inl = malloc(k * sizeof(sym_line));
    if (!s->inl) {
        for (uint32_t j = 0; j < k; j++) {
            free(tmp[j].name);
            free(tmp[j].mangled);
            free(tmp[j].file);
        }
        return;
    }
    memcpy(s->inl, tmp, k * sizeof(sym_line));
    s->ninl = k;
}

static const sym *symbolize(uint64_t pc)
{
    static sym none;
    if (atomic_load(&cp_agent_oom)) {
        /* out of memory once: libdw is not used again (addresses and build ids remain) */
        if (syms.dwfl) dw.dwfl_end(syms.dwfl);
        syms.dwfl = NULL;
    }
    if (!syms.tab) {
        syms.tab = calloc(SYM_CAP, sizeof(sym));
        if (!syms.tab) return &none;
    }
    uint32_t mask = SYM_CAP - 1;
    uint32_t i = (uint32_t)cp_hash_u64(0, pc) & mask;
    while (syms.tab[i].pc && syms.tab[i].pc != pc)
        i = (i + 1) & mask;
    if (syms.tab[i].pc == pc) return &syms.tab[i];
    if (syms.n >= SYM_CAP / 2) {
        /* the cache is bounded: start over rather than grow */
        for (uint32_t j = 0; j < SYM_CAP; j++) {
            sym_free(&syms.tab[j]);
        }
        memset(syms.tab, 0, SYM_CAP * sizeof(sym));
        syms.n = 0;
        i = (uint32_t)cp_hash_u64(0, pc) & mask;
    }
    sym *s = &syms.tab[i];
    s->pc = pc;
    syms.n++;
    Dwfl_Module *m = syms.dwfl ? dw.dwfl_addrmodule(syms.dwfl, pc) : NULL;
    if (m) {
        const char *name = dw.dwfl_module_addrname(m, pc);
        if (name) set_name(name, &s->name, &s->mangled);
        Dwfl_Line *l = dw.dwfl_module_getsrc(m, pc);
        if (l) {
            int line = 0;
            const char *file = dw.dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL);
            if (file) {
                if (s->name) inline_frames(m, pc, s, &file, &line);
                if (file) s->file = strdup(file);
                s->line = line;
            }
        }
    }
    return s;
}

/* ------------------------------------------------------------------------------------
 * Profile building */

typedef struct builder {
    cp_profile *p;
    const cp_modules *mods;
    /* pc -> location id, module index -> mapping id, function name -> id */
    uint64_t *loc_pc;
    uint32_t *loc_id;
    uint32_t loc_cap;
    uint32_t *map_id;
    /* (name, system name, file) string ids -> function id */
    uint64_t *fn_key;
    uint32_t *fn_id;
    uint32_t fn_cap, fn_n;
    int err;
} builder;

static int b_init(builder *b, const cp_modules *mods)
{
    memset(b, 0, sizeof(*b));
    b->p = cp_profile_create();
    b->mods = mods;
    b->loc_cap = 1024;
    b->loc_pc = calloc(b->loc_cap, sizeof(uint64_t));
    b->loc_id = calloc(b->loc_cap, sizeof(uint32_t));
    b->map_id = mods ? calloc(mods->n + 1, sizeof(uint32_t)) : NULL;
    if (!b->p || !b->loc_pc || !b->loc_id || (mods && !b->map_id)) return CP_ENOMEM;
    return 0;
}

static void b_close(builder *b)
{
    cp_profile_destroy(b->p);
    free(b->loc_pc);
    free(b->loc_id);
    free(b->map_id);
    free(b->fn_key);
    free(b->fn_id);
}

static uint32_t str_id(builder *b, const char *s)
{
    uint32_t id = 0;
    if (s && cp_profile_intern_cstr(b->p, s, &id) != 0) b->err = CP_ENOMEM;
    return id;
}

static uint32_t mapping_for(builder *b, uint64_t pc)
{
    const cp_module *m = cp_modules_find(b->mods, pc);
    if (!m) return 0;
    uint32_t idx = (uint32_t)(m - b->mods->m);
    if (b->map_id[idx]) return b->map_id[idx];
    static const char digits[] = "0123456789abcdef";
    char hex[2 * CP_BUILD_ID_MAX + 1];
    for (uint32_t i = 0; i < m->build_id_len; i++) {
        hex[2 * i] = digits[m->build_id[i] >> 4];
        hex[2 * i + 1] = digits[m->build_id[i] & 15];
    }
    hex[2 * m->build_id_len] = 0;
    cp_mapping mp = {
        .start = m->lo,
        .limit = m->hi,
        .offset = m->file_offset,
        .filename = str_id(b, m->path),
        .build_id = str_id(b, hex),
        .flags = cp_cfg.symbolize_server ? 0
                                         : CP_MAP_HAS_FUNCTIONS | CP_MAP_HAS_FILENAMES |
                                               CP_MAP_HAS_LINE_NUMBERS | CP_MAP_HAS_INLINE_FRAMES,
    };
    uint32_t id = 0;
    if (cp_profile_add_mapping(b->p, &mp, &id) != 0) b->err = CP_ENOMEM;
    b->map_id[idx] = id;
    return id;
}

/* pprof takes the first mapping for the program ("File:" in go tool pprof): put the main
 * executable's (the one holding the entry point) first. */
static void b_main_mapping_first(builder *b)
{
    unsigned long entry = getauxval(AT_ENTRY);
    if (b->mods && entry) (void)mapping_for(b, (uint64_t)entry);
}

static uint32_t add_function(builder *b, const char *name, const char *sys, const char *file)
{
    cp_function f = {.name = str_id(b, name), .system_name = 0, .filename = str_id(b, file)};
    f.system_name = sys ? str_id(b, sys) : f.name;
    uint64_t key = cp_hash_u64(cp_hash_u64(f.name, f.system_name), f.filename) | 1;
    if (b->fn_n * 2 >= b->fn_cap) { /* grow the index */
        uint32_t nc = b->fn_cap ? b->fn_cap * 2 : 256;
        uint64_t *nk = calloc(nc, sizeof(uint64_t));
        uint32_t *ni = calloc(nc, sizeof(uint32_t));
        if (!nk || !ni) {
            free(nk);
            free(ni);
            b->err = CP_ENOMEM;
            return 0;
        }
        for (uint32_t i = 0; i < b->fn_cap; i++) {
            if (!b->fn_id[i]) continue;
            uint32_t j = (uint32_t)b->fn_key[i] & (nc - 1);
            while (ni[j])
                j = (j + 1) & (nc - 1);
            nk[j] = b->fn_key[i];
            ni[j] = b->fn_id[i];
        }
        free(b->fn_key);
        free(b->fn_id);
        b->fn_key = nk;
        b->fn_id = ni;
        b->fn_cap = nc;
    }
    uint32_t mask = b->fn_cap - 1, i = (uint32_t)key & mask;
    for (; b->fn_id[i]; i = (i + 1) & mask) {
        const cp_function *g = &b->p->functions.v[b->fn_id[i] - 1];
        if (b->fn_key[i] == key && g->name == f.name && g->system_name == f.system_name &&
            g->filename == f.filename)
            return b->fn_id[i];
    }
    uint32_t id = 0;
    if (cp_profile_add_function(b->p, &f, &id) != 0) {
        b->err = CP_ENOMEM;
        return 0;
    }
    b->fn_key[i] = key;
    b->fn_id[i] = id;
    b->fn_n++;
    return id;
}

static int loc_grow(builder *b)
{
    uint32_t ncap = b->loc_cap * 2;
    uint64_t *npc = calloc(ncap, sizeof(uint64_t));
    uint32_t *nid = calloc(ncap, sizeof(uint32_t));
    if (!npc || !nid) {
        free(npc);
        free(nid);
        return CP_ENOMEM;
    }
    for (uint32_t i = 0; i < b->loc_cap; i++) {
        if (!b->loc_id[i]) continue;
        uint32_t j = (uint32_t)cp_hash_u64(0, b->loc_pc[i]) & (ncap - 1);
        while (nid[j])
            j = (j + 1) & (ncap - 1);
        npc[j] = b->loc_pc[i];
        nid[j] = b->loc_id[i];
    }
    free(b->loc_pc);
    free(b->loc_id);
    b->loc_pc = npc;
    b->loc_id = nid;
    b->loc_cap = ncap;
    return 0;
}

/* Function ids are per profile; functions are deduplicated through the profile's own
 * string ids (name, file) with a small linear-probing table. */
static uint32_t location_for(builder *b, uint64_t pc)
{
    if (b->p->locations.n * 2 >= b->loc_cap && loc_grow(b) != 0) {
        b->err = CP_ENOMEM;
        return 0;
    }
    uint32_t mask = b->loc_cap - 1;
    uint32_t i = (uint32_t)cp_hash_u64(0, pc) & mask;
    while (b->loc_id[i] && b->loc_pc[i] != pc)
        i = (i + 1) & mask;
    if (b->loc_id[i]) return b->loc_id[i];

    cp_line line = {0};
    uint32_t mapping = 0;
    uint64_t addr = pc;
    if (pc & CP_LANG_TAG) {
        const char *fn = NULL, *file = NULL;
        int64_t ln = 0;
        if (cp_lang_get((uint32_t)(pc & 0xffffffffu), &fn, &file, &ln) == 0) {
            line.function_id = add_function(b, fn, NULL, file);
            line.line = ln;
        }
        addr = 0;
    } else {
        mapping = mapping_for(b, pc);
        const sym *s = cp_cfg.symbolize_server ? NULL : symbolize(pc);
        if (s && s->name) {
            /* inlined functions first (leaf first), then the function itself */
            cp_line lines[SYM_MAX_INLINE + 1];
            uint32_t nl = 0;
            for (uint32_t k = 0; k < s->ninl; k++) {
                lines[nl].function_id =
                    add_function(b, s->inl[k].name, s->inl[k].mangled, s->inl[k].file);
                lines[nl++].line = s->inl[k].line;
            }
            lines[nl].function_id = add_function(b, s->name, s->mangled, s->file);
            lines[nl++].line = s->line;
            uint32_t id = 0;
            if (cp_profile_add_location(b->p, addr, mapping, lines, nl, &id) != 0) {
                b->err = CP_ENOMEM;
                return 0;
            }
            b->loc_pc[i] = pc;
            b->loc_id[i] = id;
            return id;
        }
    }
    uint32_t id = 0;
    if (cp_profile_add_location(b->p, addr, mapping, &line, line.function_id ? 1 : 0, &id) != 0) {
        b->err = CP_ENOMEM;
        return 0;
    }
    b->loc_pc[i] = pc;
    b->loc_id[i] = id;
    return id;
}

static void add_stack_sample(builder *b, const uint64_t *pcs, uint32_t n, const int64_t *vals)
{
    uint32_t locs[CP_MAX_FRAMES];
    uint32_t k = 0;
    for (uint32_t i = 0; i < n && i < CP_MAX_FRAMES; i++) {
        uint32_t id = location_for(b, pcs[i]);
        if (id) locs[k++] = id;
    }
    if (cp_profile_add_sample(b->p, locs, k, vals, NULL, 0) != 0) b->err = CP_ENOMEM;
}

/* ------------------------------------------------------------------------------------
 * Isolates present in a window */

typedef struct bucket_copy {
    cp_alloc_bucket *b;
    uint32_t n;
} bucket_copy;

typedef struct iso_set {
    iso_key *k;
    uint32_t n, cap;
} iso_set;

static void iso_add(iso_set *s, const iso_key *k)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (key_eq(&s->k[i], k)) return;
    if (s->n == s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 16;
        iso_key *nk = realloc(s->k, nc * sizeof(*nk));
        if (!nk) return;
        s->k = nk;
        s->cap = nc;
    }
    s->k[s->n++] = *k;
}

static const char *iso_name(const iso_key *k, const char **labels)
{
    *labels = NULL;
    if (!k->iso) return k->thread[0] ? k->thread : "unnamed";
    struct contprof_isolate *iso = &cp_isolates[k->iso - 1];
    *labels = iso->labels;
    return iso->name ? iso->name : "unknown";
}

static int add_labels_text(cp_labels *l, const char *text)
{
    if (!text) return 0;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq && eq > p) {
            char name[CP_LABEL_NAME_MAX + 1], value[256];
            size_t nl = (size_t)(eq - p), vl = len - nl - 1;
            if (nl <= CP_LABEL_NAME_MAX && vl < sizeof(value)) {
                memcpy(name, p, nl);
                name[nl] = 0;
                memcpy(value, eq + 1, vl);
                value[vl] = 0;
                if (cp_label_name_valid(name) && cp_labels_set(l, name, value) != 0)
                    return CP_ENOMEM;
            }
        }
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

static int emit_profile(builder *b, int kind, const iso_key *k, const cp_window_meta *m,
                        cp_emit_fn emit, void *arg)
{
    cp_profile *p = b->p;
    p->time_nanos = m->start_ns;
    p->duration_nanos = m->end_ns - m->start_ns;
    const char *ilabels;
    const char *iname = iso_name(k, &ilabels);
    char comment[256];
    uint32_t cid;
    snprintf(comment, sizeof(comment), "engine=%s", cp_engine);
    if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
        return CP_ENOMEM;
    snprintf(comment, sizeof(comment), "isolate=%s", iname);
    if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
        return CP_ENOMEM;
    snprintf(comment, sizeof(comment), "dropped_samples=%llu dropped_windows=%llu%s",
             (unsigned long long)m->dropped_samples, (unsigned long long)m->dropped_windows,
             atomic_load(&cp_agent_oom) ? " agent_out_of_memory=1" : "");
    if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
        return CP_ENOMEM;

    cp_envelope e;
    memset(&e, 0, sizeof(e));
    cp_buf buf = {0};
    int rc = CP_ENOMEM;
    /* Raw pprof: Kafka's lz4 compresses the batch (once, and ingest inflates nothing).
     * A window too big for Kafka's default 1 MB message limit goes gzip'd instead, at
     * level 1 (on a 6 KB profile 39 us against 123 us at level 6, for 16% more bytes).
     * Files written to --output-dir are always gzip'd (write_file). */
    if (cp_pprof_encode(p, 0, &buf) != 0) goto fail;
    if (buf.len > CP_RAW_PPROF_MAX) {
        cp_buf gz = {0};
        if (cp_gzip(buf.data, buf.len, 1, &gz) != 0) goto fail;
        cp_buf_close(&buf);
        buf = gz;
    }
    e.tenant = strdup(cp_cfg.tenant);
    e.producer_id = strdup(m->producer_id);
    e.engine = strdup(cp_engine);
    if (!e.tenant || !e.producer_id || !e.engine) goto fail;
    if (add_labels_text(&e.labels, cp_cfg.labels) || add_labels_text(&e.labels, ilabels)) goto fail;
    if (cp_labels_set(&e.labels, CP_LABEL_SERVICE, cp_cfg.service) ||
        (cp_cfg.version[0] && cp_labels_set(&e.labels, CP_LABEL_VERSION, cp_cfg.version)) ||
        cp_labels_set(&e.labels, CP_LABEL_INSTANCE, m->instance) ||
        cp_labels_set(&e.labels, CP_LABEL_ISOLATE, iname))
        goto fail;
    e.kind = kind;
    e.window_start_ns = m->start_ns;
    e.window_duration_ns = m->end_ns - m->start_ns;
    e.sequence = (*m->sequence)++;
    e.dropped_samples = m->dropped_samples;
    e.dropped_windows = m->dropped_windows;
    /* cumulative means "alloc totals since process start" (envelope.proto); the agent's
     * alloc is per window and inuse is a gauge by its kind, so neither is cumulative. */
    e.cumulative = 0;
    e.pprof = cp_buf_steal(&buf, &e.pprof_len);
    emit(&e, arg);
    return 0;
fail:
    cp_buf_close(&buf);
    cp_envelope_close(&e);
    return rc;
}

static int64_t rnd64(double v)
{
    return (int64_t)llround(v);
}

int cp_window_finish(const cp_window_meta *m, cp_emit_fn emit, void *arg)
{
    cp_modules_refresh(0);
    const cp_modules *mods = cp_modules_current();

    /* Copied into memory allocated before taking the sampler's lock. */
    bucket_copy bc = {0};
    uint32_t want = cp_alloc_nbuckets() + 64;
    bc.b = malloc((size_t)want * sizeof(cp_alloc_bucket));
    if (bc.b) bc.n = cp_alloc_snapshot(bc.b, want);

    iso_set isos = {0};
    for (uint32_t i = 0; i < cpu.cap; i++)
        if (cpu.e[i].hash) iso_add(&isos, &cpu.e[i].key);
    for (uint32_t i = 0; i < bc.n; i++) {
        iso_key k = {.iso = bc.b[i].isolate};
        memcpy(k.thread, bc.b[i].thread, sizeof(k.thread));
        if (bc.b[i].alloc_objects == 0 && bc.b[i].inuse_objects < 0.5) continue;
        if (k.iso && atomic_load(&cp_isolates[k.iso - 1].state) == CP_ISO_FREE) continue;
        iso_add(&isos, &k);
    }

    /* loads libdw the first time there is something; never with CONTPROF_SYMBOLIZE=server */
    if (isos.n && !cp_cfg.symbolize_server) syms_refresh(mods);
    int rc = 0;
    for (uint32_t ii = 0; ii < isos.n; ii++) {
        const iso_key *k = &isos.k[ii];
        for (int kind = CP_KIND_CPU; kind <= CP_KIND_INUSE; kind++) {
            builder b;
            if (b_init(&b, mods) != 0) {
                b_close(&b);
                rc = CP_ENOMEM;
                continue;
            }
            b_main_mapping_first(&b);
            int any = 0;
            if (kind == CP_KIND_CPU) {
                if (cp_profile_add_sample_type(b.p, "samples", "count") ||
                    cp_profile_add_sample_type(b.p, "cpu", "nanoseconds"))
                    b.err = CP_ENOMEM;
                b.p->period_type.type = str_id(&b, "cpu");
                b.p->period_type.unit = str_id(&b, "nanoseconds");
                b.p->period = cp_period_ns;
                b.p->default_sample_type = str_id(&b, "cpu");
                for (uint32_t i = 0; i < cpu.cap && !b.err; i++) {
                    cpu_entry *e = &cpu.e[i];
                    if (!e->hash || !key_eq(&e->key, k)) continue;
                    int64_t v[2] = {(int64_t)e->count, (int64_t)e->periods * cp_period_ns};
                    add_stack_sample(&b, e->pcs, e->nframes, v);
                    any = 1;
                }
            } else {
                int alloc = kind == CP_KIND_ALLOC;
                if (cp_profile_add_sample_type(b.p, alloc ? "alloc_objects" : "inuse_objects",
                                               "count") ||
                    cp_profile_add_sample_type(b.p, alloc ? "alloc_space" : "inuse_space", "bytes"))
                    b.err = CP_ENOMEM;
                b.p->period_type.type = str_id(&b, "space");
                b.p->period_type.unit = str_id(&b, "bytes");
                b.p->period = cp_cfg.alloc_rate;
                b.p->default_sample_type = str_id(&b, alloc ? "alloc_space" : "inuse_space");
                for (uint32_t i = 0; i < bc.n && !b.err; i++) {
                    const cp_alloc_bucket *ab = &bc.b[i];
                    iso_key bk = {.iso = ab->isolate};
                    memcpy(bk.thread, ab->thread, sizeof(bk.thread));
                    if (!key_eq(&bk, k)) continue;
                    double objs = alloc ? ab->alloc_objects : ab->inuse_objects;
                    double bytes = alloc ? ab->alloc_bytes : ab->inuse_bytes;
                    if (objs < 0.5) continue;
                    int64_t v[2] = {rnd64(objs), rnd64(bytes)};
                    add_stack_sample(&b, ab->pcs, ab->nframes, v);
                    any = 1;
                }
            }
            /* An isolate with CPU or allocations gets all three kinds each window, so a
             * quiet kind reads as zero rather than as missing. */
            (void)any;
            /* object addresses as file offsets: every process of a binary sends the same
             * frames (symbolizing above used the run-time addresses) */
            if (!b.err) cp_profile_canonicalize(b.p);
            if (!b.err)
                rc = emit_profile(&b, kind, k, m, emit, arg);
            else
                rc = b.err;
            b_close(&b);
        }
    }
    free(isos.k);
    free(bc.b);
    cpu_clear();
    return rc;
}

void cp_window_reset(void)
{
    cpu_clear();
    syms_clear();
}

void cp_window_abandon(void)
{
    /* The parent's agent may have been half way through changing these when it forked:
     * forget them without touching them (the memory is lost once per fork). */
    memset(&cpu, 0, sizeof(cpu));
    memset(&syms, 0, sizeof(syms));
}

uint64_t cp_window_take_dropped(void)
{
    uint64_t d = cpu.dropped;
    cpu.dropped = 0;
    return d;
}
