/* Where a producer's envelopes go: one sink for the agent (libcontprof.so) and the V8
 * source (`contprof v8`), with one transport behind it:
 * - the host's relay (model/relay.h) over its Unix socket, each envelope acknowledged in
 *   microseconds; when the relay is away, busy or slow, the relay's spool directory;
 * - or a Kafka producer of its own (direct, an option: CONTPROF_BROKERS), brokers given or
 *   asked of contprofd, asked again when they stay unreachable.
 * Every envelope the sink cannot hand on is counted (cp_sink_take_dropped), to be reported in
 * the producer's next envelope. One thread only (the agent thread); may allocate and block
 * within the bounds below, never longer. */
#ifndef CP_SINK_H
#define CP_SINK_H

#include <stdatomic.h>
#include <stdint.h>

#include "envelope.h"
#include "error.h"
#include "kafka.h"

typedef struct cp_sink_options {
    /* The relay's directory (relay.sock, spool/): when set, the transport is the relay. */
    const char *relay_dir;
    /* Else Kafka: brokers (may be empty), or asked of server (a contprofd URL). */
    const char *brokers, *server;
    const char *token; /* signs every envelope (model/envelope.h) and asks server; may be "" */
    const char *topic, *kafka_props;
    int kafka_queue; /* envelopes held for Kafka at most */
    /* Bumped when the host took over one of the agent's fds (collector/fd.h): the Kafka
     * client is rebuilt. NULL outside the agent. */
    atomic_uint *fd_revocations;
    /* How long one envelope may take to reach the relay and be acknowledged before it is
     * spooled instead (and the connection dropped). 0: CP_SINK_RELAY_TIMEOUT_NS. */
    int64_t relay_timeout_ns;
} cp_sink_options;

#define CP_SINK_RELAY_TIMEOUT_NS ((int64_t)200 * 1000000)

typedef struct cp_sink cp_sink;

/* Creates a sink (nothing connects yet: the first send or tick does). The options' strings
 * are copied. Returns 0 with *out (cp_sink_destroy), CP_ENOMEM, or CP_EINVAL with err naming
 * a relay directory whose socket path is too long. */
int cp_sink_create(const cp_sink_options *o, cp_sink **out, cp_err *err);

/* Signs (with a token) and hands on one envelope; e stays the caller's. Counts a loss when
 * it cannot: encoding failed, the relay refused it, the spool is full or missing, no
 * transport is up yet. */
void cp_sink_send(cp_sink *s, const cp_envelope *e);

/* With the relay: sends it one frame of type that needs no answer ('N', model/relay.h),
 * ahead of the next envelope on the same connection; dropped (nothing else happens) when
 * the relay cannot be reached at once. Without a relay: nothing. */
void cp_sink_hint(cp_sink *s, uint8_t type, const uint8_t *p, size_t len);

/* Kafka only (the relay's own sink): hands on an encoded envelope as it is (value and key
 * malloc'd, ownership taken). Counts a loss when no client is up. */
void cp_sink_send_encoded(cp_sink *s, uint8_t *value, size_t len, uint8_t *key, size_t klen);

/* Kafka only: who keeps what the producer gives up on (kafka.h cp_kafka_set_keep), set on
 * every client the sink builds. */
void cp_sink_set_keep(cp_sink *s, cp_kafka_keep_fn fn, void *arg);

/* Kafka only: envelopes held and not yet acknowledged, or -1 with no client up or all its
 * brokers unreachable (then whatever is sent waits or is lost). */
int64_t cp_sink_pending(const cp_sink *s);

/* Housekeeping, each agent tick: Kafka's delivery reports and backlog, rebuilding a failed
 * or revoked client, asking the server for brokers. Never blocks longer than a broker
 * question to the server (2 s, and only after the brokers stayed down 5 s). */
void cp_sink_tick(cp_sink *s);

/* Kafka only: envelopes the brokers acknowledged since the last call. */
uint64_t cp_sink_take_delivered(cp_sink *s);

/* Envelopes lost since the last call. */
uint64_t cp_sink_take_dropped(cp_sink *s);

/* 1 if the sink holds nothing that a flush would wait for (a Kafka client with messages). */
int cp_sink_idle(const cp_sink *s);

/* The brokers in use ("" with the relay, or none known yet): the capture watcher's. */
const char *cp_sink_brokers(const cp_sink *s);

/* The image ends (exec, _exit, stop): Kafka gets timeout_ns to deliver, what it still holds
 * is counted lost, and the client goes (rebuilt by a later tick). The relay's envelopes
 * were acknowledged when sent: nothing to wait for. */
void cp_sink_flush(cp_sink *s, int64_t timeout_ns);

/* Flushes (as above) and frees s. Returns what was lost and not yet taken. NULL is fine. */
uint64_t cp_sink_destroy(cp_sink *s, int64_t timeout_ns);

/* In a fork child, on the forking thread: the parent's Kafka handle has no threads here
 * (forgotten without touching it); the child's copies of the relay connection and the spool
 * directory are closed with close_fd (the agent's cp_fd_close), so the next send connects
 * anew. */
void cp_sink_after_fork_child(cp_sink *s, int (*close_fd)(int));

#endif
