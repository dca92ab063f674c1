/* The ingest consumer: one thread polls Kafka, validates each envelope and its pprof,
 * adds the window to a store batch together with the partition's next offset, and writes
 * the batch as one synced LevelDB write every batch_max_messages or batch_max_ms. On
 * assignment it seeks each partition to the offset stored with the data, so a SIGKILL at
 * any moment loses nothing and stores nothing twice. */
#include "ingest.h"
#include "ingest_int.h"
#include "assign.h"
#include "broker.h"
#include "check.h"
#include "envelope.h"
#include "log.h"
#include "metrics.h"

#include <librdkafka/rdkafka.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PARTITIONS 65536
/* How long the open batch may wait, once nothing more is waiting to be read, while someone
 * asks which offsets are stored (a sender waiting for the store, contprof import; or
 * /metrics): the sender's wait is this latency. Nobody asking, it waits batch_max_ms. */
#define ASKED_WAIT_NS (10 * 1000000LL)

typedef struct range {
    int64_t from, to; /* [from, to) */
    char why[CP_OFFSETS_WHY];
} range;

typedef struct part {
    int assigned;
    int64_t next; /* next offset to store; -1 = none stored */
    int ours;     /* next was set by this process (it belongs to the broker's current log) */
    /* Shown to senders (cp_ingest_get_partitions); written under cp_ingest.mu. */
    int seen;           /* assigned at least once by this process */
    int64_t durable;    /* next offset written to the store; -1 = none */
    int64_t known_from; /* the ring below lists every unstored offset from here on */
    uint64_t lost;
    uint64_t resets; /* times its log was found behind its stored offset (offset_reset) */
    int64_t start;   /* the offset it was assigned at (offset_reset restarts others there) */
    int64_t lost_to; /* offsets below were counted as lost already (a batch read again after
                        a store failure must not count its gap twice) */
    uint32_t r0, nr; /* ring of unstored ranges, oldest at r0 */
    range ring[CP_INGEST_RANGES];
} part;

/* A DLQ copy librdkafka could not deliver, kept to be produced again. */
typedef struct dlq_retry {
    void *value, *key;
    size_t len, klen;
    rd_kafka_headers_t *hdrs;
} dlq_retry;

/* Agents' own losses, per service; producers remember the last window counted, because
 * every envelope of one window (each isolate and kind) carries the same numbers. */
#define MAX_SERVICES 256
#define MAX_PRODUCERS 1024
typedef struct producer_seen {
    char *id;
    int64_t start;
} producer_seen;

/* Sequence gaps across a restart (seq_note): per producer, the last sequence stored before
 * this process first saw it (base) and the lowest sequence above it seen since (min). */
#define GAP_PRODUCERS 4096
#define GAP_SETTLE_NS (10 * 1000000000LL) /* how long lower sequences may still arrive */
#define GAP_IDLE_NS (600 * 1000000000LL)  /* an entry idle this long may be forgotten */
enum { GAP_TRACK = 1, GAP_DONE = 2 };
typedef struct gap_seen {
    char *id;
    uint64_t base, min;
    int64_t first_ns, last_ns; /* monotonic */
    int state;
} gap_seen;

typedef struct slot {
    rd_kafka_message_t *m;
    int todo; /* passed the offset checks */
    int rc_env, rc_prof;
    int tenant_bad; /* not signed by a token of its tenant */
    cp_envelope env;
    cp_profile *prof;
    cp_pprof_lazy lz; /* prof's samples whose ids the store resolves (its stack cache) */
    cp_err err;
} slot;

struct cp_ingest {
    cp_ingest_options o;
    cp_pprof_limits limits;
    char *topic, *dlq_topic, *brokers;
    cp_store *store;
    cp_store_batch *batch;
    /* decoding: up to chunk_max messages are polled, decoded by nthreads threads (this
     * one included; one reusable decoder each), then stored in order by this thread */
    uint32_t nthreads, chunk_max, nslots;
    cp_pprof_decoder **decs;
    slot *slots;
    pthread_t *workers;
    uint32_t nworkers;
    pthread_mutex_t wmu;
    pthread_cond_t wgo, wdone;
    uint64_t gen;
    uint32_t ndone;
    int wquit;
    rd_kafka_t *rk;  /* consumer */
    rd_kafka_t *dlq; /* producer for the dead-letter topic */
    int cooperative;
    CP_VEC(part) parts;
    uint32_t pending;    /* messages whose offsets are in the open batch */
    int64_t batch_start; /* monotonic ns of the first pending message */
    int dlq_pending;
    pthread_t th;
    int started;
    atomic_int stop;
    pthread_mutex_t mu;
    cp_ingest_stats st;
    atomic_uint_fast64_t dlq_failed;
    /* Counted without mu and registered in the statistics registry (counters[] below);
     * cp_ingest_get_stats reads them into st's fields of the same names. */
    cp_counter messages, bytes, windows, duplicates, skipped, batches;
    cp_counter dlq_reason[CP_DLQ_NREASONS];
    cp_gauge lag;
    cp_gauge_f rate; /* windows per second, smoothed (cp_ingest_rate_tick) */
    /* "ingest thread only" (rate_ns, paused, the gaps): run()'s thread, released when it
     * ends; the caller's while it leaves the group in cp_ingest_stop */
    cp_thread_owner owner;
    int64_t rate_ns;              /* when cp_ingest_rate_tick last sampled; ingest thread only */
    uint64_t rate_windows;        /* the windows count then */
    cp_metrics *metrics;          /* where this ingest is registered; NULL = nowhere */
    atomic_int_fast64_t asked_ns; /* monotonic ns of the last cp_ingest_get_partitions */
    /* store failure: paused until cp_store_reopen succeeds (ingest thread only) */
    int paused;
    int64_t retry_at, backoff;
    CP_VEC(uint8_t) ours_durable;      /* parts[i].ours as of the last successful commit */
    CP_VEC(dlq_retry) retry;           /* failed DLQ deliveries, produced again by dlq_settle */
    CP_VEC(cp_ingest_dropped) dropped; /* under mu */
    producer_seen producers[MAX_PRODUCERS]; /* open addressing by producer id */
    uint32_t nproducers;
    gap_seen *gaps; /* GAP_PRODUCERS, open addressing by producer id (ingest thread) */
    uint32_t ngaps, ntracked;
    int64_t gaps_checked_ns;
    cp_counter seq_lost; /* contprof_ingest_sequence_gaps_total */
};

static const char *const reason_names[] = {
#define CP_DLQ_NAME_(n, s) s,
    CP_DLQ_REASON_MAP(CP_DLQ_NAME_)
#undef CP_DLQ_NAME_
};

const char *cp_dlq_reason_name(int r)
{
    return r >= 0 && r < CP_DLQ_NREASONS ? reason_names[r] : NULL;
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Remembers msg as the latest error shown in /metrics. */
static void note_error(cp_ingest *in, const char *msg)
{
    pthread_mutex_lock(&in->mu);
    snprintf(in->st.last_error, sizeof in->st.last_error, "%.*s", (int)sizeof in->st.last_error - 1,
             msg);
    pthread_mutex_unlock(&in->mu);
}

static part *part_get(cp_ingest *in, int32_t p)
{
    if (p < 0 || p >= MAX_PARTITIONS) return NULL;
    if ((uint32_t)p >= in->parts.n) {
        /* readers of the vector (cp_ingest_get_partitions) hold mu */
        pthread_mutex_lock(&in->mu);
        int rc = cp_vec_reserve(&in->parts, (size_t)p + 1);
        while (!rc && in->parts.n <= (uint32_t)p)
            in->parts.v[in->parts.n++] = (part){.next = -1, .durable = -1};
        pthread_mutex_unlock(&in->mu);
        if (rc) return NULL;
    }
    return &in->parts.v[p];
}

/* Records that offsets [from, to) of p will not be in the store, and why. Adjacent ranges
 * with the same reason are merged; when the ring is full the oldest is forgotten and
 * known_from moves past it. */
static void not_stored(cp_ingest *in, part *p, int64_t from, int64_t to, const char *why)
{
    pthread_mutex_lock(&in->mu);
    if (p->nr) {
        range *last = &p->ring[(p->r0 + p->nr - 1) % CP_INGEST_RANGES];
        if (last->to == from && !strcmp(last->why, why)) {
            last->to = to;
            pthread_mutex_unlock(&in->mu);
            return;
        }
    }
    if (p->nr == CP_INGEST_RANGES) {
        p->known_from = p->ring[p->r0].to;
        p->r0 = (p->r0 + 1) % CP_INGEST_RANGES;
        p->nr--;
    }
    range *r = &p->ring[(p->r0 + p->nr++) % CP_INGEST_RANGES];
    r->from = from;
    r->to = to;
    snprintf(r->why, sizeof r->why, "%s", why);
    pthread_mutex_unlock(&in->mu);
}

/* Counts and logs offsets [from, to) of partition pn as lost: the broker dropped them
 * before this ingest read them. */
static void lost(cp_ingest *in, const char *topic, int32_t pn, part *p, int64_t from, int64_t to)
{
    if (from < p->lost_to) from = p->lost_to;
    if (from >= to) return;
    p->lost_to = to;
    char msg[256];
    snprintf(msg, sizeof msg, "%s [%d]: offsets %lld..%lld are gone from the broker (lost)", topic,
             pn, (long long)from, (long long)to - 1);
    cp_log_warn("ingest: %s", msg);
    note_error(in, msg);
    not_stored(in, p, from, to, "lost");
    pthread_mutex_lock(&in->mu);
    p->lost += (uint64_t)(to - from); /* their sum is cp_ingest_stats.gap */
    pthread_mutex_unlock(&in->mu);
}

/* ---------------------------------------------------------------------------------
 * Store failures: pause, retry, resume
 * --------------------------------------------------------------------------------- */

#define BACKOFF_FIRST_NS 250000000LL
#define BACKOFF_MAX_NS 8000000000LL

static void set_paused(cp_ingest *in, int paused, const char *why)
{
    pthread_mutex_lock(&in->mu);
    in->st.paused = paused;
    if (why) {
        in->st.store_errors++;
        snprintf(in->st.pause_reason, sizeof in->st.pause_reason, "%.*s",
                 (int)sizeof in->st.pause_reason - 1, why);
        memcpy(in->st.error, in->st.pause_reason, sizeof in->st.error); /* the last error */
    }
    if (!paused) in->st.pause_reason[0] = 0;
    pthread_mutex_unlock(&in->mu);
}

/* A store write failed (ENOSPC, EIO, out of memory half-way through a batch): nothing of the
 * open batch is stored and no offset moves. Its messages are dropped here and read again
 * after the store is back; the assigned partitions are paused meanwhile, and run() retries
 * reopening the store with backoff (try_resume). */
static void store_failed(cp_ingest *in, const char *msg)
{
    CP_ASSERT_THREAD(&in->owner, "ingest thread only");
    cp_store_batch_reset(in->batch);
    in->pending = 0;
    /* an offset of the failed batch is not this process's until it is stored */
    for (uint32_t i = 0; i < in->parts.n; i++)
        in->parts.v[i].ours = i < in->ours_durable.n && in->ours_durable.v[i];
    set_paused(in, 1, msg);
    if (in->paused) return;
    in->paused = 1;
    in->backoff = BACKOFF_FIRST_NS;
    in->retry_at = mono_ns() + in->backoff;
    rd_kafka_topic_partition_list_t *a = NULL;
    if (!rd_kafka_assignment(in->rk, &a) && a) {
        rd_kafka_pause_partitions(in->rk, a);
        rd_kafka_topic_partition_list_destroy(a);
    }
    cp_log_error("ingest paused, nothing is lost: %s; the store is reopened with backoff until "
                 "it works (/healthz answers 503 meanwhile)",
                 msg);
}

/* Reopens the store; on success seeks every assigned partition back to the offset stored
 * with the data (what the failed batch had read is read again) and resumes them. */
static void try_resume(cp_ingest *in)
{
    CP_ASSERT_THREAD(&in->owner, "ingest thread only");
    cp_err err = {0};
    if (cp_store_reopen(in->store, &err)) {
        in->backoff = in->backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : in->backoff * 2;
        in->retry_at = mono_ns() + in->backoff;
        set_paused(in, 1, err.msg);
        cp_log_warn("ingest: the store is still unavailable (next try in %.1f s): %s",
                    (double)in->backoff / 1e9, err.msg);
        return;
    }
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(in->rk, &a) || !a) {
        in->retry_at = mono_ns() + in->backoff;
        return;
    }
    for (int i = 0; i < a->cnt; i++) {
        rd_kafka_topic_partition_t *tp = &a->elems[i];
        part *p = part_get(in, tp->partition);
        int64_t next = -1;
        cp_err e = {0};
        /* as at assignment: with a new log, only offsets this process stored count */
        if (cp_store_get_offset(in->store, tp->topic, tp->partition, &next, &e) ||
            (in->o.new_log && !(p && p->ours)))
            next = -1;
        tp->offset = next >= 0 ? next : RD_KAFKA_OFFSET_BEGINNING;
        if (p) p->next = next;
        cp_log_info("ingest: %s [%d] continues at %s%lld", tp->topic, tp->partition,
                    next < 0 ? "the beginning " : "offset ", (long long)(next < 0 ? 0 : next));
    }
    rd_kafka_error_t *ke = rd_kafka_seek_partitions(in->rk, a, 10000);
    if (ke) {
        cp_log_error("ingest: seeking back to the stored offsets: %s", rd_kafka_error_string(ke));
        rd_kafka_error_destroy(ke);
    }
    rd_kafka_resume_partitions(in->rk, a);
    rd_kafka_topic_partition_list_destroy(a);
    in->paused = 0;
    set_paused(in, 0, NULL);
    cp_log_info("ingest resumed: the store is open again");
}

/* ---------------------------------------------------------------------------------
 * Batches
 * --------------------------------------------------------------------------------- */

static void dlq_settle(cp_ingest *in);

/* Writes the open batch (windows and offsets) in one synced write. 0 or an error (the
 * ingest is then failed). */
static int commit(cp_ingest *in)
{
    if (!in->pending) return 0;
    if (in->dlq_pending) {
        /* bad messages are in the DLQ before their offsets are passed */
        dlq_settle(in);
        in->dlq_pending = 0;
    }
    uint32_t w = cp_store_batch_windows(in->batch);
    cp_err err = {0};
    int rc = cp_store_batch_commit(in->batch, &err);
    if (rc) {
        store_failed(in, err.msg);
        return rc;
    }
    cp_counter_add(&in->windows, w);
    cp_counter_add(&in->batches, 1);
    pthread_mutex_lock(&in->mu);
    for (uint32_t i = 0; i < in->parts.n; i++)
        if (in->parts.v[i].next >= 0) in->parts.v[i].durable = in->parts.v[i].next;
    pthread_mutex_unlock(&in->mu);
    in->pending = 0;
    if (!cp_vec_reserve(&in->ours_durable, (size_t)in->parts.n + 1)) {
        for (uint32_t i = 0; i < in->parts.n; i++)
            in->ours_durable.v[i] = (uint8_t)in->parts.v[i].ours;
        in->ours_durable.n = in->parts.n;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Rebalancing: seek to the offsets stored with the data
 * --------------------------------------------------------------------------------- */

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    cp_ingest *in = opaque;
    /* whatever happens next, the open batch is written first */
    commit(in);
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        for (int i = 0; i < parts->cnt; i++) {
            rd_kafka_topic_partition_t *tp = &parts->elems[i];
            int64_t next;
            cp_err e = {0};
            int rc = cp_store_get_offset(in->store, tp->topic, tp->partition, &next, &e);
            part *p = part_get(in, tp->partition);
            /* A new log (contprofd's embedded broker starts empty): offsets stored by an
             * earlier process point into a log that is gone; skipping up to them would drop
             * new messages as if they were stored. */
            if (rc == 0 && in->o.new_log && !(p && p->ours)) {
                rc = CP_ENOTFOUND;
                if (next > 0 && p) {
                    cp_log_warn("ingest: %s [%d]: offsets up to %lld were stored from an earlier "
                                "log of the embedded broker, which started empty: the new log is "
                                "read from its start (offset reset)",
                                tp->topic, tp->partition, (long long)next);
                    pthread_mutex_lock(&in->mu);
                    p->resets++;
                    in->st.offset_resets++;
                    pthread_mutex_unlock(&in->mu);
                }
            }
            if (rc == 0) {
                tp->offset = next;
            } else {
                if (rc != CP_ENOTFOUND) cp_log_error("ingest: %s", e.msg);
                /* Offset 0 rather than BEGINNING: the same start (a log that begins later
                 * is out of range, and offset_reset moves to its start), but
                 * without librdkafka's offset query, which a partition assigned before its
                 * leader is known retries only after 500 ms: a sender waiting for its first
                 * windows to be stored would wait that long. */
                /* (a partition handed over to this node starts where its last owner ended:
                 * cluster.partitions P@OFFSET, set in tp by cp_assign_list) */
                tp->offset = tp->offset >= 0 ? tp->offset : 0;
                next = -1;
            }
            if (p) {
                pthread_mutex_lock(&in->mu);
                p->start = tp->offset;
                p->assigned = 1;
                p->next = next;
                p->seen = 1;
                p->durable = next;
                p->known_from = next < 0 ? 0 : next;
                p->nr = p->r0 = 0;
                pthread_mutex_unlock(&in->mu);
            }
            cp_log_info("ingest: assigned %s [%d] at %s%lld", tp->topic, tp->partition,
                        next < 0 ? "the beginning " : "offset ", (long long)(next < 0 ? 0 : next));
        }
        if (in->cooperative) {
            rd_kafka_error_t *ke = rd_kafka_incremental_assign(rk, parts);
            if (ke) {
                cp_log_error("ingest: incremental assign: %s", rd_kafka_error_string(ke));
                rd_kafka_error_destroy(ke);
            }
        } else {
            rd_kafka_assign(rk, parts);
        }
        pthread_mutex_lock(&in->mu);
        in->st.ready = 1;
        pthread_mutex_unlock(&in->mu);
    } else {
        for (int i = 0; i < parts->cnt; i++) {
            part *p = part_get(in, parts->elems[i].partition);
            if (p) p->assigned = 0;
        }
        if (in->cooperative) {
            rd_kafka_error_t *ke = rd_kafka_incremental_unassign(rk, parts);
            if (ke) rd_kafka_error_destroy(ke);
        } else {
            rd_kafka_assign(rk, NULL);
        }
    }
}

/* ---------------------------------------------------------------------------------
 * Messages
 * --------------------------------------------------------------------------------- */

/* A bad message's copy in the DLQ is cut to this size when the whole is too large for it. */
#define DLQ_TRUNCATED (64u << 10)

static void retry_close(dlq_retry *r)
{
    free(r->value);
    free(r->key);
    if (r->hdrs) rd_kafka_headers_destroy(r->hdrs);
}

/* Keeps a copy of an undelivered DLQ message (takes hdrs) for dlq_settle. */
static void retry_later(cp_ingest *in, const void *v, size_t len, const void *k, size_t klen,
                        rd_kafka_headers_t *hdrs)
{
    dlq_retry r = {malloc(len ? len : 1), malloc(klen ? klen : 1), len, klen, hdrs};
    if (!r.value || !r.key || cp_vec_push(&in->retry, r)) {
        /* out of memory: this copy is lost, and said so */
        cp_log_error("ingest: DLQ: out of memory keeping an undelivered copy (lost)");
        retry_close(&r);
        return;
    }
    if (len) memcpy(r.value, v, len);
    if (klen) memcpy(r.key, k, klen);
}

static const char *header_of(rd_kafka_headers_t *h, const char *name, char *out, size_t n)
{
    const void *v;
    size_t vl;
    out[0] = 0;
    if (h && !rd_kafka_header_get_last(h, name, &v, &vl))
        snprintf(out, n, "%.*s", (int)(vl < n ? vl : n - 1), (const char *)v);
    return out;
}

/* Produces one DLQ copy (takes hdrs). A copy too large for the DLQ (librdkafka's
 * message.max.bytes, or the broker's answer when truncate is set) is replaced by its first
 * DLQ_TRUNCATED bytes with headers that say so. Other failures are kept for dlq_settle. */
static void dlq_produce(cp_ingest *in, const void *v, size_t len, const void *k, size_t klen,
                        rd_kafka_headers_t *hdrs, int truncate)
{
    char src[320];
    header_of(hdrs, "contprof-source", src, sizeof src);
    for (;;) {
        if (truncate && len > DLQ_TRUNCATED) {
            char sz[32];
            snprintf(sz, sizeof sz, "%zu", len);
            rd_kafka_header_add(hdrs, "contprof-truncated", -1, "true", -1);
            rd_kafka_header_add(hdrs, "contprof-original-size", -1, sz, -1);
            cp_log_warn("ingest: %s: %zu bytes are too large for %s; a truncated copy (first %u "
                        "bytes, headers contprof-truncated and contprof-original-size) goes there",
                        src, len, in->dlq_topic, DLQ_TRUNCATED);
            pthread_mutex_lock(&in->mu);
            in->st.dlq_truncated++;
            pthread_mutex_unlock(&in->mu);
            len = DLQ_TRUNCATED;
        }
        truncate = 0;
        rd_kafka_headers_t *hc = rd_kafka_headers_copy(hdrs);
        rd_kafka_resp_err_t e = rd_kafka_producev(
            in->dlq, RD_KAFKA_V_TOPIC(in->dlq_topic), RD_KAFKA_V_VALUE((void *)v, len),
            RD_KAFKA_V_KEY(k, klen), RD_KAFKA_V_HEADERS(hc),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (!e) {
            rd_kafka_headers_destroy(hdrs);
            in->dlq_pending = 1;
            return;
        }
        rd_kafka_headers_destroy(hc); /* not taken on failure */
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rd_kafka_poll(in->dlq, 100);
        } else if (e == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE && len > DLQ_TRUNCATED) {
            truncate = 1;
        } else {
            char msg[400];
            snprintf(msg, sizeof msg, "DLQ produce for %s: %s (retrying; offsets wait)", src,
                     rd_kafka_err2str(e));
            cp_log_error("ingest: %s", msg);
            note_error(in, msg);
            atomic_fetch_add(&in->dlq_failed, 1);
            retry_later(in, v, len, k, klen, hdrs);
            in->dlq_pending = 1;
            return;
        }
    }
}

static void dlq_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    cp_ingest *in = opaque;
    if (!m->err) return;
    rd_kafka_headers_t *h = NULL, *hc;
    rd_kafka_message_headers(m, &h);
    hc = h ? rd_kafka_headers_copy(h) : rd_kafka_headers_new(0);
    char src[320], msg[400];
    header_of(hc, "contprof-source", src, sizeof src);
    snprintf(msg, sizeof msg, "DLQ delivery for %s failed: %s (retrying; offsets wait)", src,
             rd_kafka_err2str(m->err));
    cp_log_error("ingest: %s", msg);
    note_error(in, msg);
    atomic_fetch_add(&in->dlq_failed, 1);
    if (m->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE && m->len > DLQ_TRUNCATED) {
        rd_kafka_header_add(hc, "contprof-too-large", -1, "broker", -1);
    }
    retry_later(in, m->payload, m->len, m->key, m->key_len, hc);
}

/* Returns once every DLQ copy produced so far is delivered. Failed deliveries are produced
 * again after a pause growing from 0.1 s to 5 s; offsets do not move meanwhile (the caller
 * writes them after this). Gives up only when the ingest is stopping: what is still
 * undelivered then is counted in dlq_failed and logged with its source offset. */
static void dlq_settle(cp_ingest *in)
{
    int backoff_ms = 100;
    for (;;) {
        rd_kafka_flush(in->dlq, 1000);
        if (!in->retry.n && rd_kafka_outq_len(in->dlq) == 0) return;
        if (atomic_load(&in->stop)) {
            rd_kafka_purge(in->dlq, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
            rd_kafka_poll(in->dlq, 0);
            for (uint32_t i = 0; i < in->retry.n; i++) {
                char src[320];
                cp_log_error("ingest: stopping: the DLQ copy of %s was never delivered (lost)",
                             header_of(in->retry.v[i].hdrs, "contprof-source", src, sizeof src));
                retry_close(&in->retry.v[i]);
            }
            in->retry.n = 0;
            return;
        }
        if (!in->retry.n) continue;
        for (int t = 0; t < backoff_ms && !atomic_load(&in->stop); t += 50)
            usleep(50000);
        if (backoff_ms < 5000) backoff_ms *= 2;
        /* produce them again; failures land in in->retry anew */
        dlq_retry *v = in->retry.v;
        uint32_t n = in->retry.n;
        in->retry.v = NULL;
        in->retry.n = in->retry.cap = 0;
        for (uint32_t i = 0; i < n; i++) {
            char big[8];
            int trunc = header_of(v[i].hdrs, "contprof-too-large", big, sizeof big)[0] != 0;
            if (trunc) rd_kafka_header_remove(v[i].hdrs, "contprof-too-large");
            dlq_produce(in, v[i].value, v[i].len, v[i].key, v[i].klen, v[i].hdrs, trunc);
            v[i].hdrs = NULL;
            retry_close(&v[i]);
        }
        free(v);
    }
}

static void to_dlq(cp_ingest *in, part *p, const rd_kafka_message_t *m, int reason, const char *why)
{
    const char *topic = rd_kafka_topic_name(m->rkt);
    char src[320], tag[24];
    snprintf(src, sizeof src, "%s/%d/%lld", topic, m->partition, (long long)m->offset);
    cp_log_warn("ingest: %s [%d] offset %lld -> %s (%s): %s", topic, m->partition,
                (long long)m->offset, in->dlq_topic, reason_names[reason], why);
    cp_counter_add(&in->dlq_reason[reason], 1);
    snprintf(tag, sizeof tag, "dlq:%s", reason_names[reason]);
    not_stored(in, p, m->offset, m->offset + 1, tag);
    rd_kafka_headers_t *h = rd_kafka_headers_new(5);
    rd_kafka_header_add(h, "contprof-reason", -1, reason_names[reason], -1);
    rd_kafka_header_add(h, "contprof-error", -1, why, -1);
    rd_kafka_header_add(h, "contprof-source", -1, src, -1);
    dlq_produce(in, m->payload, m->len, m->key, m->key_len, h, 0);
}

static int dlq_reason_of(int rc, int stage)
{
    if (rc == CP_ELIMIT) return CP_DLQ_LIMIT;
    if (stage == 0) return rc == CP_EVERSION ? CP_DLQ_VERSION : CP_DLQ_ENVELOPE;
    if (stage == 1) return rc == CP_ENOMEM ? CP_DLQ_LIMIT : CP_DLQ_PPROF;
    return CP_DLQ_REJECTED;
}

/* Counts m and decides whether it is to be stored: not below the stored offset, and its
 * partition still ours (a rebalance may run while a chunk is being polled). */
static int admit(cp_ingest *in, rd_kafka_message_t *m)
{
    part *p = part_get(in, m->partition);
    cp_counter_add(&in->messages, 1);
    cp_counter_add(&in->bytes, m->len);
    pthread_mutex_lock(&in->mu);
    int skip = !p || !p->assigned || (p->next >= 0 && m->offset < p->next);
    pthread_mutex_unlock(&in->mu);
    if (skip) cp_counter_add(&in->skipped, 1);
    return !skip;
}

/* 1 if the message is signed with one of the tokens of the tenant its envelope names. */
static int tenant_signed(const cp_ingest *in, const slot *sl)
{
    for (const char *const *t = in->o.tenant_tokens; t[0] && t[1]; t += 2)
        if (strcmp(t[0], sl->env.tenant) == 0 &&
            cp_envelope_verify(sl->m->payload, sl->m->len, t[1]))
            return 1;
    return 0;
}

static void decode_slot(cp_ingest *in, slot *sl, cp_pprof_decoder *dec)
{
    sl->err.code = 0;
    sl->err.msg[0] = 0;
    sl->rc_prof = 0;
    sl->tenant_bad = 0;
    sl->rc_env = cp_envelope_decode_view(sl->m->payload, sl->m->len, in->o.max_message_bytes,
                                         &sl->env, &sl->err);
    if (!sl->rc_env && in->o.tenant_tokens && !tenant_signed(in, sl)) {
        /* Checked before the payload is decoded: a forged envelope costs no pprof work. */
        sl->tenant_bad = 1;
        cp_err_set(&sl->err, CP_EINVAL,
                   "envelope for tenant \"%.64s\" is not signed with a token of that tenant "
                   "(auth field missing or wrong)",
                   sl->env.tenant);
        return;
    }
    if (!sl->rc_env)
        sl->rc_prof = cp_pprof_decoder_decode_lazy(dec, sl->env.pprof, sl->env.pprof_len, sl->prof,
                                                   &sl->lz, &sl->err);
}

static void decode_share(cp_ingest *in, uint32_t tid)
{
    for (uint32_t i = tid; i < in->nslots; i += in->nthreads)
        if (in->slots[i].todo) decode_slot(in, &in->slots[i], in->decs[tid]);
}

static void *worker(void *arg)
{
    cp_ingest *in = ((void **)arg)[0];
    uint32_t tid = (uint32_t)(uintptr_t)((void **)arg)[1];
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&in->wmu);
    for (;;) {
        while (in->gen == seen && !in->wquit)
            pthread_cond_wait(&in->wgo, &in->wmu);
        if (in->wquit) break;
        seen = in->gen;
        pthread_mutex_unlock(&in->wmu);
        decode_share(in, tid);
        pthread_mutex_lock(&in->wmu);
        in->ndone++;
        pthread_cond_signal(&in->wdone);
    }
    pthread_mutex_unlock(&in->wmu);
    return NULL;
}

/* Adds what the agent says it lost (e's dropped_windows and dropped_samples) to its
 * service, once per producer and window: every envelope of a window carries the same
 * numbers. The producer table is cleared when full (a window may then count twice). */
static void count_dropped(cp_ingest *in, const cp_envelope *e)
{
    if (!e->dropped_windows && !e->dropped_samples) return;
    const char *id = e->producer_id ? e->producer_id : "";
    uint32_t h = 2166136261u;
    for (const char *c = id; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    producer_seen *ps = NULL;
    for (uint32_t i = 0; i < MAX_PRODUCERS; i++) {
        producer_seen *q = &in->producers[(h + i) % MAX_PRODUCERS];
        if (!q->id || !strcmp(q->id, id)) {
            ps = q;
            break;
        }
    }
    if (!ps || (!ps->id && in->nproducers >= MAX_PRODUCERS / 2)) {
        for (uint32_t i = 0; i < MAX_PRODUCERS; i++) {
            free(in->producers[i].id);
            in->producers[i].id = NULL;
        }
        in->nproducers = 0;
        ps = &in->producers[h % MAX_PRODUCERS];
    }
    if (!ps->id) {
        if (!(ps->id = strdup(id))) return;
        in->nproducers++;
    } else if (e->window_start_ns <= ps->start) {
        return; /* this window was counted */
    }
    ps->start = e->window_start_ns;
    const char *svc = cp_labels_get(&e->labels, "service");
    if (!svc) svc = "";
    pthread_mutex_lock(&in->mu);
    cp_ingest_dropped *d = NULL;
    for (uint32_t i = 0; i < in->dropped.n && !d; i++)
        if (!strncmp(in->dropped.v[i].service, svc, sizeof d->service - 1)) d = &in->dropped.v[i];
    if (!d && in->dropped.n < MAX_SERVICES && !cp_vec_reserve(&in->dropped, in->dropped.n + 1)) {
        d = &in->dropped.v[in->dropped.n++];
        memset(d, 0, sizeof *d);
        snprintf(d->service, sizeof d->service, "%s", svc);
    }
    if (!d) d = &in->dropped.v[in->dropped.n - 1]; /* the last one stands for the rest */
    d->windows += e->dropped_windows;
    d->samples += e->dropped_samples;
    pthread_mutex_unlock(&in->mu);
}

static uint32_t gap_hash(const char *id)
{
    uint32_t h = 2166136261u;
    for (const char *c = id; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    return h;
}

/* Makes room in the gap table: keeps the entries seen in the last GAP_IDLE_NS (a producer
 * forgotten and seen again is looked up in the store again, which then holds all of it). */
static void gap_compact(cp_ingest *in, int64_t now)
{
    gap_seen *old = in->gaps;
    gap_seen *nw = calloc(GAP_PRODUCERS, sizeof *nw);
    if (!nw) return;
    in->ngaps = in->ntracked = 0;
    for (uint32_t i = 0; i < GAP_PRODUCERS; i++) {
        if (!old[i].id) continue;
        if (now - old[i].last_ns > GAP_IDLE_NS) {
            free(old[i].id);
            continue;
        }
        uint32_t j = gap_hash(old[i].id) % GAP_PRODUCERS;
        while (nw[j].id)
            j = (j + 1) % GAP_PRODUCERS;
        nw[j] = old[i];
        in->ngaps++;
        in->ntracked += old[i].state == GAP_TRACK;
    }
    free(old);
    in->gaps = nw;
}

/* Notes e's producer and sequence, to count what an agent numbered and ingest never saw
 * across a restart of contprofd (what died with the embedded broker at a crash, which no
 * other counter sees). At a producer's first envelope in this process with sequence > 1
 * (agents number from 0 and import's windows are 1: nothing to compare), the store says
 * the last sequence it holds of it (base); the lowest sequence above base seen in the next
 * GAP_SETTLE_NS (other partitions may bring lower ones a little later) tells the gap,
 * counted and logged by gap_settle. A lower bound: what was lost below base on another
 * partition is not seen. */
static void seq_note(cp_ingest *in, const cp_envelope *e)
{
    CP_ASSERT_THREAD(&in->owner, "ingest thread only");
    const char *id = e->producer_id;
    if (!id || !*id || !e->tenant || !in->gaps) return;
    int64_t now = mono_ns();
    uint32_t j = gap_hash(id) % GAP_PRODUCERS;
    while (in->gaps[j].id && strcmp(in->gaps[j].id, id))
        j = (j + 1) % GAP_PRODUCERS;
    gap_seen *g = &in->gaps[j];
    if (g->id) {
        g->last_ns = now;
        if (g->state == GAP_TRACK && e->sequence > g->base && e->sequence < g->min)
            g->min = e->sequence;
        return;
    }
    if (e->sequence <= 1) return; /* nothing before it to miss; not remembered */
    if (in->ngaps >= GAP_PRODUCERS * 3 / 4) {
        gap_compact(in, now);
        if (in->ngaps >= GAP_PRODUCERS * 3 / 4) return; /* untracked: a lower bound anyway */
        j = gap_hash(id) % GAP_PRODUCERS;
        while (in->gaps[j].id)
            j = (j + 1) % GAP_PRODUCERS;
        g = &in->gaps[j];
    }
    if (!(g->id = strdup(id))) return;
    in->ngaps++;
    g->first_ns = g->last_ns = now;
    g->state = GAP_DONE;
    uint64_t base = 0;
    cp_err err = {0};
    int rc = cp_store_producer_last(in->store, e->tenant, id, &base, &err);
    if (rc && rc != CP_ENOTFOUND) cp_log_warn("ingest: sequence gaps: %s", err.msg);
    if (!rc && e->sequence > base + 1) {
        g->state = GAP_TRACK;
        g->base = base;
        g->min = e->sequence;
        in->ntracked++;
    }
}

/* Counts and logs the gaps of the producers first seen at least GAP_SETTLE_NS ago. */
static void gap_settle(cp_ingest *in, int64_t now)
{
    CP_ASSERT_THREAD(&in->owner, "ingest thread only");
    if (!in->ntracked || now - in->gaps_checked_ns < 1000000000LL) return;
    in->gaps_checked_ns = now;
    for (uint32_t i = 0; i < GAP_PRODUCERS; i++) {
        gap_seen *g = &in->gaps[i];
        if (!g->id || g->state != GAP_TRACK || now - g->first_ns < GAP_SETTLE_NS) continue;
        g->state = GAP_DONE;
        in->ntracked--;
        if (g->min <= g->base + 1) continue;
        uint64_t n = g->min - g->base - 1;
        cp_counter_add(&in->seq_lost, n);
        cp_log_warn("ingest: producer %s: sequences %llu..%llu (%llu envelopes) never arrived: "
                    "numbered after the last one stored before this start and before the "
                    "first read since; lost with the broker's memory at a crash or stop, or "
                    "dropped by the agent (contprof_agent_dropped_windows_total)",
                    g->id, (unsigned long long)g->base + 1, (unsigned long long)g->min - 1,
                    (unsigned long long)n);
    }
}

/* Stores one decoded message (or sends it to the DLQ) and moves its partition's offset.
 * Returns -1 when the ingest failed (the offset does not move). */
static int apply(cp_ingest *in, slot *sl)
{
    rd_kafka_message_t *m = sl->m;
    const char *topic = rd_kafka_topic_name(m->rkt);
    part *p = part_get(in, m->partition);
    if (p->next >= 0 && m->offset > p->next) {
        lost(in, topic, m->partition, p, p->next, m->offset);
    } else if (p->next < 0 && m->offset > 0) {
        /* The first message read. On a log that started with this process (the embedded
         * broker) everything before it was produced and dropped unread. */
        if (in->o.new_log)
            lost(in, topic, m->partition, p, 0, m->offset);
        else
            cp_log_info("ingest: %s [%d] starts at offset %lld: the broker removed the earlier "
                        "ones before this store read any",
                        topic, m->partition, (long long)m->offset);
    }
    if (!sl->rc_env && !sl->tenant_bad) count_dropped(in, &sl->env);
    int rc = 0;
    if (sl->tenant_bad) {
        to_dlq(in, p, m, CP_DLQ_TENANT, sl->err.msg);
    } else if (sl->rc_env) {
        to_dlq(in, p, m, dlq_reason_of(sl->rc_env, 0), sl->err.msg);
    } else if (sl->rc_prof) {
        to_dlq(in, p, m, dlq_reason_of(sl->rc_prof, 1), sl->err.msg);
    } else {
        cp_err err = {0};
        seq_note(in, &sl->env);
        rc = cp_store_batch_add_lazy(in->batch, &sl->env, sl->prof, &sl->lz, m->partition, &err);
        if (rc == CP_STORE_DUPLICATE) {
            cp_counter_add(&in->duplicates, 1);
        } else if (rc == CP_EPPROF) { /* a sample's ids, checked by the store (lazy ids) */
            to_dlq(in, p, m, dlq_reason_of(rc, 1), err.msg);
        } else if (rc == CP_EINVAL || rc == CP_EINCOMPAT || rc == CP_ELIMIT) {
            to_dlq(in, p, m, dlq_reason_of(rc, 2), err.msg);
        } else if (rc) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s [%d] offset %lld: %s", topic, m->partition,
                     (long long)m->offset, err.msg);
            store_failed(in, msg);
            return -1;
        }
    }
    p->next = m->offset + 1;
    p->ours = 1;
    cp_store_batch_set_offset(in->batch, topic, m->partition, p->next);
    if (!in->pending++) in->batch_start = mono_ns();
    return 0;
}

/* The consumer could not fetch partition pn at offset `at`: out of the log's range
 * (auto.offset.reset=error hands the decision here). Below the log's start, the broker
 * removed offsets before they were read: read from the start, apply() counts them lost.
 * At or past its end, the log is not the one the stored offset counts in (a broker that
 * restarted empty, a topic deleted and created again): read the new log from its start,
 * its offsets stored from there on, counted in contprof_ingest_offset_resets_total and
 * logged. The open batch is written first, so the reset offset goes in a batch of its own
 * messages, as every offset does. */
static void offset_reset(cp_ingest *in, const char *topic, int32_t pn, int64_t at)
{
    part *p = part_get(in, pn);
    if (!p || !p->assigned) return;
    if (commit(in)) return; /* paused; the resume seeks to the stored offsets */
    int64_t lo = -1, hi = -1;
    rd_kafka_resp_err_t ke = rd_kafka_query_watermark_offsets(in->rk, topic, pn, &lo, &hi, 5000);
    if (ke) {
        /* the broker did not answer: try the start of a log that begins at 0; if it does
         * not, the fetch fails again and this runs again */
        cp_log_warn("ingest: %s [%d]: offset %lld is out of the log's range and its range is "
                    "unknown (%s): reading from offset 0",
                    topic, pn, (long long)at, rd_kafka_err2str(ke));
        lo = 0;
        hi = 0;
    }
    if (at < lo) {
        cp_log_warn("ingest: %s [%d]: offset %lld was removed from the broker before it was "
                    "read; the log starts at %lld",
                    topic, pn, (long long)at, (long long)lo);
    } else {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "%s [%d]: the log holds offsets %lld..%lld, before the stored offset %lld (the "
                 "broker restarted empty, or the topic was recreated): read from %lld (offset "
                 "reset)",
                 topic, pn, (long long)lo, (long long)hi - 1, (long long)at, (long long)lo);
        cp_log_warn("ingest: %s", msg);
        note_error(in, msg);
        pthread_mutex_lock(&in->mu);
        p->resets++;
        in->st.offset_resets++;
        /* the offsets senders ask about are the new log's from here on */
        p->next = lo;
        p->durable = lo;
        p->known_from = lo;
        p->lost_to = lo;
        p->nr = p->r0 = 0;
        pthread_mutex_unlock(&in->mu);
        p->ours = 1;
        cp_store_batch_set_offset(in->batch, topic, pn, lo);
        if (!in->pending++) in->batch_start = mono_ns();
        if (commit(in)) return;
    }
    /* The fetcher stopped at the error and a seek cannot start it again: the partition is
     * assigned anew at lo. Eager (and static) assignment replaces the whole list, so every
     * other partition restarts where it stands: the batch is written, so at its stored
     * offset, or where it was assigned if it has read nothing. */
    p->start = lo;
    rd_kafka_topic_partition_list_t *l = NULL;
    rd_kafka_error_t *e = NULL;
    if (in->cooperative) {
        l = rd_kafka_topic_partition_list_new(1);
        if (!l) return;
        rd_kafka_topic_partition_list_add(l, topic, pn)->offset = lo;
        e = rd_kafka_incremental_unassign(in->rk, l);
        if (!e) e = rd_kafka_incremental_assign(in->rk, l);
    } else if (!rd_kafka_assignment(in->rk, &l) && l) {
        for (int i = 0; i < l->cnt; i++) {
            part *q = part_get(in, l->elems[i].partition);
            if (l->elems[i].partition == pn && !strcmp(l->elems[i].topic, topic))
                l->elems[i].offset = lo;
            else if (q)
                l->elems[i].offset = q->next >= 0 ? q->next : q->start;
        }
        rd_kafka_resp_err_t ae = rd_kafka_assign(in->rk, l);
        if (ae)
            cp_log_error("ingest: %s [%d]: assigning again at %lld: %s", topic, pn, (long long)lo,
                         rd_kafka_err2str(ae));
    }
    if (e) {
        cp_log_error("ingest: %s [%d]: assigning again at %lld: %s", topic, pn, (long long)lo,
                     rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
    }
    if (l) rd_kafka_topic_partition_list_destroy(l);
}

/* Admits, decodes (in parallel) and stores the polled chunk, in order. */
static void process_chunk(cp_ingest *in)
{
    uint32_t todo = 0;
    for (uint32_t i = 0; i < in->nslots; i++) {
        slot *sl = &in->slots[i];
        sl->todo = admit(in, sl->m);
        memset(&sl->env, 0, sizeof sl->env);
        todo += sl->todo;
    }
    int parallel = todo > 1 && in->nworkers;
    if (parallel) {
        pthread_mutex_lock(&in->wmu);
        in->gen++;
        in->ndone = 0;
        pthread_cond_broadcast(&in->wgo);
        pthread_mutex_unlock(&in->wmu);
        decode_share(in, 0);
        pthread_mutex_lock(&in->wmu);
        while (in->ndone < in->nworkers)
            pthread_cond_wait(&in->wdone, &in->wmu);
        pthread_mutex_unlock(&in->wmu);
    }
    int failed = 0;
    for (uint32_t i = 0; i < in->nslots; i++) {
        slot *sl = &in->slots[i];
        /* alone, each message is decoded just before it is stored: still in the cache */
        if (sl->todo && !failed && !parallel) decode_slot(in, sl, in->decs[0]);
        if (sl->todo && !failed) failed = apply(in, sl) < 0;
        cp_envelope_close(&sl->env);
        rd_kafka_message_destroy(sl->m);
        sl->m = NULL;
    }
    in->nslots = 0;
}

static void update_lag(cp_ingest *in)
{
    int64_t lag = 0;
    uint32_t np = 0;
    for (uint32_t i = 0; i < in->parts.n; i++) {
        if (!in->parts.v[i].assigned) continue;
        np++;
        int64_t lo = -1, hi = -1;
        if (rd_kafka_get_watermark_offsets(in->rk, in->topic, (int32_t)i, &lo, &hi) || hi < 0 ||
            lo < 0) {
            lag = -1; /* no fetch answer yet for this partition */
            break;
        }
        /* nothing stored yet: everything from the log start is behind */
        int64_t pos = in->parts.v[i].next >= 0 ? in->parts.v[i].next : lo;
        if (hi > pos) lag += hi - pos;
    }
    cp_gauge_set(&in->lag, np ? lag : -1);
    pthread_mutex_lock(&in->mu);
    in->st.partitions = np;
    pthread_mutex_unlock(&in->mu);
}

/* How long a caught-up batch may wait now: idle_wait, or ASKED_WAIT_NS while someone asks
 * which offsets are stored (within the last 50 ms). */
static int64_t wait_now(cp_ingest *in, int64_t idle_wait)
{
    int64_t asked = atomic_load(&in->asked_ns);
    if (asked && mono_ns() - asked < 50 * 1000000LL && ASKED_WAIT_NS < idle_wait)
        return ASKED_WAIT_NS;
    return idle_wait;
}

/* (ingest_int.h) A weight of 0.3 for the newest sample. */
void cp_ingest_rate_tick(cp_ingest *in, int64_t now)
{
    CP_ASSERT_THREAD(&in->owner, "ingest thread only");
    if (in->rate_ns && now - in->rate_ns < 5000000000LL) return;
    uint64_t w = cp_counter_get(&in->windows);
    if (in->rate_ns) {
        double inst = (double)(w - in->rate_windows) / ((double)(now - in->rate_ns) / 1e9);
        double r = cp_gauge_f_get(&in->rate);
        cp_gauge_f_set(&in->rate, r ? 0.7 * r + 0.3 * inst : inst);
    }
    in->rate_ns = now;
    in->rate_windows = w;
}

static void *run(void *arg)
{
    cp_ingest *in = arg;
    int64_t last_maint = mono_ns(), last_lag = 0;
    int64_t max_wait = (int64_t)in->o.batch_max_ms * 1000000;
    /* once caught up, the open batch waits this long at most, less while someone asks
     * (wait_now); each commit re-encodes the series' open rollup buckets, so fewer larger
     * batches under a steady stream cost less CPU (ingest/README.md, "Batches") */
    int64_t idle_wait = max_wait;
    int caught_up = 0; /* nothing was waiting to be read at some point since the batch began */
    pthread_mutex_lock(&in->mu);
    in->st.running = 1;
    pthread_mutex_unlock(&in->mu);
    while (!atomic_load(&in->stop)) {
        cp_ingest_rate_tick(in, mono_ns());
        if (in->paused) {
            /* polling serves rebalances and keeps the group membership; a message fetched
             * before the pause took hold is read again after the seek back */
            rd_kafka_message_t *m = rd_kafka_consumer_poll(in->rk, 100);
            if (m) rd_kafka_message_destroy(m);
            if (mono_ns() >= in->retry_at) try_resume(in);
            continue;
        }
        int timeout = 100;
        if (in->pending) {
            int64_t left =
                in->batch_start + (caught_up ? wait_now(in, idle_wait) : max_wait) - mono_ns();
            timeout = left <= 0 ? 0 : (int)(left / 1000000) + 1;
            /* a sender may start asking meanwhile (wait_now) */
            if (timeout > (int)(ASKED_WAIT_NS / 1000000)) timeout = (int)(ASKED_WAIT_NS / 1000000);
        }
        rd_kafka_message_t *m = rd_kafka_consumer_poll(in->rk, timeout);
        if (!m) caught_up = 1;
        while (m) {
            if (!m->err) {
                in->slots[in->nslots++].m = m;
            } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET && m->rkt) {
                /* what was read before it is stored first, in order */
                if (in->nslots) process_chunk(in);
                offset_reset(in, rd_kafka_topic_name(m->rkt), m->partition, m->offset);
                rd_kafka_message_destroy(m);
            } else {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                    char msg[300];
                    snprintf(msg, sizeof msg, "consumer: %s", rd_kafka_message_errstr(m));
                    cp_log_warn("ingest: %s", msg);
                    note_error(in, msg);
                } else {
                    caught_up = 1;
                }
                rd_kafka_message_destroy(m);
            }
            if (in->nslots >= in->chunk_max) break;
            m = rd_kafka_consumer_poll(in->rk, 0);
        }
        if (in->nslots) process_chunk(in);
        if (in->paused) continue;
        if (atomic_load(&in->stop) && !in->pending) break;
        int64_t now = mono_ns();
        /* Write when the batch is full or old; once ingest has caught up with what there is
         * to read and someone asks, old means ASKED_WAIT_NS: a sender waiting for its windows
         * to be stored (import) is not held for batch_max_ms, a backlog is still written in
         * large batches, and a sender slower than ingest does not get one synced write per
         * window. */
        if (in->pending &&
            (in->pending >= in->o.batch_max_messages ||
             now - in->batch_start >= (caught_up ? wait_now(in, idle_wait) : max_wait))) {
            if (commit(in)) continue; /* paused (store_failed), or stopping */
            caught_up = 0;
        }
        rd_kafka_poll(in->dlq, 0);
        gap_settle(in, now);
        if (now - last_lag >= 1000000000LL) {
            update_lag(in);
            last_lag = now;
        }
        if (now - last_maint >= (int64_t)in->o.maintain_every_ms * 1000000) {
            if (commit(in)) continue;
            cp_err err = {0};
            uint32_t del = 0;
            if (cp_store_maintain(in->store, real_ns(), in->o.maintain_max_keys, &del, &err))
                cp_log_error("ingest: retention: %s", err.msg);
            else if (del)
                cp_log_info("ingest: retention removed %u blocks", del);
            last_maint = mono_ns();
        }
    }
    if (!in->st.failed) commit(in);
    rd_kafka_flush(in->dlq, 10000);
    cp_store_writer_release(in->store); /* a later start, or the caller, may write next */
    CP_THREAD_RELEASE(&in->owner);
    pthread_mutex_lock(&in->mu);
    in->st.running = 0;
    pthread_mutex_unlock(&in->mu);
    return NULL;
}

/* ---------------------------------------------------------------------------------
 * Lifecycle
 * --------------------------------------------------------------------------------- */

void cp_ingest_malloc_policy(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 16 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

static int conf_set(rd_kafka_conf_t *c, const char *k, const char *v, cp_err *err)
{
    char es[512];
    if (rd_kafka_conf_set(c, k, v, es, sizeof es) != RD_KAFKA_CONF_OK)
        return cp_err_set(err, CP_EINVAL, "kafka property %s: %s", k, es);
    return 0;
}

int cp_ingest_create(const cp_ingest_options *opt, cp_store *store, cp_ingest **out, cp_err *err)
{
    *out = NULL;
    if (!opt || !opt->brokers || !*opt->brokers)
        return cp_err_set(err, CP_EINVAL, "ingest: no brokers given");
    cp_ingest *in = calloc(1, sizeof *in);
    if (!in) return cp_err_set(err, CP_ENOMEM, "ingest");
    pthread_mutex_init(&in->mu, NULL);
    in->o = *opt;
    in->store = store;
    in->gaps = calloc(GAP_PRODUCERS, sizeof *in->gaps); /* NULL: gaps go uncounted */
    if (!in->o.batch_max_messages) in->o.batch_max_messages = 512;
    if (!in->o.batch_max_ms) in->o.batch_max_ms = 200;
    if (!in->o.max_message_bytes) in->o.max_message_bytes = CP_INGEST_MAX_PPROF;
    if (!in->o.maintain_every_ms) in->o.maintain_every_ms = 10000;
    if (!in->o.maintain_max_keys) in->o.maintain_max_keys = 20000;
    if (opt->limits)
        in->limits = *opt->limits;
    else
        cp_pprof_limits_default(&in->limits);
    in->topic = strdup(opt->topic ? opt->topic : CP_TOPIC_PROFILES);
    in->dlq_topic = strdup(opt->dlq_topic ? opt->dlq_topic : CP_TOPIC_DLQ);
    in->brokers = strdup(opt->brokers);
    in->batch = cp_store_batch_create(store);
    int rc;
    if (!in->topic || !in->dlq_topic || !in->brokers || !in->batch) {
        rc = cp_err_set(err, CP_ENOMEM, "ingest");
        goto fail;
    }
    /* decoding threads */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    in->nthreads = opt->decode_threads ? opt->decode_threads
                                       : (uint32_t)(ncpu < 1   ? 1
                                                    : ncpu > 4 ? 4
                                                               : ncpu);
    if (in->nthreads > 16) in->nthreads = 16;
    in->chunk_max = 8 * in->nthreads;
    in->decs = calloc(in->nthreads, sizeof *in->decs);
    in->slots = calloc(in->chunk_max, sizeof *in->slots);
    if (!in->decs || !in->slots) {
        rc = cp_err_set(err, CP_ENOMEM, "ingest");
        goto fail;
    }
    for (uint32_t i = 0; i < in->nthreads; i++)
        if (!(in->decs[i] = cp_pprof_decoder_create(&in->limits))) {
            rc = cp_err_set(err, CP_ENOMEM, "ingest");
            goto fail;
        }
    for (uint32_t i = 0; i < in->chunk_max; i++)
        if (!(in->slots[i].prof = cp_profile_create())) {
            rc = cp_err_set(err, CP_ENOMEM, "ingest");
            goto fail;
        }
    pthread_mutex_init(&in->wmu, NULL);
    pthread_cond_init(&in->wgo, NULL);
    pthread_cond_init(&in->wdone, NULL);
    in->workers = calloc(in->nthreads, sizeof *in->workers);
    if (!in->workers) {
        rc = cp_err_set(err, CP_ENOMEM, "ingest");
        goto fail;
    }
    for (uint32_t i = 1; i < in->nthreads; i++) {
        void **arg = malloc(2 * sizeof *arg);
        if (!arg) {
            rc = cp_err_set(err, CP_ENOMEM, "ingest");
            goto fail;
        }
        arg[0] = in;
        arg[1] = (void *)(uintptr_t)i;
        if (pthread_create(&in->workers[in->nworkers], NULL, worker, arg)) {
            free(arg);
            rc = cp_err_set(err, CP_ENOMEM, "ingest: decoder thread");
            goto fail;
        }
        char name[16]; /* named for top -H and the bench's CPU per thread */
        snprintf(name, sizeof name, "cp-decode%u", i % 100); /* at most 16 threads */
        (void)pthread_setname_np(in->workers[in->nworkers], name);
        in->nworkers++;
    }
    char es[512];
    /* the consumer */
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if ((rc = conf_set(c, "bootstrap.servers", opt->brokers, err)) ||
        (rc = conf_set(c, "group.id", opt->group_id ? opt->group_id : "contprofd", err)) ||
        (rc = conf_set(c, "enable.auto.commit", "false", err)) ||
        (rc = conf_set(c, "enable.auto.offset.store", "false", err)) ||
        (rc = conf_set(c, "auto.offset.reset", "error", err)) || /* offset_reset */
        (rc = conf_set(c, "fetch.wait.max.ms", "20", err)) ||
        /* large fetches: a burst into one partition is read in few round trips */
        (rc = conf_set(c, "max.partition.fetch.bytes", "16777216", err)) ||
        (rc = conf_set(c, "enable.partition.eof", "true", err)) ||
        (rc = conf_set(c, "client.id", "contprofd-ingest", err))) {
        rd_kafka_conf_destroy(c);
        goto fail;
    }
    for (const char *const *kv = opt->kafka_props; kv && kv[0] && kv[1]; kv += 2)
        if ((rc = conf_set(c, kv[0], kv[1], err))) {
            rd_kafka_conf_destroy(c);
            goto fail;
        }
    rd_kafka_conf_set_rebalance_cb(c, rebalance_cb);
    rd_kafka_conf_set_opaque(c, in);
    in->rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, es, sizeof es);
    if (!in->rk) {
        rd_kafka_conf_destroy(c);
        rc = cp_err_set(err, CP_EKAFKA, "ingest: consumer: %s", es);
        goto fail;
    }
    rd_kafka_poll_set_consumer(in->rk);
    in->cooperative =
        !strcmp(rd_kafka_rebalance_protocol(in->rk) ? rd_kafka_rebalance_protocol(in->rk) : "",
                "COOPERATIVE");
    /* the DLQ producer */
    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    if ((rc = conf_set(pc, "bootstrap.servers", opt->brokers, err)) ||
        (rc = conf_set(pc, "enable.idempotence", "true", err)) ||
        (rc = conf_set(pc, "linger.ms", "5", err)) ||
        /* undelivered copies come back within 30 s and are produced again (dlq_settle) */
        (rc = conf_set(pc, "message.timeout.ms", "30000", err)) ||
        (rc = conf_set(pc, "client.id", "contprofd-dlq", err))) {
        rd_kafka_conf_destroy(pc);
        goto fail;
    }
    for (const char *const *kv = opt->kafka_props; kv && kv[0] && kv[1]; kv += 2)
        rd_kafka_conf_set(pc, kv[0], kv[1], es, sizeof es); /* consumer-only ones are ignored */
    rd_kafka_conf_set_dr_msg_cb(pc, dlq_dr_cb);
    rd_kafka_conf_set_opaque(pc, in);
    in->dlq = rd_kafka_new(RD_KAFKA_PRODUCER, pc, es, sizeof es);
    if (!in->dlq) {
        rd_kafka_conf_destroy(pc);
        rc = cp_err_set(err, CP_EKAFKA, "ingest: DLQ producer: %s", es);
        goto fail;
    }
    cp_gauge_set(&in->lag, -1);
    *out = in;
    return 0;
fail:
    cp_ingest_destroy(in);
    return rc;
}

int cp_ingest_start(cp_ingest *in, cp_err *err)
{
    if (in->started) return 0;
    rd_kafka_topic_partition_list_t *t;
    rd_kafka_resp_err_t ke = 0;
    if (in->o.partitions && *in->o.partitions) {
        /* Static ownership: this node's partitions, sought as a group's assignment would be
         * (rebalance_cb), before the thread polls. */
        if (!(t = cp_assign_list(in->topic, in->o.partitions, err))) return err->code;
        rebalance_cb(in->rk, RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, t, in);
    } else {
        t = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(t, in->topic, RD_KAFKA_PARTITION_UA);
        ke = rd_kafka_subscribe(in->rk, t);
    }
    rd_kafka_topic_partition_list_destroy(t);
    if (ke)
        return cp_err_set(err, CP_EKAFKA, "ingest: subscribe to %s: %s", in->topic,
                          rd_kafka_err2str(ke));
    atomic_store(&in->stop, 0);
    /* running from here on, not from when the thread gets to it: a sender that asks at once
     * must not read "not running" */
    pthread_mutex_lock(&in->mu);
    in->st.running = 1;
    pthread_mutex_unlock(&in->mu);
    if (pthread_create(&in->th, NULL, run, in)) {
        pthread_mutex_lock(&in->mu);
        in->st.running = 0;
        pthread_mutex_unlock(&in->mu);
        return cp_err_set(err, CP_ENOMEM, "ingest: cannot start the thread");
    }
    (void)pthread_setname_np(in->th, "cp-ingest");
    in->started = 1;
    return 0;
}

void cp_ingest_stop(cp_ingest *in)
{
    if (!in || !in->started) return;
    atomic_store(&in->stop, 1);
    pthread_join(in->th, NULL);
    in->started = 0;
    /* leaving the group runs the revoke callback on this thread: it commits (nothing) */
    rd_kafka_consumer_close(in->rk);
    CP_THREAD_RELEASE(&in->owner);
}

void cp_ingest_destroy(cp_ingest *in)
{
    if (!in) return;
    cp_metrics_remove(in->metrics, in);
    cp_ingest_stop(in);
    if (in->rk) rd_kafka_destroy(in->rk);
    if (in->dlq) {
        rd_kafka_flush(in->dlq, 5000);
        rd_kafka_purge(in->dlq, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_destroy(in->dlq);
    }
    for (uint32_t i = 0; i < in->retry.n; i++)
        retry_close(&in->retry.v[i]);
    free(in->retry.v);
    for (uint32_t i = 0; i < MAX_PRODUCERS; i++)
        free(in->producers[i].id);
    for (uint32_t i = 0; in->gaps && i < GAP_PRODUCERS; i++)
        free(in->gaps[i].id);
    free(in->gaps);
    free(in->dropped.v);
    cp_store_batch_destroy(in->batch);
    if (in->workers) {
        pthread_mutex_lock(&in->wmu);
        in->wquit = 1;
        pthread_cond_broadcast(&in->wgo);
        pthread_mutex_unlock(&in->wmu);
        for (uint32_t i = 0; i < in->nworkers; i++)
            pthread_join(in->workers[i], NULL);
        pthread_mutex_destroy(&in->wmu);
        pthread_cond_destroy(&in->wgo);
        pthread_cond_destroy(&in->wdone);
        free(in->workers);
    }
    for (uint32_t i = 0; in->decs && i < in->nthreads; i++)
        cp_pprof_decoder_destroy(in->decs[i]);
    free(in->decs);
    for (uint32_t i = 0; in->slots && i < in->chunk_max; i++) {
        if (in->slots[i].m) rd_kafka_message_destroy(in->slots[i].m);
        cp_profile_destroy(in->slots[i].prof);
        cp_pprof_lazy_close(&in->slots[i].lz);
    }
    free(in->slots);
    free(in->parts.v);
    free(in->ours_durable.v);
    free(in->topic);
    free(in->dlq_topic);
    free(in->brokers);
    pthread_mutex_destroy(&in->mu);
    free(in);
}

int cp_ingest_drain(cp_ingest *in, int64_t timeout_ns)
{
    CP_ASSERT(!in->started || !pthread_equal(pthread_self(), in->th)); /* not ingest's */
    int64_t end = mono_ns() + timeout_ns;
    /* The broker's own end offsets (a ListOffsets round trip each), not the ones the last
     * fetch answer left in the consumer: a message produced just before this call and not
     * fetched yet counts. The partitions assigned now (with the embedded broker, all). */
    pthread_mutex_lock(&in->mu);
    uint32_t np = in->parts.n;
    int64_t *want = calloc(np + 1, sizeof *want);
    for (uint32_t i = 0; want && i < np; i++)
        want[i] = in->parts.v[i].assigned ? 0 : -1;
    pthread_mutex_unlock(&in->mu);
    if (!want) return CP_ENOMEM;
    /* offsets for the time "latest" (-1) are the ends; rd_kafka_offsets_for_times keeps to
     * its timeout with a broker away, where rd_kafka_query_watermark_offsets (2.0) waits for
     * the request's own timeout after the leader lookup */
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new((int)np + 1);
    for (uint32_t i = 0; i < np; i++)
        if (want[i] >= 0) rd_kafka_topic_partition_list_add(tl, in->topic, (int32_t)i)->offset = -1;
    int rc = 0;
    int left = (int)((end - mono_ns()) / 1000000);
    rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR__TIMED_OUT;
    if (tl->cnt && left > 0) e = rd_kafka_offsets_for_times(in->rk, tl, left);
    if (e && tl->cnt) {
        cp_log_warn("ingest: %s: the broker did not tell its partitions' ends: %s", in->topic,
                    rd_kafka_err2str(e));
        rc = CP_ELIMIT;
    }
    for (int j = 0; !rc && j < tl->cnt; j++) {
        const rd_kafka_topic_partition_t *tp = &tl->elems[j];
        if (tp->err) {
            cp_log_warn("ingest: %s [%d]: the broker did not tell the partition's end: %s",
                        in->topic, tp->partition, rd_kafka_err2str(tp->err));
            rc = CP_ELIMIT;
        }
        want[tp->partition] = tp->offset;
    }
    rd_kafka_topic_partition_list_destroy(tl);
    /* then until each partition's stored offset reaches that end; batches are written at
     * once meanwhile (asked_ns) */
    while (!rc) {
        uint32_t behind = 0;
        pthread_mutex_lock(&in->mu);
        for (uint32_t i = 0; i < np; i++)
            behind += want[i] > 0 && in->parts.v[i].durable < want[i];
        pthread_mutex_unlock(&in->mu);
        if (!behind) break;
        if (mono_ns() >= end) {
            rc = CP_ELIMIT;
            break;
        }
        atomic_store(&in->asked_ns, mono_ns());
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    free(want);
    return rc;
}

/* Ingest's counters: each registered once in the statistics registry under its name and
 * read into cp_ingest_stats's field of the same meaning; adding one is adding a row. */
static const struct {
    const char *name, *help;
    size_t counter; /* offsetof(cp_ingest, ...) */
    size_t stat;    /* offsetof(cp_ingest_stats, ...) */
} counters[] = {
    {"contprof_ingest_messages_total", "Kafka messages consumed.", offsetof(cp_ingest, messages),
     offsetof(cp_ingest_stats, messages)},
    {"contprof_ingest_windows_total", "Windows written to the store by ingest.",
     offsetof(cp_ingest, windows), offsetof(cp_ingest_stats, windows)},
    {"contprof_ingest_bytes_total", "Payload bytes consumed.", offsetof(cp_ingest, bytes),
     offsetof(cp_ingest_stats, bytes)},
    {"contprof_ingest_duplicates_total", "Envelopes dropped as duplicates.",
     offsetof(cp_ingest, duplicates), offsetof(cp_ingest_stats, duplicates)},
    {"contprof_ingest_sequence_gaps_total",
     "Envelopes agents numbered that ingest never read, seen across a restart as a gap in a "
     "producer's sequence (what died with the embedded broker; logged with the range).",
     offsetof(cp_ingest, seq_lost), offsetof(cp_ingest_stats, sequence_gaps)},
    {"contprof_ingest_skipped_total",
     "Messages read below the stored offset (already stored: read again after a rebalance or "
     "a restart) and not written again.",
     offsetof(cp_ingest, skipped), offsetof(cp_ingest_stats, skipped)},
    {"contprof_ingest_batches_total", "Batches written to the store (one LevelDB write each).",
     offsetof(cp_ingest, batches), offsetof(cp_ingest_stats, batches)},
};

void cp_ingest_get_stats(cp_ingest *in, cp_ingest_stats *out)
{
    pthread_mutex_lock(&in->mu);
    *out = in->st;
    out->gap = 0;
    for (uint32_t i = 0; i < in->parts.n; i++)
        out->gap += in->parts.v[i].lost;
    pthread_mutex_unlock(&in->mu);
    out->dlq_failed = atomic_load(&in->dlq_failed);
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        *(uint64_t *)((char *)out + counters[i].stat) =
            cp_counter_get((cp_counter *)((char *)in + counters[i].counter));
    for (int r = 0; r < CP_DLQ_NREASONS; r++)
        out->dlq[r] = cp_counter_get(&in->dlq_reason[r]);
    out->lag = cp_gauge_get(&in->lag);
}

uint32_t cp_ingest_get_partitions(cp_ingest *in, cp_partition_offsets *out, uint32_t max)
{
    uint32_t n = 0;
    atomic_store(&in->asked_ns, mono_ns());
    pthread_mutex_lock(&in->mu);
    for (uint32_t i = 0; i < in->parts.n; i++) {
        const part *p = &in->parts.v[i];
        if (!p->seen) continue;
        if (n < max) {
            cp_partition_offsets *o = &out[n];
            o->partition = (int32_t)i;
            o->stored = p->durable;
            o->known_from = p->known_from;
            o->lost = p->lost;
            o->nranges = p->nr;
            for (uint32_t k = 0; k < p->nr; k++) {
                const range *r = &p->ring[(p->r0 + k) % CP_INGEST_RANGES];
                o->not_stored[k].from = r->from;
                o->not_stored[k].to = r->to;
                memcpy(o->not_stored[k].why, r->why, sizeof r->why);
            }
        }
        n++;
    }
    pthread_mutex_unlock(&in->mu);
    return n;
}

uint32_t cp_ingest_get_dropped(cp_ingest *in, cp_ingest_dropped *out, uint32_t max)
{
    pthread_mutex_lock(&in->mu);
    uint32_t n = in->dropped.n;
    if (n && max) memcpy(out, in->dropped.v, (n < max ? n : max) * sizeof *out);
    pthread_mutex_unlock(&in->mu);
    return n;
}

/* ---- statistics ---------------------------------------------------------------------- */

/* One family per reported label value set (partition, service, the last error). */
static int ingest_labelled(cp_ingest *in, cp_metrics_out *o, const char *last_error)
{
    int rc = cp_metrics_out_family(o, "contprof_ingest_lost_total",
                                   "Offsets the broker dropped before ingest read them.",
                                   CP_METRIC_COUNTER);
    for (uint32_t i = 0; i < in->parts.n && !rc; i++) {
        if (!in->parts.v[i].seen) continue;
        char p[16];
        snprintf(p, sizeof p, "%u", i);
        rc = cp_metrics_out_u64(o, NULL, (cp_metric_label[]){{"partition", p}}, 1,
                                in->parts.v[i].lost);
    }
    if (!rc)
        rc = cp_metrics_out_family(o, "contprof_ingest_offset_resets_total",
                                   "Times a partition's log was found behind its stored offset "
                                   "(a broker restarted empty, a topic recreated) and read "
                                   "from its start.",
                                   CP_METRIC_COUNTER);
    for (uint32_t i = 0; i < in->parts.n && !rc; i++) {
        if (!in->parts.v[i].seen) continue;
        char p[16];
        snprintf(p, sizeof p, "%u", i);
        rc = cp_metrics_out_u64(o, NULL, (cp_metric_label[]){{"partition", p}}, 1,
                                in->parts.v[i].resets);
    }
    for (int k = 0; k < 2 && !rc; k++) {
        rc = cp_metrics_out_scalar(o, k ? "contprof_ingest_ready" : "contprof_ingest_running",
                                   k ? "1 once the consumer has its partitions."
                                     : "1 while the ingest thread runs.",
                                   CP_METRIC_GAUGE, (uint64_t)(k ? in->st.ready : in->st.running));
    }
    if (!rc)
        rc = cp_metrics_out_family(o, "contprof_ingest_last_error",
                                   "The latest ingest error (1 when there is one).",
                                   CP_METRIC_GAUGE);
    if (!rc && *last_error)
        rc = cp_metrics_out_u64(o, NULL, (cp_metric_label[]){{"error", last_error}}, 1, 1);
    for (int k = 0; k < 2 && !rc; k++) {
        rc = cp_metrics_out_family(
            o, k ? "contprof_agent_dropped_samples_total" : "contprof_agent_dropped_windows_total",
            k ? "Samples agents dropped, as they reported, by service."
              : "Windows agents dropped, as they reported, by service.",
            CP_METRIC_COUNTER);
        for (uint32_t i = 0; i < in->dropped.n && !rc; i++) {
            const cp_ingest_dropped *d = &in->dropped.v[i];
            rc = cp_metrics_out_u64(o, NULL, (cp_metric_label[]){{"service", d->service}}, 1,
                                    k ? d->samples : d->windows);
        }
    }
    return rc;
}

/* What /metrics shows of ingest besides its counters: numbers read under mu, and the label
 * sets that change. A scrape counts as asking for the partitions (asked_ns), as
 * cp_ingest_get_partitions does. */
static int ingest_collect(void *arg, cp_metrics_out *o)
{
    cp_ingest *in = arg;
    atomic_store(&in->asked_ns, mono_ns());
    pthread_mutex_lock(&in->mu);
    const cp_ingest_stats *st = &in->st;
    const struct {
        const char *name, *help;
        cp_metric_type type;
        uint64_t v;
    } scalars[] = {
        {"contprof_ingest_paused",
         "1 while ingest waits for the store after a failed write (the reason is in /healthz "
         "and the log).",
         CP_METRIC_GAUGE, (uint64_t)st->paused},
        {"contprof_ingest_store_errors_total", "Failed store writes and reopen attempts.",
         CP_METRIC_COUNTER, st->store_errors},
        {"contprof_ingest_dlq_failed_total",
         "DLQ deliveries that failed (each is retried; offsets wait).", CP_METRIC_COUNTER,
         atomic_load(&in->dlq_failed)},
        {"contprof_ingest_dlq_truncated_total",
         "Messages too large for the DLQ, sent there truncated.", CP_METRIC_COUNTER,
         st->dlq_truncated},
        {"contprof_ingest_partitions", "Partitions assigned to this consumer.", CP_METRIC_GAUGE,
         st->partitions},
        {"contprof_ingest_failed",
         "1 once ingest stopped for good (contprof_ingest_last_error and the log say why).",
         CP_METRIC_GAUGE, (uint64_t)st->failed},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0] && !rc; i++)
        rc = cp_metrics_out_scalar(o, scalars[i].name, scalars[i].help, scalars[i].type,
                                   scalars[i].v);
    char last_error[256];
    snprintf(last_error, sizeof last_error, "%s", st->last_error);
    for (char *c = last_error; *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' '; /* a Prometheus label value: one line */
    if (!rc) rc = ingest_labelled(in, o, last_error);
    pthread_mutex_unlock(&in->mu);
    return rc;
}

int cp_ingest_register_metrics(cp_ingest *in, cp_metrics *r)
{
    if (in->metrics) return CP_EINVAL;
    int rc = 0;
    for (size_t i = 0; i < sizeof counters / sizeof counters[0] && !rc; i++)
        rc = cp_metrics_counter(r, in, counters[i].name, counters[i].help, NULL, 0,
                                (cp_counter *)((char *)in + counters[i].counter));
    if (!rc)
        rc = cp_metrics_gauge_f(r, in, "contprof_ingest_windows_per_second", "Recent ingest rate.",
                                NULL, 0, 3, &in->rate);
    if (!rc)
        rc = cp_metrics_gauge(r, in, "contprof_ingest_consumer_lag",
                              "Messages behind the end of the partitions (-1 unknown).", NULL, 0,
                              &in->lag);
    for (int i = 0; i < CP_DLQ_NREASONS && !rc; i++)
        rc = cp_metrics_counter(r, in, "contprof_ingest_dlq_total",
                                "Messages sent to the dead-letter queue, by reason.",
                                (cp_metric_label[]){{"reason", reason_names[i]}}, 1,
                                &in->dlq_reason[i]);
    if (!rc) rc = cp_metrics_collector(r, in, ingest_collect, in);
    if (rc) {
        cp_metrics_remove(r, in);
        return rc;
    }
    in->metrics = r;
    return 0;
}
