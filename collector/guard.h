/* Who is running: the thread-local marks that tell the agent's own code and threads from
 * the host's. Every interposed function reads them first (allocations not sampled, fds
 * moved out of the host's way, failed allocations served from the reserve), so they are
 * initial-exec TLS: no __tls_get_addr, no malloc, safe in a signal handler. A leaf. */
#ifndef CP_GUARD_H
#define CP_GUARD_H

#include <sys/types.h>

#define CP_TLS __attribute__((tls_model("initial-exec"))) __thread

/* A large zero-initialised global (4 KiB and more): placed in .lbss, which the linker puts
 * after .bss, so the small globals lie together in a few pages instead of between the
 * arrays. Why: a short process touches a few bytes of each module's globals, and each page
 * touched is a page fault (~2.5 us on the 2-vCPU guest): the small ones now fill 19 KiB, 5
 * pages, where they were spread over ~23. */
#if defined(__GNUC__) && !defined(__clang__)
#define CP_BIG __attribute__((section(".lbss")))
#else
#define CP_BIG /* clang would make a named section PROGBITS: zeros in the file */
#endif

/* Set while the agent's own code runs on a thread (any thread): its allocations are not
 * sampled, a thread it creates is the agent's. Saved and restored around each such stretch
 * by whoever sets it. */
extern CP_TLS int cp_in_agent;

/* Set for the whole life of the agent's threads (its own and librdkafka's, through
 * cp_guard_agent_thread_begin): their failed allocations are served from the reserve
 * (nextmalloc.h), their fds go above the floor (fd.c), they are never sampled. */
extern CP_TLS int cp_agent_thread;

/* The agent thread's tid (never registered, never sampled); 0 when there is none (before
 * start, in a fork child until its new agent thread runs). Written only through the two
 * functions below. */
extern pid_t cp_agent_tid;

/* Marks the calling thread as one of the agent's for the rest of its life (first thing on
 * the thread). main: it is the agent thread itself (cp_agent_tid). Async-signal-safe. */
void cp_guard_agent_thread_begin(int main);

/* In a fork child: the parent's agent thread does not exist here (cp_agent_tid = 0). */
void cp_guard_after_fork_child(void);

/* "Agent thread only", asserted where a header says it (Debug and sanitizer builds,
 * model/check.h): while an agent thread exists only it may call; with none (a fork child
 * before its agent starts, unit tests) any thread may. A failure names func and where. */
#ifdef CONTPROF_ASSERTS
void cp_guard_check_agent_thread(const char *file, int line, const char *func);
#define CP_ASSERT_AGENT_THREAD() cp_guard_check_agent_thread(__FILE__, __LINE__, __func__)
#else
#define CP_ASSERT_AGENT_THREAD() ((void)0)
#endif

#endif
