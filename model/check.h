/* Debug-build checks of the invariants a function assumes where it assumes them (SQLite's
 * assert(sqlite3_mutex_held(...)), Lua's api_check): preconditions, and "this thread only"
 * rules. On when CONTPROF_ASSERTS is defined (CMake: Debug and sanitizer builds); compiled
 * out otherwise, the condition then not evaluated. A failed check prints what failed and
 * where on stderr and aborts: it is a bug in the caller, never bad input. */
#ifndef CP_CHECK_H
#define CP_CHECK_H

#include <stdatomic.h>
#include <stdint.h>

/* The one thread allowed to run some code ("writer thread only", "loop thread only"). Zero
 * it to start: the first thread that checks it becomes its owner; cp_thread_owner_release
 * hands it on (the owner stops, another thread may take over). The same size in every
 * build; read and written only when asserts are on. */
typedef struct cp_thread_owner {
    _Atomic uintptr_t thread; /* pthread_self() of the owner; 0 = none yet */
} cp_thread_owner;

#ifdef CONTPROF_ASSERTS
#define CP_ASSERTS_ON 1
/* Prints "assertion failed: FILE:LINE FUNC: WHAT" and aborts. */
_Noreturn void cp_assert_fail(const char *file, int line, const char *func, const char *what);
/* Claims o for this thread if it has no owner, else aborts (naming rule and both threads)
 * unless this thread owns it. */
void cp_thread_owner_check(cp_thread_owner *o, const char *rule, const char *file, int line,
                           const char *func);
void cp_thread_owner_release(cp_thread_owner *o);

#define CP_ASSERT(cond) ((cond) ? (void)0 : cp_assert_fail(__FILE__, __LINE__, __func__, #cond))
/* CP_ASSERT_THREAD(&s->writer, "writer thread only"): the calling thread owns it. */
#define CP_ASSERT_THREAD(owner, rule)                                                              \
    cp_thread_owner_check((owner), (rule), __FILE__, __LINE__, __func__)
#define CP_THREAD_RELEASE(owner) cp_thread_owner_release(owner)
#else
#define CP_ASSERTS_ON 0
/* sizeof: the operands stay "used" (no unused-variable warnings) and are not evaluated */
#define CP_ASSERT(cond) ((void)sizeof(!(cond)))
#define CP_ASSERT_THREAD(owner, rule) ((void)sizeof(owner), (void)sizeof(rule))
#define CP_THREAD_RELEASE(owner) ((void)sizeof(owner))
#endif

#endif
