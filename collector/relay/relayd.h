/* The per-host relay (README.md): takes envelopes from the host's processes over a Unix
 * socket (model/relay.h), holds the host's one Kafka producer (idempotent, lz4), spools to
 * disk what Kafka cannot take yet and drains the spool when it can, and serves the capture
 * list it asks contprofd for once per host. contprofd runs one in-process; `contprof relay`
 * runs one alone. */
#ifndef CP_RELAY_SERVER_H
#define CP_RELAY_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "metrics.h"

typedef struct cp_relay_options {
    const char *dir;     /* relay.sock and spool/ live here (created) */
    const char *brokers; /* Kafka bootstrap list; or, empty: */
    const char *server;  /* a contprofd URL to ask for brokers and the capture list */
    /* contprofd's bearer token (asking the server); with sign set, also signs every envelope
     * that arrives unsigned (contprofd with tokens stores only signed ones) */
    const char *token;
    int sign;
    const char *topic, *kafka_props; /* Kafka topic and extra properties ("name=value\n") */
    int queue;                       /* envelopes held for Kafka (default 10000) */
    int max_clients;                 /* connections at once (default 1024) */
    size_t max_buffered;             /* bytes of partial frames held (default 64 MiB) */
    uint32_t names_max_files;        /* files of the name cache DIR/names (default 4096) */
    uint64_t names_max_bytes;        /* and their bytes (default 256 MiB) */
} cp_relay_options;

typedef struct cp_relay cp_relay;

/* Creates the relay: the directory and spool (model/relay.h cp_spool_open), and the socket
 * bound and listening (mode 0666: any local user's process may hand in windows). A socket
 * file left by a relay that is gone is replaced; one a live relay answers on is refused.
 * Returns 0 with *out (cp_relay_destroy), or CP_EIO/CP_EINVAL/CP_ENOMEM with err naming the
 * path and the reason. Nothing runs until cp_relay_start. */
int cp_relay_create(const cp_relay_options *o, cp_relay **out, cp_err *err);

/* Starts the relay's threads. Returns 0 or CP_ENOMEM. */
int cp_relay_start(cp_relay *r, cp_err *err);

/* Registers the relay's counters (contprof_relay_*) in m. Returns 0 or CP_ENOMEM. */
int cp_relay_register_metrics(cp_relay *r, cp_metrics *m);

/* The counters, for a log line or a test. */
typedef struct cp_relay_stats {
    uint64_t connections, accepted, refused, spooled, drained, delivered, lost;
    int64_t pending; /* held for Kafka, -1 when it is not reachable */
    uint64_t names_built, names_refused, names_evicted; /* the name cache */
} cp_relay_stats;
void cp_relay_get_stats(cp_relay *r, cp_relay_stats *st);

/* Stops taking envelopes (the socket file is removed first, so senders spool), gives Kafka
 * up to flush_ns to deliver what it holds and spools the rest, and frees r. NULL is fine. */
void cp_relay_destroy(cp_relay *r, int64_t flush_ns);

#endif
