/* The failure half of model/check.h's debug-build checks. */
#include "check.h"

#ifdef CONTPROF_ASSERTS
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

_Noreturn void cp_assert_fail(const char *file, int line, const char *func, const char *what)
{
    fprintf(stderr, "assertion failed: %s:%d %s: %s\n", file, line, func, what);
    fflush(stderr);
    abort();
}

void cp_thread_owner_check(cp_thread_owner *o, const char *rule, const char *file, int line,
                           const char *func)
{
    uintptr_t self = (uintptr_t)pthread_self(), owner = 0;
    if (atomic_compare_exchange_strong(&o->thread, &owner, self) || owner == self) return;
    char what[200];
    snprintf(what, sizeof what, "%s: called on thread %#lx, owned by thread %#lx", rule,
             (unsigned long)self, (unsigned long)owner);
    cp_assert_fail(file, line, func, what);
}

void cp_thread_owner_release(cp_thread_owner *o)
{
    atomic_store(&o->thread, 0);
}
#else
typedef int cp_check_unused; /* an empty translation unit is not ISO C */
#endif
