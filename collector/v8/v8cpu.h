/* The CPU a V8 host's thread used, read from the local /proc: which process listens on an
 * inspector's port, and a thread's (schedstat) or a process's (stat) CPU time. The V8
 * source weighs each cpu window by it (README "CPU seconds"). */
#ifndef CP_V8CPU_H
#define CP_V8CPU_H

#include <stddef.h>
#include <stdint.h>

/* The pid of the process of this machine (and pid namespace) with a listening TCP socket
 * on port, found through /proc/net/tcp{,6} and /proc/PID/fd; 0 when none can be seen
 * (another user's process, another namespace, a remote host). */
int cp_v8_listener_pid(unsigned port);

/* The CPU time of thread tid of pid (tid > 0, /proc/PID/task/TID/schedstat) or of the
 * whole process (tid 0, utime + stime of /proc/PID/stat, clock-tick resolution), in ns.
 * Returns 0 with *ns, or CP_EIO (gone, unreadable) or CP_EPARSE. */
int cp_v8_cpu_ns(int pid, int tid, int64_t *ns);

/* The threads of pid named as V8's CPU profiler names its sampler ("v8:ProfEvntProc": one
 * per running profiler, a new one at each Profiler.start), at most cap of them into tids.
 * Returns how many (0 when none or pid cannot be read). */
size_t cp_v8_sampler_threads(int pid, int *tids, size_t cap);

#endif
