/* CPU sampling: the thread registry, one CPU-time event per thread (perf task-clock, or a
 * POSIX thread CPU timer as fallback), the signal handler that unwinds into the thread's
 * own lock-free ring, and the pthread_create/pthread_setname_np hooks that bring new
 * threads in. */
#include <dirent.h>
#include <stdarg.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "collector_int.h"

cp_thread *_Atomic cp_threads[CP_MAX_THREADS];
atomic_uint cp_threads_hwm;
CP_TLS cp_thread *cp_self;
CP_TLS int cp_in_agent;
char cp_engine[64];
int64_t cp_period_ns;
atomic_uint_fast64_t cp_dropped_samples;

static int g_sig = SIGPROF;
static atomic_int g_cpu_on;
static int g_use_perf;
static int g_perf_user_only; /* set once kernel time turned out not to be allowed */
static pthread_key_t g_key;
static int g_key_ok;
pid_t cp_agent_tid; /* set by agent.c; never sampled */

static void set_name(char *dst, const char *src)
{
    size_t n = strnlen(src, 15);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static pid_t my_tid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/* ------------------------------------------------------------------------------------
 * The signal handler */

static cp_thread *find_by_tid(pid_t tid)
{
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (t && t->tid == tid && atomic_load(&t->state) == CP_T_LIVE) return t;
    }
    return NULL;
}

static void ring_push(cp_thread *t, const cp_sample_rec *r)
{
    unsigned h = atomic_load_explicit(&t->head, memory_order_relaxed);
    unsigned tl = atomic_load_explicit(&t->tail, memory_order_acquire);
    if (h - tl >= CP_RING) {
        atomic_fetch_add_explicit(&t->dropped, r->weight, memory_order_relaxed);
        return;
    }
    cp_sample_rec *slot = &t->ring[h & (CP_RING - 1)];
    slot->isolate = r->isolate;
    slot->weight = r->weight;
    slot->nframes = r->nframes;
    memcpy(slot->pcs, r->pcs, r->nframes * sizeof(uint64_t));
    atomic_store_explicit(&t->head, h + 1, memory_order_release);
}

/* Counts the overflows recorded in a perf ring since the last call and frees their space.
 * Signals for several overflows can merge into one; the ring still counts each. */
#define PERF_RING_PAGES 1
static uint64_t perf_consume(void *ring)
{
    struct perf_event_mmap_page *pg = ring;
    uint64_t head = __atomic_load_n(&pg->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = pg->data_tail;
    uint64_t size = pg->data_size ? pg->data_size : 4096u * PERF_RING_PAGES;
    const uint8_t *data = (const uint8_t *)ring + (pg->data_offset ? pg->data_offset : 4096);
    uint64_t n = 0;
    while (tail + sizeof(struct perf_event_header) <= head) {
        struct perf_event_header h;
        uint64_t off = tail % size;
        memcpy(&h, data + off, sizeof(h)); /* headers are 8-aligned: never wrap */
        if (h.size == 0) break;
        if (h.type == PERF_RECORD_SAMPLE) {
            n++;
        } else if (h.type == PERF_RECORD_LOST) {
            uint64_t lost;
            memcpy(&lost, data + (off + 16) % size, sizeof(lost));
            n += lost;
        }
        tail += h.size;
    }
    __atomic_store_n(&pg->data_tail, head, __ATOMIC_RELEASE);
    return n;
}

#define CP_PEND_MAX_WEIGHT 256

static void handler(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    int saved_errno = errno;
    uint64_t weight = 1;
    if (si->si_code == SI_TIMER) {
        weight = 1 + (uint64_t)(si->si_overrun > 0 ? si->si_overrun : 0);
    } else if (si->si_code >= POLL_IN && si->si_code <= POLL_HUP) {
        weight = 1;
    } else {
        goto out; /* not ours (kill, setitimer) */
    }
    cp_thread *t = cp_self;
    if (!t) t = find_by_tid(my_tid());
    if (!t || atomic_load_explicit(&t->state, memory_order_acquire) != CP_T_LIVE) {
        atomic_fetch_add(&cp_dropped_samples, weight);
        goto out;
    }
    if (si->si_code != SI_TIMER && t->perf_fd >= 0) {
        if (t->perf_ring) {
            weight = perf_consume(t->perf_ring);
            if (!weight) goto out; /* a signal for overflows already counted */
        } else {
            ioctl(t->perf_fd, PERF_EVENT_IOC_REFRESH, 1);
        }
    }
    if (!atomic_load_explicit(&g_cpu_on, memory_order_relaxed)) goto out;

    ucontext_t *uc = ucv;
    cp_uregs r = {
        .pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP],
        .sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP],
        .fp = (uintptr_t)uc->uc_mcontext.gregs[REG_RBP],
    };
    unsigned depth = atomic_load_explicit(&t->iso_depth, memory_order_relaxed);
    uint32_t iso = depth ? t->iso_stack[(depth > 16 ? 16 : depth) - 1] : 0;
    int walk = iso && iso <= CP_MAX_ISOLATES &&
               atomic_load_explicit(&cp_isolates[iso - 1].walker, memory_order_relaxed);

    if (walk) {
        /* Language frames are added at the next safe point; a sample still waiting
         * from before goes out without them. */
        if (atomic_load_explicit(&t->pending, memory_order_relaxed)) {
            if (t->pend.isolate == iso && t->pend.weight < CP_PEND_MAX_WEIGHT) {
                /* Still waiting for the safe point: this period of CPU time goes to the
                 * same sample, whose language frames the safe point will supply. (A
                 * runtime that never reaches one still ships its CPU time, without
                 * language frames, every CP_PEND_MAX_WEIGHT periods.) */
                t->pend.weight += weight;
                goto request;
            }
            ring_push(t, &t->pend);
            atomic_store_explicit(&t->pending, 0, memory_order_relaxed);
        }
        t->pend.isolate = iso;
        t->pend.weight = weight;
        t->pend.nframes = (uint32_t)cp_unwind(&r, t->stack_lo, t->stack_hi, t->pend.pcs,
                                              CP_MAX_FRAMES, &t->ucache_sig);
        atomic_store_explicit(&t->pending, 1, memory_order_release);
    request:;
        contprof_safepoint_request rq =
            atomic_load_explicit(&cp_isolates[iso - 1].request, memory_order_acquire);
        if (rq) rq(atomic_load_explicit(&cp_isolates[iso - 1].request_arg, memory_order_relaxed));
        goto out;
    }

    unsigned h = atomic_load_explicit(&t->head, memory_order_relaxed);
    unsigned tl = atomic_load_explicit(&t->tail, memory_order_acquire);
    if (h - tl >= CP_RING) {
        atomic_fetch_add_explicit(&t->dropped, weight, memory_order_relaxed);
        goto out;
    }
    cp_sample_rec *slot = &t->ring[h & (CP_RING - 1)];
    slot->isolate = iso;
    slot->weight = weight;
    slot->nframes =
        (uint32_t)cp_unwind(&r, t->stack_lo, t->stack_hi, slot->pcs, CP_MAX_FRAMES, &t->ucache_sig);
    atomic_store_explicit(&t->head, h + 1, memory_order_release);
out:
    errno = saved_errno;
}

/* ------------------------------------------------------------------------------------
 * Arming one thread */

static uint64_t rnd_state;

static uint64_t rnd(void)
{
    uint64_t x = rnd_state ? rnd_state : (uint64_t)cp_mono_ns() | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rnd_state = x;
    return x;
}

static int arm_perf(cp_thread *t)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a);
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.sample_period = (uint64_t)cp_period_ns;
    a.sample_type = PERF_SAMPLE_IP;
    a.wakeup_events = 1;
    a.exclude_hv = 1;
    a.disabled = 1;
    /* Time in system calls is CPU time too (the timer engine counts it); only where
     * perf_event_paranoid forbids that are samples limited to user mode. */
    a.exclude_kernel = g_perf_user_only;
    int fd = (int)syscall(SYS_perf_event_open, &a, t->tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0 && !a.exclude_kernel && (errno == EACCES || errno == EPERM)) {
        g_perf_user_only = a.exclude_kernel = 1;
        fd = (int)syscall(SYS_perf_event_open, &a, t->tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    }
    if (fd < 0) return -errno;
    /* With a ring the event never stops and each overflow is counted there; without one
     * (perf_event_mlock_kb exhausted) each signal re-arms it for one more overflow. */
    void *ring =
        mmap(NULL, 4096u * (1 + PERF_RING_PAGES), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) ring = NULL;
    struct f_owner_ex own = {.type = F_OWNER_TID, .pid = t->tid};
    if (fcntl(fd, F_SETFL, O_ASYNC) < 0 || fcntl(fd, F_SETSIG, g_sig) < 0 ||
        fcntl(fd, F_SETOWN_EX, &own) < 0 || ioctl(fd, PERF_EVENT_IOC_RESET, 0) < 0) {
        int e = -errno;
        if (ring) munmap(ring, 4096u * (1 + PERF_RING_PAGES));
        close(fd);
        return e;
    }
    t->perf_ring = ring;
    t->perf_fd = fd;
    if (ioctl(fd, ring ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_REFRESH, ring ? 0 : 1) < 0) {
        int e = -errno;
        if (ring) munmap(ring, 4096u * (1 + PERF_RING_PAGES));
        close(fd);
        t->perf_fd = -1;
        t->perf_ring = NULL;
        return e;
    }
    return 0;
}

static int arm_timer(cp_thread *t)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof(sev));
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = g_sig;
    sev._sigev_un._tid = t->tid;
    /* The CPU clock of any thread of ours: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED). */
    clockid_t clk = (clockid_t)((~(unsigned)t->tid << 3) | 6);
    timer_t id;
    if (timer_create(clk, &sev, &id) < 0) return -errno;
    struct itimerspec its;
    /* First expiry uniform in (0, period], so short-lived threads are not biased. */
    int64_t first = 1 + (int64_t)(rnd() % (uint64_t)cp_period_ns);
    its.it_value.tv_sec = first / 1000000000;
    its.it_value.tv_nsec = first % 1000000000;
    its.it_interval.tv_sec = cp_period_ns / 1000000000;
    its.it_interval.tv_nsec = cp_period_ns % 1000000000;
    if (timer_settime(id, 0, &its, NULL) < 0) {
        int e = -errno;
        timer_delete(id);
        return e;
    }
    t->timer = id;
    t->has_timer = 1;
    return 0;
}

static void arm(cp_thread *t)
{
    if (!atomic_load(&g_cpu_on) || t->perf_fd >= 0 || t->has_timer) return;
    if (g_use_perf && arm_perf(t) == 0) return;
    if (arm_timer(t) < 0) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            fprintf(stderr,
                    "contprof: cannot arm a CPU timer for thread %d (ulimit -i?); "
                    "some threads are not sampled\n",
                    (int)t->tid);
    }
}

static void disarm(cp_thread *t)
{
    if (t->perf_fd >= 0) {
        ioctl(t->perf_fd, PERF_EVENT_IOC_DISABLE, 0);
        int fd = t->perf_fd;
        t->perf_fd = -1;
        if (t->perf_ring) munmap(t->perf_ring, 4096u * (1 + PERF_RING_PAGES));
        t->perf_ring = NULL;
        close(fd);
    }
    if (t->has_timer) {
        timer_delete(t->timer);
        t->has_timer = 0;
    }
}

/* ------------------------------------------------------------------------------------
 * Registry */

static cp_thread *slot_acquire(void)
{
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        int expect = CP_T_FREE;
        if (t && atomic_compare_exchange_strong(&t->state, &expect, 3)) return t;
    }
    unsigned i = atomic_fetch_add(&cp_threads_hwm, 1);
    if (i >= CP_MAX_THREADS) {
        atomic_fetch_sub(&cp_threads_hwm, 1);
        return NULL;
    }
    cp_thread *t =
        mmap(NULL, sizeof(cp_thread), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t == MAP_FAILED) {
        /* the slot index stays empty (NULL) and is skipped */
        return NULL;
    }
    atomic_store(&t->state, 3);
    atomic_store(&cp_threads[i], t);
    return t;
}

static void slot_init(cp_thread *t, pid_t tid)
{
    t->tid = tid;
    t->perf_fd = -1;
    t->perf_ring = NULL;
    t->has_timer = 0;
    t->stack_lo = t->stack_hi = 0;
    t->own_tls = 0;
    t->name[0] = 0;
    atomic_store(&t->iso_depth, 0);
    atomic_store(&t->head, 0);
    atomic_store(&t->tail, 0);
    atomic_store(&t->dropped, 0);
    atomic_store(&t->pending, 0);
}

static void thread_exit(void *arg);

cp_thread *cp_thread_register_self(void)
{
    if (cp_self) return cp_self;
    pid_t tid = my_tid();
    if (tid == cp_agent_tid) return NULL;
    cp_thread *t = find_by_tid(tid); /* found by a /proc scan earlier */
    int fresh = 0;
    if (!t) {
        t = slot_acquire();
        if (!t) return NULL;
        slot_init(t, tid);
        fresh = 1;
    }
    int saved = cp_in_agent;
    cp_in_agent = 1; /* pthread_getattr_np allocates */
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *addr;
        size_t size;
        if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
            t->stack_lo = (uintptr_t)addr;
            t->stack_hi = (uintptr_t)addr + size;
        }
        pthread_attr_destroy(&attr);
    }
    cp_in_agent = saved;
    t->self = pthread_self();
    t->own_tls = 1;
    prctl(PR_GET_NAME, t->name, 0, 0, 0);
    cp_self = t;
    if (g_key_ok) pthread_setspecific(g_key, t);
    if (fresh) {
        atomic_store(&t->state, CP_T_LIVE);
        arm(t);
    }
    return t;
}

/* The pthread key destructor: the thread is going away. */
static void thread_exit(void *arg)
{
    cp_thread *t = arg;
    if (!t || t != cp_self) return;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, g_sig);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    disarm(t);
    if (atomic_load(&t->pending)) {
        ring_push(t, &t->pend);
        atomic_store(&t->pending, 0);
    }
    prctl(PR_GET_NAME, t->name, 0, 0, 0);
    cp_self = NULL;
    atomic_store(&t->state, CP_T_DEAD);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void cp_threads_scan(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid == cp_agent_tid || find_by_tid(tid)) continue;
        cp_thread *t = slot_acquire();
        if (!t) break;
        slot_init(t, tid);
        /* Stack bounds unknown for a thread we did not see start: leaf frames only. */
        atomic_store(&t->state, CP_T_LIVE);
        arm(t);
    }
    closedir(d);
}

void cp_threads_refresh_names(void)
{
    unsigned n = atomic_load(&cp_threads_hwm);
    char path[64], buf[32];
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_LIVE) continue;
        snprintf(path, sizeof(path), "/proc/self/task/%d/comm", (int)t->tid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT && !t->own_tls) {
                /* a thread we never hooked is gone */
                disarm(t);
                atomic_store(&t->state, CP_T_DEAD);
            }
            continue;
        }
        ssize_t k = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (k <= 0) continue;
        buf[k] = 0;
        buf[strcspn(buf, "\n")] = 0;
        if (strncmp(buf, t->name, 16) != 0) set_name(t->name, buf);
    }
}

void cp_threads_reap(void)
{
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_DEAD) continue;
        if (atomic_load(&t->head) != atomic_load(&t->tail)) continue; /* not drained */
        atomic_store(&t->state, CP_T_FREE);
    }
}

void cp_threads_after_fork_child(void)
{
    pid_t tid = my_tid();
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t) continue;
        /* perf fds are inherited but count the parent's threads; timers are not. */
        if (t->perf_fd >= 0) close(t->perf_fd);
        if (t->perf_ring) munmap(t->perf_ring, 4096u * (1 + PERF_RING_PAGES));
        t->perf_ring = NULL;
        t->perf_fd = -1;
        t->has_timer = 0;
        atomic_store(&t->head, 0);
        atomic_store(&t->tail, 0);
        atomic_store(&t->dropped, 0);
        atomic_store(&t->pending, 0);
        if (t == cp_self)
            t->tid = tid;
        else
            atomic_store(&t->state, CP_T_FREE);
    }
    if (cp_self) {
        atomic_store(&cp_self->state, CP_T_LIVE);
        arm(cp_self);
    }
}

/* ------------------------------------------------------------------------------------
 * Start and stop */

static int perf_usable(void)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a);
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.sample_period = 1000000;
    a.exclude_kernel = 1;
    a.disabled = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

void cp_exec_resolve(void);

/* The engine. A perf task-clock event samples at any period, but costs the host more per
 * second than its samples: the kernel starts and cancels the event's hrtimer each time
 * the thread is scheduled in and out, and every sample is a timer interrupt plus an
 * irq_work interrupt before the signal (on a virtual machine, VM exits). A POSIX
 * thread CPU timer is checked on the scheduler tick that runs anyway and sends its
 * signal directly, but it can only expire on a tick. So by default (CONTPROF_CPU_ENGINE
 * unset) perf is used only for periods shorter than two ticks (above 125 Hz at the 4 ms
 * tick of these machines), where the tick would blur them; longer periods, the 100 Hz
 * default among them, use the timers: each sample then lands on the first tick after its
 * period has elapsed (at 100 Hz: 8 or 12 ms apart, 10 on average, weight 1). The costs
 * measured on the collector bench are in README.md. CONTPROF_CPU_ENGINE=perf or =timer
 * forces one engine at any rate. */
#define CP_TICK_NS 4000000
#define CP_TIMER_MIN_PERIOD_NS (2 * CP_TICK_NS)

int cp_cpu_start(void)
{
    cp_exec_resolve();
    if (!g_key_ok && pthread_key_create(&g_key, thread_exit) == 0) g_key_ok = 1;
    if (cp_cfg.cpu_hz <= 0) {
        snprintf(cp_engine, sizeof(cp_engine), "off");
        return 0;
    }
    cp_period_ns = 1000000000 / cp_cfg.cpu_hz;
    struct sigaction old;
    if (sigaction(SIGPROF, NULL, &old) == 0 && old.sa_handler != SIG_DFL &&
        old.sa_handler != SIG_IGN)
        g_sig = SIGVTALRM; /* the program profiles itself with SIGPROF: leave it alone */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(g_sig, &sa, NULL) < 0) return -errno;

    g_use_perf = cp_cfg.cpu_engine != CP_ENGINE_TIMER &&
                 (cp_cfg.cpu_engine == CP_ENGINE_PERF || cp_period_ns < CP_TIMER_MIN_PERIOD_NS) &&
                 perf_usable();
    if (g_use_perf) {
        snprintf(cp_engine, sizeof(cp_engine), "perf-task-clock %gms", cp_period_ns / 1e6);
    } else {
        /* POSIX CPU timers expire on the scheduler tick (CONFIG_HZ, not visible to user
         * space; clock_getres says 1 ns): report the period, or the tick if that is longer. */
        int64_t res = cp_period_ns < CP_TICK_NS ? CP_TICK_NS : cp_period_ns;
        snprintf(cp_engine, sizeof(cp_engine), "posix-cpu-timer %gms", res / 1e6);
    }
    atomic_store(&g_cpu_on, 1);
    cp_thread_register_self();
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (t && atomic_load(&t->state) == CP_T_LIVE) arm(t);
    }
    return 0;
}

void cp_cpu_stop(void)
{
    atomic_store(&g_cpu_on, 0);
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (t && atomic_load(&t->state) == CP_T_LIVE) disarm(t);
    }
}

/* ------------------------------------------------------------------------------------
 * Hooks */

typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
typedef int (*setname_fn)(pthread_t, const char *);

typedef struct start_arg {
    void *(*fn)(void *);
    void *arg;
    int agent; /* created by the agent (librdkafka's threads): neither sampled nor hooked */
} start_arg;

static void *start_thunk(void *p)
{
    start_arg sa = *(start_arg *)p;
    cp_real_free(p);
    if (sa.agent)
        cp_in_agent = cp_agent_thread = 1;
    else
        cp_thread_register_self();
    return sa.fn(sa.arg);
}

CONTPROF_EXTERN int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                                   void *arg)
{
    static pthread_create_fn real;
    if (!real) real = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (!real) return EAGAIN;
    start_arg *sa = cp_real_malloc(sizeof(*sa));
    if (!sa) return real(th, attr, fn, arg); /* degrade: the thread is scanned later */
    sa->fn = fn;
    sa->arg = arg;
    sa->agent = cp_in_agent;
    int rc = real(th, attr, start_thunk, sa);
    if (rc != 0) cp_real_free(sa);
    return rc;
}

CONTPROF_EXTERN int pthread_setname_np(pthread_t th, const char *name)
{
    static setname_fn real;
    if (!real) real = (setname_fn)dlsym(RTLD_NEXT, "pthread_setname_np");
    if (!real) return ENOSYS;
    int rc = real(th, name);
    if (rc == 0) {
        unsigned n = atomic_load(&cp_threads_hwm);
        for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
            cp_thread *t = atomic_load(&cp_threads[i]);
            if (t && t->own_tls && pthread_equal(t->self, th) &&
                atomic_load(&t->state) == CP_T_LIVE)
                set_name(t->name, name);
        }
    }
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Safe points */

CONTPROF_EXTERN void contprof_safepoint(void)
{
    cp_thread *t = cp_self;
    if (!t || !atomic_load_explicit(&t->pending, memory_order_acquire)) return;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, g_sig);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    if (atomic_load(&t->pending)) {
        cp_sample_rec *r = &t->pend;
        uint32_t iso = r->isolate;
        contprof_walker fn =
            iso && iso <= CP_MAX_ISOLATES ? atomic_load(&cp_isolates[iso - 1].walker) : NULL;
        if (fn) {
            /* the walker and the interning are the agent's work: not sampled */
            int saved_in_agent = cp_in_agent;
            cp_in_agent = 1;
            contprof_frame fr[32];
            int k = fn(atomic_load(&cp_isolates[iso - 1].walker_arg), fr, 32);
            if (k > 32) k = 32;
            if (k < 0) k = 0;
            uint64_t ids[32];
            int m = cp_lang_ids(fr, k, ids);
            /* language frames go on top (leaf side) of the native stack, or in place of
             * the runtime's own frames */
            r->nframes = cp_lang_join(iso, r->pcs, r->nframes, ids, (uint32_t)m);
            cp_in_agent = saved_in_agent;
        }
        ring_push(t, r);
        atomic_store(&t->pending, 0);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ------------------------------------------------------------------------------------
 * exec: a sample signal still pending when the image is replaced would be delivered to
 * the new program with the default action (terminate). Before exec the calling thread's
 * event is disarmed and a pending signal discarded (ignoring a signal drops it); other
 * threads vanish with the old image. If exec fails, the event is re-armed. */

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);

static struct {
    execve_fn execve;
    execvpe_fn execvpe;
    execv_fn execv, execvp;
} rx;

/* Resolved at start: dlsym after fork in a threaded program is best avoided. */
void cp_exec_resolve(void)
{
    if (!rx.execve) rx.execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    if (!rx.execvpe) rx.execvpe = (execvpe_fn)dlsym(RTLD_NEXT, "execvpe");
    if (!rx.execv) rx.execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
    if (!rx.execvp) rx.execvp = (execv_fn)dlsym(RTLD_NEXT, "execvp");
}

static cp_thread *before_exec(void)
{
    if (!rx.execve) cp_exec_resolve();
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, g_sig);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    cp_thread *t = cp_self ? cp_self : find_by_tid(my_tid());
    if (t) disarm(t);
    struct sigaction ign, cur;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    if (sigaction(g_sig, &ign, &cur) == 0) sigaction(g_sig, &cur, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return t;
}

static void after_failed_exec(cp_thread *t)
{
    int e = errno;
    if (t && atomic_load(&t->state) == CP_T_LIVE) arm(t);
    errno = e;
}

CONTPROF_EXTERN int execve(const char *path, char *const argv[], char *const envp[])
{
    cp_thread *t = before_exec();
    if (!rx.execve) return errno = ENOSYS, -1;
    int rc = rx.execve(path, argv, envp);
    after_failed_exec(t);
    return rc;
}

CONTPROF_EXTERN int execvpe(const char *file, char *const argv[], char *const envp[])
{
    cp_thread *t = before_exec();
    if (!rx.execvpe) return errno = ENOSYS, -1;
    int rc = rx.execvpe(file, argv, envp);
    after_failed_exec(t);
    return rc;
}

CONTPROF_EXTERN int execv(const char *path, char *const argv[])
{
    cp_thread *t = before_exec();
    if (!rx.execv) return errno = ENOSYS, -1;
    int rc = rx.execv(path, argv);
    after_failed_exec(t);
    return rc;
}

CONTPROF_EXTERN int execvp(const char *file, char *const argv[])
{
    cp_thread *t = before_exec();
    if (!rx.execvp) return errno = ENOSYS, -1;
    int rc = rx.execvp(file, argv);
    after_failed_exec(t);
    return rc;
}

/* The variadic forms collect their arguments on the stack (no malloc: exec is called
 * between fork and exec, where only async-signal-safe functions are allowed). */
#define CP_EXEC_MAX_ARGS 1024
#define COLLECT_ARGS(arg0, ap, argv, n)                                                            \
    do {                                                                                           \
        argv[0] = (char *)(arg0);                                                                  \
        n = 1;                                                                                     \
        while (n < CP_EXEC_MAX_ARGS && (argv[n] = va_arg(ap, char *)) != NULL)                     \
            n++;                                                                                   \
        if (n == CP_EXEC_MAX_ARGS) {                                                               \
            va_end(ap);                                                                            \
            errno = E2BIG;                                                                         \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

CONTPROF_EXTERN int execl(const char *path, const char *arg, ...)
{
    char *argv[CP_EXEC_MAX_ARGS];
    int n;
    va_list ap;
    va_start(ap, arg);
    COLLECT_ARGS(arg, ap, argv, n);
    va_end(ap);
    return execv(path, argv);
}

CONTPROF_EXTERN int execlp(const char *file, const char *arg, ...)
{
    char *argv[CP_EXEC_MAX_ARGS];
    int n;
    va_list ap;
    va_start(ap, arg);
    COLLECT_ARGS(arg, ap, argv, n);
    va_end(ap);
    return execvp(file, argv);
}

CONTPROF_EXTERN int execle(const char *path, const char *arg, ...)
{
    char *argv[CP_EXEC_MAX_ARGS];
    int n;
    va_list ap;
    va_start(ap, arg);
    COLLECT_ARGS(arg, ap, argv, n);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, argv, envp);
}
