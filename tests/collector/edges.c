/* A workload for the edges of a process's life (test_edges.c): burn CPU in burn_edge, print
 * the CPU time burnt there, then end the image one way or another. Usage: cpe MODE SECS.
 *   return    return from main (exit: destructors run)
 *   exec      execv /bin/true
 *   _exit     _exit(0)          _Exit   _Exit(0)          sysexit  syscall(SYS_exit_group, 0)
 *   vfork     vfork, the child execs /bin/true (or _exits if that fails); burn again, return
 *   vforkexit vfork, the child _exits at once; burn again, return
 *   forkexit  fork; the child burns and _exits, the parent waits and returns
 *   forkalloc as forkexit, the child freeing a malloc'd block every 20 ms of its burn
 *   sigexit   a thread mallocs and frees in a loop; after SECS of its CPU time a signal
 *             handler on that thread calls _exit(0), often inside the agent's malloc hook */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static volatile uint64_t sink;

__attribute__((noinline)) void burn_edge(double secs);
__attribute__((noinline)) void burn_edge(double secs)
{
    double t0 = cpu_now();
    uint64_t x = 1;
    while (cpu_now() - t0 < secs)
        for (int i = 0; i < 20000; i++)
            x = x * 6364136223846793005ULL + 1;
    sink += x;
}

/* Burns secs of CPU and prints the CPU time burnt. */
static void burn_and_say(double secs)
{
    double t0 = cpu_now();
    burn_edge(secs);
    printf("%.6f\n", cpu_now() - t0);
    fflush(stdout);
}

static void exit_now(int sig)
{
    (void)sig;
    _exit(0);
}

static void *churn(void *arg)
{
    double secs = *(double *)arg;
    struct sigaction sa = {.sa_handler = exit_now};
    sigaction(SIGUSR1, &sa, NULL);
    clockid_t clk;
    pthread_getcpuclockid(pthread_self(), &clk);
    struct sigevent ev = {.sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGUSR1};
    ev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    timer_t tm;
    if (timer_create(clk, &ev, &tm) != 0) exit(3);
    struct itimerspec its = {.it_value = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)}};
    timer_settime(tm, 0, &its, NULL);
    for (unsigned i = 0;; i++) {
        void *p = malloc(64 + (i % 4096));
        sink += (uintptr_t)p;
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    const char *m = argv[1];
    double secs = atof(argv[2]);
    if (!strcmp(m, "forkalloc")) {
        pid_t p = fork();
        if (p == 0) {
            double t0 = cpu_now();
            while (cpu_now() - t0 < secs) {
                burn_edge(0.02);
                void *b = malloc(64);
                sink += (uintptr_t)b;
                free(b);
            }
            printf("%.6f\n", cpu_now() - t0);
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(p, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    if (!strcmp(m, "forkexit")) {
        pid_t p = fork();
        if (p == 0) {
            burn_and_say(secs);
            _exit(0);
        }
        int st = 0;
        waitpid(p, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    if (!strcmp(m, "sigexit")) {
        pthread_t t;
        pthread_create(&t, NULL, churn, &secs);
        pthread_join(t, NULL);
        return 4;
    }
    burn_and_say(secs);
    if (!strcmp(m, "return")) return 0;
    if (!strcmp(m, "exec")) {
        execl("/bin/true", "true", (char *)NULL);
        return 127;
    }
    if (!strcmp(m, "_exit")) _exit(0);
    if (!strcmp(m, "_Exit")) _Exit(0);
    if (!strcmp(m, "sysexit")) {
        syscall(SYS_exit_group, 0);
        return 1;
    }
    if (!strcmp(m, "vfork") || !strcmp(m, "vforkexit")) {
        pid_t p = vfork();
        if (p == 0) {
            if (!strcmp(m, "vfork")) execl("/bin/true", "true", (char *)NULL);
            _exit(0);
        }
        int st = 0;
        waitpid(p, &st, 0);
        burn_and_say(secs);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    return 2;
}
