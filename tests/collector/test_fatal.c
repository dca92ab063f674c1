/* Black-box tests of fatal signals under the agent: a process ended by a signal whose action
 * is the default (SIGTERM from a supervisor, Ctrl-C's SIGINT re-raised by Python, abort(), a
 * crash) keeps its last window, and dies exactly as it does without the agent (the same
 * wait status); a host that handles, ignores or blocks the signal, or asks what it set, sees
 * no difference; a flush that hangs (hang.c's `cphang`) or an agent that was stopped never
 * keeps a process from dying. Real programs (python3, fatal.c's `cpf`) under LD_PRELOAD in
 * output-dir mode with the default 10 s window, profiles decoded with cp_pprof_decode
 * (pfiles.h). */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pprof.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

#define PYTHON "/usr/bin/python3"
/* burns a second of CPU, says ready, then burns until killed */
#define PY_BUSY                                                                                    \
    "import time\n"                                                                                \
    "t = time.process_time()\n"                                                                    \
    "while time.process_time() - t < 1.0: pass\n"                                                  \
    "print('ready', flush=True)\n"                                                                 \
    "while True: pass\n"

static char g_dir[256], g_env_dir[300];
static char g_out[1 << 16];
static const char *g_extra_env; /* one more variable for the program, if set */
static const char *g_extra_lib; /* preloaded after the agent, if set */
static double g_kill_to_death;  /* seconds from run()'s signal to the child's reaping */
static int g_twice;             /* run() sends its signal 4 times more, at once and 0.5 ms apart */

enum { AGENT = 1, IGNORE_TERM = 2 };

/* Runs prog args (with the agent if flags has AGENT) with SIGTERM, SIGINT, SIGHUP and
 * SIGQUIT at their default (SIGTERM ignored with IGNORE_TERM), nothing blocked, no core
 * file; sends sig once it printed "ready" (0: none). Its output is in g_out. Returns the wait
 * status; fails the test if it runs past 30 s. */
static int run(const char *prog, const char *const *args, int flags, int sig)
{
    int rd;
    pid_t pid = fork_stdout_pipe(&rd);
    if (pid == 0) {
        int dfl[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
        for (int i = 0; i < 4; i++)
            signal(dfl[i], SIG_DFL);
        if (flags & IGNORE_TERM) signal(SIGTERM, SIG_IGN);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct rlimit core = {0, 0};
        setrlimit(RLIMIT_CORE, &core);
        unsetenv("LD_PRELOAD");
        static char preload[600];
        const char *lib = getenv("CP_TEST_LIB");
        snprintf(preload, sizeof(preload), "LD_PRELOAD=%s%s%s", lib ? lib : CP_LIB,
                 g_extra_lib ? ":" : "", g_extra_lib ? g_extra_lib : "");
        if (flags & AGENT) putenv(preload);
        putenv(g_env_dir);
        if (g_extra_env) putenv((char *)g_extra_env);
        char *argv[16];
        int n = 0;
        argv[n++] = (char *)prog;
        for (int i = 0; args[i] && n < 15; i++)
            argv[n++] = (char *)args[i];
        argv[n] = NULL;
        execv(prog, argv);
        _exit(127);
    }
    size_t len = 0;
    int sent = 0;
    int64_t end = mono_ns() + 30 * SEC;
    for (;;) {
        struct pollfd p = {.fd = rd, .events = POLLIN};
        int left = (int)((end - mono_ns()) / 1000000);
        if (left <= 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fprintf(stderr, "%s %s: still running after 30 s: %s\n", prog, args[0], g_out);
            CHECK(0);
        }
        if (poll(&p, 1, left) <= 0) continue;
        ssize_t k = read(rd, g_out + len, sizeof(g_out) - 1 - len);
        if (k <= 0) break;
        len += (size_t)k;
        g_out[len] = 0;
        if (sig && !sent && strstr(g_out, "ready\n")) {
            kill(pid, sig);
            for (int i = 0; g_twice && i < 4; i++) {
                kill(pid, sig);
                nanosleep(&(struct timespec){0, 500000}, NULL);
            }
            sent = 1;
            g_kill_to_death = (double)mono_ns();
        }
    }
    close(rd);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    g_kill_to_death = sent ? ((double)mono_ns() - g_kill_to_death) / 1e9 : 0;
    return st;
}

static void make_dir(void)
{
    pset_dir_make("fatal", g_dir, g_env_dir);
}

/* Seconds of CPU in the cpu profiles of isolate iso (all but the agent's if NULL) over
 * stacks with fn (any if NULL), and how many such profiles there are. */
static double profiled(const char *iso, const char *fn, int *nprof)
{
    pset s;
    pset_load(g_dir, &s);
    int n = 0;
    double sum = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].kind, "cpu") || !strcmp(s.f[i].iso, "contprof-agent")) continue;
        if (iso && strcmp(s.f[i].iso, iso)) continue;
        n++;
        sum += (double)func_total(s.f[i].p, fn, 1) / 1e9;
    }
    pset_free(&s);
    if (nprof) *nprof = n;
    return sum;
}

static void describe(const char *what, int st)
{
    if (WIFSIGNALED(st))
        printf("%s: killed by signal %d%s\n", what, WTERMSIG(st), WCOREDUMP(st) ? " (core)" : "");
    else
        printf("%s: exit %d\n", what, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* prog args ends by sig (sent after "ready"; 0: by itself) the same way with the agent as
 * without, by signal want; with the agent, its window holds at least min_cpu seconds of
 * CPU in fn (any stack if NULL) of isolate iso. */
static void check_dies(const char *prog, const char *const *args, int sig, int want,
                       const char *iso, const char *fn, double min_cpu)
{
    make_dir();
    int plain = run(prog, args, 0, sig);
    describe("without the agent", plain);
    if (sig) printf("signal to death: %.3f s\n", g_kill_to_death);
    CHECK(WIFSIGNALED(plain) && WTERMSIG(plain) == want);
    int64_t t0 = mono_ns();
    int st = run(prog, args, AGENT, sig);
    double secs = (double)(mono_ns() - t0) / 1e9;
    describe("with the agent", st);
    if (sig) printf("signal to death: %.3f s\n", g_kill_to_death);
    int n;
    double cpu = profiled(iso, fn, &n);
    printf("%d cpu profiles, %.3f s of CPU profiled, %.2f s wall\n", n, cpu, secs);
    CHECK_EQ(st, plain);
    CHECK(n >= 1);
    CHECK(cpu >= min_cpu);
    pset_dir_remove(g_dir);
}

/* `timeout -s TERM` on a Python busy loop: python3 does not handle SIGTERM. */
TEST(python_sigterm_keeps_window)
{
    const char *args[] = {"-c", PY_BUSY, NULL};
    check_dies(PYTHON, args, SIGTERM, SIGTERM, "python3", NULL, 0.5);
}

/* Ctrl-C: Python's own handler raises KeyboardInterrupt; at exit Python sets SIGINT back to
 * SIG_DFL and kills itself with it (so that its parent sees a death by SIGINT). */
/* The same signal again within 2 ms, as timeout(1) sends it (to the process, then to its
 * group) and supervisors do: the copy arrives while the window is written and must not cut
 * it short. The program started through `bash -c 'exec ...'`, where this was first seen. */
TEST(sigterm_twice_keeps_window)
{
    g_twice = 1;
    const char *args[] = {"spin", "1.0", NULL};
    check_dies(CPF, args, SIGTERM, SIGTERM, NULL, "burn_fatal", 0.6);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "exec %s spin 1.0", CPF);
    const char *sh[] = {"-c", cmd, NULL};
    check_dies("/bin/bash", sh, SIGTERM, SIGTERM, NULL, "burn_fatal", 0.6);
    const char *py[] = {"-c", PY_BUSY, NULL};
    check_dies(PYTHON, py, SIGTERM, SIGTERM, "python3", NULL, 0.5);
    g_twice = 0;
}

TEST(python_sigint_keeps_window)
{
    const char *args[] = {"-c", PY_BUSY, NULL};
    check_dies(PYTHON, args, SIGINT, SIGINT, "python3", NULL, 0.5);
}

TEST(abort_keeps_window)
{
    const char *args[] = {"abort", "1.0", NULL};
    check_dies(CPF, args, 0, SIGABRT, NULL, "burn_fatal", 0.6);
}

TEST(null_dereference_keeps_window)
{
    const char *args[] = {"segv", "1.0", NULL};
    check_dies(CPF, args, 0, SIGSEGV, NULL, "burn_fatal", 0.6);
}

/* The crash on another thread than main: the whole process dies of it. */
TEST(crash_on_thread_keeps_window)
{
    const char *args[] = {"segvthr", "1.0", NULL};
    check_dies(CPF, args, 0, SIGSEGV, NULL, "burn_fatal", 0.6);
}

/* A stack overflow on a thread with a sigaltstack: the handler runs there (SA_ONSTACK). */
TEST(stack_overflow_on_altstack_keeps_window)
{
    const char *args[] = {"overflow", "1.0", NULL};
    check_dies(CPF, args, 0, SIGSEGV, NULL, "burn_fatal", 0.6);
}

/* SIGTERM to a C program that has no handler, and SIGQUIT (a core-dumping signal). */
TEST(kill_keeps_window)
{
    const char *args[] = {"spin", "1.0", NULL};
    check_dies(CPF, args, SIGTERM, SIGTERM, NULL, "burn_fatal", 0.6);
    check_dies(CPF, args, SIGQUIT, SIGQUIT, NULL, "burn_fatal", 0.6);
    check_dies(CPF, args, SIGHUP, SIGHUP, NULL, "burn_fatal", 0.6);
}

/* A write to a pipe nobody reads. */
TEST(sigpipe_keeps_window)
{
    const char *args[] = {"pipe", "1.0", NULL};
    check_dies(CPF, args, 0, SIGPIPE, NULL, "burn_fatal", 0.6);
}

/* SIGTERM to threads that allocate without pause, every allocation sampled: often inside
 * the agent's hooks (no flush) or holding the sampler's lock the agent thread needs to
 * build the window (a bounded flush): the process dies of SIGTERM each time, well within
 * the bounds. */
TEST(sigterm_in_malloc_never_hangs)
{
    make_dir();
    g_extra_env = "CONTPROF_ALLOC_RATE=1";
    const char *args[] = {"churn", "0.3", NULL};
    for (int i = 0; i < 5; i++) {
        int64_t t0 = mono_ns();
        int st = run(CPF, args, AGENT, SIGTERM);
        double secs = (double)(mono_ns() - t0) / 1e9;
        describe("churn", st);
        printf("run %d: %.2f s, signal to death %.3f s\n", i, secs, g_kill_to_death);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
        CHECK(g_kill_to_death < 3);
    }
    g_extra_env = NULL;
    pset_dir_remove(g_dir);
}

/* The flush never returns (cphang: the agent's lock wait hangs on the main thread): the
 * handler's watchdog delivers SIGTERM past the flush's bound (200 ms + 300 ms), and the
 * process dies of it. */
TEST(hung_flush_ends_by_watchdog)
{
    make_dir();
    g_extra_lib = CP_HANG;
    const char *args[] = {"spin", "0.3", NULL};
    int st = run(CPF, args, AGENT, SIGTERM);
    g_extra_lib = NULL;
    describe("hung flush", st);
    printf("signal to death: %.3f s\n", g_kill_to_death);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    CHECK(g_kill_to_death >= 0.45);
    CHECK(g_kill_to_death < 5);
    pset_dir_remove(g_dir);
}

/* After contprof_stop the handler calls nothing of the agent's: the process dies of SIGTERM
 * at once, with no window after the one stop wrote. */
TEST(stopped_agent_just_dies)
{
    make_dir();
    const char *args[] = {"stopped", "0.5", NULL};
    int st = run(CPF, args, AGENT, SIGTERM);
    describe("stopped", st);
    printf("signal to death: %.3f s\n", g_kill_to_death);
    CHECK_CONTAINS(g_out, "stopped=1\n");
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    CHECK(g_kill_to_death < 3);
    int n;
    profiled(NULL, NULL, &n);
    CHECK_EQ(n, 1);
    pset_dir_remove(g_dir);
}

/* A vfork child that crashes dies of SIGSEGV as without the agent, without asking the
 * parent's agent thread for a flush: the parent's CPU time is in one window, written at its
 * exit. */
TEST(vfork_child_crash)
{
    make_dir();
    const char *args[] = {"vforkcrash", "0.3", NULL};
    int st = run(CPF, args, 0, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(g_out, "child: signal 11\n");
    st = run(CPF, args, AGENT, 0);
    printf("%s", g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(g_out, "child: signal 11\n");
    int n;
    double cpu = profiled(NULL, "burn_fatal", &n);
    printf("%d cpu profiles, %.3f s in burn_fatal\n", n, cpu);
    CHECK_EQ(n, 1);
    CHECK(cpu >= 0.35);
    pset_dir_remove(g_dir);
}

/* The host's own SIGTERM handler runs and the program returns from main: exit 0, its
 * window written at exit as always. */
TEST(host_handler_keeps_behavior)
{
    make_dir();
    const char *args[] = {"handler", "0.5", NULL};
    int st = run(CPF, args, AGENT, SIGTERM);
    describe("handler", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(g_out, "handled\n");
    int n;
    CHECK(profiled(NULL, "burn_fatal", &n) >= 0.3);
    pset_dir_remove(g_dir);
}

/* What sigaction() and signal() return as the program sets and resets SIGTERM, SIGINT and
 * SIGSEGV (the agent's handler in the kernel for each at first): the same transcript as
 * without the agent. */
TEST(host_sees_what_it_set)
{
    make_dir();
    const char *args[] = {"query", "0", NULL};
    static char plain[sizeof(g_out)];
    int st = run(CPF, args, 0, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    memcpy(plain, g_out, sizeof(plain));
    st = run(CPF, args, AGENT, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("%s", g_out);
    CHECK_CONTAINS(g_out, "start: sigaction(15) rc=0 handler=SIG_DFL siginfo=0\n");
    CHECK_CONTAINS(g_out, "raise with handler: flag=1\n");
    CHECK_STREQ(g_out, plain);
    pset_dir_remove(g_dir);
}

/* SIGTERM ignored by the program, or ignored when it was started (nohup, a shell's
 * background job), or blocked: it neither dies nor sees the agent's handler. */
TEST(ignored_or_blocked_sigterm_stays_so)
{
    make_dir();
    const char *ign[] = {"ignore", "0.5", NULL};
    int st = run(CPF, ign, AGENT, SIGTERM);
    describe("SIG_IGN set", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    const char *inh[] = {"inherit", "0.5", NULL};
    st = run(CPF, inh, AGENT | IGNORE_TERM, SIGTERM);
    describe("SIG_IGN inherited", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    const char *blk[] = {"blocked", "0.5", NULL};
    st = run(CPF, blk, AGENT, SIGTERM);
    describe("blocked", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(g_out, "pending=1\n");
    pset_dir_remove(g_dir);
}

/* An exec'd program (without the agent: CONTPROF_CHILDREN=0) finds the dispositions the
 * host left: no handler caught, SIG_IGN kept (/proc/self/status's SigCgt and SigIgn). */
TEST(exec_sees_host_dispositions)
{
    make_dir();
    const char *args[] = {"-c", "trap '' HUP; exec /bin/grep -E '^Sig(Cgt|Ign)' /proc/self/status",
                          NULL};
    static char plain[sizeof(g_out)];
    int st = run("/bin/sh", args, 0, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    memcpy(plain, g_out, sizeof(plain));
    putenv("CONTPROF_CHILDREN=0");
    st = run("/bin/sh", args, AGENT, 0);
    unsetenv("CONTPROF_CHILDREN");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("%s", g_out);
    CHECK_STREQ(g_out, plain);
    pset_dir_remove(g_dir);
}

TEST_MAIN(T(python_sigterm_keeps_window), T(sigterm_twice_keeps_window),
          T(python_sigint_keeps_window), T(abort_keeps_window), T(null_dereference_keeps_window),
          T(crash_on_thread_keeps_window), T(stack_overflow_on_altstack_keeps_window),
          T(kill_keeps_window), T(sigpipe_keeps_window), T(sigterm_in_malloc_never_hangs),
          T(hung_flush_ends_by_watchdog), T(stopped_agent_just_dies), T(vfork_child_crash),
          T(host_handler_keeps_behavior), T(host_sees_what_it_set),
          T(ignored_or_blocked_sigterm_stays_so), T(exec_sees_host_dispositions))
