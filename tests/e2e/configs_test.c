/* The examples in configs/ cannot rot: contprofd starts with each *.conf (real binary, a
 * throw-away data directory, loopback port 0) and stops cleanly; every CONTPROF_* variable
 * in agent.env is one the agent reads; contprofd.service runs contprofd with options it
 * knows. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "test.h"

static const char *srcdir(void)
{
    const char *s = getenv("CP_SOURCE_DIR");
    return s ? s : ".";
}

static const char *bindir(void)
{
    const char *b = getenv("CP_BINARY_DIR");
    return b ? b : "build";
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* Starts contprofd --config conf, waits for its API, stops it with SIGTERM; returns the
 * exit status, with the log in *log (owned by the caller). */
static int run_with_config(const char *conf, char **log)
{
    char dir[] = "/tmp/contprof-conf-XXXXXX";
    CHECK(mkdtemp(dir));
    char bin[512], data[600], logp[600];
    snprintf(bin, sizeof bin, "%s/query/contprofd", bindir());
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(logp, sizeof logp, "%s/log", dir);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(logp, "w", stderr);
        (void)f;
        execl(bin, bin, "--config", conf, "--data", data, "--http", "127.0.0.1:0", (char *)NULL);
        _exit(127);
    }
    int st = 0, up = 0;
    for (int i = 0; i < 1500 && !up; i++) { /* 30 s */
        free(*log);
        *log = slurp(logp);
        if (*log && strstr(*log, "query API on http://"))
            up = 1;
        else if (waitpid(pid, &st, WNOHANG) == pid)
            break;
        else
            usleep(20000);
    }
    if (!up) {
        fprintf(stderr, "%s: contprofd did not start:\n%s\n", conf, *log ? *log : "");
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
    }
    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
    free(*log);
    *log = slurp(logp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(contprofd_starts_with_each_example)
{
    char dirp[600];
    snprintf(dirp, sizeof dirp, "%s/configs", srcdir());
    DIR *d = opendir(dirp);
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".conf") != 0) continue;
        char conf[1200];
        snprintf(conf, sizeof conf, "%s/%s", dirp, e->d_name);
        char *log = NULL;
        int rc = run_with_config(conf, &log);
        if (rc != 0) fprintf(stderr, "%s: exit %d\n%s\n", conf, rc, log ? log : "");
        CHECK_EQ(rc, 0);
        CHECK(strstr(log, "stopped cleanly"));
        printf("%s: accepted\n", e->d_name);
        free(log);
        n++;
    }
    closedir(d);
    CHECK(n >= 4);
}

TEST(agent_env_names_only_known_variables)
{
    char path[600];
    snprintf(path, sizeof path, "%s/configs/agent.env", srcdir());
    char *env = slurp(path);
    CHECK(env);
    /* the agent's sources: every variable it reads is spelled "CONTPROF_..." there */
    static const char *const sources[] = {"collector/config.c", "collector/agent.c",
                                          "cmd/contprof/cmd_run.c"};
    char *src[3];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", srcdir(), sources[i]);
        src[i] = slurp(path);
        CHECK(src[i]);
    }
    int n = 0;
    for (char *p = env; (p = strstr(p, "CONTPROF_")); p++) {
        char name[64] = "\"";
        size_t k = 1;
        while (k < sizeof name - 2 && ((p[k - 1] >= 'A' && p[k - 1] <= 'Z') || p[k - 1] == '_'))
            name[k] = p[k - 1], k++;
        name[k] = '"';
        name[k + 1] = 0;
        /* CONTPROF_KAFKA_<property> is a family: librdkafka checks the property itself */
        int known =
            strncmp(name, "\"CONTPROF_KAFKA_", 16) == 0 && strstr(src[0], "\"CONTPROF_KAFKA_\"");
        for (int i = 0; i < 3; i++)
            known |= strstr(src[i], name) != NULL;
        if (!known) fprintf(stderr, "agent.env: %s is read nowhere in the agent\n", name);
        CHECK(known);
        n++;
    }
    CHECK(n >= 10);
    for (int i = 0; i < 3; i++)
        free(src[i]);
    free(env);
}

TEST(service_unit_runs_contprofd_with_known_options)
{
    char path[600];
    snprintf(path, sizeof path, "%s/configs/contprofd.service", srcdir());
    char *unit = slurp(path);
    CHECK(unit);
    char *exec = strstr(unit, "\nExecStart=");
    CHECK(exec);
    char line[512];
    CHECK(sscanf(exec + 11, "%511[^\n]", line) == 1);
    char cmd[700], help[4096] = "";
    snprintf(cmd, sizeof cmd, "%s/query/contprofd --help", bindir());
    FILE *p = popen(cmd, "r");
    CHECK(p);
    size_t hn = fread(help, 1, sizeof help - 1, p);
    help[hn] = 0;
    CHECK(pclose(p) == 0);
    int nopt = 0;
    char *save = NULL;
    for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (!nopt++) {
            size_t l = strlen(tok);
            CHECK(l > 10 && strcmp(tok + l - 10, "/contprofd") == 0);
            continue;
        }
        if (strncmp(tok, "--", 2) != 0) continue;
        if (!strstr(help, tok)) fprintf(stderr, "ExecStart option %s unknown to contprofd\n", tok);
        CHECK(strstr(help, tok));
    }
    CHECK(strstr(unit, "KillSignal=SIGTERM"));
    free(unit);
}

TEST_MAIN(T(contprofd_starts_with_each_example), T(agent_env_names_only_known_variables),
          T(service_unit_runs_contprofd_with_known_options))
