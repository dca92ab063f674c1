/* Ingest end to end with real parts: the librdkafka mock cluster (embedded broker), a real
 * LevelDB on disk. Exact totals, restart, duplicates, every class of bad input to the DLQ
 * while ingestion goes on, and SIGKILLs at random moments during a long ingest. */
#include <signal.h>
#include <sys/wait.h>

#include "ingest_util.h"
#include "synth.h"

#define WIN (10 * SEC)

static cp_broker *broker;

static const char *start_broker(void)
{
    cp_err err = {0};
    cp_broker_options bo = {.partitions = 4};
    CHECK_EQ(cp_broker_create(&bo, &broker, &err), 0);
    return cp_broker_bootstraps(broker);
}

static int64_t total(cp_store *s, const char *tenant, cp_kind kind, int col)
{
    cp_profile *p = NULL;
    CHECK_EQ(cp_store_query(s,
                            &(cp_query){.tenant = tenant,
                                        .kind = kind,
                                        .from_ns = T0 - 86400 * SEC,
                                        .to_ns = T0 + 30 * 86400 * SEC},
                            &p, NULL),
             0);
    int64_t t = p->sample_types.n > (uint32_t)col ? cp_profile_total(p, (uint32_t)col) : 0;
    cp_profile_destroy(p);
    return t;
}

/* Produces n windows spread over nseries series; returns the expected cpu total. */
static int64_t produce_windows(rd_kafka_t *rk, cp_synth *sy, int first, int n, int nseries,
                               uint32_t samples)
{
    int64_t sum = 0;
    for (int i = first; i < first + n; i++) {
        int ser = i % nseries;
        char lab[64], prod[32];
        snprintf(lab, sizeof lab, "service=api,instance=i%d", ser);
        snprintf(prod, sizeof prod, "agent-%d", ser);
        (void)sy;
        cp_profile *p = mini_window((uint64_t)i, samples, T0 + (int64_t)(i / nseries) * WIN);
        sum += cp_profile_total(p, 1);
        cp_envelope e;
        make_env(&e, "acme", CP_KIND_CPU, lab, T0 + (int64_t)(i / nseries) * WIN, WIN, prod,
                 (uint64_t)(i / nseries));
        produce_env(rk, &e, p);
        cp_envelope_close(&e);
        cp_profile_destroy(p);
    }
    return sum;
}

TEST(pipeline_exact_totals_restart_duplicates)
{
    const char *bs = start_broker();
    char *dir = tmpdir("ingest");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_synth *sy = cp_synth_create(5, 500);
    int64_t want = produce_windows(rk, sy, 0, 400, 4, 50);
    flush(rk);
    cp_ingest *in = ingest_start(bs, s, 64);
    wait_messages(in, 400, 60);
    cp_ingest_stop(in);
    cp_ingest_stats st;
    cp_ingest_get_stats(in, &st);
    CHECK_EQ(st.windows, 400);
    CHECK_EQ(st.duplicates, 0);
    cp_ingest_destroy(in);
    CHECK_EQ(total(s, "acme", CP_KIND_CPU, 1), want);
    /* restart (store and consumer): nothing is read twice, new messages are added */
    cp_store_close(s);
    s = open_store(dir);
    want += produce_windows(rk, sy, 400, 100, 4, 50);
    /* the same envelopes again (a producer retrying): dropped as duplicates */
    cp_synth *sy2 = cp_synth_create(5, 500);
    produce_windows(rk, sy2, 0, 40, 4, 50);
    cp_synth_destroy(sy2);
    flush(rk);
    in = ingest_start(bs, s, 64);
    cp_metrics *reg = NULL;
    CHECK_EQ(cp_metrics_create(&reg), 0);
    CHECK_EQ(cp_ingest_register_metrics(in, reg), 0);
    wait_messages(in, 140, 60);
    cp_ingest_stop(in);
    cp_ingest_get_stats(in, &st);
    CHECK_EQ(st.windows, 100);
    CHECK_EQ(st.duplicates, 40);
    CHECK_EQ(st.skipped, 0); /* seeked to the stored offsets: nothing old was even fetched */
    /* every number ingest counts is on /metrics, the same as in its stats */
    CHECK(st.batches >= 1);
    CHECK_EQ(metric_value(reg, "contprof_ingest_batches_total"), (int64_t)st.batches);
    CHECK_EQ(metric_value(reg, "contprof_ingest_skipped_total"), 0);
    CHECK_EQ(metric_value(reg, "contprof_ingest_duplicates_total"), 40);
    CHECK_EQ(st.partitions, 4);
    CHECK_EQ(metric_value(reg, "contprof_ingest_partitions"), 4);
    CHECK_EQ(metric_value(reg, "contprof_ingest_failed"), 0);
    CHECK_EQ(metric_value(reg, "contprof_ingest_sequence_gaps_total"), (int64_t)st.sequence_gaps);
    cp_ingest_destroy(in);
    cp_metrics_destroy(reg);
    CHECK_EQ(total(s, "acme", CP_KIND_CPU, 1), want);
    cp_synth_destroy(sy);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(broker);
    rmtree(dir);
}

/* Reads the DLQ from the beginning: the reasons of its messages, in order. */
static int read_dlq(const char *bs, char reasons[][32], int max)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bs, es, sizeof es);
    rd_kafka_conf_set(c, "group.id", "dlq-reader", es, sizeof es);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, es, sizeof es);
    CHECK(rk);
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(tl, CP_TOPIC_DLQ, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, tl);
    rd_kafka_topic_partition_list_destroy(tl);
    int n = 0;
    double end = now_s() + 20;
    while (n < max && now_s() < end) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m) continue;
        if (!m->err) {
            rd_kafka_headers_t *h = NULL;
            const void *v = NULL;
            size_t vl = 0;
            CHECK(rd_kafka_message_headers(m, &h) == 0);
            CHECK(rd_kafka_header_get_last(h, "contprof-reason", &v, &vl) == 0);
            snprintf(reasons[n], 32, "%.*s", (int)vl, (const char *)v);
            CHECK(rd_kafka_header_get_last(h, "contprof-source", &v, &vl) == 0);
            CHECK(vl > strlen(CP_TOPIC_PROFILES));
            n++;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

TEST(bad_inputs_to_dlq_and_ingest_goes_on)
{
    const char *bs = start_broker();
    char *dir = tmpdir("ingest");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_synth *sy = cp_synth_create(9, 300);
    int64_t want = 0;
    cp_envelope e;
    /* all on one key, so they share a partition and each poison message sits between good ones */
    const char *key = "k";
    for (int i = 0; i < 6; i++) {
        /* a good one */
        cp_profile *p = mini_window((uint64_t)i, 100, T0 + i * WIN);
        want += cp_profile_total(p, 1);
        make_env(&e, "acme", CP_KIND_CPU, "service=api", T0 + i * WIN, WIN, "ag", (uint64_t)i);
        cp_buf pp = {0}, enc = {0};
        cp_pprof_encode(p, 1, &pp);
        e.pprof = pp.data;
        e.pprof_len = pp.len;
        cp_envelope_encode(&e, &enc);
        produce_raw(rk, enc.data, enc.len, key, 1);
        e.pprof = NULL;
        cp_envelope_close(&e);
        cp_buf_close(&enc);
        /* then one bad one of each class */
        make_env(&e, "acme", CP_KIND_CPU, "service=api", T0 + i * WIN, WIN, "bad",
                 (uint64_t)(100 + i));
        switch (i) {
        case 0: /* not an envelope */
            produce_raw(rk, "\xff\xff\xff garbage", 12, key, 1);
            break;
        case 1: /* unknown major version */
            e.format_major = 99;
            e.pprof = pp.data;
            e.pprof_len = pp.len;
            cp_envelope_encode(&e, &enc);
            produce_raw(rk, enc.data, enc.len, key, 1);
            break;
        case 2: /* payload is not pprof */
            e.pprof = (uint8_t *)"\x1f\x8b\x08\x00 broken gzip";
            e.pprof_len = 17;
            cp_envelope_encode(&e, &enc);
            produce_raw(rk, enc.data, enc.len, key, 1);
            break;
        case 3: { /* too deep for the limits (max_depth 64) */
            cp_profile *q = cp_profile_create();
            cp_profile_add_sample_type(q, "samples", "count");
            cp_profile_add_sample_type(q, "cpu", "nanoseconds");
            uint32_t locs[100];
            for (int k = 0; k < 100; k++)
                cp_profile_add_location(q, 0x1000 + (uint64_t)k, 0, NULL, 0, &locs[k]);
            int64_t v[2] = {1, 10};
            cp_profile_add_sample(q, locs, 100, v, NULL, 0);
            cp_buf qb = {0};
            cp_pprof_encode(q, 0, &qb);
            e.pprof = qb.data;
            e.pprof_len = qb.len;
            cp_envelope_encode(&e, &enc);
            produce_raw(rk, enc.data, enc.len, key, 1);
            cp_buf_close(&qb);
            cp_profile_destroy(q);
            break;
        }
        case 4: { /* the store refuses it: the series' sample types change */
            cp_profile *q = cp_profile_create();
            cp_profile_add_sample_type(q, "contentions", "count");
            uint32_t loc;
            cp_profile_add_location(q, 0x1000, 0, NULL, 0, &loc);
            int64_t v[1] = {1};
            cp_profile_add_sample(q, &loc, 1, v, NULL, 0);
            cp_buf qb = {0};
            cp_pprof_encode(q, 0, &qb);
            e.pprof = qb.data;
            e.pprof_len = qb.len;
            cp_envelope_encode(&e, &enc);
            produce_raw(rk, enc.data, enc.len, key, 1);
            cp_buf_close(&qb);
            cp_profile_destroy(q);
            break;
        }
        case 5: /* an envelope without a tenant */
            free(e.tenant);
            e.tenant = strdup("");
            e.pprof = pp.data;
            e.pprof_len = pp.len;
            cp_envelope_encode(&e, &enc);
            produce_raw(rk, enc.data, enc.len, key, 1);
            break;
        }
        e.pprof = NULL;
        cp_envelope_close(&e);
        cp_buf_close(&enc);
        cp_buf_close(&pp);
        cp_profile_destroy(p);
    }
    flush(rk);
    cp_pprof_limits lim;
    cp_pprof_limits_default(&lim);
    lim.max_depth = 64;
    cp_ingest_options o = {
        .brokers = bs, .kafka_props = test_props, .batch_max_ms = 50, .limits = &lim};
    cp_ingest *in = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_ingest_create(&o, s, &in, &err), 0);
    CHECK_EQ(cp_ingest_start(in, &err), 0);
    wait_messages(in, 12, 60);
    cp_ingest_stop(in);
    cp_ingest_stats st;
    cp_ingest_get_stats(in, &st);
    CHECK_EQ(st.windows, 6);
    CHECK_EQ(st.dlq[CP_DLQ_ENVELOPE], 2);
    CHECK_EQ(st.dlq[CP_DLQ_VERSION], 1);
    CHECK_EQ(st.dlq[CP_DLQ_PPROF], 1);
    CHECK_EQ(st.dlq[CP_DLQ_LIMIT], 1);
    CHECK_EQ(st.dlq[CP_DLQ_REJECTED], 1);
    CHECK_EQ(st.dlq_failed, 0);
    cp_ingest_destroy(in);
    CHECK_EQ(total(s, "acme", CP_KIND_CPU, 1), want);
    char reasons[16][32];
    int n = read_dlq(bs, reasons, 6);
    CHECK_EQ(n, 6);
    CHECK_STREQ(reasons[0], "envelope");
    CHECK_STREQ(reasons[1], "version");
    CHECK_STREQ(reasons[2], "pprof");
    CHECK_STREQ(reasons[3], "limit");
    CHECK_STREQ(reasons[4], "rejected");
    CHECK_STREQ(reasons[5], "envelope");
    cp_synth_destroy(sy);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(broker);
    rmtree(dir);
}

/* cp_ingest_drain, as contprofd's stop uses it with the embedded broker: once it returns 0,
 * everything the broker held when it was called is in the store, though batches are only
 * written when old (a minute here) and the consumer may not have fetched the last messages
 * yet. With the broker away it gives up within its time, saying so. */
TEST(drain_stores_what_the_broker_holds)
{
    const char *bs = start_broker();
    char *dir = tmpdir("ingest");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_ingest_options o = {.brokers = bs,
                           .kafka_props = test_props,
                           .batch_max_messages = 100000,
                           .batch_max_ms = 60000};
    cp_ingest *in = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_ingest_create(&o, s, &in, &err), 0);
    CHECK_EQ(cp_ingest_start(in, &err), 0);
    CHECK_EQ(cp_ingest_drain(in, 30 * SEC), 0); /* nothing yet: at once */
    int64_t want = produce_windows(rk, NULL, 0, 20, 4, 30);
    flush(rk);
    wait_messages(in, 20, 60); /* assigned, fetching */
    for (int round = 0; round < 3; round++) {
        want += produce_windows(rk, NULL, 20 + round * 300, 300, 4, 30);
        flush(rk); /* acknowledged by the broker, maybe not fetched */
        CHECK_EQ(cp_ingest_drain(in, 30 * SEC), 0);
        CHECK_EQ(total(s, "acme", CP_KIND_CPU, 1), want); /* before any stop */
    }
    CHECK_EQ(cp_broker_set_up(broker, 1, 0, NULL), 0);
    double t0 = now_s();
    CHECK_EQ(cp_ingest_drain(in, 2 * SEC), CP_ELIMIT);
    CHECK(now_s() - t0 < 10);
    CHECK_EQ(cp_broker_set_up(broker, 1, 1, NULL), 0);
    cp_ingest_stop(in);
    cp_ingest_destroy(in);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(broker);
    rmtree(dir);
}

/* The broker goes down for a while during an ingest: nothing is lost or doubled. */
TEST(broker_outage)
{
    const char *bs = start_broker();
    char *dir = tmpdir("ingest");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_ingest *in = ingest_start(bs, s, 32);
    int64_t want = produce_windows(rk, NULL, 0, 200, 4, 30);
    flush(rk);
    wait_messages(in, 200, 60);
    CHECK_EQ(cp_broker_set_up(broker, 1, 0, NULL), 0);
    want += produce_windows(rk, NULL, 200, 200, 4, 30); /* queued in the producer */
    usleep(2500000);
    CHECK_EQ(cp_broker_set_up(broker, 1, 1, NULL), 0);
    flush(rk);
    wait_messages(in, 400, 90);
    cp_ingest_stop(in);
    cp_ingest_stats st;
    cp_ingest_get_stats(in, &st);
    CHECK_EQ(st.windows, 400);
    CHECK_EQ(st.gap, 0);
    cp_ingest_destroy(in);
    CHECK_EQ(total(s, "acme", CP_KIND_CPU, 1), want);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(broker);
    rmtree(dir);
}

/* SIGKILL the ingesting process at random moments; then every window is stored once. */
TEST(sigkill_exactly_once)
{
    const char *bs = start_broker();
    char *dir = tmpdir("ingest");
    rd_kafka_t *rk = producer(bs);
    cp_synth *sy = cp_synth_create(21, 300);
    const int N = 3000;
    int64_t want = produce_windows(rk, sy, 0, N, 8, 40);
    flush(rk);
    char harness[600];
    snprintf(harness, sizeof harness, "%s/tests/ingest/ingest_harness", getenv("CP_BINARY_DIR"));
    uint64_t x = (uint64_t)getpid() * 2654435761u;
    int kills = 0, runs = 0;
    for (;;) {
        int pfd[2];
        CHECK(pipe(pfd) == 0);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(pfd[1], 1);
            close(pfd[0]);
            execl(harness, harness, dir, bs, (char *)NULL);
            _exit(127);
        }
        close(pfd[1]);
        runs++;
        /* wait until it has stored something in this run, then kill it a moment later */
        FILE *f = fdopen(pfd[0], "r");
        char line[128];
        int done = 0, started = 0;
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "done", 4)) {
                done = 1;
                break;
            }
            if (!strncmp(line, "progress", 8) && kills < 12) {
                started = 1;
                break;
            }
        }
        if (started) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            /* within 30 ms: short enough that a fast machine still needs many runs (and
             * so many kills) to get through all the windows */
            usleep((useconds_t)(x % 30000));
            kill(pid, SIGKILL);
            kills++;
        }
        int st;
        waitpid(pid, &st, 0);
        fclose(f);
        if (done) {
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
            break;
        }
        CHECK(started); /* otherwise the harness died on its own */
        CHECK(runs < 40);
    }
    fprintf(stderr, "%d runs, %d kills\n", runs, kills);
    CHECK(kills >= 10);
    cp_store *s = open_store(dir);
    CHECK_EQ(total(s, "acme", CP_KIND_CPU, 1), want);
    cp_store_close(s);
    cp_synth_destroy(sy);
    rd_kafka_destroy(rk);
    cp_broker_destroy(broker);
    rmtree(dir);
}

TEST_MAIN(T(pipeline_exact_totals_restart_duplicates), T(bad_inputs_to_dlq_and_ingest_goes_on),
          T(drain_stores_what_the_broker_holds), T(broker_outage), T(sigkill_exactly_once))
