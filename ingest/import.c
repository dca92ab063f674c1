/* `contprof import`: reads pprof files (raw or gzip'd), wraps each in an envelope (a Go heap
 * profile becomes a cumulative alloc envelope and an inuse envelope; an alloc profile
 * without inuse_*, as contprof's own windows are, stays a window of its own) and produces them to
 * contprof.profiles, keyed by series so a series stays on one partition. With --server it
 * waits until contprofd says each window is stored (GET /api/v1/ingest/offsets), keeping a
 * bounded number of unstored bytes in flight, so exit 0 means stored. */
#include "import.h"
#include "defaults.h"
#include "envelope.h"
#include "error.h"
#include "heapsnap.h"
#include "hmac.h"
#include "http_client.h"
#include "json.h"
#include "offsets.h"
#include "pprof.h"
#include "times.h"

#include <errno.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define IMPORT_MAX_MESSAGE 16777216 /* the producer's message.max.bytes */
/* The embedded broker's per-partition log (ingest/broker.h), for the refusal message. */
#define CP_EMBEDDED_PARTITION_BYTES (5u << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: contprof import [--server URL | --brokers LIST] [--tenant T] [--service S]\n"
            "                       [--label k=v]... [--at TIME --duration D] [--no-wait]\n"
            "                       [--timeout D] [--token T] FILE...\n"
            "  --server URL    ask contprofd (GET /api/v1/brokers) where Kafka is, and wait\n"
            "                  until it has stored every window (default " CP_DEFAULT_SERVER ")\n"
            "  --brokers LIST  Kafka bootstrap servers, host:port,...; exit 0 then means\n"
            "                  delivered to Kafka, not stored (nothing to ask)\n"
            "  --no-wait       do not wait for the store: exit 0 means delivered to Kafka\n"
            "  --timeout D     give up when nothing was stored for D (default 2m; a bare number\n"
            "                  is seconds)\n"
            "  --tenant T      tenant (default \"default\")\n"
            "  --token T       contprofd's bearer token for the tenant (or CONTPROF_TOKEN)\n"
            "  --service S     service label (default \"import\")\n"
            "  --label k=v     another label (repeatable; at most %d labels with service,\n"
            "                  values at most %d bytes: ingest's limits, checked before sending)\n"
            "  --at TIME       window start instead of the profile's time_nanos: RFC 3339,\n"
            "                  unix seconds, now, now-15m or -1h (the query API's grammar)\n"
            "  --duration D    window length (10s, 1m, ...; a bare number is seconds; at most\n"
            "                  1d) instead of duration_nanos\n\n"
            "examples:\n"
            "  contprof import --server http://127.0.0.1:7070 --service legacy *.pb.gz\n"
            "  contprof import --service api --label version=1.4 --at now-10s --duration 10s "
            "cpu.pb.gz\n",
            CP_LABELS_MAX, CP_LABEL_VALUE_MAX);
}

/* GET url + path with the shared client (model/http_client.h), at most 30 s and max bytes:
 * the body (NUL-terminated, in res, which the caller closes) or NULL with why set. */
static char *http_get(const char *url, const char *path, const char *token, size_t max,
                      cp_http_result *res, char *why, size_t whylen)
{
    cp_err err = {0};
    if (cp_http_get(url, path, token, 30000, max, res, &err)) {
        snprintf(why, whylen, "%s", err.msg);
        return NULL;
    }
    if (res->status != 200) {
        snprintf(why, whylen, "%s%s answered %d %.200s", url, path, res->status,
                 (const char *)res->body.data);
        cp_buf_close(&res->body);
        return NULL;
    }
    return (char *)res->body.data;
}

/* One envelope produced, and what became of it. */
enum { S_QUEUED, S_DELIVERED, S_STORED, S_NOT, S_UNKNOWN };
typedef struct sent {
    int file;
    cp_kind kind;
    int state;
    size_t bytes;
    int32_t partition;
    int64_t offset;
    char why[160]; /* S_NOT: why it is not stored; S_UNKNOWN: why nobody can tell */
} sent;

typedef struct imp {
    rd_kafka_t *rk;
    const char *tenant, *service;
    const char *token; /* signs each envelope (NULL = unsigned) */
    char **labels;     /* k=v */
    int nlabels;
    int64_t at, dur;
    char producer[128];         /* the envelope being sent's (window_producer) */
    uint8_t run[CP_SHA256_LEN]; /* SHA-256 of the sorted file list: the cumulative streams' run */
    char **files;
    int nfiles;
    /* flow control (wait = 1): at most budget unstored bytes in flight */
    int wait;
    const char *server;   /* contprofd, asked for the stored offsets */
    uint64_t max_message; /* served by contprofd; 0 = not known */
    uint64_t budget;
    uint64_t inflight;
    cp_buf lz4;           /* scratch for wire_bytes */
    size_t file_bytes;    /* the file being sent, as read */
    int file_gz;          /* it was gzip'd */
    double gz_factor;     /* wire bytes per gzip'd file byte, calibrated (wire_bytes) */
    uint32_t nsized;      /* messages sized so far */
    int64_t last_wake_ns; /* wait_some */
    int64_t last_progress_ns, last_poll_ns, last_bar_ns;
    int64_t last_brokers_ns; /* wait_some: when contprofd's broker list was last checked */
    double timeout_s;
    int bar;
    CP_VEC(sent) sent;
    int nstored, nnot, ndelivered, nunknown;
    const char *brokers; /* as contprofd served them (or --brokers) */
    int restarted;       /* contprofd came back with another broker: the rest is unknown */
    int64_t retention_raw_s, retention_rollup_s; /* contprofd's (0 = forever or unknown) */
    int warned_raw;                              /* past retention.raw said once */
} imp;

/* Moves r to state; its bytes leave the flight once it is stored or known not to be. */
static void settle(imp *im, sent *r, int state, const char *why)
{
    if ((state == S_STORED || state == S_NOT || state == S_UNKNOWN) &&
        (r->state == S_QUEUED || r->state == S_DELIVERED))
        im->inflight -= r->bytes;
    if (r->state == S_DELIVERED) im->ndelivered--;
    if (r->state == S_UNKNOWN) im->nunknown--; /* a late answer settles it */
    r->state = state;
    if (state == S_STORED) im->nstored++;
    if (state == S_NOT || state == S_UNKNOWN) {
        if (state == S_NOT) im->nnot++;
        if (state == S_UNKNOWN) im->nunknown++;
        snprintf(r->why, sizeof r->why, "%s", why);
    }
    if (state == S_DELIVERED) im->ndelivered++;
    im->last_progress_ns = cp_mono_ns();
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    imp *im = opaque;
    sent *r = &im->sent.v[(uintptr_t)m->_private];
    if (m->err) {
        /* "not stored" only when Kafka surely does not have it; a timeout after sending may
         * have been appended all the same */
        char why[160];
        int surely = rd_kafka_message_status(m) == RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
        snprintf(why, sizeof why, "Kafka %s: %s (%zu bytes)",
                 surely ? "did not take it" : "may or may not have taken it",
                 rd_kafka_err2str(m->err), m->len);
        settle(im, r, surely ? S_NOT : S_UNKNOWN, why);
        return;
    }
    r->partition = m->partition;
    r->offset = m->offset;
    if (im->wait) {
        settle(im, r, S_DELIVERED, NULL); /* in flight until contprofd says it is stored */
    } else {
        settle(im, r, S_STORED, NULL); /* --no-wait: delivered is all we learn */
    }
}

static void draw_bar(imp *im, int force)
{
    if (!im->bar) return;
    int64_t now = cp_mono_ns();
    if (!force && now - im->last_bar_ns < 100000000) return;
    im->last_bar_ns = now;
    /* a file is one window, or two (a Go heap profile): the files bound the total */
    int total = (int)im->sent.n > im->nfiles ? (int)im->sent.n : im->nfiles;
    int done = im->nstored + im->nnot + im->nunknown, w = 40;
    int fill = total ? done * w / total : 0;
    fprintf(stderr, "\r[%.*s%*s] %d window(s) %s, %d file(s)", fill,
            "########################################", w - fill, "", im->nstored,
            im->wait ? "stored" : "delivered", im->nfiles);
}

/* The bytes a message will take in the broker's log: the topic is lz4-compressed, and the
 * embedded broker's 5 MiB per partition count compressed message sets. Measured by
 * compressing the message alone, faster and less tightly than librdkafka's batch
 * compression (acceleration 4), so it errs on the large side; the uncompressed size when
 * that fails. */
static size_t lz4_bytes(imp *im, const cp_buf *msg)
{
    int bound = LZ4_compressBound((int)msg->len);
    if (bound <= 0 || msg->len > (size_t)LZ4_MAX_INPUT_SIZE) return msg->len;
    im->lz4.len = 0;
    if (cp_buf_reserve(&im->lz4, (size_t)bound)) return msg->len;
    int n =
        LZ4_compress_fast((const char *)msg->data, (char *)im->lz4.data, (int)msg->len, bound, 4);
    return n > 0 ? (size_t)n + 128 : msg->len;
}

/* The flight's estimate of a message's wire bytes, without compressing every message twice
 * (that cost a fifth of the sender's CPU, and the sender bounds the import's rate):
 * - a gzip'd pprof inside (raw over CP_RAW_PPROF_MAX): lz4 cannot shrink it; its size plus
 *   lz4's worst-case growth;
 * - a raw pprof from a gzip'd file: gz_factor times the file's size, capped by that worst
 *   case. gz_factor starts at 2 (realistic CPU windows: lz4 1.6 times gzip) and is
 *   calibrated on the first message and every 16th after it: measured (lz4_bytes), it
 *   becomes at least 1.25 times the ratio seen, and that message counts its measured size
 *   if larger. Safety: the budget (3 MiB) leaves the broker's 5 MiB per partition 1.67
 *   times the estimate; the flight's real bytes pass 5 MiB only if a whole flight of
 *   messages compresses more than twice worse (against gzip) than the calibrated ones;
 * - a raw file: no free estimate; measured. */
static size_t wire_bytes(imp *im, const cp_buf *msg, int pprof_gz)
{
    size_t worst = msg->len + msg->len / 255 + 16 + 128;
    if (pprof_gz) return worst;
    if (!im->file_gz || !im->file_bytes) return lz4_bytes(im, msg);
    if (im->gz_factor < 2.0) im->gz_factor = 2.0;
    size_t est = (size_t)(im->gz_factor * (double)im->file_bytes) + 128;
    if (im->nsized++ % 16 == 0) {
        size_t real = lz4_bytes(im, msg);
        double f = 1.25 * (double)real / (double)im->file_bytes;
        if (f > im->gz_factor) im->gz_factor = f;
        if (real > est) est = real;
    }
    return est < worst ? est : worst;
}

/* Settles each delivered window of partition po that lies below its stored offset: stored,
 * not stored (in one of its not_stored ranges: refused to the DLQ or dropped by the
 * broker), or unknown (below known_from: contprofd no longer knows). */
static void settle_partition(imp *im, const cp_partition_offsets *po)
{
    int32_t part = po->partition;
    for (uint32_t i = 0; i < im->sent.n; i++) {
        sent *r = &im->sent.v[i];
        if (r->state != S_DELIVERED || r->partition != part || r->offset >= po->stored) continue;
        char w[160] = "";
        int unknown = r->offset < po->known_from;
        if (unknown)
            snprintf(w, sizeof w,
                     "unknown: contprofd no longer knows whether offset %lld of "
                     "partition %d was stored",
                     (long long)r->offset, part);
        for (uint32_t k = 0; k < po->nranges && !w[0]; k++) {
            const cp_offsets_range *q = &po->not_stored[k];
            if (r->offset < q->from || r->offset >= q->to) continue;
            if (!strncmp(q->why, "dlq:", 4))
                snprintf(w, sizeof w,
                         "refused by contprofd (%s; the message is in the "
                         "dead-letter topic, its log says why)",
                         q->why + 4);
            else
                snprintf(w, sizeof w,
                         "dropped by the broker before contprofd read it "
                         "(partition %d offset %lld)",
                         part, (long long)r->offset);
        }
        settle(im, r, unknown ? S_UNKNOWN : w[0] ? S_NOT : S_STORED, w);
    }
}

/* Asks contprofd which offsets are stored and settles what it can. 0; -1 with why when it
 * cannot be asked (down, restarting, an error answer, an answer that does not read); -2
 * with why when its ingest says it is not running. */
static int poll_offsets(imp *im, char *why, size_t whylen)
{
    cp_http_result res;
    char *body =
        http_get(im->server, "/api/v1/ingest/offsets", im->token, 1 << 20, &res, why, whylen);
    if (!body) return -1;
    im->last_poll_ns = cp_mono_ns();
    cp_json *j = NULL;
    cp_err err = {0};
    int rc = cp_json_parse(body, res.body.len, &j, &err);
    cp_buf_close(&res.body);
    if (rc) {
        snprintf(why, whylen, "contprofd's /api/v1/ingest/offsets: %s", err.msg);
        return -1;
    }
    const cp_json *running = cp_json_get(j, "running");
    if (running && running->type == CP_JSON_BOOL && !running->num) {
        snprintf(why, whylen,
                 "contprofd's ingest is not running (its log and /metrics say why); what is "
                 "sent cannot be stored");
        cp_json_free(j);
        return -2;
    }
    if (!im->budget) {
        im->max_message = (uint64_t)cp_json_int(cp_json_get(j, "max_message_bytes"), 0);
        im->budget = (uint64_t)cp_json_int(cp_json_get(j, "max_in_flight_bytes"), 0);
        im->retention_raw_s = cp_json_int(cp_json_get(j, "retention_raw_s"), 0);
        im->retention_rollup_s = cp_json_int(cp_json_get(j, "retention_rollup_s"), 0);
        if (!im->budget) im->budget = 3u << 20;
    }
    const cp_json *parts = cp_json_get(j, "partitions");
    for (uint32_t i = 0; parts && parts->type == CP_JSON_ARRAY && i < parts->n; i++) {
        cp_partition_offsets po;
        if (cp_offsets_read(parts->items[i], &po, &err)) {
            snprintf(why, whylen, "contprofd's /api/v1/ingest/offsets: %s", err.msg);
            cp_json_free(j);
            return -1;
        }
        settle_partition(im, &po);
    }
    cp_json_free(j);
    draw_bar(im, 0);
    return 0;
}

#define RECONNECT_NS (15 * (int64_t)1000000000) /* how long a silent contprofd is awaited */

/* contprofd could not be asked (why). Asks it for its brokers every 200 ms for at most
 * RECONNECT_NS: the same list back (a restarted contprofd on a Kafka that outlived it, whose
 * offsets still answer for what was delivered) returns 0 and waiting goes on. Otherwise the
 * windows delivered and unconfirmed become unknown (a SIGKILLed contprofd may have stored
 * some before it died, and its embedded broker's unstored messages died with it), the
 * producer's queue is purged (what never left is surely not stored; what was in flight is
 * unknown: dr_cb), and -1 with why. */
static int contprofd_gone(imp *im, char *why, size_t whylen)
{
    char list[4096] = "", first[400];
    snprintf(first, sizeof first, "%s", why);
    int answered = 0, listed = 0;
    for (int64_t end = cp_mono_ns() + RECONNECT_NS; cp_mono_ns() < end && !listed;) {
        rd_kafka_poll(im->rk, 200);
        int rc = cp_http_get_brokers(im->server, im->token, list, sizeof list, 2000, NULL);
        answered |= rc == 0 || rc == CP_ENOTFOUND; /* "": its broker is starting */
        listed = rc == 0;
    }
    if (listed && im->brokers && !strcmp(list, im->brokers)) return 0; /* --timeout holds */
    im->restarted = answered;
    const char *w = answered ? "unknown: contprofd restarted before confirming it"
                             : "unknown: contprofd stopped answering before confirming it";
    for (uint32_t i = 0; i < im->sent.n; i++)
        if (im->sent.v[i].state == S_DELIVERED) settle(im, &im->sent.v[i], S_UNKNOWN, w);
    rd_kafka_purge(im->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_poll(im->rk, 100);
    snprintf(why, whylen, "%s (%.200s)",
             answered ? "contprofd restarted with another broker, which does not hold what "
                        "was delivered to the old one"
                      : "contprofd stopped answering",
             first);
    return -1;
}

/* Serves delivery reports and, when something delivered waits for the store, asks
 * contprofd (every 5 ms at most). -1 with why when contprofd cannot be asked (after
 * contprofd_gone) or nothing moved for timeout_s. */
static int wait_some(imp *im, char *why, size_t whylen)
{
    /* Nothing delivered yet: a metadata request wakes the broker threads. librdkafka 2.0's
     * idempotent producer has its producer id within milliseconds, but a partition takes it
     * only at its broker thread's next wake-up, up to 1 s later (a flush does not wake it);
     * a sender waiting for its first windows would sit out that second. Every 50 ms. */
    if (!im->ndelivered && !im->nstored && !im->nnot && im->sent.n &&
        cp_mono_ns() - im->last_wake_ns >= 50000000) {
        const struct rd_kafka_metadata *md = NULL;
        im->last_wake_ns = cp_mono_ns();
        if (!rd_kafka_metadata(im->rk, 0, NULL, &md, 1000)) rd_kafka_metadata_destroy(md);
    }
    rd_kafka_poll(im->rk, 2);
    if (im->wait && im->ndelivered && cp_mono_ns() - im->last_poll_ns >= 5000000) {
        int rc = poll_offsets(im, why, whylen);
        if (rc == -2 || (rc == -1 && contprofd_gone(im, why, whylen))) return -1;
    }
    /* A contprofd restarted between two polls answers them, with offsets of its new
     * embedded broker that never reach ours: its broker list says so. Asked once a second
     * while nothing moves. */
    if (im->wait && cp_mono_ns() - im->last_progress_ns >= 1000000000 &&
        cp_mono_ns() - im->last_brokers_ns >= 1000000000) {
        char list[4096];
        im->last_brokers_ns = cp_mono_ns();
        int rc = cp_http_get_brokers(im->server, im->token, list, sizeof list, 2000, NULL);
        if (rc || !im->brokers || strcmp(list, im->brokers)) {
            snprintf(why, whylen, "%s",
                     rc ? "contprofd does not serve its brokers" : "its brokers changed");
            if (contprofd_gone(im, why, whylen)) return -1;
        }
    }
    if ((double)(cp_mono_ns() - im->last_progress_ns) / 1e9 > im->timeout_s) {
        snprintf(why, whylen, "nothing was %s for %.0f s", im->wait ? "stored" : "delivered",
                 im->timeout_s);
        return -1;
    }
    return 0;
}

/* Between files: once half the budget is in flight, asks contprofd (every 5 ms at most)
 * what is stored, so that the budget frees while the sender reads and encodes the next
 * files instead of after it has run out. A failure is left to wait_some, which reports it
 * if the sender comes to wait. */
static void poll_ahead(imp *im)
{
    char why[400];
    if (im->wait && im->ndelivered && im->inflight > im->budget / 2 &&
        cp_mono_ns() - im->last_poll_ns >= 5000000)
        (void)poll_offsets(im, why, sizeof why);
}

static int has_type(const cp_profile *p, const char *t)
{
    return cp_profile_find_type(p, t) >= 0;
}

/* 1, with the cause printed, if ingest would refuse the envelope e (encoded as enc): the
 * consumer's own checks (cp_envelope_validate, then decoding with its default size limit),
 * run before sending, so that nothing ingest sends to the DLQ is reported delivered. */
static int refused(const char *file, const cp_envelope *e, const cp_buf *enc)
{
    cp_envelope v = *e, back = {0};
    cp_err err = {0};
    v.format_major = CP_ENVELOPE_MAJOR;
    v.format_minor = CP_ENVELOPE_MINOR;
    int rc = cp_envelope_validate(&v, CP_INGEST_MAX_PPROF, &err);
    if (!rc) rc = cp_envelope_decode_view(enc->data, enc->len, CP_INGEST_MAX_PPROF, &back, &err);
    cp_envelope_close(&back);
    if (rc)
        fprintf(stderr, "contprof import: %s: not sent, ingest would refuse it: %s\n", file,
                err.msg);
    return rc != 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether file starts like a V8 heap snapshot (0 when unreadable: the pprof path says why). */
static int is_heap_snapshot(const char *file)
{
    char head[64];
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, head, sizeof(head));
    close(fd);
    return n > 0 && cp_heapsnap_looks_like(head, (size_t)n);
}

typedef struct timed_file {
    int64_t t; /* the profile's time_nanos; INT64_MAX when unreadable (refused later) */
    int i;     /* its place on the command line: the order among equal times */
    char *name;
} timed_file;

static int cmp_timed(const void *a, const void *b)
{
    const timed_file *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->i - y->i;
}

/* Orders files by their profiles' own time, the command line's order among equal ones: a
 * cumulative series (heap snapshots) is subtracted in the order it was taken, whatever
 * the order a shell glob gives ("heap.10" before "heap.9", issue 36). 0, or 1 out of
 * memory (said). Reads each file once more than the import does, its time field only. */
static int order_by_time(char **files, int n)
{
    if (n < 2) return 0;
    timed_file *tf = calloc((size_t)n, sizeof *tf);
    if (!tf) {
        fprintf(stderr, "contprof import: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        tf[i] = (timed_file){INT64_MAX, i, files[i]};
        cp_buf b = {0};
        int64_t t;
        /* the time field alone (the tables are not decoded): cheap for thousands of files */
        struct stat sb;
        if (is_heap_snapshot(files[i]) && stat(files[i], &sb) == 0) /* its time: written */
            tf[i].t = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        else if (!cp_read_file(files[i], &b, NULL) && !cp_pprof_peek_time(b.data, b.len, &t))
            tf[i].t = t;
        cp_buf_close(&b);
    }
    qsort(tf, (size_t)n, sizeof *tf, cmp_timed);
    for (int i = 0; i < n; i++)
        files[i] = tf[i].name;
    free(tf);
    return 0;
}

/* The run's identity (window_producer): SHA-256 of the file names, sorted, so the same
 * command names the same run in any order. 0, or 1 (said) out of memory. */
static int run_id(char **files, int n, uint8_t out[CP_SHA256_LEN])
{
    char **sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    cp_buf b = {0};
    int rc = !sorted;
    if (!rc) {
        memcpy(sorted, files, (size_t)n * sizeof *sorted);
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
        for (int i = 0; i < n && !rc; i++)
            rc = cp_buf_printf(&b, "%s\n", sorted[i]) != 0;
    }
    if (!rc) cp_sha256(b.data, b.len, out);
    if (rc) fprintf(stderr, "contprof import: out of memory\n");
    cp_buf_close(&b);
    free(sorted);
    return rc;
}

/* Names the window e (its series key in key) by what it is, so that sending it again is a
 * duplicate the store drops (store/README.md "Duplicates": per producer and partition;
 * one series keys one partition). im->producer becomes "import:S#W" with sequence 1:
 * S, 16 hex digits of SHA-256 over the series key (tenant, kind, labels) and the run (the
 * sorted list of the files named), names the series' cumulative stream (the store keeps
 * cumulative inputs' differences per series and the producer's part before '#'): the
 * cumulative profiles of one import are one process's snapshots, each one's difference
 * from the one before counts, while another import's count in full (it may be another
 * process), and a retry of the same command is the same stream; W, 32 hex digits of
 * SHA-256 over the series key, the
 * window's start, duration and cumulative flag and the pprof as encoded, names the window.
 * Decision: one producer per window rather than a per-run producer and sequence, since a
 * retry is another run, and the same file must map to the same key in any order and any
 * run; the store keeps one small record per window (64 KiB of them cached, store.c). The
 * same profile under other labels or at another --at is another window. 0 or CP_ENOMEM. */
static int window_producer(imp *im, const cp_envelope *e, const cp_buf *key)
{
    uint8_t hs[CP_SHA256_LEN], hw[CP_SHA256_LEN];
    cp_buf b = {0};
    if (cp_buf_append(&b, key->data, key->len) || cp_buf_append(&b, im->run, sizeof im->run)) {
        cp_buf_close(&b);
        return CP_ENOMEM;
    }
    cp_sha256(b.data, b.len, hs);
    b.len = 0;
    if (cp_buf_printf(&b, "%.*s\n%lld %lld %d\n", (int)key->len, (const char *)key->data,
                      (long long)e->window_start_ns, (long long)e->window_duration_ns,
                      e->cumulative) ||
        cp_buf_append(&b, e->pprof, e->pprof_len)) {
        cp_buf_close(&b);
        return CP_ENOMEM;
    }
    cp_sha256(b.data, b.len, hw);
    cp_buf_close(&b);
    int n = snprintf(im->producer, sizeof im->producer, "import:");
    for (int i = 0; i < 8; i++)
        n += snprintf(im->producer + n, sizeof im->producer - (size_t)n, "%02x", hs[i]);
    n += snprintf(im->producer + n, sizeof im->producer - (size_t)n, "#");
    for (int i = 0; i < 16; i++)
        n += snprintf(im->producer + n, sizeof im->producer - (size_t)n, "%02x", hw[i]);
    return 0;
}

/* Produces one envelope of kind with profile p (encoded raw; Kafka compresses). */
static int send_one(imp *im, int fi, cp_kind kind, int cumulative, const cp_profile *p)
{
    const char *file = im->files[fi];
    cp_envelope e = {0};
    cp_buf pp = {0}, enc = {0}, key = {0};
    int rc = 0;
    e.tenant = (char *)im->tenant;
    e.kind = kind;
    e.window_start_ns = im->at ? im->at : p->time_nanos;
    e.window_duration_ns = im->dur ? im->dur : p->duration_nanos;
    if (!e.window_start_ns) {
        fprintf(stderr, "contprof import: %s: the profile has no time_nanos; give --at\n", file);
        return 1;
    }
    if (e.window_duration_ns <= 0) e.window_duration_ns = 10000000000LL;
    e.cumulative = cumulative;
    /* contprofd's retention (known when waiting): a window it would delete is not sent, one
     * past raw retention is kept only in the rollups (said once) */
    int64_t age_s = (cp_now_ns() - e.window_start_ns) / 1000000000LL;
    if (im->retention_rollup_s > 0 && age_s > im->retention_rollup_s) {
        fprintf(stderr,
                "contprof import: %s: not sent: the window starts %.1f days ago, past "
                "contprofd's retention.rollup (%.1f days): retention would delete it\n",
                file, (double)age_s / 86400, (double)im->retention_rollup_s / 86400);
        return 1;
    }
    if (im->retention_raw_s > 0 && age_s > im->retention_raw_s && !im->warned_raw++) {
        char until[64] = "for ever (retention.rollup = 0)";
        if (im->retention_rollup_s > 0)
            snprintf(until, sizeof until, "until retention.rollup (%.1f days)",
                     (double)im->retention_rollup_s / 86400);
        fprintf(stderr,
                "contprof import: %s: warning: the window starts %.1f days ago, past contprofd's "
                "retention.raw (%.1f days): stored, but kept only in the rollups (1-minute "
                "resolution and coarser) %s\n",
                file, (double)age_s / 86400, (double)im->retention_raw_s / 86400, until);
    }
    if (cp_labels_set(&e.labels, "service", im->service)) rc = 1;
    for (int i = 0; i < im->nlabels && !rc; i++) {
        const char *eq = strchr(im->labels[i], '=');
        char name[CP_LABEL_NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(eq - im->labels[i]), im->labels[i]);
        rc = cp_labels_set(&e.labels, name, eq + 1) != 0;
    }
    /* raw up to CP_RAW_PPROF_MAX (the topic's lz4 compresses it), gzip'd beyond */
    if (!rc) rc = cp_pprof_encode(p, 0, &pp) != 0;
    int gzipd = 0; /* the envelope carries the pprof gzip'd */
    if (!rc && pp.len > CP_RAW_PPROF_MAX) {
        gzipd = 1;
        pp.len = 0;
        rc = cp_pprof_encode(p, 1, &pp) != 0;
    }
    e.pprof = pp.data;
    e.pprof_len = pp.len;
    if (!rc) rc = cp_envelope_series_key(&e, &key) != 0 || window_producer(im, &e, &key) != 0;
    e.producer_id = im->producer;
    e.sequence = 1;
    if (!rc) rc = cp_envelope_encode(&e, &enc) != 0;
    if (!rc && refused(file, &e, &enc)) {
        rc = 1;
        goto done;
    }
    if (!rc && im->token) rc = cp_envelope_sign(&enc, im->token) != 0;
    if (rc) {
        fprintf(stderr, "contprof import: %s: out of memory\n", file);
    } else if (im->max_message && enc.len > im->max_message) {
        fprintf(stderr,
                "contprof import: %s: refused: its %s envelope is %.1f MiB, over the embedded "
                "broker's limit of %.1f MiB per message (it keeps %.0f MiB per partition); "
                "send it through a Kafka cluster (README: the embedded broker)\n",
                file, cp_kind_name(kind), (double)enc.len / (1 << 20),
                (double)im->max_message / (1 << 20),
                (double)CP_EMBEDDED_PARTITION_BYTES / (1 << 20));
        rc = 1;
    } else {
        char why[400];
        /* flow control: at most budget unstored bytes in flight (one message alone always) */
        size_t wire = im->wait ? wire_bytes(im, &enc, gzipd) : enc.len;
        while (im->wait && im->inflight && im->inflight + wire > im->budget)
            if (wait_some(im, why, sizeof why)) {
                fprintf(stderr, "contprof import: %s: waiting for the store: %s\n", file, why);
                rc = 2; /* stop sending: the rest cannot be confirmed either */
                goto done;
            }
        sent r = {.file = fi, .kind = kind, .state = S_QUEUED, .bytes = wire, .offset = -1};
        if (cp_vec_push(&im->sent, r)) {
            rc = 1;
        } else {
            uintptr_t idx = im->sent.n - 1;
            im->inflight += wire;
            for (int tries = 0;; tries++) {
                rd_kafka_resp_err_t ke = rd_kafka_producev(
                    im->rk, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES),
                    RD_KAFKA_V_VALUE(enc.data, enc.len), RD_KAFKA_V_KEY(key.data, key.len),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE((void *)idx),
                    RD_KAFKA_V_END);
                if (!ke) break;
                if (ke != RD_KAFKA_RESP_ERR__QUEUE_FULL || tries > 600) {
                    if (ke == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE)
                        snprintf(why, sizeof why,
                                 "refused: its %s envelope of %zu bytes is over the producer's "
                                 "message.max.bytes (%d)",
                                 cp_kind_name(kind), enc.len, IMPORT_MAX_MESSAGE);
                    else
                        snprintf(why, sizeof why, "%s", rd_kafka_err2str(ke));
                    fprintf(stderr, "contprof import: %s: %s\n", file, why);
                    im->sent.n--;
                    im->inflight -= wire;
                    rc = 1;
                    break;
                }
                rd_kafka_poll(im->rk, 100);
            }
        }
    }
done:
    cp_labels_close(&e.labels);
    cp_buf_close(&pp);
    cp_buf_close(&enc);
    cp_buf_close(&key);
    return rc;
}

/* A V8 heap snapshot: one window of kind heap at the file's modification time. */
static int import_heap_snapshot(imp *im, int fi)
{
    const char *file = im->files[fi];
    cp_heapsnap_limits lim;
    cp_heapsnap_limits_default(&lim);
    lim.limit_name = "contprof import's heap snapshot limit";
    cp_profile *p = cp_profile_create();
    cp_heapsnap_stats st;
    cp_err err = {0};
    int rc = !p ? (cp_err_set(&err, CP_ENOMEM, "out of memory"), 1)
                : cp_heapsnap_read_file(file, &lim, p, &st, &err) != 0;
    if (rc) {
        fprintf(stderr, "contprof import: %s: %s\n", file, err.msg);
    } else {
        im->file_bytes = 0;
        im->file_gz = 0;
        p->duration_nanos = 1000000000; /* an instant: its window is a second at its time */
        rc = send_one(im, fi, CP_KIND_HEAP, 0, p);
    }
    cp_profile_destroy(p);
    return rc;
}

static int import_file(imp *im, int fi)
{
    const char *file = im->files[fi];
    if (is_heap_snapshot(file)) return import_heap_snapshot(im, fi);
    cp_buf b = {0};
    cp_err rerr = {0};
    if (cp_read_file(file, &b, &rerr)) {
        fprintf(stderr, "contprof import: %s\n", rerr.msg);
        return 1;
    }
    cp_profile *p = NULL;
    cp_err err = {0};
    int rc = cp_pprof_decode(b.data, b.len, NULL, &p, &err);
    im->file_bytes = b.len;
    im->file_gz = b.len >= 2 && b.data[0] == 0x1f && b.data[1] == 0x8b;
    cp_buf_close(&b);
    if (rc) {
        fprintf(stderr, "contprof import: %s: %s\n", file, err.msg);
        return 1;
    }
    int alloc = has_type(p, "alloc_objects") && has_type(p, "alloc_space");
    int inuse = has_type(p, "inuse_objects") && has_type(p, "inuse_space");
    if (alloc || inuse) {
        /* A heap profile that also carries inuse_* (Go's) counts allocations since its
         * process started: cumulative, the store keeps the difference between successive
         * ones. Without inuse_* (contprof's own alloc windows, any windowed profile) the
         * counts are the window's own. */
        int cumulative = inuse;
        if (alloc) {
            cp_profile *a = cp_profile_clone(p);
            const char *t[2] = {"alloc_objects", "alloc_space"};
            rc = !a || cp_profile_select_types(a, t, 2, &err)
                     ? 1
                     : send_one(im, fi, CP_KIND_ALLOC, cumulative, a);
            cp_profile_destroy(a);
        }
        if (inuse && !rc) {
            cp_profile *u = cp_profile_clone(p);
            const char *t[2] = {"inuse_objects", "inuse_space"};
            rc = !u || cp_profile_select_types(u, t, 2, &err)
                     ? 1
                     : send_one(im, fi, CP_KIND_INUSE, 0, u);
            cp_profile_destroy(u);
        }
    } else if (p->sample_types.n) {
        /* CPU and anything else sampled over time (samples/count + cpu/nanoseconds, ...) */
        rc = send_one(im, fi, CP_KIND_CPU, 0, p);
    } else {
        fprintf(stderr, "contprof import: %s: the profile has no sample types\n", file);
        rc = 1;
    }
    cp_profile_destroy(p);
    return rc;
}

/* Ingest's limits on labels, checked before anything is sent: distinct names (service
 * and every --label; a repeated name keeps its last value) at most CP_LABELS_MAX, the
 * service's value at most CP_LABEL_VALUE_MAX bytes. 0, or 2 with the cause printed. */
static int check_labels(const imp *im)
{
    cp_labels l = {0};
    int rc = cp_labels_set(&l, "service", im->service);
    for (int i = 0; i < im->nlabels && !rc; i++) {
        const char *eq = strchr(im->labels[i], '=');
        char name[CP_LABEL_NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(eq - im->labels[i]), im->labels[i]);
        rc = cp_labels_set(&l, name, eq + 1);
    }
    uint32_t n = l.p.n;
    cp_labels_close(&l);
    if (rc) {
        fprintf(stderr, "contprof import: out of memory\n");
        return 1;
    }
    if (n > CP_LABELS_MAX) {
        fprintf(stderr,
                "contprof import: %u distinct labels (service and --label): ingest accepts at "
                "most %d labels per series\n",
                n, CP_LABELS_MAX);
        return 2;
    }
    int bad = cp_label_value_check(im->service);
    if (bad < 0) {
        fprintf(stderr,
                "contprof import: --service: the value is %zu bytes, over the limit of %d bytes "
                "per label value\n",
                strlen(im->service), CP_LABEL_VALUE_MAX);
        return 2;
    }
    if (bad) {
        fprintf(stderr, "contprof import: --service: control character 0x%02x at byte %d\n",
                (unsigned char)im->service[bad - 1], bad - 1);
        return 2;
    }
    return 0;
}

/* What the command line asks beyond the importer's own state. */
typedef struct import_args {
    const char *server, *brokers, *token;
    int no_wait;
} import_args;

/* A --label's NAME=VALUE checked (the name's form, not service, the value's length and
 * bytes): 0, or 2 with the cause printed. */
static int check_label_arg(const char *v)
{
    const char *eq = strchr(v, '=');
    char name[CP_LABEL_NAME_MAX + 2] = {0};
    if (eq && (size_t)(eq - v) <= CP_LABEL_NAME_MAX) memcpy(name, v, (size_t)(eq - v));
    if (!eq || !cp_label_name_valid(name)) {
        fprintf(stderr,
                "contprof import: --label %s: expected name=value with a name "
                "like [A-Za-z_][A-Za-z0-9_]*\n",
                v);
        return 2;
    }
    if (!strcmp(name, "service")) {
        fprintf(stderr, "contprof import: --label service=...: give --service instead "
                        "(one would silently override the other)\n");
        return 2;
    }
    int bad = cp_label_value_check(eq + 1);
    if (bad < 0) {
        fprintf(stderr,
                "contprof import: --label %s: the value is %zu bytes, over the limit of "
                "%d bytes per label value\n",
                name, strlen(eq + 1), CP_LABEL_VALUE_MAX);
        return 2;
    }
    if (bad) {
        fprintf(stderr,
                "contprof import: --label %s: control character 0x%02x at byte %d of "
                "the value\n",
                name, (unsigned char)eq[bad], bad - 1);
        return 2;
    }
    return 0;
}

/* Reads argv into *im (its files and labels arrays allocated by the caller, argc + 1
 * long) and *a; returns -1 to go on, else the status to exit with (the cause printed). */
static int parse_args(int argc, char **argv, imp *im, import_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--no-wait")) {
            a->no_wait = 1;
        } else if (o[0] == '-' && o[1] == '-' && !v) {
            fprintf(stderr, "contprof import: %s needs a value\n", o);
            return 2;
        } else if (!strcmp(o, "--server"))
            a->server = argv[++i];
        else if (!strcmp(o, "--brokers"))
            a->brokers = argv[++i];
        else if (!strcmp(o, "--tenant"))
            im->tenant = argv[++i];
        else if (!strcmp(o, "--token"))
            a->token = argv[++i];
        else if (!strcmp(o, "--timeout")) {
            cp_err err = {0};
            int64_t ns = 0;
            if (cp_parse_duration(argv[++i], 0, &ns, &err)) {
                fprintf(stderr, "contprof import: --timeout: %s\n", err.msg);
                return 2;
            }
            im->timeout_s = (double)ns / 1e9;
        } else if (!strcmp(o, "--service"))
            im->service = argv[++i];
        else if (!strcmp(o, "--label")) {
            if (check_label_arg(v)) return 2;
            im->labels[im->nlabels++] = argv[++i];
        } else if (!strcmp(o, "--at") || !strcmp(o, "--duration")) {
            cp_err err = {0};
            if (o[2] == 'a' ? cp_parse_time(argv[++i], cp_now_ns(), &im->at, &err)
                            : cp_parse_duration(argv[++i], 0, &im->dur, &err)) {
                fprintf(stderr, "contprof import: %s: %s\n", o, err.msg);
                return 2;
            }
        } else if (o[0] == '-' && o[1]) {
            fprintf(stderr, "contprof import: unknown option %s\n", o);
            usage(stderr);
            return 2;
        } else {
            im->files[im->nfiles++] = argv[i];
        }
    }
    if (!im->nfiles) {
        usage(stderr);
        return 2;
    }
    int rc = check_labels(im);
    if (rc) return rc;
    if (a->server && a->brokers) {
        fprintf(stderr, "contprof import: give --server or --brokers, not both\n");
        return 2;
    }
    return -1;
}

/* Without --brokers: contprofd's brokers, asked of it (*fetched, freed by the caller),
 * and the import waits for the store unless --no-wait. 0 or 1 (reported). */
static int resolve_brokers(imp *im, const import_args *a, char **fetched)
{
    im->token = a->token && *a->token ? a->token : NULL;
    im->brokers = a->brokers;
    if (a->brokers) return 0;
    const char *srv = a->server ? a->server : CP_DEFAULT_SERVER;
    char list[4096];
    cp_err err = {0};
    int brc = cp_http_get_brokers(srv, im->token, list, sizeof list, 30000, &err);
    /* a contprofd that is starting answers before its broker is up: "" for a while */
    for (int t = 0; brc == CP_ENOTFOUND && t < 100; t++) {
        usleep(100000);
        brc = cp_http_get_brokers(srv, im->token, list, sizeof list, 30000, &err);
    }
    if (brc || !(*fetched = strdup(list))) {
        fprintf(stderr, "contprof import: %s\n", brc ? err.msg : "out of memory");
        return 1;
    }
    im->brokers = *fetched;
    im->server = srv;
    im->wait = !a->no_wait;
    return 0;
}

/* The idempotent producer to im->brokers, its delivery reports to dr_cb. 0 or 1. */
static int producer_create(imp *im)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (rd_kafka_conf_set(c, "bootstrap.servers", im->brokers, es, sizeof es) ||
        rd_kafka_conf_set(c, "enable.idempotence", "true", es, sizeof es) ||
        rd_kafka_conf_set(c, "compression.type", "lz4", es, sizeof es) ||
        rd_kafka_conf_set(c, "message.max.bytes", "16777216", es, sizeof es) ||
        rd_kafka_conf_set(c, "linger.ms", "2", es, sizeof es) ||
        rd_kafka_conf_set(c, "message.timeout.ms", "60000", es, sizeof es)) {
        fprintf(stderr, "contprof import: kafka: %s\n", es);
        rd_kafka_conf_destroy(c);
        return 1;
    }
    rd_kafka_conf_set_dr_msg_cb(c, dr_cb);
    rd_kafka_conf_set_opaque(c, im);
    im->rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es);
    if (!im->rk) {
        fprintf(stderr, "contprof import: kafka: %s\n", es);
        rd_kafka_conf_destroy(c);
        return 1;
    }
    return 0;
}

/* Sends every file in time order, then waits until everything produced is stored,
 * refused or given up. *bad = files refused; *stopped = the first file not sent, or -1. */
static void send_files(imp *im, int *bad, int *stopped)
{
    char why[400];
    *bad = 0;
    *stopped = -1;
    for (int i = 0; i < im->nfiles && *stopped < 0; i++) {
        int r = import_file(im, i);
        *bad += r == 1; /* 2: sending stopped, reported below */
        if (r == 2) *stopped = i;
        rd_kafka_poll(im->rk, 0);
        poll_ahead(im);
        draw_bar(im, 0);
    }
    while (*stopped < 0 && im->nstored + im->nnot + im->nunknown < (int)im->sent.n)
        if (wait_some(im, why, sizeof why)) {
            fprintf(stderr, "contprof import: waiting for the store: %s\n", why);
            break;
        }
    if (!im->restarted) rd_kafka_flush(im->rk, 10000);
    /* what is still queued never left: surely not stored; in flight: unknown (dr_cb) */
    rd_kafka_purge(im->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_poll(im->rk, 100);
    draw_bar(im, 1);
    if (im->bar) fputc('\n', stderr);
}

/* What was stored, not stored and unknown, per window and in sum; the exit status. */
static int report(imp *im, int bad, int stopped)
{
    /* "not stored" only of windows known not to be; the rest that is not confirmed stored is
     * "unknown" (contprofd died, restarted, forgot, or did not answer in time) */
    int listed = 0;
    for (uint32_t k = 0; k < im->sent.n; k++) {
        sent *r = &im->sent.v[k];
        if (r->state == S_STORED) continue;
        if (r->state == S_DELIVERED) {
            settle(im, r, S_UNKNOWN, "unknown: delivered, but contprofd did not confirm it");
        } else if (r->state == S_QUEUED) {
            settle(im, r, S_UNKNOWN, "unknown: never confirmed delivered to Kafka");
        }
        if (listed++ < 20)
            fprintf(stderr, "contprof import: %s (%s): %s%s\n", im->files[r->file],
                    cp_kind_name(r->kind), r->state == S_NOT ? "not stored: " : "", r->why);
    }
    if (listed > 20)
        fprintf(stderr, "contprof import: ... and %d more not stored or unknown\n", listed - 20);
    if (stopped >= 0)
        fprintf(stderr, "contprof import: stopped: %d file(s) from %s on were not sent\n",
                im->nfiles - stopped, im->files[stopped]);
    if (im->wait)
        fprintf(stderr, "contprof import: %d of %u window(s) from %d file(s) stored%s\n",
                im->nstored, im->sent.n, im->nfiles,
                bad ? "; some files were refused (see above)" : "");
    else
        fprintf(stderr,
                "contprof import: %d of %u window(s) from %d file(s) delivered to Kafka at %s "
                "(not waiting for the store)%s\n",
                im->nstored, im->sent.n, im->nfiles, im->brokers,
                bad ? "; some files were refused (see above)" : "");
    if (im->wait && (im->nnot || im->nunknown))
        fprintf(stderr, "contprof import: %d window(s) not stored, %d unknown\n", im->nnot,
                im->nunknown);
    if (im->wait && (im->nunknown || im->nnot || stopped >= 0))
        fprintf(stderr, "contprof import: to store what is missing, run the same command again: a "
                        "window already stored is dropped by contprofd as a duplicate (import is "
                        "idempotent per file content, labels and --at/--duration)\n");
    return bad || stopped >= 0 || im->nstored < (int)im->sent.n ? 1 : 0;
}

int cp_cmd_import(int argc, char **argv)
{
    imp im = {0};
    import_args a = {.token = getenv("CONTPROF_TOKEN")};
    im.tenant = CP_DEFAULT_TENANT;
    im.service = "import";
    im.files = calloc((size_t)argc + 1, sizeof *im.files);
    im.labels = calloc((size_t)argc + 1, sizeof *im.labels);
    im.timeout_s = (double)CP_DEFAULT_CLIENT_TIMEOUT_NS / 1e9;
    char *fetched = NULL;
    int rc = 1, bad, stopped;
    if (!im.files || !im.labels) goto out;
    if ((rc = parse_args(argc, argv, &im, &a)) >= 0) goto out;
    rc = 1;
    if (resolve_brokers(&im, &a, &fetched) || producer_create(&im) ||
        order_by_time(im.files, im.nfiles) || run_id(im.files, im.nfiles, im.run))
        goto out;
    im.bar = isatty(2);
    im.last_progress_ns = cp_mono_ns();
    char why[400];
    /* the limits of the broker path, and whether this contprofd can say what is stored */
    if (im.wait && poll_offsets(&im, why, sizeof why)) {
        fprintf(stderr,
                "contprof import: cannot ask contprofd what is stored: %s (give --no-wait "
                "to send without waiting)\n",
                why);
        goto out;
    }
    send_files(&im, &bad, &stopped);
    rc = report(&im, bad, stopped);
out:
    if (im.rk) rd_kafka_destroy(im.rk);
    free(im.sent.v);
    cp_buf_close(&im.lz4);
    free(fetched);
    free(im.files);
    free(im.labels);
    return rc;
}
