/* The one time and duration grammar (model/times.c): every accepted form, every refusal,
 * and the messages that name the form or the representable range. */
#include "test.h"
#include "times.h"

#define S(x) ((int64_t)(x)*1000000000LL)

TEST(times_and_durations)
{
    int64_t t, d, now = S(1764424800LL); /* 2025-11-29T14:00:00Z */
    cp_err err = {0};
    CHECK(cp_parse_time("2025-11-29T14:00:00Z", now, &t, &err) == 0);
    CHECK_EQ(t, now);
    CHECK(cp_parse_time("2025-11-29T15:00:00.5+01:00", now, &t, &err) == 0);
    CHECK_EQ(t, now + 500000000LL);
    CHECK(cp_parse_time("1764424800", now, &t, &err) == 0);
    CHECK_EQ(t, now);
    CHECK(cp_parse_time("1764424800.25", now, &t, &err) == 0);
    CHECK_EQ(t, now + 250000000LL);
    CHECK(cp_parse_time("now", now, &t, &err) == 0);
    CHECK_EQ(t, now);
    CHECK(cp_parse_time("now-15m", now, &t, &err) == 0);
    CHECK_EQ(t, now - S(900));
    CHECK(cp_parse_time("now+1h", now, &t, &err) == 0);
    CHECK_EQ(t, now + S(3600));
    CHECK(cp_parse_time("-1h", now, &t, &err) == 0);
    CHECK_EQ(t, now - S(3600));
    CHECK(cp_parse_time("-7d", now, &t, &err) == 0);
    CHECK_EQ(t, now - 7 * S(86400));
    CHECK(cp_parse_time("now-90", now, &t, &err) == 0); /* a bare number is seconds */
    CHECK_EQ(t, now - S(90));
    const char *bad[] = {"",
                         "yesterday",
                         "2025-13-01T00:00:00Z",
                         "2025-02-29T00:00:00Z",
                         "2025-11-29T14:00:00",
                         "now-",
                         "now-15x",
                         "-",
                         "12abc",
                         "1e9",
                         "2025-11-29T14:00:00+1:00",
                         "nowish",
                         "+1h",
                         NULL};
    for (const char **b = bad; *b; b++) {
        CHECK_EQ(cp_parse_time(*b, now, &t, &err), CP_EPARSE);
        CHECK_CONTAINS(err.msg, "bad time");
        CHECK_CONTAINS(err.msg, "expected RFC 3339");
    }
    CHECK(cp_parse_duration("1h30m", 0, &d, &err) == 0);
    CHECK_EQ(d, S(5400));
    CHECK(cp_parse_duration("90", 0, &d, &err) == 0);
    CHECK_EQ(d, S(90));
    CHECK(cp_parse_duration("1.5s", 0, &d, &err) == 0);
    CHECK_EQ(d, 1500000000LL);
    CHECK(cp_parse_duration("2w", 0, &d, &err) == 0);
    CHECK_EQ(d, 14 * S(86400));
    CHECK(cp_parse_duration("250ms", 0, &d, &err) == 0);
    CHECK_EQ(d, 250000000LL);
    CHECK(cp_parse_duration("0", 1, &d, &err) == 0);
    CHECK_EQ(d, 0);
    CHECK_EQ(cp_parse_duration("0s", 0, &d, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "bad duration '0s': must be positive");
    const char *badd[] = {"", "5y", "10 s", "1h30", "s", "-1s", "1.s5", NULL};
    for (const char **b = badd; *b; b++) {
        CHECK_EQ(cp_parse_duration(*b, 0, &d, &err), CP_EPARSE);
        CHECK_CONTAINS(err.msg, "bad duration");
        CHECK_CONTAINS(err.msg, "a bare number is seconds");
    }
    char buf[40];
    cp_format_time(now + 5000000, buf, sizeof buf);
    CHECK_STREQ(buf, "2025-11-29T14:00:00.005Z");
    cp_format_time(-1, buf, sizeof buf);
    CHECK_STREQ(buf, "1969-12-31T23:59:59.999Z");
}

/* Out of range is its own error: the message names the bound, not the grammar. */
TEST(range_errors_name_the_limit)
{
    int64_t t, d, now = S(1764424800LL);
    cp_err err = {0};
    CHECK_EQ(cp_parse_time("9999-12-31T23:59:59Z", now, &t, &err), CP_EPARSE);
    CHECK_STREQ(err.msg, "bad time '9999-12-31T23:59:59Z': after 2262-04-11T23:47:16Z, the "
                         "latest time contprof can represent (unix nanoseconds in 64 bits)");
    CHECK_EQ(cp_parse_time("0001-01-01T00:00:00Z", now, &t, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "before 1677-09-21T00:12:44Z, the earliest time");
    CHECK_EQ(cp_parse_time("99999999999999999999", now, &t, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "after 2262-04-11T23:47:16Z");
    CHECK_EQ(cp_parse_time("now+15000w", now, &t, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "after 2262-04-11T23:47:16Z");
    CHECK_EQ(cp_parse_time("now+99999999999w", now, &t, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "after 2262-04-11T23:47:16Z");
    CHECK(cp_parse_time("-15000w", now, &t, &err) == 0);
    CHECK_EQ(cp_parse_time("-99999999999w", now, &t, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "before 1677-09-21T00:12:44Z");
    /* The bounds themselves are accepted and print back as named. */
    CHECK(cp_parse_time("2262-04-11T23:47:15Z", now, &t, &err) == 0);
    CHECK(cp_parse_time("1677-09-21T00:12:44Z", now, &t, &err) == 0);
    char buf[40];
    cp_format_time(CP_TIME_MAX_S * 1000000000LL, buf, sizeof buf);
    CHECK_STREQ(buf, "2262-04-11T23:47:15.000Z");
    CHECK_EQ(cp_parse_duration("99999999999w", 0, &d, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "longer than the longest duration, 15250w");
}

TEST_MAIN(T(times_and_durations), T(range_errors_name_the_limit))
