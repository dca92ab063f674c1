/* Control messages from contprofd to the agents (proto/control.proto): captures, the
 * on-demand high-resolution profiles of the isolates a selector names.
 *
 * The contract between the two sides:
 * - contprofd writes one message per capture state change to CP_TOPIC_CONTROL (one
 *   partition), keyed by the capture's id, signed with the tenant's token when it has one.
 *   The latest message of an id is the capture's state; cancelled ends it early.
 * - An agent reads the topic, ignores captures of other tenants, captures whose signature
 *   does not verify against its own token (when it holds one) and captures whose end is
 *   past, and boosts the isolates whose labels match the selector until end_ns.
 * - A captured isolate's samples go, besides its always-on windows at their usual rate,
 *   into envelopes labelled CP_CAPTURE_LABEL=<id>. Queries leave series with that label out
 *   unless their selector names it, so a capture never adds CPU to the always-on view. */
#ifndef CP_MODEL_CAPTURE_H
#define CP_MODEL_CAPTURE_H

#include <stdint.h>
#include <stddef.h>
#include "envelope.h"
#include "error.h"
#include "selector.h"

#define CP_TOPIC_CONTROL "contprof.control"
#define CP_CAPTURE_LABEL "capture"
#define CP_CAPTURE_MAJOR 1
#define CP_CAPTURE_ID_MAX 64
/* Hard ceilings a decoded message must respect; contprofd's configured limits are lower. */
#define CP_CAPTURE_HZ_CEIL 10000
#define CP_CAPTURE_DURATION_CEIL_NS (24LL * 3600 * 1000000000)
/* captures.max_concurrent at most: the agents' feed (GET /api/v1/control/captures) holds a
 * tenant's running captures only, each under CP_CAPTURE_RECORD_MAX bytes, so it stays
 * under the agents' 1 MiB poll limit by construction (issue 36); an agent runs 64 at once. */
#define CP_CAPTURE_CONCURRENT_CEIL 64
#define CP_CAPTURE_RECORD_MAX 8192 /* a selector of 4096 bytes, ids, fields, signature */
_Static_assert(CP_CAPTURE_CONCURRENT_CEIL *CP_CAPTURE_RECORD_MAX < (1 << 20),
               "the agents' feed must fit their 1 MiB poll limit");

typedef struct cp_capture {
    char id[CP_CAPTURE_ID_MAX + 1];
    char tenant[CP_TENANT_MAX + 1];
    char *selector; /* owned */
    cp_kind kind;   /* CP_KIND_CPU or CP_KIND_ALLOC */
    uint32_t cpu_hz;
    int64_t alloc_rate;
    int64_t start_ns, end_ns;
    int cancelled;
    uint32_t max_overhead_permille;
} cp_capture;

/* Frees what c owns and zeroes it. */
void cp_capture_close(cp_capture *c);

/* Checks every field (id characters and length, tenant, selector parses, kind, rate within
 * 1..CP_CAPTURE_HZ_CEIL for cpu or > 0 for alloc, 0 < end - start <= the duration
 * ceiling). Returns 0 or CP_EINVAL with err naming the field and value. */
int cp_capture_validate(const cp_capture *c, cp_err *err);

/* 1 while capture c runs at now_ns: neither cancelled nor past its end. The one test of a
 * capture's liveness: agents, the V8 source, contprofd's API and start-up. */
static inline int cp_capture_live(const cp_capture *c, int64_t now_ns)
{
    return !c->cancelled && c->end_ns > now_ns;
}

/* Serialises and validates c and appends it to out, then signs with token (if not NULL or
 * "") all of out (cp_envelope_sign): to sign one message, give an empty out. Returns 0, CP_EINVAL
 * or CP_ENOMEM. */
int cp_capture_encode(const cp_capture *c, const char *token, cp_buf *out);

/* Parses and validates a control message. On success *out owns its selector; on failure
 * *out is zeroed and the code is CP_EENVELOPE (not a capture), CP_EVERSION or CP_EINVAL.
 * The signature is not checked here: cp_envelope_verify(buf, len, token) does. */
int cp_capture_decode(const uint8_t *buf, size_t len, cp_capture *out, cp_err *err);

/* The list GET /api/v1/control/captures answers (query/captures.c, read by collector/watch.c):
 * messages as above, each after its length (4 bytes, big-endian). Appends c signed with
 * token (as cp_capture_encode). 0, CP_EINVAL or CP_ENOMEM (out as it was). */
int cp_capture_feed_append(cp_buf *out, const cp_capture *c, const char *token);
/* Hands each message of the list body[0..len) to fn (borrowed for the call). The whole
 * list is checked first: -1, nothing handed, when a length runs past the end; else how
 * many were handed. */
int cp_capture_feed_split(const uint8_t *body, size_t len,
                          void (*fn)(const uint8_t *value, size_t len, void *arg), void *arg);

/* The CPU rate a source can give capture c: the asked cpu_hz, at most max_hz (the source's
 * bound), at most what c's max_overhead_permille allows at sample_cost_ns a sample. Returns
 * the rate; when it is lower than asked, reason (cap bytes) says which bound held, naming
 * the setting and where it is changed. Shared by the agent (collector/captable.c) and the V8
 * source, so both reduce a rate alike and say so in the same words. */
int64_t cp_capture_plan_hz(const cp_capture *c, int64_t max_hz, int64_t sample_cost_ns,
                           const char *source, char *reason, size_t cap);

/* ------------------------------------------------------------------------------------
 * The intake: what a table of running captures does with each control message. One
 * decision for the agent (collector/captable.c) and the V8 source (collector/v8/), each
 * keeping only its own bookkeeping (boost, generation, poll; per-isolate runs). */

/* The part of a table's slot the intake reads and writes. A slot not used is all zero
 * (the caller zeroes a slot when it forgets a capture). */
typedef struct cp_capture_slot {
    int used;        /* holds a capture */
    int ended;       /* ended here: a later message does not restart it */
    cp_capture c;    /* owned */
    cp_selector sel; /* c.selector, parsed; owned */
} cp_capture_slot;

/* Control messages not run, since start: the agent prints them as control_bad,
 * control_other_tenant, control_bad_signature, control_expired, captures_over_table. */
typedef struct cp_capture_counts {
    uint64_t bad;     /* undecodable, or a selector that does not parse */
    uint64_t foreign; /* another tenant's */
    uint64_t badsig;  /* a signature that does not verify with our token */
    uint64_t expired; /* cancelled or past their end when first heard */
    uint64_t full;    /* no free slot when first heard */
} cp_capture_counts;

/* A table as the intake sees it: slot(arg, i) for i in 0..n (n <= 64), its counts. */
typedef struct cp_capture_table {
    cp_capture_slot *(*slot)(void *arg, int i);
    void *arg;
    int n;
    cp_capture_counts *counts;
    const char *tenant; /* ours: other tenants' captures are counted and left */
    const char *token;  /* ours, or NULL/"": when set, a message must verify with it */
    int heap;           /* 1: heap captures run here (V8); 0: skipped (a native program) */
} cp_capture_table;

typedef enum cp_capture_act {
    CP_CAPTURE_BAD,     /* undecodable or its selector does not parse (counts.bad; err) */
    CP_CAPTURE_FOREIGN, /* another tenant's (counts.foreign) */
    CP_CAPTURE_BADSIG,  /* its signature does not verify (counts.badsig) */
    CP_CAPTURE_SKIPPED, /* a heap capture and the table has no heap */
    CP_CAPTURE_SAME,    /* slot's capture, nothing to do (unchanged, or ended here before) */
    CP_CAPTURE_ENDED,   /* slot's capture is cancelled or past: slot->ended set now */
    CP_CAPTURE_UPDATED, /* slot's end, rate or budget changed (slot->c updated): re-plan */
    CP_CAPTURE_EXPIRED, /* not in the table, and not live (counts.expired) */
    CP_CAPTURE_NEW,     /* taken into slot: used, c and sel set; plan it */
    CP_CAPTURE_FULL,    /* no free slot (counts.full; the first: counts.full == 1) */
} cp_capture_act;

/* What the intake did with one message, for the caller's own bookkeeping and log lines. */
typedef struct cp_capture_heard {
    cp_capture_act act;
    int slot;                       /* SAME, ENDED, UPDATED, NEW: the slot; else -1 */
    char id[CP_CAPTURE_ID_MAX + 1]; /* the capture's id ("" when undecodable) */
    int cancelled;                  /* the message says cancelled */
    cp_err err;                     /* BAD: why (id "": undecodable; else the selector's) */
} cp_capture_heard;

/* Takes control message v[0..len) into table t at now_ns (realtime): decodes it, leaves
 * other tenants', badly signed and (t->heap 0) heap captures, and for a capture in the
 * table ends it (not live), updates it (a changed end, cpu_hz, alloc_rate or
 * max_overhead_permille of the same kind) or does nothing (ended here: a later message
 * does not restart it); a new live one takes the first free slot. Counts what it leaves
 * in t->counts, fills *out; v is borrowed for the call. Never allocates beyond the
 * decoded record and selector, which a taken slot owns. */
void cp_capture_intake(const cp_capture_table *t, const uint8_t *v, size_t len, int64_t now_ns,
                       cp_capture_heard *out);

/* Forgets slot s's capture: frees what it owns and zeroes it. */
void cp_capture_slot_close(cp_capture_slot *s);

/* ------------------------------------------------------------------------------------
 * The engine text of a capture window (the envelope's engine string): written by the agent
 * and the V8 source, read by contprofd's capture answers (query/captures.c):
 *   "<engine> capture asked=A ran=R[ cost_us_per_s=C][ cost_permille=P][ reason=WHY]"
 * the reason last: it runs to the end of the text. */
typedef struct cp_capture_engine {
    int64_t asked, ran; /* the rate asked and the rate run (Hz or bytes; heap: 1) */
    int has_cost;       /* cost_us_per_s: the sampler's CPU per wall second it added */
    double cost_us_per_s;
    int has_permille; /* cost_permille: that cost in 1/1000 of the isolate's CPU */
    double cost_permille;
    const char *reason; /* why ran differs from asked; NULL or "": none */
} cp_capture_engine;

/* Writes engine (the source's engine text, e.g. "v8-inspector") and e's fields as above into
 * out[0..cap) (cut at cap, as snprintf). Returns the length snprintf would. */
int cp_capture_engine_write(char *out, size_t cap, const char *engine, const cp_capture_engine *e);

/* Reads what text (NULL allowed) says of a capture: 1 with *e filled (e->reason points into
 * text, "" when it gives none), 0 (e zeroed, reason "") when it says nothing of one. */
int cp_capture_engine_parse(const char *text, cp_capture_engine *e);

#endif
