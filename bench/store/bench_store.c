/* Store benchmarks, and a harness that builds a 7-day store for query benchmarks.
 *   bench_store build DIR [WINDOWS [SERIES]]  N realistic 10 s CPU windows (2,000 distinct
 *       stacks of depth 10-60, 1,000 samples each) of one service, written through the
 *       store's batch API (synced LevelDB writes); prints write speed and bytes on disk per
 *       window (all levels, after a full compaction) against the windows' gzip'd pprof size.
 *   bench_store query DIR [REPS]  the merged profile of the whole store and of random
 *       unaligned 24 h windows; prints milliseconds.
 *   bench_store forget DIR [N]  N per-process series past retention: the heap a series
 *       holds, what retention's forgetting leaves of it, and its CPU (forget, below).
 * The store is written for tenant "default", labels service=bench,instance=i<k>, starting at
 * BENCH_T0 (2024-01-01T00:00:00Z), so other benchmarks can reuse it. */
#include <leveldb/c.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "pprof.h"
#include "selector.h"
#include "store.h"
#include "synth.h"
#include "clock.h"

#define BENCH_T0 1704067200000000000LL
#define SEC 1000000000LL
#define NDISTINCT 48

static void die(const char *what, const cp_err *e)
{
    fprintf(stderr, "bench_store: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}

static int build(const char *dir, long n, int nseries)
{
    cp_synth *sy = cp_synth_create(42, 2000);
    cp_profile *w[NDISTINCT];
    double gz = 0;
    for (int i = 0; i < NDISTINCT; i++) {
        w[i] = cp_synth_cpu_window(sy, 1000, BENCH_T0, 10 * SEC);
        cp_buf b = {0};
        cp_pprof_encode(w[i], 6, &b);
        gz += (double)b.len;
        cp_buf_close(&b);
    }
    gz /= NDISTINCT;
    cp_store_options o = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&o, &s, &err)) die("open", &err);
    cp_store_batch *b = cp_store_batch_create(s);
    double t0 = now_s(), c0 = thread_cpu_s();
    for (long i = 0; i < n; i++) {
        int ser = (int)(i % nseries);
        long k = i / nseries;
        cp_envelope e = {0};
        char inst[32];
        snprintf(inst, sizeof inst, "i%d", ser);
        e.tenant = "default";
        cp_labels_set(&e.labels, "service", "bench");
        cp_labels_set(&e.labels, "instance", inst);
        e.kind = CP_KIND_CPU;
        e.window_start_ns = BENCH_T0 + k * 10 * SEC;
        e.window_duration_ns = 10 * SEC;
        e.producer_id = inst;
        e.sequence = (uint64_t)k;
        if (cp_store_batch_add(b, &e, w[(i * 7) % NDISTINCT], 0, &err)) die("add", &err);
        cp_labels_close(&e.labels);
        if (i % 256 == 255 && cp_store_batch_commit(b, &err)) die("commit", &err);
    }
    if (cp_store_batch_commit(b, &err)) die("commit", &err);
    double t1 = now_s(), c1 = thread_cpu_s();
    cp_store_batch_destroy(b);
    cp_store_close(s);
    /* steady state: what LevelDB's compactions converge to */
    char *e = NULL;
    leveldb_options_t *lo = leveldb_options_create();
    leveldb_t *db = leveldb_open(lo, dir, &e);
    if (e) die(e, NULL);
    leveldb_compact_range(db, NULL, 0, NULL, 0);
    leveldb_close(db);
    leveldb_options_destroy(lo);
    if (cp_store_open(&o, &s, &err)) die("reopen", &err);
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    cp_store_close(s);
    printf("windows %ld\n", n);
    printf("write_windows_per_s %.0f\n", (double)n / (t1 - t0));
    printf("write_windows_per_cpu_s %.0f\n", (double)n / (c1 - c0));
    printf("disk_bytes %llu\n", (unsigned long long)st.disk_bytes);
    printf("bytes_per_window %.0f\n", (double)st.disk_bytes / (double)n);
    printf("gzip_bytes_per_window %.0f\n", gz);
    printf("storage_ratio_pct %.2f\n", 100.0 * (double)st.disk_bytes / (double)n / gz);
    for (int i = 0; i < NDISTINCT; i++)
        cp_profile_destroy(w[i]);
    cp_synth_destroy(sy);
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int query(const char *dir, int reps)
{
    cp_store_options o = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&o, &s, &err)) die("open", &err);
    cp_series_list sl;
    if (cp_store_series(s, &(cp_query){.tenant = "default", .from_ns = 0, .to_ns = (1LL << 62) - 1},
                        &sl, &err))
        die("series", &err);
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (uint32_t i = 0; i < sl.n; i++) {
        if (sl.v[i].first_ns < first) first = sl.v[i].first_ns;
        if (sl.v[i].last_ns > last) last = sl.v[i].last_ns;
    }
    cp_series_list_close(&sl);
    if (first > last) die("empty store", NULL);
    double *t = calloc((size_t)reps, sizeof *t);
    int64_t tot = 0;
    uint32_t nsamples = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cp_profile *p = NULL;
        if (cp_store_query(
                s,
                &(cp_query){
                    .tenant = "default", .kind = CP_KIND_CPU, .from_ns = first, .to_ns = last + 1},
                &p, &err))
            die("query", &err);
        t[r] = now_s() - t0;
        tot = cp_profile_total(p, 0);
        nsamples = p->samples.n;
        cp_profile_destroy(p);
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    printf("whole_range_s %.0f\n", (double)(last - first) / 1e9);
    printf("whole_ms_median %.2f\n", t[reps / 2] * 1000);
    printf("whole_samples %u total %lld\n", nsamples, (long long)tot);
    uint64_t x = 0x2545F4914F6CDD1DULL;
    int64_t span = last - first - 86400 * SEC;
    for (int r = 0; r < reps; r++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t a = first + (span > 0 ? (int64_t)(x % (uint64_t)span) : 0) + 1234567;
        double t0 = now_s();
        cp_profile *p = NULL;
        if (cp_store_query(s,
                           &(cp_query){.tenant = "default",
                                       .kind = CP_KIND_CPU,
                                       .from_ns = a,
                                       .to_ns = a + 86400 * SEC},
                           &p, &err))
            die("query", &err);
        t[r] = now_s() - t0;
        cp_profile_destroy(p);
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    printf("day_ms_median %.2f\n", t[reps / 2] * 1000);
    printf("day_ms_max %.2f\n", t[reps - 1] * 1000);
    free(t);
    cp_store_close(s);
    return 0;
}

/* VmRSS of this process in bytes (0 if unknown). */
static long long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atoll(line + 6);
    if (f) fclose(f);
    return kb * 1024;
}

/* nseries single-stack series of kind (instance=i<k>), one window each, in batches of 512
 * windows (ingest's batch); the resident bytes the store's open rollup buckets then hold. */
static void build_series(cp_store *s, cp_kind kind, int nseries, double *bytes_per_series)
{
    cp_store_batch *b = cp_store_batch_create(s);
    cp_err err = {0};
    long long r0 = rss_bytes();
    for (int i = 0; i < nseries; i++) {
        cp_envelope e = {0};
        char inst[32];
        snprintf(inst, sizeof inst, "i%d", i);
        e.tenant = "default";
        cp_labels_set(&e.labels, "service", kind == CP_KIND_INUSE ? "heap" : "burn");
        cp_labels_set(&e.labels, "instance", inst);
        e.kind = kind;
        e.window_start_ns = BENCH_T0;
        e.window_duration_ns = 10 * SEC;
        e.producer_id = inst;
        e.sequence = 1;
        cp_profile *p = cp_synth_one_stack(kind, BENCH_T0, 1 + i % 7);
        if (cp_store_batch_add(b, &e, p, kind, &err)) die("add", &err);
        cp_profile_destroy(p);
        cp_labels_close(&e.labels);
        if (i % 512 == 511 && cp_store_batch_commit(b, &err)) die("commit", &err);
    }
    if (cp_store_batch_commit(b, &err)) die("commit", &err);
    cp_store_batch_destroy(b);
    *bytes_per_series = (double)(rss_bytes() - r0) / nseries;
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    printf("%s_open_bucket_bytes %llu\n", cp_kind_name(kind), (unsigned long long)st.bucket_bytes);
    printf("%s_open_bucket_drops %llu\n", cp_kind_name(kind), (unsigned long long)st.bucket_drops);
}

/* Median of reps merged queries of kind over every series of service svc, in ms. */
static double time_query(cp_store *s, cp_kind kind, const char *svc, int reps, int64_t *total)
{
    cp_selector sel = {0};
    cp_err err = {0};
    char text[64];
    snprintf(text, sizeof text, "{service=\"%s\"}", svc);
    if (cp_selector_parse(text, &sel, &err)) die("selector", &err);
    double t[16];
    if (reps > 16) reps = 16;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cp_profile *p = NULL;
        if (cp_store_query(s,
                           &(cp_query){.tenant = "default",
                                       .kind = kind,
                                       .sel = sel,
                                       .from_ns = BENCH_T0 - 3600 * SEC,
                                       .to_ns = BENCH_T0 + 3600 * SEC},
                           &p, &err))
            die("query", &err);
        t[r] = now_s() - t0;
        *total = cp_profile_total(p, 0);
        cp_profile_destroy(p);
    }
    cp_selector_close(&sel);
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    return t[reps / 2] * 1000;
}

/* bench_store series DIR N: N single-stack inuse series and N cpu series (the baseline) in
 * a fresh store; resident bytes per series the open rollup buckets hold after writing, and
 * the merged inuse query over all N against the cpu one over all N. BUDGET_MB: the store's
 * memory_budget (0: its default). */
static int series(const char *dir, int n, int reps, size_t budget)
{
    cp_store_options o = {.path = dir, .memory_budget = budget};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&o, &s, &err)) die("open", &err);
    double inuse_b, cpu_b;
    build_series(s, CP_KIND_INUSE, n, &inuse_b);
    build_series(s, CP_KIND_CPU, n, &cpu_b);
    printf("series %d\n", n);
    printf("rss_bytes %lld\n", rss_bytes());
    printf("inuse_rss_bytes_per_series %.0f\n", inuse_b);
    printf("cpu_rss_bytes_per_series %.0f\n", cpu_b);
    int64_t ti = 0, tc = 0;
    double qi = time_query(s, CP_KIND_INUSE, "heap", reps, &ti);
    double qc = time_query(s, CP_KIND_CPU, "burn", reps, &tc);
    printf("inuse_query_ms %.1f total %lld\n", qi, (long long)ti);
    printf("cpu_query_ms %.1f total %lld\n", qc, (long long)tc);
    printf("inuse_over_cpu %.2f\n", qi / qc);
    cp_store_close(s);
    /* cold: reopened, nothing in memory */
    if (cp_store_open(&o, &s, &err)) die("reopen", &err);
    qi = time_query(s, CP_KIND_INUSE, "heap", reps, &ti);
    qc = time_query(s, CP_KIND_CPU, "burn", reps, &tc);
    printf("reopened_inuse_query_ms %.1f\n", qi);
    printf("reopened_cpu_query_ms %.1f\n", qc);
    printf("reopened_rss_bytes %lld\n", rss_bytes());
    cp_store_close(s);
    return 0;
}

static size_t heap_bytes(void)
{
    return mallinfo2().uordblks;
}

/* bench_store forget DIR N: N series as a host's short processes make them (service,
 * host, instance = host:pid, one cpu window each), all past retention. Prints the heap a
 * series holds once the store is opened (the series table: LevelDB's block cache held to
 * 1 MiB), what retention's forgetting leaves of it, its CPU per series, and what a reopen
 * then holds. */
static int forget(const char *dir, int n)
{
    int64_t now = BENCH_T0 + 3 * 86400 * SEC;
    cp_store_options o = {.path = dir,
                          .retention_raw_ns = 3600 * SEC,
                          .retention_rollup_ns = 86400 * SEC,
                          .cache_bytes = 1u << 20};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&o, &s, &err)) die("open", &err);
    cp_store_batch *b = cp_store_batch_create(s);
    cp_profile *p = cp_synth_one_stack(CP_KIND_CPU, BENCH_T0, 3);
    for (int i = 0; i < n; i++) {
        cp_envelope e = {0};
        char inst[64];
        snprintf(inst, sizeof inst, "build-7.example.net:%d", 100000 + i);
        e.tenant = "default";
        cp_labels_set(&e.labels, "service", "cc1");
        cp_labels_set(&e.labels, "host", "build-7.example.net");
        cp_labels_set(&e.labels, "instance", inst);
        e.kind = CP_KIND_CPU;
        e.window_start_ns = BENCH_T0 + (int64_t)i * SEC / 10;
        e.window_duration_ns = 10 * SEC;
        e.producer_id = inst;
        e.sequence = 1;
        if (cp_store_batch_add(b, &e, p, 0, &err)) die("add", &err);
        cp_labels_close(&e.labels);
        if (i % 512 == 511 && cp_store_batch_commit(b, &err)) die("commit", &err);
    }
    if (cp_store_batch_commit(b, &err)) die("commit", &err);
    cp_profile_destroy(p);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    malloc_trim(0);
    size_t h0 = heap_bytes();
    if (cp_store_open(&o, &s, &err)) die("reopen", &err);
    size_t h1 = heap_bytes();
    double c0 = thread_cpu_s();
    uint32_t del;
    do
        if (cp_store_maintain(s, now, 20000, &del, &err)) die("maintain", &err);
    while (del);
    cp_store_maintain(s, now, 20000, &del, &err); /* frees what the last pass forgot */
    double c1 = thread_cpu_s();
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    malloc_trim(0);
    size_t h2 = heap_bytes();
    cp_store_close(s);
    malloc_trim(0);
    size_t h3 = heap_bytes();
    if (cp_store_open(&o, &s, &err)) die("reopen", &err);
    size_t h4 = heap_bytes();
    cp_store_stats st2;
    cp_store_get_stats(s, &st2);
    cp_store_close(s);
    printf("series %d\n", n);
    printf("forgotten %llu\n", (unsigned long long)st.series_forgotten);
    printf("heap_bytes_per_series %.0f\n", ((double)h1 - (double)h0) / n);
    printf("heap_left_per_forgotten_series %.1f\n", ((double)h2 - (double)h0) / n);
    printf("forget_cpu_us_per_series %.1f\n", (c1 - c0) * 1e6 / n);
    printf("reopened_series %llu\n", (unsigned long long)st2.series);
    printf("reopened_heap_bytes %.0f\n", (double)h4 - (double)h3);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "forget"))
        return forget(argv[2], argc > 3 ? atoi(argv[3]) : 100000);
    if (argc >= 3 && !strcmp(argv[1], "series"))
        return series(argv[2], argc > 3 ? atoi(argv[3]) : 100000, argc > 4 ? atoi(argv[4]) : 3,
                      argc > 5 ? (size_t)atol(argv[5]) << 20 : 0);
    if (argc >= 3 && !strcmp(argv[1], "build"))
        return build(argv[2], argc > 3 ? atol(argv[3]) : 60480, argc > 4 ? atoi(argv[4]) : 1);
    if (argc >= 3 && !strcmp(argv[1], "query")) return query(argv[2], argc > 3 ? atoi(argv[3]) : 9);
    fprintf(stderr, "usage: bench_store build DIR [WINDOWS [SERIES]] | query DIR [REPS] | series "
                    "DIR [N [REPS [BUDGET_MB]]] | forget DIR [N]\n");
    return 2;
}
