/* `contprof import` of real Go profiles (written by runtime/pprof at test time) through the
 * embedded broker into the store: the totals come back as `go tool pprof -raw` reports
 * them; a heap profile yields alloc (cumulative) and inuse; bad files are refused. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#include "import.h"
#include "ingest_util.h"
#include "proc.h"

/* The total of column col of tenant's kind over the day around now. */
static int64_t qtotal_of(cp_store *s, const char *tenant, cp_kind kind, int col)
{
    int64_t now = (int64_t)time(NULL) * SEC;
    cp_query q = {.tenant = tenant, .kind = kind};
    q.from_ns = now - 86400 * SEC;
    q.to_ns = now + 86400 * SEC;
    cp_profile *p = NULL;
    CHECK_EQ(cp_store_query(s, &q, &p, NULL), 0);
    int64_t t = cp_profile_total(p, (uint32_t)col);
    cp_profile_destroy(p);
    return t;
}

static int64_t qtotal(cp_store *s, cp_kind kind, int col)
{
    return qtotal_of(s, "acme", kind, col);
}

/* A stand-in for contprofd's GET /api/v1/brokers: answers one request. */
static int srv_fd;
static const char *srv_brokers;
static void *serve_one(void *arg)
{
    (void)arg;
    int c = accept(srv_fd, NULL, NULL);
    char req[2048];
    ssize_t n = read(c, req, sizeof req - 1);
    CHECK(n > 0);
    req[n] = 0;
    CHECK(strstr(req, "GET /api/v1/brokers ") == req);
    char resp[1024];
    int len =
        snprintf(resp, sizeof resp,
                 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"brokers\":\"%s\"}",
                 srv_brokers);
    CHECK(write(c, resp, (size_t)len) == len);
    close(c);
    return NULL;
}

static int serve_brokers(const char *brokers, pthread_t *th)
{
    srv_brokers = brokers;
    srv_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(srv_fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(srv_fd, 4) == 0);
    socklen_t al = sizeof a;
    getsockname(srv_fd, (struct sockaddr *)&a, &al);
    pthread_create(th, NULL, serve_one, NULL);
    return ntohs(a.sin_port);
}

TEST(go_profiles_round_trip)
{
    char *dir = tmpdir("import");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && GOCACHE='%s/gocache' HOME='%s' GOFLAGS= go run "
             "'%s/tests/ingest/genprof.go' '%s'",
             dir, dir, dir, getenv("CP_SOURCE_DIR"), dir);
    CHECK(system(cmd) == 0);
    char cpu[600], heap[600], bad[600];
    snprintf(cpu, sizeof cpu, "%s/cpu.pprof", dir);
    snprintf(heap, sizeof heap, "%s/heap.pprof", dir);
    snprintf(bad, sizeof bad, "%s/bad.pprof", dir);
    FILE *f = fopen(bad, "w");
    fputs("not a profile", f);
    fclose(f);

    cp_broker *b = NULL;
    CHECK_EQ(cp_broker_create(NULL, &b, NULL), 0);
    const char *bs = cp_broker_bootstraps(b);
    char *argv[] = {"import", "--brokers", (char *)bs,    "--tenant", "acme", "--service",
                    "goapp",  "--label",   "version=1.0", cpu,        heap,   NULL};
    CHECK_EQ(cp_cmd_import(11, argv), 0);
    /* the same again (a retry): every window a duplicate the store drops (issue 27) */
    char *argv1[] = {"import", "--brokers", (char *)bs,    "--tenant", "acme", "--service",
                     "goapp",  "--label",   "version=1.0", cpu,        heap,   NULL};
    CHECK_EQ(cp_cmd_import(11, argv1), 0);
    /* a bad file: refused with a non-zero exit, the good ones still go */
    char *argv2[] = {"import", "--brokers", (char *)bs, "--tenant", "other", bad, cpu, NULL};
    CHECK_EQ(cp_cmd_import(7, argv2), 1);
    char *argv3[] = {"import", "--brokers", (char *)bs, "--label", "bad label", cpu, NULL};
    CHECK_EQ(cp_cmd_import(6, argv3), 2);
    /* --label service= would override --service without a word; control characters in a
     * value would forge lines wherever it is shown */
    char *argv3b[] = {"import", "--brokers", (char *)bs, "--label", "service=x", cpu, NULL};
    CHECK_EQ(cp_cmd_import(6, argv3b), 2);
    char *argv3c[] = {"import", "--brokers", (char *)bs, "--label", "zone=a\nb", cpu, NULL};
    CHECK_EQ(cp_cmd_import(6, argv3c), 2);
    char *argv3d[] = {"import", "--brokers", (char *)bs, "--service", "a\x1b[0m", cpu, NULL};
    CHECK_EQ(cp_cmd_import(6, argv3d), 2);
    /* --server: the broker list comes from GET /api/v1/brokers (this stand-in serves no
     * /api/v1/ingest/offsets, hence --no-wait; waiting is tested in tests/e2e/delivery) */
    pthread_t th;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", serve_brokers(bs, &th));
    char *argv4[] = {"import", "--server", url, "--no-wait", "--tenant", "viaserver", cpu, NULL};
    CHECK_EQ(cp_cmd_import(7, argv4), 0);
    pthread_join(th, NULL);
    close(srv_fd);

    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/store", dir);
    cp_store_options so = {.path = sdir};
    cp_store *s = NULL;
    CHECK_EQ(cp_store_open(&so, &s, NULL), 0);
    cp_ingest *in = ingest_start(bs, s, 64);
    wait_messages(in, 8, 60);
    cp_ingest_stop(in); /* every message read is applied */
    cp_ingest_stats ist;
    cp_ingest_get_stats(in, &ist);
    CHECK_EQ(ist.duplicates, 3); /* cpu, alloc (cumulative) and inuse of the retry */
    cp_ingest_destroy(in);

    int64_t want[8];
    char quoted[700];
    snprintf(quoted, sizeof quoted, "'%s'", cpu);
    CHECK_EQ(pprof_raw_totals(quoted, want, 8), 2);
    CHECK(want[0] > 0);
    CHECK_EQ(qtotal(s, CP_KIND_CPU, 0), want[0]);
    CHECK_EQ(qtotal(s, CP_KIND_CPU, 1), want[1]);
    int64_t want_cpu = want[1];
    snprintf(quoted, sizeof quoted, "'%s'", heap);
    CHECK_EQ(pprof_raw_totals(quoted, want, 8), 4);
    CHECK(want[3] > 0); /* the start-up allocations are still in use */
    CHECK_EQ(qtotal(s, CP_KIND_ALLOC, 0), want[0]);
    CHECK_EQ(qtotal(s, CP_KIND_ALLOC, 1), want[1]);
    CHECK_EQ(qtotal(s, CP_KIND_INUSE, 0), want[2]);
    CHECK_EQ(qtotal(s, CP_KIND_INUSE, 1), want[3]);
    CHECK_EQ(qtotal_of(s, "viaserver", CP_KIND_CPU, 1), want_cpu);
    /* the labels came along */
    cp_string_list l = {0};
    CHECK_EQ(cp_store_label_values(s, &(cp_query){.tenant = "acme", .label = "version"}, &l, NULL),
             0);
    CHECK_EQ(l.n, 1);
    CHECK_STREQ(l.v[0], "1.0");
    cp_string_list_close(&l);
    cp_store_close(s);
    cp_broker_destroy(b);
    rmtree(dir);
}

/* An allocation window as the agent writes one with --output-dir: alloc_objects and
 * alloc_space counted over its own window (duration_nanos), no inuse_* types. */
static cp_profile *alloc_window(int i, int64_t start)
{
    cp_profile *p = mini_window((uint64_t)i + 7, 40, start);
    cp_profile *a = cp_profile_create();
    cp_profile_add_sample_type(a, "alloc_objects", "count");
    cp_profile_add_sample_type(a, "alloc_space", "bytes");
    cp_profile_intern_cstr(a, "space", &a->period_type.type);
    cp_profile_intern_cstr(a, "bytes", &a->period_type.unit);
    a->period = 524288;
    a->time_nanos = start;
    a->duration_nanos = 10 * SEC;
    cp_function f = {0};
    cp_profile_intern_cstr(a, "alloc_site", &f.name);
    uint32_t fid, loc;
    cp_profile_add_function(a, &f, &fid);
    cp_line ln = {fid, 1};
    cp_profile_add_location(a, 0x5000, 0, &ln, 1, &loc);
    for (int k = 0; k < 3 + i; k++) {
        int64_t v[2] = {100 + i * 10 + k, (100 + i * 10 + k) * 4096};
        cp_profile_add_sample(a, &loc, 1, v, NULL, 0);
    }
    cp_profile_destroy(p);
    return a;
}

/* contprof's own allocation windows are counts over each window, not totals since process
 * start: imported, the store holds the sum of every window, as if the agent had sent them
 * live (it used to keep only the last window's, the rest taken for a cumulative series). */
TEST(alloc_windows_import_as_windows)
{
    char *dir = tmpdir("impalloc");
    enum { N = 6 };
    char files[N][600];
    char *argv[16] = {"import", "--brokers", NULL, "--tenant", "acme", "--service", "s1"};
    int argc = 7;
    int64_t now = (int64_t)time(NULL) * SEC, want[2] = {0, 0};
    for (int i = 0; i < N; i++) {
        cp_profile *a = alloc_window(i, now - (N - i) * 10 * SEC);
        want[0] += cp_profile_total(a, 0);
        want[1] += cp_profile_total(a, 1);
        cp_buf b = {0};
        CHECK_EQ(cp_pprof_encode(a, 1, &b), 0);
        snprintf(files[i], sizeof files[i], "%s/s1.%d.alloc.pb.gz", dir, i);
        CHECK_EQ(cp_write_file(files[i], b.data, b.len, NULL), 0);
        cp_buf_close(&b);
        cp_profile_destroy(a);
        argv[argc++] = files[i];
    }
    cp_broker *b = NULL;
    CHECK_EQ(cp_broker_create(NULL, &b, NULL), 0);
    argv[2] = (char *)cp_broker_bootstraps(b);
    CHECK_EQ(cp_cmd_import(argc, argv), 0);

    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/store", dir);
    cp_store_options so = {.path = sdir};
    cp_store *s = NULL;
    CHECK_EQ(cp_store_open(&so, &s, NULL), 0);
    cp_ingest *in = ingest_start(argv[2], s, 64);
    wait_messages(in, N, 60);
    cp_ingest_destroy(in);
    CHECK_EQ(qtotal(s, CP_KIND_ALLOC, 0), want[0]);
    CHECK_EQ(qtotal(s, CP_KIND_ALLOC, 1), want[1]);
    cp_store_close(s);
    cp_broker_destroy(b);
    rmtree(dir);
}

TEST_MAIN(T(go_profiles_round_trip), T(alloc_windows_import_as_windows))
