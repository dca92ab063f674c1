/* Unit tests of the query stage's parsers and renderers: query strings, and the top /
 * folded / JSON views (selectors and the JSON reader are model/'s: tests/model). */
#include <regex.h>

#include "json.h" /* the views read cp_json trees */
#include "params.h"
#include "qtest.h"
#include "render.h"
#include "selector.h"
#include "views.h"

/* ---- query strings (times and durations: tests/model/test_times.c) ------------------ */

TEST(query_strings)
{
    cp_params p = {0};
    cp_err err = {0};
    CHECK(cp_params_parse("select=%7Bservice%3D%22api%22%7D&from=now-1h&x=a+b&flag", &p, &err) ==
          0);
    CHECK_STREQ(cp_params_get(&p, "select"), "{service=\"api\"}");
    CHECK_STREQ(cp_params_get(&p, "x"), "a b");
    CHECK_STREQ(cp_params_get(&p, "flag"), "");
    CHECK(cp_params_get(&p, "to") == NULL);
    const char *allowed[] = {"select", "from", "x", NULL};
    CHECK_EQ(cp_params_check(&p, allowed, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "unknown parameter 'flag'");
    cp_params_close(&p);
    CHECK_EQ(cp_params_parse("a=1&a=2", &p, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "'a' given more than once");
    cp_params_close(&p);
    CHECK_EQ(cp_params_parse("a=%zz", &p, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "bad percent escape");
    cp_params_close(&p);
    CHECK_EQ(cp_params_parse("a=%4", &p, &err), CP_EPARSE);
    cp_params_close(&p);
    CHECK_EQ(cp_params_parse("a=%00", &p, &err), CP_EPARSE);
    cp_params_close(&p);
    char many[1024] = "";
    for (int i = 0; i < 70; i++)
        snprintf(many + strlen(many), 16, "p%d=1&", i);
    CHECK_EQ(cp_params_parse(many, &p, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "more than 64");
    cp_params_close(&p);
}

/* ---- renderers ---------------------------------------------------------------------- */

static cp_profile *sample_profile(void)
{
    cp_profile *p = qt_cpu_profile();
    qt_add(p, "main;a;b", 3, 30000000);
    qt_add(p, "main;a", 2, 20000000);
    qt_add(p, "main;c", 5, 50000000);
    qt_add(p, "main;a;b;a", 1, 10000000); /* recursion: a counted once in cum */
    return p;
}

static char *cstr(cp_buf *b)
{
    cp_buf_append(b, "", 1);
    return (char *)b->data;
}

TEST(render_folded)
{
    cp_profile *p = sample_profile();
    cp_buf b = {0};
    CHECK(cp_render_folded(p, 1, &b) == 0);
    CHECK_STREQ(cstr(&b), "main;a 20000000\nmain;a;b 30000000\nmain;a;b;a 10000000\n"
                          "main;c 50000000\n");
    cp_buf_close(&b);
    CHECK(cp_render_folded(p, 0, &b) == 0);
    CHECK_STREQ(cstr(&b), "main;a 2\nmain;a;b 3\nmain;a;b;a 1\nmain;c 5\n");
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

TEST(render_top)
{
    cp_profile *p = sample_profile();
    int vi = -1;
    cp_err err = {0};
    CHECK(cp_render_value_index(p, NULL, &vi, &err) == 0);
    CHECK_EQ(vi, 1); /* the last sample type, as pprof */
    CHECK(cp_render_value_index(p, "samples", &vi, &err) == 0);
    CHECK_EQ(vi, 0);
    CHECK_EQ(cp_render_value_index(p, "bogus", &vi, &err), CP_EINVAL);
    CHECK_CONTAINS(err.msg, "profile has: samples, cpu");
    cp_buf b = {0};
    CHECK(cp_render_top(p, 1, 0, &b) == 0);
    const char *s = cstr(&b);
    CHECK_CONTAINS(s, "Showing nodes accounting for 110ms, 100.00% of 110ms total");
    CHECK_CONTAINS(s, "      flat  flat%   sum%        cum   cum%");
    CHECK_CONTAINS(s, "      50ms 45.45% 45.45%       50ms 45.45%  c\n");
    CHECK_CONTAINS(s, "      30ms 27.27% 72.73%       60ms 54.55%  a\n");
    CHECK_CONTAINS(s, "      30ms 27.27% 100.00%       40ms 36.36%  b\n");
    CHECK_CONTAINS(s, "         0  0.00% 100.00%      110ms 100.00%  main\n");
    cp_buf_close(&b);
    CHECK(cp_render_top(p, 1, 2, &b) == 0);
    CHECK_CONTAINS(cstr(&b), "Showing top 2 nodes out of 4");
    cp_buf_close(&b);
    cp_profile_destroy(p);
    char v[32];
    cp_render_value(1200000000, "nanoseconds", v, sizeof v);
    CHECK_STREQ(v, "1.20s");
    cp_render_value(3 * 1048576 + 524288, "bytes", v, sizeof v);
    CHECK_STREQ(v, "3.50MB");
    cp_render_value(42, "count", v, sizeof v);
    CHECK_STREQ(v, "42");
}

TEST(render_json_tree_and_pruning)
{
    cp_profile *p = sample_profile();
    cp_buf b = {0};
    CHECK(cp_render_tree_json(p, 0, NULL, 0, &(cp_render_tree_opts){0, "\"x\":1,"}, &b) == 0);
    CHECK_STREQ(cstr(&b),
                "{\"x\":1,\"sample_type\":{\"type\":\"samples\",\"unit\":\"count\"},\"total\":11,"
                "\"nodes\":5,\"total_nodes\":5,\"root\":{\"name\":\"total\",\"self\":0,\"total\":"
                "11,\"children\":[{\"name\":\"main\",\"self\":0,\"total\":11,\"children\":["
                "{\"name\":\"a\",\"self\":2,\"total\":6,\"children\":[{\"name\":\"b\",\"self\":3,"
                "\"total\":4,\"children\":[{\"name\":\"a\",\"self\":1,\"total\":1}]}]},"
                "{\"name\":\"c\",\"self\":5,\"total\":5}]}]}}");
    cp_buf_close(&b);
    /* Three nodes: main (11), a (6), c (5); b's subtree (4) folds into a's self. */
    CHECK(cp_render_tree_json(p, 0, NULL, 0, &(cp_render_tree_opts){3, NULL}, &b) == 0);
    CHECK_CONTAINS(cstr(&b), "\"nodes\":3,\"total_nodes\":5");
    CHECK_CONTAINS(cstr(&b), "{\"name\":\"a\",\"self\":6,\"total\":6}");
    CHECK_CONTAINS(cstr(&b), "{\"name\":\"c\",\"self\":5,\"total\":5}");
    cp_buf_close(&b);
    /* A diff tree carries both sides. */
    cp_profile *base = qt_cpu_profile();
    qt_add(base, "main;c", 7, 0);
    qt_add(base, "main;d", 1, 0);
    CHECK(cp_render_tree_json(p, 0, base, 0, NULL, &b) == 0);
    CHECK_CONTAINS(cstr(&b), "\"total\":11,\"base_total\":8");
    CHECK_CONTAINS(cstr(&b), "{\"name\":\"c\",\"self\":5,\"total\":5,\"base_self\":7,"
                             "\"base_total\":7}");
    CHECK_CONTAINS(cstr(&b), "{\"name\":\"d\",\"self\":0,\"total\":0,\"base_self\":1,"
                             "\"base_total\":1}");
    cp_buf_close(&b);
    cp_profile_destroy(base);
    cp_profile_destroy(p);
}

TEST(render_filter)
{
    cp_profile *p = sample_profile();
    cp_err err = {0};
    CHECK(cp_render_filter(p, "^b$", NULL, &err) == 0);
    CHECK_EQ(p->samples.n, 2);
    CHECK_EQ(cp_profile_total(p, 0), 4);
    cp_profile_destroy(p);
    p = sample_profile();
    CHECK(cp_render_filter(p, NULL, "^c$", &err) == 0);
    CHECK_EQ(cp_profile_total(p, 0), 6);
    CHECK(cp_render_filter(p, "a", "b", &err) == 0);
    CHECK_EQ(cp_profile_total(p, 0), 2);
    CHECK_EQ(cp_render_filter(p, "(", NULL, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "bad focus regex '('");
    CHECK_EQ(cp_render_filter(p, NULL, "[", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "bad ignore regex '['");
    /* the regex guard (tests/model/test_selector.c) applies to focus and ignore too */
    CHECK_EQ(cp_render_filter(p, "a**", NULL, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "bad focus regex 'a**': regular expression has stacked repetition");
    cp_profile_destroy(p);
}

/* ---- the CLI's table views (the JSON reader: tests/model/test_json.c) --------------- */

TEST(views_name_what_is_missing)
{
    cp_buf out = {0};
    cp_err err = {0};
    CHECK_EQ(cp_view_series("{\"count\":0}", 11, &out, &err), CP_EPARSE);
    CHECK_STREQ(err.msg, "the server's series answer has no \"series\" list");
    CHECK_EQ(cp_view_timeline("[1,", 3, &out, &err), CP_EPARSE);
    CHECK_STREQ(err.msg, "the server's timeline answer: malformed JSON at byte 3");
    const char *tl = "{\"sample_types\":[{\"type\":\"cpu\",\"unit\":\"nanoseconds\"}],"
                     "\"points\":[[0,1,2]]}";
    CHECK_EQ(cp_view_timeline(tl, strlen(tl), &out, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "[time, values...] points");
    CHECK_EQ(cp_view_diff("{}", 2, 0, &out, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "diff answer has no \"root\" tree");
    CHECK_EQ(out.len, 0);
    /* A series without a label that others have shows "-"; wide tables stay aligned. */
    cp_buf j = {0};
    cp_buf_printf(&j, "{\"series\":[{\"type\":\"inuse\",\"labels\":{");
    for (int i = 0; i < 40; i++)
        cp_buf_printf(&j, "%s\"l%02d\":\"v%d\"", i ? "," : "", i, i * 100);
    cp_buf_printf(&j, "},\"first\":\"x\",\"last\":\"y\"},{\"type\":\"cpu\",\"labels\":{\"l39\":"
                      "\"w\"},\"first\":\"2025-11-24T16:00:00.500Z\",\"last\":\"y\"}]}");
    CHECK(cp_view_series((const char *)j.data, j.len, &out, &err) == 0);
    cp_buf_append(&out, "", 1);
    const char *o = (const char *)out.data;
    CHECK_CONTAINS(o, "TYPE   L00  L01   L02   ");
    CHECK_CONTAINS(o, "  L39    FIRST                     LAST\n");
    CHECK_CONTAINS(o, "\ncpu    -    -     -     ");
    CHECK_CONTAINS(o, "  -      w      2025-11-24T16:00:00.500Z  y\n");
    CHECK_CONTAINS(o, "\ninuse  v0   v100  v200  ");
    CHECK_CONTAINS(o, "  v3800  v3900  x                         y\n");
    cp_buf_close(&j);
    cp_buf_close(&out);
}

/* Unsymbolized frames: module+0xOFFSET in every text format, the same at any base; a bare
 * address only where no object is known. */
TEST(render_unsymbolized_frames)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_profile_add_sample_type(p, "cpu", "nanoseconds") == 0);
    uint32_t mid[3], loc[6];
    for (int k = 0; k < 2; k++) { /* two processes: the program at two ASLR bases */
        uint64_t base = k ? 0x563200000000 : 0x555555554000;
        cp_mapping m = {base + 0x1000, base + 0x3000, 0x1000, 0, 0, 0};
        CHECK(cp_profile_intern_cstr(p, "/usr/bin/rg", &m.filename) == 0);
        CHECK(cp_profile_add_mapping(p, &m, &mid[k]) == 0);
        CHECK(cp_profile_add_location(p, base + 0x1234, mid[k], NULL, 0, &loc[2 * k]) == 0);
        CHECK(cp_profile_add_location(p, base + 0x2000, mid[k], NULL, 0, &loc[2 * k + 1]) == 0);
    }
    cp_mapping jit = {0x7e0000000000, 0x7e0000001000, 0, 0, 0, 0};
    CHECK(cp_profile_add_mapping(p, &jit, &mid[2]) == 0);
    CHECK(cp_profile_add_location(p, 0x7e0000000040, mid[2], NULL, 0, &loc[4]) == 0);
    int64_t v = 7;
    for (int k = 0; k < 2; k++) {
        uint32_t st[2] = {loc[2 * k], loc[2 * k + 1]};
        CHECK(cp_profile_add_sample(p, st, 2, &v, NULL, 0) == 0);
    }
    uint32_t st[2] = {loc[4], loc[1]};
    CHECK(cp_profile_add_sample(p, st, 2, &v, NULL, 0) == 0);
    cp_buf b = {0};
    CHECK(cp_render_folded(p, 0, &b) == 0);
    CHECK_STREQ(cstr(&b), "rg+0x2000;0x7e0000000040 7\nrg+0x2000;rg+0x1234 14\n");
    cp_buf_close(&b);
    CHECK(cp_render_top(p, 0, 0, &b) == 0);
    CHECK_CONTAINS(cstr(&b), "rg+0x1234\n");
    cp_buf_close(&b);
    CHECK(cp_render_tree_json(p, 0, NULL, 0, NULL, &b) == 0);
    CHECK_CONTAINS(cstr(&b), "\"name\":\"rg+0x2000\",\"module\":\"rg\",\"self\"");
    /* anonymous memory names no object: no module */
    CHECK_CONTAINS(cstr(&b), "\"name\":\"0x7e0000000040\",\"self\"");
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

/* The JSON tree tells native frames (their object's base name as "module") from language
 * frames (no mapping: none), which the web UI's "language frames only" and "collapse
 * module" drawings rely on. */
TEST(render_json_modules)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_profile_add_sample_type(p, "cpu", "nanoseconds") == 0);
    cp_mapping m = {0x400000, 0x800000, 0, 0, 0, 0};
    CHECK(cp_profile_intern_cstr(p, "/opt/bin/workerd", &m.filename) == 0);
    uint32_t mid, loc[3];
    CHECK(cp_profile_add_mapping(p, &m, &mid) == 0);
    const char *fn[3] = {"kj::run", "handler", "v8::Call"};
    for (int k = 0; k < 3; k++) {
        cp_function f = {0};
        CHECK(cp_profile_intern_cstr(p, fn[k], &f.name) == 0);
        f.system_name = f.name;
        CHECK(cp_profile_intern_cstr(p, k == 1 ? "worker.js" : "", &f.filename) == 0);
        uint32_t fid;
        CHECK(cp_profile_add_function(p, &f, &fid) == 0);
        cp_line line = {.function_id = fid, .line = 4};
        CHECK(cp_profile_add_location(p, k == 1 ? 0 : 0x401000 + 16 * (uint64_t)k, k == 1 ? 0 : mid,
                                      &line, 1, &loc[k]) == 0);
    }
    /* kj::run -> handler -> v8::Call (leaf first in pprof) */
    uint32_t st[3] = {loc[2], loc[1], loc[0]};
    int64_t v = 5;
    CHECK(cp_profile_add_sample(p, st, 3, &v, NULL, 0) == 0);
    cp_buf b = {0};
    CHECK(cp_render_tree_json(p, 0, NULL, 0, NULL, &b) == 0);
    const char *s = cstr(&b);
    CHECK_CONTAINS(s, "{\"name\":\"total\",\"self\":0,");
    CHECK_CONTAINS(s, "{\"name\":\"kj::run\",\"module\":\"workerd\",\"self\":0,\"total\":5,");
    CHECK_CONTAINS(s, "{\"name\":\"handler\",\"self\":0,\"total\":5,");
    CHECK_CONTAINS(s, "{\"name\":\"v8::Call\",\"module\":\"workerd\",\"self\":5,\"total\":5}");
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

TEST_MAIN(T(query_strings), T(render_folded), T(render_top), T(render_json_tree_and_pruning),
          T(render_filter), T(views_name_what_is_missing), T(render_unsymbolized_frames),
          T(render_json_modules))
