/* exec and _exit: the exec family is interposed so that the current window is written before
 * the image is replaced (the agent's flush, registered by agent.c: bounded) and so that a
 * sample signal still pending then is not delivered to the new program with the default
 * action (terminate). Before exec the calling thread's event is disarmed and a pending
 * signal discarded (thread.c cp_cpu_before_exec); other threads vanish with the old image.
 * If exec fails, the event is re-armed. _exit, _Exit and quick_exit, which skip the
 * destructor that writes the last window, flush it first. The agent's handlers of fatal
 * signals (fatal.c) need nothing here: exec resets them to SIG_DFL, what the host believes. */
#include "exec.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "contprof.h"
#include "thread.h"

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
typedef void (*exit_fn)(int);

static struct {
    execve_fn execve;
    execvpe_fn execvpe;
    execv_fn execv, execvp;
    exit_fn exit_, quick_exit;
} rx;

static _Atomic(cp_exec_flush_fn) g_flush;

void cp_exec_set_flush(cp_exec_flush_fn fn)
{
    atomic_store(&g_flush, fn);
}

static void flush(void)
{
    cp_exec_flush_fn f = atomic_load(&g_flush);
    if (f) f();
}

/* Resolved at start: dlsym after fork in a threaded program is best avoided. */
void cp_exec_resolve(void)
{
    if (!rx.execve) rx.execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    if (!rx.execvpe) rx.execvpe = (execvpe_fn)dlsym(RTLD_NEXT, "execvpe");
    if (!rx.execv) rx.execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
    if (!rx.execvp) rx.execvp = (execv_fn)dlsym(RTLD_NEXT, "execvp");
    if (!rx.exit_) rx.exit_ = (exit_fn)dlsym(RTLD_NEXT, "_exit");
    if (!rx.quick_exit) rx.quick_exit = (exit_fn)dlsym(RTLD_NEXT, "quick_exit");
}

/* Called between fork and exec too: async-signal-safe (dlsym only if cp_exec_resolve was
 * not called at start). */
static cp_thread *before_exec(void)
{
    if (!rx.execve) cp_exec_resolve();
    flush();
    return cp_cpu_before_exec();
}

CONTPROF_EXTERN int execve(const char *path, char *const argv[], char *const envp[])
{
    cp_thread *t = before_exec();
    if (!rx.execve) return errno = ENOSYS, -1;
    int rc = rx.execve(path, argv, envp);
    cp_cpu_after_failed_exec(t);
    return rc;
}

CONTPROF_EXTERN int execvpe(const char *file, char *const argv[], char *const envp[])
{
    cp_thread *t = before_exec();
    if (!rx.execvpe) return errno = ENOSYS, -1;
    int rc = rx.execvpe(file, argv, envp);
    cp_cpu_after_failed_exec(t);
    return rc;
}

CONTPROF_EXTERN int execv(const char *path, char *const argv[])
{
    cp_thread *t = before_exec();
    if (!rx.execv) return errno = ENOSYS, -1;
    int rc = rx.execv(path, argv);
    cp_cpu_after_failed_exec(t);
    return rc;
}

CONTPROF_EXTERN int execvp(const char *file, char *const argv[])
{
    cp_thread *t = before_exec();
    if (!rx.execvp) return errno = ENOSYS, -1;
    int rc = rx.execvp(file, argv);
    cp_cpu_after_failed_exec(t);
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

/* _exit and _Exit end the process without destructors: the window is flushed first. glibc's
 * exit() ends in its own _exit, past this hook, after the destructor has written the last
 * window. */
CONTPROF_EXTERN void _exit(int status)
{
    flush();
    if (!rx.exit_) rx.exit_ = (exit_fn)dlsym(RTLD_NEXT, "_exit");
    if (rx.exit_) rx.exit_(status);
    for (;;)
        syscall(SYS_exit_group, status);
}

CONTPROF_EXTERN void _Exit(int status)
{
    _exit(status);
}

/* quick_exit runs the at_quick_exit handlers, then ends in glibc's own _exit. */
CONTPROF_EXTERN void quick_exit(int status)
{
    flush();
    if (!rx.quick_exit) rx.quick_exit = (exit_fn)dlsym(RTLD_NEXT, "quick_exit");
    if (rx.quick_exit) rx.quick_exit(status);
    _exit(status);
}
