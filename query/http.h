/* A small HTTP/1.1 server on libuv with Debian's http-parser: keep-alive and pipelining,
 * bounded URL, headers and body, idle timeouts, a connection cap, and a work queue that runs
 * heavy requests on libuv's threadpool with bounded concurrency so the event loop never
 * stalls. Every error the server produces itself is a JSON body {"error":"..."}. */
#ifndef CP_QUERY_HTTP_H
#define CP_QUERY_HTTP_H

#include <stdint.h>
#include <uv.h>

#include "error.h"
#include "times.h"
#include "vec.h"

#define CP_HTTP_NHDR 3
#define CP_HTTP_HDR_MAX 200

/* A parsed request, valid for the duration of the handler call. */
typedef struct cp_http_request {
    const char *method;        /* "GET", "POST", ... */
    const char *path;          /* the URL's path, not decoded ("/api/v1/profile") */
    const char *query;         /* the raw query string after '?', "" if none */
    const char *authorization; /* the Authorization header or NULL */
    /* Content-Type, Content-Encoding and X-Scope-OrgID: "" when absent, values truncated to
     * CP_HTTP_HDR_MAX - 1 bytes */
    const char *content_type, *content_encoding, *org_id;
    int accepts_gzip; /* Accept-Encoding lists gzip */
    const uint8_t *body;
    size_t body_len;
    int64_t received_ns; /* CLOCK_MONOTONIC when the request was complete */
    int64_t deadline_ns; /* CLOCK_MONOTONIC deadline for heavy requests, 0 = none */
} cp_http_request;

/* What a handler fills in. The server owns it and frees body after writing. */
typedef struct cp_http_response {
    int status;              /* 200 unless set */
    char content_type[64];   /* "application/json" unless set */
    char extra_headers[256]; /* complete header lines ("Name: value\r\n"), may be "" */
    int compressible;        /* text worth gzip'ing when the client accepts it */
    cp_buf body;
} cp_http_response;

/* Handles one request. Runs on the loop thread for light requests and on a threadpool
 * thread for heavy ones; must be thread-safe in the latter case. */
typedef void (*cp_http_handler_fn)(void *ctx, const cp_http_request *req, cp_http_response *resp);
/* Lanes a request can run in (what cp_http_is_light_fn returns). */
enum {
    CP_HTTP_LANE_HEAVY = 0, /* the threadpool, at most `concurrency` at once */
    CP_HTTP_LANE_LOOP = 1,  /* cheap and memory-only: inline on the loop thread */
    CP_HTTP_LANE_CHEAP = 2, /* short store reads: the threadpool, in their own
                               `cheap_concurrency` slots that heavy requests never take */
    CP_HTTP_LANE_PEER = 3,  /* a cluster peer's request for its part (never waits on other
                               nodes): `peer_concurrency` slots and threads of its own, so
                               that nodes whose slots all wait on each other's parts cannot
                               deadlock; heavy when peer_concurrency is 0 */
};
/* The lane of a request: CP_HTTP_LANE_LOOP for health, metrics, static answers and errors,
 * CP_HTTP_LANE_CHEAP for short store reads, CP_HTTP_LANE_HEAVY for queries. */
typedef int (*cp_http_is_light_fn)(void *ctx, const cp_http_request *req);
/* Called on the loop thread once a request's headers are complete and before any of its
 * body is read, for a request that has one (head->body NULL, head->body_len the declared
 * length, 0 when chunked): 0 to read it, else the status (401, 403) of the refusal, with
 * why[0..cap) its message. So an upload without a valid token costs nothing but its
 * headers. */
typedef int (*cp_http_admit_fn)(void *ctx, const cp_http_request *head, char *why, size_t cap);
/* Called on the loop thread after every response is queued, for metrics. */
typedef void (*cp_http_observe_fn)(void *ctx, const cp_http_request *req, int status, int heavy,
                                   double seconds);

typedef struct cp_http_options {
    const char *host;        /* "127.0.0.1" */
    int port;                /* 0 = kernel-chosen (read it back with cp_http_server_port) */
    size_t max_url_bytes;    /* 414 beyond; default 8 KiB */
    size_t max_header_bytes; /* request line + headers, 431 beyond; default 16 KiB */
    size_t max_body_bytes;   /* 413 beyond; default 64 KiB */
    const char *upload_path; /* POSTs to this path (e.g. "/api/v1/symbols") may carry up to
                                max_upload_bytes instead; NULL = none */
    size_t max_upload_bytes;
    const char *const *ingest_paths; /* POSTs to these (NULL-terminated) may carry up to
                                        max_ingest_bytes (default 16 MiB); NULL = none */
    size_t max_ingest_bytes;
    uint32_t max_ingests;          /* ingest-sized requests at once; 429 beyond; default 16 */
    uint32_t max_uploads;          /* upload-sized requests at once (receiving or answered); 503
                                      beyond; default 2 */
    size_t max_response_bytes;     /* a larger handler answer becomes an error; default 256 MiB */
    size_t gzip_min_bytes;         /* compressible answers at least this big are gzip'd for
                                      clients that accept it (level 1); 0 = never; default 8 KiB */
    uint32_t max_connections;      /* at the cap a new connection closes the one that has waited
                                      longest without a request being answered (idle, or still
                                      sending one); if every one is busy it gets a reserved slot,
                                      else 503; default 1024 */
    uint32_t concurrency;          /* heavy requests running at once; default 4 */
    uint32_t max_queued;           /* heavy requests waiting; 503 beyond; default 256 */
    int64_t query_timeout_ns;      /* deadline of a heavy request from its arrival; default 30 s */
    int64_t idle_timeout_ns;       /* a connection silent this long is closed; default 60 s */
    int64_t request_timeout_ns;    /* a request must arrive whole within this of its first byte
                                      (never longer than idle_timeout_ns); default 10 s */
    int64_t write_timeout_ns;      /* an answer whose writing makes no progress for this long
                                      closes the connection; default 30 s */
    size_t max_inflight_bytes;     /* daemon-wide budget of answers held in memory until written;
                                      a query arriving over it, or an answer that would pass it,
                                      gets 503 with Retry-After; 0 = none; default 512 MiB */
    uint32_t cheap_concurrency;    /* CP_HTTP_LANE_CHEAP requests running at once; default 2 */
    uint32_t peer_concurrency;     /* CP_HTTP_LANE_PEER requests running at once; 0 = they run
                                      in the heavy lane; default 0 */
    uint32_t max_conns_per_client; /* connections from one peer address; 0 = no limit;
                                      default 256 */
    uint32_t reserved_connections; /* beyond max_connections, slots that may only ask
                                      /healthz; default 16 */
    int heavy_nice;                /* the threads that run heavy requests (libuv's threadpool)
                                      run at the creating thread's nice value plus this (at
                                      most 19); 0 = none; default 10 */
    cp_http_handler_fn handle;
    cp_http_is_light_fn is_light; /* NULL = everything heavy */
    cp_http_admit_fn admit;       /* NULL = every body read */
    cp_http_observe_fn observe;   /* may be NULL */
    void *ctx;
} cp_http_options;

typedef struct cp_http_server cp_http_server;

/* Fills o with the defaults above (handler fields NULL). */
void cp_http_options_default(cp_http_options *o);

/* Binds and listens on loop. *out is owned by the caller and freed by
 * cp_http_server_destroy. Returns 0, CP_EIO (err names the address and reason) or
 * CP_ENOMEM. The loop must be run by the caller. */
int cp_http_server_create(uv_loop_t *loop, const cp_http_options *opt, cp_http_server **out,
                          cp_err *err);
/* The port actually bound. */
int cp_http_server_port(const cp_http_server *s);
/* Stops accepting, closes idle connections, lets in-flight requests finish and answers
 * them, and closes everything once done; cb (may be NULL) runs on the loop when the last
 * handle is closed. Loop thread only (checked in debug builds, model/check.h). The server must then
 * be freed with cp_http_server_destroy. */
void cp_http_server_shutdown(cp_http_server *s, void (*cb)(void *arg), void *arg);
/* Frees a server after shutdown completed (or one that never listened). NULL is fine. */
void cp_http_server_destroy(cp_http_server *s);

/* Sets resp to status with body {"error":"<msg>"} (msg printf-formatted, JSON-escaped). */
void cp_http_error(cp_http_response *resp, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The token of req's `Authorization: Bearer TOKEN` header, blanks around it trimmed: a
 * pointer into req's memory with its length in *len, or NULL when the header is missing
 * or not a Bearer token. */
const char *cp_http_bearer(const cp_http_request *req, size_t *len);

/* 1 if the presented token (tok, len bytes, not NUL-terminated) equals want; the time taken
 * depends on want's length only. */
int cp_http_token_eq(const char *tok, size_t len, const char *want);

/* cp_mono_ns: CLOCK_MONOTONIC in nanoseconds, now in times.h. */

#endif
