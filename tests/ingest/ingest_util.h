/* Helpers for ingest tests: producing envelopes to the mock cluster, waiting for the
 * ingest to catch up, reading the DLQ. */
#ifndef CP_TEST_INGEST_UTIL_H
#define CP_TEST_INGEST_UTIL_H

#include <librdkafka/rdkafka.h>
#include <time.h>

#include "broker.h"
#include "ingest.h"
#include "pprof.h"
#include "store/store_util.h"

static inline rd_kafka_t *producer(const char *bootstraps)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(c, "bootstrap.servers", bootstraps, es, sizeof es) == 0);
    CHECK(rd_kafka_conf_set(c, "enable.idempotence", "true", es, sizeof es) == 0);
    CHECK(rd_kafka_conf_set(c, "compression.type", "lz4", es, sizeof es) == 0);
    CHECK(rd_kafka_conf_set(c, "linger.ms", "5", es, sizeof es) == 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es);
    CHECK(rk);
    return rk;
}

static inline void produce_raw(rd_kafka_t *rk, const void *v, size_t len, const void *key,
                               size_t klen)
{
    for (;;) {
        rd_kafka_resp_err_t e =
            rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES),
                              RD_KAFKA_V_VALUE((void *)v, len), RD_KAFKA_V_KEY((void *)key, klen),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (!e) return;
        CHECK(e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
        rd_kafka_poll(rk, 50);
    }
}

/* Produces envelope e carrying profile p (raw pprof), keyed by series. */
static inline void produce_env(rd_kafka_t *rk, cp_envelope *e, const cp_profile *p)
{
    cp_buf pp = {0}, enc = {0}, key = {0};
    CHECK(cp_pprof_encode(p, 0, &pp) == 0);
    e->pprof = pp.data;
    e->pprof_len = pp.len;
    CHECK(cp_envelope_encode(e, &enc) == 0);
    CHECK(cp_envelope_series_key(e, &key) == 0);
    produce_raw(rk, enc.data, enc.len, key.data, key.len);
    e->pprof = NULL;
    e->pprof_len = 0;
    cp_buf_close(&pp);
    cp_buf_close(&enc);
    cp_buf_close(&key);
}

static inline void flush(rd_kafka_t *rk)
{
    CHECK(rd_kafka_flush(rk, 60000) == 0);
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A small CPU window (~1 KB of pprof): the mock cluster keeps only ~5 MiB per partition,
 * so long ingests in tests use these rather than full-size synthetic windows. */
static inline cp_profile *mini_window(uint64_t seed, uint32_t nsamples, int64_t start)
{
    cp_profile *p = cp_profile_create();
    cp_profile_add_sample_type(p, "samples", "count");
    cp_profile_add_sample_type(p, "cpu", "nanoseconds");
    cp_profile_intern_cstr(p, "cpu", &p->period_type.type);
    cp_profile_intern_cstr(p, "nanoseconds", &p->period_type.unit);
    p->period = 10000000;
    p->time_nanos = start;
    p->duration_nanos = 10000000000LL;
    uint32_t locs[30];
    for (int i = 0; i < 30; i++) {
        char name[64];
        snprintf(name, sizeof name, "ns::Worker::step_%d(int)", i);
        cp_function f = {0};
        cp_profile_intern_cstr(p, name, &f.name);
        cp_profile_intern_cstr(p, "worker.cc", &f.filename);
        uint32_t fid;
        cp_profile_add_function(p, &f, &fid);
        cp_line ln = {fid, 10 + i};
        cp_profile_add_location(p, 0x4000 + (uint64_t)i * 32, 0, &ln, 1, &locs[i]);
    }
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (uint32_t k = 0; k < nsamples; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t depth = 3 + (uint32_t)(x % 6), st[8];
        for (uint32_t d = 0; d < depth; d++)
            st[d] = locs[(x >> (8 + 4 * d)) % 30];
        int64_t v[2] = {1 + (int64_t)(x % 3), 0};
        v[1] = v[0] * 10000000;
        cp_profile_add_sample(p, st, depth, v, NULL, 0);
    }
    return p;
}

/* Kafka properties for tests: a killed member must leave the group fast. */
static const char *const test_props[] = {"session.timeout.ms", "6000", "heartbeat.interval.ms",
                                         "500", NULL};

static inline cp_ingest *ingest_start(const char *brokers, cp_store *s, uint32_t batch)
{
    cp_ingest_options o = {.brokers = brokers,
                           .kafka_props = test_props,
                           .batch_max_messages = batch,
                           .batch_max_ms = 50};
    cp_ingest *in = NULL;
    cp_err err = {0};
    int rc = cp_ingest_create(&o, s, &in, &err);
    if (rc) fprintf(stderr, "ingest: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    CHECK_EQ(cp_ingest_start(in, &err), 0);
    return in;
}

/* The value of the sample line "name value" (name with its labels, if any) that registry r
 * prints on /metrics; fails the test when there is none. */
static inline int64_t metric_value(cp_metrics *r, const char *name)
{
    cp_buf b = {0};
    CHECK_EQ(cp_metrics_write(r, &b), 0);
    CHECK_EQ(cp_buf_append(&b, "", 1), 0);
    const char *text = (const char *)b.data, *p = text;
    size_t n = strlen(name);
    int64_t v = -1;
    int found = 0;
    for (; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') {
            v = strtoll(p + n + 1, NULL, 10);
            found = 1;
            break;
        }
    if (!found) fprintf(stderr, "no %s in /metrics:\n%s", name, text);
    CHECK(found);
    cp_buf_close(&b);
    return v;
}

/* Waits until the ingest has consumed n messages (all outcomes); fails after secs. */
static inline void wait_messages(cp_ingest *in, uint64_t n, double secs)
{
    double end = now_s() + secs;
    cp_ingest_stats st;
    for (;;) {
        cp_ingest_get_stats(in, &st);
        CHECK(!st.failed);
        if (st.messages >= n && st.lag == 0) break;
        if (now_s() > end) {
            fprintf(stderr,
                    "timeout: %llu of %llu messages, lag %lld, windows %llu dup %llu skipped %llu "
                    "dlq %llu/%llu/%llu/%llu/%llu gap %llu\n",
                    (unsigned long long)st.messages, (unsigned long long)n, (long long)st.lag,
                    (unsigned long long)st.windows, (unsigned long long)st.duplicates,
                    (unsigned long long)st.skipped, (unsigned long long)st.dlq[0],
                    (unsigned long long)st.dlq[1], (unsigned long long)st.dlq[2],
                    (unsigned long long)st.dlq[3], (unsigned long long)st.dlq[4],
                    (unsigned long long)st.gap);
            CHECK(0);
        }
        usleep(20000);
    }
}

/* Opens the store at dir with default options; fails the test (printing why) if it cannot. */
static inline cp_store *open_store(const char *dir)
{
    cp_store_options o = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    int rc = cp_store_open(&o, &s, &err);
    if (rc) fprintf(stderr, "open: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    return s;
}

#endif
