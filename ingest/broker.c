/* The embedded broker: a librdkafka mock cluster in this process (see broker.h). */
#include "broker.h"
#include "capture.h"
#include "log.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdlib.h>
#include <string.h>

struct cp_broker {
    rd_kafka_t *rk; /* the handle that owns the cluster */
    rd_kafka_mock_cluster_t *mc;
    char *bootstraps;
};

int cp_broker_create(const cp_broker_options *opt, cp_broker **out, cp_err *err)
{
    *out = NULL;
    int nb = opt && opt->brokers > 0 ? opt->brokers : 1;
    int np = opt && opt->partitions > 0 ? opt->partitions : CP_BROKER_DEFAULT_PARTITIONS;
    cp_broker *b = calloc(1, sizeof *b);
    if (!b) return cp_err_set(err, CP_ENOMEM, "broker");
    char es[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* this handle only hosts the cluster; keep it quiet */
    rd_kafka_conf_set(conf, "log_level", "3", es, sizeof es);
    b->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof es);
    int rc;
    if (!b->rk) {
        rd_kafka_conf_destroy(conf);
        rc = cp_err_set(err, CP_EKAFKA, "embedded broker: %s", es);
        goto fail;
    }
    b->mc = rd_kafka_mock_cluster_new(b->rk, nb);
    if (!b->mc) {
        rc = cp_err_set(err, CP_EKAFKA, "embedded broker: cannot start the mock cluster");
        goto fail;
    }
    rd_kafka_resp_err_t ke = rd_kafka_mock_topic_create(b->mc, CP_TOPIC_PROFILES, np, 1);
    if (!ke) ke = rd_kafka_mock_topic_create(b->mc, CP_TOPIC_DLQ, 1, 1);
    /* captures (model/capture.h): one partition, every agent reads all of it */
    if (!ke) ke = rd_kafka_mock_topic_create(b->mc, CP_TOPIC_CONTROL, 1, 1);
    if (ke) {
        rc = cp_err_set(err, CP_EKAFKA, "embedded broker: creating topics: %s",
                        rd_kafka_err2str(ke));
        goto fail;
    }
    b->bootstraps = strdup(rd_kafka_mock_cluster_bootstraps(b->mc));
    if (!b->bootstraps) {
        rc = cp_err_set(err, CP_ENOMEM, "broker");
        goto fail;
    }
    cp_log_info("embedded Kafka (in-memory mock cluster, %d broker(s), %s with %d partitions) "
                "at %s",
                nb, CP_TOPIC_PROFILES, np, b->bootstraps);
    *out = b;
    return 0;
fail:
    cp_broker_destroy(b);
    return rc;
}

const char *cp_broker_bootstraps(const cp_broker *b)
{
    return b->bootstraps;
}

int cp_broker_set_up(cp_broker *b, int broker_id, int up, cp_err *err)
{
    rd_kafka_resp_err_t e = up ? rd_kafka_mock_broker_set_up(b->mc, broker_id)
                               : rd_kafka_mock_broker_set_down(b->mc, broker_id);
    if (e)
        return cp_err_set(err, CP_EKAFKA, "embedded broker %d: %s", broker_id, rd_kafka_err2str(e));
    return 0;
}

int cp_broker_set_leader(cp_broker *b, const char *topic, int partition, int broker_id, cp_err *err)
{
    rd_kafka_resp_err_t e = rd_kafka_mock_partition_set_leader(b->mc, topic, partition, broker_id);
    if (e)
        return cp_err_set(err, CP_EKAFKA, "embedded broker: leader of %s [%d]: %s", topic,
                          partition, rd_kafka_err2str(e));
    return 0;
}

int cp_broker_set_coordinator(cp_broker *b, const char *group, int broker_id, cp_err *err)
{
    rd_kafka_resp_err_t e = rd_kafka_mock_coordinator_set(b->mc, "group", group, broker_id);
    if (e)
        return cp_err_set(err, CP_EKAFKA, "embedded broker: coordinator of %s: %s", group,
                          rd_kafka_err2str(e));
    return 0;
}

void cp_broker_destroy(cp_broker *b)
{
    if (!b) return;
    if (b->mc) rd_kafka_mock_cluster_destroy(b->mc);
    if (b->rk) rd_kafka_destroy(b->rk);
    free(b->bootstraps);
    free(b);
}
