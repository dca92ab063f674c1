/* Hostile hosts: programs that do to their own process what daemons, shells and test harnesses
 * do (close every fd, take SIGPROF, re-exec themselves, fork storms, many threads), run by
 * test_hostile with and without the agent. Each prints what it saw so that the two runs can
 * be compared, and exits non-zero when one of its own calls failed. Usage: cph MODE [ARGS]. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static volatile uint64_t sink;

/* Burns secs of this thread's CPU time. */
__attribute__((noinline)) static void burn(double secs)
{
    double t0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
    uint64_t x = 1;
    while (cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0 < secs)
        for (int i = 0; i < 20000; i++)
            x = x * 6364136223846793005ULL + 1;
    sink += x;
}

/* Writes everything or says why not. */
static int write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* --- (a) close every fd above 2, then open files and write ticks -------------------- */

static void close_all(const char *how)
{
    if (!strcmp(how, "loop")) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        int closed = 0, ebadf = 0;
        for (long fd = 3; fd < (long)rl.rlim_cur; fd++) {
            if (close((int)fd) == 0)
                closed++;
            else
                ebadf += errno == EBADF;
        }
        /* what close() said, fd by fd: the same with and without the agent */
        printf("closed %d, EBADF %d\n", closed, ebadf);
    } else if (!strcmp(how, "close_range")) {
        close_range(3, ~0U, 0);
    } else if (!strcmp(how, "closefrom")) {
        closefrom(3);
    } else if (!strcmp(how, "syscall")) {
        syscall(SYS_close_range, 3, ~0U, 0);
    } else if (!strcmp(how, "dup2")) {
        /* dup2 onto every number up to the limit, then close them: takes every number
         * the agent might hold */
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        long top = (long)rl.rlim_cur < 4096 ? (long)rl.rlim_cur : 4096;
        int null = open("/dev/null", O_RDONLY);
        for (long fd = 3; fd < top; fd++)
            if (fd != null) dup2(null, (int)fd);
        for (long fd = 3; fd < top; fd++)
            close((int)fd);
    }
}

/* Opens 8 files in dir and writes `tick N` lines to them in turn, burning a little CPU
 * between lines (the agent keeps sampling and shipping windows). Prints the fd numbers it
 * got. Exit 5 if a write fails, 4 if an open fails. */
static int write_ticks(const char *dir, int lines)
{
    int fds[8];
    printf("fds");
    for (int i = 0; i < 8; i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s/f%d", dir, i);
        fds[i] = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fds[i] < 0) return 4;
        printf(" %d", fds[i]);
    }
    printf("\n");
    for (int n = 0; n < lines; n++) {
        char b[32];
        int k = snprintf(b, sizeof(b), "tick %d\n", n);
        if (write_all(fds[n % 8], b, (size_t)k) != 0) return 5;
        burn(0.004);
        if (n % 50 == 49) usleep(20000); /* a few wake-ups of the agent's threads */
    }
    for (int i = 0; i < 8; i++)
        if (close(fds[i]) != 0) return 6;
    return 0;
}

static int mode_closeall(const char *how, const char *dir, double secs)
{
    burn(secs); /* the agent is up, its Kafka client connected */
    if (!strcmp(how, "fork")) {
        /* fork + close-all in the child, which then writes the files */
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            closefrom(3);
            int rc = write_ticks(dir, 400);
            fflush(stdout);
            _exit(rc);
        }
        int st;
        if (waitpid(p, &st, 0) != p || !WIFEXITED(st)) return 7;
        printf("child exit %d\n", WEXITSTATUS(st));
        return WEXITSTATUS(st);
    }
    close_all(how);
    return write_ticks(dir, 400);
}

/* --- (a') close loops while the agent makes fds ------------------------------------- */

static volatile int g_storm_stop;

static void *idle_thr(void *a)
{
    (void)a;
    while (!g_storm_stop)
        usleep(10000);
    return NULL;
}

static void *short_thr(void *a)
{
    (void)a;
    usleep(1000);
    return NULL;
}

/* Starts threads of a millisecond, 8 at a time (the agent arms each one's CPU event: a
 * perf fd, on the perf engine), until the storm ends. */
static void *spawner(void *a)
{
    (void)a;
    while (!g_storm_stop) {
        pthread_t x[8];
        int k = 0;
        for (; k < 8 && pthread_create(&x[k], NULL, short_thr, NULL) == 0; k++) {
        }
        for (int i = 0; i < k; i++)
            pthread_join(x[i], NULL);
    }
    return NULL;
}

/* Closes every fd above 2, then for secs of wall time closes 3..63 over and over while
 * nthreads idle threads run (the agent opens each one's /proc comm file every second, and
 * its window files every window, at the lowest free numbers before moving them) and short
 * threads come and go (each one's perf fd is born there too). The host holds no fd there,
 * so no close() may succeed: one that does closed an fd of the agent's before it moved out
 * of the way. Prints how many did. */
static int mode_closestorm(double secs, int nthreads)
{
    close_all("close_range");
    pthread_t t[256], sp;
    if (nthreads > 256) nthreads = 256;
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&t[i], NULL, idle_thr, NULL) != 0) return 3;
    if (pthread_create(&sp, NULL, spawner, NULL) != 0) return 3;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long stray = 0, rounds = 0;
    do {
        for (int fd = 3; fd < 64; fd++)
            stray += close(fd) == 0;
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - t0.tv_sec + (now.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    g_storm_stop = 1;
    pthread_join(sp, NULL);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    fprintf(stderr, "closestorm: %ld rounds\n", rounds);
    printf("stray closes %ld\n", stray);
    return 0;
}

/* --- (b) its own SIGPROF handler and ITIMER_PROF at 100 Hz -------------------------- */

static volatile sig_atomic_t g_prof, g_foreign, g_ref;

/* A reference beside the itimer: a process CPU-time timer at the same 100 Hz on SIGUSR2. The
 * kernel checks both on the same scheduler ticks, so under load both lose signals alike. */
static void on_ref(int sig)
{
    (void)sig;
    g_ref++;
}

#define OWN_TIMER_VALUE 4242

static void on_prof(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    if (si->si_code == SI_KERNEL ||
        (si->si_code == SI_TIMER && si->si_value.sival_int == OWN_TIMER_VALUE))
        g_prof++;
    else
        g_foreign++; /* not from the itimer: someone else's signal */
}

static void on_prof_plain(int sig)
{
    (void)sig;
    g_prof++;
}

/* how: "sigaction" or "signal" install the handler, then ITIMER_PROF at 100 Hz; "timer":
 * sigaction, then a POSIX process CPU-time timer at 100 Hz delivering SIGPROF. */
static int mode_sigprof(const char *how, double secs)
{
    burn(0.5); /* the agent has been sampling for a while */
    timer_t ref;
    struct sigevent rev;
    memset(&rev, 0, sizeof(rev));
    rev.sigev_notify = SIGEV_SIGNAL;
    rev.sigev_signo = SIGUSR2;
    if (signal(SIGUSR2, on_ref) == SIG_ERR ||
        timer_create(CLOCK_PROCESS_CPUTIME_ID, &rev, &ref) != 0)
        return 12;
    struct sigaction q0;
    /* nothing set yet: the program sees SIGPROF at its default */
    if (sigaction(SIGPROF, NULL, &q0) != 0 || q0.sa_handler != SIG_DFL) return 11;
    if (!strcmp(how, "signal")) {
        if (signal(SIGPROF, on_prof_plain) == SIG_ERR) return 3;
        struct sigaction q;
        if (sigaction(SIGPROF, NULL, &q) != 0 || q.sa_handler != on_prof_plain) return 8;
    } else {
        struct sigaction sa, q;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_prof;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGPROF, &sa, NULL) != 0) return 3;
        /* the query returns what this program set */
        if (sigaction(SIGPROF, NULL, &q) != 0 || q.sa_sigaction != on_prof ||
            !(q.sa_flags & SA_SIGINFO))
            return 8;
    }
    timer_t tm;
    if (!strcmp(how, "timer")) {
        struct sigevent sev;
        memset(&sev, 0, sizeof(sev));
        sev.sigev_notify = SIGEV_SIGNAL;
        sev.sigev_signo = SIGPROF;
        sev.sigev_value.sival_int = OWN_TIMER_VALUE;
        struct itimerspec its = {{0, 10000000}, {0, 10000000}};
        if (timer_create(CLOCK_PROCESS_CPUTIME_ID, &sev, &tm) != 0 ||
            timer_settime(tm, 0, &its, NULL) != 0)
            return 9;
    } else {
        struct itimerval it = {{0, 10000}, {0, 10000}};
        if (setitimer(ITIMER_PROF, &it, NULL) != 0) return 9;
    }
    struct itimerspec rits = {{0, 10000000}, {0, 10000000}};
    if (timer_settime(ref, 0, &rits, NULL) != 0) return 12;
    double c0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID);
    burn(secs);
    timer_delete(ref);
    double cpu = cpu_now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (!strcmp(how, "timer")) {
        timer_delete(tm);
    } else {
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_PROF, &off, NULL);
    }
    /* counts vary from run to run: on stderr, for the test to compare rates */
    fprintf(stderr, "signals %d foreign %d cpu %.3f ref %d\n", (int)g_prof, (int)g_foreign, cpu,
            (int)g_ref);
    printf("sigprof %s done\n", how);
    return g_foreign ? 10 : 0;
}

/* Ignores SIGPROF, then execs itself to print what the new image sees: SIG_IGN survives
 * exec, with or without the agent. */
static const char *disposition(int sig)
{
    struct sigaction q;
    if (sigaction(sig, NULL, &q) != 0) return "error";
    return q.sa_handler == SIG_IGN ? "ignored" : q.sa_handler == SIG_DFL ? "default" : "handled";
}

static int mode_ignexec(const char *self)
{
    if (signal(SIGPROF, SIG_IGN) == SIG_ERR) return 3;
    burn(0.3);
    printf("before exec: SIGPROF %s\n", disposition(SIGPROF));
    fflush(stdout);
    execl(self, self, "sigquery", (char *)NULL);
    return 127;
}

/* --- (c) re-exec itself under --output-dir ------------------------------------------ */

static int mode_reexec(const char *self, int n, double secs)
{
    burn(secs);
    printf("image %d\n", n);
    fflush(stdout);
    if (n <= 0) return 0;
    char a[16], s[32];
    snprintf(a, sizeof(a), "%d", n - 1);
    snprintf(s, sizeof(s), "%g", secs);
    execl(self, self, "reexec", a, s, (char *)NULL);
    return 127;
}

/* --- what already passed: fork storm, 500 threads, fds closed at start -------------- */

static int mode_forkstorm(int n)
{
    int sum = 0;
    for (int round = 0; round < 4; round++) {
        pid_t p[64];
        int k = n / 4 < 64 ? n / 4 : 64;
        for (int i = 0; i < k; i++) {
            p[i] = fork();
            if (p[i] == 0) {
                burn(0.002);
                _exit((round * 64 + i) % 7);
            }
            if (p[i] < 0) return 3;
        }
        for (int i = 0; i < k; i++) {
            int st;
            if (waitpid(p[i], &st, 0) != p[i] || !WIFEXITED(st)) return 4;
            sum += WEXITSTATUS(st);
        }
    }
    printf("forkstorm %d\n", sum);
    return 0;
}

static void *thr(void *a)
{
    uint64_t x = (uintptr_t)a, h = 0;
    for (int i = 0; i < 20000; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        char *b = malloc(16 + (x >> 60));
        b[0] = (char)x;
        h += (unsigned char)b[0];
        free(b);
    }
    return (void *)(uintptr_t)h;
}

static int mode_threads(int n)
{
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    if (!t) return 3;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, thr, (void *)(uintptr_t)(i + 1)) != 0) return 4;
    uint64_t h = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        h += (uintptr_t)r;
    }
    free(t);
    printf("threads %d sum %llu\n", n, (unsigned long long)h);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *m = argv[1];
    if (!strcmp(m, "closestart")) { /* every fd above 2 closed before anything else */
        close_all("loop");
        return write_ticks(argc > 2 ? argv[2] : ".", 200);
    }
    if (!strcmp(m, "closeall") && argc > 3)
        return mode_closeall(argv[2], argv[3], argc > 4 ? atof(argv[4]) : 3);
    if (!strcmp(m, "sigprof") && argc > 2)
        return mode_sigprof(argv[2], argc > 3 ? atof(argv[3]) : 2);
    if (!strcmp(m, "reexec") && argc > 2)
        return mode_reexec(argv[0], atoi(argv[2]), argc > 3 ? atof(argv[3]) : 0.5);
    if (!strcmp(m, "ignexec")) return mode_ignexec(argv[0]);
    if (!strcmp(m, "sigquery")) {
        burn(0.3);
        printf("after exec: SIGPROF %s, SIGVTALRM %s\n", disposition(SIGPROF),
               disposition(SIGVTALRM));
        return 0;
    }
    if (!strcmp(m, "closestorm"))
        return mode_closestorm(argc > 2 ? atof(argv[2]) : 5, argc > 3 ? atoi(argv[3]) : 64);
    if (!strcmp(m, "forkstorm")) return mode_forkstorm(argc > 2 ? atoi(argv[2]) : 200);
    if (!strcmp(m, "threads")) return mode_threads(argc > 2 ? atoi(argv[2]) : 500);
    return 2;
}
