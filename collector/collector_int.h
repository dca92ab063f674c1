/* Private to the collector: the configuration, the thread registry and its sample rings,
 * isolates, the allocation sampler's buckets, and what the agent thread calls. */
#ifndef CP_COLLECTOR_INT_H
#define CP_COLLECTOR_INT_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "contprof.h"
#include "error.h"
#include "unwind.h"
#include "vec.h"

#define CP_TLS __attribute__((tls_model("initial-exec"))) __thread

/* ------------------------------------------------------------------------------------
 * Configuration (config.c) */

/* CPU engines (CONTPROF_CPU_ENGINE): auto picks by rate (thread.c cp_cpu_start). */
enum { CP_ENGINE_AUTO, CP_ENGINE_PERF, CP_ENGINE_TIMER };

typedef struct cp_config {
    char service[128], version[128], tenant[64];
    char labels[1024];  /* "k=v,k=v" */
    int cpu_hz;         /* 0: off */
    int64_t alloc_rate; /* 0: off */
    int64_t window_ns;
    char brokers[1024], server[512], topic[256], output_dir[1024];
    char token[256]; /* CONTPROF_TOKEN: contprofd's bearer token (asking for the brokers) */
    int children;
    int64_t flush_ms;
    int kafka_queue; /* envelopes waiting in the agent plus librdkafka */
    int cpu_engine;  /* CONTPROF_CPU_ENGINE: CP_ENGINE_AUTO, _PERF or _TIMER */
    int symbolize_server; /* CONTPROF_SYMBOLIZE=server: no names, no libdw (window.c) */
    /* librdkafka properties from CONTPROF_KAFKA_<NAME>=value (NAME lowercased, '_' -> '.';
     * e.g. CONTPROF_KAFKA_SECURITY_PROTOCOL=SASL_SSL), as "name=value\n" lines. */
    char kafka_props[4096];
} cp_config;

/* Fills c from opts (may be NULL) and the environment. */
void cp_config_load(cp_config *c, const contprof_options *opts);
/* Parses "10s", "250ms", "2m", "1500" (ms); -1 if malformed. */
int64_t cp_parse_duration_ms(const char *s);

extern cp_config cp_cfg;

/* ------------------------------------------------------------------------------------
 * Threads and CPU samples (thread.c) */

/* Language-frame ids in a sample are tagged with this bit (see cp_lang_*). */
#define CP_LANG_TAG (1ULL << 63)

typedef struct cp_sample_rec {
    uint32_t isolate; /* explicit isolate id, 0 = the thread's own */
    uint32_t nframes;
    uint64_t weight; /* periods of CPU time */
    uint64_t pcs[CP_MAX_FRAMES];
} cp_sample_rec;

#define CP_RING 128 /* power of two */

enum { CP_T_FREE = 0, CP_T_LIVE = 1, CP_T_DEAD = 2 };

typedef struct cp_thread {
    atomic_int state;
    pid_t tid;
    pthread_t self;
    int own_tls; /* registered on its own thread (TLS points here) */
    uintptr_t stack_lo, stack_hi;
    int perf_fd;
    void *perf_ring; /* perf's mmap'd buffer: overflows are counted there, none lost */
    int has_timer;
    timer_t timer;
    char name[16];
    uint32_t iso_stack[16]; /* explicit isolates entered, innermost last */
    atomic_uint iso_depth;
    atomic_uint head; /* written by the thread (handler or safepoint) */
    atomic_uint tail; /* written by the agent */
    atomic_uint_fast64_t dropped;
    /* A sample waiting for the walker at the next safe point. */
    atomic_int pending;
    cp_sample_rec pend;
    cp_ucache ucache_sig;   /* the signal handler's */
    cp_ucache ucache_alloc; /* the allocation path's */
    cp_sample_rec ring[CP_RING];
} cp_thread;

#define CP_MAX_THREADS 4096
extern cp_thread *_Atomic cp_threads[CP_MAX_THREADS];
extern atomic_uint cp_threads_hwm; /* slots ever used */

extern CP_TLS cp_thread *cp_self;
/* Set while the agent's own code runs on a thread: allocations are not sampled. */
extern CP_TLS int cp_in_agent;
/* Set for the whole life of the agent's threads (its own and librdkafka's): their failed
 * allocations are served from a reserve, and cp_agent_oom is raised. */
extern CP_TLS int cp_agent_thread;
extern atomic_int cp_agent_oom;

/* The agent thread's tid (never registered, never sampled). */
extern pid_t cp_agent_tid;

/* Engine string such as "perf-task-clock 1ms" or "posix-cpu-timer 4ms". */
extern char cp_engine[64];
extern int64_t cp_period_ns;
extern atomic_uint_fast64_t cp_dropped_samples; /* process-wide (no thread slot, etc.) */

int cp_cpu_start(void); /* installs the handler and arms all known threads */
void cp_cpu_stop(void); /* disarms every thread */
/* Registers the calling thread (TLS, stack bounds, CPU timer). Idempotent. */
cp_thread *cp_thread_register_self(void);
/* Agent: finds threads in /proc/self/task that are not registered and arms them. */
void cp_threads_scan(void);
/* Agent: frees DEAD slots (after their rings were drained) and marks vanished tids. */
void cp_threads_reap(void);
/* Agent: refreshes thread names from /proc/self/task/TID/comm. */
void cp_threads_refresh_names(void);
/* After fork in the child: only the calling thread survives. */
void cp_threads_after_fork_child(void);

/* The agent's signal handler was found or moved to this signal (SIGPROF unless the host
 * uses it); README.md "Signals". */
int cp_sample_signal(void);
/* fd.c: perf fd `from` is moving to `to` (the host dup2()s onto `from`): updates the
 * thread that holds it and re-registers its async owner. Returns 0, or -1 if no thread
 * holds it. */
int cp_perf_fd_moved(int from, int to);

/* ------------------------------------------------------------------------------------
 * File descriptors (fd.c): the agent's fds live above a floor near the fd limit and are
 * marked here; the host's close/close_range/closefrom/dup2/dup3 skip or vacate them. */

#define CP_FD_MAX 65536
enum { CP_FD_HOST = 0, CP_FD_AGENT = 1, CP_FD_PERF = 2, CP_FD_REVOKED = 3 };
/* Per fd number: CP_FD_AGENT/CP_FD_PERF while the agent owns it, CP_FD_REVOKED once the
 * host took the number over (dup2) while the agent's code may still hold it. */
extern _Atomic unsigned char cp_fd_state[CP_FD_MAX];
/* Bumped whenever the host takes over an agent fd that could not be moved: the agent
 * thread then rebuilds its Kafka client (whose fds it cannot renumber). */
extern atomic_uint cp_fd_revocations;
/* Moves fd above the floor (close-on-exec) and marks it as kind (CP_FD_AGENT or
 * CP_FD_PERF). Returns the new number, fd itself if there is no room above the floor, or
 * -1 (fd closed, errno EMFILE) if it cannot be marked. fd < 0 is returned as is. */
int cp_fd_adopt(int fd, int kind);
/* Closes an fd of the agent's from any thread (the interposed close() refuses host threads)
 * and unmarks it; a revoked number is only unmarked. */
int cp_fd_close(int fd);
/* In a fork child (not a vfork child, which shares the parent's memory). */
void cp_fd_after_fork_child(void);
/* fcntl without the interposer's checks. */
int cp_fd_fcntl(int fd, int cmd, long arg);

/* ------------------------------------------------------------------------------------
 * Isolates (agent.c) */

#define CP_MAX_ISOLATES 4096
enum { CP_ISO_FREE = 0, CP_ISO_LIVE = 1, CP_ISO_DYING = 2 };

struct contprof_isolate {
    atomic_int state;
    uint32_t id; /* index + 1 */
    char *name, *labels;
    _Atomic(contprof_walker) walker;
    void *_Atomic walker_arg;
    _Atomic(contprof_safepoint_request) request;
    void *_Atomic request_arg;
    _Atomic uintptr_t code_lo, code_hi; /* the runtime's native code, or 0, 0 */
};
extern struct contprof_isolate cp_isolates[CP_MAX_ISOLATES];

/* Language frames interned by the safepoint: id -> function/file/line. */
int cp_lang_intern(const contprof_frame *f, uint32_t *id);
int cp_lang_get(uint32_t id, const char **function, const char **file, int64_t *line);
/* Interns frames (innermost first) and writes their tagged ids to ids; returns how many. */
int cp_lang_ids(const contprof_frame *fr, int n, uint64_t *ids);
/* Joins m language frame ids into the native stack pcs[0..n) (leaf first, capacity
 * CP_MAX_FRAMES) as contprof_isolate_set_runtime_code says for isolate iso (0: on top).
 * Returns the new number of frames. */
uint32_t cp_lang_join(uint32_t iso, uint64_t *pcs, uint32_t n, const uint64_t *ids, uint32_t m);

/* ------------------------------------------------------------------------------------
 * Allocation sampling (alloc.c) */

/* One (isolate, stack) with weighted totals; unbiased as in Go's scaleHeapSample. */
typedef struct cp_alloc_bucket {
    uint64_t hash;
    uint32_t isolate;
    char thread[16];
    uint32_t nframes;
    double alloc_objects, alloc_bytes; /* this window */
    double inuse_objects, inuse_bytes; /* since start */
    uint64_t pcs[CP_MAX_FRAMES];
} cp_alloc_bucket;

int cp_alloc_init(void);
/* Arms sampling with mean rate bytes (0 disables). */
void cp_alloc_set_rate(int64_t rate);
/* Number of buckets so far (they are never removed). */
uint32_t cp_alloc_nbuckets(void);
/* Agent: copies at most cap buckets to out and zeroes their window counters, under the
 * sampler's lock (nothing allocates while it is held). Returns how many were copied. */
uint32_t cp_alloc_snapshot(cp_alloc_bucket *out, uint32_t cap);
extern atomic_uint_fast64_t cp_alloc_dropped;
void cp_alloc_atfork_prepare(void);
void cp_alloc_atfork_parent(void);
void cp_alloc_atfork_child(void);

/* Real allocator entry points (resolved with dlsym, with a bootstrap pool). */
void *cp_real_malloc(size_t n);
void cp_real_free(void *p);

/* ------------------------------------------------------------------------------------
 * Time */

static inline int64_t cp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static inline int64_t cp_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
