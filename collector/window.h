/* One window of profiles: CPU samples aggregated as the agent drains the rings, then at the
 * window's end, per isolate, the cpu, alloc and inuse profiles, symbolized and encoded as
 * envelopes. Agent thread only. */
#ifndef CP_WINDOW_H
#define CP_WINDOW_H

#include <stdint.h>

#include "alloc.h"
#include "envelope.h"
#include "labels.h"
#include "thread.h"

/* Adds one drained CPU sample of a thread named thread (used when r->isolate is 0). */
void cp_window_add_cpu(const cp_sample_rec *r, const char *thread);

/* Names Node.js worker threads' isolates (nodeworker.h) in a V8 host: call before draining
 * the rings, so a new worker's samples carry its label. Reads symbols (once per start
 * routine) and the Worker objects of new threads. */
void cp_window_label_threads(void);

/* Capture slots (captable.c): at most this many captures run at once in a process. */
#define CP_WINDOW_CAPTURE_SLOTS 64

/* Adds one drained CPU sample of a boosted thread to capture slot's table: count the
 * sample's weight, value ns. */
void cp_window_add_capture_cpu(unsigned slot, const cp_sample_rec *r, const char *thread,
                               int64_t ns);

/* The labels isolate iso (0: thread isolate named thread) carries in its envelopes, added
 * to out (the caller closes it). Returns 0 or CP_ENOMEM. */
int cp_window_isolate_labels(uint32_t iso, const char *thread, const char *instance,
                             cp_labels *out);

/* Receives each finished envelope; takes ownership of e's contents (cp_envelope_close). */
typedef void (*cp_emit_fn)(cp_envelope *e, void *arg);

typedef struct cp_window_meta {
    int64_t start_ns, end_ns;
    const char *instance, *producer_id;
    uint64_t *sequence;        /* incremented per envelope */
    uint64_t dropped_samples;  /* since the previous window */
    uint64_t dropped_windows;  /* carried from the transport */
    const char *agent_comment; /* may be NULL: a comment of the contprof-agent profile */
} cp_window_meta;

/* Builds and emits every isolate's profiles for the window and resets the CPU table.
 * Returns 0 or CP_ENOMEM (the window is then lost and counted by the caller). */
int cp_window_finish(const cp_window_meta *m, cp_emit_fn emit, void *arg);

/* Calls fn with each 'N' payload (model/relay.h) the windows built since the last call ask
 * the relay for (objects named from their own symbols that the host's name cache lacks; at
 * most 8 a window), and forgets them. Returns how many. Agent thread. */
uint32_t cp_window_take_names_wants(void (*fn)(const uint8_t *p, size_t len, void *arg), void *arg);

/* One capture window (captable.c): the envelopes of a capture slot's isolates. */
typedef struct cp_window_capture {
    int64_t start_ns, end_ns;
    const char *instance, *producer_id;
    uint64_t *sequence; /* the captures' own sequence (their own producer id) */
    const char *id;     /* label CP_CAPTURE_LABEL */
    int kind;           /* CP_KIND_CPU (the slot's table) or CP_KIND_ALLOC (buckets) */
    int64_t period;     /* ns between samples (cpu) or mean bytes (alloc) actually run */
    const char *engine; /* the envelopes' engine string */
    const cp_alloc_bucket *buckets; /* alloc: this capture's boosted buckets */
    uint32_t nbuckets;
} cp_window_capture;

/* Builds and emits one envelope per isolate of the capture window and empties the slot's
 * CPU table. Nothing is emitted for a window without samples. Returns 0 or CP_ENOMEM. */
int cp_window_finish_capture(unsigned slot, const cp_window_capture *w, cp_emit_fn emit, void *arg);
/* 1 if capture slot has no CPU sample waiting. */
int cp_window_capture_empty(unsigned slot);
/* Empties capture slot's CPU table without building anything. */
void cp_window_drop_capture(unsigned slot);

/* Frees the symbol cache, the CPU table and the streams' kept epochs (stream.h). */
void cp_window_reset(void);
/* CPU samples the aggregation table had no room for since the last call. */
uint64_t cp_window_take_dropped(void);

/* After fork in the child: forgets them without freeing (they may be inconsistent). */
void cp_window_abandon(void);

#endif
