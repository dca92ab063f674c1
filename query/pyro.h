/* Grafana Pyroscope's ingest protocol, read: the application name with its labels, times in
 * the unit their digit count implies, multipart bodies, folded text, pprof split into
 * contprof's kinds, and Push requests (protobuf and JSON). Pure parsers over memory (no
 * store, no Kafka): the API turns their result into envelopes (api.c, query/README.md
 * "Pyroscope"); each has a fuzz target. Written from Pyroscope's public docs and field
 * numbers (/work/shared/notes/pyroscope.md), none of its code. */
#ifndef CP_QUERY_PYRO_H
#define CP_QUERY_PYRO_H

#include <stddef.h>
#include <stdint.h>

#include "envelope.h"
#include "error.h"
#include "http.h"
#include "labels.h"
#include "metrics.h"
#include "profile.h"
#include "vec.h"

/* The largest decoded profile (after gunzip) one request may carry: ingest's own limit. */
#define CP_PYRO_MAX_PPROF CP_INGEST_MAX_PPROF
/* Frames in one folded line, lines with the same stack merged or not. */
#define CP_PYRO_MAX_DEPTH 1024
#define CP_PYRO_MAX_PARTS 16

/* One profile of a request, to become one envelope. */
typedef struct cp_pyro_item {
    cp_kind kind;
    int cumulative;  /* the values count since the process started (the store subtracts) */
    cp_profile *p;   /* owned */
    uint8_t src[32]; /* SHA-256 of the bytes it came from (the profile as sent): its identity */
} cp_pyro_item;

/* What one request holds: the series' labels (service first among them), the window and
 * the profiles by kind. Zero it; cp_pyro_batch_close frees. */
typedef struct cp_pyro_batch {
    cp_labels labels;
    char kind_hint[32]; /* __name__ (Push) or the app name's last dot-part: mutex or block */
    int cumulative;     /* __delta__="false" (Push): every summed kind is cumulative */
    CP_VEC(cp_pyro_item) items;
    CP_VEC(char *) dropped; /* sample types no kind takes ("type/unit"), owned */
} cp_pyro_batch;

void cp_pyro_batch_close(cp_pyro_batch *b);

/* name= "app{k=v,...}" (or "app"): app becomes label service, each k=v a label
 * (service_name is service; __name__ sets kind_hint; other names starting "__" are not
 * kept). Errors (CP_EINVAL, err naming the byte offset): empty app, a bad label name,
 * a value with a control character or over CP_LABEL_VALUE_MAX, a missing '=' or '}',
 * text after '}', "service" given twice, more than CP_LABELS_MAX labels. */
int cp_pyro_parse_name(const char *name, cp_pyro_batch *b, cp_err *err);

/* A Pyroscope time: digits only, in seconds unless it has 13 (ms), 16 (us) or 19 (ns)
 * digits; NULL or "" is now_ns. *out in ns. CP_EINVAL naming the value otherwise. */
int cp_pyro_parse_time(const char *s, int64_t now_ns, int64_t *out, cp_err *err);

/* One part of a multipart/form-data body: its name and bytes (pointing into the body). */
typedef struct cp_pyro_part {
    char name[64];
    const uint8_t *data;
    size_t len;
} cp_pyro_part;

/* Splits body by the boundary of content_type ("multipart/form-data; boundary=X"). Fills
 * parts[0..*n) (at most CP_PYRO_MAX_PARTS). CP_EPARSE naming the offset: no boundary,
 * a part without headers or a name, no closing boundary (a truncated body). */
int cp_pyro_multipart(const char *content_type, const uint8_t *body, size_t len,
                      cp_pyro_part *parts, int *n, cp_err *err);

/* The options of folded text. */
typedef struct cp_pyro_folded_opts {
    const char *units;       /* samples (default), objects, bytes, goroutines,
                                lock_samples, lock_nanoseconds */
    const char *aggregation; /* sum (default) or average (a gauge: inuse) */
    int64_t sample_rate;     /* Hz of "samples" (default 100) */
} cp_pyro_folded_opts;

/* Folded text ("a;b;c 12\n", root first) into one item of b: samples -> cpu (samples,
 * cpu nanoseconds at sample_rate), objects/bytes -> alloc (average: inuse), goroutines ->
 * goroutines, lock_samples/lock_nanoseconds -> mutex. CP_EPARSE naming the line (no count,
 * a bad count, an empty frame, deeper than CP_PYRO_MAX_DEPTH), CP_EINVAL for unknown units
 * or aggregation, CP_ENOMEM. */
int cp_pyro_folded(const uint8_t *text, size_t len, const cp_pyro_folded_opts *o, cp_pyro_batch *b,
                   cp_err *err);

/* A pprof (raw or gzip'd) into items of b, one per kind its sample types make (cpu, wall,
 * alloc + inuse as `contprof import` splits a Go heap profile, node's objects/space as
 * inuse, contentions/delay as mutex or block by kind_hint, goroutine); types no kind takes
 * are named in b->dropped. stc (may be NULL): sample_type_config JSON, {type: {"units",
 * "display-name", "aggregation", "cumulative", "sampled"}}: display-name renames a type
 * before it is matched, cumulative marks its kind cumulative. CP_EPPROF/CP_EGZIP/CP_ELIMIT
 * from the decoder, CP_EPARSE for a bad stc, CP_EINVAL when no type makes a kind. */
int cp_pyro_pprof(const uint8_t *buf, size_t len, const char *stc, size_t stc_len, cp_pyro_batch *b,
                  cp_err *err);

/* One series of a Push request. */
typedef struct cp_pyro_push_series {
    cp_labels labels; /* as sent */
    CP_VEC(cp_buf) profiles;
} cp_pyro_push_series;

typedef struct cp_pyro_pushreq {
    CP_VEC(cp_pyro_push_series) series;
} cp_pyro_pushreq;

void cp_pyro_push_close(cp_pyro_pushreq *p);

/* push.v1.PushRequest: protobuf (json 0) {1 series: {1 labels: {1 name, 2 value}, 2 samples:
 * {1 raw_profile, 2 ID}}} or proto3 JSON ({"series":[{"labels":[{"name","value"}],
 * "samples":[{"rawProfile" or "raw_profile": base64, "ID"}]}]}). CP_EPARSE naming the field
 * and offset; CP_ELIMIT past max_bytes of profiles in all; CP_ENOMEM. *out zeroed first. */
int cp_pyro_push_decode(const uint8_t *buf, size_t len, int json, size_t max_bytes,
                        cp_pyro_pushreq *out, cp_err *err);

/* Labels of a Push series into b (service_name -> service, __name__ -> kind_hint,
 * __delta__="false" -> cumulative, other "__" names dropped). CP_EINVAL naming the label. */
int cp_pyro_push_labels(const cp_labels *sent, cp_pyro_batch *b, cp_err *err);

/* Standard base64 (padding optional; '-' '_' accepted too) appended to out. CP_EPARSE at
 * a bad byte, CP_ENOMEM. */
int cp_pyro_base64(const char *s, size_t n, cp_buf *out);

/* ---- the endpoints (POST /ingest, /pyroscope/ingest, push.v1.PusherService/Push) ----- */

/* One Kafka message to the profiles topic: the series key and the encoded, signed envelope
 * (both borrowed for the call). */
typedef struct cp_pyro_message {
    const uint8_t *key, *value;
    size_t key_len, value_len;
} cp_pyro_message;

/* Produces msgs[0..n) and returns once Kafka acknowledged every one: 0; CP_ELIMIT (a
 * message over the broker's size limit), CP_EKAFKA (not acknowledged) or CP_ENOMEM with
 * err set. Any thread. The daemon wires it to ingest/publisher.h (query/ links no Kafka). */
typedef int (*cp_pyro_produce_fn)(void *arg, const cp_pyro_message *msgs, size_t n, cp_err *err);

/* /metrics: what the endpoints did. Registered by the API (cp_pyro_register_metrics). */
typedef struct cp_pyro_stats {
    cp_counter requests;      /* answered 200 */
    cp_counter profiles;      /* envelopes acknowledged by Kafka */
    cp_counter refused[5];    /* 400 bad metadata, 413, 429, 422, 503 (Kafka or memory) */
    cp_counter dropped_types; /* sample types no kind takes, dropped from stored profiles */
} cp_pyro_stats;

int cp_pyro_register_metrics(cp_pyro_stats *s, cp_metrics *m, const void *owner);
/* Counts the answer's status in s (a refusal by its code). */
void cp_pyro_count(cp_pyro_stats *s, int status);

/* What a request needs besides itself. */
typedef struct cp_pyro_call {
    const char *tenant; /* from the token (api.c) */
    const char *token;  /* signs the envelopes (the tenant's first token); NULL = unsigned */
    cp_pyro_produce_fn produce;
    void *produce_arg;
    cp_pyro_stats *stats;
} cp_pyro_call;

/* POST /ingest (and /pyroscope/ingest): Pyroscope's legacy ingest. Answers 200 {"profiles":N}
 * once Kafka acknowledged the N envelopes; 400 naming bad metadata (name, from/until,
 * parameters), 413 past a size limit, 422 a body that is no profile, 503 when Kafka did
 * not acknowledge. */
void cp_pyro_ingest(const cp_pyro_call *c, const cp_http_request *req, cp_http_response *r);

/* A Connect error answer: status, {"error": msg, "code": code, "message": msg} (Connect's
 * fields, and the API's "error" every 4xx/5xx carries). */
void cp_pyro_connect_error(cp_http_response *r, int status, const char *code, const char *msg);

/* POST /push.v1.PusherService/Push: a Connect unary call (application/proto, gzip'd or not;
 * application/json). 200 {} (an empty PushResponse in the request's encoding); errors as
 * cp_pyro_ingest's, in Connect's JSON error form {"code","message"}. */
void cp_pyro_push(const cp_pyro_call *c, const cp_http_request *req, cp_http_response *r);

#endif
