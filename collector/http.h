/* A minimal HTTP/1.1 client for one question: contprofd's GET /api/v1/brokers. */
#ifndef CP_HTTP_H
#define CP_HTTP_H

#include <stddef.h>

/* Asks the contprofd at url ("http://host:port[/prefix]") for its Kafka bootstrap list and
 * writes it to out ("host:port,..."), sending token (NULL or "" = none) as a bearer token.
 * Waits at most timeout_ms in all. Returns 0, CP_EIO (connection, status) or CP_EPARSE (no
 * "brokers" string in the JSON body). */
int cp_http_get_brokers(const char *url, const char *token, char *out, size_t cap, int timeout_ms);

#endif
