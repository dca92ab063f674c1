/* Parsing of contprofd's configuration file and settings. */
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "broker.h"
#include "fanout.h"
#include "http.h"
#include "params.h"
#include "symbols.h"

static int set_str(char **dst, const char *v)
{
    char *d = strdup(v);
    if (!d) return CP_ENOMEM;
    free(*dst);
    *dst = d;
    return 0;
}

int cp_config_init(cp_config *c)
{
    memset(c, 0, sizeof *c);
    /* Settings the stages own start from the stages' own defaults: each written once. */
    cp_http_options ho;
    cp_api_options ao;
    cp_symbols_options so;
    cp_captures_options co;
    cp_http_options_default(&ho);
    cp_captures_options_default(&co);
    cp_api_options_default(&ao);
    cp_symbols_options_default(&so);
    c->http_port = ho.port;
    c->embedded_partitions = CP_BROKER_DEFAULT_PARTITIONS;
    c->retention_raw_ns = 7LL * 86400 * 1000000000LL;
    c->retention_rollup_ns = 90LL * 86400 * 1000000000LL;
    c->max_range_ns = ao.max_range_ns;
    c->query_timeout_ns = ho.query_timeout_ns;
    c->idle_timeout_ns = ho.idle_timeout_ns;
    c->concurrency = ho.concurrency;
    c->max_queued = ho.max_queued;
    c->max_connections = ho.max_connections;
    c->max_nodes_default = ao.max_nodes_default;
    c->max_nodes_limit = ao.max_nodes_limit;
    c->max_response_bytes = ho.max_response_bytes;
    c->max_header_bytes = ho.max_header_bytes;
    c->max_url_bytes = ho.max_url_bytes;
    c->gzip_min_bytes = ho.gzip_min_bytes;
    c->symbols_max_upload_bytes = so.max_upload_bytes;
    c->symbols_max_table_bytes = so.max_table_bytes;
    c->symbols_cache_bytes = so.cache_bytes;
    c->ingest_max_body_bytes = ho.max_ingest_bytes;
    c->ingest_max_concurrent = ho.max_ingests;
    c->request_timeout_ns = ho.request_timeout_ns;
    c->write_timeout_ns = ho.write_timeout_ns;
    c->output_budget = ho.max_inflight_bytes;
    c->cheap_concurrency = ho.cheap_concurrency;
    c->max_conns_per_client = ho.max_conns_per_client;
    c->healthz_connections = ho.reserved_connections;
    c->cluster_peer_timeout_ns = CP_FANOUT_DEFAULT_PEER_TIMEOUT_NS;
    c->capture_max_concurrent = co.max_concurrent;
    c->capture_max_hz = co.max_hz;
    c->capture_max_overhead_permille = co.max_overhead_permille;
    c->capture_max_duration_ns = co.max_duration_ns;
    c->capture_min_alloc_rate = (size_t)co.min_alloc_rate;
    if (set_str(&c->data_dir, CP_CONFIG_DEFAULT_DATA_DIR) || set_str(&c->http_host, ho.host) ||
        set_str(&c->brokers, "") || set_str(&c->log_level, "info") ||
        set_str(&c->symbols_dirs, so.dirs)) {
        cp_config_close(c);
        return CP_ENOMEM;
    }
    return 0;
}

static void kvs_close(void *vec)
{
    CP_VEC(cp_kv) *v = vec;
    for (uint32_t i = 0; i < v->n; i++) {
        free(v->v[i].key);
        free(v->v[i].value);
    }
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
}

void cp_config_close(cp_config *c)
{
    free(c->data_dir);
    free(c->http_host);
    free(c->brokers);
    free(c->topic);
    free(c->dlq_topic);
    free(c->control_topic);
    free(c->relay_dir);
    free(c->group_id);
    free(c->log_level);
    free(c->symbols_dirs);
    free(c->metrics_token);
    free(c->cluster_peers);
    free(c->cluster_partitions);
    free(c->cluster_token);
    kvs_close(&c->kafka);
    kvs_close(&c->tokens);
    memset(c, 0, sizeof *c);
}

int cp_config_is_loopback(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

int cp_config_set_listen(cp_config *c, const char *addr, cp_err *err)
{
    const char *colon = strrchr(addr, ':');
    char host[256];
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host) goto bad;
    size_t hl = (size_t)(colon - addr);
    const char *h = addr;
    if (addr[0] == '[') {
        if (hl < 3 || addr[hl - 1] != ']') goto bad;
        h = addr + 1;
        hl -= 2;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || colon[1] == 0 || port < 0 || port > 65535) goto bad;
    if (strcmp(host, "localhost") == 0) snprintf(host, sizeof host, "127.0.0.1");
    if (set_str(&c->http_host, host)) return cp_err_set(err, CP_ENOMEM, "out of memory");
    c->http_port = (int)port;
    return 0;
bad:
    return cp_err_set(err, CP_EPARSE, "listen address '%.100s': expected HOST:PORT or [V6]:PORT",
                      addr);
}

static int parse_u64(const char *v, uint64_t max, uint64_t *out)
{
    char *end;
    if (!isdigit((unsigned char)v[0])) return -1;
    unsigned long long x = strtoull(v, &end, 10);
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1024, end++;
    else if (*end == 'M')
        mul = 1024 * 1024, end++;
    else if (*end == 'G')
        mul = 1024ULL * 1024 * 1024, end++;
    if (*end || x > max / mul) return -1;
    *out = x * mul;
    return 0;
}

static int push_kv(void *vec, const char *k, const char *v)
{
    CP_VEC(cp_kv) *kv = vec;
    for (uint32_t i = 0; i < kv->n; i++)
        if (strcmp(kv->v[i].key, k) == 0) return set_str(&kv->v[i].value, v);
    cp_kv e = {strdup(k), strdup(v)};
    if (!e.key || !e.value || cp_vec_push(kv, e)) {
        free(e.key);
        free(e.value);
        return CP_ENOMEM;
    }
    return 0;
}

/* A secret names one holder: 0 if value is no other key's among the tenants' tokens and
 * metrics.token, else CP_EPARSE naming both keys (issue 36: with token.a = token.b, b's
 * users read a's data; a metrics.token equal to a tenant's made that tenant the reader of
 * every tenant's counts). key is the one being set ("token.NAME" or "metrics.token"). */
static int secret_unique(const cp_config *c, const char *key, const char *value, cp_err *err)
{
    const char *other = NULL;
    char name[80];
    for (uint32_t i = 0; !other && i < c->tokens.n; i++) {
        snprintf(name, sizeof name, "token.%s", c->tokens.v[i].key);
        if (strcmp(name, key) != 0 && strcmp(c->tokens.v[i].value, value) == 0) other = name;
    }
    if (!other && strcmp(key, "metrics.token") != 0 && c->metrics_token &&
        strcmp(c->metrics_token, value) == 0)
        other = "metrics.token";
    if (!other) return 0;
    return cp_err_set(err, CP_EPARSE,
                      "'%.80s' has the same secret as '%s': each secret must name one holder "
                      "(a token shared by two keys opens both)",
                      key, other);
}

/* How a setting's value is read. */
enum setting_type {
    SET_STR,      /* a string, kept as it is */
    SET_DURATION, /* cp_parse_duration, 0 = unlimited */
    SET_U32,      /* a positive 32-bit integer (query.max_nodes: 0 too) */
    SET_SIZE,     /* a byte count: 65536, 64k, 256M */
    SET_U64,      /* any 64-bit integer */
    SET_U32_ZERO, /* a 32-bit integer, 0 allowed */
};

/* Tokens are secrets: shorter ones could be guessed. */
#define TOKEN_MIN_CHARS 8

int cp_config_set(cp_config *c, const char *key, const char *value, cp_err *err)
{
    struct {
        const char *key;
        enum setting_type type;
        void *dst;
    } tab[] = {
        {"data", SET_STR, &c->data_dir},
        {"brokers", SET_STR, &c->brokers},
        {"topic", SET_STR, &c->topic},
        {"dlq_topic", SET_STR, &c->dlq_topic},
        {"group_id", SET_STR, &c->group_id},
        {"log.level", SET_STR, &c->log_level},
        {"retention.raw", SET_DURATION, &c->retention_raw_ns},
        {"retention.rollup", SET_DURATION, &c->retention_rollup_ns},
        {"query.max_range", SET_DURATION, &c->max_range_ns},
        {"query.timeout", SET_DURATION, &c->query_timeout_ns},
        {"http.idle_timeout", SET_DURATION, &c->idle_timeout_ns},
        {"http.request_timeout", SET_DURATION, &c->request_timeout_ns},
        {"http.write_timeout", SET_DURATION, &c->write_timeout_ns},
        {"query.cheap_concurrency", SET_U32, &c->cheap_concurrency},
        {"http.max_connections_per_client", SET_U32_ZERO, &c->max_conns_per_client},
        {"http.healthz_connections", SET_U32_ZERO, &c->healthz_connections},
        {"http.output_budget", SET_SIZE, &c->output_budget},
        {"query.concurrency", SET_U32, &c->concurrency},
        {"query.max_queued", SET_U32, &c->max_queued},
        {"http.max_connections", SET_U32, &c->max_connections},
        {"query.max_nodes", SET_U32, &c->max_nodes_default},
        {"query.max_nodes_limit", SET_U32, &c->max_nodes_limit},
        {"embedded.partitions", SET_U32, &c->embedded_partitions},
        {"query.max_response_bytes", SET_SIZE, &c->max_response_bytes},
        {"http.max_header_bytes", SET_SIZE, &c->max_header_bytes},
        {"http.max_url_bytes", SET_SIZE, &c->max_url_bytes},
        {"http.gzip_min_bytes", SET_SIZE, &c->gzip_min_bytes},
        {"store.cache_bytes", SET_SIZE, &c->cache_bytes},
        {"store.stack_cache_bytes", SET_SIZE, &c->stack_cache_bytes},
        {"store.memory_budget", SET_SIZE, &c->memory_budget},
        {"query.max_blocks", SET_U64, &c->max_blocks},
        {"symbols.dirs", SET_STR, &c->symbols_dirs},
        {"symbols.max_upload_bytes", SET_SIZE, &c->symbols_max_upload_bytes},
        {"symbols.max_table_bytes", SET_SIZE, &c->symbols_max_table_bytes},
        {"symbols.cache_bytes", SET_SIZE, &c->symbols_cache_bytes},
        {"ingest.max_body_bytes", SET_SIZE, &c->ingest_max_body_bytes},
        {"ingest.max_concurrent", SET_U32, &c->ingest_max_concurrent},
        {"cluster.peers", SET_STR, &c->cluster_peers},
        {"cluster.partitions", SET_STR, &c->cluster_partitions},
        {"cluster.peer_timeout", SET_DURATION, &c->cluster_peer_timeout_ns},
        {"control_topic", SET_STR, &c->control_topic},
        {"relay.dir", SET_STR, &c->relay_dir},
        {"captures.max_concurrent", SET_U32, &c->capture_max_concurrent},
        {"captures.max_hz", SET_U32, &c->capture_max_hz},
        {"captures.max_overhead_permille", SET_U32, &c->capture_max_overhead_permille},
        {"captures.max_duration", SET_DURATION, &c->capture_max_duration_ns},
        {"captures.min_alloc_rate", SET_SIZE, &c->capture_min_alloc_rate},
    };
    if (strcmp(key, "listen") == 0) return cp_config_set_listen(c, value, err);
    if (strncmp(key, "kafka.", 6) == 0 && key[6]) {
        if (strcmp(key, "kafka.bootstrap.servers") == 0)
            return set_str(&c->brokers, value) ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
        return push_kv(&c->kafka, key + 6, value) ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
    }
    if (strcmp(key, "metrics.token") == 0) {
        if (strlen(value) < TOKEN_MIN_CHARS)
            return cp_err_set(err, CP_EPARSE,
                              "'metrics.token': a token must be at least %d "
                              "characters",
                              TOKEN_MIN_CHARS);
        if (secret_unique(c, key, value, err)) return CP_EPARSE;
        return set_str(&c->metrics_token, value) ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
    }
    if (strcmp(key, "cluster.token") == 0) {
        if (strlen(value) < TOKEN_MIN_CHARS)
            return cp_err_set(err, CP_EPARSE,
                              "'cluster.token': a token must be at least %d "
                              "characters",
                              TOKEN_MIN_CHARS);
        return set_str(&c->cluster_token, value) ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
    }
    if (strncmp(key, "token.", 6) == 0) {
        const char *tenant = key + 6;
        size_t tl = strlen(tenant);
        int ok = tl > 0 && tl <= 64;
        for (size_t i = 0; ok && i < tl; i++)
            ok = isalnum((unsigned char)tenant[i]) || tenant[i] == '_' || tenant[i] == '-' ||
                 tenant[i] == '.';
        if (!ok)
            return cp_err_set(err, CP_EPARSE, "'%.80s': tenant names are 1..64 of [A-Za-z0-9_.-]",
                              key);
        if (strlen(value) < TOKEN_MIN_CHARS)
            return cp_err_set(err, CP_EPARSE, "'%.80s': a token must be at least %d characters",
                              key, TOKEN_MIN_CHARS);
        if (secret_unique(c, key, value, err)) return CP_EPARSE;
        return push_kv(&c->tokens, tenant, value) ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
    }
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (strcmp(tab[i].key, key) != 0) continue;
        uint64_t u;
        switch (tab[i].type) {
        case SET_STR:
            return set_str(tab[i].dst, value) ? cp_err_set(err, CP_ENOMEM, "out of memory") : 0;
        case SET_DURATION:
            if (cp_parse_duration(value, 1, tab[i].dst, NULL))
                return cp_err_set(err, CP_EPARSE,
                                  "'%s': bad duration '%.64s' (e.g. 30s, 7d; 0 = unlimited)", key,
                                  value);
            return 0;
        case SET_U32:
            if (parse_u64(value, UINT32_MAX, &u) || (!u && strcmp(key, "query.max_nodes")))
                return cp_err_set(err, CP_EPARSE, "'%s': expected a positive integer, got '%.64s'",
                                  key, value);
            *(uint32_t *)tab[i].dst = (uint32_t)u;
            return 0;
        case SET_SIZE:
            if (parse_u64(value, SIZE_MAX, &u))
                return cp_err_set(err, CP_EPARSE,
                                  "'%s': expected a size like 65536, 64k, 256M, got "
                                  "'%.64s'",
                                  key, value);
            *(size_t *)tab[i].dst = (size_t)u;
            return 0;
        case SET_U64:
            if (parse_u64(value, UINT64_MAX, &u))
                return cp_err_set(err, CP_EPARSE, "'%s': expected an integer, got '%.64s'", key,
                                  value);
            *(uint64_t *)tab[i].dst = u;
            return 0;
        case SET_U32_ZERO:
            if (parse_u64(value, UINT32_MAX, &u))
                return cp_err_set(err, CP_EPARSE, "'%s': expected an integer, got '%.64s'", key,
                                  value);
            *(uint32_t *)tab[i].dst = (uint32_t)u;
            return 0;
        }
    }
    return cp_err_set(err, CP_EPARSE, "unknown setting '%.80s'", key);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

int cp_config_load(cp_config *c, const char *path, cp_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return cp_err_set(err, CP_EIO, "cannot open config file %s", path);
    char line[4096];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = cp_err_set(err, CP_EPARSE, "%s:%d: line longer than %zu bytes", path, lineno,
                            sizeof line - 2);
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#' || *s == ';') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = cp_err_set(err, CP_EPARSE, "%s:%d: expected 'key = value'", path, lineno);
            break;
        }
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        size_t vl = strlen(v);
        if (vl >= 2 && ((v[0] == '"' && v[vl - 1] == '"') || (v[0] == '\'' && v[vl - 1] == '\''))) {
            v[vl - 1] = 0;
            v++;
        }
        cp_err e2 = {0};
        if ((rc = cp_config_set(c, k, v, &e2))) {
            cp_err_set(err, rc, "%s:%d: %s", path, lineno, e2.msg);
            break;
        }
    }
    fclose(f);
    return rc;
}
