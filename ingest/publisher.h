/* The control publisher: contprofd's writer of capture states to the control topic
 * (CP_TOPIC_CONTROL, model/capture.h), which every agent reads. Lives in ingest/ because
 * ingest owns contprofd's Kafka clients; the API reaches it through a callback
 * (query/captures.h), so query/ links no Kafka. */
#ifndef CP_INGEST_PUBLISHER_H
#define CP_INGEST_PUBLISHER_H

#include <stdint.h>

#include "capture.h"
#include "error.h"

typedef struct cp_publisher cp_publisher;

/* A producer to topic (NULL: CP_TOPIC_CONTROL) at brokers, with the extra librdkafka
 * properties kafka_props (NULL-terminated key, value pairs; consumer-only ones ignored).
 * Returns 0 with *out, CP_EKAFKA or CP_ENOMEM. */
int cp_publisher_create(const char *brokers, const char *const *kafka_props, const char *topic,
                        cp_publisher **out, cp_err *err);
void cp_publisher_destroy(cp_publisher *c); /* NULL is fine */

/* Writes c (signed with token when not NULL/"") keyed by its id and waits until the broker
 * has it or timeout_ns passed. Any thread; several at once. Returns 0, CP_EINVAL (c does
 * not validate), CP_ENOMEM, or CP_EKAFKA with err naming the broker's error or the
 * timeout. */
int cp_publisher_publish(cp_publisher *ctl, const cp_capture *c, const char *token,
                         int64_t timeout_ns, cp_err *err);

/* One message for cp_publisher_produce (borrowed for the call). */
typedef struct cp_publisher_message {
    const void *key, *value;
    size_t key_len, value_len;
} cp_publisher_message;

/* Writes m[0..n) to the publisher's topic and waits until the broker acknowledged every
 * one or timeout_ns passed (the profiles topic's writer for Pyroscope's ingest,
 * query/pyro.h). Any thread. Returns 0; CP_ELIMIT when one is over max_message (0 = no
 * limit of ours) or the producer's message.max.bytes; CP_EKAFKA naming the broker's error
 * or the timeout (some may then be written: their producer ids make a retry a duplicate
 * the store drops); CP_ENOMEM. */
int cp_publisher_produce(cp_publisher *pub, const cp_publisher_message *m, size_t n,
                         size_t max_message, int64_t timeout_ns, cp_err *err);

#endif
