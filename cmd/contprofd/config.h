/* contprofd's configuration: a file of `key = value` lines (# comments), overridden by the
 * command line. Unknown keys are errors naming the line, so typos do not pass silently;
 * `kafka.<property>` lines go to librdkafka as they are and `token.<tenant>` lines map bearer
 * tokens to tenants. */
#ifndef CP_QUERY_CONFIG_H
#define CP_QUERY_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "vec.h"

/* Where the store lives without data = or --data. */
#define CP_CONFIG_DEFAULT_DATA_DIR "/var/lib/contprof"

typedef struct cp_kv {
    char *key, *value; /* owned */
} cp_kv;

typedef struct cp_config {
    char *data_dir;  /* data = DIR (default CP_CONFIG_DEFAULT_DATA_DIR) */
    char *http_host; /* listen = HOST:PORT (default CP_DEFAULT_LISTEN) */
    int http_port;
    char *brokers; /* brokers = LIST; "" = embedded broker */
    char *topic, *dlq_topic, *group_id;
    uint32_t embedded_partitions;
    int64_t retention_raw_ns, retention_rollup_ns;
    /* query limits */
    int64_t max_range_ns, query_timeout_ns, idle_timeout_ns;
    uint32_t concurrency, max_queued, max_connections, max_nodes_default, max_nodes_limit;
    size_t max_response_bytes, max_header_bytes, max_url_bytes, cache_bytes, gzip_min_bytes;
    size_t stack_cache_bytes; /* store.stack_cache_bytes: the writer's stack caches */
    size_t memory_budget;     /* store.memory_budget: the writer's open rollup buckets */
    uint64_t max_blocks;
    /* what clients may hold (see query/README.md) */
    int64_t request_timeout_ns, write_timeout_ns;
    size_t output_budget;
    uint32_t cheap_concurrency, max_conns_per_client, healthz_connections;
    char *metrics_token;  /* metrics.token; NULL = the tenants' tokens (when any) */
    CP_VEC(cp_kv) kafka;  /* kafka.<prop> = value, prefix stripped */
    CP_VEC(cp_kv) tokens; /* token.<tenant> = secret: key = tenant, value = secret */
    char *log_level;
    /* server-side symbolization (query/symbols.c) */
    char *symbols_dirs; /* symbols.dirs = DIR[:DIR...] (default /usr/lib/debug/.build-id) */
    size_t symbols_max_upload_bytes, symbols_max_table_bytes, symbols_cache_bytes;
    /* Pyroscope's ingest (query/pyro.h): a request's body; requests at once (429 beyond) */
    size_t ingest_max_body_bytes;
    uint32_t ingest_max_concurrent;
    /* a node of a cluster (query/fanout.c, ingest/assign.c); NULL = alone */
    char *cluster_peers;             /* cluster.peers = http://h:p,... (own URL may be listed) */
    char *cluster_partitions;        /* cluster.partitions = 0-3: the partitions this node owns */
    char *cluster_token;             /* cluster.token: what peers present to each other */
    int64_t cluster_peer_timeout_ns; /* cluster.peer_timeout: longest wait for a peer's part */
    /* on-demand captures (query/captures.h): captures.* limits; control_topic (Kafka name) */
    uint32_t capture_max_concurrent, capture_max_hz, capture_max_overhead_permille;
    int64_t capture_max_duration_ns;
    size_t capture_min_alloc_rate;
    char *control_topic; /* NULL = CP_TOPIC_CONTROL */
    /* relay.dir: the host's relay (collector/relay/README.md); NULL = DATA/relay, "off" = none */
    char *relay_dir;
} cp_config;

/* Sets every default. cp_config_close frees what is set. */
int cp_config_init(cp_config *c);
void cp_config_close(cp_config *c);

/* Applies one setting (as from a file line or the command line). CP_EPARSE names the key
 * and what was expected. */
int cp_config_set(cp_config *c, const char *key, const char *value, cp_err *err);

/* Reads a file of `key = value` lines; err names the file and line. */
int cp_config_load(cp_config *c, const char *path, cp_err *err);

/* Splits "host:port" or "[v6]:port" into c->http_host / c->http_port. */
int cp_config_set_listen(cp_config *c, const char *addr, cp_err *err);

/* 1 if host is a loopback address (127.0.0.0/8, ::1, localhost). */
int cp_config_is_loopback(const char *host);

#endif
