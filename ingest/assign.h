/* Static partition ownership for a cluster of contprofd nodes: each node is given the
 * partitions it owns (`cluster.partitions = 0-3`) and reads exactly those, without a
 * consumer group, from the offsets stored in its own store. */
#ifndef CP_INGEST_ASSIGN_H
#define CP_INGEST_ASSIGN_H

#include <librdkafka/rdkafka.h>
#include <stdint.h>

#include "envelope.h"
#include "error.h"

/* The most partitions a node may own, and the highest partition number + 1. */
#define CP_ASSIGN_MAX_PARTITION CP_MAX_PARTITIONS

/* Parses a partition list: numbers and inclusive ranges separated by commas ("0-3",
 * "0,2,5-7"), a single partition optionally with the offset to start from when this node's
 * store has none for it ("5@1234": a partition handed over from another node, which had
 * stored everything below 1234). On success *out is a malloc'd, sorted list without repeats
 * of *n >= 1 partitions and, if start is not NULL, *start a malloc'd list of their start
 * offsets (-1 = none given); the caller frees both. CP_EPARSE names the spec and the bad
 * part. */
int cp_assign_parse(const char *spec, int32_t **out, int64_t **start, uint32_t *n, cp_err *err);

/* The partitions of spec for topic as a librdkafka list, for the ingest's assignment: each
 * offset is the start given with it, else RD_KAFKA_OFFSET_INVALID (the ingest then takes the
 * offset stored with the data, or 0). NULL with err set if spec is bad or memory runs out.
 * The caller destroys it. */
rd_kafka_topic_partition_list_t *cp_assign_list(const char *topic, const char *spec, cp_err *err);

#endif
