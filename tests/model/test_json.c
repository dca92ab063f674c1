/* JSON (model/json.c): the escaping every writer uses and the reader the CLI and the
 * brokers client use. */
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "test.h"

TEST(json_escape)
{
    cp_buf b = {0};
    const char s[] = "a\"b\\c\n\r\t\x01\x7f\x1f\xc3\xa9/\0z";
    CHECK_EQ(cp_json_escape(&b, s, sizeof s - 1), 0);
    CHECK_EQ(b.len, 41);
    CHECK(memcmp(b.data, "a\\\"b\\\\c\\n\\r\\t\\u0001\\u007f\\u001f\xc3\xa9/\\u0000z", 41) == 0);
    /* what it writes, the reader reads back as it was (but for the NUL the reader refuses) */
    cp_buf q = {0};
    CHECK_EQ(cp_buf_printf(&q, "\"%.*s\"", (int)(b.len - 7), (const char *)b.data), 0);
    cp_json *j = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_json_parse((const char *)q.data, q.len, &j, &err), 0);
    CHECK_STREQ(cp_json_str(j, NULL), "a\"b\\c\n\r\t\x01\x7f\x1f\xc3\xa9/");
    cp_json_free(j);
    cp_buf_close(&q);
    cp_buf_close(&b);
}

TEST(json_reader)
{
    cp_json *j = NULL;
    cp_err err = {0};
    const char *t =
        " {\"a\":[1,-2.5,1e3,true,false,null],\"s\":\"x\\\"\\\\\\/\\n\\u00e9\\ud83d\\ude00\","
        "\"big\":9007199254740993,\"o\":{}} ";
    CHECK(cp_json_parse(t, strlen(t), &j, &err) == 0);
    const cp_json *a = cp_json_get(j, "a");
    CHECK(a && a->type == CP_JSON_ARRAY && a->n == 6);
    CHECK(a->items[0]->is_int && a->items[0]->i64 == 1);
    CHECK(!a->items[1]->is_int && a->items[1]->num == -2.5);
    CHECK_EQ(cp_json_int(a->items[2], 0), 1000);
    CHECK(a->items[3]->type == CP_JSON_BOOL && a->items[3]->num == 1);
    CHECK(a->items[5]->type == CP_JSON_NULL);
    CHECK_STREQ(cp_json_str(cp_json_get(j, "s"), NULL), "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
    CHECK_EQ(cp_json_int(cp_json_get(j, "big"), 0), 9007199254740993LL); /* exact, not a double */
    CHECK(cp_json_get(j, "o")->n == 0 && !cp_json_get(j, "missing"));
    cp_json_free(j);
    /* Many members (the growth path) and deep nesting up to the bound. */
    cp_buf b = {0};
    cp_buf_printf(&b, "[");
    for (int i = 0; i < 1000; i++)
        cp_buf_printf(&b, "%s%d", i ? "," : "", i);
    cp_buf_printf(&b, "]");
    CHECK(cp_json_parse((const char *)b.data, b.len, &j, &err) == 0);
    CHECK(j->n == 1000 && cp_json_int(j->items[999], 0) == 999);
    cp_json_free(j);
    cp_buf_close(&b);
    const char *bad[] = {"",      "{",           "[1,]",        "{\"a\"}", "{\"a\":1,}",
                         "\"abc", "\"\\u0000\"", "\"\\ud800\"", "tru",     "[1] x",
                         "{1:2}", "\"a\nb\"",    "-",           "01x",     NULL};
    for (const char **x = bad; *x; x++) {
        CHECK_EQ(cp_json_parse(*x, strlen(*x), &j, &err), CP_EPARSE);
        CHECK_CONTAINS(err.msg, "malformed JSON at byte");
        CHECK(j == NULL);
    }
    /* a tree 500 levels deep (the API's answer for a 250-frame stack) reads; 1025 does not */
    static char deep[2 * 1025];
    memset(deep, '[', 500);
    memset(deep + 500, ']', 500);
    CHECK_EQ(cp_json_parse(deep, 1000, &j, &err), 0);
    cp_json_free(j);
    memset(deep, '[', 1025);
    memset(deep + 1025, ']', 1025);
    CHECK_EQ(cp_json_parse(deep, 2050, &j, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "JSON nested deeper than 1024 at byte");
}

TEST_MAIN(T(json_escape), T(json_reader))
