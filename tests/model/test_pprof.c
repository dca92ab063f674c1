/* The pprof codec: round trips and one specific error for each class of malformed input. */
#include "test.h"
#include "pprof.h"
#include "profile.pb-c.h"
#include "synth.h"
#include "util.h"
#include "wire.h"

static cp_profile *window(uint64_t seed)
{
    cp_synth *s = cp_synth_create(seed, 2000);
    CHECK(s);
    cp_profile *p = cp_synth_cpu_window(s, 1000, 1700000000000000000LL, 10000000000LL);
    CHECK(p);
    cp_synth_destroy(s);
    return p;
}

TEST(roundtrip_raw_and_gzip)
{
    cp_profile *p = window(1);
    for (int level = 0; level <= 6; level += 6) {
        cp_buf b1 = {0}, b2 = {0};
        CHECK_EQ(cp_pprof_encode(p, level, &b1), 0);
        CHECK_EQ(cp_is_gzip(b1.data, b1.len), level > 0);
        cp_profile *q = NULL;
        cp_err err = {0};
        CHECK_EQ(cp_pprof_decode(b1.data, b1.len, NULL, &q, &err), 0);
        CHECK_EQ(q->samples.n, p->samples.n);
        CHECK_EQ(q->locations.n, p->locations.n);
        CHECK_EQ(q->functions.n, p->functions.n);
        CHECK_EQ(cp_profile_total(q, 1), cp_profile_total(p, 1));
        CHECK_EQ(q->time_nanos, p->time_nanos);
        CHECK_EQ(q->duration_nanos, p->duration_nanos);
        CHECK_EQ(q->period, p->period);
        CHECK_STREQ(cp_profile_str(q, q->period_type.type), "cpu");
        char *c1 = canonical(p), *c2 = canonical(q);
        CHECK_STREQ(c1, c2);
        /* re-encoding the decoded profile gives the same bytes */
        CHECK_EQ(cp_pprof_encode(q, 0, &b2), 0);
        cp_buf b3 = {0};
        CHECK_EQ(cp_pprof_encode(p, 0, &b3), 0);
        CHECK_EQ(b2.len, b3.len);
        CHECK(memcmp(b2.data, b3.data, b2.len) == 0);
        free(c1);
        free(c2);
        cp_buf_close(&b1);
        cp_buf_close(&b2);
        cp_buf_close(&b3);
        cp_profile_destroy(q);
    }
    cp_profile_destroy(p);
}

/* Builds a small valid profile with protobuf-c so tests can damage one field at a time. */
typedef struct pbfix {
    Perftools__Profiles__Profile p;
    Perftools__Profiles__ValueType vt, *vtp[1];
    Perftools__Profiles__Function f[2], *fp[2];
    Perftools__Profiles__Line ln[2], *lnp[2];
    Perftools__Profiles__Location l[2], *lp[2];
    Perftools__Profiles__Mapping m, *mp[1];
    Perftools__Profiles__Sample s, *sp[1];
    uint64_t locids[2];
    int64_t val[1];
    char *strs[5];
} pbfix;

static void fix_init(pbfix *x)
{
    memset(x, 0, sizeof *x);
    perftools__profiles__profile__init(&x->p);
    static char s0[] = "", s1[] = "samples", s2[] = "count", s3[] = "main", s4[] = "work";
    x->strs[0] = s0;
    x->strs[1] = s1;
    x->strs[2] = s2;
    x->strs[3] = s3;
    x->strs[4] = s4;
    x->p.string_table = x->strs;
    x->p.n_string_table = 5;
    perftools__profiles__value_type__init(&x->vt);
    x->vt.type = 1;
    x->vt.unit = 2;
    x->vtp[0] = &x->vt;
    x->p.sample_type = x->vtp;
    x->p.n_sample_type = 1;
    perftools__profiles__mapping__init(&x->m);
    x->m.id = 1;
    x->m.memory_start = 0x1000;
    x->m.memory_limit = 0x9000;
    x->mp[0] = &x->m;
    x->p.mapping = x->mp;
    x->p.n_mapping = 1;
    for (int i = 0; i < 2; i++) {
        perftools__profiles__function__init(&x->f[i]);
        x->f[i].id = (uint64_t)i + 1;
        x->f[i].name = 3 + i;
        x->fp[i] = &x->f[i];
        perftools__profiles__line__init(&x->ln[i]);
        x->ln[i].function_id = (uint64_t)i + 1;
        x->ln[i].line = 10;
        x->lnp[i] = &x->ln[i];
        perftools__profiles__location__init(&x->l[i]);
        x->l[i].id = (uint64_t)i + 1;
        x->l[i].mapping_id = 1;
        x->l[i].address = 0x1100 + (uint64_t)i;
        x->l[i].line = &x->lnp[i];
        x->l[i].n_line = 1;
        x->lp[i] = &x->l[i];
        x->locids[i] = (uint64_t)(2 - i); /* leaf work, then main */
    }
    x->p.function = x->fp;
    x->p.n_function = 2;
    x->p.location = x->lp;
    x->p.n_location = 2;
    perftools__profiles__sample__init(&x->s);
    x->s.location_id = x->locids;
    x->s.n_location_id = 2;
    x->val[0] = 7;
    x->s.value = x->val;
    x->s.n_value = 1;
    x->sp[0] = &x->s;
    x->p.sample = x->sp;
    x->p.n_sample = 1;
}

static int decode_fix(pbfix *x, cp_err *err)
{
    size_t n = perftools__profiles__profile__get_packed_size(&x->p);
    uint8_t *b = malloc(n);
    perftools__profiles__profile__pack(&x->p, b);
    cp_profile *p = NULL;
    int rc = cp_pprof_decode(b, n, NULL, &p, err);
    CHECK((rc == 0) == (p != NULL));
    cp_profile_destroy(p);
    free(b);
    return rc;
}

/* A gzipper kept across buffers gives each the bytes cp_gzip gives, and they inflate back;
 * it appends to what out already holds. */
TEST(gzipper_reused)
{
    cp_gzipper *g = NULL;
    CHECK_EQ(cp_gzipper_create(1, &g), 0);
    CHECK(g != NULL);
    for (int w = 1; w <= 3; w++) {
        cp_profile *p = window(w);
        cp_buf raw = {0}, one = {0}, kept = {0}, back = {0};
        CHECK_EQ(cp_pprof_encode(p, 0, &raw), 0);
        CHECK_EQ(cp_gzip(raw.data, raw.len, 1, &one), 0);
        CHECK_EQ(cp_buf_append(&kept, "ab", 2), 0);
        CHECK_EQ(cp_gzipper_run(g, raw.data, raw.len, &kept), 0);
        CHECK_EQ(kept.len, one.len + 2);
        CHECK(memcmp(kept.data, "ab", 2) == 0);
        CHECK(memcmp(kept.data + 2, one.data, one.len) == 0);
        cp_err err = {0};
        CHECK_EQ(cp_gunzip(kept.data + 2, kept.len - 2, 1 << 24, &back, &err), 0);
        CHECK_EQ(back.len, raw.len);
        CHECK(memcmp(back.data, raw.data, raw.len) == 0);
        cp_buf_close(&raw);
        cp_buf_close(&one);
        cp_buf_close(&kept);
        cp_buf_close(&back);
        cp_profile_destroy(p);
    }
    cp_gzipper_destroy(g);
    cp_gzipper_destroy(NULL);
}

TEST(fixture_is_valid)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    CHECK_EQ(decode_fix(&x, &err), 0);
}

/* Our encoder against a second implementation: protobuf-c reads what we write, and writes
 * the very same bytes back (same field order, packed runs, zeros left out). */
TEST(encoder_matches_protobuf_c)
{
    cp_profile *p = window(5);
    p->comments.n = 0;
    uint32_t c;
    CHECK_EQ(cp_profile_intern_cstr(p, "a comment", &c), 0);
    CHECK_EQ(cp_vec_push(&p->comments, c), 0);
    p->drop_frames = c;
    cp_buf b = {0};
    CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
    Perftools__Profiles__Profile *pb = perftools__profiles__profile__unpack(NULL, b.len, b.data);
    CHECK(pb);
    CHECK_EQ(pb->n_sample, p->samples.n);
    CHECK_EQ(pb->n_location, p->locations.n);
    CHECK_EQ(pb->n_function, p->functions.n);
    CHECK_EQ(pb->n_mapping, p->mappings.n);
    CHECK_EQ(pb->n_string_table, p->strs.off.n);
    CHECK_EQ(pb->n_comment, 1);
    CHECK_EQ(pb->time_nanos, p->time_nanos);
    CHECK_STREQ(pb->string_table[pb->function[3]->name], cp_profile_str(p, p->functions.v[3].name));
    CHECK_EQ(pb->sample[7]->n_location_id, p->samples.v[7].nlocs);
    CHECK_EQ(pb->sample[7]->location_id[2], p->stack.v[p->samples.v[7].loc_off + 2]);
    CHECK_EQ(pb->sample[7]->value[1], cp_profile_sample_values(p, 7)[1]);
    size_t n = perftools__profiles__profile__get_packed_size(pb);
    uint8_t *again = malloc(n);
    perftools__profiles__profile__pack(pb, again);
    CHECK_EQ(n, b.len);
    CHECK(memcmp(again, b.data, n) == 0);
    free(again);
    perftools__profiles__profile__free_unpacked(pb, NULL);
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

/* Decodes the fixture with one extra sample appended as raw bytes (a protobuf message may
 * be extended by concatenation) and returns the decoded profile, or NULL with err set. */
static cp_profile *decode_fix_plus_sample(pbfix *x, const uint8_t *smp, size_t n, cp_err *err)
{
    size_t len = perftools__profiles__profile__get_packed_size(&x->p);
    uint8_t *b = malloc(len + 2 + n);
    perftools__profiles__profile__pack(&x->p, b);
    CHECK(n < 128);
    b[len] = 0x12; /* field 2 (sample), length-delimited */
    b[len + 1] = (uint8_t)n;
    memcpy(b + len + 2, smp, n);
    cp_profile *p = NULL;
    cp_pprof_decode(b, len + 2 + n, NULL, &p, err);
    free(b);
    return p;
}

static void check_stack(const cp_profile *p, uint32_t smp, const uint32_t *want, uint32_t n)
{
    CHECK(smp < p->samples.n);
    CHECK_EQ(p->samples.v[smp].nlocs, n);
    for (uint32_t k = 0; k < n; k++)
        CHECK_EQ(p->stack.v[p->samples.v[smp].loc_off + k], want[k]);
}

/* Location ids come packed (short and long runs, read 8 bytes at a time), one by one, or
 * both in one sample; the order is kept, and a bad id deep in a run is named by its index. */
TEST(location_ids_packed_unpacked_mixed)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    /* unpacked 2, then a packed run [1]: stack 2,1 */
    const uint8_t a[] = {0x08, 0x02, 0x0a, 0x01, 0x01, 0x10, 0x05};
    cp_profile *p = decode_fix_plus_sample(&x, a, sizeof a, &err);
    CHECK(p);
    check_stack(p, 1, (const uint32_t[]){2, 1}, 2);
    cp_profile_destroy(p);
    /* a packed run [1], then unpacked 2: stack 1,2 */
    const uint8_t b[] = {0x0a, 0x01, 0x01, 0x08, 0x02, 0x10, 0x05};
    CHECK((p = decode_fix_plus_sample(&x, b, sizeof b, &err)));
    check_stack(p, 1, (const uint32_t[]){1, 2}, 2);
    cp_profile_destroy(p);
    /* a long run with a two-byte varint for 2 (0x82 0x00) among one-byte ids */
    const uint8_t c[] = {0x0a, 0x0d, 1, 2, 1, 0x82, 0x00, 2, 1, 2, 1, 2, 1, 2, 1, 0x10, 0x05};
    CHECK((p = decode_fix_plus_sample(&x, c, sizeof c, &err)));
    check_stack(p, 1, (const uint32_t[]){1, 2, 1, 2, 2, 1, 2, 1, 2, 1, 2, 1}, 12);
    cp_profile_destroy(p);
    /* id 9 at index 10 of a long run: reported with its index */
    const uint8_t d[] = {0x0a, 0x0c, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 9, 1, 0x10, 0x05};
    CHECK(!decode_fix_plus_sample(&x, d, sizeof d, &err));
    CHECK_CONTAINS(err.msg, "sample[1].location_id[10]: location 9 not found");
    /* four two-byte varints in one 8-byte load (1, 2, 1 written long, then 130) */
    const uint8_t f[] = {0x0a, 0x09, 0x81, 0x00, 0x82, 0x00, 0x81, 0x00, 0x82, 0x01, 1, 0x10, 0x05};
    CHECK(!decode_fix_plus_sample(&x, f, sizeof f, &err));
    CHECK_CONTAINS(err.msg, "sample[1].location_id[3]: location 130 not found");
    const uint8_t g[] = {0x0a, 0x09, 0x81, 0x00, 0x82, 0x00, 0x81, 0x00, 0x82, 0x00, 1, 0x10, 0x05};
    CHECK((p = decode_fix_plus_sample(&x, g, sizeof g, &err)));
    check_stack(p, 1, (const uint32_t[]){1, 2, 1, 2, 1}, 5);
    cp_profile_destroy(p);
    /* a three-byte varint id (2^14 + 1) in a run */
    const uint8_t e[] = {0x0a, 0x0b, 1, 2, 1, 2, 1, 2, 1, 2, 0x81, 0x80, 0x01, 0x10, 0x05};
    CHECK(!decode_fix_plus_sample(&x, e, sizeof e, &err));
    CHECK_CONTAINS(err.msg, "sample[1].location_id[8]: location 16385 not found");
}

/* The eight-bytes-at-a-time path for location ids (one- and two-byte varints, checked in
 * bulk) against what it must give: random stacks over 20,000 locations (ids of one, two
 * and three bytes) decode to the same ids; in runs of ids 1 and 2 written short or long,
 * an id 0 or 3 at every place of the run is named with its index. */
TEST(location_ids_every_width_and_place)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    uint32_t st, un, mid;
    CHECK_EQ(cp_profile_intern_cstr(p, "samples", &st), 0);
    CHECK_EQ(cp_profile_intern_cstr(p, "count", &un), 0);
    CHECK_EQ(cp_profile_add_sample_type(p, "samples", "count"), 0);
    cp_mapping m = {.start = 0x1000, .limit = 0x10000000};
    CHECK_EQ(cp_profile_add_mapping(p, &m, &mid), 0);
    for (uint32_t i = 0; i < 20000; i++) {
        uint32_t id;
        CHECK_EQ(cp_profile_add_location(p, 0x1000 + i, mid, NULL, 0, &id), 0);
        CHECK_EQ(id, i + 1);
    }
    uint64_t x = 0x2545f4914f6cdd1dULL;
    uint32_t locs[200];
    for (int k = 0; k < 300; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t n = 1 + (uint32_t)(x % 200);
        for (uint32_t j = 0; j < n; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t r = (uint32_t)(x >> 32) % 100; /* mostly one and two bytes */
            uint32_t hi = r < 40 ? 127 : r < 97 ? 16383 : 20000;
            locs[j] = 1 + (uint32_t)(x % hi);
        }
        int64_t v = k + 1;
        CHECK_EQ(cp_profile_add_sample(p, locs, n, &v, NULL, 0), 0);
    }
    cp_buf b = {0};
    CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
    cp_profile *q = NULL;
    cp_err err = {0};
    int rc = cp_pprof_decode(b.data, b.len, NULL, &q, &err);
    if (rc) fprintf(stderr, "decode: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    CHECK_EQ(q->samples.n, p->samples.n);
    for (uint32_t i = 0; i < p->samples.n; i++)
        check_stack(q, i, p->stack.v + p->samples.v[i].loc_off, p->samples.v[i].nlocs);
    cp_profile_destroy(q);
    cp_buf_close(&b);
    cp_profile_destroy(p);

    pbfix f;
    fix_init(&f);
    for (uint32_t len = 1; len <= 40; len++) {
        for (uint32_t at = 0; at < len; at++) {
            for (int bad = 0; bad < 2; bad++) {
                uint8_t smp[128], *o = smp + 2;
                uint32_t want[40];
                for (uint32_t j = 0; j < len; j++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    uint32_t id = j == at ? (bad ? 3 : 0) : 1 + (uint32_t)(x & 1);
                    want[j] = id;
                    if (x & 2) { /* written long: two bytes */
                        *o++ = (uint8_t)(id | 0x80);
                        *o++ = 0;
                    } else {
                        *o++ = (uint8_t)id;
                    }
                }
                smp[0] = 0x0a;
                smp[1] = (uint8_t)(o - smp - 2);
                *o++ = 0x10;
                *o++ = 0x05;
                cp_profile *r = decode_fix_plus_sample(&f, smp, (size_t)(o - smp), &err);
                CHECK(!r);
                char msg[96];
                snprintf(msg, sizeof msg, "sample[1].location_id[%u]: location %u not found", at,
                         want[at]);
                CHECK_CONTAINS(err.msg, msg);
                /* the same run without the bad id decodes whole */
                want[at] = 1;
                o = smp + 2;
                for (uint32_t j = 0; j < len; j++) {
                    if (j % 3 == 0) {
                        *o++ = (uint8_t)(want[j] | 0x80);
                        *o++ = 0;
                    } else {
                        *o++ = (uint8_t)want[j];
                    }
                }
                smp[1] = (uint8_t)(o - smp - 2);
                *o++ = 0x10;
                *o++ = 0x05;
                CHECK((r = decode_fix_plus_sample(&f, smp, (size_t)(o - smp), &err)));
                check_stack(r, 1, want, len);
                cp_profile_destroy(r);
            }
        }
    }
}

TEST(error_huge_string_index)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    x.f[0].filename = 1ull << 40;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "function[0] (id 1).filename: string index");
    CHECK_CONTAINS(err.msg, "out of range");
}

TEST(error_truncated)
{
    cp_profile *p = window(2), *q = NULL;
    cp_buf b = {0};
    cp_err err = {0};
    CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
    CHECK_EQ(cp_pprof_decode(b.data, b.len - 7, NULL, &q, &err), CP_EPPROF);
    CHECK(q == NULL);
    CHECK_CONTAINS(err.msg, "truncated");
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

TEST(error_huge_length)
{
    /* field 2 (sample), wire type 2, length 2^40 */
    const uint8_t b[] = {0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0x00};
    cp_profile *q = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_pprof_decode(b, sizeof b, NULL, &q, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "declares length 1099511627776");
}

TEST(error_missing_empty_string0)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    static char bad[] = "oops";
    x.strs[0] = bad;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "string_table[0] is not the empty string");
    x.p.n_string_table = 0;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "string_table is empty");
}

TEST(error_out_of_range_ids)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    x.locids[0] = 99;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "sample[0].location_id[0]: location 99 not found");
    fix_init(&x);
    x.ln[1].function_id = 5;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "location[1] (id 2).line[0]: function_id 5 not found");
    fix_init(&x);
    x.l[0].mapping_id = 3;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "mapping_id 3 not found");
    fix_init(&x);
    x.f[1].name = 42;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "function[1] (id 2).name: string index 42 out of range");
    fix_init(&x);
    x.vt.unit = -1;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "sample_type[0].unit: string index -1");
}

TEST(error_wrong_value_count)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    x.s.n_value = 0;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "sample[0] has 0 values (profile has 1 sample types)");
}

TEST(error_duplicate_and_zero_ids)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    x.f[1].id = 1;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "function[1]: duplicate id 1");
    fix_init(&x);
    x.l[0].id = 0;
    CHECK_EQ(decode_fix(&x, &err), CP_EPPROF);
    CHECK_CONTAINS(err.msg, "location[0]: id is 0");
}

TEST(sparse_ids_are_renumbered)
{
    pbfix x;
    cp_err err = {0};
    fix_init(&x);
    x.l[0].id = 1000;
    x.l[1].id = 77;
    x.locids[0] = 77;
    x.locids[1] = 1000;
    x.f[0].id = 5;
    x.ln[0].function_id = 5;
    size_t n = perftools__profiles__profile__get_packed_size(&x.p);
    uint8_t *b = malloc(n);
    perftools__profiles__profile__pack(&x.p, b);
    cp_profile *p = NULL;
    CHECK_EQ(cp_pprof_decode(b, n, NULL, &p, &err), 0);
    /* leaf is location id 77 = x.l[1] -> function 2 "work" */
    const cp_location *leaf = &p->locations.v[p->stack.v[0] - 1];
    CHECK_STREQ(cp_profile_str(p, p->functions.v[p->lines.v[leaf->line_off].function_id - 1].name),
                "work");
    cp_profile_destroy(p);
    free(b);
}

TEST(error_bad_gzip)
{
    cp_profile *p = window(3), *q = NULL;
    cp_buf b = {0};
    cp_err err = {0};
    CHECK_EQ(cp_pprof_encode(p, 6, &b), 0);
    b.data[b.len / 2] ^= 0xff;
    b.data[b.len / 2 + 1] ^= 0x55;
    int rc = cp_pprof_decode(b.data, b.len, NULL, &q, &err);
    CHECK_EQ(rc, CP_EGZIP);
    CHECK_CONTAINS(err.msg, "gzip");
    CHECK_EQ(cp_pprof_decode(b.data, 20, NULL, &q, &err), CP_EGZIP);
    CHECK_CONTAINS(err.msg, "truncated");
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

TEST(error_limits)
{
    cp_profile *p = window(4), *q = NULL;
    cp_buf b = {0};
    cp_err err = {0};
    cp_pprof_limits lim;
    CHECK_EQ(cp_pprof_encode(p, 6, &b), 0);
    cp_pprof_limits_default(&lim);
    lim.max_samples = 10;
    CHECK_EQ(cp_pprof_decode(b.data, b.len, &lim, &q, &err), CP_ELIMIT);
    CHECK_CONTAINS(err.msg, "samples (limit 10)");
    cp_pprof_limits_default(&lim);
    lim.max_depth = 12;
    CHECK_EQ(cp_pprof_decode(b.data, b.len, &lim, &q, &err), CP_ELIMIT);
    CHECK_CONTAINS(err.msg, "stack depth limit 12");
    cp_pprof_limits_default(&lim);
    lim.max_bytes = 1000; /* a gzip bomb guard: inflating stops at the limit */
    CHECK_EQ(cp_pprof_decode(b.data, b.len, &lim, &q, &err), CP_ELIMIT);
    CHECK_CONTAINS(err.msg, "1000-byte limit");
    cp_pprof_limits_default(&lim);
    lim.max_strings = 50;
    CHECK_EQ(cp_pprof_decode(b.data, b.len, &lim, &q, &err), CP_ELIMIT);
    CHECK_CONTAINS(err.msg, "strings (limit 50)");
    cp_pprof_limits_default(&lim);
    lim.max_locations = 50;
    CHECK_EQ(cp_pprof_decode(b.data, b.len, &lim, &q, &err), CP_ELIMIT);
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

/* A stream that keeps its tables: the next window keeps every mapping, location, function
 * and the strings before the cut with their ids, drops the last window's own strings and
 * samples, and interns again what it dropped. */
TEST(next_window_keeps_the_tables)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK_EQ(cp_profile_add_sample_type(p, "cpu", "nanoseconds"), 0);
    uint32_t file, fn, map, loc, c1, c2;
    CHECK_EQ(cp_profile_intern_cstr(p, "/bin/x", &file), 0);
    CHECK_EQ(cp_profile_add_mapping(
                 p, &(cp_mapping){.start = 0x1000, .limit = 0x9000, .filename = file}, &map),
             0);
    cp_function f = {0};
    CHECK_EQ(cp_profile_intern_cstr(p, "main", &f.name), 0);
    f.system_name = f.name;
    CHECK_EQ(cp_profile_add_function(p, &f, &fn), 0);
    CHECK_EQ(cp_profile_add_location(p, 0x1234, map, &(cp_line){fn, 7}, 1, &loc), 0);
    uint32_t keep = p->strs.off.n;
    int64_t v = 5;
    CHECK_EQ(cp_profile_add_sample(p, &loc, 1, &v, NULL, 0), 0);
    CHECK_EQ(cp_profile_intern_cstr(p, "dropped_samples=1", &c1), 0);
    CHECK_EQ(cp_vec_push(&p->comments, c1), 0);
    p->time_nanos = 10;

    cp_profile_next_window(p, keep);
    CHECK_EQ(p->samples.n, 0);
    CHECK_EQ(p->stack.n, 0);
    CHECK_EQ(p->values.n, 0);
    CHECK_EQ(p->comments.n, 0);
    CHECK_EQ(p->time_nanos, 0);
    CHECK_EQ(p->strs.off.n, keep);
    CHECK_EQ(p->mappings.n, 1);
    CHECK_EQ(p->locations.n, 1);
    CHECK_EQ(p->functions.n, 1);
    CHECK_EQ(p->sample_types.n, 1);
    CHECK_STREQ(cp_profile_str(p, p->functions.v[0].name), "main");
    /* the index forgot the dropped string and still finds the kept ones */
    uint32_t again;
    CHECK_EQ(cp_profile_intern_cstr(p, "main", &again), 0);
    CHECK_EQ(again, f.name);
    CHECK_EQ(cp_profile_intern_cstr(p, "dropped_samples=2", &c2), 0);
    CHECK_EQ(c2, keep);
    CHECK_EQ(cp_profile_intern_cstr(p, "dropped_samples=1", &c1), 0);
    CHECK_EQ(c1, keep + 1);
    CHECK_EQ(cp_profile_add_sample(p, &loc, 1, &v, NULL, 0), 0);

    /* its encoding is a valid profile whose location section is the first window's */
    cp_buf b = {0};
    CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
    cp_profile *q = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_pprof_decode(b.data, b.len, NULL, &q, &err), 0);
    CHECK_EQ(q->locations.n, 1);
    CHECK_EQ(q->locations.v[0].address, 0x1234);
    CHECK_EQ(q->strs.off.n, keep + 2);
    cp_profile_destroy(q);
    cp_buf_close(&b);
    /* a cut past the end changes nothing in the strings */
    cp_profile_next_window(p, 1000);
    CHECK_EQ(p->strs.off.n, keep + 2);
    cp_profile_destroy(p);
}

/* Lazy ids: a raw window's samples keep their packed ids as bytes, which decode to what the
 * eager decoder gives; gzip'd input, sparse ids and runs longer than the depth limit are
 * decoded as usual. */
TEST(lazy_ids_decode_to_the_eager_ids)
{
    cp_profile *w = window(5);
    cp_buf raw = {0}, gz = {0};
    CHECK_EQ(cp_pprof_encode(w, 0, &raw), 0);
    CHECK_EQ(cp_pprof_encode(w, 6, &gz), 0);
    cp_pprof_decoder *d = cp_pprof_decoder_create(NULL);
    cp_profile *p = cp_profile_create(), *q = NULL;
    cp_pprof_lazy lz = {0};
    cp_err err = {0};
    CHECK_EQ(cp_pprof_decode(raw.data, raw.len, NULL, &q, &err), 0);
    CHECK_EQ(cp_pprof_decoder_decode_lazy(d, raw.data, raw.len, p, &lz, &err), 0);
    CHECK_EQ(lz.ids.n, p->samples.n);
    CHECK_EQ(lz.nlazy, p->samples.n);
    /* the locations too: left as the bytes they came in */
    CHECK_EQ(p->locations.n, 0);
    CHECK_EQ(lz.nloc, q->locations.n);
    CHECK(lz.locs > raw.data && lz.locs + lz.locs_len <= raw.data + raw.len);
    uint32_t ids[600];
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *a = &p->samples.v[i], *b = &q->samples.v[i];
        CHECK_EQ(a->nlocs, 0);
        CHECK(lz.ids.v[i].p >= raw.data && lz.ids.v[i].p + lz.ids.v[i].len <= raw.data + raw.len);
        uint32_t n = 0;
        CHECK_EQ(cp_pprof_lazy_ids(p, &lz, i, ids, &n, &err), 0);
        CHECK_EQ(n, b->nlocs);
        CHECK(!memcmp(ids, q->stack.v + b->loc_off, (size_t)n * 4));
    }
    /* parsed from the 7th on: the same locations as the eager decode */
    size_t seventh = 0; /* where the 7th message starts: key 0x22, a length, the message */
    for (int k = 0; k < 7; k++) {
        CHECK_EQ(lz.locs[seventh++], 0x22);
        uint64_t len = 0;
        for (int sh = 0;; sh += 7) {
            uint8_t c = lz.locs[seventh++];
            len |= (uint64_t)(c & 0x7f) << sh;
            if (!(c & 0x80)) break;
        }
        seventh += len;
    }
    /* the first 7 are the caller's: not written (a pattern put there stays) */
    CHECK_EQ(cp_vec_reserve(&p->locations, 7), 0);
    memset(p->locations.v, 0xab, 7 * sizeof *p->locations.v);
    CHECK_EQ(cp_pprof_lazy_locations(p, &lz, 7, seventh, &err), 0);
    CHECK_EQ(p->locations.n, q->locations.n);
    CHECK_EQ(p->locations.v[3].address, 0xababababababababull);
    CHECK_EQ(p->locations.v[6].nlines, 0xababababu);
    for (uint32_t i = 7; i < q->locations.n; i++) {
        const cp_location *a = &p->locations.v[i], *b = &q->locations.v[i];
        CHECK_EQ(a->address, b->address);
        CHECK_EQ(a->mapping_id, b->mapping_id);
        CHECK_EQ(a->nlines, b->nlines);
        for (uint32_t k = 0; k < a->nlines; k++) {
            CHECK_EQ(p->lines.v[a->line_off + k].function_id,
                     q->lines.v[b->line_off + k].function_id);
            CHECK_EQ(p->lines.v[a->line_off + k].line, q->lines.v[b->line_off + k].line);
        }
    }
    /* a location naming a mapping the profile lacks: the same error, eager or lazy */
    {
        cp_profile *bad = cp_profile_clone(w);
        CHECK(bad);
        bad->locations.v[bad->locations.n - 1].mapping_id = bad->mappings.n + 3;
        cp_buf bb = {0};
        CHECK_EQ(cp_pprof_encode(bad, 0, &bb), 0);
        cp_err e1 = {0}, e2 = {0};
        cp_profile *none = NULL;
        CHECK_EQ(cp_pprof_decode(bb.data, bb.len, NULL, &none, &e1), CP_EPPROF);
        CHECK_EQ(cp_pprof_decoder_decode_lazy(d, bb.data, bb.len, p, &lz, &err), 0);
        CHECK(lz.nloc > 0);
        CHECK_EQ(cp_pprof_lazy_locations(p, &lz, 0, 0, &e2), CP_EPPROF);
        CHECK_STREQ(e1.msg, e2.msg);
        CHECK_EQ(p->locations.n, 0);
        cp_buf_close(&bb);
        cp_profile_destroy(bad);
    }
    /* gzip'd: the inflated bytes are the decoder's, so nothing stays lazy */
    CHECK_EQ(cp_pprof_decoder_decode_lazy(d, gz.data, gz.len, p, &lz, &err), 0);
    CHECK_EQ(lz.nlazy, 0);
    CHECK_EQ(lz.nloc, 0);
    char *cp = canonical(p), *cq = canonical(q);
    CHECK_STREQ(cp, cq);
    free(cp);
    free(cq);
    /* a depth limit below a run's bytes: that sample is decoded, and refused, as usual */
    cp_pprof_limits lim;
    cp_pprof_limits_default(&lim);
    lim.max_depth = 12;
    cp_pprof_decoder *d2 = cp_pprof_decoder_create(&lim);
    cp_err e1 = {0}, e2 = {0};
    CHECK_EQ(cp_pprof_decoder_decode_lazy(d2, raw.data, raw.len, p, &lz, &e1), CP_ELIMIT);
    CHECK_EQ(cp_pprof_decoder_decode(d2, raw.data, raw.len, p, &e2), CP_ELIMIT);
    CHECK_STREQ(e1.msg, e2.msg);
    cp_pprof_decoder_destroy(d2);
    /* sparse location ids: decoded and renumbered, not lazy */
    pbfix x;
    fix_init(&x);
    x.l[0].id = 1000;
    x.l[1].id = 77;
    x.locids[0] = 77;
    x.locids[1] = 1000;
    size_t n = perftools__profiles__profile__get_packed_size(&x.p);
    uint8_t *b = malloc(n);
    perftools__profiles__profile__pack(&x.p, b);
    CHECK_EQ(cp_pprof_decoder_decode_lazy(d, b, n, p, &lz, &err), 0);
    CHECK_EQ(lz.nlazy, 0);
    CHECK_EQ(lz.nloc, 0);
    CHECK_EQ(lz.ids.v[0].p, NULL);
    CHECK(p->samples.v[0].nlocs > 0);
    free(b);
    cp_pprof_lazy_close(&lz);
    cp_pprof_decoder_destroy(d);
    cp_profile_destroy(p);
    cp_profile_destroy(q);
    cp_profile_destroy(w);
    cp_buf_close(&raw);
    cp_buf_close(&gz);
}

/* A hand-written raw profile of 200 locations (ids 1..200, one mapping), for the lazy
 * location run's byte-level shapes: `shape` changes how one message is written. */
enum {
    SHAPE_PLAIN,
    SHAPE_LONG_ID,
    SHAPE_LONG_LEN,
    SHAPE_FIELD_BETWEEN,
    SHAPE_SWAPPED_IDS,
    SHAPE_ID_AGAIN
};

static uint8_t *put_key_len(uint8_t *o, unsigned field, size_t n)
{
    return wr_varint(wr_varint(o, field << 3 | WT_LEN), n);
}

static size_t shaped_profile(int shape, uint8_t *out)
{
    uint8_t *o = out;
    static const char *strs[] = {"", "/bin/x", "cpu", "nanoseconds"};
    for (int i = 0; i < 4; i++) {
        o = put_key_len(o, 6, strlen(strs[i]));
        memcpy(o, strs[i], strlen(strs[i]));
        o += strlen(strs[i]);
    }
    uint8_t m[32], *e = m;
    e = wr_varint(wr_varint(e, 1 << 3), 1);        /* id */
    e = wr_varint(wr_varint(e, 2 << 3), 0x1000);   /* start */
    e = wr_varint(wr_varint(e, 3 << 3), 0x100000); /* limit */
    e = wr_varint(wr_varint(e, 5 << 3), 1);        /* filename */
    o = put_key_len(o, 3, (size_t)(e - m));
    memcpy(o, m, (size_t)(e - m));
    o += e - m;
    for (uint32_t i = 1; i <= 200; i++) {
        uint32_t id = i;
        if (shape == SHAPE_SWAPPED_IDS && (i == 120 || i == 121)) id = i == 120 ? 121 : 120;
        e = m;
        *e++ = 0x08;
        if (shape == SHAPE_LONG_ID && i == 150) { /* 150 in three bytes, not two */
            *e++ = (uint8_t)(150 | 0x80);
            *e++ = 0x81;
            *e++ = 0x00;
        } else {
            e = wr_varint(e, id);
        }
        e = wr_varint(wr_varint(e, 2 << 3), 1);
        e = wr_varint(wr_varint(e, 3 << 3), 0x1000 + (uint64_t)i * 16);
        if (shape == SHAPE_ID_AGAIN && (i == 120 || i == 121)) /* the last id counts */
            e = wr_varint(wr_varint(e, 1 << 3), i == 120 ? 121 : 120);
        if (shape == SHAPE_LONG_LEN && i == 100) { /* the length in two bytes */
            *o++ = 0x22;
            *o++ = (uint8_t)((e - m) | 0x80);
            *o++ = 0x00;
        } else {
            o = put_key_len(o, 4, (size_t)(e - m));
        }
        memcpy(o, m, (size_t)(e - m));
        o += e - m;
        if (shape == SHAPE_FIELD_BETWEEN && i == 50) { /* a comment inside the run */
            *o++ = 13 << 3;
            *o++ = 1;
        }
    }
    e = m; /* sample_type {cpu, nanoseconds} */
    e = wr_varint(wr_varint(e, 1 << 3), 2);
    e = wr_varint(wr_varint(e, 2 << 3), 3);
    o = put_key_len(o, 1, (size_t)(e - m));
    memcpy(o, m, (size_t)(e - m));
    o += e - m;
    static const uint32_t stacks[3][3] = {{1, 150, 200}, {121, 120, 100}, {51, 50, 127}};
    for (int k = 0; k < 3; k++) {
        uint8_t ids[16], *q = ids;
        for (int j = 0; j < 3; j++)
            q = wr_varint(q, stacks[k][j]);
        e = put_key_len(m, 1, (size_t)(q - ids));
        memcpy(e, ids, (size_t)(q - ids));
        e += q - ids;
        e = wr_varint(wr_varint(e, 2 << 3), 10000000); /* one value, unpacked */
        o = put_key_len(o, 2, (size_t)(e - m));
        memcpy(o, m, (size_t)(e - m));
        o += e - m;
    }
    return (size_t)(o - out);
}

/* The lazy location run, as the agent writes it and in the other forms protobuf allows:
 * kept as bytes while its messages are one run whose first fields are ids 1..n (in any
 * varint form), parsed by the decoder otherwise, and in every case the same locations and
 * stacks as the eager decoder's. */
TEST(lazy_location_run_shapes)
{
    static const int lazy_expected[] = {1, 1, 1, 0, 0, 1};
    cp_pprof_decoder *d = cp_pprof_decoder_create(NULL);
    cp_profile *p = cp_profile_create();
    cp_pprof_lazy lz = {0};
    CHECK(d && p);
    for (int shape = SHAPE_PLAIN; shape <= SHAPE_ID_AGAIN; shape++) {
        uint8_t buf[8192];
        size_t n = shaped_profile(shape, buf);
        CHECK(n < sizeof buf);
        cp_profile *q = NULL;
        cp_err err = {0};
        CHECK_EQ(cp_pprof_decode(buf, n, NULL, &q, &err), 0);
        CHECK_EQ(q->locations.n, 200);
        CHECK_EQ(cp_pprof_decoder_decode_lazy(d, buf, n, p, &lz, &err), 0);
        if (lazy_expected[shape]) {
            CHECK_EQ(lz.nloc, 200);
            CHECK_EQ(p->locations.n, 0);
            CHECK(lz.locs > buf && lz.locs + lz.locs_len <= buf + n);
        } else {
            CHECK_EQ(lz.nloc, 0);
            CHECK_EQ(p->locations.n, 200);
        }
        /* an id given again later in its message passes the first-field check and is
         * caught when parsed: the window is decoded again in full */
        CHECK_EQ(cp_pprof_lazy_locations(p, &lz, 0, 0, &err), 0);
        if (shape == SHAPE_ID_AGAIN) CHECK_EQ(lz.nloc, 0);
        CHECK_EQ(p->locations.n, 200);
        for (uint32_t i = 0; i < 200; i++) {
            CHECK_EQ(p->locations.v[i].address, q->locations.v[i].address);
            CHECK_EQ(p->locations.v[i].mapping_id, q->locations.v[i].mapping_id);
        }
        CHECK_EQ(p->samples.n, 3);
        for (uint32_t i = 0; i < 3; i++) {
            const cp_sample *b = &q->samples.v[i];
            uint32_t ids[16];
            const uint32_t *got = p->stack.v + p->samples.v[i].loc_off;
            uint32_t k = p->samples.v[i].nlocs;
            if (i < lz.ids.n && lz.ids.v[i].p) {
                CHECK_EQ(cp_pprof_lazy_ids(p, &lz, i, ids, &k, &err), 0);
                got = ids;
            }
            CHECK_EQ(k, b->nlocs);
            CHECK(!memcmp(got, q->stack.v + b->loc_off, (size_t)k * 4));
        }
        cp_profile_destroy(q);
    }
    cp_pprof_lazy_close(&lz);
    cp_profile_destroy(p);
    cp_pprof_decoder_destroy(d);
}

/* The varint reader against the writer: every length 1-10, at every distance from the end
 * of the buffer (the one-load path needs eight bytes), and truncated ones refused. */
TEST(varints_every_length_and_place)
{
    uint64_t vals[] = {0,
                       1,
                       127,
                       128,
                       300,
                       16383,
                       16384,
                       2097151,
                       2097152,
                       10000000,
                       268435455,
                       268435456,
                       34359738367ull,
                       34359738368ull,
                       1ull << 49,
                       (1ull << 56) - 1,
                       1ull << 56,
                       (1ull << 63) - 1,
                       1ull << 63,
                       UINT64_MAX};
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++)
        for (size_t tail = 0; tail < 12; tail++) {
            uint8_t buf[32];
            uint8_t *end = wr_varint(buf, vals[k]);
            size_t n = (size_t)(end - buf);
            memset(end, 0xff, tail); /* what follows: continuation bytes */
            rd r = {buf, end + tail};
            uint64_t got = 0;
            CHECK_EQ(rd_varint(&r, &got), 0);
            CHECK_EQ(got, vals[k]);
            CHECK(r.p == end);
            rd cut = {buf, buf + n - 1}; /* one byte short */
            if (n > 1 || tail) CHECK_EQ(rd_varint(&cut, &got), -1);
            /* rd_varint_in may load past the field's end (up to the buffer's): the same
             * value, and a varint cut by the field's end is still refused */
            rd in = {buf, end + tail};
            got = 0;
            CHECK_EQ(rd_varint_in(&in, buf + sizeof buf, &got), 0);
            CHECK_EQ(got, vals[k]);
            CHECK(in.p == end);
            rd cut_in = {buf, buf + n - 1};
            if (n > 1) CHECK_EQ(rd_varint_in(&cut_in, buf + sizeof buf, &got), -1);
        }
    uint8_t eleven[16];
    memset(eleven, 0x80, sizeof eleven);
    rd r = {eleven, eleven + sizeof eleven};
    uint64_t v;
    CHECK_EQ(rd_varint(&r, &v), -1); /* longer than ten bytes */
}

TEST_MAIN(T(roundtrip_raw_and_gzip), T(gzipper_reused), T(fixture_is_valid),
          T(location_ids_packed_unpacked_mixed), T(location_ids_every_width_and_place),
          T(encoder_matches_protobuf_c), T(error_huge_string_index), T(error_truncated),
          T(error_huge_length), T(error_missing_empty_string0), T(error_out_of_range_ids),
          T(error_wrong_value_count), T(error_duplicate_and_zero_ids), T(sparse_ids_are_renumbered),
          T(error_bad_gzip), T(error_limits), T(next_window_keeps_the_tables),
          T(lazy_ids_decode_to_the_eager_ids), T(lazy_location_run_shapes),
          T(varints_every_length_and_place))
