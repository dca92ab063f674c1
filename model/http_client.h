/* The one HTTP/1.1 client of the project: every program that asks contprofd something (the
 * agent on its own thread, `contprof run`, `contprof import`, the CLI, the tests) goes
 * through it. One request per connection, one deadline for connecting, sending and reading
 * (name resolution is getaddrinfo's, outside it); no libuv, no global state, no signals
 * (MSG_NOSIGNAL), memory bounded by the caller's body limit plus 64 KiB of headers. */
#ifndef CP_HTTP_CLIENT_H
#define CP_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "vec.h"

/* The most response header bytes (status line included) a response may have. */
#define CP_HTTP_MAX_HEAD (64u << 10)

typedef struct cp_http_result {
    int status;
    char content_type[128]; /* "" when the response has none; cut at 127 bytes */
    /* Contprof-Partial: the cluster peers whose part is missing from the answer (query/
     * fanout.c), or "" for a whole answer; cut at 255 bytes. */
    char partial[256];
    /* Owned by the caller (cp_buf_close). After a successful call data is never NULL and
     * is NUL-terminated at len (the NUL not counted), so JSON and text can be read as C
     * strings up to the first NUL they hold. */
    cp_buf body;
} cp_http_result;

/* GETs base_url (http://host[:port][/prefix], "http://" optional, port 80 by default) +
 * path_query ("/api/v1/...?..."), sending "Authorization: Bearer token" unless token is
 * NULL or "". Waits at most timeout_ms for the whole exchange and keeps at most max_body
 * bytes of body (0 = 1 GiB). The response body may be framed by Content-Length, chunked,
 * or the end of the connection. Returns 0 with *out filled whatever the status (out is
 * zeroed first; the caller frees out->body), or CP_EINVAL (bad URL), CP_EIO (resolution,
 * connection, time-out, malformed response), CP_ELIMIT (body or headers too large) or
 * CP_ENOMEM, with err naming the server and the problem and out->body already freed. */
int cp_http_get(const char *base_url, const char *path_query, const char *token, int64_t timeout_ms,
                size_t max_body, cp_http_result *out, cp_err *err);

/* Like cp_http_get, with method POST and body[0..body_len) (application/octet-stream;
 * body may be NULL when body_len is 0). A server that answers before the whole body is
 * sent (413) has its answer returned. */
int cp_http_post(const char *base_url, const char *path_query, const char *token, const void *body,
                 size_t body_len, int64_t timeout_ms, size_t max_body, cp_http_result *out,
                 cp_err *err);

/* Like cp_http_get, with method DELETE. */
int cp_http_delete(const char *base_url, const char *path_query, const char *token,
                   int64_t timeout_ms, size_t max_body, cp_http_result *out, cp_err *err);
/* Sends req[0..len) as it is (tests of malformed input) to host:port and reads one
 * response, as cp_http_get does (no body limit beyond 1 GiB). */
int cp_http_raw(const char *host, int port, const void *req, size_t len, int64_t timeout_ms,
                cp_http_result *out, cp_err *err);

/* Asks the contprofd at url (as cp_http_get's base_url) for its Kafka bootstrap list
 * (GET /api/v1/brokers, {"brokers":"host:port,..."}) and writes it NUL-terminated to
 * out[0..cap), sending token (NULL or "" = none) as a bearer token. Waits at most
 * timeout_ms in all. Returns 0, CP_EINVAL (bad URL), CP_EIO (connection, time-out, a
 * status other than 200), CP_EPARSE (no "brokers" string in a JSON body), CP_ENOTFOUND (the
 * list is "": a contprofd that is starting answers so until its broker is up; ask again),
 * CP_ELIMIT (the list does not fit in cap) or CP_ENOMEM, with err (may be NULL) saying
 * which; out is "" on any error. Safe on the agent's thread:
 * allocates at most a few tens of KiB, all freed before it returns. */
int cp_http_get_brokers(const char *url, const char *token, char *out, size_t cap, int timeout_ms,
                        cp_err *err);

/* cp_http_get_brokers, and the directory of the server's relay (collector/relay/README.md)
 * into relay[0..rcap) when it names one ("" otherwise; relay may be NULL). The relay is on
 * the server's host: cp_relay_listening says whether it is on this one. */
int cp_http_get_transport(const char *url, const char *token, char *out, size_t cap, char *relay,
                          size_t rcap, int timeout_ms, cp_err *err);

/* Writes url (as cp_http_get's base_url) to out[0..cap) with its host replaced by the
 * first address it resolves to, numeric, so that requests to it resolve no name (a poller
 * asking twice a second). Returns 0, CP_EINVAL (bad URL), CP_EIO (resolution) or
 * CP_ELIMIT (out too small). */
int cp_http_resolve_url(const char *url, char *out, size_t cap, cp_err *err);

/* Appends s percent-encoded for a query string (unreserved characters kept) to b.
 * Returns 0 or CP_ENOMEM. */
int cp_url_encode(cp_buf *b, const char *s);

#endif
