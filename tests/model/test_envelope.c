/* The envelope: round trip, validation naming the field, version handling, unknown fields. */
#include "test.h"
#include "envelope.h"
#include "envelope.pb-c.h"
#include "pprof.h"

static void fill(cp_envelope *e)
{
    static uint8_t payload[] = {0x1f, 0x8b, 1, 2, 3};
    memset(e, 0, sizeof *e);
    e->tenant = strdup("acme");
    cp_labels_set(&e->labels, "service", "api");
    cp_labels_set(&e->labels, "isolate", "worker");
    cp_labels_set(&e->labels, "version", "1.2");
    e->kind = CP_KIND_ALLOC;
    e->window_start_ns = 1700000000000000000LL;
    e->window_duration_ns = 10000000000LL;
    e->producer_id = strdup("host-1/1234/abcd");
    e->sequence = 42;
    e->dropped_samples = 3;
    e->cumulative = 1;
    e->engine = strdup("perf-task-clock 1ms");
    e->pprof = malloc(sizeof payload);
    memcpy(e->pprof, payload, sizeof payload);
    e->pprof_len = sizeof payload;
}

TEST(roundtrip)
{
    cp_envelope e, d;
    cp_buf b = {0};
    cp_err err = {0};
    fill(&e);
    CHECK_EQ(cp_envelope_encode(&e, &b), 0);
    CHECK_EQ(cp_envelope_decode(b.data, b.len, 1 << 20, &d, &err), 0);
    CHECK_STREQ(d.tenant, "acme");
    CHECK_STREQ(cp_labels_get(&d.labels, "service"), "api");
    CHECK_STREQ(cp_labels_get(&d.labels, "isolate"), "worker");
    CHECK_EQ(d.labels.p.n, 3);
    CHECK_STREQ(d.labels.p.v[0].name, "isolate"); /* sorted */
    CHECK_EQ(d.kind, CP_KIND_ALLOC);
    CHECK_EQ(d.window_start_ns, e.window_start_ns);
    CHECK_EQ(d.sequence, 42);
    CHECK_EQ(d.dropped_samples, 3);
    CHECK_EQ(d.cumulative, 1);
    CHECK_EQ(d.format_major, CP_ENVELOPE_MAJOR);
    CHECK_STREQ(d.engine, "perf-task-clock 1ms");
    CHECK_EQ(d.pprof_len, e.pprof_len);
    CHECK(memcmp(d.pprof, e.pprof, e.pprof_len) == 0);
    cp_buf key = {0};
    cp_envelope_series_key(&d, &key);
    cp_buf_append(&key, "", 1);
    CHECK_STREQ((char *)key.data, "acme/alloc{isolate=\"worker\",service=\"api\",version=\"1.2\"}");
    cp_buf_close(&key);
    cp_buf_close(&b);
    cp_envelope_close(&e);
    cp_envelope_close(&d);
}

static int decode_pb(Contprof__Envelope *pb, cp_err *err)
{
    size_t n = contprof__envelope__get_packed_size(pb);
    uint8_t *b = malloc(n + 16);
    contprof__envelope__pack(pb, b);
    cp_envelope d;
    int rc = cp_envelope_decode(b, n, 1 << 20, &d, err);
    cp_envelope_close(&d);
    free(b);
    return rc;
}

static void pb_fill(Contprof__Envelope *pb)
{
    static uint8_t payload[] = {1, 2, 3};
    contprof__envelope__init(pb);
    pb->format_major = 1;
    pb->tenant = (char *)"t";
    pb->kind = CONTPROF__KIND__KIND_CPU;
    pb->window_start_ns = 1;
    pb->window_duration_ns = 10;
    pb->producer_id = (char *)"p";
    pb->pprof.data = payload;
    pb->pprof.len = sizeof payload;
}

TEST(version_checks)
{
    Contprof__Envelope pb;
    cp_err err = {0};
    pb_fill(&pb);
    CHECK_EQ(decode_pb(&pb, &err), 0);
    pb.format_minor = 9; /* a newer minor of the same major is read */
    CHECK_EQ(decode_pb(&pb, &err), 0);
    pb.format_major = 2;
    CHECK_EQ(decode_pb(&pb, &err), CP_EVERSION);
    CHECK_CONTAINS(err.msg, "envelope format 2.9 is not supported");
    pb.format_major = 0;
    CHECK_EQ(decode_pb(&pb, &err), CP_EVERSION);
}

TEST(unknown_fields_ignored)
{
    Contprof__Envelope pb;
    cp_err err = {0};
    pb_fill(&pb);
    size_t n = contprof__envelope__get_packed_size(&pb);
    uint8_t *b = malloc(n + 16);
    contprof__envelope__pack(&pb, b);
    /* field 99, varint 5; and field 100, bytes "hi" */
    const uint8_t extra[] = {0x98, 0x06, 0x05, 0xa2, 0x06, 0x02, 'h', 'i'};
    memcpy(b + n, extra, sizeof extra);
    cp_envelope d;
    CHECK_EQ(cp_envelope_decode(b, n + sizeof extra, 1 << 20, &d, &err), 0);
    CHECK_STREQ(d.tenant, "t");
    cp_envelope_close(&d);
    free(b);
}

TEST(validation_names_the_field)
{
    Contprof__Envelope pb;
    cp_err err = {0};
    pb_fill(&pb);
    pb.kind = 9;
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "kind 9 is unknown");
    pb_fill(&pb);
    pb.tenant = (char *)"a/b";
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "tenant \"a/b\" is invalid");
    pb_fill(&pb);
    pb.window_duration_ns = 0;
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "window_duration_ns 0");
    pb_fill(&pb);
    pb.producer_id = (char *)"";
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "producer_id");
    pb_fill(&pb);
    pb.pprof.len = 0;
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "pprof payload is empty");
    pb_fill(&pb);
    Contprof__Label l1 = CONTPROF__LABEL__INIT, l2 = CONTPROF__LABEL__INIT, *ls[2] = {&l1, &l2};
    l1.name = (char *)"service";
    l1.value = (char *)"a";
    l2.name = (char *)"service";
    l2.value = (char *)"b";
    pb.labels = ls;
    pb.n_labels = 2;
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "label \"service\" appears twice");
    l2.name = (char *)"9bad";
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "name \"9bad\" is invalid");
    /* a newline or an escape in a value would forge lines in every text answer and log */
    l2.name = (char *)"zone";
    l2.value = (char *)"eu\n{service=\"x\"} 1";
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "label \"zone\": control character 0x0a at byte 2");
    l2.value = (char *)"\x1b[31mred";
    CHECK_EQ(decode_pb(&pb, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "control character 0x1b at byte 0");
    l2.value = (char *)"caf\xc3\xa9 \"ok\""; /* UTF-8 and quotes are values like any */
    CHECK_EQ(decode_pb(&pb, &err), 0);
    /* what a producer does with names it did not choose (a thread's) before it sends them */
    cp_labels ls2 = {0};
    CHECK_EQ(cp_labels_set(&ls2, "isolate", "w\tor\x7fker\x1b"), 0);
    CHECK_EQ(cp_labels_set(&ls2, "service", "caf\xc3\xa9"), 0);
    CHECK_EQ(cp_labels_scrub(&ls2), 3);
    CHECK_STREQ(cp_labels_get(&ls2, "isolate"), "w?or?ker?");
    CHECK_STREQ(cp_labels_get(&ls2, "service"), "caf\xc3\xa9");
    cp_labels_close(&ls2);
    const uint8_t junk[] = {0x0a, 0xff};
    cp_envelope d;
    CHECK_EQ(cp_envelope_decode(junk, sizeof junk, 1 << 20, &d, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "not a valid envelope");
}

/* The view decoder borrows the payload from the buffer; the copying one owns a copy. Both
 * reject strings that are not UTF-8 or hold a NUL, and known fields of the wrong wire type. */
TEST(view_and_strict_strings)
{
    cp_envelope e, d, v;
    cp_buf b = {0};
    cp_err err = {0};
    fill(&e);
    CHECK_EQ(cp_envelope_encode(&e, &b), 0);
    CHECK_EQ(cp_envelope_decode_view(b.data, b.len, 1 << 20, &v, &err), 0);
    CHECK(v.pprof_borrowed);
    CHECK(v.pprof >= b.data && v.pprof + v.pprof_len <= b.data + b.len);
    CHECK_EQ(v.pprof_len, e.pprof_len);
    CHECK(memcmp(v.pprof, e.pprof, e.pprof_len) == 0);
    CHECK_EQ(cp_envelope_decode(b.data, b.len, 1 << 20, &d, &err), 0);
    CHECK(!d.pprof_borrowed);
    CHECK(d.pprof < b.data || d.pprof >= b.data + b.len);
    CHECK_STREQ(d.producer_id, v.producer_id);
    cp_envelope_close(&v); /* must not free the borrowed payload (ASan would tell) */
    cp_envelope_close(&d);

    /* producer_id (field 8) = "a\0b", then "\xc3\x28" (a bad UTF-8 sequence) */
    const char *bad[] = {"a\0b", "\xc3\x28", "\xed\xa0\x80" /* a surrogate */,
                         "\xe2\x82" /* cut short */};
    const size_t badlen[] = {3, 2, 3, 2};
    const char *want[] = {"producer_id contains a NUL byte", "producer_id is not valid UTF-8",
                          "producer_id is not valid UTF-8", "producer_id is not valid UTF-8"};
    for (int i = 0; i < 4; i++) {
        cp_buf m = {0};
        cp_buf_append(&m, b.data, b.len);
        const uint8_t key[] = {0x42, (uint8_t)badlen[i]}; /* field 8, length-delimited */
        cp_buf_append(&m, key, sizeof key);
        cp_buf_append(&m, bad[i], badlen[i]);
        CHECK_EQ(cp_envelope_decode_view(m.data, m.len, 1 << 20, &v, &err), CP_EENVELOPE);
        CHECK_CONTAINS(err.msg, want[i]);
        cp_buf_close(&m);
    }
    /* valid multi-byte UTF-8 passes, and the last value of a repeated scalar wins */
    cp_buf m = {0};
    cp_buf_append(&m, b.data, b.len);
    const uint8_t ok[] = {0x42, 0x06, 'h', 0xc3, 0xa9, 0xe2, 0x82};
    cp_buf_append(&m, ok, sizeof ok);
    const uint8_t ok2[] = {0xac};
    cp_buf_append(&m, ok2, 1);
    CHECK_EQ(cp_envelope_decode_view(m.data, m.len, 1 << 20, &v, &err), 0);
    CHECK_STREQ(v.producer_id, "h\xc3\xa9\xe2\x82\xac");
    cp_envelope_close(&v);
    /* the tenant (field 3) as a varint */
    m.len = 0;
    cp_buf_append(&m, b.data, b.len);
    const uint8_t wt[] = {0x18, 0x01};
    cp_buf_append(&m, wt, sizeof wt);
    CHECK_EQ(cp_envelope_decode_view(m.data, m.len, 1 << 20, &v, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "envelope field 3 at byte");
    CHECK_CONTAINS(err.msg, "expected length-delimited");
    cp_buf_close(&m);
    cp_buf_close(&b);
    cp_envelope_close(&e);
}

TEST(labels_sorted_and_formatted)
{
    cp_labels l = {0};
    cp_labels_set(&l, "z", "1");
    cp_labels_set(&l, "a", "q\"uote");
    cp_labels_set(&l, "m", "2");
    cp_labels_set(&l, "m", "3");
    cp_buf b = {0};
    cp_labels_format(&l, &b);
    cp_buf_append(&b, "", 1);
    CHECK_STREQ((char *)b.data, "{a=\"q\\\"uote\",m=\"3\",z=\"1\"}");
    CHECK(cp_labels_get(&l, "q") == NULL);
    CHECK(cp_label_name_valid("_ok9"));
    CHECK(!cp_label_name_valid("9no"));
    CHECK(!cp_label_name_valid(""));
    CHECK(!cp_label_name_valid("a-b"));
    cp_buf_close(&b);
    cp_labels_close(&l);
}

/* An envelope's pprof: raw up to CP_RAW_PPROF_MAX, gzip'd beyond; either decodes back to
 * the profile's comment. */
TEST(pprof_raw_or_gzipped_by_size)
{
    for (int big = 0; big < 2; big++) {
        cp_profile *p = cp_profile_create();
        CHECK(p);
        size_t n = big ? CP_RAW_PPROF_MAX + 1000 : 100;
        char *text = malloc(n + 1);
        CHECK(text);
        for (size_t i = 0; i < n; i++)
            text[i] = (char)('a' + (i * 7919 % 26));
        text[n] = 0;
        uint32_t id;
        CHECK_EQ(cp_profile_intern_cstr(p, text, &id), 0);
        CHECK_EQ(cp_vec_push(&p->comments, id), 0);
        cp_buf b = {0};
        CHECK_EQ(cp_envelope_pprof(p, &b), 0);
        CHECK_EQ(cp_is_gzip(b.data, b.len), big);
        CHECK(big ? b.len < CP_RAW_PPROF_MAX : b.len > n);
        cp_profile *d = NULL;
        CHECK_EQ(cp_pprof_decode(b.data, b.len, NULL, &d, NULL), 0);
        CHECK_EQ(d->comments.n, 1);
        CHECK_STREQ(cp_profile_str(d, d->comments.v[0]), text);
        cp_profile_destroy(d);
        cp_profile_destroy(p);
        cp_buf_close(&b);
        free(text);
    }
}

TEST_MAIN(T(roundtrip), T(version_checks), T(unknown_fields_ignored), T(validation_names_the_field),
          T(labels_sorted_and_formatted), T(view_and_strict_strings),
          T(pprof_raw_or_gzipped_by_size))
