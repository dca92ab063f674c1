/* Query fan-out across the nodes of a cluster: every node answers every query by asking
 * each peer for its part over the same HTTP API (`local=1`: the peer answers from its own
 * store only), merging the parts with its own, and only then letting the endpoint prune,
 * filter and render. A peer that does not answer in time makes the answer partial, and the
 * answer says so (a JSON field and a response header). With no peers a request's reader
 * is the local one alone. */
#ifndef CP_QUERY_FANOUT_H
#define CP_QUERY_FANOUT_H

#include <stdint.h>

#include "http.h"
#include "metrics.h"
#include "store.h"

/* The response header naming the peers that did not answer (comma-separated base URLs). */
#define CP_FANOUT_PARTIAL_HEADER "Contprof-Partial"

/* The longest wait for a peer's part when cp_fanout_options.timeout_ns is 0 (config key
 * cluster.peer_timeout). */
#define CP_FANOUT_DEFAULT_PEER_TIMEOUT_NS (10 * 1000000000LL)

typedef struct cp_fanout cp_fanout;

typedef struct cp_fanout_options {
    const char *peers;  /* comma-separated base URLs (http://host:port); copied */
    const char *self;   /* this node's own URL, dropped from peers if listed; may be NULL */
    const char *token;  /* cluster token peers present and accept; NULL/"" = none */
    int64_t timeout_ns; /* longest wait for a peer, within the request's deadline; 0 = default */
    size_t max_body;    /* largest part taken from a peer */
    const int32_t *own; /* this node's partitions (cluster.partitions), own[0..nown); copied:
                           a peer that lists one of them too is logged (both store it) */
    uint32_t nown;
} cp_fanout_options;

/* Parses o->peers into a fan-out object (*out; NULL when the list is empty, which every
 * function below accepts: the node then answers alone). CP_EINVAL names a URL that is not
 * http://host:port; CP_ENOMEM. */
int cp_fanout_create(const cp_fanout_options *o, cp_fanout **out, cp_err *err);
void cp_fanout_destroy(cp_fanout *f); /* NULL is fine */
/* How many peers f asks (0 for NULL), and the base URL of peer i < that. */
uint32_t cp_fanout_npeers(const cp_fanout *f);
const char *cp_fanout_peer(const cp_fanout *f, uint32_t i);

/* ---- routing (the API decides lanes and peers' requests with these) --------------------- */

/* 1 if req presents the cluster token (a peer asking for its part): the API then takes the
 * tenant from the `tenant` parameter instead of authenticating a tenant's token. */
int cp_fanout_is_peer(const cp_fanout *f, const cp_http_request *req);

/* 1 if req comes from this very node (its node=ID): a peer list that names this node under
 * another spelling. The API answers it 421 and the asking side stops asking that peer. */
int cp_fanout_is_self(const cp_fanout *f, const cp_http_request *req);
/* This node's ID, as its requests to peers carry it in node=ID ("" for NULL). */
const char *cp_fanout_node(const cp_fanout *f);

/* 1 if req asks for this node's part only (`local=1`): what the API runs in
 * CP_HTTP_LANE_PEER. A cheap look at the raw query string; the parameter is checked when
 * the request runs. */
int cp_fanout_is_part_request(const cp_http_request *req);

/* 1 if req goes in CP_HTTP_LANE_PEER: a part request that presents the cluster token (a
 * cluster always has one). Any other local=1 request is refused by the API (403), so it
 * never takes the slots (and priority) kept for peers' parts. */
int cp_fanout_peer_lane(const cp_fanout *f, const cp_http_request *req);

/* ---- one request: the store's readers across the cluster ------------------------------ */

#define CP_FANOUT_MAX_PEERS 64

/* One request's readers over every node (caller-allocated, one per request, used by one
 * thread): store.h's cp_reader, implemented by asking each peer for its part over HTTP
 * (`local=1`, in parallel, within the query's deadline) while the wrapped local reader
 * answers this node's part, then merging. Peers that fail, miss the deadline or answer
 * something unusable are recorded here as missing; their absence is not an error. A query
 * with q->local set, or no peers, is the local reader's alone.
 * - profile: parts fetched as full-detail pprof and merged; the result carries
 *   time_nanos = from and duration_nanos = to - from as the store's does. cpu and alloc
 *   parts add up (merged and freed one by one). inuse parts come per series
 *   (`by_series=1`, cp_store_query) and, per series, only the part holding its latest
 *   snapshot counts (the lowest part, this node's first, on a tie): a series whose
 *   partition was handed over (`P@N`) within the range has a last snapshot on both its old
 *   and its new owner; those parts are held until all are in.
 * - series: the union, one entry per (kind, labels) with the widest span, sorted by kind
 *   then labels. labels, values: the sorted union. timeline: points added step by step. */
typedef struct cp_fanout_req {
    cp_reader reader;                     /* first member: what cp_fanout_req_init returns */
    cp_fanout *f;                         /* NULL: no peers */
    cp_reader *local;                     /* this node's readers (cp_store_reader) */
    int fanned;                           /* peers were asked */
    uint8_t missing[CP_FANOUT_MAX_PEERS]; /* peers that did not answer */
} cp_fanout_req;

/* Starts a request: fr reads through local (not owned; it must outlive fr) and f's peers (f
 * may be NULL). Returns fr's reader. Nothing to free. */
cp_reader *cp_fanout_req_init(cp_fanout_req *fr, cp_fanout *f, cp_reader *local);

/* Ends a request: if a peer was missing, adds the CP_FANOUT_PARTIAL_HEADER header and, to a
 * 2xx JSON object answer, `"partial":true,"missing_peers":[...]` as its first members. */
void cp_fanout_end(const cp_fanout_req *fr, cp_http_response *r);

/* ---- uploads (POST /api/v1/symbols) ---------------------------------------------------- */

/* Passes an upload this node has kept (the body of POST path, body[0..len), not retained) on
 * to every peer as that peer's own (`local=1`, with the cluster token and q->tenant; path
 * may carry parameters of its own), in parallel, each within q->lim.deadline_ns (CLOCK_MONOTONIC; 0
 * = the peer timeout) less a tenth, at most the peer timeout. A peer that fails, answers non-200 or
 * misses the deadline is missing (logged, counted): cp_fanout_end then marks the answer partial.
 * Nothing for a peer's own request (q->local) or without peers. 0 or CP_ENOMEM. */
int cp_fanout_upload(cp_fanout_req *fr, const cp_query *q, const char *path, const void *body,
                     size_t len, cp_err *err);

/* ---- ingest offsets (GET /api/v1/ingest/offsets), for senders that wait --------------- */

/* Appends the peers' partitions, as each last reported them, to the "partitions" array being
 * written in r->body (with a leading comma if comma), unless req asks with local=1. Runs on
 * the loop thread without waiting: each peer is asked by a thread of its own, continuously
 * while senders ask (within the last 2 s), every 5 ms. A peer that is down, or not heard
 * from yet, adds no partition: a sender's windows there count as not stored yet, which is
 * the truth until that node is back; its URL goes in the CP_FANOUT_PARTIAL_HEADER header.
 * 0 or CP_ENOMEM. */
int cp_fanout_offsets(cp_fanout *f, const cp_http_request *req, cp_http_response *r, int comma);

/* Registers the fan-out's families in m, per peer: contprof_cluster_peer_failures_total and
 * contprof_cluster_peer_partition_overlap (1 once a peer listed a partition this node owns
 * too). Nothing for NULL. 0, CP_ENOMEM or CP_EINVAL (registered twice). */
int cp_fanout_register_metrics(cp_fanout *f, cp_metrics *m);

#endif
