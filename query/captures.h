/* On-demand captures (issue 29): the endpoints POST/GET/DELETE /api/v1/captures[/ID]. A
 * capture is a record in the store (store.h, "captures") and a message on the control
 * topic (model/capture.h) that every agent reads; its answer is what the store's readers
 * (across the cluster) hold under {capture="ID"}, set against the always-on series its
 * selector names. api.c routes here; the control topic is reached through a callback, so
 * query/ links no Kafka. */
#ifndef CP_QUERY_CAPTURES_H
#define CP_QUERY_CAPTURES_H

#include <stdint.h>

#include "capture.h"
#include "http.h"
#include "params.h"
#include "store.h"

/* Writes c, signed with token (NULL: unsigned), to the control topic and waits for the
 * broker's acknowledgement. 0 or an error named in err. Called on a worker thread. */
typedef int (*cp_captures_publish_fn)(void *arg, const cp_capture *c, const char *token,
                                      cp_err *err);

/* The limits (contprofd's captures.* keys; defaults in parentheses) and the writer. */
typedef struct cp_captures_options {
    uint32_t max_concurrent;        /* running captures per tenant (4) */
    int64_t max_duration_ns;        /* longest capture (5 min) */
    uint32_t max_hz;                /* highest cpu rate (1000) */
    int64_t min_alloc_rate;         /* smallest mean bytes between alloc samples (4096) */
    uint32_t max_overhead_permille; /* the agents' extra CPU bound (20): see budget below */
    const char *config_file;        /* contprofd's --config FILE, named in refusals (NULL) */
    cp_captures_publish_fn publish; /* NULL: captures are refused (503) */
    void *publish_arg;
} cp_captures_options;

void cp_captures_options_default(cp_captures_options *o);

/* The extra CPU a capture of duration_ns may cost what it captures, in 1/1000 of the
 * captured CPU while it runs: captures.max_overhead_permille P is the bound over any
 * captures.max_duration span, and a capture is bounded in time (and in scope: only the
 * isolates it selects pay), so a shorter one gets P x max_duration / duration, at most
 * 1000 (decision, issue 35). Defaults: 20 over 5 min; a 30 s capture 200 (V8's 1 kHz costs
 * ~100), a 5 min one 20. This is the max_overhead_permille the control message carries. */
uint32_t cp_captures_budget_permille(const cp_captures_options *o, int64_t duration_ns);

/* Whether an isolate covered the whole duration: its first capture window starts within
 * CP_CAPTURES_HEAR_NS of the capture's start (agents learn of a capture within 2 s: the
 * contract) and its windows reach within CP_CAPTURES_END_NS of the end (the last window is
 * flushed as the capture ends). While running, "the end" is now less the time a window
 * takes to be stored. */
#define CP_CAPTURES_HEAR_NS (2500 * 1000000LL)
#define CP_CAPTURES_END_NS (500 * 1000000LL)

/* One capture request, built by api.c's dispatch. */
typedef struct cp_captures_call {
    const cp_captures_options *o;
    cp_store *store;
    cp_reader *rd;              /* the request's readers: this node's and its peers' */
    struct cp_fanout_req *fr;   /* to pass records on to peers */
    const cp_query *q;          /* tenant, local (a peer's), deadline */
    const cp_params *pa;        /* select, type, duration, hz, alloc_rate */
    const cp_http_request *req; /* path (the id), body (a peer's record) */
    const char *token;          /* the tenant's token (signs control messages); NULL */
    int from_peer;              /* a peer passing a record on (cluster token) */
} cp_captures_call;

/* POST /api/v1/captures: checks the limits (a 4xx naming the one passed), stores the
 * record, passes it on to the peers, publishes it; 201 with the capture. From a peer
 * (local=1): the body is a record to keep as it is. */
void cp_captures_ep_post(const cp_captures_call *c, cp_http_response *r);
/* GET /api/v1/captures: the tenant's captures. */
void cp_captures_ep_list(const cp_captures_call *c, cp_http_response *r);
/* GET /api/v1/captures/ID: the capture, its matched isolates and whether it is complete. */
void cp_captures_ep_get(const cp_captures_call *c, cp_http_response *r);
/* GET /api/v1/control/captures: what a polling agent hears (collector/watch.c): the
 * tenant's captures not yet ended, cancelled ones included, each as the control topic
 * carries it (model/capture.h, signed with the tenant's token) after its length (4 bytes,
 * big-endian); application/octet-stream, empty when none runs. */
void cp_captures_ep_control(const cp_captures_call *c, cp_http_response *r);
/* DELETE /api/v1/captures/ID: cancels (a new state, published and passed on). */
void cp_captures_ep_delete(const cp_captures_call *c, cp_http_response *r);

/* What an agent's engine text says of a capture (" capture asked=A ran=R[ reason=...]"):
 * 1 with asked, ran and reason (reason[0..cap), "" if none) filled, 0 if it says nothing. */
/* ---- start-up --------------------------------------------------------------------- */

/* At start-up: every stored capture still live (cp_capture_live) is published again through
 * publish (the embedded broker's control topic began empty; on a Kafka cluster this repeats
 * its latest state), signed with its tenant's token from tenant_tokens (NULL-terminated
 * tenant, token pairs; empty = no tokens); every other one that ended in the last 24 h is
 * reported in the log. Nothing is dropped silently: what cannot be read or published is
 * logged. */
void cp_captures_resume(cp_store *store, cp_captures_publish_fn publish, void *publish_arg,
                        const char *const *tenant_tokens);

struct cp_fanout;
/* At start-up, in a cluster (f not NULL): the captures running on the peers that this node
 * does not hold (accepted while it was down), asked for each tenant of tenant_tokens (or
 * the default tenant without tokens) and kept in store, so that the agents polling this node
 * hear them; a record unsigned by its tenant's token or for another tenant is logged and
 * skipped. A peer that does not answer within 1 s is logged and skipped. */
void cp_captures_pull_peers(cp_store *store, const struct cp_fanout *f,
                            const char *const *tenant_tokens);

int cp_captures_engine_parse(const char *engine, int64_t *asked, int64_t *ran, char *reason,
                             size_t cap);

#endif
