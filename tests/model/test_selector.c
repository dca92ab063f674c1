/* Prometheus-style selectors (model/selector.c): matching, errors that name the byte, and
 * the guard that refuses regular expressions glibc's matcher would take exponential time
 * on. */
#include <stdio.h>
#include <string.h>

#include "labels.h"
#include "selector.h"
#include "test.h"

static int sel_ok(const char *text, const char *const *kv)
{
    cp_selector s;
    cp_err err = {0};
    CHECK(cp_selector_parse(text, &s, &err) == 0);
    cp_labels l = {0};
    for (; kv && kv[0]; kv += 2)
        CHECK(cp_labels_set(&l, kv[0], kv[1]) == 0);
    int m = cp_selector_match(&s, &l);
    cp_labels_close(&l);
    cp_selector_close(&s);
    return m;
}

static void sel_err(const char *text, const char *needle)
{
    cp_selector s;
    cp_err err = {0};
    CHECK_EQ(cp_selector_parse(text, &s, &err), CP_EPARSE);
    CHECK_EQ(s.n, 0);
    CHECK_CONTAINS(err.msg, needle);
}

TEST(selector_matches)
{
    const char *api[] = {"service", "api", "isolate", "worker3", "version", "1.3", NULL};
    CHECK(sel_ok("", api));
    CHECK(sel_ok("{}", api));
    CHECK(sel_ok(" { } ", api));
    CHECK(sel_ok("{service=\"api\"}", api));
    CHECK(sel_ok("service=\"api\"", api));
    CHECK(!sel_ok("{service=\"ap\"}", api));
    CHECK(sel_ok("{service=\"api\",isolate=~\"worker.*\",version!=\"1.2\"}", api));
    CHECK(!sel_ok("{service=\"api\",isolate=~\"worker.*\",version!=\"1.3\"}", api));
    CHECK(!sel_ok("{isolate=~\"worker\"}", api));        /* anchored */
    CHECK(sel_ok("{isolate=~\"worker|worker3\"}", api)); /* anchored around the alternation */
    CHECK(!sel_ok("{isolate=~\"x|worker\"}", api));
    CHECK(sel_ok("{isolate!~\"main.*\"}", api));
    CHECK(sel_ok("{absent=\"\"}", api));
    CHECK(!sel_ok("{absent!=\"\"}", api));
    CHECK(sel_ok("{ service = 'api' , }", api));
    CHECK(sel_ok("{version=~`1\\.[0-9]`}", api));
    const char *q[] = {"path", "a\"b\\c", NULL};
    CHECK(sel_ok("{path=\"a\\\"b\\\\c\"}", q));
}

TEST(selector_errors_name_the_byte)
{
    sel_err("{service=\"api\"", "expected ',' or '}' at byte 14");
    sel_err("{service~\"api\"}", "expected one of = != =~ !~ after the label name at byte 8");
    sel_err("{9x=\"a\"}", "expected a label name at byte 1");
    sel_err("{a=b}", "expected a quoted label value at byte 3");
    sel_err("{a=\"b}", "string opened at byte 3 is not closed");
    sel_err("{a=~\"(\"}", "bad regular expression at byte 4");
    sel_err("{a=\"b\"} x", "end of selector after '}' at byte 8");
    sel_err("{a=\"b\" c=\"d\"}", "expected ',' or '}' at byte 7");
    char big[CP_SELECTOR_MAX + 10];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    sel_err(big, "limit 4096");
}

TEST(regex_guard)
{
    cp_err err = {0};
    const char *ok[] = {"worker.*", "(a|b)+",         "[a-z]{2,5}", "x{3}", "a{2,}", "[]a]*",
                        "\\++",     "[[:alpha:]]+x?", "((ab)*c)+",  "a{",   "{",     "v1\\.[0-9]+",
                        NULL};
    for (const char **r = ok; *r; r++) {
        if (cp_regex_check(*r, &err)) fprintf(stderr, "%s: %s\n", *r, err.msg);
        CHECK(cp_regex_check(*r, &err) == 0);
    }
    CHECK_EQ(cp_regex_check("w+++++++++++++++++++++++*", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "stacked repetition operators at byte 2");
    CHECK_EQ(cp_regex_check("a*{2}", &err), CP_EPARSE);
    CHECK_EQ(cp_regex_check("(a*)b*\\1", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "backreference at byte 6");
    CHECK_EQ(cp_regex_check("a{1000}", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "repeats more than 255 times at byte 1");
    CHECK_EQ(cp_regex_check("a{,24444}", &err), CP_EPARSE); /* glibc's {,n} is {0,n} */
    CHECK_CONTAINS(err.msg, "repeats more than 255 times at byte 1");
    /* groups that can match nothing, repeated: exponential time in glibc's matcher */
    CHECK_EQ(cp_regex_check("(()+){84}", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "repeats a group that can match nothing at byte 3");
    CHECK_EQ(cp_regex_check("(a|)*", &err), CP_EPARSE);
    CHECK_EQ(cp_regex_check("($)+){42}", &err), CP_EPARSE); /* anchors match nothing */
    CHECK_EQ(cp_regex_check("(\\b)*", &err), CP_EPARSE);
    CHECK_EQ(cp_regex_check("((a*)b?)*", &err), CP_EPARSE);
    /* a ')' with no '(' would close the selector's own ^(...)$ group: the repetition after
     * it then copies every alternative before it (fuzz_selector: 2 GiB in regcomp) */
    CHECK_EQ(cp_regex_check(")", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "unmatched ')' at byte 0");
    CHECK_EQ(cp_regex_check("a|b|c|d|e){43}x))+){43}", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "unmatched ')' at byte 9");
    CHECK_EQ(cp_regex_check("(a|b)*", &err), 0);
    CHECK_EQ(cp_regex_check("(ab?)+x{0,3}", &err), 0);
    CHECK_EQ(cp_regex_check("((a{100}){100}){100}", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "too complex");
    CHECK_EQ(cp_regex_check("((((((((((((((((a+)+)+)+)+)+)+)+)+)+)+)+)+)+)+)+)+", &err), CP_EPARSE);
    char deep[200] = "";
    for (int i = 0; i < 70; i++)
        strcat(deep, "(");
    CHECK_EQ(cp_regex_check(deep, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "deeper than 64 at byte 64");
    sel_err("{a=~\"x{300}\"}", "selector: value at byte 4: regular expression repeats more than "
                               "255 times at byte 1");
}

TEST_MAIN(T(selector_matches), T(selector_errors_name_the_byte), T(regex_guard))
