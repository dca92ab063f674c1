/* Ingest benchmark: realistic 10 s CPU windows (2,000 distinct stacks of depth 10-60 in the
 * service, 1,000 samples per window, raw pprof in the envelope and lz4 on the topic, as
 * the agent sends them) produced to the embedded broker (librdkafka mock cluster) and
 * consumed by cp_ingest into a store with synced LevelDB writes. Also the same decode +
 * store path on one thread without Kafka, for gzip'd and raw payloads.
 *   bench_ingest DIR [WINDOWS [direct|kafka]]   (only that part, for profiling)
 * Prints key value lines. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "broker.h"
#include "envelope.h"
#include "ingest.h"
#include "pprof.h"
#include "store.h"
#include "synth.h"
#include "clock.h"

#define T0 1704067200000000000LL
#define SEC 1000000000LL
#define NDISTINCT 32
#define NSERIES 8

static cp_buf payload[NDISTINCT], rawload[NDISTINCT];
static int use_raw;
static long nwin;
static cp_ingest *ing;
static const char *bootstraps;

static double proc_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static void envelope_for(long i, cp_buf *enc, cp_buf *key)
{
    cp_envelope e = {0};
    char inst[16];
    snprintf(inst, sizeof inst, "i%ld", i % NSERIES);
    e.tenant = "default";
    cp_labels_set(&e.labels, "service", "bench");
    cp_labels_set(&e.labels, "instance", inst);
    e.kind = CP_KIND_CPU;
    e.window_start_ns = T0 + (i / NSERIES) * 10 * SEC;
    e.window_duration_ns = 10 * SEC;
    e.producer_id = inst;
    e.sequence = (uint64_t)(i / NSERIES);
    cp_buf *pl = use_raw ? rawload : payload;
    e.pprof = pl[(i * 7) % NDISTINCT].data;
    e.pprof_len = pl[(i * 7) % NDISTINCT].len;
    enc->len = key->len = 0;
    cp_envelope_encode(&e, enc);
    cp_envelope_series_key(&e, key);
    cp_labels_close(&e.labels);
}

/* The agents' side, in a child process of its own (`bench_ingest --produce BOOTSTRAPS N`)
 * so that its CPU (building envelopes, librdkafka's lz4 compression) is not counted as
 * ingest's. It produces N envelopes, staying at most 64 ahead of the consumer, whose
 * progress the parent writes to stdin as one line per count: the mock cluster keeps only
 * about 5 MiB per partition. */
static int produce_main(const char *brokers, long n)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", brokers, es, sizeof es);
    rd_kafka_conf_set(c, "linger.ms", "2", es, sizeof es);
    rd_kafka_conf_set(c, "compression.type", "lz4", es, sizeof es); /* as the agent does */
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es);
    if (!rk) {
        fprintf(stderr, "bench_ingest producer: %s\n", es);
        return 1;
    }
    cp_buf enc = {0}, key = {0};
    long consumed = 0;
    char line[64];
    for (long i = 0; i < n; i++) {
        while (consumed + 64 <= i) {
            rd_kafka_poll(rk, 0);
            if (!fgets(line, sizeof line, stdin)) return 1; /* the parent went away */
            consumed = atol(line);
        }
        envelope_for(i, &enc, &key);
        while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES),
                                 RD_KAFKA_V_VALUE(enc.data, enc.len),
                                 RD_KAFKA_V_KEY(key.data, key.len),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END))
            rd_kafka_poll(rk, 10);
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 60000);
    rd_kafka_destroy(rk);
    cp_buf_close(&enc);
    cp_buf_close(&key);
    return 0;
}

static void make_payloads(void)
{
    cp_synth *sy = cp_synth_create(42, 2000);
    for (int i = 0; i < NDISTINCT; i++) {
        cp_profile *w = cp_synth_cpu_window(sy, 1000, T0, 10 * SEC);
        cp_pprof_encode(w, 6, &payload[i]);
        cp_pprof_encode(w, 0, &rawload[i]);
        cp_profile_destroy(w);
    }
    cp_synth_destroy(sy);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_ingest DIR [WINDOWS]\n");
        return 2;
    }
    if (!strcmp(argv[1], "--produce") && argc == 4) {
        use_raw = 1;
        make_payloads();
        return produce_main(argv[2], atol(argv[3]));
    }
    nwin = argc > 2 ? atol(argv[2]) : 3000;
    make_payloads();
    double gz = 0;
    for (int i = 0; i < NDISTINCT; i++) gz += (double)payload[i].len;
    printf("gzip_bytes_per_window %.0f\n", gz / NDISTINCT);
    char path[512];
    cp_err err = {0};

    /* 1. decode + store on this thread, no Kafka: gzip'd payloads, then raw ones (an
     * agent may send raw pprof and let Kafka's lz4 compress the batch) */
    int only_kafka = argc > 3 && !strcmp(argv[3], "kafka"); /* for profiling */
    for (use_raw = 0; use_raw < 2 && !only_kafka; use_raw++) {
        snprintf(path, sizeof path, "%s/direct%d", argv[1], use_raw);
        cp_store_options so = {.path = path};
        cp_store *s = NULL;
        if (cp_store_open(&so, &s, &err)) goto fail;
        cp_store_batch *b = cp_store_batch_create(s);
        cp_pprof_decoder *dec = cp_pprof_decoder_create(NULL);
        cp_profile *p = cp_profile_create();
        cp_buf enc = {0}, key = {0};
        long ndirect = nwin < 2000 ? nwin : 2000;
        double t0 = now_s(), c0 = thread_cpu_s();
        for (long i = 0; i < ndirect; i++) {
            envelope_for(i, &enc, &key);
            cp_envelope e;
            if (cp_envelope_decode_view(enc.data, enc.len, 64u << 20, &e, &err) ||
                cp_pprof_decoder_decode(dec, e.pprof, e.pprof_len, p, &err) ||
                cp_store_batch_add(b, &e, p, 0, &err))
                goto fail;
            cp_envelope_close(&e);
            if (i % 512 == 511 && cp_store_batch_commit(b, &err)) goto fail;
        }
        if (cp_store_batch_commit(b, &err)) goto fail;
        double t1 = now_s(), c1 = thread_cpu_s();
        printf("direct%s_windows %ld\n", use_raw ? "_raw" : "", ndirect);
        printf("direct%s_windows_per_s %.0f\n", use_raw ? "_raw" : "", (double)ndirect / (t1 - t0));
        printf("direct%s_windows_per_cpu_s %.0f\n", use_raw ? "_raw" : "",
               (double)ndirect / (c1 - c0));
        cp_store_batch_destroy(b);
        cp_pprof_decoder_destroy(dec);
        cp_profile_destroy(p);
        cp_store_close(s);
        cp_buf_close(&enc);
        cp_buf_close(&key);
    }
    use_raw = 1; /* the agent sends raw pprof and lets Kafka's lz4 compress the batch */
    if (argc > 3 && !strcmp(argv[3], "direct")) return 0; /* for callgrind */

    /* 2. through Kafka */
    cp_broker *br = NULL;
    if (cp_broker_create(NULL, &br, &err)) goto fail;
    bootstraps = cp_broker_bootstraps(br);
    snprintf(path, sizeof path, "%s/kafka", argv[1]);
    cp_store_options so = {.path = path};
    cp_store *s = NULL;
    if (cp_store_open(&so, &s, &err)) goto fail;
    cp_ingest_options io = {.brokers = bootstraps, .batch_max_messages = 512, .batch_max_ms = 200};
    if (cp_ingest_create(&io, s, &ing, &err) || cp_ingest_start(ing, &err)) goto fail;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --produce '%s' %ld", argv[0], bootstraps, nwin);
    signal(SIGPIPE, SIG_IGN); /* the producer exits once it has sent everything */
    FILE *prod = popen(cmd, "w"); /* its stdin: our progress */
    if (!prod) {
        fprintf(stderr, "bench_ingest: cannot start the producer\n");
        return 1;
    }
    long told = -1;
    /* the clock starts with the first stored message (the group join takes seconds) */
    cp_ingest_stats st;
    double start = 0, cstart = 0;
    uint64_t m0 = 0;
    for (;;) {
        cp_ingest_get_stats(ing, &st);
        if (st.failed) {
            fprintf(stderr, "bench_ingest: %s\n", st.error);
            return 1;
        }
        if (!start && st.messages > 0) {
            start = now_s();
            cstart = proc_cpu();
            m0 = st.messages;
        }
        long done = (long)(st.messages + st.gap);
        if (done >= nwin) break;
        if (done != told) {
            fprintf(prod, "%ld\n", done);
            fflush(prod);
            told = done;
        }
        usleep(1000);
    }
    cp_ingest_stop(ing); /* writes the last batch */
    double end = now_s(), cend = proc_cpu();
    if (pclose(prod) != 0) {
        fprintf(stderr, "bench_ingest: the producer failed\n");
        return 1;
    }
    cp_ingest_get_stats(ing, &st);
    long counted = nwin - (long)m0;
    printf("kafka_windows %llu\n", (unsigned long long)st.windows);
    printf("kafka_batches %llu\n", (unsigned long long)st.batches);
    printf("kafka_gap %llu\n", (unsigned long long)st.gap);
    printf("kafka_windows_per_s %.0f\n", (double)counted / (end - start));
    /* CPU of this process: consumer, librdkafka, the mock broker, the store (the agents'
     * side runs in the child) */
    printf("kafka_windows_per_cpu_s %.0f\n", (double)counted / (cend - cstart));
    cp_ingest_destroy(ing);
    cp_store_close(s);
    cp_broker_destroy(br);
    for (int i = 0; i < NDISTINCT; i++) {
        cp_buf_close(&payload[i]);
        cp_buf_close(&rawload[i]);
    }
    return st.windows + st.gap == (uint64_t)nwin ? 0 : 1;
fail:
    fprintf(stderr, "bench_ingest: %s\n", err.msg);
    return 1;
}
