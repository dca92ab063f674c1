/* The HTTP server's loop-thread rule (query/http.c, model/check.h) fires when broken on
 * purpose: once the loop thread has served a request, cp_http_server_shutdown called from
 * another thread kills the process naming the rule. Registered only with CONTPROF_ASSERTS
 * (tests/store/test_checks_off.c covers builds without them). */
#include "check.h"
#include "http_client.h"
#include "proc.h"
#include "serve.h"

#if !CP_ASSERTS_ON
#error "checks_test.c needs CONTPROF_ASSERTS (tests/query/CMakeLists.txt)"
#endif

static void handler(void *ctx, const cp_http_request *req, cp_http_response *resp)
{
    (void)ctx;
    (void)req;
    cp_buf_printf(&resp->body, "ok");
}

/* Served once (the loop thread is the server's from its first connection), then shut down
 * from this thread, which is not the loop's. */
static void shutdown_off_the_loop(void *arg)
{
    (void)arg;
    qsrv s = {0};
    cp_http_options o;
    cp_http_options_default(&o);
    o.handle = handler;
    qsrv_start(&s, &o);
    cp_http_result r = {0};
    cp_err err = {0};
    CHECK_EQ(cp_http_get(s.url, "/x", NULL, 10000, 0, &r, &err), 0);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    cp_http_server_shutdown(s.srv, NULL, NULL);
}

TEST(shutdown_off_the_loop_thread_dies)
{
    char out[4096];
    int st = run_in_child(shutdown_off_the_loop, NULL, out, sizeof out);
    check_died_of_assert(st, out, "cp_http_server_shutdown");
    CHECK_CONTAINS(out, "loop thread only: called on thread ");
    CHECK_CONTAINS(out, "query/http.c:");
}

TEST_MAIN(T(shutdown_off_the_loop_thread_dies))
