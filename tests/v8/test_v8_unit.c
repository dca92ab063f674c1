/* The V8 source's conversions in process (collector/v8/v8conv.c, sourcemap.c): a CPU
 * profile and a sampling heap profile as V8's inspector sends them become the expected
 * pprof samples; esbuild's source map maps minified frames back to TypeScript; malformed
 * messages and maps are errors naming the problem, never a crash. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sourcemap.h"
#include "test.h"
#include "v8conv.h"
#include "v8cpu.h"
#include "v8source_int.h"

static cp_json *parse(const char *text)
{
    cp_json *j = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_json_parse(text, strlen(text), &j, &err), 0);
    return j;
}

/* Sum of column t over samples whose stack has a function named fn. */
static int64_t total_with(const cp_profile *p, const char *fn, int t)
{
    int64_t sum = 0;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        for (uint32_t k = 0; k < s->nlocs; k++) {
            const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
            const cp_function *f = &p->functions.v[p->lines.v[l->line_off].function_id - 1];
            if (!strcmp(cp_profile_str(p, f->name), fn)) {
                sum += cp_profile_sample_values(p, i)[t];
                break;
            }
        }
    }
    return sum;
}

#define CPU_OK                                                                                     \
    "{\"nodes\":["                                                                                 \
    "{\"id\":1,\"callFrame\":{\"functionName\":\"(root)\",\"url\":\"\",\"lineNumber\":-1,"         \
    "\"columnNumber\":-1},\"children\":[2,4]},"                                                    \
    "{\"id\":2,\"callFrame\":{\"functionName\":\"outer\",\"url\":\"file:///a.js\","                \
    "\"lineNumber\":9,\"columnNumber\":4},\"children\":[3]},"                                      \
    "{\"id\":3,\"callFrame\":{\"functionName\":\"\",\"url\":\"file:///a.js\",\"lineNumber\":19,"   \
    "\"columnNumber\":0}},"                                                                        \
    "{\"id\":4,\"callFrame\":{\"functionName\":\"(idle)\",\"url\":\"\",\"lineNumber\":-1,"         \
    "\"columnNumber\":-1}}],"                                                                      \
    "\"startTime\":1000,\"endTime\":5000,\"samples\":[3,3,2,4],\"timeDeltas\":[0,1000,1500,500]}"

TEST(cpu_profile)
{
    cp_json *j = parse(CPU_OK);
    cp_profile *p = NULL;
    int64_t span = 0;
    cp_err err = {0};
    CHECK_EQ(cp_v8_cpu_profile(j, 1000, &p, &span, &err), 0);
    CHECK_EQ(span, 4000);
    CHECK_EQ(p->sample_types.n, 2);
    /* two samples of node 3, one of node 2, one idle (dropped): one interval each */
    CHECK_EQ(total_with(p, "(anonymous)", 0), 2);
    CHECK_EQ(total_with(p, "(anonymous)", 1), 2000000);
    CHECK_EQ(total_with(p, "outer", 0), 3);
    CHECK_EQ(total_with(p, "outer", 1), 3000000);
    CHECK_EQ(total_with(p, "(idle)", 0), 0);
    CHECK_EQ(total_with(p, "(root)", 0), 0);
    /* the frame: file = URL, line 1-based, column in the system name */
    int found = 0;
    for (uint32_t i = 0; i < p->functions.n; i++)
        if (!strcmp(cp_profile_str(p, p->functions.v[i].name), "outer")) {
            CHECK_STREQ(cp_profile_str(p, p->functions.v[i].filename), "file:///a.js");
            CHECK_STREQ(cp_profile_str(p, p->functions.v[i].system_name),
                        "outer file:///a.js:10:5");
            CHECK_EQ(p->functions.v[i].start_line, 10);
            found = 1;
        }
    CHECK(found);
    cp_profile_destroy(p);
    cp_json_free(j);
}

/* positionTicks: a function's samples split over the lines V8 counted (3:1 of 10 samples:
 * 7 and 3, by cumulative rounding), each a leaf at its line under the same function;
 * its callers keep their own line. Malformed ticks are refused by name. */
TEST(cpu_position_ticks)
{
    const char *text =
        "{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"(root)\",\"url\":\"\","
        "\"lineNumber\":-1,\"columnNumber\":-1},\"children\":[2]},"
        "{\"id\":2,\"callFrame\":{\"functionName\":\"outer\",\"url\":\"file:///a.js\","
        "\"lineNumber\":0,\"columnNumber\":0},\"children\":[3]},"
        "{\"id\":3,\"callFrame\":{\"functionName\":\"hot\",\"url\":\"file:///a.js\","
        "\"lineNumber\":3,\"columnNumber\":0},\"positionTicks\":[{\"line\":5,\"ticks\":3},"
        "{\"line\":7,\"ticks\":1}]}],"
        "\"startTime\":0,\"endTime\":10000,\"samples\":[3,3,3,3,3,3,3,3,3,3],"
        "\"timeDeltas\":[0,1000,1000,1000,1000,1000,1000,1000,1000,1000]}";
    cp_json *j = parse(text);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_v8_cpu_profile(j, 1000, &p, NULL, &err), 0);
    CHECK_EQ(total_with(p, "hot", 0), 10);
    CHECK_EQ(total_with(p, "outer", 0), 10);
    int64_t at[10] = {0};
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *sm = &p->samples.v[i];
        const cp_location *leaf = &p->locations.v[p->stack.v[sm->loc_off] - 1];
        const cp_line *ln = &p->lines.v[leaf->line_off];
        CHECK_STREQ(cp_profile_str(p, p->functions.v[ln->function_id - 1].name), "hot");
        CHECK(ln->line >= 0 && ln->line < 10);
        at[ln->line] += cp_profile_sample_values(p, i)[0];
        const cp_location *up = &p->locations.v[p->stack.v[sm->loc_off + 1] - 1];
        CHECK_EQ(p->lines.v[up->line_off].line, 1); /* outer at its own line */
    }
    CHECK_EQ(at[5], 7);
    CHECK_EQ(at[7], 3);
    cp_profile_destroy(p);
    cp_json_free(j);
    static const char *bad[] = {"\"positionTicks\":3", "\"positionTicks\":[7]",
                                "\"positionTicks\":[{\"line\":0,\"ticks\":1}]",
                                "\"positionTicks\":[{\"line\":2,\"ticks\":-1}]"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        char t[2048];
        snprintf(t, sizeof(t),
                 "{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"f\",\"url\":\"u\"},%s}],"
                 "\"startTime\":0,\"endTime\":1,\"samples\":[1],\"timeDeltas\":[0]}",
                 bad[k]);
        j = parse(t);
        p = NULL;
        CHECK(cp_v8_cpu_profile(j, 1000, &p, NULL, &err) != 0);
        printf("%s -> %s\n", bad[k], err.msg);
        CHECK_CONTAINS(err.msg, "positionTicks");
        CHECK(!p);
        cp_json_free(j);
    }
}

/* Each malformed profile fails with a message naming the problem. */
TEST(cpu_malformed)
{
    static const struct {
        const char *json, *says;
    } cases[] = {
        {"[]", "not an object"},
        {"{\"nodes\":3}", "no nodes array"},
        {"{\"nodes\":[1]}", "not an object"},
        {"{\"nodes\":[{\"id\":1}]}", "callFrame"},
        {"{\"nodes\":[{\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"}}]}", "no id"},
        {"{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":7,\"url\":\"\"}}]}",
         "not a string"},
        {"{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"}},"
         "{\"id\":1,\"callFrame\":{\"functionName\":\"b\",\"url\":\"\"}}]}",
         "appears twice"},
        {"{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"},"
         "\"children\":[9]}]}",
         "not a node id"},
        {"{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"},"
         "\"children\":[2]},{\"id\":2,\"callFrame\":{\"functionName\":\"b\",\"url\":\"\"},"
         "\"children\":[1]}],\"samples\":[1],\"timeDeltas\":[1]}",
         "cycle"},
        {"{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"},"
         "\"children\":[1]}]}",
         "child of two"},
        {"{\"nodes\":[],\"samples\":[1],\"timeDeltas\":[]}", "timeDeltas"},
        {"{\"nodes\":[],\"samples\":[1],\"timeDeltas\":[1]}", "samples[0]"},
        {"{\"nodes\":[],\"samples\":[],\"timeDeltas\":[],\"startTime\":\"x\"}", "startTime"},
        {"{\"nodes\":[{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\","
         "\"lineNumber\":1e300}}],\"samples\":[1],\"timeDeltas\":[1]}",
         "lineNumber"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cp_json *j = parse(cases[i].json);
        cp_profile *p = (cp_profile *)1;
        cp_err err = {0};
        int rc = cp_v8_cpu_profile(j, 1000, &p, NULL, &err);
        if (rc == 0 || !strstr(err.msg, cases[i].says))
            printf("case %zu: rc %d, \"%s\" (expected \"%s\")\n", i, rc, err.msg, cases[i].says);
        CHECK(rc != 0);
        CHECK(p == NULL);
        CHECK_CONTAINS(err.msg, cases[i].says);
        cp_json_free(j);
    }
}

#define HEAP                                                                                       \
    "{\"head\":{\"callFrame\":{\"functionName\":\"(root)\",\"url\":\"\",\"lineNumber\":-1,"        \
    "\"columnNumber\":-1},\"selfSize\":0,\"id\":1,\"children\":["                                  \
    "{\"callFrame\":{\"functionName\":\"build\",\"url\":\"w.js\",\"lineNumber\":2,"                \
    "\"columnNumber\":3},\"selfSize\":0,\"id\":2,\"children\":[]},"                                \
    "{\"callFrame\":{\"functionName\":\"other\",\"url\":\"w.js\",\"lineNumber\":8,"                \
    "\"columnNumber\":3},\"selfSize\":0,\"id\":3,\"children\":[]}]},"                              \
    "\"samples\":[{\"size\":1572864,\"nodeId\":2,\"ordinal\":1},"                                  \
    "{\"size\":532224,\"nodeId\":2,\"ordinal\":2},{\"size\":524320,\"nodeId\":3,\"ordinal\":3}]}"

TEST(heap_profile)
{
    cp_json *j = parse(HEAP);
    cp_profile *in = NULL, *al = NULL, *al2 = NULL;
    cp_err err = {0};
    uint64_t mark = 1;
    CHECK_EQ(cp_v8_heap_profile(j, 512 * 1024, 0, NULL, &in, &err), 0);
    CHECK_EQ(cp_v8_heap_profile(j, 512 * 1024, 1, &mark, &al, &err), 0);
    CHECK_EQ(mark, 3);
    CHECK_EQ(cp_v8_heap_profile(j, 512 * 1024, 1, &mark, &al2, &err), 0);
    /* V8's sizes at 512 KiB (as node 20 reports them): a sample's size is the object's size
     * times the objects it stands for, taken as the bytes. A 1.5 MiB object is 1 object; an
     * 8,064-byte array stands for 66 (532,224 bytes), a 32-byte object for 16,385 (524,320):
     * counting them again by 1 / (1 - e^(-size / interval)) read 1.58x the bytes. */
    CHECK_EQ(total_with(in, "build", 1), 1572864 + 532224);
    CHECK_EQ(total_with(in, "build", 0), 1 + 66);
    CHECK_EQ(total_with(in, "other", 1), 524320);
    CHECK_EQ(total_with(in, "other", 0), 16385);
    CHECK_EQ(total_with(al, "build", 1), 532224); /* ordinal 1 was before the mark */
    CHECK_EQ(total_with(al, "build", 0), 66);
    CHECK_EQ(total_with(al, "other", 0), 16385);
    CHECK_EQ(al2->samples.n, 0); /* nothing new since */
    CHECK_STREQ(cp_profile_str(in, in->sample_types.v[1].type), "inuse_space");
    CHECK_STREQ(cp_profile_str(al, al->sample_types.v[1].type), "alloc_space");
    cp_profile_destroy(in);
    cp_profile_destroy(al);
    cp_profile_destroy(al2);
    cp_json_free(j);
}

TEST(heap_malformed)
{
    static const struct {
        const char *json, *says;
    } cases[] = {
        {"{}", "no head"},
        {"{\"head\":{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"},"
         "\"children\":{}}}",
         "children is not an array"},
        {"{\"head\":{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"}},"
         "\"samples\":[{\"size\":1,\"nodeId\":5}]}",
         "is no node"},
        {"{\"head\":{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"}},"
         "\"samples\":[{\"size\":-1,\"nodeId\":1}]}",
         "size"},
        {"{\"head\":{\"id\":1,\"callFrame\":{\"functionName\":\"a\",\"url\":\"\"}},"
         "\"samples\":[7]}",
         "samples[0]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cp_json *j = parse(cases[i].json);
        cp_profile *p = NULL;
        cp_err err = {0};
        int rc = cp_v8_heap_profile(j, 1024, 0, NULL, &p, &err);
        if (rc == 0 || !strstr(err.msg, cases[i].says))
            printf("case %zu: rc %d, \"%s\" (expected \"%s\")\n", i, rc, err.msg, cases[i].says);
        CHECK(rc != 0);
        CHECK(p == NULL);
        CHECK_CONTAINS(err.msg, cases[i].says);
        cp_json_free(j);
    }
}

/* esbuild 0.28.2's map of `function hotTyped(n: number)...` (worker.ts line 3) minified to
 * `function u(t){...}`: V8 reports u at column 10 (its parameter list). */
#define ESBUILD_MAP                                                                                \
    "{\"version\":3,\"sources\":[\"worker.ts\"],\"mappings\":\"AAEA,SAASA,EAASC,EAAmB,CACnC,"      \
    "IAAIC,EAAI,EACR,QAASC,EAAI,EAAGA,EAAIF,EAAGE,IAAKD,GAAKA,EAAI,GAAKC,GAAK,QAC/C,OAAOD,CACT,"   \
    "CAEA,SAASE,EAAUH,EAAmB,CACpC\",\"names\":[\"hotTyped\",\"n\",\"x\",\"i\",\"sideTyped\"]}"

TEST(source_map)
{
    cp_v8_smap *m = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_v8_smap_create(ESBUILD_MAP, strlen(ESBUILD_MAP), &m, &err), 0);
    cp_v8_smap_pos pos;
    CHECK_EQ(cp_v8_smap_lookup(m, 0, 9, &pos), 0);
    CHECK(!strcmp(pos.source, "worker.ts"));
    CHECK(pos.name && !strcmp(pos.name, "hotTyped"));
    CHECK_EQ(pos.line, 2);
    CHECK_EQ(cp_v8_smap_lookup(m, 5, 0, &pos), -1); /* no such generated line */
    cp_json *f = parse("{\"functionName\":\"u\",\"scriptId\":\"3\",\"url\":\"w.js\","
                       "\"lineNumber\":0,\"columnNumber\":10}");
    CHECK_EQ(cp_v8_smap_apply(m, f), 1);
    CHECK(!strcmp(cp_json_str(cp_json_get(f, "functionName"), NULL), "hotTyped"));
    CHECK(!strcmp(cp_json_str(cp_json_get(f, "url"), NULL), "worker.ts"));
    CHECK_EQ(cp_json_int(cp_json_get(f, "lineNumber"), 0), 2);
    cp_json_free(f);
    /* a name the minifier kept (no name in the map): V8's stays */
    f = parse("{\"functionName\":\"fetch\",\"url\":\"w.js\",\"lineNumber\":0,\"columnNumber\":"
              "5}");
    CHECK_EQ(cp_v8_smap_apply(m, f), 1);
    CHECK(!strcmp(cp_json_str(cp_json_get(f, "functionName"), NULL), "fetch"));
    cp_json_free(f);
    cp_v8_smap_destroy(m);

    /* a class's method reads as Class.method when the map holds the source: esbuild's
     * `class t{n=0;hit(r){...}}function e(n){...}` of cls.ts */
    static const char cls_map[] =
        "{\"version\":3,\"sources\":[\"cls.ts\"],\"sourcesContent\":[\"export class Room "
        "{\\n  n = 0;\\n  hit(k: number): number {\\n    return this.n += k;\\n  }\\n}\\n"
        "export function top(x: number) { return new Room().hit(x); }\\n\"],\"mappings\":"
        "\"AAAO,MAAMA,CAAK,CAChB,EAAI,EACJ,IAAIC,EAAmB,CACrB,OAAO,KAAK,GAAKA,CACnB,CACF,CACO,"
        "SAASC,EAAIC,EAAW,CAAE,OAAO,IAAIH,EAAK,EAAE,IAAIG,CAAC,CAAG\",\"names\":[\"Room\","
        "\"k\",\"top\",\"x\"]}";
    CHECK_EQ(cp_v8_smap_create(cls_map, strlen(cls_map), &m, &err), 0);
    f = parse("{\"functionName\":\"hit\",\"url\":\"c.js\",\"lineNumber\":0,\"columnNumber\":15}");
    CHECK_EQ(cp_v8_smap_apply(m, f), 1);
    CHECK(!strcmp(cp_json_str(cp_json_get(f, "functionName"), NULL), "Room.hit"));
    CHECK_EQ(cp_json_int(cp_json_get(f, "lineNumber"), 0), 2);
    cp_json_free(f);
    f = parse("{\"functionName\":\"e\",\"url\":\"c.js\",\"lineNumber\":0,\"columnNumber\":47}");
    CHECK_EQ(cp_v8_smap_apply(m, f), 1);
    CHECK(!strcmp(cp_json_str(cp_json_get(f, "functionName"), NULL), "top"));
    cp_json_free(f);
    cp_v8_smap_destroy(m);

    /* an inline map as esbuild writes it */
    cp_buf b = {0};
    CHECK_EQ(cp_v8_data_url_decode("data:application/json;base64,eyJ2ZXJzaW9uIjozfQ==", &b, &err),
             0);
    CHECK_EQ(b.len, 13);
    CHECK(!memcmp(b.data, "{\"version\":3}", 13));
    cp_buf_close(&b);

    static const struct {
        const char *map, *says;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"version\":2,\"mappings\":\"\"}", "version is not 3"},
        {"{\"version\":3,\"sections\":[]}", "index maps (sections) are not supported"},
        {"{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"AA!A\"}", "'!' is not a base64 VLQ"},
        {"{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"ACAA\"}",
         "source index 1 out of range"},
        {"{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"AAAAC\"}", "name index 1 out of range"},
        {"{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"AA\"}", "has 2 fields"},
        {"{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"AAAg\"}", "end inside a VLQ"},
        {"{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"gggggggB\"}", "over 31 bits"},
        {"{\"version\":3,\"sources\":[7],\"mappings\":\"\"}", "sources[0] is not a string"},
        {"{\"version\":3,\"sources\":[],\"sources\":[],\"mappings\":\"\"}",
         "member \"sources\" twice"},
        {"{\"version\":3,\"mappings\":\"\"} x", "not JSON: bytes after the value at byte 28"},
        {"{\"version\":3,\"names\":[\"\\u0000\"],\"mappings\":\"\"}", "\\u0000 in a string"},
        {"{\"version\":3.0,\"mappings\":\"\"}", "version is not 3"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&err, 0, sizeof(err));
        m = NULL;
        int rc = cp_v8_smap_create(bad[i].map, strlen(bad[i].map), &m, &err);
        if (rc == 0 || !strstr(err.msg, bad[i].says))
            printf("case %zu: rc %d, \"%s\" (expected \"%s\")\n", i, rc, err.msg, bad[i].says);
        CHECK(rc != 0 && m == NULL);
        CHECK_CONTAINS(err.msg, bad[i].says);
    }
}

/* A map is held as counted (cp_v8_smap_bytes), refused over its byte budget naming it,
 * and read no further than its deadline; escapes decode as JSON says. */
TEST(source_map_budget_and_deadline)
{
    cp_buf b = {0};
    CHECK(cp_buf_printf(&b,
                        "{\"version\":3,\"sourceRoot\":\"r\",\"sources\":[\"a\\u00e9\\n\",null],"
                        "\"names\":[\"n\"],\"mappings\":\"AAAAA") == 0);
    for (int i = 0; i < 200000; i++)
        CHECK(cp_buf_append(&b, ",CAAA", 5) == 0);
    CHECK(cp_buf_append(&b, "\"}", 2) == 0);
    cp_v8_smap *m = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_v8_smap_create((const char *)b.data, b.len, &m, &err), 0);
    size_t held = cp_v8_smap_bytes(m);
    fprintf(stderr, "%zu bytes of text held as %zu\n", b.len, held);
    CHECK(held >= 200001 * 20 && held < 200001 * 20 + 4096);
    cp_v8_smap_pos pos;
    CHECK_EQ(cp_v8_smap_lookup(m, 0, 0, &pos), 0);
    CHECK(!strcmp(pos.source, "r/a\xc3\xa9\n"));
    CHECK(!strcmp(pos.name, "n"));
    CHECK_EQ(cp_v8_smap_lookup(m, 0, 150000, &pos), 0);
    CHECK_EQ(pos.gen_column, 150000);
    cp_v8_smap_destroy(m);
    /* one byte under what it holds: refused, naming the limit */
    cp_v8_smap_limits lim = {.max_bytes = held - 1, .max_bytes_name = "symbols.max_table_bytes"};
    m = NULL;
    CHECK_EQ(cp_v8_smap_create_within((const char *)b.data, b.len, &lim, &m, &err), CP_ELIMIT);
    CHECK(!m);
    CHECK_CONTAINS(err.msg, "(symbols.max_table_bytes)");
    lim.max_bytes = held;
    CHECK_EQ(cp_v8_smap_create_within((const char *)b.data, b.len, &lim, &m, &err), 0);
    CHECK_EQ(cp_v8_smap_bytes(m), held);
    cp_v8_smap_destroy(m);
    /* a deadline already past: stopped, saying so */
    lim = (cp_v8_smap_limits){.deadline_ns = 1};
    m = NULL;
    CHECK_EQ(cp_v8_smap_create_within((const char *)b.data, b.len, &lim, &m, &err), CP_ELIMIT);
    CHECK(!m);
    CHECK_CONTAINS(err.msg, "past the deadline");
    cp_buf_close(&b);
}

/* The /proc texts the CPU weighing reads: real lines of this kernel's formats, and
 * malformed ones refused. */
TEST(proc_texts)
{
    int pid = 0, tid = 0;
    cp_err e = {0};
    CHECK_EQ(cp_v8_thread_self_parse("26341/task/26348", &pid, &tid, &e), 0);
    CHECK_EQ(pid, 26341);
    CHECK_EQ(tid, 26348);
    static const char *const bad[] = {"",          "26341",    "26341/task/",       "x/task/1",
                                      "1/task/2x", "0/task/0", "99999999999/task/1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&e, 0, sizeof(e));
        CHECK_EQ(cp_v8_thread_self_parse(bad[i], &pid, &tid, &e), CP_EPARSE);
        CHECK(strstr(e.msg, "not PID/task/TID"));
    }
    uint64_t ino = 0;
    const char *l = "   3: 0100007F:2405 00000000:0000 0A 00000000:00000000 00:00000000 "
                    "00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0\n";
    CHECK_EQ(cp_v8_tcp_listener(l, 0x2405, &ino), 1);
    CHECK_EQ(ino, 4242);
    CHECK_EQ(cp_v8_tcp_listener(l, 0x2406, &ino), 0);
    /* an established connection on that port, the header, a cut line */
    CHECK_EQ(cp_v8_tcp_listener("   4: 0100007F:2405 0100007F:D2F0 01 00000000:00000000 "
                                "00:00000000 00000000  1000 0 4243 1\n",
                                0x2405, &ino),
             0);
    CHECK_EQ(cp_v8_tcp_listener("  sl  local_address rem_address   st tx_queue rx_queue\n", 0x2405,
                                &ino),
             0);
    CHECK_EQ(cp_v8_tcp_listener("   3: 0100007F:2405 00000000:0000 0A 00000000", 0x2405, &ino), 0);
    int64_t ns = 0;
    CHECK_EQ(cp_v8_schedstat_ns("911208083 36244274 4127\n", &ns), 0);
    CHECK_EQ(ns, 911208083);
    CHECK_EQ(cp_v8_schedstat_ns("x 1 2\n", &ns), CP_EPARSE);
    CHECK_EQ(cp_v8_schedstat_ns("99999999999999999999999 1 2\n", &ns), CP_EPARSE);
    int64_t ticks = 0;
    CHECK_EQ(cp_v8_stat_ticks("947 (node) S 1 947 1 0 -1 4194304 5521 0 0 0 71 9 0 0 20 0 11 0 "
                              "100 0\n",
                              &ticks),
             0);
    CHECK_EQ(ticks, 80);
    /* a command holding ") " is read after its last ')' */
    CHECK_EQ(cp_v8_stat_ticks("5 (a) b) R 1 5 1 0 -1 0 0 0 0 0 3 4 0\n", &ticks), 0);
    CHECK_EQ(ticks, 7);
    CHECK_EQ(cp_v8_stat_ticks("5 (node) S 1 2 3\n", &ticks), CP_EPARSE);
    CHECK_EQ(cp_v8_stat_ticks("no paren", &ticks), CP_EPARSE);
}

/* A session's state (v8source_int.h): the diagram's path from start to the host's end,
 * and what "gone" makes of each state: a running isolate's window is lost, any other
 * session just gone; a second "gone" (a connection reports its close twice) changes
 * nothing. */
TEST(session_states)
{
    session s = {0};
    snprintf(s.isolate, sizeof(s.isolate), "alpha");
    CHECK(s.state == SESSION_STARTING && cp_v8_session_alive(&s) && !cp_v8_session_running(&s));
    cp_v8_session_set(&s, SESSION_RUNNING, "test");
    CHECK(cp_v8_session_running(&s));
    cp_v8_session_set(&s, SESSION_DONE, "test");
    CHECK(cp_v8_session_alive(&s) && !cp_v8_session_running(&s));
    cp_v8_session_gone(&s, "test");
    CHECK(s.state == SESSION_GONE && !cp_v8_session_alive(&s));

    static const struct {
        session_state from, to;
    } gone[] = {
        {SESSION_STARTING, SESSION_GONE}, {SESSION_RUNNING, SESSION_LOST},
        {SESSION_DONE, SESSION_GONE},     {SESSION_LOST, SESSION_LOST},
        {SESSION_GONE, SESSION_GONE},
    };
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
        s.state = gone[i].from;
        cp_v8_session_gone(&s, "test");
        CHECK_EQ((int)s.state, (int)gone[i].to);
        cp_v8_session_gone(&s, "again");
        CHECK_EQ((int)s.state, (int)gone[i].to);
        CHECK(!cp_v8_session_alive(&s));
    }
}

/* A connection's life along its diagram (v8source_int.h): open while OPEN, FINISHING or
 * CLOSING; closed by the host it is retried, closed after we asked it ends. */
TEST(conn_states)
{
    host h = {0};
    conn c = {0};
    c.h = &h;
    CHECK(c.state == CONN_IDLE && !cp_v8_conn_open(&c));
    static const conn_state path[] = {CONN_CONNECTING, CONN_CLOSED,  CONN_CONNECTING, CONN_OPEN,
                                      CONN_FINISHING,  CONN_CLOSING, CONN_ENDED};
    static const int open[] = {0, 0, 0, 1, 1, 1, 0};
    for (size_t i = 0; i < sizeof(path) / sizeof(path[0]); i++) {
        cp_v8_conn_set(&c, path[i], "test");
        CHECK_EQ((int)c.state, (int)path[i]);
        CHECK_EQ(cp_v8_conn_open(&c), open[i]);
    }
}

static void *ended_thread(void *arg)
{
    *(pid_t *)arg = (pid_t)syscall(SYS_gettid);
    return NULL;
}

/* The type name of p's column col. */
static const char *type_of(const cp_profile *p, int col)
{
    return cp_profile_str(p, p->sample_types.v[col].type);
}

/* CPU weighing (README "CPU seconds"): a live thread's window is scaled to the thread's
 * CPU; a thread read before and ended since (a worker's last window) keeps its window cpu
 * and unscaled, so its series' sample types do not change (the store would refuse it); a
 * host not of this machine has wall windows throughout. */
TEST(cpu_weighing_keeps_a_series_types)
{
    cp_json *j = parse(CPU_OK);
    int64_t span = 0;
    cp_err err = {0};
    pid_t gone = 0;
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, ended_thread, &gone), 0);
    CHECK_EQ(pthread_join(th, NULL), 0);
    int64_t ns;
    CHECK(gone > 0 && cp_v8_cpu_ns((int)getpid(), (int)gone, &ns) != 0); /* unreadable now */
    struct {
        int pid, tid;
        const char *type, *engine;
        int scaled;
    } cases[] = {
        {(int)getpid(), (int)syscall(SYS_gettid), "cpu", "v8-inspector cpu=thread", 1},
        {(int)getpid(), (int)gone, "cpu", "v8-inspector cpu=intervals", 0},
        {0, 0, "wall", "v8-inspector wall", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        session s = {0}, *v[1] = {&s};
        snprintf(s.isolate, sizeof(s.isolate), "alpha");
        s.pid = cases[i].pid;
        s.tid = cases[i].tid;
        s.cpu_mark_ns = s.pid ? 0 : -1; /* all this thread's CPU so far in the window */
        CHECK_EQ(cp_v8_cpu_profile(j, 1000, &s.pend, &span, &err), 0);
        int64_t said = total_with(s.pend, "outer", 1);
        CHECK_EQ(said, 3000000);
        cp_v8_weigh_pending(v, 1);
        CHECK_STREQ(type_of(s.pend, 1), cases[i].type);
        CHECK_STREQ(cp_profile_str(s.pend, s.pend->default_sample_type), cases[i].type);
        CHECK_STREQ(s.pend_engine, cases[i].engine);
        if (cases[i].scaled)
            CHECK(total_with(s.pend, "outer", 1) != said); /* this thread's CPU, not 3 ms */
        else
            CHECK_EQ(total_with(s.pend, "outer", 1), said);
        cp_profile_destroy(s.pend);
    }
    cp_json_free(j);
}

/* What the inspector sends is refused by name when it is not JSON, not an object, not
 * UTF-8 or nested past the reader's bound; a heap profile deeper than V8 records (129
 * frames) inside a message reads and converts. */
TEST(messages_malformed)
{
    static const struct {
        const char *text, *says;
    } cases[] = {
        {"", "malformed JSON message: malformed JSON at byte 0"},
        {"{\"id\":1} x", "malformed JSON message: malformed JSON at byte 9"},
        {"[1]", "not a JSON object"},
        {"{\"method\":\"a\xff\"}", "malformed JSON message: JSON string at byte 10 is not valid "
                                   "UTF-8"},
        {"{\"id\":01}", "malformed JSON at byte 6"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cp_json *m = (cp_json *)1;
        cp_err err = {0};
        CHECK_EQ(cp_v8_message_parse(cases[i].text, strlen(cases[i].text), &m, &err), CP_EPARSE);
        CHECK(m == NULL);
        CHECK_CONTAINS(err.msg, cases[i].says);
    }
    /* nesting: 1024 levels read (the object and 1023 arrays), 1025 do not */
    cp_buf b = {0};
    for (int deep = 1023; deep <= 1024; deep++) {
        b.len = 0;
        CHECK_EQ(cp_buf_printf(&b, "{\"a\":"), 0);
        for (int k = 0; k < deep; k++)
            CHECK_EQ(cp_buf_append(&b, "[", 1), 0);
        for (int k = 0; k < deep; k++)
            CHECK_EQ(cp_buf_append(&b, "]", 1), 0);
        CHECK_EQ(cp_buf_append(&b, "}", 1), 0);
        cp_json *m = NULL;
        cp_err err = {0};
        int rc = cp_v8_message_parse((const char *)b.data, b.len, &m, &err);
        if (deep == 1023) {
            CHECK_EQ(rc, 0);
        } else {
            CHECK_EQ(rc, CP_EPARSE);
            CHECK_CONTAINS(err.msg, "JSON nested deeper than 1024 at byte 1028");
        }
        cp_json_free(m);
    }
    /* a heap profile 129 frames deep (V8 records at most 128 under its root), as a reply */
    b.len = 0;
    CHECK_EQ(cp_buf_printf(&b, "{\"id\":3,\"result\":{\"profile\":{\"head\":"), 0);
    for (int k = 1; k <= 129; k++)
        CHECK_EQ(cp_buf_printf(&b,
                               "{\"callFrame\":{\"functionName\":\"%s%d\",\"url\":\"d.js\","
                               "\"lineNumber\":%d,\"columnNumber\":0},\"selfSize\":0,\"id\":%d,"
                               "\"children\":[",
                               "f", k, k, k),
                 0);
    for (int k = 1; k <= 129; k++)
        CHECK_EQ(cp_buf_printf(&b, "]}"), 0);
    CHECK_EQ(cp_buf_printf(&b, ",\"samples\":[{\"size\":100,\"nodeId\":129,\"ordinal\":1}]}}}"), 0);
    cp_json *m = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_v8_message_parse((const char *)b.data, b.len, &m, &err), 0);
    cp_profile *p = NULL;
    CHECK_EQ(cp_v8_heap_profile(cp_json_get(cp_json_get(m, "result"), "profile"), 1024, 0, NULL, &p,
                                &err),
             0);
    CHECK_EQ(p->samples.n, 1);
    CHECK_EQ(p->samples.v[0].nlocs, 129); /* every frame (none is V8's "(root)" here) */
    cp_profile_destroy(p);
    cp_json_free(m);
    cp_buf_close(&b);
    /* a worker's wrapped message and /json/list */
    const char *sid;
    cp_json *inner = NULL;
    cp_json *params = parse("{\"sessionId\":\"7\",\"message\":\"{\\\"id\\\":1,\"}");
    CHECK_EQ(cp_v8_worker_message(params, &sid, &inner, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "malformed worker message (malformed JSON at byte 8)");
    CHECK(!inner);
    cp_json_free(params);
    params = parse("{\"sessionId\":\"7\",\"message\":\"{\\\"id\\\":1}\"}");
    CHECK_EQ(cp_v8_worker_message(params, &sid, &inner, &err), 0);
    CHECK_STREQ(sid, "7");
    CHECK_EQ(cp_json_int(cp_json_get(inner, "id"), 0), 1);
    cp_json_free(inner);
    cp_json_free(params);
    cp_v8_target *tv = NULL;
    size_t nt = 0;
    CHECK_EQ(cp_v8_targets_parse("{}", 2, &tv, &nt, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "/json/list is not a JSON array: another value");
    CHECK_EQ(cp_v8_targets_parse("[{", 2, &tv, &nt, &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "/json/list is not a JSON array: malformed JSON at byte 2");
    const char *list = "[{\"id\":\"A\",\"title\":\"workerd: worker w\","
                       "\"webSocketDebuggerUrl\":\"ws://127.0.0.1:9229/A\"},{\"id\":\"\"}]";
    CHECK_EQ(cp_v8_targets_parse(list, strlen(list), &tv, &nt, &err), 0);
    CHECK_EQ(nt, 1);
    CHECK_STREQ(tv[0].path, "/A");
    free(tv);
}

/* A capture's finer run thinned to the always-on interval: one sample each time the time
 * the samples stand for reaches it, "(idle)" passing nothing; the nodes as they were. */
TEST(thin_profile)
{
    cp_json *j = parse(CPU_OK);
    int64_t acc = 0;
    cp_json *thin = cp_v8_thin_profile(j, 2000, &acc);
    CHECK(thin);
    cp_buf b = {0};
    CHECK_EQ(cp_json_write(&b, cp_json_get(thin, "samples")), 0);
    CHECK_EQ(cp_json_write(&b, cp_json_get(thin, "timeDeltas")), 0);
    CHECK_EQ(cp_buf_append(&b, "", 1), 0);
    CHECK_STREQ((const char *)b.data, "[2][2500]");
    CHECK_EQ(acc, 500);
    CHECK_EQ(cp_json_len(cp_json_get(thin, "nodes")), 4);
    CHECK_EQ(cp_json_int(cp_json_get(thin, "endTime"), 0), 5000);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_v8_cpu_profile(thin, 2000, &p, NULL, &err), 0);
    CHECK_EQ(total_with(p, "outer", 0), 1);
    CHECK_EQ(total_with(p, "outer", 1), 2000000);
    cp_profile_destroy(p);
    /* the original keeps its samples */
    CHECK_EQ(cp_json_len(cp_json_get(j, "samples")), 4);
    cp_json_free(thin);
    cp_json_free(j);
    cp_buf_close(&b);
    CHECK(!cp_v8_thin_profile(NULL, 2000, &acc));
}

TEST_MAIN(T(cpu_profile), T(cpu_position_ticks), T(cpu_malformed), T(heap_profile), T(conn_states),
          T(heap_malformed), T(source_map), T(source_map_budget_and_deadline), T(proc_texts),
          T(session_states), T(cpu_weighing_keeps_a_series_types), T(messages_malformed),
          T(thin_profile))
