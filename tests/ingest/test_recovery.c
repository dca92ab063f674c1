/* Store failures and their way out, with the real parts: contprofd on a store in a small
 * tmpfs that fills up while it ingests from its embedded broker (ingest pauses, /healthz
 * says why, and it resumes by itself once space is back, storing every window); a real
 * store whose write-ahead log is byte-flipped or truncated (refused by name with the fix,
 * or reported), repaired by `contprofd --repair`; and the repair of derived data on a
 * store with records deleted under it. */
#include <fcntl.h>
#include <leveldb/c.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "http_client.h"
#include "ingest_util.h"
#include "proc.h"
#include "store.h"

#define WIN (10 * SEC)

/* ---------------------------------------------------------------------------------
 * Helpers: the daemon, HTTP, files (the process helpers are in tests/proc.h)
 * --------------------------------------------------------------------------------- */

/* Runs contprofd with args to completion; its stdout and stderr into out. Returns the exit
 * status (-1 if killed: a daemon that should have refused to start dies of SIGALRM). */
static int run_contprofd(const char *const *args, char *out, size_t len)
{
    int rd;
    pid_t pid = fork_stdout_pipe(&rd);
    if (pid == 0) {
        alarm(30);
        dup2(1, 2);
        exec_contprofd(args);
    }
    int st = cp_test_collect(rd, pid, out, len);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The total of sample type 0 of a query through the daemon; -1 if it is not answered. */
static int64_t http_total(int port, const char *service, int64_t from, int64_t to)
{
    char pq[300];
    snprintf(pq, sizeof pq,
             "/api/v1/profile?format=pprof&select=%%7Bservice%%3D%%22%s%%22%%7D&from=%lld&to=%lld",
             service, (long long)(from / SEC), (long long)(to / SEC));
    cp_http_result r = http_get(port, pq, NULL);
    int64_t t = -1;
    cp_profile *q = NULL;
    if (r.status == 200 && cp_pprof_decode(r.body.data, r.body.len, NULL, &q, NULL) == 0) {
        t = q->sample_types.n ? cp_profile_total(q, 0) : 0;
        cp_profile_destroy(q);
    }
    cp_buf_close(&r.body);
    return t;
}

static void sh(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0) {
        fprintf(stderr, "command failed: %s\n", cmd);
        CHECK(0);
    }
}

/* A contprofd config in dir keeping everything (the test windows are from 2023); its
 * path into out. The repair checks rollups only where raw retention keeps level 0. */
static void keep_all_conf(const char *dir, char *out, size_t len)
{
    snprintf(out, len, "%s/keep-all.conf", dir);
    FILE *f = fopen(out, "w");
    CHECK(f);
    fprintf(f, "retention.raw = 0\nretention.rollup = 0\n");
    fclose(f);
}

/* The single write-ahead log of a store directory: its path into out. */
static void find_log(const char *dir, char *out, size_t len)
{
    DIR *d = opendir(dir);
    CHECK(d);
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n > 4 && !strcmp(de->d_name + n - 4, ".log") && strcmp(de->d_name, "LOG")) {
            snprintf(out, len, "%s/%s", dir, de->d_name);
            found++;
        }
    }
    closedir(d);
    CHECK_EQ(found, 1);
}

/* ---------------------------------------------------------------------------------
 * A real store with many batches
 * --------------------------------------------------------------------------------- */

/* A CPU window whose stacks are partly its own: every window adds strings, functions,
 * locations and stacks to the dictionaries, so a lost batch leaves later ones referring
 * to entries that are gone. */
static cp_profile *fresh_window(int i, int64_t start)
{
    cp_profile *p = mini_window((uint64_t)i + 1, 300, start);
    uint32_t locs[4];
    for (int j = 0; j < 4; j++) {
        char name[64];
        snprintf(name, sizeof name, "batch_%d::fn_%d", i, j);
        cp_function f = {0};
        cp_profile_intern_cstr(p, name, &f.name);
        uint32_t fid;
        cp_profile_add_function(p, &f, &fid);
        cp_line ln = {fid, j};
        cp_profile_add_location(p, 0x900000 + (uint64_t)i * 64 + (uint64_t)j * 8, 0, &ln, 1,
                                &locs[j]);
    }
    for (int j = 0; j < 20; j++) {
        int64_t v[2] = {1 + j % 3, 10000000LL * (1 + j % 3)};
        uint32_t st[3] = {locs[j % 4], locs[(j / 4) % 4], p->locations.n > 0 ? 1 : 0};
        cp_profile_add_sample(p, st, 3, v, NULL, 0);
    }
    return p;
}

/* Writes n windows of service svc, one batch (one synced LevelDB write) each; returns the
 * sum of sample type 0 of each window in totals[i]. */
static void build_store(const char *dir, const char *svc, int n, int64_t *totals)
{
    cp_store_options o = {.path = dir};
    cp_store *s = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_open(&o, &s, &err), 0);
    cp_store_batch *b = cp_store_batch_create(s);
    for (int i = 0; i < n; i++) {
        cp_envelope e;
        make_env(&e, "default", CP_KIND_CPU, svc, T0 + i * WIN, WIN, "p1", (uint64_t)i + 1);
        cp_profile *p = fresh_window(i, T0 + i * WIN);
        totals[i] = cp_profile_total(p, 0);
        CHECK_EQ(cp_store_batch_add(b, &e, p, 0, &err), 0);
        CHECK_EQ(cp_store_batch_commit(b, &err), 0);
        cp_profile_destroy(p);
        cp_envelope_close(&e);
    }
    cp_store_batch_destroy(b);
    cp_store_close(s);
}

static int64_t store_total(cp_store *s, const char *svc, int64_t from, int64_t to)
{
    cp_selector sel = {0};
    sel_add(&sel, "service", "=", svc);
    cp_profile *p = NULL;
    cp_err err = {0};
    int rc = cp_store_query(
        s,
        &(cp_query){
            .tenant = "default", .kind = CP_KIND_CPU, .sel = sel, .from_ns = from, .to_ns = to},
        &p, &err);
    if (rc) fprintf(stderr, "query: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    int64_t t = p->sample_types.n ? cp_profile_total(p, 0) : 0;
    cp_profile_destroy(p);
    sel_free(&sel);
    return t;
}

/* The store answers consistently: the total over two whole hours (read from the rollups)
 * equals the sum of every window's own total (read from level 0), and each 1-minute
 * bucket equals its windows. Returns that total. */
static int64_t check_consistent(const char *dir, const char *svc, int n)
{
    cp_store *s = open_store(dir);
    int64_t h = T0 - T0 % (3600 * SEC), sum = 0;
    for (int i = 0; i < n; i++)
        sum += store_total(s, svc, T0 + i * WIN, T0 + (i + 1) * WIN);
    int64_t all = store_total(s, svc, h, h + 7200 * SEC);
    CHECK_EQ(all, sum);
    int64_t m0 = T0 - T0 % (60 * SEC);
    for (int64_t m = m0; m < T0 + n * WIN; m += 60 * SEC) {
        int64_t msum = 0;
        for (int i = 0; i < n; i++)
            if (T0 + i * WIN >= m && T0 + i * WIN < m + 60 * SEC)
                msum += store_total(s, svc, T0 + i * WIN, T0 + (i + 1) * WIN);
        CHECK_EQ(store_total(s, svc, m, m + 60 * SEC), msum);
    }
    cp_store_close(s);
    return all;
}

/* ---------------------------------------------------------------------------------
 * WAL damage
 * --------------------------------------------------------------------------------- */

TEST(wal_byte_flip_refused_then_repaired)
{
    char *dir = tmpdir("wal");
    char orig[600], copy[600], logf[700], out[16384];
    snprintf(orig, sizeof orig, "%s/orig", dir);
    snprintf(copy, sizeof copy, "%s/copy", dir);
    int64_t totals[60], want = 0;
    build_store(orig, "service=wal", 60, totals);
    for (int i = 0; i < 60; i++)
        want += totals[i];
    sh("cp -a '%s' '%s'", orig, copy); /* before any open turns the log into a table */
    CHECK_EQ(check_consistent(orig, "wal", 60), want);
    find_log(copy, logf, sizeof logf);
    struct stat stt;
    CHECK(stat(logf, &stt) == 0);
    CHECK(stt.st_size > 3 * 32768); /* the log spans several blocks: later writes survive */
    /* flip one byte inside the first block, in a record well after the format record */
    int fd = open(logf, O_RDWR);
    CHECK(fd >= 0);
    unsigned char c;
    CHECK(pread(fd, &c, 1, 20000) == 1);
    c ^= 0x5a;
    CHECK(pwrite(fd, &c, 1, 20000) == 1);
    close(fd);

    /* refused, naming the file and the fix */
    const char *base = strrchr(logf, '/') + 1;
    const char *a1[] = {"--data", copy, "--http", "127.0.0.1:0", "--brokers", "127.0.0.1:9", NULL};
    CHECK_EQ(run_contprofd(a1, out, sizeof out), 1);
    CHECK_CONTAINS(out, "corrupted write-ahead log");
    CHECK_CONTAINS(out, base);
    char fix[700];
    snprintf(fix, sizeof fix, "run `contprofd --repair --data %s`", copy);
    CHECK_CONTAINS(out, fix);

    /* the repair reports the loss and exits 0; the store then opens and is consistent */
    char conf[700];
    keep_all_conf(dir, conf, sizeof conf);
    const char *a2[] = {"--config", conf, "--repair", "--data", copy, NULL};
    int st = run_contprofd(a2, out, sizeof out);
    fprintf(stderr, "%s\n", out); /* the report, for the test's log */
    CHECK_EQ(st, 0);
    CHECK_CONTAINS(out, "checksum mismatch at byte");
    CHECK_CONTAINS(out, "repaired: it opens again");
    CHECK_CONTAINS(out, "tenant default: dictionary of");
    int64_t got = check_consistent(copy, "wal", 60);
    CHECK(got > 0 && got < want);
    /* a second repair finds nothing more to drop */
    CHECK_EQ(run_contprofd(a2, out, sizeof out), 0);
    CHECK_CONTAINS(out, "nothing lost");
    CHECK_EQ(check_consistent(copy, "wal", 60), got);
    rmtree(dir);
}

TEST(wal_truncated_reported)
{
    char *dir = tmpdir("walt");
    char orig[600], logf[700], plog[700];
    snprintf(orig, sizeof orig, "%s/orig", dir);
    snprintf(plog, sizeof plog, "%s/contprofd.log", dir);
    int64_t totals[30], want = 0;
    build_store(orig, "service=trunc", 30, totals);
    for (int i = 0; i < 29; i++)
        want += totals[i];
    find_log(orig, logf, sizeof logf);
    struct stat stt;
    CHECK(stat(logf, &stt) == 0);
    CHECK(truncate(logf, stt.st_size - 100) == 0); /* inside the last write */
    const char *args[] = {"--data",    orig,          "--http", "127.0.0.1:0",
                          "--brokers", "127.0.0.1:9", NULL};
    proc p = {0};
    start_daemon_log(&p, plog, args, 30);
    /* no repair under a running daemon */
    char out[4096];
    const char *rargs[] = {"--repair", "--data", orig, NULL};
    CHECK_EQ(run_contprofd(rargs, out, sizeof out), 1);
    CHECK_CONTAINS(out, "is open in another process");
    CHECK_EQ(stop_daemon_within(&p, SIGTERM, 30), 0);
    static char log[65536];
    slurp(plog, log, sizeof log);
    CHECK_CONTAINS(log, "ends inside a write: its last ");
    CHECK_CONTAINS(log, strrchr(logf, '/') + 1);
    /* exactly the last window is gone, and nothing else */
    CHECK_EQ(check_consistent(orig, "trunc", 30), want);
    rmtree(dir);
}

/* The single table of a store directory: its path into out. */
static void find_table(const char *dir, char *out, size_t len)
{
    DIR *d = opendir(dir);
    CHECK(d);
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n > 4 && !strcmp(de->d_name + n - 4, ".ldb")) {
            snprintf(out, len, "%s/%s", dir, de->d_name);
            found++;
        }
    }
    closedir(d);
    CHECK_EQ(found, 1);
}

/* A store of n windows of service svc in dir/s (path, 600 bytes), opened once so its log
 * became a table (table, 700 bytes); returns the sum of its windows' totals. */
static int64_t store_with_table(const char *dir, const char *svc, int n, char *path, char *table)
{
    char labels[64];
    snprintf(path, 600, "%s/s", dir);
    snprintf(labels, sizeof labels, "service=%s", svc);
    int64_t totals[64], want = 0;
    CHECK(n <= 64);
    build_store(path, labels, n, totals);
    for (int i = 0; i < n; i++)
        want += totals[i];
    CHECK_EQ(check_consistent(path, svc, n), want); /* the open moves the log to a table */
    find_table(path, table, 700);
    return want;
}

/* A damaged table block (its first: the format record and the first windows): refused at
 * open naming the table and the fix; repaired with what was lost reported; consistent. */
TEST(table_damage_refused_then_repaired)
{
    char *dir = tmpdir("ldb");
    char path[600], table[700], out[16384];
    int64_t want = store_with_table(dir, "ldb", 40, path, table);
    int fd = open(table, O_RDWR);
    CHECK(fd >= 0);
    unsigned char c;
    CHECK(pread(fd, &c, 1, 1000) == 1);
    c ^= 0x5a;
    CHECK(pwrite(fd, &c, 1, 1000) == 1);
    close(fd);

    const char *a1[] = {"--data", path, "--http", "127.0.0.1:0", "--brokers", "127.0.0.1:9", NULL};
    CHECK_EQ(run_contprofd(a1, out, sizeof out), 1);
    CHECK_CONTAINS(out, "Corruption");
    CHECK_CONTAINS(out, strrchr(table, '/') + 1);
    char fix[700];
    snprintf(fix, sizeof fix, "run `contprofd --repair --data %s`", path);
    CHECK_CONTAINS(out, fix);

    char conf[700];
    keep_all_conf(dir, conf, sizeof conf);
    const char *a2[] = {"--config", conf, "--repair", "--data", path, NULL};
    int st = run_contprofd(a2, out, sizeof out);
    fprintf(stderr, "%s\n", out);
    CHECK_EQ(st, 0);
    CHECK_CONTAINS(out, "format record lost; written again");
    /* what else the damaged block held depends on LevelDB's layout: whatever is left
     * answers consistently */
    int64_t got = check_consistent(path, "ldb", 40);
    CHECK(got > 0 && got <= want);
    rmtree(dir);
}

/* Starts contprofd (argv[0] its path) logging to log; its HTTP port, or 0 if it exited
 * first (a store it refuses), reaped then. */
static int try_start(const char *const *argv, const char *log, pid_t *pid)
{
    *pid = spawn(argv, log);
    static char buf[1 << 16];
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(20000)) {
        slurp(log, buf, sizeof buf);
        const char *m = strstr(buf, PROC_QUERY_API);
        if (m) return atoi(m + strlen(PROC_QUERY_API));
        int st;
        if (waitpid(*pid, &st, WNOHANG) == *pid) return 0;
    }
    CHECK(0);
    return 0;
}

/* A damaged table block the open does not read: contprofd starts and is healthy (200), a
 * query over it answers the damage, and /healthz then says degraded (503), naming the table
 * and the repair. Each
 * 4 KiB block of the table is tried in turn until one is such a block. */
TEST(damaged_table_makes_healthz_degraded)
{
    char *dir = tmpdir("hz");
    char path[600], table[700], conf[700], orig[700], log[800], bin[600];
    store_with_table(dir, "hz", 40, path, table);
    keep_all_conf(dir, conf, sizeof conf);
    snprintf(orig, sizeof orig, "%s.orig", path);
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    sh("cp -a '%s' '%s'", path, orig);
    struct stat stt;
    CHECK(stat(table, &stt) == 0);
    int found = 0, tried = 0;
    for (off_t off = 1000; off < stt.st_size - 100 && !found; off += 4096, tried++) {
        sh("rm -rf '%s'%s", path, "");
        sh("cp -a '%s' '%s'", orig, path);
        int fd = open(table, O_RDWR);
        CHECK(fd >= 0);
        unsigned char c;
        CHECK(pread(fd, &c, 1, off) == 1);
        c ^= 0x5a;
        CHECK(pwrite(fd, &c, 1, off) == 1);
        close(fd);
        snprintf(log, sizeof log, "%s/contprofd-%lld.log", dir, (long long)off);
        const char *argv[] = {bin, "--config", conf, "--data", path, "--http", "127.0.0.1:0", NULL};
        pid_t pid;
        int port = try_start(argv, log, &pid);
        if (!port) continue; /* the open read that block, and refused the store */
        /* healthy first: 200 once ingest has its partitions */
        cp_http_result h;
        for (int64_t end = mono_ns() + 30 * SEC;; usleep(50000)) {
            h = http_get(port, "/healthz", NULL);
            if (h.status == 200 || mono_ns() > end) break;
            cp_buf_close(&h.body);
        }
        CHECK_EQ(h.status, 200);
        cp_buf_close(&h.body);
        char pq[300];
        snprintf(pq, sizeof pq,
                 "/api/v1/timeline?type=cpu&select=%%7Bservice%%3D%%22hz%%22%%7D&from=%lld&to=%lld"
                 "&step=10s",
                 (long long)(T0 / SEC - 3600), (long long)(T0 / SEC + 3600));
        cp_http_result r = http_get(port, pq, NULL);
        if (r.status != 200) {
            fprintf(stderr, "byte %lld: %d %s\n", (long long)off, r.status, (char *)r.body.data);
            CHECK_CONTAINS((char *)r.body.data, "Corruption");
            h = http_get(port, "/healthz", NULL);
            fprintf(stderr, "/healthz: %d %s\n", h.status, (char *)h.body.data);
            CHECK_EQ(h.status, 503);
            CHECK_CONTAINS((char *)h.body.data, "\"status\":\"degraded\"");
            CHECK_CONTAINS((char *)h.body.data, strrchr(table, '/') + 1);
            CHECK_CONTAINS((char *)h.body.data, "contprofd --repair --data");
            cp_buf_close(&h.body);
            found = 1;
        }
        cp_buf_close(&r.body);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    fprintf(stderr, "%d block(s) tried\n", tried);
    CHECK(found);
    rmtree(dir);
}

/* A store whose CURRENT is gone: the daemon refuses it (LevelDB would create a new store
 * and delete the tables as garbage), naming the file and the repair; the tables are still
 * there, and the repair gives every window back. A lost MANIFEST is refused too. */
TEST(missing_current_refused_not_wiped)
{
    char *dir = tmpdir("cur");
    char path[600], file[1000], table[700], out[16384];
    int64_t want = store_with_table(dir, "cur", 30, path, table);
    snprintf(file, sizeof file, "%s/CURRENT", path);
    CHECK(unlink(file) == 0);

    const char *a1[] = {"--data", path, "--http", "127.0.0.1:0", "--brokers", "127.0.0.1:9", NULL};
    CHECK_EQ(run_contprofd(a1, out, sizeof out), 1);
    CHECK_CONTAINS(out, "CURRENT is missing");
    char fix[700];
    snprintf(fix, sizeof fix, "run `contprofd --repair --data %s`", path);
    CHECK_CONTAINS(out, fix);
    CHECK(access(table, F_OK) == 0); /* nothing deleted */
    CHECK(access(file, F_OK) != 0);  /* and no new store written over it */

    char conf[700];
    keep_all_conf(dir, conf, sizeof conf);
    const char *a2[] = {"--config", conf, "--repair", "--data", path, NULL};
    int st = run_contprofd(a2, out, sizeof out);
    fprintf(stderr, "%s\n", out);
    CHECK_EQ(st, 0);
    CHECK_EQ(check_consistent(path, "cur", 30), want);

    /* CURRENT naming a MANIFEST that is gone: refused too, with the way out */
    DIR *d = opendir(path);
    CHECK(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "MANIFEST-", 9)) {
            snprintf(file, sizeof file, "%s/%s", path, de->d_name);
            CHECK(unlink(file) == 0);
        }
    closedir(d);
    CHECK_EQ(run_contprofd(a1, out, sizeof out), 1);
    CHECK_CONTAINS(out, "CURRENT points to a non-existent file");
    CHECK_CONTAINS(out, "contprofd --repair");
    CHECK(access(table, F_OK) == 0);
    rmtree(dir);
}

/* ---------------------------------------------------------------------------------
 * Derived data: records deleted under the store, then repaired
 * --------------------------------------------------------------------------------- */

static void put_be32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24), p[1] = (char)(v >> 16), p[2] = (char)(v >> 8), p[3] = (char)v;
}

static void del_key(leveldb_t *db, const char *k, size_t kl)
{
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    char *e = NULL;
    leveldb_delete(db, wo, k, kl, &e);
    CHECK(!e);
    leveldb_writeoptions_destroy(wo);
}

TEST(repair_rebuilds_derived_data)
{
    char *dir = tmpdir("rep");
    char path[600];
    snprintf(path, sizeof path, "%s/s", dir);
    int64_t ta[12], tb[12];
    build_store(path, "service=a", 12, ta);
    /* a second series, created after the first */
    {
        cp_store_options o = {.path = path};
        cp_store *s = NULL;
        cp_err err = {0};
        CHECK_EQ(cp_store_open(&o, &s, &err), 0);
        cp_store_batch *b = cp_store_batch_create(s);
        for (int i = 0; i < 12; i++) {
            cp_envelope e;
            make_env(&e, "default", CP_KIND_CPU, "service=b", T0 + i * WIN, WIN, "p2",
                     (uint64_t)i + 1);
            cp_profile *p = mini_window((uint64_t)i + 100, 200, T0 + i * WIN);
            tb[i] = cp_profile_total(p, 0);
            CHECK_EQ(cp_store_batch_add(b, &e, p, 0, &err), 0);
            CHECK_EQ(cp_store_batch_commit(b, &err), 0);
            cp_profile_destroy(p);
            cp_envelope_close(&e);
        }
        cp_store_batch_destroy(b);
        cp_store_close(s);
    }
    int64_t want_b = 0;
    for (int i = 0; i < 12; i++)
        want_b += tb[i];
    /* lose: series record 1 (service=a), one stack and one function in the middle */
    leveldb_options_t *lo = leveldb_options_create();
    char *e = NULL;
    leveldb_t *db = leveldb_open(lo, path, &e);
    CHECK(!e);
    char k[32] = "default";
    k[7] = 0;
    k[8] = 'S';
    put_be32(k + 9, 1);
    del_key(db, k, 13);
    k[8] = 'D';
    k[9] = 'k';
    put_be32(k + 10, 40);
    del_key(db, k, 14);
    k[9] = 'f';
    put_be32(k + 10, 35); /* a batch_N::fn_M of series a */
    del_key(db, k, 14);
    leveldb_close(db);
    leveldb_options_destroy(lo);

    /* the store is refused, pointing to the repair */
    cp_store_options o = {.path = path};
    cp_store *s = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_store_open(&o, &s, &err), CP_ESTORE);
    CHECK_CONTAINS(err.msg, "run `contprofd --repair --data");

    cp_store_repair_stats st;
    char *rep = NULL;
    size_t replen = 0;
    FILE *f = open_memstream(&rep, &replen);
    cp_store_options ro = {.path = path};
    int rc = cp_store_repair(&ro, f, &st, &err);
    fclose(f);
    if (rc) fprintf(stderr, "repair: %s\n", err.msg);
    CHECK_EQ(rc, 0);
    CHECK_EQ(st.series_missing, 1);
    CHECK_EQ(st.series_kept, 1);
    CHECK_EQ(st.dict_missing, 2);
    CHECK(st.dict_dropped >= 1);    /* at least the location of the lost function */
    CHECK(st.blocks_dropped >= 12); /* series a's windows and rollups */
    CHECK_CONTAINS(rep, "tenant default: series: 1 without a usable record");
    CHECK_CONTAINS(rep, "dictionary of stacks: 1 ids missing");
    CHECK_CONTAINS(rep, "dictionary of functions: 1 ids missing");
    free(rep);

    /* series b is kept under a new id, its labels indexed again, every row whose stack
     * survived still there and the levels in agreement */
    CHECK_EQ(cp_store_open(&o, &s, &err), 0);
    cp_string_list vals = {0};
    CHECK_EQ(
        cp_store_label_values(s, &(cp_query){.tenant = "default", .label = "service"}, &vals, &err),
        0);
    CHECK_EQ(vals.n, 1);
    CHECK_STREQ(vals.v[0], "b");
    cp_string_list_close(&vals);
    cp_store_close(s);
    int64_t got_b = check_consistent(path, "b", 12);
    CHECK(got_b > 0 && got_b <= want_b);
    CHECK_EQ(check_consistent(path, "a", 12), 0);
    rmtree(dir);
}

/* ---------------------------------------------------------------------------------
 * Disk full
 * --------------------------------------------------------------------------------- */

/* Fills the file system of dir with one file until it is full; returns its path. */
static void fill_disk(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    static char zeros[65536];
    for (;;) {
        ssize_t n = write(fd, zeros, sizeof zeros);
        if (n <= 0) break;
    }
    for (;;) { /* the last pages */
        ssize_t n = write(fd, zeros, 512);
        if (n <= 0) break;
    }
    close(fd);
}

static int wait_status(int port, int status, double secs, char *body, size_t len)
{
    double end = now_s() + secs;
    for (;;) {
        cp_http_result r = http_get(port, "/healthz", NULL);
        int st = r.status;
        snprintf(body, len, "%s", (char *)r.body.data);
        cp_buf_close(&r.body);
        if (st == status) return 1;
        if (now_s() > end) return 0;
        usleep(100000);
    }
}

TEST(disk_full_pauses_and_resumes)
{
    char *dir = tmpdir("full");
    char mnt[600], store[700], filler[700], conf[700], plog[700];
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    snprintf(store, sizeof store, "%s/store", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    snprintf(plog, sizeof plog, "%s/contprofd.log", dir);
    CHECK(mkdir(mnt, 0755) == 0);
    /* CI runs as root: a real file system that fills up */
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=4m")) {
        fprintf(stderr, "mount tmpfs on %s: %s (this test needs root)\n", mnt, strerror(errno));
        CHECK(0);
    }
    FILE *cf = fopen(conf, "w");
    fprintf(cf, "retention.raw = 0\nretention.rollup = 0\n"); /* the windows are from 2023 */
    fclose(cf);
    const char *args[] = {"--config", conf, "--data", store, "--http", "127.0.0.1:0", NULL};
    proc p = {0};
    start_daemon_log(&p, plog, args, 30);
    cp_http_result r = http_get(p.port, "/api/v1/brokers", NULL);
    CHECK_EQ(r.status, 200);
    char brokers[256] = {0};
    CHECK(sscanf((char *)r.body.data, "{\"brokers\":\"%255[^\"]\"}", brokers) == 1);
    cp_buf_close(&r.body);
    rd_kafka_t *rk = producer(brokers);
    const int first = 20, later = 40;
    int64_t want = 0, want_first = 0;
    for (int i = 0; i < first + later; i++) {
        if (i == first) {
            flush(rk);
            /* the first windows are stored while there is room */
            double end = now_s() + 60;
            while (http_total(p.port, "disk", T0, T0 + 3600 * SEC) != want_first) {
                CHECK(now_s() < end);
                usleep(100000);
            }
            fill_disk(filler);
        }
        cp_envelope e;
        make_env(&e, "default", CP_KIND_CPU, "service=disk", T0 + i * WIN, WIN, "disk-test",
                 (uint64_t)i + 1);
        cp_profile *pr = fresh_window(i, T0 + i * WIN);
        want += cp_profile_total(pr, 0);
        if (i < first) want_first += cp_profile_total(pr, 0);
        produce_env(rk, &e, pr);
        cp_profile_destroy(pr);
        cp_envelope_close(&e);
    }
    flush(rk);
    rd_kafka_destroy(rk);

    /* the write fails: paused, visible, nothing consumed further */
    char body[1024];
    if (!wait_status(p.port, 503, 60, body, sizeof body)) {
        fprintf(stderr, "/healthz never said 503: %s\n", body);
        CHECK(0);
    }
    CHECK_CONTAINS(body, "\"status\":\"paused\"");
    CHECK_CONTAINS(body, "No space left on device");
    /* it stays paused while the disk is full, retrying: every reopen fails too */
    double until = now_s() + 3;
    while (now_s() < until) {
        r = http_get(p.port, "/healthz", NULL);
        CHECK_EQ(r.status, 503);
        cp_buf_close(&r.body);
        usleep(200000);
    }
    r = http_get(p.port, "/metrics", NULL);
    CHECK_CONTAINS((char *)r.body.data, "contprof_ingest_paused 1\n");
    const char *se = strstr((char *)r.body.data, "\ncontprof_ingest_store_errors_total ");
    CHECK(se);
    CHECK(atoi(se + strlen("\ncontprof_ingest_store_errors_total ")) >= 3);
    cp_buf_close(&r.body);
    /* queries are still answered meanwhile, with what was stored */
    int64_t during = http_total(p.port, "disk", T0, T0 + 3600 * SEC);
    CHECK(during == -1 || during == want_first);

    /* space comes back: ingest resumes alone, and every window is stored */
    CHECK(unlink(filler) == 0);
    if (!wait_status(p.port, 200, 60, body, sizeof body)) {
        fprintf(stderr, "/healthz did not recover: %s\n", body);
        CHECK(0);
    }
    double end = now_s() + 60;
    int64_t got = -1;
    while ((got = http_total(p.port, "disk", T0, T0 + 3600 * SEC)) != want && now_s() < end)
        usleep(100000);
    CHECK_EQ(got, want);
    for (int i = 0; i < first + later; i += 7) { /* level 0 too, window by window */
        cp_profile *pr = fresh_window(i, T0 + i * WIN);
        CHECK_EQ(http_total(p.port, "disk", T0 + i * WIN, T0 + (i + 1) * WIN),
                 cp_profile_total(pr, 0));
        cp_profile_destroy(pr);
    }
    r = http_get(p.port, "/metrics", NULL);
    CHECK_CONTAINS((char *)r.body.data, "contprof_ingest_paused 0\n");
    cp_buf_close(&r.body);
    CHECK_EQ(stop_daemon_within(&p, SIGTERM, 30), 0);
    static char log[65536];
    slurp(plog, log, sizeof log);
    CHECK_CONTAINS(log, "ingest paused, nothing is lost");
    CHECK_CONTAINS(log, "ingest: the store is still unavailable");
    CHECK_CONTAINS(log, "ingest resumed");
    CHECK(umount(mnt) == 0);
    rmtree(dir);
}

TEST_MAIN(T(wal_byte_flip_refused_then_repaired), T(wal_truncated_reported),
          T(repair_rebuilds_derived_data), T(disk_full_pauses_and_resumes),
          T(table_damage_refused_then_repaired), T(missing_current_refused_not_wiped),
          T(damaged_table_makes_healthz_degraded))
