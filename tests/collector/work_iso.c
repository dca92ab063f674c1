/* A toy interpreter host linked with libcontprof: it starts the agent through the API,
 * runs two isolates on one thread (entering and leaving them), and reports language
 * frames through a walker at its safe points. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "contprof.h"

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

typedef struct vm {
    const char *script_fn; /* the "language" function currently running */
    int line;
} vm;

static int walker(void *arg, contprof_frame *out, int max)
{
    vm *v = arg;
    if (max < 2) return 0;
    out[0] = (contprof_frame){.function = v->script_fn, .file = "script.js", .line = v->line};
    out[1] = (contprof_frame){.function = "main.js:<toplevel>", .file = "main.js", .line = 1};
    return 2;
}

static volatile uint64_t sink;

__attribute__((noinline)) void interp_loop(vm *v, double secs)
{
    double t0 = thread_cpu();
    uint64_t x = 1;
    while (thread_cpu() - t0 < secs) {
        for (int i = 0; i < 2000; i++)
            x = x * 6364136223846793005ULL + 1;
        v->line = 10 + (int)(x & 3);
        contprof_safepoint();
    }
    sink += x;
}

int main(void)
{
    contprof_options o;
    memset(&o, 0, sizeof(o));
    o.cpu_hz = 500;
    o.service = "isohost";
    if (contprof_start(&o) != 0) return 1;
    contprof_isolate *a = contprof_isolate_create("js-a", "tenant_app=shop");
    contprof_isolate *b = contprof_isolate_create("js-b", NULL);
    if (!a || !b) return 1;
    vm va = {"renderCart", 0}, vb = {"computeTax", 0};
    contprof_isolate_set_walker(a, walker, &va);
    contprof_isolate_set_walker(b, walker, &vb);
    for (int round = 0; round < 10; round++) {
        contprof_isolate_enter(a);
        interp_loop(&va, 0.06);
        contprof_isolate_leave();
        contprof_isolate_enter(b);
        interp_loop(&vb, 0.02);
        contprof_isolate_leave();
    }
    contprof_stop();
    contprof_isolate_destroy(a);
    contprof_isolate_destroy(b);
    printf("ok\n");
    return 0;
}
