/* Delivery through contprofd's embedded broker, black-box: the real contprofd (its mock
 * cluster, ingest, store and HTTP API) and the real `contprof import`. Exit 0 of import must
 * mean stored: a 360-window burst of one series right after start is stored whole (totals
 * checked against `go tool pprof`); a 7.6 MB profile is refused by name and limit and the
 * next window is stored; a bad message too large for the DLQ goes there truncated, with
 * headers saying so, and the next window is stored; what the broker drops unread (a
 * fire-and-forget burst while the consumer joins) is counted by partition and logged. */
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "http_client.h"
#include "envelope.h"
#include "pprof.h"
#include "proc.h"

#define CP_TOPIC_PROFILES_ "contprof.profiles"
#define CP_TOPIC_DLQ_ "contprof.profiles.dlq"

/* ---- processes and files (the generic helpers are in tests/proc.h) ------------------- */

/* The whole file at path, NUL-terminated and malloc'd; "" if it cannot be read. */
static char *slurp_alloc(const char *path)
{
    cp_buf b = {0};
    if (cp_read_file(path, &b, NULL)) return strdup("");
    CHECK(cp_buf_append(&b, "", 1) == 0);
    return (char *)b.data;
}

static char *mkdir_tmp(const char *what)
{
    return proc_tmpdir("delivery", what);
}

static void rmtree(const char *d)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    CHECK(system(cmd) == 0);
}

typedef struct daemon {
    proc p;
    char url[64];
} daemon_t;

/* Starts contprofd with its embedded broker on dir/data and returns once its port is known
 * (the broker and the consumer may still be starting: that is the point). */
static void daemon_start(daemon_t *d, const char *dir)
{
    char data[512], log[600];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/contprofd.log", dir);
    const char *args[] = {"--data", data, "--http", "127.0.0.1:0", NULL};
    start_daemon_log(&d->p, log, args, 30);
    snprintf(d->url, sizeof d->url, "http://127.0.0.1:%d", d->p.port);
}

static void daemon_stop(daemon_t *d)
{
    CHECK_EQ(stop_daemon_within(&d->p, SIGTERM, 120), 0);
}

/* Runs `contprof import --server URL ARGS` (ARGS may hold shell globs); returns its exit
 * status, its stderr in *out (malloc'd). */
static int import(const daemon_t *d, const char *dir, const char *args, char **out)
{
    char cmd[4096], err[600];
    snprintf(err, sizeof err, "%s/import.err", dir);
    snprintf(cmd, sizeof cmd, "'%s/query/contprof' import --server %s %s 2>'%s'", bindir(), d->url,
             args, err);
    int st = system(cmd);
    *out = slurp_alloc(err);
    fprintf(stderr, "$ contprof import %s\n%s", args, *out);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* The value of one /metrics line ("name{labels}" exactly), or -1 when absent. */
static long long metric(const daemon_t *d, const char *name)
{
    return http_metric(d->p.port, name, NULL);
}

/* Sum of contprof_ingest_lost_total over partitions. */
static long long lost_total(const daemon_t *d)
{
    long long sum = 0;
    for (int p = 0; p < 4; p++) {
        char n[96];
        snprintf(n, sizeof n, "contprof_ingest_lost_total{partition=\"%d\"}", p);
        long long v = metric(d, n);
        sum += v > 0 ? v : 0; /* absent until the partition is assigned */
    }
    return sum;
}

/* The merged CPU profile of service svc over the last day, from the HTTP API. */
static cp_profile *query_cpu(const daemon_t *d, const char *svc)
{
    int64_t now = (int64_t)time(NULL);
    char pq[512];
    snprintf(pq, sizeof pq,
             "/api/v1/profile?format=pprof&type=cpu&from=%lld&to=%lld&select=%%7Bservice%%3D%%22%s"
             "%%22%%7D",
             (long long)(now - 86400), (long long)(now + 60), svc);
    cp_buf b = http_get_ok(d->p.port, pq, NULL);
    cp_profile *p = NULL;
    cp_err err = {0};
    if (cp_pprof_decode(b.data, b.len, NULL, &p, &err)) fprintf(stderr, "%s\n", err.msg);
    CHECK(p);
    cp_buf_close(&b);
    return p;
}

static void genwindows(const char *dir, int n, const char *extra)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s/bench/genwindows' '%s' %d %s", bindir(), dir, n, extra);
    proc_sh(cmd);
}

static void check_totals(const daemon_t *d, const char *svc, const char *files)
{
    int64_t want[4];
    CHECK_EQ(pprof_raw_totals(files, want, 4), 2);
    CHECK(want[0] > 0 && want[1] > 0);
    cp_profile *p = query_cpu(d, svc);
    CHECK_EQ(cp_profile_total(p, 0), want[0]);
    CHECK_EQ(cp_profile_total(p, 1), want[1]);
    cp_profile_destroy(p);
}

/* ---- tests -------------------------------------------------------------------------- */

TEST(burst_right_after_start_is_stored_whole)
{
    char *dir = mkdir_tmp("burst"), wdir[512], files[600];
    snprintf(wdir, sizeof wdir, "%s/w", dir);
    CHECK(mkdir(wdir, 0755) == 0);
    genwindows(wdir, 360, "");
    daemon_t d = {0};
    daemon_start(&d, dir);
    char *out;
    snprintf(files, sizeof files, "--service burst '%s'/*.pb.gz", wdir);
    CHECK_EQ(import(&d, dir, files, &out), 0);
    CHECK_CONTAINS(out, "360 of 360 window(s) from 360 file(s) stored");
    free(out);
    /* exit 0 meant stored: the totals are there without waiting */
    snprintf(files, sizeof files, "'%s'/*.pb.gz", wdir);
    check_totals(&d, "burst", files);
    CHECK_EQ(metric(&d, "contprof_ingest_windows_total"), 360);
    CHECK_EQ(lost_total(&d), 0);
    daemon_stop(&d);
    rmtree(dir);
    free(dir);
}

TEST(profile_too_large_is_refused_and_the_next_is_stored)
{
    char *dir = mkdir_tmp("big"), big[512], small[512], args[1600];
    snprintf(big, sizeof big, "%s/big", dir);
    snprintf(small, sizeof small, "%s/small", dir);
    CHECK(mkdir(big, 0755) == 0 && mkdir(small, 0755) == 0);
    genwindows(big, 1, "500000 500000"); /* about 7.6 MB gzip'd */
    genwindows(small, 1, "");
    struct stat st;
    snprintf(args, sizeof args, "%s/w00000.pb.gz", big);
    CHECK(stat(args, &st) == 0 && st.st_size > 7000000);
    daemon_t d = {0};
    daemon_start(&d, dir);
    char *out;
    snprintf(args, sizeof args, "--service big '%s/w00000.pb.gz' '%s/w00000.pb.gz'", big, small);
    CHECK_EQ(import(&d, dir, args, &out), 1);
    /* named: the file, and the limit */
    char name[600];
    snprintf(name, sizeof name, "%s/w00000.pb.gz: refused", big);
    CHECK_CONTAINS(out, name);
    CHECK_CONTAINS(out, "over the embedded broker's limit of 4.0 MiB per message");
    CHECK_CONTAINS(out, "1 of 1 window(s) from 2 file(s) stored");
    free(out);
    snprintf(args, sizeof args, "'%s/w00000.pb.gz'", small);
    check_totals(&d, "big", args);
    CHECK_EQ(lost_total(&d), 0);
    daemon_stop(&d);
    rmtree(dir);
    free(dir);
}

static rd_kafka_t *kafka(rd_kafka_type_t type, const char *brokers)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(c, "bootstrap.servers", brokers, es, sizeof es) == 0);
    if (type == RD_KAFKA_PRODUCER)
        CHECK(rd_kafka_conf_set(c, "message.max.bytes", "16777216", es, sizeof es) == 0);
    else
        CHECK(rd_kafka_conf_set(c, "group.id", "delivery-test", es, sizeof es) == 0);
    rd_kafka_t *rk = rd_kafka_new(type, c, es, sizeof es);
    CHECK(rk);
    return rk;
}

static const char *header(const rd_kafka_message_t *m, const char *name, char *out, size_t n)
{
    rd_kafka_headers_t *h = NULL;
    const void *v;
    size_t vl;
    out[0] = 0;
    if (!rd_kafka_message_headers(m, &h) && !rd_kafka_header_get_last(h, name, &v, &vl))
        snprintf(out, n, "%.*s", (int)vl, (const char *)v);
    return out;
}

/* Also: an agent's own drops, carried in its envelope, appear in /metrics by service; a
 * window the store refuses is reported by import as not stored. */
TEST(bad_message_too_large_for_the_dlq_goes_there_truncated)
{
    char *dir = mkdir_tmp("dlq"), wdir[512], args[700];
    snprintf(wdir, sizeof wdir, "%s/w", dir);
    CHECK(mkdir(wdir, 0755) == 0);
    genwindows(wdir, 2, "");
    daemon_t d = {0};
    daemon_start(&d, dir);
    /* a first window of the series, to learn its partition */
    char *out;
    snprintf(args, sizeof args, "--service afterdlq '%s/w00000.pb.gz'", wdir);
    CHECK_EQ(import(&d, dir, args, &out), 0);
    free(out);
    cp_buf b = http_get_ok(d.p.port, "/api/v1/ingest/offsets", NULL);
    const char *one = strstr((char *)b.data, ",\"stored\":1,");
    CHECK(one);
    while (one > (char *)b.data && strncmp(one, "{\"partition\":", 13))
        one--;
    int32_t part = atoi(one + 13);
    cp_buf_close(&b);
    /* the broker contprofd hosts */
    char brokers[256] = "";
    for (int64_t end = mono_ns() + 20 * SEC; !brokers[0] && mono_ns() < end; usleep(50000)) {
        cp_buf b = http_get_ok(d.p.port, "/api/v1/brokers", NULL);
        const char *q = strstr((char *)b.data, "\"brokers\":\"");
        if (q) snprintf(brokers, sizeof brokers, "%.*s", (int)strcspn(q + 11, "\""), q + 11);
        cp_buf_close(&b);
    }
    CHECK(brokers[0]);
    /* 2 MiB that are not an envelope, over the DLQ producer's 1 MB message.max.bytes, into
     * the series' partition */
    size_t big = 2u << 20;
    uint8_t *junk = malloc(big);
    for (size_t i = 0; i < big; i++)
        junk[i] = (uint8_t)(i * 2654435761u >> 13);
    rd_kafka_t *p = kafka(RD_KAFKA_PRODUCER, brokers);
    CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES_), RD_KAFKA_V_PARTITION(part),
                            RD_KAFKA_V_VALUE(junk, big), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_END) == 0);
    CHECK(rd_kafka_flush(p, 30000) == 0);
    rd_kafka_destroy(p);
    /* then the next window through import, which waits until it is stored */
    snprintf(args, sizeof args, "--service afterdlq '%s/w00001.pb.gz'", wdir);
    CHECK_EQ(import(&d, dir, args, &out), 0);
    free(out);
    snprintf(args, sizeof args, "'%s'/w*.pb.gz", wdir);
    check_totals(&d, "afterdlq", args);
    CHECK_EQ(metric(&d, "contprof_ingest_dlq_total{reason=\"envelope\"}"), 1);
    CHECK_EQ(metric(&d, "contprof_ingest_dlq_truncated_total"), 1);
    /* the offsets endpoint says offset 1 of the partition is not stored, and why */
    b = http_get_ok(d.p.port, "/api/v1/ingest/offsets", NULL);
    char want[160];
    snprintf(want, sizeof want,
             "{\"partition\":%d,\"stored\":3,\"known_from\":0,\"lost\":0,"
             "\"not_stored\":[{\"from\":1,\"to\":2,\"why\":\"dlq:envelope\"}]}",
             part);
    CHECK_CONTAINS((char *)b.data, want);
    cp_buf_close(&b);
    /* the DLQ holds a truncated copy with its original size and source */
    rd_kafka_t *c = kafka(RD_KAFKA_CONSUMER, brokers);
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(tl, CP_TOPIC_DLQ_, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    CHECK(rd_kafka_assign(c, tl) == 0);
    rd_kafka_topic_partition_list_destroy(tl);
    rd_kafka_message_t *m = NULL;
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end;) {
        m = rd_kafka_consumer_poll(c, 500);
        if (m && !m->err) break;
        if (m) rd_kafka_message_destroy(m);
        m = NULL;
    }
    CHECK(m);
    char h[128];
    CHECK_EQ(m->len, 64 << 10);
    CHECK(memcmp(m->payload, junk, m->len) == 0);
    CHECK_STREQ(header(m, "contprof-truncated", h, sizeof h), "true");
    CHECK_STREQ(header(m, "contprof-original-size", h, sizeof h), "2097152");
    snprintf(want, sizeof want, "%s/%d/1", CP_TOPIC_PROFILES_, part);
    CHECK_STREQ(header(m, "contprof-source", h, sizeof h), want);
    CHECK_STREQ(header(m, "contprof-reason", h, sizeof h), "envelope");
    rd_kafka_message_destroy(m);
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    free(junk);
    /* an agent's envelope that says it dropped windows and samples: in /metrics by service */
    cp_envelope e = {.tenant = "default",
                     .kind = CP_KIND_CPU,
                     .producer_id = "agent-x",
                     .sequence = 1,
                     .dropped_windows = 3,
                     .dropped_samples = 7};
    e.window_start_ns = ((int64_t)time(NULL) - 3600) * SEC;
    e.window_duration_ns = 10 * SEC;
    CHECK(cp_labels_set(&e.labels, "service", "dropper") == 0);
    cp_buf pp = {0}, enc = {0};
    snprintf(args, sizeof args, "%s/w00000.pb.gz", wdir);
    CHECK(cp_read_file(args, &pp, NULL) == 0);
    e.pprof = pp.data;
    e.pprof_len = pp.len;
    CHECK(cp_envelope_encode(&e, &enc) == 0);
    p = kafka(RD_KAFKA_PRODUCER, brokers);
    CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES_),
                            RD_KAFKA_V_VALUE(enc.data, enc.len), RD_KAFKA_V_KEY("agent-x", 7),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) == 0);
    CHECK(rd_kafka_flush(p, 30000) == 0);
    rd_kafka_destroy(p);
    cp_labels_close(&e.labels);
    cp_buf_close(&pp);
    cp_buf_close(&enc);
    long long dw = -1;
    for (int64_t end = mono_ns() + 30 * SEC; dw != 3 && mono_ns() < end; usleep(50000))
        dw = metric(&d, "contprof_agent_dropped_windows_total{service=\"dropper\"}");
    CHECK_EQ(dw, 3);
    CHECK_EQ(metric(&d, "contprof_agent_dropped_samples_total{service=\"dropper\"}"), 7);
    /* a window the store refuses (a sample type the series does not have) goes to the DLQ:
     * import names it and why, and exits 1 */
    cp_profile *odd = cp_profile_create();
    CHECK(odd && cp_profile_add_sample_type(odd, "wall", "nanoseconds") == 0);
    cp_function fn = {0};
    uint32_t fid, lid;
    cp_profile_intern_cstr(odd, "odd_function", &fn.name);
    CHECK(cp_profile_add_function(odd, &fn, &fid) == 0);
    cp_line ln = {fid, 1};
    CHECK(cp_profile_add_location(odd, 0x1000, 0, &ln, 1, &lid) == 0);
    int64_t v = 5;
    CHECK(cp_profile_add_sample(odd, &lid, 1, &v, NULL, 0) == 0);
    odd->time_nanos = ((int64_t)time(NULL) - 7200) * SEC;
    odd->duration_nanos = 10 * SEC;
    CHECK(cp_pprof_encode(odd, 1, &pp) == 0);
    snprintf(args, sizeof args, "%s/odd.pb.gz", dir);
    CHECK(cp_write_file(args, pp.data, pp.len, NULL) == 0);
    cp_buf_close(&pp);
    cp_profile_destroy(odd);
    snprintf(args, sizeof args, "--service afterdlq '%s/odd.pb.gz'", dir);
    CHECK_EQ(import(&d, dir, args, &out), 1);
    CHECK_CONTAINS(out, "odd.pb.gz (cpu): not stored: refused by contprofd (rejected;");
    CHECK_CONTAINS(out, "0 of 1 window(s) from 1 file(s) stored");
    free(out);
    daemon_stop(&d);
    char *log = slurp_alloc(d.p.log);
    CHECK_CONTAINS(log, "a truncated copy (first 65536 bytes");
    free(log);
    rmtree(dir);
    free(dir);
}

TEST(fire_and_forget_burst_loss_is_counted_and_logged)
{
    char *dir = mkdir_tmp("lost"), wdir[512], args[700];
    snprintf(wdir, sizeof wdir, "%s/w", dir);
    CHECK(mkdir(wdir, 0755) == 0);
    genwindows(wdir, 360, "");
    daemon_t d = {0};
    daemon_start(&d, dir);
    char *out;
    /* --no-wait: the send of before flow control; 22 MB into one partition while the
     * consumer is still joining (about 3 s): the broker keeps the last 5 MiB */
    snprintf(args, sizeof args, "--no-wait --service lost '%s'/*.pb.gz", wdir);
    CHECK_EQ(import(&d, dir, args, &out), 0);
    CHECK_CONTAINS(out, "not waiting for the store");
    free(out);
    /* every window is accounted for: stored or counted as lost */
    long long stored = 0, lost = 0;
    for (int64_t end = mono_ns() + 60 * SEC; mono_ns() < end; usleep(100000)) {
        stored = metric(&d, "contprof_ingest_windows_total");
        lost = lost_total(&d);
        if (stored + lost >= 360 && metric(&d, "contprof_ingest_consumer_lag") == 0) break;
    }
    fprintf(stderr, "stored %lld, lost %lld\n", stored, lost);
    CHECK_EQ(stored + lost, 360);
    CHECK(lost > 0);
    char *log = slurp_alloc(d.p.log);
    char line[160];
    /* one partition holds the series; which one depends on the key's hash */
    int found = 0;
    for (int p = 0; p < 4 && !found; p++) {
        snprintf(line, sizeof line,
                 "contprof.profiles [%d]: offsets 0..%lld are gone from the "
                 "broker (lost)",
                 p, lost - 1);
        found = strstr(log, line) != NULL;
    }
    if (!found) fprintf(stderr, "no \"offsets 0..%lld are gone\" line in:\n%s\n", lost - 1, log);
    CHECK(found);
    free(log);
    /* the last error says so too */
    cp_buf b = http_get_ok(d.p.port, "/metrics", NULL);
    CHECK_CONTAINS((char *)b.data, "contprof_ingest_last_error{error=\"contprof.profiles [");
    cp_buf_close(&b);
    daemon_stop(&d);
    rmtree(dir);
    free(dir);
}

TEST_MAIN(T(burst_right_after_start_is_stored_whole),
          T(profile_too_large_is_refused_and_the_next_is_stored),
          T(bad_message_too_large_for_the_dlq_goes_there_truncated),
          T(fire_and_forget_burst_loss_is_counted_and_logged))
