/* The writer's stack cache (store/wcache.c) on a real LevelDB: windows decoded with lazy
 * ids and stored through the cache give exactly what the same bytes give decoded in full;
 * a table that changed under the same ids is not trusted; a bad id is refused with the
 * batch still usable; labelled samples and a spent budget lose nothing. */
#include "format.h"
#include "pprof.h"
#include "store.h"
#include "store_util.h"
#include "synth.h"
#include "model/util.h"

#define WIN (10 * SEC)

/* Two stores fed the same encoded windows: one through lazy ids and the cache, one with
 * the windows decoded in full (the path without the cache). */
typedef struct pair {
    char *dir;
    cp_store *lazy, *full;
    cp_store_batch *bl, *bf;
    cp_pprof_decoder *dec;
    cp_profile *p;
    cp_pprof_lazy lz;
} pair;

static cp_store *open_at(const char *dir, const char *name, size_t cache_bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cp_store_options o = {.path = path, .stack_cache_bytes = cache_bytes};
    cp_store *s = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_open(&o, &s, &err), 0);
    return s;
}

static void pair_open(pair *x, size_t cache_bytes)
{
    memset(x, 0, sizeof *x);
    x->dir = tmpdir("stack-cache");
    x->lazy = open_at(x->dir, "lazy", cache_bytes);
    x->full = open_at(x->dir, "full", 0);
    x->bl = cp_store_batch_create(x->lazy);
    x->bf = cp_store_batch_create(x->full);
    x->dec = cp_pprof_decoder_create(NULL);
    x->p = cp_profile_create();
    CHECK(x->bl && x->bf && x->dec && x->p);
}

static void pair_close(pair *x)
{
    cp_store_batch_destroy(x->bl);
    cp_store_batch_destroy(x->bf);
    cp_store_close(x->lazy);
    cp_store_close(x->full);
    cp_pprof_decoder_destroy(x->dec);
    cp_profile_destroy(x->p);
    cp_pprof_lazy_close(&x->lz);
    rmtree(x->dir); /* frees it */
}

/* Adds the raw pprof b as window seq of instance inst to both stores; want is what the
 * lazy store returns (the full decode of a bad window fails in the decoder instead). */
static void pair_add(pair *x, const cp_buf *b, const char *inst, uint64_t seq, int want,
                     cp_err *err)
{
    char labels[64];
    snprintf(labels, sizeof labels, "service=svc,instance=%s", inst);
    cp_envelope e;
    make_env(&e, "acme", CP_KIND_CPU, labels, T0 + (int64_t)seq * WIN, WIN, inst, seq);
    CHECK_EQ(cp_pprof_decoder_decode_lazy(x->dec, b->data, b->len, x->p, &x->lz, err), 0);
    CHECK(x->lz.nlazy > 0);
    int rc = cp_store_batch_add_lazy(x->bl, &e, x->p, &x->lz, 0, err);
    if (rc != want) fprintf(stderr, "lazy add: rc %d: %s\n", rc, err->msg);
    CHECK_EQ(rc, want);
    if (!want) {
        cp_err ferr = {0};
        CHECK_EQ(cp_pprof_decoder_decode(x->dec, b->data, b->len, x->p, &ferr), 0);
        CHECK_EQ(cp_store_batch_add(x->bf, &e, x->p, 0, &ferr), 0);
    }
    cp_envelope_close(&e);
}

static void pair_commit(pair *x)
{
    cp_err err = {0};
    CHECK_EQ(cp_store_batch_commit(x->bl, &err), 0);
    CHECK_EQ(cp_store_batch_commit(x->bf, &err), 0);
}

/* Both stores answer [from, to) with the same stacks and values. */
static void pair_same(pair *x, int64_t from, int64_t to)
{
    cp_profile *a = NULL, *b = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_query(
                 x->lazy,
                 &(cp_query){.tenant = "acme", .kind = CP_KIND_CPU, .from_ns = from, .to_ns = to},
                 &a, &err),
             0);
    CHECK_EQ(cp_store_query(
                 x->full,
                 &(cp_query){.tenant = "acme", .kind = CP_KIND_CPU, .from_ns = from, .to_ns = to},
                 &b, &err),
             0);
    CHECK(a->samples.n > 0);
    CHECK_EQ(cp_profile_total(a, 1), cp_profile_total(b, 1));
    char *ca = canonical(a), *cb = canonical(b);
    CHECK_STREQ(ca, cb);
    free(ca);
    free(cb);
    cp_profile_destroy(a);
    cp_profile_destroy(b);
}

/* A stream's profile with w's sample types and period, no samples yet. */
static cp_profile *stream_for(const cp_profile *w)
{
    cp_profile *e = cp_profile_create();
    CHECK(e);
    for (uint32_t t = 0; t < w->sample_types.n; t++)
        CHECK_EQ(cp_profile_add_sample_type(e, cp_profile_str(w, w->sample_types.v[t].type),
                                            cp_profile_str(w, w->sample_types.v[t].unit)),
                 0);
    e->period = w->period;
    return e;
}

/* The next window of stream e: w's samples in e's numbering, encoded raw into b. */
static void stream_window(cp_profile *e, const cp_profile *w, cp_buf *b)
{
    cp_profile_next_window(e, e->strs.off.n);
    CHECK_EQ(cp_synth_stream_add(e, w), 0);
    b->len = 0;
    CHECK_EQ(cp_pprof_encode(e, 0, b), 0);
}

/* Two instances, 40 windows each, from services that grow: later windows bring frames
 * the stream has not seen (appended to its tables), most stacks come again. */
TEST(stable_stream_stores_what_the_full_decode_stores)
{
    pair x;
    pair_open(&x, 0);
    cp_synth *sy = cp_synth_create(7, 2000);
    cp_profile *e[2] = {NULL, NULL};
    cp_buf b = {0};
    cp_err err = {0};
    for (uint64_t i = 0; i < 40; i++)
        for (int k = 0; k < 2; k++) {
            cp_profile *w = cp_synth_cpu_window(sy, 100 + 25 * (uint32_t)i, T0, WIN);
            CHECK(w);
            if (!e[k]) e[k] = stream_for(w);
            stream_window(e[k], w, &b);
            pair_add(&x, &b, k ? "b" : "a", i, 0, &err);
            cp_profile_destroy(w);
            if (i % 9 == 8) pair_commit(&x);
        }
    pair_commit(&x);
    pair_same(&x, T0, T0 + 40 * WIN);
    pair_same(&x, T0 + 17 * WIN, T0 + 18 * WIN);
    cp_store_stats st;
    cp_store_get_stats(x.lazy, &st);
    /* most samples of the later windows are stacks seen before */
    CHECK(st.stack_cache_hits > st.stack_cache_misses);
    CHECK(st.stack_cache_misses > 0);
    CHECK(st.stack_cache_bytes > 0);
    CHECK_EQ(st.stack_cache_flushes, 0);
    /* a reopened store starts without caches and still agrees */
    cp_err rerr = {0};
    CHECK_EQ(cp_store_reopen(x.lazy, &rerr), 0);
    cp_store_get_stats(x.lazy, &st);
    CHECK_EQ(st.stack_cache_bytes, 0);
    for (uint64_t i = 40; i < 44; i++) {
        cp_profile *w = cp_synth_cpu_window(sy, 500, T0, WIN);
        stream_window(e[0], w, &b);
        pair_add(&x, &b, "a", i, 0, &err);
        cp_profile_destroy(w);
    }
    pair_commit(&x);
    pair_same(&x, T0, T0 + 44 * WIN);
    cp_profile_destroy(e[0]);
    cp_profile_destroy(e[1]);
    cp_buf_close(&b);
    cp_synth_destroy(sy);
    pair_close(&x);
}

/* The same ids and sample bytes, but a location, a mapping's build ID or a function
 * changed between windows: the cache must not name the old frames. */
TEST(a_table_changed_under_the_same_ids_is_not_trusted)
{
    for (int what = 0; what < 3; what++) {
        pair x;
        pair_open(&x, 0);
        cp_profile *p = cp_profile_create();
        CHECK_EQ(cp_profile_add_sample_type(p, "samples", "count"), 0);
        CHECK_EQ(cp_profile_add_sample_type(p, "cpu", "nanoseconds"), 0);
        cp_mapping m = {.start = 0x1000, .limit = 0x100000, .offset = 0x1000};
        CHECK_EQ(cp_profile_intern_cstr(p, "/usr/bin/app", &m.filename), 0);
        CHECK_EQ(cp_profile_intern_cstr(p, "aaaa", &m.build_id), 0);
        uint32_t mid, fid, loc[3];
        CHECK_EQ(cp_profile_add_mapping(p, &m, &mid), 0);
        cp_function f = {0};
        CHECK_EQ(cp_profile_intern_cstr(p, "hot", &f.name), 0);
        f.system_name = f.name;
        CHECK_EQ(cp_profile_add_function(p, &f, &fid), 0);
        for (int i = 0; i < 3; i++)
            CHECK_EQ(cp_profile_add_location(p, 0x2000 + 0x100 * (uint64_t)i, mid,
                                             &(cp_line){fid, 10 + i}, 1, &loc[i]),
                     0);
        uint32_t nstr = p->strs.off.n;
        int64_t v[2] = {3, 30};
        cp_buf b = {0};
        cp_err err = {0};
        for (uint64_t seq = 0; seq < 3; seq++) {
            cp_profile_next_window(p, nstr);
            if (seq == 2) { /* the last window: same ids, other meaning */
                if (what == 0) p->locations.v[1].address = 0x9000;
                if (what == 1) {
                    CHECK_EQ(cp_profile_intern_cstr(p, "bbbb", &p->mappings.v[0].build_id), 0);
                    nstr = p->strs.off.n;
                }
                if (what == 2) {
                    CHECK_EQ(cp_profile_intern_cstr(p, "cold", &p->functions.v[0].name), 0);
                    nstr = p->strs.off.n;
                }
            }
            CHECK_EQ(cp_profile_add_sample(p, loc, 3, v, NULL, 0), 0);
            CHECK_EQ(cp_profile_add_sample(p, loc + 1, 2, v, NULL, 0), 0);
            b.len = 0;
            CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
            pair_add(&x, &b, "a", seq, 0, &err);
        }
        pair_commit(&x);
        cp_store_stats st;
        cp_store_get_stats(x.lazy, &st);
        CHECK_EQ(st.stack_cache_hits, 2); /* the second window's two samples only */
        pair_same(&x, T0 + 2 * WIN, T0 + 3 * WIN);
        pair_same(&x, T0, T0 + 3 * WIN);
        cp_profile *q = NULL;
        CHECK_EQ(cp_store_query(x.lazy,
                                &(cp_query){.tenant = "acme",
                                            .kind = CP_KIND_CPU,
                                            .from_ns = T0 + 2 * WIN,
                                            .to_ns = T0 + 3 * WIN},
                                &q, &err),
                 0);
        char *c = canonical(q);
        if (what == 2) CHECK_CONTAINS(c, "cold:");
        if (what == 2) CHECK(!strstr(c, "hot:"));
        cp_profile_destroy(q);
        free(c);
        cp_buf_close(&b);
        cp_profile_destroy(p);
        pair_close(&x);
    }
}

/* A lazy sample naming a location the window does not have: refused as the decoder would
 * refuse it, the batch unchanged and usable; the window after it is stored. */
TEST(a_bad_lazy_id_is_refused_and_the_batch_goes_on)
{
    pair x;
    pair_open(&x, 0);
    cp_synth *sy = cp_synth_create(3, 500);
    cp_profile *w = cp_synth_cpu_window(sy, 300, T0, WIN);
    cp_profile *e = stream_for(w);
    cp_buf good = {0}, bad = {0};
    cp_err err = {0};
    stream_window(e, w, &good);
    pair_add(&x, &good, "a", 0, 0, &err);
    /* the same tables with one more sample naming location n + 7 */
    uint32_t ids[2] = {1, e->locations.n + 7};
    int64_t v[2] = {1, 10};
    CHECK_EQ(cp_profile_add_sample(e, ids, 2, v, NULL, 0), 0);
    CHECK_EQ(cp_pprof_encode(e, 0, &bad), 0);
    uint32_t bad_sample = e->samples.n - 1;
    pair_add(&x, &bad, "a", 1, CP_EPPROF, &err);
    char want[160];
    snprintf(want, sizeof want,
             "sample[%u].location_id[1]: location %u not found (profile has %u locations)",
             bad_sample, e->locations.n + 7, e->locations.n);
    CHECK_STREQ(err.msg, want);
    /* the decoder without lazy ids says the same */
    cp_err ferr = {0};
    CHECK_EQ(cp_pprof_decoder_decode(x.dec, bad.data, bad.len, x.p, &ferr), CP_EPPROF);
    CHECK_STREQ(ferr.msg, want);
    stream_window(e, w, &good);
    pair_add(&x, &good, "a", 2, 0, &err);
    pair_commit(&x);
    pair_same(&x, T0, T0 + 3 * WIN);
    cp_profile *q = NULL;
    CHECK_EQ(cp_store_query(
                 x.lazy,
                 &(cp_query){
                     .tenant = "acme", .kind = CP_KIND_CPU, .from_ns = T0, .to_ns = T0 + 3 * WIN},
                 &q, &err),
             0);
    CHECK_EQ(cp_profile_total(q, 0), 2 * cp_profile_total(w, 0));
    cp_profile_destroy(q);
    cp_buf_close(&good);
    cp_buf_close(&bad);
    cp_profile_destroy(e);
    cp_profile_destroy(w);
    cp_synth_destroy(sy);
    pair_close(&x);
}

/* Labelled samples (never cached) and a budget too small for one series (every cache
 * dropped after each window, and counted) still store what the full decode stores. */
TEST(labels_and_a_spent_budget_lose_nothing)
{
    pair x;
    pair_open(&x, 1);
    cp_synth *sy = cp_synth_create(11, 800);
    cp_profile *e = NULL;
    cp_buf b = {0};
    cp_err err = {0};
    for (uint64_t i = 0; i < 12; i++) {
        cp_profile *w = cp_synth_cpu_window(sy, 400, T0, WIN);
        if (!e) e = stream_for(w);
        stream_window(e, w, &b);
        /* and a labelled sample of the first stack */
        cp_label lb = {0};
        CHECK_EQ(cp_profile_intern_cstr(e, "span", &lb.key), 0);
        CHECK_EQ(cp_profile_intern_cstr(e, i % 2 ? "odd" : "even", &lb.str), 0);
        int64_t v[2] = {5, 50};
        const cp_sample *s0 = &e->samples.v[0];
        CHECK_EQ(cp_profile_add_sample(e, e->stack.v + s0->loc_off, s0->nlocs, v, &lb, 1), 0);
        b.len = 0;
        CHECK_EQ(cp_pprof_encode(e, 0, &b), 0);
        pair_add(&x, &b, "a", i, 0, &err);
        cp_profile_destroy(w);
    }
    pair_commit(&x);
    pair_same(&x, T0, T0 + 12 * WIN);
    cp_store_stats st;
    cp_store_get_stats(x.lazy, &st);
    CHECK(st.stack_cache_flushes >= 12);
    CHECK_EQ(st.stack_cache_hits, 0);
    CHECK_EQ(st.stack_cache_bytes, 0);
    cp_profile_destroy(e);
    cp_buf_close(&b);
    cp_synth_destroy(sy);
    pair_close(&x);
}

/* A window whose location messages take over 4 MiB is stored, but its series keeps no
 * cache (the cache's bound on what it copies of a window). */
TEST(a_huge_table_is_not_followed)
{
    pair x;
    pair_open(&x, 0);
    cp_profile *p = cp_profile_create();
    CHECK_EQ(cp_profile_add_sample_type(p, "samples", "count"), 0);
    CHECK_EQ(cp_profile_add_sample_type(p, "cpu", "nanoseconds"), 0);
    cp_mapping m = {.start = 0x1000, .limit = 1ull << 40, .offset = 0x1000};
    CHECK_EQ(cp_profile_intern_cstr(p, "/usr/bin/big", &m.filename), 0);
    uint32_t mid, id = 0;
    CHECK_EQ(cp_profile_add_mapping(p, &m, &mid), 0);
    for (uint32_t i = 0; i < 400000; i++) /* about 12 bytes each with its key and length */
        CHECK_EQ(cp_profile_add_location(p, 0x100000000ull + 64 * (uint64_t)i, mid, NULL, 0, &id),
                 0);
    uint32_t nstr = p->strs.off.n, ids[3] = {1, 200000, id};
    int64_t v[2] = {1, 10};
    cp_buf b = {0};
    cp_err err = {0};
    for (uint64_t seq = 0; seq < 2; seq++) {
        cp_profile_next_window(p, nstr);
        CHECK_EQ(cp_profile_add_sample(p, ids, 3, v, NULL, 0), 0);
        b.len = 0;
        CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
        CHECK(b.len > (4u << 20));
        pair_add(&x, &b, "a", seq, 0, &err);
    }
    pair_commit(&x);
    pair_same(&x, T0, T0 + 2 * WIN);
    cp_store_stats st;
    cp_store_get_stats(x.lazy, &st);
    CHECK_EQ(st.stack_cache_hits, 0);
    CHECK_EQ(st.stack_cache_bytes, 0);
    cp_buf_close(&b);
    cp_profile_destroy(p);
    pair_close(&x);
}

TEST_MAIN(T(stable_stream_stores_what_the_full_decode_stores),
          T(a_table_changed_under_the_same_ids_is_not_trusted),
          T(a_bad_lazy_id_is_refused_and_the_batch_goes_on),
          T(labels_and_a_spent_budget_lose_nothing), T(a_huge_table_is_not_followed))
