/* Grafana Pyroscope's read side, querier.v1.QuerierService over Connect unary in JSON and
 * protobuf (ProfileTypes, LabelNames, LabelValues, Series, SelectMergeStacktraces,
 * SelectSeries, SelectMergeProfile, Diff, GetProfileStats), answered from the store's readers
 * (across the cluster): what Grafana's data source and Profiles Drilldown ask.
 * Written from the protocol's public field names (query/README.md "Pyroscope"). */
#ifndef CP_QUERY_QUERIER_H
#define CP_QUERY_QUERIER_H

#include <stdint.h>

#include "http.h"
#include "store.h"

/* What a call needs: the tenant (from its token), the readers, the API's limits. */
typedef struct cp_querier_call {
    const char *tenant;
    cp_reader *rd;
    int64_t max_range_ns;
    uint64_t max_blocks;
    uint32_t max_nodes_default, max_nodes_limit;
} cp_querier_call;

/* The path's method (after "/querier.v1.QuerierService/") with req's body, application/json
 * or application/proto (gzip'd by Content-Encoding). Answers 200 with the method's response
 * in the request's encoding (JSON: proto3 JSON, int64 as strings); Connect errors
 * {"code","message"} in JSON: invalid_argument (400) naming the field or the byte, unimplemented
 * (404) for other methods, 415 for other Content-Types, unavailable (503) for store failures
 * and deadlines. */
void cp_querier_handle(const cp_querier_call *c, const char *method, const cp_http_request *req,
                       cp_http_response *r);

/* Pyroscope's legacy read API, by req's path: GET /pyroscope/render (query=TYPE{selector},
 * from, until: digits as /ingest's or "now-1h"; format=json; max-nodes) answers the
 * flamebearer JSON ({"version":1,"flamebearer":{"names","levels":[[offset, total, self,
 * name],...],"numTicks","maxSelf"},"metadata":{...},"timeline":{"startTime","samples",
 * "durationDelta"}}); GET
 * /pyroscope/render-diff (leftQuery, leftFrom, leftUntil, rightQuery, rightFrom, rightUntil)
 * the same with 7-int bars, leftTicks, rightTicks, format "double"; GET
 * /pyroscope/label-values (label, query, from, until) a JSON array of values. Errors as
 * cp_querier_handle's (400 naming the parameter; unknown parameters refused). */
void cp_querier_legacy(const cp_querier_call *c, const cp_http_request *req, cp_http_response *r);

/* The kind and sample type a profile type ID names ("process_cpu:cpu:nanoseconds:cpu:
 * nanoseconds"): 0 with *kind and *sample_type (static), or CP_EINVAL. */
int cp_querier_profile_type(const char *id, cp_kind *kind, const char **sample_type);

/* A selector in Pyroscope's label names made contprof's, into out (NUL-terminated text):
 * service_name is service; the matchers on __profile_type__ (a profile type ID) and __name__
 * (its first part: process_cpu, memory, ...) are taken out and applied to the profile type
 * IDs served instead, *types getting bit i for the i-th ID cp_querier_profile_type knows
 * (the order of ProfileTypes' answer) when they all allow it (every bit without them). The
 * other matchers keep their order, operators and values. 0, CP_EPARSE with err (the
 * selector's own message, offsets into in), or CP_ENOMEM. */
int cp_querier_selector(const char *in, cp_buf *out, uint32_t *types, cp_err *err);

#endif
