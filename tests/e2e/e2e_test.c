/* The end-to-end test: the demo service under the agent -> Kafka -> contprofd's ingest ->
 * store -> query API, all real processes, with a restart of contprofd in the middle. The
 * agent also writes every window it produces to files (--output-dir): they are the ground
 * truth the store's answers are compared with, window by window. See README.md for why the
 * broker runs in a process of its own. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "http_client.h"
#include "envelope.h"
#include "pprof.h"
#include "proc.h"

#define DEMO_SECONDS 34 /* long enough for an inuse window >= 20 s after start */
#define LATE_AFTER 6    /* batch-export starts then */

/* ---- processes (the generic helpers are in tests/proc.h) ------------------------------ */

typedef struct daemon {
    pid_t pid;
    int port;
    char log[512];
} daemon_t;

static void daemon_start(daemon_t *d, const char *dir, const char *brokers)
{
    char bin[512], data[512];
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(d->log, sizeof d->log, "%s/contprofd.log", dir);
    FILE *f = fopen(d->log, "a");
    CHECK(f);
    fprintf(f, "---- start\n");
    fclose(f);
    /* brokers NULL: contprofd's embedded broker */
    const char *argv[] = {
        bin, "--data", data, "--http", "127.0.0.1:0", brokers ? "--brokers" : NULL, brokers, NULL};
    d->pid = spawn(argv, d->log);
    /* the log is appended to: look for the line after the last start marker */
    static char buf[1 << 16];
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(20000)) {
        slurp(d->log, buf, sizeof buf);
        char *start = buf, *m;
        while ((m = strstr(start + 1, "---- start")))
            start = m;
        if ((m = strstr(start, "query API on http://127.0.0.1:"))) {
            d->port = atoi(m + strlen("query API on http://127.0.0.1:"));
            return;
        }
    }
    fprintf(stderr, "contprofd did not start:\n%s\n", buf);
    CHECK(0);
}

/* ---- queries ------------------------------------------------------------------------- */

static void fmt_time(int64_t ns, char *out, size_t len)
{
    snprintf(out, len, "%lld.%09lld", (long long)(ns / SEC), (long long)(ns % SEC));
}

/* The merged profile of [from, to) for selector sel, as pprof, decoded. */
static cp_profile *query(int port, const char *type, const char *sel, int64_t from, int64_t to,
                         cp_buf *raw)
{
    cp_buf pq = {0};
    char f[40], t[40];
    fmt_time(from, f, sizeof f);
    fmt_time(to, t, sizeof t);
    char head[160];
    snprintf(head, sizeof head, "/api/v1/profile?format=pprof&type=%s&from=%s&to=%s&select=", type,
             f, t);
    CHECK(cp_buf_append(&pq, head, strlen(head)) == 0);
    CHECK(cp_url_encode(&pq, sel) == 0);
    CHECK(cp_buf_append(&pq, "", 1) == 0);
    cp_buf body = http_get_ok(port, (char *)pq.data, NULL);
    cp_buf_close(&pq);
    cp_profile *p = NULL;
    cp_err err = {0};
    if (cp_pprof_decode(body.data, body.len, NULL, &p, &err)) {
        fprintf(stderr, "profile of %s: %s\n", type, err.msg);
        CHECK(0);
    }
    if (raw)
        *raw = body;
    else
        cp_buf_close(&body);
    return p;
}

static int64_t total_of(const cp_profile *p, const char *type)
{
    int t = cp_profile_find_type(p, type);
    return t < 0 ? 0 : cp_profile_total(p, (uint32_t)t);
}

/* Whether location index i (0-based) of p names fn on one of its lines. */
static int loc_names(const cp_profile *p, uint32_t i, const char *fn)
{
    const cp_location *l = &p->locations.v[i];
    for (uint32_t k = 0; k < l->nlines; k++) {
        uint32_t f = p->lines.v[l->line_off + k].function_id;
        if (f && strcmp(cp_profile_str(p, p->functions.v[f - 1].name), fn) == 0) return 1;
    }
    return 0;
}

static int stack_has(const cp_profile *p, const cp_sample *s, const char *fn)
{
    for (uint32_t i = 0; i < s->nlocs; i++)
        if (loc_names(p, p->stack.v[s->loc_off + i] - 1, fn)) return 1;
    return 0;
}

/* Sum of column type over the samples whose stack contains fn. */
static int64_t value_under(const cp_profile *p, const char *type, const char *fn)
{
    int t = cp_profile_find_type(p, type);
    CHECK(t >= 0);
    int64_t sum = 0;
    for (uint32_t i = 0; i < p->samples.n; i++)
        if (stack_has(p, &p->samples.v[i], fn)) sum += cp_profile_sample_values(p, i)[t];
    return sum;
}

/* The function with the most self (leaf) value of column type, and that value. */
static const char *top_self(const cp_profile *p, const char *type, int64_t *out)
{
    int t = cp_profile_find_type(p, type);
    CHECK(t >= 0);
    int64_t *self = calloc(p->functions.n + 1, sizeof *self);
    CHECK(self);
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        if (!s->nlocs) continue;
        const cp_location *l = &p->locations.v[p->stack.v[s->loc_off] - 1];
        if (l->nlines)
            self[p->lines.v[l->line_off].function_id] += cp_profile_sample_values(p, i)[t];
    }
    uint32_t best = 0;
    for (uint32_t f = 1; f <= p->functions.n; f++)
        if (self[f] > self[best]) best = f;
    *out = self[best];
    free(self);
    return best ? cp_profile_str(p, p->functions.v[best - 1].name) : "";
}

/* ---- ground truth: the agent's own files --------------------------------------------- */

typedef struct window_file {
    int kind;
    char isolate[64];
    int64_t start, duration;
    int64_t v0, v1; /* totals of the two sample types (samples/cpu, objects/bytes) */
} window_file;

typedef struct truth {
    window_file *w;
    size_t n;
    int64_t first_start, last_end;
} truth;

/* Reads every window the agent wrote to dir: <service>.<pid>.<seq>.<kind>.<isolate>.pb.gz */
static void truth_load(truth *t, const char *dir)
{
    memset(t, 0, sizeof *t);
    DIR *d = opendir(dir);
    CHECK(d);
    struct dirent *e;
    size_t cap = 0;
    t->first_start = INT64_MAX;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl < 7 || strcmp(e->d_name + nl - 6, ".pb.gz") != 0) continue;
        char name[256], *parts[6] = {0};
        snprintf(name, sizeof name, "%s", e->d_name);
        int np = 0;
        for (char *sv, *tok = strtok_r(name, ".", &sv); tok && np < 6;
             tok = strtok_r(NULL, ".", &sv))
            parts[np++] = tok;
        CHECK(np == 6);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        cp_buf b = {0};
        CHECK(cp_read_file(path, &b, NULL) == 0);
        cp_profile *p = NULL;
        cp_err err = {0};
        if (cp_pprof_decode(b.data, b.len, NULL, &p, &err)) {
            fprintf(stderr, "%s: %s\n", path, err.msg);
            CHECK(0);
        }
        cp_buf_close(&b);
        if (t->n == cap) {
            cap = cap ? 2 * cap : 256;
            t->w = realloc(t->w, cap * sizeof *t->w);
            CHECK(t->w);
        }
        window_file *w = &t->w[t->n++];
        w->kind = cp_kind_parse(parts[3]);
        CHECK(w->kind);
        snprintf(w->isolate, sizeof w->isolate, "%s", parts[4]);
        w->start = p->time_nanos;
        w->duration = p->duration_nanos;
        w->v0 = cp_profile_total(p, 0);
        w->v1 = cp_profile_total(p, 1);
        if (w->start < t->first_start) t->first_start = w->start;
        if (w->start + w->duration > t->last_end) t->last_end = w->start + w->duration;
        cp_profile_destroy(p);
    }
    closedir(d);
}

static void truth_sum(const truth *t, int kind, int64_t from, int64_t to, int64_t *v0, int64_t *v1)
{
    *v0 = *v1 = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->w[i].kind == kind && t->w[i].start >= from && t->w[i].start < to) {
            *v0 += t->w[i].v0;
            *v1 += t->w[i].v1;
        }
}

static size_t count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".pb.gz") && !strstr(e->d_name, ".tmp");
    closedir(d);
    return n;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* `go tool pprof -top` on file: the "of N total" number for sample index si. */
static long long go_pprof_total(const char *file, const char *si)
{
    char cmd[1400], out[8192];
    snprintf(cmd, sizeof cmd, "go tool pprof -sample_index=%s -top -nodecount=1 %s 2>&1", si, file);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    if (rc != 0) fprintf(stderr, "%s:\n%s\n", cmd, out);
    CHECK(rc == 0);
    const char *m = strstr(out, "% of ");
    if (!m) fprintf(stderr, "%s:\n%s\n", cmd, out);
    CHECK(m);
    return atoll(m + 5);
}

/* ---- the test ------------------------------------------------------------------------ */

/* The three kinds of profile the demo's windows hold: kind, type, its two value types. */
static const struct {
    int kind;
    const char *name, *t0, *t1;
} kinds[] = {{CP_KIND_CPU, "cpu", "samples", "cpu"},
             {CP_KIND_ALLOC, "alloc", "alloc_objects", "alloc_space"},
             {CP_KIND_INUSE, "inuse", "inuse_objects", "inuse_space"}};

/* Window by window (starts[0..nu), each kind, the store on port against the agent's files t)
 * and then the export of [from, to) in our decoder and in go tool pprof (written to dir):
 * equal. */
static void check_windows_equal_the_files(int port, const char *dir, const truth *tp,
                                          const char *svc, const int64_t *starts, size_t nu,
                                          int64_t from, int64_t to)
{
    int64_t sum_windows[3][2] = {{0}};
    for (size_t i = 0; i < nu; i++)
        for (int k = 0; k < 3; k++) {
            cp_profile *p = query(port, kinds[k].name, svc, starts[i] - SEC / 2000,
                                  starts[i] + SEC / 2000, NULL);
            int64_t w0, w1;
            truth_sum(tp, kinds[k].kind, starts[i] - SEC / 2000, starts[i] + SEC / 2000, &w0, &w1);
            int64_t s0 = total_of(p, kinds[k].t0), s1 = total_of(p, kinds[k].t1);
            if (s0 != w0 || s1 != w1)
                fprintf(stderr, "window %zu (start %lld) %s: store %lld/%lld, agent %lld/%lld\n", i,
                        (long long)starts[i], kinds[k].name, (long long)s0, (long long)s1,
                        (long long)w0, (long long)w1);
            CHECK_EQ(s0, w0);
            CHECK_EQ(s1, w1);
            sum_windows[k][0] += s0;
            sum_windows[k][1] += s1;
            cp_profile_destroy(p);
        }
    fprintf(stderr, "e2e: %zu windows, each equal to the agent's files\n", nu);

    /* The exported pprof of the whole run: its totals are the sum of the windows, in our
     * decoder and in `go tool pprof`. */
    for (int k = 0; k < 2; k++) {
        cp_buf raw;
        cp_profile *p = query(port, kinds[k].name, svc, from, to, &raw);
        CHECK_EQ(total_of(p, kinds[k].t0), sum_windows[k][0]);
        CHECK_EQ(total_of(p, kinds[k].t1), sum_windows[k][1]);
        char path[700];
        snprintf(path, sizeof path, "%s/%s.pb.gz", dir, kinds[k].name);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(raw.data, 1, raw.len, f) == raw.len);
        fclose(f);
        cp_buf_close(&raw);
        CHECK_EQ(go_pprof_total(path, kinds[k].t0), sum_windows[k][0]);
        cp_profile_destroy(p);
    }
    fprintf(stderr, "e2e: go tool pprof totals equal the sum of the windows\n");
}

/* The demo's planted problems in the store on port: the hot function, the allocating one,
 * the start-up allocation still in use 20 s later (starts[0..nu): the windows' starts,
 * first: the run's first start), one isolate selected alone, the late isolate. */
static void check_planted_problems(int port, const char *svc, const int64_t *starts, size_t nu,
                                   int64_t first, int64_t from, int64_t to)
{
    /* The planted problems. */
    cp_profile *cpu = query(port, "cpu", svc, from, to, NULL);
    int64_t self;
    const char *top = top_self(cpu, "cpu", &self);
    fprintf(stderr, "e2e: top self-CPU %s (%.0f%%)\n", top, 100.0 * self / total_of(cpu, "cpu"));
    CHECK_STREQ(top, "json_replacer");
    CHECK(value_under(cpu, "cpu", "metrics_report") > 0);
    cp_profile_destroy(cpu);

    cp_profile *alloc = query(port, "alloc", svc, from, to, NULL);
    int64_t span = value_under(alloc, "alloc_space", "trace_span_record");
    int64_t all = total_of(alloc, "alloc_space");
    fprintf(stderr, "e2e: trace_span_record allocated %.0f%% of alloc_space\n", 100.0 * span / all);
    CHECK(span * 2 > all);
    cp_profile_destroy(alloc);

    /* The start-up allocation, in the inuse answer of a window at least 20 s after start. */
    size_t late_w = 0;
    while (late_w < nu && starts[late_w] < first + 20 * SEC)
        late_w++;
    CHECK(late_w < nu);
    cp_profile *inuse =
        query(port, "inuse", svc, starts[late_w] - SEC / 2000, starts[late_w] + SEC / 2000, NULL);
    int64_t geo = value_under(inuse, "inuse_space", "geo_table_load");
    fprintf(stderr, "e2e: %.1f s after start, geo_table_load holds %.1f MiB in use\n",
            (double)(starts[late_w] - first) / SEC, geo / 1048576.0);
    CHECK(llabs(geo - (64LL << 20)) < (64LL << 20) / 10);
    cp_profile_destroy(inuse);

    /* One isolate selected: only its frames. */
    cp_profile *m = query(port, "cpu", "{service=\"e2e\",isolate=\"metrics\"}", from, to, NULL);
    CHECK(value_under(m, "cpu", "metrics_snapshot") > 0);
    static const char *const others[] = {"json_replacer",     "http_worker_main",
                                         "trace_span_record", "export_compress_batch",
                                         "batch_export_main", "main"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        if (value_under(m, "cpu", others[i]) != 0) fprintf(stderr, "metrics has %s\n", others[i]);
        CHECK_EQ(value_under(m, "cpu", others[i]), 0);
    }
    cp_profile_destroy(m);

    /* The late isolate: nothing before it was created, its own work after. */
    const char *late_sel = "{service=\"e2e\",isolate=\"batch-export\"}";
    cp_profile *early = query(port, "cpu", late_sel, from, from + (LATE_AFTER - 2) * SEC, NULL);
    CHECK_EQ(total_of(early, "cpu"), 0);
    cp_profile_destroy(early);
    cp_profile *lp = query(port, "cpu", late_sel, from, to, NULL);
    CHECK(value_under(lp, "cpu", "export_compress_batch") > 0);
    CHECK_EQ(value_under(lp, "cpu", "json_replacer"), 0);
    cp_profile_destroy(lp);
}

TEST(demo_through_the_whole_pipeline)
{
    char dir[] = "/tmp/contprof-e2e-XXXXXX";
    CHECK(mkdtemp(dir));
    char files[600], blog[600], alog[600];
    snprintf(files, sizeof files, "%s/windows", dir);
    snprintf(blog, sizeof blog, "%s/broker.log", dir);
    snprintf(alog, sizeof alog, "%s/demo.log", dir);
    fprintf(stderr, "e2e: working in %s\n", dir);

    /* The broker, in a process of its own so that it outlives contprofd's restart. */
    char bbin[512];
    snprintf(bbin, sizeof bbin, "%s/tests/e2e/e2e_broker", bindir());
    const char *bargv[] = {bbin, NULL};
    pid_t broker = spawn(bargv, blog);
    char brokers[256];
    sscanf(wait_for_log(broker, blog, "bootstrap ", 20), "%255s", brokers);

    daemon_t d = {0};
    daemon_start(&d, dir, brokers);

    /* The demo service under the agent: Kafka, and files as the ground truth. */
    char cbin[512], dbin[512], dur[16], late[16];
    snprintf(cbin, sizeof cbin, "%s/query/contprof", bindir());
    snprintf(dbin, sizeof dbin, "%s/tests/demo/demo_service", bindir());
    snprintf(dur, sizeof dur, "%d", DEMO_SECONDS);
    snprintf(late, sizeof late, "%d", LATE_AFTER);
    const char *aargv[] = {cbin,         "run", "--brokers",    brokers, "--service", "e2e",
                           "--window",   "2s",  "--output-dir", files,   "--",        dbin,
                           "--duration", dur,   "--late-after", late,    NULL};
    int64_t t_demo = mono_ns();
    pid_t demo = spawn(aargv, alog);

    /* The first profiles become queryable. */
    int64_t t_first = 0;
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end && !t_first; usleep(200000)) {
        cp_buf b = http_get_ok(d.port, "/api/v1/series?from=-10m&to=now", NULL);
        if (strstr((char *)b.data, "\"service\":\"e2e\"")) t_first = mono_ns();
        cp_buf_close(&b);
    }
    CHECK(t_first);
    fprintf(stderr, "e2e: first profiles queryable %.1f s after the demo started\n",
            (double)(t_first - t_demo) / SEC);

    /* Restart contprofd in the middle: stop it cleanly, let the agent produce at least two
     * windows into the broker meanwhile, start it again on the same data directory. */
    while (mono_ns() - t_demo < 12 * SEC)
        usleep(100000);
    kill(d.pid, SIGTERM);
    CHECK_EQ(wait_exit(d.pid, 30), 0);
    size_t at_stop = count_files(files);
    for (int64_t end = mono_ns() + 20 * SEC; mono_ns() < end; usleep(100000))
        if (count_files(files) >= at_stop + 2 * 3) break; /* 2 windows x 3 kinds */
    CHECK(count_files(files) >= at_stop + 6);
    daemon_start(&d, dir, brokers);

    CHECK_EQ(wait_exit(demo, DEMO_SECONDS + 60), 0);
    truth t;
    truth_load(&t, files);
    fprintf(stderr, "e2e: the agent wrote %zu windows from %lld to %lld\n", t.n,
            (long long)t.first_start, (long long)t.last_end);
    CHECK(t.n > 0);
    const char *svc = "{service=\"e2e\"}";
    int64_t from = t.first_start, to = t.last_end;

    /* Loses nothing: once ingest has caught up, every window is in the store exactly once
     * (polled: bounded, because ingest of the last windows may still be under way). */
    int64_t want_cpu, want_samples, store_cpu = -1;
    truth_sum(&t, CP_KIND_CPU, from, to, &want_samples, &want_cpu);
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(250000)) {
        cp_profile *p = query(d.port, "cpu", svc, from, to, NULL);
        store_cpu = total_of(p, "cpu");
        cp_profile_destroy(p);
        if (store_cpu == want_cpu) break;
    }
    fprintf(stderr, "e2e: cpu ns: agent %lld, store %lld\n", (long long)want_cpu,
            (long long)store_cpu);
    CHECK_EQ(store_cpu, want_cpu);

    /* Window by window, each kind: the store's answer equals the agent's files. Windows
     * share their start across isolates; a query of [start - 0.5 ms, start + 0.5 ms) holds
     * exactly one window of each isolate. */
    int64_t *starts = malloc(t.n * sizeof *starts);
    CHECK(starts);
    size_t ns = 0;
    for (size_t i = 0; i < t.n; i++)
        starts[ns++] = t.w[i].start;
    qsort(starts, ns, sizeof *starts, cmp_i64);
    size_t nu = 0;
    for (size_t i = 0; i < ns; i++)
        if (!nu || starts[i] != starts[nu - 1]) starts[nu++] = starts[i];
    check_windows_equal_the_files(d.port, dir, &t, svc, starts, nu, from, to);

    check_planted_problems(d.port, svc, starts, nu, t.first_start, from, to);

    /* The agent keeps each stream's tables between windows, so the restarted daemon's
     * writer found stacks of later windows in its per-series caches; the window-by-window
     * check above shows they were stored as the agent sent them. */
    long long hits = http_metric(d.port, "contprof_store_stack_cache_hits_total", NULL);
    long long misses = http_metric(d.port, "contprof_store_stack_cache_misses_total", NULL);
    fprintf(stderr, "e2e: the writer's stack caches: %lld hits, %lld misses\n", hits, misses);
    CHECK(hits > 0);
    CHECK(misses > 0);

    kill(d.pid, SIGTERM);
    CHECK_EQ(wait_exit(d.pid, 30), 0);
    kill(broker, SIGTERM);
    CHECK_EQ(wait_exit(broker, 30), 0);
    free(starts);
    free(t.w);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* The README's demo run twice on one data directory, with contprofd's embedded broker:
 * the second broker starts empty while the store holds the first one's offsets. Every
 * window of each run must arrive (none skipped as "already stored"). */
TEST(rerun_with_the_embedded_broker_loses_nothing)
{
    char dir[] = "/tmp/contprof-rerun-XXXXXX";
    CHECK(mkdtemp(dir));
    char cbin[512], dbin[512];
    snprintf(cbin, sizeof cbin, "%s/query/contprof", bindir());
    snprintf(dbin, sizeof dbin, "%s/tests/demo/demo_service", bindir());
    for (int run = 1; run <= 2; run++) {
        daemon_t d = {0};
        daemon_start(&d, dir, NULL);
        char url[64], files[600], alog[600];
        snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
        snprintf(files, sizeof files, "%s/windows-%d", dir, run);
        snprintf(alog, sizeof alog, "%s/demo-%d.log", dir, run);
        const char *aargv[] = {
            cbin,           "run", "--server", url,  "--service",  "rerun", "--window", "1s",
            "--output-dir", files, "--",       dbin, "--duration", "6",     NULL};
        pid_t demo = spawn(aargv, alog);
        CHECK_EQ(wait_exit(demo, 60), 0);
        truth t;
        truth_load(&t, files);
        CHECK(t.n > 0);
        int64_t want_samples, want_cpu, got = -1;
        truth_sum(&t, CP_KIND_CPU, t.first_start, t.last_end, &want_samples, &want_cpu);
        char sel[128];
        snprintf(sel, sizeof sel, "{service=\"rerun\",instance=~\".*:%d\"}", (int)demo);
        for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(250000)) {
            cp_profile *p = query(d.port, "cpu", sel, t.first_start, t.last_end, NULL);
            got = total_of(p, "cpu");
            cp_profile_destroy(p);
            if (got == want_cpu) break;
        }
        fprintf(stderr, "rerun %d: %zu windows, cpu ns: agent %lld, store %lld\n", run, t.n,
                (long long)want_cpu, (long long)got);
        CHECK_EQ(got, want_cpu);
        int64_t want_objs, want_bytes;
        truth_sum(&t, CP_KIND_ALLOC, t.first_start, t.last_end, &want_objs, &want_bytes);
        cp_profile *p = query(d.port, "alloc", sel, t.first_start, t.last_end, NULL);
        CHECK_EQ(total_of(p, "alloc_space"), want_bytes);
        cp_profile_destroy(p);
        free(t.w);
        kill(d.pid, SIGTERM);
        CHECK_EQ(wait_exit(d.pid, 30), 0);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* ---- a fleet: two processes of one stripped binary ------------------------------------ */

/* The body of GET pq, NUL-terminated. */
static char *get_text(int port, const char *pq)
{
    cp_buf b = http_get_ok(port, pq, NULL);
    return (char *)b.data;
}

/* GET /api/v1/PATH?...&select=SEL over [from, to) (PATH carries its own parameters). */
static char *api_text(int port, const char *path, const char *sel, int64_t from, int64_t to)
{
    cp_buf pq = {0};
    char f[40], t[40], head[400];
    fmt_time(from, f, sizeof f);
    fmt_time(to, t, sizeof t);
    snprintf(head, sizeof head, "/api/v1/%s&from=%s&to=%s&select=", path, f, t);
    CHECK(cp_buf_append(&pq, head, strlen(head)) == 0);
    CHECK(cp_url_encode(&pq, sel) == 0);
    CHECK(cp_buf_append(&pq, "", 1) == 0);
    char *body = get_text(port, (char *)pq.data);
    cp_buf_close(&pq);
    return body;
}

/* A bare address where a name belongs: "0x" and hex digits as a whole frame or word, not
 * after a module's "+". Prints where it is and fails. */
static void check_no_bare_address(const char *what, const char *text)
{
    for (const char *p = strstr(text, "0x"); p; p = strstr(p + 2, "0x")) {
        if (p > text &&
            (p[-1] == '+' || (p[-1] >= '0' && p[-1] <= '9') || (p[-1] >= 'a' && p[-1] <= 'z') ||
             (p[-1] >= 'A' && p[-1] <= 'Z') || p[-1] == '_'))
            continue;
        size_t n = strspn(p + 2, "0123456789abcdef");
        if (!n) continue;
        int ctx = (int)(p - text > 80 ? 80 : p - text);
        fprintf(stderr, "%s: a bare address: ...%.*s\n", what, ctx + (int)n + 2, p - ctx);
        CHECK(0);
    }
}

/* Frame sums of a folded profile: per root frame (first) and per leaf frame (last). */
typedef struct fsum {
    char name[200];
    int64_t v;
} fsum;

typedef struct folded {
    fsum root[64], leaf[256];
    int nroot, nleaf;
    int64_t total;
} folded;

static void fsum_add(fsum *a, int *n, int cap, const char *name, size_t len, int64_t v)
{
    char nm[200];
    snprintf(nm, sizeof nm, "%.*s", (int)len, name);
    for (int i = 0; i < *n; i++)
        if (!strcmp(a[i].name, nm)) {
            a[i].v += v;
            return;
        }
    CHECK(*n < cap);
    snprintf(a[*n].name, sizeof a[*n].name, "%s", nm);
    a[(*n)++].v = v;
}

static void folded_parse(const char *text, folded *f)
{
    memset(f, 0, sizeof *f);
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n'), *end = nl ? nl : line + strlen(line);
        const char *sp = end;
        while (sp > line && sp[-1] != ' ')
            sp--;
        CHECK(sp > line);
        int64_t v = atoll(sp);
        const char *stack_end = sp - 1, *semi = memchr(line, ';', (size_t)(stack_end - line));
        const char *leaf = stack_end;
        while (leaf > line && leaf[-1] != ';')
            leaf--;
        fsum_add(f->root, &f->nroot, 64, line, (size_t)((semi ? semi : stack_end) - line), v);
        fsum_add(f->leaf, &f->nleaf, 256, leaf, (size_t)(stack_end - leaf), v);
        f->total += v;
        line = nl ? nl + 1 : end;
    }
}

static const fsum *fsum_find(const fsum *a, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(a[i].name, name)) return &a[i];
    return NULL;
}

/* Roots with at least 5% of the total: the same names in a and b. */
static int heavy_roots_equal(const folded *a, const folded *b)
{
    for (int k = 0; k < 2; k++) {
        const folded *x = k ? b : a, *y = k ? a : b;
        for (int i = 0; i < x->nroot; i++) {
            if (x->root[i].v * 20 < x->total) continue;
            const fsum *o = fsum_find(y->root, y->nroot, x->root[i].name);
            if (!o || o->v * 20 < y->total) {
                fprintf(stderr, "root %s (%lld of %lld) is not a heavy root of the other\n",
                        x->root[i].name, (long long)x->root[i].v, (long long)x->total);
                return 0;
            }
        }
    }
    return 1;
}

static const fsum *top_leaf(const folded *f)
{
    const fsum *best = NULL;
    for (int i = 0; i < f->nleaf; i++)
        if (!best || f->leaf[i].v > best->v) best = &f->leaf[i];
    CHECK(best);
    return best;
}

/* `go tool pprof` reads file: -top and -traces exit 0 and print the profile. */
static void go_pprof_reads(const char *file)
{
    static const char *const views[] = {"-top", "-traces"};
    for (int i = 0; i < 2; i++) {
        char cmd[1400], out[4096];
        snprintf(cmd, sizeof cmd, "go tool pprof %s %s 2>&1", views[i], file);
        FILE *p = popen(cmd, "r");
        CHECK(p);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        while (fread(cmd, 1, sizeof cmd, p) > 0) {
        }
        int rc = pclose(p);
        if (rc != 0 || !strstr(out, i ? "-----------" : "% of ")) {
            fprintf(stderr, "go tool pprof %s %s: exit %d\n%s\n", views[i], file, rc, out);
            CHECK(0);
        }
    }
}

/* pprof identity of the export: no two mappings of one object and offset, no two locations
 * of one object at one file offset, and every address inside its mapping. */
static void check_export_identity(const cp_profile *p)
{
    for (uint32_t i = 0; i < p->mappings.n; i++)
        for (uint32_t j = i + 1; j < p->mappings.n; j++) {
            const cp_mapping *a = &p->mappings.v[i], *b = &p->mappings.v[j];
            CHECK(!(a->offset == b->offset &&
                    !strcmp(cp_profile_str(p, a->filename), cp_profile_str(p, b->filename)) &&
                    !strcmp(cp_profile_str(p, a->build_id), cp_profile_str(p, b->build_id))));
        }
    uint32_t n = p->locations.n;
    uint64_t *key = calloc(n + 1, sizeof *key);
    CHECK(key);
    for (uint32_t i = 0; i < n; i++) {
        const cp_location *l = &p->locations.v[i];
        if (!l->mapping_id) continue;
        const cp_mapping *m = &p->mappings.v[l->mapping_id - 1];
        CHECK(l->address >= m->start && l->address < m->limit);
        key[i] = (uint64_t)l->mapping_id << 40 ^ (l->address - m->start + m->offset);
        for (uint32_t j = 0; j < i; j++)
            if (key[j] == key[i] && p->locations.v[j].nlines == l->nlines && !l->nlines) {
                fprintf(stderr, "two locations of one object at file offset 0x%llx\n",
                        (unsigned long long)(l->address - m->start + m->offset));
                CHECK(0);
            }
    }
    free(key);
}

/* Loads the windows two processes wrote to files[0] and files[1] into t, and the span
 * [from, to) they cover. */
static void truth_load_fleet(truth t[2], char files[2][600], int64_t *from, int64_t *to)
{
    *from = INT64_MAX;
    *to = 0;
    for (int i = 0; i < 2; i++) {
        truth_load(&t[i], files[i]);
        CHECK(t[i].n > 0);
        if (t[i].first_start < *from) *from = t[i].first_start;
        if (t[i].last_end > *to) *to = t[i].last_end;
    }
}

/* The CPU total of sel over [from, to), asked until it is want (at most 60 s). */
static int64_t cpu_total_when_stored(int port, const char *sel, int64_t from, int64_t to,
                                     int64_t want)
{
    int64_t got = -1;
    for (int64_t end = mono_ns() + 60 * SEC; mono_ns() < end && got != want; usleep(250000)) {
        cp_profile *p = query(port, "cpu", sel, from, to, NULL);
        got = total_of(p, "cpu");
        cp_profile_destroy(p);
    }
    return got;
}

/* A test's working directory (dir: a mkdtemp template) and its contprofd; url and cbin get
 * the daemon's URL and the contprof CLI's path. */
static void start_in_tmp(char *dir, const char *what, daemon_t *d, char url[64], char cbin[512])
{
    CHECK(mkdtemp(dir));
    fprintf(stderr, "%s: working in %s\n", what, dir);
    daemon_start(d, dir, NULL);
    snprintf(url, 64, "http://127.0.0.1:%d", d->port);
    snprintf(cbin, 512, "%s/query/contprof", bindir());
}

/* Every export of the fleet (each process, sel[0..2), and all): pprof's identity holds and
 * go tool pprof reads it (files in dir); the diff of sel[0] against sel[1] as pprof too. */
static void check_fleet_exports(int port, const char *dir, char sel[2][128], const char *all,
                                int64_t from, int64_t to)
{
    /* every export: pprof's identity holds and go tool pprof reads it */
    const char *exports[4] = {sel[0], sel[1], all, NULL};
    for (int i = 0; exports[i]; i++) {
        cp_buf raw;
        cp_profile *p = query(port, "cpu", exports[i], from, to, &raw);
        check_export_identity(p);
        cp_profile_destroy(p);
        char path[700];
        snprintf(path, sizeof path, "%s/export-%d.pb.gz", dir, i);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(raw.data, 1, raw.len, f) == raw.len);
        fclose(f);
        cp_buf_close(&raw);
        go_pprof_reads(path);
    }
    /* the diff as pprof (target minus base) */
    {
        cp_buf pq = {0};
        CHECK(cp_buf_append(&pq, "diff?format=pprof&type=cpu&base_select=", 39) == 0);
        CHECK(cp_url_encode(&pq, sel[1]) == 0);
        CHECK(cp_buf_append(&pq, "", 1) == 0);
        char f0[40], t0[40], head[200];
        fmt_time(from, f0, sizeof f0);
        fmt_time(to, t0, sizeof t0);
        cp_buf full = {0};
        snprintf(head, sizeof head, "/api/v1/%s&from=%s&to=%s&select=", (char *)pq.data, f0, t0);
        CHECK(cp_buf_append(&full, head, strlen(head)) == 0);
        CHECK(cp_url_encode(&full, sel[0]) == 0);
        CHECK(cp_buf_append(&full, "", 1) == 0);
        cp_buf raw = http_get_ok(port, (char *)full.data, NULL);
        char path[700];
        snprintf(path, sizeof path, "%s/diff.pb.gz", dir);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(raw.data, 1, raw.len, f) == raw.len);
        fclose(f);
        cp_buf_close(&raw);
        cp_buf_close(&full);
        cp_buf_close(&pq);
        go_pprof_reads(path);
    }
}

/* The agent's own windows of both processes (files[0..2)), merged by `contprof merge` (cbin):
 * pprof's identity, the total want, go tool pprof reads it; as folded text, names (leaf among
 * them), never bare addresses. */
static void check_contprof_merge(const char *cbin, const char *dir, char files[2][600],
                                 int64_t want, const char *leaf)
{
    char cmd[4096];
    char merged[700];
    snprintf(merged, sizeof merged, "%s/merged.pb.gz", dir);
    snprintf(cmd, sizeof cmd, "%s merge -o %s %s/*.cpu.*.pb.gz %s/*.cpu.*.pb.gz", cbin, merged,
             files[0], files[1]);
    CHECK_EQ(system(cmd), 0);
    cp_buf mb = {0};
    CHECK(cp_read_file(merged, &mb, NULL) == 0);
    cp_profile *mp = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_pprof_decode(mb.data, mb.len, NULL, &mp, &err), 0);
    check_export_identity(mp);
    CHECK_EQ(total_of(mp, "cpu"), want);
    cp_profile_destroy(mp);
    cp_buf_close(&mb);
    go_pprof_reads(merged);
    snprintf(cmd, sizeof cmd,
             "%s merge --format folded %s/*.cpu.*.pb.gz %s/*.cpu.*.pb.gz > %s/m.txt", cbin,
             files[0], files[1], dir);
    CHECK_EQ(system(cmd), 0);
    char mt[700];
    snprintf(mt, sizeof mt, "%s/m.txt", dir);
    CHECK(cp_read_file(mt, &mb, NULL) == 0);
    CHECK(cp_buf_append(&mb, "", 1) == 0);
    check_no_bare_address("contprof merge --format folded", (char *)mb.data);
    CHECK(strstr((char *)mb.data, leaf));
    cp_buf_close(&mb);
}

/* Stops the daemon (SIGTERM, exit 0 within 60 s) and removes dir. */
static void finish_in_tmp(daemon_t *d, const char *dir)
{
    kill(d->pid, SIGTERM);
    CHECK_EQ(wait_exit(d->pid, 60), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST(fleet_of_one_stripped_binary_merges)
{
    char dir[] = "/tmp/contprof-fleet-XXXXXX", url[64], cbin[512], wbin[512];
    daemon_t d = {0};
    start_in_tmp(dir, "fleet", &d, url, cbin);
    snprintf(wbin, sizeof wbin, "%s/tests/e2e/fleet_work", bindir());

    /* the binary is stripped: no symbol table, nothing to name its functions by */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "readelf -S %s | grep -q '\\.symtab'", wbin);
    CHECK(system(cmd) != 0);

    /* two processes of it at once, each under the agent, to one contprofd */
    char files[2][600], logs[2][600];
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        snprintf(files[i], sizeof files[i], "%s/windows-%d", dir, i);
        snprintf(logs[i], sizeof logs[i], "%s/work-%d.log", dir, i);
        const char *argv[] = {cbin,       "run", "--server",     url,      "--service", "fleet",
                              "--window", "1s",  "--output-dir", files[i], "--",        wbin,
                              "6",        NULL};
        pid[i] = spawn(argv, logs[i]);
    }
    for (int i = 0; i < 2; i++)
        CHECK_EQ(wait_exit(pid[i], 90), 0);
    truth t[2];
    int64_t from, to, want = 0;
    truth_load_fleet(t, files, &from, &to);
    for (int i = 0; i < 2; i++) {
        int64_t s, c;
        truth_sum(&t[i], CP_KIND_CPU, from, to, &s, &c);
        want += c;
    }
    const char *all = "{service=\"fleet\"}";
    CHECK_EQ(cpu_total_when_stored(d.port, all, from, to, want), want);

    /* folded, per process and merged */
    char sel[2][128];
    folded fp[2], fm;
    for (int i = 0; i < 2; i++) {
        snprintf(sel[i], sizeof sel[i], "{service=\"fleet\",instance=~\".*:%d\"}", (int)pid[i]);
        char *text = api_text(d.port, "profile?format=folded&type=cpu", sel[i], from, to);
        check_no_bare_address("folded", text);
        folded_parse(text, &fp[i]);
        free(text);
        CHECK(fp[i].total > 0);
    }
    char *text = api_text(d.port, "profile?format=folded&type=cpu", all, from, to);
    check_no_bare_address("folded", text);
    folded_parse(text, &fm);
    free(text);
    CHECK_EQ(fm.total, fp[0].total + fp[1].total);
    /* the same frames: the hottest leaf is a module+offset name hot in both processes, the
     * heavy roots are the same in each process and in the merge (not one per process) */
    const fsum *l0 = top_leaf(&fp[0]), *l1 = top_leaf(&fp[1]);
    fprintf(stderr, "fleet: hottest leaf %s / %s; roots %d, %d, merged %d\n", l0->name, l1->name,
            fp[0].nroot, fp[1].nroot, fm.nroot);
    CHECK(!strncmp(l0->name, "fleet_work+0x", 13));
    /* (a neighbouring instruction of the same loop may lead by a few samples) */
    const fsum *in1 = fsum_find(fp[1].leaf, fp[1].nleaf, l0->name);
    CHECK(in1 && in1->v * 4 >= l1->v);
    CHECK(heavy_roots_equal(&fp[0], &fp[1]));
    CHECK(heavy_roots_equal(&fp[0], &fm));
    for (int i = 0; i < fm.nroot; i++) {
        const fsum *a = fsum_find(fp[0].root, fp[0].nroot, fm.root[i].name);
        const fsum *b = fsum_find(fp[1].root, fp[1].nroot, fm.root[i].name);
        CHECK(a || b);
        CHECK_EQ(fm.root[i].v, (a ? a->v : 0) + (b ? b->v : 0));
    }

    /* top, JSON, diff: names, never bare addresses */
    static const char *const views[] = {"profile?format=top&type=cpu",
                                        "profile?format=json&type=cpu", NULL};
    for (int i = 0; views[i]; i++) {
        text = api_text(d.port, views[i], all, from, to);
        check_no_bare_address(views[i], text);
        CHECK(strstr(text, "fleet_work+0x"));
        free(text);
    }
    {
        cp_buf pq = {0};
        CHECK(cp_buf_append(&pq, "diff?format=json&type=cpu&base_select=", 38) == 0);
        CHECK(cp_url_encode(&pq, sel[1]) == 0);
        CHECK(cp_buf_append(&pq, "", 1) == 0);
        text = api_text(d.port, (char *)pq.data, sel[0], from, to);
        check_no_bare_address("diff", text);
        CHECK(strstr(text, l0->name));
        free(text);
        cp_buf_close(&pq);
    }

    check_fleet_exports(d.port, dir, sel, all, from, to);
    check_contprof_merge(cbin, dir, files, want, l0->name);

    kill(d.pid, SIGTERM);
    CHECK_EQ(wait_exit(d.pid, 30), 0);
    free(t[0].w);
    free(t[1].w);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* With tokens, the agent signs its envelopes with CONTPROF_TOKEN: windows of a program run
 * with its tenant's token are stored; those of one run with another tenant's token (it may
 * ask for the brokers, but not write as alpha) go to the DLQ with reason "tenant". */
TEST(agent_signs_for_its_tenant)
{
    char dir[] = "/tmp/contprof-tenant-XXXXXX";
    CHECK(mkdtemp(dir));
    char bin[512], conf[600], data[600], cbin[512], dbin[512];
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    snprintf(cbin, sizeof cbin, "%s/query/contprof", bindir());
    snprintf(dbin, sizeof dbin, "%s/tests/demo/demo_service", bindir());
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    FILE *cf = fopen(conf, "w");
    CHECK(cf);
    fprintf(cf, "token.alpha = alpha-secret-1\ntoken.beta = beta-secret-2\n");
    fclose(cf);
    daemon_t d = {0};
    snprintf(d.log, sizeof d.log, "%s/contprofd.log", dir);
    const char *argv[] = {bin, "--config", conf, "--data", data, "--http", "127.0.0.1:0", NULL};
    d.pid = spawn(argv, d.log);
    static char buf[1 << 16];
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end && !d.port; usleep(20000)) {
        slurp(d.log, buf, sizeof buf);
        char *m = strstr(buf, "query API on http://127.0.0.1:");
        if (m) d.port = atoi(m + strlen("query API on http://127.0.0.1:"));
    }
    CHECK(d.port > 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
    const char *runs[2][2] = {{"signed", "alpha-secret-1"}, {"forged", "beta-secret-2"}};
    for (int i = 0; i < 2; i++) {
        char alog[700];
        snprintf(alog, sizeof alog, "%s/demo-%s.log", dir, runs[i][0]);
        const char *aargv[] = {cbin,      "run",      "--server",   url,        "--tenant", "alpha",
                               "--token", runs[i][1], "--service",  runs[i][0], "--window", "1s",
                               "--",      dbin,       "--duration", "3",        NULL};
        pid_t demo = spawn(aargv, alog);
        CHECK_EQ(wait_exit(demo, 60), 0);
    }
    int ok = 0;
    for (int64_t end = mono_ns() + 60 * SEC; mono_ns() < end && !ok; usleep(250000)) {
        cp_http_result r;
        cp_err err = {0};
        CHECK(cp_http_get(url, "/metrics", "alpha-secret-1", 30000, 0, &r, &err) == 0);
        CHECK(cp_buf_append(&r.body, "", 1) == 0);
        static const char wn[] = "\ncontprof_ingest_windows_total ", /* not # TYPE's */
            tn[] = "contprof_ingest_dlq_total{reason=\"tenant\"} ";
        const char *w = strstr((char *)r.body.data, wn), *t = strstr((char *)r.body.data, tn);
        ok = w && t && atoi(w + strlen(wn)) > 0 && atoi(t + strlen(tn)) > 0;
        cp_buf_close(&r.body);
    }
    CHECK(ok);
    cp_http_result r;
    cp_err err = {0};
    CHECK(cp_http_get(url, "/api/v1/series", "alpha-secret-1", 30000, 0, &r, &err) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(cp_buf_append(&r.body, "", 1) == 0);
    CHECK(strstr((char *)r.body.data, "\"service\":\"signed\"") != NULL);
    CHECK(strstr((char *)r.body.data, "forged") == NULL);
    cp_buf_close(&r.body);
    kill(d.pid, SIGTERM);
    CHECK_EQ(wait_exit(d.pid, 30), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* ---- JavaScript: a fleet of two workerd processes -------------------------------------- */

/* Per-function CPU of a merged profile: self (leaf) and total (on the stack), by name. */
typedef struct fn_cpu {
    const char *name;
    int64_t self, total;
} fn_cpu;

static int fn_cpu_by_self(const void *a, const void *b)
{
    const fn_cpu *x = a, *y = b;
    return x->self != y->self ? (x->self < y->self ? 1 : -1)
                              : (x->total < y->total) - (x->total > y->total);
}

/* Fills f[0..p->functions.n) (name order of the profile) and returns the CPU of samples
 * whose leaf is a bare address (no name, no mapping: not even module+offset). */
static int64_t function_cpu(const cp_profile *p, fn_cpu *f)
{
    int t = cp_profile_find_type(p, "cpu");
    CHECK(t >= 0);
    for (uint32_t i = 0; i < p->functions.n; i++)
        f[i] = (fn_cpu){cp_profile_str(p, p->functions.v[i].name), 0, 0};
    int64_t bare = 0;
    uint8_t *seen = calloc(p->functions.n + 1, 1);
    CHECK(seen);
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        int64_t v = cp_profile_sample_values(p, i)[t];
        memset(seen, 0, p->functions.n + 1);
        for (uint32_t j = 0; j < s->nlocs; j++) {
            const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + j] - 1];
            if (!l->nlines && !l->mapping_id && j == 0) bare += v;
            for (uint32_t k = 0; k < l->nlines; k++) {
                uint32_t fid = p->lines.v[l->line_off + k].function_id;
                if (!fid) continue;
                if (j == 0 && k == 0) f[fid - 1].self += v;
                if (!seen[fid]) f[fid - 1].total += v;
                seen[fid] = 1;
            }
        }
    }
    free(seen);
    return bare;
}

/* The CPU (ns) the agent's files in dir hold for isolate iso over [from, to). */
static int64_t truth_isolate_cpu(const truth *t, const char *iso, int64_t from, int64_t to)
{
    int64_t sum = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->w[i].kind == CP_KIND_CPU && !strcmp(t->w[i].isolate, iso) && t->w[i].start >= from &&
            t->w[i].start < to)
            sum += t->w[i].v1;
    return sum;
}

/* workerd (npm's, pinned and installed as tests/collector/test_js does) serving a Worker
 * and its Durable Object (tests/collector/workerd/worker.js) with V8's perf map on, two
 * processes of one config under `contprof run` to one contprofd, under HTTP load: through
 * the daemon, the Worker's functions are among the top frames at the ratio the code burns
 * them (weighThree:weighOne = 3), bare addresses hold ≤ 1% of the CPU, no mangled name
 * (_Z, _R) in the top 50, the two processes merge into one tower (one function, one
 * location per JS frame, totals summed), and the Durable Object's method shows. */
TEST(workerd_fleet_js_frames_through_contprofd)
{
    char dir[] = "/tmp/contprof-workerd-XXXXXX", url[64], cbin[512];
    daemon_t d = {0};
    start_in_tmp(dir, "workerd", &d, url, cbin);
    const char *src = getenv("CP_SOURCE_DIR") ? getenv("CP_SOURCE_DIR") : ".";
    char cmd[2048], wbin[600] = "", script[600];
    snprintf(cmd, sizeof cmd, "sh %s/tests/collector/workerd/install.sh %s/tests/collector/workerd",
             src, bindir());
    FILE *f = popen(cmd, "r");
    CHECK(f);
    CHECK(fgets(wbin, sizeof wbin, f) != NULL);
    CHECK(pclose(f) == 0);
    wbin[strcspn(wbin, "\n")] = 0;
    snprintf(script, sizeof script, "%s/tests/collector/workerd/run.sh", src);

    /* two processes of one config (the port given on the command line) at once; sampled at
     * 1 kHz, so that the ratio below rests on hundreds of samples */
    setenv("CONTPROF_CPU_HZ", "1000", 1);
    char files[2][600], logs[2][600], port[2][16];
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        snprintf(files[i], sizeof files[i], "%s/windows-%d", dir, i);
        snprintf(logs[i], sizeof logs[i], "%s/workerd-%d.log", dir, i);
        snprintf(port[i], sizeof port[i], "%d", free_port());
        const char *argv[] = {cbin,   "run",          "--server", url,   "--window",
                              "1s",   "--output-dir", files[i],   "--",  "/bin/sh",
                              script, wbin,           port[i],    "120", NULL};
        pid[i] = spawn(argv, logs[i]);
    }
    unsetenv("CONTPROF_CPU_HZ");
    int wpid[2];
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(wait_exit(pid[i], 200), 0);
        static char log[1 << 16];
        slurp(logs[i], log, sizeof log);
        const char *m = strstr(log, "workerd_pid ");
        CHECK(m);
        wpid[i] = atoi(m + strlen("workerd_pid "));
    }
    /* everything the agents wrote has arrived */
    truth t[2];
    int64_t from, to, want = 0;
    truth_load_fleet(t, files, &from, &to);
    for (int i = 0; i < 2; i++)
        want += truth_isolate_cpu(&t[i], "workerd", from, to);
    const char *all = "{service=\"workerd\",isolate=\"workerd\"}";
    int64_t got = cpu_total_when_stored(d.port, all, from, to, want);
    fprintf(stderr, "workerd: %lld ns of CPU in the files, %lld through contprofd\n",
            (long long)want, (long long)got);
    CHECK_EQ(got, want);
    CHECK(want >= 2 * SEC); /* at least 1 s per process */

    cp_profile *m = query(d.port, "cpu", all, from, to, NULL);
    fn_cpu *fc = calloc(m->functions.n + 1, sizeof *fc);
    CHECK(fc);
    int64_t bare = function_cpu(m, fc);
    qsort(fc, m->functions.n, sizeof *fc, fn_cpu_by_self);
    int64_t three = 0, one = 0, tally = 0;
    int rank_three = -1, rank_one = -1, named_three = 0;
    for (uint32_t i = 0; i < m->functions.n; i++) {
        if (i < 12)
            fprintf(stderr, "workerd: top %2u %-60.60s self %lld total %lld\n", i, fc[i].name,
                    (long long)fc[i].self, (long long)fc[i].total);
        if (!strcmp(fc[i].name, "weighThree"))
            three = fc[i].total, rank_three = (int)i, named_three++;
        if (!strcmp(fc[i].name, "weighOne")) one = fc[i].total, rank_one = (int)i;
        if (!strcmp(fc[i].name, "tally")) tally = fc[i].total;
        /* no mangled C++ or Rust name among the top 50 (by self CPU) */
        if (i < 50 && (!strncmp(fc[i].name, "_Z", 2) || !strncmp(fc[i].name, "_R", 2))) {
            fprintf(stderr, "workerd: mangled name in the top 50: %s\n", fc[i].name);
            CHECK(0);
        }
    }
    fprintf(stderr,
            "workerd: weighThree %lld (rank %d), weighOne %lld (rank %d), ratio %.2f; tally %lld; "
            "bare addresses %lld of %lld\n",
            (long long)three, rank_three, (long long)one, rank_one, one ? (double)three / one : 0,
            (long long)tally, (long long)bare, (long long)got);
    /* the hot functions are among the top frames, at the ratio the code burns them */
    CHECK(rank_three >= 0 && rank_three < 5);
    CHECK(rank_one >= 0 && rank_one < 10);
    CHECK(three * 10 >= one * 24 && three * 10 <= one * 36); /* 3 ± 20% */
    CHECK(bare * 100 <= got);
    CHECK(tally > 0); /* the Durable Object's method */
    /* one tower: JS frames merged by name, one function and one location each */
    CHECK_EQ(named_three, 1);
    uint32_t locs_three = 0;
    for (uint32_t i = 0; i < m->locations.n; i++)
        if (loc_names(m, i, "weighThree")) locs_three++;
    CHECK_EQ(locs_three, 1);
    /* each process has it, and the merge sums them */
    int64_t per[2];
    for (int i = 0; i < 2; i++) {
        char sel[160];
        snprintf(sel, sizeof sel, "{service=\"workerd\",isolate=\"workerd\",instance=~\".*:%d\"}",
                 wpid[i]);
        cp_profile *p = query(d.port, "cpu", sel, from, to, NULL);
        per[i] = value_under(p, "cpu", "weighThree");
        fprintf(stderr, "workerd: process %d: weighThree %lld of %lld\n", wpid[i],
                (long long)per[i], (long long)total_of(p, "cpu"));
        CHECK(per[i] > 0);
        cp_profile_destroy(p);
    }
    CHECK_EQ(value_under(m, "cpu", "weighThree"), per[0] + per[1]);
    free(fc);
    cp_profile_destroy(m);
    finish_in_tmp(&d, dir);
}

/* ---- Rust: names demangled on the agent's side and on the server's -------------------- */

/* Names of functions with CPU in p that are still mangled (C++ _Z, Rust _R), printed. */
static int mangled_with_cpu(const cp_profile *p)
{
    fn_cpu *fc = calloc(p->functions.n + 1, sizeof *fc);
    CHECK(fc);
    function_cpu(p, fc);
    int n = 0;
    for (uint32_t i = 0; i < p->functions.n; i++)
        if (fc[i].total > 0 && (!strncmp(fc[i].name, "_Z", 2) || !strncmp(fc[i].name, "_R", 2))) {
            fprintf(stderr, "still mangled: %s\n", fc[i].name);
            n++;
        }
    free(fc);
    return n;
}

/* A small Rust program (rsburn.rs, built by rustc with legacy and with v0 mangling) under
 * the agent to contprofd, naming by the agent and with --symbolize server (its binary
 * uploaded): rsburn::hot_three and rsburn::hot_one demangled on both sides, the same names
 * from both manglings. And Debian's ripgrep (a Rust program, shipped stripped: its own
 * frames can only read rg+0x...) with --symbolize server: no mangled name, bare addresses
 * ≤ 1% of CPU, libpcre2 (uploaded) named. */
TEST(rust_names_demangled_on_both_sides)
{
    char dir[] = "/tmp/contprof-rust-XXXXXX", url[64], cbin[512], cmd[4096];
    daemon_t d = {0};
    start_in_tmp(dir, "rust", &d, url, cbin);
    /* ripgrep's input: 85 MB of text, searched with a backreference (PCRE2) for > 1 s */
    char text[600];
    snprintf(text, sizeof text, "%s/text", dir);
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 1 2400); do cat /usr/share/common-licenses/GPL-3; done > %s", text);
    CHECK(system(cmd) == 0);

    static const char *const kinds[] = {"legacy", "v0"};
    struct {
        char service[32], bin[600], files[600];
        int server;
    } runs[5];
    int nr = 0;
    for (int k = 0; k < 2; k++)
        for (int server = 0; server < 2; server++, nr++) {
            snprintf(runs[nr].service, sizeof runs[nr].service, "rs-%s-%s", kinds[k],
                     server ? "server" : "agent");
            snprintf(runs[nr].bin, sizeof runs[nr].bin, "%s/tests/e2e/rsburn_%s", bindir(),
                     kinds[k]);
            runs[nr].server = server;
        }
    snprintf(runs[nr].service, sizeof runs[nr].service, "rg");
    snprintf(runs[nr].bin, sizeof runs[nr].bin, "%s", CP_RG);
    runs[nr++].server = 1;
    pid_t pid[5];
    for (int i = 0; i < nr; i++) {
        char log[700];
        snprintf(runs[i].files, sizeof runs[i].files, "%s/windows-%s", dir, runs[i].service);
        snprintf(log, sizeof log, "%s/%s.log", dir, runs[i].service);
        const char *rs[] = {runs[i].bin, "3", NULL};
        const char *rg[] = {runs[i].bin, "-j1", "--pcre2", "-c", "(\\w+)\\s+\\w*\\1", text, NULL};
        const char *const *prog = i == nr - 1 ? rg : rs;
        const char *argv[24] = {cbin,          "run",         "--server",
                                url,           "--service",   runs[i].service,
                                "--window",    "1s",          "--output-dir",
                                runs[i].files, "--symbolize", runs[i].server ? "server" : "agent",
                                "--"};
        int a = 13;
        if (prog == rg) { /* 1 kHz: pcre2_match_8 is on ~1% of rg's stacks, 0-3 samples at
                           * 100 Hz (0 failed a CI run), 10-30 at 1 kHz */
            argv[a - 1] = "--cpu-hz";
            argv[a++] = "1000";
            argv[a++] = "--";
        }
        for (int j = 0; prog[j]; j++)
            argv[a++] = prog[j];
        argv[a] = NULL;
        pid[i] = spawn(argv, log);
        CHECK_EQ(wait_exit(pid[i], 120), 0); /* one at a time: each burns a core */
    }
    /* the unstripped Rust builds and ripgrep's libpcre2 uploaded (Debian's rg is stripped:
     * the server refuses it) */
    char lib[512] = "";
    snprintf(cmd, sizeof cmd, "ldd %s | awk '/libpcre2-8/ {print $3}'", CP_RG);
    FILE *f = popen(cmd, "r");
    CHECK(f && fgets(lib, sizeof lib, f));
    pclose(f);
    lib[strcspn(lib, "\n")] = 0;
    snprintf(cmd, sizeof cmd,
             "%s symbols upload --server %s %s/tests/e2e/rsburn_legacy %s/tests/e2e/rsburn_v0 %s",
             cbin, url, bindir(), bindir(), lib);
    CHECK(system(cmd) == 0);

    for (int i = 0; i < nr; i++) {
        truth t;
        truth_load(&t, runs[i].files);
        CHECK(t.n > 0);
        int64_t s0, want;
        truth_sum(&t, CP_KIND_CPU, t.first_start, t.last_end, &s0, &want);
        char sel[96];
        snprintf(sel, sizeof sel, "{service=\"%.31s\"}", runs[i].service);
        CHECK_EQ(cpu_total_when_stored(d.port, sel, t.first_start, t.last_end, want), want);
        cp_profile *p = query(d.port, "cpu", sel, t.first_start, t.last_end, NULL);
        fn_cpu *fc = calloc(p->functions.n + 1, sizeof *fc);
        CHECK(fc);
        int64_t bare = function_cpu(p, fc);
        free(fc);
        fprintf(stderr, "rust: %s: cpu %lld ns, bare %lld\n", runs[i].service, (long long)want,
                (long long)bare);
        CHECK_EQ(mangled_with_cpu(p), 0);
        CHECK(bare * 100 <= want);
        if (i < nr - 1) {
            int64_t three = value_under(p, "cpu", "rsburn::hot_three"),
                    one = value_under(p, "cpu", "rsburn::hot_one");
            fprintf(stderr, "rust: %s: rsburn::hot_three %lld, rsburn::hot_one %lld\n",
                    runs[i].service, (long long)three, (long long)one);
            CHECK(one > 0);
            CHECK(three > one);
        } else {
            int64_t pcre = value_under(p, "cpu", "pcre2_match_8");
            fprintf(stderr, "rust: rg: pcre2_match_8 %lld of %lld ns\n", (long long)pcre,
                    (long long)want);
            CHECK(want >= SEC / 2);
            CHECK(pcre > 0);
        }
        cp_profile_destroy(p);
        free(t.w);
    }
    finish_in_tmp(&d, dir);
}

TEST_MAIN(T(demo_through_the_whole_pipeline), T(rerun_with_the_embedded_broker_loses_nothing),
          T(fleet_of_one_stripped_binary_merges), T(agent_signs_for_its_tenant),
          T(workerd_fleet_js_frames_through_contprofd), T(rust_names_demangled_on_both_sides))
