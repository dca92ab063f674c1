/* The store on a real LevelDB on disk: exact totals, rollups equal to raw windows,
 * restart, inuse and cumulative semantics, tenants, duplicates, retention, versions. */
#include <pthread.h>
#include <stdatomic.h>
#include <leveldb/c.h>

#include "format.h"
#include "merge.h"
#include "store.h"
#include "store_int.h"
#include "store_util.h"
#include "synth.h"
#include "times.h"
#include "model/util.h"

#define WIN (10 * SEC)

static cp_store *open_store(const char *dir, int64_t raw_ret, int64_t roll_ret)
{
    cp_store_options o = {
        .path = dir, .retention_raw_ns = raw_ret, .retention_rollup_ns = roll_ret};
    cp_store *s = NULL;
    cp_err err = {0};
    int rc = cp_store_open(&o, &s, &err);
    if (rc) fprintf(stderr, "open: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    return s;
}

static void add(cp_store_batch *b, const char *tenant, cp_kind kind, const char *labels,
                int64_t start, const char *producer, uint64_t seq, const cp_profile *p, int want)
{
    cp_envelope e;
    make_env(&e, tenant, kind, labels, start, WIN, producer, seq);
    cp_err err = {0};
    int rc = cp_store_batch_add(b, &e, p, 0, &err);
    if (rc != want) fprintf(stderr, "add: rc %d: %s\n", rc, err.msg);
    CHECK_EQ(rc, want);
    cp_envelope_close(&e);
}

static void commit(cp_store_batch *b)
{
    cp_err err = {0};
    int rc = cp_store_batch_commit(b, &err);
    if (rc) fprintf(stderr, "commit: %s\n", err.msg);
    CHECK_EQ(rc, 0);
}

/* cp_store_timeline with its result in three out-parameters, as the checks below read it. */
static int store_timeline(cp_store *s, const cp_query *q, int64_t **v, uint32_t *nsteps,
                          uint32_t *ntypes, cp_err *err)
{
    cp_timeline tl = {0};
    int rc = cp_store_timeline(s, q, &tl, err);
    *v = tl.v;
    *nsteps = tl.nsteps;
    *ntypes = tl.ntypes;
    return rc;
}

static cp_profile *query(cp_store *s, const char *tenant, cp_kind kind, const cp_selector *sel,
                         int64_t from, int64_t to)
{
    cp_profile *p = NULL;
    cp_err err = {0};
    int rc = cp_store_query(s,
                            &(cp_query){.tenant = tenant,
                                        .kind = kind,
                                        .sel = sel ? *sel : (cp_selector){0},
                                        .from_ns = from,
                                        .to_ns = to},
                            &p, &err);
    if (rc) fprintf(stderr, "query: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    CHECK(p);
    return p;
}

/* N windows of one cpu series starting at T0 + i*WIN (with a gap pattern), kept for checks. */
#define NWIN 720
static cp_profile *wins[NWIN];
static int64_t starts[NWIN];

static void make_windows(uint64_t seed)
{
    cp_synth *sy = cp_synth_create(seed, 2000);
    for (int i = 0; i < NWIN; i++) {
        starts[i] = T0 + (int64_t)i * WIN + (i / 100) * 3600 * SEC; /* hour-long gaps */
        wins[i] = cp_synth_cpu_window(sy, 200 + (uint32_t)(i % 7) * 50, starts[i], WIN);
        CHECK(wins[i]);
    }
    cp_synth_destroy(sy);
}

static void fill(cp_store *s, const char *tenant, const char *labels)
{
    cp_store_batch *b = cp_store_batch_create(s);
    for (int i = 0; i < NWIN; i++) {
        add(b, tenant, CP_KIND_CPU, labels, starts[i], "prod-1", (uint64_t)i, wins[i], 0);
        if (i % 37 == 36) commit(b);
    }
    commit(b);
    cp_store_batch_destroy(b);
}

/* The merge of every window starting in [from, to), by the model's merger. */
static char *expected(int64_t from, int64_t to, int64_t *tot0, int64_t *tot1)
{
    cp_merger *m = cp_merger_create();
    for (int i = 0; i < NWIN; i++)
        if (starts[i] >= from && starts[i] < to) CHECK_EQ(cp_merger_add(m, wins[i], NULL), 0);
    cp_profile *p = cp_merger_finish(m);
    *tot0 = p->sample_types.n ? cp_profile_total(p, 0) : 0;
    *tot1 = p->sample_types.n ? cp_profile_total(p, 1) : 0;
    char *c = canonical(p);
    cp_profile_destroy(p);
    cp_merger_destroy(m);
    return c;
}

static void check_range(cp_store *s, int64_t from, int64_t to)
{
    int64_t e0, e1;
    char *want = expected(from, to, &e0, &e1);
    cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, from, to);
    CHECK_EQ(p->sample_types.n, 2);
    CHECK_EQ(cp_profile_total(p, 0), e0);
    CHECK_EQ(cp_profile_total(p, 1), e1);
    CHECK_EQ(p->time_nanos, from);
    CHECK_EQ(p->duration_nanos, to - from);
    char *got = canonical(p);
    if (strcmp(got, want)) {
        fprintf(stderr, "range [%lld, %lld): content differs\n", (long long)(from - T0),
                (long long)(to - T0));
        CHECK(0);
    }
    free(got);
    free(want);
    cp_profile_destroy(p);
}

TEST(exact_totals_and_rollups)
{
    char *dir = tmpdir("store");
    make_windows(11);
    cp_store *s = open_store(dir, 0, 0);
    fill(s, "acme", "service=api,instance=a");
    /* everything, then many unaligned ranges: rollups + raw must equal merging the windows */
    check_range(s, T0 - 1000 * SEC, starts[NWIN - 1] + 1000 * SEC);
    uint64_t x = 88172645463325252ULL;
    int64_t span = starts[NWIN - 1] - T0 + WIN;
    for (int k = 0; k < 40; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t a = T0 - 50 * SEC + (int64_t)(x % (uint64_t)span);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t len = (int64_t)(x % (uint64_t)(span / (k % 3 + 1)));
        check_range(s, a, a + len);
    }
    /* a window belongs to a query iff its start is in [from, to) */
    check_range(s, starts[5], starts[6]);
    check_range(s, starts[5] + 1, starts[6] + 1);
    /* no data: the kind's types, empty */
    cp_profile *p = query(s, "acme", CP_KIND_ALLOC, NULL, T0, T0 + 3600 * SEC);
    CHECK_EQ(p->samples.n, 0);
    CHECK_STREQ(cp_profile_str(p, p->sample_types.v[0].type), "alloc_objects");
    cp_profile_destroy(p);
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.windows, NWIN);
    CHECK_EQ(st.series, 1);
    CHECK(st.disk_bytes > 0);
    cp_store_close(s);
    /* restart: same answers */
    s = open_store(dir, 0, 0);
    check_range(s, T0 - 1000 * SEC, starts[NWIN - 1] + 1000 * SEC);
    check_range(s, starts[100] + 7 * SEC, starts[400] + 3 * SEC);
    cp_store_close(s);
    rmtree(dir);
}

TEST(timeline_matches_queries)
{
    char *dir = tmpdir("store");
    make_windows(12);
    cp_store *s = open_store(dir, 0, 0);
    fill(s, "acme", "service=api");
    int64_t from = T0 + 17 * SEC, to = starts[NWIN - 1] + WIN, step = 1800 * SEC;
    int64_t *tl = NULL;
    uint32_t ns = 0, nt = 0;
    cp_err err = {0};
    CHECK_EQ(store_timeline(s,
                            &(cp_query){.tenant = "acme",
                                        .kind = CP_KIND_CPU,
                                        .from_ns = from,
                                        .to_ns = to,
                                        .step_ns = step},
                            &tl, &ns, &nt, &err),
             0);
    CHECK_EQ(nt, 2);
    CHECK_EQ(ns, (uint32_t)((to - from + step - 1) / step));
    int64_t sum = 0;
    for (uint32_t i = 0; i < ns; i++) {
        int64_t a = from + (int64_t)i * step, b = a + step < to ? a + step : to;
        cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, a, b);
        CHECK_EQ(tl[i * nt + 0], cp_profile_total(p, 0));
        CHECK_EQ(tl[i * nt + 1], cp_profile_total(p, 1));
        sum += tl[i * nt + 1];
        cp_profile_destroy(p);
    }
    int64_t e0, e1;
    free(expected(from, to, &e0, &e1));
    CHECK_EQ(sum, e1);
    free(tl);
    cp_store_close(s);
    rmtree(dir);
}

/* 90 days of hourly windows (at 17 s past the hour) of 3 series, raw windows kept 7 days:
 * once level 0 is cut, the timeline of any range still adds up to its profile, at every
 * step size and offset, and series are found in old ranges. Both used to read the ragged
 * sub-minute ends of each step from level 0, where retention had removed the windows. */
TEST(timeline_and_series_past_raw_retention)
{
    char *dir = tmpdir("store");
    const int64_t H = 3600 * SEC, D = 24 * H;
    cp_store *s = open_store(dir, 7 * D, 0);
    cp_synth *sy = cp_synth_create(90, 200);
    int64_t now = cp_now_ns(), h0 = now - now % H;
    enum { NH = 90 * 24 };
    static int64_t wstart[NH], wtot[3][NH];
    cp_store_batch *b = cp_store_batch_create(s);
    for (int k = 0; k < NH; k++) {
        wstart[k] = h0 - (int64_t)(NH - k) * H + 17 * SEC;
        for (int r = 0; r < 3; r++) {
            cp_profile *w = cp_synth_cpu_window(sy, 5 + (uint32_t)((k + r) % 4), wstart[k], WIN);
            CHECK(w);
            wtot[r][k] = cp_profile_total(w, 1);
            char lab[32], prod[8];
            snprintf(lab, sizeof lab, "service=s%d", r);
            snprintf(prod, sizeof prod, "p%d", r);
            add(b, "acme", CP_KIND_CPU, lab, wstart[k], prod, (uint64_t)k + 1, w, 0);
            cp_profile_destroy(w);
        }
        if (k % 200 == 199) commit(b);
    }
    commit(b);
    cp_store_batch_destroy(b);
    cp_synth_destroy(sy);
    uint32_t del = 0, total = 0;
    do {
        CHECK_EQ(cp_store_maintain(s, now, 5000, &del, NULL), 0);
        total += del;
    } while (del);
    CHECK(total >= 3 * (NH - 8 * 24)); /* level 0 past 7 days is gone */

    /* from on a minute: the truth is every window starting in [from, to) */
    int64_t to = h0, from = h0 - 30 * D, want = 0;
    for (int k = 0; k < NH; k++)
        for (int r = 0; r < 3; r++)
            if (wstart[k] >= from && wstart[k] < to) want += wtot[r][k];
    int64_t odd[] = {from, from + 37 * SEC, from + 17 * SEC, from - 43 * SEC};
    int64_t steps[] = {H, 6 * H, D, 7 * 60 * SEC + 13 * SEC, 7 * D};
    for (size_t o = 0; o < sizeof odd / sizeof *odd; o++) {
        cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, odd[o], to);
        int64_t ptot = cp_profile_total(p, 1);
        cp_profile_destroy(p);
        if (o == 0) CHECK_EQ(ptot, want);
        for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
            int64_t *tl = NULL;
            uint32_t ns = 0, nt = 0;
            cp_err err = {0};
            CHECK_EQ(store_timeline(s,
                                    &(cp_query){.tenant = "acme",
                                                .kind = CP_KIND_CPU,
                                                .from_ns = odd[o],
                                                .to_ns = to,
                                                .step_ns = steps[k]},
                                    &tl, &ns, &nt, &err),
                     0);
            int64_t sum = 0;
            for (uint32_t i = 0; i < ns; i++)
                sum += tl[i * nt + 1];
            free(tl);
            if (sum != ptot)
                fprintf(stderr, "from %+lld s, step %lld s: timeline %lld, profile %lld\n",
                        (long long)((odd[o] - from) / SEC), (long long)(steps[k] / SEC),
                        (long long)sum, (long long)ptot);
            CHECK_EQ(sum, ptot);
        }
    }
    cp_series_list l = {0};
    CHECK_EQ(cp_store_series(s,
                             &(cp_query){.tenant = "acme",
                                         .from_ns = h0 - 60 * D + 29 * SEC,
                                         .to_ns = h0 - 30 * D + 5 * SEC},
                             &l, NULL),
             0);
    CHECK_EQ(l.n, 3);
    cp_series_list_close(&l);
    cp_store_close(s);
    rmtree(dir);
}

/* A tiny profile: one stack per (name, value) pair, inuse or alloc types. */
static cp_profile *mem_profile(int alloc, const char **names, const int64_t *vals, int n)
{
    cp_profile *p = cp_profile_create();
    cp_profile_add_sample_type(p, alloc ? "alloc_objects" : "inuse_objects", "count");
    cp_profile_add_sample_type(p, alloc ? "alloc_space" : "inuse_space", "bytes");
    cp_profile_intern_cstr(p, "space", &p->period_type.type);
    cp_profile_intern_cstr(p, "bytes", &p->period_type.unit);
    p->period = 524288;
    uint32_t root;
    cp_function f = {0};
    cp_profile_intern_cstr(p, "main", &f.name);
    uint32_t fid;
    cp_profile_add_function(p, &f, &fid);
    cp_line ln = {fid, 1};
    cp_profile_add_location(p, 0x1000, 0, &ln, 1, &root);
    for (int i = 0; i < n; i++) {
        cp_function g = {0};
        cp_profile_intern_cstr(p, names[i], &g.name);
        uint32_t gid, lid;
        cp_profile_add_function(p, &g, &gid);
        cp_line l2 = {gid, 10};
        cp_profile_add_location(p, 0x2000 + (uint64_t)i * 16, 0, &l2, 1, &lid);
        uint32_t stack[2] = {lid, root};
        int64_t v[2] = {vals[i], vals[i] * 64};
        cp_profile_add_sample(p, stack, 2, v, NULL, 0);
    }
    return p;
}

static int64_t value_of(const cp_profile *p, const char *fn, int col)
{
    int64_t v = 0;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        const cp_location *l = &p->locations.v[p->stack.v[s->loc_off] - 1];
        const cp_function *f = &p->functions.v[p->lines.v[l->line_off].function_id - 1];
        if (!strcmp(cp_profile_str(p, f->name), fn)) v += cp_profile_sample_values(p, i)[col];
    }
    return v;
}

TEST(inuse_is_a_gauge)
{
    char *dir = tmpdir("store");
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    const char *names[2] = {"startup_cache", "request_buf"};
    /* two instances, 3 hours of windows; startup_cache allocated at start and kept */
    for (int i = 0; i < 1080; i++) {
        for (int inst = 0; inst < 2; inst++) {
            int64_t vals[2] = {1000 + inst, i + 1};
            cp_profile *p = mem_profile(0, names, vals, 2);
            add(b, "acme", CP_KIND_INUSE,
                inst ? "service=api,instance=b" : "service=api,instance=a", T0 + (int64_t)i * WIN,
                inst ? "pb" : "pa", (uint64_t)i, p, 0);
            cp_profile_destroy(p);
        }
        if (i % 100 == 99) commit(b);
    }
    commit(b);
    /* a window long after the start: the start-up allocation is there, once per instance */
    int64_t from = T0 + 7000 * SEC, to = T0 + 7300 * SEC;
    cp_profile *p = query(s, "acme", CP_KIND_INUSE, NULL, from, to);
    CHECK_EQ(value_of(p, "startup_cache", 0), 1000 + 1001);
    /* last snapshot within the range: window index 729 (start 7290 s) */
    CHECK_EQ(value_of(p, "request_buf", 0), 2 * 730);
    cp_profile_destroy(p);
    /* whole range: the last snapshot of each instance */
    p = query(s, "acme", CP_KIND_INUSE, NULL, T0 - 3600 * SEC, T0 + 86400 * SEC);
    CHECK_EQ(value_of(p, "request_buf", 0), 2 * 1080);
    CHECK_EQ(value_of(p, "startup_cache", 1), (1000 + 1001) * 64);
    cp_profile_destroy(p);
    /* one instance via a selector */
    cp_selector sel = {0};
    sel_add(&sel, "instance", "=", "b");
    p = query(s, "acme", CP_KIND_INUSE, &sel, T0, T0 + 65 * SEC);
    CHECK_EQ(value_of(p, "startup_cache", 0), 1001);
    CHECK_EQ(value_of(p, "request_buf", 0), 7);
    cp_profile_destroy(p);
    sel_free(&sel);
    /* timeline uses the same rule per step */
    int64_t *tl;
    uint32_t ns, nt;
    CHECK_EQ(store_timeline(s,
                            &(cp_query){.tenant = "acme",
                                        .kind = CP_KIND_INUSE,
                                        .from_ns = T0,
                                        .to_ns = T0 + 3 * 3600 * SEC,
                                        .step_ns = 3600 * SEC},
                            &tl, &ns, &nt, NULL),
             0);
    CHECK_EQ(ns, 3);
    CHECK_EQ(tl[0], 2001 + 2 * 360);
    CHECK_EQ(tl[2 * nt], 2001 + 2 * 1080);
    free(tl);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

TEST(cumulative_alloc_not_double_counted)
{
    char *dir = tmpdir("store");
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    const char *names[2] = {"alloc_a", "alloc_b"};
    int64_t cum[2] = {0, 0};
    /* a Go-like heap profile: totals since process start, growing */
    for (int i = 0; i < 200; i++) {
        cum[0] += 3;
        cum[1] += i % 5;
        cp_profile *p = mem_profile(1, names, cum, 2);
        cp_envelope e;
        make_env(&e, "acme", CP_KIND_ALLOC, "service=go", T0 + (int64_t)i * WIN, WIN, "gop-1",
                 (uint64_t)i);
        e.cumulative = 1;
        CHECK_EQ(cp_store_batch_add(b, &e, p, 0, NULL), 0);
        cp_envelope_close(&e);
        cp_profile_destroy(p);
        if (i == 120) { /* restart in the middle: the previous input comes back from disk */
            commit(b);
            cp_store_batch_destroy(b);
            cp_store_close(s);
            s = open_store(dir, 0, 0);
            b = cp_store_batch_create(s);
        }
    }
    commit(b);
    cp_profile *p = query(s, "acme", CP_KIND_ALLOC, NULL, T0, T0 + 86400 * SEC);
    CHECK_EQ(value_of(p, "alloc_a", 0), cum[0]);
    CHECK_EQ(value_of(p, "alloc_b", 0), cum[1]);
    CHECK_EQ(value_of(p, "alloc_b", 1), cum[1] * 64);
    cp_profile_destroy(p);
    /* a window in the middle holds only its own allocations */
    p = query(s, "acme", CP_KIND_ALLOC, NULL, T0 + 50 * WIN, T0 + 51 * WIN);
    CHECK_EQ(value_of(p, "alloc_a", 0), 3);
    cp_profile_destroy(p);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

TEST(duplicates_dropped)
{
    char *dir = tmpdir("store");
    make_windows(13);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "p", 10, wins[0], 0);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "p", 10, wins[0], CP_STORE_DUPLICATE);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[2], "p", 12, wins[2], 0);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[1], "p", 11, wins[1],
        0); /* late, not a dup */
    commit(b);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    s = open_store(dir, 0, 0);
    b = cp_store_batch_create(s);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[1], "p", 11, wins[1], CP_STORE_DUPLICATE);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "p", 10, wins[0], CP_STORE_DUPLICATE);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "q", 10, wins[0], 0); /* other producer */
    commit(b);
    int64_t e0, e1;
    free(expected(starts[0], starts[3], &e0, &e1));
    cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, starts[0], starts[3]);
    CHECK_EQ(cp_profile_total(p, 1), e1 + cp_profile_total(wins[0], 1));
    cp_profile_destroy(p);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

TEST(tenants_isolated_and_labels)
{
    char *dir = tmpdir("store");
    make_windows(14);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    for (int i = 0; i < 50; i++) {
        add(b, "acme", CP_KIND_CPU, "service=api,version=1.2", starts[i], "p", (uint64_t)i, wins[i],
            0);
        add(b, "globex", CP_KIND_CPU, "service=web,version=9", starts[i], "p", (uint64_t)i,
            wins[i + 50], 0);
        add(b, "acme", CP_KIND_CPU, "service=worker,version=1.3,isolate=w1", starts[i], "p2",
            (uint64_t)i, wins[i + 100], 0);
    }
    commit(b);
    int64_t e0, e1;
    cp_profile *p = query(s, "globex", CP_KIND_CPU, NULL, T0, T0 + 86400 * SEC);
    free(expected(starts[50], starts[100], &e0, &e1));
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    p = query(s, "nobody", CP_KIND_CPU, NULL, T0, T0 + 86400 * SEC);
    CHECK_EQ(p->samples.n, 0);
    cp_profile_destroy(p);
    /* selectors: =, !=, =~, !~ */
    cp_selector sel = {0};
    sel_add(&sel, "service", "=", "api");
    p = query(s, "acme", CP_KIND_CPU, &sel, T0, T0 + 86400 * SEC);
    free(expected(starts[0], starts[50], &e0, &e1));
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    sel_free(&sel);
    sel_add(&sel, "service", "=", "web"); /* globex's label value, asked of acme */
    p = query(s, "acme", CP_KIND_CPU, &sel, T0, T0 + 86400 * SEC);
    CHECK_EQ(p->samples.n, 0);
    cp_profile_destroy(p);
    sel_free(&sel);
    sel_add(&sel, "version", "=~", "1\\..*");
    sel_add(&sel, "isolate", "!~", "w.*");
    sel_add(&sel, "service", "!=", "worker");
    p = query(s, "acme", CP_KIND_CPU, &sel, T0, T0 + 86400 * SEC);
    free(expected(starts[0], starts[50], &e0, &e1));
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    sel_free(&sel);
    /* label names and values, sorted, per tenant */
    cp_string_list l = {0};
    CHECK_EQ(cp_store_label_names(s, &(cp_query){.tenant = "acme"}, &l, NULL), 0);
    CHECK_EQ(l.n, 3);
    CHECK_STREQ(l.v[0], "isolate");
    CHECK_STREQ(l.v[1], "service");
    CHECK_STREQ(l.v[2], "version");
    cp_string_list_close(&l);
    CHECK_EQ(cp_store_label_values(s, &(cp_query){.tenant = "acme", .label = "service"}, &l, NULL),
             0);
    CHECK_EQ(l.n, 2);
    CHECK_STREQ(l.v[0], "api");
    CHECK_STREQ(l.v[1], "worker");
    cp_string_list_close(&l);
    CHECK_EQ(
        cp_store_label_values(s, &(cp_query){.tenant = "globex", .label = "service"}, &l, NULL), 0);
    CHECK_EQ(l.n, 1);
    CHECK_STREQ(l.v[0], "web");
    cp_string_list_close(&l);
    /* series with a window in range */
    cp_series_list sl = {0};
    CHECK_EQ(
        cp_store_series(s, &(cp_query){.tenant = "acme", .from_ns = T0, .to_ns = T0 + 86400 * SEC},
                        &sl, NULL),
        0);
    CHECK_EQ(sl.n, 2);
    CHECK_EQ(sl.v[0].first_ns, starts[0]);
    CHECK_EQ(sl.v[0].last_ns, starts[49]);
    cp_series_list_close(&sl);
    CHECK_EQ(
        cp_store_series(
            s, &(cp_query){.tenant = "acme", .from_ns = starts[49] + 1, .to_ns = T0 + 86400 * SEC},
            &sl, NULL),
        0);
    CHECK_EQ(sl.n, 0);
    cp_series_list_close(&sl);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

TEST(retention_frees_disk)
{
    char *dir = tmpdir("store");
    make_windows(15);
    /* raw windows kept 1 h, rollups 1 day */
    cp_store *s = open_store(dir, 3600 * SEC, 86400 * SEC);
    cp_store_batch *b = cp_store_batch_create(s);
    for (int r = 0; r < 6; r++) /* 6 series, so there is real data to give back */
        for (int i = 0; i < NWIN; i++) {
            char lab[64];
            snprintf(lab, sizeof lab, "service=s%d", r);
            add(b, "acme", CP_KIND_CPU, lab, starts[i], "p", (uint64_t)(r * NWIN + i), wins[i], 0);
            if (i % 60 == 59) commit(b);
        }
    commit(b);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    s = open_store(dir, 3600 * SEC, 86400 * SEC);
    uint64_t before = dir_bytes(dir);
    int64_t last = starts[NWIN - 1];
    int64_t e0, e1;
    free(expected(T0, last + WIN, &e0, &e1));
    /* now = just after the last window: raw windows older than 1 h go, in bounded steps */
    uint32_t del = 0, total = 0, steps = 0;
    do {
        CHECK_EQ(cp_store_maintain(s, last + WIN, 500, &del, NULL), 0);
        total += del;
        steps++;
    } while (del && steps < 1000);
    CHECK(steps > 2); /* bounded: it took several steps */
    CHECK(total > 6 * 500);
    /* rollups still answer the old ranges (at 1 min resolution and above) */
    cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, T0 - 3600 * SEC, last + WIN);
    CHECK_EQ(cp_profile_total(p, 1), 6 * e1);
    cp_profile_destroy(p);
    /* a day later, everything is gone and the disk is given back */
    do {
        CHECK_EQ(cp_store_maintain(s, last + 3 * 86400 * SEC, 1000, &del, NULL), 0);
    } while (del);
    p = query(s, "acme", CP_KIND_CPU, NULL, T0 - 3600 * SEC, last + WIN);
    CHECK_EQ(p->samples.n, 0);
    cp_profile_destroy(p);
    cp_store_close(s);
    uint64_t after = dir_bytes(dir);
    fprintf(stderr, "disk before %llu after %llu\n", (unsigned long long)before,
            (unsigned long long)after);
    CHECK(after < before / 2);
    rmtree(dir);
}

TEST(unknown_version_refused)
{
    char *dir = tmpdir("store");
    cp_store *s = open_store(dir, 0, 0);
    cp_store_close(s);
    char *e = NULL;
    leveldb_options_t *o = leveldb_options_create();
    leveldb_t *db = leveldb_open(o, dir, &e);
    CHECK(!e);
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    char rec[18] = "contprof-store\0\0\0\x63";
    leveldb_put(db, wo, "\0V", 2, rec, 18, &e);
    CHECK(!e);
    leveldb_close(db);
    leveldb_writeoptions_destroy(wo);
    leveldb_options_destroy(o);
    cp_store_options so = {.path = dir};
    cp_err err = {0};
    CHECK_EQ(cp_store_open(&so, &s, &err), CP_EVERSION);
    CHECK(s == NULL);
    CHECK_CONTAINS(err.msg, "format version 99");
    rmtree(dir);
}

TEST(bad_inputs_refused_batch_usable)
{
    char *dir = tmpdir("store");
    make_windows(16);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "p", 1, wins[0], 0);
    /* the same series with other sample types */
    const char *names[1] = {"x"};
    int64_t v[1] = {1};
    cp_profile *m = mem_profile(1, names, v, 1);
    cp_envelope e;
    make_env(&e, "acme", CP_KIND_CPU, "service=api", starts[1], WIN, "p", 2);
    cp_err err = {0};
    CHECK_EQ(cp_store_batch_add(b, &e, m, 0, &err), CP_EINCOMPAT);
    CHECK_CONTAINS(err.msg, "alloc_objects");
    cp_envelope_close(&e);
    make_env(&e, "bad\ttenant", CP_KIND_CPU, "service=api", starts[1], WIN, "p", 3);
    CHECK_EQ(cp_store_batch_add(b, &e, wins[1], 0, &err), CP_EINVAL);
    cp_envelope_close(&e);
    cp_profile_destroy(m);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[1], "p", 4, wins[1], 0);
    commit(b);
    int64_t e0, e1;
    free(expected(starts[0], starts[2], &e0, &e1));
    cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, T0, T0 + 86400 * SEC);
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    /* bad query arguments */
    CHECK_EQ(
        cp_store_query(
            s, &(cp_query){.tenant = "acme", .kind = CP_KIND_CPU, .from_ns = T0 + 10, .to_ns = T0},
            &p, &err),
        CP_EINVAL);
    cp_query_limits lim = {.max_range_ns = 3600 * SEC};
    CHECK_EQ(cp_store_query(s,
                            &(cp_query){.tenant = "acme",
                                        .kind = CP_KIND_CPU,
                                        .from_ns = T0,
                                        .to_ns = T0 + 7200 * SEC,
                                        .lim = *&lim},
                            &p, &err),
             CP_ELIMIT);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

/* The same address symbolized differently (another build, a re-symbolization) stays two
 * locations: the (mapping, address) fast path compares content. */
TEST(same_address_other_function)
{
    char *dir = tmpdir("store");
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    const char *n1[1] = {"alloc_a"}, *n2[1] = {"alloc_z"};
    int64_t v1[1] = {5}, v2[1] = {7};
    cp_profile *p1 = mem_profile(1, n1, v1, 1), *p2 = mem_profile(1, n2, v2, 1);
    add(b, "acme", CP_KIND_ALLOC, "service=x", T0, "p", 1, p1, 0);
    add(b, "acme", CP_KIND_ALLOC, "service=x", T0 + WIN, "p", 2, p2, 0);
    commit(b);
    add(b, "acme", CP_KIND_ALLOC, "service=x", T0 + 2 * WIN, "p", 3, p1, 0);
    commit(b);
    cp_profile *p = query(s, "acme", CP_KIND_ALLOC, NULL, T0, T0 + 3 * WIN);
    CHECK_EQ(value_of(p, "alloc_a", 0), 10);
    CHECK_EQ(value_of(p, "alloc_z", 0), 7);
    CHECK_EQ(p->samples.n, 2);
    cp_profile_destroy(p);
    cp_profile_destroy(p1);
    cp_profile_destroy(p2);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

/* One writer and several readers at once: readers always see whole batches. */
static cp_store *cs;
static atomic_int stop_readers;
static void *reader(void *arg)
{
    (void)arg;
    while (!stop_readers) {
        cp_profile *p = NULL;
        CHECK_EQ(cp_store_query(cs,
                                &(cp_query){.tenant = "acme",
                                            .kind = CP_KIND_CPU,
                                            .from_ns = T0,
                                            .to_ns = T0 + 30 * 86400 * SEC},
                                &p, NULL),
                 0);
        /* every committed batch holds 10 windows of 200+ samples: totals move in whole batches */
        cp_profile_destroy(p);
        cp_series_list sl;
        CHECK_EQ(cp_store_series(
                     cs, &(cp_query){.tenant = "acme", .from_ns = T0, .to_ns = T0 + 86400 * SEC},
                     &sl, NULL),
                 0);
        cp_series_list_close(&sl);
    }
    return NULL;
}

TEST(concurrent_readers)
{
    char *dir = tmpdir("store");
    make_windows(17);
    cs = open_store(dir, 0, 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, reader, NULL);
    cp_store_batch *b = cp_store_batch_create(cs);
    for (int i = 0; i < 300; i++) {
        add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
        if (i % 10 == 9) commit(b);
    }
    stop_readers = 1;
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    int64_t e0, e1;
    free(expected(T0, starts[300], &e0, &e1));
    cp_profile *p = query(cs, "acme", CP_KIND_CPU, NULL, T0, T0 + 30 * 86400 * SEC);
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    cp_store_batch_destroy(b);
    cp_store_close(cs);
    rmtree(dir);
}

/* A failed batch (dropped with cp_store_batch_reset) leaves the store refusing writes
 * until cp_store_reopen, which runs while readers query: they wait for it, never fail,
 * and the store ends exactly at its commits. */
TEST(reopen_under_readers)
{
    char *dir = tmpdir("store");
    make_windows(17);
    cs = open_store(dir, 0, 0);
    stop_readers = 0;
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, reader, NULL);
    cp_store_batch *b = cp_store_batch_create(cs);
    int64_t want = 0, batch = 0;
    cp_err err = {0};
    for (int i = 0; i < 60; i++) {
        add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
        batch += cp_profile_total(wins[i], 1);
        if (i % 10 != 9) continue;
        if (i % 30 == 29) { /* this batch fails: nothing of it is stored */
            cp_store_batch_reset(b);
            add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", 1000, wins[i], CP_ESTORE);
            CHECK_EQ(cp_store_batch_commit(b, &err), CP_ESTORE);
            CHECK_EQ(cp_store_reopen(cs, &err), 0);
        } else {
            commit(b);
            want += batch;
        }
        batch = 0;
    }
    stop_readers = 1;
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cp_profile *p = query(cs, "acme", CP_KIND_CPU, NULL, T0, T0 + 30 * 86400 * SEC);
    CHECK_EQ(cp_profile_total(p, 1), want);
    cp_profile_destroy(p);
    cp_store_batch_destroy(b);
    cp_store_close(cs);
    /* and after a real reopen, the same */
    cs = open_store(dir, 0, 0);
    p = query(cs, "acme", CP_KIND_CPU, NULL, T0, T0 + 30 * 86400 * SEC);
    CHECK_EQ(cp_profile_total(p, 1), want);
    cp_profile_destroy(p);
    cp_store_close(cs);
    rmtree(dir);
}

/* Two producers of one series with windows at the same start, in one batch and then in
 * the next: the window's own bucket (level 0) and every rollup hold the sum of all. */
TEST(same_start_summed)
{
    char *dir = tmpdir("store");
    make_windows(17);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "p", 1, wins[0], 0);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "q", 1, wins[1], 0);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[6], "p", 2, wins[6], 0); /* next minute */
    commit(b);
    add(b, "acme", CP_KIND_CPU, "service=api", starts[0], "r", 1, wins[3], 0);
    commit(b);
    cp_merger *m = cp_merger_create();
    CHECK_EQ(cp_merger_add(m, wins[0], NULL), 0);
    CHECK_EQ(cp_merger_add(m, wins[1], NULL), 0);
    CHECK_EQ(cp_merger_add(m, wins[3], NULL), 0);
    cp_profile *want = cp_merger_finish(m);
    char *w = canonical(want);
    /* level 0 alone, then T0's whole minute (T0 is 22:13:20 UTC), which its 1-minute
     * rollup answers */
    int64_t ranges[2][2] = {{starts[0], starts[0] + 1}, {T0 - 20 * SEC, T0 + 40 * SEC}};
    for (int k = 0; k < 2; k++) {
        cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, ranges[k][0], ranges[k][1]);
        CHECK_EQ(cp_profile_total(p, 1), cp_profile_total(want, 1));
        char *got = canonical(p);
        CHECK_STREQ(got, w);
        free(got);
        cp_profile_destroy(p);
    }
    free(w);
    cp_profile_destroy(want);
    cp_merger_destroy(m);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

/* ---- frame identity: object + file offset --------------------------------------------- */

#define FLEET "/opt/fleet/bin/fleet_work"
#define FLEET_ID "4f1e2d3c4b5a69788796a5b4c3d2e1f0aabbccdd"
#define LIBC "/usr/lib/x86_64-linux-gnu/libc.so.6"
#define LIBC_ID "8dd1fd2e9b2e6a7bb2dcd5c2d1e0f1a2b3c4d5e6"

/* One process of a stripped binary: its text at exe_base + 0x1000 (file offset 0x1000),
 * libc's at libc_base + 0x28000 (file offset 0x28000), JIT code in anonymous memory at
 * anon. Samples: fleet+0x1234 <- fleet+0x1400 <- libc+0x29d90 (10 ns), and
 * anon+0x10 <- libc+0x29d90 (3 ns). named = 0: mappings without file or build ID (what a
 * format-1 store kept of any mapping: run-time addresses), and the file names and build
 * IDs as function names of one extra sample so that the store's strings hold them. */
static cp_profile *process_profile(uint64_t exe_base, uint64_t libc_base, uint64_t anon, int named)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK_EQ(cp_profile_add_sample_type(p, "samples", "count"), 0);
    CHECK_EQ(cp_profile_add_sample_type(p, "cpu", "nanoseconds"), 0);
    CHECK_EQ(cp_profile_intern_cstr(p, "cpu", &p->period_type.type), 0);
    CHECK_EQ(cp_profile_intern_cstr(p, "nanoseconds", &p->period_type.unit), 0);
    p->period = 1;
    cp_mapping exe = {exe_base + 0x1000, exe_base + 0x5000, 0x1000, 0, 0, 0};
    cp_mapping libc = {libc_base + 0x28000, libc_base + 0x1bd000, 0x28000, 0, 0, 0};
    cp_mapping jit = {anon, anon + 0x1000, 0, 0, 0, 0};
    if (named) { /* named 2: the same build at another path (another host's layout) */
        CHECK_EQ(
            cp_profile_intern_cstr(p, named == 2 ? "/srv/app/fleet_work" : FLEET, &exe.filename),
            0);
        CHECK_EQ(cp_profile_intern_cstr(p, FLEET_ID, &exe.build_id), 0);
        CHECK_EQ(cp_profile_intern_cstr(p, LIBC, &libc.filename), 0);
        CHECK_EQ(cp_profile_intern_cstr(p, LIBC_ID, &libc.build_id), 0);
    }
    uint32_t me, ml, mj, l[5];
    CHECK_EQ(cp_profile_add_mapping(p, &exe, &me), 0);
    CHECK_EQ(cp_profile_add_mapping(p, &libc, &ml), 0);
    CHECK_EQ(cp_profile_add_mapping(p, &jit, &mj), 0);
    CHECK_EQ(cp_profile_add_location(p, exe_base + 0x1234, me, NULL, 0, &l[0]), 0);
    CHECK_EQ(cp_profile_add_location(p, exe_base + 0x1400, me, NULL, 0, &l[1]), 0);
    CHECK_EQ(cp_profile_add_location(p, libc_base + 0x29d90, ml, NULL, 0, &l[2]), 0);
    CHECK_EQ(cp_profile_add_location(p, anon + 0x10, mj, NULL, 0, &l[3]), 0);
    uint32_t s1[3] = {l[0], l[1], l[2]}, s2[2] = {l[3], l[2]};
    int64_t v1[2] = {1, 10}, v2[2] = {1, 3};
    CHECK_EQ(cp_profile_add_sample(p, s1, 3, v1, NULL, 0), 0);
    CHECK_EQ(cp_profile_add_sample(p, s2, 2, v2, NULL, 0), 0);
    if (!named) {
        static const char *const strs[] = {FLEET, FLEET_ID, LIBC, LIBC_ID};
        cp_line ln[4];
        for (int i = 0; i < 4; i++) {
            cp_function f = {0};
            CHECK_EQ(cp_profile_intern_cstr(p, strs[i], &f.name), 0);
            f.system_name = f.name;
            CHECK_EQ(cp_profile_add_function(p, &f, &ln[i].function_id), 0);
            ln[i].line = 0;
        }
        CHECK_EQ(cp_profile_add_location(p, 0, 0, ln, 4, &l[4]), 0);
        int64_t v3[2] = {0, 0};
        CHECK_EQ(cp_profile_add_sample(p, &l[4], 1, v3, NULL, 0), 0);
    }
    return p;
}

/* The store's answer over processes A and B of process_profile (and more windows of the
 * same shape): one mapping per object, addresses are file offsets inside it, one location
 * per (object, file offset), so the object-only stack is one sample of their sum; the JIT
 * code's frames, identified by nothing but their run-time addresses, stay apart. */
static void check_fleet_answer(const cp_profile *q, int nproc)
{
    uint32_t nexe = 0, nlibc = 0, nanon = 0;
    for (uint32_t i = 0; i < q->mappings.n; i++) {
        const char *f = cp_profile_str(q, q->mappings.v[i].filename);
        nexe += !strcmp(f, FLEET);
        nlibc += !strcmp(f, LIBC);
        nanon += !*f;
    }
    CHECK_EQ(nexe, 1);
    CHECK_EQ(nlibc, 1);
    CHECK_EQ(nanon, (uint32_t)nproc);
    uint32_t nobj = 0;
    for (uint32_t i = 0; i < q->locations.n; i++) {
        const cp_location *l = &q->locations.v[i];
        if (!l->mapping_id) continue;
        const cp_mapping *m = &q->mappings.v[l->mapping_id - 1];
        CHECK(l->address >= m->start && l->address < m->limit); /* pprof's invariant */
        if (!*cp_profile_str(q, m->filename)) continue;
        nobj++;
        CHECK_EQ(m->start, m->offset);
        uint64_t off = l->address - m->start + m->offset;
        CHECK(off == 0x1234 || off == 0x1400 || off == 0x29d90);
        char name[128];
        cp_location_label(q, l, name, sizeof name);
        CHECK(!strcmp(name, "fleet_work+0x1234") || !strcmp(name, "fleet_work+0x1400") ||
              !strcmp(name, "libc.so.6+0x29d90"));
    }
    CHECK_EQ(nobj, 3);
    int64_t obj_stack = 0;
    uint32_t nobj_samples = 0;
    for (uint32_t i = 0; i < q->samples.n; i++)
        if (q->samples.v[i].nlocs == 3) {
            nobj_samples++;
            obj_stack += cp_profile_sample_values(q, i)[1];
        }
    CHECK_EQ(obj_stack, 10 * nproc);
    CHECK_EQ(nobj_samples, 1);
    CHECK_EQ(cp_profile_total(q, 1), 13 * nproc);
}

static const uint64_t bases[3][3] = {{0x555555554000, 0x7f0000000000, 0x7e0000000000},
                                     {0x563200000000, 0x7fcc00000000, 0x7e0000100000},
                                     {0x55aa00000000, 0x7f1100000000, 0x7e0000200000}};

TEST(one_binary_at_two_bases_is_one_frame_set)
{
    char *dir = tmpdir("store");
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    cp_profile *pa = process_profile(bases[0][0], bases[0][1], bases[0][2], 1);
    cp_profile *pb = process_profile(bases[1][0], bases[1][1], bases[1][2], 1);
    add(b, "acme", CP_KIND_CPU, "service=fleet,instance=a", T0, "pa", 1, pa, 0);
    commit(b);
    add(b, "acme", CP_KIND_CPU, "service=fleet,instance=b", T0, "pb", 1, pb, 0);
    commit(b);
    cp_profile *q = query(s, "acme", CP_KIND_CPU, NULL, T0, T0 + WIN);
    check_fleet_answer(q, 2);
    cp_profile_destroy(q);
    /* the same after a restart (the dictionaries as loaded) and a third process */
    cp_store_batch_destroy(b);
    cp_store_close(s);
    s = open_store(dir, 0, 0);
    b = cp_store_batch_create(s);
    cp_profile *pc = process_profile(bases[2][0], bases[2][1], bases[2][2], 2);
    add(b, "acme", CP_KIND_CPU, "service=fleet,instance=c", T0, "pc", 1, pc, 0);
    commit(b);
    q = query(s, "acme", CP_KIND_CPU, NULL, T0, T0 + WIN);
    check_fleet_answer(q, 3); /* the build ID is the object: one mapping, the first path */
    cp_profile_destroy(q);
    cp_profile_destroy(pa);
    cp_profile_destroy(pb);
    cp_profile_destroy(pc);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    rmtree(dir);
}

/* Id of string str in tenant's dictionary of the store db (0 if absent). */
static uint32_t raw_string_id(leveldb_t *db, const char *tenant, const char *str)
{
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_iterator_t *it = leveldb_create_iterator(db, ro);
    char k[64];
    size_t n = strlen(tenant);
    memcpy(k, tenant, n);
    k[n] = 0;
    k[n + 1] = CP_K_DICT;
    k[n + 2] = CP_D_STRING;
    uint32_t id = 0;
    for (leveldb_iter_seek(it, k, n + 3); leveldb_iter_valid(it) && !id; leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl), *v = leveldb_iter_value(it, &vl);
        if (kl != n + 7 || memcmp(key, k, n + 3)) break;
        if (vl == strlen(str) && !memcmp(v, str, vl))
            id = cp_get_be32((const uint8_t *)key + n + 3);
    }
    leveldb_iter_destroy(it);
    leveldb_readoptions_destroy(ro);
    return id;
}

/* A store of format 1, as that version wrote it: every mapping with the run-time addresses
 * of its process. It is made here by storing processes whose mappings carry no file name
 * (kept as they come, then as now), then giving the stored mapping entries their file
 * names and build IDs and the format record version 1: byte for byte what format 1 wrote
 * for named mappings. Opened now, it answers as a store of the current format does, and
 * new windows join the frames it already holds. */
TEST(format_1_store_read_canonical)
{
    char *dir = tmpdir("store");
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    cp_profile *pa = process_profile(bases[0][0], bases[0][1], bases[0][2], 0);
    cp_profile *pb = process_profile(bases[1][0], bases[1][1], bases[1][2], 0);
    add(b, "acme", CP_KIND_CPU, "service=fleet,instance=a", T0, "pa", 1, pa, 0);
    add(b, "acme", CP_KIND_CPU, "service=fleet,instance=b", T0, "pb", 1, pb, 0);
    commit(b);
    cp_store_batch_destroy(b);
    cp_store_close(s);

    char *e = NULL;
    leveldb_options_t *o = leveldb_options_create();
    leveldb_t *db = leveldb_open(o, dir, &e);
    CHECK(!e);
    uint32_t ids[4] = {raw_string_id(db, "acme", FLEET), raw_string_id(db, "acme", FLEET_ID),
                       raw_string_id(db, "acme", LIBC), raw_string_id(db, "acme", LIBC_ID)};
    for (int i = 0; i < 4; i++)
        CHECK(ids[i]);
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    int named = 0;
    for (uint32_t id = 1; id <= 6; id++) {
        char k[16] = "acme\0D";
        k[6] = CP_D_MAPPING;
        cp_put_be32((uint8_t *)k + 7, id);
        size_t vl;
        char *v = leveldb_get(db, ro, k, 11, &vl, &e);
        CHECK(!e && v);
        cp_rd r = {(const uint8_t *)v, (const uint8_t *)v + vl, 0};
        uint64_t f[6];
        for (int j = 0; j < 6; j++)
            f[j] = cp_get_uv(&r);
        CHECK(!r.bad);
        leveldb_free(v);
        CHECK_EQ(f[3], 0); /* stored without a file name */
        if (f[2] == 0x1000 || f[2] == 0x28000) {
            f[3] = ids[f[2] == 0x1000 ? 0 : 2];
            f[4] = ids[f[2] == 0x1000 ? 1 : 3];
        }
        named += f[3] != 0;
        CHECK(f[0] > 0x550000000000); /* run-time addresses */
        uint8_t nv[64], *p = nv;
        for (int j = 0; j < 6; j++)
            p = cp_put_uv(p, f[j]);
        leveldb_put(db, wo, k, 11, (const char *)nv, (size_t)(p - nv), &e);
        CHECK(!e);
    }
    CHECK_EQ(named, 4); /* two processes x (the program, libc) */
    char rec[18] = "contprof-store\0\0\0\x01";
    leveldb_put(db, wo, "\0V", 2, rec, 18, &e);
    CHECK(!e);
    leveldb_readoptions_destroy(ro);
    leveldb_writeoptions_destroy(wo);
    leveldb_close(db);
    leveldb_options_destroy(o);

    s = open_store(dir, 0, 0);
    cp_profile *q = query(s, "acme", CP_KIND_CPU, NULL, T0, T0 + WIN);
    check_fleet_answer(q, 2);
    cp_profile_destroy(q);
    /* a window of today's agent (named, canonical) lands on the same frames */
    b = cp_store_batch_create(s);
    cp_profile *pc = process_profile(bases[2][0], bases[2][1], bases[2][2], 1);
    add(b, "acme", CP_KIND_CPU, "service=fleet,instance=c", T0, "pc", 1, pc, 0);
    commit(b);
    q = query(s, "acme", CP_KIND_CPU, NULL, T0, T0 + WIN);
    check_fleet_answer(q, 3);
    cp_profile_destroy(q);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    /* and again from disk: old entries canonicalized again, new ones found as stored */
    s = open_store(dir, 0, 0);
    q = query(s, "acme", CP_KIND_CPU, NULL, T0, T0 + WIN);
    check_fleet_answer(q, 3);
    cp_profile_destroy(q);
    cp_store_close(s);
    cp_profile_destroy(pa);
    cp_profile_destroy(pb);
    cp_profile_destroy(pc);
    rmtree(dir);
}

/* Symbol tables are put and read from query threads while the writer reopens the store:
 * each put and get sees an open database or none (CP_ESTORE), never one being closed (the
 * sanitizer build would see a use after free), and what was put is there afterwards. */
static atomic_int sym_puts;
static void *symbols_user(void *arg)
{
    char bid[16];
    snprintf(bid, sizeof bid, "b%02d", (int)(intptr_t)arg);
    uint8_t table[64];
    memset(table, (int)(intptr_t)arg, sizeof table);
    while (!stop_readers) {
        cp_err err = {0};
        int rc = cp_store_put_symbols(cs, "acme", bid, table, sizeof table, &err);
        CHECK(rc == 0 || rc == CP_ESTORE);
        if (rc == 0) atomic_fetch_add(&sym_puts, 1);
        uint8_t *got = NULL;
        size_t len = 0;
        rc = cp_store_get_symbols(cs, "acme", bid, &got, &len, &err);
        CHECK(rc == 0 || rc == CP_ESTORE || rc == CP_ENOTFOUND);
        if (rc == 0) CHECK(len == sizeof table && !memcmp(got, table, len));
        free(got);
    }
    return NULL;
}

TEST(symbols_under_reopen)
{
    char *dir = tmpdir("store");
    cs = open_store(dir, 0, 0);
    stop_readers = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, symbols_user, (void *)(intptr_t)(i + 1));
    cp_err err = {0};
    for (int i = 0; i < 40; i++)
        CHECK_EQ(cp_store_reopen(cs, &err), 0);
    for (int w = 0; w < 30000 && atomic_load(&sym_puts) < 20; w++) /* up to 30 s */
        usleep(1000);
    CHECK(atomic_load(&sym_puts) >= 20);
    stop_readers = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 1; i <= 2; i++) {
        char bid[16];
        snprintf(bid, sizeof bid, "b%02d", i);
        uint8_t *got = NULL;
        size_t len = 0;
        CHECK_EQ(cp_store_get_symbols(cs, "acme", bid, &got, &len, &err), 0);
        CHECK_EQ(len, 64);
        CHECK_EQ(got[0], i);
        free(got);
    }
    cp_store_close(cs);
    rmtree(dir);
}

/* The check of a repair, read only for what it finds: a rollup bucket whose window count
 * disagrees with the level-0 windows in it is what a wrong rollup looks like on disk. */
static void check_repair_finds_nothing(const char *dir)
{
    cp_store_options o = {.path = dir};
    cp_store_repair_stats st;
    cp_err err = {0};
    int rc = cp_store_repair(&o, NULL, &st, &err);
    if (rc) fprintf(stderr, "repair: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    CHECK_EQ(st.rollups_rebuilt, 0);
    CHECK_EQ(st.windows_lost, 0);
    CHECK_EQ(st.blocks_dropped, 0);
}

/* The writer sums a batch's windows per series and minute before adding them to levels
 * 1-4 (write.c, stage_flush). One batch holding every window of two interleaved series,
 * out of order (late windows, minutes revisited, hours apart), must store what one window
 * per batch does: exact totals over aligned and unaligned ranges, the right window counts
 * in every rollup (the repair's check finds nothing to rebuild). */
TEST(rollups_of_one_batch_equal_window_by_window)
{
    char *dir = tmpdir("store");
    make_windows(17);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    int order[NWIN];
    for (int i = 0; i < NWIN; i++)
        order[i] = i;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    /* shuffled within runs of 120 windows (a sequence more than 256 behind a producer's
     * highest counts as a duplicate), every other run backwards */
    for (int r = 0; r < NWIN; r += 120) {
        for (int i = 119; i > 0; i--) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int j = (int)(x % (uint64_t)(i + 1)), t = order[r + i];
            order[r + i] = order[r + j], order[r + j] = t;
        }
        if ((r / 120) % 2)
            for (int i = 0; i < 60; i++) {
                int t = order[r + i];
                order[r + i] = order[r + 119 - i], order[r + 119 - i] = t;
            }
    }
    for (int k = 0; k < NWIN; k++) {
        int i = order[k];
        add(b, "acme", CP_KIND_CPU, "service=api,instance=a", starts[i], "pa", (uint64_t)i, wins[i],
            0);
        add(b, "acme", CP_KIND_CPU, "service=api,instance=b", starts[i], "pb", (uint64_t)i, wins[i],
            0);
    }
    commit(b);
    cp_store_batch_destroy(b);
    /* per series, against the merge of the windows */
    int64_t span = starts[NWIN - 1] - T0 + WIN;
    for (int k = 0; k < 24; k++) {
        int64_t a, len;
        if (k < 4) { /* whole day, hour, 10 min, 1 min: the rollups alone */
            static const int64_t size[4] = {86400, 3600, 600, 60};
            len = size[k] * SEC;
            a = T0 + (k == 0 ? 0 : 2 * len);
        } else {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            a = T0 - 50 * SEC + (int64_t)(x % (uint64_t)span);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            len = (int64_t)(x % (uint64_t)(span / (k % 3 + 1)));
        }
        int64_t e0, e1;
        char *want = expected(a, a + len, &e0, &e1);
        for (int inst = 0; inst < 2; inst++) {
            cp_selector sel = {0};
            sel_add(&sel, "instance", "=", inst ? "b" : "a");
            cp_profile *p = query(s, "acme", CP_KIND_CPU, &sel, a, a + len);
            sel_free(&sel);
            CHECK_EQ(cp_profile_total(p, 0), e0);
            CHECK_EQ(cp_profile_total(p, 1), e1);
            char *got = canonical(p);
            CHECK_STREQ(got, want);
            free(got);
            cp_profile_destroy(p);
        }
        free(want);
    }
    cp_store_close(s);
    check_repair_finds_nothing(dir);
    rmtree(dir);
}

/* Many series in one writer cache (a host's short processes make a series each), written in
 * interleaved batches: each commit takes its level-0 buckets out of the cache one by one
 * (write.c: bucket_remove); a bucket lost from the cache's table would be opened again from
 * disk and its uncommitted rows lost, which the rollup-only ranges below would show. */
TEST(rollups_of_many_series_in_one_cache)
{
    enum { NSER = 100, PER = 60 };
    char *dir = tmpdir("store");
    make_windows(23);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    uint64_t x = 0x2545f4914f6cdd1dULL;
    for (int i = 0, n = 0; i < PER; i++)
        for (int r = 0; r < NSER; r++) {
            char lab[64], prod[16];
            snprintf(lab, sizeof lab, "service=s%d", r);
            snprintf(prod, sizeof prod, "p%d", r);
            add(b, "acme", CP_KIND_CPU, lab, starts[i], prod, (uint64_t)i, wins[i], 0);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if (++n >= 7 + (int)(x % 150)) { /* batches of 7-156 windows */
                commit(b);
                CHECK_EQ(cp_buckets_check(s), 0);
                n = 0;
            }
        }
    commit(b);
    cp_store_batch_destroy(b);
    /* the first 60 windows are 10 minutes: whole minutes and the 10 minutes from rollups */
    static const int64_t range[][2] = {{0, 600}, {0, 60}, {120, 180}, {540, 600}, {300, 600}};
    for (int k = 0; k < 5; k++) {
        int64_t a = T0 + range[k][0] * SEC, z = T0 + range[k][1] * SEC, e0, e1;
        char *want = expected(a, z, &e0, &e1);
        for (int r = 0; r < NSER; r += k + 1) {
            char v[16];
            snprintf(v, sizeof v, "s%d", r);
            cp_selector sel = {0};
            sel_add(&sel, "service", "=", v);
            cp_profile *p = query(s, "acme", CP_KIND_CPU, &sel, a, z);
            sel_free(&sel);
            CHECK_EQ(cp_profile_total(p, 0), e0);
            CHECK_EQ(cp_profile_total(p, 1), e1);
            if (r % 40 == 0) {
                char *got = canonical(p);
                CHECK_STREQ(got, want);
                free(got);
            }
            cp_profile_destroy(p);
        }
        free(want);
    }
    cp_store_close(s);
    check_repair_finds_nothing(dir);
    rmtree(dir);
}

/* Retention passes over a level whose blocks are all newer than its cut without a seek
 * (retention.c: mt_floor); a window arriving late, older than the cut, into a series a pass
 * already found clean still goes at the next pass, at every level. */
TEST(retention_takes_late_windows_of_clean_series)
{
    char *dir = tmpdir("store");
    make_windows(29);
    cp_store *s = open_store(dir, 3600 * SEC, 86400 * SEC);
    int64_t now = starts[NWIN - 1] + WIN, old = now - 3 * 86400 * SEC;
    cp_store_batch *b = cp_store_batch_create(s);
    for (int i = NWIN - 20; i < NWIN; i++) /* the last hour's */
        add(b, "acme", CP_KIND_CPU, "service=late", starts[i], "p", (uint64_t)i, wins[i], 0);
    commit(b);
    uint32_t del = 1;
    CHECK_EQ(cp_store_maintain(s, now, 1000, &del, NULL), 0);
    CHECK_EQ(del, 0);
    /* three days old: past the raw and the rollup retention */
    for (int i = 0; i < 3; i++)
        add(b, "acme", CP_KIND_CPU, "service=late", old + i * WIN, "p2", (uint64_t)i, wins[i], 0);
    commit(b);
    cp_store_batch_destroy(b);
    cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, old - 86400 * SEC, old + 3600 * SEC);
    CHECK(cp_profile_total(p, 1) > 0);
    cp_profile_destroy(p);
    uint32_t total = 0;
    do {
        CHECK_EQ(cp_store_maintain(s, now, 2, &del, NULL), 0); /* 2 a pass: resumes mid-level */
        total += del;
    } while (del);
    CHECK(total >= 3 + 4); /* 3 raw windows; their minute, 10 minutes, hour and day */
    p = query(s, "acme", CP_KIND_CPU, NULL, old - 86400 * SEC, old + 3600 * SEC);
    CHECK_EQ(p->samples.n, 0);
    cp_profile_destroy(p);
    /* the recent windows stay */
    int64_t e0, e1;
    free(expected(starts[NWIN - 20], now, &e0, &e1));
    p = query(s, "acme", CP_KIND_CPU, NULL, starts[NWIN - 20], now);
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    cp_store_close(s);
    rmtree(dir);
}

/* Staged windows belong to their batch: a batch dropped after its adds (cp_store_batch_reset,
 * then cp_store_reopen, as ingest does after a failed write) leaves nothing of them for the
 * next batch to write into the rollups. */
TEST(dropped_batch_leaves_no_staged_windows)
{
    char *dir = tmpdir("store");
    make_windows(18);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    for (int i = 0; i < 20; i++)
        add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
    commit(b);
    /* the next 30 windows are added (staged, same minutes as later ones), then dropped */
    for (int i = 20; i < 50; i++)
        add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
    cp_store_batch_reset(b);
    cp_err err = {0};
    CHECK_EQ(cp_store_batch_commit(b, &err), CP_ESTORE); /* refused until reopened */
    int rc = cp_store_reopen(s, &err);
    if (rc) fprintf(stderr, "reopen: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    /* windows 20-49 sent again (the offsets were not stored), then 50-59 */
    for (int i = 20; i < 60; i++)
        add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
    commit(b);
    cp_store_batch_destroy(b);
    for (int k = 0; k < 3; k++) {
        /* the whole day (its rollup holds windows 0-59 only), then finer ranges */
        int64_t a = k == 0 ? T0 : k == 1 ? starts[20] : starts[33] + SEC;
        int64_t z = k == 0 ? starts[60] : k == 1 ? starts[50] : starts[59];
        int64_t e0, e1;
        free(expected(a, z, &e0, &e1));
        cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, a, k == 0 ? T0 + 86400 * SEC : z);
        CHECK_EQ(cp_profile_total(p, 0), e0);
        CHECK_EQ(cp_profile_total(p, 1), e1);
        cp_profile_destroy(p);
    }
    cp_store_close(s);
    check_repair_finds_nothing(dir);
    rmtree(dir);
}

/* A series' windows reach levels 2-4 through a 10-minute stage (write.c, stage10_flush).
 * Windows that alternate between two 10-minute buckets (each flushes the other's stage),
 * in batches of irregular sizes (a batch ends mid-minute and mid-10-minutes, so buckets
 * that took a stage's rows get more added in the next batch), store every 1-minute,
 * 10-minute, hour and day bucket exactly, with the right window counts. */
TEST(rollups_through_ten_minute_stages)
{
    char *dir = tmpdir("store");
    make_windows(19);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    int k = 0, next_commit = 3;
    for (int r = 0; r < NWIN; r += 100) {
        int m = NWIN - r < 100 ? NWIN - r : 100; /* a run of windows (even) */
        for (int j = 0; j < m; j++, k++) {
            int i = r + (j % 2 ? m / 2 : 0) + j / 2; /* up to 8 minutes apart, alternating */
            add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
            if (k == next_commit) {
                commit(b);
                next_commit += 1 + (k * 7) % 41;
            }
        }
    }
    commit(b);
    cp_store_batch_destroy(b);
    int64_t day0 = T0 - (T0 % (86400 * SEC));
    check_range(s, day0, day0 + 86400 * SEC);
    for (int64_t len = 3600 * SEC; len >= 60 * SEC; len /= len == 3600 * SEC ? 6 : 10)
        for (int64_t a = T0 - (T0 % len); a < starts[NWIN - 1] + WIN; a += len) {
            int any = 0;
            int64_t e0 = 0, e1 = 0;
            for (int i = 0; i < NWIN; i++)
                if (starts[i] >= a && starts[i] < a + len) {
                    any = 1;
                    e0 += cp_profile_total(wins[i], 0);
                    e1 += cp_profile_total(wins[i], 1);
                }
            if (!any) continue;
            if (len > 60 * SEC) {
                check_range(s, a, a + len); /* (the whole content) */
                continue;
            }
            cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, a, a + len); /* 120 minutes */
            CHECK_EQ(cp_profile_total(p, 0), e0);
            CHECK_EQ(cp_profile_total(p, 1), e1);
            cp_profile_destroy(p);
        }
    cp_store_close(s);
    check_repair_finds_nothing(dir);
    rmtree(dir);
}

/* The capture rule (store.h): a capture's series (label `capture`) only for selectors
 * naming the label, in every reader; its window records summed in the series list; capture
 * records kept across a reopen. */
TEST(capture_series_apart_and_records_kept)
{
    char *dir = tmpdir("store");
    make_windows(29);
    cp_store *s = open_store(dir, 0, 0);
    cp_store_batch *b = cp_store_batch_create(s);
    int64_t cap_samples = 0;
    for (int i = 0; i < 20; i++) {
        add(b, "acme", CP_KIND_CPU, "service=api,isolate=w1", starts[i], "p", (uint64_t)i, wins[i],
            0);
        cp_envelope e;
        make_env(&e, "acme", CP_KIND_CPU,
                 i % 2 ? "service=api,isolate=w1,capture=c1"
                       : "service=api,isolate=ghost,capture=c1",
                 starts[i], SEC, "p/capture", (uint64_t)i);
        e.engine =
            strdup(i < 19 ? "test capture asked=1000 ran=1000" : "test capture asked=1000 ran=900");
        cp_err err = {0};
        CHECK_EQ(cp_store_batch_add(b, &e, wins[i + 20], 0, &err), 0);
        /* a duplicate adds no second window record */
        CHECK_EQ(cp_store_batch_add(b, &e, wins[i + 20], 0, &err), CP_STORE_DUPLICATE);
        cp_envelope_close(&e);
        for (uint32_t k = 0; k < wins[i + 20]->samples.n; k++)
            cap_samples += cp_profile_sample_values(wins[i + 20], k)[0];
    }
    commit(b);
    int64_t e0, e1, c0 = 0, c1 = 0;
    free(expected(starts[0], starts[20], &e0, &e1));
    for (int i = 20; i < 40; i++) {
        c0 += cp_profile_total(wins[i], 0);
        c1 += cp_profile_total(wins[i], 1);
    }
    CHECK_EQ(c0, cap_samples);
    int64_t from = T0, to = T0 + 86400 * SEC;
    cp_selector sel = {0};
    cp_profile *p = query(s, "acme", CP_KIND_CPU, NULL, from, to);
    CHECK_EQ(cp_profile_total(p, 1), e1); /* the always-on only */
    cp_profile_destroy(p);
    sel_add(&sel, "service", "=", "api");
    p = query(s, "acme", CP_KIND_CPU, &sel, from, to);
    CHECK_EQ(cp_profile_total(p, 1), e1);
    cp_profile_destroy(p);
    sel_free(&sel);
    sel_add(&sel, "capture", "=", "c1");
    p = query(s, "acme", CP_KIND_CPU, &sel, from, to);
    CHECK_EQ(cp_profile_total(p, 1), c1);
    cp_profile_destroy(p);
    /* the series list: the capture's two, with their windows */
    cp_series_list l = {0};
    cp_err err = {0};
    cp_query q = {.tenant = "acme", .sel = sel, .from_ns = from, .to_ns = to};
    CHECK_EQ(cp_store_series(s, &q, &l, &err), 0);
    CHECK_EQ(l.n, 2);
    uint64_t sum = 0;
    uint32_t nwin = 0;
    for (uint32_t i = 0; i < l.n; i++) {
        sum += l.v[i].cap_samples;
        nwin += l.v[i].cap_windows;
        CHECK(l.v[i].cap_end_ns > l.v[i].last_ns);
        CHECK(l.v[i].cap_engine);
    }
    CHECK_EQ(nwin, 20);
    CHECK_EQ((int64_t)sum, cap_samples);
    cp_series_list_close(&l);
    sel_free(&sel);
    sel_add(&sel, "capture", "=", ""); /* exactly the always-on */
    q.sel = sel;
    CHECK_EQ(cp_store_series(s, &q, &l, &err), 0);
    CHECK_EQ(l.n, 1);
    CHECK(!l.v[0].cap_windows && !l.v[0].cap_engine);
    cp_series_list_close(&l);
    sel_free(&sel);
    q.sel = (cp_selector){0};
    CHECK_EQ(cp_store_series(s, &q, &l, &err), 0);
    CHECK_EQ(l.n, 1);
    cp_series_list_close(&l);
    /* timeline */
    int64_t *v;
    uint32_t ns, nt;
    q.kind = CP_KIND_CPU;
    q.step_ns = 86400 * SEC;
    CHECK_EQ(store_timeline(s, &q, &v, &ns, &nt, &err), 0);
    CHECK_EQ(v[1], e1);
    free(v);
    /* labels and values */
    cp_string_list names = {0}, vals = {0};
    CHECK_EQ(cp_store_label_names(s, &q, &names, &err), 0);
    for (uint32_t i = 0; i < names.n; i++)
        CHECK(strcmp(names.v[i], "capture") != 0);
    CHECK_EQ(names.n, 2); /* isolate, service */
    cp_string_list_close(&names);
    q.label = "isolate";
    CHECK_EQ(cp_store_label_values(s, &q, &vals, &err), 0);
    CHECK_EQ(vals.n, 1); /* ghost is only a capture's */
    CHECK_STREQ(vals.v[0], "w1");
    cp_string_list_close(&vals);
    q.label = "capture";
    CHECK_EQ(cp_store_label_values(s, &q, &vals, &err), 0);
    CHECK_EQ(vals.n, 1);
    CHECK_STREQ(vals.v[0], "c1");
    cp_string_list_close(&vals);

    /* capture records: kept, replaced, listed per tenant or for all, across a reopen */
    cp_capture c = {.id = "c1",
                    .tenant = "acme",
                    .kind = CP_KIND_CPU,
                    .cpu_hz = 1000,
                    .start_ns = T0,
                    .end_ns = T0 + 5 * SEC,
                    .max_overhead_permille = 20};
    c.selector = strdup("{service=\"api\"}");
    CHECK_EQ(cp_store_put_capture(s, &c, &err), 0);
    snprintf(c.id, sizeof c.id, "c2");
    snprintf(c.tenant, sizeof c.tenant, "globex");
    CHECK_EQ(cp_store_put_capture(s, &c, &err), 0);
    c.cancelled = 1;
    CHECK_EQ(cp_store_put_capture(s, &c, &err), 0);
    c.end_ns = c.start_ns; /* invalid: refused */
    CHECK_EQ(cp_store_put_capture(s, &c, &err), CP_EINVAL);
    cp_capture_close(&c);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    s = open_store(dir, 0, 0);
    cp_store_capture_list cl = {0};
    CHECK_EQ(cp_store_captures(s, NULL, &cl, &err), 0);
    CHECK_EQ(cl.n, 2);
    CHECK_STREQ(cl.v[0].tenant, "acme");
    CHECK_STREQ(cl.v[1].id, "c2");
    CHECK(cl.v[1].cancelled);
    cp_store_capture_list_close(&cl);
    CHECK_EQ(cp_store_captures(s, "acme", &cl, &err), 0);
    CHECK_EQ(cl.n, 1);
    cp_store_capture_list_close(&cl);
    CHECK_EQ(cp_store_get_capture(s, "acme", "c1", &c, &err), 0);
    CHECK_STREQ(c.selector, "{service=\"api\"}");
    CHECK_EQ(c.cpu_hz, 1000);
    cp_capture_close(&c);
    CHECK_EQ(cp_store_get_capture(s, "acme", "c2", &c, &err), CP_ENOTFOUND);
    cp_store_close(s);
    rmtree(dir);
}

/* Retention takes a capture's records with its windows: a capture series' window records
 * ('W') once no level holds its windows, a capture record ('K') once its end is older than
 * the longest-kept level; a capture that ended since stays. */
/* Keys of tenant of type (format.h), read from the store's LevelDB itself (closed). */
static uint32_t tenant_keys_of(const char *dir, const char *tenant, char type)
{
    char *lerr = NULL;
    leveldb_options_t *o = leveldb_options_create();
    leveldb_t *db = leveldb_open(o, dir, &lerr);
    CHECK(db != NULL);
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_iterator_t *it = leveldb_create_iterator(db, ro);
    char pre[CP_TENANT_KEY_MAX + 2];
    size_t tl = strlen(tenant);
    memcpy(pre, tenant, tl);
    pre[tl] = 0;
    pre[tl + 1] = type;
    uint32_t n = 0;
    for (leveldb_iter_seek(it, pre, tl + 2); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl;
        const char *k = leveldb_iter_key(it, &kl);
        if (kl < tl + 2 || memcmp(k, pre, tl + 2)) break;
        n++;
    }
    leveldb_iter_destroy(it);
    leveldb_readoptions_destroy(ro);
    leveldb_close(db);
    leveldb_options_destroy(o);
    return n;
}

static uint32_t tenant_keys(const char *dir, char type)
{
    return tenant_keys_of(dir, "acme", type);
}

TEST(capture_records_leave_with_retention)
{
    char *dir = tmpdir("store");
    make_windows(31);
    cp_store *s = open_store(dir, 3600 * SEC, 86400 * SEC);
    cp_store_batch *b = cp_store_batch_create(s);
    for (int i = 0; i < 30; i++) {
        add(b, "acme", CP_KIND_CPU, "service=api", starts[i], "p", (uint64_t)i, wins[i], 0);
        add(b, "acme", CP_KIND_CPU, "service=api,capture=old", starts[i], "p/capture", (uint64_t)i,
            wins[i], 0);
    }
    commit(b);
    int64_t later = starts[29] + 2 * 86400 * SEC;
    add(b, "acme", CP_KIND_CPU, "service=api,capture=new", later, "p/capture", 30, wins[30], 0);
    commit(b);
    cp_store_batch_destroy(b);
    cp_err err = {0};
    cp_capture c = {.id = "old",
                    .tenant = "acme",
                    .kind = CP_KIND_CPU,
                    .cpu_hz = 1000,
                    .start_ns = starts[0],
                    .end_ns = starts[29] + WIN,
                    .max_overhead_permille = 20};
    c.selector = strdup("{service=\"api\"}");
    CHECK_EQ(cp_store_put_capture(s, &c, &err), 0);
    snprintf(c.id, sizeof c.id, "new");
    c.start_ns = later;
    c.end_ns = later + WIN;
    CHECK_EQ(cp_store_put_capture(s, &c, &err), 0);
    cp_capture_close(&c);
    uint32_t del = 0;
    /* within retention: nothing of either capture goes */
    CHECK_EQ(cp_store_maintain(s, starts[29] + 2 * WIN, 1000, &del, &err), 0);
    cp_store_capture_list cl = {0};
    CHECK_EQ(cp_store_captures(s, "acme", &cl, &err), 0);
    CHECK_EQ(cl.n, 2);
    cp_store_capture_list_close(&cl);
    /* a day and a bit after the old capture, a little after the new one */
    do {
        CHECK_EQ(cp_store_maintain(s, later + 2 * WIN, 1000, &del, &err), 0);
    } while (del);
    CHECK_EQ(cp_store_get_capture(s, "acme", "old", &c, &err), CP_ENOTFOUND);
    CHECK_EQ(cp_store_get_capture(s, "acme", "new", &c, &err), 0);
    cp_capture_close(&c);
    cp_store_close(s);
    CHECK_EQ(tenant_keys(dir, CP_K_CAPWIN), 1); /* the new capture's one window */
    rmtree(dir);
}

/* A host's short processes are a series each (instance = host:pid). Once every window of
 * one is past every level's retention, retention forgets it: its record, label index
 * entries, cumulative inputs and capture windows leave the disk and the series the tables
 * (and contprof_store_series); the live series stay whole; a window that comes later with a
 * forgotten series' labels makes a new series; a restart reads ids with gaps, and the
 * repair finds nothing lost in them. */
static void add_cumulative(cp_store_batch *b, const char *labels, int64_t start,
                           const char *producer, uint64_t seq, int64_t total)
{
    const char *names[1] = {"alloc_a"};
    cp_profile *p = mem_profile(1, names, &total, 1);
    cp_envelope e;
    make_env(&e, "acme", CP_KIND_ALLOC, labels, start, WIN, producer, seq);
    e.cumulative = 1;
    CHECK_EQ(cp_store_batch_add(b, &e, p, 0, NULL), 0);
    cp_envelope_close(&e);
    cp_profile_destroy(p);
}

static uint32_t instance_values(cp_store *s, const char *prefix)
{
    cp_string_list l = {0};
    CHECK_EQ(cp_store_label_values(s, &(cp_query){.tenant = "acme", .label = "instance"}, &l, NULL),
             0);
    uint32_t n = 0;
    for (uint32_t i = 0; i < l.n; i++)
        n += !strncmp(l.v[i], prefix, strlen(prefix));
    cp_string_list_close(&l);
    return n;
}

/* The cpu total of sel over every window the test writes (level 0 is past the raw
 * retention by the clock: whole minutes answer). */
static int64_t cpu_total(cp_store *s, const char *sel)
{
    int64_t from = T0 - 4 * 86400 * SEC, to = T0 + 2 * 86400 * SEC;
    cp_selector q = {0};
    CHECK_EQ(cp_selector_parse(sel, &q, NULL), 0);
    cp_profile *p = query(s, "acme", CP_KIND_CPU, &q, from, to);
    int64_t v = cp_profile_total(p, 1);
    cp_profile_destroy(p);
    cp_selector_close(&q);
    return v;
}

TEST(series_past_every_retention_are_forgotten)
{
    char *dir = tmpdir("store");
    make_windows(31);
    cp_store *s = open_store(dir, 3600 * SEC, 86400 * SEC);
    int64_t now = starts[NWIN - 1] + WIN, old = now - 3 * 86400 * SEC;
    cp_store_batch *b = cp_store_batch_create(s);
    char lab[96], prod[16];
    /* 40 processes three days ago (cpu, and a cumulative alloc series for every fourth; one
     * under a capture), each followed by one that runs now (their ids interleave) */
    for (int p = 0; p < 40; p++) {
        snprintf(lab, sizeof lab, "service=job,instance=old:%d%s", p, p == 7 ? ",capture=c7" : "");
        snprintf(prod, sizeof prod, "p%d", p);
        for (int i = 0; i < 3; i++) {
            int64_t at = old + (int64_t)(p * 3 + i) * WIN;
            add(b, "acme", CP_KIND_CPU, lab, at, prod, (uint64_t)i, wins[p * 3 + i], 0);
            if (p % 4 == 0)
                add_cumulative(b, lab, at, "allocs", (uint64_t)(p * 3 + i), 10 * (i + 1));
        }
        snprintf(lab, sizeof lab, "service=job,instance=live:%d", p);
        snprintf(prod, sizeof prod, "live%d", p);
        add(b, "acme", CP_KIND_CPU, lab, starts[NWIN - 40 + p], prod, 0, wins[NWIN - 40 + p], 0);
    }
    commit(b);
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.series, 40 + 10 + 40);
    CHECK_EQ(instance_values(s, "old:"), 39); /* a capture's series is listed apart */
    int64_t live = cpu_total(s, "{instance=\"live:1\"}");
    CHECK(live > 0);
    /* retention in passes of 5 keys, as long as any finds something to delete */
    uint32_t del, passes = 0;
    do {
        CHECK_EQ(cp_store_maintain(s, now, 5, &del, NULL), 0);
        CHECK(++passes < 1000);
    } while (del);
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.series_forgotten, 50);
    CHECK_EQ(st.series, 40);
    CHECK_EQ(instance_values(s, "old:"), 0);
    CHECK_EQ(instance_values(s, "live:"), 40);
    cp_series_list sl;
    CHECK_EQ(cp_store_series(
                 s, &(cp_query){.tenant = "acme", .from_ns = old - 86400 * SEC, .to_ns = now + WIN},
                 &sl, NULL),
             0);
    CHECK_EQ(sl.n, 40);
    for (uint32_t i = 0; i < sl.n; i++) { /* in the order they were made, as before */
        snprintf(lab, sizeof lab, "live:%u", i);
        CHECK_STREQ(cp_labels_get(&sl.v[i].labels, "instance"), lab);
    }
    cp_series_list_close(&sl);
    CHECK_EQ(cpu_total(s, "{instance=\"live:1\"}"), live);
    /* every live series is still found by its labels (its id by the index, its record by
     * its labels: a second window joins it, no new series) */
    for (int p = 0; p < 40; p++) {
        snprintf(lab, sizeof lab, "{instance=\"live:%d\"}", p);
        int64_t e0, e1;
        free(expected(starts[NWIN - 40 + p], starts[NWIN - 40 + p] + 1, &e0, &e1));
        CHECK_EQ(cpu_total(s, lab), e1);
        snprintf(lab, sizeof lab, "service=job,instance=live:%d", p);
        snprintf(prod, sizeof prod, "live%d", p);
        add(b, "acme", CP_KIND_CPU, lab, now, prod, 1, wins[0], 0);
    }
    commit(b);
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.series, 40);
    live = cpu_total(s, "{instance=\"live:1\"}");
    /* a window of a forgotten series' labels, now: a new series holding only it */
    add(b, "acme", CP_KIND_CPU, "service=job,instance=old:3", now, "p3", 100, wins[0], 0);
    commit(b);
    int64_t e0, e1;
    free(expected(starts[0], starts[0] + 1, &e0, &e1));
    CHECK_EQ(cpu_total(s, "{instance=\"old:3\"}"), e1);
    cp_store_batch_destroy(b);
    cp_store_close(s);
    /* every key of the forgotten series is gone: records, index, cumulative, captures */
    CHECK_EQ(tenant_keys(dir, CP_K_SERIES), 41);
    CHECK_EQ(tenant_keys(dir, CP_K_LABEL), 82); /* service and instance of each */
    CHECK_EQ(tenant_keys(dir, CP_K_CUMUL), 0);
    CHECK_EQ(tenant_keys(dir, CP_K_CAPWIN), 0);
    /* a restart reads the ids with their gaps; the new series gets its own */
    s = open_store(dir, 3600 * SEC, 86400 * SEC);
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.series, 41);
    b = cp_store_batch_create(s);
    add(b, "acme", CP_KIND_CPU, "service=job,instance=old:9", now, "p9", 100, wins[1], 0);
    commit(b);
    cp_store_batch_destroy(b);
    CHECK_EQ(cpu_total(s, "{instance=\"old:3\"}"), e1);
    CHECK_EQ(cpu_total(s, "{instance=\"live:1\"}"), live);
    free(expected(starts[1], starts[1] + 1, &e0, &e1));
    CHECK_EQ(cpu_total(s, "{instance=\"old:9\"}"), e1);
    CHECK_EQ(instance_values(s, "old:"), 2);
    cp_store_close(s);
    cp_store_repair_stats rst;
    cp_err err = {0};
    cp_store_options ro = {
        .path = dir, .retention_raw_ns = 3600 * SEC, .retention_rollup_ns = 86400 * SEC};
    CHECK_EQ(cp_store_repair(&ro, NULL, &rst, &err), 0);
    CHECK_EQ(rst.series_missing, 0);
    CHECK_EQ(rst.series_kept, 42);
    CHECK_EQ(rst.blocks_dropped, 0);
    rmtree(dir);
}

/* Queries read a series' blocks outside the tables' lock: one that runs while retention
 * forgets the series keeps it (freed once no query runs). Readers query and list without
 * pause while series are made three days old and forgotten, round after round (under
 * ASan, a series freed under a query is a use after free). */
static void *forget_reader(void *arg)
{
    int64_t from = *(const int64_t *)arg;
    while (!stop_readers) {
        cp_profile *p = NULL;
        CHECK_EQ(cp_store_query(cs,
                                &(cp_query){.tenant = "acme",
                                            .kind = CP_KIND_CPU,
                                            .from_ns = from,
                                            .to_ns = from + 5 * 86400 * SEC},
                                &p, NULL),
                 0);
        cp_profile_destroy(p);
        cp_series_list sl;
        CHECK_EQ(
            cp_store_series(
                cs, &(cp_query){.tenant = "acme", .from_ns = from, .to_ns = from + 5 * 86400 * SEC},
                &sl, NULL),
            0);
        cp_series_list_close(&sl);
        CHECK(instance_values(cs, "") >= 1);
    }
    return NULL;
}

TEST(series_forgotten_under_queries)
{
    char *dir = tmpdir("store");
    make_windows(37);
    cs = open_store(dir, 3600 * SEC, 86400 * SEC);
    int64_t now = starts[NWIN - 1] + WIN, old = now - 3 * 86400 * SEC;
    cp_store_batch *b = cp_store_batch_create(cs);
    add(b, "acme", CP_KIND_CPU, "instance=live", now - WIN, "live", 0, wins[0], 0);
    commit(b);
    stop_readers = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, forget_reader, &old);
    char lab[64], prod[16];
    uint64_t forgotten = 0;
    for (int round = 0; round < 30; round++) {
        for (int p = 0; p < 8; p++) {
            snprintf(lab, sizeof lab, "instance=r%d-%d", round, p);
            snprintf(prod, sizeof prod, "r%d-%d", round, p);
            add(b, "acme", CP_KIND_CPU, lab, old + (int64_t)(round * 8 + p) * WIN, prod, 0,
                wins[(round * 8 + p) % NWIN], 0);
        }
        commit(b);
        uint32_t del;
        do
            CHECK_EQ(cp_store_maintain(cs, now, 7, &del, NULL), 0);
        while (del);
        cp_store_stats st;
        cp_store_get_stats(cs, &st);
        CHECK_EQ(st.series, 1);
        forgotten = st.series_forgotten;
    }
    stop_readers = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(forgotten, 30 * 8);
    /* with no query running, the next pass frees every series kept for one */
    uint32_t del;
    CHECK_EQ(cp_store_maintain(cs, now, 7, &del, NULL), 0);
    CHECK_EQ(cs->forgotten.n, 0);
    cp_store_batch_destroy(b);
    cp_store_close(cs);
    rmtree(dir);
}

/* A query that does not end (here: the store's dblock held for reading, as a query holds it
 * throughout) keeps the series retention forgot without holding retention up, until
 * forgotten_wait of them are kept: then a pass waits for the query to end and frees them. */
static atomic_int long_armed, long_done;
static void *long_query(void *arg)
{
    cp_store *s = arg;
    pthread_rwlock_rdlock(&s->dblock);
    atomic_store(&long_done, 1); /* holding */
    while (!atomic_load(&long_armed))
        usleep(1000);
    usleep(2000 * 1000); /* what retention must wait for */
    atomic_store(&long_done, 2);
    pthread_rwlock_unlock(&s->dblock);
    return NULL;
}

static void forget_old_series(cp_store *s, int from, int n, int64_t old, int64_t now)
{
    cp_store_batch *b = cp_store_batch_create(s);
    char lab[64];
    for (int p = from; p < from + n; p++) {
        snprintf(lab, sizeof lab, "instance=h:%d", p);
        add(b, "acme", CP_KIND_CPU, lab, old + (int64_t)p * WIN, lab, 0, wins[p], 0);
    }
    commit(b);
    cp_store_batch_destroy(b);
    uint32_t del;
    do
        CHECK_EQ(cp_store_maintain(s, now, 1000, &del, NULL), 0);
    while (del);
}

TEST(forgotten_series_wait_for_a_query_only_so_long)
{
    char *dir = tmpdir("store");
    make_windows(41);
    cp_store *s = open_store(dir, 3600 * SEC, 86400 * SEC);
    s->forgotten_wait = 8;
    int64_t now = starts[NWIN - 1] + WIN, old = now - 3 * 86400 * SEC;
    pthread_t th;
    pthread_create(&th, NULL, long_query, s);
    while (atomic_load(&long_done) != 1)
        usleep(1000);
    forget_old_series(s, 0, 5, old, now); /* returns at once: the query holds them */
    CHECK_EQ(s->forgotten.n, 5);
    CHECK_EQ(atomic_load(&long_done), 1);
    atomic_store(&long_armed, 1);
    forget_old_series(s, 5, 5, old, now); /* the eighth: this pass waits for the query */
    CHECK_EQ(atomic_load(&long_done), 2);
    CHECK_EQ(s->forgotten.n, 0);
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    CHECK_EQ(st.series_forgotten, 10);
    pthread_join(th, NULL);
    cp_store_close(s);
    rmtree(dir);
}

/* Every process is a producer with a record of its own ('P', the duplicate check). A record
 * whose producer's last window is past every level's retention goes, read a few a pass
 * from a cursor that resumes (here 7: ten live producers sort first, in two tenants); the
 * live ones stay and still drop a repeat. */
TEST(producer_records_leave_with_retention)
{
    char *dir = tmpdir("store");
    make_windows(43);
    cp_store *s = open_store(dir, 3600 * SEC, 86400 * SEC);
    s->prod_scan = 7;
    int64_t now = starts[NWIN - 1] + WIN, old = now - 3 * 86400 * SEC;
    cp_store_batch *b = cp_store_batch_create(s);
    char prod[32];
    for (int k = 0; k < 2; k++) {
        const char *tn = k ? "beta" : "acme";
        for (int p = 0; p < 10; p++) {
            snprintf(prod, sizeof prod, "a-live-%d", p);
            add(b, tn, CP_KIND_CPU, "service=api", starts[NWIN - 30 + p], prod, 5, wins[p], 0);
        }
        for (int p = 0; p < 30; p++) {
            snprintf(prod, sizeof prod, "b-old-%02d", p);
            add(b, tn, CP_KIND_CPU, "service=job", old + (int64_t)p * WIN, prod, 1, wins[p], 0);
        }
    }
    commit(b);
    for (int pass = 0; pass < 20; pass++) {
        uint32_t del;
        CHECK_EQ(cp_store_maintain(s, now, 1000, &del, NULL), 0);
    }
    for (int p = 0; p < 10; p++) { /* the live ones still know what they sent */
        snprintf(prod, sizeof prod, "a-live-%d", p);
        add(b, "beta", CP_KIND_CPU, "service=api", starts[NWIN - 30 + p], prod, 5, wins[p],
            CP_STORE_DUPLICATE);
    }
    cp_store_batch_destroy(b);
    cp_store_close(s);
    CHECK_EQ(tenant_keys_of(dir, "acme", CP_K_PRODUCER), 10);
    CHECK_EQ(tenant_keys_of(dir, "beta", CP_K_PRODUCER), 10);
    rmtree(dir);
}

TEST_MAIN(T(exact_totals_and_rollups), T(timeline_matches_queries),
          T(timeline_and_series_past_raw_retention), T(inuse_is_a_gauge),
          T(cumulative_alloc_not_double_counted), T(duplicates_dropped),
          T(tenants_isolated_and_labels), T(retention_frees_disk),
          T(capture_records_leave_with_retention), T(unknown_version_refused),
          T(bad_inputs_refused_batch_usable), T(same_address_other_function), T(concurrent_readers),
          T(same_start_summed), T(one_binary_at_two_bases_is_one_frame_set),
          T(format_1_store_read_canonical), T(reopen_under_readers),
          T(rollups_of_one_batch_equal_window_by_window), T(rollups_of_many_series_in_one_cache),
          T(retention_takes_late_windows_of_clean_series),
          T(dropped_batch_leaves_no_staged_windows), T(rollups_through_ten_minute_stages),
          T(symbols_under_reopen), T(capture_series_apart_and_records_kept),
          T(series_past_every_retention_are_forgotten), T(series_forgotten_under_queries),
          T(forgotten_series_wait_for_a_query_only_so_long),
          T(producer_records_leave_with_retention))
