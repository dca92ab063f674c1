/* The statistics registry (model/metrics.c): a metric registered once is in the exposition
 * text, with its help, type and labels; collectors print at their place; owners leave. */
#include <pthread.h>

#include "metrics.h"
#include "test.h"

static char *text(cp_metrics *r)
{
    cp_buf b = {0};
    CHECK_EQ(cp_metrics_write(r, &b), 0);
    CHECK_EQ(cp_buf_append(&b, "", 1), 0);
    return (char *)b.data;
}

TEST(a_registered_counter_is_printed)
{
    cp_metrics *r;
    CHECK_EQ(cp_metrics_create(&r), 0);
    static cp_counter c;
    int owner;
    CHECK_EQ(
        cp_metrics_counter(r, &owner, "contprof_test_things_total", "Things counted.", NULL, 0, &c),
        0);
    cp_counter_add(&c, 41);
    cp_counter_add(&c, 1);
    char *t = text(r);
    CHECK_STREQ(t, "# HELP contprof_test_things_total Things counted.\n"
                   "# TYPE contprof_test_things_total counter\n"
                   "contprof_test_things_total 42\n");
    free(t);
    cp_metrics_destroy(r);
}

TEST(labels_group_into_one_family_in_registration_order)
{
    cp_metrics *r;
    CHECK_EQ(cp_metrics_create(&r), 0);
    static cp_counter dlq[2];
    static cp_gauge lag;
    static cp_gauge_f rate;
    int owner;
    CHECK_EQ(cp_metrics_counter(r, &owner, "x_dlq_total", "By reason.",
                                (cp_metric_label[]){{"reason", "pprof"}}, 1, &dlq[0]),
             0);
    CHECK_EQ(cp_metrics_gauge(r, &owner, "x_lag", "Lag.", NULL, 0, &lag), 0);
    CHECK_EQ(cp_metrics_counter(r, &owner, "x_dlq_total", "By reason.",
                                (cp_metric_label[]){{"reason", "a\"b\\c\n"}}, 1, &dlq[1]),
             0);
    CHECK_EQ(cp_metrics_gauge_f(r, &owner, "x_rate", "Rate.", NULL, 0, 3, &rate), 0);
    /* the same series twice, or the same family with another type or help: refused */
    CHECK_EQ(cp_metrics_counter(r, &owner, "x_dlq_total", "By reason.",
                                (cp_metric_label[]){{"reason", "pprof"}}, 1, &dlq[0]),
             CP_EINVAL);
    CHECK_EQ(cp_metrics_gauge(r, &owner, "x_dlq_total", "By reason.", NULL, 0, &lag), CP_EINVAL);
    CHECK_EQ(cp_metrics_counter(r, &owner, "x_dlq_total", "Other help.", NULL, 0, &dlq[0]),
             CP_EINVAL);
    cp_counter_add(&dlq[1], 2);
    cp_gauge_set(&lag, -1);
    cp_gauge_f_set(&rate, 1.5);
    char *t = text(r);
    CHECK_STREQ(t, "# HELP x_dlq_total By reason.\n# TYPE x_dlq_total counter\n"
                   "x_dlq_total{reason=\"pprof\"} 0\n"
                   "x_dlq_total{reason=\"a\\\"b\\\\c\\n\"} 2\n"
                   "# HELP x_lag Lag.\n# TYPE x_lag gauge\nx_lag -1\n"
                   "# HELP x_rate Rate.\n# TYPE x_rate gauge\nx_rate 1.500\n");
    free(t);
    cp_metrics_destroy(r);
}

static int collect(void *arg, cp_metrics_out *o)
{
    const int *n = arg;
    int rc = cp_metrics_out_family(o, "x_lost_total", "Lost.", CP_METRIC_COUNTER);
    for (int i = 0; i < *n && !rc; i++) {
        char p[16];
        snprintf(p, sizeof p, "%d", i);
        rc = cp_metrics_out_u64(o, NULL, (cp_metric_label[]){{"partition", p}}, 1, 10u + i);
    }
    if (!rc) rc = cp_metrics_out_family(o, "x_seconds", "Time.", CP_METRIC_HISTOGRAM);
    if (!rc)
        rc = cp_metrics_out_u64(o, "_bucket",
                                (cp_metric_label[]){{"endpoint", "top"}, {"le", "+Inf"}}, 2, 3);
    if (!rc)
        rc = cp_metrics_out_f64(o, "_sum", (cp_metric_label[]){{"endpoint", "top"}}, 1, 0.25, 6);
    if (!rc) rc = cp_metrics_out_i64(o, "_count", NULL, 0, 3);
    return rc;
}

TEST(collectors_print_at_their_place_and_owners_leave)
{
    cp_metrics *r;
    CHECK_EQ(cp_metrics_create(&r), 0);
    static cp_counter a, b;
    int stage1, stage2, n = 2;
    CHECK_EQ(cp_metrics_counter(r, &stage1, "x_a_total", "A.", NULL, 0, &a), 0);
    CHECK_EQ(cp_metrics_collector(r, &stage2, collect, &n), 0);
    CHECK_EQ(cp_metrics_counter(r, &stage2, "x_b_total", "B.", NULL, 0, &b), 0);
    char *t = text(r);
    CHECK_STREQ(t, "# HELP x_a_total A.\n# TYPE x_a_total counter\nx_a_total 0\n"
                   "# HELP x_lost_total Lost.\n# TYPE x_lost_total counter\n"
                   "x_lost_total{partition=\"0\"} 10\nx_lost_total{partition=\"1\"} 11\n"
                   "# HELP x_seconds Time.\n# TYPE x_seconds histogram\n"
                   "x_seconds_bucket{endpoint=\"top\",le=\"+Inf\"} 3\n"
                   "x_seconds_sum{endpoint=\"top\"} 0.250000\nx_seconds_count 3\n"
                   "# HELP x_b_total B.\n# TYPE x_b_total counter\nx_b_total 0\n");
    free(t);
    cp_metrics_remove(r, &stage2);
    t = text(r);
    CHECK_STREQ(t, "# HELP x_a_total A.\n# TYPE x_a_total counter\nx_a_total 0\n");
    free(t);
    cp_metrics_remove(r, &stage1);
    t = text(r);
    CHECK_STREQ(t, "");
    free(t);
    cp_metrics_remove(NULL, &stage1);
    cp_metrics_destroy(r);
}

/* Increments from several threads while another prints: no lost counts (run under TSan
 * or ASan in CI; the count is checked in every build). */
static cp_counter g_hits;
static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000; i++)
        cp_counter_add(&g_hits, 1);
    return NULL;
}

TEST(increments_need_no_lock)
{
    cp_metrics *r;
    CHECK_EQ(cp_metrics_create(&r), 0);
    int owner;
    CHECK_EQ(cp_metrics_counter(r, &owner, "x_hits_total", "Hits.", NULL, 0, &g_hits), 0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < 20; i++)
        free(text(r));
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    char *t = text(r);
    CHECK_CONTAINS(t, "x_hits_total 400000\n");
    free(t);
    cp_metrics_destroy(r);
}

TEST_MAIN(T(a_registered_counter_is_printed), T(labels_group_into_one_family_in_registration_order),
          T(collectors_print_at_their_place_and_owners_leave), T(increments_need_no_lock))
