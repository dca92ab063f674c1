/* The signal-safe unwinder. Module snapshots are built on the agent thread; the CFI
 * interpreter runs in signal handlers and allocation hooks and only reads memory that is
 * mapped for sure: the loaded objects' own .eh_frame_hdr/.eh_frame and the interrupted
 * thread's stack between its stack pointer and the stack's top. x86-64 only. */
#include "guard.h"
#include "unwind.h"

#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

/* ------------------------------------------------------------------------------------
 * Module snapshots */

static _Atomic(cp_modules *) g_mods;
/* Handlers currently reading a snapshot; the agent waits for zero before unmapping. */
static atomic_int g_readers;

typedef struct build_ctx {
    cp_modules *mods;
    uint32_t cap;
    uint64_t adds, subs;
} build_ctx;

static void read_build_id(const struct dl_phdr_info *info, cp_module *m)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
        const uint8_t *end = p + ph->p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
            const uint8_t *name = p + sizeof(*nh);
            const uint8_t *desc = name + ((nh->n_namesz + 3) & ~3u);
            const uint8_t *next = desc + ((nh->n_descsz + 3) & ~3u);
            if (next > end) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(name, "GNU", 4) == 0 &&
                nh->n_descsz <= CP_BUILD_ID_MAX) {
                memcpy(m->build_id, desc, nh->n_descsz);
                m->build_id_len = nh->n_descsz;
                return;
            }
            p = next;
        }
    }
}

static void read_eh_hdr(const struct dl_phdr_info *info, cp_module *m)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_GNU_EH_FRAME) continue;
        const uint8_t *h = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
        /* version 1; eh_frame_ptr any; fde_count udata4; table datarel|sdata4 */
        if (h[0] != 1 || h[2] != 0x03 || h[3] != 0x3b) return;
        size_t ptrlen;
        switch (h[1] & 0x0f) {
        case 0x03:
        case 0x0b:
            ptrlen = 4;
            break;
        case 0x04:
        case 0x0c:
        case 0x00:
            ptrlen = 8;
            break;
        default:
            return;
        }
        uint32_t count;
        memcpy(&count, h + 4 + ptrlen, 4);
        m->eh_hdr = h;
        m->table = (const int32_t *)(h + 4 + ptrlen + 4);
        m->count = count;
        return;
    }
}

static int build_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    build_ctx *c = arg;
    (void)size;
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        if (c->mods->n == c->cap) return 1;
        cp_module *m = &c->mods->m[c->mods->n++];
        memset(m, 0, sizeof(*m));
        m->lo = info->dlpi_addr + ph->p_vaddr;
        m->hi = m->lo + ph->p_memsz;
        m->bias = info->dlpi_addr;
        m->file_offset = ph->p_offset;
        const char *name = info->dlpi_name;
        if (name == NULL || name[0] == 0) name = ""; /* the main program; filled below */
        size_t n = strlen(name);
        if (n >= CP_MODULE_PATH_MAX) n = CP_MODULE_PATH_MAX - 1;
        memcpy(m->path, name, n);
        m->path[n] = 0;
        read_build_id(info, m);
        read_eh_hdr(info, m);
    }
    return 0;
}

static int count_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    uint64_t *v = arg;
    (void)size;
    v[0] = info->dlpi_adds;
    v[1] = info->dlpi_subs;
    v[2]++;
    return 0;
}

static int cmp_mod(const void *a, const void *b)
{
    const cp_module *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Insertion sort: qsort may allocate, and n is small. */
static void sort_mods(cp_modules *mods)
{
    for (uint32_t i = 1; i < mods->n; i++) {
        cp_module t = mods->m[i];
        uint32_t j = i;
        while (j > 0 && cmp_mod(&mods->m[j - 1], &t) > 0) {
            mods->m[j] = mods->m[j - 1];
            j--;
        }
        mods->m[j] = t;
    }
}

static void exe_path(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    out[n > 0 ? n : 0] = 0;
}

/* Publishers take turns (the agent thread at each window, any host thread after its
 * dlopen); held only while a snapshot is built and swapped, never while waiting for
 * readers. Held across fork by the forking thread, so the child finds it free. */
static pthread_mutex_t g_pub = PTHREAD_MUTEX_INITIALIZER;
/* The snapshot the agent thread holds (cp_modules_current): only the agent unmaps it. */
static cp_modules *g_held;
/* Snapshots replaced on a host thread while a handler or the agent could still read them:
 * linked through their `retired` field, unmapped by the next publisher that finds them
 * free (always by the agent's next refresh). */
static cp_modules *g_retired;
static uint64_t g_gen;
static atomic_uint g_mapped; /* snapshots mapped: the published one and the retired */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void pub_lock(void)
{
    pthread_mutex_lock(&g_pub);
}

static void pub_unlock(void)
{
    pthread_mutex_unlock(&g_pub);
}

static void atfork_register(void)
{
    pthread_atfork(pub_lock, pub_unlock, pub_unlock);
}

/* Waits (bounded) for handlers that may still read a replaced snapshot. 1 when none. */
static int readers_gone(int wait)
{
    for (int i = 0; i < 1000 && wait && atomic_load(&g_readers) > 0; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&g_readers) == 0;
}

/* Under g_pub, on a host thread: unmaps the retired snapshots that no handler reads now
 * and the agent does not hold. Never waits. */
static void reap_retired_host(void)
{
    if (!g_retired || !readers_gone(0)) return;
    cp_modules **pp = &g_retired;
    while (*pp) {
        cp_modules *r = *pp;
        if (r != g_held) {
            *pp = r->retired;
            munmap(r, r->map_len);
            atomic_fetch_sub(&g_mapped, 1);
        } else {
            pp = &r->retired;
        }
    }
}

/* Under g_pub: builds and publishes a new snapshot if the loaded objects changed (or
 * force); *old receives the one it replaced. */
static int publish(int force, cp_modules **old)
{
    uint64_t v[3] = {0, 0, 0};
    *old = NULL;
    dl_iterate_phdr(count_cb, v);
    cp_modules *cur = atomic_load(&g_mods);
    if (!force && cur && cur->adds == v[0] && cur->subs == v[1]) return 0;

    uint32_t cap = (uint32_t)v[2] * 2 + 16;
    size_t len = sizeof(cp_modules) + (size_t)cap * sizeof(cp_module);
    len = (len + 4095) & ~(size_t)4095;
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return CP_ENOMEM;
    atomic_fetch_add(&g_mapped, 1);
    build_ctx c = {.mods = mem, .cap = cap};
    c.mods->map_len = len;
    c.mods->n = 0;
    c.mods->retired = NULL;
    c.mods->gen = ++g_gen;
    dl_iterate_phdr(build_cb, &c);
    c.mods->adds = c.adds;
    c.mods->subs = c.subs;
    char exe[CP_MODULE_PATH_MAX];
    exe_path(exe, sizeof(exe));
    for (uint32_t i = 0; i < c.mods->n; i++)
        if (c.mods->m[i].path[0] == 0) memcpy(c.mods->m[i].path, exe, sizeof(exe));
    sort_mods(c.mods);
    atomic_store(&g_mods, c.mods);
    *old = cur;
    return 0;
}

int cp_modules_refresh(int force)
{
    pthread_once(&g_atfork_once, atfork_register);
    pub_lock();
    cp_modules *old;
    int rc = publish(force, &old);
    if (old) {
        old->retired = g_retired;
        g_retired = old;
    }
    g_held = NULL; /* the agent's pointers from cp_modules_current end here */
    cp_modules *list = g_retired;
    g_retired = NULL;
    pub_unlock();
    if (!list) return rc;
    /* Every snapshot on the list is unpublished: once no handler is inside cp_unwind, none
     * can read it. Handlers finish within microseconds; if one is still reading after
     * 100 ms, the list waits for the next refresh. */
    if (readers_gone(1)) {
        while (list) {
            cp_modules *r = list;
            list = r->retired;
            munmap(r, r->map_len);
            atomic_fetch_sub(&g_mapped, 1);
        }
        return rc;
    }
    pub_lock();
    cp_modules **pp = &list;
    while (*pp)
        pp = &(*pp)->retired;
    *pp = g_retired;
    g_retired = list;
    pub_unlock();
    return rc;
}

int cp_modules_refresh_host(void)
{
    /* Nothing to keep current before the agent published its first snapshot. */
    if (!atomic_load(&g_mods)) return 0;
    pthread_once(&g_atfork_once, atfork_register);
    pub_lock();
    cp_modules *old;
    int rc = publish(0, &old);
    if (old) {
        old->retired = g_retired;
        g_retired = old;
    }
    reap_retired_host();
    pub_unlock();
    return rc;
}

const cp_modules *cp_modules_current(void)
{
    CP_ASSERT_AGENT_THREAD();
    pub_lock();
    cp_modules *m = atomic_load(&g_mods);
    g_held = m;
    pub_unlock();
    return m;
}

unsigned cp_modules_mapped(void)
{
    return atomic_load(&g_mapped);
}

const cp_module *cp_modules_find(const cp_modules *mods, uintptr_t pc)
{
    if (!mods) return NULL;
    uint32_t lo = 0, hi = mods->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (pc < mods->m[mid].lo)
            hi = mid;
        else if (pc >= mods->m[mid].hi)
            lo = mid + 1;
        else
            return &mods->m[mid];
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------
 * DWARF CFI */

enum { REG_RBP = 6, REG_RSP = 7, REG_RA = 16 };
enum { RULE_SAME = 0, RULE_OFFSET = 1, RULE_UNDEF = 2, RULE_OTHER = 3 };
enum { CFA_REG = 0, CFA_PLT = 1, CFA_BAD = 2 };

typedef struct cfi_row {
    uint8_t cfa_kind, cfa_reg;
    int64_t cfa_off;
    uint8_t rbp_rule, ra_rule;
    int64_t rbp_off, ra_off;
} cfi_row;

typedef struct cie_info {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    int has_z;
    const uint8_t *insns, *insns_end;
} cie_info;

static uint64_t uleb(const uint8_t **pp, const uint8_t *end)
{
    uint64_t v = 0;
    unsigned shift = 0;
    const uint8_t *p = *pp;
    while (p < end) {
        uint8_t b = *p++;
        if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) break;
    }
    *pp = p;
    return v;
}

static int64_t sleb(const uint8_t **pp, const uint8_t *end)
{
    int64_t v = 0;
    unsigned shift = 0;
    uint8_t b = 0;
    const uint8_t *p = *pp;
    while (p < end) {
        b = *p++;
        if (shift < 64) v |= (int64_t)((uint64_t)(b & 0x7f) << shift);
        shift += 7;
        if (!(b & 0x80)) break;
    }
    if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
    *pp = p;
    return v;
}

/* Reads a DW_EH_PE-encoded pointer. Returns 0 on an unsupported encoding. */
static int read_enc(const uint8_t **pp, const uint8_t *end, uint8_t enc, uintptr_t datarel,
                    uintptr_t *out)
{
    const uint8_t *p = *pp;
    uintptr_t base = 0, v;
    if (enc == 0xff) return 0;
    switch (enc & 0x70) {
    case 0x00:
        break;
    case 0x10:
        base = (uintptr_t)p;
        break;
    case 0x30:
        base = datarel;
        break;
    default:
        return 0;
    }
    switch (enc & 0x0f) {
    case 0x00:
    case 0x04:
    case 0x0c: {
        if (p + 8 > end) return 0;
        uint64_t x;
        memcpy(&x, p, 8);
        v = (uintptr_t)x;
        p += 8;
        break;
    }
    case 0x03: {
        if (p + 4 > end) return 0;
        uint32_t x;
        memcpy(&x, p, 4);
        v = x;
        p += 4;
        break;
    }
    case 0x0b: {
        if (p + 4 > end) return 0;
        int32_t x;
        memcpy(&x, p, 4);
        v = (uintptr_t)(intptr_t)x;
        p += 4;
        break;
    }
    case 0x02: {
        if (p + 2 > end) return 0;
        uint16_t x;
        memcpy(&x, p, 2);
        v = x;
        p += 2;
        break;
    }
    case 0x0a: {
        if (p + 2 > end) return 0;
        int16_t x;
        memcpy(&x, p, 2);
        v = (uintptr_t)(intptr_t)x;
        p += 2;
        break;
    }
    case 0x01:
        v = (uintptr_t)uleb(&p, end);
        break;
    case 0x09:
        v = (uintptr_t)sleb(&p, end);
        break;
    default:
        return 0;
    }
    if (enc & 0x80) return 0; /* indirect: not used in .eh_frame FDE ranges */
    *out = base + v;
    *pp = p;
    return 1;
}

/* Bounds for reading CIE/FDE records, which live in the module's mapped text. */
#define CFI_RECORD_MAX (1u << 20)

static int parse_cie(const uint8_t *cie, cie_info *ci)
{
    uint32_t len;
    memcpy(&len, cie, 4);
    if (len == 0 || len == 0xffffffffu || len > CFI_RECORD_MAX) return 0;
    const uint8_t *p = cie + 4, *end = cie + 4 + len;
    uint32_t id;
    memcpy(&id, p, 4);
    p += 4;
    if (id != 0) return 0;
    uint8_t version = *p++;
    const char *aug = (const char *)p;
    while (p < end && *p)
        p++;
    if (p >= end) return 0;
    p++;
    if (aug[0] == 'e' && aug[1] == 'h') p += 8;
    ci->code_align = uleb(&p, end);
    ci->data_align = sleb(&p, end);
    ci->ra_reg = version == 1 ? *p++ : uleb(&p, end);
    ci->fde_enc = 0;
    ci->has_z = 0;
    const uint8_t *aug_end = NULL;
    for (const char *a = aug; *a; a++) {
        switch (*a) {
        case 'z': {
            uint64_t n = uleb(&p, end);
            ci->has_z = 1;
            aug_end = p + n;
            break;
        }
        case 'R':
            ci->fde_enc = *p++;
            break;
        case 'L':
            p++;
            break;
        case 'P': {
            uint8_t enc = *p++;
            uintptr_t dummy;
            if (!read_enc(&p, end, enc & 0x7f, 0, &dummy)) return 0;
            break;
        }
        case 'S':
        case 'B':
        case 'e':
        case 'h':
            break;
        default:
            if (!aug_end) return 0; /* unknown, but 'z' tells how to skip it */
            goto done;
        }
        if (p > end) return 0;
    }
done:
    if (aug_end) p = aug_end;
    if (p > end) return 0;
    ci->insns = p;
    ci->insns_end = end;
    return 1;
}

#define CFI_STACK 8

/* The rules of a register CFI says was saved at CFA + off (only rbp's and the return
 * address's are kept). */
static inline void rule_offset(cfi_row *row, uint64_t reg, int64_t off)
{
    if (reg == REG_RBP) {
        row->rbp_rule = RULE_OFFSET;
        row->rbp_off = off;
    } else if (reg == REG_RA) {
        row->ra_rule = RULE_OFFSET;
        row->ra_off = off;
    }
}

/* A register set by a rule the unwinder does not follow (a register, an expression). */
static inline void rule_other(cfi_row *row, uint64_t reg)
{
    if (reg == REG_RBP) row->rbp_rule = RULE_OTHER;
    if (reg == REG_RA) row->ra_rule = RULE_OTHER;
}

/* A register's rule back to the CIE's (initial); 0 while running the CIE itself. */
static inline int rule_restore(cfi_row *row, const cfi_row *initial, uint64_t reg)
{
    if (!initial) return 0;
    if (reg == REG_RBP) {
        row->rbp_rule = initial->rbp_rule;
        row->rbp_off = initial->rbp_off;
    } else if (reg == REG_RA) {
        row->ra_rule = initial->ra_rule;
        row->ra_off = initial->ra_off;
    }
    return 1;
}

/* set_loc and advance_loc1/2/4 (op 0x01-0x04): moves *loc. Returns 0 if the address
 * cannot be read. */
static inline int cfi_advance(uint8_t op, const uint8_t **pp, const uint8_t *end,
                              const cie_info *ci, uintptr_t *loc)
{
    const uint8_t *p = *pp;
    switch (op) {
    case 0x01: { /* set_loc */
        uintptr_t v;
        if (!read_enc(&p, end, ci->fde_enc, 0, &v)) return 0;
        *loc = v;
        break;
    }
    case 0x02:
        *loc += *p++ * ci->code_align;
        break;
    case 0x03: {
        uint16_t d;
        memcpy(&d, p, 2);
        p += 2;
        *loc += d * ci->code_align;
        break;
    }
    default: { /* 0x04 */
        uint32_t d;
        memcpy(&d, p, 4);
        p += 4;
        *loc += d * ci->code_align;
        break;
    }
    }
    *pp = p;
    return 1;
}

/* The CFA rules (def_cfa, def_cfa_sf, def_cfa_register, def_cfa_offset,
 * def_cfa_offset_sf, def_cfa_expression). */
static inline void cfi_def_cfa(uint8_t op, const uint8_t **pp, const uint8_t *end,
                               const cie_info *ci, cfi_row *row)
{
    const uint8_t *p = *pp;
    switch (op) {
    case 0x0c: /* def_cfa */
        row->cfa_reg = (uint8_t)uleb(&p, end);
        row->cfa_off = (int64_t)uleb(&p, end);
        row->cfa_kind = CFA_REG;
        break;
    case 0x12: /* def_cfa_sf */
        row->cfa_reg = (uint8_t)uleb(&p, end);
        row->cfa_off = sleb(&p, end) * ci->data_align;
        row->cfa_kind = CFA_REG;
        break;
    case 0x0d: /* def_cfa_register */
        row->cfa_reg = (uint8_t)uleb(&p, end);
        if (row->cfa_kind != CFA_REG) row->cfa_kind = CFA_BAD;
        break;
    case 0x0e: /* def_cfa_offset */
        row->cfa_off = (int64_t)uleb(&p, end);
        break;
    case 0x13: /* def_cfa_offset_sf */
        row->cfa_off = sleb(&p, end) * ci->data_align;
        break;
    default: { /* 0x0f def_cfa_expression */
        uint64_t n = uleb(&p, end);
        /* The PLT's expression (rsp + 8 + ...) is the one worth recognising. */
        if (n == 11 && p[0] == 0x77 && p[2] == 0x80) {
            row->cfa_kind = CFA_PLT;
            row->cfa_reg = REG_RSP;
            row->cfa_off = 8;
        } else {
            row->cfa_kind = CFA_BAD;
        }
        p += n;
        break;
    }
    }
    *pp = p;
}

/* The register rules in their extended forms (offset_extended(_sf), restore_extended,
 * undefined, same_value, register, (val_)expression, val_offset(_sf),
 * GNU_negative_offset_extended). Returns 0 for an op it cannot follow. */
static inline int cfi_reg_rule(uint8_t op, const uint8_t **pp, const uint8_t *end,
                               const cie_info *ci, cfi_row *row, const cfi_row *initial)
{
    const uint8_t *p = *pp;
    uint64_t reg = uleb(&p, end);
    int ok = 1;
    switch (op) {
    case 0x05: /* offset_extended */
        rule_offset(row, reg, (int64_t)uleb(&p, end) * ci->data_align);
        break;
    case 0x11: /* offset_extended_sf */
        rule_offset(row, reg, sleb(&p, end) * ci->data_align);
        break;
    case 0x2f: /* GNU_negative_offset_extended */
        rule_offset(row, reg, -(int64_t)uleb(&p, end) * ci->data_align);
        break;
    case 0x06: /* restore_extended */
        ok = rule_restore(row, initial, reg);
        break;
    case 0x07: /* undefined */
        if (reg == REG_RBP) row->rbp_rule = RULE_UNDEF;
        if (reg == REG_RA) row->ra_rule = RULE_UNDEF;
        break;
    case 0x08: /* same_value */
        if (reg == REG_RBP) row->rbp_rule = RULE_SAME;
        break;
    case 0x09: /* register */
        (void)uleb(&p, end);
        rule_other(row, reg);
        break;
    case 0x10:   /* expression */
    case 0x16: { /* val_expression */
        uint64_t n = uleb(&p, end);
        p += n;
        rule_other(row, reg);
        break;
    }
    case 0x14: /* val_offset */
        (void)uleb(&p, end);
        rule_other(row, reg);
        break;
    case 0x15: /* val_offset_sf */
        (void)sleb(&p, end);
        rule_other(row, reg);
        break;
    default:
        return 0;
    }
    *pp = p;
    return ok;
}

/* Executes CFA instructions until the location passes target. Returns 0 if it met
 * something it cannot follow. Runs in the signal handler: no allocation, the helpers
 * above inlined. */
static int run_cfi(const uint8_t *p, const uint8_t *end, const cie_info *ci, uintptr_t loc,
                   uintptr_t target, cfi_row *row, const cfi_row *initial)
{
    cfi_row stack[CFI_STACK];
    int sp = 0;
    while (p < end) {
        uint8_t op = *p++;
        uint8_t hi = op & 0xc0, lo = op & 0x3f;
        if (hi == 0x40) { /* advance_loc */
            loc += lo * ci->code_align;
            if (loc > target) return 1;
            continue;
        }
        if (hi == 0x80) { /* offset */
            rule_offset(row, lo, (int64_t)uleb(&p, end) * ci->data_align);
            continue;
        }
        if (hi == 0xc0) { /* restore */
            if (!rule_restore(row, initial, lo)) return 0;
            continue;
        }
        switch (op) {
        case 0x00: /* nop */
            break;
        case 0x01: /* set_loc, advance_loc1/2/4 */
        case 0x02:
        case 0x03:
        case 0x04:
            if (!cfi_advance(op, &p, end, ci, &loc)) return 0;
            if (loc > target) return 1;
            break;
        case 0x0a: /* remember_state */
            if (sp == CFI_STACK) return 0;
            stack[sp++] = *row;
            break;
        case 0x0b: /* restore_state */
            if (sp == 0) return 0;
            {
                cfi_row saved = stack[--sp];
                row->rbp_rule = saved.rbp_rule;
                row->rbp_off = saved.rbp_off;
                row->ra_rule = saved.ra_rule;
                row->ra_off = saved.ra_off;
                row->cfa_kind = saved.cfa_kind;
                row->cfa_reg = saved.cfa_reg;
                row->cfa_off = saved.cfa_off;
            }
            break;
        case 0x0c: /* def_cfa and its kin */
        case 0x0d:
        case 0x0e:
        case 0x0f:
        case 0x12:
        case 0x13:
            cfi_def_cfa(op, &p, end, ci, row);
            break;
        case 0x2e: /* GNU_args_size */
            (void)uleb(&p, end);
            break;
        default:
            if (!cfi_reg_rule(op, &p, end, ci, row, initial)) return 0;
            break;
        }
    }
    return 1;
}

/* Finds the FDE covering pc in m and computes the row there. */
static int find_row(const cp_module *m, uintptr_t pc, cfi_row *row)
{
    if (!m->eh_hdr || m->count == 0) return 0;
    const int32_t *t = m->table;
    uintptr_t base = (uintptr_t)m->eh_hdr;
    uint32_t lo = 0, hi = m->count;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (base + (intptr_t)t[2 * mid] <= pc)
            lo = mid;
        else
            hi = mid;
    }
    if (base + (intptr_t)t[2 * lo] > pc) return 0;
    const uint8_t *fde = (const uint8_t *)(base + (intptr_t)t[2 * lo + 1]);
    uint32_t len;
    memcpy(&len, fde, 4);
    if (len == 0 || len == 0xffffffffu || len > CFI_RECORD_MAX) return 0;
    const uint8_t *p = fde + 4, *end = fde + 4 + len;
    uint32_t cie_off;
    memcpy(&cie_off, p, 4);
    if (cie_off == 0) return 0;
    cie_info ci;
    if (!parse_cie(p - cie_off, &ci)) return 0;
    p += 4;
    uintptr_t start, range;
    if (!read_enc(&p, end, ci.fde_enc, base, &start)) return 0;
    if (!read_enc(&p, end, ci.fde_enc & 0x0f, 0, &range)) return 0;
    if (pc < start || pc >= start + range) return 0;
    if (ci.has_z) {
        uint64_t n = uleb(&p, end);
        p += n;
    }
    if (p > end) return 0;
    memset(row, 0, sizeof(*row));
    row->cfa_kind = CFA_REG;
    row->cfa_reg = REG_RSP;
    row->cfa_off = 8;
    row->ra_rule = RULE_OFFSET;
    row->ra_off = -8;
    if (ci.ra_reg != REG_RA) return 0;
    if (!run_cfi(ci.insns, ci.insns_end, &ci, start, pc, row, NULL)) return 0;
    cfi_row initial = *row;
    if (!run_cfi(p, end, &ci, start, pc, row, &initial)) return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------
 * The walk */

static inline int in_stack(uintptr_t a, uintptr_t lo, uintptr_t hi)
{
    return a >= lo && a + 8 <= hi && (a & 7) == 0;
}

static inline uintptr_t load(uintptr_t a)
{
    uintptr_t v;
    memcpy(&v, (const void *)a, sizeof(v));
    return v;
}

/* The rule for lookup: from the cache, or computed (and cached). 1 if a usable CFI rule. */
static int rule_for(const cp_modules *mods, uintptr_t lookup, cfi_row *row, cp_ucache *cache)
{
    cp_ucache_ent *ent = NULL;
    /* Entries are kept only under a snapshot, so a cache that never had one is all zero (a
     * fresh thread slot's, mmap'd): not cleared, its 12 KiB are not faulted in at once by
     * the thread's first sample, only the entries it uses. */
    if (cache && mods) {
        if (cache->mods != (const void *)mods || cache->gen != mods->gen) {
            if (cache->mods) memset(cache->e, 0, sizeof(cache->e));
            cache->mods = mods;
            cache->gen = mods->gen;
        }
        ent = &cache->e[(lookup ^ (lookup >> 9)) & (CP_UCACHE_SIZE - 1)];
        if (ent->pc == lookup && ent->kind) {
            if (ent->kind != 1) return 0;
            row->cfa_kind = CFA_REG;
            row->cfa_reg = ent->cfa_reg;
            row->cfa_off = ent->cfa_off;
            row->rbp_rule = ent->rbp_rule;
            row->rbp_off = ent->rbp_off;
            row->ra_rule = RULE_OFFSET;
            row->ra_off = ent->ra_off;
            return 1;
        }
    }
    const cp_module *m = cp_modules_find(mods, lookup);
    int ok = m && find_row(m, lookup, row) && row->cfa_kind != CFA_BAD &&
             row->ra_rule == RULE_OFFSET && (row->cfa_reg == REG_RSP || row->cfa_reg == REG_RBP) &&
             row->cfa_off == (int32_t)row->cfa_off && row->rbp_off == (int32_t)row->rbp_off &&
             row->ra_off == (int32_t)row->ra_off;
    if (ent) {
        ent->pc = lookup;
        ent->kind = ok ? 1 : 2;
        if (ok) {
            ent->cfa_reg = row->cfa_reg;
            ent->cfa_off = (int32_t)row->cfa_off;
            ent->rbp_rule = row->rbp_rule;
            ent->rbp_off = (int32_t)row->rbp_off;
            ent->ra_off = (int32_t)row->ra_off;
        }
    }
    return ok;
}

/* The walk over a stack whose bytes at address a are at a + delta (0: the live stack; a
 * copy of it elsewhere: cp_unwind_copy). */
static int walk(const cp_uregs *r, uintptr_t stack_lo, uintptr_t stack_hi, intptr_t delta,
                uint64_t *pcs, int max, cp_ucache *cache)
{
    if (max <= 0) return 0;
    int n = 0;
    pcs[n++] = r->pc;
    if (stack_hi <= stack_lo) return n;
    /* Only what lies above the interrupted stack pointer is part of live frames. */
    uintptr_t lo = r->sp > stack_lo ? r->sp : stack_lo;
    if (lo >= stack_hi) return n;

    atomic_fetch_add(&g_readers, 1);
    const cp_modules *mods = atomic_load(&g_mods);
    uintptr_t pc = r->pc, sp = r->sp, fp = r->fp;
    int leaf = 1;
    while (n < max) {
        uintptr_t lookup = leaf ? pc : pc - 1;
        cfi_row row;
        uintptr_t cfa, ra, nfp = fp;
        if (rule_for(mods, lookup, &row, cache)) {
            cfa = (row.cfa_reg == REG_RSP ? sp : fp) + (uintptr_t)row.cfa_off;
            uintptr_t ra_at = cfa + (uintptr_t)row.ra_off;
            if (!in_stack(ra_at, lo, stack_hi)) break;
            ra = load(ra_at + (uintptr_t)delta);
            if (row.rbp_rule == RULE_OFFSET) {
                uintptr_t at = cfa + (uintptr_t)row.rbp_off;
                if (!in_stack(at, lo, stack_hi)) break;
                nfp = load(at + (uintptr_t)delta);
            } else if (row.rbp_rule != RULE_SAME) {
                nfp = 0;
            }
        } else {
            /* No usable CFI (JIT code, stripped objects): follow the frame pointer. */
            if (!in_stack(fp, lo, stack_hi) || !in_stack(fp + 8, lo, stack_hi) || fp < sp) break;
            nfp = load(fp + (uintptr_t)delta);
            ra = load(fp + 8 + (uintptr_t)delta);
            cfa = fp + 16;
        }
        if (ra < 4096 || cfa <= sp) break;
        sp = cfa;
        fp = nfp;
        pc = ra;
        leaf = 0;
        pcs[n++] = (uint64_t)(pc - 1);
        if (sp >= stack_hi) break;
    }
    atomic_fetch_sub(&g_readers, 1);
    return n;
}

int cp_unwind(const cp_uregs *r, uintptr_t stack_lo, uintptr_t stack_hi, uint64_t *pcs, int max,
              cp_ucache *cache)
{
    return walk(r, stack_lo, stack_hi, 0, pcs, max, cache);
}

int cp_unwind_copy(const cp_uregs *r, const void *stack, size_t len, uint64_t *pcs, int max,
                   cp_ucache *cache)
{
    intptr_t delta = (intptr_t)((uintptr_t)stack - r->sp);
    return walk(r, r->sp, r->sp + (len & ~(size_t)7), delta, pcs, max, cache);
}

__attribute__((noinline)) int cp_unwind_here(uintptr_t stack_lo, uintptr_t stack_hi, uint64_t *pcs,
                                             int max, int skip, cp_ucache *cache)
{
    uint64_t tmp[CP_MAX_FRAMES + 8];
    cp_uregs r;
    __asm__ volatile("leaq 0(%%rip), %0\n\t"
                     "movq %%rsp, %1\n\t"
                     "movq %%rbp, %2"
                     : "=r"(r.pc), "=r"(r.sp), "=r"(r.fp));
    int want = max + skip + 1;
    if (want > (int)(sizeof(tmp) / sizeof(tmp[0]))) want = (int)(sizeof(tmp) / sizeof(tmp[0]));
    int n = cp_unwind(&r, stack_lo, stack_hi, tmp, want, cache);
    int drop = skip + 1; /* this function's own frame too */
    if (n <= drop) return 0;
    int out = n - drop;
    if (out > max) out = max;
    memcpy(pcs, tmp + drop, (size_t)out * sizeof(uint64_t));
    return out;
}
