/* contprofd: the daemon that owns a store. It opens the store, hosts the embedded Kafka
 * broker when no brokers are configured, runs the ingest consumer into the store, and
 * answers the query API over HTTP, all in one process (LevelDB allows one per database).
 * SIGINT/SIGTERM stop it cleanly: in-flight batch written, queries answered, store closed. */
#include <getopt.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "check.h"
#include "config.h"
#include "relay.h"
#include "relayd.h"
#include "defaults.h"
#include "fanout.h"
#include "http_client.h"
#include "http.h"
#include "log.h"
#include "store.h"
#include "assign.h"
#include "broker.h"
#include "ingest.h"
#include "publisher.h"

typedef struct daemon {
    cp_config cfg;
    uv_loop_t *loop;
    cp_store *store;
    cp_api *api;
    cp_captures *captures; /* the server's captures (query/captures.h) */
    cp_symbols *symbols;
    cp_http_server *http;
    cp_fanout *fanout; /* the cluster's peers; NULL = alone */
    uv_signal_t sigint, sigterm;
    uv_timer_t health_timer;
    int stopping;
    cp_broker *broker;
    cp_ingest *ingest;
    const char **tenant_tokens; /* tenant, token pairs: ingest's checks, captures' signers */
    const char **kafka_props;   /* kafka.* key, value pairs: ingest's and the producers' */
    cp_metrics *metrics;        /* the statistics registry every stage registers in */
    cp_publisher *publisher;    /* captures to the control topic (ingest/publisher.h) */
    cp_publisher *profiles;     /* Pyroscope's ingest to the profiles topic (query/pyro.h) */
    cp_relay *relay;            /* the host's relay (collector/relay/relayd.h); NULL = none */
} daemon_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: contprofd [--config FILE] [--data DIR] [--http ADDR:PORT] [--brokers LIST]\n"
            "                 [--peers URL,URL,... --partitions A-B]\n"
            "  --config FILE     key = value settings (see cmd/README.md)\n"
            "  --data DIR        the store's directory (default " CP_CONFIG_DEFAULT_DATA_DIR ")\n"
            "  --http ADDR:PORT  the query API's address (default " CP_DEFAULT_LISTEN ")\n"
            "  --brokers LIST    Kafka bootstrap servers; none = the embedded broker\n"
            "  --peers LIST      a cluster node: the other nodes' http://HOST:PORT URLs, asked\n"
            "                    for their part of every query (cluster.peers)\n"
            "  --partitions A-B  the topic's partitions this node owns and ingests, e.g. 0-3 or\n"
            "                    0,4-5 (cluster.partitions); none = the consumer group\n"
            "  --offsets         print the Kafka offsets stored in the store at --data (no\n"
            "                    contprofd may have it open), as cluster.partitions P@OFFSET\n"
            "                    items for the node that takes a partition over\n"
            "  --repair          repair the store at --data (no contprofd may have it open):\n"
            "                    LevelDB's repair, then dictionaries, indexes and rollups\n"
            "                    checked and rebuilt; prints what was lost, exits 0 if the\n"
            "                    store opens again\n");
}

/* ---- ingest's state for the API --------------------------------------------------- */

/* /healthz and GET /api/v1/ingest/offsets (issue 13): ingest's state and its partitions.
 * The arrays are static: the callback runs on the loop thread only. Ingest's counters are
 * in the statistics registry (cp_ingest_register_metrics), not here. */
static void ingest_stats_cb(void *arg, cp_api_ingest_stats *out)
{
    enum { MAXP = 256 };
    static cp_partition_offsets parts[MAXP];
    static cp_thread_owner loop_thread;
    CP_ASSERT_THREAD(&loop_thread, "loop thread only");
    daemon_t *d = arg;
    memset(out, 0, sizeof *out);
    if (!d->ingest) return;
    cp_ingest_stats st;
    cp_ingest_get_stats(d->ingest, &st);
    out->available = 1;
    out->paused = st.paused;
    snprintf(out->paused_reason, sizeof out->paused_reason, "%s", st.pause_reason);
    out->running = st.running;
    out->ready = st.ready;
    out->topic = d->cfg.topic && *d->cfg.topic ? d->cfg.topic : CP_TOPIC_PROFILES;
    out->max_message_bytes = d->broker ? CP_BROKER_MAX_MESSAGE_BYTES : 0;
    out->max_in_flight_bytes = d->broker ? CP_BROKER_MAX_IN_FLIGHT_BYTES : 64u << 20;
    uint32_t n = cp_ingest_get_partitions(d->ingest, parts, MAXP);
    out->nparts = n < MAXP ? n : MAXP;
    out->parts = parts;
}

/* Every 5 s: logs it if ingest has stopped for good. */
static void on_health_timer(uv_timer_t *t)
{
    daemon_t *d = t->data;
    if (!d->ingest) return;
    cp_ingest_stats st;
    cp_ingest_get_stats(d->ingest, &st);
    if (st.failed) cp_log_error("ingest stopped: %s", st.error);
}

/* ---- captures ----------------------------------------------------------------------- */

/* The API's writer of capture states (query/captures.h): the control topic's producer,
 * which exists once Kafka is up (before the loop runs, so before any request). */
static int publish_capture(void *arg, const cp_capture *c, const char *token, cp_err *err)
{
    daemon_t *d = arg;
    if (!d->publisher) return cp_err_set(err, CP_EKAFKA, "the control topic is not open yet");
    return cp_publisher_publish(d->publisher, c, token, 5000000000LL, err);
}

/* The API's writer for Pyroscope's ingest (query/pyro.h): the profiles topic's producer,
 * open before the loop runs; within the embedded broker's message limit. */
static int produce_profiles(void *arg, const cp_pyro_message *msgs, size_t n, cp_err *err)
{
    daemon_t *d = arg;
    if (!d->profiles) return cp_err_set(err, CP_EKAFKA, "the profiles topic is not open yet");
    cp_publisher_message *m = calloc(n ? n : 1, sizeof *m);
    if (!m) return cp_err_set(err, CP_ENOMEM, "producing profiles");
    for (size_t i = 0; i < n; i++)
        m[i] =
            (cp_publisher_message){msgs[i].key, msgs[i].value, msgs[i].key_len, msgs[i].value_len};
    int rc = cp_publisher_produce(d->profiles, m, n, d->broker ? CP_BROKER_MAX_MESSAGE_BYTES : 0,
                                  10000000000LL, err);
    free(m);
    return rc;
}

/* ---- the relay ---------------------------------------------------------------------- */

/* This host's relay (collector/relay/README.md): processes here hand their windows to it
 * over its socket, it holds the one producer. relay.dir off: none. A relay that cannot
 * start (another one answers on the socket, a directory it may not use) is logged and
 * contprofd goes on without: the agents then spool or use Kafka directly. */
static int start_relay(daemon_t *d, const char *bootstrap, cp_err *err)
{
    if (d->cfg.relay_dir && (!*d->cfg.relay_dir || !strcmp(d->cfg.relay_dir, "off"))) return 0;
    char dir[1024];
    if (d->cfg.relay_dir)
        snprintf(dir, sizeof(dir), "%s", d->cfg.relay_dir);
    else
        snprintf(dir, sizeof(dir), "%s/relay", d->cfg.data_dir);
    cp_buf props = {0};
    for (uint32_t i = 0; i < d->cfg.kafka.n; i++)
        if (cp_buf_printf(&props, "%s=%s\n", d->cfg.kafka.v[i].key, d->cfg.kafka.v[i].value))
            return cp_err_set(err, CP_ENOMEM, "out of memory");
    /* the capture list it serves is asked of this contprofd (with tokens, agents ask it
     * themselves with theirs: CONTPROF_SERVER and CONTPROF_TOKEN) */
    char self[64] = "";
    if (!d->cfg.tokens.n)
        snprintf(self, sizeof(self), "http://127.0.0.1:%d", cp_http_server_port(d->http));
    cp_relay_options ro = {
        .dir = dir,
        .brokers = bootstrap,
        .topic = d->cfg.topic,
        .kafka_props = props.data ? (const char *)props.data : "",
        .server = self,
    };
    cp_err rerr = {0};
    int rc = cp_relay_create(&ro, &d->relay, &rerr);
    cp_buf_close(&props);
    if (rc) {
        cp_log_warn("no relay on this host: %s", rerr.msg);
        return 0;
    }
    if (cp_relay_register_metrics(d->relay, d->metrics) || cp_relay_start(d->relay, err) ||
        cp_api_set_relay(d->api, dir))
        return err->code ? err->code : cp_err_set(err, CP_ENOMEM, "out of memory");
    cp_log_info("relay for this host's processes at %s/%s (CONTPROF_RELAY=%s)", dir,
                CP_RELAY_SOCKET, dir);
    return 0;
}

/* ---- shutdown ----------------------------------------------------------------------- */

/* How long a stop waits for ingest to store what the embedded broker holds (a backlog
 * under a slow disk or a sanitizer takes seconds; systemd waits 90 s). */
#define STOP_DRAIN_NS (15 * (int64_t)1000000000)

static void on_http_closed(void *arg)
{
    daemon_t *d = arg;
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->health_timer, NULL);
}

static void on_signal(uv_signal_t *s, int signum)
{
    daemon_t *d = s->data;
    if (d->stopping) {
        cp_log_warn("second signal %d: still finishing; send SIGKILL to abandon", signum);
        return;
    }
    d->stopping = 1;
    cp_log_info("signal %d: stopping (finishing the in-flight batch and queries)", signum);
    /* The relay first: its socket goes (senders spool from now on) and what it holds goes
     * to Kafka or its spool. Then, with the embedded broker, whose log dies with this
     * process, ingest reads it to its end (bounded) before it stops. */
    cp_relay_destroy(d->relay, 2 * (int64_t)1000000000);
    d->relay = NULL;
    if (d->broker && d->ingest && cp_ingest_drain(d->ingest, STOP_DRAIN_NS) != 0)
        cp_log_warn("stopping: ingest did not store all the embedded broker held within %d s: "
                    "the rest is lost (counted as sequence gaps after the restart)",
                    (int)(STOP_DRAIN_NS / 1000000000));
    /* Blocks until the in-flight batch is written with its offsets. */
    if (d->ingest) cp_ingest_stop(d->ingest);
    cp_http_server_shutdown(d->http, on_http_closed, d);
}

/* ---- repair ------------------------------------------------------------------------- */

static int repair(const cp_config *cfg)
{
    const char *dir = cfg->data_dir;
    cp_store_options so = {.path = dir, .retention_raw_ns = cfg->retention_raw_ns};
    cp_err err = {0};
    cp_store_repair_stats st;
    printf("repairing the store %s\n", dir);
    if (cp_store_repair(&so, stdout, &st, &err)) {
        fprintf(stderr, "contprofd: %s\n", err.msg);
        return 1;
    }
    printf("store %s repaired: it opens again. Lost: about %llu bytes of write-ahead log, "
           "%llu dictionary ids (and %llu entries that referred to them), %llu series, "
           "%llu blocks, %llu block rows of lost stacks, %llu windows; %llu rollup buckets "
           "recomputed, %llu blocks rewritten\n",
           dir, (unsigned long long)st.log_bytes_dropped, (unsigned long long)st.dict_missing,
           (unsigned long long)st.dict_dropped, (unsigned long long)st.series_missing,
           (unsigned long long)st.blocks_dropped, (unsigned long long)st.rows_dropped,
           (unsigned long long)st.windows_lost, (unsigned long long)st.rollups_rebuilt,
           (unsigned long long)st.blocks_rewritten);
    return 0;
}

/* ---- handing a partition over ------------------------------------------------------- */

/* Prints, per partition of the topic, the next offset stored with the data: where a node
 * that takes the partition over starts (cluster.partitions P@OFFSET). */
static int print_offsets(const cp_config *cfg)
{
    cp_store_options so = {.path = cfg->data_dir};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&so, &s, &err)) {
        fprintf(stderr, "contprofd: %s\n", err.msg);
        return 1;
    }
    const char *topic = cfg->topic && *cfg->topic ? cfg->topic : CP_TOPIC_PROFILES;
    int n = 0;
    for (int32_t p = 0; p < CP_ASSIGN_MAX_PARTITION; p++) {
        int64_t next;
        if (cp_store_get_offset(s, topic, p, &next, &err) == 0)
            printf("%s%d@%lld", n++ ? "," : "", p, (long long)next);
    }
    if (n)
        printf("\n");
    else
        printf("no offsets of %s stored in %s\n", topic, cfg->data_dir);
    cp_store_close(s);
    return 0;
}

/* ---- start-up ----------------------------------------------------------------------- */

static int cluster_peers(daemon_t *d, const int32_t *parts, uint32_t nparts, cp_err *err);

/* The cluster's side of the query API (query/README.md "A cluster of nodes"). */
static int cluster_create(daemon_t *d, cp_err *err)
{
    const cp_config *c = &d->cfg;
    int32_t *parts = NULL;
    uint32_t nparts = 0;
    /* checked here, before anything starts, rather than when ingest assigns them */
    if (c->cluster_partitions && cp_assign_parse(c->cluster_partitions, &parts, NULL, &nparts, err))
        return err->code;
    int rc = cluster_peers(d, parts, nparts, err);
    free(parts);
    return rc;
}

/* The fan-out of cluster.peers, given this node's partitions; 0 when there are no peers. */
static int cluster_peers(daemon_t *d, const int32_t *parts, uint32_t nparts, cp_err *err)
{
    const cp_config *c = &d->cfg;
    if (!c->cluster_peers || !*c->cluster_peers) return 0;
    /* nodes pass each other parts and capture records (local=1): only the cluster secret
     * tells a peer from anyone who can connect, with or without tenant tokens (issue 36) */
    if (!c->cluster_token && nparts)
        return cp_err_set(err, CP_EINVAL,
                          "cluster.peers needs cluster.token = SECRET (at least 8 characters, "
                          "the same on every node): peers present it to each other, and a "
                          "part request (local=1) without it is refused");
    /* a tenant holding the cluster token could read every tenant's data as a peer */
    for (uint32_t i = 0; c->cluster_token && i < c->tokens.n; i++)
        if (strcmp(c->tokens.v[i].value, c->cluster_token) == 0)
            return cp_err_set(err, CP_EINVAL,
                              "cluster.token is also token.%s: the cluster token must differ "
                              "from every tenant's (it reads any tenant's data)",
                              c->tokens.v[i].key);
    char self[300];
    snprintf(self, sizeof self, "http://%s%s%s:%d", strchr(c->http_host, ':') ? "[" : "",
             c->http_host, strchr(c->http_host, ':') ? "]" : "", c->http_port);
    cp_fanout_options fo = {.peers = c->cluster_peers,
                            .self = c->http_port ? self : NULL,
                            .token = c->cluster_token,
                            .timeout_ns = c->cluster_peer_timeout_ns,
                            .max_body = c->max_response_bytes,
                            .own = parts,
                            .nown = nparts};
    if (cp_fanout_create(&fo, &d->fanout, err)) return err->code;
    /* Without its own partitions a node joins a consumer group: after a restart the others
     * re-read its partitions from their stored offsets, each partition then lives on two
     * nodes, and every answer counts it twice. Ownership is stated, never negotiated. */
    if (!nparts) {
        cp_fanout_destroy(d->fanout);
        d->fanout = NULL;
        return cp_err_set(err, CP_EINVAL,
                          "cluster.peers needs cluster.partitions (--partitions A-B): each node "
                          "of a cluster stores the partitions it is given, so no partition is "
                          "stored twice");
    }
    cp_log_info("cluster: %u peer(s) asked for their part of every query: %s",
                cp_fanout_npeers(d->fanout), c->cluster_peers);
    return 0;
}

static int apply_log_level(const char *lvl)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(lvl, names[i]) == 0) {
            cp_log_level = i;
            return 0;
        }
    return -1;
}

/* ---- the command line --------------------------------------------------------------- */

/* What the command line asks: settings that override the configuration file's, and the
 * store maintenance modes that run instead of the daemon. */
typedef struct args {
    const char *config, *data, *http, *brokers, *peers, *partitions;
    int mode; /* 0 = the daemon, 1 = --repair, 2 = --offsets */
} args_t;

/* Reads argv into *a; returns -1 to go on, else the status to exit with. */
static int parse_args(int argc, char **argv, args_t *a)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"data", required_argument, 0, 'd'},
                                         {"http", required_argument, 0, 'H'},
                                         {"brokers", required_argument, 0, 'b'},
                                         {"help", no_argument, 0, 'h'},
                                         {"repair", no_argument, 0, 'R'},
                                         {"peers", required_argument, 0, 'P'},
                                         {"offsets", no_argument, 0, 'O'},
                                         {"partitions", required_argument, 0, 'A'},
                                         {0, 0, 0, 0}};
    int c;
    memset(a, 0, sizeof *a);
    while ((c = getopt_long(argc, argv, "c:d:H:b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a->config = optarg;
            break;
        case 'd':
            a->data = optarg;
            break;
        case 'H':
            a->http = optarg;
            break;
        case 'b':
            a->brokers = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'R':
            a->mode = 1;
            break;
        case 'P':
            a->peers = optarg;
            break;
        case 'O':
            a->mode = 2;
            break;
        case 'A':
            a->partitions = optarg;
            break;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "contprofd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The configuration file, then the command line's overrides over it, checked. */
static int load_config(cp_config *cfg, const args_t *a, cp_err *err)
{
    if (a->config && cp_config_load(cfg, a->config, err)) return err->code;
    if (a->data && cp_config_set(cfg, "data", a->data, err)) return err->code;
    if (a->http && cp_config_set_listen(cfg, a->http, err)) return err->code;
    if (a->brokers && cp_config_set(cfg, "brokers", a->brokers, err)) return err->code;
    if (a->peers && cp_config_set(cfg, "cluster.peers", a->peers, err)) return err->code;
    if (a->partitions && cp_config_set(cfg, "cluster.partitions", a->partitions, err))
        return err->code;
    if (apply_log_level(cfg->log_level))
        return cp_err_set(err, CP_EINVAL, "log.level '%s': expected error, warn, info or debug",
                          cfg->log_level);
    if (cfg->tokens.n == 0 && !cp_config_is_loopback(cfg->http_host))
        return cp_err_set(err, CP_EINVAL,
                          "refusing to listen on %s without tokens: configure token.<tenant> = "
                          "SECRET lines, or listen on a loopback address",
                          cfg->http_host);
    return 0;
}

/* ---- creating the objects ----------------------------------------------------------- */

/* The process's limits, before anything opens a file or starts a thread. */
static void set_process_limits(const cp_config *cfg)
{
    cp_ingest_malloc_policy();
    /* Every allowed connection needs a descriptor; the usual soft limit (1,024) is below
     * the default cap plus the store's and Kafka's own files. */
    struct rlimit nof;
    rlim_t want = (rlim_t)cfg->max_connections + cfg->healthz_connections + 512;
    if (getrlimit(RLIMIT_NOFILE, &nof) == 0 && nof.rlim_cur < want) {
        nof.rlim_cur = nof.rlim_max < want ? nof.rlim_max : want;
        if (setrlimit(RLIMIT_NOFILE, &nof) == 0 && nof.rlim_cur < want)
            cp_log_warn("open files limited to %llu: fewer than http.max_connections (%u) may be "
                        "served",
                        (unsigned long long)nof.rlim_cur, cfg->max_connections);
    }
    /* libuv sizes its threadpool once, at first use: give every query slot a thread. */
    char tp[16];
    snprintf(tp, sizeof tp, "%u", cfg->concurrency < 128 ? cfg->concurrency : 128);
    setenv("UV_THREADPOOL_SIZE", tp, 0);
}

/* The store and the statistics registry. */
static int store_create(daemon_t *d, cp_err *err)
{
    cp_store_options so = {.path = d->cfg.data_dir,
                           .retention_raw_ns = d->cfg.retention_raw_ns,
                           .retention_rollup_ns = d->cfg.retention_rollup_ns,
                           .cache_bytes = d->cfg.cache_bytes,
                           .stack_cache_bytes = d->cfg.stack_cache_bytes,
                           .memory_budget = d->cfg.memory_budget};
    if (cp_store_open(&so, &d->store, err)) return err->code;
    if (cp_metrics_create(&d->metrics)) return cp_err_set(err, CP_ENOMEM, "out of memory");
    cp_log_info("store %s open", d->cfg.data_dir);
    return 0;
}

static int pairs_of(const cp_kv *kv, uint32_t n, const char ***out, cp_err *err);

/* The server's captures over the open store and the cluster's peers, with the limits of
 * the captures.* settings, checked against their ceilings; tenants' tokens sign their
 * control messages. */
static int captures_create(daemon_t *d, const char *config, cp_err *err)
{
    cp_captures_options co;
    cp_captures_options_default(&co);
    co.max_concurrent = d->cfg.capture_max_concurrent;
    co.max_hz = d->cfg.capture_max_hz;
    co.max_overhead_permille = d->cfg.capture_max_overhead_permille;
    co.config_file = config;
    co.max_duration_ns = d->cfg.capture_max_duration_ns ? d->cfg.capture_max_duration_ns
                                                        : CP_CAPTURE_DURATION_CEIL_NS;
    co.min_alloc_rate = (int64_t)d->cfg.capture_min_alloc_rate;
    co.publish = publish_capture;
    co.publish_arg = d;
    if (co.max_hz > CP_CAPTURE_HZ_CEIL || co.max_duration_ns > CP_CAPTURE_DURATION_CEIL_NS ||
        co.max_overhead_permille > 1000 || co.max_concurrent > CP_CAPTURE_CONCURRENT_CEIL)
        return cp_err_set(err, CP_EINVAL,
                          "captures.max_hz is at most %d, captures.max_duration at most 24h, "
                          "captures.max_overhead_permille at most 1000, captures.max_concurrent "
                          "at most %d",
                          CP_CAPTURE_HZ_CEIL, CP_CAPTURE_CONCURRENT_CEIL);
    /* tenant, token pairs: the captures sign with them, ingest checks envelopes against them */
    if (pairs_of(d->cfg.tokens.v, d->cfg.tokens.n, &d->tenant_tokens, err)) return err->code;
    co.store = d->store;
    co.fanout = d->fanout;
    co.tenant_tokens = (const char *const *)d->tenant_tokens;
    if (cp_captures_create(&co, &d->captures)) return cp_err_set(err, CP_ENOMEM, "out of memory");
    return 0;
}

/* The symbol service, the cluster's fan-out and the query API over the open store. */
static int api_create(daemon_t *d, const char *config, cp_err *err)
{
    CP_VEC(cp_api_token) toks = {0};
    for (uint32_t i = 0; i < d->cfg.tokens.n; i++) {
        cp_api_token t = {d->cfg.tokens.v[i].value, d->cfg.tokens.v[i].key};
        if (cp_vec_push(&toks, t)) goto nomem;
    }
    cp_symbols_options syo;
    cp_symbols_options_default(&syo);
    syo.store = d->store;
    syo.dirs = d->cfg.symbols_dirs;
    syo.max_upload_bytes = d->cfg.symbols_max_upload_bytes;
    syo.max_table_bytes = d->cfg.symbols_max_table_bytes;
    syo.cache_bytes = d->cfg.symbols_cache_bytes;
    if (!(d->symbols = cp_symbols_create(&syo))) goto nomem;
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.symbols = d->symbols;
    ao.store = d->store;
    ao.tokens = toks.v;
    ao.ntokens = toks.n;
    ao.max_range_ns = d->cfg.max_range_ns;
    ao.max_blocks = d->cfg.max_blocks;
    ao.max_nodes_default = d->cfg.max_nodes_default;
    ao.max_nodes_limit = d->cfg.max_nodes_limit;
    ao.brokers = d->cfg.brokers;
    ao.metrics_token = d->cfg.metrics_token;
    if (cluster_create(d, err)) goto fail; /* the settings it refused are named in err */
    ao.fanout = d->fanout;
    ao.metrics = d->metrics;
    ao.ingest_stats = ingest_stats_cb;
    ao.ingest_arg = d;
    ao.pyro_produce = produce_profiles;
    ao.pyro_arg = d;
    if (captures_create(d, config, err)) goto fail;
    ao.captures = d->captures;
    d->api = cp_api_create(&ao); /* registers the API's families first */
    free(toks.v);
    if (!d->api || cp_store_register_metrics(d->store, d->metrics))
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    return 0;
nomem:
    cp_err_set(err, CP_ENOMEM, "out of memory");
fail:
    free(toks.v);
    return err->code;
}

/* SIGINT and SIGTERM, before the port is announced: one that arrives while HTTP binds or
 * Kafka connects is held by libuv and handled once the loop runs: a clean stop. */
static void signals_start(daemon_t *d)
{
    uv_signal_init(d->loop, &d->sigint);
    uv_signal_init(d->loop, &d->sigterm);
    d->sigint.data = d->sigterm.data = d;
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    signal(SIGPIPE, SIG_IGN);
}

/* The HTTP server of the query API, bound and listening. */
static int http_create(daemon_t *d, cp_err *err)
{
    const cp_config *c = &d->cfg;
    cp_http_options ho;
    cp_http_options_default(&ho);
    ho.host = c->http_host;
    ho.port = c->http_port;
    ho.concurrency = c->concurrency;
    ho.max_queued = c->max_queued;
    ho.max_connections = c->max_connections;
    ho.max_response_bytes = c->max_response_bytes;
    ho.max_header_bytes = c->max_header_bytes;
    ho.max_url_bytes = c->max_url_bytes;
    ho.gzip_min_bytes = c->gzip_min_bytes;
    ho.query_timeout_ns = c->query_timeout_ns;
    ho.idle_timeout_ns = c->idle_timeout_ns;
    ho.upload_path = "/api/v1/symbols";
    ho.max_upload_bytes = c->symbols_max_upload_bytes;
    static const char *const pyro_paths[] = {"/ingest", "/pyroscope/ingest",
                                             "/push.v1.PusherService/Push", NULL};
    ho.ingest_paths = pyro_paths;
    ho.max_ingest_bytes = c->ingest_max_body_bytes;
    ho.max_ingests = c->ingest_max_concurrent;
    ho.request_timeout_ns = c->request_timeout_ns;
    ho.write_timeout_ns = c->write_timeout_ns;
    ho.max_inflight_bytes = c->output_budget;
    ho.cheap_concurrency = c->cheap_concurrency;
    ho.peer_concurrency = d->fanout ? c->concurrency : 0; /* peers' parts: own slots */
    ho.max_conns_per_client = c->max_conns_per_client;
    ho.reserved_connections = c->healthz_connections;
    ho.handle = cp_api_handle;
    ho.is_light = cp_api_is_light;
    ho.admit = cp_api_admit;
    ho.observe = cp_api_observe;
    ho.ctx = d->api;
    if (cp_http_server_create(d->loop, &ho, &d->http, err)) return err->code;
    cp_log_info("query API on http://%s%s%s:%d/ (%s)", strchr(c->http_host, ':') ? "[" : "",
                c->http_host, strchr(c->http_host, ':') ? "]" : "", cp_http_server_port(d->http),
                c->tokens.n ? "tokens required" : "single tenant \"default\", no tokens");
    return 0;
}

/* The embedded broker when no brokers are configured; *bootstrap = the servers to use. */
static int broker_create(daemon_t *d, const char **bootstrap, cp_err *err)
{
    *bootstrap = d->cfg.brokers;
    if (**bootstrap) {
        cp_log_info("Kafka bootstrap servers: %s", *bootstrap);
        return 0;
    }
    cp_broker_options bo = {.partitions = (int)d->cfg.embedded_partitions};
    if (cp_broker_create(&bo, &d->broker, err)) return err->code;
    *bootstrap = cp_broker_bootstraps(d->broker);
    cp_log_info("Kafka bootstrap servers: %s (the embedded broker: in memory, about 5 MiB "
                "per partition; served at /api/v1/brokers)",
                *bootstrap);
    if (d->fanout)
        cp_log_warn("cluster with the embedded broker: its log lives in this process and "
                    "starts empty at each start, so what it holds unread dies with it and "
                    "the other nodes read its new log from the start (counted in "
                    "contprof_ingest_offset_resets_total). The embedded broker is for a "
                    "single node; run a cluster on a real, replicated Kafka (--brokers, "
                    "README.md \"The embedded broker and a real Kafka\")");
    return 0;
}

/* The key, value pairs of a config section, NULL-terminated, into *out (freed by the
 * caller; the strings stay the configuration's). */
static int pairs_of(const cp_kv *kv, uint32_t n, const char ***out, cp_err *err)
{
    CP_VEC(const char *) v = {0};
    for (uint32_t i = 0; i < n; i++)
        if (cp_vec_push(&v, kv[i].key) || cp_vec_push(&v, kv[i].value)) goto nomem;
    if (cp_vec_push(&v, NULL)) goto nomem;
    *out = v.v;
    return 0;
nomem:
    free(v.v);
    return cp_err_set(err, CP_ENOMEM, "out of memory");
}

/* The ingest consumer into the store, its statistics registered, started. */
static int ingest_create(daemon_t *d, const char *bootstrap, cp_err *err)
{
    if (pairs_of(d->cfg.kafka.v, d->cfg.kafka.n, &d->kafka_props, err)) return err->code;
    cp_ingest_options io = {.brokers = bootstrap,
                            .group_id = d->cfg.group_id,
                            .topic = d->cfg.topic,
                            .dlq_topic = d->cfg.dlq_topic,
                            .kafka_props = d->kafka_props,
                            .new_log = d->broker != NULL,
                            .tenant_tokens = d->cfg.tokens.n ? d->tenant_tokens : NULL,
                            .partitions = d->cfg.cluster_partitions};
    if (cp_ingest_create(&io, d->store, &d->ingest, err)) return err->code;
    /* /metrics: the API's, store, ingest, symbols, cluster, in registration order */
    if (cp_ingest_register_metrics(d->ingest, d->metrics) ||
        cp_symbols_register_metrics(d->symbols, d->metrics) ||
        cp_fanout_register_metrics(d->fanout, d->metrics))
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    return cp_ingest_start(d->ingest, err);
}

/* Kafka after the HTTP port is bound (a port conflict fails before anything is consumed):
 * the broker, ingest, the relay, the control and profiles topics' producers, and the
 * captures that run on. */
static int kafka_start(daemon_t *d, cp_err *err)
{
    const char *bootstrap;
    if (broker_create(d, &bootstrap, err) || ingest_create(d, bootstrap, err)) return err->code;
    if (cp_api_set_brokers(d->api, bootstrap)) return cp_err_set(err, CP_ENOMEM, "out of memory");
    if (start_relay(d, bootstrap, err)) return err->code;
    const char *const *props = (const char *const *)d->kafka_props;
    if (cp_publisher_create(bootstrap, props, d->cfg.control_topic, &d->publisher, err) ||
        cp_publisher_create(bootstrap, props,
                            d->cfg.topic && *d->cfg.topic ? d->cfg.topic : CP_TOPIC_PROFILES,
                            &d->profiles, err))
        return err->code;
    cp_captures_resume(d->captures);
    return 0;
}

/* ---- running and destroying --------------------------------------------------------- */

/* The loop, until a signal's clean stop has closed every handle. */
static void daemon_run(daemon_t *d)
{
    uv_timer_init(d->loop, &d->health_timer);
    d->health_timer.data = d;
    uv_timer_start(&d->health_timer, on_health_timer, 5000, 5000);
    uv_run(d->loop, UV_RUN_DEFAULT);
    cp_log_info("stopped cleanly");
}

/* After a failed start: a server that failed to listen still holds a handle, and so do
 * the signal handles (or the loop waits for a signal: a bad kafka.* property hung here). */
static void daemon_abort(daemon_t *d, const cp_err *err)
{
    cp_log_error("contprofd: %s", err->msg[0] ? err->msg : "out of memory");
    if (d->http && d->loop) {
        uv_close((uv_handle_t *)&d->sigint, NULL);
        uv_close((uv_handle_t *)&d->sigterm, NULL);
        cp_http_server_shutdown(d->http, NULL, NULL);
        uv_run(d->loop, UV_RUN_DEFAULT);
    }
}

/* Destroys what exists of *d, in dependency order; accepts a half-built daemon. */
static void daemon_destroy(daemon_t *d)
{
    /* first: what it holds goes to Kafka (the embedded broker is still up) or its spool */
    cp_relay_destroy(d->relay, 2 * (int64_t)1000000000);
    cp_http_server_destroy(d->http);
    cp_publisher_destroy(d->publisher);
    cp_publisher_destroy(d->profiles);
    free(d->kafka_props);
    cp_ingest_destroy(d->ingest);
    free(d->tenant_tokens);
    cp_broker_destroy(d->broker);
    cp_api_destroy(d->api);
    cp_captures_destroy(d->captures);
    cp_fanout_destroy(d->fanout);
    cp_symbols_destroy(d->symbols);
    cp_store_close(d->store);
    cp_metrics_destroy(d->metrics);
    if (d->loop) uv_loop_close(d->loop);
    cp_config_close(&d->cfg);
}

int main(int argc, char **argv)
{
    args_t a;
    int status = parse_args(argc, argv, &a);
    if (status >= 0) return status;
    status = 1;
    daemon_t d;
    memset(&d, 0, sizeof d);
    cp_err err = {0};
    if (cp_config_init(&d.cfg)) return 1;
    if (load_config(&d.cfg, &a, &err)) goto fail;
    if (a.mode) {
        status = a.mode == 2 ? print_offsets(&d.cfg) : repair(&d.cfg);
        cp_config_close(&d.cfg);
        return status;
    }
    set_process_limits(&d.cfg);
    if (store_create(&d, &err) || api_create(&d, a.config, &err)) goto fail;
    d.loop = uv_default_loop();
    signals_start(&d);
    if (http_create(&d, &err) || kafka_start(&d, &err)) goto fail;
    daemon_run(&d);
    status = 0;
    goto out;
fail:
    daemon_abort(&d, &err);
out:
    daemon_destroy(&d);
    return status;
}
