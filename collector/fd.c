/* The agent's file descriptors, kept out of the host's way. Every fd created on one of the
 * agent's threads (its own files and sockets, librdkafka's sockets and wake-up pipes, libdw's
 * ELF files) and every perf event fd is moved above a floor near the fd limit, close-on-exec,
 * and marked in a table. The host's close, close_range, closefrom, dup, dup2, dup3, fcntl (and
 * the same through syscall()) are interposed so that the host can neither close nor overwrite
 * one of them by accident and gets the results it would get if the agent were not there: an
 * agent fd looks closed to the host (EBADF), a close-all skips it, and a dup2 onto its number
 * hands the number to the host after moving the agent's fd away (perf) or revoking it (every
 * other: the agent's threads then get EBADF on that number and the Kafka client is rebuilt).
 * A gate keeps the host's calls that make, close or overwrite an fd from meeting an agent
 * fd between its birth at a low number and its move; fopen/opendir on the agent's threads
 * are made of the hooked open, and dlopen (whose fds libc makes past any hook) holds the
 * gate. The fd table is grown to cover the floor once, while the process has one thread
 * (cp_fd_reserve: the constructor, a fork child), since growing it later, with the agent
 * thread running, waits for an RCU grace period (milliseconds, at every process's exit);
 * kept over a floor below the kernel's initial 64 (it would meet a host's own fds, and
 * librdkafka's cannot be moved) and over moving only when the host reaches the agent's
 * numbers (the host's open() would get other numbers than without the agent). Design and
 * limits: README.md, "File descriptors". */
#include "fd.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <dirent.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "contprof.h"
#include "guard.h"
#include "unwind.h"

_Atomic unsigned char cp_fd_state[CP_FD_MAX] CP_BIG;
atomic_uint cp_fd_revocations;
static atomic_int g_hwm;   /* 1 + the highest fd ever marked */
static atomic_int g_floor; /* 0 until computed */
static atomic_int g_pid;   /* this process, to tell a vfork child (which shares our memory) */
static _Atomic(cp_fd_perf_moved_fn) g_perf_holder; /* thread.c's cp_perf_fd_moved */
static _Atomic(cp_fd_exit_fn) g_exit_hook;         /* agent.c's flush */

void cp_fd_set_perf_holder(cp_fd_perf_moved_fn fn)
{
    atomic_store(&g_perf_holder, fn);
}

void cp_fd_set_exit_hook(cp_fd_exit_fn fn)
{
    atomic_store(&g_exit_hook, fn);
}

/* ------------------------------------------------------------------------------------
 * The real functions */

static int (*real_close)(int);
static int (*real_close_range)(unsigned, unsigned, int);
static void (*real_closefrom)(int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_fcntl)(int, int, ...);
static long (*real_syscall)(long, ...);
static int (*real_socket)(int, int, int);
static int (*real_socketpair)(int, int, int, int[2]);
static int (*real_pipe)(int[2]);
static int (*real_pipe2)(int[2], int);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static FILE *(*real_fopen)(const char *, const char *);
static FILE *(*real_fopen64)(const char *, const char *);
static FILE *(*real_fdopen)(int, const char *);
static int (*real_fclose)(FILE *);
static DIR *(*real_opendir)(const char *);
static DIR *(*real_fdopendir)(int);
static int (*real_closedir)(DIR *);
static void *(*real_dlopen)(const char *, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static int (*real_poll)(struct pollfd *, nfds_t, int);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_shutdown)(int, int);
static int (*real_getsockopt)(int, int, int, void *, socklen_t *);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static int (*real_getsockname)(int, struct sockaddr *, socklen_t *);

static inline void *resolve(void **slot, const char *name)
{
    void *p = *slot;
    if (__builtin_expect(p == NULL, 0)) *slot = p = dlsym(RTLD_NEXT, name);
    return p;
}
#define REAL(f) ((__typeof__(real_##f))resolve((void **)&real_##f, #f))

/* ------------------------------------------------------------------------------------
 * The table */

static inline unsigned char fd_state(int fd)
{
    return (unsigned)fd < CP_FD_MAX ? atomic_load_explicit(&cp_fd_state[fd], memory_order_relaxed)
                                    : CP_FD_HOST;
}

/* A live fd of the agent's (not one the host has taken over). */
static inline int agent_fd(int fd)
{
    unsigned char s = fd_state(fd);
    return s == CP_FD_AGENT || s == CP_FD_PERF;
}

static inline int revoked(int fd)
{
    return fd_state(fd) == CP_FD_REVOKED;
}

static void mark(int fd, unsigned char st)
{
    atomic_store(&cp_fd_state[fd], st);
    int h = atomic_load(&g_hwm);
    while (fd + 1 > h && !atomic_compare_exchange_weak(&g_hwm, &h, fd + 1)) {
    }
}

/* Where the agent's fds go: 256 below the soft limit (at most 4096: the kernel's fd table
 * grows to the highest fd in use), half of it for small limits. The host's open(), dup()
 * and F_DUPFD take the lowest free number, so they meet the agent's only once the host
 * holds that many fds itself. */
static int fd_floor(void)
{
    int f = atomic_load_explicit(&g_floor, memory_order_relaxed);
    if (f) return f;
    struct rlimit rl;
    rlim_t cap = 4096;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < cap) cap = rl.rlim_cur;
    f = cap > 512 ? (int)cap - 256 : (int)cap / 2;
    if (f < 3) f = 3;
    atomic_store(&g_floor, f);
    return f;
}

int cp_fd_adopt(int fd, int kind)
{
    if (fd < 0) return fd;
    int e = errno;
    if (!atomic_load_explicit(&g_pid, memory_order_relaxed)) atomic_store(&g_pid, (int)getpid());
    int fl = fd_floor();
    if (fd < fl) {
        int hi = REAL(fcntl)(fd, F_DUPFD_CLOEXEC, fl);
        if (hi >= 0) {
            REAL(close)(fd);
            fd = hi;
        } else if (errno == EBADF) {
            return -1; /* closed by the host past the gate's bound: the number is not ours */
        }
        /* else (no room above the floor): it stays where it is, still marked */
    } else {
        REAL(fcntl)(fd, F_SETFD, FD_CLOEXEC);
    }
    if (fd >= CP_FD_MAX) {
        REAL(close)(fd);
        errno = EMFILE;
        return -1;
    }
    mark(fd, (unsigned char)kind);
    errno = e;
    return fd;
}

int cp_fd_close(int fd)
{
    unsigned char s = fd_state(fd);
    if (s == CP_FD_REVOKED) { /* the number is the host's now */
        atomic_store(&cp_fd_state[fd], CP_FD_HOST);
        return 0;
    }
    int rc = REAL(close)(fd);
    if (s != CP_FD_HOST) atomic_store(&cp_fd_state[fd], CP_FD_HOST);
    return rc;
}

/* The host is about to take number fd over (dup2/dup3 onto it): a perf fd moves to another
 * number (its thread's slot is updated), any other is revoked. */
static void vacate(int fd)
{
    /* A vfork child's dup2 changes its own fd table, not ours: nothing of ours moves. */
    int pid = atomic_load(&g_pid);
    if (!pid) atomic_store(&g_pid, pid = (int)getpid());
    if (pid != (int)getpid()) return;
    if (fd_state(fd) == CP_FD_PERF) {
        int m = REAL(fcntl)(fd, F_DUPFD_CLOEXEC, fd_floor());
        if (m >= 0 && m < CP_FD_MAX) {
            mark(m, CP_FD_PERF);
            cp_fd_perf_moved_fn moved = atomic_load(&g_perf_holder);
            if (!moved || moved(fd, m) != 0) cp_fd_close(m);
            atomic_store(&cp_fd_state[fd], CP_FD_HOST);
            return;
        }
        if (m >= 0) REAL(close)(m);
    }
    atomic_store(&cp_fd_state[fd], CP_FD_REVOKED);
    atomic_fetch_add(&cp_fd_revocations, 1);
}

/* Next agent fd in [from, to], or -1. */
static long long next_agent(long long from, long long to)
{
    long long h = atomic_load(&g_hwm);
    if (to >= h) to = h - 1;
    for (long long fd = from; fd <= to; fd++)
        if (agent_fd((int)fd)) return fd;
    return -1;
}

static int raw_close_range(unsigned lo, unsigned hi, int flags)
{
    if (REAL(close_range)) return real_close_range(lo, hi, flags);
    return (int)REAL(syscall)(SYS_close_range, lo, hi, flags);
}

/* close_range over [lo, hi] minus the agent's fds. */
static int close_range_skipping(unsigned lo, unsigned hi, int flags)
{
    long long a = lo;
    for (;;) {
        long long b = next_agent(a, hi);
        long long end = b < 0 ? (long long)hi : b - 1;
        if (end >= a) {
            int rc = raw_close_range((unsigned)a, (unsigned)end, flags);
            if (rc != 0) return rc;
        }
        if (b < 0 || b >= (long long)hi) return 0;
        a = b + 1;
    }
}

/* ------------------------------------------------------------------------------------
 * The gate between the host's and the agent's threads */

/* An agent fd is born at the lowest free number and moved above the floor at once. In
 * between, the number is the agent's but not yet marked: a host thread that takes the lowest
 * free number then would get the next one instead of the number it gets without the agent,
 * and a host thread that closes or overwrites that number (a close loop, close_range,
 * closefrom, dup2 onto it) would close the agent's fd and be told it closed one of its own.
 * So the two take turns, Dekker-style on two counters (sequentially consistent atomics: each
 * side announces itself, then looks at the other): a host call that makes, closes or
 * overwrites an fd waits while an agent thread is between making one and moving it (a few
 * system calls), and an agent thread waits for such host calls in flight. Both waits are
 * bounded (a host open of a FIFO may block for good, a close may flush to a slow disk): past
 * the bound the call goes on, as before this gate. accept() is left out, as it blocks by
 * design. */
static atomic_int g_agent_making, g_host_making;

#define GATE_SPINS 20000 /* sched_yield()s: milliseconds at most */

static void host_wait_slow(void)
{
    for (int i = 0; i < GATE_SPINS; i++) {
        if (!atomic_load(&g_agent_making)) {
            atomic_fetch_add(&g_host_making, 1);
            if (!atomic_load(&g_agent_making)) return;
            atomic_fetch_sub(&g_host_making, 1);
        }
        sched_yield();
    }
    atomic_fetch_add(&g_host_making, 1); /* the bound: go on */
}

static inline void host_enter(void)
{
    atomic_fetch_add(&g_host_making, 1);
    if (__builtin_expect(!atomic_load(&g_agent_making), 1)) return;
    atomic_fetch_sub(&g_host_making, 1);
    host_wait_slow();
}

static inline void host_leave(void)
{
    atomic_fetch_sub(&g_host_making, 1);
}

static void agent_enter(void)
{
    atomic_fetch_add(&g_agent_making, 1);
    for (int i = 0; i < GATE_SPINS && atomic_load(&g_host_making); i++)
        sched_yield();
}

static void agent_leave(void)
{
    atomic_fetch_sub(&g_agent_making, 1);
}

void cp_fd_gate_enter(void)
{
    agent_enter();
}

void cp_fd_gate_leave(void)
{
    agent_leave();
}

/* The kernel grows a process's fd table (64 entries at first) to the next power of two above
 * the highest number in use, and never shrinks it; in a process with more than one thread
 * (files_struct shared) expand_fdtable waits for an RCU grace period (synchronize_rcu: 3-15
 * ms on this machine), which would make the agent thread's first move above the floor cost
 * a preloaded /bin/true that much wall time at exit. Growing it once while the process has one
 * thread costs a few microseconds: a dup to the top of the agent's range, closed at once. */
void cp_fd_reserve(void)
{
    int fl = fd_floor();
    struct rlimit rl;
    int top = fl + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)top + 1)
        top = (int)rl.rlim_cur - 1;
    if (top < fl) top = fl;
    agent_enter();
    int src = REAL(open)("/", O_PATH | O_CLOEXEC, 0);
    if (src >= 0) {
        int hi = REAL(fcntl)(src, F_DUPFD_CLOEXEC, top);
        if (hi >= 0) REAL(close)(hi);
        REAL(close)(src);
    }
    agent_leave();
}

/* What cp_fd_reserve calls, found at load: in a fork child of a threaded process, dlsym could
 * wait for a loader lock that a thread of the parent held at fork. */
__attribute__((constructor)) static void fd_resolve(void)
{
    (void)REAL(open);
    (void)REAL(fcntl);
    (void)REAL(close);
}

/* on_agent on an agent thread, on_host on any other, each through its side of the gate */
#define GATED(on_agent, on_host)                                                                   \
    __extension__({                                                                                \
        int r_;                                                                                    \
        if (cp_agent_thread) {                                                                     \
            agent_enter();                                                                         \
            r_ = (on_agent);                                                                       \
            agent_leave();                                                                         \
        } else {                                                                                   \
            host_enter();                                                                          \
            r_ = (on_host);                                                                        \
            host_leave();                                                                          \
        }                                                                                          \
        r_;                                                                                        \
    })

/* ------------------------------------------------------------------------------------
 * The host's calls that close or overwrite fds */

__attribute__((noinline, cold)) static int close_slow(int fd)
{
    if (cp_agent_thread) {
        unsigned char s = fd_state(fd);
        return s != CP_FD_HOST ? cp_fd_close(fd) : REAL(close)(fd);
    }
    REAL(close);
    host_enter();
    /* looked at inside the gate: an agent fd in transit is marked by now */
    unsigned char s = fd_state(fd);
    int rc = s == CP_FD_HOST || s == CP_FD_REVOKED ? real_close(fd)
                                                   : (errno = EBADF, -1); /* not open to the host */
    host_leave();
    return rc;
}

/* A host thread's close goes through the gate (see above): the number it closes is never an
 * agent fd between its birth and its move. */
CONTPROF_EXTERN int close(int fd)
{
    int (*f)(int) = real_close;
    if (__builtin_expect(f != NULL && !cp_agent_thread, 1)) {
        host_enter();
        int rc = fd_state(fd) == CP_FD_HOST ? f(fd) : -2;
        host_leave();
        if (__builtin_expect(rc != -2, 1)) return rc;
    }
    return close_slow(fd);
}

static int host_close_range(unsigned lo, unsigned hi, int flags)
{
    /* CLOSE_RANGE_UNSHARE closes in a private copy of the table: the agent keeps its own */
    if ((flags & CLOSE_RANGE_UNSHARE) || lo > hi || next_agent(lo, hi) < 0)
        return raw_close_range(lo, hi, flags);
    return close_range_skipping(lo, hi, flags);
}

CONTPROF_EXTERN int close_range(unsigned lo, unsigned hi, int flags)
{
    if (cp_agent_thread) return raw_close_range(lo, hi, flags);
    host_enter();
    int rc = host_close_range(lo, hi, flags);
    host_leave();
    return rc;
}

static void host_closefrom(int lo)
{
    if (next_agent(lo, INT_MAX) < 0) {
        REAL(closefrom)(lo);
        return;
    }
    if (close_range_skipping((unsigned)lo, ~0U, 0) == 0) return;
    /* no close_range (kernel before 5.9): one by one up to the limit */
    struct rlimit rl;
    long long top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20)
                        ? (long long)rl.rlim_cur
                        : (1 << 20);
    for (long long fd = lo; fd < top; fd++)
        if (!agent_fd((int)fd)) REAL(close)((int)fd);
}

CONTPROF_EXTERN void closefrom(int lo)
{
    if (lo < 0) lo = 0;
    if (cp_agent_thread) {
        REAL(closefrom)(lo);
        return;
    }
    host_enter();
    host_closefrom(lo);
    host_leave();
}

/* call makes one fd (a pair into fds): on an agent thread it is moved above the floor */
#define ADOPT(call) GATED(cp_fd_adopt((call), CP_FD_AGENT), (call))
#define ADOPT_PAIR(call, fds) GATED(adopt_pair((call), (fds)), (call))

CONTPROF_EXTERN int dup(int fd)
{
    if (cp_agent_thread ? revoked(fd) : agent_fd(fd)) return errno = EBADF, -1;
    return ADOPT(REAL(dup)(fd));
}

static int host_dup2(int old, int fd)
{
    if (agent_fd(old)) return errno = EBADF, -1;
    if (agent_fd(fd) && old != fd && fcntl(old, F_GETFD) >= 0) vacate(fd);
    return REAL(dup2)(old, fd);
}

static int host_dup3(int old, int fd, int flags)
{
    if (agent_fd(old)) return errno = EBADF, -1;
    if (agent_fd(fd) && old != fd && (flags & ~O_CLOEXEC) == 0 && fcntl(old, F_GETFD) >= 0)
        vacate(fd);
    return REAL(dup3)(old, fd, flags);
}

/* dup2/dup3 overwrite a number: a host thread's go through the gate, as close does */
CONTPROF_EXTERN int dup2(int old, int fd)
{
    if (cp_agent_thread) return REAL(dup2)(old, fd);
    host_enter();
    int rc = host_dup2(old, fd);
    host_leave();
    return rc;
}

CONTPROF_EXTERN int dup3(int old, int fd, int flags)
{
    if (cp_agent_thread) return REAL(dup3)(old, fd, flags);
    host_enter();
    int rc = host_dup3(old, fd, flags);
    host_leave();
    return rc;
}

CONTPROF_EXTERN int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (__builtin_expect(fd_state(fd) != CP_FD_HOST, 0)) {
        if (cp_agent_thread ? revoked(fd) : agent_fd(fd)) return errno = EBADF, -1;
    }
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) /* makes an fd: through the gate */
        return ADOPT(REAL(fcntl)(fd, cmd, arg));
    return REAL(fcntl)(fd, cmd, arg);
}

/* The same through syscall(2), as programs written before glibc's wrappers do. */
CONTPROF_EXTERN long syscall(long n, ...)
{
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (!cp_agent_thread) {
        switch (n) {
        case SYS_close:
            return close((int)a);
        case SYS_close_range:
            return close_range((unsigned)a, (unsigned)b, (int)c);
        case SYS_dup:
            return dup((int)a);
        case SYS_dup2:
            return dup2((int)a, (int)b);
        case SYS_dup3:
            return dup3((int)a, (int)b, (int)c);
        case SYS_exit_group: {
            cp_fd_exit_fn x = atomic_load(&g_exit_hook);
            if (x) x();
            break;
        }
        default:
            break;
        }
    }
    return REAL(syscall)(n, a, b, c, d, e, f);
}

/* ------------------------------------------------------------------------------------
 * fds created on the agent's threads go above the floor */

CONTPROF_EXTERN int socket(int dom, int type, int proto)
{
    return ADOPT(REAL(socket)(dom, type, proto));
}

static int adopt_pair(int rc, int fds[2])
{
    if (rc == 0 && cp_agent_thread) {
        int a = cp_fd_adopt(fds[0], CP_FD_AGENT), b = cp_fd_adopt(fds[1], CP_FD_AGENT);
        if (a < 0 || b < 0) {
            if (a >= 0) cp_fd_close(a);
            if (b >= 0) cp_fd_close(b);
            return errno = EMFILE, -1;
        }
        fds[0] = a;
        fds[1] = b;
    }
    return rc;
}

CONTPROF_EXTERN int socketpair(int dom, int type, int proto, int fds[2])
{
    return ADOPT_PAIR(REAL(socketpair)(dom, type, proto, fds), fds);
}

CONTPROF_EXTERN int pipe(int fds[2])
{
    return ADOPT_PAIR(REAL(pipe)(fds), fds);
}

CONTPROF_EXTERN int pipe2(int fds[2], int flags)
{
    return ADOPT_PAIR(REAL(pipe2)(fds, flags), fds);
}

static mode_t open_mode(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

CONTPROF_EXTERN int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = open_mode(flags, ap);
    va_end(ap);
    return ADOPT(REAL(open)(path, flags, m));
}

CONTPROF_EXTERN int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = open_mode(flags, ap);
    va_end(ap);
    return ADOPT(REAL(open64)(path, flags, m));
}

CONTPROF_EXTERN int openat(int dir, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = open_mode(flags, ap);
    va_end(ap);
    return ADOPT(REAL(openat)(dir, path, flags, m));
}

CONTPROF_EXTERN int openat64(int dir, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = open_mode(flags, ap);
    va_end(ap);
    return ADOPT(REAL(openat64)(dir, path, flags, m));
}

/* fopen and opendir make their fd inside libc, past the hooks above: libdw reads
 * /proc/PID/maps with fopen and walks directories with opendir. On an agent thread the fd
 * is made with the hooked open (moved above the floor, in the gate) and wrapped; on a host
 * thread the call goes through the gate as open does. */
static int fopen_flags(const char *m)
{
    int fl;
    switch (m[0]) {
    case 'r':
        fl = O_RDONLY;
        break;
    case 'w':
        fl = O_WRONLY | O_CREAT | O_TRUNC;
        break;
    case 'a':
        fl = O_WRONLY | O_CREAT | O_APPEND;
        break;
    default:
        return -1;
    }
    for (const char *c = m + 1; *c && *c != ','; c++) {
        if (*c == '+') fl = (fl & ~O_ACCMODE) | O_RDWR;
        if (*c == 'x') fl |= O_EXCL;
        if (*c == 'e') fl |= O_CLOEXEC;
    }
    return fl;
}

static FILE *agent_fopen(const char *path, const char *mode)
{
    int fl = fopen_flags(mode);
    if (fl < 0) return errno = EINVAL, NULL;
    int fd = ADOPT(REAL(open)(path, fl, 0666));
    if (fd < 0) return NULL;
    FILE *f = REAL(fdopen)(fd, mode);
    if (!f) {
        int e = errno;
        cp_fd_close(fd);
        errno = e;
    }
    return f;
}

CONTPROF_EXTERN FILE *fopen(const char *path, const char *mode)
{
    if (cp_agent_thread) return agent_fopen(path, mode);
    REAL(fopen);
    host_enter();
    FILE *f = real_fopen(path, mode);
    host_leave();
    return f;
}

CONTPROF_EXTERN FILE *fopen64(const char *path, const char *mode)
{
    if (cp_agent_thread) return agent_fopen(path, mode);
    REAL(fopen64);
    host_enter();
    FILE *f = real_fopen64(path, mode);
    host_leave();
    return f;
}

/* An agent thread's fclose/closedir closes inside libc: the number is unmarked after, and a
 * revoked one (the host's now) is left open. */
CONTPROF_EXTERN int fclose(FILE *f)
{
    if (!cp_agent_thread || !f) return REAL(fclose)(f);
    int fd = fileno(f);
    unsigned char s = fd_state(fd);
    if (s == CP_FD_REVOKED) f->_fileno = -1; /* glibc's FILE: closing -1 closes nothing */
    int rc = REAL(fclose)(f);
    if (s != CP_FD_HOST) atomic_store(&cp_fd_state[fd], CP_FD_HOST);
    return s == CP_FD_REVOKED ? 0 : rc;
}

CONTPROF_EXTERN DIR *opendir(const char *path)
{
    if (!cp_agent_thread) {
        REAL(opendir);
        host_enter();
        DIR *d = real_opendir(path);
        host_leave();
        return d;
    }
    int fd = ADOPT(REAL(open)(path, O_RDONLY | O_NONBLOCK | O_DIRECTORY | O_CLOEXEC, 0));
    if (fd < 0) return NULL;
    DIR *d = REAL(fdopendir)(fd);
    if (!d) {
        int e = errno;
        cp_fd_close(fd);
        errno = e;
    }
    return d;
}

CONTPROF_EXTERN int closedir(DIR *d)
{
    if (!cp_agent_thread) return REAL(closedir)(d);
    int fd = dirfd(d);
    int rc = REAL(closedir)(d); /* a revoked directory fd: see README, not covered */
    if (fd >= 0 && fd_state(fd) != CP_FD_HOST) atomic_store(&cp_fd_state[fd], CP_FD_HOST);
    return rc;
}

/* dlopen (the agent loads libdw and librdkafka on its thread) opens the library inside libc,
 * where no hook can move the fd. On an agent thread the whole call holds the agent's side of
 * the gate: host calls that make, close or overwrite an fd wait for it (bounded, as every
 * wait of the gate). */
CONTPROF_EXTERN void *dlopen(const char *file, int mode)
{
    if (!cp_agent_thread) {
        /* the host's: the unwinder learns the new objects before the next sample needs
         * their CFI (unwind.c; a dlopen that loaded nothing costs one dl_iterate_phdr) */
        void *h = REAL(dlopen)(file, mode);
        if (h) {
            int e = errno;
            cp_modules_refresh_host();
            errno = e;
        }
        return h;
    }
    agent_enter();
    void *h = REAL(dlopen)(file, mode);
    agent_leave();
    return h;
}

/* The host's dlclose: the snapshot drops an unloaded object at once, not at the window's
 * end (a handler must not look up CFI in memory that is gone; README "Unwinding"). */
CONTPROF_EXTERN int dlclose(void *handle)
{
    static int (*real_dlclose)(void *);
    int rc = REAL(dlclose)(handle);
    if (rc == 0 && !cp_agent_thread) {
        int e = errno;
        cp_modules_refresh_host();
        errno = e;
    }
    return rc;
}

CONTPROF_EXTERN int accept(int fd, struct sockaddr *a, socklen_t *l)
{
    int r = REAL(accept)(fd, a, l);
    return cp_agent_thread ? cp_fd_adopt(r, CP_FD_AGENT) : r;
}

CONTPROF_EXTERN int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
    int r = REAL(accept4)(fd, a, l, flags);
    return cp_agent_thread ? cp_fd_adopt(r, CP_FD_AGENT) : r;
}

/* ------------------------------------------------------------------------------------
 * I/O on a revoked number: the agent's threads (librdkafka's among them) get EBADF, never
 * the host's file that now has that number. Host threads pay one thread-local test. */

/* The common path is a test of a thread-local flag and a tail call through the resolved
 * pointer (no frame); the agent's threads and the first call take the cold one. */
#define IO_HOOK(ret, name, params, args)                                                           \
    __attribute__((noinline, cold)) static ret name##_slow params                                  \
    {                                                                                              \
        if (cp_agent_thread && revoked(fd)) return errno = EBADF, -1;                              \
        return REAL(name) args;                                                                    \
    }                                                                                              \
    CONTPROF_EXTERN ret name params                                                                \
    {                                                                                              \
        __typeof__(real_##name) f = real_##name;                                                   \
        if (__builtin_expect(f != NULL && !cp_agent_thread, 1)) return f args;                     \
        return name##_slow args;                                                                   \
    }

IO_HOOK(ssize_t, read, (int fd, void *b, size_t n), (fd, b, n))
IO_HOOK(ssize_t, write, (int fd, const void *b, size_t n), (fd, b, n))
IO_HOOK(ssize_t, pread, (int fd, void *b, size_t n, off_t off), (fd, b, n, off))
IO_HOOK(ssize_t, send, (int fd, const void *b, size_t n, int fl), (fd, b, n, fl))
IO_HOOK(ssize_t, recv, (int fd, void *b, size_t n, int fl), (fd, b, n, fl))
IO_HOOK(ssize_t, sendmsg, (int fd, const struct msghdr *m, int fl), (fd, m, fl))
IO_HOOK(ssize_t, recvmsg, (int fd, struct msghdr *m, int fl), (fd, m, fl))
IO_HOOK(int, connect, (int fd, const struct sockaddr *a, socklen_t l), (fd, a, l))
IO_HOOK(int, shutdown, (int fd, int how), (fd, how))
IO_HOOK(int, getsockopt, (int fd, int lvl, int name, void *v, socklen_t *l), (fd, lvl, name, v, l))
IO_HOOK(int, setsockopt, (int fd, int lvl, int name, const void *v, socklen_t l),
        (fd, lvl, name, v, l))
IO_HOOK(int, getsockname, (int fd, struct sockaddr *a, socklen_t *l), (fd, a, l))

/* A revoked entry is left out of the kernel's poll and reported POLLNVAL. */
CONTPROF_EXTERN int poll(struct pollfd *fds, nfds_t n, int timeout)
{
    if (__builtin_expect(cp_agent_thread, 0) && n <= 64) {
        int any = 0;
        for (nfds_t i = 0; i < n; i++)
            any |= revoked(fds[i].fd);
        if (any) {
            struct pollfd c[64];
            for (nfds_t i = 0; i < n; i++) {
                c[i] = fds[i];
                if (revoked(c[i].fd)) c[i].fd = -1;
            }
            int rc = REAL(poll)(c, n, timeout);
            if (rc < 0) return rc;
            int k = 0;
            for (nfds_t i = 0; i < n; i++) {
                fds[i].revents = revoked(fds[i].fd) ? POLLNVAL : c[i].revents;
                k += fds[i].revents != 0;
            }
            return k;
        }
    }
    return REAL(poll)(fds, n, timeout);
}

void cp_fd_after_fork_child(void)
{
    atomic_store(&g_pid, (int)getpid());
    /* the other threads, and whatever they were making, stayed in the parent */
    atomic_store(&g_agent_making, 0);
    atomic_store(&g_host_making, 0);
}

int cp_fd_openat(int dir, const char *path, int flags, int mode)
{
    agent_enter();
    int fd = cp_fd_adopt(REAL(openat)(dir, path, flags, (mode_t)mode), CP_FD_AGENT);
    agent_leave();
    return fd;
}

int cp_fd_fcntl(int fd, int cmd, long arg)
{
    return REAL(fcntl)(fd, cmd, arg);
}
