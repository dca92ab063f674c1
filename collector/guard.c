/* The marks that tell the agent's code and threads from the host's (guard.h). */
#include "guard.h"

#include <stdio.h>

#include "check.h"

#include <sys/syscall.h>
#include <unistd.h>

CP_TLS int cp_in_agent;
CP_TLS int cp_agent_thread;
pid_t cp_agent_tid;

void cp_guard_agent_thread_begin(int main)
{
    cp_in_agent = cp_agent_thread = 1;
    if (main) cp_agent_tid = (pid_t)syscall(SYS_gettid);
}

void cp_guard_after_fork_child(void)
{
    cp_agent_tid = 0;
}

#ifdef CONTPROF_ASSERTS
void cp_guard_check_agent_thread(const char *file, int line, const char *func)
{
    pid_t self = (pid_t)syscall(SYS_gettid), agent = cp_agent_tid;
    if (!agent || agent == self) return;
    char what[96];
    snprintf(what, sizeof(what), "agent thread only: called on thread %d, the agent's is %d",
             (int)self, (int)agent);
    cp_assert_fail(file, line, func, what);
}
#endif
