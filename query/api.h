/* The query API of contprofd: routes, parameters, tenants and tokens, and the JSON, pprof and
 * text answers, on top of the store's query functions. Plugs into the HTTP server as its
 * handler (cp_api_handle, cp_api_is_light, cp_api_observe with the cp_api as ctx). */
#ifndef CP_QUERY_API_H
#define CP_QUERY_API_H

#include <stdint.h>

#include "captures.h"
#include "http.h"
#include "metrics.h"
#include "offsets.h"
#include "pyro.h"
#include "store.h"
#include "symbols.h"

/* Ingest's state for /healthz and GET /api/v1/ingest/offsets, filled by the daemon's
 * callback on the loop thread. Its counters are not here: /metrics prints the statistics
 * registry (cp_api_options.metrics), where ingest registers them itself. */
typedef struct cp_api_ingest_stats {
    int available;           /* 0: no ingest in this process */
    int paused;              /* a store write failed: ingest waits for the store */
    char paused_reason[256]; /* why, while paused */
    /* Delivery (GET /api/v1/ingest/offsets); pointers valid until the next call. */
    int running, ready; /* consumer thread up; partitions assigned once */
    const char *topic;
    uint64_t max_message_bytes;   /* largest message the broker takes; 0 = not known */
    uint64_t max_in_flight_bytes; /* unstored bytes a sender may have in flight */
    uint32_t nparts;
    const cp_partition_offsets *parts; /* model/offsets.h */
} cp_api_ingest_stats;

typedef void (*cp_api_stats_fn)(void *arg, cp_api_ingest_stats *out);

typedef struct cp_api_token {
    const char *token, *tenant;
} cp_api_token;

typedef struct cp_api_options {
    cp_store *store;            /* not owned */
    const cp_api_token *tokens; /* ntokens == 0: every request is the default tenant */
    size_t ntokens;
    int64_t max_range_ns;         /* longest [from, to); 0 = unlimited */
    uint64_t max_blocks;          /* store blocks per query; 0 = unlimited */
    uint32_t max_nodes_default;   /* json tree nodes when max_nodes is not given */
    uint32_t max_nodes_limit;     /* largest max_nodes accepted */
    uint32_t max_steps;           /* timeline points */
    const char *brokers;          /* bootstrap list served at /api/v1/brokers; copied */
    cp_symbols *symbols;          /* names unsymbolized frames at query time; may be NULL */
    const char *metrics_token;    /* the only token /metrics takes; NULL: any tenant's token
                                     (none needed when no tokens are configured); copied */
    struct cp_fanout *fanout;     /* the cluster's peers (query/fanout.h); NULL = alone */
    cp_metrics *metrics;          /* the statistics registry /metrics prints; the API adds its
                                     families at create, ahead of stages registering later;
                                     not owned; NULL: the API keeps one of its own */
    cp_api_stats_fn ingest_stats; /* may be NULL */
    void *ingest_arg;
    cp_captures *captures; /* the server's captures (captures.h); not owned; NULL: the
                              API keeps one of its own over store, fanout and tokens,
                              with the default limits and no writer (POST answers 503) */
    /* Pyroscope's ingest (pyro.h): the profiles topic's writer; NULL: those endpoints 503 */
    cp_pyro_produce_fn pyro_produce;
    void *pyro_arg;
} cp_api_options;

typedef struct cp_api cp_api;

/* Fills o with the defaults written beside each field (o->store left NULL). */
void cp_api_options_default(cp_api_options *o);
/* Returns a new API object (copies what it needs from o) or NULL on out of memory. */
cp_api *cp_api_create(const cp_api_options *o);
void cp_api_destroy(cp_api *a); /* NULL is fine */
/* Replaces the broker list (copied; the embedded broker starts after the API). Loop thread
 * only. Returns 0 or CP_ENOMEM (the old list kept). */
int cp_api_set_brokers(cp_api *a, const char *brokers);
/* The directory of this host's relay (collector/relay/README.md), copied; /api/v1/brokers
 * names it as "relay" so that `contprof run` on this host hands windows to it. Loop thread
 * only. Returns 0 or CP_ENOMEM. */
int cp_api_set_relay(cp_api *a, const char *dir);

/* cp_http_options.handle / is_light / observe with ctx = the cp_api. */
void cp_api_handle(void *api, const cp_http_request *req, cp_http_response *resp);
int cp_api_is_light(void *api, const cp_http_request *req);
void cp_api_observe(void *api, const cp_http_request *req, int status, int heavy, double seconds);
/* cp_http_options.admit: a body is read only for a peer (cluster token) or, with tokens, a
 * valid tenant token; anyone else's local=1 is 403, a missing or wrong token 401. */
int cp_api_admit(void *api, const cp_http_request *head, char *why, size_t cap);

#endif
