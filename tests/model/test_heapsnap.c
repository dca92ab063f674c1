/* Heap snapshots into retainer profiles (model/heapsnap.c): a real node snapshot whose
 * module table is named and weighed as V8 measured it, hand-made graphs with known
 * dominators, any chunking, and hostile input: truncated, malformed, absurd claims, lists a
 * million deep, names without end. */
#include <stdarg.h>

#include "heapsnap.h"
#include "test.h"
#include "util.h"

static char g_dir[64] = "/tmp/cp_heapsnap_XXXXXX";

/* Parses text[0..len) fed in chunks of chunk bytes into a new profile (*out, NULL on error). */
static int parse(const char *text, size_t len, size_t chunk, const cp_heapsnap_limits *lim,
                 cp_profile **out, cp_heapsnap_stats *st, cp_err *err)
{
    cp_heapsnap *h;
    CHECK(cp_heapsnap_create(lim, &h) == 0);
    int rc = 0;
    for (size_t at = 0; at < len && !rc; at += chunk)
        rc = cp_heapsnap_feed(h, text + at, len - at < chunk ? len - at : chunk, err);
    cp_profile *p = cp_profile_create();
    CHECK(p);
    cp_heapsnap_stats s;
    if (!rc) rc = cp_heapsnap_finish(h, p, &s, err);
    if (st && !rc) *st = s;
    cp_heapsnap_destroy(h);
    if (rc) {
        cp_profile_destroy(p);
        p = NULL;
    }
    *out = p;
    return rc;
}

/* The frames of sample i, root first, joined by " > ". */
static void path_of(const cp_profile *p, uint32_t i, char *out, size_t cap)
{
    const cp_sample *s = &p->samples.v[i];
    size_t at = 0;
    out[0] = 0;
    for (uint32_t k = s->nlocs; k-- > 0 && at < cap;) {
        const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
        const cp_function *f = &p->functions.v[p->lines.v[l->line_off].function_id - 1];
        at += (size_t)snprintf(out + at, cap - at, "%s%s", at ? " > " : "",
                               cp_profile_str(p, f->name));
    }
}

/* Bytes (t = 1) or objects (t = 0) of the samples whose path contains frame. */
static int64_t under(const cp_profile *p, const char *frame, int t)
{
    int64_t sum = 0;
    char path[4096], pat[300];
    snprintf(pat, sizeof(pat), "> %s", frame);
    for (uint32_t i = 0; i < p->samples.n; i++) {
        path_of(p, i, path, sizeof(path));
        char full[4200];
        snprintf(full, sizeof(full), "> %s", path);
        const char *hit = strstr(full, pat);
        size_t n = strlen(pat);
        if (hit && (hit[n] == 0 || hit[n] == ' ')) sum += cp_profile_sample_values(p, i)[t];
    }
    return sum;
}

/* Value t of the one sample whose path is exactly path (-1 if none). */
static int64_t at_path(const cp_profile *p, const char *path, int t)
{
    char buf[4096];
    for (uint32_t i = 0; i < p->samples.n; i++) {
        path_of(p, i, buf, sizeof(buf));
        if (!strcmp(buf, path)) return cp_profile_sample_values(p, i)[t];
    }
    return -1;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    CHECK(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* A snapshot of node running js/hoard.js, and the heap growth V8 measured for its table. */
static char *node_snapshot(size_t *len, long long *growth)
{
    CHECK(mkdtemp(g_dir));
    char cmd[1024], file[300];
    snprintf(file, sizeof(file), "%s/hoard.heapsnapshot", g_dir);
    snprintf(cmd, sizeof(cmd), "%s --expose-gc %s %s", CP_NODE, CP_HOARD_JS, file);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    CHECK(fscanf(f, "%lld", growth) == 1);
    CHECK(pclose(f) == 0);
    char *t = read_all(file, len);
    unlink(file);
    rmdir(g_dir);
    return t;
}

TEST(node_module_table_under_its_variable)
{
    size_t len;
    long long growth;
    char *text = node_snapshot(&len, &growth);
    cp_profile *p;
    cp_heapsnap_stats st;
    cp_err err = {0};
    CHECK_EQ(parse(text, len, 1 << 16, NULL, &p, &st, &err), 0);
    int64_t hoard = under(p, "HOARD: Array", 1);
    printf("%llu nodes, %llu edges, %llu reachable, %llu bytes, %u paths, %u passes, "
           "%.1f MiB held; HOARD %lld bytes, V8's growth %lld\n",
           (unsigned long long)st.nodes, (unsigned long long)st.edges,
           (unsigned long long)st.reachable, (unsigned long long)st.total_bytes, st.frames,
           st.passes, (double)st.held_bytes / 1048576, (long long)hoard, growth);
    /* the table and everything only it holds, under the variable, within 10% of V8's count */
    CHECK(hoard >= growth * 0.9 && hoard <= growth * 1.1);
    /* its 100,000 objects, their names and tags */
    CHECK(under(p, "HOARD: Array > Object", 0) >= 100000);
    CHECK(under(p, "HOARD: Array > Object > name: (string)", 0) >= 100000);
    /* the module context is named for its script */
    CHECK(under(p, "hoard.js > HOARD: Array", 1) == hoard);
    /* the profile adds up to every reachable object */
    CHECK_EQ(cp_profile_total(p, 1), (int64_t)st.total_bytes);
    CHECK_EQ(cp_profile_total(p, 0), (int64_t)st.reachable);
    CHECK_STREQ(cp_profile_str(p, p->default_sample_type), "retained_space");
    cp_profile_destroy(p);
    free(text);
}

/* `contprof merge` reads a snapshot file as a retainer profile: folded and top. */
TEST(contprof_merge_reads_snapshots)
{
    CHECK(mkdtemp(g_dir));
    char cmd[2400], file[300], out[300];
    snprintf(file, sizeof(file), "%s/hoard.heapsnapshot", g_dir);
    snprintf(out, sizeof(out), "%s/folded", g_dir);
    snprintf(cmd, sizeof(cmd),
             "%s --expose-gc %s %s >/dev/null && %s merge --format folded %s > %s", CP_NODE,
             CP_HOARD_JS, file, CP_CONTPROF, file, out);
    CHECK(system(cmd) == 0);
    size_t len;
    char *text = read_all(out, &len);
    /* "hoard.js;HOARD: Array;Object;name: (string) BYTES" with 100,000 strings' bytes */
    const char *line = strstr(text, "hoard.js;HOARD: Array;Object;name: (string) ");
    CHECK(line);
    CHECK(atoll(line + strlen("hoard.js;HOARD: Array;Object;name: (string) ")) > 1000000);
    free(text);
    /* a damaged file: the error names the file and the byte */
    snprintf(cmd, sizeof(cmd), "head -c 100000 %s > %s.cut && %s merge %s.cut 2> %s", file, file,
             CP_CONTPROF, file, out);
    CHECK(system(cmd) != 0);
    text = read_all(out, &len);
    printf("%s", text);
    CHECK(strstr(text, ".cut: heap snapshot: truncated at byte 100000"));
    free(text);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}

TEST(any_chunking_gives_the_same_profile)
{
    size_t len;
    long long growth;
    char *text = node_snapshot(&len, &growth);
    size_t chunks[] = {len, 7, 4096};
    char *first = NULL;
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
        cp_profile *p;
        cp_err err = {0};
        CHECK_EQ(parse(text, len, chunks[i], NULL, &p, NULL, &err), 0);
        char *c = canonical(p);
        if (!first)
            first = c;
        else {
            CHECK(!strcmp(first, c));
            free(c);
        }
        cp_profile_destroy(p);
    }
    free(first);
    free(text);
}

/* Builds a snapshot's text: nodes as "type,name,size,edges" quads, edges as triples. */
static char *snap(const char *nodes, const char *edges, const char *strings)
{
    static const char *meta =
        "{\"snapshot\":{\"meta\":{\"node_fields\":[\"type\",\"name\",\"id\",\"self_size\","
        "\"edge_count\"],\"node_types\":[[\"hidden\",\"array\",\"string\",\"object\",\"code\","
        "\"closure\",\"regexp\",\"number\",\"native\",\"synthetic\"],\"string\",\"number\","
        "\"number\",\"number\"],\"edge_fields\":[\"type\",\"name_or_index\",\"to_node\"],"
        "\"edge_types\":[[\"context\",\"element\",\"property\",\"internal\",\"hidden\","
        "\"shortcut\",\"weak\"],\"string_or_number\",\"node\"],\"location_fields\":[\"a\"]},"
        "\"trace_function_count\":0},\n";
    size_t n = strlen(meta) + strlen(nodes) + strlen(edges) + strlen(strings) + 200;
    char *t = malloc(n);
    snprintf(t, n,
             "%s\"nodes\":[%s],\n\"edges\":[%s],\"trace_tree\":[[1,[2,[3]]]],"
             "\"samples\":[],\"strings\":[%s]}",
             meta, nodes, edges, strings);
    return t;
}

/* root(0) -a-> A(1) -c-> C(3) -0-> D(4); root -b-> B(2) -c-> C; root ~weak~> E(5):
 * C has two retainers, so the root dominates it; E is only weakly held (not counted);
 * a cycle C -> A changes no dominator. Node fields: type, name, id, self_size, edge_count
 * (5 per node); to_node is a node's index times 5. */
TEST(known_graph_exact_paths)
{
    const char *nodes = "9,0,1,0,3, 3,1,2,10,1, 3,2,3,20,1, 3,3,4,30,2, 1,4,5,40,0, 3,5,6,50,0";
    const char *edges = "2,6,5, 2,7,10, 6,8,25, 2,9,15, 2,9,15, 1,0,20, 2,10,5";
    const char *strings = "\"\",\"Foo\",\"Bar\",\"Baz\",\"\",\"Gone\",\"a\",\"b\",\"w\",\"c\","
                          "\"back\"";
    char *t = snap(nodes, edges, strings);
    size_t chunks[] = {strlen(t), 1, 3};
    for (size_t i = 0; i < 3; i++) {
        cp_profile *p;
        cp_heapsnap_stats st;
        cp_err err = {0};
        CHECK_EQ(parse(t, strlen(t), chunks[i], NULL, &p, &st, &err), 0);
        CHECK_EQ(at_path(p, "a: Foo", 1), 10);
        CHECK_EQ(at_path(p, "b: Bar", 1), 20);
        CHECK_EQ(at_path(p, "Baz", 1), 30); /* no edge of the root holds it: no name */
        CHECK_EQ(at_path(p, "Baz > (array)", 1), 40);
        CHECK_EQ(at_path(p, "Gone", 1), -1);
        CHECK_EQ(st.reachable, 4);
        CHECK_EQ(cp_profile_total(p, 1), 100);
        CHECK_EQ(p->samples.n, 4);
        cp_profile_destroy(p);
    }
    free(t);
}

/* A list 300,000 deep and an object with 5,000 distinct property names: the paths stop at
 * max_depth under "(deeper)", the names past max_children go to "(other)", and every byte is
 * still counted. */
TEST(deep_and_wide_are_bounded)
{
    enum { DEEP = 300000, WIDE = 5000 };
    cp_buf nodes = {0}, edges = {0}, strings = {0};
    /* node 0 root -> 1 (the list's head) and -> DEEP + 1 (the wide object) */
    cp_buf_printf(&nodes, "9,0,1,0,2");
    cp_buf_printf(&edges, "2,1,5,2,2,%d", (DEEP + 1) * 5);
    for (int i = 1; i <= DEEP; i++) {
        cp_buf_printf(&nodes, ",3,3,%d,1,%d", i + 1, i < DEEP ? 1 : 0);
        if (i < DEEP) cp_buf_printf(&edges, ",2,4,%d", (i + 1) * 5);
    }
    cp_buf_printf(&nodes, ",3,3,%d,0,%d", DEEP + 2, WIDE);
    for (int k = 0; k < WIDE; k++) {
        cp_buf_printf(&nodes, ",7,0,%d,8,0", DEEP + 3 + k);
        cp_buf_printf(&edges, ",2,%d,%d", 5 + k, (DEEP + 2 + k) * 5);
    }
    cp_buf_printf(&strings, "\"\",\"list\",\"wide\",\"Node\",\"next\"");
    for (int k = 0; k < WIDE; k++)
        cp_buf_printf(&strings, ",\"key%d\"", k);
    cp_buf_append(&nodes, "", 1);
    cp_buf_append(&edges, "", 1);
    cp_buf_append(&strings, "", 1);
    char *t = snap((char *)nodes.data, (char *)edges.data, (char *)strings.data);
    cp_profile *p;
    cp_heapsnap_stats st;
    cp_err err = {0};
    CHECK_EQ(parse(t, strlen(t), 1 << 16, NULL, &p, &st, &err), 0);
    CHECK_EQ(st.reachable, DEEP + 1 + WIDE);
    CHECK_EQ(cp_profile_total(p, 1), (int64_t)DEEP + 8 * WIDE);
    CHECK(under(p, "(deeper)", 1) == DEEP - 63);
    CHECK(under(p, "(other)", 0) == WIDE - 1000);
    CHECK(p->samples.n < 1100);
    for (uint32_t i = 0; i < p->samples.n; i++)
        CHECK(p->samples.v[i].nlocs <= 64);
    cp_profile_destroy(p);
    free(t);
    cp_buf_close(&nodes);
    cp_buf_close(&edges);
    cp_buf_close(&strings);
}

static void refused(const char *text, size_t len, const cp_heapsnap_limits *lim, int code,
                    const char *says)
{
    cp_profile *p;
    cp_err err = {0};
    int rc = parse(text, len, 4096, lim, &p, NULL, &err);
    printf("%s -> %s\n", says, err.msg);
    CHECK_EQ(rc, code);
    CHECK(strstr(err.msg, says));
    CHECK(!p);
}

TEST(hostile_snapshots_refused_by_name)
{
    size_t len;
    long long growth;
    char *text = node_snapshot(&len, &growth);
    refused(text, len / 2, NULL, CP_EPARSE, "truncated");
    cp_heapsnap_limits lim;
    cp_heapsnap_limits_default(&lim);
    lim.max_bytes = 8 << 20;
    lim.limit_name = "captures.heap_max_mb";
    refused(text, len, &lim, CP_ELIMIT, "over captures.heap_max_mb (8 MiB)");
    free(text);
    refused("hello", 5, NULL, CP_EPARSE, "byte 0");
    refused("[1,2]", 5, NULL, CP_EPARSE, "an array where an object belongs");
    refused("{\"nodes\":[1,2]}", 15, NULL, CP_EPARSE, "lacks node_fields");
    /* 4 billion nodes claimed: refused before anything is held */
    char *t = snap("9,0,1,0,0", "", "\"\"");
    const char *claim = "\"trace_function_count\":0}";
    char *at = strstr(t, claim), big[8192];
    snprintf(big, sizeof(big), "%.*s\"node_count\":4000000000,\"edge_count\":1,%s", (int)(at - t),
             t, at);
    refused(big, strlen(big), NULL, CP_ELIMIT, "its claimed graph would hold");
    free(t);
    t = snap("9,0,1,0,1", "2,0,50", "\"\"");
    refused(t, strlen(t), NULL, CP_EPARSE, "to node 10 of 1");
    free(t);
    t = snap("9,0,1,0,2", "2,0,0", "\"\"");
    refused(t, strlen(t), NULL, CP_EPARSE, "passes the 1 edges");
    free(t);
    t = snap("9,7,1,0,0", "", "\"\"");
    refused(t, strlen(t), NULL, CP_EPARSE, "name 7 of 1 strings");
    free(t);
    t = snap("9,0,1,0,0,\"x\"", "", "\"\"");
    refused(t, strlen(t), NULL, CP_EPARSE, "a string among the nodes");
    free(t);
    t = snap("9,0,1,-5,0", "", "\"\"");
    refused(t, strlen(t), NULL, CP_EPARSE, "not an integer below 2^32");
    free(t);
    t = snap("9,0,1,0,0", "", "\"\\q\"");
    refused(t, strlen(t), NULL, CP_EPARSE, "bad escape");
    free(t);
    t = snap("9,0,1,0,0", "", "\"\"");
    size_t n = strlen(t);
    char *extra = malloc(n + 3);
    snprintf(extra, n + 3, "%s x", t);
    refused(extra, n + 2, NULL, CP_EPARSE, "text after the snapshot's end");
    free(extra);
    free(t);
}

/* Escapes decode to UTF-8 in names (a surrogate pair, a lone one as U+FFFD). */
TEST(escaped_names)
{
    char *t = snap("9,0,1,0,1, 3,1,2,8,0", "2,2,5",
                   "\"\",\"Caf\\u00e9\\ud83d\\ude00\\ud800x\",\"k\\n\\\"\"");
    cp_profile *p;
    cp_err err = {0};
    CHECK_EQ(parse(t, strlen(t), 2, NULL, &p, NULL, &err), 0);
    CHECK_EQ(at_path(p, "k\n\": Caf\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbdx", 1), 8);
    cp_profile_destroy(p);
    free(t);
}

TEST_MAIN(T(node_module_table_under_its_variable), T(any_chunking_gives_the_same_profile),
          T(known_graph_exact_paths), T(deep_and_wide_are_bounded),
          T(hostile_snapshots_refused_by_name), T(escaped_names), T(contprof_merge_reads_snapshots))
