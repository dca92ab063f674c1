/* The ingest offsets record: what became of the offsets of one Kafka partition, as ingest
 * keeps it, GET /api/v1/ingest/offsets serves it, a cluster node passes it on from its peers
 * and `contprof import` reads it to learn what it sent was stored. One definition, one JSON
 * writer and one reader (over model/json.h's tree). */
#ifndef CP_OFFSETS_H
#define CP_OFFSETS_H

#include <stdint.h>

#include "error.h"
#include "json.h"
#include "vec.h"

/* Every offset below `stored` was read by this process or an earlier one, and is in the
 * store unless it lies in one of `not_stored` (the DLQ, or dropped by the broker before it
 * was read). The list is complete from `known_from` on: an older offset may have been
 * forgotten (ingest keeps the latest CP_OFFSETS_RANGES ranges). */
#define CP_OFFSETS_RANGES 32
#define CP_OFFSETS_WHY 24

typedef struct cp_offsets_range {
    int64_t from, to;         /* [from, to) */
    char why[CP_OFFSETS_WHY]; /* "lost", or "dlq:" and the DLQ reason */
} cp_offsets_range;

typedef struct cp_partition_offsets {
    int32_t partition;
    int64_t stored;     /* next offset durably written with the data; -1 = none yet */
    int64_t known_from; /* not_stored lists every such offset at or above this one */
    uint64_t lost;      /* offsets the broker dropped before they were read */
    uint32_t nranges;
    cp_offsets_range not_stored[CP_OFFSETS_RANGES];
} cp_partition_offsets;

/* Appends p to b as one JSON object:
 * {"partition":P,"stored":S,"known_from":K,"lost":L,"not_stored":[{"from":A,"to":B,
 * "why":"..."},...]}. Returns 0 or CP_ENOMEM (b may then hold part of it). */
int cp_offsets_write(cp_buf *b, const cp_partition_offsets *p);

/* Reads one such object (a member of a parsed answer; o stays the caller's) into *out.
 * Returns 0, or CP_EPARSE with err naming the member that is missing, of the wrong type or
 * out of range (a partition outside 0..2^31-1, more than CP_OFFSETS_RANGES ranges, a why of
 * CP_OFFSETS_WHY bytes or more, a range whose to is below its from). */
int cp_offsets_read(const cp_json *o, cp_partition_offsets *out, cp_err *err);

#endif
