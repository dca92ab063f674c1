/* How many CPU windows the V8 source converts per second on one core: a synthetic
 * Profiler.stop reply of a busy isolate (10 s at 1 ms: 10,000 samples over 3,000 nodes,
 * 400 functions in 40 scripts, stacks 12-30 deep) parsed by jansson, converted
 * (cp_v8_cpu_profile) and encoded as pprof, as each window is. Prints one row
 * "name | value | floor | ok". usage: v8-convert-bench [SECONDS] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pprof.h"
#include "v8conv.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 3;
    enum { NODES = 3000, SAMPLES = 10000 };
    json_t *nodes = json_array(), *samples = json_array(), *deltas = json_array();
    unsigned seed = 1;
    int parent[NODES];
    for (int i = 0; i < NODES; i++) {
        parent[i] = i == 0 ? -1 : (int)(rand_r(&seed) % (unsigned)i);
        char fn[32], url[64];
        int f = i == 0 ? 0 : (int)(rand_r(&seed) % 400);
        snprintf(fn, sizeof(fn), i ? "fn%d" : "(root)", f);
        snprintf(url, sizeof(url), i ? "file:///srv/app/module%d.js" : "", f % 40);
        json_array_append_new(nodes, json_pack("{s:i, s:{s:s, s:s, s:s, s:i, s:i}, s:i, s:[]}",
                                               "id", i + 1, "callFrame", "functionName", fn,
                                               "scriptId", "1", "url", url, "lineNumber", f * 7,
                                               "columnNumber", f % 30, "hitCount", 0, "children"));
    }
    for (int i = 1; i < NODES; i++)
        json_array_append_new(json_object_get(json_array_get(nodes, (size_t)parent[i]), "children"),
                              json_integer(i + 1));
    for (int i = 0; i < SAMPLES; i++) {
        json_array_append_new(samples, json_integer(1 + (int)(rand_r(&seed) % NODES)));
        json_array_append_new(deltas, json_integer(1000));
    }
    json_t *reply = json_pack("{s:i, s:{s:{s:o, s:i, s:i, s:o, s:o}}}", "id", 7, "result",
                              "profile", "nodes", nodes, "startTime", 0, "endTime", 10000000,
                              "samples", samples, "timeDeltas", deltas);
    char *text = json_dumps(reply, JSON_COMPACT);
    size_t len = strlen(text);
    json_decref(reply);
    int n = 0;
    double t0 = now_s(), t;
    do {
        json_error_t je;
        json_t *m = json_loadb(text, len, 0, &je);
        cp_profile *p = NULL;
        cp_err err = {0};
        cp_buf out = {0};
        if (!m ||
            cp_v8_cpu_profile(json_object_get(json_object_get(m, "result"), "profile"), 1000, &p,
                              NULL, &err) != 0 ||
            cp_pprof_encode(p, 0, &out) != 0) {
            fprintf(stderr, "convert bench: %s\n", err.msg);
            return 1;
        }
        cp_buf_close(&out);
        cp_profile_destroy(p);
        json_decref(m);
        n++;
        t = now_s();
    } while (t - t0 < secs);
    double rate = n / (t - t0);
    /* floor: a 2-core machine's one core converts a busy isolate's window well within the
     * window: 10 isolates at 10 s windows need 1 per second */
    printf("v8 CPU windows converted per s (10k samples, 3k nodes, %zu KB JSON) | %.1f | >= 10 | "
           "%s\n",
           len >> 10, rate, rate >= 10 ? "yes" : "no");
    free(text);
    return rate >= 10 ? 0 : 1;
}
