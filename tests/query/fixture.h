/* A query API fixture for tests and benchmarks (bench/query/bench_query.c serves its store
 * with it): a real store in a fresh directory, the API and the HTTP server on 127.0.0.1
 * with a kernel-chosen port, run on their own loop thread; windows are written straight
 * through the store's writer API (no Kafka). */
#ifndef CP_QFIXTURE_H
#define CP_QFIXTURE_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "http_client.h"
#include "http.h"
#include "serve.h"
#include "store.h"
#include "test.h"

typedef struct qfx {
    char dir[128];
    cp_store *store;
    cp_metrics *metrics; /* the store registered in it; the API's unless its options name one */
    cp_store_batch *batch;
    cp_api *api;
    qsrv http;
    int port;     /* http.port */
    char url[64]; /* http.url */
    uint64_t seq;
} qfx;

/* Opens a store in a new temporary directory (or dir if given). */
static inline void qfx_open_store(qfx *f, const char *dir)
{
    if (dir) {
        snprintf(f->dir, sizeof f->dir, "%s", dir);
    } else {
        snprintf(f->dir, sizeof f->dir, "/tmp/cpq-XXXXXX");
        CHECK(mkdtemp(f->dir));
    }
    cp_store_options so = {.path = f->dir};
    cp_err err = {0};
    if (cp_store_open(&so, &f->store, &err)) fprintf(stderr, "store: %s\n", err.msg);
    CHECK(f->store);
    CHECK_EQ(cp_metrics_create(&f->metrics), 0);
    CHECK_EQ(cp_store_register_metrics(f->store, f->metrics), 0);
    f->batch = cp_store_batch_create(f->store);
    CHECK(f->batch);
}

/* Starts the API and server with HTTP options hopt (NULL: the defaults, concurrency 2,
 * gzip from 64 bytes); api options may be NULL for defaults. */
static inline void qfx_serve_with(qfx *f, const cp_api_options *ao, const cp_http_options *hopt)
{
    cp_api_options o;
    if (ao)
        o = *ao;
    else
        cp_api_options_default(&o);
    o.store = f->store;
    if (!o.metrics) o.metrics = f->metrics;
    f->api = cp_api_create(&o);
    CHECK(f->api);
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.concurrency = 2;
    ho.gzip_min_bytes = 64; /* the test answers are small */
    if (hopt) ho = *hopt;
    if (!ho.upload_path) { /* as contprofd sets it */
        ho.upload_path = "/api/v1/symbols";
        ho.max_upload_bytes = 64u << 20;
    }
    ho.handle = cp_api_handle;
    ho.is_light = cp_api_is_light;
    ho.observe = cp_api_observe;
    ho.ctx = f->api;
    qsrv_start(&f->http, &ho);
    f->port = f->http.port;
    snprintf(f->url, sizeof f->url, "%s", f->http.url);
}

/* Starts the API and server; api options may be NULL for defaults. */
static inline void qfx_serve(qfx *f, const cp_api_options *ao, uint32_t concurrency)
{
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.concurrency = concurrency ? concurrency : 2;
    ho.gzip_min_bytes = 64; /* the test answers are small */
    qfx_serve_with(f, ao, &ho);
}

/* Stops the server and frees the API (the store stays open). */
static inline void qfx_unserve(qfx *f)
{
    qsrv_stop(&f->http);
    cp_api_destroy(f->api);
    f->api = NULL;
}

static inline void qfx_close(qfx *f, int remove_dir)
{
    qfx_unserve(f);
    cp_store_batch_destroy(f->batch);
    cp_store_close(f->store);
    cp_metrics_destroy(f->metrics);
    if (remove_dir) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
        CHECK(system(cmd) == 0);
    }
}

/* Adds one window of kind for tenant and labels ("k=v,k=v") starting at start_s. */
static inline void qfx_add(qfx *f, const char *tenant, cp_kind kind, const char *labels,
                           int64_t start_ns, const cp_profile *p)
{
    cp_envelope e = {0};
    e.tenant = (char *)tenant;
    e.kind = kind;
    e.window_start_ns = start_ns;
    e.window_duration_ns = 10000000000LL;
    e.producer_id = (char *)"qtest";
    e.sequence = ++f->seq;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", labels);
    for (char *save = NULL, *kv = strtok_r(tmp, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        CHECK(eq);
        *eq = 0;
        CHECK(cp_labels_set(&e.labels, kv, eq + 1) == 0);
    }
    cp_err err = {0};
    int rc = cp_store_batch_add(f->batch, &e, p, 0, &err);
    if (rc) fprintf(stderr, "batch_add: %s\n", err.msg);
    CHECK(rc == 0);
    cp_labels_close(&e.labels);
}

static inline void qfx_commit(qfx *f)
{
    cp_err err = {0};
    int rc = cp_store_batch_commit(f->batch, &err);
    if (rc) fprintf(stderr, "commit: %s\n", err.msg);
    CHECK(rc == 0);
}

static inline cp_http_result qfx_get(qfx *f, const char *pq, const char *token)
{
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_get(f->url, pq, token, 60000, 0, &r, &err);
    if (rc) fprintf(stderr, "GET %s: %s\n", pq, err.msg);
    CHECK(rc == 0); /* the body is NUL-terminated (http_client.h) */
    return r;
}

#endif
