/* The agent's Kafka producer: lz4, idempotent, never RD_KAFKA_MSG_F_BLOCK; a bounded
 * backlog that drops the oldest window when full; delivery reports served by the agent
 * thread through cp_kafka_poll. librdkafka's log lines are kept off the host's stderr. */
#include "kafka.h"

#include <dlfcn.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

/* librdkafka (with libssl, libcrypto, libsasl2...) is loaded on first use, on the agent
 * thread: a program profiled without brokers never maps it, and exec'd children start
 * faster. The producer (below) and the control consumer (watch.c) share the table. */
cp_rk_lib cp_rk;

int cp_rk_load(cp_err *err)
{
    if (cp_rk.tried)
        return cp_rk.ok ? 0 : cp_err_set(err, CP_EKAFKA, "librdkafka could not be loaded");
    cp_rk.tried = 1;
    void *h = dlopen("librdkafka.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("librdkafka.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return cp_err_set(err, CP_EKAFKA, "cannot load librdkafka: %s", dlerror());
#define CP_RK_LOAD(f)                                                                              \
    if (!(cp_rk.f = (__typeof__(cp_rk.f))dlsym(h, #f)))                                            \
        return cp_err_set(err, CP_EKAFKA, "librdkafka lacks %s", #f);
    CP_RK_FUNCS(CP_RK_LOAD)
#undef CP_RK_LOAD
    cp_rk.ok = 1;
    return 0;
}

typedef struct msg {
    uint8_t *value, *key;
    size_t len, klen;
} msg;

struct cp_kafka {
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    char topic[256];
    msg *q; /* ring */
    uint32_t head, n, cap;
    uint64_t dropped, delivered;
    cp_kafka_keep_fn keep;
    void *keep_arg;
    int fatal;
    /* librdkafka said all brokers are down (since down_since, CLOCK_MONOTONIC ns) and no
     * delivery has succeeded since */
    int all_down;
    int64_t down_since;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void quiet_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk, (void)level, (void)fac, (void)buf;
}

static void on_error(rd_kafka_t *h, int err, const char *reason, void *opaque)
{
    (void)reason;
    cp_kafka *k = opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL || cp_rk.rd_kafka_fatal_error(h, NULL, 0)) k->fatal = 1;
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && !k->all_down) {
        k->all_down = 1;
        k->down_since = mono_ns();
    }
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    cp_kafka *k = opaque;
    if (m->err) {
        if (!k->keep || k->keep(k->keep_arg, m->payload, m->len) != 0) k->dropped++;
    } else {
        k->delivered++;
        k->all_down = 0; /* a broker took it: they are reachable */
    }
}

/* A message of the backlog given up on: kept by the keeper, or counted. */
static void give_up(cp_kafka *k, const msg *m)
{
    if (!k->keep || k->keep(k->keep_arg, m->value, m->len) != 0) k->dropped++;
}

void cp_kafka_set_keep(cp_kafka *k, cp_kafka_keep_fn fn, void *arg)
{
    k->keep = fn;
    k->keep_arg = arg;
}

uint64_t cp_kafka_take_delivered(cp_kafka *k)
{
    uint64_t d = k->delivered;
    k->delivered = 0;
    return d;
}

size_t cp_kafka_pending(const cp_kafka *k)
{
    return k->n + (size_t)cp_rk.rd_kafka_outq_len(k->rk);
}

int cp_kafka_create(const char *brokers, const char *topic, int queue, const char *props,
                    cp_kafka **out, cp_err *err)
{
    *out = NULL;
    int lrc = cp_rk_load(err);
    if (lrc) return lrc;
    char errstr[256] = ""; /* librdkafka's own messages */
    const size_t errlen = sizeof(errstr);
    cp_kafka *k = calloc(1, sizeof(*k));
    if (!k) return cp_err_set(err, CP_ENOMEM, "out of memory creating the Kafka producer");
    snprintf(k->topic, sizeof(k->topic), "%s", topic);
    k->cap = (uint32_t)(queue / 2 > 1 ? queue / 2 : 1);
    k->q = calloc(k->cap, sizeof(msg));
    rd_kafka_conf_t *conf = cp_rk.rd_kafka_conf_new();
    if (!k->q || !conf) goto nomem;
    char qs[32];
    snprintf(qs, sizeof(qs), "%d", queue - (int)k->cap > 1 ? queue - (int)k->cap : 1);
    const char *kv[][2] = {
        {"bootstrap.servers", brokers},          {"compression.type", "lz4"},
        {"enable.idempotence", "true"},          {"queue.buffering.max.messages", qs},
        {"queue.buffering.max.kbytes", "65536"}, {"linger.ms", "50"},
        {"message.timeout.ms", "60000"},         {"socket.keepalive.enable", "true"},
        {"client.id", "contprof-agent"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]) && !bad; i++)
        bad = cp_rk.rd_kafka_conf_set(conf, kv[i][0], kv[i][1], errstr, errlen) != RD_KAFKA_CONF_OK;
    for (const char *l = props; l && *l && !bad;) { /* "name=value\n" lines */
        const char *nl = strchr(l, '\n'), *eq = strchr(l, '=');
        size_t ll = nl ? (size_t)(nl - l) : strlen(l);
        char line[1024];
        if (eq && eq < l + ll && ll < sizeof(line)) {
            memcpy(line, l, ll);
            line[ll] = 0;
            line[eq - l] = 0;
            bad = cp_rk.rd_kafka_conf_set(conf, line, line + (eq - l) + 1, errstr, errlen) !=
                  RD_KAFKA_CONF_OK;
        }
        l += ll + (nl ? 1 : 0);
    }
    if (bad) {
        cp_rk.rd_kafka_conf_destroy(conf);
        free(k->q);
        free(k);
        return cp_err_set(err, CP_EKAFKA, "%s", errstr);
    }
    cp_rk.rd_kafka_conf_set_log_cb(conf, quiet_log);
    cp_rk.rd_kafka_conf_set_error_cb(conf, on_error);
    cp_rk.rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    cp_rk.rd_kafka_conf_set_opaque(conf, k);
    k->rk = cp_rk.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, errlen);
    if (!k->rk) {
        cp_rk.rd_kafka_conf_destroy(conf);
        free(k->q);
        free(k);
        return cp_err_set(err, CP_EKAFKA, "producer for %s: %s", brokers, errstr);
    }
    k->rkt = cp_rk.rd_kafka_topic_new(k->rk, topic, NULL);
    if (!k->rkt) {
        cp_err_set(err, CP_EKAFKA, "topic %s: %s", topic,
                   cp_rk.rd_kafka_err2str(cp_rk.rd_kafka_last_error()));
        cp_rk.rd_kafka_destroy(k->rk);
        free(k->q);
        free(k);
        return CP_EKAFKA;
    }
    *out = k;
    return 0;
nomem:
    if (conf) cp_rk.rd_kafka_conf_destroy(conf);
    free(k->q);
    free(k);
    return cp_err_set(err, CP_ENOMEM, "out of memory creating the Kafka producer");
}

static void pump(cp_kafka *k)
{
    while (k->n > 0) {
        msg *m = &k->q[k->head];
        int rc = cp_rk.rd_kafka_produce(k->rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_FREE,
                                        m->value, m->len, m->key, m->klen, NULL);
        if (rc != 0) {
            rd_kafka_resp_err_t e = cp_rk.rd_kafka_last_error();
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) return; /* keep it for later */
            give_up(k, m);
            free(m->value);
            if (e == RD_KAFKA_RESP_ERR__FATAL) k->fatal = 1;
        }
        free(m->key); /* librdkafka copies keys */
        m->value = m->key = NULL;
        k->head = (k->head + 1) % k->cap;
        k->n--;
    }
}

void cp_kafka_send(cp_kafka *k, uint8_t *value, size_t len, uint8_t *key, size_t klen)
{
    if (k->n == k->cap) { /* drop the oldest */
        msg *o = &k->q[k->head];
        give_up(k, o);
        free(o->value);
        free(o->key);
        k->head = (k->head + 1) % k->cap;
        k->n--;
    }
    msg *m = &k->q[(k->head + k->n) % k->cap];
    *m = (msg){.value = value, .len = len, .key = key, .klen = klen};
    k->n++;
    pump(k);
}

void cp_kafka_poll(cp_kafka *k)
{
    cp_rk.rd_kafka_poll(k->rk, 0);
    pump(k);
}

uint64_t cp_kafka_take_dropped(cp_kafka *k)
{
    uint64_t d = k->dropped;
    k->dropped = 0;
    return d;
}

int cp_kafka_failed(cp_kafka *k)
{
    return k->fatal;
}

int64_t cp_kafka_down_ns(const cp_kafka *k)
{
    return k->all_down ? mono_ns() - k->down_since : 0;
}

uint64_t cp_kafka_destroy(cp_kafka *k, int timeout_ms)
{
    if (!k) return 0;
    pump(k);
    if (timeout_ms > 0) cp_rk.rd_kafka_flush(k->rk, timeout_ms);
    cp_rk.rd_kafka_purge(k->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    cp_rk.rd_kafka_poll(k->rk, 0); /* purged messages: delivery reports with errors */
    for (uint32_t i = 0; i < k->n; i++) {
        msg *m = &k->q[(k->head + i) % k->cap];
        give_up(k, m);
        free(m->value);
        free(m->key);
    }
    uint64_t lost = k->dropped;
    cp_rk.rd_kafka_topic_destroy(k->rkt);
    cp_rk.rd_kafka_destroy(k->rk);
    free(k->q);
    free(k);
    return lost;
}

void cp_kafka_abandon(cp_kafka *k)
{
    (void)k;
}
