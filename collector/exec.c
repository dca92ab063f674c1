/* exec: the exec family is interposed so that a sample signal still pending when the image
 * is replaced is not delivered to the new program with the default action (terminate).
 * Before exec the calling thread's event is disarmed and a pending signal discarded
 * (thread.c cp_cpu_before_exec); other threads vanish with the old image. If exec fails,
 * the event is re-armed. */
#include "exec.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>

#include "contprof.h"
#include "thread.h"

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

/* Called between fork and exec too: async-signal-safe (dlsym only if cp_exec_resolve was
 * not called at start). */
static cp_thread *before_exec(void)
{
    if (!rx.execve) cp_exec_resolve();
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
