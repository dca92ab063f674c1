/* The envelope sink (sink.h): the relay client with its spool fallback, or a Kafka producer
 * of the process's own. */
#include "guard.h"
#include "sink.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "http_client.h"
#include "kafka.h"
#include "relay.h"
#include "times.h"

/* With a server: how long the brokers must stay unreachable before the sink asks the server
 * again (contprofd may have restarted with its embedded broker on a new port), and the
 * pause between such questions while they stay so (doubling up to the maximum). */
#define BROKERS_STALE_NS (5 * (int64_t)1000000000)
#define REFETCH_MIN_NS (5 * (int64_t)1000000000)
#define REFETCH_MAX_NS (60 * (int64_t)1000000000)
/* After a failed connection to the relay, envelopes go to the spool for this long before
 * the next attempt (a process that lives on finds a relay that came back). */
#define RECONNECT_NS ((int64_t)1000000000)
/* A connection unused this long is closed (at the next tick): a window's envelopes share
 * one, and between windows the relay holds no connection per process (a host of thousands
 * of processes would exhaust its connections). */
#define RELAY_IDLE_NS ((int64_t)1000000000)
/* Envelopes sent to the relay and not yet answered, at most: a window's envelopes go out
 * back to back and their answers are read together (one wake-up of the relay and of the
 * agent thread instead of one per envelope). */
#define INFLIGHT_MAX 64u
/* How often a missing or refused spool directory is looked for again. */
#define SPOOL_RETRY_NS (5 * (int64_t)1000000000)

struct cp_sink {
    /* relay */
    char relay_dir[1024];
    struct sockaddr_un addr;
    int fd; /* connected to the relay, or -1 */
    /* sent and not answered yet (a ring, oldest at in_head): kept to be spooled if the
     * connection fails before the answer */
    cp_buf inflight[INFLIGHT_MAX];
    uint32_t in_head, in_n;
    uint8_t ack[CP_RELAY_HEADER + 1];
    uint32_t ack_got;
    int spool; /* the spool directory, or -1 */
    /* envelopes for the spool, written as one file (cp_spool_write_batch) at the next
     * tick, flush or destroy: a window's envelopes become one file, not one each */
    cp_buf batch;
    uint32_t batch_n;
    int64_t next_connect, next_spool, timeout_ns, used_ns;
    /* Kafka */
    cp_kafka *kafka;
    char brokers[1024], server[512], topic[256], props[4096];
    int queue;
    atomic_uint *revocations;
    unsigned revocations_seen;
    int64_t next_resolve, next_refetch, refetch_backoff;
    int kafka_warned;
    cp_kafka_keep_fn keep;
    void *keep_arg;

    char token[256];
    uint64_t dropped;
};

int cp_sink_create(const cp_sink_options *o, cp_sink **out, cp_err *err)
{
    CP_ASSERT_AGENT_THREAD();
    *out = NULL;
    cp_sink *s = calloc(1, sizeof(*s));
    if (!s) return cp_err_set(err, CP_ENOMEM, "out of memory creating the envelope sink");
    s->fd = s->spool = -1;
    s->timeout_ns = o->relay_timeout_ns > 0 ? o->relay_timeout_ns : CP_SINK_RELAY_TIMEOUT_NS;
    if (o->relay_dir && *o->relay_dir) {
        snprintf(s->relay_dir, sizeof(s->relay_dir), "%s", o->relay_dir);
        s->addr.sun_family = AF_UNIX;
        if ((size_t)snprintf(s->addr.sun_path, sizeof(s->addr.sun_path), "%s/%s", o->relay_dir,
                             CP_RELAY_SOCKET) >= sizeof(s->addr.sun_path)) {
            free(s);
            return cp_err_set(err, CP_EINVAL,
                              "relay directory %s: its socket path is over the %zu bytes a Unix "
                              "socket name holds",
                              o->relay_dir, sizeof(s->addr.sun_path) - 1);
        }
    }
    snprintf(s->brokers, sizeof(s->brokers), "%s", o->brokers ? o->brokers : "");
    snprintf(s->server, sizeof(s->server), "%s", o->server ? o->server : "");
    snprintf(s->topic, sizeof(s->topic), "%s",
             o->topic && *o->topic ? o->topic : CP_TOPIC_PROFILES);
    snprintf(s->props, sizeof(s->props), "%s", o->kafka_props ? o->kafka_props : "");
    snprintf(s->token, sizeof(s->token), "%s", o->token ? o->token : "");
    s->queue = o->kafka_queue > 1 ? o->kafka_queue : 2;
    s->revocations = o->fd_revocations;
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------------------
 * The relay */

static void relay_close(cp_sink *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

static int relay_connect(cp_sink *s)
{
    int64_t now = cp_mono_ns();
    if (now < s->next_connect) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    /* On a Unix socket a connect completes or fails at once; EAGAIN: the relay's backlog
     * is full (it is busy): treated as away. */
    if (connect(fd, (struct sockaddr *)&s->addr, sizeof(s->addr)) != 0) {
        close(fd);
        s->next_connect = now + RECONNECT_NS;
        return -1;
    }
    s->fd = fd;
    return 0;
}

/* Waits for fd to be ready for events until deadline (CLOCK_MONOTONIC ns). 0 or -1. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - cp_mono_ns();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)((left + 999999) / 1000000));
        if (n > 0) return (p.revents & (events | POLLHUP | POLLERR)) ? 0 : -1;
        if (n < 0 && errno != EINTR) return -1;
    }
}

static int send_all(int fd, const uint8_t *p, size_t len, int64_t deadline)
{
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            len -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLOUT, deadline) != 0) return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* The batch to the spool as one file; what cannot be written is lost, counted. */
static void spool_flush(cp_sink *s)
{
    if (!s->batch_n) return;
    int64_t now = cp_mono_ns();
    if (s->spool < 0 && now >= s->next_spool) {
        s->next_spool = now + SPOOL_RETRY_NS;
        if (cp_spool_open(s->relay_dir, 0, &s->spool, NULL) != 0) s->spool = -1;
    }
    int rc = s->spool < 0 ? CP_EIO : cp_spool_write_batch(s->spool, &s->batch, NULL);
    if (rc) s->dropped += s->batch_n;
    if (rc == CP_EIO && s->spool >= 0) { /* the directory may have gone: open it again later */
        close(s->spool);
        s->spool = -1;
    }
    s->batch.len = 0;
    s->batch_n = 0;
}

/* The relay did not take it: into the spool (the relay reads it when it can), with the
 * rest of the window's (spool_flush). A duplicate of an envelope the relay did take (its
 * answer lost in a time-out) is dropped by the store (same producer and sequence). */
static void spool_put(cp_sink *s, const uint8_t *val, size_t len)
{
    int rc = cp_spool_batch_add(&s->batch, val, len);
    if (rc == CP_ELIMIT && s->batch_n) { /* full: this one starts the next file */
        spool_flush(s);
        rc = cp_spool_batch_add(&s->batch, val, len);
    }
    if (rc)
        s->dropped++; /* over a spool file's size by itself, or no memory */
    else
        s->batch_n++;
}

/* The oldest envelope in flight got its answer. */
static void settle_one(cp_sink *s, uint8_t status)
{
    cp_buf *b = &s->inflight[s->in_head];
    if (status == CP_RELAY_BUSY) {
        spool_put(s, b->data, b->len);
    } else if (status != CP_RELAY_OK) {
        s->dropped++; /* refused: not an envelope, never to be sent again */
    }
    cp_buf_close(b);
    s->in_head = (s->in_head + 1) % INFLIGHT_MAX;
    s->in_n--;
}

/* The connection failed (closed, a time-out, a malformed answer): every envelope still in
 * flight goes to the spool. One the relay took already is then stored twice over, a
 * duplicate the store drops (same producer and sequence). */
static void relay_fail(cp_sink *s)
{
    relay_close(s);
    s->next_connect = cp_mono_ns() + RECONNECT_NS;
    s->ack_got = 0;
    while (s->in_n) {
        cp_buf *b = &s->inflight[s->in_head];
        spool_put(s, b->data, b->len);
        cp_buf_close(b);
        s->in_head = (s->in_head + 1) % INFLIGHT_MAX;
        s->in_n--;
    }
}

/* Reads answers until at most until envelopes are in flight, waiting for them until deadline
 * (0: only the answers already there). Returns 0, or -1 after relay_fail. */
static int read_acks(cp_sink *s, uint32_t until, int64_t deadline)
{
    while (s->in_n > until) {
        ssize_t r = recv(s->fd, s->ack + s->ack_got, sizeof(s->ack) - s->ack_got, MSG_DONTWAIT);
        if (r > 0) {
            s->ack_got += (uint32_t)r;
            if (s->ack_got < sizeof(s->ack)) continue;
            uint8_t type = 0;
            uint32_t plen = 0;
            s->ack_got = 0;
            if (cp_relay_parse_header(s->ack, 1, &type, &plen, NULL) != 0 || type != CP_RELAY_ACK ||
                plen != 1) {
                relay_fail(s);
                return -1;
            }
            settle_one(s, s->ack[CP_RELAY_HEADER]);
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!deadline) return 0;
            if (wait_fd(s->fd, POLLIN, deadline) != 0) {
                relay_fail(s);
                return -1;
            }
        } else {
            relay_fail(s); /* 0: the relay closed */
            return -1;
        }
    }
    return 0;
}

/* One envelope to the relay (val taken): sent at once, its answer read later (read_acks);
 * with no relay to send to, into the spool. */
static void relay_put(cp_sink *s, cp_buf *val)
{
    int64_t now = cp_mono_ns(), deadline = now + s->timeout_ns;
    if ((s->fd >= 0 || relay_connect(s) == 0) && read_acks(s, 0, 0) == 0 &&
        read_acks(s, INFLIGHT_MAX - 1, deadline) == 0) {
        uint8_t hdr[CP_RELAY_HEADER];
        cp_relay_header(hdr, CP_RELAY_ENVELOPE, (uint32_t)val->len);
        if (send_all(s->fd, hdr, sizeof(hdr), deadline) == 0 &&
            send_all(s->fd, val->data, val->len, deadline) == 0) {
            s->inflight[(s->in_head + s->in_n) % INFLIGHT_MAX] = *val;
            s->in_n++;
            *val = (cp_buf){0};
            s->used_ns = now;
            return;
        }
        relay_fail(s);
    }
    spool_put(s, val->data, val->len);
    cp_buf_close(val);
}

void cp_sink_hint(cp_sink *s, uint8_t type, const uint8_t *p, size_t len)
{
    CP_ASSERT_AGENT_THREAD();
    if (!s->relay_dir[0] || len > CP_RELAY_FRAME_MAX) return;
    if (s->fd < 0 && relay_connect(s) != 0) return;
    int64_t now = cp_mono_ns(), deadline = now + s->timeout_ns;
    uint8_t hdr[CP_RELAY_HEADER];
    cp_relay_header(hdr, type, (uint32_t)len);
    if (send_all(s->fd, hdr, sizeof(hdr), deadline) != 0 || send_all(s->fd, p, len, deadline) != 0)
        relay_fail(s); /* what was in flight is spooled, as for a failed envelope */
    else
        s->used_ns = now;
}

/* Waits (within the bound) for the answers of every envelope in flight. */
static void relay_settle(cp_sink *s)
{
    if (s->fd >= 0 && s->in_n) read_acks(s, 0, cp_mono_ns() + s->timeout_ns);
}

/* ------------------------------------------------------------------------------------
 * Kafka */

static void kafka_drop(cp_sink *s)
{
    s->dropped += cp_kafka_take_dropped(s->kafka);
    s->dropped += cp_kafka_destroy(s->kafka, 0);
    s->kafka = NULL;
}

/* The brokers have been down a while: asks the server for its list (at most 2 s) and, if it
 * changed, drops the producer so that it is rebuilt on the new list. */
static void refetch_brokers(cp_sink *s, int64_t now)
{
    s->refetch_backoff = s->refetch_backoff ? s->refetch_backoff * 2 : REFETCH_MIN_NS;
    if (s->refetch_backoff > REFETCH_MAX_NS) s->refetch_backoff = REFETCH_MAX_NS;
    s->next_refetch = now + s->refetch_backoff;
    char b[sizeof(s->brokers)];
    if (cp_http_get_brokers(s->server, s->token, b, sizeof(b), 2000, NULL) != 0 ||
        !strcmp(b, s->brokers))
        return;
    snprintf(s->brokers, sizeof(s->brokers), "%s", b);
    kafka_drop(s);
}

static void kafka_tick(cp_sink *s)
{
    int64_t now = cp_mono_ns();
    if (!s->brokers[0] && s->server[0] && now >= s->next_resolve) {
        s->next_resolve = now + 30 * (int64_t)1000000000;
        if (cp_http_get_brokers(s->server, s->token, s->brokers, sizeof(s->brokers), 2000, NULL))
            s->brokers[0] = 0;
    }
    /* the host took over one of the agent's fd numbers (dup2 onto it): librdkafka's sockets
     * and pipes cannot be renumbered, so the client goes; what it held is counted */
    if (s->kafka && s->revocations && atomic_load(s->revocations) != s->revocations_seen)
        kafka_drop(s);
    if (s->kafka && cp_kafka_failed(s->kafka)) kafka_drop(s);
    if (s->kafka && s->server[0]) {
        if (cp_kafka_down_ns(s->kafka) < BROKERS_STALE_NS)
            s->refetch_backoff = 0;
        else if (now >= s->next_refetch)
            refetch_brokers(s, now);
    }
    if (!s->kafka && s->brokers[0]) {
        cp_err err = {0};
        s->revocations_seen = s->revocations ? atomic_load(s->revocations) : 0;
        if (cp_kafka_create(s->brokers, s->topic, s->queue, s->props, &s->kafka, &err) != 0) {
            if (!s->kafka_warned++) fprintf(stderr, "contprof: kafka: %s\n", err.msg);
            if (s->server[0]) s->brokers[0] = 0;
        } else if (s->keep) {
            cp_kafka_set_keep(s->kafka, s->keep, s->keep_arg);
        }
    }
    if (s->kafka) {
        cp_kafka_poll(s->kafka);
        s->dropped += cp_kafka_take_dropped(s->kafka);
    }
}

/* ------------------------------------------------------------------------------------
 * The interface */

void cp_sink_send(cp_sink *s, const cp_envelope *e)
{
    CP_ASSERT_AGENT_THREAD();
    cp_buf val = {0}, key = {0};
    /* With a token, the envelope is signed with it: contprofd with tokens stores only
     * envelopes signed by a token of the tenant they name. */
    if (cp_envelope_encode(e, &val) != 0 || (s->token[0] && cp_envelope_sign(&val, s->token))) {
        s->dropped++;
        goto out;
    }
    if (s->relay_dir[0]) {
        relay_put(s, &val); /* answered at the next tick, flush or destroy */
        goto out;
    }
    if (!s->kafka) kafka_tick(s); /* the first window: build the client now */
    if (!s->kafka || cp_envelope_series_key(e, &key) != 0) {
        s->dropped++; /* no transport up yet, or out of memory */
        goto out;
    }
    size_t vl, kl;
    uint8_t *v = cp_buf_steal(&val, &vl);
    uint8_t *k = cp_buf_steal(&key, &kl);
    cp_kafka_send(s->kafka, v, vl, k, kl);
out:
    cp_buf_close(&val);
    cp_buf_close(&key);
}

void cp_sink_send_encoded(cp_sink *s, uint8_t *value, size_t len, uint8_t *key, size_t klen)
{
    CP_ASSERT_AGENT_THREAD();
    if (!s->kafka) kafka_tick(s);
    if (!s->kafka) {
        if (!s->keep || s->keep(s->keep_arg, value, len) != 0) s->dropped++;
        free(value);
        free(key);
        return;
    }
    cp_kafka_send(s->kafka, value, len, key, klen);
}

void cp_sink_set_keep(cp_sink *s, cp_kafka_keep_fn fn, void *arg)
{
    s->keep = fn;
    s->keep_arg = arg;
    if (s->kafka) cp_kafka_set_keep(s->kafka, fn, arg);
}

int64_t cp_sink_pending(const cp_sink *s)
{
    if (!s->kafka || cp_kafka_down_ns(s->kafka) > 0) return -1;
    return (int64_t)cp_kafka_pending(s->kafka);
}

void cp_sink_tick(cp_sink *s)
{
    CP_ASSERT_AGENT_THREAD();
    if (!s->relay_dir[0]) {
        kafka_tick(s);
        return;
    }
    relay_settle(s);
    spool_flush(s);
    if (s->fd >= 0 && !s->in_n && cp_mono_ns() - s->used_ns > RELAY_IDLE_NS) relay_close(s);
}

uint64_t cp_sink_take_delivered(cp_sink *s)
{
    CP_ASSERT_AGENT_THREAD();
    return s->kafka ? cp_kafka_take_delivered(s->kafka) : 0;
}

uint64_t cp_sink_take_dropped(cp_sink *s)
{
    CP_ASSERT_AGENT_THREAD();
    if (s->kafka) s->dropped += cp_kafka_take_dropped(s->kafka);
    uint64_t d = s->dropped;
    s->dropped = 0;
    return d;
}

int cp_sink_idle(const cp_sink *s)
{
    return !s || (!s->kafka && !s->in_n && !s->batch_n);
}

const char *cp_sink_brokers(const cp_sink *s)
{
    return s && !s->relay_dir[0] ? s->brokers : "";
}

void cp_sink_flush(cp_sink *s, int64_t timeout_ns)
{
    CP_ASSERT_AGENT_THREAD();
    if (s && s->relay_dir[0]) {
        relay_settle(s);
        spool_flush(s);
    }
    if (!s || !s->kafka) return;
    s->dropped += cp_kafka_take_dropped(s->kafka);
    s->dropped += cp_kafka_destroy(s->kafka, (int)(timeout_ns / 1000000));
    s->kafka = NULL;
}

uint64_t cp_sink_destroy(cp_sink *s, int64_t timeout_ns)
{
    CP_ASSERT_AGENT_THREAD();
    if (!s) return 0;
    cp_sink_flush(s, timeout_ns);
    if (s->in_n) relay_fail(s); /* no answer within the bound: spooled */
    spool_flush(s);
    relay_close(s);
    if (s->spool >= 0) close(s->spool);
    cp_buf_close(&s->batch);
    uint64_t d = s->dropped;
    free(s);
    return d;
}

void cp_sink_after_fork_child(cp_sink *s, int (*close_fd)(int))
{
    if (!s) return;
    cp_kafka_abandon(s->kafka);
    s->kafka = NULL;
    if (s->fd >= 0) close_fd(s->fd); /* the parent's connection: only the child's copy */
    if (s->spool >= 0) close_fd(s->spool);
    s->fd = s->spool = -1;
    /* the parent's envelopes in flight are its own to settle: the copies are forgotten */
    for (uint32_t i = 0; i < s->in_n; i++)
        s->inflight[(s->in_head + i) % INFLIGHT_MAX] = (cp_buf){0};
    s->in_n = s->in_head = s->ack_got = 0;
    s->batch.len = 0; /* the parent's to write */
    s->batch_n = 0;
    s->dropped = 0;
    s->next_connect = s->next_spool = 0;
}
