/* End to end through Kafka: librdkafka's mock cluster runs in this process, a real program
 * runs under the agent with CONTPROF_BROKERS pointing at it, and the envelopes read back
 * from topic contprof.profiles are decoded and checked (labels, key, sequence, payload).
 * Also: `contprof run --server` follows a contprofd whose broker moved. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "cmd_run.h"
#include "envelope.h"
#include "fake_contprofd.h"
#include "pprof.h"
#include "test.h"

static int run_agent(const char *bootstraps)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", 1);
        dup2(null, 1);
        setenv("LD_PRELOAD", CP_LIB, 1);
        setenv("CONTPROF_BROKERS", bootstraps, 1);
        setenv("CONTPROF_WINDOW", "500ms", 1);
        setenv("CONTPROF_SERVICE", "kafkatest", 1);
        setenv("CONTPROF_VERSION", "1.2.3", 1);
        setenv("CONTPROF_LABELS", "team=core,region=eu", 1);
        setenv("CONTPROF_CPU_HZ", "250", 1);
        unsetenv("CONTPROF_OUTPUT_DIR");
        execl(CPW, CPW, "ratio", "0.2", (char *)NULL);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static rd_kafka_t *consumer(const char *bootstraps)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(c, "bootstrap.servers", bootstraps, err, sizeof(err)) == 0);
    CHECK(rd_kafka_conf_set(c, "group.id", "contprof-test", err, sizeof(err)) == 0);
    CHECK(rd_kafka_conf_set(c, "enable.auto.commit", "false", err, sizeof(err)) == 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof(err));
    CHECK(rk != NULL);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    for (int p = 0; p < 4; p++)
        rd_kafka_topic_partition_list_add(l, "contprof.profiles", p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    CHECK(rd_kafka_assign(rk, l) == 0);
    rd_kafka_topic_partition_list_destroy(l);
    return rk;
}

/* A librdkafka handle that hosts mock clusters. */
static rd_kafka_t *mock_host(void)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    CHECK(host != NULL);
    return host;
}

/* A one-broker mock cluster with topic contprof.profiles (4 partitions). */
static rd_kafka_mock_cluster_t *mock_cluster(rd_kafka_t *host)
{
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(host, 1);
    CHECK(mc != NULL);
    CHECK(rd_kafka_mock_topic_create(mc, "contprof.profiles", 4, 1) == 0);
    return mc;
}

TEST(envelopes_through_kafka)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);

    CHECK_EQ(run_agent(boot), 0);

    rd_kafka_t *c = consumer(boot);
    int n = 0, kinds[4] = {0}, idle = 0;
    int64_t cpu_alpha = 0, cpu_beta = 0;
    uint64_t seen_seq[512];
    int nseq = 0;
    const char *producer = NULL;
    char producer_buf[256] = "";
    while (idle < 30) { /* 3 s without messages: the topic is drained */
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) {
            idle++;
            continue;
        }
        if (m->err) {
            rd_kafka_message_destroy(m);
            continue;
        }
        idle = 0;
        cp_envelope e;
        cp_err ee = {0};
        int rc = cp_envelope_decode(m->payload, m->len, 64 << 20, &e, &ee);
        if (rc) fprintf(stderr, "envelope: %s\n", ee.msg);
        CHECK(rc == 0);
        CHECK_STREQ(e.tenant, "default");
        CHECK_STREQ(cp_labels_get(&e.labels, "service"), "kafkatest");
        CHECK_STREQ(cp_labels_get(&e.labels, "version"), "1.2.3");
        CHECK_STREQ(cp_labels_get(&e.labels, "team"), "core");
        CHECK_STREQ(cp_labels_get(&e.labels, "region"), "eu");
        CHECK(cp_labels_get(&e.labels, "instance") != NULL);
        const char *iso = cp_labels_get(&e.labels, "isolate");
        CHECK(iso != NULL);
        CHECK(e.kind >= CP_KIND_CPU && e.kind <= CP_KIND_INUSE);
        kinds[e.kind]++;
        CHECK(e.engine && strstr(e.engine, "1ms") == NULL); /* 250 Hz: 4ms */
        CHECK(e.window_duration_ns > 0 && e.window_duration_ns < 2000000000LL);
        /* cumulative = alloc totals since start (envelope.proto); the store rejects it for
         * any other kind, and the agent's alloc is per window */
        CHECK_EQ(e.cumulative, 0);
        /* one producer, each sequence number once */
        if (!producer) {
            snprintf(producer_buf, sizeof(producer_buf), "%s", e.producer_id);
            producer = producer_buf;
        }
        CHECK_STREQ(e.producer_id, producer);
        for (int i = 0; i < nseq; i++)
            CHECK(seen_seq[i] != e.sequence);
        if (nseq < 512) seen_seq[nseq++] = e.sequence;
        /* key = the series identity */
        cp_buf key = {0};
        CHECK(cp_envelope_series_key(&e, &key) == 0);
        CHECK(m->key_len == key.len && memcmp(m->key, key.data, key.len) == 0);
        cp_buf_close(&key);
        /* small windows travel as raw pprof: the topic's lz4 compresses them */
        CHECK(e.pprof_len > CP_RAW_PPROF_MAX || !cp_is_gzip(e.pprof, e.pprof_len));
        cp_profile *p;
        CHECK(cp_pprof_decode(e.pprof, e.pprof_len, NULL, &p, &ee) == 0);
        if (e.kind == CP_KIND_CPU && !strcmp(iso, "alpha")) cpu_alpha += cp_profile_total(p, 1);
        if (e.kind == CP_KIND_CPU && !strcmp(iso, "beta")) cpu_beta += cp_profile_total(p, 1);
        cp_profile_destroy(p);
        cp_envelope_close(&e);
        rd_kafka_message_destroy(m);
        n++;
    }
    printf("%d envelopes (cpu %d, alloc %d, inuse %d); alpha %.3fs beta %.3fs\n", n, kinds[1],
           kinds[2], kinds[3], cpu_alpha / 1e9, cpu_beta / 1e9);
    CHECK(n >= 6);
    CHECK(kinds[1] > 0 && kinds[2] > 0 && kinds[3] > 0);
    CHECK(cpu_beta > 0);
    CHECK(fabs((double)cpu_alpha / (double)cpu_beta - 3.0) < 0.3);
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* ------------------------------------------------------------------------------------
 * A contprofd that moves its broker */

/* Waits up to secs for an envelope on the cluster at bootstraps; copies its producer id. */
static int first_envelope(const char *bootstraps, double secs, char *producer, size_t cap)
{
    rd_kafka_t *c = consumer(bootstraps);
    int got = 0;
    for (int i = 0; i < (int)(secs * 10) && !got; i++) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        cp_envelope e;
        cp_err ee = {0};
        if (!m->err && cp_envelope_decode(m->payload, m->len, 64 << 20, &e, &ee) == 0) {
            snprintf(producer, cap, "%s", e.producer_id);
            cp_envelope_close(&e);
            got = 1;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return got;
}

/* `contprof run --server URL`: the agent got the broker list once; contprofd restarts
 * with its broker on another port. The agent must ask the server again and deliver to the
 * new broker, as the same instance (same producer id), without restarting the program. */
TEST(server_broker_moves)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *a = mock_cluster(host);
    char boot_a[256];
    snprintf(boot_a, sizeof(boot_a), "%s", rd_kafka_mock_cluster_bootstraps(a));
    fake_contprofd f;
    fake_contprofd_start(&f, boot_a);

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        setenv("CONTPROF_LIB", CP_LIB, 1);
        setenv("CONTPROF_WINDOW", "500ms", 1);
        setenv("CONTPROF_SERVICE", "movingbroker", 1);
        unsetenv("CONTPROF_OUTPUT_DIR");
        unsetenv("CONTPROF_BROKERS");
        char *argv[] = {"run", "--server", f.url, "--", CPW, "startup", "40", NULL};
        _exit(cp_cmd_run(7, argv));
    }
    char prod_a[256] = "", prod_b[256] = "";
    int got_a = first_envelope(boot_a, 20, prod_a, sizeof(prod_a));

    /* contprofd restarts: its broker is gone, a new one listens elsewhere */
    rd_kafka_mock_cluster_destroy(a);
    rd_kafka_mock_cluster_t *b = mock_cluster(host);
    char boot_b[256];
    snprintf(boot_b, sizeof(boot_b), "%s", rd_kafka_mock_cluster_bootstraps(b));
    int before = fake_contprofd_move(&f, boot_b);
    int got_b = first_envelope(boot_b, 40, prod_b, sizeof(prod_b));

    int alive = waitpid(pid, NULL, WNOHANG) == 0;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fake_contprofd_stop(&f);
    printf("broker %s -> %s; server asked %d times before the move, %d in all; "
           "producer %s / %s\n",
           boot_a, boot_b, before, f.requests, prod_a, prod_b);
    CHECK(got_a);
    CHECK(strcmp(boot_a, boot_b) != 0);
    CHECK(got_b);
    CHECK(alive); /* the same process, not a restarted one */
    CHECK_STREQ(prod_a, prod_b);
    CHECK(f.requests > before);
    rd_kafka_mock_cluster_destroy(b);
    rd_kafka_destroy(host);
}

TEST_MAIN(T(envelopes_through_kafka), T(server_broker_moves))
