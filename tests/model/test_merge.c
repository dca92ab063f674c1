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
        windows[i] =
            cp_synth_cpu_window(s, 1000, 1700000000000000000LL + i * 10000000000LL, 10000000000LL);
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
        cp_profile_add_sample_type(q, cp_profile_str(p, p->sample_types.v[t].type),
                                   cp_profile_str(p, p->sample_types.v[t].unit));
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
        for (uint32_t k = 0; k < s->nlocs; k++)
            locs[k] = lmap[p->stack.v[s->loc_off + k]];
        cp_profile_add_sample(q, locs, s->nlocs, cp_profile_sample_values(p, i), NULL, 0);
    }
    free(fmap);
    free(lmap);
    return q;
}

static void free_windows(void)
{
    for (int i = 0; i < 8; i++)
        cp_profile_destroy(windows[i]);
}

static cp_profile *merge_all(cp_profile **ps, int n)
{
    cp_merger *m = cp_merger_create();
    cp_err err = {0};
    for (int i = 0; i < n; i++)
        CHECK_EQ(cp_merger_add(m, ps[i], &err), 0);
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
    for (int i = 0; i < 8; i++)
        rev[i] = (i % 2) ? reordered(windows[7 - i]) : windows[7 - i];
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
    for (int i = 0; i < 8; i++)
        CHECK_EQ(cp_pprof_encode(windows[i], i % 2 ? 6 : 0, &in.b[i]), 0);
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
    for (int i = 0; i < 8; i++)
        cp_buf_close(&in.b[i]);
    free_windows();
}

/* One process of a stripped program: its text at base + 0x1000 (file offset 0x1000) and an
 * anonymous (JIT) mapping at jit. Stack fleet+0x1234 <- fleet+0x1400, and jit+0x10; one
 * symbolized frame written with address 0 (no address given). */
static cp_profile *process_at(uint64_t base, uint64_t jit)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK_EQ(cp_profile_add_sample_type(p, "cpu", "nanoseconds"), 0);
    cp_mapping exe = {base + 0x1000, base + 0x3000, 0x1000, 0, 0, 0},
               anon = {jit, jit + 0x1000, 0, 0, 0, 0};
    CHECK_EQ(cp_profile_intern_cstr(p, "/opt/fleet/bin/fleet_work", &exe.filename), 0);
    CHECK_EQ(cp_profile_intern_cstr(p, "4f1e2d3c", &exe.build_id), 0);
    uint32_t me, mj, l[4], f;
    CHECK_EQ(cp_profile_add_mapping(p, &exe, &me), 0);
    CHECK_EQ(cp_profile_add_mapping(p, &anon, &mj), 0);
    cp_function fn = {0};
    CHECK_EQ(cp_profile_intern_cstr(p, "main", &fn.name), 0);
    CHECK_EQ(cp_profile_add_function(p, &fn, &f), 0);
    cp_line ln = {f, 3};
    CHECK_EQ(cp_profile_add_location(p, base + 0x1234, me, NULL, 0, &l[0]), 0);
    CHECK_EQ(cp_profile_add_location(p, base + 0x1400, me, NULL, 0, &l[1]), 0);
    CHECK_EQ(cp_profile_add_location(p, jit + 0x10, mj, NULL, 0, &l[2]), 0);
    CHECK_EQ(cp_profile_add_location(p, 0, me, &ln, 1, &l[3]), 0);
    int64_t v = 10;
    uint32_t s1[3] = {l[0], l[1], l[3]};
    CHECK_EQ(cp_profile_add_sample(p, s1, 3, &v, NULL, 0), 0);
    CHECK_EQ(cp_profile_add_sample(p, &l[2], 1, &v, NULL, 0), 0);
    return p;
}

static void label_of(const cp_profile *p, uint32_t loc, const char *want)
{
    char got[64];
    cp_location_label(p, &p->locations.v[loc - 1], got, sizeof got);
    CHECK_STREQ(got, want);
}

TEST(one_binary_at_two_bases_canonical)
{
    cp_profile *a = process_at(0x555555554000, 0x7e0000000000);
    cp_profile *b = process_at(0x563200000000, 0x7e0000100000);
    label_of(a, 1, "fleet_work+0x1234"); /* named the same before and after canonical form */
    label_of(a, 3, "0x7e0000000010");    /* anonymous memory: only its address */
    label_of(a, 4, "[fleet_work]");      /* no address given */
    cp_profile_canonicalize(a);
    cp_profile_canonicalize(b);
    /* the program's frames are now identical; JIT code keeps its run-time addresses */
    CHECK_EQ(a->mappings.v[0].start, 0x1000);
    CHECK_EQ(a->mappings.v[0].limit, 0x3000);
    CHECK_EQ(a->mappings.v[0].offset, 0x1000);
    CHECK_EQ(a->locations.v[0].address, 0x1234);
    CHECK_EQ(b->locations.v[1].address, 0x1400);
    CHECK_EQ(a->locations.v[3].address, 0);
    CHECK_EQ(a->mappings.v[1].start, 0x7e0000000000);
    CHECK_EQ(b->locations.v[2].address, 0x7e0000100010);
    label_of(b, 1, "fleet_work+0x1234");
    label_of(b, 2, "fleet_work+0x1400");
    cp_profile_canonicalize(b); /* idempotent */
    CHECK_EQ(b->locations.v[0].address, 0x1234);
    cp_profile_destroy(a);
    cp_profile_destroy(b);

    /* the merger: either order, from canonical or run-time inputs, one location set and
     * canonical output addresses */
    for (int canon = 0; canon < 2; canon++) {
        cp_profile *in[2] = {process_at(0x563200000000, 0x7e0000100000),
                             process_at(0x555555554000, 0x7e0000000000)};
        if (canon) {
            cp_profile_canonicalize(in[0]);
            cp_profile_canonicalize(in[1]);
        }
        cp_profile *m = merge_all(in, 2);
        /* the program once; the JIT regions too, as pprof's Merge keys mappings by size,
         * offset and file (none), and their locations by address relative to the start */
        CHECK_EQ(m->mappings.n, 2);
        CHECK_EQ(m->locations.n, 4);
        CHECK_EQ(m->samples.n, 2);
        uint32_t at0 = 0;
        for (uint32_t i = 0; i < m->locations.n; i++) {
            const cp_location *l = &m->locations.v[i];
            const cp_mapping *mp = &m->mappings.v[l->mapping_id - 1];
            if (!l->address) {
                at0++;
                continue;
            }
            CHECK(l->address >= mp->start && l->address < mp->limit);
            if (mp->offset)
                CHECK(l->address == 0x1234 || l->address == 0x1400);
            else
                CHECK_EQ(l->address, 0x7e0000100010); /* the first input's JIT address */
        }
        CHECK_EQ(at0, 1);
        CHECK_EQ(cp_profile_total(m, 0), 40);
        cp_profile_destroy(m);
        cp_profile_destroy(in[0]);
        cp_profile_destroy(in[1]);
    }
}

TEST_MAIN(T(parallel_load_equals_sequential), T(totals_add_up), T(order_does_not_matter),
          T(empty_profile_changes_nothing), T(incompatible_types_refused),
          T(scaled_merge_subtracts), T(labels_keep_samples_apart), T(scale_and_select_types),
          T(one_binary_at_two_bases_canonical))
