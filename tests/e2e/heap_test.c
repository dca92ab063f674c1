/* V8 heap snapshots through the whole path: `contprof import` of node snapshots (written at
 * test time) into the real contprofd as kind heap, read back by `contprof query` and `top`
 * as retainer profiles; a table that grew between two snapshots shows in their diff under
 * its variable; a damaged snapshot is refused with its byte named and nothing stored. */
#include <sys/stat.h>

#include "proc.h"
#include "test.h"

/* node's snapshot of tests/model/js/hoard.js with n objects into dir/name. */
static void snapshot(const char *dir, const char *name, int n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "HOARD_N=%d '%s' --expose-gc '%s/tests/model/js/hoard.js' '%s/%s' > /dev/null", n,
             CP_NODE, getenv("CP_SOURCE_DIR"), dir, name);
    proc_sh(cmd);
}

/* Runs a contprof command with args against port; its stdout in out (cap bytes). Returns
 * the exit status. */
static int contprof(int port, const char *dir, const char *args, char *out, size_t cap)
{
    char cmd[4096], file[600];
    snprintf(file, sizeof file, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "'%s/query/contprof' %s --server http://127.0.0.1:%d > '%s' 2>&1",
             bindir(), args, port, file);
    int st = system(cmd);
    slurp(file, out, cap);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The number after "PATH " on a line of folded text (-1 if no such line). */
static long long folded_value(const char *text, const char *path)
{
    char pat[512];
    snprintf(pat, sizeof pat, "%s ", path);
    for (const char *p = text; (p = strstr(p, pat)); p++)
        if (p == text || p[-1] == '\n') return atoll(p + strlen(pat));
    return -1;
}

TEST(heap_snapshots_import_query_and_diff)
{
    char *dir = proc_tmpdir("heap", "snapshots");
    proc d;
    start_daemon_data(&d, dir, 0, 1, NULL);
    snapshot(dir, "small.heapsnapshot", 20000);
    proc_sh("sleep 1.1"); /* the second snapshot a second later: their times differ */
    snapshot(dir, "big.heapsnapshot", 100000);
    static char out[1 << 20];
    char args[2048];
    /* the later one first: import orders snapshots by the time they were written */
    snprintf(args, sizeof args,
             "import --service shop '%s/big.heapsnapshot' '%s/small.heapsnapshot'", dir, dir);
    int st = contprof(d.port, dir, args, out, sizeof out);
    printf("%s", out);
    CHECK_EQ(st, 0);
    /* the latest snapshot of the series: the 100,000-object table under its variable */
    st = contprof(
        d.port, dir,
        "query --type heap --select '{service=\"shop\"}' --from -1h --to now --format folded", out,
        sizeof out);
    CHECK_EQ(st, 0);
    long long names = folded_value(out, "hoard.js;HOARD: Array;Object;name: (string)");
    printf("name strings: %lld bytes\n", names);
    CHECK(names > 100000LL * 24);
    st = contprof(d.port, dir, "top --type heap --select '{service=\"shop\"}' --from -1h --to now",
                  out, sizeof out);
    CHECK_EQ(st, 0);
    CHECK(strstr(out, "retained_space"));
    CHECK(strstr(out, "HOARD: Array"));
    /* what grew between the two (each a 1 s window at its file's time): the table's
     * objects, under the same path */
    struct stat a, b;
    char f1[600], f2[600];
    snprintf(f1, sizeof f1, "%s/small.heapsnapshot", dir);
    snprintf(f2, sizeof f2, "%s/big.heapsnapshot", dir);
    CHECK(stat(f1, &a) == 0 && stat(f2, &b) == 0);
    long long ts = (long long)a.st_mtim.tv_sec, tb = (long long)b.st_mtim.tv_sec;
    CHECK(tb > ts);
    snprintf(
        args, sizeof args,
        "diff --type heap --select '{service=\"shop\"}' --from %lld --to %lld --base-from %lld "
        "--base-to %lld",
        tb, tb + 2, ts, ts + 1);
    st = contprof(d.port, dir, args, out, sizeof out);
    printf("%s", out);
    CHECK_EQ(st, 0);
    /* 80,000 more objects, each with a name and tags: megabytes more, in those frames */
    const char *ch = strstr(out, "Change: +");
    CHECK(ch && strstr(ch, "MB"));
    CHECK(strstr(out, "name: (string)") && strstr(out, "tags: Array"));
    /* a damaged snapshot: refused naming the byte, exit 1, nothing else stored */
    snprintf(args, sizeof args, "head -c 50000 '%s/big.heapsnapshot' > '%s/cut.heapsnapshot'", dir,
             dir);
    proc_sh(args);
    snprintf(args, sizeof args, "import --service cut '%s/cut.heapsnapshot'", dir);
    st = contprof(d.port, dir, args, out, sizeof out);
    printf("%s", out);
    CHECK(st != 0);
    CHECK(strstr(out, "cut.heapsnapshot: heap snapshot: truncated at byte 50000"));
    st = contprof(d.port, dir, "series --type heap --from -1h --to now", out, sizeof out);
    CHECK_EQ(st, 0);
    CHECK(strstr(out, "shop") && !strstr(out, "cut"));
    stop_daemon(&d, SIGTERM);
}

TEST_MAIN(T(heap_snapshots_import_query_and_diff))
