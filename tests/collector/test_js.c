/* JavaScript frames (issue 25): node under the agent with V8's perf map names its JS
 * functions (file and line, V8's C++ under them, demangled), with CONTPROF_SYMBOLIZE=server
 * too; without the map, JIT code reads [jit] and the agent says which flags name it. And
 * perfmap.c's parser on hand-written maps: incremental reads, cut lines, 0x, overlaps. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "perfmap.h"
#include "pprof.h"
#include "profile.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

static char g_dir[300], g_env_dir[300];

static void make_dir(void)
{
    pset_dir_make("js", g_dir, g_env_dir);
}

static void remove_dir(void)
{
    pset_dir_remove(g_dir);
}

/* Runs node (flags: V8 flags or "") on script (hot.js or workers.js) for secs seconds under
 * the agent with env extra (may be NULL), loads the profiles into s; returns node's stdout
 * and stderr. */
static const char *run_node_script(const char *script, const char *secs, const char *flags,
                                   const char *extra, pset *s)
{
    static char out[8192];
    make_dir();
    char cmd[1024];
    /* the perf map of each run removed after it */
    snprintf(cmd, sizeof(cmd),
             "%s %s %s %s 2>&1 & p=$!; wait $p; rc=$?; rm -f /tmp/perf-$p.map; exit $rc", CP_NODE,
             flags, script, secs);
    const char *env[8] = {"LD_PRELOAD=" CP_LIB, g_env_dir, "CONTPROF_WINDOW=1s",
                          "PATH=/usr/bin:/bin"};
    int n = 4;
    if (extra) env[n++] = extra;
    env[n] = NULL;
    const char *args[] = {"-c", cmd, NULL};
    /* in the output directory: V8's isolate-*-v8.log files go away with it */
    int st = run_capture("/bin/sh", args, g_dir, env, out, sizeof(out));
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pset_load(g_dir, s);
    CHECK(s->n > 0);
    return out;
}

static const char *run_node(const char *flags, const char *extra, pset *s)
{
    return run_node_script(CP_HOT_JS, "2.5", flags, extra, s);
}

/* The program's cpu profiles (every isolate but the agent's own). */
static int is_prog_cpu(const pfile *f)
{
    return !strcmp(f->kind, "cpu") && strcmp(f->iso, "contprof-agent") != 0;
}

static int64_t cpu_with(const pset *s, const char *fn)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++)
        if (is_prog_cpu(&s->f[i])) sum += func_total(s->f[i].p, fn, 1);
    return sum;
}

static const cp_function *find_function(const cp_profile *p, const char *fn)
{
    for (uint32_t j = 0; j < p->functions.n; j++)
        if (!strcmp(cp_profile_str(p, p->functions.v[j].name), fn)) return &p->functions.v[j];
    return NULL;
}

/* Locations with neither a mapping nor a name (bare addresses), in the program's profiles of
 * any kind, and the CPU of samples whose leaf has no name. */
static void unnamed(const pset *s, int *bare, int64_t *unnamed_leaf_cpu)
{
    *bare = 0;
    *unnamed_leaf_cpu = 0;
    for (int i = 0; i < s->n; i++) {
        if (!strcmp(s->f[i].iso, "contprof-agent")) continue;
        const cp_profile *p = s->f[i].p;
        for (uint32_t j = 0; j < p->locations.n; j++)
            if (!p->locations.v[j].mapping_id && !p->locations.v[j].nlines) ++*bare;
        if (!is_prog_cpu(&s->f[i])) continue;
        for (uint32_t j = 0; j < p->samples.n; j++) {
            const cp_sample *sm = &p->samples.v[j];
            if (sm->nlocs && !p->locations.v[p->stack.v[sm->loc_off] - 1].nlines)
                *unnamed_leaf_cpu += cp_profile_sample_values(p, j)[1];
        }
    }
}

/* Whether some sample has a frame whose function contains inner below (leafward of) a
 * frame of function outer. */
static int called_under(const pset *s, const char *inner, const char *outer)
{
    for (int i = 0; i < s->n; i++) {
        if (!is_prog_cpu(&s->f[i])) continue;
        const cp_profile *p = s->f[i].p;
        for (uint32_t j = 0; j < p->samples.n; j++) {
            const cp_sample *sm = &p->samples.v[j];
            int seen_inner = 0;
            for (uint32_t k = 0; k < sm->nlocs; k++) {
                uint32_t loc = p->stack.v[sm->loc_off + k];
                if (strstr(loc_func(p, loc), inner)) seen_inner = 1;
                if (seen_inner && loc_has_func(p, loc, outer)) return 1;
            }
        }
    }
    return 0;
}

static void check_hot_json_named(const pset *s)
{
    int64_t all = cpu_with(s, NULL), hot = cpu_with(s, "hotJson");
    printf("hotJson %lld of %lld ns; hotMath %lld, area %lld, (anonymous) %lld\n", (long long)hot,
           (long long)all, (long long)cpu_with(s, "hotMath"), (long long)cpu_with(s, "area"),
           (long long)cpu_with(s, "(anonymous)"));
    CHECK(all > 0);
    CHECK(hot * 10 > all * 3); /* JSON.stringify of a 200-object tree: most of the work */
    CHECK(cpu_with(s, "hotMath") > 0);
    int checked = 0;
    for (int i = 0; i < s->n && !checked; i++) {
        if (!is_prog_cpu(&s->f[i])) continue;
        const cp_profile *p = s->f[i].p;
        const cp_function *f = find_function(p, "hotJson");
        if (!f) continue;
        const char *file = cp_profile_str(p, f->filename);
        printf("hotJson's file %s\n", file);
        CHECK(strlen(file) >= 6 && !strcmp(file + strlen(file) - 6, "hot.js"));
        /* the line: V8's, of the function's declaration */
        for (uint32_t j = 0; j < p->lines.n; j++)
            if (p->lines.v[j].function_id && &p->functions.v[p->lines.v[j].function_id - 1] == f)
                CHECK_EQ(p->lines.v[j].line, 11);
        checked = 1;
    }
    CHECK(checked);
}

/* ------------------------------------------------------------------------------------
 * node under the agent */

TEST(node_js_frames_named_from_perf_map)
{
    pset s;
    const char *out = run_node("--perf-basic-prof --interpreted-frames-native-stack", NULL, &s);
    CHECK(!strstr(out, "contprof: V8 writes a perf map")); /* the flag is there */
    check_hot_json_named(&s);
    /* V8's serializer, demangled, under the JS function that called JSON.stringify */
    CHECK(called_under(&s, "v8::internal::JsonStringifier::", "hotJson"));
    int bare;
    int64_t leaf;
    unnamed(&s, &bare, &leaf);
    int64_t all = cpu_with(&s, NULL);
    printf("bare-address locations %d; unnamed leaves %lld of %lld ns\n", bare, (long long)leaf,
           (long long)all);
    CHECK_EQ(bare, 0);
    CHECK(leaf * 100 <= all); /* at most 1% */
    /* the map's counters travel in the comments */
    long long entries = -1;
    for (int i = 0; i < s.n; i++)
        for (uint32_t c = 0; c < s.f[i].p->comments.n; c++) {
            const char *t =
                strstr(cp_profile_str(s.f[i].p, s.f[i].p->comments.v[c]), "perf_map_entries=");
            if (t) entries = atoll(t + strlen("perf_map_entries="));
        }
    printf("perf_map_entries=%lld\n", entries);
    CHECK(entries > 100);
    pset_free(&s);
    remove_dir();
}

TEST(node_js_frames_named_with_server_symbolize)
{
    pset s;
    run_node("--perf-basic-prof --interpreted-frames-native-stack", "CONTPROF_SYMBOLIZE=server",
             &s);
    check_hot_json_named(&s);
    int bare;
    int64_t leaf;
    unnamed(&s, &bare, &leaf);
    CHECK_EQ(bare, 0);
    pset_free(&s);
    remove_dir();
}

/* worker_threads: each Worker is its own isolate, named by its name option or, unnamed,
 * "worker-" and Node's threadId (README.md "Isolates"), read from Node's Worker object with
 * no help from the host: each holds only its own JS function, and the main thread's
 * ("node") none of theirs. */
TEST(node_workers_are_isolates_by_name)
{
    pset s;
    /* four threads burning on a shared 2-core machine: 5 s for about 1 s of CPU each */
    run_node_script(CP_WORKERS_JS, "5", "--perf-basic-prof --interpreted-frames-native-stack", NULL,
                    &s);
    static const char *iso[] = {"alpha", "beta", "worker-3", "node"};
    static const char *fn[] = {"alphaWork", "betaWork", "thirdWork", "mainWork"};
    for (int i = 0; i < 4; i++) {
        int64_t all = sum_kind(&s, "cpu", iso[i], NULL, 1);
        int64_t own = sum_kind(&s, "cpu", iso[i], fn[i], 1);
        printf("isolate %s: %s %lld of %lld ns\n", iso[i], fn[i], (long long)own, (long long)all);
        CHECK(own * 2 > all); /* its own function is most of its CPU */
        for (int j = 0; j < 4; j++)
            if (j != i) CHECK_EQ(sum_kind(&s, "cpu", iso[i], fn[j], 1), 0);
    }
    /* no other isolate (V8's and libuv's shared threads stay under "node") holds them */
    for (int i = 0; i < s.n; i++) {
        int known = !strcmp(s.f[i].iso, "contprof-agent");
        for (int k = 0; k < 4; k++)
            known |= !strcmp(s.f[i].iso, iso[k]);
        if (!known) printf("other isolate %s\n", s.f[i].iso);
        for (int j = 0; j < 4 && !known; j++)
            CHECK_EQ(func_total(s.f[i].p, fn[j], 1), 0);
    }
    pset_free(&s);
    remove_dir();
}

TEST(node_without_perf_map_reads_jit_and_says_which_flags)
{
    pset s;
    const char *out = run_node("", NULL, &s);
    int64_t jit = cpu_with(&s, "[jit]"), all = cpu_with(&s, NULL);
    printf("[jit] %lld of %lld ns\n", (long long)jit, (long long)all);
    CHECK(jit * 2 > all);
    int bare;
    int64_t leaf;
    unnamed(&s, &bare, &leaf);
    CHECK_EQ(bare, 0);
    CHECK(strstr(out, "contprof: ") &&
          strstr(out, "--perf-basic-prof --interpreted-frames-native-stack"));
    const char *first = strstr(out, "--perf-basic-prof");
    CHECK(!strstr(first + 1, "contprof: a V8 host")); /* one line */
    pset_free(&s);
    remove_dir();
}

/* node with the perf map but without --interpreted-frames-native-stack, running cold code
 * (js/cold.js): interpreted functions run in V8's one InterpreterEntryTrampoline, which
 * the agent says once, naming the flag; with the flag (node_js_frames_named_from_perf_map)
 * it says nothing. */
TEST(node_perf_map_without_native_stack_names_the_flag)
{
    pset s;
    const char *out = run_node_script(CP_COLD_JS, "2.5", "--perf-basic-prof", NULL, &s);
    int64_t tramp = 0, all = cpu_with(&s, NULL);
    for (int i = 0; i < s.n; i++)
        for (uint32_t j = 0; is_prog_cpu(&s.f[i]) && j < s.f[i].p->functions.n; j++) {
            const char *fn = cp_profile_str(s.f[i].p, s.f[i].p->functions.v[j].name);
            if (strstr(fn, "InterpreterEntryTrampoline")) tramp += func_total(s.f[i].p, fn, 1);
        }
    printf("under the trampoline %lld of %lld ns\n", (long long)tramp, (long long)all);
    CHECK(tramp * 10 > all); /* what the line is about */
    const char *line = strstr(out, "contprof: V8 writes a perf map");
    CHECK(line && strstr(line, "--interpreted-frames-native-stack"));
    CHECK(!strstr(line + 1, "contprof: V8 writes a perf map")); /* once */
    pset_free(&s);
    remove_dir();
}

/* The flags behind a perf map, from a command line and NODE_OPTIONS. */
TEST(perfmap_native_stack_flags)
{
    static const char a[] = "node\0--perf-basic-prof\0app.js";
    static const char b[] = "node\0--perf-basic-prof\0--interpreted-frames-native-stack\0x.js";
    static const char c[] = "node\0--perf_basic_prof_only_functions\0x.js";
    CHECK_EQ(cp_perfmap_needs_native_stack(a, sizeof(a), NULL), 1);
    CHECK_EQ(cp_perfmap_needs_native_stack(b, sizeof(b), NULL), 0);
    CHECK_EQ(cp_perfmap_needs_native_stack(c, sizeof(c), NULL), 1);
    CHECK_EQ(cp_perfmap_needs_native_stack(a, sizeof(a), " --interpreted_frames_native_stack"), 0);
    CHECK_EQ(cp_perfmap_needs_native_stack("node\0x.js", 10, "--perf-prof"), 1);
    CHECK_EQ(cp_perfmap_needs_native_stack("node\0x.js", 10, NULL), 0);
    CHECK_EQ(cp_perfmap_needs_native_stack(NULL, 0, ""), 0);
}

/* The perf-map hint only where it can help: `node -e 0` (a few samples, none or almost none
 * in JIT code) and a short script say nothing, five runs each; the hint needs 100 ms of
 * CPU in unnamed JIT code (node_without_perf_map_reads_jit_and_says_which_flags). Before,
 * every node process without the flag printed it, `node -e 0` included. */
TEST(node_e_0_says_nothing)
{
    make_dir();
    const char *progs[] = {"0", "let s = 0; for (let i = 0; i < 1e6; i++) s += i;"};
    for (size_t k = 0; k < sizeof(progs) / sizeof(progs[0]); k++)
        for (int i = 0; i < 5; i++) {
            char cmd[512], out[4096];
            snprintf(cmd, sizeof(cmd), "%s -e '%s' 2>&1", CP_NODE, progs[k]);
            const char *env[] = {"LD_PRELOAD=" CP_LIB, g_env_dir, NULL};
            const char *args[] = {"-c", cmd, NULL};
            int st = run_capture("/bin/sh", args, g_dir, env, out, sizeof(out));
            if (out[0]) printf("node -e '%s': %s", progs[k], out);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
            CHECK(!strstr(out, "contprof:"));
        }
    pset s;
    pset_load(g_dir, &s); /* the agent ran: its windows are there */
    printf("%d profiles from %d runs\n", s.n, 10);
    CHECK(s.n > 0);
    pset_free(&s);
    remove_dir();
}

/* workerd (npm's @cloudflare/workerd-linux-64, pinned in tests/collector/workerd, installed
 * into the build directory) serving a Worker and its Durable Object with the perf map on,
 * under load: its JS functions and the object's method named, V8's C++ under them
 * demangled, no bare address. */
TEST(workerd_worker_js_frames_named)
{
    char cmd[1200], bin[600] = "";
    snprintf(cmd, sizeof(cmd), "sh %s/install.sh %s/workerd", CP_WORKERD_DIR, CP_BIN_DIR);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    CHECK(fgets(bin, sizeof(bin), f) != NULL);
    CHECK(pclose(f) == 0);
    bin[strcspn(bin, "\n")] = 0;
    make_dir();
    char port[16];
    snprintf(port, sizeof(port), "%d", free_port());
    const char *env[] = {"LD_PRELOAD=" CP_LIB, g_env_dir, "CONTPROF_WINDOW=1s",
                         "PATH=/usr/bin:/bin", NULL};
    char script[700];
    snprintf(script, sizeof(script), "%s/run.sh", CP_WORKERD_DIR);
    const char *args[] = {script, bin, port, "60", NULL};
    static char out[8192];
    int st = run_capture("/bin/sh", args, NULL, env, out, sizeof(out));
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pset s;
    pset_load(g_dir, &s);
    int64_t all = cpu_with(&s, NULL), json = cpu_with(&s, "hotJson"),
            math = cpu_with(&s, "hotMath"), fetch = cpu_with(&s, "fetch");
    printf("workerd: fetch %lld, hotJson %lld, hotMath %lld of %lld ns\n", (long long)fetch,
           (long long)json, (long long)math, (long long)all);
    CHECK(fetch * 2 > all); /* the Worker's code is most of workerd's CPU under load */
    CHECK(json > 0 && math > 0);
    int64_t tally = cpu_with(&s, "tally");
    printf("the Durable Object's method tally: %lld ns\n", (long long)tally);
    CHECK(tally > 0); /* a class method, as V8 names it */
    CHECK(called_under(&s, "v8::internal::JsonStringifier::", "hotJson"));
    int bare;
    int64_t leaf;
    unnamed(&s, &bare, &leaf);
    printf("bare-address locations %d\n", bare);
    CHECK_EQ(bare, 0);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * perfmap.c on hand-written maps */

static void split_is(const char *name, const char *fn, const char *file, int64_t line)
{
    cp_perfmap_name n;
    cp_perfmap_split(name, strlen(name), &n);
    printf("%s -> '%s' '%s' %lld\n", name, n.function, n.file, (long long)n.line);
    CHECK_STREQ(n.function, fn);
    CHECK_STREQ(n.file, file);
    CHECK_EQ(n.line, line);
}

TEST(perfmap_names)
{
    split_is("JS:~hotJson worker.js:4:17", "hotJson", "worker.js", 4);
    split_is("JS:+'hotJson worker.js:2:14", "hotJson", "worker.js", 2);
    split_is("JS:o*hotMath worker:11:17", "hotMath", "worker", 11); /* workerd: OSR code */
    split_is("JS:~oops a.js:1:1", "oops", "a.js", 1);
    split_is("JS:*Counter.increment file:///srv/app.js:10:3", "Counter.increment",
             "file:///srv/app.js", 10);
    split_is("JS:~ worker.js:10:11", "(anonymous)", "worker.js", 10);
    split_is("JS:^get size node:internal/x:5:9", "get size", "node:internal/x", 5);
    split_is("LazyCompile:*old a.js:3:1", "old", "a.js", 3);
    split_is("JS:~run", "run", "", 0);
    split_is("Builtin:JsonStringify", "Builtin:JsonStringify", "", 0);
    split_is("Stub:CEntry with spaces", "Stub:CEntry with spaces", "", 0);
}

static void append(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
}

static const char *name_at(uint64_t addr)
{
    static char buf[256];
    const char *n;
    size_t len;
    uint32_t slot;
    if (cp_perfmap_lookup(addr, &n, &len, &slot) != 0) return "";
    snprintf(buf, sizeof(buf), "%.*s", (int)len, n);
    return buf;
}

typedef struct addr_name {
    uint64_t addr;
    const char *name;
} addr_name;

/* Checks each address's name, up to an entry with no name. */
static void names_at(const addr_name *want)
{
    for (; want->name; want++)
        CHECK_STREQ(name_at(want->addr), want->name);
}

TEST(perfmap_incremental_defensive)
{
    char path[] = "/tmp/cpperfmap-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    cp_perfmap_reset();
    append(path, "1000 100 JS:~a x.js:1:1\n0x2000 0x80 JS:~b y.js:2:1\nzz 10 bad\n3000 10 JS:~c");
    CHECK_EQ(cp_perfmap_refresh(path), 0);
    names_at((const addr_name[]){{0x1000, "JS:~a x.js:1:1"},
                                 {0x10ff, "JS:~a x.js:1:1"},
                                 {0x1100, ""},
                                 {0x207f, "JS:~b y.js:2:1"},
                                 {0x3005, ""}, /* its line is not finished yet */
                                 {0}});
    cp_perfmap_stats st;
    cp_perfmap_get_stats(&st);
    CHECK_EQ(st.entries, 2);
    CHECK_EQ(st.bad, 1);
    /* the rest of the cut line, and a newer entry over part of an older one */
    append(path, " z.js:3:1\r\n1040 20 JS:*a2 x.js:1:1\n");
    CHECK_EQ(cp_perfmap_refresh(path), 0);
    names_at((const addr_name[]){{0x3005, "JS:~c z.js:3:1"},
                                 {0x1050, "JS:*a2 x.js:1:1"},
                                 {0x1030, "JS:~a x.js:1:1"},
                                 {0x1070, "JS:~a x.js:1:1"},
                                 {0}});
    /* tags stay with their entries */
    const char *n;
    size_t len;
    uint32_t slot;
    CHECK_EQ(cp_perfmap_lookup(0x2000, &n, &len, &slot), 0);
    cp_perfmap_set_tag(slot, 42);
    CHECK_EQ(cp_perfmap_refresh(path), 0); /* nothing new */
    CHECK_EQ(cp_perfmap_lookup(0x2001, &n, &len, &slot), 0);
    CHECK_EQ(cp_perfmap_get_tag(slot), 42);
    /* a file that shrank (replaced) is read again from the start */
    CHECK(truncate(path, 0) == 0);
    append(path, "5000 10 JS:~d q.js:1:1\n");
    CHECK_EQ(cp_perfmap_refresh(path), 0);
    CHECK_STREQ(name_at(0x5000), "JS:~d q.js:1:1");
    CHECK_STREQ(name_at(0x1000), "");
    unlink(path);
    CHECK_EQ(cp_perfmap_refresh(path), CP_ENOTFOUND);
    cp_perfmap_reset();
}

TEST_MAIN(T(node_e_0_says_nothing), T(node_perf_map_without_native_stack_names_the_flag),
          T(node_js_frames_named_from_perf_map), T(node_js_frames_named_with_server_symbolize),
          T(node_without_perf_map_reads_jit_and_says_which_flags),
          T(node_workers_are_isolates_by_name), T(workerd_worker_js_frames_named), T(perfmap_names),
          T(perfmap_incremental_defensive), T(perfmap_native_stack_flags))
