/* On-demand captures, the agent's side (issue 29): librdkafka's mock cluster runs in this
 * process with topics contprof.profiles and contprof.control; the test writes Capture
 * messages to the control topic itself (cp_capture_encode, a librdkafka producer), runs
 * real programs under the agent (cpcap: threads alpha and beta burning CPU or allocating)
 * and reads their envelopes back. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "fake_contprofd.h"
#include "envelope.h"
#include "pprof.h"
#include "test.h"

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static rd_kafka_t *mock_host(void)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    CHECK(host != NULL);
    return host;
}

static rd_kafka_mock_cluster_t *mock_cluster(rd_kafka_t *host, int with_control)
{
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(host, 1);
    CHECK(mc != NULL);
    CHECK(rd_kafka_mock_topic_create(mc, "contprof.profiles", 4, 1) == 0);
    if (with_control) CHECK(rd_kafka_mock_topic_create(mc, CP_TOPIC_CONTROL, 1, 1) == 0);
    return mc;
}

/* Writes capture c (signed with token if not NULL) to the control topic, as contprofd
 * does: partition 0, key = id. */
static void send_capture(const char *boot, const cp_capture *c, const char *token)
{
    cp_buf b = {0};
    CHECK(cp_capture_encode(c, token, &b) == 0);
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(conf, "bootstrap.servers", boot, err, sizeof(err)) == 0);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    CHECK(p != NULL);
    CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(CP_TOPIC_CONTROL), RD_KAFKA_V_PARTITION(0),
                            RD_KAFKA_V_KEY(c->id, strlen(c->id)), RD_KAFKA_V_VALUE(b.data, b.len),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR);
    CHECK(rd_kafka_flush(p, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_destroy(p);
    cp_buf_close(&b);
}

static cp_capture cpu_capture(const char *id, const char *selector, int hz, double secs)
{
    cp_capture c;
    memset(&c, 0, sizeof(c));
    snprintf(c.id, sizeof(c.id), "%s", id);
    snprintf(c.tenant, sizeof(c.tenant), "default");
    c.selector = (char *)selector;
    c.kind = CP_KIND_CPU;
    c.cpu_hz = (uint32_t)hz;
    c.start_ns = now_ns();
    c.end_ns = c.start_ns + (int64_t)(secs * 1e9);
    return c;
}

/* A program under the agent: cpcap MODE SECS with labels proc=PROC; its stdout (the
 * workload's own account) goes to a pipe read by finish(). */
typedef struct proc {
    pid_t pid;
    int out;
} proc;

static proc start_exe(const char *exe, const char *boot, const char *procname, const char *mode,
                      const char *secs, const char *token, const char *extra_env)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (strcmp(exe, CPCAP) == 0)
            setenv("LD_PRELOAD", CP_LIB, 1); /* cpcap_iso links the library */
        else
            unsetenv("LD_PRELOAD");
        setenv("CONTPROF_BROKERS", boot, 1);
        setenv("CONTPROF_WINDOW", "1s", 1);
        setenv("CONTPROF_SERVICE", "capsvc", 1);
        char labels[64];
        snprintf(labels, sizeof(labels), "proc=%s", procname);
        setenv("CONTPROF_LABELS", labels, 1);
        unsetenv("CONTPROF_OUTPUT_DIR");
        unsetenv("CONTPROF_CPU_HZ");
        unsetenv("CONTPROF_CAPTURES");
        if (token)
            setenv("CONTPROF_TOKEN", token, 1);
        else
            unsetenv("CONTPROF_TOKEN");
        if (extra_env) putenv((char *)extra_env);
        if (mode)
            execl(exe, exe, mode, secs, (char *)NULL);
        else
            execl(exe, exe, secs, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    return (proc){pid, fds[0]};
}

static proc start(const char *boot, const char *procname, const char *mode, const char *secs,
                  const char *token, const char *extra_env)
{
    return start_exe(CPCAP, boot, procname, mode, secs, token, extra_env);
}

typedef struct truth {
    long long alpha_cpu, beta_cpu;
    unsigned long long alpha_bytes, beta_bytes;
} truth;

static void finish_raw(proc p, char *buf, size_t cap)
{
    ssize_t n, off = 0;
    while ((n = read(p.out, buf + off, cap - 1 - (size_t)off)) > 0)
        off += n;
    buf[off] = 0;
    close(p.out);
    int st;
    CHECK(waitpid(p.pid, &st, 0) == p.pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static truth finish(proc p)
{
    char buf[512];
    ssize_t n, off = 0;
    while ((n = read(p.out, buf + off, sizeof(buf) - 1 - (size_t)off)) > 0)
        off += n;
    buf[off] = 0;
    close(p.out);
    int st;
    CHECK(waitpid(p.pid, &st, 0) == p.pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    truth t = {0};
    CHECK(sscanf(buf, "alpha_cpu_ns=%lld beta_cpu_ns=%lld alpha_bytes=%llu beta_bytes=%llu",
                 &t.alpha_cpu, &t.beta_cpu, &t.alpha_bytes, &t.beta_bytes) == 4);
    return t;
}

/* One envelope as read back. */
typedef struct rec {
    char proc[16], iso[32], capture[80], engine[256];
    int kind;
    int64_t samples, value, period, dur;
    int has_alpha, has_beta; /* function names burn_/alloc_alpha, _beta */
} rec;

#define MAXREC 4096
static rec R[MAXREC];
static int NR;

static void collect(const char *boot)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof(err)) == 0);
    CHECK(rd_kafka_conf_set(c, "group.id", "captest", err, sizeof(err)) == 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof(err));
    CHECK(rk != NULL);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    for (int p = 0; p < 4; p++)
        rd_kafka_topic_partition_list_add(l, "contprof.profiles", p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    CHECK(rd_kafka_assign(rk, l) == 0);
    rd_kafka_topic_partition_list_destroy(l);
    NR = 0;
    for (int idle = 0; idle < 30;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) {
            idle++;
            continue;
        }
        idle = 0;
        if (m->err || NR == MAXREC) {
            rd_kafka_message_destroy(m);
            continue;
        }
        cp_envelope e;
        cp_err ee = {0};
        CHECK(cp_envelope_decode(m->payload, m->len, 64 << 20, &e, &ee) == 0);
        rec *r = &R[NR++];
        memset(r, 0, sizeof(*r));
        const char *v;
        snprintf(r->proc, sizeof(r->proc), "%s", (v = cp_labels_get(&e.labels, "proc")) ? v : "");
        snprintf(r->iso, sizeof(r->iso), "%s", cp_labels_get(&e.labels, "isolate"));
        snprintf(r->capture, sizeof(r->capture), "%s",
                 (v = cp_labels_get(&e.labels, CP_CAPTURE_LABEL)) ? v : "");
        snprintf(r->engine, sizeof(r->engine), "%s", e.engine ? e.engine : "");
        r->kind = e.kind;
        r->dur = e.window_duration_ns;
        cp_profile *p;
        CHECK(cp_pprof_decode(e.pprof, e.pprof_len, NULL, &p, &ee) == 0);
        r->samples = cp_profile_total(p, 0);
        r->value = cp_profile_total(p, 1);
        r->period = p->period;
        for (uint32_t i = 0; i < p->functions.n; i++) {
            const char *fn = cp_profile_str(p, p->functions.v[i].name);
            if (strstr(fn, "_alpha") || strstr(fn, "_js_a")) r->has_alpha = 1;
            if (strstr(fn, "_beta") || strstr(fn, "_js_b")) r->has_beta = 1;
        }
        cp_profile_destroy(p);
        cp_envelope_close(&e);
        rd_kafka_message_destroy(m);
    }
    rd_kafka_destroy(rk);
}

/* Totals over the envelopes read back that match: proc, isolate, kind, and capture ("" for
 * the always-on ones, NULL for any capture). */
static void totals(const char *procname, const char *iso, int kind, const char *capture,
                   int64_t *samples, int64_t *value, int *n)
{
    *samples = *value = 0;
    *n = 0;
    for (int i = 0; i < NR; i++) {
        rec *r = &R[i];
        if (strcmp(r->proc, procname) || strcmp(r->iso, iso) || r->kind != kind) continue;
        if (capture ? strcmp(r->capture, capture) != 0 : !r->capture[0]) continue;
        *samples += r->samples;
        *value += r->value;
        (*n)++;
    }
}

static int count_captures(void)
{
    int n = 0;
    for (int i = 0; i < NR; i++)
        if (R[i].capture[0]) {
            printf("capture envelope: %s %s %s %lld samples, %lld ns\n", R[i].capture, R[i].proc,
                   R[i].iso, (long long)R[i].samples, (long long)R[i].dur);
            n++;
        }
    return n;
}

/* Samples per CPU-second of the always-on windows of proc's isolate: the agent's 100 Hz. */
static double always_on_rate(const char *procname, const char *iso, int64_t *cpu)
{
    int64_t s, v;
    int n;
    totals(procname, iso, CP_KIND_CPU, "", &s, &v, &n);
    *cpu = v;
    return v > 0 ? s / (v / 1e9) : 0;
}

/* ------------------------------------------------------------------------------------ */

/* A 1 kHz capture of isolate alpha of process a, written before either process starts
 * (so it is running when they start: picked up from the topic's tail). Process a's alpha
 * is sampled at ~1000 per CPU-second into envelopes labelled capture=<id> holding only
 * alpha's frames; its always-on windows keep 100 Hz and its CPU seconds; a's beta and all
 * of process b (same service, label proc=b) keep their rate and get no capture. */
TEST(cpu_capture_boosts_only_the_matched_isolate)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    cp_capture c =
        cpu_capture("cap-1khz", "{service=\"capsvc\",proc=\"a\",isolate=\"alpha\"}", 1000, 120);
    send_capture(boot, &c, NULL);

    proc pa = start(boot, "a", "cpu", "3", NULL, NULL);
    proc pb = start(boot, "b", "cpu", "3", NULL, NULL);
    truth ta = finish(pa), tb = finish(pb);
    collect(boot);

    int64_t cs, cv;
    int cn;
    totals("a", "alpha", CP_KIND_CPU, "cap-1khz", &cs, &cv, &cn);
    double cap_rate = cv > 0 ? cs / (cv / 1e9) : 0;
    int64_t a_alpha_cpu, a_beta_cpu, b_alpha_cpu, b_beta_cpu;
    double ra = always_on_rate("a", "alpha", &a_alpha_cpu);
    double rb = always_on_rate("a", "beta", &a_beta_cpu);
    double rba = always_on_rate("b", "alpha", &b_alpha_cpu);
    double rbb = always_on_rate("b", "beta", &b_beta_cpu);
    printf("capture: %d envelopes, %lld samples over %.3f CPU-s = %.0f/s; real alpha %.3f s\n", cn,
           (long long)cs, cv / 1e9, cap_rate, ta.alpha_cpu / 1e9);
    printf("always-on a.alpha %.3f s (%.0f/s), a.beta %.3f s (%.0f/s) real %.3f; b.alpha %.3f s "
           "(%.0f/s) b.beta %.3f s (%.0f/s) real %.3f %.3f\n",
           a_alpha_cpu / 1e9, ra, a_beta_cpu / 1e9, rb, ta.beta_cpu / 1e9, b_alpha_cpu / 1e9, rba,
           b_beta_cpu / 1e9, rbb, tb.alpha_cpu / 1e9, tb.beta_cpu / 1e9);

    CHECK(cn >= 2);
    /* most of alpha's CPU is in the capture (it is heard within ~1 s of the start) */
    CHECK(cv > ta.alpha_cpu / 2);
    CHECK(cap_rate > 850 && cap_rate < 1100);
    int others = 0;
    for (int i = 0; i < NR; i++) {
        rec *r = &R[i];
        if (!r->capture[0]) continue;
        if (strcmp(r->capture, "cap-1khz") || strcmp(r->proc, "a") || strcmp(r->iso, "alpha") ||
            r->kind != CP_KIND_CPU) {
            others++;
            continue;
        }
        CHECK(r->has_alpha && !r->has_beta); /* only the isolate's frames */
        /* windows of ~1 s: cut at the first agent tick past 1 s, later when the machine is
         * loaded (1.2 s was passed once in CI) */
        CHECK(r->dur > 0 && r->dur <= 2000000000LL);
        CHECK_EQ(r->period, 1000000);
        CHECK(strstr(r->engine, " capture asked=1000 ran=1000") != NULL);
        CHECK(strstr(r->engine, "reason=") == NULL);
    }
    CHECK_EQ(others, 0);
    /* the always-on CPU seconds are the real ones, at the usual rate */
    CHECK(fabs((double)a_alpha_cpu - (double)ta.alpha_cpu) < 0.12 * (double)ta.alpha_cpu);
    CHECK(fabs((double)a_beta_cpu - (double)ta.beta_cpu) < 0.12 * (double)ta.beta_cpu);
    CHECK(fabs((double)b_alpha_cpu - (double)tb.alpha_cpu) < 0.12 * (double)tb.alpha_cpu);
    CHECK(ra > 40 && ra < 130);
    CHECK(rb > 40 && rb < 130);
    CHECK(rba > 40 && rba < 130);
    CHECK(rbb > 40 && rbb < 130);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* Captures the agent must not run: another tenant's, one already over, one signed with
 * another token (the agent holds one), one cancelled. A capture signed with the agent's
 * token, of beta, runs: the agent did read the topic. */
TEST(captures_not_for_this_agent_do_not_boost)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    const char *sel = "{service=\"capsvc\",isolate=\"alpha\"}";
    cp_capture other = cpu_capture("other-tenant", sel, 1000, 120);
    snprintf(other.tenant, sizeof(other.tenant), "acme");
    send_capture(boot, &other, "s3cret");
    cp_capture old = cpu_capture("expired", sel, 1000, 120);
    old.start_ns -= 300 * (int64_t)1000000000;
    old.end_ns = old.start_ns + 60 * (int64_t)1000000000;
    send_capture(boot, &old, "s3cret");
    cp_capture forged = cpu_capture("forged", sel, 1000, 120);
    send_capture(boot, &forged, "not-the-token");
    cp_capture unsigned_ = cpu_capture("unsigned", sel, 1000, 120);
    send_capture(boot, &unsigned_, NULL);
    cp_capture cancelled = cpu_capture("cancelled", sel, 1000, 120);
    send_capture(boot, &cancelled, "s3cret");
    cancelled.cancelled = 1;
    send_capture(boot, &cancelled, "s3cret");
    cp_capture good = cpu_capture("good-beta", "{service=\"capsvc\",isolate=\"beta\"}", 500, 120);
    send_capture(boot, &good, "s3cret");

    /* 4 s: the capture is heard only once the agent's consumer is up (a few hundred ms to
     * a second under load), and the samples before the boost count at the agent's rate */
    proc pa = start(boot, "a", "cpu", "4", "s3cret", NULL);
    truth ta = finish(pa);
    collect(boot);
    int64_t cs, cv, a_alpha_cpu;
    int cn;
    totals("a", "beta", CP_KIND_CPU, "good-beta", &cs, &cv, &cn);
    double ra = always_on_rate("a", "alpha", &a_alpha_cpu);
    printf("captures seen: %d envelopes (good-beta %d, %.0f/s); alpha %.0f/s, %.3f s of %.3f\n",
           count_captures(), cn, cv > 0 ? cs / (cv / 1e9) : 0, ra, a_alpha_cpu / 1e9,
           ta.alpha_cpu / 1e9);
    CHECK(cn >= 1);
    CHECK(cs / (cv / 1e9) > 300 && cs / (cv / 1e9) < 560); /* boosted, from 100/s */
    /* no other capture ran, but "cancelled": its message and its cancel may reach the
     * consumer in two fetches, and then it runs from one agent tick to the next (its one
     * window is short); the others never run */
    int xn = 0;
    int64_t xdur = 0;
    for (int i = 0; i < NR; i++)
        if (!strcmp(R[i].capture, "cancelled")) {
            xn++;
            xdur += R[i].dur;
        }
    CHECK_EQ(count_captures(), cn + xn);
    CHECK(xn <= 1 && xdur < 500 * (int64_t)1000000);
    CHECK(ra > 40 && ra < 130);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* A capture written while the process runs is heard and boosts within ~2 s; cancelled
 * mid-way, it stops: its last window ends soon after the cancel. */
TEST(capture_heard_while_running_and_cancelled)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    proc pa = start(boot, "a", "cpu", "5", NULL, NULL);
    sleep(1);
    cp_capture c = cpu_capture("live", "{isolate=\"alpha\"}", 1000, 120);
    send_capture(boot, &c, NULL);
    int64_t sent = now_ns();
    sleep(2);
    c.cancelled = 1;
    send_capture(boot, &c, NULL);
    int64_t cancelled = now_ns();
    truth ta = finish(pa);
    collect(boot);
    int64_t cs, cv;
    int cn;
    totals("a", "alpha", CP_KIND_CPU, "live", &cs, &cv, &cn);
    printf("live capture: %d envelopes, %.3f CPU-s of alpha's %.3f (sent %.1f s before cancel)\n",
           cn, cv / 1e9, ta.alpha_cpu / 1e9, (cancelled - sent) / 1e9);
    CHECK(cn >= 1);
    /* heard within ~2 s of 2 s; over soon after the cancel (alpha burns ~1 CPU-s a second
     * when it has a core; the machine is shared, so only bounds) */
    CHECK(cv > 100000000LL);
    CHECK(cv < (int64_t)((cancelled - sent) + 1500000000LL));
    CHECK(cv < ta.alpha_cpu * 3 / 4);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* A capture of 1.5 s written as the process starts ends at its end_ns: alpha is back at
 * the agent's rate after it, and the capture holds at most ~1.5 s of alpha's CPU. */
TEST(capture_ends_at_its_end)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    /* 3 s from the send: a process started after it hears it 0.5 to 1.5 s in (its first
     * tick and the consumer's start; a 1.5 s capture could end unheard under load), and
     * burns 6 s: the capture's CPU must stop well before the process does */
    cp_capture c = cpu_capture("short", "{isolate=\"alpha\"}", 1000, 3);
    send_capture(boot, &c, NULL);
    proc pa = start(boot, "a", "cpu", "6", NULL, NULL);
    truth ta = finish(pa);
    collect(boot);
    int64_t cs, cv, on;
    int cn;
    totals("a", "alpha", CP_KIND_CPU, "short", &cs, &cv, &cn);
    double ra = always_on_rate("a", "alpha", &on);
    printf("short capture: %d envelopes, %.3f CPU-s at %.0f/s; alpha always-on %.3f s of %.3f "
           "(%.0f/s)\n",
           cn, cv / 1e9, cv > 0 ? cs / (cv / 1e9) : 0, on / 1e9, ta.alpha_cpu / 1e9, ra);
    CHECK(cn >= 1);
    CHECK(cv > 0 && cv < 3300000000LL); /* at most the capture's 3 s of alpha's 6 */
    CHECK(fabs((double)on - (double)ta.alpha_cpu) < 0.12 * (double)ta.alpha_cpu);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* An allocation capture: alpha's allocations are sampled every 32 KiB on average instead of
 * 512 KiB; the always-on alloc totals stay unbiased. */
TEST(alloc_capture_raises_the_allocation_rate)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    cp_capture c = cpu_capture("alloc-1", "{proc=\"a\",isolate=\"alpha\"}", 1, 120);
    c.kind = CP_KIND_ALLOC;
    c.cpu_hz = 0;
    c.alloc_rate = 32768;
    send_capture(boot, &c, NULL);
    proc pa = start(boot, "a", "alloc", "4", NULL, NULL); /* 4 s: as in the tenant test */
    truth ta = finish(pa);
    collect(boot);
    int64_t cs, cv, as, av, bs, bv;
    int cn, an, bn;
    totals("a", "alpha", CP_KIND_ALLOC, "alloc-1", &cs, &cv, &cn);
    totals("a", "alpha", CP_KIND_ALLOC, "", &as, &av, &an);
    totals("a", "beta", CP_KIND_ALLOC, "", &bs, &bv, &bn);
    printf("alloc capture: %d envelopes, %.1f MB (objects %lld); always-on alpha %.1f MB, beta "
           "%.1f MB; real %.1f MB, %.1f MB\n",
           cn, cv / 1e6, (long long)cs, av / 1e6, bv / 1e6, ta.alpha_bytes / 1e6,
           ta.beta_bytes / 1e6);
    CHECK(cn >= 1);
    for (int i = 0; i < NR; i++)
        if (R[i].capture[0]) {
            CHECK_EQ(R[i].period, 32768);
            CHECK(strstr(R[i].engine, " capture asked=32768 ran=32768") != NULL);
            CHECK(R[i].has_alpha && !R[i].has_beta);
        }
    /* the capture covers alpha from when it was heard (0.3 to 1.2 s in, seen under load)
     * to the end; the always-on totals are the real volume, unbiased */
    CHECK(cv > 0.4 * (double)ta.alpha_bytes && cv < 1.05 * (double)ta.alpha_bytes);
    CHECK(fabs((double)av - (double)ta.alpha_bytes) < 0.25 * (double)ta.alpha_bytes);
    CHECK(fabs((double)bv - (double)ta.beta_bytes) < 0.25 * (double)ta.beta_bytes);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* API isolates (contprof_isolate_create/enter): one thread switches between js-a and
 * js-b every 30 ms; a 1 kHz capture of js-a boosts the thread while it keeps running js-a
 * and takes only js-a's samples; both isolates' always-on CPU seconds stay the real ones. */
TEST(api_isolate_capture)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    cp_capture c = cpu_capture("js-a-1khz", "{app=\"shop\"}", 1000, 120);
    send_capture(boot, &c, NULL);
    proc p = start_exe(CPCAP_ISO, boot, "a", NULL, "2", NULL, NULL);
    char buf[256];
    finish_raw(p, buf, sizeof(buf));
    long long a_cpu = 0, b_cpu = 0;
    CHECK(sscanf(buf, "a_cpu_ns=%lld b_cpu_ns=%lld", &a_cpu, &b_cpu) == 2);
    collect(boot);
    int64_t cs, cv, on_a, on_b;
    int cn;
    totals("a", "js-a", CP_KIND_CPU, "js-a-1khz", &cs, &cv, &cn);
    double ra = always_on_rate("a", "js-a", &on_a), rb = always_on_rate("a", "js-b", &on_b);
    printf("api capture: %d envelopes, %lld samples over %.3f CPU-s = %.0f/s of js-a's %.3f s; "
           "always-on js-a %.3f s (%.0f/s), js-b %.3f s (%.0f/s) of %.3f s\n",
           cn, (long long)cs, cv / 1e9, cv > 0 ? cs / (cv / 1e9) : 0, a_cpu / 1e9, on_a / 1e9, ra,
           on_b / 1e9, rb, b_cpu / 1e9);
    CHECK(cn >= 1);
    CHECK_EQ(count_captures(), cn);
    CHECK(cv > a_cpu / 2);
    CHECK(cs / (cv / 1e9) > 850 && cs / (cv / 1e9) < 1100);
    for (int i = 0; i < NR; i++)
        if (R[i].capture[0]) CHECK(R[i].has_alpha && !R[i].has_beta);
    CHECK(fabs((double)on_a - (double)a_cpu) < 0.12 * (double)a_cpu);
    CHECK(fabs((double)on_b - (double)b_cpu) < 0.12 * (double)b_cpu);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* A host that takes SIGPROF itself (a handler and ITIMER_PROF, or a POSIX timer on it)
 * while a 1 kHz capture of all its threads runs: the agent moves aside with its boosted
 * events, the host gets only its own signals (cph exits 1.. otherwise), the capture goes on. */
static void host_sigprof_case(const char *how)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    cp_capture c = cpu_capture("all-1khz", "{service=\"capsvc\"}", 1000, 120);
    send_capture(boot, &c, NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        setenv("LD_PRELOAD", CP_LIB, 1);
        setenv("CONTPROF_BROKERS", boot, 1);
        setenv("CONTPROF_WINDOW", "1s", 1);
        setenv("CONTPROF_SERVICE", "capsvc", 1);
        setenv("CONTPROF_LABELS", "proc=h", 1);
        unsetenv("CONTPROF_OUTPUT_DIR");
        execl(CPH, CPH, "sigprof", how, "3", (char *)NULL);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    collect(boot);
    int64_t cs = 0, cv = 0;
    for (int i = 0; i < NR; i++)
        if (!strcmp(R[i].capture, "all-1khz") && R[i].kind == CP_KIND_CPU) {
            cs += R[i].samples;
            cv += R[i].value;
        }
    printf("host sigprof (%s): exit %d; capture %lld samples over %.3f CPU-s = %.0f/s\n", how,
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, (long long)cs, cv / 1e9,
           cv > 0 ? cs / (cv / 1e9) : 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* no foreign signal reached the host */
    CHECK(cv > 1000000000LL);
    CHECK(cs / (cv / 1e9) > 700 && cs / (cv / 1e9) < 1100);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

TEST(host_sigprof_itimer_during_capture)
{
    host_sigprof_case("sigaction");
}

TEST(host_sigprof_timer_during_capture)
{
    host_sigprof_case("timer");
}

/* No control topic on the cluster, then CONTPROF_CAPTURES=0: the program runs and its
 * windows arrive as ever. */
TEST(missing_control_topic_and_captures_off)
{
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 0);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    proc pa = start(boot, "a", "cpu", "1", NULL, NULL);
    proc pb = start(boot, "b", "cpu", "1", NULL, "CONTPROF_CAPTURES=0");
    truth ta = finish(pa), tb = finish(pb);
    collect(boot);
    int64_t a_cpu, b_cpu;
    double ra = always_on_rate("a", "alpha", &a_cpu), rb = always_on_rate("b", "alpha", &b_cpu);
    printf("no control topic: a.alpha %.3f s (%.0f/s) of %.3f; off: b.alpha %.3f s of %.3f\n",
           a_cpu / 1e9, ra, ta.alpha_cpu / 1e9, b_cpu / 1e9, tb.alpha_cpu / 1e9);
    CHECK(fabs((double)a_cpu - (double)ta.alpha_cpu) < 0.12 * (double)ta.alpha_cpu);
    CHECK(fabs((double)b_cpu - (double)tb.alpha_cpu) < 0.12 * (double)tb.alpha_cpu);
    CHECK(ra > 40 && ra < 130);
    CHECK(rb > 40 && rb < 130);
    CHECK_EQ(count_captures(), 0);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

/* With CONTPROF_SERVER the agent polls the server for captures instead of the topic
 * (collector/watch.h): a server without the path (404, an older contprofd) sends it to the
 * topic, where it hears the capture; a server answering a malformed list is asked again
 * and again, and the topic's capture is not heard (the poller alone listens). */
static void server_case(int status, const char *body, size_t len, int heard)
{
    fake_contprofd f;
    fake_contprofd_start(&f, "unused:1");
    fake_contprofd_control(&f, status, body, len, 0);
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    static char env[96];
    snprintf(env, sizeof env, "CONTPROF_SERVER=%s", f.url);
    cp_capture c = cpu_capture("polled", "{isolate=\"alpha\"}", 1000, 120);
    send_capture(boot, &c, NULL);
    proc pa = start(boot, "a", "cpu", "4", NULL, env);
    truth ta = finish(pa);
    collect(boot);
    int asked = fake_contprofd_control(&f, status, body, len, 0);
    fake_contprofd_stop(&f);
    int64_t cs, cv;
    int cn;
    totals("a", "alpha", CP_KIND_CPU, "polled", &cs, &cv, &cn);
    printf("server answering %d: asked %d times; capture %d envelopes, %.3f CPU-s of "
           "alpha's %.3f\n",
           status, asked, cn, cv / 1e9, ta.alpha_cpu / 1e9);
    CHECK(asked >= 1);
    if (heard) {
        CHECK(cn >= 1);
        CHECK(cv > 200000000LL);
    } else {
        CHECK_EQ(cn, 0);
        CHECK(asked >= 2); /* asked again after the malformed answer */
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

TEST(older_server_sends_the_agent_to_the_topic)
{
    server_case(0, NULL, 0, 1); /* 404 */
}

TEST(malformed_capture_list_is_not_heard)
{
    static const char bad[] = "\0\0\1\0abc"; /* a length past the end */
    server_case(200, bad, sizeof bad - 1, 0);
}

/* A polled server lists running captures only (issue 36): one that leaves the list (its
 * record cancelled or ended there) is over for the agent, as a cancel message on the topic
 * ends it. The capture is served for ~2 s of a 5 s run, then the answer is empty. */
TEST(polled_capture_that_leaves_the_list_ends)
{
    fake_contprofd f;
    fake_contprofd_start(&f, "unused:1");
    cp_capture c = cpu_capture("listed", "{isolate=\"alpha\"}", 1000, 120);
    cp_buf list = {0};
    CHECK(cp_capture_feed_append(&list, &c, NULL) == 0);
    fake_contprofd_control(&f, 200, list.data, list.len, 0);
    rd_kafka_t *host = mock_host();
    rd_kafka_mock_cluster_t *mc = mock_cluster(host, 1);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    static char env[96];
    snprintf(env, sizeof env, "CONTPROF_SERVER=%s", f.url);
    proc pa = start(boot, "a", "cpu", "5", NULL, env);
    int64_t listed = now_ns();
    sleep(2);
    fake_contprofd_control(&f, 200, list.data, 0, 0);
    int64_t left = now_ns();
    truth ta = finish(pa);
    collect(boot);
    fake_contprofd_stop(&f);
    cp_buf_close(&list);
    int64_t cs, cv;
    int cn;
    totals("a", "alpha", CP_KIND_CPU, "listed", &cs, &cv, &cn);
    printf("listed capture: %d envelopes, %.3f CPU-s of alpha's %.3f (listed %.1f s)\n", cn,
           cv / 1e9, ta.alpha_cpu / 1e9, (left - listed) / 1e9);
    CHECK(cn >= 1);
    CHECK(cv < (int64_t)((left - listed) + 1500000000LL));
    CHECK(cv < ta.alpha_cpu * 3 / 4);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
}

TEST_MAIN(T(cpu_capture_boosts_only_the_matched_isolate),
          T(captures_not_for_this_agent_do_not_boost), T(capture_heard_while_running_and_cancelled),
          T(capture_ends_at_its_end), T(alloc_capture_raises_the_allocation_rate),
          T(api_isolate_capture), T(host_sigprof_itimer_during_capture),
          T(host_sigprof_timer_during_capture), T(missing_control_topic_and_captures_off),
          T(older_server_sends_the_agent_to_the_topic), T(malformed_capture_list_is_not_heard),
          T(polled_capture_that_leaves_the_list_ends))
