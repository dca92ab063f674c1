/* On-demand captures (issue 29): the server's captures, one object (cp_captures) that owns
 * their records in the store (store.h, "captures"), the lock that counts a tenant's running
 * ones and the cache the polling agents read; and its endpoints POST/GET/DELETE
 * /api/v1/captures[/ID] and GET /api/v1/control/captures. A capture is a record and a
 * message on the control topic (model/capture.h) that every agent reads; its answer is what
 * the store's readers (across the cluster) hold under {capture="ID"}, set against the
 * always-on series its selector names. api.c routes here and contprofd resumes captures at
 * start-up through it; the control topic is reached through a callback, so query/ links no
 * Kafka. */
#ifndef CP_QUERY_CAPTURES_H
#define CP_QUERY_CAPTURES_H

#include <stdint.h>

#include "capture.h"
#include "http.h"
#include "params.h"
#include "store.h"

struct cp_fanout;
struct cp_fanout_req;

/* Writes c, signed with token (NULL: unsigned), to the control topic and waits for the
 * broker's acknowledgement. 0 or an error named in err. Called on a worker thread. */
typedef int (*cp_captures_publish_fn)(void *arg, const cp_capture *c, const char *token,
                                      cp_err *err);

/* The limits (contprofd's captures.* keys; defaults in parentheses), the writer and what
 * the object works on. */
typedef struct cp_captures_options {
    uint32_t max_concurrent;        /* running captures per tenant (4) */
    int64_t max_duration_ns;        /* longest capture (5 min) */
    uint32_t max_hz;                /* highest cpu rate (1000) */
    int64_t min_alloc_rate;         /* smallest mean bytes between alloc samples (4096) */
    uint32_t max_overhead_permille; /* the agents' extra CPU bound (20): see budget below */
    const char *config_file;        /* contprofd's --config FILE, named in refusals (NULL) */
    cp_captures_publish_fn publish; /* NULL: captures are refused (503) */
    void *publish_arg;
    cp_store *store;                  /* the records' home; not owned, outlives the object */
    struct cp_fanout *fanout;         /* the cluster's peers; NULL = alone; not owned */
    const char *const *tenant_tokens; /* NULL-terminated tenant, token pairs that sign a
                                         tenant's control messages (the first of a tenant);
                                         NULL = none; copied */
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

typedef struct cp_captures cp_captures;

/* Creates the server's captures over o->store (o copied, its strings too). Returns 0 with
 * *out (cp_captures_destroy), or CP_ENOMEM. Nothing is read or published until
 * cp_captures_resume or a request. */
int cp_captures_create(const cp_captures_options *o, cp_captures **out);
/* Frees cs (NULL is fine); the store keeps the records. No request may be running. */
void cp_captures_destroy(cp_captures *cs);

/* At start-up, once the writer can publish: every stored capture still live
 * (cp_capture_live) is published again (the embedded broker's control topic began empty;
 * on a Kafka cluster this repeats its latest state), signed with its tenant's token; every
 * other one that ended in the last 24 h is reported in the log. Then, in a cluster, the
 * captures running on the peers that this node does not hold (accepted while it was down),
 * asked for each tenant with a token (or the default tenant without tokens), are kept, so
 * that the agents polling this node hear them; a record unsigned by its tenant's token or
 * for another tenant is logged and skipped, and so is a peer that does not answer within
 * 1 s. Nothing is dropped silently: what cannot be read or published is logged. */
void cp_captures_resume(cp_captures *cs);

/* ---- the endpoints (api.c's dispatch; any worker thread) ---------------------------- */
/* Each answers into r. q is the parsed request (tenant, local: a peer's, deadline); fr the
 * request's side of the cluster: its reader (this node's and the peers') and the peers a
 * record is passed on to. */

/* POST /api/v1/captures: checks the limits (a 4xx naming the one passed; pa: select, type,
 * duration, hz, alloc_rate), stores the record, passes it on to the peers, publishes it;
 * 201 with the capture. From a peer (the cluster token): req's body is a record to keep as
 * it is. */
void cp_captures_post(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                      const cp_params *pa, struct cp_fanout_req *fr, cp_http_response *r);
/* GET /api/v1/captures: the tenant's captures. */
void cp_captures_list(cp_captures *cs, const cp_query *q, cp_http_response *r);
/* GET /api/v1/captures/ID (req's path): the capture, its matched isolates and whether it
 * is complete. */
void cp_captures_get(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                     struct cp_fanout_req *fr, cp_http_response *r);
/* GET /api/v1/control/captures: what a polling agent hears (collector/watch.c): the
 * tenant's running captures, each as the control topic carries it (model/capture.h, signed
 * with the tenant's token) after its length (4 bytes, big-endian);
 * application/octet-stream, empty when none runs. */
void cp_captures_control(cp_captures *cs, const cp_query *q, cp_http_response *r);
/* DELETE /api/v1/captures/ID (req's path): cancels (a new state, published and passed on). */
void cp_captures_delete(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                        struct cp_fanout_req *fr, cp_http_response *r);

#endif
