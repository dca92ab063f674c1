/* The embedded broker: librdkafka's mock cluster hosted inside this process, so contprofd
 * runs with no Kafka installed. It is memory only: each partition keeps at most about
 * 5 MiB (or 100,000 message sets); older messages are dropped and a consumer that falls
 * that far behind finds its offset out of range. Point contprofd at a real Kafka for
 * anything that must survive a restart of the daemon. All rd_kafka_mock use is here. */
#ifndef CP_BROKER_H
#define CP_BROKER_H

#include "envelope.h" /* CP_TOPIC_PROFILES, CP_TOPIC_DLQ */
#include "error.h"

/* What the mock cluster holds per partition before it drops the oldest message sets,
 * read or not (fixed in librdkafka's source, no setting changes it). */
#define CP_BROKER_PARTITION_BYTES (5u << 20)
/* The largest message a sender may give the embedded broker: one message alone in a
 * partition must leave room for what others send meanwhile. */
#define CP_BROKER_MAX_MESSAGE_BYTES (4u << 20)
/* Bytes a sender may have produced to one partition and not yet seen stored: well under
 * CP_BROKER_PARTITION_BYTES, so nothing is dropped before ingest reads it. */
#define CP_BROKER_MAX_IN_FLIGHT_BYTES (3u << 20)
/* Partitions of contprof.profiles when none are configured (embedded.partitions). */
#define CP_BROKER_DEFAULT_PARTITIONS 4

typedef struct cp_broker cp_broker;

typedef struct cp_broker_options {
    int brokers;    /* mock brokers (0 = 1) */
    int partitions; /* partitions of contprof.profiles (0 = the default); the DLQ gets 1 */
} cp_broker_options;

/* Starts the mock cluster on 127.0.0.1 (kernel-chosen ports) and creates both topics.
 * opt may be NULL. *out is owned by the caller (cp_broker_destroy). */
int cp_broker_create(const cp_broker_options *opt, cp_broker **out, cp_err *err);

/* The bootstrap list ("127.0.0.1:port,..."), valid until cp_broker_destroy. */
const char *cp_broker_bootstraps(const cp_broker *b);

/* Fault injection for tests: takes mock broker broker_id (1..brokers) down (up = 0) or
 * back up (up = 1). Connections to it fail meanwhile; its data is kept. */
int cp_broker_set_up(cp_broker *b, int broker_id, int up, cp_err *err);

/* Fault injection for tests: makes mock broker broker_id the leader of topic/partition. */
int cp_broker_set_leader(cp_broker *b, const char *topic, int partition, int broker_id,
                         cp_err *err);

/* Fault injection for tests: makes mock broker broker_id the coordinator of group. */
int cp_broker_set_coordinator(cp_broker *b, const char *group, int broker_id, cp_err *err);

/* Stops the cluster; everything in it is gone. NULL is fine. */
void cp_broker_destroy(cp_broker *b);

#endif
