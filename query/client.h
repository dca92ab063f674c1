/* A blocking HTTP/1.1 client for the contprof CLI and the tests: one GET per connection,
 * responses parsed by http-parser, bounded in size and time. */
#ifndef CP_QUERY_CLIENT_H
#define CP_QUERY_CLIENT_H

#include <stdint.h>

#include "error.h"
#include "vec.h"

typedef struct cp_http_result {
    int status;
    char content_type[128];
    char partial[256]; /* Contprof-Partial: the cluster peers missing from the answer, or "" */
    cp_buf body;       /* owned by the caller: cp_buf_close */
} cp_http_result;

/* GETs base_url (http://host:port[/prefix]) + path_query ("/api/v1/...?..."), with
 * "Authorization: Bearer token" if token is not NULL or empty. Waits at most timeout_ms for
 * the whole exchange and keeps at most max_body bytes (0 = 1 GiB). Returns 0 with out
 * filled whatever the status, or CP_EIO / CP_EINVAL / CP_ELIMIT / CP_ENOMEM with err naming
 * the server and the problem. */
int cp_http_get(const char *base_url, const char *path_query, const char *token,
                int64_t timeout_ms, size_t max_body, cp_http_result *out, cp_err *err);

/* Like cp_http_get, with method POST and body[0..body_len) (application/octet-stream). A
 * server that answers before the whole body is sent (413) has its answer returned. */
int cp_http_post(const char *base_url, const char *path_query, const char *token, const void *body,
                 size_t body_len, int64_t timeout_ms, size_t max_body, cp_http_result *out,
                 cp_err *err);

/* Like cp_http_get but sends raw bytes as the request (for tests of malformed input) to
 * host:port and reads one response. */
int cp_http_raw(const char *host, int port, const void *req, size_t len, int64_t timeout_ms,
                cp_http_result *out, cp_err *err);

/* Appends s percent-encoded for a query string (unreserved characters kept) to b. */
int cp_url_encode(cp_buf *b, const char *s);

#endif
