/* The agent's file descriptors: they live above a floor near the fd limit and are marked
 * here; the host's close/close_range/closefrom/dup/dup2/dup3/fcntl skip or vacate them
 * (README.md "File descriptors"). A leaf: it reads only guard.h's marks. */
#ifndef CP_FD_H
#define CP_FD_H

#include <stdatomic.h>

#define CP_FD_MAX 65536
enum { CP_FD_HOST = 0, CP_FD_AGENT = 1, CP_FD_PERF = 2, CP_FD_REVOKED = 3 };
/* Per fd number: CP_FD_AGENT/CP_FD_PERF while the agent owns it, CP_FD_REVOKED once the
 * host took the number over (dup2) while the agent's code may still hold it. Read with
 * relaxed atomic loads, also in the signal handler. */
extern _Atomic unsigned char cp_fd_state[CP_FD_MAX];
/* Bumped whenever the host takes over an agent fd that could not be moved: the agent
 * thread then rebuilds its Kafka client (whose fds it cannot renumber). */
extern atomic_uint cp_fd_revocations;
/* Moves fd above the floor (close-on-exec) and marks it as kind (CP_FD_AGENT or
 * CP_FD_PERF). Returns the new number, fd itself if there is no room above the floor, or
 * -1 (fd closed, errno EMFILE) if it cannot be marked. fd < 0 is returned as is.
 * Async-signal-safe (system calls and atomics only). */
int cp_fd_adopt(int fd, int kind);
/* Grows the fd table to cover the agent's range above the floor, so that no later move
 * above it grows the table in a multi-threaded process (which waits for an RCU grace period,
 * milliseconds). For the one thread of a process that has no other (the constructor): with
 * more, it would make that thread wait as long. Leaves no fd open. */
void cp_fd_reserve(void);
/* Closes an fd of the agent's from any thread (the interposed close() refuses host threads)
 * and unmarks it; a revoked number is only unmarked. Returns close()'s result.
 * Async-signal-safe. */
int cp_fd_close(int fd);
/* The agent's side of the gate (fd.c) around an fd the agent makes on a host's thread
 * (a perf event, made by the thread it samples) until cp_fd_adopt has moved it: the host's
 * calls that make, close or overwrite an fd wait meanwhile (bounded). Async-signal-safe. */
void cp_fd_gate_enter(void);
void cp_fd_gate_leave(void);
/* In a fork child (not a vfork child, which shares the parent's memory). */
void cp_fd_after_fork_child(void);
/* openat(dir, path, flags, mode) made as an agent fd from any thread (a host thread's too:
 * contprof_start's output directory): through the agent's side of the gate, moved above
 * the floor and marked, as cp_fd_adopt says. Returns the fd or -1 with errno.
 * Async-signal-safe. */
int cp_fd_openat(int dir, const char *path, int flags, int mode);
/* fcntl without the interposer's checks. Async-signal-safe. */
int cp_fd_fcntl(int fd, int cmd, long arg);

/* Who holds the perf fds (thread.c): told that perf fd `from` moved to `to` (the host
 * dup2()s onto `from`), it updates the thread that holds it and returns 0, or -1 if no
 * thread holds it (fd.c then closes `to`). Called on the host's thread inside its dup2,
 * with no lock held: must not allocate or block. */
typedef int (*cp_fd_perf_moved_fn)(int from, int to);
/* Registers the one perf fd holder; before the first perf fd is adopted. */
void cp_fd_set_perf_holder(cp_fd_perf_moved_fn fn);

/* Called by syscall(SYS_exit_group, ...) on a host thread before the process ends (the
 * agent's bounded flush of its window, registered by agent.c). */
typedef void (*cp_fd_exit_fn)(void);
void cp_fd_set_exit_hook(cp_fd_exit_fn fn);

#endif
