/* The agent: start and stop, the constructor that starts it when preloaded, fork handling,
 * and the agent thread that drains sample rings every 100-500 ms and ships a window of
 * profiles (files and/or Kafka) every window. The top of the collector's layers: it may
 * include every module's header, and none includes agent.c's (it has none). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "captable.h"
#include "config.h"
#include "capture.h"
#include "exec.h"
#include "fatal.h"
#include "fd.h"
#include "guard.h"
#include "isolate.h"
#include "outdir.h"
#include "pprof.h"
#include "python.h"
#include "relay.h"
#include "sink.h"
#include "thread.h"
#include "times.h"
#include "unwind.h"
#include "window.h"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    atomic_int running;
    int stop;     /* under mu */
    int finished; /* under mu: the agent thread has flushed */
    int exiting;  /* under mu: stopped by the destructor, the process ends next */
    int64_t window_start;
    char instance[128], producer[160];
    uint64_t sequence;
    /* In the names of this image's files, after the pid: its start time (realtime ns, hex),
     * so that an exec'd image (same pid) or a later process with the same pid never
     * writes a name an earlier one wrote. Moved on if a name exists anyway. */
    uint64_t image_token;
    uint64_t dropped_windows;
    uint64_t prev_alloc_dropped, prev_proc_dropped;
    cp_sink *sink;     /* the relay or Kafka (sink.h); NULL with files only */
    cp_gzipper *gz[2]; /* write_file's, stored and level 1, kept (agent thread only) */
    int files;         /* window files are written (an output directory passed its check) */
    int files_said;    /* write_file said once why a window was not written */
    int atfork_done;
    /* Flushes asked for by exec and _exit (agent_flush): asked counts requests, done the ones
     * served, both under mu. pid: the process this agent thread serves (a vfork child shares
     * this memory, not the thread). forked: this instance is a fork child's. */
    uint64_t flush_asked, flush_done;
    int pid, forked;
    int idle;                 /* under mu: the agent thread waits for its next tick */
    unsigned long window_cpu; /* samples drained into the current window (agent thread) */
} A = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* ------------------------------------------------------------------------------------
 * Output */

static void sanitize(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++) {
        char c = src[i];
        dst[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                         c == '-' || c == '_'
                     ? c
                     : '_';
    }
    dst[i] = 0;
}

/* Files of up to a file system block are written as gzip with deflate's stored blocks
 * (still gzip, 23 bytes more than the payload): compressing them saves no disk, as the
 * file takes a block either way, and libdeflate's level 1 costs about 25 us each when its
 * 128 KiB hash table is cache-cold (it clears it for every buffer), as it is once a
 * window: most profiles of a window are this small (an isolate without allocations has two
 * of about 300 bytes). Larger ones are compressed at level 1. */
#define GZIP_STORE_MAX 4096

/* Publishes tmp as path (both in directory dir) unless path exists: never overwrites a
 * file. */
static int publish(int dir, const char *tmp, const char *path)
{
    if (renameat2(dir, tmp, dir, path, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1; /* EEXIST among them */
    /* a file system without RENAME_NOREPLACE: link() refuses an existing name too */
    if (linkat(dir, tmp, dir, path, 0) != 0) return -1;
    unlinkat(dir, tmp, 0);
    return 0;
}

/* Says once per process why window files are not written (msg: what failed). Why once: a
 * reason that holds for one window (no fd left, the directory swapped) usually holds for
 * every later one. */
static void files_say(const char *msg, int err)
{
    if (A.files_said++) return;
    struct rlimit rl;
    char lim[96] = "";
    if ((err == EMFILE || err == ENFILE) && getrlimit(RLIMIT_NOFILE, &rl) == 0)
        snprintf(lim, sizeof(lim), " (open file limit %llu: ulimit -n)",
                 (unsigned long long)rl.rlim_cur);
    fprintf(stderr, "contprof: %s%s; windows are not written as files%s\n", msg, lim,
            cp_cfg.brokers[0] || cp_cfg.server[0] ? " (Kafka goes on)" : "");
}

static void write_file(const cp_envelope *e)
{
    char iso[160], svc[64], path[400], tmp[410];
    /* opened and checked for each file, closed after: the agent holds no fd of the host's
     * limit between windows, and a directory swapped after the check gets nothing */
    int dir;
    cp_err err = {0};
    if (cp_output_dir_open(cp_cfg.output_dir, cp_cfg.output_dir_default, &dir, &err) != 0) {
        files_say(err.msg, err.code == CP_EIO ? errno : 0);
        A.dropped_windows++;
        return;
    }
    /* a capture's envelopes (own sequence): ISOLATE.capture-ID */
    const char *capid = cp_labels_get(&e->labels, CP_CAPTURE_LABEL);
    char isocap[160];
    snprintf(isocap, sizeof(isocap), "%s%s%s", cp_labels_get(&e->labels, CP_LABEL_ISOLATE),
             capid ? ".capture-" : "", capid ? capid : "");
    sanitize(iso, sizeof(iso), isocap);
    sanitize(svc, sizeof(svc), cp_cfg.service);
    /* pprof files are gzip'd by convention; the envelope's payload may be raw */
    cp_buf gz = {0};
    const uint8_t *data = e->pprof;
    size_t len = e->pprof_len;
    if (!cp_is_gzip(data, len)) {
        int level = len <= GZIP_STORE_MAX ? 0 : 1;
        if ((!A.gz[level] && cp_gzipper_create(level, &A.gz[level]) != 0) ||
            cp_gzipper_run(A.gz[level], data, len, &gz) != 0) {
            cp_fd_close(dir);
            A.dropped_windows++;
            return;
        }
        data = gz.data;
        len = gz.len;
    }
    /* Up to 4 names: a name taken already (the clock stepped back, another machine writing
     * to the same directory) moves this image's token on for good. */
    for (int attempt = 0; attempt < 4; attempt++, A.image_token++) {
        snprintf(path, sizeof(path), "%s.%d-%llx.%06llu.%s.%s.pb.gz", svc, (int)getpid(),
                 (unsigned long long)A.image_token, (unsigned long long)e->sequence,
                 cp_kind_name(e->kind), iso);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0 && errno == EEXIST) continue;
        int werr = fd < 0 ? errno : cp_write_all(fd, data, len);
        if (fd >= 0) close(fd);
        if (!werr && publish(dir, tmp, path) == 0) {
            cp_fd_close(dir);
            cp_buf_close(&gz);
            return;
        }
        if (!werr) werr = errno; /* publish's */
        if (fd >= 0) unlinkat(dir, tmp, 0);
        if (werr != EEXIST) {
            char msg[1600];
            snprintf(msg, sizeof(msg), "%s/%s: %s", cp_cfg.output_dir, tmp, strerror(werr));
            files_say(msg, werr);
            break;
        }
    }
    cp_fd_close(dir);
    cp_buf_close(&gz);
    A.dropped_windows++;
}

static void send_hint(const uint8_t *p, size_t len, void *arg)
{
    cp_sink_hint(arg, CP_RELAY_NAMES, p, len);
}

static void emit(cp_envelope *e, void *arg)
{
    (void)arg;
    if (A.files) write_file(e);
    if (A.sink) {
        /* the relay's name cache: what this window had to name itself, ahead of it */
        cp_window_take_names_wants(send_hint, A.sink);
        cp_sink_send(A.sink, e);
    }
    cp_envelope_close(e);
}

/* Whether the agent has a transport to hand windows to (beside files). */
static int has_transport(void)
{
    return cp_cfg.relay_dir[0] || cp_cfg.brokers[0] || cp_cfg.server[0];
}

/* The sink, made once the agent thread runs (a calloc: nothing connects until the first
 * window is sent); the capture watcher reads its brokers from the first tick on. */
static void sink_open(void)
{
    if (!A.sink && has_transport()) {
        cp_sink_options o = {
            .relay_dir = cp_cfg.relay_dir,
            .brokers = cp_cfg.brokers,
            .server = cp_cfg.server,
            .token = cp_cfg.token,
            .topic = cp_cfg.topic,
            .kafka_props = cp_cfg.kafka_props,
            .kafka_queue = cp_cfg.kafka_queue,
            .fd_revocations = &cp_fd_revocations,
        };
        cp_err err = {0};
        if (cp_sink_create(&o, &A.sink, &err) != 0) {
            static int warned;
            if (!warned++) fprintf(stderr, "contprof: %s\n", err.msg);
        }
    }
}

static void transport_tick(void)
{
    sink_open();
    if (!A.sink) return;
    cp_sink_tick(A.sink);
    A.dropped_windows += cp_sink_take_dropped(A.sink);
}

/* ------------------------------------------------------------------------------------
 * The agent thread */

static int py_raw(const cp_sample_rec *r)
{
    for (uint32_t k = 0; k < r->nframes && k < CP_MAX_FRAMES; k++)
        if (CP_PY_IS_RAW(r->pcs[k])) return 1;
    return 0;
}

static void drain(void)
{
    const cp_modules *mods = cp_modules_current();
    /* a libpython dlopen'ed by an embedder: found at the next tick */
    if (mods && cp_cfg.python) cp_py_probe(mods->gen);
    cp_py_interp_reap(); /* sub-interpreters gone since: their isolates end */
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t) continue;
        int st = atomic_load(&t->state);
        if (st != CP_T_LIVE && st != CP_T_DEAD) continue;
        unsigned h = atomic_load_explicit(&t->head, memory_order_acquire);
        unsigned tl = atomic_load_explicit(&t->tail, memory_order_relaxed);
        A.window_cpu += h - tl;
        for (; tl != h; tl++) {
            const cp_sample_rec *r = &t->ring[tl & (CP_RING - 1)];
            cp_sample_rec named;
            if (py_raw(r) || (r->isolate & CP_PY_ISO_INTERP)) {
                /* Python frames named while their code objects are most likely alive */
                memcpy(&named, r, offsetof(cp_sample_rec, pcs) + r->nframes * sizeof(uint64_t));
                cp_py_resolve(named.pcs, named.nframes);
                if (named.isolate & CP_PY_ISO_INTERP) /* a sub-interpreter's first samples */
                    named.isolate = cp_py_interp_isolate(named.isolate & ~CP_PY_ISO_INTERP, 1);
                r = &named;
            }
            if (cp_captable_routes(t, r))
                cp_captable_add_cpu(t, r);
            else
                cp_window_add_cpu(r, t->name);
        }
        atomic_store_explicit(&t->tail, tl, memory_order_release);
    }
}

static uint64_t take_dropped_samples(void)
{
    uint64_t d = cp_window_take_dropped();
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (t) d += atomic_exchange(&t->dropped, 0);
    }
    uint64_t pd = atomic_load(&cp_dropped_samples);
    d += pd - A.prev_proc_dropped;
    A.prev_proc_dropped = pd;
    uint64_t ad = atomic_load(&cp_alloc_dropped);
    d += ad - A.prev_alloc_dropped;
    A.prev_alloc_dropped = ad;
    return d;
}

static void finish_window(int64_t end)
{
    cp_window_meta m = {
        .start_ns = A.window_start,
        .end_ns = end,
        .instance = A.instance,
        .producer_id = A.producer,
        .sequence = &A.sequence,
        .dropped_samples = take_dropped_samples(),
        .dropped_windows = A.dropped_windows,
        .agent_comment = cp_captable_stats(),
    };
    A.dropped_windows = 0;
    if (cp_window_finish(&m, emit, NULL) != 0) A.dropped_windows++;
    A.window_start = end;
    cp_isolates_reap();
}

/* A last window (at stop, before exec, at _exit) with nothing in it is neither built nor
 * written: no CPU sample drained and no allocation ever sampled (so nothing live either),
 * as in a preloaded /bin/true. In a fork child that has sent nothing yet, a window without a
 * CPU sample is skipped even with sampled allocations: its in-use blocks are the parent's,
 * which reports them, and a child that forks and execs at once would otherwise build and
 * symbolize a window before every exec. On the agent thread, or on a host thread while the
 * agent thread is idle (under mu). may_lock: the sampler's lock may be taken (not on a thread
 * that may hold it: an _exit from a signal handler); without it, unknown means not empty. */
static int last_window_empty(int may_lock)
{
    if (A.window_cpu) return 0;
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) { /* samples not drained yet */
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (t && atomic_load(&t->head) != atomic_load(&t->tail)) return 0;
    }
    if ((A.forked && A.sequence == 0) || cp_cfg.alloc_rate <= 0) return 1;
    return may_lock && cp_alloc_nbuckets() == 0;
}

static void *agent_main(void *arg)
{
    (void)arg;
    cp_guard_agent_thread_begin(1);
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_setname_np(pthread_self(), "contprof-agent");
    cp_modules_refresh(0); /* contprof_start's snapshot (or the parent's) serves unless it moved */
    sink_open();
    int64_t window_end_mono = cp_mono_ns() + (cp_cfg.window_ns - (cp_now_ns() - A.window_start));
    int64_t next_names = 0;
    int stopping = 0;
    /* How often the rings are drained: before a thread's ring (CP_RING samples) is half
     * full at the sampling rate, between 100 ms (at 640 Hz and more) and 500 ms (100 Hz:
     * each wake-up costs the host a context switch and some cache). */
    int64_t tick_ns =
        cp_cfg.cpu_hz > 0 ? (int64_t)CP_RING / 2 * 1000000000 / cp_cfg.cpu_hz : 500000000;
    if (tick_ns < 100000000) tick_ns = 100000000;
    if (tick_ns > 500000000) tick_ns = 500000000;
    while (!stopping) {
        pthread_mutex_lock(&A.mu);
        if (!A.stop && A.flush_asked == A.flush_done) {
            int64_t wait_ns = window_end_mono - cp_mono_ns(); /* a window ends on time */
            if (wait_ns > tick_ns) wait_ns = tick_ns;
            /* a capture's threads fill their rings faster; its windows are short */
            if (cp_captable_active() && wait_ns > CP_CAPTABLE_TICK_NS)
                wait_ns = CP_CAPTABLE_TICK_NS;
            if (cp_threads_blocked_waiting() && wait_ns > CP_BLOCKED_TICK_NS)
                wait_ns = CP_BLOCKED_TICK_NS;
            if (wait_ns < 1000000) wait_ns = 1000000;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += wait_ns / 1000000000;
            ts.tv_nsec += wait_ns % 1000000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            A.idle = 1;
            pthread_cond_timedwait(&A.cv, &A.mu, &ts);
        }
        A.idle = 0;
        stopping = A.stop;
        uint64_t flush = A.flush_asked;
        int flushing = flush != A.flush_done;
        pthread_mutex_unlock(&A.mu);

        int64_t now = cp_mono_ns();
        /* an empty last window: no names to read, no Kafka client to build */
        int empty = (stopping || flushing) && last_window_empty(1);
        if (now >= next_names && !empty) {
            cp_threads_refresh_names();
            next_names = now + 1000000000;
        }
        if (!empty) cp_window_label_threads();
        if (!stopping && !flushing) cp_captable_update(cp_sink_brokers(A.sink));
        cp_threads_poll_blocked(); /* threads that block the sample signal: into their rings */
        drain();
        cp_threads_reap();
        if (!empty) transport_tick();
        if (empty) {
            A.window_start = cp_now_ns();
        } else if (stopping || flushing || now >= window_end_mono) {
            finish_window(cp_now_ns());
            A.window_cpu = 0;
            if (now >= window_end_mono) {
                window_end_mono += cp_cfg.window_ns;
                if (window_end_mono < now) window_end_mono = now + cp_cfg.window_ns;
            }
            transport_tick();
        }
        /* capture windows: every second, at a capture's end, and all of them at stop */
        cp_captable_flush(A.instance, A.producer, stopping || flushing, stopping, emit, NULL);
        if (flushing && !stopping) {
            /* the image ends (exec, _exit): what Kafka holds goes now, within the bound; if
             * an exec fails, transport_tick builds a new client */
            if (A.sink) {
                cp_sink_flush(A.sink, cp_cfg.flush_ns);
                A.dropped_windows += cp_sink_take_dropped(A.sink);
            }
            pthread_mutex_lock(&A.mu);
            A.flush_done = flush;
            pthread_cond_broadcast(&A.cv);
            pthread_mutex_unlock(&A.mu);
        }
    }
    cp_captable_stop();
    (void)cp_sink_destroy(A.sink, cp_cfg.flush_ns); /* exit: nowhere to report */
    A.sink = NULL;
    for (int i = 0; i < 2; i++) {
        cp_gzipper_destroy(A.gz[i]);
        A.gz[i] = NULL;
    }
    pthread_mutex_lock(&A.mu);
    A.finished = 1;
    pthread_cond_broadcast(&A.cv);
    /* The process ends next: the thread waits here for exit_group rather than ending (its
     * stack given back, its TLS torn down) while the exiting thread would wait to join it. */
    while (A.exiting)
        pthread_cond_wait(&A.cv, &A.mu);
    pthread_mutex_unlock(&A.mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------
 * Start, stop, fork */

static void new_instance(void)
{
    char host[64] = "localhost";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = 0;
    snprintf(A.instance, sizeof(A.instance), "%s:%d", host, (int)getpid());
    A.image_token = (uint64_t)cp_now_ns();
    snprintf(A.producer, sizeof(A.producer), "%s:%d:%llx", host, (int)getpid(),
             (unsigned long long)A.image_token);
    A.sequence = 0;
    A.window_start = cp_now_ns();
    A.window_cpu = 0;
    A.pid = (int)getpid();
}

/* A control message arrived (captable.c, on a librdkafka thread of the agent's): the agent
 * thread wakes now rather than at its tick. */
static void agent_wake(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&A.mu);
    pthread_cond_broadcast(&A.cv);
    pthread_mutex_unlock(&A.mu);
}

/* A thread started with the sample signal blocked (thread.c): the agent looks now. */
static void agent_wake_now(void)
{
    agent_wake(NULL);
}

/* Starts the agent thread (unregistered, never sampled). Returns 0 or CP_ENOMEM. */
static int start_agent_thread(void)
{
    A.stop = 0;
    A.finished = 0;
    A.exiting = 0;
    A.idle = 1; /* until its first wake-up it does no window's work */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    int saved = cp_in_agent;
    cp_in_agent = 1; /* glibc's allocations in here are the agent's */
    int rc = cp_thread_create_agent(&A.th, &attr, agent_main);
    cp_in_agent = saved;
    pthread_attr_destroy(&attr);
    return rc ? CP_ENOMEM : 0; /* EAGAIN: no memory or thread left; nothing else applies */
}

/* A fork child's agent thread starts when the child first needs one, not in the fork: most
 * children of a fork without exec (a shell's subshells, helpers) end within milliseconds,
 * and the thread would cost each ~0.08 ms of CPU and ~15 page faults. Needed: at a sampled
 * allocation (cp_alloc_set_sample_hook), before the child creates a thread
 * (cp_threads_set_create_hook), and at an exit or exec with samples to write (stop,
 * agent_flush). Until then CPU samples wait in the rings (CP_RING per thread, more are
 * counted dropped). On a host thread, never in the child's vfork child. */
static atomic_int g_child_pending;

/* The signal handler (cp_threads_set_fill_hook): a thread's ring fills in a fork child that
 * has no agent thread yet; its next allocation starts one. A child that never allocates
 * keeps CP_RING samples per thread until its exit writes them. Async-signal-safe. */
static void child_ring_filling(void)
{
    if (atomic_load_explicit(&g_child_pending, memory_order_relaxed)) cp_alloc_poke();
}

/* Starts a fork child's agent thread (under mu). The fd table is grown first, where the
 * child still has one thread (fd.h): its first pthread_create starts this before making a
 * thread (a thread made past the hook, by a raw clone, costs this grow a grace period). */
static int child_start(void)
{
    cp_fd_reserve();
    return start_agent_thread();
}

static void child_thread_needed(void)
{
    if (!atomic_load_explicit(&g_child_pending, memory_order_relaxed) || cp_agent_thread ||
        A.pid != (int)getpid())
        return;
    int saved = cp_in_agent;
    cp_in_agent = 1;
    /* trylock: a stop or flush holding it handles the start itself */
    if (pthread_mutex_trylock(&A.mu) == 0) {
        if (atomic_exchange(&g_child_pending, 0) && atomic_load(&A.running) && child_start() != 0) {
            cp_cpu_stop();
            cp_alloc_set_rate(0);
            atomic_store(&A.running, 0);
        }
        pthread_mutex_unlock(&A.mu);
    }
    cp_in_agent = saved;
}

static void atfork_prepare(void)
{
    cp_lang_atfork_prepare();
    cp_alloc_atfork_prepare();
}

static void atfork_parent(void)
{
    cp_alloc_atfork_parent();
    cp_lang_atfork_parent();
}

static void atfork_child(void)
{
    cp_alloc_atfork_child();
    cp_lang_atfork_child();
    if (!atomic_load(&A.running)) return;
    /* The child is a new instance: its own timers, its own Kafka handle, no lock held. */
    pthread_mutex_init(&A.mu, NULL);
    pthread_cond_init(&A.cv, NULL);
    cp_sink_after_fork_child(A.sink, cp_fd_close);
    A.gz[0] = A.gz[1] = NULL; /* the parent's agent may have been freeing them: lost */
    A.dropped_windows = 0;
    A.flush_asked = A.flush_done = 0;
    A.forked = 1;
    cp_guard_after_fork_child();
    cp_threads_after_fork_child();
    new_instance();
    cp_window_abandon();
    cp_captable_after_fork_child();
    A.idle = 1;
    atomic_store(&g_child_pending, 1); /* the agent thread when needed (child_thread_needed) */
}

/* How long exec and _exit wait for the agent thread to write the current window, beyond
 * the Kafka flush bound when brokers are configured. Past it they go on: a host thread that
 * calls _exit holding a lock the agent thread needs (the sampler's, from a signal handler
 * that interrupted a malloc hook) must not hang its process. */
#define FLUSH_WAIT_NS (200 * (int64_t)1000000)

static void deadline_in(struct timespec *ts, int64_t ns)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ns / 1000000000;
    ts->tv_nsec += ns % 1000000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

/* The image is about to end (exec, _exit, _Exit, syscall(SYS_exit_group); exec.c and fd.c
 * call this): asks the agent thread to finish the current window now and waits for it,
 * bounded. Not on the agent's own threads, not in a vfork child (or a clone that shares this
 * memory without being this process: the agent thread is not its own), not before start or
 * after stop. Every wait is bounded, the lock too: the caller may be a signal handler that
 * interrupted this same function. */
static void agent_flush(void)
{
    if (!atomic_load(&A.running) || cp_agent_thread || cp_in_agent || A.pid != (int)getpid())
        return;
    int e = errno;
    cp_thread_say_name();
    int64_t bound = FLUSH_WAIT_NS;
    if (cp_cfg.relay_dir[0])
        bound += 2 * CP_SINK_RELAY_TIMEOUT_NS; /* one time-out, then the spool */
    else if (cp_cfg.brokers[0] || cp_cfg.server[0])
        bound += cp_cfg.flush_ns;
    struct timespec ts;
    deadline_in(&ts, bound);
    if (pthread_mutex_timedlock(&A.mu, &ts) != 0) {
        errno = e;
        return;
    }
    if (A.idle && cp_sink_idle(A.sink) &&
        last_window_empty(0)) { /* nothing to write: no round trip */
        pthread_mutex_unlock(&A.mu);
        errno = e;
        return;
    }
    if (atomic_exchange(&g_child_pending, 0) && child_start() != 0) {
        pthread_mutex_unlock(&A.mu); /* no thread: the window is lost */
        errno = e;
        return;
    }
    uint64_t want = ++A.flush_asked;
    pthread_cond_broadcast(&A.cv);
    int rc = 0;
    while (A.flush_done < want && !A.finished && rc == 0)
        rc = pthread_cond_timedwait(&A.cv, &A.mu, &ts);
    pthread_mutex_unlock(&A.mu);
    errno = e;
}

/* Removes this library from LD_PRELOAD so exec'd children run without it. */
static void strip_preload(void)
{
    const char *pl = getenv("LD_PRELOAD");
    if (!pl) return;
    char buf[4096], out[4096];
    snprintf(buf, sizeof(buf), "%s", pl);
    out[0] = 0;
    size_t o = 0;
    for (char *save, *tok = strtok_r(buf, ": ", &save); tok; tok = strtok_r(NULL, ": ", &save)) {
        if (strstr(tok, "libcontprof")) continue;
        int w = snprintf(out + o, sizeof(out) - o, "%s%s", o ? ":" : "", tok);
        if (w < 0 || (size_t)w >= sizeof(out) - o) break;
        o += (size_t)w;
    }
    if (o)
        setenv("LD_PRELOAD", out, 1);
    else
        unsetenv("LD_PRELOAD");
}

CONTPROF_EXTERN int contprof_start(const contprof_options *opts)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&A.running, &expect, 1)) return 0;
    int saved = cp_in_agent;
    cp_in_agent = 1;
    cp_err err = {0};
    int rc = cp_config_load(&cp_cfg, opts, &err);
    if (rc != 0) {
        /* a configuration the agent cannot read: say so and leave the program alone */
        fprintf(stderr, "contprof: %s; the agent is not started\n", err.msg);
        atomic_store(&A.running, 0);
        cp_in_agent = saved;
        return rc;
    }
    if (!cp_cfg.children) strip_preload();
    new_instance();
    /* the output directory is checked now, to say at once why no file will come */
    A.files = 0;
    A.files_said = 0;
    if (cp_cfg.output_dir[0]) {
        int dir;
        if (cp_output_dir_open(cp_cfg.output_dir, cp_cfg.output_dir_default, &dir, &err) == 0) {
            cp_fd_close(dir);
            A.files = 1;
        } else if (!has_transport()) {
            /* nowhere to write: the program runs on without the agent */
            fprintf(stderr, "contprof: %s; no profile is written, the agent is not started\n",
                    err.msg);
            atomic_store(&A.running, 0);
            cp_in_agent = saved;
            return CP_EINVAL;
        } else {
            fprintf(stderr, "contprof: %s; windows go to the relay or Kafka only\n", err.msg);
        }
    }
    cp_modules_refresh(1);
    if (cp_cfg.alloc_rate > 0 && cp_alloc_init() == 0) cp_alloc_set_rate(cp_cfg.alloc_rate);
    cp_exec_resolve();
    cp_exec_set_flush(agent_flush);
    cp_captable_set_wake(agent_wake);
    cp_fd_set_exit_hook(agent_flush);
    cp_fatal_set_flush(agent_flush);
    cp_threads_set_blocked_hook(agent_wake_now);
    cp_alloc_set_sample_hook(child_thread_needed);
    cp_threads_set_create_hook(child_thread_needed);
    cp_threads_set_fill_hook(child_ring_filling);
    if (cp_cpu_start() != 0) snprintf(cp_engine, sizeof(cp_engine), "off");
    if (cp_cfg.python) cp_py_probe(0); /* the program's own CPython: from the first sample */
    if (cp_cfg.alloc_rate > 0 && cp_alloc_host_owns_malloc()) {
        /* said once per program (not again in its exec'd children of the same name) and in
         * every envelope: no alloc or inuse window will come, and why */
        fprintf(stderr,
                "contprof: %s defines its own malloc, which the loader binds before the "
                "agent's: allocations through it are not seen (only those of the libraries "
                "that bring their own calls); CPU is sampled\n",
                program_invocation_short_name);
        size_t l = strlen(cp_engine);
        snprintf(cp_engine + l, sizeof(cp_engine) - l,
                 "; alloc=partial (the program's own malloc)");
    }
    cp_threads_scan();
    /* one thread (the constructor, before main): grow the fd table now, where it costs no
     * RCU grace period (fd.h) */
    if (atomic_load(&cp_threads_hwm) <= 1) cp_fd_reserve();
    if (!A.atfork_done) {
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        A.atfork_done = 1;
    }
    rc = start_agent_thread();
    if (rc != 0) {
        cp_cpu_stop();
        cp_alloc_set_rate(0);
        atomic_store(&A.running, 0);
    }
    cp_in_agent = saved;
    return rc;
}

/* at_exit (the destructor): the process ends next, so an agent thread that is idle, with an
 * empty last window and no Kafka client to flush, is told to stop and not waited for (it
 * has nothing to write; exit_group ends it wherever it is). A preloaded /bin/true exits
 * without a context switch to the agent thread. */
static void stop(int at_exit)
{
    if (!atomic_load(&A.running)) return;
    cp_cpu_stop();
    cp_thread_say_name();
    pthread_mutex_lock(&A.mu);
    int pending = atomic_exchange(&g_child_pending, 0);
    int nothing = (at_exit || pending) && A.idle && cp_sink_idle(A.sink) && last_window_empty(1);
    if (!nothing && pending && child_start() != 0) nothing = 1;
    A.stop = 1;
    A.exiting = at_exit;
    pthread_cond_broadcast(&A.cv);
    if (nothing) {
        pthread_mutex_unlock(&A.mu);
        cp_alloc_set_rate(0);
        atomic_store(&A.running, 0);
        return;
    }
    /* Bounded: the final window plus the Kafka flush, then we go on regardless. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t wait_ms = cp_cfg.flush_ns / 1000000 + 3000;
    ts.tv_sec += wait_ms / 1000;
    ts.tv_nsec += (wait_ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    int rc = 0;
    while (!A.finished && rc == 0)
        rc = pthread_cond_timedwait(&A.cv, &A.mu, &ts);
    int done = A.finished;
    pthread_mutex_unlock(&A.mu);
    if (done && !at_exit)
        pthread_join(A.th, NULL);
    else
        pthread_detach(A.th); /* at exit: it waits for exit_group (agent_main) */
    cp_alloc_set_rate(0);
    atomic_store(&A.running, 0);
}

CONTPROF_EXTERN void contprof_stop(void)
{
    stop(0);
}

CONTPROF_EXTERN int contprof_running(void)
{
    return atomic_load(&A.running);
}

/* Preloaded: start before main when CONTPROF_* says so (any CONTPROF_ variable, or the
 * library being in LD_PRELOAD). Linked: the program calls contprof_start. */
__attribute__((constructor)) static void contprof_ctor(void)
{
    /* the exec and _exit hooks' next functions, found now even if the agent stays idle: an
     * _exit from a signal handler must not be the first to call dlsym */
    cp_exec_resolve();
    const char *pl = getenv("LD_PRELOAD");
    const char *dis = getenv("CONTPROF_DISABLE");
    if (dis && *dis && strcmp(dis, "0") != 0) return;
    if ((pl && strstr(pl, "libcontprof")) || getenv("CONTPROF_AUTOSTART")) contprof_start(NULL);
}

__attribute__((destructor)) static void contprof_dtor(void)
{
    stop(1);
}
