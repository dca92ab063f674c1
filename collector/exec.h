/* The exec family's hooks (exec.c): they disarm the calling thread's CPU event and discard
 * a pending sample signal before the image is replaced. */
#ifndef CP_EXEC_H
#define CP_EXEC_H

/* Finds the next execve/execvpe/execv/execvp with dlsym. Called at start, from
 * contprof_start: dlsym between fork and exec in a threaded program is best avoided.
 * Idempotent. */
void cp_exec_resolve(void);

#endif
