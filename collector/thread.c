/* CPU sampling: the thread registry, one CPU-time event per thread (perf task-clock, or a
 * POSIX thread CPU timer as fallback), the signal handler that unwinds into the thread's
 * own lock-free ring, the host's view of signals, the pthread_create/pthread_setname_np
 * hooks that bring new threads in, and the isolate a thread is in. */
#include "guard.h"
#include "thread.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <asm/perf_regs.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/single_threaded.h>
#include <sched.h>
#include <signal.h>
#include <threads.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include "config.h"
#include "fatal.h"
#include "fd.h"
#include "isolate.h"
#include "nextmalloc.h"
#include "python.h"
#include "times.h"

cp_thread *_Atomic cp_threads[CP_MAX_THREADS] CP_BIG;
atomic_uint cp_threads_hwm;
CP_TLS cp_thread *cp_self;
char cp_engine[64];
int64_t cp_period_ns;
atomic_uint_fast64_t cp_dropped_samples;

static atomic_int g_sig = SIGPROF; /* the signal the agent samples on now */
static atomic_int g_cpu_on;
/* Why CPU sampling stopped behind the agent's back (the program took its signal), set
 * where it is found, reported once by the agent thread (cp_threads_reap): one line on
 * stderr, and the engine string every envelope and pprof comment carries. */
enum { LOST_NONE, LOST_SIGNALS, LOST_RAW };
static atomic_int g_lost, g_lost_sig;
static atomic_int g_lost_reported;
static int g_use_perf;
static int g_perf_user_only; /* set once kernel time turned out not to be allowed */
static pthread_key_t g_key;
static int g_key_ok;

/* Called by the handler when a ring fills (cp_threads_set_fill_hook). */
static void (*g_fill_hook)(void);

void cp_threads_set_fill_hook(void (*fn)(void))
{
    g_fill_hook = fn;
}

/* The libc functions the agent uses itself while interposing them for the host. */
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef int (*timer_create_fn)(clockid_t, struct sigevent *, timer_t *);
static sigaction_fn real_sigaction_p;
static timer_create_fn real_timer_create_p;

static int real_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!real_sigaction_p) real_sigaction_p = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    return real_sigaction_p ? real_sigaction_p(sig, act, old) : (errno = ENOSYS, -1);
}

static int real_timer_create(clockid_t c, struct sigevent *sev, timer_t *id)
{
    if (!real_timer_create_p)
        real_timer_create_p = (timer_create_fn)dlsym(RTLD_NEXT, "timer_create");
    return real_timer_create_p ? real_timer_create_p(c, sev, id) : (errno = ENOSYS, -1);
}

/* Short spin locks that block every signal while held, so that a signal handler on the same
 * thread (the host's calling sigaction, say) cannot come back into them. g_sig_lock guards
 * the host's view of signals, g_arm_lock every thread's event; taken in that order. */
static atomic_flag g_sig_lock = ATOMIC_FLAG_INIT, g_arm_lock = ATOMIC_FLAG_INIT;

static void spin_lock(atomic_flag *l, sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
    while (atomic_flag_test_and_set_explicit(l, memory_order_acquire))
        sched_yield();
}

static void spin_unlock(atomic_flag *l, const sigset_t *old)
{
    atomic_flag_clear_explicit(l, memory_order_release);
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

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
    slot->period_ns = r->period_ns;
    slot->nframes = r->nframes;
    memcpy(slot->pcs, r->pcs, r->nframes * sizeof(uint64_t));
    atomic_store_explicit(&t->head, h + 1, memory_order_release);
}

/* Counts the overflows recorded in a perf ring since the last call and frees their space.
 * Signals for several overflows can merge into one; the ring still counts each. */
#define PERF_RING_PAGES 1
/* The ring of the engine that needs no signal (below): ~62 samples of its stack copies. */
#define X_RING_PAGES 64
#define X_RING_BYTES (4096u * (1 + X_RING_PAGES))
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

static void forward(int sig, siginfo_t *si, void *uc);
/* The sigev_value of every timer of ours ("contprof" in ASCII: a non-canonical address, no
 * real pointer); bench/collector/cpb sends itself signals with it to take a known number
 * of samples. */
#define CP_TIMER_COOKIE ((void *)(uintptr_t)0x636f6e7470726f66ULL)
/* Numbers that have held a perf fd of ours: a signal of a perf event can still be pending
 * when its fd was closed (the thread unblocks it after disarming), and is ours all the same. */
static _Atomic unsigned char g_was_perf[CP_FD_MAX / 8] CP_BIG;

static int was_perf(int fd)
{
    return (unsigned)fd < CP_FD_MAX &&
           (atomic_load_explicit(&g_was_perf[fd / 8], memory_order_relaxed) & (1u << (fd % 8)));
}

#ifdef CP_HANDLER_TIMING
/* The bench build (contprof_timing, bench/collector/handler.sh): each handler call's TSC
 * cycles, entry to return (user space only: not the kernel's delivery or sigreturn), written
 * at exit to $CP_HANDLER_TIMING_OUT after the TSC rate in GHz. */
#include <x86intrin.h>
#define CP_TIMING_MAX 262144
static uint64_t g_tm[CP_TIMING_MAX];
static atomic_uint g_tm_n;
static uint64_t g_tm_tsc0;
static int64_t g_tm_ns0;
#define CP_TIMING_BEGIN() uint64_t tm_t0 = __rdtsc()
#define CP_TIMING_END()                                                                            \
    do {                                                                                           \
        unsigned i_ = atomic_fetch_add_explicit(&g_tm_n, 1, memory_order_relaxed);                 \
        if (i_ < CP_TIMING_MAX) g_tm[i_] = __rdtsc() - tm_t0;                                      \
    } while (0)

__attribute__((constructor)) static void timing_start(void)
{
    g_tm_tsc0 = __rdtsc();
    g_tm_ns0 = cp_mono_ns();
}

__attribute__((destructor)) static void timing_dump(void)
{
    const char *path = getenv("CP_HANDLER_TIMING_OUT");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    double ghz = (double)(__rdtsc() - g_tm_tsc0) / (double)(cp_mono_ns() - g_tm_ns0);
    fprintf(f, "%.6f\n", ghz);
    unsigned n = atomic_load(&g_tm_n);
    for (unsigned i = 0; i < n && i < CP_TIMING_MAX; i++)
        fprintf(f, "%llu\n", (unsigned long long)g_tm[i]);
    fclose(f);
}
#else
#define CP_TIMING_BEGIN() (void)0
#define CP_TIMING_END() (void)0
#endif

static void handler(int sig, siginfo_t *si, void *ucv)
{
    CP_TIMING_BEGIN();
    int saved_errno = errno;
    uint64_t weight = 1;
    if (si->si_code == SI_TIMER && si->si_value.sival_ptr == CP_TIMER_COOKIE) {
        weight = 1 + (uint64_t)(si->si_overrun > 0 ? si->si_overrun : 0);
    } else if (si->si_code >= POLL_IN && si->si_code <= POLL_HUP && was_perf(si->si_fd)) {
        weight = 1;
    } else {
        forward(sig, si, ucv); /* the host's own (its timer, kill): as the host asked */
        goto out;
    }
    cp_thread *t = cp_self;
    if (!t) t = find_by_tid(my_tid());
    if (!t || atomic_load_explicit(&t->state, memory_order_acquire) != CP_T_LIVE) {
        atomic_fetch_add(&cp_dropped_samples, weight);
        goto out;
    }
    if (atomic_load_explicit(&t->nosig, memory_order_relaxed)) goto out; /* the agent samples it */
    if (si->si_code != SI_TIMER && t->perf_fd >= 0) {
        if (t->perf_ring) {
            weight = perf_consume(t->perf_ring);
            if (!weight) goto out; /* a signal for overflows already counted */
        } else if (atomic_load_explicit(&cp_fd_state[t->perf_fd], memory_order_relaxed) ==
                   CP_FD_PERF) {
            ioctl(t->perf_fd, PERF_EVENT_IOC_REFRESH, 1);
        }
    }
    if (!atomic_load_explicit(&g_cpu_on, memory_order_relaxed)) goto out;
    /* the period of the event that fired: a boosted thread's samples are shorter */
    int64_t period = si->si_code == SI_TIMER ? t->timer_period_ns : t->perf_period_ns;
    if (period <= 0) period = cp_period_ns;

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
            if (t->pend.isolate == iso && t->pend.period_ns == period &&
                t->pend.weight < CP_PEND_MAX_WEIGHT) {
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
        t->pend.period_ns = period;
        t->pend.nframes = (uint32_t)cp_unwind(&r, t->stack_lo, t->stack_hi, t->pend.pcs,
                                              CP_MAX_FRAMES, &t->ucache_sig);
        uint32_t interp; /* an isolate entered explicitly keeps its samples */
        t->pend.nframes = cp_py_merge(t->pend.pcs, t->pend.nframes, CP_MAX_FRAMES, t->tid,
                                      t->stack_lo, t->stack_hi, &interp);
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
    slot->period_ns = period;
    slot->nframes =
        (uint32_t)cp_unwind(&r, t->stack_lo, t->stack_hi, slot->pcs, CP_MAX_FRAMES, &t->ucache_sig);
    uint32_t interp;
    slot->nframes = cp_py_merge(slot->pcs, slot->nframes, CP_MAX_FRAMES, t->tid, t->stack_lo,
                                t->stack_hi, &interp);
    if (!iso && interp) {
        /* a sub-interpreter's frames: its isolate, or its id for the agent to make one */
        uint32_t pi = cp_py_interp_isolate(interp, 0);
        slot->isolate = pi ? pi : CP_PY_ISO_INTERP | interp;
    }
    atomic_store_explicit(&t->head, h + 1, memory_order_release);
    if (h + 1 - tl >= CP_RING / 4 && g_fill_hook) g_fill_hook();
out:
    errno = saved_errno;
    CP_TIMING_END();
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

/* Opens perf event a on thread tid, falling back to user mode only where the kernel's part
 * is refused (remembered for later events), and moves the fd above the floor, marked as a
 * perf fd. The event is born at the lowest free number, on a host's thread maybe: the gate
 * keeps the host's fd calls out meanwhile (fd.c). Returns the fd, or -1 with *err set. */
static int perf_open(struct perf_event_attr *a, pid_t tid, int *err)
{
    cp_fd_gate_enter();
    int fd = (int)syscall(SYS_perf_event_open, a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0 && !a->exclude_kernel && (errno == EACCES || errno == EPERM)) {
        g_perf_user_only = a->exclude_kernel = 1;
        fd = (int)syscall(SYS_perf_event_open, a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    }
    *err = errno;
    if (fd >= 0) fd = cp_fd_adopt(fd, CP_FD_PERF), *err = errno;
    cp_fd_gate_leave();
    return fd;
}

static int arm_perf(cp_thread *t, int64_t period)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a);
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.sample_period = (uint64_t)period;
    a.sample_type = PERF_SAMPLE_IP;
    a.wakeup_events = 1;
    a.exclude_hv = 1;
    a.disabled = 1;
    /* Time in system calls is CPU time too (the timer engine counts it); only where
     * perf_event_paranoid forbids that are samples limited to user mode. */
    a.exclude_kernel = g_perf_user_only;
    int e = 0;
    /* above the floor before O_ASYNC: the signal's si_fd is the number O_ASYNC was set on */
    int fd = perf_open(&a, t->tid, &e);
    if (fd < 0) return -e;
    atomic_fetch_or(&g_was_perf[fd / 8], (unsigned char)(1u << (fd % 8)));
    /* With a ring the event never stops and each overflow is counted there; without one
     * (perf_event_mlock_kb exhausted) each signal re-arms it for one more overflow. */
    void *ring =
        mmap(NULL, 4096u * (1 + PERF_RING_PAGES), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) ring = NULL;
    struct f_owner_ex own = {.type = F_OWNER_TID, .pid = t->tid};
    if (cp_fd_fcntl(fd, F_SETFL, O_ASYNC) < 0 ||
        cp_fd_fcntl(fd, F_SETSIG, atomic_load(&g_sig)) < 0 ||
        cp_fd_fcntl(fd, F_SETOWN_EX, (long)&own) < 0 || ioctl(fd, PERF_EVENT_IOC_RESET, 0) < 0) {
        int e = -errno;
        if (ring) munmap(ring, 4096u * (1 + PERF_RING_PAGES));
        cp_fd_close(fd);
        return e;
    }
    t->perf_ring = ring;
    t->perf_period_ns = period;
    t->perf_fd = fd;
    if (ioctl(fd, ring ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_REFRESH, ring ? 0 : 1) < 0) {
        int e = -errno;
        if (ring) munmap(ring, 4096u * (1 + PERF_RING_PAGES));
        cp_fd_close(fd);
        t->perf_fd = -1;
        t->perf_ring = NULL;
        return e;
    }
    t->perf_enabled = 1;
    return 0;
}

static int arm_timer(cp_thread *t, int64_t period)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof(sev));
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = atomic_load(&g_sig);
    sev.sigev_value.sival_ptr = CP_TIMER_COOKIE;
    sev._sigev_un._tid = t->tid;
    /* The CPU clock of any thread of ours: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED). */
    clockid_t clk = (clockid_t)((~(unsigned)t->tid << 3) | 6);
    timer_t id;
    if (real_timer_create(clk, &sev, &id) < 0) return -errno;
    struct itimerspec its;
    /* First expiry uniform in (0, period], so short-lived threads are not biased. Armed at
     * an absolute CPU time where the clock reads: the expiries' schedule is then known
     * (exit_due counts those due and not carried). */
    int64_t first = 1 + (int64_t)(rnd() % (uint64_t)period);
    struct timespec now;
    int64_t at =
        clock_gettime(clk, &now) == 0 ? (int64_t)now.tv_sec * 1000000000 + now.tv_nsec : -1;
    int64_t value = at >= 0 ? at + first : first;
    its.it_value.tv_sec = value / 1000000000;
    its.it_value.tv_nsec = value % 1000000000;
    its.it_interval.tv_sec = period / 1000000000;
    its.it_interval.tv_nsec = period % 1000000000;
    if (timer_settime(id, at >= 0 ? TIMER_ABSTIME : 0, &its, NULL) < 0) {
        int e = -errno;
        timer_delete(id);
        return e;
    }
    t->timer = id;
    t->timer_period_ns = period;
    t->timer_first_ns = at >= 0 ? value : -1;
    t->timer_head = atomic_load(&t->head);
    t->has_timer = 1;
    return 0;
}

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

static int perf_usable(void);

/* Whether a thread whose event runs at period p uses perf: the agent's own rate as
 * cp_cpu_start chose; a capture's (cp_thread_boost) as the same rule says, where perf was
 * found usable. */
static int g_perf_ok = -1; /* perf_event_open usable: -1 not tried yet */

static int use_perf_for(int64_t p)
{
    if (p == cp_period_ns) return g_use_perf;
    return cp_cfg.cpu_engine != CP_ENGINE_TIMER &&
           (cp_cfg.cpu_engine == CP_ENGINE_PERF || p < CP_TIMER_MIN_PERIOD_NS) && g_perf_ok == 1;
}

/* Under g_arm_lock: t's event runs at its period (the boost, else the agent's) on the
 * engine use_perf_for picks; nothing changes when it already does. A perf event a boost
 * ends is disabled, not closed: its ring stays mapped for a handler that may be reading
 * it on t's thread now. */
static void arm_unlocked(cp_thread *t)
{
    if (!atomic_load(&g_cpu_on) || atomic_load(&t->nosig)) return;
    int64_t p = t->boost_ns > 0 ? t->boost_ns : cp_period_ns;
    if (use_perf_for(p)) {
        if (t->perf_fd >= 0) {
            if (t->perf_period_ns != p) {
                uint64_t v = (uint64_t)p;
                if (ioctl(t->perf_fd, PERF_EVENT_IOC_PERIOD, &v) == 0) t->perf_period_ns = p;
            }
            if (!t->perf_enabled &&
                ioctl(t->perf_fd, t->perf_ring ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_REFRESH,
                      t->perf_ring ? 0 : 1) == 0)
                t->perf_enabled = 1;
        }
        if ((t->perf_fd >= 0 && t->perf_enabled && t->perf_period_ns == p) ||
            (t->perf_fd < 0 && arm_perf(t, p) == 0)) {
            if (t->has_timer) {
                timer_delete(t->timer);
                t->has_timer = 0;
            }
            return;
        }
    }
    if (t->perf_fd >= 0 && t->perf_enabled) {
        ioctl(t->perf_fd, PERF_EVENT_IOC_DISABLE, 0);
        t->perf_enabled = 0;
    }
    if (t->has_timer && t->timer_period_ns == p) return;
    if (t->has_timer) {
        timer_delete(t->timer);
        t->has_timer = 0;
    }
    if (arm_timer(t, p) < 0) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            fprintf(stderr,
                    "contprof: cannot arm a CPU timer for thread %d (ulimit -i?); "
                    "some threads are not sampled\n",
                    (int)t->tid);
    }
}

static void disarm_unlocked(cp_thread *t)
{
    if (t->perf_fd >= 0) {
        ioctl(t->perf_fd, PERF_EVENT_IOC_DISABLE, 0);
        int fd = t->perf_fd;
        t->perf_fd = -1;
        if (t->perf_ring) munmap(t->perf_ring, 4096u * (1 + PERF_RING_PAGES));
        t->perf_ring = NULL;
        t->perf_enabled = 0;
        cp_fd_close(fd);
    }
    if (t->has_timer) {
        timer_delete(t->timer);
        t->has_timer = 0;
    }
}

static void arm(cp_thread *t)
{
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    arm_unlocked(t);
    spin_unlock(&g_arm_lock, &m);
}

int64_t cp_thread_boost(cp_thread *t, int64_t period_ns, int *perf)
{
    *perf = 0;
    if (!atomic_load(&g_cpu_on)) return 0;
    if (period_ns > 0 && g_perf_ok < 0) g_perf_ok = perf_usable();
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    int64_t eff = 0;
    if (atomic_load(&t->state) == CP_T_LIVE) {
        t->boost_ns = period_ns == cp_period_ns ? 0 : period_ns;
        arm_unlocked(t);
        *perf = t->perf_fd >= 0 && t->perf_enabled;
        eff = *perf ? t->perf_period_ns : t->has_timer ? t->timer_period_ns : 0;
    }
    spin_unlock(&g_arm_lock, &m);
    return eff;
}

static void disarm(cp_thread *t)
{
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    disarm_unlocked(t);
    spin_unlock(&g_arm_lock, &m);
}

/* fd.c's perf fd holder (cp_fd_set_perf_holder): perf fd `from` is moving to `to`. */
static int perf_fd_moved(int from, int to)
{
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    int rc = -1;
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS && rc; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (t && t->x_fd == from) { /* the agent reads it: no signal to set up */
            t->x_fd = to;
            rc = 0;
            continue;
        }
        if (!t || t->perf_fd != from) continue;
        /* O_ASYNC again on the new number: the signal's si_fd is the number it was set on */
        struct f_owner_ex own = {.type = F_OWNER_TID, .pid = t->tid};
        cp_fd_fcntl(to, F_SETFL, 0);
        cp_fd_fcntl(to, F_SETFL, O_ASYNC);
        cp_fd_fcntl(to, F_SETSIG, atomic_load(&g_sig));
        cp_fd_fcntl(to, F_SETOWN_EX, (long)&own);
        atomic_fetch_or(&g_was_perf[to / 8], (unsigned char)(1u << (to % 8)));
        t->perf_fd = to;
        rc = 0;
    }
    spin_unlock(&g_arm_lock, &m);
    return rc;
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
    t->timer_period_ns = t->perf_period_ns = 0;
    t->timer_first_ns = -1;
    t->timer_head = 0;
    t->perf_enabled = 0;
    t->boost_ns = t->acc_ns = 0;
    t->cap_mask = t->api_mask = 0;
    t->api_until = 0;
    atomic_store(&t->alloc_boost, 0);
    t->stack_lo = t->stack_hi = 0;
    t->own_tls = 0;
    t->name[0] = 0;
    atomic_store(&t->start_fn, 0);
    t->start_arg = 0;
    atomic_store(&t->labelled, 0);
    atomic_store(&t->start_checked, 0);
    atomic_store(&t->iso_depth, 0);
    atomic_store(&t->head, 0);
    atomic_store(&t->tail, 0);
    atomic_store(&t->dropped, 0);
    atomic_store(&t->pending, 0);
    atomic_store(&t->nosig, 0);
    atomic_store(&t->blocked_at_start, 0);
    t->x_fd = -1;
    t->x_ring = NULL;
    t->x_done = 0;
    t->x_head = 0;
    t->x_cpu_ns = -1;
    t->x_carry_ns = 0;
    atomic_store(&t->x_exit_cpu_ns, 0);
}

static void thread_exit(void *arg);

/* The main thread's stack without pthread_getattr_np, which reads and sscanf's all of
 * /proc/self/maps (with stdio's malloc) to find it: its frames all lie below
 * __libc_stack_end (where the loader found argc), in the page that holds it or below, within
 * RLIMIT_STACK. Only [max(sp, lo), hi) is ever read (cp_unwind), so lo need not be mapped. */
extern void *__libc_stack_end;

static int main_stack(cp_thread *t)
{
    uintptr_t hi = ((uintptr_t)__libc_stack_end | 4095) + 1;
    struct rlimit rl;
    uintptr_t size = UINTPTR_MAX;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) size = rl.rlim_cur;
    uintptr_t lo = size < hi ? hi - size : 0, here = (uintptr_t)__builtin_frame_address(0);
    /* a fork child's only thread may run on a stack its parent's thread had */
    if (here < lo || here >= hi) return -1;
    t->stack_lo = lo;
    t->stack_hi = hi;
    return 0;
}

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
    if (tid == getpid() && main_stack(t) == 0) {
        /* found without /proc */
    } else if (pthread_getattr_np(pthread_self(), &attr) == 0) {
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

/* ------------------------------------------------------------------------------------
 * A thread's last period (README.md "CPU": short threads). A POSIX CPU timer expires only
 * on a scheduler tick that finds the thread running, so a thread that exits between the
 * tick and its due expiry used to take that period with it; a perf event's overflow can
 * wait in its ring behind the signal the exiting thread blocked, and its last partial
 * period was always lost (perf starts counting at 0, no random offset). */

/* The timer's expiries due by now (t's CPU clock) that no sample carried, from the
 * schedule arm_timer set and the weights of t's timer samples since (all in its ring while
 * it holds them all); -1 if unknown. On t's own thread (only it writes its ring). */
static int64_t timer_due_exact(cp_thread *t)
{
    int64_t p = t->timer_period_ns;
    unsigned h = atomic_load_explicit(&t->head, memory_order_relaxed);
    if (t->timer_first_ns < 0 || p <= 0 || h - t->timer_head > CP_RING) return -1;
    struct timespec c;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c) != 0) return -1;
    int64_t cpu = (int64_t)c.tv_sec * 1000000000 + c.tv_nsec;
    int64_t expired = cpu >= t->timer_first_ns ? 1 + (cpu - t->timer_first_ns) / p : 0;
    int64_t carried = 0;
    for (unsigned i = t->timer_head; i != h; i++) {
        const cp_sample_rec *r = &t->ring[i & (CP_RING - 1)];
        if (r->period_ns == p) carried += (int64_t)r->weight;
    }
    if (atomic_load(&t->pending) && t->pend.period_ns == p) carried += (int64_t)t->pend.weight;
    return expired > carried ? expired - carried : 0;
}

/* Stops t's events and returns the periods (of t's running event) its CPU time earned
 * but no signal carried: an expiry due and not fired, signals fired and still pending,
 * overflows in the perf ring, and the perf event's partial period with the probability of
 * its length (so the count is right on average). Called on t's own thread at its exit,
 * with the sample signal blocked. */
static uint64_t exit_due(cp_thread *t, int64_t *period)
{
    uint64_t due = 0;
    int sig = atomic_load(&g_sig);
    *period = 0;
    /* Fired while the signal was blocked here: ours are counted, the host's sent again.
     * Taken before the timer is disarmed: a kernel that sees a timer re-armed or disarmed
     * drops the signal its old arming queued. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    struct timespec zero_ts = {0, 0};
    siginfo_t si;
    int to_thread = 0, to_process = 0;
    uint64_t timer_due = 0;
    for (int i = 0; i < 64 && sigtimedwait(&set, &si, &zero_ts) == sig; i++) {
        if (si.si_code == SI_TIMER && si.si_value.sival_ptr == CP_TIMER_COOKIE)
            timer_due += 1 + (uint64_t)(si.si_overrun > 0 ? si.si_overrun : 0);
        else if (si.si_code >= POLL_IN && si.si_code <= POLL_HUP && was_perf(si.si_fd))
            continue; /* its overflows are in the ring */
        else if (si.si_code == SI_TKILL)
            to_thread = 1;
        else
            to_process = 1;
    }
    /* the host's (a standard signal is pending at most once a target) */
    if (to_thread) syscall(SYS_tgkill, getpid(), my_tid(), sig);
    if (to_process) kill(getpid(), sig);
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    if (t->has_timer) {
        /* 1 ns left: due, not fired (timer_gettime says so; timer_settime's old value
         * would not: it moves an overdue timer on first) */
        struct itimerspec v;
        if (timer_gettime(t->timer, &v) == 0) {
            *period = t->timer_period_ns;
            if (v.it_value.tv_sec == 0 && v.it_value.tv_nsec == 1) timer_due++;
        }
        /* an expiry overdue by more than a period is still one above: count them all */
        int64_t exact = timer_due_exact(t);
        due += exact >= 0 ? (uint64_t)exact : timer_due;
    }
    if (t->perf_fd >= 0 && t->perf_enabled && t->perf_period_ns > 0) {
        ioctl(t->perf_fd, PERF_EVENT_IOC_DISABLE, 0);
        t->perf_enabled = 0;
        *period = t->perf_period_ns;
        if (t->perf_ring) due += perf_consume(t->perf_ring);
        uint64_t count;
        if (read(t->perf_fd, &count, sizeof(count)) == (ssize_t)sizeof(count)) {
            uint64_t p = (uint64_t)t->perf_period_ns, part = count % p;
            uint64_t x = (uint64_t)cp_mono_ns() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)t->tid;
            x ^= x >> 29;
            if ((x * 0xbf58476d1ce4e5b9ULL >> 11) % p < part) due++;
        }
    }
    spin_unlock(&g_arm_lock, &m);
    return due;
}

/* The CPU time of t's last periods, at its exit: one final sample on the stack of its last
 * sample (the thread most likely spent it there); for a thread without one yet, on its
 * start routine alone (thrd_create's, unknown: counted in dropped_samples). */
static void exit_final_sample(cp_thread *t)
{
    if (atomic_load(&t->nosig)) {
        /* the agent samples it, or counts its CPU time up to here */
        struct timespec c;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
        atomic_store(&t->x_exit_cpu_ns, (int64_t)c.tv_sec * 1000000000 + c.tv_nsec + 1);
        return;
    }
    int64_t period;
    uint64_t due = exit_due(t, &period);
    if (!due) return;
    /* x_switch makes the agent the ring's writer under this lock */
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    unsigned h = atomic_load_explicit(&t->head, memory_order_relaxed);
    uintptr_t fn = atomic_load(&t->start_fn);
    if (atomic_load(&t->nosig) || (h == 0 && !fn)) {
        atomic_fetch_add(&t->dropped, due);
    } else if (atomic_load(&t->pending)) {
        t->pend.weight += due; /* pushed by the caller */
    } else {
        cp_sample_rec r;
        r.weight = due;
        r.period_ns = period;
        if (h == 0) {
            /* no sample yet: its start routine, the one frame known to hold its time */
            unsigned depth = atomic_load_explicit(&t->iso_depth, memory_order_relaxed);
            r.isolate = depth ? t->iso_stack[(depth > 16 ? 16 : depth) - 1] : 0;
            r.nframes = 1;
            r.pcs[0] = (uint64_t)fn;
        } else {
            /* only this thread writes its ring: the last slot is still its last sample */
            const cp_sample_rec *last = &t->ring[(h - 1) & (CP_RING - 1)];
            r.isolate = last->isolate;
            r.nframes = last->nframes > CP_MAX_FRAMES ? CP_MAX_FRAMES : last->nframes;
            memcpy(r.pcs, last->pcs, r.nframes * sizeof(uint64_t));
        }
        ring_push(t, &r);
    }
    spin_unlock(&g_arm_lock, &m);
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
    exit_final_sample(t);
    disarm(t);
    if (atomic_load(&t->pending)) {
        ring_push(t, &t->pend);
        atomic_store(&t->pending, 0);
    }
    if (!atomic_load(&t->labelled)) prctl(PR_GET_NAME, t->name, 0, 0, 0);
    cp_self = NULL;
    atomic_store(&t->state, CP_T_DEAD);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void cp_threads_scan(void)
{
    /* glibc clears it at the first pthread_create: a preloaded program's constructor, where
     * the calling thread is the only one, reads no directory (a thread made by a raw clone,
     * without glibc, is not found) */
    if (__libc_single_threaded) return;
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
        if (!t || atomic_load(&t->state) != CP_T_LIVE || atomic_load(&t->labelled)) continue;
        if (atomic_load(&t->own_named)) { /* the thread writes own_name only while 0 */
            set_name(t->name, t->own_name);
            atomic_store(&t->own_named, 0);
            continue;
        }
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

void cp_thread_say_name(void)
{
    cp_thread *t = cp_self;
    /* one said and not yet taken is recent enough: the agent may be copying it */
    if (!t || atomic_load(&t->own_named)) return;
    char buf[16] = "";
    if (prctl(PR_GET_NAME, buf, 0, 0, 0) != 0) return;
    memcpy(t->own_name, buf, sizeof(buf));
    atomic_store(&t->own_named, 1);
}

void cp_thread_set_label(cp_thread *t, const char *label)
{
    set_name(t->name, label);
    atomic_store(&t->labelled, 1);
}

static void check_sampling(void);

void cp_threads_reap(void)
{
    check_sampling();
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_DEAD) continue;
        if (atomic_load(&t->head) != atomic_load(&t->tail)) continue; /* not drained */
        if (atomic_load(&t->nosig) && !t->x_done) continue; /* its event not read to the end */
        atomic_store(&t->state, CP_T_FREE);
    }
}

void cp_threads_after_fork_child(void)
{
    /* a thread of the parent's may have held them: it does not exist here */
    atomic_flag_clear(&g_sig_lock);
    atomic_flag_clear(&g_arm_lock);
    cp_fd_after_fork_child();
    pid_t tid = my_tid();
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t) continue;
        /* perf fds are inherited but count the parent's threads; timers are not. */
        if (t->perf_fd >= 0) cp_fd_close(t->perf_fd);
        if (t->perf_ring) munmap(t->perf_ring, 4096u * (1 + PERF_RING_PAGES));
        t->perf_ring = NULL;
        t->perf_fd = -1;
        t->has_timer = 0;
        if (t->x_fd >= 0) cp_fd_close(t->x_fd);
        if (t->x_ring) munmap(t->x_ring, X_RING_BYTES);
        t->x_fd = -1;
        t->x_ring = NULL;
        t->x_cpu_ns = -1;
        atomic_store(&t->nosig, 0); /* found again if it still blocks the signal */
        t->perf_enabled = 0;
        t->boost_ns = t->acc_ns = 0; /* the child hears captures anew */
        t->cap_mask = t->api_mask = 0;
        t->api_until = 0;
        atomic_store(&t->alloc_boost, 0);
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
 * The engine that needs no signal (README.md "CPU": threads that block signals). A thread
 * that blocks the sample signal (servers block every signal before starting workers, which
 * inherit the mask) never runs the handler: its timer expiries stay pending. The agent
 * opens a perf task-clock event on it instead and reads the event's ring itself, each
 * sample carrying the user registers and a copy of the top X_STACK bytes of the stack,
 * unwound by cp_unwind_copy with the handler's DWARF rules; the sample goes into the
 * thread's own ring, so drain() takes it as any other. Why a stack copy rather than the
 * kernel's PERF_SAMPLE_CALLCHAIN: the kernel walks frame pointers, which Debian's libraries
 * and -O2 code lack (the callchain ends or goes wrong after the leaf); the copy costs ring
 * space instead (X_RING_PAGES per such thread, mlock'ed). */

#define X_STACK 4096         /* bytes of stack per sample */
#define X_PER_TICK 56        /* samples allowed between two agent ticks */
#define X_CHECK_NS 500000000 /* threads are looked at twice a second */
#define X_NAMED_MAX 8        /* refused threads named on stderr, one line each */

static int g_x_refuse;                    /* CONTPROF_TEST_NO_PERF: tests stand for a container */
static unsigned g_x_sampled, g_x_refused; /* threads so far (agent thread) */
static unsigned g_x_shown_sampled, g_x_shown_refused;
static cp_ucache g_x_ucache CP_BIG; /* the agent's unwind cache for these samples */

/* The pthread_create/thrd_create thunk, on the new thread: it starts with the signal
 * blocked (its creator's mask), so the agent need not wait for its CPU clock to tell. */
static void (*g_blocked_hook)(void);
static unsigned g_blocked_waiting; /* agent thread: threads blocked at start not switched yet */

void cp_threads_set_blocked_hook(void (*fn)(void))
{
    g_blocked_hook = fn;
}

unsigned cp_threads_blocked_waiting(void)
{
    return g_blocked_waiting;
}

static void note_blocked_at_start(cp_thread *t)
{
    sigset_t cur;
    if (t && pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && sigismember(&cur, g_sig) == 1) {
        atomic_store(&t->blocked_at_start, 1);
        /* the agent looks now, and every CP_BLOCKED_TICK_NS until it switched the thread,
         * rather than at its next tick (up to 500 ms of the thread's CPU unsampled) */
        if (g_blocked_hook) g_blocked_hook();
    }
}

static int64_t thread_cpu_ns(pid_t tid)
{
    struct timespec ts;
    clockid_t clk = (clockid_t)((~(unsigned)tid << 3) | 6); /* as arm_timer */
    if (clock_gettime(clk, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether thread tid blocks signal sig now (SigBlk of /proc/self/task/TID/status). */
static int sig_blocked(pid_t tid, int sig)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t k = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (k <= 0) return 0;
    buf[k] = 0;
    const char *b = strstr(buf, "\nSigBlk:");
    if (!b) return 0;
    unsigned long long mask = strtoull(b + 8, NULL, 16);
    return sig > 0 && sig <= 64 && ((mask >> (sig - 1)) & 1);
}

/* Agent periods per sample: the agent reads the ring once a tick (agent.c's formula:
 * CP_RING/2 samples at the rate, 100-500 ms), which must not hold more than X_PER_TICK. */
static uint64_t x_weight(void)
{
    int64_t tick = (int64_t)CP_RING / 2 * 1000000000 / cp_cfg.cpu_hz;
    if (tick < 100000000) tick = 100000000;
    if (tick > 500000000) tick = 500000000;
    int64_t per = X_PER_TICK * cp_period_ns;
    int64_t k = (tick + per - 1) / per;
    return k < 1 ? 1 : (uint64_t)k;
}

/* Opens and maps t's event; returns 0 or -errno. */
static int x_open(cp_thread *t)
{
    if (g_x_refuse) return -EACCES;
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a);
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.sample_period = (uint64_t)cp_period_ns * x_weight();
    a.sample_type =
        PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
    a.sample_regs_user =
        (1ULL << PERF_REG_X86_BP) | (1ULL << PERF_REG_X86_SP) | (1ULL << PERF_REG_X86_IP);
    a.sample_stack_user = X_STACK;
    a.exclude_hv = 1;
    a.exclude_kernel = g_perf_user_only;
    a.disabled = 1;
    int e = 0;
    int fd = perf_open(&a, t->tid, &e);
    if (fd < 0) return -e;
    void *ring = mmap(NULL, X_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) {
        e = errno;
        cp_fd_close(fd);
        return -e;
    }
    if (ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {
        e = errno;
        munmap(ring, X_RING_BYTES);
        cp_fd_close(fd);
        return -e;
    }
    sigset_t m;
    spin_lock(&g_arm_lock, &m); /* perf_fd_moved reads x_fd */
    t->x_fd = fd;
    t->x_ring = ring;
    spin_unlock(&g_arm_lock, &m);
    return 0;
}

static void x_close(cp_thread *t)
{
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    int fd = t->x_fd;
    t->x_fd = -1;
    spin_unlock(&g_arm_lock, &m);
    if (fd >= 0) cp_fd_close(fd);
    if (t->x_ring) munmap(t->x_ring, X_RING_BYTES);
    t->x_ring = NULL;
}

/* One PERF_RECORD_SAMPLE (ip, pid/tid, user regs BP SP IP, user stack) into t's ring. */
static void x_sample(cp_thread *t, const uint8_t *rec, size_t len, uint64_t weight)
{
    const uint8_t *p = rec + sizeof(struct perf_event_header), *end = rec + len;
    uint64_t abi, regs[3], size, dyn = 0;
    if (p + 16 + 8 > end) return;
    p += 16; /* ip (the user pc is in the registers), pid and tid (the event is t's) */
    memcpy(&abi, p, 8);
    p += 8;
    if (abi == PERF_SAMPLE_REGS_ABI_NONE) { /* no user context: counted */
        atomic_fetch_add(&t->dropped, weight);
        return;
    }
    if (p + sizeof(regs) + 8 > end) return;
    memcpy(regs, p, sizeof(regs));
    p += sizeof(regs);
    memcpy(&size, p, 8);
    p += 8;
    const uint8_t *stack = p;
    if (size && p + size + 8 <= end) memcpy(&dyn, p + size, 8);
    if (dyn > size) dyn = 0;
    cp_uregs r = {.pc = (uintptr_t)regs[2], .sp = (uintptr_t)regs[1], .fp = (uintptr_t)regs[0]};
    cp_sample_rec s;
    unsigned depth = atomic_load_explicit(&t->iso_depth, memory_order_relaxed);
    s.isolate = depth ? t->iso_stack[(depth > 16 ? 16 : depth) - 1] : 0;
    s.weight = weight;
    s.period_ns = cp_period_ns;
    s.nframes = (uint32_t)cp_unwind_copy(&r, stack, (size_t)dyn, s.pcs, CP_MAX_FRAMES, &g_x_ucache);
    ring_push(t, &s);
}

/* Reads t's perf ring to its head: samples into t's ring, lost records counted. */
static void x_read(cp_thread *t)
{
    static uint8_t rec[65536] CP_BIG; /* a record is at most 64 KiB (header.size is 16 bits) */
    struct perf_event_mmap_page *pg = t->x_ring;
    if (!pg) return;
    uint64_t head = __atomic_load_n(&pg->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = pg->data_tail;
    uint64_t size = pg->data_size ? pg->data_size : 4096u * X_RING_PAGES;
    const uint8_t *data = (const uint8_t *)pg + (pg->data_offset ? pg->data_offset : 4096);
    uint64_t w = x_weight();
    while (tail + sizeof(struct perf_event_header) <= head) {
        struct perf_event_header h;
        uint64_t off = tail % size;
        memcpy(&h, data + off, sizeof(h));
        if (h.size < sizeof(h) || tail + h.size > head) break;
        size_t first = size - off < h.size ? (size_t)(size - off) : h.size;
        memcpy(rec, data + off, first);
        memcpy(rec + first, data, h.size - first); /* a record may wrap */
        if (h.type == PERF_RECORD_SAMPLE) {
            x_sample(t, rec, h.size, w);
        } else if (h.type == PERF_RECORD_LOST && h.size >= 24) {
            uint64_t lost;
            memcpy(&lost, rec + 16, sizeof(lost));
            atomic_fetch_add(&t->dropped, lost * w);
        }
        tail += h.size;
    }
    __atomic_store_n(&pg->data_tail, tail, __ATOMIC_RELEASE);
}

/* CPU time of a nosig thread that no sample carries (before the agent found it; all of
 * it where perf is refused): periods on one frame, CP_X_FRAME, in t's ring, so the thread's
 * total stays right, the window is written, and the reason is in the profile. Without the
 * frame (no memory to intern it): counted in dropped. */
#define CP_X_FRAME "contprof:signal-blocked"
static void x_unsampled(cp_thread *t, uint64_t periods)
{
    static uint64_t frame;
    if (!periods) return;
    if (!frame) {
        contprof_frame f = {.function = CP_X_FRAME, .file = NULL, .line = 0};
        uint64_t id;
        if (cp_lang_ids(&f, 1, &id) == 1) frame = id;
    }
    if (!frame) {
        atomic_fetch_add(&t->dropped, periods);
        return;
    }
    cp_sample_rec s;
    unsigned depth = atomic_load_explicit(&t->iso_depth, memory_order_relaxed);
    s.isolate = depth ? t->iso_stack[(depth > 16 ? 16 : depth) - 1] : 0;
    s.weight = periods;
    s.period_ns = cp_period_ns;
    s.nframes = 1;
    s.pcs[0] = frame;
    ring_push(t, &s);
}

/* The CPU time t used since the agent last looked (refused threads). */
static void x_count(cp_thread *t, int64_t cpu)
{
    if (cpu < 0 || t->x_cpu_ns < 0 || cpu < t->x_cpu_ns) return;
    t->x_carry_ns += cpu - t->x_cpu_ns;
    t->x_cpu_ns = cpu;
}

/* t blocks the sample signal: off the signal engine, onto the agent's perf event, or
 * counted. cpu: its CPU clock now; the CPU time since its last sample (none: since it
 * started) was not sampled and is counted. */
static void x_switch(cp_thread *t, int64_t cpu)
{
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    int ok = atomic_load(&t->state) == CP_T_LIVE && !atomic_load(&t->pending);
    if (ok) {
        atomic_store(&t->nosig, 1);
        if (t->has_timer) {
            timer_delete(t->timer);
            t->has_timer = 0;
        }
        /* disabled, not closed: a handler may still be reading its ring (as after a boost) */
        if (t->perf_fd >= 0 && t->perf_enabled) {
            ioctl(t->perf_fd, PERF_EVENT_IOC_DISABLE, 0);
            t->perf_enabled = 0;
        }
    }
    spin_unlock(&g_arm_lock, &m);
    if (!ok) return;
    /* pushed from the next tick on: a handler that passed its nosig check just before is
     * long done writing the ring by then */
    int64_t since = t->x_cpu_ns >= 0 ? t->x_cpu_ns : 0;
    t->x_carry_ns = cpu > since ? cpu - since : 0;
    t->x_cpu_ns = cpu;
    int e = x_open(t);
    if (e == 0) {
        g_x_sampled++;
        return;
    }
    atomic_store(&t->nosig, 2);
    if (g_x_refused++ < X_NAMED_MAX)
        fprintf(stderr,
                "contprof: thread %d (%s) blocks the sampling signal (%d) and perf events are "
                "refused (%s): its CPU time goes to frame " CP_X_FRAME ", without a stack%s\n",
                (int)t->tid, t->name, atomic_load(&g_sig), strerror(-e),
                g_x_refused == X_NAMED_MAX ? " (further such threads are not named)" : "");
}

/* A thread on the signal engine: does it block the signal? */
static void x_check(cp_thread *t)
{
    unsigned h = atomic_load(&t->head);
    int at_start = atomic_load(&t->blocked_at_start);
    int64_t p = t->has_timer ? t->timer_period_ns : t->perf_enabled ? t->perf_period_ns : 0;
    /* a thread that registered itself started near 0 CPU; one found in /proc: read it now */
    if (t->x_cpu_ns < 0 && t->own_tls) t->x_cpu_ns = 0, t->x_head = 0;
    if (!at_start && t->x_cpu_ns >= 0 && p > 0 && (h != t->x_head || atomic_load(&t->pending))) {
        /* sampled: count the CPU time the new samples carried, no system call (what went
         * unsampled since is found at a later check) */
        t->x_cpu_ns += (int64_t)(h - t->x_head) * p;
        t->x_head = h;
        return;
    }
    int64_t cpu = thread_cpu_ns(t->tid);
    if (cpu < 0) return;
    if (t->x_cpu_ns > cpu) t->x_cpu_ns = cpu;
    if (!at_start && (t->x_cpu_ns < 0 || p <= 0)) {
        t->x_cpu_ns = cpu;
        t->x_head = h;
        return;
    }
    /* two periods and the tick that would have carried them, without a sample (a thread
     * that started blocked, too: an idle one costs no event) */
    if (cpu - t->x_cpu_ns < 2 * (p > 0 ? p : cp_period_ns) + CP_TICK_NS) return;
    atomic_store(&t->blocked_at_start, 0);
    if (!sig_blocked(t->tid, atomic_load(&g_sig))) {
        t->x_head = h;
        t->x_cpu_ns = cpu;
        return;
    }
    x_switch(t, cpu);
}

/* One nosig thread: its samples or its CPU time; a dead one's last, then its event goes. */
static void x_poll(cp_thread *t, int on)
{
    int dead = atomic_load(&t->state) == CP_T_DEAD;
    if (atomic_load(&t->nosig) == 1) {
        x_read(t);
    } else {
        int64_t exit_cpu = atomic_load(&t->x_exit_cpu_ns);
        x_count(t, dead ? (exit_cpu ? exit_cpu - 1 : -1) : thread_cpu_ns(t->tid));
    }
    if (t->x_carry_ns >= cp_period_ns) {
        x_unsampled(t, (uint64_t)(t->x_carry_ns / cp_period_ns));
        t->x_carry_ns %= cp_period_ns;
    }
    if (dead || !on) {
        x_close(t);
        t->x_done = 1;
    }
}

static void x_engine_text(void)
{
    if (g_x_sampled == g_x_shown_sampled && g_x_refused == g_x_shown_refused) return;
    g_x_shown_sampled = g_x_sampled;
    g_x_shown_refused = g_x_refused;
    sigset_t m;
    spin_lock(&g_sig_lock, &m);
    if (atomic_load(&g_cpu_on)) {
        char rest[64] = "";
        char *r = strstr(cp_engine, "; cpu_timers_rearmed=");
        if (r) {
            snprintf(rest, sizeof(rest), "%s", r);
            *r = 0;
        }
        char *b = strstr(cp_engine, "; signal_blocked=");
        if (b) *b = 0;
        size_t base = strlen(cp_engine);
        unsigned n = g_x_sampled + g_x_refused;
        if (g_x_refused)
            snprintf(cp_engine + base, sizeof(cp_engine) - base,
                     "; signal_blocked=%u unsampled=%u%s", n, g_x_refused, rest);
        else
            snprintf(cp_engine + base, sizeof(cp_engine) - base, "; signal_blocked=%u perf%s", n,
                     rest);
    }
    spin_unlock(&g_sig_lock, &m);
}

void cp_threads_poll_blocked(void)
{
    CP_ASSERT_AGENT_THREAD();
    static int64_t next_check;
    int on = atomic_load(&g_cpu_on);
    int64_t now = cp_mono_ns();
    int check = on && now >= next_check;
    if (check) next_check = now + X_CHECK_NS;
    unsigned n = atomic_load(&cp_threads_hwm), waiting = 0;
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t) continue;
        int st = atomic_load(&t->state);
        if (st != CP_T_LIVE && st != CP_T_DEAD) continue;
        if (atomic_load(&t->nosig)) {
            if (!t->x_done) x_poll(t, on);
        } else if (st == CP_T_LIVE && (check || atomic_load(&t->blocked_at_start))) {
            x_check(t);
            waiting += on && atomic_load(&t->blocked_at_start);
        }
    }
    g_blocked_waiting = waiting;
    x_engine_text();
}

/* ------------------------------------------------------------------------------------
 * The host's view of signals. The agent samples on one signal (g_sig): SIGPROF unless the
 * host uses it. Each signal that ever carried the agent's handler stays "managed": the
 * kernel calls our handler for it, with the host's own mask and flags, and the host's
 * sigaction/signal calls are kept in g_host, returned by its queries, and obeyed for every
 * signal that is not the agent's (its own timer's, a kill): handler called, ignored, or the
 * default action (terminate) carried out. When the host takes the agent's signal (installs
 * a handler or SIG_IGN, arms ITIMER_PROF or a timer on it), the agent moves its events to
 * a signal the host has not used, on that call; the old one stays managed, so a sample
 * signal still pending from before the move is swallowed, never handed to the host. */

#define SIGBIT(s) (1ULL << (s))
static atomic_uint_fast64_t g_managed;     /* the kernel calls our handler for these */
static atomic_uint_fast64_t g_taken;       /* the host has used these: never the agent's again */
static struct sigaction g_host[65] CP_BIG; /* the host's view of each managed signal */

static int managed(int s)
{
    return s > 0 && s < 65 && (atomic_load(&g_managed) & SIGBIT(s));
}

/* What the kernel is given for a managed signal: our handler with the host's mask and flags
 * (SA_RESETHAND and SA_SIGINFO are emulated), or the agent's own before the host set any. */
static int install(int s, const struct sigaction *host)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = handler;
    if (host && host->sa_handler != SIG_DFL && host->sa_handler != SIG_IGN) {
        sa.sa_mask = host->sa_mask;
        sa.sa_flags = SA_SIGINFO | (host->sa_flags & (SA_RESTART | SA_ONSTACK | SA_NODEFER));
    } else {
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
    }
    return real_sigaction(s, &sa, NULL);
}

/* A host's signal arrived on a managed signal: do what the host asked for. */
static void forward(int sig, siginfo_t *si, void *uc)
{
    if (!managed(sig)) return;
    struct sigaction h = g_host[sig];
    if (h.sa_handler == SIG_IGN) return;
    if (h.sa_handler == SIG_DFL) {
        /* the default action of every signal the agent takes (SIGPROF, SIGVTALRM, real-time
         * signals) is to terminate: do it, as the kernel would have */
        struct sigaction d;
        memset(&d, 0, sizeof(d));
        d.sa_handler = SIG_DFL;
        real_sigaction(sig, &d, NULL);
        sigset_t u;
        sigemptyset(&u);
        sigaddset(&u, sig);
        pthread_sigmask(SIG_UNBLOCK, &u, NULL);
        raise(sig);
        return;
    }
    if (h.sa_flags & SA_RESETHAND) {
        g_host[sig].sa_handler = SIG_DFL;
        g_host[sig].sa_flags &= ~SA_SIGINFO;
    }
    if (h.sa_flags & SA_SIGINFO)
        h.sa_sigaction(sig, si, uc);
    else
        h.sa_handler(sig);
}

/* Whether the kernel still calls our handler for s: a program can replace it with the raw
 * rt_sigaction system call, past the sigaction hook (Go's runtime does where it does not
 * go through libc). glibc's sigaction with no new action is that system call. */
static int ours_in_kernel(int s)
{
    struct sigaction o;
    return real_sigaction(s, NULL, &o) == 0 && (o.sa_flags & SA_SIGINFO) &&
           o.sa_sigaction == handler;
}

/* A signal for the agent's events: not used by the host, not ignored, no handler. */
static int pick_signal(int avoid)
{
    int c[10] = {SIGPROF, SIGVTALRM};
    for (int i = 0; i < 8; i++)
        c[2 + i] = SIGRTMAX - i;
    uint64_t taken = atomic_load(&g_taken);
    for (int i = 0; i < 10; i++) {
        int s = c[i];
        if (s == avoid || s <= 0 || s >= 65 || (taken & SIGBIT(s))) continue;
        if (managed(s)) {
            if (g_host[s].sa_handler == SIG_DFL && ours_in_kernel(s)) return s;
            continue;
        }
        struct sigaction o;
        if (real_sigaction(s, NULL, &o) == 0 && o.sa_handler == SIG_DFL) return s;
    }
    return 0;
}

/* Makes s an agent signal: our handler, the host's view SIG_DFL (what it was). Returns 0
 * or CP_EIO (sigaction refused it). */
static int manage(int s)
{
    if (managed(s)) return 0;
    memset(&g_host[s], 0, sizeof(g_host[s]));
    g_host[s].sa_handler = SIG_DFL;
    if (install(s, NULL) < 0) return CP_EIO;
    atomic_fetch_or(&g_managed, SIGBIT(s));
    return 0;
}

/* Under g_sig_lock: moves every thread's event to a signal the host has not used. */
static void move_aside(void)
{
    int cur = atomic_load(&g_sig);
    int s = pick_signal(cur);
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    int was_on = atomic_load(&g_cpu_on);
    if (!s || manage(s) != 0) {
        /* nothing free: stop sampling rather than send the host a signal it did not ask for
         * (a Go runtime with cgo handles every signal); the agent thread says it */
        if (was_on) {
            atomic_store(&g_lost_sig, cur);
            int expect = LOST_NONE;
            atomic_compare_exchange_strong(&g_lost, &expect, LOST_SIGNALS);
        }
        atomic_store(&g_cpu_on, 0);
        s = 0;
    } else {
        atomic_store(&g_sig, s);
    }
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_LIVE) continue;
        if (!s) {
            disarm_unlocked(t);
            continue;
        }
        /* a boosted thread may hold both a perf event and a timer (one disabled) */
        if (t->perf_fd >= 0) cp_fd_fcntl(t->perf_fd, F_SETSIG, s);
        if (t->has_timer) {
            timer_delete(t->timer);
            t->has_timer = 0;
        }
        arm_unlocked(t);
    }
    spin_unlock(&g_arm_lock, &m);
    if (!s)
        snprintf(cp_engine, sizeof(cp_engine), "%s",
                 was_on ? "off; cpu_sampling_lost=signal taken" : "off");
}

/* The host is using signal s (a handler, SIG_IGN, a timer): the agent leaves it. */
static void host_takes(int s)
{
    if (s <= 0 || s >= 65) return;
    sigset_t m;
    spin_lock(&g_sig_lock, &m);
    atomic_fetch_or(&g_taken, SIGBIT(s));
    if (s == atomic_load(&g_sig) && atomic_load(&g_cpu_on)) move_aside();
    spin_unlock(&g_sig_lock, &m);
}

/* Agent thread: every thread's POSIX CPU timer still exists. timer_gettime says EINVAL
 * for one the program deleted (timer_delete of an id it never created, or the raw system
 * call); that thread is re-armed. Said once on stderr; the engine string then counts the
 * timers re-armed so far. (A deleted id the kernel already gave the program again cannot
 * be told from ours.) */
static void check_timers(void)
{
    static unsigned rearmed;
    unsigned found = 0;
    sigset_t m;
    spin_lock(&g_arm_lock, &m);
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_LIVE || !t->has_timer) continue;
        struct itimerspec v;
        if (timer_gettime(t->timer, &v) == 0 || errno != EINVAL) continue;
        t->has_timer = 0;
        arm_unlocked(t);
        found++;
    }
    spin_unlock(&g_arm_lock, &m);
    if (!found) return;
    if (!rearmed)
        fprintf(stderr,
                "contprof: the program deleted the agent's CPU timers (%u threads); re-armed, "
                "the CPU time in between is not sampled\n",
                found);
    rearmed += found;
    spin_lock(&g_sig_lock, &m);
    if (atomic_load(&g_cpu_on)) {
        char *semi = strstr(cp_engine, "; cpu_timers_rearmed=");
        size_t base = semi ? (size_t)(semi - cp_engine) : strlen(cp_engine);
        snprintf(cp_engine + base, sizeof(cp_engine) - base, "; cpu_timers_rearmed=%u", rearmed);
    }
    spin_unlock(&g_sig_lock, &m);
}

/* Agent thread, at most once a second: the sample signal's handler in the kernel is still
 * ours. If the program replaced it behind the hooks, the signal is the program's from now
 * on (no longer managed, never the agent's again) and the agent moves aside as when the
 * program takes it through sigaction; with nothing free, CPU sampling stops. Then, once,
 * one line on stderr and the reason in the engine string (envelopes, pprof comments);
 * allocations go on being sampled. */
static void check_sampling(void)
{
    static int64_t next, next_timers;
    int64_t now = cp_mono_ns();
    if (now >= next && atomic_load(&g_cpu_on)) {
        next = now + 1000000000;
        int s = atomic_load(&g_sig);
        if (!ours_in_kernel(s)) {
            /* a thread in exec sets SIG_IGN for a moment (cp_cpu_before_exec): look again */
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
        if (!ours_in_kernel(s)) {
            sigset_t m;
            spin_lock(&g_sig_lock, &m);
            if (s == atomic_load(&g_sig) && atomic_load(&g_cpu_on) && !ours_in_kernel(s)) {
                atomic_fetch_or(&g_taken, SIGBIT(s));
                atomic_fetch_and(&g_managed, ~SIGBIT(s));
                move_aside();
                if (!atomic_load(&g_cpu_on)) atomic_store(&g_lost, LOST_RAW);
            }
            spin_unlock(&g_sig_lock, &m);
        }
    }
    if (now >= next_timers && atomic_load(&g_cpu_on)) {
        next_timers = now + 1000000000;
        check_timers();
    }
    int lost = atomic_load(&g_lost);
    if (lost == LOST_NONE || atomic_exchange(&g_lost_reported, 1)) return;
    int sig = atomic_load(&g_lost_sig);
    char name[16];
    if (sig == SIGPROF || sig == SIGVTALRM)
        snprintf(name, sizeof(name), "%s", sig == SIGPROF ? "SIGPROF" : "SIGVTALRM");
    else
        snprintf(name, sizeof(name), "SIGRTMIN+%d", sig - SIGRTMIN);
    if (lost == LOST_RAW)
        fprintf(stderr,
                "contprof: the program replaced the agent's handler of %s past sigaction and no "
                "other signal is free; CPU sampling stopped, allocations are still sampled\n",
                name);
    else
        fprintf(stderr,
                "contprof: the program handles every signal the agent could sample on (the "
                "last: %s); CPU sampling stopped, allocations are still sampled\n",
                name);
}

int cp_sample_signal(void)
{
    return atomic_load(&g_sig);
}

CONTPROF_EXTERN int sigaction(int s, const struct sigaction *act, struct sigaction *old)
{
    if (cp_fatal_signal(s)) return cp_fatal_sigaction(s, act, old); /* never a sample signal */
    if (!managed(s)) {
        int rc = real_sigaction(s, act, old);
        if (rc == 0 && act && act->sa_handler != SIG_DFL) atomic_fetch_or(&g_taken, SIGBIT(s));
        return rc;
    }
    sigset_t m;
    spin_lock(&g_sig_lock, &m);
    struct sigaction prev = g_host[s];
    int rc = 0;
    if (act) {
        g_host[s] = *act;
        if (install(s, act) < 0) {
            rc = -1;
            g_host[s] = prev;
        } else if (act->sa_handler != SIG_DFL) {
            atomic_fetch_or(&g_taken, SIGBIT(s));
            if (s == atomic_load(&g_sig) && atomic_load(&g_cpu_on)) move_aside();
        }
    }
    int e = errno;
    spin_unlock(&g_sig_lock, &m);
    if (old) *old = prev;
    errno = e;
    return rc;
}

/* signal(), bsd_signal() and sysv_signal() as glibc builds them from sigaction. */
static sighandler_t signal_as(int s, sighandler_t h, int flags, int mask_self)
{
    struct sigaction a, o;
    memset(&a, 0, sizeof(a));
    a.sa_handler = h;
    sigemptyset(&a.sa_mask);
    if (mask_self && s > 0 && s < 65) sigaddset(&a.sa_mask, s);
    a.sa_flags = flags;
    if (h == SIG_ERR || sigaction(s, &a, &o) < 0) {
        errno = EINVAL;
        return SIG_ERR;
    }
    return o.sa_handler;
}

CONTPROF_EXTERN sighandler_t signal(int s, sighandler_t h)
{
    return signal_as(s, h, SA_RESTART, 1);
}

CONTPROF_EXTERN sighandler_t bsd_signal(int s, sighandler_t h)
{
    return signal_as(s, h, SA_RESTART, 1);
}

CONTPROF_EXTERN sighandler_t sysv_signal(int s, sighandler_t h)
{
    return signal_as(s, h, SA_RESETHAND | SA_NODEFER, 0);
}

CONTPROF_EXTERN int setitimer(__itimer_which_t which, const struct itimerval *nv,
                              struct itimerval *ov)
{
    typedef int (*fn)(__itimer_which_t, const struct itimerval *, struct itimerval *);
    static fn real;
    if (!real) real = (fn)dlsym(RTLD_NEXT, "setitimer");
    if (!real) return errno = ENOSYS, -1;
    if (nv && (nv->it_value.tv_sec || nv->it_value.tv_usec))
        host_takes(which == ITIMER_PROF ? SIGPROF : which == ITIMER_VIRTUAL ? SIGVTALRM : 0);
    return real(which, nv, ov);
}

CONTPROF_EXTERN int timer_create(clockid_t c, struct sigevent *sev, timer_t *id)
{
    if (!sev)
        host_takes(SIGALRM);
    else if (sev->sigev_notify == SIGEV_SIGNAL || sev->sigev_notify == SIGEV_THREAD_ID)
        host_takes(sev->sigev_signo);
    return real_timer_create(c, sev, id);
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
    cp_fd_gate_enter(); /* the probe's fd, at the lowest free number, never seen by the host */
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd >= 0) cp_fd_close(fd);
    cp_fd_gate_leave();
    return fd >= 0;
}

int cp_cpu_start(void)
{
    cp_fd_set_perf_holder(perf_fd_moved);
    if (!g_key_ok && pthread_key_create(&g_key, thread_exit) == 0) g_key_ok = 1;
    if (cp_cfg.cpu_hz <= 0) {
        snprintf(cp_engine, sizeof(cp_engine), "off");
        return 0;
    }
    cp_period_ns = 1000000000 / cp_cfg.cpu_hz;
    g_x_refuse = getenv("CONTPROF_TEST_NO_PERF") != NULL;
    /* SIGPROF, unless the program already handles or ignores it (then the next free one) */
    sigset_t m;
    spin_lock(&g_sig_lock, &m);
    int sig = atomic_load(&g_sig);
    if (!managed(sig) || (atomic_load(&g_taken) & SIGBIT(sig))) sig = pick_signal(0);
    int rc = sig ? manage(sig) : CP_ELIMIT;
    if (rc == 0) atomic_store(&g_sig, sig);
    spin_unlock(&g_sig_lock, &m);
    if (rc != 0) return rc;

    g_use_perf = cp_cfg.cpu_engine != CP_ENGINE_TIMER &&
                 (cp_cfg.cpu_engine == CP_ENGINE_PERF || cp_period_ns < CP_TIMER_MIN_PERIOD_NS) &&
                 perf_usable();
    if (g_use_perf) g_perf_ok = 1;
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
        if (!t || atomic_load(&t->state) != CP_T_LIVE) continue;
        if (atomic_load(&t->nosig) && t->x_done) { /* a stop closed its event: found again */
            t->x_done = 0;
            t->x_cpu_ns = -1;
            atomic_store(&t->nosig, 0);
        }
        arm(t);
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
    if (sa.agent) {
        cp_guard_agent_thread_begin(0);
    } else {
        cp_thread *t = cp_thread_register_self();
        if (t) {
            note_blocked_at_start(t);
            t->start_arg = (uintptr_t)sa.arg;
            atomic_store_explicit(&t->start_fn, (uintptr_t)sa.fn, memory_order_release);
        }
    }
    return sa.fn(sa.arg);
}

static void (*g_create_hook)(void);

void cp_threads_set_create_hook(void (*fn)(void))
{
    g_create_hook = fn;
}

static pthread_create_fn real_pthread_create(void)
{
    static pthread_create_fn real;
    if (!real) real = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
    return real;
}

int cp_thread_create_agent(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *))
{
    pthread_create_fn real = real_pthread_create();
    return real ? real(th, attr, fn, NULL) : EAGAIN;
}

CONTPROF_EXTERN int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                                   void *arg)
{
    pthread_create_fn real = real_pthread_create();
    if (!real) return EAGAIN;
    if (g_create_hook && !cp_in_agent) g_create_hook();
    start_arg *sa = cp_real_malloc(sizeof(*sa));
    if (!sa) return real(th, attr, fn, arg); /* degrade: the thread is scanned later */
    sa->fn = fn;
    sa->arg = arg;
    sa->agent = cp_in_agent;
    /* glibc allocates the new thread's TLS in here: not sampled, as its stack would hold
     * this hook's frame (allocation stacks start at the hook's caller) */
    int saved = cp_in_agent;
    cp_in_agent = 1;
    int rc = real(th, attr, start_thunk, sa);
    cp_in_agent = saved;
    if (rc != 0) cp_real_free(sa);
    return rc;
}

/* C11 threads: glibc's thrd_create does not go through pthread_create, and librdkafka starts
 * its threads with it; they must be known as the agent's (their fds go above the floor,
 * their allocations are not sampled and never fail). */
typedef struct thrd_arg {
    int (*fn)(void *);
    void *arg;
    int agent;
} thrd_arg;

static int thrd_thunk(void *p)
{
    thrd_arg ta = *(thrd_arg *)p;
    cp_real_free(p);
    if (ta.agent)
        cp_guard_agent_thread_begin(0);
    else
        note_blocked_at_start(cp_thread_register_self());
    return ta.fn(ta.arg);
}

CONTPROF_EXTERN int thrd_create(thrd_t *th, thrd_start_t fn, void *arg)
{
    typedef int (*thrd_create_fn)(thrd_t *, thrd_start_t, void *);
    static thrd_create_fn real;
    if (!real) real = (thrd_create_fn)dlsym(RTLD_NEXT, "thrd_create");
    if (!real) return thrd_error;
    if (g_create_hook && !cp_in_agent) g_create_hook();
    thrd_arg *ta = cp_real_malloc(sizeof(*ta));
    if (!ta) return real(th, fn, arg);
    ta->fn = fn;
    ta->arg = arg;
    ta->agent = cp_in_agent;
    int saved = cp_in_agent; /* as in pthread_create */
    cp_in_agent = 1;
    int rc = real(th, thrd_thunk, ta);
    cp_in_agent = saved;
    if (rc != thrd_success) cp_real_free(ta);
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
                atomic_load(&t->state) == CP_T_LIVE && !atomic_load(&t->labelled))
                set_name(t->name, name);
        }
    }
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Isolates a thread is in (the table is isolate.c's) */

CONTPROF_EXTERN void contprof_isolate_enter(contprof_isolate *iso)
{
    cp_thread *t = cp_self ? cp_self : cp_thread_register_self();
    if (!t || !iso) return;
    unsigned d = atomic_load_explicit(&t->iso_depth, memory_order_relaxed);
    if (d < 16) t->iso_stack[d] = iso->id;
    atomic_store_explicit(&t->iso_depth, d + 1, memory_order_release);
}

CONTPROF_EXTERN void contprof_isolate_leave(void)
{
    cp_thread *t = cp_self;
    if (!t) return;
    unsigned d = atomic_load_explicit(&t->iso_depth, memory_order_relaxed);
    if (d > 0) atomic_store_explicit(&t->iso_depth, d - 1, memory_order_release);
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
 * exec (the hooks are in exec.c): a sample signal still pending when the image is replaced
 * would be delivered to the new program with the default action (terminate). */

/* Every managed signal: pending ones discarded (ignoring a signal drops it); then our
 * handler again, which exec resets to SIG_DFL, exactly what the host's handler or SIG_DFL
 * becomes, or SIG_IGN where the host ignores it, which exec keeps, as it would for the
 * host. */
cp_thread *cp_cpu_before_exec(void)
{
    uint64_t mg = atomic_load(&g_managed);
    sigset_t set, old;
    sigemptyset(&set);
    for (int s = 1; s < 65; s++)
        if (mg & SIGBIT(s)) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    cp_thread *t = cp_self ? cp_self : find_by_tid(my_tid());
    if (t) disarm(t);
    struct sigaction ign;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    for (int s = 1; s < 65; s++) {
        if (!(mg & SIGBIT(s))) continue;
        real_sigaction(s, &ign, NULL);
        if (g_host[s].sa_handler != SIG_IGN) install(s, &g_host[s]);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return t;
}

void cp_cpu_after_failed_exec(cp_thread *t)
{
    int e = errno;
    uint64_t mg = atomic_load(&g_managed);
    for (int s = 1; s < 65; s++)
        if ((mg & SIGBIT(s)) && g_host[s].sa_handler == SIG_IGN) install(s, &g_host[s]);
    if (t && atomic_load(&t->state) == CP_T_LIVE) arm(t);
    errno = e;
}
