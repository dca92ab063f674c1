/* A workload for fatal signals (test_fatal.c): burn CPU in burn_fatal, say "ready", then meet
 * a signal one way or another. Usage: cpf MODE SECS.
 *   abort     burn SECS, abort()
 *   segv      burn SECS, store through NULL
 *   segvthr   a second thread burns SECS and stores through NULL; main sleeps
 *   overflow  burn SECS, then overflow the stack on a thread with a sigaltstack
 *   spin      burn SECS, say "ready", burn until killed
 *   pipe      burn SECS, write to a pipe nobody reads (SIGPIPE)
 *   churn     two threads malloc and free in a loop (often inside the agent's hooks);
 *             after SECS of CPU say "ready", go on until killed
 *   handler   own SIGTERM handler (sets a flag); burn SECS, say "ready", burn until the
 *             flag is set, say "handled", return 0
 *   ignore    SIGTERM set to SIG_IGN; burn SECS, say "ready", burn SECS more, return 0
 *   inherit   burn SECS, say "ready", burn SECS more, return 0 (SIGTERM as inherited)
 *   blocked   SIGTERM blocked; burn SECS, say "ready", burn SECS more, say whether
 *             SIGTERM is pending, return 0
 *   stopped   burn SECS, contprof_stop() (found with dlsym), say "ready", burn until killed
 *   vforkcrash burn SECS, vfork; the child stores through NULL; say how it ended, burn SECS
 *             more, return 0
 *   query     what sigaction() and signal() say of SIGTERM, SIGINT and SIGSEGV as they
 *             are set and reset (a transcript compared with and without the agent) */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static volatile uint64_t sink;
static volatile sig_atomic_t g_flag;

__attribute__((noinline)) void burn_fatal(double secs);
__attribute__((noinline)) void burn_fatal(double secs)
{
    double t0 = cpu_now();
    uint64_t x = 1;
    while ((secs < 0 && !g_flag) || (secs >= 0 && cpu_now() - t0 < secs))
        for (int i = 0; i < 20000; i++)
            x = x * 6364136223846793005ULL + 1;
    sink += x;
}

static void say(const char *s)
{
    printf("%s\n", s);
    fflush(stdout);
}

static void on_term(int sig)
{
    (void)sig;
    g_flag = 1;
}

static double g_secs;

static void *churn(void *arg)
{
    (void)arg;
    double t0 = cpu_now();
    void *keep[64] = {0};
    for (unsigned i = 0;; i++) {
        free(keep[i % 64]);
        keep[i % 64] = malloc(16 + i % 4096);
        if (arg && (i & 1023) == 0 && cpu_now() - t0 >= g_secs) {
            say("ready");
            arg = NULL;
        }
    }
    return NULL;
}

static void *crash_thread(void *arg)
{
    (void)arg;
    burn_fatal(g_secs);
    say("ready");
    *(volatile int *)(uintptr_t)(sink * 0) = 1; /* NULL, unknown to the compiler */
    return NULL;
}

/* Deeper until the stack ends (the guard stops it short of forever, unknown to the compiler). */
__attribute__((noinline)) static int recurse(int n)
{
    volatile char pad[4096];
    pad[0] = (char)n;
    if (n < 0 && sink == 12345) return 0;
    return recurse(n + 1) + pad[0];
}

static void *overflow_thread(void *arg)
{
    (void)arg;
    static char alt[1 << 16];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof(alt)};
    sigaltstack(&ss, NULL);
    burn_fatal(g_secs);
    say("ready");
    return (void *)(intptr_t)recurse(0);
}

static const char *name_of(void (*h)(int))
{
    return h == SIG_DFL ? "SIG_DFL" : h == SIG_IGN ? "SIG_IGN" : h == on_term ? "on_term" : "other";
}

static void show(const char *what, int sig)
{
    struct sigaction o;
    memset(&o, 0xa5, sizeof(o));
    int rc = sigaction(sig, NULL, &o);
    printf("%s: sigaction(%d) rc=%d handler=%s siginfo=%d\n", what, sig, rc, name_of(o.sa_handler),
           !!(o.sa_flags & SA_SIGINFO));
}

static void query(void)
{
    int sigs[] = {SIGTERM, SIGINT, SIGSEGV};
    for (int i = 0; i < 3; i++) {
        int s = sigs[i];
        show("start", s);
        printf("signal(%d, on_term) -> %s\n", s, name_of(signal(s, on_term)));
        show("after handler", s);
        printf("signal(%d, SIG_IGN) -> %s\n", s, name_of(signal(s, SIG_IGN)));
        show("after ignore", s);
        printf("signal(%d, SIG_DFL) -> %s\n", s, name_of(signal(s, SIG_DFL)));
        show("after default", s);
        struct sigaction a, o;
        memset(&a, 0, sizeof(a));
        a.sa_handler = SIG_DFL;
        sigemptyset(&a.sa_mask);
        sigaddset(&a.sa_mask, SIGUSR1);
        a.sa_flags = SA_ONSTACK;
        int rc = sigaction(s, &a, &o);
        printf("sigaction(%d, SIG_DFL+mask) rc=%d old=%s\n", s, rc, name_of(o.sa_handler));
        memset(&o, 0, sizeof(o));
        sigaction(s, NULL, &o);
        printf("  mask has SIGUSR1=%d onstack=%d\n", sigismember(&o.sa_mask, SIGUSR1),
               !!(o.sa_flags & SA_ONSTACK));
    }
    /* glibc's system() ignores SIGINT and SIGQUIT past the hooks, then restores them */
    printf("system: %d\n", system("exit 0"));
    show("after system", SIGINT);
    show("after system", SIGQUIT);
    /* a handler that is the host's really runs */
    signal(SIGTERM, on_term);
    raise(SIGTERM);
    printf("raise with handler: flag=%d\n", (int)g_flag);
    signal(SIGTERM, SIG_IGN);
    raise(SIGTERM);
    printf("raise ignored: alive\n");
    printf("invalid: %d\n", sigaction(0, NULL, NULL));
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    const char *mode = argv[1];
    g_secs = atof(argv[2]);
    if (!strcmp(mode, "query")) {
        query();
        return 0;
    }
    if (!strcmp(mode, "handler")) signal(SIGTERM, on_term);
    if (!strcmp(mode, "ignore")) signal(SIGTERM, SIG_IGN);
    if (!strcmp(mode, "blocked")) {
        sigset_t b;
        sigemptyset(&b);
        sigaddset(&b, SIGTERM);
        sigprocmask(SIG_BLOCK, &b, NULL);
    }
    if (!strcmp(mode, "churn")) {
        pthread_t t;
        pthread_create(&t, NULL, churn, NULL);
        churn(&t);
    }
    if (!strcmp(mode, "segvthr") || !strcmp(mode, "overflow")) {
        pthread_t t;
        pthread_create(&t, NULL, mode[0] == 's' ? crash_thread : overflow_thread, NULL);
        for (;;)
            pause();
    }
    burn_fatal(g_secs);
    if (!strcmp(mode, "abort")) {
        say("ready");
        abort();
    }
    if (!strcmp(mode, "segv")) {
        say("ready");
        *(volatile int *)(uintptr_t)(sink * 0) = 1;
    }
    if (!strcmp(mode, "pipe")) {
        int fd[2];
        if (pipe(fd) != 0) return 4;
        close(fd[0]);
        say("ready");
        (void)!write(fd[1], "x", 1);
        return 5;
    }
    if (!strcmp(mode, "stopped")) {
        void (*stop)(void) = (void (*)(void))(uintptr_t)dlsym(RTLD_DEFAULT, "contprof_stop");
        if (stop) stop();
        printf("stopped=%d\n", stop != NULL);
        mode = "spin";
    }
    if (!strcmp(mode, "vforkcrash")) {
        pid_t pid = vfork();
        if (pid == 0) *(volatile int *)(uintptr_t)(sink * 0) = 1;
        int st = 0;
        waitpid(pid, &st, 0);
        printf("child: %s %d\n", WIFSIGNALED(st) ? "signal" : "exit",
               WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        burn_fatal(g_secs);
        return 0;
    }
    say("ready");
    if (!strcmp(mode, "spin")) burn_fatal(-1);
    if (!strcmp(mode, "handler")) {
        burn_fatal(-1);
        say("handled");
        return 0;
    }
    if (!strcmp(mode, "ignore") || !strcmp(mode, "inherit") || !strcmp(mode, "blocked")) {
        burn_fatal(g_secs);
        if (!strcmp(mode, "blocked")) {
            sigset_t p;
            sigpending(&p);
            printf("pending=%d\n", sigismember(&p, SIGTERM));
        }
        return 0;
    }
    return 3;
}
