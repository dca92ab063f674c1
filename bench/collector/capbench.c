/* Captures, the agent's side (issue 29): what watching the control topic costs a process
 * when no capture runs, and how long a capture takes to reach a running process. Hosts
 * librdkafka's mock cluster in this process, as the collector tests do.
 *   capbench cost LIB CPCAP PAIRS SECS: PAIRS pairs of `cpcap cpu SECS` under the agent
 *     with brokers, watching (CONTPROF_CAPTURES=1) and not (=0), alternating; the child's
 *     CPU (user + system of every thread, wait4) of each; prints the median ratio.
 *   capbench latency LIB CPCAP N: one `cpcap cpu` under the agent; N captures of its
 *     alpha at 1 kHz, one after the other; for each, the time from before the produce call
 *     to the start of its first capture window (the tick that boosted alpha: its first
 *     boosted sample follows within one 1 ms period of alpha's CPU); median and p99.
 * With CAPBENCH_SERVER=URL (a contprofd) the agents poll it for captures (watch.h) instead
 * of consuming the control topic, and the rows of idle and cost say "_poll".
 *   capbench pollcost URL N [GAP_MS]: N polls of URL's GET /api/v1/control/captures as the
 *     agent makes them (cp_http_get), back to back or GAP_MS apart (as the agent spaces
 *     them: cold caches, the cost that counts); this process's CPU per poll, and what it
 *     makes a second at CP_WATCH_POLL_MS (steadier than the idle pairs on a shared machine). */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "envelope.h"
#include "http_client.h"
#include "watch.h"

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "capbench: %s\n", what);
    exit(1);
}

/* cpcap cpu SECS under the agent, or with idle set, /bin/sleep SECS (the agent alone). */
static int idle;

static pid_t spawn(const char *lib, const char *cpcap, const char *boot, const char *secs,
                   const char *captures)
{
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        setenv("LD_PRELOAD", lib, 1);
        setenv("CONTPROF_BROKERS", boot, 1);
        setenv("CONTPROF_SERVICE", "capbench", 1);
        setenv("CONTPROF_CAPTURES", captures, 1);
        unsetenv("CONTPROF_OUTPUT_DIR");
        if (getenv("CAPBENCH_SERVER")) setenv("CONTPROF_SERVER", getenv("CAPBENCH_SERVER"), 1);
        if (idle)
            execl("/bin/sleep", "sleep", secs, (char *)NULL);
        else
            execl(cpcap, cpcap, "cpu", secs, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The agent alone (/bin/sleep) for a short and a long run: the difference of the added CPU
 * over the difference of the durations is watching's steady cost per second, the rest its
 * start (a second librdkafka handle). */
static double idle_added(const char *lib, const char *boot, int pairs, const char *secs)
{
    double *d = calloc((size_t)pairs, sizeof(double));
    for (int i = 0; i < pairs; i++) {
        double cpu[2];
        for (int v = 0; v < 2; v++) {
            int watch = (v + i) % 2;
            pid_t pid = spawn(lib, NULL, boot, secs, watch ? "1" : "0");
            int st;
            struct rusage ru;
            if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
                die("sleep failed");
            cpu[watch] = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
                         ru.ru_stime.tv_usec / 1e6;
        }
        d[i] = cpu[1] - cpu[0];
        fprintf(stderr, "sleep %s: watching adds %.2f ms\n", secs, d[i] * 1e3);
    }
    qsort(d, (size_t)pairs, sizeof(double), cmp_double);
    double m = d[pairs / 2];
    free(d);
    return m;
}

static int idle_cost(const char *lib, const char *boot, int pairs)
{
    idle = 1;
    double s = idle_added(lib, boot, pairs, "1"), l = idle_added(lib, boot, pairs, "11");
    double per_s = (l - s) / 10;
    const char *how = getenv("CAPBENCH_SERVER") ? "_poll" : "";
    printf("watch%s_start_cpu_ms | %.2f\n", how, (s - per_s) * 1e3);
    printf("watch%s_idle_cpu_percent_of_a_core | %.4f | 0.05 | %s\n", how, per_s * 100,
           per_s * 100 <= 0.05 ? "ok" : "over");
    return 0;
}

static int cost(const char *lib, const char *cpcap, const char *boot, int pairs, const char *secs)
{
    double *ratio = calloc((size_t)pairs, sizeof(double));
    double on_sum = 0, off_sum = 0;
    for (int i = 0; i < pairs; i++) {
        double cpu[2];
        for (int v = 0; v < 2; v++) {
            int watch = (v + i) % 2; /* alternate which goes first */
            pid_t pid = spawn(lib, cpcap, boot, secs, watch ? "1" : "0");
            int st;
            struct rusage ru;
            if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
                die("cpcap failed");
            cpu[watch] = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
                         ru.ru_stime.tv_usec / 1e6;
        }
        ratio[i] = cpu[1] / cpu[0];
        on_sum += cpu[1];
        off_sum += cpu[0];
        fprintf(stderr, "pair %d: watching %.4f s, off %.4f s, ratio %.5f\n", i, cpu[1], cpu[0],
                ratio[i]);
    }
    qsort(ratio, (size_t)pairs, sizeof(double), cmp_double);
    const char *how = getenv("CAPBENCH_SERVER") ? "_poll" : "";
    printf("watch%s_cpu_ratio_median | %.5f | 1.0005 | %s\n", how, ratio[pairs / 2],
           ratio[pairs / 2] <= 1.0005 ? "ok" : "over");
    printf("watch%s_cpu_added_ms_per_process_mean | %.2f\n", how, (on_sum - off_sum) / pairs * 1e3);
    free(ratio);
    return 0;
}

static rd_kafka_t *consumer(const char *boot)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof(err));
    rd_kafka_conf_set(c, "group.id", "capbench", err, sizeof(err));
    rd_kafka_conf_set(c, "fetch.wait.max.ms", "20", err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof(err));
    if (!rk) die(err);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    for (int p = 0; p < 4; p++)
        rd_kafka_topic_partition_list_add(l, "contprof.profiles", p)->offset = RD_KAFKA_OFFSET_END;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    return rk;
}

static void produce(rd_kafka_t *p, const cp_capture *c)
{
    cp_buf b = {0};
    if (cp_capture_encode(c, NULL, &b)) die("encode");
    if (rd_kafka_producev(p, RD_KAFKA_V_TOPIC(CP_TOPIC_CONTROL), RD_KAFKA_V_PARTITION(0),
                          RD_KAFKA_V_KEY(c->id, strlen(c->id)), RD_KAFKA_V_VALUE(b.data, b.len),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END))
        die("produce");
    rd_kafka_flush(p, 5000);
    cp_buf_close(&b);
}

static int latency(const char *lib, const char *cpcap, const char *boot, int n)
{
    char err[256];
    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    rd_kafka_conf_set(pc, "bootstrap.servers", boot, err, sizeof(err));
    rd_kafka_conf_set(pc, "linger.ms", "0", err, sizeof(err));
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, sizeof(err));
    if (!p) die(err);
    rd_kafka_t *c = consumer(boot);
    char secs[32];
    snprintf(secs, sizeof(secs), "%d", 3 * n + 30);
    pid_t pid = spawn(lib, cpcap, boot, secs, "1");
    sleep(3); /* the agent is up and its consumer has caught up with the (empty) topic */
    double *lat = calloc((size_t)n, sizeof(double));
    int got = 0;
    for (int i = 0; i < n; i++) {
        cp_capture cap;
        memset(&cap, 0, sizeof(cap));
        snprintf(cap.id, sizeof(cap.id), "lat-%d", i);
        snprintf(cap.tenant, sizeof(cap.tenant), "default");
        cap.selector = "{service=\"capbench\",isolate=\"alpha\"}";
        cap.kind = CP_KIND_CPU;
        cap.cpu_hz = 1000;
        int64_t t0 = now_ns();
        cap.start_ns = t0;
        cap.end_ns = t0 + 60 * (int64_t)1000000000;
        produce(p, &cap);
        int64_t first = 0;
        for (int k = 0; k < 100 && !first; k++) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
            if (!m) continue;
            cp_envelope e;
            cp_err ee;
            if (!m->err && cp_envelope_decode(m->payload, m->len, 64 << 20, &e, &ee) == 0) {
                const char *id = cp_labels_get(&e.labels, CP_CAPTURE_LABEL);
                if (id && !strcmp(id, cap.id)) first = e.window_start_ns;
                cp_envelope_close(&e);
            }
            rd_kafka_message_destroy(m);
        }
        cap.cancelled = 1;
        produce(p, &cap);
        if (!first) {
            fprintf(stderr, "capture %d: no capture envelope within 10 s\n", i);
            continue;
        }
        lat[got++] = (first - t0) / 1e6;
        fprintf(stderr, "capture %d: %.1f ms\n", i, (first - t0) / 1e6);
        usleep(300000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (!got) die("no capture was heard");
    qsort(lat, (size_t)got, sizeof(double), cmp_double);
    int p99 = (int)(0.99 * (got - 1) + 0.5);
    printf("capture_to_boost_ms_median | %.1f | 2000 | %s\n", lat[got / 2],
           lat[got / 2] <= 2000 ? "ok" : "over");
    printf("capture_to_boost_ms_p99 | %.1f | 2000 | %s\n", lat[p99],
           lat[p99] <= 2000 ? "ok" : "over");
    printf("captures_heard | %d of %d\n", got, n);
    rd_kafka_destroy(c);
    rd_kafka_destroy(p);
    free(lat);
    return 0;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static int poll_cost(const char *url, int n, int gap_ms)
{
    double t0 = cpu_s();
    for (int i = 0; i < n; i++) {
        if (gap_ms) usleep((useconds_t)gap_ms * 1000);
        cp_http_result r;
        cp_err err;
        if (cp_http_get(url, "/api/v1/control/captures", NULL, CP_WATCH_HTTP_TIMEOUT_MS, 1u << 20,
                        &r, &err) != 0 ||
            r.status != 200)
            die("poll failed");
        cp_buf_close(&r.body);
    }
    double us = (cpu_s() - t0) / n * 1e6;
    printf("watch_poll_cpu_us_per_poll%s | %.1f\n", gap_ms ? "_spaced" : "", us);
    printf("watch_poll%s_cpu_percent_of_a_core_at_interval | %.4f | 0.05 | %s\n",
           gap_ms ? "_spaced" : "", us / CP_WATCH_POLL_MS / 10,
           us / CP_WATCH_POLL_MS / 10 <= 0.05 ? "ok" : "over");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "pollcost"))
        return poll_cost(argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 0);
    if (argc < 5) {
        fprintf(stderr, "usage: capbench cost LIB CPCAP PAIRS SECS | idle LIB CPCAP PAIRS | "
                        "latency LIB CPCAP N\n");
        return 2;
    }
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    rd_kafka_mock_cluster_t *mc = host ? rd_kafka_mock_cluster_new(host, 1) : NULL;
    if (!mc) die("mock cluster");
    rd_kafka_mock_topic_create(mc, "contprof.profiles", 4, 1);
    rd_kafka_mock_topic_create(mc, CP_TOPIC_CONTROL, 1, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    int rc = !strcmp(argv[1], "idle") ? idle_cost(argv[2], boot, atoi(argv[4]))
             : !strcmp(argv[1], "cost") && argc >= 6
                 ? cost(argv[2], argv[3], boot, atoi(argv[4]), argv[5])
             : !strcmp(argv[1], "latency") ? latency(argv[2], argv[3], boot, atoi(argv[4]))
                                           : 2;
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
    return rc;
}
