/* CPython frames: the interpreter's layout from a version table, the signal handler's walk
 * of the running thread's _PyInterpreterFrame chain into raw words (code object, offset),
 * and the agent thread's naming of those words (README.md "Python"). */
#include "python.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "isolate.h"
#include "json.h"
#include "unwind.h"

/* ------------------------------------------------------------------------------------
 * The version table: offsets on x86-64, from the interpreter's own headers (3.11.2 and
 * 3.11.7 agree). One row per minor version; anything else is named and left native. */

typedef struct py_layout {
    uint32_t hex_min, hex_max; /* PY_VERSION_HEX range */
    const char *name;
    uint16_t rt_tss;           /* _PyRuntime.gilstate.autoTSSkey (Py_tss_t: int set, key) */
    uint16_t rt_finalizing;    /* _PyRuntime._finalizing: the thread finalizing, or 0 */
    uint16_t rt_head, rt_main; /* _PyRuntime.interpreters.head, .main */
    uint16_t rt_current;       /* _PyRuntime.gilstate.tstate_current: the GIL holder's */
    uint16_t in_next, in_threads, in_id; /* PyInterpreterState: next, threads.head, id */
    uint16_t ts_next, ts_interp;         /* PyThreadState: next, interp */
    uint16_t ts_thread_id;               /* PyThreadState.thread_id: its pthread_t */
    uint16_t ts_cframe;                  /* PyThreadState.cframe */
    uint16_t ts_chunk;                   /* PyThreadState.datastack_chunk */
    uint16_t ts_size;                    /* sizeof(PyThreadState) (root_cframe is inside) */
    uint16_t cf_current;                 /* _PyCFrame.current_frame */
    uint16_t fr_code, fr_previous, fr_prev_instr, fr_is_entry, fr_owner, fr_size;
    uint16_t co_size; /* ob_size: code units */
    uint16_t co_firstlineno, co_filename, co_qualname, co_linetable, co_code, co_hdr;
} py_layout;

static const py_layout LAYOUTS[] = {
    /* clang-format off */
    {0x030b0000, 0x030bffff, "3.11",
     592, 24, 40, 48, 576,          /* runtime: TSS key, _finalizing, interpreters, current */
     0, 16, 48, 8, 16,              /* interpreter: next, threads, id; state: next, interp */
     152,                           /* thread_id */
     56, 296, 360, 8,               /* thread state, cframe */
     32, 48, 56, 68, 69, 72,        /* _PyInterpreterFrame */
     16, 72, 112, 128, 136, 184, 184}, /* PyCodeObject */
    /* clang-format on */
};

#define RAW_CODE_BITS 45
#define RAW_OFF_BITS 17
#define RAW_CODE_MASK ((1ULL << RAW_CODE_BITS) - 1)
#define RAW_OFF_MAX ((1u << RAW_OFF_BITS) - 1)

/* What the handler reads: written by cp_py_probe before `on` is released. */
static struct {
    atomic_int on;
    const py_layout *L;
    uintptr_t runtime;          /* &_PyRuntime */
    uintptr_t eval_lo, eval_hi; /* _PyEval_EvalFrameDefault */
    uintptr_t code_type, str_type, bytes_type;
    uint64_t gen; /* the module snapshot last probed */
    int said;     /* an unsupported version was named */
    char note[48];
} P;

static atomic_uint_fast64_t st_samples, st_truncated, st_torn, st_unresolved;

/* ------------------------------------------------------------------------------------
 * Finding the interpreter (agent thread, contprof_start) */

/* dlsym in the global scope, else in a loaded libpython3* (an embedder's RTLD_LOCAL one). */
static void *find_sym(void *h, const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p && h) p = dlsym(h, name);
    return p;
}

static int find_libpython(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const char *b = strrchr(info->dlpi_name, '/');
    b = b ? b + 1 : info->dlpi_name;
    if (strncmp(b, "libpython3", 10) == 0) {
        snprintf(arg, CP_MODULE_PATH_MAX, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

int cp_py_probe(uint64_t modules_gen)
{
    if (atomic_load(&P.on)) return 1;
    if (modules_gen && modules_gen == P.gen) return 0;
    P.gen = modules_gen;
    char lib[CP_MODULE_PATH_MAX] = "";
    dl_iterate_phdr(find_libpython, lib);
    /* dlsym only where a CPython can be: a dlsym that fails mallocs its error string, and a
     * program that never allocates gets no heap from the agent */
    const char *exe = (const char *)getauxval(AT_EXECFN);
    const char *base = exe ? strrchr(exe, '/') : NULL;
    base = base ? base + 1 : exe;
    if (!lib[0] && !(base && strncmp(base, "python", 6) == 0)) return 0;
    void *h = lib[0] ? dlopen(lib, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    void *rt = find_sym(h, "_PyRuntime");
    if (!rt) {
        if (h) dlclose(h);
        return 0;
    }
    const unsigned long *ver = find_sym(h, "Py_Version"); /* 3.11+ */
    void *eval = find_sym(h, "_PyEval_EvalFrameDefault");
    void *code_type = find_sym(h, "PyCode_Type");
    void *str_type = find_sym(h, "PyUnicode_Type");
    void *bytes_type = find_sym(h, "PyBytes_Type");
    unsigned long hex = ver ? *ver : 0;
    const py_layout *L = NULL;
    for (size_t i = 0; i < sizeof(LAYOUTS) / sizeof(LAYOUTS[0]); i++)
        if (hex >= LAYOUTS[i].hex_min && hex <= LAYOUTS[i].hex_max) L = &LAYOUTS[i];
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    int eval_ok =
        eval && dladdr1(eval, &di, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size > 0;
    if (h) dlclose(h); /* RTLD_NOLOAD: only the reference taken above */
    if (!L || !eval_ok || !code_type || !str_type || !bytes_type) {
        if (!P.said) {
            P.said = 1;
            if (hex)
                snprintf(P.note, sizeof(P.note), "; python=%lu.%lu unsupported", (hex >> 24) & 0xff,
                         (hex >> 16) & 0xff);
            else
                snprintf(P.note, sizeof(P.note), "; python=unknown unsupported");
            fprintf(stderr,
                    "contprof: CPython %s: only 3.11's frames are read; its samples keep "
                    "native frames only\n",
                    P.note + 9); /* "3.12 unsupported" */
        }
        return 0;
    }
    P.L = L;
    P.runtime = (uintptr_t)rt;
    P.eval_lo = (uintptr_t)eval;
    P.eval_hi = (uintptr_t)eval + sym->st_size;
    P.code_type = (uintptr_t)code_type;
    P.str_type = (uintptr_t)str_type;
    P.bytes_type = (uintptr_t)bytes_type;
    snprintf(P.note, sizeof(P.note), "; python=%s", L->name);
    atomic_store_explicit(&P.on, 1, memory_order_release);
    return 1;
}

const char *cp_py_engine_note(void)
{
    return P.note;
}

void cp_py_get_stats(cp_py_stats *s)
{
    s->on = atomic_load(&P.on);
    s->samples = atomic_load(&st_samples);
    s->truncated = atomic_load(&st_truncated);
    s->torn = atomic_load(&st_torn);
    s->unresolved = atomic_load(&st_unresolved);
}

/* ------------------------------------------------------------------------------------
 * The signal handler's walk */

#define MAX_CHUNKS 16

typedef struct walk_ctx {
    pid_t tid;
    uintptr_t stack_lo, stack_hi, ts;
    uint32_t interp; /* the sub-interpreter's id, 0: the main one */
    uint32_t nchunks;
    uintptr_t chunk_lo[MAX_CHUNKS], chunk_hi[MAX_CHUNKS];
} walk_ctx;

/* Reads len bytes at addr: directly where the memory is known mapped (the thread's stack,
 * its thread state, its live data-stack chunks), else through the kernel, which says
 * EFAULT instead of faulting. Returns 0 or -1. */
static int wread(const walk_ctx *c, uintptr_t addr, void *buf, size_t len)
{
    if (addr + len < addr) return -1;
    int mapped = (addr >= c->stack_lo && addr + len <= c->stack_hi) ||
                 (addr >= c->ts && addr + len <= c->ts + P.L->ts_size);
    for (uint32_t i = 0; !mapped && i < c->nchunks; i++)
        mapped = addr >= c->chunk_lo[i] && addr + len <= c->chunk_hi[i];
    if (mapped) {
        memcpy(buf, (const void *)addr, len);
        return 0;
    }
    struct iovec local = {buf, len}, remote = {(void *)addr, len};
    return process_vm_readv(c->tid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -1;
}

static uintptr_t word_at(const uint8_t *b, uint16_t off)
{
    uintptr_t v;
    memcpy(&v, b + off, sizeof(v));
    return v;
}

static int in_eval(uint64_t pc)
{
    return pc >= P.eval_lo && pc < P.eval_hi;
}

/* Reads len bytes at addr through the kernel (EFAULT, never a fault). */
static int kread(pid_t tid, uintptr_t addr, void *buf, size_t len)
{
    struct iovec local = {buf, len}, remote = {(void *)addr, len};
    return process_vm_readv(tid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -1;
}

#define MAX_INTERPS_SEEN 64 /* interpreters looked at in one search */
#define MAX_STATES_SEEN 256 /* thread states looked at in one search */

/* Thread state st's cframe when the state names this thread and its cframe lies on this
 * thread's stack (a state this thread is running: _PyEval_EvalFrameDefault's cframe is
 * its local), else 0; *next: the state after it in its interpreter's list. One read
 * through the kernel (next to thread_id): st may be another thread's, freed meanwhile. */
static uintptr_t cframe_here(const walk_ctx *c, uintptr_t st, uintptr_t *next)
{
    const py_layout *L = P.L;
    uint8_t b[256];
    size_t lo = L->ts_next, len = (size_t)L->ts_thread_id + 8 - lo;
    *next = 0;
    if (!st || (st & 7) || len > sizeof(b) || kread(c->tid, st + lo, b, len) != 0) return 0;
    *next = word_at(b, (uint16_t)(L->ts_next - lo));
    uintptr_t cf = word_at(b, (uint16_t)(L->ts_cframe - lo));
    if (word_at(b, (uint16_t)(L->ts_thread_id - lo)) != (uintptr_t)pthread_self()) return 0;
    return cf >= c->stack_lo && cf < c->stack_hi ? cf : 0;
}

/* The thread state this thread is running now, given ts, its TSS slot's (always its
 * first). One interpreter (interpreters.head is the main one): ts, with no read. Else the
 * GIL holder's state when it is this thread's and its cframe is on this stack; else the
 * state of any interpreter naming this thread whose cframe is innermost on this stack (a
 * thread running a sub-interpreter's code without the GIL: zlib, I/O); else ts. A state
 * chosen is this thread's own: only this thread's eval loop put its cframe on this stack,
 * and only this thread takes it off. The lists are read through the kernel, bounded: a
 * list changed under the search misses a state (ts is kept), never faults. */
static uintptr_t active_state(const walk_ctx *c, uintptr_t ts)
{
    const py_layout *L = P.L;
    uintptr_t head, main_in, next;
    memcpy(&head, (const void *)(P.runtime + L->rt_head), sizeof(head));
    memcpy(&main_in, (const void *)(P.runtime + L->rt_main), sizeof(main_in));
    if (head == main_in) return ts;
    uintptr_t cur = atomic_load_explicit((_Atomic uintptr_t *)(P.runtime + L->rt_current),
                                         memory_order_relaxed);
    if (cur == ts) return ts;
    if (cframe_here(c, cur, &next)) return cur;
    uintptr_t best = ts, best_cf = word_at((const uint8_t *)ts, L->ts_cframe); /* live, own */
    if (best_cf < c->stack_lo || best_cf >= c->stack_hi) best_cf = 0;
    uint32_t seen = 0;
    uintptr_t in = head;
    for (uint32_t i = 0; in && !(in & 7) && i < MAX_INTERPS_SEEN; i++) {
        uint8_t ib[64]; /* from the start to next and threads.head */
        size_t n = (size_t)(L->in_next > L->in_threads ? L->in_next : L->in_threads) + 8;
        if (n > sizeof(ib) || kread(c->tid, in, ib, n) != 0) break;
        for (uintptr_t st = word_at(ib, L->in_threads); st && seen < MAX_STATES_SEEN;
             st = next, seen++) {
            uintptr_t cf = cframe_here(c, st, &next);
            if (cf && (!best_cf || cf < best_cf)) { /* the stack grows down: innermost */
                best = st;
                best_cf = cf;
            }
        }
        in = word_at(ib, L->in_next);
    }
    return best;
}

/* The id of the interpreter that thread state tsb (this thread's, running) belongs to: 0
 * for the main one, else its id (1..2^30; larger: 0). Read directly: an interpreter
 * outlives its thread states, and this one is running. */
static uint32_t interp_of(const uint8_t *tsb)
{
    const py_layout *L = P.L;
    uintptr_t in = word_at(tsb, L->ts_interp), main_in;
    memcpy(&main_in, (const void *)(P.runtime + L->rt_main), sizeof(main_in));
    if (!in || in == main_in || (in & 7)) return 0;
    int64_t id;
    memcpy(&id, (const void *)(in + L->in_id), sizeof(id));
    return id > 0 && id <= (1 << 30) ? (uint32_t)id : 0;
}

/* Walks the thread's frames, innermost first, into raw[] with entry[] marking each frame
 * that began a _PyEval_EvalFrameDefault call. Returns how many; *cut: 1 deeper than max,
 * 2 an invalid frame. */
static uint32_t walk_state(walk_ctx *c, uintptr_t ts, uint64_t *raw, uint8_t *entry, uint32_t max,
                           int *cut);

static uint32_t walk(walk_ctx *c, uint64_t *raw, uint8_t *entry, uint32_t max, int *cut)
{
    const py_layout *L = P.L;
    *cut = 0;
    const uint8_t *tss = (const uint8_t *)(P.runtime + L->rt_tss);
    int set;
    unsigned key;
    memcpy(&set, tss, sizeof(set));
    memcpy(&key, tss + 4, sizeof(key));
    if (!set) return 0;
    /* Finalizing: the interpreter frees other threads' states (daemon threads running C
     * without the GIL) while their TSS slots still point at them: no walk from then on */
    uintptr_t fin;
    memcpy(&fin, (const void *)(P.runtime + L->rt_finalizing), sizeof(fin));
    if (fin) return 0;
    /* The thread's own state, from its TSS slot: glibc's pthread_getspecific reads the
     * calling thread's key array (no lock, no allocation); a thread's state is removed
     * from the slot before it is freed, both on this thread, so it cannot vanish under the
     * handler. Why not _PyRuntime's gilstate.tstate_current: that is the GIL holder's, not
     * the interrupted thread's (zlib releases the GIL while it compresses). */
    uintptr_t ts = (uintptr_t)pthread_getspecific((pthread_key_t)key);
    if (!ts || (ts & 7)) return 0;
    const uint8_t *tsb = (const uint8_t *)ts; /* live: this thread's own */
    if (word_at(tsb, L->ts_thread_id) != (uintptr_t)pthread_self()) {
        *cut = 2; /* not this thread's: a state freed and reused (an extension's doing) */
        return 0;
    }
    /* With sub-interpreters, the slot keeps the thread's first state while it runs
     * another (PyThreadState_Swap leaves the slot alone in 3.11): the running one first,
     * then the slot's, whose frames called into it (run_string's caller) */
    uintptr_t act = active_state(c, ts);
    c->interp = interp_of((const uint8_t *)act); /* proven this thread's running state */
    uint32_t m = walk_state(c, act, raw, entry, max, cut);
    if (act != ts && !*cut) m += walk_state(c, ts, raw + m, entry + m, max - m, cut);
    return m;
}

/* Walks the frames of thread state ts (this thread's own, live) into raw[0..max) and
 * entry[] as walk says. */
static uint32_t walk_state(walk_ctx *c, uintptr_t ts, uint64_t *raw, uint8_t *entry, uint32_t max,
                           int *cut)
{
    const py_layout *L = P.L;
    const uint8_t *tsb = (const uint8_t *)ts;
    c->ts = ts;
    /* the live data-stack chunks (each on the list is mapped; removed before freed) */
    uintptr_t ch = word_at(tsb, L->ts_chunk);
    c->nchunks = 0;
    while (ch && !(ch & 7) && c->nchunks < MAX_CHUNKS) {
        uintptr_t hdr[2];
        memcpy(hdr, (const void *)ch, sizeof(hdr));
        if (hdr[1] < 64 || hdr[1] > ((uintptr_t)1 << 30)) break;
        c->chunk_lo[c->nchunks] = ch;
        c->chunk_hi[c->nchunks++] = ch + hdr[1];
        ch = hdr[0];
    }
    uintptr_t cf = word_at(tsb, L->ts_cframe);
    uintptr_t f = 0;
    if (!cf || (cf & 7) || wread(c, cf + L->cf_current, &f, sizeof(f)) != 0) {
        *cut = 2;
        return 0;
    }
    uint32_t m = 0;
    while (f) {
        if (m == max) {
            *cut = 1;
            break;
        }
        uint8_t fb[80];
        if ((f & 7) || f < 4096 || wread(c, f, fb, L->fr_size) != 0) {
            *cut = 2;
            break;
        }
        uintptr_t code = word_at(fb, L->fr_code);
        uintptr_t pi = word_at(fb, L->fr_prev_instr);
        uint8_t owner = fb[L->fr_owner];
        if (!code || (code & 7) || (code >> 3) > RAW_CODE_MASK || owner > 3) {
            *cut = 2;
            break;
        }
        uintptr_t first = code + L->co_code;
        uint64_t off = pi > first ? (pi - first) / 2 : 0;
        if (off > RAW_OFF_MAX) off = 0;
        raw[m] = CP_PY_TAG | (code >> 3) | (off << RAW_CODE_BITS);
        entry[m++] = fb[L->fr_is_entry] != 0;
        f = word_at(fb, L->fr_previous);
    }
    return m;
}

uint32_t cp_py_merge(uint64_t *pcs, uint32_t n, uint32_t max, pid_t tid, uintptr_t stack_lo,
                     uintptr_t stack_hi, uint32_t *interp)
{
    *interp = 0;
    if (!atomic_load_explicit(&P.on, memory_order_acquire)) return n;
    walk_ctx c = {.tid = tid, .stack_lo = stack_lo, .stack_hi = stack_hi};
    uint64_t raw[CP_MAX_FRAMES];
    uint8_t entry[CP_MAX_FRAMES];
    int cut;
    uint32_t m = walk(&c, raw, entry, max < CP_MAX_FRAMES ? max : CP_MAX_FRAMES, &cut);
    if (cut == 2) atomic_fetch_add_explicit(&st_torn, 1, memory_order_relaxed);
    if (!m) return n;
    *interp = c.interp;
    atomic_fetch_add_explicit(&st_samples, 1, memory_order_relaxed);
    /* Each native eval frame, innermost first, ran the Python frames from the cursor to
     * the next entry frame, inclusive. */
    uint64_t out[CP_MAX_FRAMES];
    uint32_t o = 0, j = 0, lost = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (in_eval(pcs[i]) && j < m) {
            do {
                if (o < max)
                    out[o++] = raw[j];
                else
                    lost = 1;
            } while (!entry[j++] && j < m);
        } else if (o < max) {
            out[o++] = pcs[i];
        } else {
            lost = 1;
        }
    }
    /* The native unwind stopped short of the eval frames (no CFI somewhere): the rest of
     * the Python frames go on top of what it found, outermost last. */
    for (; j < m; j++) {
        if (o < max)
            out[o++] = raw[j];
        else
            lost = 1;
    }
    if (cut == 1 || lost) atomic_fetch_add_explicit(&st_truncated, 1, memory_order_relaxed);
    memcpy(pcs, out, o * sizeof(uint64_t));
    return o;
}

/* ------------------------------------------------------------------------------------
 * Sub-interpreters as isolates: a fixed table, claimed by compare-and-swap, never freed */

#define INTERP_ISOLATES 64
static struct {
    _Atomic uint64_t interp; /* the interpreter's id + 1; 0: free */
    atomic_uint iso;         /* its isolate's id; 0 while made or when it could not be */
} interps[INTERP_ISOLATES];

uint32_t cp_py_interp_isolate(uint32_t interp, int create)
{
    if (!interp) return 0;
    for (uint32_t i = 0; i < INTERP_ISOLATES; i++) {
        uint64_t v = atomic_load_explicit(&interps[i].interp, memory_order_acquire);
        if (v == (uint64_t)interp + 1) return atomic_load(&interps[i].iso);
        if (v) continue;
        if (!create) return 0;
        if (!atomic_compare_exchange_strong(&interps[i].interp, &v, (uint64_t)interp + 1)) {
            i--; /* taken meanwhile: look at it again */
            continue;
        }
        char name[40], labels[32];
        snprintf(name, sizeof(name), "python-interp-%u", interp);
        snprintf(labels, sizeof(labels), "interp=%u", interp);
        contprof_isolate *iso = contprof_isolate_create(name, labels);
        if (iso) atomic_store(&interps[i].iso, iso->id);
        return iso ? iso->id : 0;
    }
    return 0; /* more than INTERP_ISOLATES sub-interpreters alive: the thread's own */
}

#define LIVE_MAX 1024 /* interpreters listed at most */

static int read_self(uintptr_t addr, void *buf, size_t len);

void cp_py_interp_reap(void)
{
    static uint64_t last_s;
    if (!P.L) return;
    int used = 0;
    for (uint32_t i = 0; i < INTERP_ISOLATES && !used; i++)
        used = atomic_load(&interps[i].iso) != 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    if (!used || (uint64_t)ts.tv_sec == last_s) return;
    last_s = (uint64_t)ts.tv_sec;
    /* the ids alive now, from the runtime's list (read through the kernel: it changes
     * under us; an incomplete walk frees nothing) */
    static int64_t live[LIVE_MAX];
    uint32_t nlive = 0;
    uintptr_t in;
    if (read_self(P.runtime + P.L->rt_head, &in, sizeof(in)) != 0) return;
    while (in) {
        int64_t id;
        if (nlive == LIVE_MAX || (in & 7) || read_self(in + P.L->in_id, &id, sizeof(id)) != 0 ||
            read_self(in + P.L->in_next, &in, sizeof(in)) != 0)
            return;
        live[nlive++] = id;
    }
    for (uint32_t i = 0; i < INTERP_ISOLATES; i++) {
        uint64_t v = atomic_load(&interps[i].interp);
        unsigned iso = atomic_load(&interps[i].iso);
        if (!v || !iso) continue; /* free, being made, or never made */
        int alive = 0;
        for (uint32_t k = 0; k < nlive && !alive; k++)
            alive = live[k] == (int64_t)(v - 1);
        if (alive) continue;
        /* gone: no thread runs it, so no handler looks its id up; its samples already taken
         * are in this window, whose end reaps the isolate */
        atomic_store(&interps[i].iso, 0);
        atomic_store_explicit(&interps[i].interp, 0, memory_order_release);
        contprof_isolate_destroy(&cp_isolates[iso - 1]);
    }
}

/* ------------------------------------------------------------------------------------
 * Parsers of interpreter data (also fuzzed) */

int cp_py_line_311(const uint8_t *lt, size_t n, int firstlineno, uint32_t unit)
{
    /* Each entry: a first byte with bit 7 set (code in bits 3-6, length - 1 in bits 0-2,
     * in code units), then varints of 6 bits per byte, bit 6 continuing. */
    int64_t line = firstlineno;
    uint64_t addr = 0;
    size_t i = 0;
    while (i < n) {
        uint8_t b = lt[i++];
        if (!(b & 0x80)) continue; /* resynchronise on the next entry */
        int code = (b >> 3) & 15;
        uint64_t len = (uint64_t)(b & 7) + 1;
        int64_t delta = 0;
        int none = 0;
        if (code == 15) {
            none = 1;
        } else if (code == 13 || code == 14) {
            uint64_t v = 0;
            unsigned shift = 0;
            while (i < n) {
                uint8_t r = lt[i++];
                if (shift < 60) v |= (uint64_t)(r & 63) << shift;
                shift += 6;
                if (!(r & 64)) break;
            }
            delta = (v & 1) ? -(int64_t)(v >> 1) : (int64_t)(v >> 1);
        } else if (code >= 10 && code <= 12) {
            delta = code - 10;
        }
        if (!none) line += delta;
        if (line < -((int64_t)1 << 31) || line > ((int64_t)1 << 31)) return -1;
        if (unit < addr + len) return none ? -1 : (int)line;
        addr += len;
        while (i < n && !(lt[i] & 0x80))
            i++; /* the entry's columns */
    }
    return firstlineno;
}

#define STR_MAX 1024

int cp_py_str_311(const uint8_t hdr[72], uintptr_t addr, cp_py_readfn readfn, char *out, size_t cap)
{
    if (cap < 5) return -1;
    int64_t len;
    uint32_t state;
    memcpy(&len, hdr + 16, sizeof(len));
    memcpy(&state, hdr + 32, sizeof(state));
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || len < 0 || (kind != 1 && kind != 2 && kind != 4)) return -1;
    if (ascii && kind != 1) return -1;
    size_t want = (size_t)len < STR_MAX ? (size_t)len : STR_MAX;
    uint8_t data[STR_MAX * 4];
    uintptr_t at = addr + (ascii ? 48 : 72);
    if (want && readfn(at, data, want * kind) != 0) return -1;
    size_t o = 0;
    for (size_t i = 0; i < want; i++) {
        uint32_t cp;
        if (kind == 1) {
            cp = data[i];
        } else if (kind == 2) {
            uint16_t u;
            memcpy(&u, data + 2 * i, 2);
            cp = u;
        } else {
            memcpy(&cp, data + 4 * i, 4);
        }
        if (ascii && cp >= 0x80) return -1;
        if (cp == 0) cp = '?';
        char tmp[4];
        size_t k = cp_utf8_put(cp, tmp);
        if (o + k + 1 > cap) break;
        memcpy(out + o, tmp, k);
        o += k;
    }
    out[o] = 0;
    return (int)o;
}

/* ------------------------------------------------------------------------------------
 * Naming raw frames (agent thread) */

static int read_self(uintptr_t addr, void *buf, size_t len)
{
    struct iovec local = {buf, len}, remote = {(void *)addr, len};
    ssize_t k = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    return k == (ssize_t)len ? 0 : -1;
}

/* One code object as last read: its identity (what it points to) and its names. A code
 * object freed and another made at its address is told apart by a different identity,
 * re-read at most once per drain (gen). */
typedef struct pycode {
    uintptr_t addr;
    uint64_t ident;
    uint64_t gen;
    int ok;
    int firstlineno;
    uint32_t units;
    char *qualname, *filename;
    uint8_t *lt;
    uint32_t lt_len;
} pycode;

#define CODE_CAP 8192 /* power of two; full: started over */
#define LT_MAX (64u * 1024)
static pycode *codes;
static uint32_t ncodes;
static uint64_t resolve_gen;
static uint32_t unknown_id; /* "[python]" + 1 */

static void code_clear(pycode *e)
{
    free(e->qualname);
    free(e->filename);
    free(e->lt);
    memset(e, 0, sizeof(*e));
}

static int read_str(uintptr_t addr, char *out, size_t cap)
{
    uint8_t hdr[72];
    uint64_t type;
    if (!addr || read_self(addr, hdr, sizeof(hdr)) != 0) return -1;
    memcpy(&type, hdr + 8, 8);
    if (type != P.str_type) return -1;
    return cp_py_str_311(hdr, addr, read_self, out, cap);
}

/* Reads code object e->addr into e (ok = 0 if it is not one). hdr: its first bytes. */
static void code_load(pycode *e, const uint8_t *hdr)
{
    const py_layout *L = P.L;
    e->ok = 0;
    char q[STR_MAX * 4 + 1], f[STR_MAX * 4 + 1];
    int64_t units;
    int fl;
    memcpy(&units, hdr + L->co_size, 8);
    memcpy(&fl, hdr + L->co_firstlineno, 4);
    if (word_at(hdr, 8) != P.code_type || units < 0 || units > (1 << 24)) return;
    if (read_str(word_at(hdr, L->co_qualname), q, sizeof(q)) < 0) return;
    if (read_str(word_at(hdr, L->co_filename), f, sizeof(f)) < 0) f[0] = 0;
    uintptr_t ltp = word_at(hdr, L->co_linetable);
    uint8_t bh[32];
    uint8_t *lt = NULL;
    int64_t ltn = 0;
    if (ltp && read_self(ltp, bh, sizeof(bh)) == 0 && word_at(bh, 8) == P.bytes_type) {
        memcpy(&ltn, bh + 16, 8);
        if (ltn > 0 && ltn <= (int64_t)LT_MAX && (lt = malloc((size_t)ltn)) &&
            read_self(ltp + 32, lt, (size_t)ltn) != 0) {
            free(lt);
            lt = NULL;
        }
    }
    e->qualname = strdup(q);
    e->filename = f[0] ? strdup(f) : NULL;
    if (!e->qualname) {
        free(lt);
        return;
    }
    e->lt = lt;
    e->lt_len = lt ? (uint32_t)ltn : 0;
    e->firstlineno = fl;
    e->units = (uint32_t)units;
    e->ok = 1;
}

/* What tells one code object from another at the same address. Not ob_type: a code object
 * freed since (the interpreter's finalization, before the agent's last drain) has its
 * first words overwritten by the allocator and the rest intact, and keeps the names it
 * was read with. */
static uint64_t code_ident(const uint8_t *hdr)
{
    const py_layout *L = P.L;
    uint64_t h = word_at(hdr, L->co_qualname);
    h = h * 31 + word_at(hdr, L->co_filename);
    h = h * 31 + word_at(hdr, L->co_linetable);
    h = h * 31 + word_at(hdr, L->co_size);
    h = h * 31 + (uint32_t)word_at(hdr, L->co_firstlineno);
    return h;
}

static pycode *code_get(uintptr_t addr)
{
    if (!codes) {
        codes = calloc(CODE_CAP, sizeof(pycode));
        if (!codes) return NULL;
    }
    uint32_t i = (uint32_t)((addr >> 3) * 0x9E3779B97F4A7C15ULL >> 40) & (CODE_CAP - 1);
    while (codes[i].addr && codes[i].addr != addr)
        i = (i + 1) & (CODE_CAP - 1);
    pycode *e = &codes[i];
    /* A failed read is tried again at once: the address may hold a new code object since
     * (a module's top-level code freed after its import, its memory reused) */
    if (e->addr && e->gen == resolve_gen && e->ok) return e;
    uint8_t hdr[192];
    if (read_self(addr, hdr, P.L->co_hdr) != 0) {
        if (e->addr) e->ok = 0, e->gen = resolve_gen;
        return e->addr ? e : NULL;
    }
    uint64_t id = code_ident(hdr);
    if (e->addr && e->ident == id) {
        e->gen = resolve_gen;
        return e;
    }
    if (!e->addr) {
        if (ncodes >= CODE_CAP / 2) { /* full: start over */
            for (uint32_t k = 0; k < CODE_CAP; k++)
                code_clear(&codes[k]);
            ncodes = 0;
            return code_get(addr);
        }
        ncodes++;
    } else {
        code_clear(e);
    }
    e->addr = addr;
    e->ident = id;
    e->gen = resolve_gen;
    code_load(e, hdr);
    return e;
}

static uint64_t unknown_frame(void)
{
    if (!unknown_id) {
        contprof_frame f = {.function = "[python]"};
        uint32_t id;
        if (cp_lang_intern(&f, &id) != 0) return CP_LANG_TAG; /* id 0: never fails twice */
        unknown_id = id + 1;
    }
    return CP_LANG_TAG | (unknown_id - 1);
}

void cp_py_resolve(uint64_t *pcs, uint32_t n)
{
    int any = 0;
    for (uint32_t k = 0; k < n && !any; k++)
        any = CP_PY_IS_RAW(pcs[k]);
    if (!any || !P.L) return;
    /* a code object's identity is read again at most every 100 ms */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    resolve_gen = (uint64_t)ts.tv_sec * 10 + (uint64_t)ts.tv_nsec / 100000000 + 1;
    for (uint32_t k = 0; k < n; k++) {
        if (!CP_PY_IS_RAW(pcs[k])) continue;
        uintptr_t addr = (uintptr_t)((pcs[k] & RAW_CODE_MASK) << 3);
        uint32_t off = (uint32_t)((pcs[k] >> RAW_CODE_BITS) & RAW_OFF_MAX);
        pycode *e = code_get(addr);
        if (!e || !e->ok) {

            atomic_fetch_add_explicit(&st_unresolved, 1, memory_order_relaxed);
            pcs[k] = unknown_frame();
            continue;
        }
        int line = e->lt ? cp_py_line_311(e->lt, e->lt_len, e->firstlineno, off) : e->firstlineno;
        contprof_frame f = {.function = e->qualname, .file = e->filename, .line = line};
        uint32_t id;
        pcs[k] = cp_lang_intern(&f, &id) == 0 ? CP_LANG_TAG | id : unknown_frame();
    }
}
