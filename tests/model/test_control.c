/* Control messages (model/control.c): a capture round-trips, is signed like an envelope,
 * and every invalid field is refused with a message naming it. */
#include <stdio.h>
#include <string.h>

#include "capture.h"
#include "test.h"

static cp_capture sample(void)
{
    cp_capture c;
    memset(&c, 0, sizeof c);
    strcpy(c.id, "cap-1.a_b");
    strcpy(c.tenant, "team-a");
    c.selector = strdup("{service=\"edge\",isolate=\"counter\"}");
    c.kind = CP_KIND_CPU;
    c.cpu_hz = 1000;
    c.start_ns = 1700000000000000000LL;
    c.end_ns = c.start_ns + 5000000000LL;
    c.max_overhead_permille = 20;
    return c;
}

TEST(round_trip_signed)
{
    cp_capture c = sample(), d;
    cp_buf b = {0};
    cp_err err = {0};
    CHECK(cp_capture_encode(&c, "tok-a", &b) == 0);
    CHECK(cp_envelope_verify(b.data, b.len, "tok-a"));
    CHECK(!cp_envelope_verify(b.data, b.len, "tok-b"));
    CHECK(cp_capture_decode(b.data, b.len, &d, &err) == 0);
    CHECK_STREQ(d.id, c.id);
    CHECK_STREQ(d.tenant, "team-a");
    CHECK_STREQ(d.selector, c.selector);
    CHECK_EQ(d.kind, CP_KIND_CPU);
    CHECK_EQ(d.cpu_hz, 1000);
    CHECK_EQ(d.end_ns - d.start_ns, 5000000000LL);
    CHECK_EQ(d.max_overhead_permille, 20);
    CHECK_EQ(d.cancelled, 0);
    cp_capture_close(&d);
    cp_buf_close(&b);
    /* unsigned, cancelled */
    c.cancelled = 1;
    CHECK(cp_capture_encode(&c, NULL, &b) == 0);
    CHECK(!cp_envelope_verify(b.data, b.len, "tok-a"));
    CHECK(cp_capture_decode(b.data, b.len, &d, &err) == 0);
    CHECK_EQ(d.cancelled, 1);
    cp_capture_close(&d);
    cp_buf_close(&b);
    cp_capture_close(&c);
}

TEST(refuses_each_bad_field)
{
    cp_err err = {0};
    cp_capture c = sample();
    CHECK(cp_capture_validate(&c, &err) == 0);
    strcpy(c.id, "a/b");
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "0x2f at 1");
    c.id[0] = 0;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "capture id");
    strcpy(c.id, "x");
    free(c.selector);
    c.selector = strdup("{service=}");
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "selector");
    free(c.selector);
    c.selector = strdup("{}");
    c.cpu_hz = CP_CAPTURE_HZ_CEIL + 1;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "cpu_hz");
    c.kind = CP_KIND_ALLOC;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "alloc_rate");
    c.alloc_rate = 4096;
    CHECK(cp_capture_validate(&c, &err) == 0);
    c.kind = CP_KIND_INUSE;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "neither cpu, alloc nor heap");
    c.kind = CP_KIND_ALLOC;
    c.end_ns = c.start_ns;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "range");
    c.end_ns = c.start_ns + CP_CAPTURE_DURATION_CEIL_NS + 1;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    c.tenant[0] = 0;
    c.end_ns = c.start_ns + 1;
    CHECK_EQ(cp_capture_validate(&c, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "tenant");
    /* encode refuses what validate refuses */
    cp_buf b = {0};
    CHECK_EQ(cp_capture_encode(&c, NULL, &b), CP_EINVAL);
    CHECK_EQ(b.len, 0);
    cp_capture_close(&c);
}

TEST(refuses_garbage_and_versions)
{
    cp_capture d;
    cp_err err = {0};
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    CHECK_EQ(cp_capture_decode(junk, sizeof junk, &d, &err), CP_EENVELOPE);
    CHECK_CONTAINS(err.msg, "not a valid capture");
    const uint8_t v2[] = {0x08, 0x02}; /* format_major = 2 */
    CHECK_EQ(cp_capture_decode(v2, sizeof v2, &d, &err), CP_EVERSION);
    CHECK_EQ(d.selector == NULL, 1);
    const uint8_t empty_v1[] = {0x08, 0x01}; /* no id */
    CHECK_EQ(cp_capture_decode(empty_v1, sizeof empty_v1, &d, &err), CP_EINVAL);
}

/* The polled list (GET /api/v1/control/captures): messages after their lengths, split back
 * whole and verified; a list cut anywhere inside hands on nothing. */
static int g_seen;
static char g_ids[4][80];

static void seen(const uint8_t *v, size_t len, void *arg)
{
    cp_capture d;
    cp_err err = {0};
    CHECK(cp_envelope_verify(v, len, (const char *)arg));
    CHECK(cp_capture_decode(v, len, &d, &err) == 0);
    if (g_seen < 4) snprintf(g_ids[g_seen], sizeof g_ids[0], "%s", d.id);
    g_seen++;
    cp_capture_close(&d);
}

TEST(list_split_whole_or_not_at_all)
{
    cp_capture c = sample();
    cp_buf b = {0};
    CHECK_EQ(cp_capture_feed_split(b.data, 0, seen, "tok-a"), 0); /* none running: empty */
    for (int i = 0; i < 3; i++) {
        snprintf(c.id, sizeof c.id, "cap-%d", i);
        CHECK(cp_capture_feed_append(&b, &c, "tok-a") == 0);
    }
    size_t whole = b.len;
    c.end_ns = c.start_ns; /* invalid: refused, the list unchanged */
    CHECK_EQ(cp_capture_feed_append(&b, &c, "tok-a"), CP_EINVAL);
    CHECK_EQ(b.len, whole);
    g_seen = 0;
    CHECK_EQ(cp_capture_feed_split(b.data, b.len, seen, "tok-a"), 3);
    CHECK_EQ(g_seen, 3);
    CHECK_STREQ(g_ids[0], "cap-0");
    CHECK_STREQ(g_ids[2], "cap-2");
    for (size_t cut = 1; cut < b.len; cut++) {
        g_seen = 0;
        int n = cp_capture_feed_split(b.data, cut, seen, "tok-a");
        /* a cut at a message's end is a shorter list; anywhere else it is malformed */
        CHECK(n == -1 || (n >= 1 && n < 3));
        CHECK_EQ(g_seen, n < 0 ? 0 : n);
    }
    b.data[0] = 0xff; /* a length past the end */
    g_seen = 0;
    CHECK_EQ(cp_capture_feed_split(b.data, b.len, seen, "tok-a"), -1);
    CHECK_EQ(g_seen, 0);
    cp_buf_close(&b);
    cp_capture_close(&c);
}

TEST_MAIN(T(round_trip_signed), T(refuses_each_bad_field), T(refuses_garbage_and_versions),
          T(list_split_whole_or_not_at_all))
