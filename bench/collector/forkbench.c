/* What a fork without exec costs: N children, one at a time, each returning from main at
 * once (exit: destructors and atexit run, as a shell's subshell does). Prints the CPU time
 * per child in microseconds, of the parent (the fork itself) and of the child (everything it
 * ran, its threads included), then the child's minor page faults:
 *   forkbench N   ->   "parent_us child_us child_minflt" */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static double us(const struct rusage *r)
{
    return (r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1e6 + r->ru_utime.tv_usec +
           r->ru_stime.tv_usec;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100;
    if (n < 1) n = 1;
    struct rusage s0; /* the parent's own start (and its agent's) left out */
    getrusage(RUSAGE_SELF, &s0);
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) exit(0);
        int st;
        if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "forkbench: child %d failed\n", (int)p);
            return 1;
        }
    }
    struct rusage s, c;
    getrusage(RUSAGE_SELF, &s);
    getrusage(RUSAGE_CHILDREN, &c);
    printf("%.1f %.1f %.1f\n", (us(&s) - us(&s0)) / n, us(&c) / n, (double)c.ru_minflt / n);
    return 0;
}
