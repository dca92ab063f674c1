/* The ingest offsets record (model/offsets.c): written byte for byte as GET
 * /api/v1/ingest/offsets has always served it, read back to the same record, and every
 * bad member refused with a message naming the partition and the member. */
#include <stdio.h>
#include <string.h>

#include "offsets.h"
#include "test.h"

static const char golden[] =
    "{\"partition\":3,\"stored\":120,\"known_from\":2,\"lost\":5,\"not_stored\":["
    "{\"from\":10,\"to\":15,\"why\":\"lost\"},{\"from\":40,\"to\":41,\"why\":\"dlq:envelope\"}]}";

static int read_text(const char *text, cp_partition_offsets *out, cp_err *err)
{
    cp_json *j = NULL;
    int rc = cp_json_parse(text, strlen(text), &j, err);
    if (!rc) rc = cp_offsets_read(j, out, err);
    cp_json_free(j);
    return rc;
}

TEST(written_as_served_and_read_back)
{
    cp_partition_offsets p = {.partition = 3, .stored = 120, .known_from = 2, .lost = 5};
    p.nranges = 2;
    p.not_stored[0] = (cp_offsets_range){10, 15, "lost"};
    p.not_stored[1] = (cp_offsets_range){40, 41, "dlq:envelope"};
    cp_buf b = {0};
    CHECK(cp_offsets_write(&b, &p) == 0);
    CHECK(cp_buf_append(&b, "", 1) == 0);
    CHECK_STREQ((const char *)b.data, golden);
    cp_buf_close(&b);
    cp_partition_offsets q;
    cp_err err = {0};
    CHECK(read_text(golden, &q, &err) == 0);
    CHECK_EQ(q.partition, 3);
    CHECK_EQ(q.stored, 120);
    CHECK_EQ(q.known_from, 2);
    CHECK_EQ(q.lost, 5);
    CHECK_EQ(q.nranges, 2);
    CHECK_EQ(q.not_stored[1].from, 40);
    CHECK_EQ(q.not_stored[1].to, 41);
    CHECK_STREQ(q.not_stored[1].why, "dlq:envelope");
    /* a partition nothing was stored of yet */
    CHECK(read_text("{\"partition\":0,\"stored\":-1,\"known_from\":0,\"lost\":0,\"not_stored\":[]}",
                    &q, &err) == 0);
    CHECK_EQ(q.stored, -1);
    CHECK_EQ(q.nranges, 0);
}

TEST(bad_members_are_named)
{
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"[1]", "not an object"},
        {"{\"stored\":1}", "\"partition\" is missing"},
        {"{\"partition\":-1}", "partition -1: out of range"},
        {"{\"partition\":2,\"stored\":\"x\"}", "partition 2: \"stored\" is not an integer"},
        {"{\"partition\":2,\"stored\":1,\"known_from\":0,\"lost\":0}",
         "partition 2: \"not_stored\" is missing"},
        {"{\"partition\":2,\"stored\":1,\"known_from\":0,\"lost\":1.5,\"not_stored\":[]}",
         "\"lost\" is not an integer"},
        {"{\"partition\":2,\"stored\":9,\"known_from\":0,\"lost\":0,\"not_stored\":[{\"from\":5,"
         "\"to\":4,\"why\":\"lost\"}]}",
         "partition 2, not_stored[0]: to 4 is below from 5"},
        {"{\"partition\":2,\"stored\":9,\"known_from\":0,\"lost\":0,\"not_stored\":[{\"from\":1,"
         "\"to\":4,\"why\":\"dlq:a-reason-far-longer-than-the-record\"}]}",
         "\"why\" is 39 bytes (at most 23)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cp_partition_offsets q;
        cp_err err = {0};
        CHECK_EQ(read_text(bad[i].text, &q, &err), CP_EPARSE);
        CHECK_CONTAINS(err.msg, bad[i].says);
    }
    /* more ranges than a record holds */
    cp_buf b = {0};
    CHECK(cp_buf_printf(&b, "{\"partition\":1,\"stored\":99,\"known_from\":0,\"lost\":0,"
                            "\"not_stored\":[") == 0);
    for (int k = 0; k <= CP_OFFSETS_RANGES; k++)
        CHECK(cp_buf_printf(&b, "%s{\"from\":%d,\"to\":%d,\"why\":\"lost\"}", k ? "," : "", k,
                            k + 1) == 0);
    CHECK(cp_buf_printf(&b, "]}") == 0 && cp_buf_append(&b, "", 1) == 0);
    cp_partition_offsets q;
    cp_err err = {0};
    CHECK_EQ(read_text((const char *)b.data, &q, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "33 not_stored ranges (at most 32)");
    cp_buf_close(&b);
}

TEST_MAIN(T(written_as_served_and_read_back), T(bad_members_are_named))
