/* Ingest's thread rule (ingest/ingest_int.h, model/check.h): what its loop owns is touched
 * by the ingest thread only. With a real ingest running on the embedded broker and a real
 * store, a call from the test's own thread must kill the process with SIGABRT, naming the
 * function and the rule. Registered only when CONTPROF_ASSERTS is on
 * (tests/ingest/CMakeLists.txt), so it runs in the ASan stage of .ci/test. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "ingest_int.h"
#include "ingest_util.h"
#include "proc.h"
#include "test.h"
#include "times.h"

#if !CP_ASSERTS_ON
#error "test_ingest_checks.c needs CONTPROF_ASSERTS (tests/ingest/CMakeLists.txt)"
#endif

/* In the child: ingest up and assigned its partitions (its thread has been through its
 * loop, so it owns the loop's state), then the loop's function called from here. */
static void tick_from_the_wrong_thread(void *arg)
{
    const char *dir = arg;
    cp_broker *b = NULL;
    CHECK_EQ(cp_broker_create(NULL, &b, NULL), 0);
    cp_store *s = open_store(dir);
    cp_ingest *in = ingest_start(cp_broker_bootstraps(b), s, 100);
    cp_ingest_stats st;
    for (double end = now_s() + 60;; usleep(20000)) {
        cp_ingest_get_stats(in, &st);
        CHECK(!st.failed);
        if (st.ready) break;
        CHECK(now_s() < end);
    }
    printf("ingest is ready on its own thread\n");
    fflush(stdout);
    cp_ingest_rate_tick(in, cp_mono_ns()); /* not the ingest thread: dies here */
    printf("the call returned\n");
}

TEST(a_loop_function_called_off_the_ingest_thread_dies)
{
    char *dir = tmpdir("ingest-checks");
    char out[16384];
    int st = run_in_child(tick_from_the_wrong_thread, dir, out, sizeof out);
    CHECK_CONTAINS(out, "ingest is ready on its own thread");
    check_died_of_assert(st, out, "cp_ingest_rate_tick");
    CHECK_CONTAINS(out, "ingest thread only");
    CHECK(strstr(out, "the call returned") == NULL);
    rmtree(dir);
}

TEST_MAIN(T(a_loop_function_called_off_the_ingest_thread_dies))
