/* The per-host relay (relayd.h): one thread serves the socket, the spool and the Kafka
 * producer (collector/sink.c in Kafka mode); another asks contprofd for the capture list
 * while some process wants it. */
#include "relayd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "envelope.h"
#include "http_client.h"
#include "log.h"
#include "namecache.h"
#include "relay.h"
#include "sink.h"
#include "times.h"

/* How long a sender may take to finish a frame it started (a stalled or hostile one
 * holds a buffer meanwhile). */
#define PARTIAL_NS (10 * (int64_t)1000000000)
/* A connection that sends nothing this long is closed (senders connect per window and
 * close when idle: a held connection is a stuck or hostile one). */
#define IDLE_NS (60 * (int64_t)1000000000)
/* How often the spool is looked at while Kafka has room, and the files taken per look. */
#define DRAIN_EVERY_NS ((int64_t)1000000000)
#define DRAIN_BATCH 256
/* The capture list: asked for every CP_WATCH_POLL_MS-like period while a process asked in
 * the last CAPTURES_WANTED_NS. */
#define CAPTURES_POLL_MS 750
#define CAPTURES_WANTED_NS (10 * (int64_t)1000000000)
#define CAPTURES_MAX_BYTES ((size_t)4 << 20)
/* Answers a client has not read, past which it is dropped (it sends without reading). */
#define OUT_MAX ((size_t)8 << 20)
/* The name cache (README.md "Names"): 'N' frames taken per connection, names files built
 * per second (each reads an object's symbol tables on the relay's thread: ~1-30 ms), and
 * the directory's bounds (past them the oldest files go, down to 90%). */
#define NAMES_PER_CONN 16
#define NAMES_PER_SEC 8
#define NAMES_MAX_FILES 4096
#define NAMES_MAX_BYTES ((uint64_t)256 << 20)
/* The relay's producer's linger.ms (cp_relay_create). */
#define RELAY_LINGER_MS 200

typedef struct client {
    int fd, pid;
    uint8_t hdr[CP_RELAY_HEADER];
    uint32_t hdr_got;
    uint8_t *payload; /* the frame being read (after its header) */
    uint32_t len, got;
    uint8_t type;
    int64_t started_ns; /* when the frame being read began; 0: between frames */
    int64_t active_ns;  /* when it last sent anything */
    cp_buf out;         /* answers not yet written */
    size_t out_off;
    uint32_t names; /* 'N' frames it sent */
} client;

struct cp_relay {
    char dir[1024], sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char server[512], token[256];
    int sign, queue, max_clients;
    size_t max_buffered, buffered;
    int lfd, wake, spool;
    cp_sink *sink;
    client *c;
    int nc;
    pthread_t th, cap_th;
    int started, cap_started;
    atomic_int stop;
    int64_t next_drain;
    /* the capture list (cap_mu) */
    pthread_mutex_t cap_mu;
    pthread_cond_t cap_cv;
    cp_buf captures;
    int64_t captures_asked_ns;
    cp_counter connections, accepted, refused, spooled, drained, delivered, lost, capture_errors;
    cp_gauge pending;
    /* the name cache: DIR/names (-1: off), what it holds, this second's builds */
    int names;
    uint32_t names_files, names_max_files;
    uint64_t names_bytes, names_max_bytes;
    int64_t names_sec;
    int names_in_sec;
    uint64_t names_no[256]; /* hashes of requests refused lately: not read nor logged again */
    cp_counter names_built, names_refused, names_evicted;
};

/* ------------------------------------------------------------------------------------
 * The spool as Kafka's overflow */

/* cp_kafka_keep_fn: a message Kafka gave up on (brokers away past message.timeout.ms, the
 * backlog full, or left at shutdown) goes to the spool, drained again later. */
static int spool_put(cp_relay *r, const uint8_t *value, size_t len, cp_err *err)
{
    if (r->spool < 0) return cp_err_set(err, CP_EIO, "there is no spool");
    int rc = cp_spool_write(r->spool, value, len, err);
    if (!rc) cp_counter_add(&r->spooled, 1);
    return rc;
}

static int keep(void *arg, const uint8_t *value, size_t len)
{
    cp_relay *r = arg;
    cp_err err = {0};
    if (spool_put(r, value, len, &err) == 0) return 0;
    cp_counter_add(&r->lost, 1);
    cp_log_warn("relay: an envelope of %zu bytes is lost: Kafka did not take it, and the spool: %s",
                len, err.msg);
    return -1;
}

/* An envelope ends with its auth field (model/envelope.h): tag 16, length 32, the MAC. */
static int signed_tail(const uint8_t *v, size_t len)
{
    return len >= CP_ENVELOPE_AUTH_LEN && v[len - 35] == 0x82 && v[len - 34] == 0x01 &&
           v[len - 33] == 0x20;
}

/* Hands a checked envelope (value malloc'd, taken) to Kafka, or to the spool while Kafka
 * has no room or no broker. Returns a CP_RELAY_* status. */
static int forward(cp_relay *r, uint8_t *value, size_t len, const cp_envelope *e)
{
    cp_buf key = {0};
    if (r->sign && r->token[0] && !signed_tail(value, len)) {
        cp_buf b = {.data = value, .len = len, .cap = len};
        if (cp_envelope_sign(&b, r->token) != 0) {
            free(b.data);
            return CP_RELAY_BUSY;
        }
        value = b.data;
        len = b.len;
    }
    int64_t pending = cp_sink_pending(r->sink);
    if (pending < 0 || pending >= (int64_t)r->queue * 3 / 4 || cp_envelope_series_key(e, &key)) {
        /* refused by the spool too: the sender tries its own */
        int rc = spool_put(r, value, len, NULL) == 0 ? CP_RELAY_OK : CP_RELAY_BUSY;
        free(value);
        cp_buf_close(&key);
        return rc;
    }
    size_t kl;
    uint8_t *k = cp_buf_steal(&key, &kl);
    cp_sink_send_encoded(r->sink, value, len, k, kl);
    return CP_RELAY_OK;
}

/* Checks that value is an envelope and passes it on (value taken). who names the sender in
 * a refusal's log line. */
static int take(cp_relay *r, uint8_t *value, size_t len, const char *who)
{
    cp_envelope e;
    cp_err err = {0};
    if (cp_envelope_decode_view(value, len, CP_INGEST_MAX_PPROF, &e, &err) != 0 ||
        cp_envelope_validate(&e, CP_INGEST_MAX_PPROF, &err) != 0) {
        cp_counter_add(&r->refused, 1);
        cp_log_warn("relay: refused %zu bytes from %s: %s", len, who, err.msg);
        cp_envelope_close(&e); /* zeroed by a failed decode */
        free(value);
        return CP_RELAY_REFUSED;
    }
    int rc = forward(r, value, len, &e);
    cp_envelope_close(&e);
    if (rc == CP_RELAY_OK) cp_counter_add(&r->accepted, 1);
    return rc;
}

/* One spooled envelope (v: len bytes, taken) to Kafka. Returns 0, or -1 when out of memory
 * (v is spooled again: the drain stops for this turn). */
static int drain_one(cp_relay *r, uint8_t *v, size_t len, const char *who)
{
    cp_err err = {0};
    /* a spooled envelope taken back is counted as drained, not accepted again */
    cp_envelope e;
    if (cp_envelope_decode_view(v, len, CP_INGEST_MAX_PPROF, &e, &err) != 0) {
        cp_counter_add(&r->refused, 1);
        cp_log_warn("relay: refused %s: %s", who, err.msg);
        free(v);
        return 0;
    }
    cp_buf key = {0};
    if (cp_envelope_series_key(&e, &key) != 0) {
        cp_envelope_close(&e);
        keep(r, v, len);
        free(v);
        return -1;
    }
    cp_envelope_close(&e);
    size_t kl;
    uint8_t *k = cp_buf_steal(&key, &kl);
    cp_sink_send_encoded(r->sink, v, len, k, kl);
    cp_counter_add(&r->drained, 1);
    return 0;
}

/* A batch file's envelopes (spool file name, n bytes at p), each to drain_one. A frame that
 * does not fit refuses the rest of the file (counted, logged); what is left when memory
 * runs out is spooled again, one envelope a file. Returns 0 or -1 (stop this turn). */
static int drain_batch(cp_relay *r, const char *name, const uint8_t *p, size_t n)
{
    size_t off = 0, len;
    const uint8_t *env;
    int rc, stop = 0;
    for (unsigned i = 1; (rc = cp_spool_batch_next(p, n, &off, &env, &len)) == 1; i++) {
        if (stop) {
            keep(r, env, len);
            continue;
        }
        char who[64];
        snprintf(who, sizeof(who), "spool file %.16s, envelope %u", name, i);
        uint8_t *v = malloc(len);
        if (!v) {
            keep(r, env, len);
            stop = 1;
            continue;
        }
        memcpy(v, env, len);
        if (drain_one(r, v, len, who) != 0) stop = 1;
    }
    if (rc != 0) {
        cp_counter_add(&r->refused, 1);
        cp_log_warn("relay: refused the rest of spool file %s from byte %zu: a frame that runs "
                    "past its end",
                    name, off);
    }
    return stop ? -1 : 0;
}

/* While Kafka has room, the oldest spooled envelopes go to it. */
static void drain(cp_relay *r, int64_t now)
{
    if (r->spool < 0 || now < r->next_drain) return;
    r->next_drain = now + DRAIN_EVERY_NS;
    int64_t pending = cp_sink_pending(r->sink);
    if (pending < 0 || pending >= r->queue / 2) return;
    static cp_spool_entry ents[DRAIN_BATCH];
    size_t n = 0;
    cp_err err = {0};
    if (cp_spool_list(r->spool, ents, DRAIN_BATCH, &n, &err) != 0) {
        cp_log_warn("relay: %s", err.msg);
        return;
    }
    for (size_t i = 0;
         i < n && cp_sink_pending(r->sink) >= 0 && cp_sink_pending(r->sink) < r->queue / 2; i++) {
        cp_buf b = {0};
        int rc = cp_spool_take(r->spool, ents[i].name, &b, &err);
        if (rc) {
            if (rc == CP_EINVAL) cp_counter_add(&r->refused, 1);
            cp_log_warn("relay: %s", err.msg);
            cp_buf_close(&b);
            continue;
        }
        if (ents[i].batch) {
            int stop = drain_batch(r, ents[i].name, b.data, b.len);
            cp_buf_close(&b);
            if (stop) break;
            continue;
        }
        size_t len;
        uint8_t *v = cp_buf_steal(&b, &len);
        char who[64];
        snprintf(who, sizeof(who), "spool file %.16s", ents[i].name);
        if (drain_one(r, v, len, who) != 0) break;
    }
    if (n == DRAIN_BATCH) r->next_drain = now; /* more waiting: again at the next turn */
}

/* ------------------------------------------------------------------------------------
 * The name cache (collector/namecache.h) */

/* A file the relay may publish the names of: regular, owned by root or the relay's user,
 * writable by no one else (a local user cannot plant one with another object's build id),
 * readable by everyone (the names directory is: nothing secret is published). NULL: yes. */
static const char *names_unpublishable(const struct stat *st)
{
    if (!S_ISREG(st->st_mode)) return "not a regular file";
    if (st->st_uid != 0 && st->st_uid != geteuid())
        return "owned by neither root nor the relay's user";
    if (st->st_mode & (S_IWGRP | S_IWOTH)) return "writable by its group or others";
    if (!(st->st_mode & S_IROTH)) return "not readable by every user";
    return NULL;
}

typedef struct names_file {
    int64_t mtime_ns;
    uint64_t size;
    char name[CP_NAMECACHE_KEY_MAX];
} names_file;

static int names_file_cmp(const void *a, const void *b)
{
    const names_file *x = a, *y = b;
    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* Counts the directory's files (and bytes), removes `.tmp-*` files older than a minute and,
 * past the bounds, the oldest files down to 90% of them. */
static void names_account(cp_relay *r, int evict)
{
    int fd = openat(r->names, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    names_file *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t bytes = 0;
    int64_t now = (int64_t)time(NULL) * 1000000000;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st;
        if (e->d_name[0] == '.' && (!e->d_name[1] || !strcmp(e->d_name, ".."))) continue;
        if (fstatat(r->names, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        if (!strncmp(e->d_name, ".tmp-", 5)) {
            if (now - mt > 60 * (int64_t)1000000000) unlinkat(r->names, e->d_name, 0);
            continue;
        }
        if (strlen(e->d_name) >= CP_NAMECACHE_KEY_MAX) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            names_file *nv = realloc(v, nc * sizeof(*v));
            if (!nv) break;
            v = nv;
            cap = nc;
        }
        v[n].mtime_ns = mt;
        v[n].size = (uint64_t)st.st_size;
        memcpy(v[n].name, e->d_name, strlen(e->d_name) + 1); /* shorter: checked above */
        bytes += v[n++].size;
    }
    closedir(d);
    if (evict && (n > r->names_max_files || bytes > r->names_max_bytes)) {
        qsort(v, n, sizeof(*v), names_file_cmp);
        uint64_t keep_files = (uint64_t)r->names_max_files * 9 / 10,
                 keep_bytes = r->names_max_bytes / 10 * 9;
        for (size_t i = 0; i < n && (n - i > keep_files || bytes > keep_bytes); i++)
            if (unlinkat(r->names, v[i].name, 0) == 0) {
                bytes -= v[i].size;
                v[i].size = UINT64_MAX; /* gone */
                cp_counter_add(&r->names_evicted, 1);
            }
        size_t left = 0;
        for (size_t i = 0; i < n; i++)
            left += v[i].size != UINT64_MAX;
        n = left;
    }
    free(v);
    r->names_files = (uint32_t)n;
    r->names_bytes = bytes;
}

/* Makes DIR/names (0755, the relay's) and opens it; off (-1, logged) if what is there is not
 * the relay's own directory. */
static void names_open(cp_relay *r)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/%s", r->dir, CP_NAMECACHE_DIR);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        cp_log_warn("relay: names directory %s: %s: no name cache", path, strerror(errno));
        return;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    const char *why = fd < 0                               ? strerror(errno)
                      : fstat(fd, &st) != 0                ? strerror(errno)
                      : st.st_uid != geteuid()             ? "not owned by the relay's user"
                      : (st.st_mode & (S_IWGRP | S_IWOTH)) ? "writable by its group or others"
                                                           : NULL;
    if (why) {
        cp_log_warn("relay: names directory %s: %s: no name cache", path, why);
        if (fd >= 0) close(fd);
        return;
    }
    if ((st.st_mode & 07777) != 0755) fchmod(fd, 0755); /* readable by every user's processes */
    r->names = fd;
    names_account(r, 1);
}

/* Builds the names file n asks for, if it may. 0 built (or there already), or -1 refused
 * (counted; logged when say). */
static int names_build(cp_relay *r, const cp_relay_names *n, const char *who)
{
    char key[CP_NAMECACHE_KEY_MAX];
    struct stat st, fst;
    if (cp_namecache_key(n->id, n->id_len, n->flags, key) != 0) return -1;
    uint64_t h = cp_hash_bytes(n->path, strlen(n->path), cp_hash_bytes(key, strlen(key), 1)) | 1;
    uint64_t *no = &r->names_no[h % (sizeof(r->names_no) / sizeof(r->names_no[0]))];
    int64_t now = cp_mono_ns();
    if (now - r->names_sec >= 1000000000) {
        r->names_sec = now;
        r->names_in_sec = 0;
    }
    if (*no == h || r->names_in_sec >= NAMES_PER_SEC) {
        /* refused lately (said then), or a flood: counted, not logged line by line */
        cp_counter_add(&r->names_refused, 1);
        return -1;
    }
    r->names_in_sec++;
    if (fstatat(r->names, key, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        /* there: another process asked first, or the file is damaged (the process could not
         * use it, so it asks): a file that does not check out is removed and built again */
        cp_namecache c;
        if (cp_namecache_open(r->names, n->id, n->id_len, n->flags, &c) == 0) {
            cp_namecache_close(&c);
            return 0;
        }
        unlinkat(r->names, key, 0);
        cp_log_warn("relay: names file %s was damaged: removed, built again", key);
    }
    /* the path as the process loaded it may hold links (LD_PRELOAD=libx.so -> libx.so.1.2):
     * resolved, then stat'ed before it is opened (no device is opened), the fd checked
     * again; the build id read from that fd is what decides */
    char real[PATH_MAX];
    const char *why = !realpath(n->path, real) ? strerror(errno)
                      : stat(real, &st) != 0   ? strerror(errno)
                                               : names_unpublishable(&st);
    int fd = -1;
    cp_elfnames *t = NULL;
    cp_buf out = {0};
    uint8_t id[CP_NAMECACHE_ID_MAX];
    uint32_t id_len = 0;
    if (!why) {
        fd = open(real, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
        if (fd < 0)
            why = strerror(errno);
        else if (fstat(fd, &fst) != 0 || fst.st_ino != st.st_ino || fst.st_dev != st.st_dev)
            why = "replaced while read";
        else if (cp_namecache_file_build_id(fd, (uint64_t)fst.st_size, id, &id_len) != 0)
            why = "no build id";
        else if (id_len != n->id_len || memcmp(id, n->id, id_len) != 0)
            why = "its build id differs from the one asked for";
    }
    char dbg[256];
    if (!why && (n->flags & CP_NAMECACHE_DEBUG)) {
        /* a separate debug file elfnames.c will read must be publishable too */
        char hex[CP_NAMECACHE_KEY_MAX];
        cp_namecache_key(n->id, n->id_len, CP_NAMECACHE_DEBUG, hex);
        snprintf(dbg, sizeof(dbg), "%s/.build-id/%.2s/%s.debug", CP_NAMECACHE_DEBUG_DIR, hex,
                 hex + 2);
        if (stat(dbg, &st) == 0 && names_unpublishable(&st))
            why = "its debug file is not publishable";
    }
    if (!why) {
        char self[64]; /* the very file checked above, whatever happens to the path */
        snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
        int rc =
            cp_elfnames_create(self, n->id, n->id_len,
                               (n->flags & CP_NAMECACHE_DEBUG) ? CP_NAMECACHE_DEBUG_DIR : NULL, &t);
        if (rc != 0)
            why = rc == CP_ENOMEM ? "out of memory" : "no function symbols read";
        else if (cp_elfnames_source(t) != n->source)
            why = "the relay reads other symbols than the process did (another debug directory "
                  "or mount namespace)";
        else if (cp_namecache_encode(t, n->id, n->id_len, n->flags, &out) != 0)
            why = "its table does not fit a names file";
    }
    if (fd >= 0) close(fd);
    cp_elfnames_destroy(t);
    cp_err err = {0};
    if (!why && cp_namecache_write(r->names, key, out.data, out.len, &err) != 0) why = err.msg;
    if (why) {
        cp_buf_close(&out);
        *no = h;
        cp_counter_add(&r->names_refused, 1);
        cp_log_warn("relay: names of %s asked by %s: %s: not cached", n->path, who, why);
        return -1;
    }
    cp_counter_add(&r->names_built, 1);
    r->names_files++;
    r->names_bytes += out.len;
    cp_buf_close(&out);
    if (r->names_files > r->names_max_files || r->names_bytes > r->names_max_bytes)
        names_account(r, 1);
    return 0;
}

/* An 'N' frame from c (untrusted: bounded per connection and per second). */
static void names_frame(cp_relay *r, client *c, const uint8_t *p, uint32_t len, const char *who)
{
    if (r->names < 0) return;
    if (++c->names > NAMES_PER_CONN) {
        cp_counter_add(&r->names_refused, 1);
        if (c->names == NAMES_PER_CONN + 1)
            cp_log_warn("relay: %s sent more than %d names frames on one connection: the rest "
                        "refused",
                        who, NAMES_PER_CONN);
        return;
    }
    cp_relay_names n;
    cp_err err = {0};
    if (cp_relay_names_parse(p, len, &n, &err) != 0) {
        cp_counter_add(&r->names_refused, 1);
        cp_log_warn("relay: %s: %s: refused", who, err.msg);
        return;
    }
    names_build(r, &n, who);
}

/* ------------------------------------------------------------------------------------
 * Clients */

static void client_drop(cp_relay *r, int i)
{
    client *c = &r->c[i];
    close(c->fd);
    if (c->payload) r->buffered -= c->len;
    free(c->payload);
    cp_buf_close(&c->out);
    r->c[i] = r->c[--r->nc];
}

static int queue_answer(client *c, uint8_t type, const uint8_t *p, uint32_t len)
{
    uint8_t hdr[CP_RELAY_HEADER];
    cp_relay_header(hdr, type, len);
    if (c->out.len - c->out_off + len > OUT_MAX) return -1;
    return cp_buf_append(&c->out, hdr, sizeof(hdr)) || (len && cp_buf_append(&c->out, p, len)) ? -1
                                                                                               : 0;
}

/* Writes what c's answers hold. 0, or -1: drop the client. */
static int client_flush(client *c)
{
    while (c->out_off < c->out.len) {
        ssize_t w = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else {
            return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        }
    }
    c->out.len = c->out_off = 0;
    return 0;
}

static int frame_done(cp_relay *r, client *c)
{
    char who[48];
    snprintf(who, sizeof(who), "pid %d", c->pid);
    uint8_t *p = c->payload;
    uint32_t len = c->len;
    r->buffered -= len;
    c->payload = NULL;
    c->hdr_got = c->got = 0;
    c->started_ns = 0;
    if (c->type == CP_RELAY_ENVELOPE) {
        uint8_t st = (uint8_t)take(r, p, len, who);
        return queue_answer(c, CP_RELAY_ACK, &st, 1);
    }
    if (c->type == CP_RELAY_NAMES) {
        names_frame(r, c, p, len, who); /* no answer */
        free(p);
        return 0;
    }
    free(p);
    if (c->type == CP_RELAY_CAPTURES) {
        pthread_mutex_lock(&r->cap_mu);
        r->captures_asked_ns = cp_mono_ns();
        int rc = queue_answer(c, CP_RELAY_LIST, r->captures.data, (uint32_t)r->captures.len);
        pthread_cond_signal(&r->cap_cv);
        pthread_mutex_unlock(&r->cap_mu);
        return rc;
    }
    cp_log_warn("relay: %s sent a frame of type '%c' that only the relay sends: dropped", who,
                c->type);
    return -1;
}

/* Reads what c sent. 0, or -1: drop the client (closed, or a bad frame). */
static int client_read(cp_relay *r, client *c)
{
    for (;;) {
        if (c->hdr_got < CP_RELAY_HEADER) {
            ssize_t n =
                recv(c->fd, c->hdr + c->hdr_got, CP_RELAY_HEADER - c->hdr_got, MSG_DONTWAIT);
            if (n == 0) return -1;
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
            c->active_ns = cp_mono_ns();
            if (!c->started_ns) c->started_ns = c->active_ns;
            c->hdr_got += (uint32_t)n;
            if (c->hdr_got < CP_RELAY_HEADER) return 0;
            cp_err err = {0};
            if (cp_relay_parse_header(c->hdr, CP_RELAY_FRAME_MAX, &c->type, &c->len, &err) != 0) {
                cp_log_warn("relay: pid %d: %s: connection closed", c->pid, err.msg);
                return -1;
            }
            if (!(c->payload = malloc(c->len ? c->len : 1))) return -1;
            r->buffered += c->len;
            c->got = 0;
        }
        if (c->got < c->len) {
            ssize_t n = recv(c->fd, c->payload + c->got, c->len - c->got, MSG_DONTWAIT);
            if (n == 0) return -1;
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
            c->got += (uint32_t)n;
            if (c->got < c->len) return 0;
        }
        if (frame_done(r, c) != 0) return -1;
        if (r->buffered >= r->max_buffered) return 0; /* the rest waits for room */
    }
}

static void accept_all(cp_relay *r)
{
    for (;;) {
        int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (r->nc >= r->max_clients) {
            close(fd); /* the sender spools */
            continue;
        }
        struct ucred cred = {0};
        socklen_t cl = sizeof(cred);
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
        r->c[r->nc++] = (client){.fd = fd, .pid = (int)cred.pid, .active_ns = cp_mono_ns()};
        cp_counter_add(&r->connections, 1);
    }
}

static void *relay_main(void *arg)
{
    cp_relay *r = arg;
    pthread_setname_np(pthread_self(), "cp-relay");
    struct pollfd *pf = calloc((size_t)r->max_clients + 2, sizeof(*pf));
    if (!pf) {
        cp_log_error("relay: out of memory: not relaying");
        return NULL;
    }
    while (!atomic_load(&r->stop)) {
        int64_t now = cp_mono_ns();
        cp_sink_tick(r->sink);
        cp_counter_add(&r->lost, cp_sink_take_dropped(r->sink));
        cp_counter_add(&r->delivered, cp_sink_take_delivered(r->sink));
        cp_gauge_set(&r->pending, cp_sink_pending(r->sink));
        drain(r, now);
        pf[0] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
        pf[1] = (struct pollfd){.fd = r->wake, .events = POLLIN};
        int room = r->buffered < r->max_buffered;
        for (int i = 0; i < r->nc; i++) {
            client *c = &r->c[i];
            short ev = (room || c->payload ? POLLIN : 0) | (c->out.len > c->out_off ? POLLOUT : 0);
            pf[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        int n = poll(pf, (nfds_t)r->nc + 2, 100);
        if (n < 0 && errno != EINTR) break;
        now = cp_mono_ns();
        if (n > 0 && (pf[1].revents & POLLIN)) {
            uint64_t v;
            if (read(r->wake, &v, sizeof(v)) < 0) { /* nothing: the flag says why */
            }
        }
        int nc = r->nc;
        /* backwards: client_drop moves the last client into the slot dropped */
        for (int i = nc - 1; i >= 0; i--) {
            client *c = &r->c[i];
            short re = pf[i + 2].revents;
            int bad = (re & (POLLERR | POLLNVAL)) ||
                      (c->started_ns && now - c->started_ns > PARTIAL_NS) ||
                      now - c->active_ns > IDLE_NS;
            if (!bad && (re & (POLLIN | POLLHUP))) bad = client_read(r, c) != 0;
            if (!bad) bad = client_flush(c) != 0;
            if (bad) client_drop(r, i);
        }
        if (n > 0 && (pf[0].revents & POLLIN)) accept_all(r);
    }
    free(pf);
    return NULL;
}

/* ------------------------------------------------------------------------------------
 * The capture list */

static void *captures_main(void *arg)
{
    cp_relay *r = arg;
    pthread_setname_np(pthread_self(), "cp-relay-caps");
    pthread_mutex_lock(&r->cap_mu);
    while (!atomic_load(&r->stop)) {
        int64_t now = cp_mono_ns();
        if (now - r->captures_asked_ns < CAPTURES_WANTED_NS) {
            pthread_mutex_unlock(&r->cap_mu);
            cp_http_result res;
            cp_err err = {0};
            int rc = cp_http_get(r->server, "/api/v1/control/captures", r->token, 1000,
                                 CAPTURES_MAX_BYTES, &res, &err);
            pthread_mutex_lock(&r->cap_mu);
            if (rc == 0 && res.status == 200) {
                cp_buf_close(&r->captures);
                r->captures = res.body;
            } else {
                if (rc == 0) cp_buf_close(&res.body);
                cp_counter_add(&r->capture_errors, 1);
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t at = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + CAPTURES_POLL_MS * 1000000LL;
        ts.tv_sec = at / 1000000000;
        ts.tv_nsec = at % 1000000000;
        pthread_cond_timedwait(&r->cap_cv, &r->cap_mu, &ts);
    }
    pthread_mutex_unlock(&r->cap_mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------
 * Life */

/* Binds the socket at r->sock_path, replacing a file no relay answers on. */
static int bind_socket(cp_relay *r, cp_err *err)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", r->sock_path);
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof(a)) == 0) {
        close(probe);
        return cp_err_set(err, CP_EIO, "relay socket %s: another relay answers there",
                          r->sock_path);
    }
    if (probe >= 0) close(probe);
    struct stat st;
    if (lstat(r->sock_path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return cp_err_set(err, CP_EIO, "relay socket %s: exists and is not a socket",
                              r->sock_path);
        unlink(r->sock_path); /* left by a relay that is gone */
    }
    r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        chmod(r->sock_path, 0666) != 0 || listen(r->lfd, 512) != 0)
        return cp_err_set(err, CP_EIO, "relay socket %s: %s", r->sock_path, strerror(errno));
    return 0;
}

int cp_relay_create(const cp_relay_options *o, cp_relay **out, cp_err *err)
{
    *out = NULL;
    cp_relay *r = calloc(1, sizeof(*r));
    if (!r) return cp_err_set(err, CP_ENOMEM, "out of memory creating the relay");
    r->lfd = r->wake = r->spool = r->names = -1;
    pthread_mutex_init(&r->cap_mu, NULL);
    pthread_cond_init(&r->cap_cv, NULL);
    r->captures_asked_ns = INT64_MIN / 2;
    snprintf(r->dir, sizeof(r->dir), "%s", o->dir ? o->dir : "");
    snprintf(r->server, sizeof(r->server), "%s", o->server ? o->server : "");
    snprintf(r->token, sizeof(r->token), "%s", o->token ? o->token : "");
    r->sign = o->sign;
    r->queue = o->queue > 0 ? o->queue : 10000;
    r->max_clients = o->max_clients > 0 ? o->max_clients : 1024;
    r->max_buffered = o->max_buffered ? o->max_buffered : (size_t)64 << 20;
    r->names_max_files = o->names_max_files ? o->names_max_files : NAMES_MAX_FILES;
    r->names_max_bytes = o->names_max_bytes ? o->names_max_bytes : NAMES_MAX_BYTES;
    int rc;
    if (!r->dir[0]) {
        rc = cp_err_set(err, CP_EINVAL, "relay: no directory given");
        goto fail;
    }
    if ((size_t)snprintf(r->sock_path, sizeof(r->sock_path), "%s/%s", r->dir, CP_RELAY_SOCKET) >=
        sizeof(r->sock_path)) {
        rc = cp_err_set(err, CP_EINVAL,
                        "relay directory %s: its socket path is over the %zu bytes a Unix socket "
                        "name holds",
                        r->dir, sizeof(r->sock_path) - 1);
        goto fail;
    }
    if ((rc = cp_spool_open(r->dir, 1, &r->spool, err)) != 0) goto fail;
    names_open(r);
    if ((rc = bind_socket(r, err)) != 0) goto fail;
    r->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->c = calloc((size_t)r->max_clients, sizeof(client));
    /* The host's windows batched longer than one process's (the agent's 50 ms): fewer,
     * larger produce requests, fetches and store writes downstream (~10 ms of contprofd's
     * CPU a `make -j2` of ~200 windows, collector/README.md); the relay answers a process
     * when it holds the window, so no exit waits on this. The operator's properties come
     * after and win. */
    char props[4096]; /* the sink keeps as many (sink.c) */
    if ((size_t)snprintf(props, sizeof(props), "linger.ms=%d\n%s", RELAY_LINGER_MS,
                         o->kafka_props ? o->kafka_props : "") >= sizeof(props)) {
        rc = cp_err_set(err, CP_EINVAL, "relay: Kafka properties over %zu bytes", sizeof(props));
        goto fail;
    }
    cp_sink_options so = {
        .brokers = o->brokers,
        .server = o->server,
        .token = o->token,
        .topic = o->topic,
        .kafka_props = props,
        .kafka_queue = r->queue,
    };
    if (r->wake < 0 || !r->c || (rc = cp_sink_create(&so, &r->sink, err)) != 0) {
        rc = rc ? rc : cp_err_set(err, CP_ENOMEM, "out of memory creating the relay");
        goto fail;
    }
    cp_sink_set_keep(r->sink, keep, r);
    *out = r;
    return 0;
fail:
    cp_relay_destroy(r, 0);
    return rc;
}

int cp_relay_start(cp_relay *r, cp_err *err)
{
    if (pthread_create(&r->th, NULL, relay_main, r) != 0)
        return cp_err_set(err, CP_ENOMEM, "relay: cannot start its thread");
    r->started = 1;
    if (r->server[0]) {
        if (pthread_create(&r->cap_th, NULL, captures_main, r) != 0)
            return cp_err_set(err, CP_ENOMEM, "relay: cannot start its capture thread");
        r->cap_started = 1;
    }
    return 0;
}

int cp_relay_register_metrics(cp_relay *r, cp_metrics *m)
{
    const struct {
        const char *name, *help;
        cp_counter *c;
    } counters[] = {
        {"contprof_relay_connections_total", "Connections processes made to the relay.",
         &r->connections},
        {"contprof_relay_envelopes_total", "Envelopes the relay took from processes.",
         &r->accepted},
        {"contprof_relay_refused_total",
         "Frames the relay refused as not envelopes (logged with the sender).", &r->refused},
        {"contprof_relay_spooled_total",
         "Envelopes the relay wrote to its spool (Kafka away, full or slow).", &r->spooled},
        {"contprof_relay_drained_total", "Envelopes taken back from the spool to Kafka.",
         &r->drained},
        {"contprof_relay_delivered_total", "Envelopes Kafka acknowledged to the relay.",
         &r->delivered},
        {"contprof_relay_lost_total",
         "Envelopes the relay lost: Kafka did not take them and the spool could not (logged).",
         &r->lost},
        {"contprof_relay_capture_errors_total", "Failed requests for the capture list.",
         &r->capture_errors},
        {"contprof_relay_names_built_total",
         "Names files the relay built for the host's name cache ('N' frames).", &r->names_built},
        {"contprof_relay_names_refused_total",
         "'N' frames refused: malformed, over the bounds, or an object that may not be cached "
         "(logged).",
         &r->names_refused},
        {"contprof_relay_names_evicted_total",
         "Names files removed, oldest first, to keep the name cache within its bounds.",
         &r->names_evicted},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof counters / sizeof counters[0] && !rc; i++)
        rc = cp_metrics_counter(m, r, counters[i].name, counters[i].help, NULL, 0, counters[i].c);
    if (!rc)
        rc = cp_metrics_gauge(m, r, "contprof_relay_pending",
                              "Envelopes held for Kafka and not yet acknowledged (-1: no broker "
                              "reachable).",
                              NULL, 0, &r->pending);
    return rc;
}

void cp_relay_get_stats(cp_relay *r, cp_relay_stats *st)
{
    st->connections = cp_counter_get(&r->connections);
    st->accepted = cp_counter_get(&r->accepted);
    st->refused = cp_counter_get(&r->refused);
    st->spooled = cp_counter_get(&r->spooled);
    st->drained = cp_counter_get(&r->drained);
    st->delivered = cp_counter_get(&r->delivered);
    st->lost = cp_counter_get(&r->lost);
    st->pending = cp_gauge_get(&r->pending);
    st->names_built = cp_counter_get(&r->names_built);
    st->names_refused = cp_counter_get(&r->names_refused);
    st->names_evicted = cp_counter_get(&r->names_evicted);
}

void cp_relay_destroy(cp_relay *r, int64_t flush_ns)
{
    if (!r) return;
    /* senders find no socket from now on and spool */
    if (r->lfd >= 0) {
        unlink(r->sock_path);
        close(r->lfd);
    }
    atomic_store(&r->stop, 1);
    if (r->wake >= 0) {
        uint64_t one = 1;
        if (write(r->wake, &one, sizeof(one)) < 0) { /* the flag is set: it stops at its poll */
        }
    }
    pthread_mutex_lock(&r->cap_mu);
    pthread_cond_signal(&r->cap_cv);
    pthread_mutex_unlock(&r->cap_mu);
    if (r->started) pthread_join(r->th, NULL);
    if (r->cap_started) pthread_join(r->cap_th, NULL);
    /* clients' frames not finished are theirs to resend or spool (no answer was given) */
    while (r->nc > 0)
        client_drop(r, r->nc - 1);
    /* what Kafka has not delivered within flush_ns goes to the spool (keep) */
    uint64_t lost = cp_sink_destroy(r->sink, flush_ns);
    if (lost) {
        cp_counter_add(&r->lost, lost);
        cp_log_warn("relay: %llu envelopes lost at stop (no spool room)", (unsigned long long)lost);
    }
    if (r->spool >= 0) close(r->spool);
    if (r->names >= 0) close(r->names);
    if (r->wake >= 0) close(r->wake);
    cp_buf_close(&r->captures);
    pthread_mutex_destroy(&r->cap_mu);
    pthread_cond_destroy(&r->cap_cv);
    free(r->c);
    free(r);
}
