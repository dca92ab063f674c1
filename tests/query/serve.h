/* An HTTP server (query/http.h) on 127.0.0.1 with a kernel-chosen port, run on its own
 * libuv loop thread: how the query tests, the API fixture (fixture.h) and bench_query serve
 * a handler over real TCP. */
#ifndef CP_QSERVE_H
#define CP_QSERVE_H

#include <pthread.h>
#include <stdio.h>

#include "http.h"
#include "test.h"

typedef struct qsrv {
    uv_loop_t loop;
    uv_async_t stop;
    cp_http_server *srv; /* NULL when not serving */
    pthread_t th;
    int port;
    char url[64]; /* http://127.0.0.1:port */
} qsrv;

static void qsrv_on_shut(void *arg)
{
    qsrv *s = arg;
    uv_close((uv_handle_t *)&s->stop, NULL);
}

static void qsrv_on_stop(uv_async_t *a)
{
    qsrv *s = a->data;
    cp_http_server_shutdown(s->srv, qsrv_on_shut, s);
}

static void *qsrv_run(void *arg)
{
    qsrv *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Starts a server with options o (its port is set to 0, the kernel's choice) on a new loop
 * thread; fails the test if it cannot listen. */
static inline void qsrv_start(qsrv *s, cp_http_options *o)
{
    o->port = 0;
    CHECK(uv_loop_init(&s->loop) == 0);
    cp_err err = {0};
    int rc = cp_http_server_create(&s->loop, o, &s->srv, &err);
    if (rc) fprintf(stderr, "listen: %s\n", err.msg);
    CHECK(rc == 0);
    s->port = cp_http_server_port(s->srv);
    CHECK(s->port > 0);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
    uv_async_init(&s->loop, &s->stop, qsrv_on_stop);
    s->stop.data = s;
    CHECK(pthread_create(&s->th, NULL, qsrv_run, s) == 0);
}

/* Shuts the server down (in-flight requests are answered), joins its thread and frees it.
 * A server never started (srv NULL) is fine. */
static inline void qsrv_stop(qsrv *s)
{
    if (!s->srv) return;
    uv_async_send(&s->stop);
    pthread_join(s->th, NULL);
    CHECK(uv_loop_close(&s->loop) == 0);
    cp_http_server_destroy(s->srv);
    s->srv = NULL;
}

#endif
