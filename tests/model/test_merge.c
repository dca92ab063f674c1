/* The streaming merger: totals add up, order does not matter, empty inputs are neutral,
 * incompatible inputs are refused by name, and content is deduplicated. */
#include "test.h"
#include "merge.h"
#include "pload.h"
#include "pprof.h"
#include "synth.h"
#include "util.h"

static cp_profile *windows[8];

static void make_windows(void)
{
    cp_synth *s = cp_synth_create(7, 2000);
    for (int i = 0; i < 8; i++) {
        windows[i] = cp_synth_cpu_window(s, 1000, 1700000000000000000LL + i * 10000000000LL, 10000000000LL);
        CHECK(windows[i]);
    }
    cp_synth_destroy(s);
}

/* A profile with the same content as p but different ids and order: encode, then shuffle
 * by re-adding through the builder in reverse. */
static cp_profile *reordered(const cp_profile *p)
{
    cp_profile *q = cp_profile_create();
    uint32_t nf = p->functions.n, nl = p->locations.n;
    uint32_t *fmap = calloc(nf + 1, sizeof *fmap), *lmap = calloc(nl + 1, sizeof *lmap);
    for (uint32_t t = 0; t < p->sample_types.n; t++)
        cp_profile_add_sample_type(q, cp_profile_str(p, p->sample_types.v[t].type), cp_profile_str(p, p->sample_types.v[t].unit));
    cp_profile_intern_cstr(q, cp_profile_str(p, p->period_type.type), &q->period_type.type);
    cp_profile_intern_cstr(q, cp_profile_str(p, p->period_type.unit), &q->period_type.unit);
    q->period = p->period;
    q->time_nanos = p->time_nanos;
    q->duration_nanos = p->duration_nanos;
    uint32_t mid = 0;
    cp_mapping m = p->mappings.v[0];
    cp_profile_intern_cstr(q, cp_profile_str(p, m.filename), &m.filename);
    cp_profile_intern_cstr(q, cp_profile_str(p, m.build_id), &m.build_id);
    m.start += 0x10000; /* the same file loaded elsewhere: addresses shift with it */
    m.limit += 0x10000;
    cp_profile_add_mapping(q, &m, &mid);
    for (uint32_t i = nf; i-- > 0;) {
        cp_function f = p->functions.v[i];
        cp_profile_intern_cstr(q, cp_profile_str(p, f.name), &f.name);
        cp_profile_intern_cstr(q, cp_profile_str(p, f.system_name), &f.system_name);
        cp_profile_intern_cstr(q, cp_profile_str(p, f.filename), &f.filename);
        cp_profile_add_function(q, &f, &fmap[i + 1]);
    }
    for (uint32_t i = nl; i-- > 0;) {
        const cp_location *l = &p->locations.v[i];
        cp_line ln[8];
        for (uint32_t k = 0; k < l->nlines; k++) {
            ln[k] = p->lines.v[l->line_off + k];
            ln[k].function_id = fmap[ln[k].function_id];
        }
        cp_profile_add_location(q, l->address + 0x10000, mid, ln, l->nlines, &lmap[i + 1]);
    }
    for (uint32_t i = p->samples.n; i-- > 0;) {
        const cp_sample *s = &p->samples.v[i];
        uint32_t locs[128];
        for (uint32_t k = 0; k < s->nlocs; k++) locs[k] = lmap[p->stack.v[s->loc_off + k]];
        cp_profile_add_sample(q, locs, s->nlocs, cp_profile_sample_values(p, i), NULL, 0);
    }
    free(fmap);
    free(lmap);
    return q;
}

static void free_windows(void)
{
    for (int i = 0; i < 8; i++) cp_profile_destroy(windows[i]);
}

static cp_profile *merge_all(cp_profile **ps, int n)
{
    cp_merger *m = cp_merger_create();
    cp_err err = {0};
    for (int i = 0; i < n; i++) CHECK_EQ(cp_merger_add(m, ps[i], &err), 0);
    cp_profile *out = cp_merger_finish(m);
    cp_merger_destroy(m);
    return out;
}

TEST(totals_add_up)
{
    make_windows();
    cp_profile *out = merge_all(windows, 8);
    int64_t want0 = 0, want1 = 0;
    for (int i = 0; i < 8; i++) {
        want0 += cp_profile_total(windows[i], 0);
        want1 += cp_profile_total(windows[i], 1);
    }
    CHECK_EQ(cp_profile_total(out, 0), want0);
    CHECK_EQ(cp_profile_total(out, 1), want1);
    CHECK_EQ(want0, 8000);
    CHECK_EQ(out->duration_nanos, 80000000000LL);
    CHECK_EQ(out->time_nanos, windows[0]->time_nanos);
    CHECK_EQ(out->period, 10000000);
    /* deduplicated: no function, location or stack appears twice */
    CHECK(out->functions.n <= 1200);
    CHECK(out->samples.n <= 2000);
    CHECK_EQ(out->mappings.n, 1);
    cp_profile_destroy(out);
    free_windows();
}

TEST(order_does_not_matter)
{
    make_windows();
    cp_profile *a = merge_all(windows, 8);
    cp_profile *rev[8];
    for (int i = 0; i < 8; i++) rev[i] = (i % 2) ? reordered(windows[7 - i]) : windows[7 - i];
    cp_profile *b = merge_all(rev, 8);
    char *ca = canonical(a), *cb = canonical(b);
    CHECK_STREQ(ca, cb);
    CHECK_EQ(a->functions.n, b->functions.n);
    CHECK_EQ(a->locations.n, b->locations.n);
    CHECK_EQ(a->samples.n, b->samples.n);
    free(ca);
    free(cb);
    for (int i = 0; i < 8; i++)
        if (i % 2) cp_profile_destroy(rev[i]);
    cp_profile_destroy(a);
    cp_profile_destroy(b);
    free_windows();
}

TEST(empty_profile_changes_nothing)
{
    make_windows();
    cp_profile *a = merge_all(windows, 3);
    cp_profile *empty = cp_profile_create(), *same_types = cp_profile_create();
    cp_profile_add_sample_type(same_types, "samples", "count");
    cp_profile_add_sample_type(same_types, "cpu", "nanoseconds");
    cp_profile *in[5] = {empty, windows[0], same_types, windows[1], windows[2]};
    cp_profile *b = merge_all(in, 5);
    char *ca = canonical(a), *cb = canonical(b);
    CHECK_STREQ(ca, cb);
    CHECK_EQ(a->duration_nanos, b->duration_nanos);
    CHECK_EQ(a->time_nanos, b->time_nanos);
    free(ca);
    free(cb);
    cp_profile_destroy(a);
    cp_profile_destroy(b);
    cp_profile_destroy(empty);
    cp_profile_destroy(same_types);
    free_windows();
}

TEST(incompatible_types_refused)
{
    make_windows();
    cp_merger *m = cp_merger_create();
    cp_err err = {0};
    CHECK_EQ(cp_merger_add(m, windows[0], &err), 0);
    cp_profile *heap = cp_profile_create();
    cp_profile_add_sample_type(heap, "alloc_objects", "count");
    cp_profile_add_sample_type(heap, "alloc_space", "bytes");
    CHECK_EQ(cp_merger_add(m, heap, &err), CP_EINCOMPAT);
    CHECK_CONTAINS(err.msg, "sample type 0 is alloc_objects/count, expected samples/count");
    cp_profile *one = cp_profile_create();
    cp_profile_add_sample_type(one, "samples", "count");
    CHECK_EQ(cp_merger_add(m, one, &err), CP_EINCOMPAT);
    CHECK_CONTAINS(err.msg, "1 sample types, expected 2");
    /* the merger is unchanged by the refusals */
    cp_profile *out = cp_merger_finish(m);
    CHECK_EQ(cp_profile_total(out, 0), cp_profile_total(windows[0], 0));
    cp_profile_destroy(out);
    cp_profile_destroy(heap);
    cp_profile_destroy(one);
    cp_merger_destroy(m);
    free_windows();
}

TEST(scaled_merge_subtracts)
{
    make_windows();
    cp_merger *m = cp_merger_create();
    cp_err err = {0};
    CHECK_EQ(cp_merger_add(m, windows[0], &err), 0);
    CHECK_EQ(cp_merger_add(m, windows[1], &err), 0);
    CHECK_EQ(cp_merger_add_scaled(m, windows[1], -1.0, &err), 0);
    cp_profile *out = cp_merger_finish(m);
    char *ca = canonical(windows[0]), *cb = canonical(out);
    CHECK_STREQ(ca, cb); /* all-zero samples are dropped, the rest is windows[0] */
    free(ca);
    free(cb);
    /* the merger is reusable after finish */
    CHECK_EQ(cp_merger_add(m, windows[2], &err), 0);
    cp_profile *again = cp_merger_finish(m);
    CHECK_EQ(cp_profile_total(again, 0), cp_profile_total(windows[2], 0));
    cp_profile_destroy(out);
    cp_profile_destroy(again);
    cp_merger_destroy(m);
    free_windows();
}

TEST(labels_keep_samples_apart)
{
    cp_profile *p = cp_profile_create();
    cp_profile_add_sample_type(p, "samples", "count");
    cp_function f = {0};
    uint32_t fid, lid, k, v1, v2;
    cp_profile_intern_cstr(p, "f", &f.name);
    cp_profile_add_function(p, &f, &fid);
    cp_line ln = {fid, 1};
    cp_profile_add_location(p, 0, 0, &ln, 1, &lid);
    cp_profile_intern_cstr(p, "thread", &k);
    cp_profile_intern_cstr(p, "a", &v1);
    cp_profile_intern_cstr(p, "b", &v2);
    cp_label la = {k, v1, 0, 0}, lb = {k, v2, 0, 0};
    int64_t one = 1;
    cp_profile_add_sample(p, &lid, 1, &one, &la, 1);
    cp_profile_add_sample(p, &lid, 1, &one, &lb, 1);
    cp_profile_add_sample(p, &lid, 1, &one, &la, 1);
    cp_profile *in[2] = {p, p};
    cp_profile *out = merge_all(in, 2);
    CHECK_EQ(out->samples.n, 2);
    CHECK_EQ(cp_profile_total(out, 0), 6);
    CHECK_EQ(out->functions.n, 1);
    cp_profile_destroy(out);
    cp_profile_destroy(p);
}

TEST(scale_and_select_types)
{
    make_windows();
    cp_profile *p = cp_profile_clone(windows[0]);
    int64_t t1 = cp_profile_total(p, 1);
    cp_profile_scale(p, 2.0);
    CHECK_EQ(cp_profile_total(p, 1), 2 * t1);
    const char *sel[] = {"cpu"};
    cp_err err = {0};
    CHECK_EQ(cp_profile_select_types(p, sel, 1, &err), 0);
    CHECK_EQ(p->sample_types.n, 1);
    CHECK_EQ(cp_profile_total(p, 0), 2 * t1);
    const char *bad[] = {"alloc_space"};
    CHECK_EQ(cp_profile_select_types(p, bad, 1, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "\"alloc_space\" is not in the profile");
    cp_profile_destroy(p);
    free_windows();
}

/* Inputs for pload tests: encoded windows in memory, one of them possibly damaged. */
typedef struct mem_inputs {
    cp_buf b[8];
} mem_inputs;

static int read_mem(void *ctx, size_t i, cp_buf *out, cp_err *err)
{
    (void)err;
    mem_inputs *in = ctx;
    return cp_buf_append(out, in->b[i].data, in->b[i].len);
}

TEST(parallel_load_equals_sequential)
{
    make_windows();
    mem_inputs in;
    memset(&in, 0, sizeof in);
    for (int i = 0; i < 8; i++) CHECK_EQ(cp_pprof_encode(windows[i], i % 2 ? 6 : 0, &in.b[i]), 0);
    cp_profile *seq = merge_all(windows, 8);
    char *cs = canonical(seq);
    for (int threads = 1; threads <= 4; threads++) {
        cp_merger *m = cp_merger_create();
        cp_err err = {0};
        size_t bad = 99;
        CHECK_EQ(cp_pload_merge(8, read_mem, &in, NULL, threads, m, &bad, &err), 0);
        cp_profile *par = cp_merger_finish(m);
        char *cp = canonical(par);
        CHECK(strcmp(cs, cp) == 0);
        CHECK_EQ(par->duration_nanos, seq->duration_nanos);
        free(cp);
        cp_profile_destroy(par);
        cp_merger_destroy(m);
    }
    /* a damaged input is named by index, and the merger is left as it was */
    in.b[5].len = in.b[5].len / 2;
    cp_merger *m = cp_merger_create();
    cp_err err = {0};
    size_t bad = 99;
    CHECK_EQ(cp_pload_merge(8, read_mem, &in, NULL, 3, m, &bad, &err), CP_EGZIP);
    CHECK_EQ(bad, 5);
    CHECK_CONTAINS(err.msg, "truncated");
    CHECK_EQ(cp_merger_count(m), 0);
    cp_merger_destroy(m);
    free(cs);
    cp_profile_destroy(seq);
    for (int i = 0; i < 8; i++) cp_buf_close(&in.b[i]);
    free_windows();
}

TEST_MAIN(T(parallel_load_equals_sequential), T(totals_add_up), T(order_does_not_matter), T(empty_profile_changes_nothing),
          T(incompatible_types_refused), T(scaled_merge_subtracts), T(labels_keep_samples_apart),
          T(scale_and_select_types))
