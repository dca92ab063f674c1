/* contprof.h: the public API of libcontprof, the continuous-profiling agent. Preloaded
 * (LD_PRELOAD) it starts by itself from CONTPROF_* environment variables; linked in, a
 * program calls contprof_start. Runtimes that run many isolates (interpreters, worker
 * pools) attribute samples with the isolate API below. */
#ifndef CONTPROF_H
#define CONTPROF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CONTPROF_EXTERN __attribute__((visibility("default")))
#else
#define CONTPROF_EXTERN
#endif

/* Settings; every field has an environment variable (in brackets) that is used when the
 * field is zero/NULL. Strings are copied by contprof_start. */
typedef struct contprof_options {
    const char *service;    /* [CONTPROF_SERVICE] default: program name */
    const char *version;    /* [CONTPROF_VERSION] default: "" (label omitted) */
    const char *tenant;     /* [CONTPROF_TENANT] default: "default" */
    const char *labels;     /* [CONTPROF_LABELS] extra labels "k=v,k2=v2" */
    int cpu_hz;             /* [CONTPROF_CPU_HZ] default 100, max 1000; <0 disables CPU */
    int64_t alloc_rate;     /* [CONTPROF_ALLOC_RATE] mean bytes between samples, default
                               524288; <0 disables allocation sampling */
    int64_t window_ms;      /* [CONTPROF_WINDOW] "10s", "500ms"; default 10 s */
    const char *brokers;    /* [CONTPROF_BROKERS] Kafka bootstrap "host:port,..." */
    const char *server;     /* [CONTPROF_SERVER] contprofd URL to ask for brokers */
    const char *topic;      /* [CONTPROF_TOPIC] default "contprof.profiles" */
    const char *output_dir; /* [CONTPROF_OUTPUT_DIR] write gzip'd pprof files here */
    int children;           /* [CONTPROF_CHILDREN] 1: exec'd children are profiled too
                               (LD_PRELOAD kept), -1: not; default 1 */
} contprof_options;

/* Starts the agent: CPU timers on every thread, allocation sampling, and the agent thread
 * that ships a window of profiles every window_ms. opts may be NULL (environment only).
 * Idempotent: a second call while running returns 0 and changes nothing. Returns 0 or a
 * negative code: CP_EPARSE (contprof's model/error.h) for a CONTPROF_* variable it cannot
 * read, such as a bare CONTPROF_WINDOW of 100 or more, with the message naming it on
 * stderr; on failure the process is unaffected. Never blocks for long, never
 * aborts. */
CONTPROF_EXTERN int contprof_start(const contprof_options *opts);

/* Stops sampling, writes the last (partial) window and flushes it, waiting at most
 * CONTPROF_FLUSH (default 1s). Safe to call when not running. */
CONTPROF_EXTERN void contprof_stop(void);

/* 1 if the agent is running. */
CONTPROF_EXTERN int contprof_running(void);

/* --- isolates ------------------------------------------------------------------------
 * By default every thread is its own isolate, named after the thread (so a pool of
 * identically named threads forms one isolate). A runtime that runs several logical
 * isolates on its threads creates them here and marks which one a thread is executing. */

typedef struct contprof_isolate contprof_isolate;

/* Creates an isolate named name (label isolate=name) with extra labels "k=v,k2=v2" (may
 * be NULL). Returns NULL on out of memory or if the agent's isolate table (4096) is full.
 * The agent owns it; the caller releases it with contprof_isolate_destroy. Samples taken
 * while a thread is inside it are attributed to it. */
CONTPROF_EXTERN contprof_isolate *contprof_isolate_create(const char *name, const char *labels);

/* Ends the isolate: samples it already has are still reported in the current window,
 * then it is freed. Threads must have left it. NULL is fine. */
CONTPROF_EXTERN void contprof_isolate_destroy(contprof_isolate *iso);

/* Marks the current thread as executing iso until contprof_isolate_leave. Nesting
 * returns to the previous isolate on leave. Cheap (a thread-local store). */
CONTPROF_EXTERN void contprof_isolate_enter(contprof_isolate *iso);
CONTPROF_EXTERN void contprof_isolate_leave(void);

/* A language frame that a walker reports. Strings need only live until the walker
 * returns; the agent copies them. */
typedef struct contprof_frame {
    const char *function;
    const char *file; /* may be NULL */
    int64_t line;     /* 0 if unknown */
} contprof_frame;

/* Called at a safe point (see contprof_safepoint) on the thread that was sampled: writes
 * at most max frames, innermost first, to out and returns how many. */
typedef int (*contprof_walker)(void *arg, contprof_frame *out, int max);

/* Registers (or with NULL, removes) the walker of iso. */
CONTPROF_EXTERN void contprof_isolate_set_walker(contprof_isolate *iso, contprof_walker fn,
                                                 void *arg);

/* Called by a runtime at its safe points (function entry, loop back-edges). If a CPU sample
 * of this thread is waiting for language frames, calls the walker of the current isolate
 * and attaches the frames to it (on top of the native stack). Costs one thread-local load
 * otherwise. Never from a signal handler. */
CONTPROF_EXTERN void contprof_safepoint(void);

/* Optional: asks a runtime for a safe point soon. Called from the signal handler, on the
 * sampled thread, each time a sample of iso starts (or keeps) waiting for language frames;
 * it must be async-signal-safe (Lua's lua_sethook is). Without it the sample waits for the
 * runtime's next contprof_safepoint call. CPU time of signals that arrive while a sample
 * is waiting is added to that sample's weight, so waiting does not bias totals. */
typedef void (*contprof_safepoint_request)(void *arg);

/* Registers (or with NULL, removes) the safe-point request of iso. */
CONTPROF_EXTERN void contprof_isolate_set_request(contprof_isolate *iso,
                                                  contprof_safepoint_request fn, void *arg);

/* Optional: the runtime's own native code (e.g. the text of liblua). Where a native stack
 * passes through it, its language frames replace the native frames from the innermost to
 * just above the outermost frame in [lo, hi): native code the runtime called stays on top,
 * the runtime's entry point (e.g. lua_pcallk) and its callers stay below. Without it the
 * language frames go on top of the whole native stack. */
CONTPROF_EXTERN void contprof_isolate_set_runtime_code(contprof_isolate *iso, uintptr_t lo,
                                                       uintptr_t hi);

/* --- runtime allocators ---------------------------------------------------------------
 * A runtime with its own allocator hook (Lua's lua_Alloc) routes each call through the
 * agent, so that its blocks are sampled like malloc's, carry language frames, and are
 * matched on free whichever allocator is underneath. */

/* An allocator in lua_Alloc's shape: ptr NULL = new block, nsize 0 = free ptr. */
typedef void *(*contprof_realloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);

/* Returns fn(ud, ptr, osize, nsize), with the malloc family's sampling paused during the
 * call (nothing counts twice). A freed or moved ptr leaves the inuse profile first. The
 * nsize bytes of a new block count toward the thread's next sample (same byte-based
 * sampling and weights as malloc); a sampled block is recorded for the current isolate
 * with the caller's native stack under the language frames that walker (may be NULL)
 * writes, called before fn while the runtime's own state is still as it was. One call,
 * no lock unless sampled or ptr may be a sampled block. */
CONTPROF_EXTERN void *contprof_alloc_through(contprof_realloc_fn fn, void *ud, void *ptr,
                                             size_t osize, size_t nsize, contprof_walker walker,
                                             void *walker_arg);

#ifdef __cplusplus
}
#endif

#endif
