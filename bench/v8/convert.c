/* How many CPU windows the V8 source converts per second on one core: a synthetic
 * Profiler.stop reply of a busy isolate (10 s at 1 ms: 10,000 samples over 3,000 nodes,
 * 400 functions in 40 scripts, stacks 12-30 deep) parsed as a message (model/json), converted
 * (cp_v8_cpu_profile) and encoded as pprof, as each window is. Prints one row
 * "name | value | floor | ok". usage: v8-convert-bench [SECONDS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
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
    unsigned seed = 1;
    static int parent[NODES];
    static cp_buf children[NODES];
    static char fn[NODES][32], url[NODES][64];
    static int f[NODES];
    for (int i = 0; i < NODES; i++) {
        parent[i] = i == 0 ? -1 : (int)(rand_r(&seed) % (unsigned)i);
        f[i] = i == 0 ? 0 : (int)(rand_r(&seed) % 400);
        snprintf(fn[i], sizeof(fn[i]), i ? "fn%d" : "(root)", f[i]);
        snprintf(url[i], sizeof(url[i]), i ? "file:///srv/app/module%d.js" : "", f[i] % 40);
    }
    for (int i = 1; i < NODES; i++)
        if (cp_buf_printf(&children[parent[i]], "%s%d", children[parent[i]].len ? "," : "", i + 1))
            return 1;
    cp_buf b = {0};
    int rc = cp_buf_printf(&b, "{\"id\":7,\"result\":{\"profile\":{\"nodes\":[");
    for (int i = 0; i < NODES && !rc; i++) {
        rc = cp_buf_printf(&b,
                           "%s{\"id\":%d,\"callFrame\":{\"functionName\":\"%s\",\"scriptId\":\"1\","
                           "\"url\":\"%s\",\"lineNumber\":%d,\"columnNumber\":%d},\"hitCount\":0,"
                           "\"children\":[%.*s]}",
                           i ? "," : "", i + 1, fn[i], url[i], f[i] * 7, f[i] % 30,
                           (int)children[i].len, children[i].len ? (char *)children[i].data : "");
        cp_buf_close(&children[i]);
    }
    rc = rc || cp_buf_printf(&b, "],\"startTime\":0,\"endTime\":10000000,\"samples\":[");
    for (int i = 0; i < SAMPLES && !rc; i++)
        rc = cp_buf_printf(&b, "%s%d", i ? "," : "", 1 + (int)(rand_r(&seed) % NODES));
    rc = rc || cp_buf_printf(&b, "],\"timeDeltas\":[");
    for (int i = 0; i < SAMPLES && !rc; i++)
        rc = cp_buf_printf(&b, "%s1000", i ? "," : "");
    rc = rc || cp_buf_printf(&b, "]}}}");
    if (rc) return 1;
    const char *text = (const char *)b.data;
    size_t len = b.len;
    int n = 0;
    double t0 = now_s(), t;
    do {
        cp_json *m = NULL;
        cp_profile *p = NULL;
        cp_err err = {0};
        cp_buf out = {0};
        if (cp_v8_message_parse(text, len, &m, &err) != 0 ||
            cp_v8_cpu_profile(cp_json_get(cp_json_get(m, "result"), "profile"), 1000, &p, NULL,
                              &err) != 0 ||
            cp_pprof_encode(p, 0, &out) != 0) {
            fprintf(stderr, "convert bench: %s\n", err.msg);
            return 1;
        }
        cp_buf_close(&out);
        cp_profile_destroy(p);
        cp_json_free(m);
        n++;
        t = now_s();
    } while (t - t0 < secs);
    double rate = n / (t - t0);
    /* floor: a 2-core machine's one core converts a busy isolate's window well within the
     * window: 10 isolates at 10 s windows need 1 per second */
    printf("v8 CPU windows converted per s (10k samples, 3k nodes, %zu KB JSON) | %.1f | >= 10 | "
           "%s\n",
           len >> 10, rate, rate >= 10 ? "yes" : "no");
    cp_buf_close(&b);
    return rate >= 10 ? 0 : 1;
}
