/* Hearing of captures (watch.h): the poller of contprofd, or the control-topic consumer:
 * librdkafka's simple consumer (consume_start/consume_batch, no group, no offsets
 * committed), loaded on first use like kafka.c's producer. Its fetch memory is bounded
 * (queued.max.messages.kbytes, fetch.max.bytes); its log lines stay off the host's stderr. */
#include "watch.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "guard.h"
#include "http_client.h"
#include "relay.h"
#include "kafka.h"
#include "times.h"

/* The poller: a thread of its own asks the server, so that the agent thread never waits
 * for it; they share this under mu. The thread and the watcher each hold a reference: the
 * last to let go frees it (cp_watch_destroy never waits for a request in flight). */
typedef struct poller {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC: the thread's wait between polls, cut by stop */
    int refs;
    int stop;    /* the watcher is gone */
    int gone404; /* the server does not serve the path: the topic instead */
    int has_pending;
    cp_buf pending; /* an answer the agent thread has not taken yet */
    uint64_t errors;
    char last[160];
    cp_watch_wake_fn wake;
    void *wake_arg;
    char server[512], token[256];
} poller;

struct cp_watch {
    poller *p; /* the poller's, or NULL */
    /* the consumer's */
    char *brokers, *props;
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    rd_kafka_queue_t *q;
    cp_watch_wake_fn wake;
    void *wake_arg;
    int started;
    int whole; /* the last cp_watch_poll handed a poller's whole answer */
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

static void poller_release(poller *p)
{
    pthread_mutex_lock(&p->mu);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last) return;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    cp_buf_close(&p->pending);
    free(p);
}

/* One request (the poller thread, no lock held): 0 with *res (200 or 404), or -1 with why
 * set. */
static int poll_once(poller *p, char *resolved, size_t cap, cp_http_result *res, char *why,
                     size_t whycap)
{
    cp_err err = {0};
    if (!strncmp(p->server, CP_WATCH_RELAY_PREFIX, strlen(CP_WATCH_RELAY_PREFIX))) {
        /* the host's relay asks contprofd once for every process of the host */
        memset(res, 0, sizeof(*res));
        if (cp_relay_get_captures(p->server + strlen(CP_WATCH_RELAY_PREFIX),
                                  CP_WATCH_HTTP_TIMEOUT_MS, &res->body, &err) != 0) {
            cp_buf_close(&res->body);
            snprintf(why, whycap, "%.150s", err.msg);
            return -1;
        }
        res->status = 200;
        return 0;
    }
    /* a name is resolved once, again after a failure: not twice a second */
    if (!resolved[0] && cp_http_resolve_url(p->server, resolved, cap, &err) != 0) {
        resolved[0] = 0;
        snprintf(why, whycap, "%.150s", err.msg);
        return -1;
    }
    if (cp_http_get(resolved, "/api/v1/control/captures", p->token, CP_WATCH_HTTP_TIMEOUT_MS,
                    1u << 20, res, &err) != 0) {
        snprintf(why, whycap, "%.150s", err.msg);
        return -1;
    }
    if (res->status != 200 && res->status != 404) {
        snprintf(why, whycap, "%.100s answered %d to /api/v1/control/captures", p->server,
                 res->status);
        cp_buf_close(&res->body);
        return -1;
    }
    return 0;
}

static void *poller_main(void *arg)
{
    poller *p = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_setname_np(pthread_self(), "contprof-watch");
    char resolved[600] = "", why[160];
    uint64_t last_hash = 0; /* FNV-1a of the last answer passed on; 0: none yet */
    int failures = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->mu);
        cp_http_result res;
        int64_t wait_ms = CP_WATCH_POLL_MS;
        uint64_t h = 0;
        int ok = poll_once(p, resolved, sizeof resolved, &res, why, sizeof why) == 0;
        if (ok && res.status == 200) {
            uint64_t fnv = 14695981039346656037ULL;
            for (size_t i = 0; i < res.body.len; i++)
                fnv = (fnv ^ res.body.data[i]) * 1099511628211ULL;
            h = fnv | 1; /* never 0, the "none yet" mark */
        }
        if (!ok) {
            resolved[0] = 0;
            if (((int64_t)CP_WATCH_POLL_MS << failures) <= CP_WATCH_RETRY_MS) failures++;
            wait_ms = (int64_t)CP_WATCH_POLL_MS << (failures - 1);
        } else {
            failures = 0;
        }
        pthread_mutex_lock(&p->mu);
        int wake = 0;
        if (!ok) {
            p->errors++;
            snprintf(p->last, sizeof p->last, "%s", why);
        } else if (res.status == 404) { /* an older contprofd */
            p->gone404 = wake = 1;
        } else if (h != last_hash) {
            cp_buf_close(&p->pending);
            p->pending = res.body; /* the agent thread's now */
            res.body = (cp_buf){0};
            p->has_pending = wake = 1;
            last_hash = h;
        }
        if (ok) cp_buf_close(&res.body);
        if (wake && p->wake) p->wake(p->wake_arg);
        if (p->gone404) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t at = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + wait_ms * 1000000;
        ts.tv_sec = at / 1000000000;
        ts.tv_nsec = at % 1000000000;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&p->mu);
    poller_release(p);
    return NULL;
}

/* Starts w's poller of server. 0 or CP_ENOMEM. */
static int poller_start(cp_watch *w, const char *server, const char *token, cp_err *err)
{
    poller *p = calloc(1, sizeof(*p));
    if (!p) return cp_err_set(err, CP_ENOMEM, "out of memory creating the capture poller");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->refs = 2;
    p->wake = w->wake;
    p->wake_arg = w->wake_arg;
    snprintf(p->server, sizeof(p->server), "%s", server);
    snprintf(p->token, sizeof(p->token), "%s", token ? token : "");
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int saved = cp_in_agent;
    cp_in_agent = 1; /* the agent's thread: not sampled, its fds above the floor */
    pthread_t th;
    int rc = pthread_create(&th, &attr, poller_main, p);
    cp_in_agent = saved;
    pthread_attr_destroy(&attr);
    if (rc) {
        p->refs = 1;
        poller_release(p);
        return cp_err_set(err, CP_ENOMEM, "capture poller: no thread (%s)", strerror(rc));
    }
    w->p = p;
    return 0;
}

int cp_watch_create(const char *server, const char *token, const char *brokers, const char *props,
                    cp_watch_wake_fn wake, void *wake_arg, cp_watch **out, cp_err *err)
{
    CP_ASSERT_AGENT_THREAD();
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
    int rc = server && *server ? poller_start(w, server, token, err) : consumer_open(w, err);
    if (rc) {
        free(w->brokers);
        free(w->props);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* The agent thread's side of the poller: hands on the answer the thread left, if any. */
static int poller_take(cp_watch *w, cp_watch_fn fn, void *arg)
{
    poller *p = w->p;
    cp_buf body = {0};
    pthread_mutex_lock(&p->mu);
    int gone = p->gone404, has = p->has_pending;
    if (has) {
        body = p->pending;
        p->pending = (cp_buf){0};
        p->has_pending = 0;
    }
    w->errors += p->errors;
    p->errors = 0;
    if (p->last[0]) snprintf(w->last, sizeof(w->last), "%s", p->last);
    pthread_mutex_unlock(&p->mu);
    int handed = 0;
    if (has) {
        handed = cp_capture_feed_split(body.data, body.len, fn, arg);
        w->whole = handed >= 0;
        if (handed < 0) {
            handed = 0;
            w->errors++;
            snprintf(w->last, sizeof(w->last), "%.100s: a malformed capture list", p->server);
        }
        cp_buf_close(&body);
    }
    if (gone) { /* the topic instead; the thread has ended its side */
        cp_err err = {0};
        if (consumer_open(w, &err) == 0) {
            poller_release(p);
            w->p = NULL;
        } else {
            w->errors++;
            snprintf(w->last, sizeof(w->last), "%.150s", err.msg);
        }
    }
    return handed;
}

#define BATCH 64

int cp_watch_poll(cp_watch *w, cp_watch_fn fn, void *arg)
{
    CP_ASSERT_AGENT_THREAD();
    w->whole = 0;
    if (w->p) return poller_take(w, fn, arg);
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

int cp_watch_was_whole(const cp_watch *w)
{
    return w && w->whole;
}

uint64_t cp_watch_take_errors(cp_watch *w, const char **last)
{
    CP_ASSERT_AGENT_THREAD();
    uint64_t e = w->errors;
    w->errors = 0;
    if (last) *last = w->last;
    return e;
}

void cp_watch_destroy(cp_watch *w)
{
    CP_ASSERT_AGENT_THREAD();
    if (!w) return;
    if (w->p) { /* never waits for a request in flight: the thread lets go when it ends */
        pthread_mutex_lock(&w->p->mu);
        w->p->stop = 1;
        pthread_cond_signal(&w->p->cv);
        pthread_mutex_unlock(&w->p->mu);
        poller_release(w->p);
    }
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
