/* One window of profiles: CPU samples aggregated as the agent drains the rings, then at the
 * window's end, per isolate, the cpu, alloc and inuse profiles, symbolized and encoded as
 * envelopes. Agent thread only. */
#ifndef CP_WINDOW_H
#define CP_WINDOW_H

#include <stdint.h>

#include "envelope.h"
#include "thread.h"

/* Adds one drained CPU sample of a thread named thread (used when r->isolate is 0). */
void cp_window_add_cpu(const cp_sample_rec *r, const char *thread);

/* Names Node.js worker threads' isolates (nodeworker.h) in a V8 host: call before draining
 * the rings, so a new worker's samples carry its label. Reads symbols (once per start
 * routine) and the Worker objects of new threads. */
void cp_window_label_threads(void);

/* Receives each finished envelope; takes ownership of e's contents (cp_envelope_close). */
typedef void (*cp_emit_fn)(cp_envelope *e, void *arg);

typedef struct cp_window_meta {
    int64_t start_ns, end_ns;
    const char *instance, *producer_id;
    uint64_t *sequence;       /* incremented per envelope */
    uint64_t dropped_samples; /* since the previous window */
    uint64_t dropped_windows; /* carried from the transport */
} cp_window_meta;

/* Builds and emits every isolate's profiles for the window and resets the CPU table.
 * Returns 0 or CP_ENOMEM (the window is then lost and counted by the caller). */
int cp_window_finish(const cp_window_meta *m, cp_emit_fn emit, void *arg);

/* Frees the symbol cache, the CPU table and the streams' kept epochs (stream.h). */
void cp_window_reset(void);
/* CPU samples the aggregation table had no room for since the last call. */
uint64_t cp_window_take_dropped(void);

/* After fork in the child: forgets them without freeing (they may be inconsistent). */
void cp_window_abandon(void);

#endif
