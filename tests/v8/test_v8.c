/* Black-box tests of `contprof v8`: a real node (--inspect-brk on a free loopback port)
 * runs tests/v8/two_workers.js, two worker_threads burning named functions at known
 * ratios and a main thread that builds a large table at start-up; the source writes its
 * windows to a directory, which is decoded and checked per isolate. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_client.h"
#include "pprof.h"
#include "profile.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

static char g_dir[256];

/* node's path, found as the shell finds it. */
static void find_node(char *out, size_t cap)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof(dirs), "%s", path ? path : "/usr/bin:/usr/local/bin");
    char *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/node", d);
        if (access(out, X_OK) == 0) return;
    }
    fprintf(stderr, "node not found in PATH (.ci/deps installs it)\n");
    CHECK(0);
}

static void make_dir(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/contprof-v8-test-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(g_dir, 0755) == 0);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

static void print_log(const char *path)
{
    static char buf[1 << 16];
    slurp(path, buf, sizeof(buf));
    printf("--- %s\n%s---\n", path, buf);
}

/* The tenant and its token contprof v8 is given (run_node), NULL for none; with g_files
 * and a server, the windows go to g_dir/out as well. */
static const char *g_tenant, *g_token;
static int g_files;

/* Starts node on two_workers.js for seconds and `contprof v8 --window window` on it: the
 * windows end up in g_dir/out, or go to the contprofd at server (if not NULL). */
/* The script node_start runs (NULL: two_workers.js), given the seconds to run. */
static const char *g_script;
/* --heap-interval for contprof v8 (NULL: its default). */
static const char *g_heap_interval;

static void node_start(int seconds, const char *window, const char *server, pid_t *np, pid_t *cp)
{
    static char node[512], inspect[64], hostport[64], script[512], secs[16], out[300], nlog[300],
        clog[300];
    find_node(node, sizeof(node));
    int port = free_port();
    snprintf(inspect, sizeof(inspect), "--inspect-brk=127.0.0.1:%d", port);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
    if (g_script)
        snprintf(script, sizeof(script), "%s", g_script);
    else
        snprintf(script, sizeof(script), "%s/two_workers.js", CP_V8_TESTS);
    snprintf(secs, sizeof(secs), "%d", seconds);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    const char *nargv[] = {node, inspect, script, secs, NULL};
    *np = spawn(nargv, nlog);
    (void)wait_for_log(*np, nlog, "Debugger listening", 10);
    const char *cargv[20] = {CP_CONTPROF, "v8",        "--inspector", hostport,          "--window",
                             window,      "--service", "nodetest",    "--exit-when-gone"};
    int n = 9;
    if (server) {
        cargv[n++] = "--server";
        cargv[n++] = server;
    }
    if (!server || g_files) {
        cargv[n++] = "--output-dir";
        cargv[n++] = out;
    }
    if (g_heap_interval) {
        cargv[n++] = "--heap-interval";
        cargv[n++] = g_heap_interval;
    }
    if (g_tenant) {
        cargv[n++] = "--tenant";
        cargv[n++] = g_tenant;
        cargv[n++] = "--token";
        cargv[n++] = g_token;
    }
    cargv[n] = NULL;
    *cp = spawn(cargv, clog);
}

/* Waits for both: contprof v8 exits 0, node ran to its end. */
static void node_finish(int seconds, pid_t np, pid_t cp)
{
    char nlog[300], clog[300];
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    int cst = wait_exit(cp, seconds + 30);
    int nst = wait_exit(np, 10);
    print_log(clog);
    if (nst) print_log(nlog);
    CHECK_EQ(cst, 0);
    CHECK_EQ(nst, 0); /* the host ran to its end and exited: we let it go */
}

static void run_node(int seconds, const char *window, const char *server)
{
    pid_t np, cp;
    node_start(seconds, window, server, &np, &cp);
    node_finish(seconds, np, cp);
}

static double ratio(const pset *s, const char *iso, const char *num, const char *den)
{
    int64_t a = sum_kind(s, "cpu", iso, num, 1), b = sum_kind(s, "cpu", iso, den, 1);
    printf("%s: %s %lld ns, %s %lld ns\n", iso, num, (long long)a, den, (long long)b);
    CHECK(a > 0 && b > 0);
    return (double)a / (double)b;
}

/* Each worker is its own isolate with its own mix of the two functions, 3:1 either way;
 * the main thread's isolate holds the table it built before any worker started. */
TEST(node_two_workers)
{
    make_dir();
    run_node(6, "1s", NULL); /* 1 s windows: several per worker even on a loaded machine */
    pset s;
    char out[300];
    snprintf(out, sizeof(out), "%s/out", g_dir);
    pset_load(out, &s);
    int n_alpha = 0, n_beta = 0, n_main = 0, comment = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].kind, "cpu")) continue;
        n_alpha += !strcmp(s.f[i].iso, "alpha");
        n_beta += !strcmp(s.f[i].iso, "beta");
        n_main += !strcmp(s.f[i].iso, "main");
        const cp_profile *p = s.f[i].p;
        for (uint32_t k = 0; k < p->comments.n; k++)
            comment += strstr(cp_profile_str(p, p->comments.v[k]), "v8 CPU profiler") != NULL;
    }
    printf("cpu windows: alpha %d, beta %d, main %d\n", n_alpha, n_beta, n_main);
    CHECK(n_alpha >= 2 && n_beta >= 2 && n_main >= 2);
    CHECK(comment >= n_alpha + n_beta + n_main);
    /* 3:1 by work either way (3.00 timed). Beside two CPU burners (load 5) 2.87-3.13 and
     * 2.95-3.88: a worker gets ~1 s of CPU here, ~100 samples at 10 ms, and the 1:3 side's
     * ~25 samples spread ±20% (collector/v8/README.md "Ratios"). It still tells each
     * worker's own mix from the other's (1:3) and from a merge of both (1:1). */
    double ra = ratio(&s, "alpha", "hotAlpha", "hotBeta");
    double rb = ratio(&s, "beta", "hotBeta", "hotAlpha");
    CHECK(ra > 2.3 && ra < 4.0);
    CHECK(rb > 2.3 && rb < 4.0);
    /* the main isolate runs neither */
    CHECK_EQ(sum_kind(&s, "cpu", "main", "hotAlpha", 0), 0);
    /* inuse: the table main built before the workers, by its builder, in its last window */
    int64_t last_inuse = 0;
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.f[i].kind, "inuse") && !strcmp(s.f[i].iso, "main"))
            last_inuse = func_total(s.f[i].p, "buildBigTable", 1);
    printf("main inuse by buildBigTable in the last window: %lld bytes\n", (long long)last_inuse);
    CHECK(last_inuse > 8 << 20);
    CHECK(sum_kind(&s, "alloc", "main", "buildBigTable", 1) > 8 << 20);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * workerd: two Workers (two services) on one thread, under HTTP load */

static pid_t start_workerd(const char *wd, int pa, int pb, int pi, const char *log)
{
    char config[512], sa[64], sb[64], ia[64];
    snprintf(config, sizeof(config), "%s/workers.capnp", CP_V8_TESTS);
    snprintf(sa, sizeof(sa), "a=127.0.0.1:%d", pa);
    snprintf(sb, sizeof(sb), "b=127.0.0.1:%d", pb);
    snprintf(ia, sizeof(ia), "--inspector-addr=127.0.0.1:%d", pi);
    const char *argv[] = {wd, "serve", config, "--socket-addr", sa, "--socket-addr", sb, ia, NULL};
    pid_t p = spawn(argv, log);
    /* the inspector answers once both Workers are up */
    char base[64];
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", pi);
    for (int64_t end = mono_ns() + 15 * SEC; mono_ns() < end; usleep(50000)) {
        cp_http_result r;
        if (cp_http_get(base, "/json/list", NULL, 1000, 1 << 20, &r, NULL) == 0) {
            int ok = r.status == 200 && strstr((char *)r.body.data, "worker beta");
            cp_buf_close(&r.body);
            if (ok) return p;
        }
    }
    print_log(log);
    CHECK(0);
    return p;
}

/* Requests to both Workers, one after the other, for seconds. */
static void load(int pa, int pb, int seconds)
{
    char a[64], b[64];
    snprintf(a, sizeof(a), "http://127.0.0.1:%d", pa);
    snprintf(b, sizeof(b), "http://127.0.0.1:%d", pb);
    int n = 0;
    for (int64_t end = mono_ns() + seconds * SEC; mono_ns() < end; n++) {
        cp_http_result r;
        if (cp_http_get(n % 2 ? b : a, "/", NULL, 5000, 1 << 20, &r, NULL) == 0)
            cp_buf_close(&r.body);
    }
}

/* Each Worker's isolate holds only its own functions, at its own 3:1; workerd killed and
 * started again is attached again (a new session, the windows go on). */
TEST(workerd_two_workers)
{
    make_dir();
    char cmd[1024], wd[512], out[300], clog[300], wlog[300], hostport[64];
    snprintf(cmd, sizeof(cmd), "sh %s/install.sh %s", CP_V8_TESTS, bindir());
    CHECK(system(cmd) == 0);
    snprintf(wd, sizeof(wd), "%s/tests/v8/node_modules/@cloudflare/workerd-linux-64/bin/workerd",
             bindir());
    CHECK(access(wd, X_OK) == 0);
    int pa = free_port(), pb = free_port(), pi = free_port();
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(wlog, sizeof(wlog), "%s/workerd.log", g_dir);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", pi);
    pid_t w = start_workerd(wd, pa, pb, pi, wlog);
    const char *cargv[] = {CP_CONTPROF,    "v8",     "--inspector", hostport,
                           "--output-dir", out,      "--window",    "2s",
                           "--service",    "wdtest", NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(cp, clog, "attached to isolate beta", 10);
    (void)wait_for_log(cp, clog, "attached to isolate alpha", 10);
    load(pa, pb, 5);
    /* the host goes away and comes back: SIGTERM stops workerd (SIGINT does not) */
    kill(w, SIGTERM);
    CHECK(wait_exit(w, 10) >= 0);
    w = start_workerd(wd, pa, pb, pi, wlog);
    load(pa, pb, 5);
    kill(cp, SIGTERM);
    int cst = wait_exit(cp, 20);
    kill(w, SIGTERM);
    (void)wait_exit(w, 10);
    print_log(clog);
    CHECK_EQ(cst, 0);

    pset s;
    pset_load(out, &s);
    unsigned long long images[2][8];
    int nimg[2] = {0, 0};
    for (int i = 0; i < s.n; i++) {
        int k = !strcmp(s.f[i].iso, "alpha") ? 0 : !strcmp(s.f[i].iso, "beta") ? 1 : -1;
        CHECK(k >= 0); /* workerd's targets are its Workers, named */
        int seen = 0;
        for (int j = 0; j < nimg[k]; j++)
            seen |= images[k][j] == s.f[i].image;
        if (!seen && nimg[k] < 8) images[k][nimg[k]++] = s.f[i].image;
    }
    printf("sessions: alpha %d, beta %d\n", nimg[0], nimg[1]);
    CHECK(nimg[0] >= 2 && nimg[1] >= 2); /* attached again after the restart */
    /* 3:1 by work (3.00 timed in node): 2.80-3.37 in six runs beside two CPU burners
     * (load 4-7; ~200 samples per Worker, ±7% of sampling noise; README "Ratios") */
    double ra = ratio(&s, "alpha", "alphaMain", "alphaSide");
    double rb = ratio(&s, "beta", "betaMain", "betaSide");
    CHECK(ra > 2.5 && ra < 3.6);
    CHECK(rb > 2.5 && rb < 3.6);
    /* one thread runs both isolates: neither profile holds the other's functions */
    CHECK_EQ(sum_kind(&s, "cpu", "alpha", "betaMain", 0), 0);
    CHECK_EQ(sum_kind(&s, "cpu", "beta", "alphaMain", 0), 0);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * A fake inspector that answers with malformed messages (fake_inspector.js) */

static int start_fake(const char *node, const char *mode, const char *log, pid_t *pid)
{
    char script[512];
    snprintf(script, sizeof(script), "%s/fake_inspector.js", CP_V8_TESTS);
    const char *argv[] = {node, script, mode, NULL};
    *pid = spawn(argv, log);
    return atoi(wait_for_log(*pid, log, "fake inspector on ", 10));
}

/* Malformed /json/list, messages, replies and profiles: each is logged naming the
 * problem, the source goes on, and a stop signal ends it within its bound, exit 0. */
TEST(malformed_inspector)
{
    make_dir();
    char node[512], l1[300], l2[300], clog[300], h1[64], h2[64], out[300];
    find_node(node, sizeof(node));
    snprintf(l1, sizeof(l1), "%s/fake1.log", g_dir);
    snprintf(l2, sizeof(l2), "%s/fake2.log", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    pid_t f1, f2;
    snprintf(h1, sizeof(h1), "127.0.0.1:%d", start_fake(node, "good", l1, &f1));
    snprintf(h2, sizeof(h2), "127.0.0.1:%d", start_fake(node, "badlist", l2, &f2));
    const char *cargv[] = {CP_CONTPROF,    "v8", "--inspector", h1,   "--inspector", h2,
                           "--output-dir", out,  "--window",    "1s", NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(cp, clog, "heap profile: samples[0].nodeId 99 is no node", 20);
    kill(cp, SIGTERM);
    int64_t t0 = mono_ns();
    int cst = wait_exit(cp, 10);
    double took = (double)(mono_ns() - t0) / SEC;
    print_log(clog);
    printf("stopped in %.1f s\n", took);
    CHECK_EQ(cst, 0);
    CHECK(took < 6);
    static char buf[1 << 16];
    slurp(clog, buf, sizeof(buf));
    CHECK_CONTAINS(buf, "/json/list is not a JSON array");
    CHECK_CONTAINS(buf, "malformed message: not a JSON object");
    CHECK_CONTAINS(buf, "malformed JSON message: malformed JSON at byte 0");
    CHECK_CONTAINS(buf, "malformed worker message");
    CHECK_CONTAINS(buf, "attached to isolate fake");
    kill(f1, SIGTERM);
    kill(f2, SIGTERM);
    (void)wait_exit(f1, 5);
    (void)wait_exit(f2, 5);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * Through Kafka into the real contprofd: the labels and selectors */

/* The value of metric line name (with its labels) in contprofd's /metrics; -1 if absent. */
static long long metric_of(const char *url, const char *name)
{
    cp_http_result r;
    CHECK_EQ(cp_http_get(url, "/metrics", NULL, 5000, 1 << 22, &r, NULL), 0);
    const char *at = strstr((const char *)r.body.data, name);
    long long v = at ? atoll(at + strlen(name) + 1) : -1;
    cp_buf_close(&r.body);
    return v;
}

/* Occurrences of needle in hay. */
static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *at = strstr(hay, needle); at; at = strstr(at + 1, needle))
        n++;
    return n;
}

/* The windows a `contprof v8` log says were lost (one line per loss, naming its kinds). */
static int logged_lost(const char *log)
{
    return 3 * count_of(log, " every window from ") + count_of(log, " cpu window from ") +
           2 * count_of(log, " alloc and inuse window from ") +
           count_of(log, " alloc window from ") +
           (count_of(log, " inuse window from ") - count_of(log, " and inuse window from "));
}

/* `contprof ARGS...` against the daemon; stdout into out. */
static int cli(char *out, size_t cap, const char *const *args)
{
    return run_capture(CP_CONTPROF, args, NULL, NULL, out, cap);
}

/* Runs the CLI with args until its output holds needle (ingest is asynchronous: the first
 * consumer-group join takes seconds), at most 30 s; prints the last output. */
static void cli_until(char *out, size_t cap, const char *const *args, const char *needle)
{
    int found = 0;
    for (int i = 0; i < 300 && !found; i++) {
        CHECK_EQ(cli(out, cap, args), 0);
        found = strstr(out, needle) != NULL;
        if (!found) usleep(100000);
    }
    printf("%s\n", out);
    CHECK(found);
}

/* The windows reach contprofd through its embedded Kafka broker with the agent's envelope:
 * {runtime="v8",isolate="alpha"} selects alpha's isolate alone. */
TEST(node_to_contprofd)
{
    make_dir();
    char store[300], url[64];
    snprintf(store, sizeof(store), "%s/store", g_dir);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);
    run_node(5, "2s", url);
    static char out[1 << 16];
    const char *sel_alpha = "{service=\"nodetest\",runtime=\"v8\",isolate=\"alpha\"}";
    const char *top[] = {"top",      "--server", url,      "--type", "cpu",
                         "--select", sel_alpha,  "--from", "-10m",   NULL};
    /* ingest is asynchronous (the first consumer-group join takes seconds): poll */
    cli_until(out, sizeof(out), top, "hotAlpha");
    CHECK(!strstr(out, "buildBigTable")); /* main's, another isolate */
    const char *labels[] = {"labels", "--server", url, "runtime", "--from", "-10m", NULL};
    CHECK_EQ(cli(out, sizeof(out), labels), 0);
    CHECK_CONTAINS(out, "v8");
    const char *isos[] = {"labels", "--server", url, "isolate", "--from", "-10m", NULL};
    CHECK_EQ(cli(out, sizeof(out), isos), 0);
    printf("%s\n", out);
    CHECK_CONTAINS(out, "alpha");
    CHECK_CONTAINS(out, "beta");
    CHECK_CONTAINS(out, "main");
    /* every envelope its own (producer, sequence): none stored as a duplicate */
    cp_http_result r;
    CHECK_EQ(cp_http_get(url, "/metrics", NULL, 5000, 1 << 22, &r, NULL), 0);
    CHECK_CONTAINS((char *)r.body.data, "contprof_ingest_duplicates_total 0\n");
    cp_buf_close(&r.body);
    /* the workers' windows in progress when they ended: logged, and in /metrics through
     * main's last envelopes */
    static char log[1 << 16];
    char clog[300];
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    slurp(clog, log, sizeof(log));
    int lost = logged_lost(log);
    long long m = -1;
    for (int i = 0; i < 300 && m != lost; i++, usleep(100000))
        m = metric_of(url, "contprof_agent_dropped_windows_total{service=\"nodetest\"}");
    printf("windows lost: %d logged, %lld in /metrics\n", lost, m);
    CHECK(lost >= 6); /* each worker's cpu, alloc and inuse */
    CHECK_EQ(m, lost);
    CHECK(!strstr(log, "not reported in any envelope"));
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * workerd serving a TypeScript Worker (bundled and minified by esbuild with an inline
 * source map) with a Durable Object, into the real contprofd, killed and started again */

/* The file and first line of function fn in p; 0 if p has no such function. */
static int func_where(const cp_profile *p, const char *fn, const char **file, int64_t *line)
{
    for (uint32_t i = 0; i < p->functions.n; i++)
        if (!strcmp(cp_profile_str(p, p->functions.v[i].name), fn)) {
            *file = cp_profile_str(p, p->functions.v[i].filename);
            *line = p->functions.v[i].start_line;
            return 1;
        }
    return 0;
}

/* CPU of the samples whose outermost JS frame is the function at ts/worker.ts:line and
 * whose stack holds fn (NULL: any). */
static int64_t under_entry(const pset *s, int64_t line, const char *fn)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->f[i].kind, "cpu")) continue;
        const cp_profile *p = s->f[i].p;
        for (uint32_t k = 0; k < p->samples.n; k++) {
            const cp_sample *sm = &p->samples.v[k];
            if (!sm->nlocs) continue;
            const cp_location *l = &p->locations.v[p->stack.v[sm->loc_off + sm->nlocs - 1] - 1];
            const cp_line *ln = &p->lines.v[l->line_off];
            if (!l->nlines || ln->line != line) continue;
            int hit = fn == NULL;
            for (uint32_t j = 0; j < sm->nlocs && !hit; j++)
                hit = loc_has_func(p, p->stack.v[sm->loc_off + j], fn);
            if (hit) sum += cp_profile_sample_values(p, k)[1];
        }
    }
    return sum;
}

static pid_t start_typed(const char *wd, int pt, int pi, const char *log)
{
    char config[512], st[64], ia[64], base[64];
    snprintf(config, sizeof(config), "%s/tests/v8/typed.capnp", bindir());
    snprintf(st, sizeof(st), "t=127.0.0.1:%d", pt);
    snprintf(ia, sizeof(ia), "--inspector-addr=127.0.0.1:%d", pi);
    const char *argv[] = {wd, "serve", config, "--socket-addr", st, ia, NULL};
    pid_t p = spawn(argv, log);
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", pi);
    for (int64_t end = mono_ns() + 15 * SEC; mono_ns() < end; usleep(50000)) {
        cp_http_result r;
        if (cp_http_get(base, "/json/list", NULL, 1000, 1 << 20, &r, NULL) == 0) {
            int ok = r.status == 200 && strstr((char *)r.body.data, "worker typed");
            cp_buf_close(&r.body);
            if (ok) return p;
        }
    }
    print_log(log);
    CHECK(0);
    return p;
}

/* Requests to the Worker (/) and to its Durable Object (/do), in turn, for seconds. */
static void load_typed(int pt, int seconds)
{
    char a[64];
    snprintf(a, sizeof(a), "http://127.0.0.1:%d", pt);
    int n = 0;
    for (int64_t end = mono_ns() + seconds * SEC; mono_ns() < end; n++) {
        cp_http_result r;
        if (cp_http_get(a, n % 2 ? "/do" : "/", NULL, 5000, 1 << 20, &r, NULL) == 0)
            cp_buf_close(&r.body);
    }
}

/* The TS Worker's frames read as its TypeScript functions in ts/worker.ts at their lines,
 * at their 3:1 ratio; the Durable Object's work is told apart by its entry (Counter's
 * fetch, line 30); workerd killed mid-window and started again: the lost windows are
 * logged, and the same number reaches contprofd's /metrics through the next envelope. */
TEST(workerd_typescript)
{
    make_dir();
    char cmd[1024], wd[512], out[300], clog[300], wlog[300], hostport[64], store[300], url[64];
    snprintf(cmd, sizeof(cmd), "sh %s/install.sh %s", CP_V8_TESTS, bindir());
    CHECK(system(cmd) == 0);
    snprintf(wd, sizeof(wd), "%s/tests/v8/node_modules/@cloudflare/workerd-linux-64/bin/workerd",
             bindir());
    snprintf(store, sizeof(store), "%s/store", g_dir);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);
    int pt = free_port(), pi = free_port();
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(wlog, sizeof(wlog), "%s/workerd.log", g_dir);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", pi);
    pid_t w = start_typed(wd, pt, pi, wlog);
    const char *cargv[] = {CP_CONTPROF, "v8",       "--inspector", hostport,   "--output-dir",
                           out,         "--server", url,           "--window", "2s",
                           "--service", "tstest",   NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(cp, clog, "source map read", 10);
    (void)wait_for_log(cp, clog, "attached to isolate typed", 10);
    load_typed(pt, 5);
    kill(w, SIGKILL); /* mid-window: that window cannot be taken */
    CHECK(wait_exit(w, 10) >= 0);
    w = start_typed(wd, pt, pi, wlog);
    load_typed(pt, 4);
    kill(cp, SIGTERM);
    int cst = wait_exit(cp, 20);
    kill(w, SIGTERM);
    (void)wait_exit(w, 10);
    print_log(clog);
    CHECK_EQ(cst, 0);

    pset s;
    pset_load(out, &s);
    const char *file = NULL;
    int64_t line = 0;
    int found = 0;
    for (int i = 0; i < s.n && !found; i++)
        if (!strcmp(s.f[i].kind, "cpu")) found = func_where(s.f[i].p, "tsMain", &file, &line);
    CHECK(found);
    printf("tsMain: %s:%lld\n", file, (long long)line);
    CHECK(!strcmp(file, "ts/worker.ts"));
    CHECK_EQ(line, 15);
    double r = ratio(&s, "typed", "tsMain", "tsSide");
    CHECK(r > 2.5 && r < 3.6); /* 2.72-2.96 in three runs beside two CPU burners */
    /* the Durable Object: its work under Counter's fetch (line 30), none of the Worker's */
    int64_t dobj = under_entry(&s, 30, "counterWork"), mixed = under_entry(&s, 30, "tsMain");
    int64_t worker = under_entry(&s, 37, "tsMain"), wrong = under_entry(&s, 37, "counterWork");
    printf("Counter.fetch: counterWork %lld ns, tsMain %lld ns; fetch: tsMain %lld ns, "
           "counterWork %lld ns\n",
           (long long)dobj, (long long)mixed, (long long)worker, (long long)wrong);
    CHECK(dobj > 0 && worker > 0);
    CHECK_EQ(mixed, 0);
    CHECK_EQ(wrong, 0);
    /* the DO's method is named for its class (the map holds the TS source) */
    int64_t named = sum_kind(&s, "cpu", "typed", "Counter.fetch", 1);
    printf("Counter.fetch in all: %lld ns\n", (long long)named);
    CHECK(named >= dobj);
    CHECK(func_total(s.f[0].p, "Worker.fetch", 1) == 0);
    pset_free(&s);

    /* the lost windows: each logged with its isolate and window, the same count in
     * /metrics (reported by the restarted isolate's first envelope) */
    static char log[1 << 16];
    slurp(clog, log, sizeof(log));
    int lost = logged_lost(log);
    CHECK(count_of(log, "isolate typed: every window from ") >= 1);
    CHECK(!strstr(log, "not reported in any envelope"));
    long long m = -1;
    for (int i = 0; i < 300 && m != lost; i++, usleep(100000))
        m = metric_of(url, "contprof_agent_dropped_windows_total{service=\"tstest\"}");
    printf("windows lost: %d logged, %lld in /metrics\n", lost, m);
    CHECK_EQ(m, lost);
    /* the TS names through Kafka and the store */
    static char top_out[1 << 16];
    const char *top[] = {"top",
                         "--server",
                         url,
                         "--type",
                         "cpu",
                         "--select",
                         "{service=\"tstest\",runtime=\"v8\",isolate=\"typed\"}",
                         "--from",
                         "-10m",
                         NULL};
    found = 0;
    for (int i = 0; i < 300 && !found; i++) {
        CHECK_EQ(cli(top_out, sizeof(top_out), top), 0);
        found = strstr(top_out, "tsMain") && strstr(top_out, "counterWork");
        if (!found) usleep(100000);
    }
    printf("%s\n", top_out);
    CHECK(found);
    /* the Durable Object class alone: focus on its methods */
    const char *top_do[] = {"top",
                            "--server",
                            url,
                            "--type",
                            "cpu",
                            "--select",
                            "{service=\"tstest\",isolate=\"typed\"}",
                            "--focus",
                            "^Counter\\.",
                            "--from",
                            "-10m",
                            NULL};
    CHECK_EQ(cli(top_out, sizeof(top_out), top_do), 0);
    printf("%s\n", top_out);
    CHECK_CONTAINS(top_out, "counterWork");
    CHECK(!strstr(top_out, "tsMain"));
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * Source maps at query time: the TypeScript Worker bundled by esbuild with its map in a
 * file (smap/worker.js, smap/worker.js.map), run by node under `contprof v8
 * --no-source-maps`, stored under its minified names; the map uploaded afterwards names
 * those stored windows. */

/* The cpu profile of {service="smaptest"} over the last 10 minutes, from contprofd. */
static cp_profile *smap_profile(const char *url)
{
    cp_buf pq = {0};
    CHECK(cp_buf_printf(&pq, "/api/v1/profile?type=cpu&from=-10m&to=now&select=") == 0);
    CHECK(cp_url_encode(&pq, "{service=\"smaptest\"}") == 0);
    CHECK(cp_buf_append(&pq, "", 1) == 0);
    cp_http_result r;
    CHECK_EQ(cp_http_get(url, (const char *)pq.data, NULL, 10000, 1 << 26, &r, NULL), 0);
    cp_buf_close(&pq);
    CHECK_EQ(r.status, 200);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_pprof_decode(r.body.data, r.body.len, NULL, &p, &err), 0);
    cp_buf_close(&r.body);
    return p;
}

/* Whether any function of p has a file that ends in suffix. */
static int has_file(const cp_profile *p, const char *suffix)
{
    size_t sl = strlen(suffix);
    for (uint32_t i = 0; i < p->functions.n; i++) {
        const char *f = cp_profile_str(p, p->functions.v[i].filename);
        size_t fl = strlen(f);
        if (fl >= sl && !strcmp(f + fl - sl, suffix)) return 1;
    }
    return 0;
}

TEST(node_source_map_uploaded_after_the_windows)
{
    make_dir();
    char cmd[1024], store[300], url[64], node[512], inspect[64], hostport[64], script[512],
        bundle[512], map[512], nlog[300], clog[300], bad[300];
    snprintf(cmd, sizeof(cmd), "sh %s/install.sh %s", CP_V8_TESTS, bindir());
    CHECK(system(cmd) == 0);
    snprintf(store, sizeof(store), "%s/store", g_dir);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);

    /* node runs the bundle for 8 s; the source reads no map (--no-source-maps) */
    find_node(node, sizeof(node));
    int port = free_port();
    snprintf(inspect, sizeof(inspect), "--inspect-brk=127.0.0.1:%d", port);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
    snprintf(script, sizeof(script), "%s/ts_driver.mjs", CP_V8_TESTS);
    snprintf(bundle, sizeof(bundle), "%s/tests/v8/smap/worker.js", bindir());
    snprintf(map, sizeof(map), "%s/tests/v8/smap/worker.js.map", bindir());
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    const char *nargv[] = {node, "--no-warnings", inspect, script, bundle, "8", NULL};
    pid_t np = spawn(nargv, nlog);
    (void)wait_for_log(np, nlog, "Debugger listening", 10);
    const char *cargv[] = {CP_CONTPROF, "v8",       "--inspector",      hostport,
                           "--server",  url,        "--window",         "2s",
                           "--service", "smaptest", "--no-source-maps", "--exit-when-gone",
                           NULL};
    pid_t cp = spawn(cargv, clog);
    int cst = wait_exit(cp, 60), nst = wait_exit(np, 10);
    print_log(clog);
    if (nst) print_log(nlog);
    CHECK_EQ(cst, 0);
    CHECK_EQ(nst, 0);

    /* stored under the bundle's names: ingest is asynchronous, so poll */
    cp_profile *p = NULL;
    for (int i = 0; i < 300; i++) {
        p = smap_profile(url);
        if (has_file(p, "/smap/worker.js") && cp_profile_total(p, 1) > 0) break;
        cp_profile_destroy(p);
        p = NULL;
        usleep(100000);
    }
    CHECK(p != NULL);
    const char *file = NULL;
    int64_t line = 0;
    CHECK(!func_where(p, "tsMain", &file, &line));
    CHECK(!has_file(p, "ts/worker.ts"));
    cp_profile_destroy(p);

    /* a bad map: 400 naming the problem, from the API and through the CLI */
    static const char badmap[] = "{\"version\":2,\"sources\":[],\"mappings\":\"\"}";
    cp_http_result r;
    CHECK_EQ(cp_http_post(url, "/api/v1/symbols?name=bad.js.map", NULL, badmap, sizeof(badmap) - 1,
                          10000, 1 << 20, &r, NULL),
             0);
    CHECK(cp_buf_append(&r.body, "", 1) == 0);
    printf("bad map: %d %s", r.status, (char *)r.body.data);
    CHECK_EQ(r.status, 400);
    CHECK_CONTAINS((char *)r.body.data, "{\"error\":");
    CHECK_CONTAINS((char *)r.body.data, "version is not 3");
    cp_buf_close(&r.body);
    snprintf(bad, sizeof(bad), "%s/bad.js.map", g_dir);
    FILE *bf = fopen(bad, "w");
    CHECK(bf && fputs(badmap, bf) >= 0 && fclose(bf) == 0);
    static char out[1 << 16];
    const char *badup[] = {"symbols", "upload", "--server", url, bad, NULL};
    int st = cli(out, sizeof(out), badup); /* a wait status */
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);

    /* the upload, then the same stored windows read as the TypeScript */
    const char *up[] = {"symbols", "upload", "--server", url, map, NULL};
    CHECK_EQ(cli(out, sizeof(out), up), 0);
    printf("%s", out);
    CHECK_CONTAINS(out, "\"script\":\"worker.js\"");
    p = smap_profile(url);
    CHECK(func_where(p, "tsMain", &file, &line));
    printf("tsMain: %s:%lld\n", file, (long long)line);
    CHECK(strstr(file, "ts/worker.ts") != NULL);
    CHECK_EQ(line, 15);
    CHECK(func_where(p, "tsSide", &file, &line));
    CHECK_EQ(line, 19);
    CHECK(func_where(p, "spin", &file, &line));
    CHECK_EQ(line, 9);
    cp_profile_destroy(p);
    const char *top[] = {
        "top",    "--server", url, "--type", "cpu", "--select", "{service=\"smaptest\"}",
        "--from", "-10m",     NULL};
    CHECK_EQ(cli(out, sizeof(out), top), 0);
    printf("%s\n", out);
    CHECK_CONTAINS(out, "tsMain");
    CHECK_CONTAINS(out, "tsSide");
    CHECK_CONTAINS(out, "spin");
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * A capture (issue 29) of one named worker through the real contprofd: the source hears
 * it on the control topic and runs that isolate's profiler at 1 kHz for the capture */

/* One window the source wrote: isolate, cpu or not, capture or not, time, totals. */
typedef struct cwin {
    char iso[64];
    int cpu, capture;
    int64_t t0, t1, samples, cpu_ns, period;
    int alpha_fn, beta_fn;
} cwin;

static int load_cwins(const char *dir, cwin *w, int max)
{
    DIR *d = opendir(dir);
    CHECK(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL && n < max) {
        if (!strstr(e->d_name, ".pb.gz") || strstr(e->d_name, ".tmp")) continue;
        char name[256], *tok[9], *save;
        snprintf(name, sizeof(name), "%s", e->d_name);
        int nt = 0;
        for (char *t = strtok_r(name, ".", &save); t && nt < 9; t = strtok_r(NULL, ".", &save))
            tok[nt++] = t;
        CHECK(nt == 7 || nt == 8); /* SERVICE.PID-S.SEQ.KIND.ISO[.capture-ID].pb.gz */
        cwin *x = &w[n++];
        memset(x, 0, sizeof(*x));
        snprintf(x->iso, sizeof(x->iso), "%s", tok[4]);
        x->cpu = !strcmp(tok[3], "cpu");
        x->capture = nt == 8 && !strncmp(tok[5], "capture-", 8);
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        cp_buf b = {0};
        CHECK(cp_read_file(path, &b, NULL) == 0);
        cp_profile *p = NULL;
        CHECK(cp_pprof_decode(b.data, b.len, NULL, &p, NULL) == 0);
        cp_buf_close(&b);
        x->t0 = p->time_nanos;
        x->t1 = p->time_nanos + p->duration_nanos;
        x->period = p->period;
        if (x->cpu) {
            x->samples = cp_profile_total(p, 0);
            x->cpu_ns = cp_profile_total(p, 1);
            x->alpha_fn = func_total(p, "alphaOnly", 0) > 0;
            x->beta_fn = func_total(p, "betaOnly", 0) > 0;
        }
        cp_profile_destroy(p);
    }
    closedir(d);
    return n;
}

/* Always-on cpu windows of iso inside [from, to): CPU ns and samples per wall second. */
static void rates(const cwin *w, int n, const char *iso, int64_t from, int64_t to, double *cpu,
                  double *samples)
{
    int64_t wall = 0, c = 0, sm = 0;
    for (int i = 0; i < n; i++) {
        if (!w[i].cpu || w[i].capture || strcmp(w[i].iso, iso)) continue;
        if (w[i].t0 < from || w[i].t1 > to) continue;
        wall += w[i].t1 - w[i].t0;
        c += w[i].cpu_ns;
        sm += w[i].samples;
        /* the always-on rate whatever runs; the CPU its thread's (one thread: at most the
         * window's wall time) */
        CHECK_EQ(w[i].period, 10000000);
        CHECK(w[i].cpu_ns <= (w[i].t1 - w[i].t0) * 21 / 20);
    }
    CHECK(wall > 0);
    *cpu = (double)c / (double)wall;
    *samples = (double)sm * 1e9 / (double)wall;
    printf("%s always-on [%lld, %lld): %.3f CPU s/s, %.1f samples/s over %.1f s\n", iso,
           (long long)from, (long long)to, *cpu, *samples, (double)wall / 1e9);
}

TEST(node_capture)
{
    make_dir();
    char store[300], url[64], out[300], clog[300], nlog[300], capfile[300];
    snprintf(store, sizeof(store), "%s/store", g_dir);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(capfile, sizeof(capfile), "%s/capture.pb.gz", g_dir);
    char allocfile[300];
    snprintf(allocfile, sizeof(allocfile), "%s/capture-alloc.pb.gz", g_dir);
    /* contprofd's defaults: a 3 s capture of one isolate gets its budget for 3 s (20 permille
     * over 5 min: 1000 permille), enough for V8's ~100 us a sample at 1 kHz (before: 200 Hz,
     * exit 1, unless captures.max_overhead_permille = 100) */
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);

    char node[512], inspect[64], hostport[64], script[512];
    find_node(node, sizeof(node));
    int port = free_port();
    snprintf(inspect, sizeof(inspect), "--inspect-brk=127.0.0.1:%d", port);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
    snprintf(script, sizeof(script), "%s/capture_workers.js", CP_V8_TESTS);
    const char *nargv[] = {node, inspect, script, "24", NULL};
    pid_t np = spawn(nargv, nlog);
    (void)wait_for_log(np, nlog, "Debugger listening", 10);
    const char *cargv[] = {
        CP_CONTPROF, "v8", "--inspector", hostport,  "--server",         url, "--output-dir", out,
        "--window",  "1s", "--service",   "nodecap", "--exit-when-gone", NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(cp, clog, "attached to isolate alpha", 20);
    (void)wait_for_log(cp, clog, "attached to isolate beta", 20);
    sleep(4); /* always-on windows before the capture: the rates to compare with */
    static char txt[1 << 16];
    const char *cap[] = {
        "capture", "--server", url,          "--select", "{runtime=\"v8\",isolate=\"alpha\"}",
        "--type",  "cpu",      "--duration", "3s",       "--hz",
        "1000",    "-o",       capfile,      NULL};
    int crc = cli(txt, sizeof(txt), cap);
    printf("contprof capture: exit %d\n%s\n", crc, txt);
    /* alloc: V8's heap sampler is not restarted; the capture runs at --heap-interval and
     * says so, which the CLI reports as not the rate asked: exit 1 with the reason */
    static char txt2[1 << 16];
    const char *acap[] = {
        "capture", "--server", url,          "--select", "{runtime=\"v8\",isolate=\"alpha\"}",
        "--type",  "alloc",    "--duration", "2s",       "--alloc-rate",
        "65536",   "-o",       allocfile,    NULL};
    int arc = cli(txt2, sizeof(txt2), acap);
    printf("contprof capture --type alloc: exit %d\n%s\n", arc, txt2);
    int cst = wait_exit(cp, 60), nst = wait_exit(np, 20);
    print_log(clog);
    CHECK_EQ(crc, 0); /* it ran on alpha for the whole 3 s at 1000 Hz */
    CHECK_EQ(cst, 0);
    CHECK_EQ(nst, 0);
    CHECK_CONTAINS(txt, "alpha");
    /* the answer states the capture's measured cost on alpha (collector/v8/README.md
     * "Cost"): V8's sampler at 1 ms against 10 ms, > 0, below the rate plan's 100 us a
     * sample (100 ms/s) and below the capture's budget (1000 permille for 3 s at the
     * default captures.max_overhead_permille) */
    const char *cost = strstr(txt, "cost on ");
    CHECK(cost != NULL);
    double ms = 0, permille = 0;
    const char *colon = strstr(cost, "}: ");
    CHECK(colon != NULL);
    CHECK_EQ(sscanf(colon, "}: %lf ms of CPU per second, %lf permille", &ms, &permille), 2);
    printf("capture's cost on alpha: %.1f ms/s, %.1f permille\n", ms, permille);
    CHECK(ms > 0 && ms < 100);
    CHECK(permille > 0 && permille < 1000);
    CHECK(WIFEXITED(arc) && WEXITSTATUS(arc) == 1); /* the reason goes to its stderr */
    CHECK_CONTAINS(txt2, "(asked 65536, running at 524288)");

    /* the merged capture contprofd wrote: alpha's function alone */
    cp_buf b = {0};
    cp_profile *p = NULL;
    CHECK_EQ(cp_read_file(capfile, &b, NULL), 0);
    CHECK_EQ(cp_pprof_decode(b.data, b.len, NULL, &p, NULL), 0);
    cp_buf_close(&b);
    printf("capture: %lld samples, alphaOnly %lld, betaOnly %lld\n",
           (long long)cp_profile_total(p, 0), (long long)func_total(p, "alphaOnly", 0),
           (long long)func_total(p, "betaOnly", 0));
    CHECK(func_total(p, "alphaOnly", 0) > 0);
    CHECK_EQ(func_total(p, "betaOnly", 0), 0);
    cp_profile_destroy(p);

    /* the source's own windows */
    static cwin w[4096];
    int n = load_cwins(out, w, 4096);
    int64_t c0 = INT64_MAX, c1 = 0, csamples = 0;
    int ncap = 0, nalloc = 0;
    for (int i = 0; i < n; i++) {
        if (!w[i].capture) continue;
        CHECK(!strcmp(w[i].iso, "alpha")); /* only the matched isolate */
        if (!w[i].cpu) {
            nalloc++; /* the alloc capture's */
            continue;
        }
        ncap++;
        printf("capture window %lld + %lld ms: %lld samples\n", (long long)w[i].t0,
               (long long)((w[i].t1 - w[i].t0) / 1000000), (long long)w[i].samples);
        CHECK_EQ(w[i].period, 1000000); /* 1 ms */
        /* ~1 s windows (cut every 0.9 s; later on a loaded machine: the bound is loose) */
        CHECK(w[i].t1 - w[i].t0 <= 2000000000LL);
        CHECK(!w[i].beta_fn);
        if (w[i].t0 < c0) c0 = w[i].t0;
        if (w[i].t1 > c1) c1 = w[i].t1;
        csamples += w[i].samples;
    }
    CHECK(ncap >= 2);
    CHECK(nalloc >= 1);
    double capdur = (double)(c1 - c0) / 1e9;
    printf("capture windows: %d over %.2f s, %lld samples\n", ncap, capdur, (long long)csamples);
    CHECK(capdur > 0.9 && capdur < 3.6); /* heard within 2 s of its start, ends at its end */
    /* alpha's CPU per second, measured at 100 Hz before the capture, against the capture's
     * samples: ~1000 a CPU-second */
    int64_t first = INT64_MAX;
    for (int i = 0; i < n; i++)
        if (!w[i].capture && w[i].cpu && !strcmp(w[i].iso, "alpha") && w[i].t0 < first)
            first = w[i].t0;
    double a_cpu0, a_sm0, a_cpu1, a_sm1, b_cpu0, b_sm0, b_cpu1, b_sm1;
    rates(w, n, "alpha", first + 1000000000LL, c0, &a_cpu0, &a_sm0);
    rates(w, n, "alpha", c0, c1 + 1100000000LL, &a_cpu1, &a_sm1);
    rates(w, n, "beta", first + 1000000000LL, c0, &b_cpu0, &b_sm0);
    rates(w, n, "beta", c0, c1 + 1100000000LL, &b_cpu1, &b_sm1);
    /* over alpha's CPU during the capture (its always-on windows then): the machine may give
     * it more or less CPU a second than before */
    CHECK(a_cpu0 > 0.05 && a_cpu1 > 0.05);
    double per_cpu_s = (double)csamples / (a_cpu1 * capdur);
    printf("capture: %.0f samples per CPU-second of alpha (alpha %.3f CPU s/s during it, %.3f "
           "before)\n",
           per_cpu_s, a_cpu1, a_cpu0);
    CHECK(per_cpu_s > 300 && per_cpu_s < 2000); /* V8 falls short of 1 ms under load */
    /* beta's windows keep their rate; alpha's always-on CPU is not inflated by the capture:
     * it moves as beta's does (the machine moves both: in CI another test ending doubled
     * both isolates' CPU a second, 0.42 -> 0.94 and 0.42 -> 0.80) */
    CHECK(b_sm1 > 0.5 * b_sm0 && b_sm1 < 2.0 * b_sm0);
    CHECK(b_cpu0 > 0.05 && b_cpu1 > 0.05);
    double a_rel = (a_cpu1 / a_cpu0) / (b_cpu1 / b_cpu0);
    printf("alpha's always-on CPU during the capture against before, over beta's: %.3f\n", a_rel);
    CHECK(a_rel > 0.5 && a_rel < 2.0);
    CHECK(a_sm1 < 150); /* ~100 samples a CPU-second at most: not the capture's 1000 */
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    remove_dir();
}

/* A contprofd with tenants' tokens stores V8 windows only signed with their tenant's
 * token: contprof v8 --tenant --token asks the server with the token and signs every
 * envelope; nothing goes to the dead-letter queue. */
TEST(node_signed_for_its_tenant)
{
    make_dir();
    char store[300], url[64], conf[300];
    snprintf(store, sizeof(store), "%s/store", g_dir);
    snprintf(conf, sizeof(conf), "%s/tokens.conf", g_dir);
    FILE *f = fopen(conf, "w");
    CHECK(f);
    fprintf(f, "token.payments = payments-secret-1\ntoken.other = other-secret-22\n");
    fclose(f);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", "--config", conf, NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);
    g_tenant = "payments";
    g_token = "payments-secret-1";
    run_node(4, "1s", url);
    g_tenant = g_token = NULL;
    static char out[1 << 16];
    const char *top[] = {"top",
                         "--server",
                         url,
                         "--token",
                         "payments-secret-1",
                         "--type",
                         "cpu",
                         "--select",
                         "{isolate=\"alpha\"}",
                         "--from",
                         "-10m",
                         NULL};
    cli_until(out, sizeof(out), top, "hotAlpha");
    cp_http_result r;
    CHECK_EQ(cp_http_get(url, "/metrics", "payments-secret-1", 5000, 1 << 22, &r, NULL), 0);
    CHECK_CONTAINS((char *)r.body.data, "contprof_ingest_dlq_total{reason=\"tenant\"} 0\n");
    cp_buf_close(&r.body);
    /* the other tenant sees none of it */
    const char *other[] = {"top",
                           "--server",
                           url,
                           "--token",
                           "other-secret-22",
                           "--type",
                           "cpu",
                           "--select",
                           "{isolate=\"alpha\"}",
                           "--from",
                           "-10m",
                           NULL};
    CHECK_EQ(cli(out, sizeof(out), other), 0);
    CHECK(!strstr(out, "hotAlpha"));
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    remove_dir();
}

/* contprofd restarted while contprof v8 sends through its relay: what the source sent
 * before the stop is stored (the stop reads the embedded broker to its end), what it made
 * meanwhile waits in the relay's spool and is drained by the next contprofd. The store then
 * holds every window the source wrote to its files, to the nanosecond. */
TEST(node_through_a_contprofd_restart_loses_nothing)
{
    make_dir();
    char store[300], url[64], log1[600], log2[300], http[64], out[300];
    snprintf(store, sizeof(store), "%s/store", g_dir);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    (void)wait_for_log(d.pid, d.log, "relay for this host", 30);
    snprintf(log1, sizeof(log1), "%s", d.log);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);
    g_files = 1;
    pid_t np, cp;
    node_start(8, "1s", url, &np, &cp);
    sleep(3);
    int port = d.port;
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    sleep(1);
    snprintf(http, sizeof(http), "127.0.0.1:%d", port);
    snprintf(log2, sizeof(log2), "%s/contprofd-2.log", g_dir);
    const char *dargs2[] = {"--data", store, "--http", http, NULL};
    start_daemon_log(&d, log2, dargs2, 30);
    CHECK_EQ(d.port, port);
    node_finish(8, np, cp);
    g_files = 0;
    pset s;
    snprintf(out, sizeof(out), "%s/out", g_dir);
    pset_load(out, &s);
    int64_t want = sum_kind(&s, "cpu", "alpha", NULL, 1);
    int nwin = 0;
    for (int i = 0; i < s.n; i++)
        nwin += !strcmp(s.f[i].kind, "cpu") && !strcmp(s.f[i].iso, "alpha");
    int64_t got = -1;
    /* up to 90 s: windows spooled while contprofd was down come back as its relay drains
     * the spool, slow under ASan (one 1 s window was still missing after 30 s once) */
    for (int i = 0; i < 900 && got != want; i++) {
        cp_buf pq = {0};
        CHECK(cp_buf_printf(&pq, "/api/v1/profile?type=cpu&from=-10m&to=now&select=") == 0);
        CHECK(cp_url_encode(&pq, "{service=\"nodetest\",isolate=\"alpha\"}") == 0);
        CHECK(cp_buf_append(&pq, "", 1) == 0);
        cp_http_result r;
        CHECK_EQ(cp_http_get(url, (const char *)pq.data, NULL, 10000, 1 << 26, &r, NULL), 0);
        cp_buf_close(&pq);
        if (r.status == 200) {
            cp_profile *p = NULL;
            CHECK_EQ(cp_pprof_decode(r.body.data, r.body.len, NULL, &p, NULL), 0);
            got = func_total(p, NULL, 1);
            cp_profile_destroy(p);
        }
        cp_buf_close(&r.body);
        if (got != want) usleep(100000);
    }
    printf("alpha: %d cpu windows written, %lld ns in the files, %lld ns stored\n", nwin,
           (long long)want, (long long)got);
    CHECK(nwin >= 3); /* windows before, during and after the restart */
    /* nothing went to the dead-letter topic (a window whose types change its series' was) */
    cp_http_result mr;
    CHECK_EQ(cp_http_get(url, "/metrics", NULL, 5000, 1 << 22, &mr, NULL), 0);
    CHECK(cp_buf_append(&mr.body, "", 1) == 0);
    int dlq = 0;
    for (const char *m = (const char *)mr.body.data;
         (m = strstr(m, "\ncontprof_ingest_dlq_total{")); m++)
        dlq += strtol(strchr(m, '}') + 1, NULL, 10) != 0;
    cp_buf_close(&mr.body);
    if (got != want || dlq) { /* where it went: both daemons' logs */
        print_log(log1);
        print_log(log2);
    }
    CHECK_EQ(dlq, 0);
    CHECK_EQ(got, want);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
    pset_free(&s);
    remove_dir();
}

/* A script node loads after contprof v8 attached (its Debugger domain is off between
 * reads): the window that first has its frames reads the scripts again, so its minified
 * functions are named from its inline source map, in that window already. */
TEST(node_script_loaded_later_is_source_mapped)
{
    make_dir();
    char cmd[1024], script[600], out[300], clog[300];
    snprintf(cmd, sizeof(cmd), "sh %s/install.sh %s", CP_V8_TESTS, bindir());
    CHECK(system(cmd) == 0);
    snprintf(script, sizeof(script), "%s/tests/v8/late/main.js", bindir());
    g_script = script;
    g_files = 1;
    pid_t np, cp;
    node_start(4, "1s", NULL, &np, &cp);
    node_finish(4, np, cp);
    g_script = NULL;
    g_files = 0;
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    static char log[1 << 16];
    slurp(clog, log, sizeof(log));
    const char *att = strstr(log, "attached to isolate"),
               *read = strstr(log, "late.js: source map read");
    CHECK(att && read && read > att); /* read after the attach: on demand */
    pset s;
    snprintf(out, sizeof(out), "%s/out", g_dir);
    pset_load(out, &s);
    int64_t hot = 0;
    int named = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].kind, "cpu")) continue;
        const char *file;
        int64_t line;
        if (func_where(s.f[i].p, "lateHotLoop", &file, &line)) {
            CHECK(strstr(file, "ts/late.ts"));
            named++;
        }
        for (uint32_t k = 0; k < s.f[i].p->functions.n; k++) /* no frame left unmapped */
            CHECK(!strstr(cp_profile_str(s.f[i].p, s.f[i].p->functions.v[k].filename), "late.js"));
        hot += func_total(s.f[i].p, "lateHotLoop", 1);
    }
    printf("lateHotLoop: in %d cpu windows, %lld ns\n", named, (long long)hot);
    CHECK(named >= 1 && hot > 0);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * CPU seconds under contention: two shell loops compete with node for the 2 CPUs */

/* utime + stime of pid from /proc/PID/stat, in ns. */
static int64_t proc_cpu_ns(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    slurp(path, buf, sizeof(buf));
    const char *rp = strrchr(buf, ')');
    CHECK(rp);
    unsigned long long ut = 0, st = 0;
    CHECK(sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2);
    return (int64_t)(ut + st) * (1000000000 / sysconf(_SC_CLK_TCK));
}

/* node's main thread burns for 6 s beside two CPU-bound shell loops; once it idles, its
 * CPU in /proc is final: the cpu windows of its isolate add up to what it used after its
 * start-up within 10% (a V8 sample's interval counted as CPU read 2.5-2.7x it here: time
 * waiting for a CPU). */
TEST(node_cpu_under_competitors)
{
    make_dir();
    char node[512], inspect[64], hostport[64], script[512], out[300], nlog[300], clog[300];
    find_node(node, sizeof(node));
    int port = free_port();
    snprintf(inspect, sizeof(inspect), "--inspect-brk=127.0.0.1:%d", port);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
    snprintf(script, sizeof(script), "%s/cpu_burn.js", CP_V8_TESTS);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    const char *burner[] = {"/bin/sh", "-c", "while :; do :; done", NULL};
    pid_t b1 = spawn(burner, "/dev/null"), b2 = spawn(burner, "/dev/null");
    const char *nargv[] = {node, inspect, script, "6", "3", NULL};
    pid_t np = spawn(nargv, nlog);
    (void)wait_for_log(np, nlog, "Debugger listening", 10);
    usleep(200000);
    int64_t boot = proc_cpu_ns(np); /* node's start-up, before the script (held at -brk) */
    const char *cargv[] = {CP_CONTPROF,        "v8",           "--inspector", hostport,
                           "--window",         "1s",           "--service",   "cputest",
                           "--exit-when-gone", "--output-dir", out,           NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(np, nlog, "burned", 30);
    usleep(300000);
    int64_t used = proc_cpu_ns(np) - boot;
    kill(b1, SIGKILL);
    kill(b2, SIGKILL);
    (void)wait_exit(b1, 5);
    (void)wait_exit(b2, 5);
    int cst = wait_exit(cp, 30), nst = wait_exit(np, 10);
    print_log(clog);
    CHECK_EQ(cst, 0);
    CHECK_EQ(nst, 0);
    pset s;
    pset_load(out, &s);
    int64_t stored = sum_kind(&s, "cpu", "main", NULL, 1);
    printf("node's CPU from /proc: %lld ms after %lld ms of start-up; its isolate's cpu "
           "windows: %lld ms (%.3fx)\n",
           (long long)(used / 1000000), (long long)(boot / 1000000), (long long)(stored / 1000000),
           used ? (double)stored / (double)used : 0.0);
    CHECK(used > 500 * 1000000LL); /* it did burn */
    CHECK(stored > used * 0.9 && stored < used * 1.1);
    pset_free(&s);
    remove_dir();
}

/* The inuse estimate (README "Heap"): node's main thread keeps ~50 MB of records at
 * start-up (tests/v8/keep.js), throwing as much away, and prints heapUsed's growth between
 * two full GCs around it. The last inuse window's bytes under keepAtStartup are within 15%
 * of that growth. Sampled at 64 KiB: ~800 samples, a relative error of ~3.5% (1 /
 * sqrt(samples)); at the default 512 KiB one run's ~100 samples spread ±10%. Failed while
 * V8's already unbiased sizes were unbiased again (1.58x). */
TEST(node_inuse_matches_retained_growth)
{
    make_dir();
    char script[512], nlog[300], out[300];
    snprintf(script, sizeof(script), "%s/keep.js", CP_V8_TESTS);
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    g_script = script;
    g_heap_interval = "65536";
    run_node(4, "1s", NULL);
    g_script = NULL;
    g_heap_interval = NULL;
    static char log[4096];
    slurp(nlog, log, sizeof(log));
    const char *k = strstr(log, "kept ");
    CHECK(k != NULL);
    long long growth = atoll(k + 5);
    pset s;
    pset_load(out, &s);
    /* the window before the last: node's last one is taken as it exits, its module
     * scope already let go */
    int64_t inuse = -1, objects = 0, last = -1, last_objects = 0;
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.f[i].kind, "inuse") && !strcmp(s.f[i].iso, "main")) {
            inuse = last;
            objects = last_objects;
            last = func_total(s.f[i].p, "keepAtStartup", 1);
            last_objects = func_total(s.f[i].p, "keepAtStartup", 0);
        }
    printf(
        "heapUsed grew %lld bytes; the inuse window before the last holds %lld bytes (%.3fx), %lld "
        "objects under keepAtStartup\n",
        growth, (long long)inuse, growth ? (double)inuse / (double)growth : 0.0,
        (long long)objects);
    CHECK(growth > 40 << 20);
    CHECK(inuse > growth * 0.85 && inuse < growth * 1.15);
    /* 150,000 records of 8 objects and a share of the Map and arrays: ~1.2M objects */
    CHECK(objects > 600000 && objects < 3000000);
    pset_free(&s);
    remove_dir();
}

/* `contprof capture --type heap` of isolate iso on the contprofd at url, written to file:
 * its exit status, its output printed. */
static int heap_capture(const char *url, const char *iso, const char *file)
{
    static char txt[1 << 16];
    char sel[128];
    snprintf(sel, sizeof(sel), "{runtime=\"v8\",isolate=\"%s\"}", iso);
    const char *args[] = {"capture", "--server",   url,  "--select", sel,  "--type",
                          "heap",    "--duration", "6s", "-o",       file, NULL};
    int rc = cli(txt, sizeof(txt), args);
    printf("contprof capture --type heap %s: exit %d\n%s\n", iso, rc, txt);
    return rc;
}

/* The retained bytes of the heap capture in file: in all (*total) and under frame. */
static long long retained_under(const char *file, const char *frame, long long *total)
{
    cp_buf b = {0};
    cp_profile *p = NULL;
    CHECK_EQ(cp_read_file(file, &b, NULL), 0);
    CHECK_EQ(cp_pprof_decode(b.data, b.len, NULL, &p, NULL), 0);
    cp_buf_close(&b);
    long long under = func_total(p, frame, 1);
    *total = cp_profile_total(p, 1);
    printf("%s: %lld bytes retained, %lld under %s\n", file, *total, under, frame);
    cp_profile_destroy(p);
    return under;
}

/* A heap capture of one isolate (issue 39): node with two workers; alpha's start-up table,
 * built before any inspector call reached it, is in alpha's snapshot under its variable
 * (within 10% of the heap V8 says it grew by); beta's snapshot does not hold it. */
TEST(node_heap_capture)
{
    make_dir();
    char store[300], url[64], out[300], clog[300], nlog[300], afile[300], bfile[300];
    snprintf(store, sizeof(store), "%s/store", g_dir);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    snprintf(afile, sizeof(afile), "%s/alpha.pb.gz", g_dir);
    snprintf(bfile, sizeof(bfile), "%s/beta.pb.gz", g_dir);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);
    char node[512], inspect[64], hostport[64], script[512];
    find_node(node, sizeof(node));
    int port = free_port();
    snprintf(inspect, sizeof(inspect), "--inspect=127.0.0.1:%d", port);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
    snprintf(script, sizeof(script), "%s/heap_workers.js", CP_V8_TESTS);
    const char *nargv[] = {node, "--expose-gc", inspect, script, "25", NULL};
    pid_t np = spawn(nargv, nlog);
    const char *grew = wait_for_log(np, nlog, "alpha grew ", 20);
    long long growth = atoll(grew);
    const char *cargv[] = {CP_CONTPROF, "v8",       "--inspector",      hostport,
                           "--server",  url,        "--output-dir",     out,
                           "--service", "nodeheap", "--exit-when-gone", NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(cp, clog, "attached to isolate alpha", 20);
    (void)wait_for_log(cp, clog, "attached to isolate beta", 20);
    int arc = heap_capture(url, "alpha", afile), brc = heap_capture(url, "beta", bfile);
    kill(np, SIGTERM);
    (void)wait_exit(np, 20);
    int cst = wait_exit(cp, 60);
    print_log(clog);
    CHECK_EQ(arc, 0);
    CHECK_EQ(brc, 0);
    CHECK_EQ(cst, 0);
    static char logtext[1 << 16];
    slurp(clog, logtext, sizeof(logtext));
    CHECK_CONTAINS(logtext, "heap snapshot for capture ");
    CHECK_CONTAINS(logtext, "the isolate paused ");
    /* alpha: the table, the 100,000 objects with their names and tags, under its variable */
    long long total, hoard = retained_under(afile, "HOARD: Array", &total);
    printf("V8 says alpha grew %lld\n", growth);
    CHECK(hoard >= growth * 0.9 && hoard <= growth * 1.1);
    CHECK(retained_under(afile, "heap_workers.js", &total) >= hoard);
    /* beta: no such table (its own HOARD is empty) */
    CHECK(retained_under(bfile, "HOARD: Array", &total) < growth / 100);
    CHECK(total > 0);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
}

/* The same through workerd, the runtime the Worker ran on: alpha's start-up table
 * (300,000 rows built at module scope, before any inspector call) is in alpha's snapshot
 * under its variable; beta's snapshot has no such table. */
TEST(workerd_heap_capture)
{
    make_dir();
    char cmd[1024], wd[512], store[300], url[64], out[300], clog[300], wlog[300], hostport[64];
    char afile[300], bfile[300];
    snprintf(cmd, sizeof(cmd), "sh %s/install.sh %s", CP_V8_TESTS, bindir());
    CHECK(system(cmd) == 0);
    snprintf(wd, sizeof(wd), "%s/tests/v8/node_modules/@cloudflare/workerd-linux-64/bin/workerd",
             bindir());
    snprintf(store, sizeof(store), "%s/store", g_dir);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(wlog, sizeof(wlog), "%s/workerd.log", g_dir);
    snprintf(afile, sizeof(afile), "%s/alpha.pb.gz", g_dir);
    snprintf(bfile, sizeof(bfile), "%s/beta.pb.gz", g_dir);
    proc d;
    const char *dargs[] = {"--data", store, "--http", "127.0.0.1:0", NULL};
    start_daemon(&d, g_dir, dargs);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", d.port);
    int pa = free_port(), pb = free_port(), pi = free_port();
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", pi);
    pid_t w = start_workerd(wd, pa, pb, pi, wlog);
    const char *cargv[] = {CP_CONTPROF,    "v8", "--inspector", hostport, "--server", url,
                           "--output-dir", out,  "--service",   "wdheap", NULL};
    pid_t cp = spawn(cargv, clog);
    (void)wait_for_log(cp, clog, "attached to isolate beta", 10);
    (void)wait_for_log(cp, clog, "attached to isolate alpha", 10);
    int arc = heap_capture(url, "alpha", afile), brc = heap_capture(url, "beta", bfile);
    kill(cp, SIGTERM);
    int cst = wait_exit(cp, 30);
    kill(w, SIGTERM);
    (void)wait_exit(w, 10);
    print_log(clog);
    CHECK_EQ(arc, 0);
    CHECK_EQ(brc, 0);
    CHECK_EQ(cst, 0);
    /* 300,000 objects with a name each: ~40 bytes a row at the least */
    long long total, kept = retained_under(afile, "kept: Array", &total);
    CHECK(kept >= 300000LL * 40);
    CHECK(kept <= total);
    CHECK_EQ(retained_under(bfile, "kept: Array", &total), 0);
    CHECK(total > 0);
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
}

/* --heap-snapshot-every: each isolate's snapshot on a schedule, as always-on windows of kind
 * heap (no capture), and no more often than its pause allows (1%: a pause of P waits 100 P). */
/* Scheduled heap windows (no capture) of isolate iso in dir; the last one's path in file. */
static int heap_windows(const char *dir, const char *iso, char *file, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    char needle[80];
    snprintf(needle, sizeof(needle), ".heap.%s.", iso);
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".pb.gz") || strstr(e->d_name, ".tmp") ||
            strstr(e->d_name, "capture") || !strstr(e->d_name, needle))
            continue;
        n++;
        if (file) snprintf(file, cap, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    return n;
}

TEST(node_heap_schedule)
{
    make_dir();
    char out[300], clog[300], nlog[300];
    snprintf(out, sizeof(out), "%s/out", g_dir);
    snprintf(clog, sizeof(clog), "%s/contprof.log", g_dir);
    snprintf(nlog, sizeof(nlog), "%s/node.log", g_dir);
    char node[512], inspect[64], hostport[64], script[512];
    find_node(node, sizeof(node));
    int port = free_port();
    snprintf(inspect, sizeof(inspect), "--inspect=127.0.0.1:%d", port);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
    snprintf(script, sizeof(script), "%s/heap_workers.js", CP_V8_TESTS);
    const char *nargv[] = {node, "--expose-gc", inspect, script, "300", NULL};
    pid_t np = spawn(nargv, nlog);
    (void)wait_for_log(np, nlog, "alpha grew ", 20);
    const char *cargv[] = {CP_CONTPROF,
                           "v8",
                           "--inspector",
                           hostport,
                           "--output-dir",
                           out,
                           "--service",
                           "nodesched",
                           "--heap-snapshot-every",
                           "1s",
                           NULL};
    pid_t cp = spawn(cargv, clog);
    /* one source takes the isolates' snapshots in turn, and alpha's takes seconds (20 s
     * under load): until both have one, at most 150 s */
    for (int64_t end = mono_ns() + 150 * SEC; mono_ns() < end; usleep(200000))
        if (heap_windows(out, "alpha", NULL, 0) && heap_windows(out, "beta", NULL, 0)) break;
    sleep(2); /* a turn more: alpha's next waits 100x its pause */
    kill(cp, SIGTERM);
    int cst = wait_exit(cp, 60);
    kill(np, SIGTERM);
    (void)wait_exit(np, 20);
    print_log(clog);
    CHECK_EQ(cst, 0);
    char afile[600] = "";
    int alpha = heap_windows(out, "alpha", afile, sizeof(afile)),
        beta = heap_windows(out, "beta", NULL, 0);
    printf("scheduled heap windows: alpha %d, beta %d\n", alpha, beta);
    CHECK(alpha >= 1 && beta >= 1);
    /* alpha pauses for a second or more (a 19 MB heap): its next waits 100x that */
    CHECK(alpha == 1);
    long long total;
    CHECK(retained_under(afile, "HOARD: Array", &total) > 100000LL * 100);
}

TEST_MAIN(T(node_inuse_matches_retained_growth), T(node_heap_capture), T(node_heap_schedule),
          T(workerd_heap_capture), T(node_two_workers), T(workerd_two_workers),
          T(malformed_inspector), T(node_to_contprofd), T(node_signed_for_its_tenant),
          T(node_through_a_contprofd_restart_loses_nothing), T(workerd_typescript),
          T(node_source_map_uploaded_after_the_windows),
          T(node_script_loaded_later_is_source_mapped), T(node_capture),
          T(node_cpu_under_competitors))
