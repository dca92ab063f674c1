/* The V8 source: discovery of inspector targets (/json/list), one WebSocket per target
 * (libwebsockets, one context, one thread), Node's worker sessions multiplexed over their
 * parent's socket (NodeWorker domain), the profilers' cycle per window, and emission as
 * the native agent emits (envelopes to files and Kafka). */
#include "v8source.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libwebsockets.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control.h"
#include "envelope.h"
#include "heapsnap.h"
#include "http_client.h"
#include "relay.h"
#include "sink.h"
#include "labels.h"
#include "log.h"
#include "merge.h"
#include "pprof.h"
#include "selector.h"
#include "sourcemap.h"
#include "times.h"
#include "v8conv.h"
#include "v8cpu.h"
#include "watch.h"

#define MAX_MESSAGE ((size_t)256 << 20) /* one inspector message (a CPU profile) at most */
#define CALL_TIMEOUT_MS 10000
/* a heap snapshot: V8 writes ~150 ms per MB of heap under load (bench/v8/heapsnap.sh) */
#define SNAPSHOT_TIMEOUT_MS 120000
#define BACKOFF_MIN_NS (250 * 1000000LL)
#define BACKOFF_MAX_NS (10 * 1000000000LL)
#define POLL_NS (1000 * 1000000LL)       /* /json/list of a host that answers */
#define STOP_NS (3 * 1000000000LL)       /* what a stop signal leaves the last windows */
#define MAX_MAPS 256                     /* source-mapped scripts per isolate */
#define MAX_MAP_BYTES ((size_t)64 << 20) /* their maps' JSON, per isolate */
/* Captures (issue 29, README "Captures") */
#define CAP_SLOTS 16                      /* running captures at once */
#define CAP_WINDOW_NS (900 * 1000000LL)   /* a capture window is cut at this age (<= 1 s) */
#define CAP_MAX_HZ 1000                   /* V8's profiler: 1 ms at most */
#define CAP_SAMPLE_COST_US 100            /* V8's cost per sample, measured (README) */
#define WATCH_RETRY_NS (5 * 1000000000LL) /* a control consumer that failed */

enum { C_IDLE, C_CONNECTING, C_OPEN, C_CLOSED };

typedef struct conn conn;

/* A script of an isolate that came with a source map (Debugger.scriptParsed). */
typedef struct mapped {
    char *script_id;
    cp_v8_smap *map;
} mapped;

/* One isolate: the target of a connection, or a Node worker reached through it. */
typedef struct session {
    struct session *next;
    conn *c;
    char *sid; /* NodeWorker session id; NULL for the connection's own target */
    char isolate[128];
    int64_t next_id, want_id;
    json_t *reply; /* the awaited reply once it came */
    int gone, started, heap_on;
    uint64_t watermark, token, dropped_windows;
    int64_t window_start_ns;
    int64_t last_end_us; /* V8's time of the last stopped profile's end; -1: none yet */
    int64_t gap_total_us, gap_max_us, windows;
    CP_VEC(mapped) maps;
    size_t map_bytes;
    uint64_t maps_failed;
    /* each isolate session is its own producer (HOST:PID:v8:TOKEN): contprofd counts a
     * producer's reported losses once per window start, and isolates' windows start apart */
    char producer[224];
    uint64_t sequence;
    /* the CPU profiler's runs: one per window, or per capture window while captured */
    cp_merger *acc; /* the always-on window's pieces */
    int cpu_failed; /* a run of this window was lost */
    char cpu_why[256];
    int64_t run_interval_us; /* the interval of the run in progress */
    uint64_t run_caps;       /* the captures (slots) the run in progress serves */
    int64_t run_start_ns;
    int64_t thin_us;    /* captured CPU not yet passed to the always-on window */
    int64_t win_gap_us; /* the profiler was off this long in this window */
    char cap_producer[240];
    uint64_t cap_sequence;
    uint64_t alloc_caps; /* the alloc captures served, from alloc_start_ns */
    int64_t alloc_start_ns;
    uint64_t cap_mark;    /* the heap sample ordinal the alloc capture windows start after */
    uint64_t heap_done;   /* the heap captures (slots) whose snapshot this isolate took */
    cp_heapsnap *snap;    /* the snapshot streaming in (HeapProfiler.addHeapSnapshotChunk) */
    int snap_rc;          /* its parser's first error, 0 while fine */
    int64_t snap_next_ns; /* --heap-snapshot-every: the next one (monotonic; 0: not planned) */
    cp_err snap_err;
    /* the CPU its thread used (README "CPU seconds"): pid 0 when the host is not seen on
     * this machine (its windows say wall time); tid 0 when only the process is known */
    int pid, tid;
    int64_t cpu_mark_ns; /* that CPU time at the window's start; -1: unknown */
    int64_t cpu_read;    /* that CPU time now (weigh_pending's reading), -1: unreadable */
    /* the cpu window just ended, waiting for its share of the thread's CPU */
    cp_profile *pend;
    int64_t pend_start, pend_end;
    uint64_t pend_dropped;
    char pend_engine[64];
} session;

typedef struct out_msg {
    unsigned char *buf; /* LWS_PRE bytes, then the text */
    size_t len;
} out_msg;

typedef struct attach {
    char *sid, *title;
} attach;

typedef struct host host;

struct conn {
    conn *next;
    host *h;
    char target[128], title[256], path[512];
    struct lws *wsi;
    int state, listed;
    int finishing; /* node ran its last line and waits for us to disconnect */
    int closing;   /* asked libwebsockets to close */
    int64_t retry_at, backoff_ns, outer_id;
    int host_pid; /* the process listening on the inspector's port (0: not seen), per open */
    cp_buf rx;
    int rx_over;
    CP_VEC(out_msg) tx;
    CP_VEC(attach) attaches;
    session *sessions; /* the first is the target's own, once open */
};

/* Windows lost with an isolate's session (the host went away mid-window), handed to the
 * next session of the same name so that its first envelope reports them. */
typedef struct lost {
    char isolate[128];
    uint64_t windows;
} lost;

struct host {
    char addr[128], hostport[160], instance[192];
    lost lost[32];
    int port, seen, answering;
    int64_t next_poll, backoff_ns;
    conn *conns;
};

/* A running capture this source heard of (model/control.h). */
typedef struct v8cap {
    int used, ended;
    cp_capture c;
    cp_selector sel;
    int64_t interval_us; /* cpu: the interval run (0: cannot run) */
    int64_t ran;         /* hz (cpu) or bytes (alloc) */
    char reason[224];
} v8cap;

static struct {
    const cp_v8_options *o;
    struct lws_context *ctx;
    lws_sorted_usec_list_t tick;
    host hosts[CP_V8_MAX_HOSTS];
    int nhosts;
    cp_sink *sink; /* the relay or Kafka; NULL with files only */
    char producer[200], hostname[64];
    uint64_t next_token;
    uint64_t dropped_windows; /* lost with no session left to report them yet */
    int64_t stop_at;          /* monotonic time the stop signal was seen, 0 before */
    char brokers[1024];
    cp_watch *watch;
    int64_t watch_retry_at;
    v8cap caps[CAP_SLOTS];
    uint64_t ctl_bad, ctl_foreign, ctl_badsig, ctl_expired, ctl_full;
} S;

/* ------------------------------------------------------------------------------------
 * Emission: the agent's envelope, labels and transports. */

static void sanitize(char *dst, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++) {
        char ch = s[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '-';
        dst[i] = ok ? ch : '_';
    }
    dst[i] = 0;
    if (!i && cap > 1) snprintf(dst, cap, "_");
}

static int write_file(const cp_envelope *e, const session *s, const char *capture)
{
    char iso[64], svc[64], cap[CP_CAPTURE_ID_MAX + 10] = "", path[1500], tmp[1510];
    if (capture) snprintf(cap, sizeof(cap), ".capture-%s", capture);
    sanitize(iso, sizeof(iso), s->isolate);
    sanitize(svc, sizeof(svc), S.o->service);
    cp_buf gz = {0};
    if (cp_gzip(e->pprof, e->pprof_len, 1, &gz) != 0) return CP_ENOMEM;
    snprintf(path, sizeof(path), "%s/%s.%d-%llx.%06llu.%s.%s%s.pb.gz", S.o->output_dir, svc,
             (int)getpid(), (unsigned long long)s->token, (unsigned long long)e->sequence,
             cp_kind_name(e->kind), iso, cap);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t off = 0;
    while (fd >= 0 && off < gz.len) {
        ssize_t w = write(fd, gz.data + off, gz.len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    int ok = fd >= 0 && off == gz.len;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        cp_log_warn("v8: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    cp_buf_close(&gz);
    return ok ? 0 : CP_EIO;
}

/* "k=v,k=v" into l. */
static int add_labels_text(cp_labels *l, const char *text)
{
    if (!text || !text[0]) return 0;
    char *copy = strdup(text), *save = NULL;
    if (!copy) return CP_ENOMEM;
    int rc = 0;
    for (char *kv = strtok_r(copy, ",", &save); kv && !rc; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = 0;
        rc = cp_labels_set(l, kv, eq + 1);
    }
    free(copy);
    return rc;
}

/* s's labels: --label, service, instance, isolate, runtime. */
static int session_labels(const session *s, cp_labels *l)
{
    int rc;
    if ((rc = add_labels_text(l, S.o->labels)) ||
        (rc = cp_labels_set(l, CP_LABEL_SERVICE, S.o->service)) ||
        (rc = cp_labels_set(l, CP_LABEL_INSTANCE, s->c->h->instance)) ||
        (rc = cp_labels_set(l, CP_LABEL_ISOLATE, s->isolate)) ||
        (rc = cp_labels_set(l, "runtime", "v8")))
        return rc;
    return 0;
}

/* Wraps p (destroyed here) in an envelope of s and hands it on; with capture (a running
 * capture's id), a capture window: label capture=ID, the given engine text, the session's
 * capture producer and sequence. */
static void emit_as(session *s, cp_profile *p, cp_kind kind, int64_t start_ns, int64_t end_ns,
                    uint64_t dropped_samples, const char *capture, const char *engine)
{
    cp_envelope e = {0};
    cp_buf buf = {0};
    int rc = CP_ENOMEM;
    p->time_nanos = start_ns;
    p->duration_nanos = end_ns - start_ns;
    if (cp_pprof_encode(p, 0, &buf) != 0) goto fail;
    if (buf.len > CP_RAW_PPROF_MAX) {
        cp_buf gz = {0};
        if (cp_gzip(buf.data, buf.len, 1, &gz) != 0) goto fail;
        cp_buf_close(&buf);
        buf = gz;
    }
    e.tenant = strdup(S.o->tenant && S.o->tenant[0] ? S.o->tenant : CP_DEFAULT_TENANT);
    e.producer_id = strdup(capture ? s->cap_producer : s->producer);
    e.engine = strdup(engine ? engine : "v8-inspector");
    if (!e.tenant || !e.producer_id || !e.engine) goto fail;
    if ((rc = session_labels(s, &e.labels)) ||
        (capture && (rc = cp_labels_set(&e.labels, CP_CAPTURE_LABEL, capture))))
        goto fail;
    e.kind = kind;
    e.window_start_ns = start_ns;
    e.window_duration_ns = end_ns > start_ns ? end_ns - start_ns : 1;
    /* one sequence per producer: contprofd stores a (producer, sequence) once */
    e.sequence = capture ? s->cap_sequence++ : s->sequence++;
    e.dropped_samples = dropped_samples;
    /* losses no isolate holds (Kafka's backlog full, isolates gone for good) ride along
     * the always-on windows */
    e.dropped_windows = capture ? 0 : s->dropped_windows + S.dropped_windows;
    e.pprof = cp_buf_steal(&buf, &e.pprof_len);
    rc = 0;
    if (S.o->output_dir && S.o->output_dir[0] && write_file(&e, s, capture) != 0) rc = CP_EIO;
    if (S.sink) cp_sink_send(S.sink, &e); /* its losses: cp_sink_take_dropped, each turn */
    if (rc == 0 && !capture) s->dropped_windows = S.dropped_windows = 0; /* reported */
fail:
    if (rc) {
        char when[64];
        cp_format_time(start_ns, when, sizeof(when));
        if (!capture) s->dropped_windows++;
        cp_log_warn("v8: isolate %s: %s%s %s window from %s (%lld ms) lost: %s", s->isolate,
                    capture ? "capture " : "", capture ? capture : "", cp_kind_name(kind), when,
                    (long long)((end_ns - start_ns) / 1000000), cp_strerror(rc));
    }
    cp_buf_close(&buf);
    cp_envelope_close(&e);
    cp_profile_destroy(p);
}

static void emit(session *s, cp_profile *p, cp_kind kind, int64_t start_ns, int64_t end_ns,
                 uint64_t dropped_samples)
{
    emit_as(s, p, kind, start_ns, end_ns, dropped_samples, NULL, NULL);
}

/* ------------------------------------------------------------------------------------
 * CPU seconds: a V8 sample stands for its thread's wall time (waiting for a CPU too), so
 * each cpu window is weighed by the CPU the isolate's thread used in it, split among the
 * isolates sharing that thread by their samples. */

static int loopback(const char *addr)
{
    return !strncmp(addr, "127.", 4) || !strcmp(addr, "localhost") || !strcmp(addr, "::1") ||
           !strcmp(addr, "[::1]");
}

/* The sum of column col of p's samples. */
static int64_t column_sum(const cp_profile *p, int col)
{
    int64_t sum = 0;
    for (uint32_t i = 0; col >= 0 && i < p->samples.n; i++)
        sum += cp_profile_sample_values(p, i)[col];
    return sum;
}

/* Labels p's time as wall time (its second sample type and the default: wall). */
static void label_wall(cp_profile *p, const char *why)
{
    uint32_t w, c;
    int col = cp_profile_find_type(p, "cpu");
    if (col < 0 || cp_profile_intern_cstr(p, "wall", &w) || cp_profile_intern_cstr(p, why, &c) ||
        cp_vec_push(&p->comments, c))
        return;
    p->sample_types.v[col].type = w;
    p->default_sample_type = w;
}

/* Weighs the pending cpu windows of v[0..n) (ended together): each window's cpu column is
 * scaled to its share of the CPU its thread used since that session's last mark. */
static void weigh_pending(session **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        session *s = v[i];
        int64_t now = -1;
        if (s->pid > 0) {
            /* one reading per thread, shared by the isolates on it */
            for (size_t j = 0; j < i && now < 0; j++)
                if (v[j]->pid == s->pid && v[j]->tid == s->tid) now = v[j]->cpu_read;
            if (now < 0 && cp_v8_cpu_ns(s->pid, s->tid, &now) != 0) now = -1;
        }
        s->cpu_read = now;
    }
    for (size_t i = 0; i < n; i++) {
        session *s = v[i];
        int64_t now = s->cpu_read;
        if (!s->pend) { /* a window lost: its CPU is not carried into the next */
            s->cpu_mark_ns = now;
            continue;
        }
        int col = cp_profile_find_type(s->pend, "cpu");
        char note[320];
        if (now < 0 || s->cpu_mark_ns < 0 || col < 0) {
            snprintf(s->pend_engine, sizeof(s->pend_engine), "v8-inspector wall");
            snprintf(note, sizeof(note),
                     "wall: each sample weighs one sampling interval of its thread's time, "
                     "waiting for a CPU included (%s)",
                     s->pid > 0 ? "the thread's CPU could not be read"
                                : "the host is not a process of this machine");
            label_wall(s->pend, note);
            if (now >= 0) s->cpu_mark_ns = now;
            continue;
        }
        int64_t used = now > s->cpu_mark_ns ? now - s->cpu_mark_ns : 0;
        s->cpu_mark_ns = now;
        int64_t mine = column_sum(s->pend, 0), all = 0;
        for (size_t j = 0; j < n; j++)
            if (v[j]->pend && v[j]->pid == s->pid && v[j]->tid == s->tid)
                all += column_sum(v[j]->pend, 0);
        int64_t share = all > 0 ? (int64_t)((double)used * (double)mine / (double)all) : 0;
        int64_t said = column_sum(s->pend, col);
        if (said > 0) {
            double f = (double)share / (double)said;
            for (uint32_t k = 0; k < s->pend->samples.n; k++) {
                int64_t *val = s->pend->values.v + (size_t)k * s->pend->sample_types.n + col;
                *val = llround((double)*val * f);
            }
        }
        snprintf(s->pend_engine, sizeof(s->pend_engine), "v8-inspector cpu=%s",
                 s->tid > 0 ? "thread" : "process");
        snprintf(note, sizeof(note),
                 "cpu: %s %d used %lld us in this window (%s), this isolate's share %lld of %lld "
                 "samples; V8's intervals said %lld us",
                 s->tid > 0 ? "thread" : "process", s->tid > 0 ? s->tid : s->pid,
                 (long long)(used / 1000), s->tid > 0 ? "schedstat" : "stat utime+stime",
                 (long long)mine, (long long)all, (long long)(said / 1000));
        uint32_t c;
        if (cp_profile_intern_cstr(s->pend, note, &c) == 0)
            (void)cp_vec_push(&s->pend->comments, c);
    }
}

/* ------------------------------------------------------------------------------------
 * The WebSocket side: libwebsockets calls back here for every connection. */

static session *find_session(conn *c, const char *sid)
{
    for (session *s = c->sessions; s; s = s->next)
        if (sid ? (s->sid && !strcmp(s->sid, sid)) : !s->sid) return s;
    return NULL;
}

static const char *jstr(const json_t *o, const char *name)
{
    const json_t *v = json_object_get(o, name);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* ------------------------------------------------------------------------------------
 * Source maps: read when a script is parsed, applied to each window's call frames. */

/* The map text of a script: sourceMapURL a data: URL, a file (absolute, or relative to a
 * file:// script), or DIR/BASENAME of --source-map-dir. */
static int load_map_text(const char *script_url, const char *map_url, cp_buf *out, cp_err *e)
{
    if (!strncmp(map_url, "data:", 5)) return cp_v8_data_url_decode(map_url, out, e);
    char path[4096] = "";
    const char *rel = map_url;
    if (!strncmp(map_url, "file://", 7)) {
        snprintf(path, sizeof(path), "%s", map_url + 7);
    } else if (map_url[0] == '/') {
        snprintf(path, sizeof(path), "%s", map_url);
    } else if (!strstr(map_url, "://") && !strncmp(script_url, "file://", 7)) {
        const char *slash = strrchr(script_url + 7, '/');
        if (slash)
            snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - (script_url + 7)), script_url + 7,
                     map_url);
    }
    struct stat st;
    if ((!path[0] || stat(path, &st) != 0) && S.o->source_map_dir && S.o->source_map_dir[0]) {
        const char *base = strrchr(rel, '/');
        snprintf(path, sizeof(path), "%s/%s", S.o->source_map_dir, base ? base + 1 : rel);
    }
    if (!path[0]) return cp_err_set(e, CP_EINVAL, "%.200s: no file to read it from", map_url);
    if (stat(path, &st) != 0) return cp_err_set(e, CP_EIO, "%s: %s", path, strerror(errno));
    if ((size_t)st.st_size > CP_V8_SMAP_MAX_BYTES)
        return cp_err_set(e, CP_ELIMIT, "%s: over %zu MiB", path, CP_V8_SMAP_MAX_BYTES >> 20);
    return cp_read_file(path, out, e);
}

/* Debugger.scriptParsed: reads the script's source map, if it names one. */
static void script_parsed(session *s, const json_t *params)
{
    const char *id = jstr(params, "scriptId"), *url = jstr(params, "url");
    const char *map_url = jstr(params, "sourceMapURL");
    if (!id || !map_url || !map_url[0]) return;
    cp_err e = {0};
    cp_buf text = {0};
    cp_v8_smap *m = NULL;
    int rc = 0;
    if (s->maps.n >= MAX_MAPS || s->map_bytes >= MAX_MAP_BYTES)
        rc = cp_err_set(&e, CP_ELIMIT, "over %d maps or %zu MiB of maps for this isolate", MAX_MAPS,
                        MAX_MAP_BYTES >> 20);
    if (!rc) rc = load_map_text(url ? url : "", map_url, &text, &e);
    if (!rc) rc = cp_v8_smap_create((const char *)text.data, text.len, &m, &e);
    mapped mp = {strdup(id), m};
    if (!rc && (!mp.script_id || cp_vec_push(&s->maps, mp))) rc = CP_ENOMEM;
    if (rc) {
        s->maps_failed++;
        cp_log_warn("v8: isolate %s: script %s (%.200s): source map not used: %s", s->isolate, id,
                    url ? url : "?", e.msg[0] ? e.msg : cp_strerror(rc));
        free(mp.script_id);
        cp_v8_smap_destroy(m);
    } else {
        s->map_bytes += text.len;
        cp_log_info("v8: isolate %s: script %.200s: source map read (%zu bytes)", s->isolate,
                    url ? url : "?", text.len);
    }
    cp_buf_close(&text);
}

static const cp_v8_smap *map_of(const session *s, const json_t *frame)
{
    const char *id = jstr(frame, "scriptId");
    if (!id) return NULL;
    for (uint32_t i = 0; i < s->maps.n; i++)
        if (!strcmp(s->maps.v[i].script_id, id)) return s->maps.v[i].map;
    return NULL;
}

/* Maps every callFrame of a CPU profile's nodes or a heap profile's tree (from node). */
static void map_frames(const session *s, json_t *node, int depth)
{
    if (!s->maps.n || depth > 100000) return;
    json_t *nodes = json_object_get(node, "nodes");
    if (json_is_array(nodes)) { /* a CPU profile: a flat list */
        for (size_t i = 0; i < json_array_size(nodes); i++) {
            json_t *nd = json_array_get(nodes, i), *cf = json_object_get(nd, "callFrame");
            const cp_v8_smap *m = json_is_object(cf) ? map_of(s, cf) : NULL;
            if (!m) continue;
            (void)cp_v8_smap_apply(m, cf);
            /* its line ticks count lines of the generated script, not of the source the
             * frame now names: the frame keeps its own line alone */
            json_object_del(nd, "positionTicks");
        }
        return;
    }
    /* a heap profile: head, then children (jansson's parser bounds the depth) */
    json_t *head = json_object_get(node, "head");
    if (head && !depth) node = head;
    json_t *cf = json_object_get(node, "callFrame");
    const cp_v8_smap *m = json_is_object(cf) ? map_of(s, cf) : NULL;
    if (m) (void)cp_v8_smap_apply(m, cf);
    json_t *ch = json_object_get(node, "children");
    for (size_t i = 0; i < json_array_size(ch); i++)
        map_frames(s, json_array_get(ch, i), depth + 1);
}

/* Takes m: a reply goes to the session waiting for it, a worker's message is unwrapped,
 * worker attach/detach events are noted for the main loop, the rest is dropped. */
static void deliver(conn *c, const char *sid, json_t *m)
{
    if (cp_log_level >= CP_LOG_DEBUG) {
        char *t = json_dumps(m, JSON_COMPACT);
        cp_log_debug("v8: %s session %s: %.300s", c->target, sid ? sid : "-", t ? t : "?");
        free(t);
    }
    const json_t *id = json_object_get(m, "id");
    const char *method = jstr(m, "method");
    const json_t *params = json_object_get(m, "params");
    if (json_is_integer(id)) {
        session *s = find_session(c, sid);
        if (s && !s->reply && s->want_id == json_integer_value(id)) {
            s->reply = m;
            return;
        }
    } else if (!sid && method && !strcmp(method, "NodeWorker.receivedMessageFromWorker")) {
        const char *ws;
        json_t *inner;
        cp_err e = {0};
        if (cp_v8_worker_message(params, &ws, &inner, &e) != 0)
            cp_log_warn("v8: %s target %s: %s", c->h->hostport, c->target, e.msg);
        else
            deliver(c, ws, inner);
    } else if (!sid && method && !strcmp(method, "NodeWorker.attachedToWorker")) {
        const char *ws = jstr(params, "sessionId");
        char iso[128];
        /* node titles a worker "[worker N] NAME": the isolate is NAME */
        cp_v8_worker_isolate(jstr(json_object_get(params, "workerInfo"), "title"), iso,
                             sizeof(iso));
        attach a = {ws ? strdup(ws) : NULL, strdup(iso)};
        if (!a.sid || !a.title || cp_vec_push(&c->attaches, a)) {
            free(a.sid);
            free(a.title);
        }
    } else if (method && !strcmp(method, "HeapProfiler.addHeapSnapshotChunk")) {
        session *s = find_session(c, sid);
        const char *chunk = jstr(params, "chunk");
        if (s && s->snap && !s->snap_rc && chunk)
            s->snap_rc = cp_heapsnap_feed(s->snap, chunk, strlen(chunk), &s->snap_err);
    } else if (method && !strcmp(method, "Debugger.scriptParsed")) {
        session *s = find_session(c, sid);
        if (s) script_parsed(s, params);
    } else if (!sid && method && !strcmp(method, "NodeRuntime.waitingForDisconnect")) {
        c->finishing = 1;
    } else if (!sid && method && !strcmp(method, "NodeWorker.detachedFromWorker")) {
        const char *ws = jstr(params, "sessionId");
        session *s = ws ? find_session(c, ws) : NULL;
        if (s) s->gone = 1;
    }
    json_decref(m);
}

static void conn_closed(conn *c, const char *why)
{
    if (c->state == C_OPEN || c->state == C_CONNECTING)
        cp_log_info("v8: %s target %s (%s): %s", c->h->hostport, c->target, c->title, why);
    c->state = C_CLOSED;
    c->wsi = NULL;
    c->backoff_ns = c->backoff_ns ? c->backoff_ns * 2 : BACKOFF_MIN_NS;
    if (c->backoff_ns > BACKOFF_MAX_NS) c->backoff_ns = BACKOFF_MAX_NS;
    c->retry_at = cp_mono_ns() + c->backoff_ns;
    for (session *s = c->sessions; s; s = s->next)
        s->gone = 1;
    for (uint32_t i = 0; i < c->tx.n; i++)
        free(c->tx.v[i].buf);
    c->tx.n = 0;
    cp_buf_close(&c->rx);
}

static int ws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                 size_t len)
{
    conn *c = user;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        if (c) {
            c->state = C_OPEN;
            c->backoff_ns = 0;
        }
        break;
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        if (c) {
            char why[200];
            snprintf(why, sizeof(why), "connection failed: %.*s",
                     in ? (int)(len < 150 ? len : 150) : 7, in ? (const char *)in : "unknown");
            conn_closed(c, why);
        }
        break;
    case LWS_CALLBACK_CLIENT_CLOSED:
        if (c) conn_closed(c, "connection closed");
        break;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        if (!c) break;
        if (c->rx.len + len > MAX_MESSAGE)
            c->rx_over = 1;
        else if (cp_buf_append(&c->rx, in, len) != 0)
            c->rx_over = 1;
        if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
            if (c->rx_over) {
                cp_log_warn("v8: %s target %s: message over %zu MiB (or no memory): dropped",
                            c->h->hostport, c->target, MAX_MESSAGE >> 20);
            } else {
                json_t *m;
                cp_err e = {0};
                if (cp_v8_message_parse((const char *)c->rx.data, c->rx.len, &m, &e) != 0)
                    cp_log_warn("v8: %s target %s: %s", c->h->hostport, c->target, e.msg);
                else
                    deliver(c, NULL, m);
            }
            c->rx.len = 0;
            c->rx_over = 0;
        }
        break;
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        if (c && c->closing) return -1;
        if (!c || !c->tx.n) break;
        {
            out_msg m = c->tx.v[0];
            memmove(c->tx.v, c->tx.v + 1, (c->tx.n - 1) * sizeof(out_msg));
            c->tx.n--;
            int w = lws_write(wsi, m.buf + LWS_PRE, m.len, LWS_WRITE_TEXT);
            free(m.buf);
            if (w < (int)m.len) return -1;
            if (c->tx.n) lws_callback_on_writable(wsi);
        }
        break;
    default:
        break;
    }
    return 0;
}

static const struct lws_protocols protocols[] = {
    {"cdp", ws_cb, 0, 1 << 16, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* Makes lws_service return at least every 20 ms. */
static void tick_cb(lws_sorted_usec_list_t *sul)
{
    lws_sul_schedule(S.ctx, 0, sul, tick_cb, 20 * LWS_US_PER_MS);
}

static int queue_text(conn *c, const char *text)
{
    size_t n = strlen(text);
    out_msg m = {malloc(LWS_PRE + n), n};
    if (!m.buf) return CP_ENOMEM;
    memcpy(m.buf + LWS_PRE, text, n);
    if (cp_vec_push(&c->tx, m)) {
        free(m.buf);
        return CP_ENOMEM;
    }
    lws_callback_on_writable(c->wsi);
    return 0;
}

/* Sends method(params) to s (params taken; NULL = {}) and serves every connection until
 * the reply comes. Returns 0 with *result (may be NULL: dropped) the reply's result, or
 * CP_EIO (closed, time-out, an error reply) with err saying which. */
static int call_within(session *s, const char *method, json_t *params, json_t **result,
                       int64_t timeout_ms, cp_err *err)
{
    conn *c = s->c;
    if (result) *result = NULL;
    if (c->state != C_OPEN || s->gone) {
        json_decref(params);
        return cp_err_set(err, CP_EIO, "%s: isolate %s is not connected", method, s->isolate);
    }
    int64_t id = ++s->next_id;
    json_t *msg = json_pack("{s:I, s:s, s:o}", "id", (json_int_t)id, "method", method, "params",
                            params ? params : json_object());
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (text && s->sid) {
        json_t *w = json_pack("{s:I, s:s, s:{s:s, s:s}}", "id", (json_int_t)++c->outer_id, "method",
                              "NodeWorker.sendMessageToWorker", "params", "message", text,
                              "sessionId", s->sid);
        free(text);
        text = w ? json_dumps(w, JSON_COMPACT) : NULL;
        json_decref(w);
    }
    if (!text || queue_text(c, text) != 0) {
        free(text);
        return CP_ENOMEM;
    }
    free(text);
    s->want_id = id;
    json_decref(s->reply);
    s->reply = NULL;
    int64_t deadline = cp_mono_ns() + timeout_ms * 1000000LL;
    while (!s->reply && c->state == C_OPEN && !s->gone && cp_mono_ns() < deadline) {
        /* once stopping, every call (the last windows among them) ends within STOP_NS */
        if (*S.o->stop && !S.stop_at) S.stop_at = cp_mono_ns();
        if (S.stop_at && cp_mono_ns() > S.stop_at + STOP_NS) break;
        lws_service(S.ctx, 0);
    }
    s->want_id = 0;
    if (!s->reply) {
        char why[64];
        snprintf(why, sizeof(why), "no reply in %lld s", (long long)timeout_ms / 1000);
        return cp_err_set(err, CP_EIO, "%s on isolate %s: %s", method, s->isolate,
                          c->state != C_OPEN || s->gone ? "disconnected"
                          : S.stop_at                   ? "no reply before the stop"
                                                        : why);
    }
    const json_t *e = json_object_get(s->reply, "error");
    int rc = 0;
    if (e) {
        const char *em = jstr(e, "message");
        rc = cp_err_set(err, CP_EIO, "%s on isolate %s: %s", method, s->isolate,
                        em ? em : "error reply");
    } else if (result) {
        json_t *r = json_object_get(s->reply, "result");
        *result = r ? json_incref(r) : json_object();
    }
    json_decref(s->reply);
    s->reply = NULL;
    return rc;
}

static int call(session *s, const char *method, json_t *params, json_t **result, cp_err *err)
{
    return call_within(s, method, params, result, CALL_TIMEOUT_MS, err);
}

/* ------------------------------------------------------------------------------------
 * Sessions: starting the profilers, and each window. */

static session *session_new(conn *c, const char *sid, const char *isolate)
{
    session *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    if (sid && !(s->sid = strdup(sid))) {
        free(s);
        return NULL;
    }
    s->c = c;
    snprintf(s->isolate, sizeof(s->isolate), "%s", isolate);
    s->token = ++S.next_token;
    snprintf(s->producer, sizeof(s->producer), "%s:%llx", S.producer, (unsigned long long)s->token);
    for (size_t i = 0; i < sizeof(c->h->lost) / sizeof(c->h->lost[0]); i++)
        if (c->h->lost[i].windows && !strcmp(c->h->lost[i].isolate, s->isolate)) {
            s->dropped_windows = c->h->lost[i].windows;
            c->h->lost[i].windows = 0;
        }
    s->last_end_us = -1;
    s->next_id = 0;
    s->run_interval_us = S.o->cpu_interval_us;
    snprintf(s->cap_producer, sizeof(s->cap_producer), "%s/capture", s->producer);
    /* appended: the target's own session stays first */
    session **at = &c->sessions;
    while (*at)
        at = &(*at)->next;
    *at = s;
    return s;
}

static void session_free(session *s)
{
    cp_heapsnap_destroy(s->snap);
    for (uint32_t i = 0; i < s->maps.n; i++) {
        free(s->maps.v[i].script_id);
        cp_v8_smap_destroy(s->maps.v[i].map);
    }
    free(s->maps.v);
    cp_merger_destroy(s->acc);
    cp_profile_destroy(s->pend);
    json_decref(s->reply);
    free(s->sid);
    free(s);
}

/* Which thread's CPU s's windows are weighed by: node's isolates tell theirs (evaluated
 * on the isolate's thread: the readlink of /proc/thread-self), when the process they name
 * is the one listening on the inspector's port here (the same pid namespace); a host that
 * cannot tell (workerd) is the listening process, its Workers on its main thread (one
 * thread serves them all, observed); a Node worker that cannot tell, its process. A host
 * not seen here (remote, another namespace or user): wall time. */
static void session_thread_guess(session *s)
{
    conn *c = s->c;
    s->pid = s->tid = 0;
    s->cpu_mark_ns = -1;
    if (!loopback(c->h->addr)) return;
    if (!s->sid || !c->host_pid) c->host_pid = cp_v8_listener_pid((unsigned)c->h->port);
    int pid = c->host_pid, tid = s->sid ? 0 : pid;
    int64_t ns;
    if (pid && tid && cp_v8_cpu_ns(pid, tid, &ns) != 0) tid = 0;
    if (!pid || cp_v8_cpu_ns(pid, tid, &ns) != 0) return;
    s->pid = pid;
    s->tid = tid;
    s->cpu_mark_ns = ns;
}

/* Asks the isolate for its thread once it runs (node's `require` is not ready while it is
 * held at its start): a thread told replaces the guess, its CPU counted from now. */
static void session_thread_ask(session *s)
{
    conn *c = s->c;
    if (!s->pid) {
        cp_log_info("v8: isolate %s: no process of this machine seen listening on %s: its cpu "
                    "windows are wall time",
                    s->isolate, c->h->hostport);
        return;
    }
    json_t *r = NULL;
    int pid = 0, tid = 0;
    json_t *q = json_pack("{s:s, s:b, s:b}", "expression",
                          "require('fs').readlinkSync('/proc/thread-self')",
                          "includeCommandLineAPI", 1, "silent", 1);
    cp_err e = {0};
    char how[300] = "told by the isolate";
    if (call(s, "Runtime.evaluate", q, &r, &e) == 0) {
        const json_t *res = json_object_get(r, "result");
        const char *v = jstr(res, "value"), *d = jstr(res, "description");
        if (!v || cp_v8_thread_self_parse(v, &pid, &tid, NULL) != 0 || pid != s->pid) {
            snprintf(how, sizeof(how), "not told (%.120s)", v ? v : d ? d : "no value");
            pid = tid = 0;
        }
    } else {
        snprintf(how, sizeof(how), "not told (%.200s)", e.msg);
    }
    json_decref(r);
    int64_t ns;
    if (tid && tid != s->tid && cp_v8_cpu_ns(pid, tid, &ns) == 0) {
        s->tid = tid;
        s->cpu_mark_ns = ns;
    } else if (!tid) {
        size_t l = strlen(how);
        snprintf(how + l, sizeof(how) - l, ": %s",
                 s->tid ? "the host's main thread" : "the process's CPU");
    }
    cp_log_info("v8: isolate %s: cpu windows weighed by the CPU of %s %d of process %d (%s)",
                s->isolate, s->tid ? "thread" : "process", s->tid ? s->tid : s->pid, s->pid, how);
}

/* Starts both profilers on s, then lets a waiting isolate run (node --inspect-brk, or a
 * worker held at its start): what the script allocates from its first line is sampled. */
static int session_start(session *s)
{
    cp_err e = {0};
    int rc;
    if (S.o->cpu_interval_us > 0 &&
        ((rc = call(s, "Profiler.enable", NULL, NULL, &e)) ||
         (rc = call(s, "Profiler.setSamplingInterval",
                    json_pack("{s:I}", "interval", (json_int_t)S.o->cpu_interval_us), NULL, &e)) ||
         (rc = call(s, "Profiler.start", NULL, NULL, &e)))) {
        cp_log_warn("v8: %s", e.msg);
        return rc;
    }
    json_t *hp = json_pack("{s:I}", "samplingInterval", (json_int_t)S.o->heap_interval);
    if (S.o->heap_interval <= 0) {
        /* heap profiles off */
    } else if (call(s, "HeapProfiler.startSampling", json_incref(hp), NULL, &e) != 0) {
        /* a sampler left running by an earlier session of ours: restart it */
        (void)call(s, "HeapProfiler.stopSampling", NULL, NULL, NULL);
        if (call(s, "HeapProfiler.startSampling", json_incref(hp), NULL, &e) != 0)
            cp_log_warn("v8: isolate %s: no heap profile: %s", s->isolate, e.msg);
        else
            s->heap_on = 1;
    } else {
        s->heap_on = 1;
    }
    json_decref(hp);
    /* source maps: Debugger.scriptParsed names each script's map (the scripts already
     * there come before enable's reply); pauses are skipped so that a `debugger`
     * statement or node's --inspect-brk never stops the host for us */
    if (!S.o->no_source_maps &&
        (call(s, "Debugger.enable", NULL, NULL, &e) != 0 ||
         call(s, "Debugger.setSkipAllPauses", json_pack("{s:b}", "skip", 1), NULL, &e) != 0))
        cp_log_warn("v8: isolate %s: no source maps: %s", s->isolate, e.msg);
    session_thread_guess(s);
    s->window_start_ns = s->run_start_ns = cp_now_ns();
    s->started = 1;
    if (!s->sid) { /* node: follow its workers, each held until its profilers run */
        (void)call(s, "NodeWorker.enable", json_pack("{s:b}", "waitForDebuggerOnStart", 1), NULL,
                   NULL);
        /* and be told when it has run its last line: it then waits for us to go */
        (void)call(s, "NodeRuntime.notifyWhenWaitingForDisconnect",
                   json_pack("{s:b}", "enabled", 1), NULL, NULL);
    }
    (void)call(s, "Runtime.runIfWaitingForDebugger", NULL, NULL, NULL);
    session_thread_ask(s);
    cp_log_info("v8: %s: attached to isolate %s", s->c->h->hostport, s->isolate);
    return 0;
}

/* Logs the loss of s's what window(s) [start, end) (ns since the epoch), naming why. */
static void log_lost(const session *s, const char *what, int64_t start, int64_t end,
                     const char *why)
{
    char when[64];
    cp_format_time(start, when, sizeof(when));
    cp_log_warn("v8: %s isolate %s: %s window from %s (%lld ms) lost: %s", s->c->h->hostport,
                s->isolate, what, when, (long long)((end - start) / 1000000), why);
}

/* The windows an isolate emits each time: cpu, and alloc and inuse with the sampler. */
static int kinds_of(const session *s)
{
    return (S.o->cpu_interval_us > 0) + 2 * (s->heap_on != 0);
}

/* ------------------------------------------------------------------------------------
 * Captures: control messages, the CPU profiler's runs at a capture's interval. */

/* The rate capture k runs at on an isolate: the asked one unless a bound or the
 * always-on interval says otherwise (k->reason). */
static void cap_plan(v8cap *k)
{
    k->reason[0] = 0;
    int64_t base = S.o->cpu_interval_us;
    if (k->c.kind == CP_KIND_HEAP) { /* one snapshot per isolate */
        k->interval_us = 0;
        k->ran = 1;
        return;
    }
    if (k->c.kind == CP_KIND_ALLOC) {
        /* the heap sampler is not restarted: its in-use samples would be lost */
        k->interval_us = 0;
        k->ran = S.o->heap_interval;
        if (k->ran != k->c.alloc_rate)
            snprintf(k->reason, sizeof(k->reason), "%s",
                     S.o->heap_interval > 0
                         ? "v8 heap sampler kept at contprof v8 --heap-interval (inuse kept)"
                         : "v8 heap sampler off (contprof v8 --heap-interval 0)");
        return;
    }
    if (base <= 0) {
        k->interval_us = 0;
        k->ran = 0;
        snprintf(k->reason, sizeof(k->reason),
                 "v8 CPU profiler off (contprof v8 --cpu-interval 0)");
        return;
    }
    int64_t hz = cp_capture_plan_hz(&k->c, CAP_MAX_HZ, CAP_SAMPLE_COST_US * 1000, "the v8 source",
                                    k->reason, sizeof(k->reason));
    int64_t iv = 1000000 / hz;
    if (iv >= base) { /* at or below the always-on rate: the always-on run serves it */
        if (iv > base)
            snprintf(k->reason, sizeof(k->reason),
                     "the always-on rate (contprof v8 --cpu-interval) is higher");
        iv = base;
    }
    k->interval_us = iv;
    k->ran = 1000000 / iv;
}

static v8cap *cap_find(const char *id)
{
    for (int i = 0; i < CAP_SLOTS; i++)
        if (S.caps[i].used && !strcmp(S.caps[i].c.id, id)) return &S.caps[i];
    return NULL;
}

static void on_control(const uint8_t *v, size_t len, void *arg)
{
    (void)arg;
    cp_capture c;
    cp_err err = {0};
    if (cp_capture_decode(v, len, &c, &err) != 0) {
        S.ctl_bad++;
        cp_log_debug("v8: control message ignored: %s", err.msg);
        return;
    }
    const char *tenant = S.o->tenant && S.o->tenant[0] ? S.o->tenant : CP_DEFAULT_TENANT;
    int64_t now = cp_now_ns();
    v8cap *k;
    if (strcmp(c.tenant, tenant) != 0) {
        S.ctl_foreign++;
    } else if (S.o->token && S.o->token[0] && !cp_envelope_verify(v, len, S.o->token)) {
        S.ctl_badsig++;
        cp_log_warn("v8: capture %s ignored: its signature does not verify with our token", c.id);
    } else if ((k = cap_find(c.id)) != NULL) {
        if (k->ended) {
            /* ended here: a later message does not restart it */
        } else if (!cp_capture_live(&c, now)) {
            k->ended = 1;
            cp_log_info("v8: capture %s ended (%s)", c.id, c.cancelled ? "cancelled" : "past");
        } else if (c.kind == k->c.kind) {
            k->c.end_ns = c.end_ns;
            k->c.cpu_hz = c.cpu_hz;
            k->c.alloc_rate = c.alloc_rate;
            k->c.max_overhead_permille = c.max_overhead_permille;
            cap_plan(k);
        }
    } else if (!cp_capture_live(&c, now)) {
        S.ctl_expired++;
    } else {
        k = NULL;
        for (int i = 0; i < CAP_SLOTS && !k; i++)
            if (!S.caps[i].used) k = &S.caps[i];
        cp_err se = {0};
        if (!k) {
            if (!S.ctl_full++)
                cp_log_warn("v8: more than %d captures at once: capture %s and later ones are "
                            "not run by this source",
                            CAP_SLOTS, c.id);
        } else if (cp_selector_parse(c.selector, &k->sel, &se) != 0) {
            S.ctl_bad++;
            cp_log_warn("v8: capture %s ignored: selector: %s", c.id, se.msg);
        } else {
            k->c = c;
            memset(&c, 0, sizeof(c)); /* its selector is k's now */
            k->used = 1;
            k->ended = 0;
            cap_plan(k);
            cp_log_info("v8: capture %s heard: %s %s, asked %lld, runs at %lld%s%s", k->c.id,
                        cp_kind_name(k->c.kind), k->c.selector,
                        (long long)(k->c.kind == CP_KIND_CPU     ? k->c.cpu_hz
                                    : k->c.kind == CP_KIND_ALLOC ? k->c.alloc_rate
                                                                 : 1),
                        (long long)k->ran, k->reason[0] ? ": " : "", k->reason);
        }
    }
    cp_capture_close(&c);
}

/* The running captures of kind (slot bits) whose selector matches s's labels. */
static uint64_t caps_kind(const session *s, int64_t now, cp_kind kind)
{
    uint64_t m = 0;
    cp_labels l = {0};
    int have = 0;
    for (int i = 0; i < CAP_SLOTS; i++) {
        const v8cap *k = &S.caps[i];
        if (!k->used || k->ended || k->c.end_ns <= now || k->c.kind != kind ||
            (kind == CP_KIND_CPU && !k->interval_us))
            continue;
        if (!have && session_labels(s, &l) != 0) break;
        have = 1;
        if (cp_selector_match(&k->sel, &l)) m |= 1ULL << i;
    }
    cp_labels_close(&l);
    return m;
}

static uint64_t caps_of(const session *s, int64_t now)
{
    return caps_kind(s, now, CP_KIND_CPU);
}

/* The interval a run serving caps uses: the finest of theirs, else the always-on one. */
static int64_t interval_of(uint64_t caps)
{
    int64_t iv = S.o->cpu_interval_us;
    for (int i = 0; i < CAP_SLOTS; i++)
        if ((caps & (1ULL << i)) && S.caps[i].interval_us < iv) iv = S.caps[i].interval_us;
    return iv;
}

/* A copy of profile (a run at a finer interval) holding one sample each time the time its
 * samples stand for reaches base_us (*acc carries the rest to the next run), converted at
 * base_us: the always-on window keeps its rate and its CPU seconds. A sample stands for
 * V8's time since the one before (timeDeltas), at most base_us, as V8's sampler at base_us
 * would count it: V8 falls short of a fine interval under load (README), so counting the
 * interval per sample would shrink the always-on CPU. "(idle)" samples pass nothing. NULL
 * on out of memory. */
static json_t *thin_profile(const json_t *profile, int64_t base_us, int64_t *acc)
{
    const json_t *nodes = json_object_get(profile, "nodes");
    const json_t *samples = json_object_get(profile, "samples");
    const json_t *deltas = json_object_get(profile, "timeDeltas");
    json_t *out = json_copy((json_t *)profile);
    json_t *ns = json_array(), *nd = json_array();
    if (!out || !ns || !nd) goto fail;
    json_int_t idle[8];
    size_t nidle = 0;
    for (size_t i = 0; i < json_array_size(nodes) && nidle < 8; i++) {
        const json_t *n = json_array_get(nodes, i);
        const char *fn = jstr(json_object_get(n, "callFrame"), "functionName");
        const json_t *id = json_object_get(n, "id");
        if (fn && !strcmp(fn, "(idle)") && json_is_integer(id))
            idle[nidle++] = json_integer_value(id);
    }
    json_int_t t = 0;
    for (size_t i = 0; i < json_array_size(samples) && i < json_array_size(deltas); i++) {
        const json_t *sm = json_array_get(samples, i), *d = json_array_get(deltas, i);
        json_int_t dt = json_is_integer(d) ? json_integer_value(d) : 0;
        t += dt;
        int is_idle = 0;
        for (size_t j = 0; j < nidle && json_is_integer(sm); j++)
            is_idle |= json_integer_value(sm) == idle[j];
        if (is_idle) continue;
        *acc += dt < 0 ? 0 : dt > base_us ? base_us : dt;
        if (*acc < base_us) continue;
        *acc -= base_us;
        if (json_array_append(ns, (json_t *)sm) || json_array_append_new(nd, json_integer(t)))
            goto fail;
        t = 0;
    }
    if (json_object_set_new(out, "samples", ns) || json_object_set_new(out, "timeDeltas", nd)) {
        ns = nd = NULL;
        goto fail;
    }
    return out;
fail:
    json_decref(ns);
    json_decref(nd);
    json_decref(out);
    return NULL;
}

/* The engine text of capture k's windows. */
static void cap_engine(const v8cap *k, int64_t ran_us, char *out, size_t cap)
{
    int64_t ran = ran_us > 0 ? 1000000 / ran_us : 0;
    const char *why = k->reason;
    if (!why[0] && ran != k->ran) why = "another capture of this isolate runs faster";
    snprintf(out, cap, "v8-inspector capture asked=%lld ran=%lld%s%s", (long long)k->c.cpu_hz,
             (long long)ran, why[0] ? " reason=" : "", why);
}

/* Ends the CPU profiler's run in progress: its samples go to the captures it served (one
 * capture window each) and to the always-on window's pieces (thinned when it ran finer).
 * With restart, a new run starts at the interval the captures matching s now want. A run
 * that cannot be read marks the always-on window lost. */
static void cpu_cycle(session *s, int restart)
{
    if (S.o->cpu_interval_us <= 0) return;
    int64_t now = cp_now_ns(), base = S.o->cpu_interval_us, ran = s->run_interval_us;
    uint64_t caps = s->run_caps;
    cp_err e = {0};
    json_t *r = NULL;
    cp_profile *p = NULL;
    if (call(s, "Profiler.stop", NULL, &r, &e) != 0) {
        s->cpu_failed = 1;
        snprintf(s->cpu_why, sizeof(s->cpu_why), "%s", e.msg);
    } else {
        json_t *prof = json_object_get(r, "profile");
        map_frames(s, prof, 0);
        if (cp_v8_cpu_profile(prof, ran, &p, NULL, &e) != 0) {
            s->cpu_failed = 1;
            snprintf(s->cpu_why, sizeof(s->cpu_why), "%s", e.msg);
        } else {
            json_t *st = json_object_get(prof, "startTime"), *et = json_object_get(prof, "endTime");
            int64_t t0 = json_is_integer(st) ? json_integer_value(st) : 0;
            int64_t t1 = json_is_integer(et) ? json_integer_value(et) : 0, gap = 0;
            if (s->last_end_us >= 0 && t0 > s->last_end_us) gap = t0 - s->last_end_us;
            s->last_end_us = t1;
            s->gap_total_us += gap;
            s->win_gap_us += gap;
            if (gap > s->gap_max_us) s->gap_max_us = gap;
            p->period = ran * 1000;
            /* the always-on piece: the run itself at the always-on interval, else thinned */
            cp_profile *base_p = NULL;
            if (ran == base) {
                base_p = caps ? cp_profile_clone(p) : p;
            } else {
                json_t *thin = thin_profile(prof, base, &s->thin_us);
                if (!thin || cp_v8_cpu_profile(thin, base, &base_p, NULL, &e) != 0) {
                    s->cpu_failed = 1;
                    snprintf(s->cpu_why, sizeof(s->cpu_why), "thinning a capture's run: %.200s",
                             thin ? e.msg : "out of memory");
                }
                json_decref(thin);
            }
            if (!s->acc) s->acc = cp_merger_create();
            if (base_p && (!s->acc || cp_merger_add(s->acc, base_p, &e) != 0)) {
                s->cpu_failed = 1;
                snprintf(s->cpu_why, sizeof(s->cpu_why), "%s", s->acc ? e.msg : "out of memory");
            }
            if (base_p != p) cp_profile_destroy(base_p); /* the merger copies what it adds */
            for (int i = 0; i < CAP_SLOTS && p; i++) {
                if (!(caps & (1ULL << i)) || !S.caps[i].used) continue;
                caps &= ~(1ULL << i);
                char engine[320];
                cap_engine(&S.caps[i], ran, engine, sizeof(engine));
                cp_profile *one = caps ? cp_profile_clone(p) : p;
                if (!one) continue;
                if (one == p) p = NULL;
                emit_as(s, one, CP_KIND_CPU, s->run_start_ns, now, (uint64_t)(gap / ran),
                        S.caps[i].c.id, engine);
            }
        }
    }
    cp_profile_destroy(p);
    json_decref(r);
    if (!restart || s->gone) return;
    uint64_t want = caps_of(s, cp_now_ns());
    int64_t iv = interval_of(want);
    if (iv != s->run_interval_us &&
        call(s, "Profiler.setSamplingInterval", json_pack("{s:I}", "interval", (json_int_t)iv),
             NULL, &e) != 0) {
        cp_log_warn("v8: %s", e.msg);
        iv = s->run_interval_us; /* V8 keeps the last one */
        want = 0;
    }
    if (want && !s->run_caps)
        cp_log_info("v8: isolate %s: captured, CPU profiler at %lld us", s->isolate, (long long)iv);
    if (!want && s->run_caps)
        cp_log_info("v8: isolate %s: capture over, CPU profiler at %lld us", s->isolate,
                    (long long)iv);
    if (call(s, "Profiler.start", NULL, NULL, &e) != 0) cp_log_warn("v8: %s", e.msg);
    s->run_interval_us = iv;
    s->run_caps = want;
    s->run_start_ns = cp_now_ns();
}

/* Alloc captures: V8's heap sampler stays at --heap-interval (restarting it would drop
 * the isolate's in-use samples); the allocations it sampled since the last cut go to each
 * alloc capture matching s, one window per cut, saying ran=<heap-interval>. The first
 * cut of a capture only sets where its samples start. */
static void alloc_cycle(session *s, uint64_t want)
{
    int64_t now = cp_now_ns();
    cp_err e = {0};
    json_t *r = NULL;
    if (call(s, "HeapProfiler.getSamplingProfile", NULL, &r, &e) != 0) {
        cp_log_warn("v8: isolate %s: alloc capture window lost: %s", s->isolate, e.msg);
    } else {
        json_t *prof = json_object_get(r, "profile");
        map_frames(s, prof, 0);
        cp_profile *p = NULL;
        uint64_t mark = s->cap_mark;
        if (cp_v8_heap_profile(prof, S.o->heap_interval, 1, &mark, &p, &e) != 0) {
            cp_log_warn("v8: isolate %s: alloc capture window lost: %s", s->isolate, e.msg);
        } else {
            s->cap_mark = mark;
            uint64_t caps = s->alloc_caps;
            p->period = S.o->heap_interval;
            for (int i = 0; i < CAP_SLOTS && p; i++) {
                if (!(caps & (1ULL << i)) || !S.caps[i].used) continue;
                caps &= ~(1ULL << i);
                const v8cap *k = &S.caps[i];
                char engine[320];
                snprintf(engine, sizeof(engine), "v8-inspector capture asked=%lld ran=%lld%s%s",
                         (long long)k->c.alloc_rate, (long long)k->ran,
                         k->reason[0] ? " reason=" : "", k->reason);
                cp_profile *one = caps ? cp_profile_clone(p) : p;
                if (!one) continue;
                if (one == p) p = NULL;
                emit_as(s, one, CP_KIND_ALLOC, s->alloc_start_ns, now, 0, k->c.id, engine);
            }
            cp_profile_destroy(p);
        }
    }
    json_decref(r);
    if (want && !s->alloc_caps)
        cp_log_info("v8: isolate %s: alloc capture, heap sampler kept at %lld bytes", s->isolate,
                    (long long)S.o->heap_interval);
    s->alloc_caps = want;
    s->alloc_start_ns = now;
}

/* A heap snapshot of s, read as V8 streams it (model/heapsnap.h) into one window of kind
 * heap: for capture `capture` (NULL: the schedule's, --heap-snapshot-every). V8 pauses the
 * isolate while it writes the snapshot: the pause goes in the window's engine text and the
 * log, and is returned (-1 when no snapshot was taken). A snapshot over the parser's limit,
 * or one that fails, is logged naming the isolate, the capture and the cause. */
static int64_t heap_snapshot(session *s, const char *capture)
{
    char what[CP_CAPTURE_ID_MAX + 16];
    snprintf(what, sizeof(what), capture ? "for capture %s" : "(scheduled)", capture);
    cp_heapsnap_limits lim;
    cp_heapsnap_limits_default(&lim);
    if (S.o->heap_snapshot_max_mb > 0) lim.max_bytes = (uint64_t)S.o->heap_snapshot_max_mb << 20;
    lim.limit_name = "contprof v8 --heap-snapshot-max-mb";
    cp_err e = {0};
    cp_profile *p = cp_profile_create();
    if (!p || cp_heapsnap_create(&lim, &s->snap)) {
        cp_log_warn("v8: isolate %s: heap snapshot %s: out of memory", s->isolate, what);
        cp_profile_destroy(p);
        return -1;
    }
    s->snap_rc = 0;
    memset(&s->snap_err, 0, sizeof(s->snap_err));
    (void)call(s, "HeapProfiler.enable", NULL, NULL, NULL);
    int64_t start = cp_now_ns(), m0 = cp_mono_ns();
    json_t *params = json_pack("{s:b, s:b}", "reportProgress", 0, "captureNumericValue", 0);
    int rc = call_within(s, "HeapProfiler.takeHeapSnapshot", params, NULL, SNAPSHOT_TIMEOUT_MS, &e);
    int64_t pause_ms = (cp_mono_ns() - m0) / 1000000, end = cp_now_ns();
    cp_heapsnap_stats st = {0};
    if (!rc && s->snap_rc) {
        rc = s->snap_rc;
        e = s->snap_err;
    }
    if (!rc) rc = cp_heapsnap_finish(s->snap, p, &st, &e);
    cp_heapsnap_destroy(s->snap);
    s->snap = NULL;
    if (rc) {
        cp_log_warn("v8: isolate %s: heap snapshot for capture %s not taken: %s", s->isolate, what,
                    e.msg);
        cp_profile_destroy(p);
        return -1;
    }
    char engine[256];
    snprintf(engine, sizeof(engine), "v8-heap-snapshot pause_ms=%lld objects=%llu bytes=%llu%s",
             (long long)pause_ms, (unsigned long long)st.reachable,
             (unsigned long long)st.total_bytes, capture ? " capture asked=1 ran=1" : "");
    cp_log_info("v8: isolate %s: heap snapshot %s: %llu objects, %.1f MB, the "
                "isolate paused %lld ms, read with %.0f MiB",
                s->isolate, what, (unsigned long long)st.reachable, (double)st.total_bytes / 1e6,
                (long long)pause_ms, (double)st.held_bytes / (1 << 20));
    emit_as(s, p, CP_KIND_HEAP, start, end > start ? end : start + 1, 0, capture, engine);
    return pause_ms;
}

/* --heap-snapshot-every D: each isolate's snapshot every D, the first D after it attached,
 * and never more often than its last pause allows: a pause of P waits 100 P (the isolate
 * paused at most 1% of the time, the schedule's CPU budget). */
static void heap_schedule_tick(void)
{
    int64_t every = S.o->heap_snapshot_every_ns;
    if (every <= 0) return;
    for (int i = 0; i < S.nhosts; i++)
        for (conn *c = S.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next) {
                if (!s->started || s->gone) continue;
                int64_t now = cp_mono_ns();
                if (!s->snap_next_ns) s->snap_next_ns = now + every;
                if (now < s->snap_next_ns) continue;
                int64_t pause_ms = heap_snapshot(s, NULL);
                int64_t wait = pause_ms > 0 ? pause_ms * 100 * 1000000 : 0;
                s->snap_next_ns = cp_mono_ns() + (wait > every ? wait : every);
            }
}

/* Every loop: hears control messages, cuts capture windows (at most 1 s, the last at the
 * capture's end), switches isolates' runs as captures start and end. */
static void captures_tick(void)
{
    if (!S.brokers[0]) return;
    int64_t mono = cp_mono_ns();
    if (!S.watch && mono >= S.watch_retry_at) {
        cp_err e = {0};
        /* the control topic: this process is not a host, a consumer costs no host CPU */
        if (cp_watch_create(NULL, NULL, S.brokers, NULL, NULL, NULL, &S.watch, &e) != 0) {
            cp_log_warn("v8: no control consumer (captures not heard), retried in 5 s: %s", e.msg);
            S.watch_retry_at = mono + WATCH_RETRY_NS;
        }
    }
    if (S.watch) {
        (void)cp_watch_poll(S.watch, on_control, NULL);
        const char *last = NULL;
        uint64_t errs = cp_watch_take_errors(S.watch, &last);
        if (errs)
            cp_log_debug("v8: control consumer: %llu errors, last %s", (unsigned long long)errs,
                         last);
    }
    int64_t now = cp_now_ns();
    uint64_t live = 0;
    for (int i = 0; i < CAP_SLOTS; i++) {
        v8cap *k = &S.caps[i];
        if (k->used && !k->ended && k->c.end_ns <= now) k->ended = 1;
        if (k->used) live |= 1ULL << i;
    }
    if (!live) return;
    for (int i = 0; i < S.nhosts; i++)
        for (conn *c = S.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next) {
                if (!s->started || s->gone) continue;
                uint64_t want = caps_of(s, cp_now_ns());
                if (want != s->run_caps ||
                    (s->run_caps && cp_now_ns() - s->run_start_ns >= CAP_WINDOW_NS))
                    cpu_cycle(s, 1);
                want = s->heap_on ? caps_kind(s, cp_now_ns(), CP_KIND_ALLOC) : 0;
                if (!s->gone &&
                    (want != s->alloc_caps ||
                     (s->alloc_caps && cp_now_ns() - s->alloc_start_ns >= CAP_WINDOW_NS)))
                    alloc_cycle(s, want);
                /* heap captures: one snapshot each, the first time the isolate matches */
                want = caps_kind(s, cp_now_ns(), CP_KIND_HEAP) & ~s->heap_done;
                for (int b = 0; want && b < CAP_SLOTS && !s->gone; b++)
                    if (want & (1ULL << b)) {
                        s->heap_done |= 1ULL << b;
                        (void)heap_snapshot(s, S.caps[b].c.id);
                    }
            }
    /* ended captures whose last windows every isolate has sent are forgotten */
    for (int i = 0; i < CAP_SLOTS; i++) {
        v8cap *k = &S.caps[i];
        if (!k->used || !k->ended) continue;
        int held = 0;
        for (int h = 0; h < S.nhosts; h++)
            for (conn *c = S.hosts[h].conns; c; c = c->next)
                for (session *s = c->sessions; s; s = s->next)
                    held |= !s->gone && ((s->run_caps | s->alloc_caps) & (1ULL << i)) != 0;
        if (held) continue;
        /* a cancelled one is kept until its end: a repeated message does not restart it */
        if (k->c.end_ns > now) continue;
        cp_selector_close(&k->sel);
        cp_capture_close(&k->c);
        memset(k, 0, sizeof(*k));
        for (int h = 0; h < S.nhosts; h++) /* the slot may serve another heap capture */
            for (conn *c = S.hosts[h].conns; c; c = c->next)
                for (session *s = c->sessions; s; s = s->next)
                    s->heap_done &= ~(1ULL << i);
    }
}

/* Ends s's cpu window (the profiler restarted at once unless last): kept in s->pend until
 * weigh_pending gives it its CPU; a window lost is logged and counted. */
static void session_window_cpu(session *s, int last)
{
    int64_t end = cp_now_ns(), start = s->window_start_ns;
    s->pend_end = end;
    if (last && s->alloc_caps && !s->gone) alloc_cycle(s, 0); /* alloc captures' last windows */
    if (S.o->cpu_interval_us > 0) {
        cpu_cycle(s, !last);
        cp_profile *p = s->acc && !s->cpu_failed ? cp_merger_finish(s->acc) : NULL;
        if (!p) {
            log_lost(s, "cpu", start, end, s->cpu_failed ? s->cpu_why : "out of memory");
            s->dropped_windows++;
        } else {
            int64_t base = S.o->cpu_interval_us;
            s->windows++;
            char note[160];
            snprintf(note, sizeof(note),
                     "v8 CPU profiler restarted between windows: off for %lld us before this one",
                     (long long)s->win_gap_us);
            uint32_t sid;
            if (cp_profile_intern_cstr(p, note, &sid) == 0) (void)cp_vec_push(&p->comments, sid);
            p->period = base * 1000;
            /* the samples the gaps held, at the interval: reported as dropped, not hidden */
            s->pend = p;
            s->pend_start = start;
            s->pend_dropped = (uint64_t)(s->win_gap_us / base);
        }
        cp_merger_destroy(s->acc);
        s->acc = NULL;
        s->cpu_failed = 0;
        s->win_gap_us = 0;
    }
}

/* Ends the rest of s's window: the weighed cpu window emitted, the heap profiles. */
static void session_window_rest(session *s, int last)
{
    int64_t end = s->pend_end, start = s->window_start_ns;
    cp_err e = {0};
    json_t *r = NULL;
    int lost = 0;
    if (s->pend) {
        emit_as(s, s->pend, CP_KIND_CPU, s->pend_start, end, s->pend_dropped, NULL,
                s->pend_engine[0] ? s->pend_engine : NULL);
        s->pend = NULL;
        s->pend_engine[0] = 0;
    }
    if (s->heap_on) {
        if (call(s, "HeapProfiler.getSamplingProfile", NULL, &r, &e) == 0) {
            json_t *prof = json_object_get(r, "profile");
            cp_profile *inuse = NULL, *alloc = NULL;
            map_frames(s, prof, 0);
            uint64_t mark = s->watermark;
            if (cp_v8_heap_profile(prof, S.o->heap_interval, 0, NULL, &inuse, &e) == 0 &&
                cp_v8_heap_profile(prof, S.o->heap_interval, 1, &mark, &alloc, &e) == 0) {
                s->watermark = mark;
                emit(s, alloc, CP_KIND_ALLOC, start, end, 0);
                emit(s, inuse, CP_KIND_INUSE, start, end, 0);
            } else {
                cp_profile_destroy(inuse);
                log_lost(s, "alloc and inuse", start, end, e.msg);
                lost += 2;
            }
            json_decref(r);
        } else {
            log_lost(s, "alloc and inuse", start, end, e.msg);
            lost += 2;
        }
    }
    s->dropped_windows += (uint64_t)lost;
    if (last && !s->gone) {
        /* leave the isolate as we found it, whatever the host does when the socket closes
         * (V8 would disable them with the session) */
        if (s->heap_on) (void)call(s, "HeapProfiler.stopSampling", NULL, NULL, NULL);
        if (!S.o->no_source_maps) (void)call(s, "Debugger.disable", NULL, NULL, NULL);
        if (S.o->cpu_interval_us > 0) (void)call(s, "Profiler.disable", NULL, NULL, NULL);
    }
    s->window_start_ns = end;
}

/* Ends the windows of every started session (of conn c only, if not NULL) together: the
 * cpu windows first, so that isolates sharing a thread split the CPU read at one time. */
static void windows_end(conn *only, int last)
{
    CP_VEC(session *) v = {0};
    for (int i = 0; i < S.nhosts; i++)
        for (conn *c = S.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next)
                if ((!only || c == only) && s->started && !s->gone && cp_vec_push(&v, s) == 0)
                    session_window_cpu(s, last);
    weigh_pending(v.v, v.n);
    for (uint32_t i = 0; i < v.n; i++)
        session_window_rest(v.v[i], last);
    free(v.v);
}

static void session_report(const session *s)
{
    cp_log_info("v8: isolate %s: %lld windows, CPU profiler off between windows %lld us in "
                "all (at most %lld us once), %llu lost windows left for a later envelope",
                s->isolate, (long long)s->windows, (long long)s->gap_total_us,
                (long long)s->gap_max_us, (unsigned long long)s->dropped_windows);
}

/* ------------------------------------------------------------------------------------
 * Discovery: /json/list of every host, a connection per target. */

static void conn_free(conn *c)
{
    while (c->sessions) {
        session *s = c->sessions;
        c->sessions = s->next;
        session_free(s);
    }
    for (uint32_t i = 0; i < c->tx.n; i++)
        free(c->tx.v[i].buf);
    free(c->tx.v);
    for (uint32_t i = 0; i < c->attaches.n; i++) {
        free(c->attaches.v[i].sid);
        free(c->attaches.v[i].title);
    }
    free(c->attaches.v);
    cp_buf_close(&c->rx);
    free(c);
}

static void discover(host *h)
{
    cp_http_result res;
    cp_err e = {0};
    char base[200];
    snprintf(base, sizeof(base), "http://%s", h->hostport);
    int64_t now = cp_mono_ns();
    if (cp_http_get(base, "/json/list", NULL, 1000, 16u << 20, &res, &e) != 0 ||
        res.status != 200) {
        if (h->answering || !h->backoff_ns)
            cp_log_info("v8: inspector %s not answering: %s", h->hostport,
                        e.msg[0] ? e.msg : "status not 200");
        if (!e.msg[0]) cp_buf_close(&res.body);
        h->answering = 0;
        h->backoff_ns = h->backoff_ns ? h->backoff_ns * 2 : BACKOFF_MIN_NS;
        if (h->backoff_ns > BACKOFF_MAX_NS) h->backoff_ns = BACKOFF_MAX_NS;
        h->next_poll = now + h->backoff_ns;
        for (conn *c = h->conns; c; c = c->next)
            c->listed = 0;
        return;
    }
    h->answering = h->seen = 1;
    h->backoff_ns = 0;
    h->next_poll = now + POLL_NS;
    cp_v8_target *tv = NULL;
    size_t nt = 0;
    int rc = cp_v8_targets_parse((const char *)res.body.data, res.body.len, &tv, &nt, &e);
    cp_buf_close(&res.body);
    if (rc) {
        cp_log_warn("v8: inspector %s: %s", h->hostport, e.msg);
        return;
    }
    for (conn *c = h->conns; c; c = c->next)
        c->listed = 0;
    for (size_t i = 0; i < nt; i++) {
        const cp_v8_target *t = &tv[i];
        conn *c = h->conns;
        while (c && strcmp(c->target, t->id))
            c = c->next;
        if (c) {
            c->listed = 1;
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (!c) continue;
        c->h = h;
        c->listed = 1;
        snprintf(c->target, sizeof(c->target), "%s", t->id);
        snprintf(c->title, sizeof(c->title), "%s", t->title);
        snprintf(c->path, sizeof(c->path), "%s", t->path);
        c->outer_id = INT64_C(1) << 30; /* node wants 32-bit ids; ours count from 1 */
        c->next = h->conns;
        h->conns = c;
        cp_log_info("v8: %s: target %s (%s)", h->hostport, t->id, c->title);
    }
    free(tv);
}

static void connect_conn(conn *c)
{
    struct lws_client_connect_info i;
    memset(&i, 0, sizeof(i));
    i.context = S.ctx;
    i.address = c->h->addr;
    i.port = c->h->port;
    i.path = c->path;
    i.host = c->h->hostport;
    i.local_protocol_name = "cdp";
    i.userdata = c;
    i.pwsi = &c->wsi;
    c->state = C_CONNECTING;
    if (!lws_client_connect_via_info(&i)) {
        c->wsi = NULL;
        conn_closed(c, "connection refused by libwebsockets");
    }
}

/* Keeps s's unreported losses for the next session of its name (or, with no room, for
 * the final count). */
static void note_lost(host *h, const session *s)
{
    size_t n = sizeof(h->lost) / sizeof(h->lost[0]), free_at = n;
    for (size_t i = 0; i < n; i++) {
        if (h->lost[i].windows && !strcmp(h->lost[i].isolate, s->isolate)) {
            h->lost[i].windows += s->dropped_windows;
            return;
        }
        if (!h->lost[i].windows && free_at == n) free_at = i;
    }
    if (free_at == n) {
        S.dropped_windows += s->dropped_windows;
        return;
    }
    snprintf(h->lost[free_at].isolate, sizeof(h->lost[free_at].isolate), "%s", s->isolate);
    h->lost[free_at].windows = s->dropped_windows;
}

/* Before the last windows: what no later session of the same name will report rides on
 * them instead. */
static void flush_lost(host *h)
{
    for (size_t i = 0; i < sizeof(h->lost) / sizeof(h->lost[0]); i++) {
        S.dropped_windows += h->lost[i].windows;
        h->lost[i].windows = 0;
    }
}

/* Reaps sessions that are gone, starts new ones, connects and drops targets. */
static void maintain(host *h)
{
    int64_t now = cp_mono_ns();
    for (conn **cp = &h->conns; *cp;) {
        conn *c = *cp;
        for (session **sp = &c->sessions; *sp;) {
            session *s = *sp;
            if (s->gone) {
                if (s->started) {
                    log_lost(s, "every", s->window_start_ns, cp_now_ns(),
                             "the isolate is gone (counted in the dropped_windows of the "
                             "next envelope)");
                    s->dropped_windows += (uint64_t)kinds_of(s);
                    if (s->run_caps | s->alloc_caps) {
                        log_lost(s, "capture", s->run_caps ? s->run_start_ns : s->alloc_start_ns,
                                 cp_now_ns(), "the isolate is gone during a capture (counted)");
                        s->dropped_windows++;
                    }
                    session_report(s);
                    note_lost(h, s);
                }
                *sp = s->next;
                session_free(s);
            } else {
                sp = &s->next;
            }
        }
        if ((c->state == C_CLOSED || c->state == C_IDLE) && !c->listed &&
            c->state != C_CONNECTING) {
            *cp = c->next;
            conn_free(c);
            continue;
        }
        if ((c->state == C_IDLE || c->state == C_CLOSED) && c->listed && !c->closing &&
            now >= c->retry_at)
            connect_conn(c);
        if (c->state == C_OPEN && c->finishing && !c->closing) {
            /* the isolates still exist: their last windows are taken, then we leave */
            flush_lost(h);
            windows_end(c, 1);
            for (session *s = c->sessions; s; s = s->next) {
                if (s->started) session_report(s);
                s->started = 0;
            }
            cp_log_info("v8: %s target %s finished: last windows taken, disconnecting", h->hostport,
                        c->target);
            c->closing = 1;
            if (c->wsi) lws_callback_on_writable(c->wsi);
        }
        if (c->state == C_OPEN && !c->sessions && !c->closing) {
            char iso[128];
            cp_v8_isolate_of(c->title, iso, sizeof(iso));
            session *s = session_new(c, NULL, iso);
            if (s && session_start(s) != 0) s->gone = 1;
        }
        while (c->state == C_OPEN && c->attaches.n) {
            attach a = c->attaches.v[--c->attaches.n];
            session *s = session_new(c, a.sid, a.title);
            if (s && session_start(s) != 0) s->gone = 1;
            free(a.sid);
            free(a.title);
        }
        cp = &(*cp)->next;
    }
}

/* ------------------------------------------------------------------------------------
 * The loop. */

static int parse_inspector(host *h, const char *spec, int allow_remote, cp_err *err)
{
    const char *colon = strrchr(spec, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == spec || *end || port <= 0 || port > 65535 ||
        (size_t)(colon - spec) >= sizeof(h->addr))
        return cp_err_set(err, CP_EINVAL, "--inspector %s: not HOST:PORT", spec);
    memset(h, 0, sizeof(*h));
    snprintf(h->addr, sizeof(h->addr), "%.*s", (int)(colon - spec), spec);
    h->port = (int)port;
    snprintf(h->hostport, sizeof(h->hostport), "%s:%d", h->addr, h->port);
    if (!allow_remote && strncmp(h->addr, "127.", 4) && strcmp(h->addr, "localhost") &&
        strcmp(h->addr, "::1") && strcmp(h->addr, "[::1]"))
        return cp_err_set(err, CP_EINVAL,
                          "--inspector %s: not a loopback address (an inspector runs code for "
                          "whoever reaches it; --allow-remote to insist)",
                          spec);
    return 0;
}

int cp_v8_run(const cp_v8_options *o, cp_err *err)
{
    int rc = 0;
    memset(&S, 0, sizeof(S));
    S.o = o;
    if (!o->service || !o->service[0]) return cp_err_set(err, CP_EINVAL, "--service is required");
    if (o->ninspectors <= 0) return cp_err_set(err, CP_EINVAL, "no --inspector given");
    if (o->window_ns <= 0 || o->cpu_interval_us < 0 || o->heap_interval < 0 ||
        (!o->cpu_interval_us && !o->heap_interval))
        return cp_err_set(err, CP_EINVAL,
                          "the window must be > 0, and the CPU or the heap "
                          "interval too (0 turns one profiler off)");
    gethostname(S.hostname, sizeof(S.hostname) - 1);
    snprintf(S.producer, sizeof(S.producer), "%s:%d:v8", S.hostname, (int)getpid());
    for (int i = 0; i < o->ninspectors && i < CP_V8_MAX_HOSTS; i++) {
        if ((rc = parse_inspector(&S.hosts[i], o->inspectors[i], o->allow_remote, err))) return rc;
        host *h = &S.hosts[i];
        if (o->instance && o->instance[0])
            snprintf(h->instance, sizeof(h->instance), "%s", o->instance);
        else
            snprintf(h->instance, sizeof(h->instance), "%s:%d", S.hostname, h->port);
        S.nhosts++;
    }
    if (o->output_dir && o->output_dir[0]) mkdir(o->output_dir, 0755);
    /* Where windows go, as the agent's: the relay named, else the server's when it runs on
     * this host, else Kafka (brokers given or the server's, asked again when they stay
     * unreachable: a restarted contprofd may have them on a new port). */
    char brokers[1024] = "", relay[1024] = "";
    if (o->relay_dir && o->relay_dir[0]) snprintf(relay, sizeof(relay), "%s", o->relay_dir);
    if (o->brokers && o->brokers[0])
        snprintf(brokers, sizeof(brokers), "%s", o->brokers);
    else if (o->server && o->server[0] &&
             (rc = cp_http_get_transport(o->server, o->token, brokers, sizeof(brokers),
                                         relay[0] ? NULL : relay, sizeof(relay), 5000, err)))
        return rc;
    if (relay[0] && !cp_relay_listening(relay) && !(o->relay_dir && o->relay_dir[0]))
        relay[0] = 0; /* the server's relay is another host's */
    if (brokers[0] && !o->no_captures) snprintf(S.brokers, sizeof(S.brokers), "%s", brokers);
    if (!brokers[0] && !relay[0] && !(o->output_dir && o->output_dir[0]))
        return cp_err_set(err, CP_EINVAL,
                          "nowhere to send windows: --output-dir, --server, --relay or "
                          "--brokers");
    cp_sink_options so = {
        .relay_dir = relay,
        .brokers = brokers,
        .server = o->server,
        .token = o->token,
        .topic = o->topic,
        .kafka_queue = 10000,
    };
    if ((brokers[0] || relay[0]) && (rc = cp_sink_create(&so, &S.sink, err))) return rc;

    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info ci;
    memset(&ci, 0, sizeof(ci));
    ci.port = CONTEXT_PORT_NO_LISTEN;
    ci.protocols = protocols;
    ci.gid = -1;
    ci.uid = -1;
    S.ctx = lws_create_context(&ci);
    if (!S.ctx) {
        cp_sink_destroy(S.sink, 0);
        S.sink = NULL;
        return cp_err_set(err, CP_ENOMEM, "libwebsockets: cannot create a context");
    }
    lws_sul_schedule(S.ctx, 0, &S.tick, tick_cb, 20 * LWS_US_PER_MS);

    int64_t next_window = cp_now_ns() + o->window_ns;
    while (!*o->stop) {
        int64_t now = cp_mono_ns();
        int gone = 1;
        for (int i = 0; i < S.nhosts; i++) {
            host *h = &S.hosts[i];
            if (now >= h->next_poll) discover(h);
            maintain(h);
            if (!h->seen || h->answering || h->conns) gone = 0;
        }
        if (cp_now_ns() >= next_window) {
            windows_end(NULL, 0);
            next_window += o->window_ns;
            if (next_window < cp_now_ns()) next_window = cp_now_ns() + o->window_ns;
        }
        if (S.sink) {
            cp_sink_tick(S.sink);
            uint64_t kd = cp_sink_take_dropped(S.sink);
            if (kd)
                cp_log_warn("v8: %llu windows lost on the way (Kafka's backlog full or refused by "
                            "the broker, the relay's spool full): counted in the next envelope",
                            (unsigned long long)kd);
            S.dropped_windows += kd;
        }
        captures_tick();
        heap_schedule_tick();
        if (o->exit_when_gone && gone) {
            cp_log_info("v8: every inspector is gone: stopping");
            break;
        }
        lws_service(S.ctx, 0);
    }
    /* the last window of every isolate still attached */
    for (int i = 0; i < S.nhosts; i++)
        flush_lost(&S.hosts[i]);
    windows_end(NULL, 1);
    for (int i = 0; i < S.nhosts; i++)
        for (conn *c = S.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next)
                if (s->started) session_report(s);
    for (int i = 0; i < S.nhosts; i++)
        flush_lost(&S.hosts[i]);
    cp_watch_destroy(S.watch);
    S.watch = NULL;
    if (S.ctl_bad + S.ctl_foreign + S.ctl_badsig + S.ctl_expired + S.ctl_full)
        cp_log_info("v8: control messages ignored: %llu undecodable, %llu other tenants, %llu "
                    "badly signed, %llu ended or cancelled, %llu over %d captures",
                    (unsigned long long)S.ctl_bad, (unsigned long long)S.ctl_foreign,
                    (unsigned long long)S.ctl_badsig, (unsigned long long)S.ctl_expired,
                    (unsigned long long)S.ctl_full, CAP_SLOTS);
    for (int i = 0; i < CAP_SLOTS; i++) {
        cp_selector_close(&S.caps[i].sel);
        cp_capture_close(&S.caps[i].c);
    }
    S.dropped_windows += cp_sink_destroy(S.sink, 5 * (int64_t)1000000000);
    S.sink = NULL;
    if (S.dropped_windows)
        cp_log_warn("v8: %llu windows lost and not reported in any envelope (isolates gone "
                    "for good, transport)",
                    (unsigned long long)S.dropped_windows);
    lws_sul_cancel(&S.tick);
    lws_context_destroy(S.ctx); /* its callbacks still see the connections */
    for (int i = 0; i < S.nhosts; i++)
        while (S.hosts[i].conns) {
            conn *c = S.hosts[i].conns;
            S.hosts[i].conns = c->next;
            conn_free(c);
        }
    return 0;
}
