/* Hearing of captures (watch.h): the poller of contprofd, or the control-topic consumer:
 * librdkafka's simple consumer (consume_start/consume_batch, no group, no offsets
 * committed), loaded on first use like kafka.c's producer. Its fetch memory is bounded
 * (queued.max.messages.kbytes, fetch.max.bytes); its log lines stay off the host's stderr. */
#include "watch.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"
#include "http_client.h"
#include "kafka.h"
#include "times.h"

struct cp_watch {
    /* the poller's (server[0] != 0) */
    char server[512], token[256];
    char resolved[600]; /* server with its host numeric (cp_http_resolve_url), "" when not yet */
    int64_t next_poll_ns;
    int failures;       /* in a row */
    uint64_t last_hash; /* FNV-1a of the last answer handed on (0: none yet) */
    /* the consumer's */
    char *brokers, *props;
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    rd_kafka_queue_t *q;
    cp_watch_wake_fn wake;
    void *wake_arg;
    int started;
    uint64_t errors;
    char last[160];
};

static void quiet_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk, (void)level, (void)fac, (void)buf;
}

static void on_error(rd_kafka_t *h, int err, const char *reason, void *opaque)
{
    (void)h, (void)err;
    cp_watch *w = opaque;
    w->errors++;
    snprintf(w->last, sizeof(w->last), "%s", reason ? reason : "error");
}

/* librdkafka's thread: a message (or an error) arrived on the empty queue. */
static void on_event(rd_kafka_t *rk, void *opaque)
{
    (void)rk;
    cp_watch *w = opaque;
    if (w->wake) w->wake(w->wake_arg);
}

/* Makes w the control topic's consumer on w->brokers. */
static int consumer_open(cp_watch *w, cp_err *err)
{
    const char *brokers = w->brokers, *props = w->props;
    int lrc = cp_rk_load(err);
    if (lrc) return lrc;
    char errstr[256] = "";
    rd_kafka_conf_t *conf = cp_rk.rd_kafka_conf_new();
    if (!conf) return cp_err_set(err, CP_ENOMEM, "out of memory creating the control consumer");
    char wait[16];
    snprintf(wait, sizeof(wait), "%d", CP_WATCH_FETCH_WAIT_MS);
    /* Bounded: at most ~2 MiB fetched ahead; an idle fetch every CP_WATCH_FETCH_WAIT_MS. */
    const char *kv[][2] = {
        {"bootstrap.servers", brokers},
        {"client.id", "contprof-agent-control"},
        {"fetch.wait.max.ms", wait},
        {"fetch.min.bytes", "1"},
        {"fetch.error.backoff.ms", "1000"},
        {"fetch.message.max.bytes", "65536"},
        {"fetch.max.bytes", "1048576"},
        {"receive.message.max.bytes", "2097152"},
        {"queued.max.messages.kbytes", "2048"},
        {"queued.min.messages", "1000"},
        {"enable.partition.eof", "false"},
        {"socket.keepalive.enable", "true"},
        {"reconnect.backoff.max.ms", "5000"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]) && !bad; i++)
        bad = cp_rk.rd_kafka_conf_set(conf, kv[i][0], kv[i][1], errstr, sizeof(errstr)) !=
              RD_KAFKA_CONF_OK;
    for (const char *l = props; l && *l && !bad;) { /* "name=value\n" lines, as kafka.c */
        const char *nl = strchr(l, '\n'), *eq = strchr(l, '=');
        size_t ll = nl ? (size_t)(nl - l) : strlen(l);
        char line[1024];
        if (eq && eq < l + ll && ll < sizeof(line)) {
            memcpy(line, l, ll);
            line[ll] = 0;
            line[eq - l] = 0;
            /* producer-only properties mean nothing to a consumer: ignored, not refused */
            if (cp_rk.rd_kafka_conf_set(conf, line, line + (eq - l) + 1, errstr, sizeof(errstr)) ==
                RD_KAFKA_CONF_INVALID)
                bad = 1;
        }
        l += ll + (nl ? 1 : 0);
    }
    if (bad) {
        cp_rk.rd_kafka_conf_destroy(conf);
        return cp_err_set(err, CP_EKAFKA, "control consumer: %s", errstr);
    }
    cp_rk.rd_kafka_conf_set_log_cb(conf, quiet_log);
    cp_rk.rd_kafka_conf_set_error_cb(conf, on_error);
    cp_rk.rd_kafka_conf_set_opaque(conf, w);
    w->rk = cp_rk.rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!w->rk) {
        cp_rk.rd_kafka_conf_destroy(conf);
        return cp_err_set(err, CP_EKAFKA, "control consumer for %s: %s", brokers, errstr);
    }
    w->rkt = cp_rk.rd_kafka_topic_new(w->rk, CP_TOPIC_CONTROL, NULL);
    w->q = w->rkt ? cp_rk.rd_kafka_queue_new(w->rk) : NULL;
    if (w->q) cp_rk.rd_kafka_queue_cb_event_enable(w->q, on_event, w);
    if (!w->rkt || !w->q) {
        if (w->rkt) cp_rk.rd_kafka_topic_destroy(w->rkt);
        cp_err_set(err, CP_EKAFKA, "topic %s: %s", CP_TOPIC_CONTROL,
                   cp_rk.rd_kafka_err2str(cp_rk.rd_kafka_last_error()));
        cp_rk.rd_kafka_destroy(w->rk);
        w->rk = NULL;
        w->rkt = NULL;
        return CP_EKAFKA;
    }
    return 0;
}

int cp_watch_create(const char *server, const char *token, const char *brokers, const char *props,
                    cp_watch_wake_fn wake, void *wake_arg, cp_watch **out, cp_err *err)
{
    *out = NULL;
    cp_watch *w = calloc(1, sizeof(*w));
    if (!w || !(w->brokers = strdup(brokers ? brokers : "")) ||
        !(w->props = strdup(props ? props : ""))) {
        if (w) free(w->brokers);
        free(w);
        return cp_err_set(err, CP_ENOMEM, "out of memory creating the capture watcher");
    }
    w->wake = wake;
    w->wake_arg = wake_arg;
    if (server && *server) {
        snprintf(w->server, sizeof(w->server), "%s", server);
        snprintf(w->token, sizeof(w->token), "%s", token ? token : "");
    } else {
        int rc = consumer_open(w, err);
        if (rc) {
            free(w->brokers);
            free(w->props);
            free(w);
            return rc;
        }
    }
    *out = w;
    return 0;
}

/* A failed poll: counted, said, and the next one later. */
static void poll_failed(cp_watch *w, int64_t now)
{
    w->errors++;
    w->resolved[0] = 0;
    if (((int64_t)CP_WATCH_POLL_MS << w->failures) <= CP_WATCH_RETRY_MS) w->failures++;
    w->next_poll_ns = now + ((int64_t)CP_WATCH_POLL_MS << (w->failures - 1)) * 1000000;
}

/* One poll of the server, when due. Returns how many messages were handed. */
static int poll_server(cp_watch *w, cp_watch_fn fn, void *arg)
{
    int64_t now = cp_mono_ns();
    if (now < w->next_poll_ns) return 0;
    w->next_poll_ns = now + CP_WATCH_POLL_MS * (int64_t)1000000;
    cp_http_result res;
    cp_err err = {0};
    /* a name is resolved once, again after a failure: not twice a second */
    if (!w->resolved[0] &&
        cp_http_resolve_url(w->server, w->resolved, sizeof(w->resolved), &err) != 0) {
        w->resolved[0] = 0;
        snprintf(w->last, sizeof(w->last), "%.150s", err.msg);
        poll_failed(w, now);
        return 0;
    }
    if (cp_http_get(w->resolved, "/api/v1/control/captures", w->token, CP_WATCH_HTTP_TIMEOUT_MS,
                    1u << 20, &res, &err) != 0) {
        snprintf(w->last, sizeof(w->last), "%.150s", err.msg);
        poll_failed(w, now);
        return 0;
    }
    int handed = 0;
    if (res.status == 404) { /* an older contprofd: the control topic instead */
        cp_err e2 = {0};
        if (consumer_open(w, &e2) == 0) {
            w->server[0] = 0;
        } else {
            snprintf(w->last, sizeof(w->last), "%.150s", e2.msg);
            poll_failed(w, now);
        }
    } else if (res.status != 200) {
        snprintf(w->last, sizeof(w->last), "%.100s answered %d to /api/v1/control/captures",
                 w->server, res.status);
        poll_failed(w, now);
    } else {
        w->failures = 0;
        uint64_t h = 14695981039346656037ULL; /* FNV-1a: the same answer is handed on once */
        for (size_t i = 0; i < res.body.len; i++)
            h = (h ^ res.body.data[i]) * 1099511628211ULL;
        h |= 1; /* never 0, the "none yet" mark */
        if (h != w->last_hash) {
            handed = cp_control_list_split(res.body.data, res.body.len, fn, arg);
            if (handed < 0) {
                handed = 0;
                w->errors++;
                snprintf(w->last, sizeof(w->last), "%.100s: a malformed capture list", w->server);
            } else {
                w->last_hash = h;
            }
        }
    }
    cp_buf_close(&res.body);
    return handed;
}

#define BATCH 64

int cp_watch_poll(cp_watch *w, cp_watch_fn fn, void *arg)
{
    if (w->server[0]) return poll_server(w, fn, arg);
    cp_rk.rd_kafka_poll(w->rk, 0); /* error callbacks */
    if (!w->started) {
        /* the topic may not exist yet: librdkafka waits for it in the background */
        if (cp_rk.rd_kafka_consume_start_queue(w->rkt, 0, RD_KAFKA_OFFSET_TAIL(CP_WATCH_TAIL),
                                               w->q) != 0) {
            w->errors++;
            snprintf(w->last, sizeof(w->last), "consume_start: %s",
                     cp_rk.rd_kafka_err2str(cp_rk.rd_kafka_last_error()));
            return 0;
        }
        w->started = 1;
    }
    int handed = 0;
    for (;;) {
        rd_kafka_message_t *ms[BATCH];
        ssize_t n = cp_rk.rd_kafka_consume_batch_queue(w->q, 0, ms, BATCH);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) {
            if (ms[i]->err) {
                w->errors++;
                snprintf(w->last, sizeof(w->last), "%s", cp_rk.rd_kafka_err2str(ms[i]->err));
            } else if (ms[i]->payload) {
                fn(ms[i]->payload, ms[i]->len, arg);
                handed++;
            }
            cp_rk.rd_kafka_message_destroy(ms[i]);
        }
        if (n < BATCH) break;
    }
    return handed;
}

uint64_t cp_watch_take_errors(cp_watch *w, const char **last)
{
    uint64_t e = w->errors;
    w->errors = 0;
    if (last) *last = w->last;
    return e;
}

void cp_watch_destroy(cp_watch *w)
{
    if (!w) return;
    if (w->rk) {
        if (w->started) cp_rk.rd_kafka_consume_stop(w->rkt, 0);
        cp_rk.rd_kafka_queue_cb_event_enable(w->q, NULL, NULL);
        cp_rk.rd_kafka_queue_destroy(w->q);
        cp_rk.rd_kafka_topic_destroy(w->rkt);
        cp_rk.rd_kafka_destroy(w->rk);
    }
    free(w->brokers);
    free(w->props);
    free(w);
}

void cp_watch_abandon(cp_watch *w)
{
    (void)w;
}
