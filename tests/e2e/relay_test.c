/* The per-host relay (collector/relay/README.md), black-box: real contprofd (which hosts the
 * relay), real programs under the agent, the relay's socket and spool on disk, `contprof
 * relay` alone. What the agent hands in reaches the store, with the relay up, down (the
 * spool, drained when it returns) and attacked by hostile local clients. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "http_client.h"
#include "proc.h"
#include "relay.h"

static char *mkdir_tmp(const char *what)
{
    return proc_tmpdir("relay", what);
}

static void daemon_start(proc *p, const char *dir, int port, int n, const char *conf)
{
    start_daemon_data(p, dir, port, n, conf);
    /* the relay starts after the broker and ingest */
    CHECK(wait_for_log(p->pid, p->log, conf ? "Kafka bootstrap" : "relay for this host", 30));
}

/* Envelopes waiting in the spool of relay directory rdir: one per SLOT.env file, a batch
 * file's (SLOT.envs) counted by its frames; *files (may be NULL): the files. */
static int spool_envelopes(const char *rdir, int *files)
{
    char path[700];
    snprintf(path, sizeof path, "%s/spool", rdir);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0, nf = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l == 8 && !strcmp(e->d_name + 4, ".env")) {
            n++;
            nf++;
        } else if (l == 9 && !strcmp(e->d_name + 4, ".envs")) {
            char f[1000];
            snprintf(f, sizeof f, "%s/%s", path, e->d_name);
            cp_buf b = {0};
            CHECK_EQ(cp_read_file(f, &b, NULL), 0);
            size_t off = 0, len;
            const uint8_t *env;
            int rc;
            while ((rc = cp_spool_batch_next(b.data, b.len, &off, &env, &len)) == 1)
                n++;
            CHECK_EQ(rc, 0);
            cp_buf_close(&b);
            nf++;
        }
    }
    closedir(d);
    if (files) *files = nf;
    return n;
}

/* Runs n short programs under the agent, one after another, each handing its windows to the
 * relay in rdir, service svc: a shell loop of some 50 ms (dash starts no other process).
 * Each exits 0. */
static void run_short(const char *rdir, const char *svc, int n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "for n in $(seq %d); do CONTPROF_RELAY='%s' CONTPROF_SERVICE=%s CONTPROF_CPU_HZ=1000 "
             "LD_PRELOAD='%s/collector/libcontprof.so' /bin/dash -c 'i=0; while [ $i -lt 40000 ]; "
             "do i=$((i+1)); done' || exit 1; done",
             n, rdir, svc, bindir());
    proc_sh(cmd);
}

/* The instances of service svc with a cpu series in the last 10 minutes. */
static int instances(int port, const char *svc)
{
    char pq[256];
    snprintf(pq, sizeof pq,
             "/api/v1/series?type=cpu&from=now-10m&to=now&select=%%7Bservice%%3D%%22%s%%22%%7D",
             svc);
    cp_buf b = http_get_ok(port, pq, NULL);
    int n = 0;
    for (const char *p = (const char *)b.data; (p = strstr(p, "\"isolate\":\"dash\"")); p++)
        n++;
    cp_buf_close(&b);
    return n;
}

static void wait_instances(int port, const char *svc, int want)
{
    int64_t end = mono_ns() + 60 * SEC;
    int got = 0;
    while ((got = instances(port, svc)) < want && mono_ns() < end)
        usleep(200000);
    if (got != want) fprintf(stderr, "%s: %d of %d processes stored\n", svc, got, want);
    CHECK_EQ(got, want);
}

/* contprofd's relay: short processes hand their last window to it, every one is stored;
 * /api/v1/brokers names the relay, and the relay's counters add up. */
TEST(short_processes_through_contprofds_relay_are_stored)
{
    char *dir = mkdir_tmp("up"), rdir[600];
    proc d = {0};
    daemon_start(&d, dir, 0, 1, NULL);
    snprintf(rdir, sizeof rdir, "%s/data/relay", dir);
    cp_buf b = http_get_ok(d.port, "/api/v1/brokers", NULL);
    CHECK_CONTAINS((char *)b.data, rdir);
    cp_buf_close(&b);
    run_short(rdir, "relayup", 5);
    wait_instances(d.port, "relayup", 5);
    long long took = http_metric(d.port, "contprof_relay_envelopes_total", NULL);
    long long conns = http_metric(d.port, "contprof_relay_connections_total", NULL);
    CHECK(took >= 5 * 2); /* a cpu window of dash and the agent's own, at least */
    CHECK(conns >= 5);    /* one per process (and its capture polls, if it lived for one) */
    CHECK_EQ(http_metric(d.port, "contprof_relay_lost_total", NULL), 0);
    CHECK_EQ(spool_envelopes(rdir, NULL), 0);
    /* the host's name cache (README "Names"): contprofd's relay made names/ (0755) and builds
     * libc's file when a process asks (sort's CPU is mostly in libc: it asks) */
    char names[700];
    snprintf(names, sizeof names, "%s/names", rdir);
    struct stat st;
    CHECK(lstat(names, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755);
    CHECK_EQ(http_metric(d.port, "contprof_relay_names_refused_total", NULL), 0);
    CHECK_EQ(http_metric(d.port, "contprof_relay_names_evicted_total", NULL), 0);
    char cmd0[1600];
    snprintf(cmd0, sizeof cmd0,
             "seq 300000 | CONTPROF_RELAY='%s' CONTPROF_SERVICE=names CONTPROF_CPU_HZ=1000 "
             "LD_PRELOAD='%s/collector/libcontprof.so' sort -g > /dev/null",
             rdir, bindir());
    proc_sh(cmd0);
    long long built = 0;
    for (int i = 0;
         i < 100 && (built = http_metric(d.port, "contprof_relay_names_built_total", NULL)) < 1;
         i++)
        usleep(100000);
    CHECK(built >= 1);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

/* The relay away (contprofd stopped: its socket is gone): processes spool their windows and
 * exit; the next contprofd drains the spool into the store, every process's windows. */
TEST(relay_down_spools_and_the_next_relay_drains_it)
{
    char *dir = mkdir_tmp("down"), rdir[600];
    proc d = {0};
    daemon_start(&d, dir, 0, 1, NULL);
    int port = d.port;
    snprintf(rdir, sizeof rdir, "%s/data/relay", dir);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    char sock[700];
    snprintf(sock, sizeof sock, "%s/relay.sock", rdir);
    CHECK(access(sock, F_OK) != 0); /* removed at stop: senders spool at once */
    run_short(rdir, "relaydown", 6);
    int files = 0, spooled = spool_envelopes(rdir, &files);
    fprintf(stderr, "spooled: %d envelopes in %d files\n", spooled, files);
    CHECK(spooled >= 6 * 2);
    CHECK(files <= 6); /* each process's window: one batch file (model/relay.h) */
    daemon_start(&d, dir, port, 2, NULL);
    wait_instances(d.port, "relaydown", 6);
    CHECK_EQ(spool_envelopes(rdir, NULL), 0);
    CHECK_EQ(http_metric(d.port, "contprof_relay_drained_total", NULL), spooled);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

static int connect_relay(const char *rdir)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/relay.sock", rdir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Hostile local clients: garbage in a well-framed message is refused with its status and
 * counted, ingestion goes on; a length over the limit closes that connection; a client
 * that stops in the middle of a frame holds nothing up; the relay serves the rest. */
TEST(hostile_clients_are_refused_and_the_relay_goes_on)
{
    char *dir = mkdir_tmp("hostile"), rdir[600];
    proc d = {0};
    daemon_start(&d, dir, 0, 1, NULL);
    snprintf(rdir, sizeof rdir, "%s/data/relay", dir);
    /* a half frame that never ends, held open through the rest */
    int stall = connect_relay(rdir);
    uint8_t hdr[CP_RELAY_HEADER];
    cp_relay_header(hdr, CP_RELAY_ENVELOPE, 1000);
    CHECK(write(stall, hdr, sizeof hdr) == sizeof hdr);
    CHECK(write(stall, "abc", 3) == 3);
    /* garbage, framed */
    int g = connect_relay(rdir);
    const char junk[] = "this is not an envelope at all";
    cp_relay_header(hdr, CP_RELAY_ENVELOPE, sizeof junk);
    CHECK(write(g, hdr, sizeof hdr) == sizeof hdr);
    CHECK(write(g, junk, sizeof junk) == sizeof junk);
    uint8_t ack[CP_RELAY_HEADER + 1];
    CHECK(read(g, ack, sizeof ack) == sizeof ack);
    CHECK_EQ(ack[4], CP_RELAY_ACK);
    CHECK_EQ(ack[5], CP_RELAY_REFUSED);
    /* an oversized length: the connection is closed, nothing buffered */
    uint8_t big[CP_RELAY_HEADER] = {0x7f, 0xff, 0xff, 0xff, CP_RELAY_ENVELOPE};
    CHECK(write(g, big, sizeof big) == sizeof big);
    CHECK_EQ(read(g, ack, sizeof ack), 0);
    close(g);
    CHECK_EQ(http_metric(d.port, "contprof_relay_refused_total", NULL), 1);
    char *log = malloc(1 << 16);
    slurp(d.log, log, 1 << 16);
    CHECK_CONTAINS(log, "relay: refused 31 bytes from pid");
    CHECK_CONTAINS(log, "over the 16777216 allowed: connection closed");
    free(log);
    /* real processes still get through */
    run_short(rdir, "afterattack", 3);
    wait_instances(d.port, "afterattack", 3);
    close(stall);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

/* A relay alone: contprofd at dir with the configuration lines conf (its own relay off),
 * then `contprof relay --dir DIR/r --server URL` with the extra arguments (NULL-ended, at
 * most 4), its log DIR/relay.log (the argument vector must outlive the relay: a restart
 * uses it). */
typedef struct alone {
    proc d;
    pid_t relay;
    char rdir[600], rlog[600], url[64], bin[600];
    const char *argv[12];
} alone;

static void alone_start(alone *a, const char *dir, const char *conf_lines, const char *const *extra)
{
    char conf[600];
    snprintf(conf, sizeof conf, "%s/c.conf", dir);
    FILE *f = fopen(conf, "w");
    CHECK(f);
    fprintf(f, "relay.dir = off\n%s", conf_lines);
    fclose(f);
    daemon_start(&a->d, dir, 0, 1, conf);
    snprintf(a->rdir, sizeof a->rdir, "%s/r", dir);
    snprintf(a->rlog, sizeof a->rlog, "%s/relay.log", dir);
    snprintf(a->url, sizeof a->url, "http://127.0.0.1:%d", a->d.port);
    snprintf(a->bin, sizeof a->bin, "%s/query/contprof", bindir());
    const char *base[] = {a->bin, "relay", "--dir", a->rdir, "--server", a->url};
    int n = 0;
    for (; n < 6; n++)
        a->argv[n] = base[n];
    for (int i = 0; extra && extra[i] && n < 10; i++)
        a->argv[n++] = extra[i];
    a->argv[n] = NULL;
    a->relay = spawn(a->argv, a->rlog);
    CHECK(wait_for_log(a->relay, a->rlog, "relay at ", 10) != NULL);
}

/* `contprof relay` alone, asking contprofd (whose own relay is off) for its brokers: the
 * processes' windows arrive; SIGTERM removes its socket and exits 0. A spool directory
 * others may write without the sticky bit, or a link, is refused by name. */
TEST(contprof_relay_alone_and_its_directory_checks)
{
    char *dir = mkdir_tmp("alone"), cmd[2048];
    static alone a;
    alone_start(&a, dir, "", NULL);
    proc d = a.d;
    const char *rdir = a.rdir, *rlog = a.rlog, *const *argv = a.argv;
    pid_t r = a.relay;
    cp_buf b = http_get_ok(d.port, "/api/v1/brokers", NULL);
    CHECK(!strstr((char *)b.data, "relay"));
    cp_buf_close(&b);
    run_short(rdir, "alone", 3);
    wait_instances(d.port, "alone", 3);
    kill(r, SIGTERM);
    CHECK_EQ(wait_exit(r, 20), 0);
    snprintf(cmd, sizeof cmd, "%s/relay.sock", rdir);
    CHECK(access(cmd, F_OK) != 0);
    /* a spool others may write into without the sticky bit */
    cp_err err = {0};
    int fd = -1;
    snprintf(cmd, sizeof cmd, "chmod 0777 '%s/spool'", rdir);
    proc_sh(cmd);
    CHECK(cp_spool_open(rdir, 0, &fd, &err) != 0);
    CHECK_CONTAINS(err.msg, "writable by others without the sticky bit");
    /* a link where the spool was */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/spool' && ln -s /tmp '%s/spool'", rdir, rdir);
    proc_sh(cmd);
    CHECK(cp_spool_open(rdir, 0, &fd, &err) != 0);
    CHECK_CONTAINS(err.msg, "a symbolic link or not a directory");
    /* the relay refuses to start on it, naming it */
    pid_t r2 = spawn(argv, rlog);
    CHECK_EQ(wait_exit(r2, 10), 1);
    char *l = malloc(1 << 16);
    slurp(rlog, l, 1 << 16);
    CHECK_CONTAINS(l, "spool: a symbolic link or not a directory");
    free(l);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

/* A contprofd with tenants' tokens, processes that hold none: `contprof relay --token T
 * --sign` signs their envelopes for T's tenant, which then stores them (without --sign they
 * would go to the dead-letter queue); the relay asks the server with the token. */
TEST(contprof_relay_signs_for_its_tenant)
{
    char *dir = mkdir_tmp("sign"), cmd[2048];
    static alone a;
    const char *extra[] = {"--token", "payments-secret-1", "--sign", NULL};
    alone_start(&a, dir, "token.payments = payments-secret-1\n", extra);
    proc d = a.d;
    const char *rdir = a.rdir;
    pid_t r = a.relay;
    snprintf(cmd, sizeof cmd,
             "CONTPROF_RELAY='%s' CONTPROF_TENANT=payments CONTPROF_SERVICE=signed "
             "CONTPROF_CPU_HZ=1000 LD_PRELOAD='%s/collector/libcontprof.so' /bin/dash -c 'i=0; "
             "while [ $i -lt 40000 ]; do i=$((i+1)); done'",
             rdir, bindir());
    proc_sh(cmd);
    const char *pq =
        "/api/v1/series?type=cpu&from=now-10m&to=now&select=%7Bservice%3D%22signed%22%7D";
    int found = 0;
    for (int64_t end = mono_ns() + 60 * SEC; !found && mono_ns() < end; usleep(200000)) {
        cp_buf b = http_get_ok(d.port, pq, "payments-secret-1");
        found = strstr((char *)b.data, "\"isolate\":\"dash\"") != NULL;
        cp_buf_close(&b);
    }
    CHECK(found);
    CHECK_EQ(
        http_metric(d.port, "contprof_ingest_dlq_total{reason=\"tenant\"}", "payments-secret-1"),
        0);
    kill(r, SIGTERM);
    CHECK_EQ(wait_exit(r, 20), 0);
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

/* A relay that is alive but answers nothing (SIGSTOP): a process's envelopes wait their
 * bound and go to the spool, the process exits 0; once the relay runs again it reads what
 * was sent to it and drains the spool, the store keeping one copy of each window. */
TEST(a_stopped_relay_bounds_the_exit_and_nothing_is_stored_twice)
{
    char *dir = mkdir_tmp("stopped"), rdir[600], cmd[2048];
    proc d = {0};
    daemon_start(&d, dir, 0, 1, NULL);
    snprintf(rdir, sizeof rdir, "%s/data/relay", dir);
    CHECK_EQ(kill(d.pid, SIGSTOP), 0);
    run_short(rdir, "stopped", 2);
    int spooled = spool_envelopes(rdir, NULL);
    fprintf(stderr, "spooled while the relay was stopped: %d\n", spooled);
    CHECK(spooled >= 2);
    CHECK_EQ(kill(d.pid, SIGCONT), 0);
    wait_instances(d.port, "stopped", 2);
    for (int64_t end = mono_ns() + 30 * SEC; spool_envelopes(rdir, NULL) > 0 && mono_ns() < end;)
        usleep(100000);
    CHECK_EQ(spool_envelopes(rdir, NULL), 0);
    /* every window once: the cpu profile of the two processes equals the sum of their
     * windows, whichever copy arrived first (duplicates dropped, counted) */
    long long dups = -1;
    for (int64_t end = mono_ns() + 30 * SEC; mono_ns() < end; usleep(200000)) {
        long long taken = http_metric(d.port, "contprof_relay_envelopes_total", NULL) +
                          http_metric(d.port, "contprof_relay_drained_total", NULL);
        long long windows = http_metric(d.port, "contprof_ingest_windows_total", NULL);
        dups = http_metric(d.port, "contprof_ingest_duplicates_total", NULL);
        if (windows + dups >= taken) break;
    }
    fprintf(stderr, "duplicates dropped by the store: %lld\n", dups);
    CHECK(dups >= 1); /* the frames sent into the stopped relay's socket, spooled too */
    CHECK_EQ(stop_daemon_within(&d, SIGTERM, 60), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    proc_sh(cmd);
    free(dir);
}

TEST_MAIN(T(short_processes_through_contprofds_relay_are_stored),
          T(relay_down_spools_and_the_next_relay_drains_it),
          T(hostile_clients_are_refused_and_the_relay_goes_on),
          T(contprof_relay_alone_and_its_directory_checks), T(contprof_relay_signs_for_its_tenant),
          T(a_stopped_relay_bounds_the_exit_and_nothing_is_stored_twice))
