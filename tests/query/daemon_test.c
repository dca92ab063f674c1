/* Black-box tests of contprofd: the real binary on a real store directory, found by its log
 * line, queried over HTTP, stopped by SIGTERM and SIGINT; configuration errors and the
 * loopback rule. Also the config parser itself. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#include "config.h"
#include "pprof.h"
#include "fixture.h"
#include "qtest.h"
#include "proc.h"

#define S(x) ((int64_t)(x)*1000000000LL)
static const int64_t T0 = 1764000000;

/* Runs contprofd to completion (for start-up errors); returns the status and the log. */
static int run_daemon(const char *dir, const char *const *args, char *log, size_t len)
{
    proc p = {0};
    snprintf(p.log, sizeof p.log, "%s/contprofd-fail.log", dir);
    char bin[512];
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    p.pid = fork();
    if (p.pid == 0) {
        FILE *f = freopen(p.log, "w", stderr);
        (void)f;
        const char *argv[32] = {bin};
        int n = 1;
        for (; args[n - 1] && n < 31; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        execv(bin, (char **)argv);
        _exit(127);
    }
    int st;
    waitpid(p.pid, &st, 0);
    slurp(p.log, log, len);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(serves_a_store_and_stops_cleanly)
{
    /* Fill a store, close it, hand the directory to the daemon. */
    qfx f = {0};
    qfx_open_store(&f, NULL);
    for (int w = 0; w < 30; w++) {
        cp_profile *p = qt_cpu_profile();
        qt_add(p, "main;work", 4, 40000000);
        qfx_add(&f, "default", CP_KIND_CPU, "service=api,instance=i1", S(T0 + 10 * w), p);
        cp_profile_destroy(p);
    }
    qfx_commit(&f);
    char dir[128], store[160];
    snprintf(dir, sizeof dir, "%s", f.dir);
    snprintf(store, sizeof store, "%s", f.dir);
    qfx_close(&f, 0);
    char conf[200];
    snprintf(conf, sizeof conf, "%s.conf", dir);
    FILE *cf = fopen(conf, "w");
    /* The test data is from 2025: keep it forever, or retention would remove it. */
    fprintf(cf, "# test config\nlisten = 127.0.0.1:0\nquery.concurrency = 2\n"
                "query.max_range = 30d\nbrokers = 127.0.0.1:9\nretention.raw = 0\n"
                "retention.rollup = 0\n");
    fclose(cf);
    const char *args[] = {"--config", conf, "--data", store, NULL};
    proc p = {0};
    start_daemon(&p, "/tmp", args);
    /* queries are answered from the store, but with no reachable broker ingest is not
     * ready, and /healthz says so */
    cp_http_result r = http_get(p.port, "/healthz", NULL);
    CHECK_EQ(r.status, 503);
    CHECK_CONTAINS((char *)r.body.data, "\"status\":\"starting\"");
    cp_buf_close(&r.body);
    char pq[256];
    snprintf(pq, sizeof pq, "/api/v1/profile?format=folded&sample_type=samples&from=%lld&to=%lld",
             (long long)T0, (long long)T0 + 3600);
    r = http_get(p.port, pq, NULL);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ((char *)r.body.data, "main;work 120\n");
    cp_buf_close(&r.body);
    r = http_get(p.port, "/api/v1/profile?from=-60d", NULL);
    CHECK_EQ(r.status, 400); /* query.max_range from the config */
    cp_buf_close(&r.body);
    r = http_get(p.port, "/api/v1/brokers", NULL);
    char want[600]; /* the brokers, and the host's relay contprofd runs (DATA/relay) */
    snprintf(want, sizeof want, "{\"brokers\":\"127.0.0.1:9\",\"relay\":\"%s/relay\"}\n", store);
    CHECK_STREQ((char *)r.body.data, want);
    cp_buf_close(&r.body);
    r = http_get(p.port, "/metrics", NULL);
    CHECK_CONTAINS((char *)r.body.data, "contprof_store_series 1\n");
    CHECK_CONTAINS((char *)r.body.data,
                   "contprof_query_duration_seconds_count{endpoint=\"profile\"} 2\n");
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon(&p, SIGTERM), 0);
    char log[8192];
    slurp(p.log, log, sizeof log);
    CHECK_CONTAINS(log, "stopped cleanly");
    /* The store was closed properly: it opens again, and SIGINT stops it too. */
    start_daemon(&p, "/tmp", args);
    r = http_get(p.port, pq, NULL);
    CHECK_STREQ((char *)r.body.data, "main;work 120\n");
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon(&p, SIGINT), 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, conf, p.log);
    CHECK(system(cmd) == 0);
}

/* Every family contprofd prints, with its help and type, in registration order (the API's,
 * then store, ingest, symbols), and the samples' labels and formats. A family a stage adds
 * appears without touching this list. text: /metrics of a daemon whose ingest runs. */
static void check_metrics_families(const char *text)
{
    /* name, type, help */
    static const char *const fams[] = {
        "contprof_http_responses_total counter HTTP responses by status class.",
        "contprof_query_duration_seconds histogram Time to answer store-backed queries, arrival to "
        "response.",
        "contprof_uptime_seconds gauge Seconds since the query API started.",
        "contprof_store_disk_bytes gauge Approximate size of the store on disk.",
        "contprof_store_series gauge Distinct series in the store.",
        "contprof_store_series_forgotten_total counter Series forgotten by retention: every "
        "window of theirs was past every level's retention (a later window of the same labels "
        "makes a new series).",
        "contprof_store_windows_written_total counter Windows stored by this process.",
        "contprof_store_stack_cache_hits_total counter Samples whose stack the writer's per-series "
        "cache knew (store/README.md).",
        "contprof_store_stack_cache_misses_total counter Samples decoded and interned in full.",
        "contprof_store_stack_cache_flushes_total counter Times every series' stack cache was "
        "dropped to stay in its budget.",
        "contprof_store_stack_cache_bytes gauge Memory held by the stack caches.",
        "contprof_ingest_messages_total counter Kafka messages consumed.",
        "contprof_ingest_windows_total counter Windows written to the store by ingest.",
        "contprof_ingest_bytes_total counter Payload bytes consumed.",
        "contprof_ingest_duplicates_total counter Envelopes dropped as duplicates.",
        "contprof_ingest_windows_per_second gauge Recent ingest rate.",
        "contprof_ingest_consumer_lag gauge Messages behind the end of the partitions (-1 "
        "unknown).",
        "contprof_ingest_dlq_total counter Messages sent to the dead-letter queue, by reason.",
        "contprof_ingest_paused gauge 1 while ingest waits for the store after a failed write (the "
        "reason is in /healthz and the log).",
        "contprof_ingest_store_errors_total counter Failed store writes and reopen attempts.",
        "contprof_ingest_dlq_failed_total counter DLQ deliveries that failed (each is retried; "
        "offsets wait).",
        "contprof_ingest_dlq_truncated_total counter Messages too large for the DLQ, sent there "
        "truncated.",
        "contprof_ingest_lost_total counter Offsets the broker dropped before ingest read them.",
        "contprof_ingest_running gauge 1 while the ingest thread runs.",
        "contprof_ingest_ready gauge 1 once the consumer has its partitions.",
        "contprof_ingest_last_error gauge The latest ingest error (1 when there is one).",
        "contprof_agent_dropped_windows_total counter Windows agents dropped, as they reported, by "
        "service.",
        "contprof_agent_dropped_samples_total counter Samples agents dropped, as they reported, by "
        "service.",
        "contprof_symbols_uploads_total counter Symbol uploads kept (POST /api/v1/symbols).",
        "contprof_symbols_uploads_refused_total counter Symbol uploads refused (bad file, limit).",
        "contprof_symbols_locations_named_total counter Locations named at query time.",
        "contprof_symbols_cached_tables gauge Symbol tables held in memory.",
        "contprof_symbols_cached_bytes gauge Bytes of those tables.",
        "contprof_symbols_demangled_without_requires_total counter C++ names demangled without "
        "their C++20 requires-clause.",
        "contprof_symbols_mangled_left_total counter C++ and Rust names the demangler refused, "
        "left mangled.",
    };
    const char *last = text;
    char want[512];
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        const char *type = strchr(fams[i], ' ') + 1, *help = strchr(type, ' ') + 1;
        int nl = (int)(type - 1 - fams[i]), tl = (int)(help - 1 - type);
        snprintf(want, sizeof want, "# HELP %.*s %s\n# TYPE %.*s %.*s\n", nl, fams[i], help, nl,
                 fams[i], tl, type);
        const char *at = strstr(text, want);
        CHECK_CONTAINS(text, want);
        CHECK(at > last || i == 0); /* in the order they always had */
        last = at;
    }
    CHECK_CONTAINS(text, "contprof_http_responses_total{code=\"2xx\"} ");
    CHECK_CONTAINS(text, "contprof_ingest_dlq_total{reason=\"envelope\"} 0\n");
    CHECK_CONTAINS(text, "contprof_ingest_dlq_total{reason=\"tenant\"} 0\n");
    CHECK_CONTAINS(text, "contprof_ingest_consumer_lag ");
    CHECK_CONTAINS(text, "contprof_ingest_paused 0\n");
    CHECK_CONTAINS(text, "contprof_ingest_running 1\n");
    CHECK_CONTAINS(text, "contprof_ingest_windows_per_second ");
    CHECK_CONTAINS(text, "contprof_symbols_cached_bytes 0\n");
    CHECK_CONTAINS(text, "contprof_symbols_mangled_left_total 0\n");
}

/* The whole pipeline with no Kafka installed: contprofd hosts the embedded broker, `contprof
 * import --server` finds it through /api/v1/brokers, ingest stores the window, and the
 * query returns the file's totals. */
TEST(embedded_broker_import_to_query)
{
    char dir[] = "/tmp/cpqd-XXXXXX";
    CHECK(mkdtemp(dir));
    char store[200], conf[200];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    FILE *cf = fopen(conf, "w");
    fprintf(cf, "retention.raw = 0\nretention.rollup = 0\n"); /* the window is from 2025 */
    fclose(cf);
    const char *args[] = {"--config", conf, "--data", store, "--http", "127.0.0.1:0", NULL};
    proc p = {0};
    start_daemon(&p, dir, args);
    const char *src = getenv("CP_SOURCE_DIR");
    char file[512], cmd[2048];
    snprintf(file, sizeof file, "%s/tests/fuzz/corpus/fuzz_pprof/go_cpu.pb.gz", src ? src : ".");
    cp_buf b = {0};
    CHECK(cp_read_file(file, &b, NULL) == 0);
    cp_profile *want = NULL;
    CHECK(cp_pprof_decode(b.data, b.len, NULL, &want, NULL) == 0);
    cp_buf_close(&b);
    snprintf(cmd, sizeof cmd,
             "%s/query/contprof import --server http://127.0.0.1:%d --service gosvc "
             "--at 1764000000 --duration 10s '%s' >/dev/null 2>&1",
             bindir(), p.port, file);
    CHECK(system(cmd) == 0);
    /* Ingest is asynchronous (and the first consumer-group join takes ~3 s). */
    int64_t got = -1;
    for (int i = 0; i < 300 && got != cp_profile_total(want, 1); i++) {
        cp_http_result r = http_get(p.port,
                                    "/api/v1/profile?select=%7Bservice%3D%22gosvc%22%7D"
                                    "&from=1764000000&to=1764000010&format=pprof",
                                    NULL);
        CHECK_EQ(r.status, 200);
        cp_profile *q = NULL;
        CHECK(cp_pprof_decode(r.body.data, r.body.len, NULL, &q, NULL) == 0);
        got = q->sample_types.n > 1 ? cp_profile_total(q, 1) : 0;
        cp_profile_destroy(q);
        cp_buf_close(&r.body);
        if (got != cp_profile_total(want, 1)) usleep(50000);
    }
    CHECK_EQ(got, cp_profile_total(want, 1));
    cp_profile_destroy(want);
    cp_http_result r = http_get(p.port, "/metrics", NULL);
    CHECK_CONTAINS((char *)r.body.data, "contprof_ingest_windows_total 1\n");
    CHECK_CONTAINS((char *)r.body.data, "contprof_ingest_dlq_total{reason=\"pprof\"} 0\n");
    check_metrics_families((const char *)r.body.data);
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon(&p, SIGTERM), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* With tokens, ingest stores only envelopes signed with a token of the tenant they name:
 * an import signed with another tenant's token and an unsigned one go to the DLQ with
 * reason "tenant"; asking for the brokers without a token is refused. */
TEST(tenant_binding_of_imports)
{
    char dir[] = "/tmp/cpqd-XXXXXX";
    CHECK(mkdtemp(dir));
    char store[200], conf[200];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    FILE *cf = fopen(conf, "w");
    fprintf(cf, "retention.raw = 0\nretention.rollup = 0\ntoken.alpha = alpha-secret-1\n"
                "token.beta = beta-secret-2\n");
    fclose(cf);
    const char *args[] = {"--config", conf, "--data", store, "--http", "127.0.0.1:0", NULL};
    proc p = {0};
    start_daemon(&p, dir, args);
    const char *src = getenv("CP_SOURCE_DIR");
    char file[512], cmd[2048];
    snprintf(file, sizeof file, "%s/tests/fuzz/corpus/fuzz_pprof/go_cpu.pb.gz", src ? src : ".");
    const char *imp = "%s/query/contprof import --server http://127.0.0.1:%d --tenant alpha "
                      "--at 1764000000 --duration 10s %s '%s' >/dev/null 2>&1";
    snprintf(cmd, sizeof cmd, imp, bindir(), p.port, "--service good --token alpha-secret-1", file);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, imp, bindir(), p.port, "--service forged --token beta-secret-2",
             file);
    /* delivered to Kafka, refused by ingest (DLQ, reason tenant): import waits for the
     * store, so it says the window is not stored and exits 1 */
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, imp, bindir(), p.port, "--service nobroker", file);
    CHECK(system(cmd) != 0); /* no token: contprofd does not say where Kafka is */
    cp_http_result r = http_get(p.port, "/api/v1/brokers", "beta-secret-2");
    CHECK_EQ(r.status, 200);
    char brokers[256] = "";
    const char *q = strstr((char *)r.body.data, "\"brokers\":\"");
    CHECK(q);
    snprintf(brokers, sizeof brokers, "%.*s", (int)strcspn(q + 11, "\""), q + 11);
    cp_buf_close(&r.body);
    snprintf(cmd, sizeof cmd,
             "%s/query/contprof import --brokers %s --tenant alpha --service unsigned "
             "--at 1764000000 --duration 10s '%s' >/dev/null 2>&1",
             bindir(), brokers, file);
    CHECK(system(cmd) == 0);
    int ok = 0;
    for (int i = 0; i < 600 && !ok; i++) {
        r = http_get(p.port, "/metrics", "alpha-secret-1");
        CHECK_EQ(r.status, 200);
        ok = strstr((char *)r.body.data, "contprof_ingest_windows_total 1\n") &&
             strstr((char *)r.body.data, "contprof_ingest_dlq_total{reason=\"tenant\"} 2\n");
        cp_buf_close(&r.body);
        if (!ok) usleep(50000);
    }
    CHECK(ok);
    r = http_get(p.port, "/api/v1/series", "alpha-secret-1");
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS((char *)r.body.data, "\"service\":\"good\"");
    CHECK(strstr((char *)r.body.data, "forged") == NULL);
    CHECK(strstr((char *)r.body.data, "unsigned") == NULL);
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon(&p, SIGTERM), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

TEST(tokens_from_config)
{
    char dir[] = "/tmp/cpqd-XXXXXX";
    CHECK(mkdtemp(dir));
    char conf[200], store[200];
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    snprintf(store, sizeof store, "%s/store", dir);
    FILE *cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\nbrokers = 127.0.0.1:9\ntoken.alpha = 'alpha-secret-1'\n");
    fclose(cf);
    const char *args[] = {"--config", conf, "--data", store, NULL};
    proc p = {0};
    start_daemon(&p, dir, args);
    cp_http_result r = http_get(p.port, "/api/v1/labels", NULL);
    CHECK_EQ(r.status, 401);
    cp_buf_close(&r.body);
    r = http_get(p.port, "/api/v1/labels", "alpha-secret-1");
    CHECK_EQ(r.status, 200);
    CHECK_STREQ((char *)r.body.data, "{\"labels\":[]}\n");
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon(&p, SIGTERM), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* One raw request to port whose answer must come within 3 s (its declared body never sent
 * past its first bytes) with status, naming needle. */
static void refused_at_once(int port, const char *req, int status, const char *needle)
{
    cp_http_result r;
    cp_err err = {0};
    int64_t t0 = mono_ns();
    int rc = cp_http_raw("127.0.0.1", port, req, strlen(req), 5000, &r, &err);
    if (rc) fprintf(stderr, "%s: %s\n", req, err.msg);
    CHECK(rc == 0);
    if (r.status != status) fprintf(stderr, "%d %s\n", r.status, (char *)r.body.data);
    CHECK_EQ(r.status, status);
    CHECK_CONTAINS((char *)r.body.data, needle);
    CHECK(mono_ns() - t0 < 3 * SEC);
    cp_buf_close(&r.body);
}

/* The token, local=1 and the size limit are checked from the headers, before any body is
 * read: a 500 MB upload without a token is answered 401 at once, not after holding it
 * (issue 36: contprofd's RSS went 10.9 -> 507 MB first). */
TEST(uploads_are_refused_before_their_body_is_read)
{
    char dir[] = "/tmp/cpqd-XXXXXX";
    CHECK(mkdtemp(dir));
    char conf[200], store[200];
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    snprintf(store, sizeof store, "%s/store", dir);
    FILE *cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\nbrokers = 127.0.0.1:9\ntoken.alpha = alpha-secret-1\n"
                "symbols.max_upload_bytes = 1M\n");
    fclose(cf);
    const char *args[] = {"--config", conf, "--data", store, NULL};
    proc p = {0};
    start_daemon(&p, dir, args);
#define BIG                                                                                        \
    "Content-Length: 500000000\r\n\r\n\x7f"                                                        \
    "ELF"
    refused_at_once(p.port, "POST /api/v1/symbols HTTP/1.1\r\nHost: x\r\n" BIG, 401,
                    "missing Authorization");
    refused_at_once(p.port,
                    "POST /api/v1/symbols HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    "wrong-secret\r\n" BIG,
                    401, "invalid token");
    refused_at_once(p.port,
                    "POST /api/v1/captures?local=1&tenant=alpha HTTP/1.1\r\nHost: "
                    "x\r\nAuthorization: Bearer alpha-secret-1\r\n" BIG,
                    403, "cluster.token");
    refused_at_once(p.port,
                    "POST /api/v1/symbols HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    "alpha-secret-1\r\n" BIG,
                    413, "symbols.max_upload_bytes");
    refused_at_once(p.port,
                    "POST /api/v1/symbols HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                    "chunked\r\n\r\n1000\r\n",
                    401, "missing Authorization");
#undef BIG
    /* with the token, an upload is read and answered as before */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", p.port);
    cp_http_result r;
    cp_err err = {0};
    CHECK(cp_http_post(url, "/api/v1/symbols", "alpha-secret-1", "not an ELF", 10, 5000, 0, &r,
                       &err) == 0);
    CHECK_EQ(r.status, 400);
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon(&p, SIGTERM), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

TEST(startup_errors)
{
    char dir[] = "/tmp/cpqd-XXXXXX";
    CHECK(mkdtemp(dir));
    char conf[200], store[200], log[8192];
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    snprintf(store, sizeof store, "%s/store", dir);
    const char *a1[] = {"--data", store, "--http", "0.0.0.0:0", "--brokers", "x:1", NULL};
    CHECK_EQ(run_daemon(dir, a1, log, sizeof log), 1);
    CHECK_CONTAINS(log, "refusing to listen on 0.0.0.0 without tokens");
    FILE *cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\nquery.timeout = soon\n");
    fclose(cf);
    const char *a2[] = {"--config", conf, "--data", store, NULL};
    CHECK_EQ(run_daemon(dir, a2, log, sizeof log), 1);
    CHECK_CONTAINS(log, "c.conf:2: 'query.timeout': bad duration 'soon'");
    const char *a3[] = {"--data", store, "--http", "127.0.0.1", NULL};
    CHECK_EQ(run_daemon(dir, a3, log, sizeof log), 1);
    CHECK_CONTAINS(log, "listen address '127.0.0.1': expected HOST:PORT");
    const char *a4[] = {"--bogus", NULL};
    CHECK_EQ(run_daemon(dir, a4, log, sizeof log), 2);
    /* --data: a directory of other things is refused naming one of them (it would have
     * become a store); a dangling symlink is named as such, not "NotFound: .../LOCK" */
    char mine[300], notes[400], link[300], bin[512], flog[400];
    snprintf(mine, sizeof mine, "%s/mine", dir);
    CHECK(mkdir(mine, 0755) == 0);
    snprintf(notes, sizeof notes, "%s/notes.txt", mine);
    CHECK(cp_write_file(notes, "mine\n", 5, NULL) == 0);
    snprintf(link, sizeof link, "%s/dangling", dir);
    CHECK(symlink("/nonexistent/contprof-data", link) == 0);
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    snprintf(flog, sizeof flog, "%s/data.log", dir);
    const char *a6[] = {bin,           "--data",    mine,          "--http",
                        "127.0.0.1:0", "--brokers", "127.0.0.1:9", NULL};
    CHECK_EQ(wait_exit(spawn(a6, flog), 20), 1);
    slurp(flog, log, sizeof log);
    CHECK_CONTAINS(log, "'notes.txt' is not part of one");
    unlink(flog);
    a6[2] = link;
    CHECK_EQ(wait_exit(spawn(a6, flog), 20), 1);
    slurp(flog, log, sizeof log);
    CHECK_CONTAINS(log, "is a symbolic link to '/nonexistent/contprof-data', which does not exist");
    /* the agents' feed fits their poll limit by construction: at most 64 running a tenant */
    cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\nbrokers = 127.0.0.1:9\ncaptures.max_concurrent = 65\n");
    fclose(cf);
    CHECK_EQ(run_daemon(dir, a2, log, sizeof log), 1);
    CHECK_CONTAINS(log, "captures.max_concurrent at most 64");
    /* one secret, one holder: two tenants, or a tenant and /metrics, never share one
     * (issue 36), whatever the order of the lines */
    cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\ntoken.a = same-secret-1\ntoken.b = same-secret-1\n");
    fclose(cf);
    CHECK_EQ(run_daemon(dir, a2, log, sizeof log), 1);
    CHECK_CONTAINS(log, "c.conf:3: 'token.b' has the same secret as 'token.a'");
    cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\nmetrics.token = same-secret-1\ntoken.a = same-secret-1\n");
    fclose(cf);
    CHECK_EQ(run_daemon(dir, a2, log, sizeof log), 1);
    CHECK_CONTAINS(log, "'token.a' has the same secret as 'metrics.token'");
    cf = fopen(conf, "w");
    fprintf(cf, "listen = 127.0.0.1:0\ntoken.a = same-secret-1\nmetrics.token = same-secret-1\n");
    fclose(cf);
    CHECK_EQ(run_daemon(dir, a2, log, sizeof log), 1);
    CHECK_CONTAINS(log, "'metrics.token' has the same secret as 'token.a'");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

TEST(config_parser)
{
    cp_config c;
    cp_err err = {0};
    CHECK(cp_config_init(&c) == 0);
    CHECK(cp_config_set(&c, "kafka.security.protocol", "SASL_SSL", &err) == 0);
    CHECK(cp_config_set(&c, "kafka.bootstrap.servers", "k1:9092,k2:9092", &err) == 0);
    CHECK(cp_config_set(&c, "token.team-a", "0123456789", &err) == 0);
    CHECK(cp_config_set(&c, "retention.raw", "14d", &err) == 0);
    CHECK(cp_config_set(&c, "query.max_response_bytes", "64M", &err) == 0);
    CHECK(cp_config_set(&c, "listen", "[::1]:8080", &err) == 0);
    CHECK_STREQ(c.brokers, "k1:9092,k2:9092");
    CHECK_EQ(c.kafka.n, 1);
    CHECK_STREQ(c.kafka.v[0].key, "security.protocol");
    CHECK_STREQ(c.tokens.v[0].key, "team-a");
    CHECK_EQ(c.retention_raw_ns, S(14 * 86400));
    CHECK_EQ(c.max_response_bytes, 64u << 20);
    CHECK_STREQ(c.http_host, "::1");
    CHECK_EQ(c.http_port, 8080);
    CHECK(cp_config_is_loopback("::1") && cp_config_is_loopback("127.0.0.2") &&
          !cp_config_is_loopback("10.0.0.1"));
    CHECK_EQ(cp_config_set(&c, "token.bad name", "0123456789", &err), CP_EPARSE);
    CHECK_EQ(cp_config_set(&c, "query.concurrency", "0", &err), CP_EPARSE);
    CHECK_CONTAINS(err.msg, "'query.concurrency': expected a positive integer");
    CHECK_EQ(cp_config_set(&c, "query.max_response_bytes", "lots", &err), CP_EPARSE);
    CHECK_EQ(cp_config_set(&c, "listen", "host:99999", &err), CP_EPARSE);
    cp_config_close(&c);
}

TEST_MAIN(T(serves_a_store_and_stops_cleanly), T(uploads_are_refused_before_their_body_is_read),
          T(embedded_broker_import_to_query), T(tokens_from_config), T(tenant_binding_of_imports),
          T(startup_errors), T(config_parser))
