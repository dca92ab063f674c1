/* Fault injection for test_fatal: preloaded next to libcontprof, it makes
 * pthread_mutex_timedlock never return on the main thread, so the agent's flush from a
 * fatal signal's handler hangs there and only the handler's watchdog can end the process. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*timedlock_fn)(pthread_mutex_t *, const struct timespec *);

__attribute__((visibility("default"))) int pthread_mutex_timedlock(pthread_mutex_t *m,
                                                                   const struct timespec *ts)
{
    if (syscall(SYS_gettid) == getpid())
        for (;;) {
            struct timespec t = {1, 0};
            nanosleep(&t, NULL);
        }
    timedlock_fn next = (timedlock_fn)(uintptr_t)dlsym(RTLD_NEXT, "pthread_mutex_timedlock");
    return next ? next(m, ts) : 0;
}
