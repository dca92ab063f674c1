/* The control-topic consumer: librdkafka's simple consumer (consume_start/consume_batch,
 * no group, no offsets committed), loaded on first use like kafka.c's producer. Its fetch
 * memory is bounded (queued.max.messages.kbytes, fetch.max.bytes); its log lines stay off
 * the host's stderr. */
#include "watch.h"

#include <dlfcn.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"

/* One function a line, by hand: clang-format 14 lays X-lists out differently on each pass. */
/* clang-format off */
#define CP_WK_FUNCS(X)                                                                             \
    X(rd_kafka_conf_destroy)                                                                       \
    X(rd_kafka_conf_new)                                                                           \
    X(rd_kafka_conf_set)                                                                           \
    X(rd_kafka_conf_set_error_cb)                                                                  \
    X(rd_kafka_conf_set_log_cb)                                                                    \
    X(rd_kafka_conf_set_opaque)                                                                    \
    X(rd_kafka_consume_batch_queue)                                                                \
    X(rd_kafka_consume_start_queue)                                                                \
    X(rd_kafka_consume_stop)                                                                       \
    X(rd_kafka_destroy)                                                                            \
    X(rd_kafka_err2str)                                                                            \
    X(rd_kafka_last_error)                                                                         \
    X(rd_kafka_message_destroy)                                                                    \
    X(rd_kafka_new)                                                                                \
    X(rd_kafka_poll)                                                                               \
    X(rd_kafka_queue_cb_event_enable)                                                              \
    X(rd_kafka_queue_destroy)                                                                      \
    X(rd_kafka_queue_new)                                                                          \
    X(rd_kafka_topic_destroy)                                                                      \
    X(rd_kafka_topic_new)
/* clang-format on */

static struct {
    int tried, ok;
#define CP_WK_FIELD(f) __typeof__(&f) f;
    CP_WK_FUNCS(CP_WK_FIELD)
#undef CP_WK_FIELD
} wk;

static int wk_load(cp_err *err)
{
    if (wk.tried) return wk.ok ? 0 : cp_err_set(err, CP_EKAFKA, "librdkafka could not be loaded");
    wk.tried = 1;
    void *h = dlopen("librdkafka.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("librdkafka.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return cp_err_set(err, CP_EKAFKA, "cannot load librdkafka: %s", dlerror());
#define CP_WK_LOAD(f)                                                                              \
    if (!(wk.f = (__typeof__(wk.f))dlsym(h, #f)))                                                  \
        return cp_err_set(err, CP_EKAFKA, "librdkafka lacks %s", #f);
    CP_WK_FUNCS(CP_WK_LOAD)
#undef CP_WK_LOAD
    wk.ok = 1;
    return 0;
}

struct cp_watch {
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

int cp_watch_create(const char *brokers, const char *props, cp_watch_wake_fn wake, void *wake_arg,
                    cp_watch **out, cp_err *err)
{
    *out = NULL;
    int lrc = wk_load(err);
    if (lrc) return lrc;
    char errstr[256] = "";
    cp_watch *w = calloc(1, sizeof(*w));
    rd_kafka_conf_t *conf = w ? wk.rd_kafka_conf_new() : NULL;
    if (!w || !conf) {
        free(w);
        return cp_err_set(err, CP_ENOMEM, "out of memory creating the control consumer");
    }
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
        bad = wk.rd_kafka_conf_set(conf, kv[i][0], kv[i][1], errstr, sizeof(errstr)) !=
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
            if (wk.rd_kafka_conf_set(conf, line, line + (eq - l) + 1, errstr, sizeof(errstr)) ==
                RD_KAFKA_CONF_INVALID)
                bad = 1;
        }
        l += ll + (nl ? 1 : 0);
    }
    if (bad) {
        wk.rd_kafka_conf_destroy(conf);
        free(w);
        return cp_err_set(err, CP_EKAFKA, "control consumer: %s", errstr);
    }
    wk.rd_kafka_conf_set_log_cb(conf, quiet_log);
    wk.rd_kafka_conf_set_error_cb(conf, on_error);
    wk.rd_kafka_conf_set_opaque(conf, w);
    w->rk = wk.rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!w->rk) {
        wk.rd_kafka_conf_destroy(conf);
        free(w);
        return cp_err_set(err, CP_EKAFKA, "control consumer for %s: %s", brokers, errstr);
    }
    w->wake = wake;
    w->wake_arg = wake_arg;
    w->rkt = wk.rd_kafka_topic_new(w->rk, CP_TOPIC_CONTROL, NULL);
    w->q = w->rkt ? wk.rd_kafka_queue_new(w->rk) : NULL;
    if (w->q) wk.rd_kafka_queue_cb_event_enable(w->q, on_event, w);
    if (!w->rkt || !w->q) {
        if (w->rkt) wk.rd_kafka_topic_destroy(w->rkt);
        cp_err_set(err, CP_EKAFKA, "topic %s: %s", CP_TOPIC_CONTROL,
                   wk.rd_kafka_err2str(wk.rd_kafka_last_error()));
        wk.rd_kafka_destroy(w->rk);
        free(w);
        return CP_EKAFKA;
    }
    *out = w;
    return 0;
}

#define BATCH 64

int cp_watch_poll(cp_watch *w, cp_watch_fn fn, void *arg)
{
    wk.rd_kafka_poll(w->rk, 0); /* error callbacks */
    if (!w->started) {
        /* the topic may not exist yet: librdkafka waits for it in the background */
        if (wk.rd_kafka_consume_start_queue(w->rkt, 0, RD_KAFKA_OFFSET_TAIL(CP_WATCH_TAIL), w->q) !=
            0) {
            w->errors++;
            snprintf(w->last, sizeof(w->last), "consume_start: %s",
                     wk.rd_kafka_err2str(wk.rd_kafka_last_error()));
            return 0;
        }
        w->started = 1;
    }
    int handed = 0;
    for (;;) {
        rd_kafka_message_t *ms[BATCH];
        ssize_t n = wk.rd_kafka_consume_batch_queue(w->q, 0, ms, BATCH);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) {
            if (ms[i]->err) {
                w->errors++;
                snprintf(w->last, sizeof(w->last), "%s", wk.rd_kafka_err2str(ms[i]->err));
            } else if (ms[i]->payload) {
                fn(ms[i]->payload, ms[i]->len, arg);
                handed++;
            }
            wk.rd_kafka_message_destroy(ms[i]);
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
    if (w->started) wk.rd_kafka_consume_stop(w->rkt, 0);
    wk.rd_kafka_queue_cb_event_enable(w->q, NULL, NULL);
    wk.rd_kafka_queue_destroy(w->q);
    wk.rd_kafka_topic_destroy(w->rkt);
    wk.rd_kafka_destroy(w->rk);
    free(w);
}

void cp_watch_abandon(cp_watch *w)
{
    (void)w;
}
