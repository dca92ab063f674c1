/* Window building on the agent thread: the CPU aggregation table, the symbol cache (function
 * names from elfnames.c tables by default, libdw for file:line and inline frames with
 * CONTPROF_SYMBOLIZE=lines; a CPU budget per window), the per-isolate cpu/alloc/inuse
 * profiles wrapped in envelopes, and the contprof-agent isolate's profile of the agent's
 * own CPU. */
#include "guard.h"
#include "window.h"

#include <sys/auxv.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "capture.h"
#include "demangle.h"
#include "elfnames.h"
#include "elfplt.h"
#include "namecache.h"
#include "relay.h"
#include "fmath.h"
#include "isolate.h"
#include "python.h"
#include "labels.h"
#include "nodeworker.h"
#include "nextmalloc.h"
#include "perfmap.h"
#include "pprof.h"
#include "profile.h"
#include "stream.h"
#include "unwind.h"

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

typedef struct cpu_table {
    cpu_entry *e;
    uint32_t n, cap; /* cap: power of two slots; n used */
    uint64_t dropped;
} cpu_table;

/* The window's table, and one per capture slot (captable.h): a capture's samples, with
 * count = samples and periods = nanoseconds, flushed every capture window. */
static cpu_table cpu;
static cpu_table capcpu[CP_WINDOW_CAPTURE_SLOTS];
#define CAPTURE_MAX_ENTRIES 8192u
#define CAPTURE_MAX_TOTAL 32768u /* slots, over every capture's table */

static uint64_t stack_hash(const iso_key *k, const uint64_t *pcs, uint32_t n)
{
    uint64_t h = cp_hash_bytes(pcs, n * sizeof(uint64_t), k->iso);
    if (!k->iso) h = cp_hash_bytes(k->thread, strnlen(k->thread, 16), h);
    return h | 1; /* 0 marks an empty slot */
}

static int cpu_grow(cpu_table *t)
{
    /* small at first: a short process has a few stacks, and each page calloc touches is
     * a fault it pays for */
    uint32_t ncap = t->cap ? t->cap * 2 : 64;
    cpu_entry *ne = calloc(ncap, sizeof(*ne));
    if (!ne) return CP_ENOMEM;
    for (uint32_t i = 0; i < t->cap; i++) {
        if (!t->e[i].hash) continue;
        uint32_t j = (uint32_t)t->e[i].hash & (ncap - 1);
        while (ne[j].hash)
            j = (j + 1) & (ncap - 1);
        ne[j] = t->e[i];
    }
    free(t->e);
    t->e = ne;
    t->cap = ncap;
    return 0;
}

/* Adds a sample (count 1, periods as given) to table t. */
static void cpu_add(cpu_table *t, const cp_sample_rec *r, const char *thread, uint64_t count,
                    uint64_t periods, uint32_t max_entries)
{
    iso_key k = {.iso = r->isolate};
    if (!k.iso) {
        size_t n = strnlen(thread, 15);
        memcpy(k.thread, thread, n);
    }
    uint64_t h = stack_hash(&k, r->pcs, r->nframes);
    if (t->n * 2 >= t->cap && t->n < max_entries) cpu_grow(t);
    if (!t->cap) {
        t->dropped += count;
        return;
    }
    uint32_t mask = t->cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        cpu_entry *e = &t->e[i];
        if (!e->hash) {
            if (t->n * 2 >= t->cap) {
                t->dropped += count;
                return;
            }
            e->pcs = malloc(r->nframes * sizeof(uint64_t) + 1);
            if (!e->pcs) {
                t->dropped += count;
                return;
            }
            memcpy(e->pcs, r->pcs, r->nframes * sizeof(uint64_t));
            e->hash = h;
            e->key = k;
            e->nframes = r->nframes;
            e->count = count;
            e->periods = periods;
            t->n++;
            return;
        }
        if (e->hash == h && key_eq(&e->key, &k) && e->nframes == r->nframes &&
            memcmp(e->pcs, r->pcs, r->nframes * sizeof(uint64_t)) == 0) {
            e->count += count;
            e->periods += periods;
            return;
        }
    }
}

void cp_window_add_cpu(const cp_sample_rec *r, const char *thread)
{
    CP_ASSERT_AGENT_THREAD();
    cpu_add(&cpu, r, thread, 1, r->weight, CPU_MAX_ENTRIES);
}

void cp_window_add_capture_cpu(unsigned slot, const cp_sample_rec *r, const char *thread,
                               int64_t ns)
{
    CP_ASSERT_AGENT_THREAD();
    if (slot >= CP_WINDOW_CAPTURE_SLOTS) return;
    /* bounded: CAPTURE_MAX_ENTRIES stacks a capture window, all captures' tables together
     * CAPTURE_MAX_TOTAL (past them samples are dropped, counted in the envelopes) */
    uint32_t total = 0;
    for (unsigned i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++)
        total += capcpu[i].cap;
    uint32_t max = total >= CAPTURE_MAX_TOTAL ? capcpu[slot].n : CAPTURE_MAX_ENTRIES;
    cpu_add(&capcpu[slot], r, thread, r->weight ? r->weight : 1, (uint64_t)ns, max);
}

static void cpu_table_clear(cpu_table *t)
{
    for (uint32_t i = 0; i < t->cap; i++)
        free(t->e[i].pcs);
    free(t->e);
    memset(t, 0, sizeof(*t));
}

static void cpu_clear(void)
{
    cpu_table_clear(&cpu);
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

#define SYM_CAP (1u << 15)
#define SYM_CAP0                                                                                   \
    (1u << 6) /* the first size, one page: 1,024 slots faulted 13 pages into every short process   \
               */

static struct {
    Dwfl *dwfl;
    uint64_t adds, subs;
    sym *tab;
    uint32_t n, cap; /* cap: power of two, SYM_CAP0 to SYM_CAP */
    /* this window: CPU spent naming pcs, and pcs left unnamed over the budget */
    int64_t spent_ns;
    uint64_t over_budget;
} syms;

static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------
 * Function names without libdw (the default): one elfnames.c table per object, built the
 * first time one of its pcs is named, kept per build id (else path) for the process. */

#define MODSYM_MAX 512
#define MODSYM_MAX_BYTES ((size_t)64 << 20)
#define DEBUG_DIR "/usr/lib/debug"

typedef struct modsym {
    uint32_t build_id_len;
    uint8_t build_id[CP_BUILD_ID_MAX];
    char path[CP_MODULE_PATH_MAX];
    uint8_t built;       /* t was read (or failed) */
    uint8_t scanned;     /* a window named its pcs with one pass (cp_elfnames_scan) */
    uint8_t cache_tried; /* the host's name cache was looked in (nc) */
    uint8_t read;        /* named from its own symbols (counted in tables.read) */
    cp_elfnames *t;      /* NULL: not built, or the object has no names we can read */
    cp_namecache nc;     /* the host's names of the object, mapped (base NULL: none) */
} modsym;

static struct {
    modsym *v;
    uint32_t n, cap, last;
    size_t bytes;
    uint64_t from_cache; /* objects named from the host's name cache, for the process */
    uint64_t read;       /* objects named from their own symbol tables, for the process */
    int dir_checked;     /* the names directory was looked at (once a process) */
    int dir_refused;     /* ... and is missing, or was refused (said once) */
} tables;

static void tables_clear(void)
{
    for (uint32_t i = 0; i < tables.n; i++) {
        cp_elfnames_destroy(tables.v[i].t);
        cp_namecache_close(&tables.v[i].nc);
    }
    free(tables.v);
    uint64_t from_cache = tables.from_cache, read = tables.read;
    int checked = tables.dir_checked, refused = tables.dir_refused;
    memset(&tables, 0, sizeof(tables));
    tables.from_cache = from_cache;
    tables.read = read;
    tables.dir_checked = checked;
    tables.dir_refused = refused;
}

static int modsym_is(const modsym *e, const cp_module *m)
{
    if (e->build_id_len != m->build_id_len) return 0;
    if (m->build_id_len) return memcmp(e->build_id, m->build_id, m->build_id_len) == 0;
    return strcmp(e->path, m->path) == 0;
}

/* m's entry, added (not built) if new; NULL out of memory. */
static modsym *modsym_get(const cp_module *m)
{
    if (tables.last < tables.n && modsym_is(&tables.v[tables.last], m))
        return &tables.v[tables.last];
    for (uint32_t i = 0; i < tables.n; i++)
        if (modsym_is(&tables.v[i], m)) {
            tables.last = i;
            return &tables.v[i];
        }
    if (atomic_load(&cp_agent_oom)) return NULL; /* out of memory once: no new tables */
    if (tables.n == MODSYM_MAX || tables.bytes > MODSYM_MAX_BYTES) tables_clear(); /* bounded */
    if (tables.n == tables.cap) {
        /* grown as objects come (a short process names 2-3: 176 KiB at once was an mmap
         * and its faults); entries move, so no caller keeps one across a modsym_get */
        uint32_t cap = tables.cap ? tables.cap * 2 : 8;
        modsym *v = realloc(tables.v, (size_t)cap * sizeof(modsym));
        if (!v) return NULL;
        tables.v = v;
        tables.cap = cap;
    }
    modsym *e = &tables.v[tables.n];
    memset(e, 0, sizeof(*e));
    e->build_id_len = m->build_id_len;
    memcpy(e->build_id, m->build_id, m->build_id_len);
    memcpy(e->path, m->path, sizeof(e->path));
    tables.last = tables.n++;
    return e;
}

static const char *debug_dir(void)
{
    return cp_cfg.debuginfo == CP_DEBUGINFO_NONE ? NULL : DEBUG_DIR;
}

/* ------------------------------------------------------------------------------------
 * The host's name cache (namecache.h): with a relay, an object with a build id is named
 * from the relay's names file when there is one; one the process had to read is asked of
 * the relay ('N' frames, handed to the sink by cp_window_take_names_wants). */

#define WANTS_MAX 8

static struct {
    uint8_t p[WANTS_MAX][CP_RELAY_NAMES_MAX];
    size_t len[WANTS_MAX];
    uint32_t n;
} wants CP_BIG;

static unsigned cache_flags(void)
{
    return debug_dir() ? CP_NAMECACHE_DEBUG : 0;
}

/* e's names from the host's cache, mapped on first use; NULL: none (no relay, no build id,
 * no file or a file refused: the object is named from its own symbols). */
static const cp_namecache *cache_for(modsym *e, const cp_module *m)
{
    if (e->cache_tried) return e->nc.base ? &e->nc : NULL;
    e->cache_tried = 1;
    if (!cp_cfg.relay_dir[0] || !cp_cfg.names_cache || m->build_id_len < 2 || tables.dir_refused)
        return NULL;
    if (!tables.dir_checked) {
        /* once a process (the directory is the relay's: only root or the relay changes it) */
        cp_err err = {0};
        int rc = cp_namecache_dir_check(cp_cfg.relay_dir, &err);
        if (rc == CP_EIO) /* there, and not trusted: said once, names read from the objects */
            fprintf(stderr, "contprof: %s\n", err.msg);
        tables.dir_refused = rc != 0;
        tables.dir_checked = 1;
        if (rc != 0) return NULL;
    }
    if (cp_namecache_open_path(cp_cfg.relay_dir, m->build_id, m->build_id_len, cache_flags(),
                               &e->nc) != 0)
        return NULL;
    tables.from_cache++;
    return &e->nc;
}

/* m was named from its own symbols (source: CP_ELFNAMES_*): asks the relay for its file. */
static void want_names(const cp_module *m, int source)
{
    if (!cp_cfg.relay_dir[0] || !cp_cfg.names_cache || m->build_id_len < 2 || wants.n == WANTS_MAX)
        return;
    cp_relay_names n = {.flags = (uint8_t)cache_flags(),
                        .source = (uint8_t)source,
                        .id_len = (uint8_t)m->build_id_len};
    memcpy(n.id, m->build_id, m->build_id_len);
    snprintf(n.path, sizeof(n.path), "%s", m->path);
    size_t len = cp_relay_names_encode(&n, wants.p[wants.n]);
    if (len) wants.len[wants.n++] = len;
}

uint32_t cp_window_take_names_wants(void (*fn)(const uint8_t *p, size_t len, void *arg), void *arg)
{
    uint32_t n = wants.n;
    for (uint32_t i = 0; i < n; i++)
        fn(wants.p[i], wants.len[i], arg);
    wants.n = 0;
    return n;
}

/* m's table, read now if it never was; NULL when it has none (or out of memory). */
static const cp_elfnames *table_for(const cp_module *m)
{
    modsym *e = modsym_get(m);
    if (!e) return NULL;
    if (!e->built) {
        /* any failure (no symbols, damaged, out of memory) is remembered as t = NULL: the
         * file is not read again for each of its pcs */
        if (cp_elfnames_create(m->path, m->build_id, m->build_id_len, debug_dir(), &e->t) != 0)
            e->t = NULL;
        else if (!e->read && (e->read = 1))
            tables.read++;
        e->built = 1;
        tables.bytes += cp_elfnames_bytes(e->t);
    }
    return e->t;
}

/* Separate debug files' DWARF (/usr/lib/debug, libc6-dbg...) is large: reading it would
 * cost the host tens of MiB. With CONTPROF_SYMBOLIZE=lines only an object's own symbols
 * and DWARF are used by libdw unless CONTPROF_DEBUGINFO=1; the mappings' build ids let a
 * server symbolize the rest. (Names by default read the debug file's symbol table only.) */
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

/* Empties the per-pc cache (keeps its memory). */
static void syms_drop(void)
{
    if (!syms.tab) return;
    for (uint32_t i = 0; i < syms.cap; i++)
        sym_free(&syms.tab[i]);
    memset(syms.tab, 0, syms.cap * sizeof(sym));
    syms.n = 0;
}

/* The per-pc cache, allocated small the first time. Returns 0 or CP_ENOMEM. */
static int syms_init(void)
{
    if (syms.tab) return 0;
    if (!(syms.tab = calloc(SYM_CAP0, sizeof(sym)))) return CP_ENOMEM;
    syms.cap = SYM_CAP0;
    return 0;
}

static void syms_clear(void)
{
    tables_clear();
    syms_drop();
    free(syms.tab);
    if (syms.dwfl) dw.dwfl_end(syms.dwfl);
    memset(&syms, 0, sizeof(syms));
}

static void syms_refresh(const cp_modules *mods)
{
    if (atomic_load(&cp_agent_oom)) return; /* see symbolize */
    if (!cp_cfg.symbolize_lines) {
        /* names: the tables are per build id and stay; cached pcs of unloaded objects go */
        if (mods && mods->subs != syms.subs) syms_drop();
        if (mods) {
            syms.adds = mods->adds;
            syms.subs = mods->subs;
        }
        return;
    }
    if (!dw_load()) return; /* names stay addresses */
    if (syms.dwfl && mods && mods->adds == syms.adds && mods->subs == syms.subs) return;
    if (syms.dwfl) dw.dwfl_end(syms.dwfl);
    dwfl_cbs.find_elf = dw.dwfl_linux_proc_find_elf;
    dwfl_cbs.find_debuginfo =
        cp_cfg.debuginfo == CP_DEBUGINFO_ALL ? dw.dwfl_standard_find_debuginfo : own_debuginfo_only;
    syms.dwfl = dw.dwfl_begin(&dwfl_cbs);
    if (syms.dwfl) {
        dw.dwfl_report_begin(syms.dwfl);
        if (dw.dwfl_linux_proc_report(syms.dwfl, getpid()) != 0 ||
            dw.dwfl_report_end(syms.dwfl, NULL, NULL) != 0) {
            dw.dwfl_end(syms.dwfl);
            syms.dwfl = NULL;
        }
    }
    /* addresses of unloaded objects may now mean something else (compared before the
     * counters are updated below) */
    if (mods && mods->subs != syms.subs) syms_drop();
    if (mods) {
        syms.adds = mods->adds;
        syms.subs = mods->subs;
    }
}

/* The program's C++ runtime's demangler, if it exports one (looked up once). */
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

/* Sets *name (demangled when possible) and *mangled from a symbol or linkage name. */
static void set_name(const char *raw, char **name, char **mangled)
{
    /* C++ and Rust names, with libiberty's demanglers (model/demangle.h); a C++ name that
     * Debian 12's libiberty does not know (C++20 constraints, "Q") with the program's own
     * __cxa_demangle, when it exports one */
    char *d = cp_demangle(raw);
    if (!d && raw[0] == '_' && raw[1] == 'Z' && find_demangler()) {
        int st = -1;
        d = find_demangler()(raw, NULL, NULL, &st);
        if (st != 0) {
            free(d);
            d = NULL;
        }
    }
    if (d) {
        *name = d;
        *mangled = strdup(raw);
        return;
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

/* pc's names, cached; NULL when the window's budget is spent (the pc is not cached: a
 * later window names it). pcs in no module (JIT code) are not looked up at all. */
/* pc's cache slot: its entry, or the empty slot where it would go. */
static sym *sym_slot(uint64_t pc)
{
    uint32_t mask = syms.cap - 1;
    uint32_t i = (uint32_t)cp_hash_u64(0, pc) & mask;
    while (syms.tab[i].pc && syms.tab[i].pc != pc)
        i = (i + 1) & mask;
    return &syms.tab[i];
}

/* Doubles the cache. Returns 0 or CP_ENOMEM (the cache is unchanged). */
static int syms_grow(void)
{
    uint32_t ncap = syms.cap * 2, mask = ncap - 1;
    sym *nt = calloc(ncap, sizeof(sym));
    if (!nt) return CP_ENOMEM;
    for (uint32_t i = 0; i < syms.cap; i++) {
        if (!syms.tab[i].pc) continue;
        uint32_t j = (uint32_t)cp_hash_u64(0, syms.tab[i].pc) & mask;
        while (nt[j].pc)
            j = (j + 1) & mask;
        nt[j] = syms.tab[i];
    }
    free(syms.tab);
    syms.tab = nt;
    syms.cap = ncap;
    return 0;
}

/* A new entry for pc (not cached): the cache grows up to SYM_CAP, then starts over. */
static sym *sym_add(uint64_t pc)
{
    if (syms.n >= syms.cap / 2 && (syms.cap == SYM_CAP || syms_grow() != 0)) syms_drop();
    sym *s = sym_slot(pc);
    s->pc = pc;
    syms.n++;
    return s;
}

static int pc_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The window's allocation buckets, copied out of the sampler (cp_window_finish). */
typedef struct bucket_copy {
    cp_alloc_bucket *b;
    uint32_t n;
} bucket_copy;

/* Before the window's profiles are built: the window's new pcs in objects that have no
 * table yet are named with one pass over each object's symbols (cp_elfnames_scan), into
 * the cache. A short-lived process (make's cc1, as...) names its pcs once, and a pass is
 * cheaper than sorting every symbol of the object into a table; an object that has new
 * pcs again in a later window gets its table then (symbolize). */
static void name_new_pcs(const cp_modules *mods, const bucket_copy *bc)
{
    if (cp_cfg.symbolize_lines || cp_cfg.symbolize_server || !mods) return;
    if (atomic_load(&cp_agent_oom)) return;
    if (syms_init() != 0) return;
    int64_t t0 = thread_cpu_ns();
    /* room for every frame of the window (fresh pages cost a short-lived process more than
     * the rest); more new pcs than SYM_CAP / 4: left to symbolize */
    uint64_t frames = 1;
    for (uint32_t i = 0; i < cpu.cap; i++)
        frames += cpu.e[i].hash ? cpu.e[i].nframes : 0;
    for (uint32_t i = 0; i < bc->n; i++)
        frames += bc->b[i].nframes;
    uint32_t cap = frames < SYM_CAP / 4 ? (uint32_t)frames : SYM_CAP / 4, n = 0;
    uint64_t *pcs = malloc(cap * sizeof(uint64_t));
    char **names = malloc(cap * sizeof(char *));
    uint64_t *va = malloc(cap * sizeof(uint64_t));
    if (!pcs || !names || !va) goto out;
    for (uint32_t i = 0; i < cpu.cap && n < cap; i++)
        for (uint32_t k = 0; cpu.e[i].hash && k < cpu.e[i].nframes && n < cap; k++)
            if (!sym_slot(cpu.e[i].pcs[k])->pc) pcs[n++] = cpu.e[i].pcs[k];
    for (uint32_t i = 0; i < bc->n && n < cap; i++)
        for (uint32_t k = 0; k < bc->b[i].nframes && n < cap; k++)
            if (!sym_slot(bc->b[i].pcs[k])->pc) pcs[n++] = bc->b[i].pcs[k];
    if (n == SYM_CAP / 4 || syms.n + n >= SYM_CAP / 2) goto out; /* the cache would start over */
    qsort(pcs, n, sizeof(uint64_t), pc_cmp);
    uint32_t u = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!(pcs[i] & CP_LANG_TAG) && (u == 0 || pcs[i] != pcs[u - 1])) pcs[u++] = pcs[i];
    /* the pcs of one object are consecutive: modules are disjoint ranges */
    for (uint32_t i = 0; i < u;) {
        const cp_module *m = cp_modules_find(mods, (uintptr_t)pcs[i]);
        uint32_t e = i + 1;
        while (e < u && m && pcs[e] < m->hi)
            e++;
        modsym *ms = m ? modsym_get(m) : NULL;
        const cp_namecache *nc = ms && !ms->built ? cache_for(ms, m) : NULL;
        if (nc) {
            for (uint32_t k = i; k < e; k++) {
                size_t len = 0;
                const char *nm = cp_namecache_lookup(nc, pcs[k] - m->bias, &len);
                char *raw = nm ? strndup(nm, len) : NULL;
                sym *s = sym_add(pcs[k]);
                if (raw) set_name(raw, &s->name, &s->mangled);
                free(raw);
            }
        } else if (ms && !ms->built && !ms->scanned &&
                   !(cp_cfg.symbolize_budget_ns > 0 &&
                     syms.spent_ns + (thread_cpu_ns() - t0) >= cp_cfg.symbolize_budget_ns)) {
            ms->scanned = 1;
            for (uint32_t k = i; k < e; k++)
                va[k - i] = pcs[k] - m->bias;
            int source = 0;
            if (cp_elfnames_scan(m->path, m->build_id, m->build_id_len, debug_dir(), va, e - i,
                                 names, &source) == 0) {
                int named = 0;
                for (uint32_t k = i; k < e; k++) {
                    sym *s = sym_add(pcs[k]);
                    size_t nl = names[k - i] ? strlen(names[k - i]) : 0;
                    named |= nl && strcmp(names[k - i], CP_PLT_UNNAMED) != 0 &&
                             !(nl > 4 && !strcmp(names[k - i] + nl - 4, "@plt"));
                    if (names[k - i]) set_name(names[k - i], &s->name, &s->mangled);
                    free(names[k - i]);
                }
                /* an object with no function symbol (dash: a .dynsym of imports; names of
                 * its PLT stubs only) has no table to cache: not asked for */
                if (named) want_names(m, source);
                if (!ms->read && (ms->read = 1)) tables.read++;
            }
        }
        i = e;
    }
out:
    free(pcs);
    free(names);
    free(va);
    syms.spent_ns += thread_cpu_ns() - t0;
}

static const sym *symbolize(uint64_t pc, const cp_modules *mods)
{
    static sym none;
    const cp_module *m = cp_modules_find(mods, (uintptr_t)pc);
    if (!m) return &none;
    if (atomic_load(&cp_agent_oom)) {
        /* out of memory once: libdw is not used again (addresses and build ids remain) */
        if (syms.dwfl) dw.dwfl_end(syms.dwfl);
        syms.dwfl = NULL;
    }
    if (syms_init() != 0) return &none;
    sym *s = sym_slot(pc);
    if (s->pc == pc) return s;
    if (cp_cfg.symbolize_budget_ns > 0 && syms.spent_ns >= cp_cfg.symbolize_budget_ns) {
        syms.over_budget++;
        return NULL;
    }
    int64_t t0 = thread_cpu_ns();
    s = sym_add(pc);
    if (!cp_cfg.symbolize_lines) {
        modsym *e = modsym_get(m);
        const cp_namecache *nc = e && !e->built ? cache_for(e, m) : NULL;
        const cp_elfnames *t = nc ? NULL : table_for(m);
        size_t len = 0;
        const char *name = nc  ? cp_namecache_lookup(nc, pc - m->bias, &len)
                           : t ? cp_elfnames_lookup(t, pc - m->bias, &len)
                               : NULL;
        char *raw = name ? strndup(name, len) : NULL;
        if (raw) set_name(raw, &s->name, &s->mangled);
        free(raw);
        syms.spent_ns += thread_cpu_ns() - t0;
        return s;
    }
    Dwfl_Module *dm = syms.dwfl ? dw.dwfl_addrmodule(syms.dwfl, pc) : NULL;
    if (dm) {
        const char *name = dw.dwfl_module_addrname(dm, pc);
        if (name) set_name(name, &s->name, &s->mangled);
        Dwfl_Line *l = dw.dwfl_module_getsrc(dm, pc);
        if (l) {
            int line = 0;
            const char *file = dw.dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL);
            if (file) {
                if (s->name) inline_frames(dm, pc, s, &file, &line);
                if (file) s->file = strdup(file);
                s->line = line;
            }
        }
    }
    syms.spent_ns += thread_cpu_ns() - t0;
    return s;
}

/* ------------------------------------------------------------------------------------
 * JIT frames: pcs in no module are named from the process's perf map (perfmap.c) as
 * language frames (CP_LANG_TAG ids, cp_lang_intern): by name, with no mapping or address,
 * so they merge across processes and keep their meaning for the process's life (epochs).
 * This holds with CONTPROF_SYMBOLIZE=server too: a map entry is the only name JIT code
 * has. A pc with no entry is the frame "[jit]", never a bare address. */

/* The hint naming V8's perf-map flags is said once, and only where it can help: a V8 host
 * without a map whose CPU samples in unnamed JIT code (stacks with a [jit] frame) reach
 * JIT_HINT_SAMPLES over its life, 100 ms of CPU at 100 Hz. Why: `node -e 0`, a short CLI
 * or a process that spends its time in C++ has none or a few such samples, and the line
 * was noise in every one of them; below the bound [jit] is too small a part of any
 * profile to be worth a restart with other flags. */
#define JIT_HINT_SAMPLES 10

static struct {
    uint32_t unnamed_id;      /* "[jit]"'s language id + 1 */
    uint64_t unnamed_samples; /* CPU samples with a [jit] frame, over the process's life */
    int hint_said;            /* the perf-map hint was said (or cannot help: a map exists) */
    int native_said;          /* the --interpreted-frames-native-stack hint was weighed */
} jit;

/* Whether a module of mods looks like a V8 host: node, libnode, workerd, libv8. */
static int v8_host(const cp_modules *mods)
{
    for (size_t i = 0; mods && i < mods->n; i++) {
        const char *b = strrchr(mods->m[i].path, '/');
        b = b ? b + 1 : mods->m[i].path;
        if (strncmp(b, "node", 4) == 0 || strncmp(b, "libnode", 7) == 0 ||
            strncmp(b, "workerd", 7) == 0 || strncmp(b, "libv8", 5) == 0)
            return 1;
    }
    return 0;
}

/* node with a perf map but without --interpreted-frames-native-stack (its command line,
 * NODE_OPTIONS): every interpreted function runs in V8's one InterpreterEntryTrampoline,
 * which is all its samples show. Said once per process, once the map is read. */
static void native_stack_hint(const cp_modules *mods)
{
    cp_perfmap_stats st;
    cp_perfmap_get_stats(&st);
    if (!st.found) return;
    jit.native_said = 1;
    char args[8192];
    ssize_t n = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, args, sizeof(args));
        close(fd);
    }
    if (v8_host(mods) &&
        cp_perfmap_needs_native_stack(args, n > 0 ? (size_t)n : 0, getenv("NODE_OPTIONS")))
        fprintf(stderr, "contprof: V8 writes a perf map without --interpreted-frames-native-stack: "
                        "interpreted JavaScript reads Builtins_InterpreterEntryTrampoline without "
                        "its function; add --interpreted-frames-native-stack\n");
}

static uint64_t jit_unnamed(uint64_t pc)
{
    if (!jit.unnamed_id) {
        uint32_t id;
        contprof_frame f = {.function = "[jit]"};
        if (cp_lang_intern(&f, &id) != 0) return pc;
        jit.unnamed_id = id + 1;
    }
    return CP_LANG_TAG | (jit.unnamed_id - 1);
}

static uint64_t jit_frame(uint64_t pc, int *unnamed)
{
    const char *name;
    size_t len;
    uint32_t slot;
    if (cp_perfmap_lookup(pc, &name, &len, &slot) != 0) {
        *unnamed = 1;
        return jit_unnamed(pc);
    }
    uint64_t tag = cp_perfmap_get_tag(slot);
    if (tag) return CP_LANG_TAG | (tag - 1);
    cp_perfmap_name n;
    cp_perfmap_split(name, len, &n);
    contprof_frame f = {.function = n.function, .file = n.file[0] ? n.file : NULL, .line = n.line};
    uint32_t id;
    if (cp_lang_intern(&f, &id) != 0) return jit_unnamed(pc); /* named in the map: no hint */
    cp_perfmap_set_tag(slot, (uint64_t)id + 1);
    return CP_LANG_TAG | id;
}

/* Rewrites the stack's pcs in no module; returns whether one of them has no map entry. */
static int jit_stack(const cp_modules *mods, uint64_t *pcs, uint32_t n, int *refreshed)
{
    int unnamed = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t pc = pcs[k];
        if ((pc & CP_LANG_TAG) || cp_modules_find(mods, (uintptr_t)pc)) continue;
        if (!*refreshed) {
            *refreshed = 1;
            (void)cp_perfmap_refresh(NULL);
        }
        pcs[k] = jit_frame(pc, &unnamed);
    }
    return unnamed;
}

/* Rewrites the window's pcs in no module (CPU and allocation stacks) as language frames;
 * the perf map is read (its new tail) once per window, only when there is such a pc. */
static void jit_frames(const cp_modules *mods, bucket_copy *bc)
{
    if (!mods) return;
    int refreshed = 0;
    for (uint32_t i = 0; i < cpu.cap; i++)
        if (cpu.e[i].hash && jit_stack(mods, cpu.e[i].pcs, cpu.e[i].nframes, &refreshed))
            jit.unnamed_samples += cpu.e[i].count;
    for (uint32_t i = 0; i < bc->n; i++) {
        cp_py_resolve(bc->b[i].pcs, bc->b[i].nframes); /* allocation stacks: named here */
        jit_stack(mods, bc->b[i].pcs, bc->b[i].nframes, &refreshed);
    }
    if (refreshed && !jit.native_said) native_stack_hint(mods);
    if (!jit.hint_said && jit.unnamed_samples >= JIT_HINT_SAMPLES) {
        jit.hint_said = 1;
        cp_perfmap_stats st;
        cp_perfmap_get_stats(&st); /* read this window: there were pcs in no module */
        if (!st.found && v8_host(mods))
            fprintf(stderr, "contprof: a V8 host without a perf map: JavaScript frames read "
                            "[jit]; start it with --perf-basic-prof "
                            "--interpreted-frames-native-stack (node), or v8Flags = "
                            "[\"--perf-basic-prof\", \"--interpreted-frames-native-stack\"] "
                            "in its config (workerd)\n");
    }
}

/* ------------------------------------------------------------------------------------
 * Node's worker_threads as isolates (nodeworker.h): in a V8 host, each new thread's start
 * routine is named from its object's symbols (a table already built, else one pass); a
 * Worker's thread gets its worker's label before its samples are drained. Verdicts are
 * kept per start routine (at most STARTS_MAX: past them, a routine is named again). */

#define STARTS_MAX 64

static struct {
    const cp_modules *mods; /* the snapshot v8 was found for */
    int v8;
    uint32_t n;
    uintptr_t fn[STARTS_MAX];
    uint8_t is_worker[STARTS_MAX];
    int unreadable_said;
} starts;

/* The symbol (mangled) holding pc, into buf; 0 or CP_ENOTFOUND. */
static int start_symbol(const cp_modules *mods, uintptr_t pc, char *buf, size_t cap)
{
    const cp_module *m = cp_modules_find(mods, pc);
    if (!m) return CP_ENOTFOUND;
    for (uint32_t i = 0; i < tables.n; i++)
        if (modsym_is(&tables.v[i], m) && tables.v[i].nc.base) {
            size_t len = 0;
            const char *nm = cp_namecache_lookup(&tables.v[i].nc, pc - m->bias, &len);
            if (!nm) return CP_ENOTFOUND;
            snprintf(buf, cap, "%.*s", (int)len, nm);
            return 0;
        } else if (modsym_is(&tables.v[i], m) && tables.v[i].built) {
            size_t len = 0;
            const char *nm =
                tables.v[i].t ? cp_elfnames_lookup(tables.v[i].t, pc - m->bias, &len) : NULL;
            if (!nm) return CP_ENOTFOUND;
            snprintf(buf, cap, "%.*s", (int)len, nm);
            return 0;
        }
    uint64_t va = pc - m->bias;
    char *name = NULL;
    if (cp_elfnames_scan(m->path, m->build_id, m->build_id_len, debug_dir(), &va, 1, &name, NULL) !=
            0 ||
        !name)
        return CP_ENOTFOUND;
    snprintf(buf, cap, "%s", name);
    free(name);
    return 0;
}

static int is_worker_start(const cp_modules *mods, uintptr_t fn)
{
    for (uint32_t i = 0; i < starts.n; i++)
        if (starts.fn[i] == fn) return starts.is_worker[i];
    char name[1024];
    int yes = start_symbol(mods, fn, name, sizeof(name)) == 0 && cp_nodeworker_is_start(name);
    if (starts.n < STARTS_MAX) {
        starts.fn[starts.n] = fn;
        starts.is_worker[starts.n++] = (uint8_t)yes;
    }
    return yes;
}

void cp_window_label_threads(void)
{
    CP_ASSERT_AGENT_THREAD();
    const cp_modules *mods = cp_modules_current();
    if (!mods) return;
    if (mods != starts.mods) {
        starts.mods = mods;
        starts.v8 = v8_host(mods);
    }
    if (!starts.v8) return;
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_LIVE || atomic_load(&t->start_checked)) continue;
        uintptr_t fn = atomic_load_explicit(&t->start_fn, memory_order_acquire);
        if (!fn) continue;
        atomic_store(&t->start_checked, 1);
        if (!is_worker_start(mods, fn)) continue;
        char label[16];
        int rc = cp_nodeworker_label(t->start_arg, label);
        if (rc == 0) {
            cp_thread_set_label(t, label);
        } else if (!starts.unreadable_said) {
            starts.unreadable_said = 1;
            fprintf(stderr,
                    "contprof: a Node.js worker thread's Worker object %s (%s): worker threads "
                    "keep the thread's name as their isolate\n",
                    rc == CP_EIO ? "cannot be read" : "has an unknown layout",
                    rc == CP_EIO ? strerror(errno) : "no name and threadId fields found");
        }
    }
}

/* ------------------------------------------------------------------------------------
 * Symbolization for the streams' tables (stream.c adds each location once per epoch) */

static uint32_t sym_lines(uint64_t pc, cp_sym_line *lines, void *arg)
{
    const sym *s = symbolize(pc, arg);
    if (!s || !s->name) return 0;
    /* inlined functions first (leaf first), then the function itself */
    uint32_t nl = 0;
    for (uint32_t k = 0; k < s->ninl && nl < CP_SYM_MAX_LINES - 1; k++)
        lines[nl++] =
            (cp_sym_line){s->inl[k].name, s->inl[k].mangled, s->inl[k].file, s->inl[k].line};
    lines[nl++] = (cp_sym_line){s->name, s->mangled, s->file, s->line};
    return nl;
}

/* ------------------------------------------------------------------------------------
 * Isolates present in a window */

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

/* An isolate's labels as its envelopes carry them: CONTPROF_LABELS, the isolate's own,
 * service, version, instance, isolate; scrubbed. Returns 0 or CP_ENOMEM. */
static int isolate_labels(cp_labels *l, const iso_key *k, const char *instance)
{
    const char *ilabels;
    const char *iname = iso_name(k, &ilabels);
    if (add_labels_text(l, cp_cfg.labels) || add_labels_text(l, ilabels)) return CP_ENOMEM;
    if (cp_labels_set(l, CP_LABEL_SERVICE, cp_cfg.service) ||
        (cp_cfg.version[0] && cp_labels_set(l, CP_LABEL_VERSION, cp_cfg.version)) ||
        cp_labels_set(l, CP_LABEL_INSTANCE, instance) || cp_labels_set(l, CP_LABEL_ISOLATE, iname))
        return CP_ENOMEM;
    cp_labels_scrub(l); /* a thread may name itself "a\tb": ingest refuses that */
    return 0;
}

int cp_window_isolate_labels(uint32_t iso, const char *thread, const char *instance, cp_labels *out)
{
    CP_ASSERT_AGENT_THREAD();
    iso_key k = {.iso = iso};
    if (!iso) memcpy(k.thread, thread, strnlen(thread, 15));
    return isolate_labels(out, &k, instance);
}

/* capture_id (may be NULL): the envelope is a capture's, labelled CP_CAPTURE_LABEL, with
 * engine (else cp_engine) as its engine string. */
static int emit_profile(cp_profile *p, int kind, const iso_key *k, const cp_window_meta *m,
                        const char *capture_id, const char *engine, cp_emit_fn emit, void *arg)
{
    char eng[160];
    if (!engine) {
        /* the CPython found (or named unsupported) since the engine string was made */
        snprintf(eng, sizeof(eng), "%s%s", cp_engine, cp_py_engine_note());
        engine = eng;
    }
    p->time_nanos = m->start_ns;
    p->duration_nanos = m->end_ns - m->start_ns;
    const char *ilabels;
    const char *iname = iso_name(k, &ilabels);
    (void)ilabels;
    char comment[256];
    uint32_t cid;
    snprintf(comment, sizeof(comment), "engine=%s", engine);
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
    cp_py_stats py;
    cp_py_get_stats(&py);
    if (py.on && kind == CP_KIND_CPU) {
        /* Python stacks so far: with a frame, cut at the sample's depth, cut at a frame
         * that did not read as one (torn mid-call), frames whose code was unreadable */
        snprintf(comment, sizeof(comment),
                 "python_samples=%llu python_truncated=%llu python_torn=%llu "
                 "python_unresolved=%llu",
                 (unsigned long long)py.samples, (unsigned long long)py.truncated,
                 (unsigned long long)py.torn, (unsigned long long)py.unresolved);
        if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
            return CP_ENOMEM;
    }
    cp_perfmap_stats pst;
    cp_perfmap_get_stats(&pst);
    if (pst.found) {
        /* the perf map so far: entries kept, malformed lines, lines over the bounds */
        snprintf(comment, sizeof(comment),
                 "perf_map_entries=%llu perf_map_bad=%llu "
                 "perf_map_dropped=%llu",
                 (unsigned long long)pst.entries, (unsigned long long)pst.bad,
                 (unsigned long long)pst.dropped);
        if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
            return CP_ENOMEM;
    }
    uint64_t dm_cut, dm_failed;
    cp_demangle_counts(&dm_cut, &dm_failed);
    if (dm_cut || dm_failed) {
        /* C++ names libiberty could read only without their requires-clause, or not at all
         * (left mangled) so far (model/demangle.h) */
        snprintf(comment, sizeof(comment), "demangled_without_requires=%llu mangled_left=%llu",
                 (unsigned long long)dm_cut, (unsigned long long)dm_failed);
        if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
            return CP_ENOMEM;
    }
    if (cp_cfg.relay_dir[0] && (tables.from_cache || tables.read)) {
        /* objects named so far from the host's name cache (the relay's names/), and from
         * their own symbol tables */
        snprintf(comment, sizeof(comment), "names_from_cache=%llu names_read=%llu",
                 (unsigned long long)tables.from_cache, (unsigned long long)tables.read);
        if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
            return CP_ENOMEM;
    }
    if (syms.over_budget) {
        /* pcs the window's symbolization budget left as addresses so far (named by a later
         * window, or by the server from the mappings' build ids) */
        snprintf(comment, sizeof(comment), "unsymbolized_over_budget=%llu",
                 (unsigned long long)syms.over_budget);
        if (cp_profile_intern_cstr(p, comment, &cid) || cp_vec_push(&p->comments, cid))
            return CP_ENOMEM;
    }

    cp_envelope e;
    memset(&e, 0, sizeof(e));
    cp_buf buf = {0};
    int rc = CP_ENOMEM;
    /* Raw pprof: Kafka's lz4 compresses the batch (once, and ingest inflates nothing).
     * A window too big for Kafka's default 1 MB message limit goes gzip'd instead.
     * Files written to --output-dir are always gzip'd (write_file). */
    if (cp_envelope_pprof(p, &buf) != 0) goto fail;
    e.tenant = strdup(cp_cfg.tenant);
    e.producer_id = strdup(m->producer_id);
    e.engine = strdup(engine);
    if (!e.tenant || !e.producer_id || !e.engine) goto fail;
    if (isolate_labels(&e.labels, k, m->instance)) goto fail;
    if (capture_id && cp_labels_set(&e.labels, CP_CAPTURE_LABEL, capture_id)) goto fail;
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

static uint32_t str_id(cp_profile *p, const char *s, int *err)
{
    uint32_t id = 0;
    if (cp_profile_intern_cstr(p, s, &id) != 0) *err = CP_ENOMEM;
    return id;
}

/* A cpu profile's types and period: the sample types only in a fresh one (a kept epoch's
 * profile has them). Returns 0 or CP_ENOMEM. */
static int cpu_types(cp_profile *p, int fresh)
{
    int err = 0;
    if (fresh && (cp_profile_add_sample_type(p, "samples", "count") ||
                  cp_profile_add_sample_type(p, "cpu", "nanoseconds")))
        err = CP_ENOMEM;
    p->period_type.type = str_id(p, "cpu", &err);
    p->period_type.unit = str_id(p, "nanoseconds", &err);
    p->period = cp_period_ns;
    p->default_sample_type = str_id(p, "cpu", &err);
    return err;
}

/* Hidden bounds of the kept epochs, for tests and the bench's baseline (0 streams: every
 * window built fresh, as before epochs): CONTPROF_EPOCH_STREAMS, CONTPROF_EPOCH_LOCATIONS. */
static void epoch_bounds_from_env(void)
{
    static int done;
    if (done) return;
    done = 1;
    const char *st = getenv("CONTPROF_EPOCH_STREAMS"), *lo = getenv("CONTPROF_EPOCH_LOCATIONS");
    if (!st && !lo) return;
    cp_streams_set_bounds(st ? (uint32_t)strtoul(st, NULL, 10) : CP_STREAMS_MAX,
                          lo ? (uint32_t)strtoul(lo, NULL, 10) : CP_STREAM_MAX_LOCATIONS,
                          CP_STREAM_MAX_BYTES);
}

static int64_t rnd64(double v)
{
    return cp_math_llround(v);
}

/* ------------------------------------------------------------------------------------
 * The agent's own CPU: isolate contprof-agent, one cpu profile a window whose pseudo-frames
 * (addresses 1..SELF_N-1, in no mapping) say where the agent thread's CPU went since the
 * previous window, and librdkafka's threads' with a transport. */

#define SELF_ISOLATE "contprof-agent"
enum { SELF_SYMBOLIZE = 1, SELF_BUILD, SELF_SHIP, SELF_KAFKA, SELF_ROOT, SELF_N };
static const char *const self_names[SELF_N] = {
    [SELF_SYMBOLIZE] = "contprof:symbolize", /* naming pcs (elfnames.c tables, or libdw) */
    [SELF_BUILD] = "contprof:build",         /* building and encoding the window's profiles */
    [SELF_SHIP] = "contprof:ship",           /* draining rings, gzip, files, Kafka polls */
    [SELF_KAFKA] = "contprof:kafka",         /* librdkafka's own threads */
    [SELF_ROOT] = "contprof",
};

static struct {
    int64_t agent_ns; /* the agent thread's CPU clock at the previous window's end */
    int64_t kafka_ns; /* librdkafka's threads' CPU then */
} self;

static uint32_t self_lines(uint64_t pc, cp_sym_line *lines, void *arg)
{
    (void)arg;
    if (pc == 0 || pc >= SELF_N) return 0;
    lines[0] = (cp_sym_line){self_names[pc], NULL, NULL, 0};
    return 1;
}

/* CPU of this process's librdkafka threads ("rdk:" names) from /proc/self/task, or 0. */
static int64_t kafka_threads_ns(void)
{
    if (!cp_cfg.brokers[0] && !cp_cfg.server[0]) return 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    long tck = sysconf(_SC_CLK_TCK);
    if (tck <= 0) tck = 100;
    int64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/self/task/%.20s/stat", de->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        const char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
        if (!open_paren || !close_paren || strncmp(open_paren + 1, "rdk:", 4) != 0) continue;
        /* after ") ": state(3) ... utime(14) stime(15) */
        const char *p = close_paren + 1;
        unsigned long long ut = 0, st = 0;
        if (sscanf(p, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
            sum += (int64_t)((ut + st) * (1000000000ull / (unsigned long long)tck));
    }
    closedir(d);
    return sum;
}

static int emit_self(int64_t finish_start, const cp_modules *mods, const cp_window_meta *m,
                     cp_emit_fn emit, void *arg)
{
    int64_t now = thread_cpu_ns(), kafka = kafka_threads_ns();
    int64_t v[SELF_N] = {0};
    v[SELF_SYMBOLIZE] = syms.spent_ns;
    v[SELF_BUILD] = now - finish_start - syms.spent_ns;
    v[SELF_SHIP] = finish_start - self.agent_ns;
    v[SELF_KAFKA] = kafka - self.kafka_ns; /* threads gone since take their CPU along */
    self.agent_ns = now;
    self.kafka_ns = kafka;

    iso_key k = {.iso = 0, .thread = SELF_ISOLATE};
    cp_stream_key sk = {.iso = 0, .kind = CP_KIND_CPU};
    memcpy(sk.thread, k.thread, sizeof(sk.thread));
    int fresh = 0;
    cp_stream *s = cp_streams_begin(&sk, mods, self_lines, NULL, &fresh);
    if (!s) return CP_ENOMEM;
    cp_profile *p = cp_stream_profile(s);
    int err = cpu_types(p, fresh);
    for (uint64_t c = SELF_SYMBOLIZE; c < SELF_ROOT && !err; c++) {
        if (v[c] <= 0) continue;
        uint64_t pcs[2] = {c, SELF_ROOT};
        int64_t n = cp_period_ns > 0 ? v[c] / cp_period_ns : 0;
        int64_t vals[2] = {n > 0 ? n : 1, v[c]};
        cp_stream_add_sample(s, pcs, 2, vals);
    }
    int sealed = cp_stream_seal(s);
    if (!err) err = sealed;
    uint32_t cid;
    if (!err && m->agent_comment && m->agent_comment[0] &&
        (cp_profile_intern_cstr(p, m->agent_comment, &cid) || cp_vec_push(&p->comments, cid)))
        err = CP_ENOMEM;
    if (!err) err = emit_profile(p, CP_KIND_CPU, &k, m, NULL, NULL, emit, arg);
    cp_streams_end(s, !err);
    return err;
}

/* The stream of isolate k and kind for this window's profile, named by sym_lines unless the
 * server names (CONTPROF_SYMBOLIZE=server); NULL when out of memory. */
static cp_stream *begin_stream(const iso_key *k, int kind, const cp_modules *mods, int *fresh)
{
    cp_stream_key sk = {.iso = k->iso, .kind = kind};
    memcpy(sk.thread, k->thread, sizeof(sk.thread));
    return cp_streams_begin(&sk, mods, cp_cfg.symbolize_server ? NULL : sym_lines, (void *)mods,
                            fresh);
}

int cp_window_finish(const cp_window_meta *m, cp_emit_fn emit, void *arg)
{
    CP_ASSERT_AGENT_THREAD();
    int64_t finish_start = thread_cpu_ns();
    syms.spent_ns = 0;
    syms.over_budget = 0;
    epoch_bounds_from_env();
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

    /* with CONTPROF_SYMBOLIZE=lines, loads libdw the first time there is something */
    if (isos.n && !cp_cfg.symbolize_server) syms_refresh(mods);
    if (isos.n) {
        /* counted as naming (contprof:symbolize); bounded by perfmap.c's read bound */
        int64_t t0 = thread_cpu_ns();
        jit_frames(mods, &bc);
        syms.spent_ns += thread_cpu_ns() - t0;
    }
    if (isos.n) name_new_pcs(mods, &bc);
    int rc = 0;
    for (uint32_t ii = 0; ii < isos.n; ii++) {
        const iso_key *k = &isos.k[ii];
        for (int kind = CP_KIND_CPU; kind <= CP_KIND_INUSE; kind++) {
            int fresh = 0;
            cp_stream *s = begin_stream(k, kind, mods, &fresh);
            if (!s) {
                rc = CP_ENOMEM;
                continue;
            }
            cp_profile *p = cp_stream_profile(s);
            int err = 0;
            if (kind == CP_KIND_CPU) {
                err = cpu_types(p, fresh);
                for (uint32_t i = 0; i < cpu.cap && !err; i++) {
                    cpu_entry *e = &cpu.e[i];
                    if (!e->hash || !key_eq(&e->key, k)) continue;
                    int64_t v[2] = {(int64_t)e->count, (int64_t)e->periods * cp_period_ns};
                    cp_stream_add_sample(s, e->pcs, e->nframes, v);
                }
            } else {
                int alloc = kind == CP_KIND_ALLOC;
                if (fresh &&
                    (cp_profile_add_sample_type(p, alloc ? "alloc_objects" : "inuse_objects",
                                                "count") ||
                     cp_profile_add_sample_type(p, alloc ? "alloc_space" : "inuse_space", "bytes")))
                    err = CP_ENOMEM;
                p->period_type.type = str_id(p, "space", &err);
                p->period_type.unit = str_id(p, "bytes", &err);
                p->period = cp_cfg.alloc_rate;
                p->default_sample_type = str_id(p, alloc ? "alloc_space" : "inuse_space", &err);
                for (uint32_t i = 0; i < bc.n && !err; i++) {
                    const cp_alloc_bucket *ab = &bc.b[i];
                    iso_key bk = {.iso = ab->isolate};
                    memcpy(bk.thread, ab->thread, sizeof(bk.thread));
                    if (!key_eq(&bk, k)) continue;
                    double objs = alloc ? ab->alloc_objects : ab->inuse_objects;
                    double bytes = alloc ? ab->alloc_bytes : ab->inuse_bytes;
                    if (objs < 0.5) continue;
                    int64_t v[2] = {rnd64(objs), rnd64(bytes)};
                    cp_stream_add_sample(s, ab->pcs, ab->nframes, v);
                }
            }
            /* An isolate with CPU or allocations gets all three kinds each window, so a
             * quiet kind reads as zero rather than as missing. Mappings and addresses are
             * canonical (file offsets) as stream.c adds them; the window's own strings (its
             * comments) come after the epoch's, sealed here. */
            int sealed = cp_stream_seal(s);
            if (!err) err = sealed;
            if (!err) err = emit_profile(p, kind, k, m, NULL, NULL, emit, arg);
            if (err) rc = err;
            /* a window that failed drops its stream's epoch */
            cp_streams_end(s, !err);
        }
    }
    /* with the window's other profiles: a window that has none (nothing sampled) emits
     * nothing, its agent CPU is counted in the next one's contprof:ship */
    if (isos.n) {
        int se = emit_self(finish_start, mods, m, emit, arg);
        if (se) rc = se;
    }
    /* an isolate destroyed during the window was in it for the last time */
    cp_streams_window_done();
    /* pcs over the budget were added unnamed to their epochs: start new epochs so that the
     * next window names them (the names already found stay cached per pc) */
    if (syms.over_budget) cp_streams_reset();
    free(isos.k);
    free(bc.b);
    cpu_clear();
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Capture windows: one profile per isolate of a capture slot's samples, fresh tables each
 * time (a capture's streams never take a kept epoch's place, so the always-on windows'
 * bytes do not change), symbolized from the same cache. */

int cp_window_finish_capture(unsigned slot, const cp_window_capture *w, cp_emit_fn emit, void *arg)
{
    CP_ASSERT_AGENT_THREAD();
    if (slot >= CP_WINDOW_CAPTURE_SLOTS) return CP_EINVAL;
    cpu_table *t = &capcpu[slot];
    iso_set isos = {0};
    if (w->kind == CP_KIND_CPU) {
        for (uint32_t i = 0; i < t->cap; i++)
            if (t->e[i].hash) iso_add(&isos, &t->e[i].key);
    } else {
        for (uint32_t i = 0; i < w->nbuckets; i++) {
            iso_key k = {.iso = w->buckets[i].isolate};
            memcpy(k.thread, w->buckets[i].thread, sizeof(k.thread));
            if (w->buckets[i].alloc_objects > 0) iso_add(&isos, &k);
        }
    }
    /* the always-on window's naming budget is its own: a capture's naming is not counted
     * in it, nor its pcs over it */
    int64_t spent = syms.spent_ns;
    uint64_t over = syms.over_budget;
    syms.spent_ns = 0;
    const cp_modules *mods = cp_modules_current();
    if (isos.n && !cp_cfg.symbolize_server) syms_refresh(mods);
    cp_window_meta m = {.start_ns = w->start_ns,
                        .end_ns = w->end_ns,
                        .instance = w->instance,
                        .producer_id = w->producer_id,
                        .sequence = w->sequence,
                        .dropped_samples = t->dropped};
    int rc = 0;
    for (uint32_t ii = 0; ii < isos.n; ii++) {
        const iso_key *k = &isos.k[ii];
        /* a key no always-on stream has: created fresh, never kept */
        int fresh = 0;
        cp_stream *s = begin_stream(k, w->kind | 0x100, mods, &fresh);
        if (!s) {
            rc = CP_ENOMEM;
            continue;
        }
        cp_profile *p = cp_stream_profile(s);
        int err = 0;
        if (w->kind == CP_KIND_CPU) {
            if (cp_profile_add_sample_type(p, "samples", "count") ||
                cp_profile_add_sample_type(p, "cpu", "nanoseconds"))
                err = CP_ENOMEM;
            p->period_type.type = str_id(p, "cpu", &err);
            p->period_type.unit = str_id(p, "nanoseconds", &err);
            p->period = w->period;
            p->default_sample_type = str_id(p, "cpu", &err);
            for (uint32_t i = 0; i < t->cap && !err; i++) {
                cpu_entry *e = &t->e[i];
                if (!e->hash || !key_eq(&e->key, k)) continue;
                int64_t v[2] = {(int64_t)e->count, (int64_t)e->periods};
                cp_stream_add_sample(s, e->pcs, e->nframes, v);
            }
        } else {
            if (cp_profile_add_sample_type(p, "alloc_objects", "count") ||
                cp_profile_add_sample_type(p, "alloc_space", "bytes"))
                err = CP_ENOMEM;
            p->period_type.type = str_id(p, "space", &err);
            p->period_type.unit = str_id(p, "bytes", &err);
            p->period = w->period;
            p->default_sample_type = str_id(p, "alloc_space", &err);
            for (uint32_t i = 0; i < w->nbuckets && !err; i++) {
                const cp_alloc_bucket *ab = &w->buckets[i];
                iso_key bk = {.iso = ab->isolate};
                memcpy(bk.thread, ab->thread, sizeof(bk.thread));
                if (!key_eq(&bk, k) || ab->alloc_objects < 0.5) continue;
                int64_t v[2] = {rnd64(ab->alloc_objects), rnd64(ab->alloc_bytes)};
                uint64_t pcs[CP_MAX_FRAMES];
                uint32_t nf = ab->nframes < CP_MAX_FRAMES ? ab->nframes : CP_MAX_FRAMES;
                memcpy(pcs, ab->pcs, nf * sizeof(uint64_t));
                cp_py_resolve(pcs, nf); /* Python frames named, as in the always-on window */
                cp_stream_add_sample(s, pcs, nf, v);
            }
        }
        int sealed = cp_stream_seal(s);
        if (!err) err = sealed;
        if (!err) err = emit_profile(p, w->kind, k, &m, w->id, w->engine, emit, arg);
        if (err) rc = err;
        cp_streams_end(s, 0);
    }
    free(isos.k);
    cpu_table_clear(t);
    syms.spent_ns = spent;
    syms.over_budget = over;
    return rc;
}

int cp_window_capture_empty(unsigned slot)
{
    CP_ASSERT_AGENT_THREAD();
    return slot >= CP_WINDOW_CAPTURE_SLOTS || capcpu[slot].n == 0;
}

void cp_window_drop_capture(unsigned slot)
{
    CP_ASSERT_AGENT_THREAD();
    if (slot < CP_WINDOW_CAPTURE_SLOTS) cpu_table_clear(&capcpu[slot]);
}

void cp_window_reset(void)
{
    CP_ASSERT_AGENT_THREAD();
    cpu_clear();
    for (unsigned i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++)
        cpu_table_clear(&capcpu[i]);
    syms_clear();
    cp_perfmap_reset();
    memset(&jit, 0, sizeof(jit));
    memset(&self, 0, sizeof(self));
    cp_streams_reset();
}

void cp_window_abandon(void)
{
    /* The parent's agent may have been half way through changing these when it forked:
     * forget them without touching them (the memory is lost once per fork). */
    memset(&cpu, 0, sizeof(cpu));
    memset(capcpu, 0, sizeof(capcpu));
    memset(&syms, 0, sizeof(syms));
    memset(&tables, 0, sizeof(tables));
    cp_perfmap_abandon();           /* the child's pid has its own map */
    jit.unnamed_samples = 0;        /* its own count; a hint the parent said is not said again */
    memset(&self, 0, sizeof(self)); /* the child's agent thread starts its clock at 0 */
    cp_streams_abandon();
}

uint64_t cp_window_take_dropped(void)
{
    CP_ASSERT_AGENT_THREAD();
    uint64_t d = cpu.dropped;
    cpu.dropped = 0;
    return d;
}
