/* Private to collector/v8 (the V8 source, v8source.h): the types its files share (a host,
 * its connections, the isolate sessions on them, the captures heard) and each file's
 * functions. One thread runs all of it. Nothing outside this folder includes it. */
#ifndef CP_V8SOURCE_INT_H
#define CP_V8SOURCE_INT_H

#include <stdint.h>

#include "check.h"
#include "capture.h"
#include "error.h"
#include "heapsnap.h"
#include "json.h"
#include "labels.h"
#include "merge.h"
#include "pprof.h"
#include "selector.h"
#include "sink.h"
#include "sourcemap.h"
#include "v8source.h"
#include "watch.h"

#define CAP_SLOTS 16 /* running captures at once (README "Captures") */

/* An inspector connection's life (a target's WebSocket): one state, changed only by
 * cp_v8_conn_set (which asserts the edge in Debug/ASan builds and logs it at debug level).
 *
 *   IDLE -> CONNECTING            CONNECTING -> OPEN | CLOSED
 *   OPEN -> FINISHING | CLOSING | CLOSED
 *   FINISHING -> CLOSING | CLOSED  CLOSING -> ENDED      CLOSED -> CONNECTING
 *
 * IDLE: listed, never connected. CONNECTING: libwebsockets connects. OPEN: calls flow.
 * FINISHING: node ran its last line and waits for us to disconnect
 * (NodeRuntime.waitingForDisconnect). CLOSING: its last windows taken, we asked
 * libwebsockets to close it. CLOSED: failed or closed by the host: connected again after
 * its back-off while listed. ENDED: closed after CLOSING: never again. OPEN, FINISHING and
 * CLOSING are open (calls may be made); an unlisted IDLE, CLOSED or ENDED one is freed. */
typedef enum conn_state {
    CONN_IDLE,
    CONN_CONNECTING,
    CONN_OPEN,
    CONN_FINISHING,
    CONN_CLOSING,
    CONN_CLOSED,
    CONN_ENDED,
} conn_state;

typedef struct conn conn;

/* A script of an isolate that came with a source map (Debugger.scriptParsed). */
typedef struct mapped {
    char *script_id;
    cp_v8_smap *map;
} mapped;

/* An isolate session's life: one state, changed only by cp_v8_session_set (which asserts
 * the edge in Debug/ASan builds and logs it at debug level).
 *
 *                  profilers on                 last windows taken
 *    STARTING ------------------> RUNNING ---------------------------> DONE
 *       |                            |      (node waits to disconnect,     |
 *       | start failed,              | isolate       or the source stops)   |
 *       | detached, closed           | detached,                           | detached,
 *       v                            v closed                              v closed
 *     GONE                         LOST                                  GONE
 *
 * STARTING: session_start's calls (Profiler, HeapProfiler, Debugger, the release).
 * RUNNING: windows cut every --window, captures served, heap snapshots taken.
 * DONE: nothing more is asked; the session waits for its connection to close.
 * LOST: gone while running: its window in progress is counted lost when reaped.
 * GONE: gone with nothing in progress. LOST and GONE are reaped (freed) by
 * cp_v8_maintain; any state is freed with its connection at the end. */
typedef enum session_state {
    SESSION_STARTING,
    SESSION_RUNNING,
    SESSION_DONE,
    SESSION_LOST,
    SESSION_GONE,
} session_state;

/* One isolate: the target of a connection, or a Node worker reached through it. */
typedef struct session {
    struct session *next;
    conn *c;
    char *sid; /* NodeWorker session id; NULL for the connection's own target */
    char isolate[128];
    int64_t next_id, want_id;
    cp_json *reply;      /* the awaited reply once it came */
    session_state state; /* cp_v8_session_set only */
    int heap_on;
    uint64_t watermark, token, dropped_windows;
    int64_t window_start_ns;
    int64_t last_end_us; /* V8's time of the last stopped profile's end; -1: none yet */
    int64_t gap_total_us, gap_max_us, windows;
    CP_VEC(mapped) maps;
    size_t map_bytes;
    uint64_t maps_failed;
    /* the Debugger domain is on only while scripts are read (README "Source maps"): the
     * ids V8 reported (a bitset), and whether it is on now or stays on (ids it cannot
     * keep: not numbers, or past the bitset's bound) */
    CP_VEC(uint64_t) scripts_seen;
    int dbg_on, dbg_always;
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
    /* the CPU profiler's own cost (README "Captures", "Cost"): the sampler thread of the
     * run in progress (0: not seen) and its isolate's CPU at the run's start; that thread's
     * CPU and wall time over the always-on runs, and over the runs of the capture(s) in
     * progress (with the isolate's CPU meanwhile) */
    int sampler_tid;
    int64_t run_cpu0_ns;
    int64_t base_prof_ns, base_wall_ns;
    int64_t cap_prof_ns, cap_wall_ns, cap_cpu_ns, cap_run_us;
    int cap_counting;
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
    conn_state state; /* cp_v8_conn_set only */
    int listed;
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

/* A running capture this source heard of (model/capture.h). */
typedef struct v8cap {
    cp_capture_slot s;   /* the intake's part (model/capture.h) */
    int64_t interval_us; /* cpu: the interval run (0: cannot run) */
    int64_t ran;         /* hz (cpu) or bytes (alloc) */
    char reason[224];
} v8cap;

/* The source's one state (one thread: cp_v8_run's). */
typedef struct cp_v8src_state {
    const cp_v8_options *o;
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
    cp_capture_counts ctl; /* control messages not run (the intake's counts) */
} cp_v8src_state;

extern cp_v8src_state cp_v8src;

/* ------------------------------------------------------------------------------------
 * The callback rule. Messages arrive only in libwebsockets' callbacks (v8inspector.c's
 * ws_cb), and those run only inside lws_service: in the loop's turn, or in a call's wait
 * for its reply (cp_v8_call_within), so most run nested in a call further up the stack.
 * A callback (ws_cb and what it calls: the delivery of a message, a connection closed,
 * cp_v8_script_parsed) may only store the awaited reply, note a worker's attach or the
 * host's finishing, feed a heap snapshot's chunk, read a source map, and mark sessions
 * gone (cp_v8_session_gone: to LOST or GONE). It must not call an isolate (that would
 * nest lws_service in itself and replace the reply awaited below), free a session or a
 * connection (the call below holds them), start, end or emit a window, or serve the loop.
 * Calls do not nest either: one at a time. Asserted in Debug/ASan builds (model/check.h):
 * CP_V8_ASSERT_NOT_IN_CALLBACK where only the first holds, CP_V8_ASSERT_OUTSIDE_CALLS
 * where neither a callback nor a call may be under way. */

/* ws_cb's depth, and whether a call waits for its reply (v8inspector.c). */
int cp_v8_in_callback(void);
int cp_v8_in_call(void);
/* Brackets a callback (ws_cb; tests that check the rule). */
void cp_v8_callback_enter(void);
void cp_v8_callback_leave(void);
#define CP_V8_ASSERT_NOT_IN_CALLBACK() CP_ASSERT(!cp_v8_in_callback())
#define CP_V8_ASSERT_OUTSIDE_CALLS() CP_ASSERT(!cp_v8_in_callback() && !cp_v8_in_call())

/* ------------------------------------------------------------------------------------
 * v8inspector.c: the inspector's HTTP listing, one WebSocket per target, calls. */

/* Whether addr is a loopback address. */
int cp_v8_loopback(const char *addr);
/* o's member name if it is a string, else NULL. */
const char *cp_v8_jstr(const cp_json *o, const char *name);
/* Creates the libwebsockets context (the source's one); CP_ENOMEM when it cannot. */
int cp_v8_inspector_open(cp_err *err);
/* Serves every connection once (returns at least every 20 ms). */
void cp_v8_inspector_service(void);
/* Destroys the context: its callbacks still see the connections (each one closed). */
void cp_v8_inspector_close(void);
/* Sends method(params) to s (params: a JSON object's text, NULL = {}) and serves every
 * connection until the reply comes. Returns 0 with *result (may be NULL: dropped; the
 * caller's, cp_json_free) the reply's result, CP_ENOMEM, or CP_EIO (closed, time-out, an
 * error reply) with err saying which. */
int cp_v8_call_within(session *s, const char *method, const char *params, cp_json **result,
                      int64_t timeout_ms, cp_err *err);
/* cp_v8_call_within with the usual time-out (10 s). */
int cp_v8_call(session *s, const char *method, const char *params, cp_json **result, cp_err *err);
/* Polls h's /json/list: a connection for each new target, listed marks the rest. */
void cp_v8_discover(host *h);
/* Opens c's WebSocket (its callbacks say when it is open or failed). */
void cp_v8_connect(conn *c);
/* Moves c to state to (an edge of the diagram above; asserted), logged with why. */
void cp_v8_conn_set(conn *c, conn_state to, const char *why);
/* Whether c's WebSocket is open (OPEN, FINISHING, CLOSING): calls may be made. */
static inline int cp_v8_conn_open(const conn *c)
{
    return c->state == CONN_OPEN || c->state == CONN_FINISHING || c->state == CONN_CLOSING;
}
/* Asks libwebsockets to close c (moved to CLOSING by the caller). */
void cp_v8_conn_close(conn *c);
/* Frees c, its sessions and what it queued. */
void cp_v8_conn_free(conn *c);

/* ------------------------------------------------------------------------------------
 * v8session.c: an isolate's session, its profilers' runs and windows. */

void cp_v8_session_free(session *s);
/* Moves s to state to (an edge of the diagram above; asserted), logged with why. */
void cp_v8_session_set(session *s, session_state to, const char *why);
/* The isolate went (detached, its connection closed, its start failed): RUNNING becomes
 * LOST, STARTING and DONE GONE; LOST and GONE stay. */
void cp_v8_session_gone(session *s, const char *why);
/* Not gone: its isolate may be asked (STARTING, RUNNING, DONE). */
static inline int cp_v8_session_alive(const session *s)
{
    return s->state <= SESSION_DONE;
}
/* Profiling: its windows are cut and captures served (RUNNING). */
static inline int cp_v8_session_running(const session *s)
{
    return s->state == SESSION_RUNNING;
}
/* Debugger.scriptParsed: reads the script's source map, if it names one. */
void cp_v8_script_parsed(session *s, const cp_json *params);
/* Reads the isolate's scripts (Debugger on, its scriptParsed replayed for each, then off)
 * when prof, a CPU profile or a heap profile's tree, has a frame of a script not reported
 * yet; then maps every callFrame through the source maps. Outside calls only. */
void cp_v8_map_profile(session *s, cp_json *prof);
/* Ends the CPU profiler's run in progress; with restart, starts the next one. */
void cp_v8_cpu_cycle(session *s, int restart);
/* Cuts the alloc captures' windows of s; want: the alloc captures it serves from now. */
void cp_v8_alloc_cycle(session *s, uint64_t want);
/* A heap snapshot of s into one heap window; returns the isolate's pause (ms), -1: none. */
int64_t cp_v8_heap_snapshot(session *s, const char *capture);
/* Ends the windows of every started session (of only, if not NULL) together. */
void cp_v8_windows_end(conn *only, int last);
void cp_v8_session_report(const session *s);
/* Before the last windows: h's losses kept for later sessions ride on them instead. */
void cp_v8_flush_lost(host *h);
/* Reaps sessions that are gone, starts new ones, connects and drops h's targets. */
void cp_v8_maintain(host *h);

/* ------------------------------------------------------------------------------------
 * v8capture.c: captures heard on the control topic, and the heap schedule. */

/* The running captures of kind (slot bits) whose selector matches s's labels. */
uint64_t cp_v8_caps_kind(const session *s, int64_t now, cp_kind kind);
/* cp_v8_caps_kind of CP_KIND_CPU. */
uint64_t cp_v8_caps_of(const session *s, int64_t now);
/* The interval a run serving caps uses: the finest of theirs, else the always-on one. */
int64_t cp_v8_interval_of(uint64_t caps);
/* A copy of a finer run's profile thinned to base_us (*acc carries the rest); NULL: no
 * memory. */
cp_json *cp_v8_thin_profile(const cp_json *profile, int64_t base_us, int64_t *acc);
/* The engine text of capture k's cpu windows of s's run at ran_us, with what the capture
 * cost s so far (cost_us_per_s, cost_permille) once measured. */
void cp_v8_cap_engine(const v8cap *k, const session *s, int64_t ran_us, char *out, size_t cap);
/* Profiler.start on s, noting the sampler thread V8 starts for the run (its cost). */
int cp_v8_profiler_start(session *s, cp_err *err);
/* Before Profiler.stop: the run's sampler thread's CPU, counted to the always-on runs or
 * to the capture's (s->run_caps). */
void cp_v8_profiler_cost(session *s);
/* Every loop: hears control messages, cuts capture windows, switches isolates' runs. */
void cp_v8_captures_tick(void);
/* --heap-snapshot-every: takes the snapshots that are due. */
void cp_v8_heap_schedule_tick(void);
/* At the end: logs what control messages were ignored, forgets every capture. */
void cp_v8_captures_close(void);

/* ------------------------------------------------------------------------------------
 * v8emit.c: windows to envelopes, to files and the sink. */

/* s's labels: --label, service, instance, isolate, runtime. */
int cp_v8_session_labels(const session *s, cp_labels *l);
/* Wraps p (destroyed here) in an envelope of s and hands it on; with capture, a capture
 * window of that capture (its engine text, producer and sequence). */
void cp_v8_emit_as(session *s, cp_profile *p, cp_kind kind, int64_t start_ns, int64_t end_ns,
                   uint64_t dropped_samples, const char *capture, const char *engine);
void cp_v8_emit(session *s, cp_profile *p, cp_kind kind, int64_t start_ns, int64_t end_ns,
                uint64_t dropped_samples);
/* Weighs the pending cpu windows of v[0..n) (ended together) by their threads' CPU. */
void cp_v8_weigh_pending(session **v, size_t n);

#endif
