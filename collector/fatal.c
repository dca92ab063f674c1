/* Fatal signals: the window in progress is written before a signal's default action ends
 * the process (SIGTERM from a supervisor, Ctrl-C, abort(), a crash), and the process then
 * dies of that signal exactly as it would have (README.md "Signals"). */
#include "fatal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "contprof.h"
#include "guard.h"

/* The set, and why each: every signal whose default action ends the process (terminate or
 * core), less SIGKILL (cannot be caught) and SIGPROF/SIGVTALRM (the agent may sample on
 * them; thread.c manages them). Real-time signals are left out: the agent samples on the
 * highest ones, and programs that use the others handle them. */
#define SIGBIT(s) (1ULL << (s))
static const uint64_t FATAL_SET =
    SIGBIT(SIGHUP) | SIGBIT(SIGINT) | SIGBIT(SIGQUIT) | SIGBIT(SIGILL) | SIGBIT(SIGTRAP) |
    SIGBIT(SIGABRT) | SIGBIT(SIGBUS) | SIGBIT(SIGFPE) | SIGBIT(SIGUSR1) | SIGBIT(SIGSEGV) |
    SIGBIT(SIGUSR2) | SIGBIT(SIGPIPE) | SIGBIT(SIGALRM) | SIGBIT(SIGTERM) | SIGBIT(SIGSTKFLT) |
    SIGBIT(SIGXCPU) | SIGBIT(SIGXFSZ) | SIGBIT(SIGIO) | SIGBIT(SIGPWR) | SIGBIT(SIGSYS);

/* How much longer than the flush's own bound (agent.c: 200 ms, plus CONTPROF_FLUSH with
 * brokers) the handler lets the process live before its watchdog delivers the signal. */
#define WATCHDOG_SLACK_NS (300 * (int64_t)1000000)
#define FLUSH_BOUND_NS (200 * (int64_t)1000000)
/* How long after the handler a fault that should come again at once (a repeating one) has
 * before a watchdog delivers its signal: a program may send itself a positive si_code. */
#define REPEAT_WAIT_NS (50 * (int64_t)1000000)

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction_p;
static _Atomic(cp_fatal_flush_fn) g_flush;
/* The kernel calls our handler for these; the host's disposition is SIG_DFL, as in g_view. */
static atomic_uint_fast64_t g_managed;
static struct sigaction
    g_view[65] CP_BIG; /* what the host set (or found) for each managed signal */
static atomic_flag g_lock = ATOMIC_FLAG_INIT;

static int real_sigaction(int s, const struct sigaction *act, struct sigaction *old)
{
    if (!real_sigaction_p) real_sigaction_p = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    return real_sigaction_p ? real_sigaction_p(s, act, old) : (errno = ENOSYS, -1);
}

/* The host's sigaction calls on one thread never meet another's half-way; every signal is
 * blocked while held, so the handler of a signal never waits for it on its own thread. */
static void lock(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
    while (atomic_flag_test_and_set_explicit(&g_lock, memory_order_acquire))
        sched_yield();
}

static void unlock(const sigset_t *old)
{
    atomic_flag_clear_explicit(&g_lock, memory_order_release);
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

static int managed(int s)
{
    return atomic_load(&g_managed) & SIGBIT(s);
}

static void set_default(int s)
{
    struct sigaction d;
    memset(&d, 0, sizeof(d));
    d.sa_handler = SIG_DFL;
    real_sigaction(s, &d, NULL);
}

/* ------------------------------------------------------------------------------------
 * The handler */

static void on_fatal(int sig, siginfo_t *si, void *uc);

static int install(int s)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fatal;
    /* every signal blocked while it runs: another fatal signal waits (the process dies of
     * this one, as without the agent); a fault inside is forced to its default action by
     * the kernel. SA_ONSTACK: a host's sigaltstack serves a stack overflow. */
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    return real_sigaction(s, &sa, NULL);
}

static int ours_in_kernel(int s)
{
    struct sigaction o;
    return real_sigaction(s, NULL, &o) == 0 && (o.sa_flags & SA_SIGINFO) &&
           o.sa_sigaction == on_fatal;
}

/* A timer that sends sig to this thread once the flush has had its bound and more: whatever
 * the flush waits for (a lock the interrupted code holds), the process dies of sig then.
 * Raw system calls: the timer_create hook is the host's. Returns the kernel's timer id, or
 * -1 if none could be made (RLIMIT_SIGPENDING): the flush's own bounds still hold. */
static int arm_watchdog(int sig, pid_t tid, int64_t ns)
{
    struct sigevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = sig;
    ev._sigev_un._tid = tid;
    int id = -1;
    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &ev, &id) != 0) return -1;
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = ns / 1000000000;
    its.it_value.tv_nsec = ns % 1000000000;
    if (syscall(SYS_timer_settime, id, 0, &its, NULL) != 0) {
        syscall(SYS_timer_delete, id);
        return -1;
    }
    return id;
}

/* A fault the kernel raised for an instruction (si_code > 0) happens again when the handler
 * returns: with the default action back, the process dies of it with the faulting context in
 * its core, as without the agent. SIGTRAP and SIGSYS do not repeat (the trap or the refused
 * system call is behind), nor a machine check reported after the fact (BUS_MCEERR_AO). */
static int repeats(int sig, const siginfo_t *si)
{
    if (si->si_code <= 0) return 0;
    return sig == SIGSEGV || sig == SIGILL || sig == SIGFPE ||
           (sig == SIGBUS && si->si_code != BUS_MCEERR_AO);
}

/* The thread writing the window for a fatal signal, which signal, and since when. The same
 * signal again within DUPLICATE_NS is the same event, not a second Ctrl-C: timeout(1) and
 * supervisors send it to the process and then to its group, and the copy is pending by the
 * time the handler unblocks it for the watchdog. */
#define DUPLICATE_NS (100 * (int64_t)1000000)
static atomic_int g_dying_tid, g_dying_sig;
static _Atomic int64_t g_dying_since;

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The default action back, sig unblocked on this thread, and sig sent to it: returns only if
 * that did not end the process (the init of a PID namespace ignores a default-action signal;
 * a debugger swallowed it). */
static void die_of(int sig, pid_t pid, pid_t tid)
{
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    set_default(sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    syscall(SYS_tgkill, pid, tid, sig);
}

/* Runs with every signal blocked (install). Unless the agent is not running or this thread
 * is the agent's own or inside its code, the window is written first, bounded twice (the
 * flush's wait, the watchdog), with sig unblocked on this thread: the watchdog, a second
 * Ctrl-C (the same signal after DUPLICATE_NS) or another thread's fault ends the process at
 * once; a copy of the same signal within DUPLICATE_NS is dropped. Then the process dies of
 * sig: a repeating fault by returning with the default action back, anything else by sending
 * sig to this thread again. If that does not end the process, the handler is put back and
 * the program goes on as it would have. */
static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    int saved_errno = errno;
    pid_t pid = (pid_t)syscall(SYS_getpid), tid = (pid_t)syscall(SYS_gettid);
    int dying = atomic_load(&g_dying_tid);
    if (dying != 0 && atomic_load(&g_dying_sig) == sig) {
        if (si->si_code != SI_TIMER && !repeats(sig, si) &&
            mono_ns() - atomic_load(&g_dying_since) < DUPLICATE_NS) {
            errno = saved_errno; /* the copy: the flush goes on */
            return;
        }
        die_of(sig, pid, tid);
        errno = saved_errno;
        return;
    }
    cp_fatal_flush_fn flush = atomic_load(&g_flush);
    int watchdog = -1, expect = 0;
    if (flush && contprof_running() && !cp_agent_thread && !cp_in_agent) {
        /* the first fatal signal is the one whose copies are dropped; another one on
         * another thread meanwhile writes the window too (agent_flush takes turns) */
        if (atomic_compare_exchange_strong(&g_dying_tid, &expect, (int)tid)) {
            atomic_store(&g_dying_since, mono_ns());
            atomic_store(&g_dying_sig, sig);
        }
        int64_t ns = FLUSH_BOUND_NS + WATCHDOG_SLACK_NS;
        if (cp_cfg.brokers[0] || cp_cfg.server[0]) ns += cp_cfg.flush_ns;
        watchdog = arm_watchdog(sig, tid, ns);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL);
        flush();
        pthread_sigmask(SIG_BLOCK, &one, NULL);
    }
    if (repeats(sig, si)) {
        set_default(sig);
        /* the watchdog stays: it delivers sig should the fault not come again (a positive
         * si_code the program sent itself) */
        if (watchdog < 0) arm_watchdog(sig, tid, REPEAT_WAIT_NS);
        errno = saved_errno;
        return;
    }
    die_of(sig, pid, tid);
    /* still alive: the signal was ignored or swallowed */
    if (watchdog >= 0) syscall(SYS_timer_delete, watchdog);
    if (atomic_load(&g_dying_tid) == (int)tid) atomic_store(&g_dying_tid, 0);
    if (managed(sig)) install(sig);
    errno = saved_errno;
}

/* ------------------------------------------------------------------------------------
 * The host's view */

int cp_fatal_signal(int s)
{
    return s > 0 && s < 64 && (FATAL_SET & SIGBIT(s));
}

/* Only the forking thread lives on in a child: a lock another thread held is free there. */
static void after_fork_child(void)
{
    atomic_flag_clear(&g_lock);
    atomic_store(&g_dying_tid, 0);
}

void cp_fatal_set_flush(cp_fatal_flush_fn fn)
{
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, after_fork_child) == 0) atfork_done = 1;
    sigset_t m;
    lock(&m);
    atomic_store(&g_flush, fn);
    for (int s = 1; s < 64; s++) {
        if (!cp_fatal_signal(s) || managed(s)) continue;
        struct sigaction o;
        if (real_sigaction(s, NULL, &o) != 0 || o.sa_handler != SIG_DFL) continue;
        if (install(s) != 0) continue;
        g_view[s] = o;
        atomic_fetch_or(&g_managed, SIGBIT(s));
    }
    unlock(&m);
}

int cp_fatal_sigaction(int s, const struct sigaction *act, struct sigaction *old)
{
    sigset_t m;
    lock(&m);
    /* replaced past the hooks (sigset, the raw system call): the kernel's is the host's */
    if (managed(s) && !ours_in_kernel(s)) atomic_fetch_and(&g_managed, ~SIGBIT(s));
    struct sigaction prev;
    int rc = 0;
    if (managed(s)) {
        prev = g_view[s];
        if (act && act->sa_handler == SIG_DFL) {
            g_view[s] = *act;
        } else if (act) {
            rc = real_sigaction(s, act, NULL);
            if (rc == 0) atomic_fetch_and(&g_managed, ~SIGBIT(s));
        }
    } else if (act && act->sa_handler == SIG_DFL && atomic_load(&g_flush)) {
        /* the host gives the signal back: the agent's handler, never SIG_DFL in between */
        rc = real_sigaction(s, NULL, &prev);
        if (rc == 0 && install(s) == 0) {
            g_view[s] = *act;
            atomic_fetch_or(&g_managed, SIGBIT(s));
        } else if (rc == 0) {
            rc = real_sigaction(s, act, NULL);
        }
    } else {
        rc = real_sigaction(s, act, &prev);
        if (rc == 0 && (prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == on_fatal) {
            /* ours came back past the hooks (glibc's system() restores SIGINT and SIGQUIT
             * with its own sigaction after ignoring them): the host's is still g_view's */
            prev = g_view[s];
            if (!act) atomic_fetch_or(&g_managed, SIGBIT(s));
        }
    }
    int e = errno;
    unlock(&m);
    if (rc == 0 && old) *old = prev;
    errno = e;
    return rc;
}
