/* Server-side symbolization end to end, real processes: contprofd with two tenants, a
 * stripped -O2 program without frame pointers run twice at once under the agent with
 * CONTPROF_SYMBOLIZE=server (tenant a) and once for tenant b; the agent never maps libdw;
 * the hot functions are unnamed; `contprof symbols upload` of the unstripped build; the
 * same query of the windows stored before the upload names them, for tenant a only, in
 * our decoder and in `go tool pprof`. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "http_client.h"
#include "pprof.h"
#include "proc.h"

/* Whether the maps of pid (`contprof run` execs the program: same pid) name libdw; waits
 * first until they name the agent. */
static int maps_have_libdw(pid_t pid, int wait)
{
    char path[64];
    static char buf[1 << 18];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    for (int64_t end = mono_ns() + 20 * SEC; wait && mono_ns() < end; usleep(50000)) {
        slurp(path, buf, sizeof buf);
        if (strstr(buf, "libcontprof.so")) break;
    }
    slurp(path, buf, sizeof buf);
    CHECK(strstr(buf, "libcontprof.so"));
    return strstr(buf, "libdw") != NULL;
}

/* GET that must answer 200, with 60 s to answer: a symbolized query can be slow on a loaded
 * machine. */
static cp_http_result get(const char *url, const char *pq, const char *token)
{
    cp_http_result r = http_get_from(url, pq, token, 60000);
    http_expect_200(pq, &r);
    return r;
}

/* Runs cmd, returns its exit status and its output (stdout and stderr) in out. */
static int run(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    CHECK(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    fprintf(stderr, "$ %s\n%s", cmd, out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The CPU total of tenant's selection over [from, to) (unix seconds), from the pprof answer. */
static int64_t cpu_total(const char *url, const char *token, const char *sel, long from, long to)
{
    cp_buf pq = {0};
    char head[160];
    snprintf(head, sizeof head,
             "/api/v1/profile?format=pprof&type=cpu&from=%ld&to=%ld&select=", from, to);
    CHECK(cp_buf_append(&pq, head, strlen(head)) == 0);
    CHECK(cp_url_encode(&pq, sel) == 0);
    CHECK(cp_buf_append(&pq, "", 1) == 0);
    cp_http_result r = get(url, (char *)pq.data, token);
    cp_buf_close(&pq);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK(cp_pprof_decode(r.body.data, r.body.len, NULL, &p, &err) == 0);
    cp_buf_close(&r.body);
    int t = cp_profile_find_type(p, "cpu");
    int64_t v = t >= 0 ? cp_profile_total(p, (uint32_t)t) : 0;
    cp_profile_destroy(p);
    return v;
}

/* Locations of the stripped program's mapping in tenant's export: how many, how many named. */
static void prog_locations(const char *url, const char *token, long from, long to, uint32_t *n,
                           uint32_t *named, cp_buf *raw)
{
    char pq[200];
    snprintf(pq, sizeof pq, "/api/v1/profile?format=pprof&type=cpu&from=%ld&to=%ld", from, to);
    cp_http_result r = get(url, pq, token);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK(cp_pprof_decode(r.body.data, r.body.len, NULL, &p, &err) == 0);
    *n = *named = 0;
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        if (!l->mapping_id) continue;
        const char *file = cp_profile_str(p, p->mappings.v[l->mapping_id - 1].filename);
        if (!strstr(file, "symprog-stripped")) continue;
        (*n)++;
        if (l->nlines) (*named)++;
    }
    cp_profile_destroy(p);
    if (raw)
        *raw = r.body;
    else
        cp_buf_close(&r.body);
}

/* Starts contprofd with config conf (its log dlog) and waits for its API: url gets its
 * address. Returns its pid. */
static pid_t start_contprofd(const char *conf, const char *dlog, char url[64])
{
    char dbin[512];
    snprintf(dbin, sizeof dbin, "%s/query/contprofd", bindir());
    const char *dargv[] = {dbin, "--config", conf, NULL};
    pid_t d = spawn(dargv, dlog);
    int port = atoi(wait_for_log(d, dlog, PROC_QUERY_API, 30));
    CHECK(port);
    snprintf(url, 64, "http://127.0.0.1:%d", port);
    return d;
}

/* One program run under the agent for a tenant: mode is its --symbolize (agent or server),
 * or "lines" (CONTPROF_SYMBOLIZE=lines, the libdw control). */
typedef struct tenant_run {
    const char *tenant, *mode;
    pid_t pid;
    char log[600];
} tenant_run;

/* Runs stripped 8 under `contprof run` for each of runs[4] at once, checks that only the
 * "lines" run maps libdw, and waits for all to exit 0. */
static void run_tenants(tenant_run *runs, const char *dir, const char *cbin, const char *url,
                        const char *stripped)
{
    for (int i = 0; i < 4; i++) {
        snprintf(runs[i].log, sizeof runs[i].log, "%s/run-%d.log", dir, i);
        /* each agent signs for its tenant (contprofd has tokens); c borrows a's token to
         * find the brokers, and its windows are refused for the tenant: c is checked for
         * libdw only */
        const char *tok = runs[i].tenant[0] == 'b' ? "token-of-b" : "token-of-a";
        /* `contprof run --symbolize` takes agent or server: lines goes by the environment */
        int lines = strcmp(runs[i].mode, "lines") == 0;
        const char *argv[] = {cbin,
                              "run",
                              "--server",
                              url,
                              "--token",
                              tok,
                              "--tenant",
                              runs[i].tenant,
                              lines ? "--label" : "--symbolize",
                              lines ? "control=1" : runs[i].mode,
                              "--service",
                              "symprog",
                              "--window",
                              "1s",
                              "--",
                              stripped,
                              "8",
                              NULL};
        if (lines) setenv("CONTPROF_SYMBOLIZE", "lines", 1);
        runs[i].pid = spawn(argv, runs[i].log);
        unsetenv("CONTPROF_SYMBOLIZE");
    }
    for (int i = 0; i < 4; i++)
        (void)maps_have_libdw(runs[i].pid, 1);
    usleep(3000000); /* past the first windows (1 s): an agent that symbolizes has loaded libdw */
    for (int i = 0; i < 4; i++) {
        int has = maps_have_libdw(runs[i].pid, 0);
        fprintf(stderr, "run %d (%s): libdw %s\n", i, runs[i].mode, has ? "mapped" : "not mapped");
        CHECK_EQ(has, strcmp(runs[i].mode, "lines") == 0);
    }
    for (int i = 0; i < 4; i++)
        CHECK_EQ(wait_exit(runs[i].pid, 90), 0);
}

/* Every instance's windows of runs[0..3) are stored (the agent flushes at exit): waits until
 * each one's CPU total stays the same for 1.5 s, then wants at least 10 samples. */
static void wait_stored(const tenant_run *runs, const char *url, long t_from, long t_to)
{
    for (int i = 0; i < 3; i++) {
        char sel[128];
        snprintf(sel, sizeof sel, "{service=\"symprog\",instance=~\".*:%d\"}", (int)runs[i].pid);
        const char *tok = runs[i].tenant[0] == 'a' ? "token-of-a" : "token-of-b";
        int64_t v = 0, last = -1;
        int same = 0;
        for (int64_t end = mono_ns() + 40 * SEC; mono_ns() < end; usleep(500000)) {
            v = cpu_total(url, tok, sel, t_from, t_to);
            same = v > 0 && v == last ? same + 1 : 0;
            if (same == 3) break; /* unchanged for 1.5 s after the program's exit */
            last = v;
        }
        fprintf(stderr, "instance %d (tenant %s): cpu %lld ns\n", (int)runs[i].pid, runs[i].tenant,
                (long long)v);
        /* up to 8 s of CPU each; a loaded machine gives it much less: at least 10 samples */
        CHECK(v >= 100000000LL);
    }
}

TEST(stripped_program_named_after_upload_per_tenant)
{
    char dir[] = "/tmp/contprof-symbols-XXXXXX";
    CHECK(mkdtemp(dir));
    fprintf(stderr, "symbols: working in %s\n", dir);
    char conf[600], dlog[600], data[600];
    snprintf(conf, sizeof conf, "%s/contprofd.conf", dir);
    snprintf(dlog, sizeof dlog, "%s/contprofd.log", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    FILE *f = fopen(conf, "w");
    CHECK(f);
    fprintf(f,
            "data = %s\nlisten = 127.0.0.1:0\ntoken.a = token-of-a\ntoken.b = token-of-b\n"
            "symbols.dirs = %s/no-debug-dir\n",
            data, dir);
    fclose(f);
    char cbin[512], prog[512], stripped[512];
    snprintf(cbin, sizeof cbin, "%s/query/contprof", bindir());
    snprintf(prog, sizeof prog, "%s/tests/symbols/symprog", bindir());
    snprintf(stripped, sizeof stripped, "%s/tests/symbols/symprog-stripped", bindir());
    char url[64];
    pid_t d = start_contprofd(conf, dlog, url);

    /* two processes of tenant a and one of tenant b, addresses only; a control that loads
     * libdw (tenant c, CONTPROF_SYMBOLIZE=lines: the agent's default names frames without
     * libdw) shows that the libdw check can see libdw */
    long t_from = (long)time(NULL) - 2;
    tenant_run runs[4] = {{"a", "server", 0, ""},
                          {"a", "server", 0, ""},
                          {"b", "server", 0, ""},
                          {"c", "lines", 0, ""}};
    run_tenants(runs, dir, cbin, url, stripped);
    long t_to = (long)time(NULL) + 2;

    wait_stored(runs, url, t_from, t_to);

    /* before the upload: the program's frames carry no names */
    char pq[200];
    snprintf(pq, sizeof pq, "/api/v1/profile?format=top&type=cpu&from=%ld&to=%ld", t_from, t_to);
    cp_http_result r = get(url, pq, "token-of-a");
    CHECK(!strstr((char *)r.body.data, "symprog_hash_spin"));
    cp_buf_close(&r.body);
    uint32_t n, named;
    prog_locations(url, "token-of-a", t_from, t_to, &n, &named, NULL);
    fprintf(stderr, "tenant a before the upload: %u locations in the program, %u named\n", n,
            named);
    CHECK(n > 0);
    CHECK_EQ(named, 0);

    /* bad uploads through the CLI: exit 1, the server's message */
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd, "%s symbols upload --server %s --token token-of-a %s %s", cbin, url,
             conf, stripped);
    CHECK_EQ(run(cmd, out, sizeof out), 1);
    CHECK_CONTAINS(out, "not an ELF file");
    CHECK_CONTAINS(out, "no function symbols");
    snprintf(cmd, sizeof cmd, "%s symbols upload --server %s --token token-of-a --tenant b %s",
             cbin, url, prog);
    CHECK_EQ(run(cmd, out, sizeof out), 1);
    CHECK_CONTAINS(out, "HTTP 403");

    /* the upload */
    snprintf(cmd, sizeof cmd, "%s symbols upload --server %s --token token-of-a --tenant a %s",
             cbin, url, prog);
    CHECK_EQ(run(cmd, out, sizeof out), 0);
    CHECK_CONTAINS(out, "\"build_id\":");

    /* the same query of the windows stored before the upload: named, the hot function on top */
    r = get(url, pq, "token-of-a");
    fprintf(stderr, "%s", (char *)r.body.data);
    const char *row = strstr((char *)r.body.data, "cum%\n");
    CHECK(row);
    const char *eol = strchr(row + 5, '\n');
    CHECK(eol);
    char first[256];
    snprintf(first, sizeof first, "%.*s", (int)(eol - row - 5), row + 5);
    CHECK_CONTAINS(first, "symprog_hash_spin");
    CHECK_CONTAINS((char *)r.body.data, "symprog_table_walk");
    cp_buf_close(&r.body);
    cp_buf raw;
    prog_locations(url, "token-of-a", t_from, t_to, &n, &named, &raw);
    fprintf(stderr, "tenant a after the upload: %u locations in the program, %u named\n", n, named);
    CHECK(named > 0);
    /* go tool pprof reads the named export */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s/a.pb.gz", dir);
    CHECK(cp_write_file(tmp, raw.data, raw.len, NULL) == 0);
    cp_buf_close(&raw);
    snprintf(cmd, sizeof cmd, "go tool pprof -top %s", tmp);
    CHECK_EQ(run(cmd, out, sizeof out), 0);
    CHECK_CONTAINS(out, "symprog_hash_spin");

    /* tenant b ran the same binary: a's upload names none of b's frames */
    r = get(url, pq, "token-of-b");
    CHECK(!strstr((char *)r.body.data, "symprog_hash_spin"));
    cp_buf_close(&r.body);
    prog_locations(url, "token-of-b", t_from, t_to, &n, &named, NULL);
    fprintf(stderr, "tenant b: %u locations in the program, %u named\n", n, named);
    CHECK(n > 0);
    CHECK_EQ(named, 0);

    kill(d, SIGTERM);
    CHECK_EQ(wait_exit(d, 30), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* A profile's build ID is the agent's word, not a file name: one that climbs out of
 * symbols.dirs ("../../../.." to a file of the test's) is never looked up, so the file
 * there is never opened (issue 36: a query parsed /tmp/x/evil.debug, up to 512 MiB). */
TEST(a_build_id_that_is_a_path_opens_nothing)
{
    char dir[] = "/tmp/contprof-symbols-XXXXXX";
    CHECK(mkdtemp(dir));
    char conf[600], dlog[600], data[600], evil[700], id[800], file[600], cmd[2000], out[8192];
    snprintf(conf, sizeof conf, "%s/contprofd.conf", dir);
    snprintf(dlog, sizeof dlog, "%s/contprofd.log", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/debug/ab %s/x", dir, dir);
    CHECK(system(cmd) == 0);
    /* the file the build ID points at: not ELF, so a parse would be logged */
    snprintf(evil, sizeof evil, "%s/x/evil.debug", dir);
    CHECK(cp_write_file(evil, "not an ELF file at all", 22, NULL) == 0);
    snprintf(id, sizeof id, "../../../../../../../../../../..%s/x/evil", dir);
    FILE *f = fopen(conf, "w");
    CHECK(f);
    fprintf(f, "data = %s\nlisten = 127.0.0.1:0\nsymbols.dirs = %s/debug\n", data, dir);
    fclose(f);
    /* one window of a program with no names: addresses in a mapping with that build ID */
    cp_profile *pr = cp_profile_create();
    CHECK(pr);
    CHECK(cp_profile_add_sample_type(pr, "samples", "count") == 0);
    CHECK(cp_profile_add_sample_type(pr, "cpu", "nanoseconds") == 0);
    cp_profile_intern_cstr(pr, "cpu", &pr->period_type.type);
    cp_profile_intern_cstr(pr, "nanoseconds", &pr->period_type.unit);
    pr->period = 10000000;
    pr->time_nanos = ((int64_t)time(NULL) - 30) * SEC;
    pr->duration_nanos = 10 * SEC;
    cp_mapping m = {.start = 0x400000, .limit = 0x500000};
    cp_profile_intern_cstr(pr, "/usr/bin/victim", &m.filename);
    cp_profile_intern_cstr(pr, id, &m.build_id);
    uint32_t mid, lid;
    CHECK(cp_profile_add_mapping(pr, &m, &mid) == 0);
    CHECK(cp_profile_add_location(pr, 0x401234, mid, NULL, 0, &lid) == 0);
    int64_t v[2] = {10, 100000000};
    CHECK(cp_profile_add_sample(pr, &lid, 1, v, NULL, 0) == 0);
    cp_buf pp = {0};
    CHECK(cp_pprof_encode(pr, 1, &pp) == 0);
    cp_profile_destroy(pr);
    snprintf(file, sizeof file, "%s/w.pb.gz", dir);
    CHECK(cp_write_file(file, pp.data, pp.len, NULL) == 0);
    cp_buf_close(&pp);

    char url[64];
    pid_t d = start_contprofd(conf, dlog, url);
    snprintf(cmd, sizeof cmd, "%s/query/contprof import --server %s --service victim %s", bindir(),
             url, file);
    CHECK_EQ(run(cmd, out, sizeof out), 0);
    /* the query names frames (server-side symbolization runs) and finds the window */
    CHECK_EQ(cpu_total(url, NULL, "{service=\"victim\"}", (long)time(NULL) - 3600,
                       (long)time(NULL) + 60),
             100000000);
    kill(d, SIGTERM);
    CHECK_EQ(wait_exit(d, 30), 0);
    static char text[1 << 16];
    slurp(dlog, text, sizeof text);
    if (strstr(text, "evil")) fprintf(stderr, "contprofd's log:\n%s\n", text);
    CHECK(!strstr(text, "evil.debug"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN(T(stripped_program_named_after_upload_per_tenant),
          T(a_build_id_that_is_a_path_opens_nothing))
