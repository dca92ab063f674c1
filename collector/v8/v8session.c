/* The V8 source's isolate sessions: one per isolate (a target, or a Node worker reached
 * through it), its profilers started, its source maps, each window's profiler runs and
 * heap reads, and its end (gone, finished, or the source stopping). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "log.h"
#include "times.h"
#include "v8conv.h"
#include "v8cpu.h"
#include "v8source_int.h"

/* a heap snapshot: V8 writes ~150 ms per MB of heap under load (bench/v8/heapsnap.sh) */
#define SNAPSHOT_TIMEOUT_MS 120000
#define MAX_MAPS 256                     /* source-mapped scripts per isolate */
#define MAX_MAP_BYTES ((size_t)64 << 20) /* their maps' JSON, per isolate */

/* ------------------------------------------------------------------------------------
 * Sessions: their state, starting the profilers. */

static const char *const state_names[] = {"starting", "running", "done", "lost", "gone"};

/* The diagram's edges (v8source_int.h), a bit per state reached from each state. */
#define EDGE(to) (1u << (to))
static const unsigned legal_edges[] = {
    [SESSION_STARTING] = EDGE(SESSION_RUNNING) | EDGE(SESSION_GONE),
    [SESSION_RUNNING] = EDGE(SESSION_DONE) | EDGE(SESSION_LOST),
    [SESSION_DONE] = EDGE(SESSION_GONE),
    [SESSION_LOST] = 0,
    [SESSION_GONE] = 0,
};

void cp_v8_session_set(session *s, session_state to, const char *why)
{
    CP_ASSERT(legal_edges[s->state] & EDGE(to));
    /* a callback only marks sessions gone (the callback rule) */
    CP_ASSERT(!cp_v8_in_callback() || to == SESSION_LOST || to == SESSION_GONE);
    cp_log_debug("v8: isolate %s: session %s -> %s (%s)", s->isolate, state_names[s->state],
                 state_names[to], why);
    s->state = to;
}

void cp_v8_session_gone(session *s, const char *why)
{
    if (s->state == SESSION_RUNNING)
        cp_v8_session_set(s, SESSION_LOST, why);
    else if (s->state == SESSION_STARTING || s->state == SESSION_DONE)
        cp_v8_session_set(s, SESSION_GONE, why);
}

static session *session_new(conn *c, const char *sid, const char *isolate)
{
    session *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    if (sid && !(s->sid = strdup(sid))) {
        free(s);
        return NULL;
    }
    s->c = c;
    s->state = SESSION_STARTING;
    snprintf(s->isolate, sizeof(s->isolate), "%s", isolate);
    s->token = ++cp_v8src.next_token;
    snprintf(s->producer, sizeof(s->producer), "%s:%llx", cp_v8src.producer,
             (unsigned long long)s->token);
    for (size_t i = 0; i < sizeof(c->h->lost) / sizeof(c->h->lost[0]); i++)
        if (c->h->lost[i].windows && !strcmp(c->h->lost[i].isolate, s->isolate)) {
            s->dropped_windows = c->h->lost[i].windows;
            c->h->lost[i].windows = 0;
        }
    s->last_end_us = -1;
    s->next_id = 0;
    s->run_interval_us = cp_v8src.o->cpu_interval_us;
    snprintf(s->cap_producer, sizeof(s->cap_producer), "%s/capture", s->producer);
    /* appended: the target's own session stays first */
    session **at = &c->sessions;
    while (*at)
        at = &(*at)->next;
    *at = s;
    return s;
}

static int scripts_read(session *s, cp_err *e);

void cp_v8_session_free(session *s)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    cp_heapsnap_destroy(s->snap);
    for (uint32_t i = 0; i < s->maps.n; i++) {
        free(s->maps.v[i].script_id);
        cp_v8_smap_destroy(s->maps.v[i].map);
    }
    free(s->maps.v);
    free(s->scripts_seen.v);
    cp_merger_destroy(s->acc);
    cp_profile_destroy(s->pend);
    cp_json_free(s->reply);
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
    if (!cp_v8_loopback(c->h->addr)) return;
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
    cp_json *r = NULL;
    int pid = 0, tid = 0;
    const char *q = "{\"expression\":\"require('fs').readlinkSync('/proc/thread-self')\","
                    "\"includeCommandLineAPI\":true,\"silent\":true}";
    cp_err e = {0};
    char how[300] = "told by the isolate";
    if (cp_v8_call(s, "Runtime.evaluate", q, &r, &e) == 0) {
        const cp_json *res = cp_json_get(r, "result");
        const char *v = cp_v8_jstr(res, "value"), *d = cp_v8_jstr(res, "description");
        if (!v || cp_v8_thread_self_parse(v, &pid, &tid, NULL) != 0 || pid != s->pid) {
            snprintf(how, sizeof(how), "not told (%.120s)", v ? v : d ? d : "no value");
            pid = tid = 0;
        }
    } else {
        snprintf(how, sizeof(how), "not told (%.200s)", e.msg);
    }
    cp_json_free(r);
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
    char iv[64], hp[64];
    snprintf(iv, sizeof(iv), "{\"interval\":%lld}", (long long)cp_v8src.o->cpu_interval_us);
    snprintf(hp, sizeof(hp), "{\"samplingInterval\":%lld}", (long long)cp_v8src.o->heap_interval);
    if (cp_v8src.o->cpu_interval_us > 0 &&
        ((rc = cp_v8_call(s, "Profiler.enable", NULL, NULL, &e)) ||
         (rc = cp_v8_call(s, "Profiler.setSamplingInterval", iv, NULL, &e)) ||
         (rc = cp_v8_profiler_start(s, &e)))) {
        cp_log_warn("v8: %s", e.msg);
        return rc;
    }
    if (cp_v8src.o->heap_interval <= 0) {
        /* heap profiles off */
    } else if (cp_v8_call(s, "HeapProfiler.startSampling", hp, NULL, &e) != 0) {
        /* a sampler left running by an earlier session of ours: restart it */
        (void)cp_v8_call(s, "HeapProfiler.stopSampling", NULL, NULL, NULL);
        if (cp_v8_call(s, "HeapProfiler.startSampling", hp, NULL, &e) != 0)
            cp_log_warn("v8: isolate %s: no heap profile: %s", s->isolate, e.msg);
        else
            s->heap_on = 1;
    } else {
        s->heap_on = 1;
    }
    /* source maps: Debugger.scriptParsed names each script's map (the scripts already
     * there come before enable's reply); pauses are skipped so that a `debugger`
     * statement or node's --inspect-brk never stops the host for us */
    if (!cp_v8src.o->no_source_maps && scripts_read(s, &e) != 0)
        cp_log_warn("v8: isolate %s: no source maps: %s", s->isolate, e.msg);
    session_thread_guess(s);
    s->window_start_ns = s->run_start_ns = cp_now_ns();
    /* (a session gone during the calls above is GONE: it never ran a window) */
    if (s->state == SESSION_STARTING) cp_v8_session_set(s, SESSION_RUNNING, "profilers on");
    if (!s->sid) { /* node: follow its workers, each held until its profilers run */
        (void)cp_v8_call(s, "NodeWorker.enable", "{\"waitForDebuggerOnStart\":true}", NULL, NULL);
        /* and be told when it has run its last line: it then waits for us to go */
        (void)cp_v8_call(s, "NodeRuntime.notifyWhenWaitingForDisconnect", "{\"enabled\":true}",
                         NULL, NULL);
    }
    (void)cp_v8_call(s, "Runtime.runIfWaitingForDebugger", NULL, NULL, NULL);
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
    return (cp_v8src.o->cpu_interval_us > 0) + 2 * (s->heap_on != 0);
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
    if ((!path[0] || stat(path, &st) != 0) && cp_v8src.o->source_map_dir &&
        cp_v8src.o->source_map_dir[0]) {
        const char *base = strrchr(rel, '/');
        snprintf(path, sizeof(path), "%s/%s", cp_v8src.o->source_map_dir, base ? base + 1 : rel);
    }
    if (!path[0]) return cp_err_set(e, CP_EINVAL, "%.200s: no file to read it from", map_url);
    if (stat(path, &st) != 0) return cp_err_set(e, CP_EIO, "%s: %s", path, strerror(errno));
    if ((size_t)st.st_size > CP_V8_SMAP_MAX_BYTES)
        return cp_err_set(e, CP_ELIMIT, "%s: over %zu MiB", path, CP_V8_SMAP_MAX_BYTES >> 20);
    return cp_read_file(path, out, e);
}

/* ---- scripts, read on demand ------------------------------------------------------
 * Source maps are named by Debugger.scriptParsed. An enabled Debugger domain costs the
 * host (workerd per request at 10 ms: ~1.3%, bench/v8/run.sh), so it is on only while
 * scripts are read: at the start, and when a profile has a frame of a script not reported
 * yet (V8 replays scriptParsed for every script at each enable). */

#define SCRIPTS_SEEN_MAX (1u << 20) /* script ids kept in the bitset; past it: always on */

/* The script id as a bitset index, or -1 (not a decimal number within the bound). */
static int64_t script_index(const char *id)
{
    uint64_t v = 0;
    if (!id[0]) return -1;
    for (const char *p = id; *p; p++) {
        if (*p < '0' || *p > '9' || v >= SCRIPTS_SEEN_MAX) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    return v < SCRIPTS_SEEN_MAX ? (int64_t)v : -1;
}

/* Marks id reported; returns 1 if it was already. An id that cannot be kept sets
 * dbg_always (the domain stays on from the next read) and counts as new. */
static int script_mark(session *s, const char *id)
{
    int64_t i = script_index(id);
    size_t w = (size_t)i / 64;
    if (i < 0 || (w >= s->scripts_seen.n && cp_vec_reserve(&s->scripts_seen, w + 1) != 0)) {
        s->dbg_always = 1;
        return 0;
    }
    while (s->scripts_seen.n <= w)
        s->scripts_seen.v[s->scripts_seen.n++] = 0;
    uint64_t bit = (uint64_t)1 << (i % 64);
    int had = (s->scripts_seen.v[w] & bit) != 0;
    s->scripts_seen.v[w] |= bit;
    return had;
}

static int script_seen(const session *s, const char *id)
{
    int64_t i = script_index(id);
    if (i < 0) return 0;
    size_t w = (size_t)i / 64;
    return w < s->scripts_seen.n && (s->scripts_seen.v[w] >> (i % 64) & 1);
}

/* Debugger on (its scriptParsed for each script arrive before the reply), pauses skipped
 * so that a `debugger` statement never stops the host for us, then off again unless
 * dbg_always. */
static int scripts_read(session *s, cp_err *e)
{
    if (!s->dbg_on) {
        if (cp_v8_call(s, "Debugger.enable", NULL, NULL, e) != 0) return -1;
        s->dbg_on = 1;
        if (cp_v8_call(s, "Debugger.setSkipAllPauses", "{\"skip\":true}", NULL, e) != 0) return -1;
    }
    if (s->dbg_always) return 0;
    if (cp_v8_call(s, "Debugger.disable", NULL, NULL, e) != 0) return -1;
    s->dbg_on = 0;
    return 0;
}

/* The script id of node's callFrame if it names a script (V8's own entries say "0"). */
static const char *frame_script(const cp_json *node)
{
    const char *id = cp_v8_jstr(cp_json_get(node, "callFrame"), "scriptId");
    return id && strcmp(id, "0") ? id : NULL;
}

/* Over the frames under node (a CPU profile's nodes, or a heap profile's tree): with mark,
 * marks each script id reported and returns 0; else returns 1 at the first id not
 * reported yet. */
static int scan_scripts(session *s, const cp_json *node, int depth, int mark)
{
    if (depth > 100000) return 0;
    const cp_json *nodes = cp_json_get(node, "nodes");
    if (cp_json_is(nodes, CP_JSON_ARRAY)) {
        for (size_t i = 0; i < cp_json_len(nodes); i++) {
            const char *id = frame_script(cp_json_at(nodes, i));
            if (id && mark) (void)script_mark(s, id);
            if (id && !mark && !script_seen(s, id)) return 1;
        }
        return 0;
    }
    const cp_json *head = cp_json_get(node, "head");
    if (head && !depth) node = head;
    const char *id = frame_script(node);
    if (id && mark) (void)script_mark(s, id);
    if (id && !mark && !script_seen(s, id)) return 1;
    const cp_json *ch = cp_json_get(node, "children");
    for (size_t i = 0; cp_json_is(ch, CP_JSON_ARRAY) && i < cp_json_len(ch); i++)
        if (scan_scripts(s, cp_json_at(ch, i), depth + 1, mark)) return 1;
    return 0;
}

static void map_frames(const session *s, cp_json *node, int depth);

/* o's member key, to edit in place (o is the caller's tree). */
static cp_json *member(cp_json *o, const char *key)
{
    return (cp_json *)cp_json_get(o, key);
}

void cp_v8_map_profile(session *s, cp_json *prof)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    if (!prof || cp_v8src.o->no_source_maps) return;
    if (!(s->dbg_on && s->dbg_always) && scan_scripts(s, prof, 0, 0)) {
        cp_err e = {0};
        if (scripts_read(s, &e) != 0)
            cp_log_warn("v8: isolate %s: scripts not read (source maps of new scripts not "
                        "used): %s",
                        s->isolate, e.msg);
        (void)scan_scripts(s, prof, 0, 1); /* one V8 never reports is not asked again */
    }
    map_frames(s, prof, 0);
}

/* Debugger.scriptParsed: reads the script's source map, if it names one. */
void cp_v8_script_parsed(session *s, const cp_json *params)
{
    const char *id = cp_v8_jstr(params, "scriptId"), *url = cp_v8_jstr(params, "url");
    const char *map_url = cp_v8_jstr(params, "sourceMapURL");
    if (!id || script_mark(s, id)) return; /* known: replayed by a later enable */
    if (!map_url || !map_url[0]) return;
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

static const cp_v8_smap *map_of(const session *s, const cp_json *frame)
{
    const char *id = cp_v8_jstr(frame, "scriptId");
    if (!id) return NULL;
    for (uint32_t i = 0; i < s->maps.n; i++)
        if (!strcmp(s->maps.v[i].script_id, id)) return s->maps.v[i].map;
    return NULL;
}

/* Maps every callFrame of a CPU profile's nodes or a heap profile's tree (from node). */
static void map_frames(const session *s, cp_json *node, int depth)
{
    if (!s->maps.n || depth > 100000) return;
    cp_json *nodes = member(node, "nodes");
    if (cp_json_is(nodes, CP_JSON_ARRAY)) { /* a CPU profile: a flat list */
        for (size_t i = 0; i < cp_json_len(nodes); i++) {
            cp_json *nd = nodes->items[i], *cf = member(nd, "callFrame");
            const cp_v8_smap *m = cp_json_is(cf, CP_JSON_OBJECT) ? map_of(s, cf) : NULL;
            if (!m) continue;
            (void)cp_v8_smap_apply(m, cf);
            /* its line ticks count lines of the generated script, not of the source the
             * frame now names: the frame keeps its own line alone */
            cp_json_free(cp_json_take(nd, "positionTicks"));
        }
        return;
    }
    /* a heap profile: head, then children (the parser bounds the depth) */
    cp_json *head = member(node, "head");
    if (head && !depth) node = head;
    cp_json *cf = member(node, "callFrame");
    const cp_v8_smap *m = cp_json_is(cf, CP_JSON_OBJECT) ? map_of(s, cf) : NULL;
    if (m) (void)cp_v8_smap_apply(m, cf);
    cp_json *ch = member(node, "children");
    for (size_t i = 0; i < cp_json_len(ch); i++)
        map_frames(s, ch->items[i], depth + 1);
}

/* ------------------------------------------------------------------------------------
 * The profilers' runs: the CPU profiler's (always-on and captures), alloc captures' cuts, heap
 * snapshots. */

/* Ends the CPU profiler's run in progress: its samples go to the captures it served (one
 * capture window each) and to the always-on window's pieces (thinned when it ran finer).
 * With restart, a new run starts at the interval the captures matching s now want. A run
 * that cannot be read marks the always-on window lost. */
void cp_v8_cpu_cycle(session *s, int restart)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    if (cp_v8src.o->cpu_interval_us <= 0) return;
    int64_t now = cp_now_ns(), base = cp_v8src.o->cpu_interval_us, ran = s->run_interval_us;
    uint64_t caps = s->run_caps;
    cp_err e = {0};
    cp_json *r = NULL;
    cp_profile *p = NULL;
    cp_v8_profiler_cost(s);
    if (cp_v8_call(s, "Profiler.stop", NULL, &r, &e) != 0) {
        s->cpu_failed = 1;
        snprintf(s->cpu_why, sizeof(s->cpu_why), "%s", e.msg);
    } else {
        cp_json *prof = member(r, "profile");
        cp_v8_map_profile(s, prof);
        if (cp_v8_cpu_profile(prof, ran, &p, NULL, &e) != 0) {
            s->cpu_failed = 1;
            snprintf(s->cpu_why, sizeof(s->cpu_why), "%s", e.msg);
        } else {
            const cp_json *st = cp_json_get(prof, "startTime"), *et = cp_json_get(prof, "endTime");
            int64_t t0 = cp_json_is_int(st) ? st->i64 : 0;
            int64_t t1 = cp_json_is_int(et) ? et->i64 : 0, gap = 0;
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
                cp_json *thin = cp_v8_thin_profile(prof, base, &s->thin_us);
                if (!thin || cp_v8_cpu_profile(thin, base, &base_p, NULL, &e) != 0) {
                    s->cpu_failed = 1;
                    snprintf(s->cpu_why, sizeof(s->cpu_why), "thinning a capture's run: %.200s",
                             thin ? e.msg : "out of memory");
                }
                cp_json_free(thin);
            }
            if (!s->acc) s->acc = cp_merger_create();
            if (base_p && (!s->acc || cp_merger_add(s->acc, base_p, &e) != 0)) {
                s->cpu_failed = 1;
                snprintf(s->cpu_why, sizeof(s->cpu_why), "%s", s->acc ? e.msg : "out of memory");
            }
            if (base_p != p) cp_profile_destroy(base_p); /* the merger copies what it adds */
            for (int i = 0; i < CAP_SLOTS && p; i++) {
                if (!(caps & (1ULL << i)) || !cp_v8src.caps[i].s.used) continue;
                caps &= ~(1ULL << i);
                char engine[320];
                cp_v8_cap_engine(&cp_v8src.caps[i], s, ran, engine, sizeof(engine));
                cp_profile *one = caps ? cp_profile_clone(p) : p;
                if (!one) continue;
                if (one == p) p = NULL;
                cp_v8_emit_as(s, one, CP_KIND_CPU, s->run_start_ns, now, (uint64_t)(gap / ran),
                              cp_v8src.caps[i].s.c.id, engine);
            }
        }
    }
    cp_profile_destroy(p);
    cp_json_free(r);
    if (!restart || !cp_v8_session_alive(s)) return;
    uint64_t want = cp_v8_caps_of(s, cp_now_ns());
    int64_t iv = cp_v8_interval_of(want);
    char ivt[64];
    snprintf(ivt, sizeof(ivt), "{\"interval\":%lld}", (long long)iv);
    if (iv != s->run_interval_us &&
        cp_v8_call(s, "Profiler.setSamplingInterval", ivt, NULL, &e) != 0) {
        cp_log_warn("v8: %s", e.msg);
        iv = s->run_interval_us; /* V8 keeps the last one */
        want = 0;
    }
    if (want && !s->run_caps)
        cp_log_info("v8: isolate %s: captured, CPU profiler at %lld us", s->isolate, (long long)iv);
    if (!want && s->run_caps)
        cp_log_info("v8: isolate %s: capture over, CPU profiler at %lld us", s->isolate,
                    (long long)iv);
    if (cp_v8_profiler_start(s, &e) != 0) cp_log_warn("v8: %s", e.msg);
    s->run_interval_us = iv;
    s->run_caps = want;
    s->run_start_ns = cp_now_ns();
}

/* Alloc captures: V8's heap sampler stays at --heap-interval (restarting it would drop
 * the isolate's in-use samples); the allocations it sampled since the last cut go to each
 * alloc capture matching s, one window per cut, saying ran=<heap-interval>. The first
 * cut of a capture only sets where its samples start. */
void cp_v8_alloc_cycle(session *s, uint64_t want)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    int64_t now = cp_now_ns();
    cp_err e = {0};
    cp_json *r = NULL;
    if (cp_v8_call(s, "HeapProfiler.getSamplingProfile", NULL, &r, &e) != 0) {
        cp_log_warn("v8: isolate %s: alloc capture window lost: %s", s->isolate, e.msg);
    } else {
        cp_json *prof = member(r, "profile");
        cp_v8_map_profile(s, prof);
        cp_profile *p = NULL;
        uint64_t mark = s->cap_mark;
        if (cp_v8_heap_profile(prof, cp_v8src.o->heap_interval, 1, &mark, &p, &e) != 0) {
            cp_log_warn("v8: isolate %s: alloc capture window lost: %s", s->isolate, e.msg);
        } else {
            s->cap_mark = mark;
            uint64_t caps = s->alloc_caps;
            p->period = cp_v8src.o->heap_interval;
            for (int i = 0; i < CAP_SLOTS && p; i++) {
                if (!(caps & (1ULL << i)) || !cp_v8src.caps[i].s.used) continue;
                caps &= ~(1ULL << i);
                const v8cap *k = &cp_v8src.caps[i];
                char engine[320];
                cp_capture_engine ce = {
                    .asked = k->s.c.alloc_rate, .ran = k->ran, .reason = k->reason};
                (void)cp_capture_engine_write(engine, sizeof(engine), "v8-inspector", &ce);
                cp_profile *one = caps ? cp_profile_clone(p) : p;
                if (!one) continue;
                if (one == p) p = NULL;
                cp_v8_emit_as(s, one, CP_KIND_ALLOC, s->alloc_start_ns, now, 0, k->s.c.id, engine);
            }
            cp_profile_destroy(p);
        }
    }
    cp_json_free(r);
    if (want && !s->alloc_caps)
        cp_log_info("v8: isolate %s: alloc capture, heap sampler kept at %lld bytes", s->isolate,
                    (long long)cp_v8src.o->heap_interval);
    s->alloc_caps = want;
    s->alloc_start_ns = now;
}

/* A heap snapshot of s, read as V8 streams it (model/heapsnap.h) into one window of kind
 * heap: for capture `capture` (NULL: the schedule's, --heap-snapshot-every). V8 pauses the
 * isolate while it writes the snapshot: the pause goes in the window's engine text and the
 * log, and is returned (-1 when no snapshot was taken). A snapshot over the parser's limit,
 * or one that fails, is logged naming the isolate, the capture and the cause. */
int64_t cp_v8_heap_snapshot(session *s, const char *capture)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    char what[CP_CAPTURE_ID_MAX + 16];
    snprintf(what, sizeof(what), capture ? "for capture %s" : "(scheduled)", capture);
    cp_heapsnap_limits lim;
    cp_heapsnap_limits_default(&lim);
    if (cp_v8src.o->heap_snapshot_max_mb > 0)
        lim.max_bytes = (uint64_t)cp_v8src.o->heap_snapshot_max_mb << 20;
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
    (void)cp_v8_call(s, "HeapProfiler.enable", NULL, NULL, NULL);
    int64_t start = cp_now_ns(), m0 = cp_mono_ns();
    const char *params = "{\"reportProgress\":false,\"captureNumericValue\":false}";
    int rc = cp_v8_call_within(s, "HeapProfiler.takeHeapSnapshot", params, NULL,
                               SNAPSHOT_TIMEOUT_MS, &e);
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
    char engine[256], snap[200];
    snprintf(snap, sizeof(snap), "v8-heap-snapshot pause_ms=%lld objects=%llu bytes=%llu",
             (long long)pause_ms, (unsigned long long)st.reachable,
             (unsigned long long)st.total_bytes);
    cp_capture_engine ce = {.asked = 1, .ran = 1}; /* a heap capture: one snapshot */
    if (capture)
        (void)cp_capture_engine_write(engine, sizeof(engine), snap, &ce);
    else
        snprintf(engine, sizeof(engine), "%s", snap);
    cp_log_info("v8: isolate %s: heap snapshot %s: %llu objects, %.1f MB, the "
                "isolate paused %lld ms, read with %.0f MiB",
                s->isolate, what, (unsigned long long)st.reachable, (double)st.total_bytes / 1e6,
                (long long)pause_ms, (double)st.held_bytes / (1 << 20));
    cp_v8_emit_as(s, p, CP_KIND_HEAP, start, end > start ? end : start + 1, 0, capture, engine);
    return pause_ms;
}

/* ------------------------------------------------------------------------------------
 * Windows: each isolate's cpu, alloc and inuse windows, ended together. */

/* Ends s's cpu window (the profiler restarted at once unless last): kept in s->pend until
 * weigh_pending gives it its CPU; a window lost is logged and counted. */
static void session_window_cpu(session *s, int last)
{
    int64_t end = cp_now_ns(), start = s->window_start_ns;
    s->pend_end = end;
    if (last && s->alloc_caps && cp_v8_session_alive(s))
        cp_v8_alloc_cycle(s, 0); /* alloc captures' last windows */
    if (cp_v8src.o->cpu_interval_us > 0) {
        cp_v8_cpu_cycle(s, !last);
        cp_profile *p = s->acc && !s->cpu_failed ? cp_merger_finish(s->acc) : NULL;
        if (!p) {
            log_lost(s, "cpu", start, end, s->cpu_failed ? s->cpu_why : "out of memory");
            s->dropped_windows++;
        } else {
            int64_t base = cp_v8src.o->cpu_interval_us;
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
    cp_json *r = NULL;
    int lost = 0;
    if (s->pend) {
        cp_v8_emit_as(s, s->pend, CP_KIND_CPU, s->pend_start, end, s->pend_dropped, NULL,
                      s->pend_engine[0] ? s->pend_engine : NULL);
        s->pend = NULL;
        s->pend_engine[0] = 0;
    }
    if (s->heap_on) {
        if (cp_v8_call(s, "HeapProfiler.getSamplingProfile", NULL, &r, &e) == 0) {
            cp_json *prof = member(r, "profile");
            cp_profile *inuse = NULL, *alloc = NULL;
            cp_v8_map_profile(s, prof);
            uint64_t mark = s->watermark;
            if (cp_v8_heap_profile(prof, cp_v8src.o->heap_interval, 0, NULL, &inuse, &e) == 0 &&
                cp_v8_heap_profile(prof, cp_v8src.o->heap_interval, 1, &mark, &alloc, &e) == 0) {
                s->watermark = mark;
                cp_v8_emit(s, alloc, CP_KIND_ALLOC, start, end, 0);
                cp_v8_emit(s, inuse, CP_KIND_INUSE, start, end, 0);
            } else {
                cp_profile_destroy(inuse);
                log_lost(s, "alloc and inuse", start, end, e.msg);
                lost += 2;
            }
            cp_json_free(r);
        } else {
            log_lost(s, "alloc and inuse", start, end, e.msg);
            lost += 2;
        }
    }
    s->dropped_windows += (uint64_t)lost;
    if (last && cp_v8_session_alive(s)) {
        /* leave the isolate as we found it, whatever the host does when the socket closes
         * (V8 would disable them with the session) */
        if (s->heap_on) (void)cp_v8_call(s, "HeapProfiler.stopSampling", NULL, NULL, NULL);
        if (s->dbg_on) (void)cp_v8_call(s, "Debugger.disable", NULL, NULL, NULL);
        if (cp_v8src.o->cpu_interval_us > 0)
            (void)cp_v8_call(s, "Profiler.disable", NULL, NULL, NULL);
    }
    s->window_start_ns = end;
}

/* Ends the windows of every started session (of conn c only, if not NULL) together: the
 * cpu windows first, so that isolates sharing a thread split the CPU read at one time. */
void cp_v8_windows_end(conn *only, int last)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    CP_VEC(session *) v = {0};
    for (int i = 0; i < cp_v8src.nhosts; i++)
        for (conn *c = cp_v8src.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next)
                if ((!only || c == only) && cp_v8_session_running(s) && cp_vec_push(&v, s) == 0)
                    session_window_cpu(s, last);
    cp_v8_weigh_pending(v.v, v.n);
    for (uint32_t i = 0; i < v.n; i++)
        session_window_rest(v.v[i], last);
    free(v.v);
}

void cp_v8_session_report(const session *s)
{
    cp_log_info("v8: isolate %s: %lld windows, CPU profiler off between windows %lld us in "
                "all (at most %lld us once), %llu lost windows left for a later envelope",
                s->isolate, (long long)s->windows, (long long)s->gap_total_us,
                (long long)s->gap_max_us, (unsigned long long)s->dropped_windows);
}

/* ------------------------------------------------------------------------------------
 * A host's sessions: started, reaped, their losses handed on. */

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
        cp_v8src.dropped_windows += s->dropped_windows;
        return;
    }
    snprintf(h->lost[free_at].isolate, sizeof(h->lost[free_at].isolate), "%s", s->isolate);
    h->lost[free_at].windows = s->dropped_windows;
}

/* Before the last windows: what no later session of the same name will report rides on
 * them instead. */
void cp_v8_flush_lost(host *h)
{
    for (size_t i = 0; i < sizeof(h->lost) / sizeof(h->lost[0]); i++) {
        cp_v8src.dropped_windows += h->lost[i].windows;
        h->lost[i].windows = 0;
    }
}

/* Reaps sessions that are gone, starts new ones, connects and drops targets. */
void cp_v8_maintain(host *h)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    int64_t now = cp_mono_ns();
    for (conn **cp = &h->conns; *cp;) {
        conn *c = *cp;
        for (session **sp = &c->sessions; *sp;) {
            session *s = *sp;
            if (!cp_v8_session_alive(s)) {
                if (s->state == SESSION_LOST) {
                    log_lost(s, "every", s->window_start_ns, cp_now_ns(),
                             "the isolate is gone (counted in the dropped_windows of the "
                             "next envelope)");
                    s->dropped_windows += (uint64_t)kinds_of(s);
                    if (s->run_caps | s->alloc_caps) {
                        log_lost(s, "capture", s->run_caps ? s->run_start_ns : s->alloc_start_ns,
                                 cp_now_ns(), "the isolate is gone during a capture (counted)");
                        s->dropped_windows++;
                    }
                    cp_v8_session_report(s);
                    note_lost(h, s);
                }
                *sp = s->next;
                cp_v8_session_free(s);
            } else {
                sp = &s->next;
            }
        }
        if ((c->state == CONN_CLOSED || c->state == CONN_IDLE || c->state == CONN_ENDED) &&
            !c->listed) {
            *cp = c->next;
            cp_v8_conn_free(c);
            continue;
        }
        if ((c->state == CONN_IDLE || c->state == CONN_CLOSED) && c->listed && now >= c->retry_at)
            cp_v8_connect(c);
        if (c->state == CONN_FINISHING) {
            /* the isolates still exist: their last windows are taken, then we leave */
            cp_v8_flush_lost(h);
            cp_v8_windows_end(c, 1);
            for (session *s = c->sessions; s; s = s->next)
                if (cp_v8_session_running(s)) {
                    cp_v8_session_report(s);
                    cp_v8_session_set(s, SESSION_DONE, "the host finished");
                }
            cp_log_info("v8: %s target %s finished: last windows taken, disconnecting", h->hostport,
                        c->target);
            cp_v8_conn_set(c, CONN_CLOSING, "last windows taken");
            cp_v8_conn_close(c);
        }
        if (c->state == CONN_OPEN && !c->sessions) {
            char iso[128];
            cp_v8_isolate_of(c->title, iso, sizeof(iso));
            session *s = session_new(c, NULL, iso);
            if (s && session_start(s) != 0) cp_v8_session_gone(s, "its profilers did not start");
        }
        while (cp_v8_conn_open(c) && c->attaches.n) {
            attach a = c->attaches.v[--c->attaches.n];
            session *s = session_new(c, a.sid, a.title);
            if (s && session_start(s) != 0) cp_v8_session_gone(s, "its profilers did not start");
            free(a.sid);
            free(a.title);
        }
        cp = &(*cp)->next;
    }
}
