/* CPU sampling: the thread registry and its sample rings, one CPU-time event per thread,
 * the signal handler, and the host's view of signals (README.md "Signals"). Below the
 * agent and the allocation sampler; above the leaves (guard, config, fd, isolate,
 * nextmalloc, unwind). */
#ifndef CP_THREAD_H
#define CP_THREAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "guard.h"
#include "unwind.h"

typedef struct cp_sample_rec {
    uint32_t isolate; /* explicit isolate id, 0 = the thread's own */
    uint32_t nframes;
    uint64_t weight;   /* periods of CPU time */
    int64_t period_ns; /* the period of the event that took it (boosted threads: shorter) */
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
    /* The periods the events run at (the handler tags each sample with its event's), and
     * whether the perf event counts: a boost may leave a disabled perf event behind, kept
     * (never unmapped under a handler) until the thread disarms for good. */
    int64_t timer_period_ns, perf_period_ns;
    /* The timer's first expiry (the thread's CPU clock, ns; -1 unknown) and t's ring head
     * when it was armed: the schedule its samples since follow. */
    int64_t timer_first_ns;
    unsigned timer_head;
    int perf_enabled;
    /* A capture's period for this thread (0: the agent's own rate); agent thread only,
     * like acc_ns (boosted CPU not yet passed to the always-on window) and cap_mask (the
     * captures, by slot, whose selector matches the thread's isolate now). */
    int64_t boost_ns;
    int64_t acc_ns;
    uint64_t cap_mask;
    uint64_t api_mask; /* captures of the API isolate it was last found running */
    int64_t api_until; /* ... boosted until then (mono ns) */
    uint32_t cap_gen;  /* captable.c's generation cap_mask was computed in */
    char cap_name[16]; /* and the thread name it was computed for */
    /* A capture's allocation rate for this thread's allocations (0: the agent's own),
     * read by the allocation hooks; set by the agent thread. */
    _Atomic int64_t alloc_boost;
    char name[16];
    /* The start routine and argument the thread was created with (0: not seen), for the
     * agent to recognize Node's worker threads; labelled: name holds the agent's label for
     * it, which thread names no longer replace. start_checked is the agent's. */
    _Atomic uintptr_t start_fn;
    uintptr_t start_arg;
    atomic_int labelled;
    atomic_int start_checked;
    /* The thread's own name as it read it (PR_GET_NAME) when its image ended; own_named set
     * after: the agent's last names refresh takes it instead of reading /proc. */
    char own_name[16];
    atomic_int own_named;
    uint32_t iso_stack[16]; /* explicit isolates entered, innermost last */
    atomic_uint iso_depth;
    atomic_uint head; /* written by the thread (handler or safepoint) */
    atomic_uint tail; /* written by the agent */
    atomic_uint_fast64_t dropped;
    /* The engine that needs no signal, for a thread that blocks the sample signal (README.md
     * "CPU"): nosig 1, a perf event the agent thread opened and reads, the agent then the
     * ring's only writer; 2, refused: the thread's CPU time is counted in dropped. The
     * handler takes no sample of a nosig thread. The x_ fields are the agent's. */
    atomic_int nosig;
    atomic_int blocked_at_start; /* the pthread_create thunk found the signal blocked */
    int x_fd;
    void *x_ring;
    int x_done;         /* a dead nosig thread accounted for and its event closed: reapable */
    unsigned x_head;    /* ring head at the last check */
    int64_t x_cpu_ns;   /* the thread's CPU clock then (-1: not read yet) */
    int64_t x_carry_ns; /* refused: CPU time not yet a whole dropped period */
    _Atomic int64_t x_exit_cpu_ns; /* a nosig thread's CPU clock at its exit (0: not yet) */
    /* A sample waiting for the walker at the next safe point. */
    atomic_int pending;
    cp_sample_rec pend;
    cp_ucache ucache_sig;   /* the signal handler's */
    cp_ucache ucache_alloc; /* the allocation path's */
    cp_sample_rec ring[CP_RING];
} cp_thread;

/* The registry: slots are mmap'd once and never unmapped (the handler may still read a
 * reaped slot); a slot's state says whether it is in use. */
#define CP_MAX_THREADS 4096
extern cp_thread *_Atomic cp_threads[CP_MAX_THREADS];
extern atomic_uint cp_threads_hwm; /* slots ever used */

/* The calling thread's slot, once registered on its own thread; NULL otherwise. Read in
 * the signal handler and the allocation hooks. */
extern CP_TLS cp_thread *cp_self;

/* Engine string such as "perf-task-clock 1ms" or "posix-cpu-timer 4ms", or "off". */
extern char cp_engine[64];
extern int64_t cp_period_ns;
extern atomic_uint_fast64_t cp_dropped_samples; /* process-wide (no thread slot, etc.) */

/* Installs the handler on the sample signal and arms every known thread at cp_cfg's rate.
 * Returns 0 (also when cpu_hz is 0: engine "off"), CP_ELIMIT (no signal free of the
 * host's) or CP_EIO (sigaction refused the handler); the caller then reports engine "off".
 * Not async-signal-safe; the caller holds cp_in_agent. */
int cp_cpu_start(void);
/* Disarms every thread. */
void cp_cpu_stop(void);
/* Registers the calling thread (TLS, stack bounds, CPU event). Idempotent. Returns its
 * slot, or NULL (the agent thread, no room). Takes no lock that a signal handler takes;
 * allocates its slot with mmap, never malloc (it is called from the allocation hooks). */
cp_thread *cp_thread_register_self(void);
/* Starts the agent thread past the pthread_create hook: no start record is malloc'd here and
 * freed on the new thread (a free there sets up a glibc arena for it: 3 system calls and
 * ~10 page faults in a process that may end before the thread ever allocates). fn's first
 * act must be cp_guard_agent_thread_begin(1). Returns pthread_create's result. */
int cp_thread_create_agent(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *));
/* fn is called by the pthread_create and thrd_create hooks before a host thread creates a
 * thread: agent.c starts a fork child's agent thread there. */
void cp_threads_set_create_hook(void (*fn)(void));
/* fn is called by the signal handler (so it must be async-signal-safe) when a sample leaves
 * CP_RING / 4 or more undrained in the thread's ring. */
void cp_threads_set_fill_hook(void (*fn)(void));
/* Agent: finds threads in /proc/self/task that are not registered and arms them; none
 * while glibc says the process is single-threaded. */
void cp_threads_scan(void);
/* Agent: frees DEAD slots (after their rings were drained) and marks vanished tids; at
 * most once a second, checks that the kernel still calls the agent's handler for the
 * sample signal (a raw rt_sigaction passes the hooks) and moves aside if not; says once on
 * stderr when CPU sampling stopped because the program took every signal it could use
 * (cp_engine then reads "off; cpu_sampling_lost=signal taken"). */
void cp_threads_reap(void);
/* Agent: runs thread t's CPU event at period_ns (0: the agent's own rate, cp_period_ns).
 * Shorter periods than the timer engine can keep use perf events when the kernel allows
 * them. Returns the period now in effect for t (0 if CPU sampling is off or t is not live)
 * and sets *perf to whether a perf event runs it. Not async-signal-safe; agent thread. */
int64_t cp_thread_boost(cp_thread *t, int64_t period_ns, int *perf);
/* Agent, each tick before draining the rings: finds threads that block the sample signal
 * (their CPU clock ran two periods with no sample, or the pthread_create hook saw the signal
 * blocked; then /proc/self/task/TID/status says so) and samples them with a perf event it
 * reads itself, each sample unwound from a copy of the top of the thread's stack and pushed
 * into the thread's ring like the handler's; where perf is refused, names the thread once
 * on stderr and counts its CPU time in dropped. Adds "; signal_blocked=N ..." to cp_engine.
 * Not async-signal-safe; agent thread only. */
void cp_threads_poll_blocked(void);

/* How often the agent looks while a thread that started with the sample signal blocked waits
 * to be switched (it switches once the thread ran two periods), and how many wait (agent
 * thread). The hook (agent.c: wake the agent thread) is called on such a thread as it
 * starts. */
#define CP_BLOCKED_TICK_NS ((int64_t)20 * 1000000)
unsigned cp_threads_blocked_waiting(void);
void cp_threads_set_blocked_hook(void (*fn)(void));
/* Agent: refreshes thread names from /proc/self/task/TID/comm (not of labelled threads),
 * or from what a thread said itself (cp_thread_say_name). */
void cp_threads_refresh_names(void);
/* On a host thread whose image ends (exit, exec, _exit, a fatal signal), before it wakes
 * the agent for the last window: the thread reads its own name, a system call, where the
 * agent's /proc read of it costs 25-75 us in a short process (each /proc/self/task/TID
 * lookup builds its inodes anew). Async-signal-safe. */
void cp_thread_say_name(void);
/* Agent: names t's isolate label (≤ 15 bytes), kept over the thread's own name from now on
 * (nodeworker.h). */
void cp_thread_set_label(cp_thread *t, const char *label);
/* After fork in the child: only the calling thread survives. */
void cp_threads_after_fork_child(void);

/* The agent's signal handler was found or moved to this signal (SIGPROF unless the host
 * uses it); README.md "Signals". */
int cp_sample_signal(void);

/* exec (exec.c): before the image is replaced, every managed signal is discarded and set
 * as the new image would see it without the agent, and the calling thread's event is
 * disarmed; returns that thread's slot (may be NULL) for cp_cpu_after_failed_exec, which
 * undoes it when exec returned. Both async-signal-safe (exec is called between fork and
 * exec); errno is preserved by the second. */
cp_thread *cp_cpu_before_exec(void);
void cp_cpu_after_failed_exec(cp_thread *t);

#endif
