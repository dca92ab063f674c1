/* Control messages (model/capture.c): a capture round-trips, is signed like an envelope,
 * every invalid field is refused with a message naming it, and the one intake (the agent's
 * and the V8 source's) takes each kind of message as its contract says. */
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

/* The intake over a table of two slots. */
static cp_capture_slot g_slots[2];

static cp_capture_slot *slot_at(void *arg, int i)
{
    (void)arg;
    return &g_slots[i];
}

/* c encoded, signed with token (NULL: unsigned), taken at now by t; the action. */
static cp_capture_act take(const cp_capture_table *t, const cp_capture *c, const char *token,
                           int64_t now, cp_capture_heard *h)
{
    cp_buf b = {0};
    CHECK(cp_capture_encode(c, token, &b) == 0);
    cp_capture_intake(t, b.data, b.len, now, h);
    cp_buf_close(&b);
    return h->act;
}

TEST(intake_each_branch)
{
    memset(g_slots, 0, sizeof g_slots);
    cp_capture_counts n = {0};
    cp_capture_table t = {slot_at, NULL, 2, &n, "team-a", "tok-a", 0};
    cp_capture c = sample();
    int64_t now = c.start_ns + 1000000000LL;
    cp_capture_heard h;

    /* bad: not a capture; nothing taken */
    cp_capture_intake(&t, (const uint8_t *)"\xff\xff\xff", 3, now, &h);
    CHECK_EQ(h.act, CP_CAPTURE_BAD);
    CHECK_EQ(h.slot, -1);
    CHECK_STREQ(h.id, "");
    CHECK(strstr(h.err.msg, "not a valid capture") != NULL);
    CHECK_EQ(n.bad, 1);
    /* foreign: another tenant's, even signed with our token */
    strcpy(c.tenant, "team-b");
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_FOREIGN);
    CHECK_EQ(n.foreign, 1);
    strcpy(c.tenant, "team-a");
    /* bad signature: unsigned, and signed with another token */
    CHECK_EQ(take(&t, &c, NULL, now, &h), CP_CAPTURE_BADSIG);
    CHECK_EQ(take(&t, &c, "tok-b", now, &h), CP_CAPTURE_BADSIG);
    CHECK_STREQ(h.id, "cap-1.a_b");
    CHECK_EQ(n.badsig, 2);
    /* heap: skipped by a native table, uncounted; a V8 table takes it */
    c.kind = CP_KIND_HEAP;
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_SKIPPED);
    CHECK(!g_slots[0].used && !g_slots[1].used);
    c.kind = CP_KIND_CPU;
    /* new: the first free slot, record and selector the slot's */
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_NEW);
    CHECK_EQ(h.slot, 0);
    CHECK(g_slots[0].used && !g_slots[0].ended);
    CHECK_STREQ(g_slots[0].c.id, "cap-1.a_b");
    CHECK_STREQ(g_slots[0].c.selector, c.selector);
    CHECK_EQ(g_slots[0].sel.n, 2);
    /* the same state again: nothing to re-plan */
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_SAME);
    CHECK_EQ(h.slot, 0);
    /* update: a new end and rate; the kind and selector stay */
    c.end_ns += 2000000000LL;
    c.cpu_hz = 500;
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_UPDATED);
    CHECK_EQ(h.slot, 0);
    CHECK_EQ(g_slots[0].c.end_ns, c.end_ns);
    CHECK_EQ(g_slots[0].c.cpu_hz, 500);
    /* another kind under the same id changes nothing */
    c.kind = CP_KIND_ALLOC;
    c.alloc_rate = 4096;
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_SAME);
    CHECK_EQ(g_slots[0].c.kind, CP_KIND_CPU);
    c.kind = CP_KIND_CPU;
    c.alloc_rate = 0;
    /* a second capture fills the table; a third is over it, counted */
    cp_capture d = sample();
    strcpy(d.id, "cap-2");
    CHECK_EQ(take(&t, &d, "tok-a", now, &h), CP_CAPTURE_NEW);
    CHECK_EQ(h.slot, 1);
    strcpy(d.id, "cap-3");
    CHECK_EQ(take(&t, &d, "tok-a", now, &h), CP_CAPTURE_FULL);
    CHECK_EQ(h.slot, -1);
    CHECK_STREQ(h.id, "cap-3");
    CHECK_EQ(n.full, 1);
    /* end: cancelled; a later live message does not restart it */
    c.cancelled = 1;
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_ENDED);
    CHECK_EQ(h.slot, 0);
    CHECK_EQ(h.cancelled, 1);
    CHECK(g_slots[0].used && g_slots[0].ended);
    c.cancelled = 0;
    c.cpu_hz = 100;
    CHECK_EQ(take(&t, &c, "tok-a", now, &h), CP_CAPTURE_SAME);
    CHECK_EQ(g_slots[0].c.cpu_hz, 500);
    /* end: past its end (not cancelled) */
    CHECK_EQ(take(&t, &d, "tok-a", d.end_ns, &h), CP_CAPTURE_EXPIRED); /* cap-3: not in it */
    CHECK_EQ(n.expired, 1);
    strcpy(d.id, "cap-2");
    CHECK_EQ(take(&t, &d, "tok-a", d.end_ns, &h), CP_CAPTURE_ENDED);
    CHECK_EQ(h.slot, 1);
    CHECK_EQ(h.cancelled, 0);
    /* expired: a cancelled one never heard before takes no slot */
    cp_capture_slot_close(&g_slots[1]);
    CHECK(!g_slots[1].used && !g_slots[1].c.selector);
    strcpy(d.id, "cap-4");
    d.cancelled = 1;
    CHECK_EQ(take(&t, &d, "tok-a", now, &h), CP_CAPTURE_EXPIRED);
    CHECK_EQ(n.expired, 2);
    CHECK(!g_slots[1].used);
    /* no token of ours: unsigned messages are taken; heap with a V8 table */
    cp_capture_table v8 = {slot_at, NULL, 2, &n, "team-a", NULL, 1};
    strcpy(d.id, "heap-1");
    d.cancelled = 0;
    d.kind = CP_KIND_HEAP;
    CHECK_EQ(take(&v8, &d, NULL, now, &h), CP_CAPTURE_NEW);
    CHECK_EQ(h.slot, 1);
    CHECK_EQ(g_slots[1].c.kind, CP_KIND_HEAP);
    /* the counts are the branches' only */
    CHECK_EQ(n.bad, 1);
    CHECK_EQ(n.foreign, 1);
    CHECK_EQ(n.badsig, 2);
    CHECK_EQ(n.expired, 2);
    CHECK_EQ(n.full, 1);
    for (int i = 0; i < 2; i++)
        cp_capture_slot_close(&g_slots[i]);
    cp_capture_close(&c);
    cp_capture_close(&d);
}

/* The engine text of capture windows: what a source writes, contprofd reads back. */
TEST(engine_text_written_and_read_back)
{
    char t[256];
    cp_capture_engine e = {.asked = 1000, .ran = 250, .reason = "perf events refused: x"}, r;
    CHECK(cp_capture_engine_write(t, sizeof t, "perf-event", &e) > 0);
    CHECK_STREQ(t, "perf-event capture asked=1000 ran=250 reason=perf events refused: x");
    CHECK_EQ(cp_capture_engine_parse(t, &r), 1);
    CHECK_EQ(r.asked, 1000);
    CHECK_EQ(r.ran, 250);
    CHECK(!r.has_cost && !r.has_permille);
    CHECK_STREQ(r.reason, "perf events refused: x");
    /* the V8 source's cost, without a reason */
    cp_capture_engine v = {.asked = 1000,
                           .ran = 1000,
                           .has_cost = 1,
                           .cost_us_per_s = 4321.4,
                           .has_permille = 1,
                           .cost_permille = 12.34};
    cp_capture_engine_write(t, sizeof t, "v8-inspector", &v);
    CHECK_STREQ(t, "v8-inspector capture asked=1000 ran=1000 cost_us_per_s=4321 "
                   "cost_permille=12.3");
    CHECK_EQ(cp_capture_engine_parse(t, &r), 1);
    CHECK(r.has_cost && r.has_permille);
    CHECK(r.cost_us_per_s == 4321.0);
    CHECK(r.cost_permille > 12.29 && r.cost_permille < 12.31);
    CHECK_STREQ(r.reason, "");
    /* a prefix that has words of its own (a heap snapshot's) */
    cp_capture_engine h = {.asked = 1, .ran = 1};
    cp_capture_engine_write(t, sizeof t, "v8-heap-snapshot pause_ms=3 objects=9 bytes=80", &h);
    CHECK_EQ(cp_capture_engine_parse(t, &r), 1);
    CHECK_EQ(r.asked, 1);
    CHECK_EQ(r.ran, 1);
    /* texts that say nothing of a capture */
    CHECK_EQ(cp_capture_engine_parse(NULL, &r), 0);
    CHECK_STREQ(r.reason, "");
    CHECK_EQ(cp_capture_engine_parse("perf-event", &r), 0);
    CHECK_EQ(cp_capture_engine_parse("x capture asked=abc ran=1", &r), 0);
    /* cut at the buffer, as snprintf */
    char small[20];
    CHECK(cp_capture_engine_write(small, sizeof small, "perf-event", &e) >= (int)sizeof small);
    CHECK_EQ(strlen(small), sizeof small - 1);
}

TEST_MAIN(T(intake_each_branch), T(engine_text_written_and_read_back), T(round_trip_signed),
          T(refuses_each_bad_field), T(refuses_garbage_and_versions),
          T(list_split_whole_or_not_at_all))
