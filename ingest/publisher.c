/* The control producer (model/capture.h): one idempotent librdkafka producer; each publish waits
 * for its own delivery report. */
#include "publisher.h"
#include "log.h"
#include "times.h"

#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct cp_publisher {
    rd_kafka_t *rk;
    char *topic;
};

/* One message's delivery, set by the delivery report (on whichever thread polls). */
typedef struct delivery {
    atomic_int done;
    rd_kafka_resp_err_t err;
} delivery;

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    delivery *d = m->_private;
    if (!d) return;
    d->err = m->err;
    atomic_store(&d->done, 1);
}

int cp_publisher_create(const char *brokers, const char *const *kafka_props, const char *topic,
                        cp_publisher **out, cp_err *err)
{
    *out = NULL;
    cp_publisher *c = calloc(1, sizeof *c);
    if (!c || !(c->topic = strdup(topic && *topic ? topic : CP_TOPIC_CONTROL))) {
        free(c);
        return cp_err_set(err, CP_ENOMEM, "control producer");
    }
    char es[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *const fixed[] = {"enable.idempotence",
                                 "true",
                                 "linger.ms",
                                 "0",
                                 "message.timeout.ms",
                                 "10000",
                                 "message.max.bytes",
                                 "16777216",
                                 "compression.codec",
                                 "lz4",
                                 "client.id",
                                 topic && *topic && strcmp(topic, CP_TOPIC_CONTROL)
                                     ? "contprofd-profiles"
                                     : "contprofd-control",
                                 NULL};
    int rc = 0;
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, es, sizeof es) != RD_KAFKA_CONF_OK)
        rc = cp_err_set(err, CP_EKAFKA, "control producer: bootstrap.servers: %s", es);
    for (int i = 0; !rc && fixed[i]; i += 2)
        if (rd_kafka_conf_set(conf, fixed[i], fixed[i + 1], es, sizeof es) != RD_KAFKA_CONF_OK)
            rc = cp_err_set(err, CP_EKAFKA, "control producer: %s: %s", fixed[i], es);
    for (const char *const *kv = kafka_props; !rc && kv && kv[0] && kv[1]; kv += 2)
        rd_kafka_conf_set(conf, kv[0], kv[1], es, sizeof es); /* consumer-only ones ignored */
    if (rc) {
        rd_kafka_conf_destroy(conf);
        cp_publisher_destroy(c);
        return rc;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    /* the profiles topic's envelopes are keyed by series; librdkafka's default partitioner
     * hashes keys as the agent's and `contprof import`'s producers do */
    if (!(c->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof es))) {
        rd_kafka_conf_destroy(conf);
        cp_publisher_destroy(c);
        return cp_err_set(err, CP_EKAFKA, "control producer: %s", es);
    }
    *out = c;
    return 0;
}

void cp_publisher_destroy(cp_publisher *c)
{
    if (!c) return;
    if (c->rk) {
        rd_kafka_flush(c->rk, 2000);
        rd_kafka_purge(c->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(c->rk, 0);
        rd_kafka_destroy(c->rk);
    }
    free(c->topic);
    free(c);
}

int cp_publisher_produce(cp_publisher *pub, const cp_publisher_message *m, size_t n,
                         size_t max_message, int64_t timeout_ns, cp_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (max_message && m[i].value_len > max_message)
            return cp_err_set(err, CP_ELIMIT,
                              "message %zu of %zu is %zu bytes, over the broker's limit of %zu "
                              "bytes per message",
                              i + 1, n, m[i].value_len, max_message);
    delivery *d = calloc(n ? n : 1, sizeof *d);
    if (!d) return cp_err_set(err, CP_ENOMEM, "producing to %s", pub->topic);
    int64_t until = cp_mono_ns() + (timeout_ns > 0 ? timeout_ns : 5000000000LL);
    size_t sent = 0;
    int rc = 0;
    for (; sent < n && !rc; sent++) {
        for (;;) {
            rd_kafka_resp_err_t ke = rd_kafka_producev(
                pub->rk, RD_KAFKA_V_TOPIC(pub->topic), RD_KAFKA_V_KEY(m[sent].key, m[sent].key_len),
                RD_KAFKA_V_VALUE((void *)m[sent].value, m[sent].value_len),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(&d[sent]),
                RD_KAFKA_V_END);
            if (!ke) break;
            if (ke == RD_KAFKA_RESP_ERR__QUEUE_FULL && cp_mono_ns() < until) {
                rd_kafka_poll(pub->rk, 10);
                continue;
            }
            rc = cp_err_set(err, ke == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ? CP_ELIMIT : CP_EKAFKA,
                            "producing message %zu of %zu (%zu bytes) to %s: %s", sent + 1, n,
                            m[sent].value_len, pub->topic, rd_kafka_err2str(ke));
            break;
        }
    }
    if (rc) sent--; /* the one refused was not sent */
    size_t done = 0;
    while (cp_mono_ns() < until) {
        done = 0;
        for (size_t i = 0; i < sent; i++)
            done += (size_t)atomic_load(&d[i].done);
        if (done == sent) break;
        rd_kafka_poll(pub->rk, 5);
    }
    if (done < sent) {
        /* d stays with the messages: their reports may still come (publish's reason) */
        if (!rc)
            rc = cp_err_set(err, CP_EKAFKA,
                            "%s did not acknowledge %zu of %zu messages within %.1f s", pub->topic,
                            sent - done, n,
                            (double)(timeout_ns > 0 ? timeout_ns : 5000000000LL) / 1e9);
        return rc;
    }
    for (size_t i = 0; i < sent && !rc; i++)
        if (d[i].err)
            rc = cp_err_set(
                err, d[i].err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ? CP_ELIMIT : CP_EKAFKA,
                "writing message %zu of %zu to %s: %s", i + 1, n, pub->topic,
                rd_kafka_err2str(d[i].err));
    free(d);
    return rc;
}

int cp_publisher_publish(cp_publisher *ctl, const cp_capture *c, const char *token,
                         int64_t timeout_ns, cp_err *err)
{
    if (cp_capture_validate(c, err)) return CP_EINVAL;
    cp_buf b = {0};
    if (cp_capture_encode(c, token, &b)) return cp_err_set(err, CP_ENOMEM, "capture message");
    delivery *d = calloc(1, sizeof *d);
    if (!d) {
        cp_buf_close(&b);
        return cp_err_set(err, CP_ENOMEM, "capture message");
    }
    rd_kafka_resp_err_t ke = rd_kafka_producev(
        ctl->rk, RD_KAFKA_V_TOPIC(ctl->topic), RD_KAFKA_V_KEY(c->id, strlen(c->id)),
        RD_KAFKA_V_VALUE(b.data, b.len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_OPAQUE(d), RD_KAFKA_V_END);
    cp_buf_close(&b);
    if (ke) {
        free(d);
        return cp_err_set(err, CP_EKAFKA, "capture %s: producing to %s: %s", c->id, ctl->topic,
                          rd_kafka_err2str(ke));
    }
    int64_t until = cp_mono_ns() + (timeout_ns > 0 ? timeout_ns : 5000000000LL);
    while (!atomic_load(&d->done) && cp_mono_ns() < until)
        rd_kafka_poll(ctl->rk, 10);
    if (!atomic_load(&d->done)) {
        /* d stays with the message: its report (the message times out within
         * message.timeout.ms) may still come; leaked rather than written after free */
        return cp_err_set(
            err, CP_EKAFKA, "capture %s: the control topic %s did not acknowledge within %.1f s",
            c->id, ctl->topic, (double)(timeout_ns > 0 ? timeout_ns : 5000000000LL) / 1e9);
    }
    ke = d->err;
    free(d);
    if (ke)
        return cp_err_set(err, CP_EKAFKA, "capture %s: writing to %s: %s", c->id, ctl->topic,
                          rd_kafka_err2str(ke));
    return 0;
}
