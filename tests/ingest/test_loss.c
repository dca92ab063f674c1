/* Loss and the DLQ with real parts (the librdkafka mock cluster, a real LevelDB): offsets
 * the broker dropped while ingest was stopped are counted by partition; a DLQ that cannot
 * be reached holds the offsets back until it can, and nothing is passed meanwhile; what
 * agents say they dropped is summed per service, once per window. */
#include "ingest_util.h"

#define WIN (10 * SEC)

/* Produces window i of the series "service=loss" (so always the same partition). */
static void produce_window(rd_kafka_t *rk, int i)
{
    cp_profile *p = mini_window((uint64_t)i, 50, T0 + (int64_t)i * WIN);
    cp_envelope e;
    make_env(&e, "acme", CP_KIND_CPU, "service=loss", T0 + (int64_t)i * WIN, WIN, "loss-agent",
             (uint64_t)i);
    produce_env(rk, &e, p);
    cp_envelope_close(&e);
    cp_profile_destroy(p);
}

/* The one partition this ingest has stored something in. */
static cp_partition_offsets only_partition(cp_ingest *in)
{
    cp_partition_offsets ps[8], found = {.partition = -1};
    uint32_t n = cp_ingest_get_partitions(in, ps, 8);
    CHECK(n <= 8);
    for (uint32_t i = 0; i < n; i++)
        if (ps[i].stored > 0) {
            CHECK_EQ(found.partition, -1);
            found = ps[i];
        }
    CHECK(found.partition >= 0);
    return found;
}

TEST(offsets_dropped_while_stopped_are_counted_by_partition)
{
    cp_broker *b = NULL;
    CHECK_EQ(cp_broker_create(NULL, &b, NULL), 0);
    const char *bs = cp_broker_bootstraps(b);
    char *dir = tmpdir("loss");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_ingest *in = ingest_start(bs, s, 64);
    for (int i = 0; i < 5; i++)
        produce_window(rk, i);
    flush(rk);
    wait_messages(in, 5, 60);
    cp_partition_offsets p0 = only_partition(in);
    CHECK_EQ(p0.stored, 5);
    CHECK_EQ(p0.lost, 0);
    cp_ingest_destroy(in);
    /* ingest is down: 10 MiB that do not compress into the same partition (the broker
     * keeps 5 MiB), then one more window */
    size_t big = 256u << 10;
    uint8_t *junk = malloc(big);
    uint64_t x = 88172645463325252ULL;
    for (size_t i = 0; i < big; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        junk[i] = (uint8_t)x;
    }
    for (int i = 0; i < 40; i++) {
        junk[0] = (uint8_t)i; /* not an envelope: would go to the DLQ if it were read */
        CHECK(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES),
                                RD_KAFKA_V_PARTITION(p0.partition), RD_KAFKA_V_VALUE(junk, big),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) == 0);
        flush(rk);
    }
    produce_window(rk, 5);
    flush(rk);
    free(junk);
    /* back up on the same store: it goes on from offset 5, which the broker dropped */
    in = ingest_start(bs, s, 64);
    cp_ingest_stats st;
    for (double end = now_s() + 60;; usleep(20000)) {
        cp_ingest_get_stats(in, &st);
        if (st.windows == 1) break;
        CHECK(now_s() < end);
    }
    cp_partition_offsets p1 = only_partition(in);
    CHECK_EQ(p1.partition, p0.partition);
    CHECK_EQ(p1.stored, 46); /* 5 windows, 40 junk, 1 window */
    uint64_t dlq = 0;
    for (int r = 0; r < CP_DLQ_NREASONS; r++)
        dlq += st.dlq[r];
    fprintf(stderr, "lost %llu, to the DLQ %llu\n", (unsigned long long)p1.lost,
            (unsigned long long)dlq);
    /* every offset is accounted for: lost, in the DLQ, or stored */
    CHECK(p1.lost >= 20);
    CHECK_EQ(p1.lost + dlq, 40);
    CHECK_EQ(st.gap, p1.lost);
    /* the lost range is listed for senders, from offset 5 */
    CHECK(p1.nranges >= 1);
    CHECK_EQ(p1.not_stored[0].from, 5);
    CHECK_EQ(p1.not_stored[0].to, 5 + (int64_t)p1.lost);
    CHECK_STREQ(p1.not_stored[0].why, "lost");
    CHECK(strstr(st.last_error, "are gone from the broker (lost)"));
    cp_ingest_destroy(in);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(b);
    rmtree(dir);
}

TEST(unreachable_dlq_holds_the_offsets_back)
{
    /* two mock brokers: the DLQ's leader (2) goes down, the profiles' (1) stays up */
    cp_broker *b = NULL;
    cp_broker_options bo = {.brokers = 2, .partitions = 1};
    CHECK_EQ(cp_broker_create(&bo, &b, NULL), 0);
    const char *bs = cp_broker_bootstraps(b);
    CHECK_EQ(cp_broker_set_leader(b, CP_TOPIC_PROFILES, 0, 1, NULL), 0);
    CHECK_EQ(cp_broker_set_leader(b, CP_TOPIC_DLQ, 0, 2, NULL), 0);
    CHECK_EQ(cp_broker_set_coordinator(b, "contprofd", 1, NULL), 0);
    char *dir = tmpdir("dlqdown");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_ingest *in = ingest_start(bs, s, 64);
    produce_window(rk, 0);
    flush(rk);
    wait_messages(in, 1, 60);
    CHECK_EQ(cp_broker_set_up(b, 2, 0, NULL), 0);
    produce_raw(rk, "not an envelope", 15, "k", 1);
    produce_window(rk, 1);
    flush(rk);
    /* both are read; the bad one's DLQ copy cannot be delivered: no offset moves */
    cp_ingest_stats st;
    for (double end = now_s() + 30;; usleep(20000)) {
        cp_ingest_get_stats(in, &st);
        if (st.messages == 3) break;
        CHECK(now_s() < end);
    }
    /* longer than any flush timeout: a send that gave up would have passed the offsets */
    usleep(12000000);
    int64_t next = -1;
    CHECK_EQ(cp_store_get_offset(s, CP_TOPIC_PROFILES, 0, &next, NULL), 0);
    CHECK_EQ(next, 1);
    cp_ingest_get_stats(in, &st);
    CHECK_EQ(st.windows, 1);
    CHECK_EQ(only_partition(in).stored, 1);
    /* the DLQ is back: the copy goes, and the offsets with it */
    CHECK_EQ(cp_broker_set_up(b, 2, 1, NULL), 0);
    for (double end = now_s() + 60;; usleep(20000)) {
        cp_ingest_get_stats(in, &st);
        if (st.windows == 2) break;
        CHECK(now_s() < end);
    }
    CHECK_EQ(cp_store_get_offset(s, CP_TOPIC_PROFILES, 0, &next, NULL), 0);
    CHECK_EQ(next, 3);
    cp_partition_offsets p = only_partition(in);
    CHECK_EQ(p.nranges, 1);
    CHECK_EQ(p.not_stored[0].from, 1);
    CHECK_STREQ(p.not_stored[0].why, "dlq:envelope");
    cp_ingest_destroy(in);
    /* exactly one copy in the DLQ */
    char es[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(c, "bootstrap.servers", bs, es, sizeof es) == 0);
    CHECK(rd_kafka_conf_set(c, "group.id", "dlq-reader", es, sizeof es) == 0);
    CHECK(rd_kafka_conf_set(c, "enable.partition.eof", "true", es, sizeof es) == 0);
    rd_kafka_t *rc = rd_kafka_new(RD_KAFKA_CONSUMER, c, es, sizeof es);
    CHECK(rc);
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(tl, CP_TOPIC_DLQ, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    CHECK(rd_kafka_assign(rc, tl) == 0);
    rd_kafka_topic_partition_list_destroy(tl);
    int copies = 0, eof = 0;
    for (double end = now_s() + 30; !eof && now_s() < end;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rc, 200);
        if (!m) continue;
        if (!m->err) {
            copies++;
            CHECK_EQ(m->len, 15);
        } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eof = 1;
        }
        rd_kafka_message_destroy(m);
    }
    CHECK(eof);
    CHECK_EQ(copies, 1);
    rd_kafka_consumer_close(rc);
    rd_kafka_destroy(rc);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(b);
    rmtree(dir);
}

/* Produces the envelope of one isolate of a window that says the agent dropped dw windows
 * and ds samples before it. */
static void produce_dropped(rd_kafka_t *rk, const char *svc, const char *prod, const char *iso,
                            int win, uint64_t seq, uint64_t dw, uint64_t ds)
{
    char labels[128];
    snprintf(labels, sizeof labels, "service=%s,isolate=%s", svc, iso);
    cp_profile *p = mini_window(seq, 20, T0 + (int64_t)win * WIN);
    cp_envelope e;
    make_env(&e, "acme", CP_KIND_CPU, labels, T0 + (int64_t)win * WIN, WIN, prod, seq);
    e.dropped_windows = dw;
    e.dropped_samples = ds;
    produce_env(rk, &e, p);
    cp_envelope_close(&e);
    cp_profile_destroy(p);
}

TEST(agents_drops_are_summed_per_service_once_per_window)
{
    cp_broker *b = NULL;
    CHECK_EQ(cp_broker_create(NULL, &b, NULL), 0);
    const char *bs = cp_broker_bootstraps(b);
    char *dir = tmpdir("dropped");
    cp_store *s = open_store(dir);
    rd_kafka_t *rk = producer(bs);
    cp_ingest *in = ingest_start(bs, s, 64);
    /* window 0 of agent a: three isolates, each envelope carries the window's numbers */
    produce_dropped(rk, "api", "agent-a", "main", 0, 1, 2, 100);
    produce_dropped(rk, "api", "agent-a", "worker", 0, 2, 2, 100);
    produce_dropped(rk, "api", "agent-a", "io", 0, 3, 2, 100);
    /* window 1 of agent a, and another agent of the same service, and another service */
    produce_dropped(rk, "api", "agent-a", "main", 1, 4, 1, 10);
    produce_dropped(rk, "api", "agent-b", "main", 0, 1, 0, 5);
    produce_dropped(rk, "db", "agent-c", "main", 0, 1, 7, 0);
    /* nothing dropped: not listed */
    produce_dropped(rk, "quiet", "agent-d", "main", 0, 1, 0, 0);
    flush(rk);
    wait_messages(in, 7, 60);
    cp_ingest_dropped d[8];
    uint32_t n = cp_ingest_get_dropped(in, d, 8);
    CHECK_EQ(n, 2);
    int api = strcmp(d[0].service, "api") == 0 ? 0 : 1;
    CHECK_STREQ(d[api].service, "api");
    CHECK_EQ(d[api].windows, 3);
    CHECK_EQ(d[api].samples, 115);
    CHECK_STREQ(d[1 - api].service, "db");
    CHECK_EQ(d[1 - api].windows, 7);
    CHECK_EQ(d[1 - api].samples, 0);
    cp_ingest_destroy(in);
    rd_kafka_destroy(rk);
    cp_store_close(s);
    cp_broker_destroy(b);
    rmtree(dir);
}

TEST_MAIN(T(agents_drops_are_summed_per_service_once_per_window),
          T(offsets_dropped_while_stopped_are_counted_by_partition),
          T(unreachable_dlq_holds_the_offsets_back))
