/* A stream's tables kept between windows: for each (isolate, kind) the mappings, locations,
 * functions and their strings live on from one window to the next (an epoch), so successive
 * windows of a stream start with the same tables, entry for entry (README "Epochs"). Agent
 * thread only: no lock, no hook; may allocate. */
#ifndef CP_STREAM_H
#define CP_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "profile.h"
#include "unwind.h"

/* One stream of a process: an explicit isolate id, or a thread name when iso is 0, and the
 * envelope kind (CP_KIND_*). thread is compared up to its first NUL (at most 16 bytes). */
typedef struct cp_stream_key {
    uint32_t iso;
    char thread[16];
    int kind;
} cp_stream_key;

/* One line of a symbolized address: function (name demangled when possible, mangled the
 * symbol's own name or NULL), source file (or NULL) and line. */
typedef struct cp_sym_line {
    const char *name, *mangled, *file;
    int64_t line;
} cp_sym_line;

#define CP_SYM_MAX_LINES 9

/* Symbolizes the run-time address pc: writes its lines, the inlined calls first (leaf
 * first) and the function itself last, at most CP_SYM_MAX_LINES, and returns how many (0:
 * no name). The strings need to stay valid only until the next call. */
typedef uint32_t (*cp_symbolize_fn)(uint64_t pc, cp_sym_line *lines, void *arg);

typedef struct cp_stream cp_stream;

/* The defaults: epochs kept for 32 streams (least recently used evicted, but never for a
 * stream of the same window), a stream's epoch
 * kept while it has at most 8192 locations and holds at most 1 MiB (its profile's arrays,
 * strings and indexes, by capacity): at most 32 MiB kept in all. */
#define CP_STREAMS_MAX 32u
#define CP_STREAM_MAX_LOCATIONS 8192u
#define CP_STREAM_MAX_BYTES ((size_t)1 << 20)

/* Sets the bounds (streams is capped at CP_STREAMS_MAX; 0 keeps no stream, every window is
 * built fresh) and drops every kept epoch. For tests and the bench's baseline. */
void cp_streams_set_bounds(uint32_t streams, uint32_t locations, size_t bytes);

/* Starts stream k's profile for one window, built against the module snapshot mods (may
 * be NULL). The stream's kept epoch continues when its tables still hold for mods (no
 * object unloaded since, every mapping found again); else a new epoch starts, with fresh
 * tables whose first mapping is the main executable's. *fresh says which: on a fresh one
 * the caller adds the sample types (they are part of the epoch). symbolize NULL: addresses
 * only, the mappings say no functions. The stream belongs to the caller until
 * cp_streams_end. Returns NULL on out of memory (nothing kept for k then). */
cp_stream *cp_streams_begin(const cp_stream_key *k, const cp_modules *mods,
                            cp_symbolize_fn symbolize, void *arg, int *fresh);

/* The profile being built: the caller may set its header fields and intern strings; its
 * mappings, locations and functions are the stream's to add. Borrowed from s. */
cp_profile *cp_stream_profile(cp_stream *s);

/* Adds a sample of n frames (leaf first: run-time pcs, or CP_LANG_TAG language ids) with
 * the profile's sample_types.n values. Locations, their mapping (canonical: start = file
 * offset, address = file offset) and functions are added on first use in the epoch. An
 * error is kept and returned by cp_stream_seal. */
void cp_stream_add_sample(cp_stream *s, const uint64_t *pcs, uint32_t n, const int64_t *vals);

/* Marks the end of the epoch's strings: what the caller interns after this (the window's
 * comments) is the window's own, dropped before the next window. Returns 0, or the first
 * error of this window's building (CP_ENOMEM). */
int cp_stream_seal(cp_stream *s);

/* Ends the window of s: keep = 1 keeps its epoch for the next window, unless it is over the
 * bounds or streams are not kept (then it is freed, as with keep = 0, and the next window
 * starts a new epoch). s is no longer valid after. */
void cp_streams_end(cp_stream *s, int keep);

/* Called once a window's streams are all ended: frees the epochs of isolates no longer live
 * (destroyed: their slot may be reused by another isolate) and starts the next window's
 * eviction round (a kept stream is evicted only for one of a later window). */
void cp_streams_window_done(void);

/* Streams whose epoch is kept now. */
uint32_t cp_streams_kept(void);

/* Frees every kept epoch. */
void cp_streams_reset(void);

/* After fork in the child: forgets the kept epochs without touching them. */
void cp_streams_abandon(void);

#endif
