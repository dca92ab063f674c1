/* The contprof CLI as people and scripts see it, driven against the real contprofd on a
 * fixed data set: each human table against a committed golden file (tests/query/golden),
 * `-o json` / `--format json` byte for byte against the JSON the CLI printed before tables
 * existed, the error messages that name the cause, the help texts and the bash completion.
 * CP_UPDATE_GOLDEN=1 rewrites the golden files instead of comparing (CP_CLI picks the
 * contprof binary, e.g. an older build to capture its JSON). */
#include <time.h>

#include "json.h"
#include "pprof.h"
#include "proc.h"
#include "fixture.h"
#include "qtest.h"

#define S(x) ((int64_t)(x)*1000000000LL)
static const int64_t T0 = 1764000000; /* 2025-11-24T16:00:00Z */

/* ---- the fixed data set and the daemon ---------------------------------------------- */

static cp_profile *alloc_profile(void)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_profile_add_sample_type(p, "alloc_objects", "count") == 0);
    CHECK(cp_profile_add_sample_type(p, "alloc_space", "bytes") == 0);
    return p;
}

/* Two services over 10 minutes from T0: api (version 1, then 2 with a new slow path and
 * less time in c) and web, cpu; api's allocations over the first 5 minutes. */
static void fill(qfx *f)
{
    for (int w = 0; w < 60; w++) {
        cp_profile *p = qt_cpu_profile();
        int64_t x = 1 + w % 3;
        qt_add(p, "main;a;b", x, x * 10000000);
        qt_add(p, "main;c", w < 30 ? 5 : 2, w < 30 ? 50000000 : 20000000);
        if (w >= 30) qt_add(p, "main;d;slow", 7, 70000000);
        qfx_add(f, "default", CP_KIND_CPU,
                w < 30 ? "service=api,version=1,instance=i1" : "service=api,version=2,instance=i1",
                S(T0 + 10 * w), p);
        cp_profile_destroy(p);
        if (w < 30) {
            p = qt_cpu_profile();
            qt_add(p, "main;serve;parse", 3, 30000000);
            qfx_add(f, "default", CP_KIND_CPU, "service=web,instance=w1", S(T0 + 10 * w), p);
            cp_profile_destroy(p);
            p = alloc_profile();
            qt_add(p, "main;a;grow", 1 + w % 4, (1 + w % 4) * 1048576);
            qt_add(p, "main;c;buf", 2, 8192);
            qfx_add(f, "default", CP_KIND_ALLOC, "service=api,version=1,instance=i1",
                    S(T0 + 10 * w), p);
            cp_profile_destroy(p);
        }
    }
    qfx_commit(f);
}

typedef struct env {
    proc d;
    char dir[64], store[128], conf[128], url[64];
} env;

static void env_start(env *e)
{
    snprintf(e->dir, sizeof e->dir, "/tmp/cpcli-XXXXXX");
    CHECK(mkdtemp(e->dir));
    snprintf(e->store, sizeof e->store, "%s/store", e->dir);
    snprintf(e->conf, sizeof e->conf, "%s/c.conf", e->dir);
    qfx f = {0};
    qfx_open_store(&f, e->store);
    fill(&f);
    qfx_close(&f, 0);
    FILE *cf = fopen(e->conf, "w");
    CHECK(cf);
    /* The data is from 2025: keep it forever, or retention would remove it. */
    fprintf(cf, "listen = 127.0.0.1:0\nbrokers = 127.0.0.1:9\nretention.raw = 0\n"
                "retention.rollup = 0\nquery.max_range = 30d\n");
    fclose(cf);
    const char *args[] = {"--config", e->conf, "--data", e->store, NULL};
    start_daemon(&e->d, e->dir, args);
    snprintf(e->url, sizeof e->url, "http://127.0.0.1:%d", e->d.port);
}

static void env_stop(env *e)
{
    CHECK_EQ(stop_daemon(&e->d, SIGTERM), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    CHECK(system(cmd) == 0);
}

/* ---- running the CLI ---------------------------------------------------------------- */

static const char *cli(void)
{
    static char path[512];
    const char *c = getenv("CP_CLI");
    if (c && *c) return c;
    snprintf(path, sizeof path, "%s/query/contprof", bindir());
    return path;
}

/* Runs `contprof ARGS` (through sh, so ARGS may quote) with stdout to out and stderr to
 * err (each NUL-terminated; err may be NULL to send it to out); returns the exit status. */
static int run(const char *args, char *out, size_t olen, char *err, size_t elen)
{
    char ef[64];
    snprintf(ef, sizeof ef, "/tmp/cpcli-err-%d", (int)getpid());
    size_t cl = strlen(args) + 1024;
    char *cmd = malloc(cl);
    CHECK(cmd);
    snprintf(cmd, cl, "%s %s 2>%s", cli(), args, err ? ef : "&1");
    FILE *p = popen(cmd, "r");
    free(cmd);
    CHECK(p);
    size_t n = 0, r;
    while (n < olen - 1 && (r = fread(out + n, 1, olen - 1 - n, p)) > 0)
        n += r;
    out[n] = 0;
    int st = pclose(p);
    if (err) {
        slurp(ef, err, elen);
        unlink(ef);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Compares text with tests/query/golden/name, or writes it there with CP_UPDATE_GOLDEN. */
static void golden(const char *name, const char *text)
{
    const char *src = getenv("CP_SOURCE_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/tests/query/golden/%s", src ? src : ".", name);
    const char *up = getenv("CP_UPDATE_GOLDEN");
    if (up && *up == '1') {
        FILE *f = fopen(path, "w");
        CHECK(f);
        fputs(text, f);
        fclose(f);
        return;
    }
    static char want[1 << 16];
    slurp(path, want, sizeof want);
    if (strcmp(want, text) != 0)
        fprintf(stderr, "golden %s differs; got:\n%s\n--- want:\n%s\n", name, text, want);
    CHECK_STREQ(text, want);
}

/* The commands with a table view and their golden names, over the fixed data set. */
typedef struct view {
    const char *name, *args;
} view;

static void views(const env *e, view *v, char bufs[][512])
{
    const long long t = (long long)T0;
    const char *fmt[] = {
        "series",
        "series --server %s --from %lld --to %lld",
        "labels",
        "labels --server %s",
        "labels_version",
        "labels --server %s version",
        "timeline_cpu",
        "timeline --server %s --type cpu --select '{service=\"api\"}' --from %lld "
        "--to %lld --step 1m",
        "timeline_alloc",
        "timeline --server %s --type alloc --from %lld --to %lld --step 30s",
        "diff",
        "diff --server %s --type cpu --select '{service=\"api\"}' --from %lld --to %lld "
        "--base-from %lld --base-to %lld",
    };
    snprintf(bufs[0], 512, fmt[1], e->url, t, t + 3600);
    snprintf(bufs[1], 512, fmt[3], e->url);
    snprintf(bufs[2], 512, fmt[5], e->url);
    snprintf(bufs[3], 512, fmt[7], e->url, t, t + 600);
    snprintf(bufs[4], 512, fmt[9], e->url, t, t + 300);
    snprintf(bufs[5], 512, fmt[11], e->url, t + 300, t + 600, t, t + 300);
    for (int i = 0; i < 6; i++) {
        v[i].name = fmt[2 * i];
        v[i].args = bufs[i];
    }
}

/* ---- tests -------------------------------------------------------------------------- */

/* -o json and --format json print exactly what the CLI printed before it had tables. */
TEST(json_is_unchanged)
{
    env e = {0};
    env_start(&e);
    view v[6];
    char bufs[6][512];
    views(&e, v, bufs);
    static char out[1 << 16], err[4096];
    const char *up = getenv("CP_UPDATE_GOLDEN");
    const char *flags[] = {"--format json", "-o json", "--output json"};
    for (int i = 0; i < 6; i++) {
        for (int k = 0; k < (up && *up == '1' ? 1 : 3); k++) {
            char args[700], name[64];
            snprintf(args, sizeof args, "%s %s", v[i].args, flags[k]);
            CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 0);
            CHECK_STREQ(err, "");
            snprintf(name, sizeof name, "%s.json", v[i].name);
            golden(name, out);
        }
    }
    env_stop(&e);
}

/* Without -o json, whether stdout is a terminal or not (here a pipe): tables. */
TEST(tables_against_golden_files)
{
    env e = {0};
    env_start(&e);
    view v[6];
    char bufs[6][512];
    views(&e, v, bufs);
    static char out[1 << 16], err[4096];
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(run(v[i].args, out, sizeof out, err, sizeof err), 0);
        CHECK_STREQ(err, "");
        char name[64];
        snprintf(name, sizeof name, "%s.txt", v[i].name);
        golden(name, out);
        /* -o table is the same as the default */
        char args[700];
        static char again[1 << 16];
        snprintf(args, sizeof args, "%s -o table", v[i].args);
        CHECK_EQ(run(args, again, sizeof again, err, sizeof err), 0);
        CHECK_STREQ(again, out);
    }
    /* -o FILE (anything but json and table) still writes the view to that file. */
    char args[700], file[128];
    snprintf(file, sizeof file, "%s/json.txt", e.dir);
    snprintf(args, sizeof args, "%s -o %s", v[0].args, file);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 0);
    CHECK_STREQ(out, "");
    slurp(file, out, sizeof out);
    golden("series.txt", out);
    /* diff: --max-nodes counts rows of the table. */
    snprintf(args, sizeof args, "%s --max-nodes 2", v[5].args);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 0);
    golden("diff_rows2.txt", out);
    env_stop(&e);
}

static const char *go_cpu_file(void)
{
    static char file[512];
    const char *src = getenv("CP_SOURCE_DIR");
    snprintf(file, sizeof file, "%s/tests/fuzz/corpus/fuzz_pprof/go_cpu.pb.gz", src ? src : ".");
    return file;
}

/* Each refusal names its cause: the flag, the limit, the field. */
TEST(errors_name_the_cause)
{
    env e = {0};
    env_start(&e);
    static char out[1 << 16], err[1 << 14], args[1 << 15];
    /* A time beyond what fits: the range limit, named by the CLI before sending ... */
    snprintf(args, sizeof args, "timeline --server %s --to 9999-12-31T23:59:59Z", e.url);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 2);
    CHECK_STREQ(err, "contprof timeline: --to: bad time '9999-12-31T23:59:59Z': after "
                     "2262-04-11T23:47:16Z, the latest time contprof can represent (unix "
                     "nanoseconds in 64 bits)\n");
    /* ... and by the API, with the parameter. */
    cp_http_result r;
    cp_err cerr = {0};
    CHECK(cp_http_get(e.url, "/api/v1/profile?to=9999-12-31T23:59:59Z", NULL, 30000, 0, &r,
                      &cerr) == 0);
    CHECK_EQ(r.status, 400);
    cp_buf_append(&r.body, "", 1);
    CHECK_CONTAINS((char *)r.body.data,
                   "{\"error\":\"bad to: bad time '9999-12-31T23:59:59Z': after "
                   "2262-04-11T23:47:16Z, the latest time");
    cp_buf_close(&r.body);
    /* A window longer than the server allows: its limit, from the server. */
    snprintf(args, sizeof args, "series --server %s --from -60d -o json", e.url);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 0); /* series: no range limit */
    snprintf(args, sizeof args, "timeline --server %s --from -60d", e.url);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 1);
    CHECK_CONTAINS(err, "exceeds the longest allowed window of 2592000 s");
    snprintf(args, sizeof args, "timeline --server %s --step 5x", e.url);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 2);
    CHECK_CONTAINS(err, "contprof timeline: --step: bad duration '5x'");
    snprintf(args, sizeof args, "series --server %s --format folded", e.url);
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 2);
    CHECK_CONTAINS(err, "contprof series: --format: expected table (default) or json");
    /* import: 300 labels name the 64-label limit (not "out of memory") ... */
    int n = snprintf(args, sizeof args, "import --brokers 127.0.0.1:9");
    for (int i = 0; i < 300; i++)
        n += snprintf(args + n, sizeof args - (size_t)n, " --label l%d=v", i);
    snprintf(args + n, sizeof args - (size_t)n, " '%s'", go_cpu_file());
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 2);
    CHECK_STREQ(err, "contprof import: 301 distinct labels (service and --label): ingest accepts "
                     "at most 64 labels per series\n");
    /* ... a value over 1,024 bytes names that limit ... */
    n = snprintf(args, sizeof args, "import --brokers 127.0.0.1:9 --label big=");
    for (int i = 0; i < 1025; i++)
        args[n++] = 'x';
    snprintf(args + n, sizeof args - (size_t)n, " '%s'", go_cpu_file());
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 2);
    CHECK_STREQ(err, "contprof import: --label big: the value is 1025 bytes, over the limit of "
                     "1024 bytes per label value\n");
    /* ... and what ingest would refuse is not sent, nor reported delivered. */
    snprintf(args, sizeof args, "import --brokers 127.0.0.1:9 --tenant 'no spaces' '%s'",
             go_cpu_file());
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 1);
    CHECK_CONTAINS(err, "go_cpu.pb.gz: not sent, ingest would refuse it: tenant \"no spaces\" "
                        "is invalid");
    CHECK_CONTAINS(err, "0 of 0 window(s) from 1 file(s) delivered");
    snprintf(args, sizeof args, "import --brokers 127.0.0.1:9 --duration 2d '%s'", go_cpu_file());
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 1);
    CHECK_CONTAINS(err, "not sent, ingest would refuse it: window_duration_ns 172800000000000 is "
                        "out of range (0, 1 day]");
    snprintf(args, sizeof args, "import --brokers 127.0.0.1:9 --at tomorrow '%s'", go_cpu_file());
    CHECK_EQ(run(args, out, sizeof out, err, sizeof err), 2);
    CHECK_CONTAINS(err, "contprof import: --at: bad time 'tomorrow' (expected RFC 3339");
    env_stop(&e);
}

/* `import --at now` takes the same grammar as queries, and the window is stored. */
TEST(import_at_now_is_stored)
{
    env e = {0};
    snprintf(e.dir, sizeof e.dir, "/tmp/cpcli-XXXXXX");
    CHECK(mkdtemp(e.dir));
    snprintf(e.store, sizeof e.store, "%s/store", e.dir);
    const char *args[] = {"--data", e.store, "--http", "127.0.0.1:0", NULL}; /* embedded broker */
    start_daemon(&e.d, e.dir, args);
    snprintf(e.url, sizeof e.url, "http://127.0.0.1:%d", e.d.port);
    static char out[1 << 16], err[4096], cmd[2048];
    snprintf(cmd, sizeof cmd, "import --server %s --service nowsvc --at now --duration 10s '%s'",
             e.url, go_cpu_file());
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 0);
    CHECK_CONTAINS(err, "1 of 1 window(s) from 1 file(s) stored");
    /* Ingest is asynchronous (the first consumer-group join takes seconds): poll. */
    snprintf(cmd, sizeof cmd, "series --server %s --select '{service=\"nowsvc\"}' --from -10m",
             e.url);
    int found = 0;
    for (int i = 0; i < 600 && !found; i++) {
        CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 0);
        found = strstr(out, "nowsvc") != NULL;
        if (!found) usleep(100000);
    }
    CHECK(found);
    CHECK_CONTAINS(out, "TYPE  SERVICE  FIRST");
    env_stop(&e);
}

/* A heap snapshot of one process (one stack) at t: objects allocated since it started. */
static void heap_file(const char *path, int64_t t, int64_t objects)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    static const char *const types[4][2] = {{"alloc_objects", "count"},
                                            {"alloc_space", "bytes"},
                                            {"inuse_objects", "count"},
                                            {"inuse_space", "bytes"}};
    for (int i = 0; i < 4; i++)
        CHECK(cp_profile_add_sample_type(p, types[i][0], types[i][1]) == 0);
    p->time_nanos = t;
    cp_function fn = {0};
    uint32_t fid, lid;
    cp_profile_intern_cstr(p, "grow", &fn.name);
    CHECK(cp_profile_add_function(p, &fn, &fid) == 0);
    cp_line ln = {fid, 1};
    CHECK(cp_profile_add_location(p, 0x1000, 0, &ln, 1, &lid) == 0);
    int64_t v[4] = {objects, objects * 10, 5, 50};
    CHECK(cp_profile_add_sample(p, &lid, 1, v, NULL, 0) == 0);
    cp_buf b = {0};
    CHECK(cp_pprof_encode(p, 1, &b) == 0);
    CHECK(cp_write_file(path, b.data, b.len, NULL) == 0);
    cp_buf_close(&b);
    cp_profile_destroy(p);
}

/* Heap snapshots count since their process started: they are subtracted in the order they
 * were taken (their time_nanos, not the command line's: a glob puts heap.10 before
 * heap.9), and a count that went down (a restart) starts anew; no window is negative
 * (issue 36: `import h2 h1` stored -50 and a total of 100 for 150). */
TEST(heap_snapshots_are_subtracted_in_their_own_time_order)
{
    env e = {0};
    snprintf(e.dir, sizeof e.dir, "/tmp/cpcli-XXXXXX");
    CHECK(mkdtemp(e.dir));
    snprintf(e.store, sizeof e.store, "%s/store", e.dir);
    const char *args[] = {"--data", e.store, "--http", "127.0.0.1:0", NULL}; /* embedded broker */
    start_daemon(&e.d, e.dir, args);
    snprintf(e.url, sizeof e.url, "http://127.0.0.1:%d", e.d.port);
    int64_t t0 = ((int64_t)time(NULL) / 10 - 12) * 10;
    /* 100 then 150 in one process; it restarts; 30 then 60 */
    static const int64_t objects[4] = {100, 150, 30, 60};
    char files[4][600];
    for (int i = 0; i < 4; i++) {
        snprintf(files[i], sizeof files[i], "%s/heap.%d", e.dir, 9 + i);
        heap_file(files[i], (t0 + 10 * i) * 1000000000LL, objects[i]);
    }
    static char out[1 << 16], err[4096], cmd[4096];
    snprintf(cmd, sizeof cmd, "import --server %s --service heapsvc '%s' '%s' '%s' '%s'", e.url,
             files[1], files[0], files[3], files[2]);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 0);
    char pq[400];
    snprintf(pq, sizeof pq,
             "/api/v1/timeline?type=alloc&from=%lld&to=%lld&step=10s&select=%%7Bservice%%3D%%22"
             "heapsvc%%22%%7D",
             (long long)t0 - 60, (long long)t0 + 60);
    int64_t sum = 0, neg = 0;
    for (int tries = 0; tries < 100 && sum != 210; tries++) {
        if (tries) usleep(100000);
        cp_http_result r;
        CHECK(cp_http_get(e.url, pq, NULL, 10000, 0, &r, NULL) == 0);
        CHECK_EQ(r.status, 200);
        cp_buf b = r.body;
        cp_json *j = NULL;
        CHECK(cp_json_parse((const char *)b.data, b.len, &j, NULL) == 0);
        const cp_json *pts = cp_json_get(j, "points");
        sum = neg = 0;
        for (uint32_t i = 0; pts && i < pts->n; i++) {
            int64_t v = cp_json_int(pts->items[i]->items[1], 0);
            sum += v;
            neg += v < 0;
        }
        if (tries == 99 || sum == 210) fprintf(stderr, "%s\n", (char *)b.data);
        cp_json_free(j);
        cp_buf_close(&b);
    }
    CHECK_EQ(neg, 0);
    CHECK_EQ(sum, 100 + 50 + 30 + 30);
    env_stop(&e);
}

/* Every command's --help shows examples. */
TEST(help_shows_examples)
{
    static char out[1 << 16], err[4096];
    const char *cmds[] = {"--help",        "query --help",      "top --help",      "series --help",
                          "labels --help", "diff --help",       "timeline --help", "import --help",
                          "merge --help",  "completion --help", "run --help",      NULL};
    for (const char **c = cmds; *c; c++) {
        CHECK_EQ(run(*c, out, sizeof out, err, sizeof err), 0);
        if (!strstr(out, "examples:\n  contprof ") && !strstr(out, "examples:\n  source "))
            fprintf(stderr, "contprof %s: no examples in:\n%s\n", *c, out);
        CHECK(strstr(out, "examples:\n  contprof ") || strstr(out, "examples:\n  source "));
    }
    CHECK_EQ(run("--help", out, sizeof out, err, sizeof err), 0);
    CHECK_CONTAINS(out, "-o json (or\n--format json) prints the HTTP API's JSON");
}

/* The completion script parses, lists the subcommands and each one's flags, and completes
 * label names from the server. */
TEST(bash_completion)
{
    env e = {0};
    env_start(&e);
    static char out[1 << 16], err[4096], cmd[4096];
    char script[128];
    snprintf(script, sizeof script, "%s/completion.bash", e.dir);
    snprintf(cmd, sizeof cmd, "completion bash > %s", script);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 0);
    snprintf(cmd, sizeof cmd, "bash -n %s", script);
    CHECK_EQ(system(cmd), 0);
    slurp(script, out, sizeof out);
    CHECK_CONTAINS(out, "local cmds=\"merge query top series labels diff timeline");
    CHECK_CONTAINS(out, "complete -F _contprof contprof\n");
    CHECK(strstr(out, " import") && strstr(out, " completion"));
    /* Drive it as bash would: COMP_WORDS, COMP_CWORD, then COMPREPLY. */
    const struct {
        const char *words, *want;
    } cases[] = {
        {"ti", "timeline"},
        {"timeline --st", "--step"},
        {"top --type i", "inuse"},
        {"series -o j", "json"},
        {"diff --base-f", "--base-from"},
        {"labels --server URL ''", "instance service version"},
        {"series --server URL --select '{s'", "{service="},
        {"completion ''", "bash"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char words[256];
        const char *u = strstr(cases[i].words, "URL");
        if (u)
            snprintf(words, sizeof words, "%.*s%s%s", (int)(u - cases[i].words), cases[i].words,
                     e.url, u + 3);
        else
            snprintf(words, sizeof words, "%s", cases[i].words);
        /* A file, not bash -c: the words have quotes of their own. */
        char f[160];
        snprintf(f, sizeof f, "%s/case.sh", e.dir);
        FILE *fp = fopen(f, "w");
        CHECK(fp);
        fprintf(fp,
                "source %s\nCOMP_WORDS=(%s %s)\nCOMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n"
                "_contprof\necho \"${COMPREPLY[*]}\"\n",
                script, cli(), words);
        fclose(fp);
        snprintf(cmd, sizeof cmd, "bash %s", f);
        FILE *p = popen(cmd, "r");
        CHECK(p);
        size_t k = fread(out, 1, sizeof out - 1, p);
        out[k] = 0;
        pclose(p);
        char want[256];
        snprintf(want, sizeof want, "%s\n", cases[i].want);
        if (strcmp(out, want) != 0) fprintf(stderr, "completing '%s':\n", words);
        CHECK_STREQ(out, want);
    }
    env_stop(&e);
}

TEST_MAIN(T(json_is_unchanged), T(heap_snapshots_are_subtracted_in_their_own_time_order),
          T(tables_against_golden_files), T(errors_name_the_cause), T(import_at_now_is_stored),
          T(help_shows_examples), T(bash_completion))
