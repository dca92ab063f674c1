/* What one CPU sample costs below the agent's handler: a fixed busy loop, alone or with
 * one perf task-clock event on its thread sampling every PERIOD_NS of its CPU time
 * (bench/collector/handler.sh runs each mode side by side with `none` on one core).
 *   sigcost none UNITS                    the loop alone
 *   sigcost ring UNITS PERIOD_NS          the event writes a record into a mmap'd ring
 *                                         per period, no signal (timer interrupt,
 *                                         overflow, ring write)
 *   sigcost signal UNITS PERIOD_NS        the same plus a signal per period to an empty
 *                                         handler (O_ASYNC, as the agent: wake-up,
 *                                         signal frame, sigreturn)
 * Prints "cpu_seconds signals overflows". */
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile sig_atomic_t signals;
static volatile uint64_t sink;

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)si, (void)uc;
    signals++;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: sigcost none|ring|signal UNITS [PERIOD_NS]\n");
        return 2;
    }
    long units = atol(argv[2]);
    long period = argc > 3 ? atol(argv[3]) : 1000000;
    int mode = !strcmp(argv[1], "ring") ? 1 : !strcmp(argv[1], "signal") ? 2 : 0;
    int fd = -1;
    struct perf_event_mmap_page *pg = NULL;
    if (mode) {
        struct perf_event_attr a;
        memset(&a, 0, sizeof(a));
        a.size = sizeof(a);
        a.type = PERF_TYPE_SOFTWARE;
        a.config = PERF_COUNT_SW_TASK_CLOCK;
        a.sample_period = (uint64_t)period;
        a.sample_type = PERF_SAMPLE_IP;
        a.wakeup_events = 1;
        a.exclude_hv = 1;
        a.disabled = 1;
        fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd < 0) {
            perror("perf_event_open");
            return 1;
        }
        pg = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (pg == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        if (mode == 2) {
            struct sigaction sa;
            memset(&sa, 0, sizeof(sa));
            sa.sa_sigaction = on_signal;
            sa.sa_flags = SA_SIGINFO | SA_RESTART;
            sigaction(SIGPROF, &sa, NULL);
            struct f_owner_ex own = {.type = F_OWNER_TID, .pid = (pid_t)syscall(SYS_gettid)};
            fcntl(fd, F_SETFL, O_ASYNC);
            fcntl(fd, F_SETSIG, SIGPROF);
            fcntl(fd, F_SETOWN_EX, &own);
        }
        ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
    }
    double c0 = cpu_s();
    uint64_t overflows = 0, x = 1;
    for (long u = 0; u < units; u++) {
        for (long i = 0; i < 10000000; i++)
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        sink = x;
        if (pg) { /* free the ring's space, counting its records */
            uint64_t head = __atomic_load_n(&pg->data_head, __ATOMIC_ACQUIRE);
            uint64_t tail = pg->data_tail;
            const uint8_t *data = (const uint8_t *)pg + 4096;
            while (tail + sizeof(struct perf_event_header) <= head) {
                struct perf_event_header h;
                memcpy(&h, data + tail % 4096, sizeof(h));
                if (h.size == 0) break;
                overflows += h.type == PERF_RECORD_SAMPLE;
                tail += h.size;
            }
            __atomic_store_n(&pg->data_tail, head, __ATOMIC_RELEASE);
        }
    }
    printf("%.6f %ld %llu\n", cpu_s() - c0, (long)signals, (unsigned long long)overflows);
    return 0;
}
