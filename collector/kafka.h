/* The agent's Kafka producer: a bounded backlog in front of librdkafka that drops the
 * oldest window on overflow, never blocks, and counts everything it loses. Agent thread
 * only. */
#ifndef CP_KAFKA_H
#define CP_KAFKA_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

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
