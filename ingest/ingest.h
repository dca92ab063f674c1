/* Ingest: the Kafka consumer that validates envelopes and writes them into the store,
 * exactly once. Offsets live in the store, written in the same synced LevelDB batch as the
 * windows they produced; Kafka's own committed offsets are never used. Bad messages go to
 * the dead-letter topic with the reason attached and the partition moves on. */
#ifndef CP_INGEST_H
#define CP_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "metrics.h"
#include "offsets.h"
#include "pprof.h"
#include "store.h"

typedef struct cp_ingest cp_ingest;

typedef struct cp_ingest_options {
    const char *brokers;   /* bootstrap.servers (required) */
    const char *group_id;  /* consumer group; NULL = "contprofd" */
    const char *topic;     /* NULL = "contprof.profiles" */
    const char *dlq_topic; /* NULL = "contprof.profiles.dlq" */
    /* Extra librdkafka properties, NULL-terminated name, value pairs, applied to the
     * consumer and the DLQ producer (security.protocol, sasl.*, ssl.*, ...). */
    const char *const *kafka_props;
    uint32_t batch_max_messages;   /* messages per LevelDB write; 0 = 512 */
    uint32_t batch_max_ms;         /* longest a message waits for its write; 0 = 200 */
    size_t max_message_bytes;      /* envelope payload limit; 0 = 64 MiB */
    const cp_pprof_limits *limits; /* pprof decoding limits; NULL = defaults */
    uint32_t maintain_every_ms;    /* retention step period; 0 = 10000 */
    uint32_t maintain_max_keys;    /* blocks deleted per step; 0 = 20000 */
    uint32_t decode_threads;       /* threads decoding pprof, this one included;
                                      0 = one per CPU, at most 4 */
    /* 1 = the broker's log is newer than the offsets in the store (contprofd's embedded
     * broker starts empty at every start): offsets stored by earlier processes are ignored
     * and each partition is read from the beginning. Duplicates are still dropped. */
    int new_log;
    /* NULL-terminated tenant, token pairs (contprofd's token.<tenant> lines), kept by
     * reference: when given, an envelope is stored only if it carries an auth field signed
     * with one of its tenant's tokens (cp_envelope_verify), else it goes to the DLQ with
     * reason "tenant". NULL = no check (a single-tenant daemon on loopback). */
    const char *const *tenant_tokens;
    /* Static ownership (a cluster node's `cluster.partitions`, ingest/assign.h grammar, kept
     * by reference): these partitions are assigned at start, without a consumer group, each
     * at the offset stored with the data, and never move. NULL = the consumer group. */
    const char *partitions;
} cp_ingest_options;

/* Why a message went to the dead-letter topic (the "contprof-reason" header). */
#define CP_DLQ_REASON_MAP(X)                                                                       \
    X(ENVELOPE, "envelope") /* not a decodable / valid envelope */                                 \
    X(VERSION, "version")   /* unknown envelope major version */                                   \
    X(PPROF, "pprof")       /* payload is not a valid (gzip'd) pprof */                            \
    X(LIMIT, "limit")       /* over a size / count limit */                                        \
    X(REJECTED, "rejected") /* the store refused it (e.g. sample types changed) */                 \
    X(TENANT, "tenant")     /* not signed with a token of the tenant it names */

typedef enum cp_dlq_reason {
#define CP_DLQ_ENUM_(n, s) CP_DLQ_##n,
    CP_DLQ_REASON_MAP(CP_DLQ_ENUM_)
#undef CP_DLQ_ENUM_
        CP_DLQ_NREASONS
} cp_dlq_reason;

/* "envelope", "version", ...; NULL for anything else. */
const char *cp_dlq_reason_name(int reason);

typedef struct cp_ingest_stats {
    uint64_t messages;      /* consumed (all outcomes) */
    uint64_t bytes;         /* payload bytes consumed */
    uint64_t windows;       /* stored */
    uint64_t duplicates;    /* dropped by (producer, sequence) */
    uint64_t skipped;       /* below the stored offset (already stored) */
    uint64_t sequence_gaps; /* envelopes agents numbered that ingest never read */
    uint64_t dlq[CP_DLQ_NREASONS];
    uint64_t dlq_failed; /* bad messages whose DLQ produce failed (still skipped) */
    uint64_t gap;        /* messages lost because the broker dropped them before we read: the sum
                            of the partitions' lost (contprof_ingest_lost_total) */
    uint64_t batches;    /* LevelDB writes */
    int64_t lag;         /* messages behind the high watermarks of the assigned
                            partitions; -1 while unknown */
    uint32_t partitions; /* assigned partitions */
    int running;         /* the consumer thread is up */
    int failed;          /* 0: a store error pauses ingest (paused below), never stops it */
    char error[256];
    /* A store write failed (disk full, I/O error): nothing is consumed, no offset moves,
     * and reopening the store is retried with backoff until it works. */
    int paused;             /* 1 while waiting for the store */
    uint64_t store_errors;  /* failed store writes and reopen attempts */
    char pause_reason[256]; /* the last store error while paused */
    int ready;              /* partitions have been assigned once: the consumer reads */
    uint64_t dlq_truncated; /* bad messages too large for the DLQ, sent as a truncated copy */
    char last_error[256];   /* the latest error of any kind (DLQ, consumer), "" if none */
    uint64_t offset_resets; /* a partition's log found behind its stored offset (a broker
                               restarted empty, a topic recreated): read from its start */
} cp_ingest_stats;

/* What became of the offsets of one partition (model/offsets.h), for senders that wait
 * until what they sent is stored (GET /api/v1/ingest/offsets). */
#define CP_INGEST_RANGES CP_OFFSETS_RANGES

/* Copies up to max partitions this process has been assigned (in partition order) into
 * out; returns how many there are (may exceed max). Any thread. */
uint32_t cp_ingest_get_partitions(cp_ingest *in, cp_partition_offsets *out, uint32_t max);

/* What agents reported losing themselves (the envelope's dropped_windows and
 * dropped_samples), summed per service once per producer and window. */
typedef struct cp_ingest_dropped {
    char service[64];
    uint64_t windows, samples;
} cp_ingest_dropped;

/* Copies up to max services into out; returns how many there are. Any thread. */
uint32_t cp_ingest_get_dropped(cp_ingest *in, cp_ingest_dropped *out, uint32_t max);

/* Registers ingest's statistics in r (the contprof_ingest_* and contprof_agent_dropped_*
 * families of /metrics); cp_ingest_destroy ends the registration. Once per ingest. Returns
 * 0, CP_ENOMEM or CP_EINVAL (already registered there); nothing stays registered then. */
int cp_ingest_register_metrics(cp_ingest *in, cp_metrics *r);

/* Creates the consumer (group, enable.auto.commit=false) and the DLQ producer for store
 * (not owned; must outlive the ingest). Does not consume yet. */
int cp_ingest_create(const cp_ingest_options *opt, cp_store *store, cp_ingest **out, cp_err *err);

/* Starts the consumer thread. */
int cp_ingest_start(cp_ingest *in, cp_err *err);

/* Waits, at most timeout_ns, until ingest has stored everything the assigned partitions
 * hold now: their end offsets asked of the broker, then the stored offsets watched until
 * they reach them, batches written at once meanwhile. For a stop with the embedded broker,
 * whose messages die with the process. Returns 0, or CP_ELIMIT (the broker did not answer,
 * or ingest did not catch up in time; logged), or CP_ENOMEM. Any thread but ingest's. */
int cp_ingest_drain(cp_ingest *in, int64_t timeout_ns);

/* Stops the thread: the in-flight batch is written (with its offsets), the DLQ producer
 * flushed, and the consumer leaves the group. Safe to call twice or without start. */
void cp_ingest_stop(cp_ingest *in);

/* Stops if needed and frees everything. NULL is fine. */
void cp_ingest_destroy(cp_ingest *in);

/* A consistent copy of the counters (any thread). */
void cp_ingest_get_stats(cp_ingest *in, cp_ingest_stats *out);

/* Process-wide malloc policy for a process that ingests (contprofd calls it before it
 * starts any thread; the ingest benchmark too). Every window passes through buffers of a
 * few hundred KB (librdkafka's decompressed message sets, the decoded profile): with
 * glibc's defaults those are mapped and unmapped, or trimmed and faulted back in, over
 * and over (measured: 22 page faults per window; with this policy 10). Fixed thresholds
 * keep them in the heap: blocks below 16 MiB come from the arenas, and an arena gives
 * memory back once more than 64 MiB is free at its top. No effect outside glibc. */
void cp_ingest_malloc_policy(void);

#endif
