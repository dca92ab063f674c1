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
    const char *bad[] = {
        "",    "{",     "[1,]",  "{\"a\"}",  "{\"a\":1,}", "\"abc", "\"\\u0000\"", "\"\\ud800\"",
        "tru", "[1] x", "{1:2}", "\"a\nb\"", "-",          "01x",   "01",          "1.",
        "+1",  ".5",    "1e",    "1e+",      "0x10",       "[1 2]", NULL};
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

/* CP_JSON_UTF8 refuses strings that are not UTF-8 by their offset; without it the bytes
 * pass as they are. Long numbers and numbers at the text's very end read. */
TEST(json_reader_utf8_and_numbers)
{
    cp_json *j = NULL;
    cp_err err = {0};
    const char *ok = "[\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]";
    CHECK_EQ(cp_json_parse_flags(ok, strlen(ok), CP_JSON_UTF8, &j, &err), 0);
    cp_json_free(j);
    const char *bad[] = {"[1,\"\xff\"]",
                         "[1,\"\xc3\"]",
                         "[1,\"\xc0\xaf\"]",
                         "[1,\"\xed\xa0\x80\"]",
                         "[1,\"\xf4\x90\x80\x80\"]",
                         NULL};
    for (const char **x = bad; *x; x++) {
        CHECK_EQ(cp_json_parse_flags(*x, strlen(*x), CP_JSON_UTF8, &j, &err), CP_EPARSE);
        CHECK_CONTAINS(err.msg, "JSON string at byte 3 is not valid UTF-8");
        CHECK(j == NULL);
        CHECK_EQ(cp_json_parse(*x, strlen(*x), &j, &err), 0);
        cp_json_free(j);
    }
    char num[200];
    memset(num, '9', 100);
    memcpy(num + 100, ".5e-98", 7);
    CHECK_EQ(cp_json_parse(num, strlen(num), &j, &err), 0);
    CHECK(j->type == CP_JSON_NUMBER && !j->is_int && j->num > 99.9 && j->num < 100.1);
    cp_json_free(j);
    CHECK_EQ(cp_json_parse("-9223372036854775807", 20, &j, &err), 0);
    CHECK(cp_json_is_int(j) && j->i64 == -9223372036854775807LL);
    cp_json_free(j);
    CHECK_EQ(cp_json_parse("12345678901234567890", 20, &j, &err), 0);
    CHECK(!cp_json_is_int(j) && j->num > 1.2e19);
    cp_json_free(j);
}

/* Trees edited and built: set replaces or adds, take removes, add appends, copy is deep,
 * write gives the compact text back. */
TEST(json_build_edit_write)
{
    cp_json *j = NULL;
    cp_err err = {0};
    const char *t = "{\"a\":1,\"b\":[true,null,\"x\\\"y\"],\"c\":-2.5,\"d\":{}}";
    CHECK_EQ(cp_json_parse(t, strlen(t), &j, &err), 0);
    cp_buf b = {0};
    CHECK_EQ(cp_json_write(&b, j), 0);
    CHECK_EQ(b.len, strlen(t));
    CHECK(!memcmp(b.data, t, b.len));
    b.len = 0;
    cp_json *c = cp_json_copy(j);
    CHECK(c);
    CHECK_EQ(cp_json_set(c, "a", cp_json_new_str("one")), 0);
    CHECK_EQ(cp_json_set(c, "e", cp_json_new_int(7)), 0);
    cp_json *taken = cp_json_take(c, "b");
    CHECK(cp_json_len(taken) == 3 && cp_json_is(cp_json_at(taken, 0), CP_JSON_BOOL));
    CHECK(!cp_json_at(taken, 3) && !cp_json_take(c, "b"));
    CHECK_EQ(cp_json_set(taken, "x", cp_json_new_int(1)), CP_EINVAL); /* not an object */
    cp_json_free(taken);
    for (int i = 0; i < 20; i++) /* grows past the arrays' capacity after the take */
        CHECK_EQ(cp_json_add(c, "k", cp_json_new_int(i)), 0);
    CHECK_EQ(cp_json_add(c, "z", NULL), CP_ENOMEM);
    CHECK_EQ(cp_json_write(&b, c), 0);
    CHECK_EQ(cp_buf_append(&b, "", 1), 0);
    CHECK_STREQ((const char *)b.data,
                "{\"a\":\"one\",\"c\":-2.5,\"d\":{},\"e\":7,\"k\":0,\"k\":1,\"k\":2,\"k\":3,"
                "\"k\":4,\"k\":5,\"k\":6,\"k\":7,\"k\":8,\"k\":9,\"k\":10,\"k\":11,\"k\":12,"
                "\"k\":13,\"k\":14,\"k\":15,\"k\":16,\"k\":17,\"k\":18,\"k\":19}");
    /* the original is untouched by edits of its copy */
    CHECK_EQ(cp_json_int(cp_json_get(j, "a"), 0), 1);
    CHECK_EQ(cp_json_len(cp_json_get(j, "b")), 3);
    CHECK_EQ(cp_json_num(cp_json_get(j, "c"), 0), -2.5);
    cp_buf_close(&b);
    cp_json_free(c);
    cp_json_free(j);
}

TEST_MAIN(T(json_escape), T(json_reader), T(json_reader_utf8_and_numbers), T(json_build_edit_write))
