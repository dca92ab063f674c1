/* Fatal signals (README.md "Signals"): while the host's disposition of a signal that would
 * end the process is the default, the kernel calls the agent's handler instead; it has the
 * current window written (the agent's bounded flush) and then dies of the same signal, as
 * the default action would have. The host's sigaction/signal calls on these signals come
 * here (thread.c's hooks) and see what they set. Layer 1: reads guard.h's marks. */
#ifndef CP_FATAL_H
#define CP_FATAL_H

#include <signal.h>

/* Writes the current window, bounded in time (agent.c's agent_flush, the one exec and _exit
 * use). Called from the handler on a host thread; it must tell a vfork child apart. */
typedef void (*cp_fatal_flush_fn)(void);

/* Registers the flush (agent.c, at start) and puts the handler in the kernel for every
 * fatal signal whose disposition is SIG_DFL there now; a signal the program ignores or
 * handles is left to it. Idempotent. Not async-signal-safe; may allocate (dlsym,
 * pthread_atfork). */
void cp_fatal_set_flush(cp_fatal_flush_fn fn);

/* Whether the hooks hand signal s to cp_fatal_sigaction: the fatal set (README.md
 * "Signals"), whether or not the agent ever started. Async-signal-safe. */
int cp_fatal_signal(int s);

/* sigaction() for a signal of the fatal set (thread.c's hook, and through it signal() and
 * its variants): the host's SIG_DFL keeps the agent's handler in the kernel and is returned
 * by later queries as the host set it; a handler or SIG_IGN goes to the kernel as is and the
 * signal is the host's until it sets SIG_DFL again. A handler the program put in the kernel
 * past the hooks (sigset, the raw system call) is noticed here and left to it. Returns 0, or
 * -1 with errno as sigaction. Async-signal-safe, as sigaction (a short spin lock that blocks
 * every signal while held). */
int cp_fatal_sigaction(int s, const struct sigaction *act, struct sigaction *old);

#endif
