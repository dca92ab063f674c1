/* The agent's Kafka producer: a bounded backlog in front of librdkafka that drops the
 * oldest window on overflow, never blocks, and counts everything it loses. Agent thread
 * only. */
#ifndef CP_KAFKA_H
#define CP_KAFKA_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "error.h"

/* librdkafka's functions the agent calls (the producer here, the control consumer in
 * watch.c), loaded by cp_rk_load on first use and called through cp_rk. */
/* One function a line, by hand: clang-format 14 lays X-lists out differently on each pass. */
/* clang-format off */
#define CP_RK_FUNCS(X)                                                                             \
    X(rd_kafka_conf_destroy)                                                                       \
    X(rd_kafka_conf_new)                                                                           \
    X(rd_kafka_conf_set)                                                                           \
    X(rd_kafka_conf_set_dr_msg_cb)                                                                 \
    X(rd_kafka_conf_set_error_cb)                                                                  \
    X(rd_kafka_conf_set_log_cb)                                                                    \
    X(rd_kafka_conf_set_opaque)                                                                    \
    X(rd_kafka_consume_batch_queue)                                                                \
    X(rd_kafka_consume_start_queue)                                                                \
    X(rd_kafka_consume_stop)                                                                       \
    X(rd_kafka_destroy)                                                                            \
    X(rd_kafka_err2str)                                                                            \
    X(rd_kafka_fatal_error)                                                                        \
    X(rd_kafka_flush)                                                                              \
    X(rd_kafka_last_error)                                                                         \
    X(rd_kafka_message_destroy)                                                                    \
    X(rd_kafka_new)                                                                                \
    X(rd_kafka_outq_len)                                                                           \
    X(rd_kafka_poll)                                                                               \
    X(rd_kafka_produce)                                                                            \
    X(rd_kafka_purge)                                                                              \
    X(rd_kafka_queue_cb_event_enable)                                                              \
    X(rd_kafka_queue_destroy)                                                                      \
    X(rd_kafka_queue_new)                                                                          \
    X(rd_kafka_topic_destroy)                                                                      \
    X(rd_kafka_topic_new)
/* clang-format on */

typedef struct cp_rk_lib {
    int tried, ok;
#define CP_RK_FIELD(f) __typeof__(&f) f;
    CP_RK_FUNCS(CP_RK_FIELD)
#undef CP_RK_FIELD
} cp_rk_lib;
extern cp_rk_lib cp_rk;

/* Loads librdkafka once (agent thread). Returns 0 or CP_EKAFKA with err naming what is
 * missing (again on later calls, without the detail: it was said the first time). */
int cp_rk_load(cp_err *err);

typedef struct cp_kafka cp_kafka;

/* Creates a producer for brokers/topic holding at most queue messages (backlog plus
 * librdkafka's own queue). props (may be NULL) holds further librdkafka properties as
 * "name=value" lines, applied last (SASL/SSL settings). Returns 0 with *out the producer
 * (the caller destroys it with cp_kafka_destroy), or CP_EKAFKA/CP_ENOMEM with err (may be
 * NULL) saying why: librdkafka missing, the property it refused, the brokers. */
int cp_kafka_create(const char *brokers, const char *topic, int queue, const char *props,
                    cp_kafka **out, cp_err *err);

/* Queues one message; takes ownership of value and key (both malloc'd). */
void cp_kafka_send(cp_kafka *k, uint8_t *value, size_t len, uint8_t *key, size_t klen);

/* Serves delivery reports and moves the backlog into librdkafka. Never blocks. */
void cp_kafka_poll(cp_kafka *k);

/* Who keeps what the producer gives up on (the relay spools it): called with each message
 * dropped from a full backlog, failed in delivery, or left at cp_kafka_destroy; value is
 * valid only during the call. Returns 0 if it kept the message, else it counts as dropped.
 * Without one (the agent), all of these are dropped and counted. */
typedef int (*cp_kafka_keep_fn)(void *arg, const uint8_t *value, size_t len);
void cp_kafka_set_keep(cp_kafka *k, cp_kafka_keep_fn fn, void *arg);

/* Messages the brokers acknowledged since the last call. */
uint64_t cp_kafka_take_delivered(cp_kafka *k);

/* Messages held and not yet acknowledged: the backlog plus librdkafka's queue. */
size_t cp_kafka_pending(const cp_kafka *k);

/* Windows lost since the last call (overflow, delivery failure). */
uint64_t cp_kafka_take_dropped(cp_kafka *k);

/* 1 if the handle hit a fatal error and must be re-created. */
int cp_kafka_failed(cp_kafka *k);

/* How long librdkafka has reported all brokers down with no delivery since (ns), or 0. */
int64_t cp_kafka_down_ns(const cp_kafka *k);

/* Flushes for at most timeout_ms, purges the rest and destroys. Returns the windows lost
 * that cp_kafka_take_dropped has not reported yet. NULL is fine. */
uint64_t cp_kafka_destroy(cp_kafka *k, int timeout_ms);

/* After fork in the child: the handle's threads do not exist there; forget it without
 * touching it (its memory is leaked on purpose). */
void cp_kafka_abandon(cp_kafka *k);

#endif
