/* On-demand capture end to end (issue 29), black-box: the real contprofd with its embedded
 * Kafka, two processes of one service under the real agent (tests/e2e/capwork: named
 * threads "counter" and "other" burning CPU), and `contprof capture` of isolate counter of
 * process a at 1 kHz for 5 s. Checked: the CLI names what matched and exits 0; the
 * capture's samples are ~1,000 per CPU-second of that isolate and it holds only that
 * isolate's frames; no other series is captured and every always-on series keeps its rate
 * (~100 per CPU-second); the always-on CPU of each isolate equals what its thread burned
 * (so the capture added no CPU); a selector matching nothing exits 1 saying so. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_client.h"
#include "json.h"
#include "proc.h"

#define BURN_S 16
#define AGENT_HZ 100

static int g_port;

static cp_json *get_json(const char *pq)
{
    cp_buf b = http_get_ok(g_port, pq, NULL);
    cp_json *j = NULL;
    CHECK(cp_json_parse((const char *)b.data, b.len, &j, NULL) == 0);
    cp_buf_close(&b);
    return j;
}

/* samples and cpu ns of sel (URL-encoded) over the last hour; via the timeline (one step) */
static void totals(const char *sel, int64_t *samples, int64_t *cpu_ns)
{
    char pq[600];
    snprintf(pq, sizeof pq, "/api/v1/timeline?type=cpu&from=-1h&to=now%%2B1m&step=2h&select=%s",
             sel);
    cp_json *j = get_json(pq);
    const cp_json *pts = cp_json_get(j, "points");
    *samples = *cpu_ns = 0;
    for (uint32_t i = 0; pts && i < pts->n; i++) {
        *samples += cp_json_int(pts->items[i]->items[1], 0);
        *cpu_ns += cp_json_int(pts->items[i]->items[2], 0);
    }
    cp_json_free(j);
}

static void url_sel(char *out, size_t cap, const char *sel)
{
    cp_buf b = {0};
    CHECK(cp_url_encode(&b, sel) == 0 && cp_buf_append(&b, "", 1) == 0);
    snprintf(out, cap, "%s", (char *)b.data);
    cp_buf_close(&b);
}

/* The CPU ns thread `name` printed in log (capwork's "cpu NAME NS"). */
static int64_t burned(const char *log, const char *name)
{
    char text[4096], key[64];
    slurp(log, text, sizeof text);
    snprintf(key, sizeof key, "cpu %s ", name);
    const char *m = strstr(text, key);
    if (!m) fprintf(stderr, "%s has no '%s':\n%s\n", log, key, text);
    CHECK(m);
    return strtoll(m + strlen(key), NULL, 10);
}

TEST(capture_of_one_isolate_of_one_process)
{
    char dir[] = "/tmp/cp-capture-e2e-XXXXXX";
    CHECK(mkdtemp(dir));
    char data[600], url[64], cbin[600], wbin[600], logs[2][600], clog[600], out[600];
    snprintf(data, sizeof data, "%s/data", dir);
    const char *dargs[] = {"--data", data, "--http", "127.0.0.1:0", NULL};
    proc d;
    start_daemon(&d, dir, dargs);
    g_port = d.port;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
    snprintf(cbin, sizeof cbin, "%s/query/contprof", bindir());
    snprintf(wbin, sizeof wbin, "%s/tests/e2e/capwork", bindir());
    static const char *procs[2] = {"a", "b"};
    pid_t pid[2];
    char burn[16];
    snprintf(burn, sizeof burn, "%d", BURN_S);
    for (int i = 0; i < 2; i++) {
        char label[16];
        snprintf(label, sizeof label, "proc=%s", procs[i]);
        snprintf(logs[i], sizeof logs[i], "%s/capwork-%s.log", dir, procs[i]);
        const char *argv[] = {cbin,      "run",     "--server", url,  "--service", "capsvc",
                              "--label", label,     "--window", "2s", "--",        wbin,
                              burn,      "counter", "other",    NULL};
        pid[i] = spawn(argv, logs[i]);
    }
    /* both processes' isolates are known before the capture starts */
    for (int64_t end = mono_ns() + 30 * SEC;; usleep(200000)) {
        cp_json *j = get_json("/api/v1/series?type=cpu&select=%7Bservice%3D%22capsvc%22%7D");
        int64_t n = cp_json_int(cp_json_get(j, "count"), 0);
        cp_json_free(j);
        if (n >= 4) break;
        CHECK(mono_ns() < end);
    }
    snprintf(clog, sizeof clog, "%s/capture.log", dir);
    snprintf(out, sizeof out, "%s/counter.pb.gz", dir);
    const char *cargv[] = {
        cbin,       "capture", "--select",   "{service=\"capsvc\",proc=\"a\",isolate=\"counter\"}",
        "--type",   "cpu",     "--duration", "5s",
        "--hz",     "1000",    "-o",         out,
        "--server", url,       NULL};
    int st = wait_exit(spawn(cargv, clog), 60);
    char text[8192];
    slurp(clog, text, sizeof text);
    fprintf(stderr, "contprof capture:\n%s\n", text);
    CHECK_EQ(st, 0);
    CHECK_CONTAINS(text, "matched {");
    CHECK_CONTAINS(text, "isolate=\"counter\"");
    CHECK_CONTAINS(text, "proc=\"a\"");
    const char *idp = strstr(text, "capture ");
    CHECK(idp);
    char id[80];
    CHECK(sscanf(idp, "capture %79[^:]:", id) == 1);
    for (int i = 0; i < 2; i++)
        CHECK_EQ(wait_exit(pid[i], 60), 0);

    /* every isolate's always-on CPU is what its thread burned (the last windows arrive
     * after the exit: waited for) */
    char sel[600], q[600];
    for (int i = 0; i < 2; i++) {
        static const char *iso[2] = {"counter", "other"};
        for (int k = 0; k < 2; k++) {
            int64_t want = burned(logs[i], iso[k]), samples = 0, cpu = 0;
            snprintf(q, sizeof q, "{service=\"capsvc\",proc=\"%s\",isolate=\"%s\"}", procs[i],
                     iso[k]);
            url_sel(sel, sizeof sel, q);
            for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(250000)) {
                totals(sel, &samples, &cpu);
                if (cpu > want * 0.9) break;
            }
            fprintf(stderr, "%s: always-on %lld samples, %.3f s CPU; the thread burned %.3f s\n", q,
                    (long long)samples, cpu / 1e9, want / 1e9);
            CHECK(cpu >= want * 0.9 && cpu <= want * 1.1);
            /* its rate is the agent's, captured or not */
            double rate = samples / (cpu / 1e9);
            CHECK(rate >= AGENT_HZ * 0.85 && rate <= AGENT_HZ * 1.15);
        }
    }
    /* the capture: one series, process a's counter, ~1000 samples per CPU-second */
    snprintf(q, sizeof q, "{capture=\"%s\"}", id);
    url_sel(sel, sizeof sel, q);
    char pq[800];
    snprintf(pq, sizeof pq, "/api/v1/series?select=%s", sel);
    cp_json *j = get_json(pq);
    const cp_json *ser = cp_json_get(j, "series");
    CHECK(ser && ser->n >= 1);
    for (uint32_t i = 0; i < ser->n; i++) {
        const cp_json *l = cp_json_get(ser->items[i], "labels");
        CHECK_STREQ(cp_json_str(cp_json_get(l, "proc"), ""), "a");
        CHECK_STREQ(cp_json_str(cp_json_get(l, "isolate"), ""), "counter");
    }
    cp_json_free(j);
    int64_t cs = 0, ccpu = 0;
    totals(sel, &cs, &ccpu);
    double crate = cs / (ccpu / 1e9);
    fprintf(stderr, "capture: %lld samples over %.3f s CPU: %.0f per CPU-second\n", (long long)cs,
            ccpu / 1e9, crate);
    /* ~1,000: the agent's own test takes 850..1100; on this shared 2-core machine at a
     * load of 10, 827 was seen once in a few runs, hence 800 */
    CHECK(crate >= 800 && crate <= 1150);
    /* and its CPU is the isolate's real CPU over the capture: the always-on windows that
     * started within it (2 s windows: the edges straddle, hence the tolerance) */
    snprintf(pq, sizeof pq, "/api/v1/captures/%s", id);
    j = get_json(pq);
    int64_t cstart = cp_json_int(cp_json_get(j, "start_ns"), 0),
            cend = cp_json_int(cp_json_get(j, "end_ns"), 0);
    CHECK(cp_json_get(j, "complete")->num == 1);
    cp_json_free(j);
    char asel[300];
    url_sel(asel, sizeof asel, "{service=\"capsvc\",proc=\"a\",isolate=\"counter\"}");
    snprintf(pq, sizeof pq, "/api/v1/timeline?type=cpu&from=%.3f&to=%.3f&step=1h&select=%s",
             (cstart - SEC) / 1e9, (cend - SEC) / 1e9, asel);
    j = get_json(pq);
    int64_t acpu = 0;
    const cp_json *pts = cp_json_get(j, "points");
    for (uint32_t i = 0; pts && i < pts->n; i++)
        acpu += cp_json_int(pts->items[i]->items[2], 0);
    cp_json_free(j);
    fprintf(stderr, "always-on CPU of the isolate in windows starting during the capture: %.3f s\n",
            acpu / 1e9);
    CHECK(ccpu >= acpu * 0.65 && ccpu <= acpu * 1.35);
    CHECK(cs >= 200); /* enough samples for the ratios to mean something */
    /* only the isolate's frames */
    snprintf(pq, sizeof pq,
             "/api/v1/profile?type=cpu&format=folded&from=-1h&to=now%%2B1m&select=%s", sel);
    cp_buf f = http_get_ok(d.port, pq, NULL);
    CHECK(strstr((char *)f.data, "burn_counter"));
    CHECK(!strstr((char *)f.data, "burn_other"));
    cp_buf_close(&f);

    /* a selector that matches nothing: exit 1, saying so */
    const char *nargv[] = {cbin,         "capture", "--select", "{service=\"nosuch\"}",
                           "--duration", "1s",      "-o",       out,
                           "--server",   url,       NULL};
    unlink(clog);
    CHECK_EQ(wait_exit(spawn(nargv, clog), 60), 1);
    slurp(clog, text, sizeof text);
    CHECK_CONTAINS(text, "matched no isolate");
    CHECK_EQ(stop_daemon(&d, SIGTERM), 0);
}

TEST_MAIN(T(capture_of_one_isolate_of_one_process))
