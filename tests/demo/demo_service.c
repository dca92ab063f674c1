/* demo_service: a small synthetic service with four planted performance problems, for
 * the README's demo (.ci/demo) and the end-to-end test (tests/e2e). Run it under the agent
 * (`contprof run ... -- demo_service`) and the profiles should point straight at them:
 *
 *   1. json_replacer: the serializer's replacer walks the whole subtree below every value
 *      it is given, so a value five levels deep is processed five times. The widest
 *      self-CPU frame.
 *   2. metrics_snapshot: an expensive metrics call made twice per report where once would
 *      do (metrics_report calls it for the count and again for the percentiles).
 *   3. trace_span_record: instrumentation that is "disabled", yet formats each span into a
 *      freshly allocated buffer before it looks at the switch. Most of the alloc_space.
 *   4. geo_table_load: a 64 MiB table allocated at start-up and kept for the life of the
 *      process. Always in the inuse profile.
 *
 * Isolates are named threads (the agent's default): two "http-worker" threads (one
 * isolate), "metrics", and "batch-export", which starts only after --late-after seconds.
 *
 * usage: demo_service [--duration SECONDS] [--late-after SECONDS]
 * Runs until SIGINT/SIGTERM (or --duration) and exits 0 after joining its threads. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* noipa: not inlined, not cloned (no .constprop/.isra suffixes), so each planted function
 * appears in profiles under exactly the name written here. */
#define DEMO_FRAME __attribute__((noipa))

static atomic_int stopping;
static atomic_ulong requests_total;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stopping, 1);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && !atomic_load(&stopping)) {
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One unit of work, then a rest: a steady load that leaves the machine to others. */
static void paced(void (*fn)(void *), void *arg, long sleep_for)
{
    fn(arg);
    sleep_ms(sleep_for);
}

/* ---- 4. the start-up allocation --------------------------------------------------- */

#define GEO_TABLE_BYTES (64u << 20)
static unsigned char *geo_table; /* kept for the life of the process, on purpose */

DEMO_FRAME static void geo_table_load(void)
{
    geo_table = malloc(GEO_TABLE_BYTES);
    if (!geo_table) {
        fprintf(stderr, "demo_service: cannot allocate the geo table\n");
        exit(1);
    }
    for (size_t i = 0; i < GEO_TABLE_BYTES; i += 4096)
        geo_table[i] = (unsigned char)i;
}

/* ---- 3. the "disabled" instrumentation ------------------------------------------- */

static int tracing_enabled = 0; /* off in production... */

/* Records one span. The bug: the span is formatted into a new buffer before the switch is
 * looked at, so the disabled path still allocates 8 KiB per call. */
DEMO_FRAME static void trace_span_record(const char *name, unsigned long id)
{
    char *buf = malloc(8192);
    if (!buf) return;
    int n = snprintf(buf, 8192, "{\"span\":\"%s\",\"id\":%lu}", name, id);
    if (!tracing_enabled || n < 0) {
        free(buf);
        return;
    }
    fwrite(buf, 1, (size_t)n, stderr);
    free(buf);
}

/* ---- 1. the serializer and its replacer ------------------------------------------ */

enum { V_NUM, V_STR, V_OBJ };
#define FANOUT 3
#define DEPTH 7

typedef struct value {
    int kind;
    long num;
    char str[16];
    struct value *child[FANOUT];
} value;

typedef struct outbuf {
    char *p;
    size_t len, cap;
} outbuf;

static void put(outbuf *o, const char *s, size_t n)
{
    if (o->len + n > o->cap) return; /* sized once per worker; never reached */
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

/* The replacer normalises a value before it is written. It checks the value and, the bug,
 * everything below it, although the serializer calls it again for each of those values:
 * a value at depth d is processed d times. Returns a checksum so the work is not dead. */
DEMO_FRAME static unsigned long json_replacer(const value *v)
{
    unsigned long h = (unsigned long)v->kind * 1099511628211ul;
    if (v->kind == V_NUM) h ^= (unsigned long)v->num * 2654435761ul;
    for (const char *s = v->str; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ul;
    if (v->kind == V_OBJ)
        for (int i = 0; i < FANOUT; i++)
            h += json_replacer(v->child[i]);
    return h;
}

DEMO_FRAME static void json_write_value(outbuf *o, const value *v, unsigned long *sum)
{
    *sum += json_replacer(v);
    char tmp[24];
    switch (v->kind) {
    case V_NUM: {
        int n = 0;
        unsigned long x = (unsigned long)v->num;
        do
            tmp[sizeof tmp - 1 - n++] = (char)('0' + x % 10);
        while ((x /= 10) && n < 20);
        put(o, tmp + sizeof tmp - n, (size_t)n);
        break;
    }
    case V_STR:
        put(o, "\"", 1);
        put(o, v->str, strlen(v->str));
        put(o, "\"", 1);
        break;
    default:
        put(o, "[", 1);
        for (int i = 0; i < FANOUT; i++) {
            if (i) put(o, ",", 1);
            json_write_value(o, v->child[i], sum);
        }
        put(o, "]", 1);
    }
}

DEMO_FRAME static unsigned long json_serialize(outbuf *o, const value *doc)
{
    unsigned long sum = 0;
    o->len = 0;
    json_write_value(o, doc, &sum);
    return sum;
}

static value *doc_build(int depth, unsigned long seed)
{
    value *v = calloc(1, sizeof *v);
    if (!v) exit(1);
    if (depth == DEPTH) {
        v->kind = seed & 1 ? V_NUM : V_STR;
        v->num = (long)(seed * 7919 % 100000);
        snprintf(v->str, sizeof v->str, "k%lu", seed % 1000);
        return v;
    }
    v->kind = V_OBJ;
    for (int i = 0; i < FANOUT; i++)
        v->child[i] = doc_build(depth + 1, seed * FANOUT + i);
    return v;
}

/* ---- the request path (isolate "http-worker") ------------------------------------ */

typedef struct worker {
    value *doc;
    outbuf out;
    unsigned long requests, checksum;
} worker;

DEMO_FRAME static void http_handle_request(void *arg)
{
    worker *w = arg;
    for (int r = 0; r < 8; r++) {
        w->requests++;
        w->doc->child[0]->child[0]->num = (long)w->requests; /* a fresh answer each time */
        for (int s = 0; s < 16; s++)
            trace_span_record("serialize", w->requests * 16 + s);
        w->checksum += json_serialize(&w->out, w->doc);
    }
}

static void *http_worker_main(void *arg)
{
    pthread_setname_np(pthread_self(), "http-worker");
    worker w = {.doc = doc_build(1, (unsigned long)(uintptr_t)arg)};
    w.out.cap = 1 << 16;
    w.out.p = malloc(w.out.cap);
    if (!w.out.p) exit(1);
    while (!atomic_load(&stopping))
        paced(http_handle_request, &w, 8);
    atomic_fetch_add(&requests_total, w.requests);
    return NULL;
}

/* ---- 2. metrics (isolate "metrics") ---------------------------------------------- */

#define NLAT 8000
static double latencies[NLAT];

/* Builds a latency histogram by scanning every recorded latency for every bucket:
 * expensive by nature, and metrics_report calls it twice. */
DEMO_FRAME static double metrics_snapshot(double quantile)
{
    enum { NBUCKETS = 64 };
    unsigned counts[NBUCKETS] = {0};
    for (int b = 0; b < NBUCKETS; b++)
        for (int i = 0; i < NLAT; i++)
            if (latencies[i] >= b * 0.5 && latencies[i] < (b + 1) * 0.5) counts[b]++;
    unsigned want = (unsigned)(quantile * NLAT), seen = 0;
    for (int b = 0; b < NBUCKETS; b++)
        if ((seen += counts[b]) >= want) return (b + 1) * 0.5;
    return NBUCKETS * 0.5;
}

/* The bug: two snapshots where one (returning both numbers) would do. */
DEMO_FRAME static void metrics_report(void *arg)
{
    double *last = arg;
    double p50 = metrics_snapshot(0.50);
    double p99 = metrics_snapshot(0.99);
    last[0] = p50, last[1] = p99;
}

static void *metrics_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "metrics");
    for (int i = 0; i < NLAT; i++)
        latencies[i] = (double)((i * 7919) % 3000) / 100.0;
    double last[2];
    while (!atomic_load(&stopping))
        paced(metrics_report, last, 100);
    return NULL;
}

/* ---- a late isolate ("batch-export") --------------------------------------------- */

DEMO_FRAME static void export_compress_batch(void *arg)
{
    unsigned *state = arg;
    unsigned char block[4096];
    for (int round = 0; round < 200; round++) {
        for (size_t i = 0; i < sizeof block; i++)
            block[i] = (unsigned char)(*state >> (i & 7));
        for (size_t i = 0; i < sizeof block; i++)
            *state = *state * 31 + block[i];
    }
}

static void *batch_export_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "batch-export");
    unsigned state = 1;
    while (!atomic_load(&stopping))
        paced(export_compress_batch, &state, 50);
    return NULL;
}

/* ---- main ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    double duration = 0, late_after = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--duration") == 0 && i + 1 < argc)
            duration = atof(argv[++i]);
        else if (strcmp(argv[i], "--late-after") == 0 && i + 1 < argc)
            late_after = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: demo_service [--duration SECONDS] [--late-after SECONDS]\n");
            return 2;
        }
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    double t0 = now_s();
    geo_table_load();

    enum { NWORKERS = 2 };
    pthread_t workers[NWORKERS], metrics, late;
    int late_started = 0;
    for (int i = 0; i < NWORKERS; i++)
        pthread_create(&workers[i], NULL, http_worker_main, (void *)(uintptr_t)(i + 1));
    pthread_create(&metrics, NULL, metrics_main, NULL);
    printf("demo_service: pid %d serving; batch-export starts after %.0f s\n", (int)getpid(),
           late_after);
    fflush(stdout);

    while (!atomic_load(&stopping)) {
        double t = now_s() - t0;
        if (duration > 0 && t >= duration) break;
        if (!late_started && t >= late_after) {
            pthread_create(&late, NULL, batch_export_main, NULL);
            late_started = 1;
        }
        sleep_ms(100);
    }
    atomic_store(&stopping, 1);
    for (int i = 0; i < NWORKERS; i++)
        pthread_join(workers[i], NULL);
    pthread_join(metrics, NULL);
    if (late_started) pthread_join(late, NULL);
    /* for bench/e2e: the process's CPU time (agent included when present) per request */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                 (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    printf("demo_service: stopped after %lu requests, %.3f s CPU (geo table byte %u)\n",
           atomic_load(&requests_total), cpu, geo_table[4096]);
    return 0;
}
