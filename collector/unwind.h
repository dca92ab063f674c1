/* The signal-safe unwinder: a snapshot of the loaded modules (built off the signal path
 * with dl_iterate_phdr) and a DWARF CFI interpreter that reads each module's in-memory
 * .eh_frame_hdr/.eh_frame, so stacks go through code built without frame pointers. */
#ifndef CP_UNWIND_H
#define CP_UNWIND_H

#include <stdint.h>
#include <stddef.h>

#define CP_MAX_FRAMES 64
#define CP_MODULE_PATH_MAX 256
#define CP_BUILD_ID_MAX 32

/* One loaded object's executable segment. Addresses are run-time addresses. */
typedef struct cp_module {
    uintptr_t lo, hi;      /* executable PT_LOAD range */
    uintptr_t bias;        /* dlpi_addr */
    uint64_t file_offset;  /* p_offset of that segment (for the pprof mapping) */
    const uint8_t *eh_hdr; /* .eh_frame_hdr, NULL if none or unusable */
    const int32_t *table;  /* its sorted (initial location, FDE) table, datarel sdata4 */
    uint32_t count;
    uint32_t build_id_len;
    uint8_t build_id[CP_BUILD_ID_MAX];
    char path[CP_MODULE_PATH_MAX];
} cp_module;

/* An immutable snapshot, published to signal handlers through one atomic pointer. */
typedef struct cp_modules {
    size_t map_len;             /* bytes of the mmap holding this struct */
    uint64_t adds, subs;        /* dl_iterate_phdr counters at snapshot time */
    uint64_t gen;               /* 1, 2, ...: tells apart two snapshots mapped at one address */
    struct cp_modules *retired; /* unwind.c's list of replaced snapshots not yet unmapped */
    uint32_t n;
    cp_module m[];
} cp_modules;

/* The agent thread's refresh: rebuilds the snapshot if objects were loaded or unloaded
 * since the last one (or always when force), ends the agent's hold on the snapshot
 * cp_modules_current gave it, and unmaps replaced snapshots once no handler reads them
 * (waits up to 100 ms for handlers, without holding the publishers' lock). Never from a
 * signal handler. Returns 0 or CP_ENOMEM (the old snapshot then stays). */
int cp_modules_refresh(int force);

/* A host thread's refresh, after its dlopen returned: publishes a new snapshot if objects
 * were loaded or unloaded, so the next sample unwinds through them. Never waits for
 * handlers (a replaced snapshot still read, or held by the agent, is left to the agent's
 * next refresh). Does nothing before the agent's first snapshot. Takes the publishers'
 * mutex (held for one dl_iterate_phdr walk and an mmap by whoever holds it); allocates with
 * mmap only. Not from a signal handler. Returns 0 or CP_ENOMEM. */
int cp_modules_refresh_host(void);

/* The current snapshot (may be NULL). Agent thread only: it stays mapped until the agent's
 * next cp_modules_refresh, whatever host threads publish meanwhile. */
const cp_modules *cp_modules_current(void);

/* How many snapshots are mapped now: the current one and those replaced but not yet
 * unmapped (1 after the agent's refresh when no handler was reading). */
unsigned cp_modules_mapped(void);

/* The module whose executable range holds pc, or NULL. */
const cp_module *cp_modules_find(const cp_modules *mods, uintptr_t pc);

/* Registers at the start of the unwind (x86-64). */
typedef struct cp_uregs {
    uintptr_t pc, sp, fp;
} cp_uregs;

/* A direct-mapped cache of unwind rules by address. One writer only: each thread has one
 * for its signal handler and one for its allocation path (a handler may interrupt the
 * allocation path, never itself). Zero-initialised memory is an empty cache. */
#define CP_UCACHE_SIZE 512
typedef struct cp_ucache_ent {
    uint64_t pc;
    uint8_t kind; /* 1: CFI rule below, 2: no usable CFI (frame pointer) */
    uint8_t cfa_reg, rbp_rule, _pad;
    int32_t cfa_off, rbp_off, ra_off;
} cp_ucache_ent;
typedef struct cp_ucache {
    const void *mods; /* the snapshot the entries came from */
    uint64_t gen;     /* and its generation (a new snapshot may reuse the address) */
    cp_ucache_ent e[CP_UCACHE_SIZE];
} cp_ucache;

/* Unwinds from r, reading the stack only inside [stack_lo, stack_hi) (0,0: leaf only).
 * Writes at most max addresses to pcs: the first is r->pc, the others are return
 * addresses minus one (inside the call instruction). cache may be NULL. Async-signal-safe:
 * no locks, no allocation, no dl_iterate_phdr. Returns the number of frames. */
int cp_unwind(const cp_uregs *r, uintptr_t stack_lo, uintptr_t stack_hi, uint64_t *pcs, int max,
              cp_ucache *cache);

/* Unwinds from r over a copy of the stack: len bytes that were at r->sp (perf's
 * PERF_SAMPLE_STACK_USER), read at stack; code and CFI are read in place, in this process.
 * Same contract as cp_unwind otherwise; for the agent thread (off the signal path). */
int cp_unwind_copy(const cp_uregs *r, const void *stack, size_t len, uint64_t *pcs, int max,
                   cp_ucache *cache);

/* Captures the caller's registers and unwinds from there, skipping `skip` frames of the
 * caller's own; for the allocation path. Same contract as cp_unwind. */
int cp_unwind_here(uintptr_t stack_lo, uintptr_t stack_hi, uint64_t *pcs, int max, int skip,
                   cp_ucache *cache);

#endif
