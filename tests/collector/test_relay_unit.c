/* The relay's parts in one process, so that the ASan+UBSan build checks them too: the agent's
 * sink (collector/sink.c) hands envelopes to the relay (collector/relay/relayd.c) over its
 * socket, the relay produces them to a librdkafka mock cluster, a consumer reads them back
 * byte for byte; with the relay gone the sink spools (model/relay.c) and the next relay
 * drains the spool; the frame and spool checks refuse what they must. */
#include <dirent.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "envelope.h"
#include "relay.h"
#include "relayd.h"
#include "sink.h"
#include "test.h"

static char g_dir[128];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cp-relay-unit-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_dir, g_dir);
    CHECK(system(cmd) == 0);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}

/* Envelope number i of producer "unit": a small payload that names it. */
static void make_envelope(cp_envelope *e, int i)
{
    memset(e, 0, sizeof(*e));
    e->tenant = strdup("default");
    e->producer_id = strdup("unit");
    CHECK(e->tenant && e->producer_id);
    CHECK(cp_labels_set(&e->labels, "service", "relayunit") == 0);
    CHECK(cp_labels_set(&e->labels, "isolate", i % 2 ? "odd" : "even") == 0);
    e->kind = CP_KIND_CPU;
    e->window_start_ns = 1700000000000000000LL + (int64_t)i * 1000000000;
    e->window_duration_ns = 1000000000;
    e->sequence = (uint64_t)i;
    char payload[64];
    int n = snprintf(payload, sizeof payload, "payload-%04d", i);
    e->pprof = malloc((size_t)n);
    CHECK(e->pprof);
    memcpy(e->pprof, payload, (size_t)n);
    e->pprof_len = (size_t)n;
}

/* Reads the profiles topic from its start until it has been quiet for 3 s; returns how many
 * messages decoded as envelopes of producer "unit", each sequence marked in seen. */
static int consume(const char *boot, int *seen, int max)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    CHECK(rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof err) == 0);
    CHECK(rd_kafka_conf_set(c, "group.id", "relayunit", err, sizeof err) == 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    CHECK(rk != NULL);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    for (int p = 0; p < 4; p++)
        rd_kafka_topic_partition_list_add(l, CP_TOPIC_PROFILES, p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    CHECK(rd_kafka_assign(rk, l) == 0);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0;
    for (int idle = 0; idle < 30;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) {
            idle++;
            continue;
        }
        idle = 0;
        cp_envelope e;
        if (!m->err && cp_envelope_decode(m->payload, m->len, 1 << 20, &e, NULL) == 0) {
            if (!strcmp(e.producer_id, "unit") && e.sequence < (uint64_t)max) {
                char want[64];
                int wl = snprintf(want, sizeof want, "payload-%04d", (int)e.sequence);
                CHECK_EQ(e.pprof_len, wl);
                CHECK(memcmp(e.pprof, want, (size_t)wl) == 0);
                seen[e.sequence]++;
                n++;
            }
            cp_envelope_close(&e);
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

static int spool_count(void)
{
    char path[200];
    snprintf(path, sizeof path, "%s/spool", g_dir);
    DIR *d = opendir(path);
    CHECK(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += strlen(de->d_name) == 8 || strlen(de->d_name) == 9; /* SLOT.env, SLOT.envs */
    closedir(d);
    return n;
}

/* librdkafka's mock cluster (one broker, the profiles topic in 4 partitions) on a producer
 * handle of its own, *host: the test destroys both. */
static rd_kafka_mock_cluster_t *mock_start(rd_kafka_t **host)
{
    char err[256];
    rd_kafka_conf_t *hc = rd_kafka_conf_new();
    rd_kafka_conf_set(hc, "log_level", "0", err, sizeof err);
    *host = rd_kafka_new(RD_KAFKA_PRODUCER, hc, err, sizeof err);
    CHECK(*host);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(*host, 1);
    CHECK(mc);
    CHECK(rd_kafka_mock_topic_create(mc, CP_TOPIC_PROFILES, 4, 1) == 0);
    return mc;
}

static cp_relay *relay_start(const char *boot)
{
    cp_relay_options o = {.dir = g_dir, .brokers = boot, .topic = CP_TOPIC_PROFILES, .queue = 100};
    cp_relay *r = NULL;
    cp_err err = {0};
    if (cp_relay_create(&o, &r, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    CHECK(r != NULL);
    CHECK(cp_relay_start(r, &err) == 0);
    return r;
}

/* 20 envelopes through the relay, then 10 with the relay gone (spooled, as one batch file
 * at the next tick), then a new relay: all 30 read back from Kafka, each once, and the
 * spool empty. */
TEST(sink_to_relay_to_kafka_and_through_the_spool)
{
    make_dir();
    rd_kafka_t *host;
    rd_kafka_mock_cluster_t *mc = mock_start(&host);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);

    cp_relay *r = relay_start(boot);
    cp_sink_options so = {.relay_dir = g_dir};
    cp_sink *s = NULL;
    CHECK(cp_sink_create(&so, &s, NULL) == 0);
    for (int i = 0; i < 20; i++) {
        cp_envelope e;
        make_envelope(&e, i);
        cp_sink_send(s, &e);
        cp_envelope_close(&e);
    }
    cp_sink_tick(s); /* the answers: the agent reads them at its next tick */
    CHECK(cp_sink_idle(s));
    CHECK_EQ(cp_sink_take_dropped(s), 0);
    CHECK_EQ(spool_count(), 0);
    cp_relay_stats st;
    cp_relay_get_stats(r, &st);
    CHECK_EQ(st.accepted, 20);
    cp_relay_destroy(r, 5 * 1000000000LL); /* delivers what it holds, removes the socket */

    for (int i = 20; i < 30; i++) {
        cp_envelope e;
        make_envelope(&e, i);
        cp_sink_send(s, &e);
        cp_envelope_close(&e);
    }
    CHECK_EQ(cp_sink_take_dropped(s), 0);
    CHECK_EQ(spool_count(), 0); /* held for one file */
    CHECK(!cp_sink_idle(s));
    cp_sink_tick(s);
    CHECK(cp_sink_idle(s));
    CHECK_EQ(spool_count(), 1);

    r = relay_start(boot);
    for (int i = 0; i < 100 && spool_count() > 0; i++)
        usleep(100000);
    CHECK_EQ(spool_count(), 0);
    cp_relay_get_stats(r, &st);
    CHECK_EQ(st.drained, 10);
    cp_relay_destroy(r, 5 * 1000000000LL);
    CHECK_EQ(cp_sink_destroy(s, 0), 0);

    int seen[30] = {0};
    CHECK_EQ(consume(boot, seen, 30), 30);
    for (int i = 0; i < 30; i++)
        CHECK_EQ(seen[i], 1);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
    remove_dir();
}

/* A batch file whose third frame runs past the file's end (a sender that died writing it
 * cannot leave one: files are renamed whole; a damaged disk can): the relay drains the two
 * envelopes before the damage, counts the rest refused, and removes the file. */
TEST(a_damaged_batch_drains_what_precedes_the_damage)
{
    make_dir();
    rd_kafka_t *host;
    rd_kafka_mock_cluster_t *mc = mock_start(&host);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    int dfd = -1;
    cp_err e = {0};
    CHECK(cp_spool_open(g_dir, 1, &dfd, &e) == 0);
    cp_buf batch = {0};
    for (int i = 0; i < 3; i++) {
        cp_envelope env;
        make_envelope(&env, i);
        cp_buf v = {0};
        CHECK_EQ(cp_envelope_encode(&env, &v), 0);
        CHECK_EQ(cp_spool_batch_add(&batch, v.data, v.len), 0);
        cp_buf_close(&v);
        cp_envelope_close(&env);
    }
    batch.len -= 3; /* the last frame cut short */
    CHECK_EQ(cp_spool_write_batch(dfd, &batch, &e), 0);
    cp_buf_close(&batch);
    close(dfd);
    cp_relay *r = relay_start(boot);
    cp_relay_stats st = {0};
    for (int i = 0; i < 100 && (spool_count() > 0 || st.drained < 2); i++) {
        usleep(100000);
        cp_relay_get_stats(r, &st);
    }
    CHECK_EQ(spool_count(), 0);
    CHECK_EQ(st.drained, 2);
    CHECK_EQ(st.refused, 1);
    cp_relay_destroy(r, 5 * 1000000000LL);
    int seen[3] = {0};
    CHECK_EQ(consume(boot, seen, 3), 2);
    CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 0);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
    remove_dir();
}

/* Frames: a zero length, an oversized one and an unknown type are refused by name; a header
 * written is read back. The spool: an envelope over its file bound is refused, a link or a
 * directory others may write without the sticky bit is not opened, and a file that is not
 * a regular one is removed when taken. */
TEST(frames_and_spool_refuse_what_they_must)
{
    uint8_t h[CP_RELAY_HEADER], type;
    uint32_t len;
    cp_err err = {0};
    cp_relay_header(h, CP_RELAY_ENVELOPE, 1234);
    CHECK(cp_relay_parse_header(h, CP_RELAY_FRAME_MAX, &type, &len, &err) == 0);
    CHECK_EQ(type, CP_RELAY_ENVELOPE);
    CHECK_EQ(len, 1234);
    uint8_t zero[CP_RELAY_HEADER] = {0, 0, 0, 0, 'E'};
    CHECK(cp_relay_parse_header(zero, CP_RELAY_FRAME_MAX, &type, &len, &err) != 0);
    CHECK_CONTAINS(err.msg, "length 0");
    uint8_t big[CP_RELAY_HEADER] = {0xff, 0xff, 0xff, 0xff, 'E'};
    CHECK(cp_relay_parse_header(big, CP_RELAY_FRAME_MAX, &type, &len, &err) != 0);
    CHECK_CONTAINS(err.msg, "over the 16777216 allowed");
    uint8_t odd[CP_RELAY_HEADER] = {0, 0, 0, 1, 'Z'};
    CHECK(cp_relay_parse_header(odd, CP_RELAY_FRAME_MAX, &type, &len, &err) != 0);
    CHECK_CONTAINS(err.msg, "unknown type 0x5a");

    make_dir();
    int dfd = -1;
    CHECK(cp_spool_open(g_dir, 1, &dfd, &err) == 0);
    uint8_t *huge = calloc(1, CP_SPOOL_FILE_MAX + 1);
    CHECK(huge);
    CHECK_EQ(cp_spool_write(dfd, huge, CP_SPOOL_FILE_MAX + 1, &err), CP_ELIMIT);
    CHECK_CONTAINS(err.msg, "over the");
    free(huge);
    CHECK_EQ(cp_spool_write(dfd, (const uint8_t *)"abc", 3, &err), 0);
    cp_spool_entry ents[4];
    size_t n = 0;
    CHECK(cp_spool_list(dfd, ents, 4, &n, &err) == 0);
    CHECK_EQ(n, 1);
    cp_buf b = {0};
    CHECK(cp_spool_take(dfd, ents[0].name, &b, &err) == 0);
    CHECK_EQ(b.len, 3);
    CHECK(memcmp(b.data, "abc", 3) == 0);
    cp_buf_close(&b);
    /* a fifo where a spool file would be: removed, not read (which would block) */
    char path[300];
    snprintf(path, sizeof path, "%s/spool/0001.env", g_dir);
    CHECK(mkfifo(path, 0600) == 0);
    CHECK(cp_spool_list(dfd, ents, 4, &n, &err) == 0);
    CHECK_EQ(n, 1);
    CHECK_EQ(cp_spool_take(dfd, ents[0].name, &b, &err), CP_EINVAL);
    CHECK(access(path, F_OK) != 0);
    /* a batch: frames written and read back in order; one that runs past the end, or is
     * empty, is refused; an envelope that cannot fit a file is refused before it is added */
    cp_buf batch = {0};
    CHECK_EQ(cp_spool_batch_add(&batch, (const uint8_t *)"first", 5), 0);
    CHECK_EQ(cp_spool_batch_add(&batch, (const uint8_t *)"second!", 7), 0);
    CHECK_EQ(cp_spool_batch_add(&batch, (const uint8_t *)"", 0), CP_ELIMIT);
    CHECK_EQ(cp_spool_batch_add(&batch, (const uint8_t *)"x", CP_SPOOL_FILE_MAX), CP_ELIMIT);
    CHECK_EQ(batch.len, 4 + 5 + 4 + 7);
    CHECK_EQ(cp_spool_write_batch(dfd, &batch, &err), 0);
    CHECK(cp_spool_list(dfd, ents, 4, &n, &err) == 0);
    CHECK_EQ(n, 1);
    CHECK(ents[0].batch);
    CHECK_EQ(strlen(ents[0].name), 9);
    CHECK(cp_spool_take(dfd, ents[0].name, &b, &err) == 0);
    size_t off = 0, flen = 0;
    const uint8_t *env = NULL;
    CHECK_EQ(cp_spool_batch_next(b.data, b.len, &off, &env, &flen), 1);
    CHECK(flen == 5 && !memcmp(env, "first", 5));
    CHECK_EQ(cp_spool_batch_next(b.data, b.len, &off, &env, &flen), 1);
    CHECK(flen == 7 && !memcmp(env, "second!", 7));
    CHECK_EQ(cp_spool_batch_next(b.data, b.len, &off, &env, &flen), 0);
    for (size_t cut = 1; cut < b.len; cut++) { /* every truncation but at a frame's end */
        off = 0;
        int rc;
        while ((rc = cp_spool_batch_next(b.data, cut, &off, &env, &flen)) == 1)
            ;
        CHECK_EQ(rc, cut == 9 ? 0 : CP_EPARSE);
    }
    uint8_t empty[4] = {0};
    off = 0;
    CHECK_EQ(cp_spool_batch_next(empty, 4, &off, &env, &flen), CP_EPARSE);
    cp_buf_close(&b);
    cp_buf_close(&batch);
    close(dfd);
    snprintf(path, sizeof path, "%s/spool", g_dir);
    CHECK(chmod(path, 0777) == 0);
    CHECK(cp_spool_open(g_dir, 0, &dfd, &err) != 0);
    CHECK_CONTAINS(err.msg, "without the sticky bit");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s/spool && ln -s /tmp %s/spool", g_dir, g_dir);
    CHECK(system(cmd) == 0);
    CHECK(cp_spool_open(g_dir, 0, &dfd, &err) != 0);
    CHECK_CONTAINS(err.msg, "symbolic link");
    remove_dir();
}

TEST_MAIN(T(sink_to_relay_to_kafka_and_through_the_spool),
          T(a_damaged_batch_drains_what_precedes_the_damage),
          T(frames_and_spool_refuse_what_they_must))
