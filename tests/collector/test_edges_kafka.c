/* The edges of a process's life through Kafka (test_edges.c does it with files): cpe (edges.c)
 * under the agent with CONTPROF_BROKERS at a librdkafka mock cluster in this process and the
 * default 10 s window; the envelopes read back from contprof.profiles must hold the CPU time
 * it burnt, when it returns (a process shorter than the window), execs or _exits. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "envelope.h"
#include "pprof.h"
#include "test.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* pfiles.h's file loading: unused here */
#include "pfiles.h"
#include "proc.h"

/* Runs cpe MODE SECS with the agent sending to bootstraps; returns the CPU seconds it printed. */
static double run_cpe(const char *bootstraps, const char *mode, const char *secs)
{
    int rd;
    pid_t pid = fork_stdout_pipe(&rd);
    if (pid == 0) {
        const char *lib = getenv("CP_TEST_LIB"); /* another build's library, to compare */
        setenv("LD_PRELOAD", lib ? lib : CP_LIB, 1);
        setenv("CONTPROF_BROKERS", bootstraps, 1);
        setenv("CONTPROF_SERVICE", "edges", 1);
        unsetenv("CONTPROF_OUTPUT_DIR");
        unsetenv("CONTPROF_WINDOW");
        execl(CPE, CPE, mode, secs, (char *)NULL);
        _exit(127);
    }
    char out[256];
    int st = cp_test_collect(rd, pid, out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return atof(out);
}

/* Reads contprof.profiles from the start until 3 s pass without a message; returns the CPU
 * seconds in burn_edge over the cpu envelopes. */
static double kafka_cpu(const char *bootstraps)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps, err, sizeof(err)) == 0);
    CHECK(rd_kafka_conf_set(conf, "group.id", "edges", err, sizeof(err)) == 0);
    CHECK(rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err)) == 0);
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    CHECK(c != NULL);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    for (int p = 0; p < 4; p++)
        rd_kafka_topic_partition_list_add(l, "contprof.profiles", p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    CHECK(rd_kafka_assign(c, l) == 0);
    rd_kafka_topic_partition_list_destroy(l);
    int64_t ns = 0;
    for (int idle = 0; idle < 30;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) {
            idle++;
            continue;
        }
        idle = 0;
        if (!m->err) {
            cp_envelope e;
            cp_err ee = {0};
            CHECK(cp_envelope_decode(m->payload, m->len, 64 << 20, &e, &ee) == 0);
            if (e.kind == CP_KIND_CPU) {
                cp_profile *p;
                CHECK(cp_pprof_decode(e.pprof, e.pprof_len, NULL, &p, &ee) == 0);
                ns += func_total(p, "burn_edge", 1);
                cp_profile_destroy(p);
            }
            cp_envelope_close(&e);
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return (double)ns / 1e9;
}

static void check_mode(const char *mode, const char *secs)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    CHECK(host != NULL);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(host, 1);
    CHECK(mc != NULL);
    CHECK(rd_kafka_mock_topic_create(mc, "contprof.profiles", 4, 1) == 0);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    double burnt = run_cpe(boot, mode, secs);
    double seen = kafka_cpu(boot);
    printf("%s %s through Kafka: burnt %.3f s, profiled %.3f s (%.0f%%)\n", mode, secs, burnt, seen,
           burnt > 0 ? 100 * seen / burnt : 0);
    CHECK(burnt > 0);
    CHECK(seen >= 0.9 * burnt);
    CHECK(seen <= 1.1 * burnt);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* 1 s of CPU (a tenth of the window; 300 ms at 100 Hz is 30 samples, whose count varies by
 * a tenth) and a normal exit: the one window goes through Kafka at exit. */
TEST(short_process_kafka)
{
    check_mode("return", "1.0");
}

TEST(exec_flushes_window_kafka)
{
    check_mode("exec", "0.5");
}

TEST(exit_flushes_window_kafka)
{
    check_mode("_exit", "0.5");
}

TEST_MAIN(T(short_process_kafka), T(exec_flushes_window_kafka), T(exit_flushes_window_kafka))
