/* Around a crash, black-box: the real contprofd (embedded broker, ingest, store, HTTP API),
 * the real `contprof import` and a real program under the agent, and a SIGKILL of contprofd
 * at a chosen moment. An import cut by the SIGKILL says "not stored" only of what is known
 * not to be, calls the rest unknown and says how to retry; the retry stores exactly what is
 * missing and a third run stores nothing (import is idempotent per window). What died with
 * the embedded broker right after an agent's window boundary is counted in /metrics from
 * the agent's own sequence numbers and logged with producer and range. */
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "http_client.h"
#include "pprof.h"
#include "proc.h"

static char *mkdir_tmp(const char *what)
{
    return proc_tmpdir("crash", what);
}

static char *slurp_alloc(const char *path)
{
    cp_buf b = {0};
    if (cp_read_file(path, &b, NULL)) return strdup("");
    CHECK(cp_buf_append(&b, "", 1) == 0);
    return (char *)b.data;
}

/* contprofd on dir/data; port 0 picks one, else that one (a restart on the same address). */
static void daemon_start(proc *p, const char *dir, int port, int n)
{
    start_daemon_data(p, dir, port, n, NULL);
}

/* Sum of the first sample column of every file matching glob (decoded here). */
static int64_t files_total(const char *dir)
{
    DIR *d = opendir(dir);
    CHECK(d);
    int64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, ".pb.gz")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        cp_buf b = {0};
        CHECK(cp_read_file(path, &b, NULL) == 0);
        cp_profile *p = NULL;
        cp_err err = {0};
        CHECK(cp_pprof_decode(b.data, b.len, NULL, &p, &err) == 0);
        sum += cp_profile_total(p, 0);
        cp_profile_destroy(p);
        cp_buf_close(&b);
    }
    closedir(d);
    return sum;
}

/* The stored cpu total of service svc over the last 30 days (first column). */
static int64_t stored_total(int port, const char *svc)
{
    int64_t now = (int64_t)time(NULL);
    char pq[512];
    snprintf(pq, sizeof pq,
             "/api/v1/profile?format=pprof&type=cpu&from=%lld&to=%lld&select=%%7Bservice%%3D%%22%s"
             "%%22%%7D",
             (long long)(now - 30 * 86400), (long long)(now + 60), svc);
    cp_http_result r = http_get(port, pq, NULL);
    if (r.status == 404) { /* nothing stored yet */
        cp_buf_close(&r.body);
        return 0;
    }
    http_expect_200(pq, &r);
    cp_profile *p = NULL;
    cp_err err = {0};
    if (cp_pprof_decode(r.body.data, r.body.len, NULL, &p, &err)) fprintf(stderr, "%s\n", err.msg);
    CHECK(p);
    int64_t t = cp_profile_total(p, 0);
    cp_profile_destroy(p);
    cp_buf_close(&r.body);
    return t;
}

/* Runs import in the background; its stderr goes to errpath. */
static pid_t import_bg(int port, const char *args, const char *errpath)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec '%s/query/contprof' import --server http://127.0.0.1:%d --timeout 60s %s "
             "2>'%s'",
             bindir(), port, args, errpath);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int import_wait(pid_t pid, const char *errpath, char **out)
{
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    *out = slurp_alloc(errpath);
    const char *tail = strlen(*out) > 3000 ? *out + strlen(*out) - 3000 : *out;
    fprintf(stderr, "--- contprof import (tail) ---\n%s", tail);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* ---- tests ------------------------------------------------------------------------- */

TEST(import_cut_by_a_sigkill_says_unknown_and_a_retry_stores_once)
{
    enum { NWIN = 2000 };
    char *dir = mkdir_tmp("import"), wdir[512], args[1024], errp[600];
    snprintf(wdir, sizeof wdir, "%s/w", dir);
    CHECK(mkdir(wdir, 0755) == 0);
    /* 2,000 small one-series windows (50 stacks, 50 samples), 10 s apart: enough that a part
     * is stored and a part in flight at the kill; sent three times (400 s under ASan at 12,000) */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s/bench/genwindows' '%s' %d 50 50", bindir(), wdir, NWIN);
    proc_sh(cmd);
    int64_t want = files_total(wdir);
    CHECK(want > 0);
    proc d = {0};
    daemon_start(&d, dir, 0, 1);
    int port = d.port;
    snprintf(args, sizeof args, "--service cut '%s'/*.pb.gz", wdir);
    snprintf(errp, sizeof errp, "%s/import1.err", dir);
    pid_t imp = import_bg(port, args, errp);
    /* SIGKILL once a part is stored, the rest in flight */
    int64_t end = mono_ns() + 120 * SEC;
    while (http_metric(port, "contprof_ingest_windows_total", NULL) < NWIN / 8) {
        CHECK(mono_ns() < end);
        usleep(20000);
    }
    CHECK_EQ(stop_daemon_within(&d, SIGKILL, 10), 128 + SIGKILL);
    daemon_start(&d, dir, port, 2);
    char *out;
    CHECK_EQ(import_wait(imp, errp, &out), 1);
    CHECK_CONTAINS(out, "unknown: contprofd restarted before confirming it");
    CHECK_CONTAINS(out, "run the same command again");
    int stored = 0, total = 0, nfiles = 0, nnot = -1, nunknown = -1;
    const char *s = strstr(out, " window(s) from ");
    CHECK(s);
    while (s > out && s[-1] != '\n')
        s--;
    CHECK(sscanf(s, "contprof import: %d of %d window(s) from %d file(s) stored", &stored, &total,
                 &nfiles) == 3);
    const char *u = strstr(out, " window(s) not stored, ");
    CHECK(u);
    while (u > out && u[-1] != '\n')
        u--;
    CHECK(sscanf(u, "contprof import: %d window(s) not stored, %d unknown", &nnot, &nunknown) == 2);
    fprintf(stderr, "reported: %d stored, %d not stored, %d unknown of %d sent (%d files)\n",
            stored, nnot, nunknown, total, nfiles);
    CHECK(nunknown > 0);
    CHECK(stored > 0); /* confirmations may lag what contprofd had stored when killed */
    /* what is stored: at least what was reported stored, and nothing said "not stored" */
    int64_t per = want / NWIN; /* genwindows' windows carry equal totals */
    CHECK_EQ(per * NWIN, want);
    int64_t have = stored_total(port, "cut");
    fprintf(stderr, "in the store after the restart: %lld windows\n", (long long)(have / per));
    CHECK(have % per == 0);
    CHECK(have / per >= stored);
    CHECK(have / per <= stored + nunknown); /* none said "not stored" is there */
    CHECK(count_lines(out, "): not stored: ") <= nnot);
    free(out);
    /* the retry stores exactly what is missing */
    snprintf(errp, sizeof errp, "%s/import2.err", dir);
    CHECK_EQ(import_wait(import_bg(port, args, errp), errp, &out), 0);
    char all[128];
    snprintf(all, sizeof all, "%d of %d window(s) from %d file(s) stored", NWIN, NWIN, NWIN);
    CHECK_CONTAINS(out, all);
    free(out);
    CHECK_EQ(stored_total(port, "cut"), want);
    CHECK(http_metric(port, "contprof_ingest_duplicates_total", NULL) >= have / per);
    /* and once more: nothing changes */
    snprintf(errp, sizeof errp, "%s/import3.err", dir);
    CHECK_EQ(import_wait(import_bg(port, args, errp), errp, &out), 0);
    free(out);
    CHECK_EQ(stored_total(port, "cut"), want);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

/* The highest sequence among the agent's window files in dir (their names carry it:
 * SERVICE.PID-TOKEN.SEQUENCE.KIND.ISOLATE.pb.gz), and how many there are. */
static long long files_max_seq(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    long long mx = -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *g = strstr(de->d_name, ".pb.gz");
        if (!g || g[6]) continue;
        const char *dot = strchr(de->d_name, '.');
        if (!dot || !(dot = strchr(dot + 1, '.'))) continue;
        long long q = strtoll(dot + 1, NULL, 10);
        if (q > mx) mx = q;
        n++;
    }
    closedir(d);
    *count = n;
    return mx;
}

TEST(envelopes_lost_with_the_broker_at_a_sigkill_are_counted)
{
    char *dir = mkdir_tmp("gap"), odir[512], log[600], cmd[2048];
    snprintf(odir, sizeof odir, "%s/out", dir);
    proc d = {0};
    daemon_start(&d, dir, 0, 1);
    int port = d.port;
    /* one process burning CPU under the agent, 1 s windows, sent and written to files */
    snprintf(log, sizeof log, "%s/run.log", dir);
    snprintf(cmd, sizeof cmd,
             "exec '%s/query/contprof' run --server http://127.0.0.1:%d --service gapsvc "
             "--window 1s --output-dir '%s' -- /bin/sh -c 'i=0; while [ $i -lt 100000000 ]; do "
             "i=$((i+1)); done' >'%s' 2>&1",
             bindir(), port, odir, log);
    pid_t run = fork();
    CHECK(run >= 0);
    if (run == 0) {
        setpgid(0, 0); /* the test ends the agent's whole group */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int64_t end = mono_ns() + 60 * SEC;
    while (http_metric(port, "contprof_ingest_windows_total", NULL) < 6) {
        CHECK(mono_ns() < end);
        usleep(100000);
    }
    /* no scrape from here on (a scrape shortens ingest's batch to 10 ms): wait for the
     * next window's files, then SIGKILL 40 ms later, inside ingest's 200 ms batch */
    usleep(1200000);
    int n0 = 0, n1 = 0;
    files_max_seq(odir, &n0);
    for (n1 = n0; n1 == n0; usleep(1000)) {
        files_max_seq(odir, &n1);
        CHECK(mono_ns() < end);
    }
    usleep(40000);
    kill(d.pid, SIGKILL);
    int n2 = 0;
    long long kseq = files_max_seq(odir, &n2);
    CHECK_EQ(stop_daemon_within(&d, SIGKILL, 10), 128 + SIGKILL);
    fprintf(stderr, "killed with the agent's files up to sequence %lld\n", kseq);
    daemon_start(&d, dir, port, 2);
    /* the agent finds the new broker (it asks after 5 s of silence), windows flow again,
     * and the gap settles 10 s after the producer's first envelope */
    end = mono_ns() + 90 * SEC;
    long long gaps = -1;
    while ((gaps = http_metric(port, "contprof_ingest_sequence_gaps_total", NULL)) <= 0) {
        if (mono_ns() > end) break;
        usleep(200000);
    }
    char *dl = slurp_alloc(d.log);
    fprintf(stderr, "contprof_ingest_sequence_gaps_total %lld\n", gaps);
    CHECK(gaps > 0);
    const char *l = strstr(dl, "ingest: producer ");
    CHECK(l);
    unsigned long long a = 0, b = 0, n = 0;
    const char *q = strstr(l, ": sequences ");
    CHECK(q && sscanf(q, ": sequences %llu..%llu (%llu envelopes)", &a, &b, &n) == 3);
    fprintf(stderr, "logged: %.*s\n", (int)strcspn(l, "\n"), l);
    CHECK_EQ(n, b - a + 1);
    /* the range starts at or before what the agent had numbered when contprofd died: those
     * died in the broker, not in the agent's queue while contprofd was away */
    CHECK((long long)a <= kseq);
    free(dl);
    kill(-run, SIGKILL);
    waitpid(run, NULL, 0);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

/* --at past contprofd's retention: refused naming retention.rollup (nothing stored that
 * retention would delete); past retention.raw only: stored, with a warning naming it. */
TEST(import_past_retention_is_refused_or_warned)
{
    char *dir = mkdir_tmp("retention"), wdir[512], args[1024], errp[600], cmd[1200];
    snprintf(wdir, sizeof wdir, "%s/w", dir);
    CHECK(mkdir(wdir, 0755) == 0);
    snprintf(cmd, sizeof cmd, "'%s/bench/genwindows' '%s' 1 50 50", bindir(), wdir);
    proc_sh(cmd);
    proc d = {0};
    daemon_start(&d, dir, 0, 1); /* the defaults: retention.raw 7d, retention.rollup 90d */
    char *out;
    snprintf(args, sizeof args, "--service old --at now-100d '%s/w00000.pb.gz'", wdir);
    snprintf(errp, sizeof errp, "%s/import1.err", dir);
    CHECK_EQ(import_wait(import_bg(d.port, args, errp), errp, &out), 1);
    CHECK_CONTAINS(out, "not sent: the window starts 100.0 days ago, past contprofd's "
                        "retention.rollup (90.0 days)");
    CHECK_CONTAINS(out, "0 of 0 window(s) from 1 file(s) stored");
    free(out);
    snprintf(args, sizeof args, "--service old --at now-10d '%s/w00000.pb.gz'", wdir);
    snprintf(errp, sizeof errp, "%s/import2.err", dir);
    CHECK_EQ(import_wait(import_bg(d.port, args, errp), errp, &out), 0);
    CHECK_CONTAINS(out, "past contprofd's retention.raw (7.0 days): stored, but kept only in the "
                        "rollups");
    CHECK_CONTAINS(out, "1 of 1 window(s) from 1 file(s) stored");
    free(out);
    CHECK(stored_total(d.port, "old") > 0);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

TEST_MAIN(T(import_past_retention_is_refused_or_warned),
          T(import_cut_by_a_sigkill_says_unknown_and_a_retry_stores_once),
          T(envelopes_lost_with_the_broker_at_a_sigkill_are_counted))
