/* The envelope: what travels through Kafka (proto/envelope.proto), with validation. */
#ifndef CP_ENVELOPE_H
#define CP_ENVELOPE_H

#include <stdint.h>
#include <stddef.h>
#include "error.h"
#include "labels.h"

#define CP_ENVELOPE_MAJOR 1
#define CP_ENVELOPE_MINOR 0

/* The Kafka topics envelopes travel on, named once for every stage: producers (the agent,
 * `contprof import`) write CP_TOPIC_PROFILES unless configured otherwise, the embedded
 * broker creates both, and ingest copies what it refuses to CP_TOPIC_DLQ. */
#define CP_TOPIC_PROFILES "contprof.profiles"
#define CP_TOPIC_DLQ "contprof.profiles.dlq"
/* Partition numbers a node may own or be asked about: 0 .. CP_MAX_PARTITIONS - 1. */
#define CP_MAX_PARTITIONS 4096

typedef enum cp_kind {
    CP_KIND_CPU = 1,   /* summed over time */
    CP_KIND_ALLOC = 2, /* summed over time */
    CP_KIND_INUSE = 3, /* a gauge: latest snapshot per instance */
    /* Pyroscope's other profile types (query/pyro.h), each under its own name */
    CP_KIND_WALL = 4,       /* summed over time: samples/count, wall/nanoseconds */
    CP_KIND_MUTEX = 5,      /* summed over time: contentions/count, delay/nanoseconds */
    CP_KIND_BLOCK = 6,      /* summed over time: contentions/count, delay/nanoseconds */
    CP_KIND_GOROUTINES = 7, /* a gauge: goroutine/count */
    /* a V8 heap snapshot as a retainer profile (model/heapsnap.h), a gauge:
     * retained_objects/count, retained_space/bytes */
    CP_KIND_HEAP = 8,
} cp_kind;
#define CP_KIND_MAX CP_KIND_HEAP

/* "cpu", "alloc", "inuse", "wall", "mutex", "block", "goroutines", "heap"; NULL for anything
 * else. */
const char *cp_kind_name(int kind);
/* 1 for a kind whose windows are snapshots (the latest per series counts: inuse,
 * goroutines, heap), 0 for one whose windows add up. */
int cp_kind_is_gauge(int kind);
/* Parses a kind name; returns the kind or 0. */
int cp_kind_parse(const char *name);

/* Producers send the pprof payload raw up to this size (Kafka's lz4 compresses the batch,
 * once) and gzip'd beyond it, to stay under Kafka's default 1 MB message limit. Readers
 * accept both. */
#define CP_RAW_PPROF_MAX (512u << 10)

struct cp_profile;
/* p as an envelope carries it (into out, which the caller closes): raw up to
 * CP_RAW_PPROF_MAX, gzip'd at level 1 beyond (on a 6 KB profile 39 us against 123 us at
 * level 6, for 16% more bytes). Returns 0 or CP_ENOMEM (out then empty). */
int cp_envelope_pprof(const struct cp_profile *p, cp_buf *out);

/* The largest pprof payload ingest accepts by default (cp_ingest_options.max_message_bytes);
 * `contprof import` checks its envelopes against it before sending. */
#define CP_INGEST_MAX_PPROF ((size_t)64 << 20)

#define CP_TENANT_MAX 64
#define CP_DEFAULT_TENANT "default"

typedef struct cp_envelope {
    uint32_t format_major, format_minor;
    char *tenant;     /* owned */
    cp_labels labels; /* owned */
    cp_kind kind;
    int64_t window_start_ns, window_duration_ns;
    char *producer_id; /* owned */
    uint64_t sequence;
    uint64_t dropped_samples, dropped_windows;
    int cumulative;
    char *engine;   /* owned, may be NULL */
    uint8_t *pprof; /* owned, unless pprof_borrowed */
    size_t pprof_len;
    int pprof_borrowed; /* pprof points into the buffer given to cp_envelope_decode_view */
} cp_envelope;

/* Frees what e owns and zeroes it. */
void cp_envelope_close(cp_envelope *e);

/* Checks the fields a reader relies on (version, tenant, labels, kind, window, producer,
 * payload present and at most max_pprof bytes). Returns 0, or CP_EENVELOPE, CP_EVERSION,
 * CP_ELIMIT (payload too large) or CP_EINVAL with err naming the field. */
int cp_envelope_validate(const cp_envelope *e, size_t max_pprof, cp_err *err);

/* Serialises e (format_major/minor filled in if zero) and appends it to out. Returns 0,
 * CP_EINVAL (more than CP_LABELS_MAX labels) or CP_ENOMEM. */
int cp_envelope_encode(const cp_envelope *e, cp_buf *out);

/* Parses and validates an envelope. On success *out owns copies of everything; on failure
 * *out is zeroed and the code is CP_EENVELOPE, CP_EVERSION or CP_ENOMEM. Unknown fields are
 * ignored. The pprof payload is not decoded here. */
int cp_envelope_decode(const uint8_t *buf, size_t len, size_t max_pprof, cp_envelope *out,
                       cp_err *err);
/* The same, except that out->pprof points into buf (no copy of the payload, the bulk of the
 * message): buf must outlive *out. */
int cp_envelope_decode_view(const uint8_t *buf, size_t len, size_t max_pprof, cp_envelope *out,
                            cp_err *err);

/* The auth field (16) appended to an encoded envelope: tag, length, HMAC-SHA-256. */
#define CP_ENVELOPE_AUTH_LEN 35

/* Appends the auth field to enc, an encoded envelope: HMAC-SHA-256 of enc keyed by token,
 * binding the envelope (its tenant among the rest) to whoever holds the tenant's token.
 * Returns 0 or CP_ENOMEM. */
int cp_envelope_sign(cp_buf *enc, const char *token);

/* 1 if the message buf ends with an auth field that token signed over everything before
 * it, else 0 (no auth field, or another key, or changed bytes). */
int cp_envelope_verify(const uint8_t *buf, size_t len, const char *token);

/* Series key for Kafka partitioning: tenant, kind and every label, in a stable text form
 * (so one series stays on one partition); appended to out. Returns 0 or CP_ENOMEM. */
int cp_envelope_series_key(const cp_envelope *e, cp_buf *out);

#endif
