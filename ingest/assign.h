/* Static partition ownership for a cluster of contprofd nodes: each node is given the
 * partitions it owns (`cluster.partitions = 0-3`) and reads exactly those, without a
 * consumer group, from the offsets stored in its own store. */
#ifndef CP_INGEST_ASSIGN_H
#define CP_INGEST_ASSIGN_H

#include <librdkafka/rdkafka.h>
#include <stdint.h>

#include "error.h"

/* The most partitions a node may own, and the highest partition number + 1. */
#define CP_ASSIGN_MAX_PARTITION 4096

/* Parses a partition list: numbers and inclusive ranges separated by commas ("0-3",
 * "0,2,5-7"). On success *out is a malloc'd, sorted list without repeats (the caller frees
 * it) of *n >= 1 partitions. CP_EPARSE names the spec and the bad part. */
int cp_assign_parse(const char *spec, int32_t **out, uint32_t *n, cp_err *err);

/* The partitions of spec for topic as a librdkafka list (offsets unset), for the ingest's
 * assignment; NULL with err set if spec is bad or memory runs out. The caller destroys it. */
rd_kafka_topic_partition_list_t *cp_assign_list(const char *topic, const char *spec, cp_err *err);

#endif
