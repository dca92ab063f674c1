/* The isolate table and the language frames interned for them. A leaf: threads, the
 * allocation sampler and the window read it; it knows nothing of them. */
#ifndef CP_ISOLATE_H
#define CP_ISOLATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "contprof.h"

#define CP_MAX_ISOLATES 4096
enum { CP_ISO_FREE = 0, CP_ISO_LIVE = 1, CP_ISO_DYING = 2 };

/* Language-frame ids in a sample are tagged with this bit (see cp_lang_*). */
#define CP_LANG_TAG (1ULL << 63)

struct contprof_isolate {
    atomic_int state;
    uint32_t id; /* index + 1 */
    char *name, *labels;
    _Atomic(contprof_walker) walker;
    void *_Atomic walker_arg;
    _Atomic(contprof_safepoint_request) request;
    void *_Atomic request_arg;
    _Atomic uintptr_t code_lo, code_hi; /* the runtime's native code, or 0, 0 */
};
/* Slot i holds isolate id i + 1 (id 0: none, the thread's own). A slot's fields are set
 * before its state turns LIVE and freed only by cp_isolates_reap: the signal handler
 * reads walker and request with atomic loads, no lock. */
extern struct contprof_isolate cp_isolates[CP_MAX_ISOLATES];

/* Agent thread, after a window was built: frees the isolates destroyed before it (their
 * samples were in it) and makes their slots free. Not async-signal-safe. */
void cp_isolates_reap(void);

/* Interns a language frame (function required, file may be NULL): *id is its number,
 * stable for the process's life. Returns 0, CP_ENOMEM or CP_ELIMIT (65536 frames). Takes
 * a mutex and allocates: safe points and the allocation path only, never in a signal
 * handler; the caller sets cp_in_agent so the allocations are not sampled. */
int cp_lang_intern(const contprof_frame *f, uint32_t *id);
/* The frame interned as id: the pointers stay valid for the process's life. Returns 0 or
 * CP_ENOTFOUND. Takes the mutex. */
int cp_lang_get(uint32_t id, const char **function, const char **file, int64_t *line);
/* Interns frames (innermost first) and writes their tagged ids to ids; returns how many
 * (frames without a function, or that could not be interned, are left out). As
 * cp_lang_intern. */
int cp_lang_ids(const contprof_frame *fr, int n, uint64_t *ids);
/* Joins m language frame ids into the native stack pcs[0..n) (leaf first, capacity
 * CP_MAX_FRAMES) as contprof_isolate_set_runtime_code says for isolate iso (0: on top).
 * Returns the new number of frames. No lock, no allocation. */
uint32_t cp_lang_join(uint32_t iso, uint64_t *pcs, uint32_t n, const uint64_t *ids, uint32_t m);

/* pthread_atfork: the interning mutex is held across fork, so the child's is consistent. */
void cp_lang_atfork_prepare(void);
void cp_lang_atfork_parent(void);
void cp_lang_atfork_child(void);

#endif
