/* The exec family's hooks (exec.c): they have the current window written and disarm the
 * calling thread's CPU event and discard a pending sample signal before the image is
 * replaced; _exit, _Exit and quick_exit have the window written too. */
#ifndef CP_EXEC_H
#define CP_EXEC_H

/* Finds the next execve/execvpe/execv/execvp with dlsym. Called at start, from
 * contprof_start: dlsym between fork and exec in a threaded program is best avoided.
 * Idempotent. */
void cp_exec_resolve(void);

/* Writes the current window before the image ends, bounded in time (agent.c). Called on the
 * host's thread that execs or exits, possibly from a signal handler or a vfork child: it must
 * tell those apart and never wait unbounded. */
typedef void (*cp_exec_flush_fn)(void);
/* Registers it (agent.c, at start); until then the hooks flush nothing. */
void cp_exec_set_flush(cp_exec_flush_fn fn);

#endif
