/* The debug-build checks (model/check.h) fire where a rule is broken on purpose: the store's
 * writer-only functions called from a second thread, a failed CP_ASSERT. Each case runs in a
 * forked child, which must die of SIGABRT naming the rule, the function and the file.
 * Registered only when CONTPROF_ASSERTS is on (test_checks_off.c covers the other builds). */
#include <pthread.h>
#include <signal.h>

#include "check.h"
#include "proc.h"
#include "store.h"
#include "store_util.h"

#if !CP_ASSERTS_ON
#error "test_checks.c needs CONTPROF_ASSERTS (tests/store/CMakeLists.txt)"
#endif

typedef struct writer {
    char *dir;
    cp_store *s;
    cp_store_batch *b;
    int second; /* which call the second thread makes: 0 commit, 1 maintain */
    int rc;
} writer;

static void writer_open(writer *w)
{
    w->dir = tmpdir("checks");
    cp_store_options o = {.path = w->dir};
    CHECK_EQ(cp_store_open(&o, &w->s, NULL), 0);
    CHECK(w->b = cp_store_batch_create(w->s));
}

static void writer_close(writer *w)
{
    cp_store_batch_destroy(w->b);
    cp_store_close(w->s);
    rmtree(w->dir);
}

/* One committed batch of offsets: the calling thread is the writer from now on. */
static void write_once(writer *w)
{
    CHECK_EQ(cp_store_batch_set_offset(w->b, "t", 0, 1), 0);
    CHECK_EQ(cp_store_batch_commit(w->b, NULL), 0);
}

static void *second_thread(void *arg)
{
    writer *w = arg;
    if (w->second == 0) {
        w->rc = cp_store_batch_commit(w->b, NULL);
    } else {
        uint32_t deleted;
        w->rc = cp_store_maintain(w->s, T0, 100, &deleted, NULL);
    }
    return NULL;
}

static void write_then_second_thread(void *arg)
{
    writer *w = arg;
    writer_open(w);
    write_once(w);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, second_thread, w) == 0);
    pthread_join(th, NULL);
    writer_close(w); /* not reached when the check fires */
}

/* A child writes, then makes call `second` on another thread, and must die naming func
 * and where it is. */
static void dies_on_the_second_thread(int second, const char *func, const char *file)
{
    char out[4096];
    writer w = {.second = second};
    int st = run_in_child(write_then_second_thread, &w, out, sizeof out);
    check_died_of_assert(st, out, func);
    CHECK_CONTAINS(out, "writer thread only: called on thread ");
    CHECK_CONTAINS(out, file);
}

TEST(batch_commit_from_a_second_thread_dies)
{
    dies_on_the_second_thread(0, "cp_store_batch_commit", "store/write.c:");
}

TEST(maintain_from_a_second_thread_dies)
{
    dies_on_the_second_thread(1, "cp_store_maintain", "store/retention.c:");
}

/* The handover: once the writer releases the store (ingest's thread as it ends), another
 * thread writes without a complaint. */
TEST(released_writer_hands_over)
{
    writer w = {.second = 0, .rc = -1};
    writer_open(&w);
    write_once(&w);
    cp_store_writer_release(w.s);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, second_thread, &w) == 0);
    pthread_join(th, NULL);
    CHECK_EQ(w.rc, 0);
    writer_close(&w); /* the batch's destroy is not a writer-only call */
}

static void failing_assert(void *arg)
{
    int *two = arg;
    CP_ASSERT(*two + 1 == 4);
}

TEST(a_failed_assert_names_the_condition)
{
    char out[4096];
    int two = 2;
    int st = run_in_child(failing_assert, &two, out, sizeof out);
    check_died_of_assert(st, out, "failing_assert");
    CHECK_CONTAINS(out, "test_checks.c:");
    CHECK_CONTAINS(out, "*two + 1 == 4");
}

TEST_MAIN(T(batch_commit_from_a_second_thread_dies), T(maintain_from_a_second_thread_dies),
          T(released_writer_hands_over), T(a_failed_assert_names_the_condition))
