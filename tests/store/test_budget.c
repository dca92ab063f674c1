/* store.memory_budget: the writer's open rollup buckets are bounded in bytes. With a 1 MiB
 * budget and 4,000 single-stack series of each kind, every commit leaves at most the budget
 * open, all are dropped and counted when a commit passes it, and the answers stay exact
 * (dropped buckets are read back from LevelDB). A one-row bucket costs at most 350 bytes. */
#include "store_util.h"

#include "pprof.h"
#include "store.h"
#include "synth.h"
#include "test.h"

#define NSER 4000

/* Window w (0 or 1) of every series of both kinds, committed every 512; after each commit
 * the open buckets hold at most budget bytes (0: not checked). */
static void write_all(cp_store *s, int w, size_t budget)
{
    cp_store_batch *b = cp_store_batch_create(s);
    CHECK(b);
    cp_err err = {0};
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NSER; i++) {
            cp_kind kind = k ? CP_KIND_CPU : CP_KIND_INUSE;
            char labels[64], prod[32];
            snprintf(labels, sizeof labels, "service=%s,instance=i%d", k ? "burn" : "heap", i);
            snprintf(prod, sizeof prod, "p%d-%d", k, i);
            cp_envelope e;
            make_env(&e, "default", kind, labels, T0 + w * 10 * SEC, 10 * SEC, prod,
                     (uint64_t)w + 1);
            cp_profile *p = cp_synth_one_stack(kind, T0 + w * 10 * SEC, 1 + i % 5 + w);
            CHECK(p);
            CHECK_EQ(cp_store_batch_add(b, &e, p, 0, &err), 0);
            cp_profile_destroy(p);
            cp_envelope_close(&e);
            if (++n % 512 == 0) {
                CHECK_EQ(cp_store_batch_commit(b, &err), 0);
                cp_store_stats st;
                cp_store_get_stats(s, &st);
                if (budget) CHECK(st.bucket_bytes <= budget);
            }
        }
    CHECK_EQ(cp_store_batch_commit(b, &err), 0);
    cp_store_batch_destroy(b);
}

static int64_t total(cp_store *s, cp_kind kind, const char *svc)
{
    cp_selector sel = {0};
    sel_add(&sel, "service", "=", svc);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_query(s,
                            &(cp_query){.tenant = "default",
                                        .kind = kind,
                                        .sel = sel,
                                        .from_ns = T0 - 3600 * SEC,
                                        .to_ns = T0 + 3600 * SEC},
                            &p, &err),
             0);
    int64_t t = cp_profile_total(p, 0);
    cp_profile_destroy(p);
    sel_free(&sel);
    return t;
}

TEST(open_buckets_stay_within_the_memory_budget)
{
    char *dir = tmpdir("budget");
    size_t budget = 1u << 20;
    cp_store_options o = {.path = dir, .memory_budget = budget};
    cp_store *s = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_open(&o, &s, &err), 0);
    write_all(s, 0, budget);
    write_all(s, 1, budget); /* every bucket again: read back from LevelDB when dropped */
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    fprintf(stderr, "open bucket bytes %llu, drops %llu\n", (unsigned long long)st.bucket_bytes,
            (unsigned long long)st.bucket_drops);
    CHECK(st.bucket_drops > 0);
    int64_t inuse = 0, cpu = 0;
    for (int i = 0; i < NSER; i++) {
        inuse += 1 + i % 5 + 1;               /* the latest snapshot: window 1 */
        cpu += (1 + i % 5) + (1 + i % 5 + 1); /* both windows */
    }
    CHECK_EQ(total(s, CP_KIND_INUSE, "heap"), inuse);
    CHECK_EQ(total(s, CP_KIND_CPU, "burn"), cpu);
    cp_store_close(s);
    rmtree(dir);
}

TEST(a_one_row_bucket_is_small)
{
    char *dir = tmpdir("budget-row");
    cp_store_options o = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_open(&o, &s, &err), 0);
    write_all(s, 0, 0);
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.bucket_drops, 0);
    /* inuse: levels 1-4 open per series; cpu: levels 1-4 once staged (at least 1 and 2) */
    double per = (double)st.bucket_bytes / (2.0 * NSER);
    fprintf(stderr, "open bucket bytes %llu: %.0f per series\n",
            (unsigned long long)st.bucket_bytes, per);
    CHECK(per <= 4 * 350);
    cp_store_close(s);
    rmtree(dir);
}

TEST_MAIN(T(open_buckets_stay_within_the_memory_budget), T(a_one_row_bucket_is_small))
