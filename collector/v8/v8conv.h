/* Converting what V8's inspector returns (Profiler.stop's Profile, HeapProfiler's
 * SamplingHeapProfile, as model/json trees) into pprof profiles of the shared model. Pure
 * functions: no I/O, no global state; every id, index and number is checked, so a
 * malformed message is an error naming the field, never a crash. */
#ifndef CP_V8CONV_H
#define CP_V8CONV_H

#include <stdint.h>

#include "error.h"
#include "json.h"
#include "profile.h"

/* The most nodes a profile may hold (a sane V8 tree holds thousands). */
#define CP_V8_MAX_NODES (1u << 22)

/* Converts a Profiler.Profile (profile: the `profile` member of Profiler.stop's result)
 * into a CPU profile (sample types samples/count and cpu/nanoseconds, like the native
 * agent's). Each sample weighs one sampling interval (interval_us, the one given to
 * Profiler.setSamplingInterval): V8 records a sample only while the isolate runs on its
 * thread, so the time to the next sample (DevTools' wall-clock weight) would hold the
 * time the isolate waited or another isolate ran its thread (workerd). "(root)" is
 * dropped from stacks and "(idle)" samples are dropped. Frames: function name (or
 * "(anonymous)"), file = script URL, line = lineNumber + 1; system_name = "NAME
 * URL:LINE:COLUMN" (1-based), which tells apart the anonymous functions of one file. On
 * success *out is a new profile the caller destroys and *span_us (may be NULL) is endTime
 * - startTime. Returns 0, CP_EPARSE (err naming the field), CP_ELIMIT or CP_ENOMEM. */
int cp_v8_cpu_profile(const cp_json *profile, int64_t interval_us, cp_profile **out,
                      int64_t *span_us, cp_err *err);

/* Converts a HeapProfiler.SamplingHeapProfile (`profile` of getSamplingProfile's result)
 * sampled at interval_bytes into an inuse profile (inuse_objects/count,
 * inuse_space/bytes) of every sample, or, with alloc set, an alloc profile
 * (alloc_objects, alloc_space) of the samples whose ordinal is above *watermark. A
 * sample's size is V8's unbiased estimate already (the object's size times the objects of
 * that size it stands for): its bytes are taken as they are, its objects recovered from
 * them (README "Heap"). *watermark (may be NULL) is raised to the highest ordinal seen. Returns as
 * cp_v8_cpu_profile. */
int cp_v8_heap_profile(const cp_json *profile, int64_t interval_bytes, int alloc,
                       uint64_t *watermark, cp_profile **out, cp_err *err);

/* One inspector target of a /json/list answer. */
typedef struct cp_v8_target {
    char id[128], title[256];
    char path[512]; /* the path of webSocketDebuggerUrl (ws://HOST:PORT/PATH) */
} cp_v8_target;

/* Parses a /json/list answer (len bytes): the targets with an id and a ws:// debugger URL
 * whose parts fit (others are skipped). On success *out (caller frees) holds *n targets.
 * Returns 0, CP_EPARSE (err: "not a JSON array: ..."), CP_ELIMIT (over 4096 targets) or
 * CP_ENOMEM. */
int cp_v8_targets_parse(const char *body, size_t len, cp_v8_target **out, size_t *n, cp_err *err);

/* The isolate label of a target's title: a Worker's NAME from workerd's "workerd: worker
 * NAME"; another workerd title as it is; anything else (a node main thread) "main". */
void cp_v8_isolate_of(const char *title, char *out, size_t cap);

/* The isolate label of a Node worker titled "[worker N] NAME": NAME; other titles as they
 * are; NULL "worker". */
void cp_v8_worker_isolate(const char *title, char *out, size_t cap);

/* Parses one inspector message (len bytes) into a JSON object (*out, the caller's:
 * cp_json_free). Strings must be valid UTF-8, nesting at most CP_JSON_MAX_DEPTH deep.
 * Returns 0, CP_ENOMEM, or CP_EPARSE with err "malformed JSON message: WHY at byte N" or
 * "malformed message: not a JSON object". */
int cp_v8_message_parse(const char *data, size_t len, cp_json **out, cp_err *err);

/* Unwraps NodeWorker.receivedMessageFromWorker's params: *sid points into params, *inner
 * is the worker's message (the caller's: cp_json_free). Returns 0, CP_ENOMEM or CP_EPARSE
 * with err "malformed worker message (WHY)". */
int cp_v8_worker_message(const cp_json *params, const char **sid, cp_json **inner, cp_err *err);

/* ------------------------------------------------------------------------------------
 * The host's /proc, read to weigh a window by its thread's CPU (v8cpu.c does the I/O). */

/* Parses "PID/task/TID" (readlink of /proc/thread-self, as an isolate evaluates it).
 * Returns 0 with *pid and *tid (both > 0), or CP_EPARSE with err naming the text. */
int cp_v8_thread_self_parse(const char *text, int *pid, int *tid, cp_err *err);

/* One line of /proc/net/tcp or tcp6: 1 with *inode when it is a listening socket
 * (state 0A) on local port, else 0 (other sockets, the header, malformed lines). */
int cp_v8_tcp_listener(const char *line, unsigned port, uint64_t *inode);

/* The first field of /proc/PID/task/TID/schedstat (ns the thread ran on a CPU). Returns
 * 0 or CP_EPARSE. */
int cp_v8_schedstat_ns(const char *text, int64_t *ns);

/* utime + stime (clock ticks) of a /proc/PID/stat text (fields after the command's last
 * ')'). Returns 0 or CP_EPARSE. */
int cp_v8_stat_ticks(const char *text, int64_t *ticks);

#endif
