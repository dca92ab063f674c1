/* Where CONTPROF_ASSERTS is off (release builds), model/check.h's checks are compiled out:
 * a condition is not evaluated, and a thread rule is not enforced (the writer-only calls
 * from a second thread still work as before). test_checks.c runs where they are on. */
#include <pthread.h>

#include "check.h"
#include "store.h"
#include "store_util.h"

#if CP_ASSERTS_ON
#error "test_checks_off.c is for builds without CONTPROF_ASSERTS (tests/store/CMakeLists.txt)"
#endif

static int g_evaluated;
static int touch(void)
{
    g_evaluated++;
    return 0;
}

TEST(asserts_compile_to_nothing)
{
    CP_ASSERT(touch());
    CP_ASSERT(touch() == 1);
    CHECK_EQ(g_evaluated, 0);
    cp_thread_owner o = {0};
    CP_ASSERT_THREAD(&o, "nobody's");
    CHECK_EQ(atomic_load(&o.thread), 0); /* never claimed */
}

static void *commit_there(void *arg)
{
    cp_store_batch *b = arg;
    CHECK_EQ(cp_store_batch_set_offset(b, "t", 0, 2), 0);
    CHECK_EQ(cp_store_batch_commit(b, NULL), 0);
    return NULL;
}

TEST(no_thread_rule_is_enforced)
{
    char *dir = tmpdir("checks-off");
    cp_store_options o = {.path = dir};
    cp_store *s = NULL;
    CHECK_EQ(cp_store_open(&o, &s, NULL), 0);
    cp_store_batch *b = cp_store_batch_create(s);
    CHECK(b);
    CHECK_EQ(cp_store_batch_set_offset(b, "t", 0, 1), 0);
    CHECK_EQ(cp_store_batch_commit(b, NULL), 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, commit_there, b) == 0);
    pthread_join(th, NULL);
    int64_t next = 0;
    CHECK_EQ(cp_store_get_offset(s, "t", 0, &next, NULL), 0);
    CHECK_EQ(next, 2);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

TEST_MAIN(T(asserts_compile_to_nothing), T(no_thread_rule_is_enforced))
