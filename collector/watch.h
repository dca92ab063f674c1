/* How the agent hears of captures (model/capture.h), in one of two ways:
 * - with a contprofd URL (CONTPROF_SERVER): a thread of its own ("contprof-watch", the
 *   agent's: not sampled, signals blocked) asks GET /api/v1/control/captures every
 *   CP_WATCH_POLL_MS, at most CP_WATCH_HTTP_TIMEOUT_MS each, and leaves a changed answer for
 *   the agent thread, which never waits for the server. Why not the topic: a second
 *   librdkafka handle costs CPU even idle (librdkafka 2.0.2's main thread spins through the
 *   last millisecond before each of its timers); both costs are collector/README.md's
 *   `watch_*` rows.
 *   A server that does not serve the path (404: an older contprofd) turns the watcher into
 *   the consumer below.
 * - without: the control topic's consumer (CP_TOPIC_CONTROL), a second librdkafka handle,
 *   no consumer group, partition 0 read from the last CP_WATCH_TAIL messages on.
 * It never fails the host: errors are retried and counted. Called on the agent thread only
 * (a leaf, as kafka.c). */
#ifndef CP_WATCH_H
#define CP_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* How far back a new consumer starts: a capture still running when a process starts is
 * seen if its message is among the topic's last CP_WATCH_TAIL (contprofd writes one to
 * three messages per capture). */
#define CP_WATCH_TAIL 1024

/* How long the broker holds an empty fetch (librdkafka's fetch.wait.max.ms): a capture is
 * heard within this (plus the agent's tick) even from a broker that answers only at the
 * end of the wait, as librdkafka's mock cluster does; a real broker answers at once. */
#define CP_WATCH_FETCH_WAIT_MS 500

/* The polling interval and each poll's bound (a loaded contprofd can take a few hundred
 * ms); after n failures in a row the next poll is CP_WATCH_POLL_MS << (n - 1) later, at
 * most CP_WATCH_RETRY_MS. Why 750 ms: the gap between two polls stays under 1 s, so a poll
 * falls inside any capture of 1 s or more, for ~0.03% of a core (collector/README.md,
 * `watch_poll_spaced_cpu_percent_of_a_core_at_interval`). */
#define CP_WATCH_POLL_MS 750
#define CP_WATCH_HTTP_TIMEOUT_MS 1000
#define CP_WATCH_RETRY_MS 6000

/* A server given as "relay:DIR" is the host's relay in DIR (model/relay.h), asked over its
 * socket instead of HTTP: one question to contprofd per host rather than per process. */
#define CP_WATCH_RELAY_PREFIX "relay:"

typedef struct cp_watch cp_watch;

/* Called on a librdkafka thread (the agent's) when a message arrives while none waits:
 * must be short and must not call librdkafka. */
typedef void (*cp_watch_wake_fn)(void *arg);

/* Creates a watcher: a poller of server (NULL or "": none) sending token (NULL or "":
 * none) as its bearer token, else a consumer of the control topic on brokers. props (may
 * be NULL): further librdkafka properties as "name=value" lines (the producer's,
 * CONTPROF_KAFKA_*), applied last. wake (may be NULL) is told of new messages, so the agent
 * thread need not wait for its tick. Returns 0 with *out (cp_watch_destroy), or
 * CP_EKAFKA/CP_ENOMEM with err (may be NULL) saying why. */
int cp_watch_create(const char *server, const char *token, const char *brokers, const char *props,
                    cp_watch_wake_fn wake, void *wake_arg, cp_watch **out, cp_err *err);

/* Receives a control message's value (borrowed for the call). */
typedef void (*cp_watch_fn)(const uint8_t *value, size_t len, void *arg);

/* Hands every message fetched since the last call to fn, in offset order; serves
 * librdkafka's error callbacks. A poller hands on each capture of the latest answer that
 * differs from the one before (the same answer is handed on once). Never blocks. Returns
 * how many messages were handed. */
int cp_watch_poll(cp_watch *w, cp_watch_fn fn, void *arg);

/* 1 if the last cp_watch_poll handed a server's whole answer: every capture running for
 * this tenant, so one heard before and not handed now has ended or been cancelled (the
 * server lists running captures only, issue 36). 0 for the control topic, where a capture
 * ends by its own message. */
int cp_watch_was_whole(const cp_watch *w);

/* Errors since the last call (unknown topic, brokers down, fetch errors, a server that
 * failed or answered malformed), and the last one's text (valid until the next poll). */
uint64_t cp_watch_take_errors(cp_watch *w, const char **last);

/* Stops and destroys (NULL is fine); a poller's request in flight is not waited for. */
void cp_watch_destroy(cp_watch *w);

/* After fork in the child: the handle's threads (the poller's) are gone; forget it (memory
 * leaked). */
void cp_watch_abandon(cp_watch *w);

#endif
